"""This line's CPU patch tests on its patched SGLang tree, through the harness all lines share.

The shared folder (tests/patches: cpu_harness, sglang_cpu, verify_cpu, spec_v2_cpu, kernel_refs,
stubs) goes on sys.path after the line's own, which holds the line's tests. Copied as is into each
release line (lines/<ref>/tests/patches), it finds the project root from where it lies.
"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED = next((p / "tests" / "patches" for p in HERE.parents if (p / "tests/patches/cpu_harness.py").is_file()), None)
if SHARED is None:
    raise pytest.UsageError(f"{HERE} is not inside the project: no tests/patches/cpu_harness.py in a folder above it")
sys.path.append(str(SHARED))

import cpu_harness  # noqa: E402
from cpu_harness import imported_sglang_is_the_tree, pytest_report_header  # noqa: E402, F401

cpu_harness.set_up(HERE)
