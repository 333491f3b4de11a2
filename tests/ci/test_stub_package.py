"""The bundle's stand-in for a package too large to travel (ci/gpu/stub_package.py): SGLang's
module-level uses import, and every real use raises, naming the package (CPU, fast)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What 0.5.15's cutedsl modules do with cutlass at import time, then two real uses.
USES = """
import cutlass
import cutlass.cute as cute
from cutlass.utils import HardwareInfo
from typing import Type

dtypes = {"f16": cutlass.Float16}

@cute.jit
def kernel(x: cute.Tensor) -> Type[cutlass.Numeric] | None:
    return None

class Runner(cute.Struct):
    pass

for call in (lambda: kernel(1), lambda: cute.sym_int(), lambda: HardwareInfo()):
    try:
        call()
    except ModuleNotFoundError as e:
        print("raised:", e)
    else:
        print("did not raise")
"""


def test_imports_succeed_and_uses_raise(tmp_path: Path) -> None:
    (tmp_path / "cutlass").mkdir()
    shutil.copy(ROOT / "ci" / "gpu" / "stub_package.py", tmp_path / "cutlass" / "__init__.py")
    proc = subprocess.run(
        [sys.executable, "-c", USES],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("raised:") and "'cutlass'" in line for line in lines), lines
    assert "cutlass.cute.jit(kernel)" in lines[0] and "cutlass.cute.sym_int" in lines[1]
