"""GPU test harness: the patched server, started and stopped by the tests themselves.

- Tests marked ``gpu`` skip, with the reason shown, when no CUDA GPU is present.
- The server imports SGLang from ``$SGLANG_TREE`` (default ``build/sglang-v0.5.9``): the suite refuses
  (exit 3) a tree without the patch, or an environment where ``import sglang`` loads another copy.
- Models: ``$SGL_TEST_MODEL`` / ``$SGL_TEST_DRAFT_MODEL`` (default: the generated fixtures,
  cached under ``$SGL_FIXTURE_DIR`` or ``build/fixtures``), ``$SGL_TEST_TP`` (default 1),
  ``$SGL_TEST_EXTRA_FLAGS`` (appended to every server), ``$SGL_BASE_FLAGS`` (default: the flags the
  offline H200 bundle needs), ``$SGL_TEST_LOG_DIR`` (keep server logs and summary.txt there).
- No network, no package index: everything comes from the environment as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from gpu_harness import SUMMARY  # noqa: E402  (quotable lines for the terminal summary)


def gpu_count() -> tuple[int, str]:
    """(number of CUDA GPUs, how it was found)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), "torch"
        return 0, "torch.cuda.is_available() is False"
    except ImportError:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0, "no torch and no nvidia-smi"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return 0, f"nvidia-smi failed: {e}"
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return n, "nvidia-smi" if n else "nvidia-smi lists no GPU"


GPUS, GPU_HOW = gpu_count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the patched SGLang tree (skipped without a GPU)")
    config.addinivalue_line("markers", "gpus(n): needs at least n CUDA GPUs")
    config.addinivalue_line(
        "markers", "switch: needs the speculation switch in the tree (skipped on a line without it)"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"GPU tests: {GPUS} CUDA GPU(s) ({GPU_HOW}); SGLANG_TREE={os.environ.get('SGLANG_TREE') or '(default)'}"


def _tree_without_switch() -> str | None:
    """The reason to skip switch tests: the tree is there and carries no switch (None otherwise)."""
    from bench.run.server import TreeError, resolve_tree, tree_has_switch

    try:
        tree = resolve_tree()
    except TreeError:
        return None  # sgl_tree refuses it, with the reason
    if tree_has_switch(tree):
        return None
    return f"the tree at {tree} carries no speculation switch (its line does not port it: lines/<ref>/NOTES.md)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_switch = _tree_without_switch() if GPUS else None
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        if no_switch and item.get_closest_marker("switch") is not None:
            item.add_marker(pytest.mark.skip(reason=no_switch))
            continue
        if GPUS == 0:
            item.add_marker(pytest.mark.skip(reason=f"no CUDA GPU: {GPU_HOW}"))
            continue
        need = item.get_closest_marker("gpus")
        if need and GPUS < int(need.args[0]):
            item.add_marker(pytest.mark.skip(reason=f"needs {need.args[0]} CUDA GPUs, {GPUS} present"))


@pytest.fixture(scope="session")
def sgl_tree() -> Path:
    from bench.run.server import TreeError, check_tree, resolve_tree

    try:
        tree = resolve_tree()
        imported = check_tree(tree, require_switch=False)
    except TreeError as e:
        pytest.exit(f"refusing to run the GPU tests: {e}", returncode=3)
    SUMMARY.append(f"sglang imported from {imported}")
    return tree


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = os.environ.get("SGL_TEST_LOG_DIR")
    if d:
        p = Path(d)
        p.mkdir(parents=True, exist_ok=True)
        return p
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def fixture_models() -> Any:
    from gpu_harness import FixtureSets

    return FixtureSets()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    rep = outcome.get_result()
    if rep.failed:
        import gpu_harness

        logs = gpu_harness.LOGS_SEEN
        if logs:
            rep.sections.append(("server logs (kept)", "\n".join(str(p) for p in logs)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not SUMMARY:
        return
    terminalreporter.section("spec-switch GPU summary")
    for line in SUMMARY:
        terminalreporter.write_line(line)
    d = os.environ.get("SGL_TEST_LOG_DIR")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / "summary.txt").write_text("\n".join(SUMMARY) + "\n", encoding="utf-8")
