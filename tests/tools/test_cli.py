"""check, status, test, new: end to end through ``main(argv)`` on real repos."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, Env

DEMO_TESTS = """
import os
from pathlib import Path

TREE = Path(os.environ["SGLANG_TREE"])


def test_x20():
    assert "x20 = 2000\\n" in (TREE / "python/sglang/srt/server_args.py").read_text()


def test_nonl_untouched():
    # declared by the first patch: runs on the series up to it, where the next patch is not applied
    assert (TREE / "python/sglang/srt/nonl.txt").read_bytes() == b"first\\nlast"


def test_fails():
    assert False, "this patch broke it"
"""


def write_patch(env: Env, src: str, name: str, tests: str) -> None:
    with open(DATA / src, newline="") as f:
        text = f.read()
    old = text.split("Tests:\n")[1].split("---\n")[0]
    (env.root / "patches" / name).write_bytes(text.replace("Tests:\n" + old, "Tests:\n" + tests).encode())


def setup_demo(env: Env, second_tests: str) -> None:
    (env.root / "tests/patches").mkdir(parents=True)
    (env.root / "tests/patches/test_demo.py").write_text(DEMO_TESTS)
    write_patch(
        env,
        "exact.patch",
        "exact.patch",
        " tests/patches/test_demo.py::test_x20\n tests/patches/test_demo.py::test_nonl_untouched\n",
    )
    write_patch(env, "no-newline.patch", "no-newline.patch", second_tests)
    (env.root / "series").write_text("exact.patch\nno-newline.patch\n")
    assert env.tool("apply") == 0


def test_per_patch_tests_pass_on_series_up_to_each_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    setup_demo(env, " tests/patches/test_demo.py::test_x20\n")
    assert env.tool("test", "--patches-only") == 0
    err = capsys.readouterr().err
    assert "[2/2] testing no-newline.patch" in err
    wt = env.root / "build/worktrees/sglang-v1.0.0/01-exact"
    assert f"SGLANG_TREE={wt}" in err
    assert (wt / "python/sglang/srt/nonl.txt").read_bytes() == b"first\nlast"


def test_failing_test_names_the_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    setup_demo(env, " tests/patches/test_demo.py::test_fails\n")
    assert env.tool("test", "--patches-only") == 1
    err = capsys.readouterr().err
    assert "FAIL no-newline.patch (series up to #2): pytest exit 1" in err
    assert "ok   exact.patch (series up to #1)" in err


@pytest.mark.parametrize("node", ["tests/patches/test_demo.py::test_nope", "tests/patches/test_missing.py::test_x"])
def test_declared_test_that_does_not_exist(env: Env, capsys: pytest.CaptureFixture[str], node: str) -> None:
    setup_demo(env, f" {node}\n")
    assert env.tool("test", "--patches-only") == 1
    err = capsys.readouterr().err
    assert "FAIL no-newline.patch (series up to #2): pytest" in err
    assert "declared node id" in err


def test_test_refuses_stale_tree(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    setup_demo(env, " tests/patches/test_demo.py::test_x20\n")
    (env.root / "series").write_text("exact.patch\n")
    (env.root / "patches/no-newline.patch").unlink()
    assert env.tool("test", "--patches-only") == 1
    assert "does not hold the current series" in capsys.readouterr().err


def test_own_tests_and_gpu_stage(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    setup_demo(env, " tests/patches/test_demo.py::test_x20\n")
    (env.root / "tests/tools").mkdir()
    (env.root / "tests/tools/test_ok.py").write_text("def test_ok():\n    pass\n")
    (env.root / "tests/gpu").mkdir()
    (env.root / "tests/gpu/test_gpu.py").write_text(
        "import os, pytest\n\n@pytest.mark.skip(reason='no GPU')\ndef test_gpu():\n    pass\n\n"
        "def test_tree_is_full():\n    assert os.environ['SGLANG_TREE'].endswith('sglang-v1.0.0')\n"
    )
    assert env.tool("test") == 0
    err = capsys.readouterr().err
    assert "ok   tool tests" in err and "ok   tests/gpu (full series)" in err


@pytest.mark.parametrize("per_patch", [False, True])
def test_declared_gpu_tests_run_once_unless_asked_per_patch(
    env: Env, capsys: pytest.CaptureFixture[str], per_patch: bool
) -> None:
    setup_demo(env, " tests/patches/test_demo.py::test_x20\n tests/gpu/test_gpu.py::test_records_tree\n")
    (env.root / "tests/gpu").mkdir()
    (env.root / "tests/gpu/test_gpu.py").write_text(
        "import os\nfrom pathlib import Path\n\n"
        "def test_records_tree():\n"
        "    with open(Path(__file__).parents[2] / 'gpu-trees.txt', 'a') as f:\n"
        "        f.write(os.environ['SGLANG_TREE'] + '\\n')\n"
    )
    assert env.tool("test", "--patches-only", *(["--gpu-per-patch"] if per_patch else [])) == 0
    trees = [Path(t).name for t in (env.root / "gpu-trees.txt").read_text().split()]
    assert trees == (["02-no-newline", "sglang-v1.0.0"] if per_patch else ["sglang-v1.0.0"])


def test_a_deferred_gpu_test_that_does_not_exist_is_still_an_error(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_demo(env, " tests/patches/test_demo.py::test_x20\n tests/gpu/test_gpu.py::test_gone\n")
    (env.root / "tests/gpu").mkdir()
    (env.root / "tests/gpu/test_gpu.py").write_text("def test_other():\n    pass\n")
    assert env.tool("test", "--patches-only") == 1
    err = capsys.readouterr().err
    assert "FAIL no-newline.patch (series up to #2): pytest" in err and "declared node id" in err


def test_check_reports_every_problem(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "missing-field.patch", "fuzz.patch", "broken.patch")
    shutil.copy(DATA / "rename.patch", env.root / "patches/unused.patch")
    (env.root / "series").write_text("fuzz.patch\nmissing-field.patch\nbroken.patch\nghost.patch\n")
    assert env.tool("check") == 1
    out = capsys.readouterr().out
    assert "series:4: ghost.patch has no file" in out
    assert "patches/exact.patch is not listed in series" in out
    assert "patches/unused.patch is not listed in series" in out
    assert "broken.patch: " in out
    assert "missing-field.patch: header lacks required field Drop-When:" in out
    assert (
        "fuzz.patch: python/sglang/srt/server_args.py: hunk @@ -17,7 +17,7 @@ x16 = 16: would only apply with fuzz"
        in out
    )


def test_check_detects_patch_that_would_change_on_export(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch")
    p = env.root / "patches/exact.patch"
    p.write_text(p.read_text().replace("Date: Thu, 1 Jan 2026 00:00:00 +0000", "Date: Fri, 2 Jan 2026 10:00:00 +0100"))
    assert env.tool("check") == 1
    assert "exact.patch: re-export would change the file" in capsys.readouterr().out
    p.write_bytes((DATA / "exact.patch").read_bytes())
    assert env.tool("check") == 0


def test_status_table(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "offset.patch")
    capsys.readouterr()
    assert env.tool("status") == 0
    out = capsys.readouterr().out
    assert "| patch | v1.0.0 (pinned) | Applies-To | Upstream-Status | Tests |" in out
    assert "| exact.patch | exact | v1.0.0 | not upstream | tests/patches/test_demo.py::test_x20 |" in out
    assert "| offset.patch | failed (1/1 hunks) |" in out  # exact.patch already changed x20


def test_status_says_once_why_a_release_is_unavailable(
    env: Env, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    env.use("exact.patch", "offset.patch")
    capsys.readouterr()
    assert env.tool("status", "--refs", "no-such-tag") == 0
    out = capsys.readouterr().out
    assert out.count("| unavailable (no-such-tag: see the log above) |") == 2
    reasons = [r.getMessage() for r in caplog.records if "no-such-tag unavailable" in r.getMessage()]
    assert len(reasons) == 1
    # Every source tried, with its own reason, and what to do.
    assert "Tried:" in reasons[0] and str(env.upstream) in reasons[0] and "SGLANG_REPO" in reasons[0]


def test_new_writes_template(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert env.tool("new", "Gate SM120") == 0
    tpl = (env.tree / ".git/sglang-patch-template").read_text()
    assert tpl.startswith("Gate SM120\n\nDescription:\n") and "Applies-To: v1.0.0" in tpl
    assert "make refresh" in capsys.readouterr().out


def test_install_needs_a_tree(env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert env.tool("--tree", str(tmp_path / "nope"), "install") == 1
    assert "run `make apply` first" in capsys.readouterr().err


def test_make_exits_2_but_its_output_names_the_tools_code(env: Env) -> None:
    """Through make every failure is 2; the message says it was work that would be lost (3)."""
    from conftest import REAL_ROOT

    shutil.copy(REAL_ROOT / "Makefile", env.root / "Makefile")
    shutil.copytree(REAL_ROOT / "tools", env.root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (env.tree / "python/sglang/__init__.py").write_text("work in progress\n")
    # Under `make test SGLANG_REF=...` the outer make's variables reach this one through MAKEFLAGS.
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SGLANG_REF")}
    res = subprocess.run(
        ["make", "apply", f"PYTHON={sys.executable}"], cwd=env.root, capture_output=True, text=True, env=clean
    )
    assert res.returncode == 2
    assert "error (exit 3: work would be lost): " in res.stderr
    assert (env.tree / "python/sglang/__init__.py").read_text() == "work in progress\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--ref", "v1.0.0;touch {x}", "apply"],
        ["--ref", "$(touch {x})", "check"],
        ["status", "--refs", "v1.0.0,../{x}"],
        ["rebase", "--to", "v2 {x}"],
        ["--ref", "v1.lock", "apply"],
        ["--ref", "v1..v2", "apply"],
    ],
)
def test_a_ref_that_is_not_a_ref_is_refused_first(
    env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    marker = tmp_path / "x"
    before = sorted(p.name for p in (env.root / "build").iterdir())
    assert env.tool(*(a.format(x=marker) for a in argv)) == 2
    assert "is not a git ref" in capsys.readouterr().err
    assert not marker.exists() and sorted(p.name for p in (env.root / "build").iterdir()) == before
