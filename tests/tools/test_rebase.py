"""Rebase: one small real upstream with a v2.0.0 that makes each status happen."""

import json
from pathlib import Path

import pytest

from tools.cli import main

from conftest import UPSTREAM_FILES, commit_in_tree, git, header, make_upstream

MERGE_ME = "".join(f"m{i} = {i}\n" for i in range(1, 21))
V1 = {**UPSTREAM_FILES, "python/sglang/srt/merge_me.py": MERGE_ME}
SA = UPSTREAM_FILES["python/sglang/srt/server_args.py"]
V2 = {
    **V1,
    "python/sglang/srt/server_args.py": "# new\n# upstream\n# lines\n" + SA,
    "python/sglang/srt/merge_me.py": MERGE_ME.replace("m8 = 8\n", "m8 = 80\n"),
    "python/sglang/srt/nonl.txt": "first\nLAST",
    "python/sglang/srt/delete_me.py": "gone = 'maybe'\n",
}
del V2["python/sglang/srt/old_name.py"]
EXPECTED = {
    "a-exact.patch": "exact",
    "b-offset.patch": "offset (refreshed)",
    "c-merged.patch": "3-way merged (refreshed)",
    "d-upstream.patch": "already upstream",
    "e-obsolete.patch": "obsolete",
    "f-conflict.patch": "conflict",
}


def _project_with_patches(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    upstream: dict[str, str],
    series: str,
    edits: list[tuple[str, dict[str, str]]],
) -> Path:
    """A project pinned to v1.0.0 of `upstream` whose series holds one patch per (message, files)."""
    up = make_upstream(tmp_path / "up", upstream, "v1.0.0")
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text(series)
    monkeypatch.setenv("SGLANG_REPO", str(up))
    assert main(["--root", str(root), "--ref", "v1.0.0", "apply"]) == 0
    tree = root / "build/sglang-v1.0.0"
    for msg, e in edits:
        commit_in_tree(tree, msg, e)
    assert main(["--root", str(root), "refresh"]) == 0
    return root


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    edits = [
        ("A exact", {"python/sglang/srt/crlf.txt": "ALPHA\r\nbeta\r\ngamma\r\n"}),
        ("B offset", {"python/sglang/srt/server_args.py": SA.replace("x20 = 20\n", "x20 = 2000\n")}),
        ("C merged", {"python/sglang/srt/merge_me.py": MERGE_ME.replace("m10 = 10\n", "m10 = 1000\n")}),
        ("D upstream", {"python/sglang/srt/nonl.txt": "first\nLAST"}),
        ("E obsolete", {"python/sglang/srt/old_name.py": V1["python/sglang/srt/old_name.py"].replace("1", "5")}),
        ("F conflict", {"python/sglang/srt/delete_me.py": "gone = False\n"}),
    ]
    root = _project_with_patches(
        tmp_path, monkeypatch, V1, "# the series\n", [(header(subject), e) for subject, e in edits]
    )
    (tmp_path / "up/python/sglang/srt/old_name.py").unlink()
    make_upstream(tmp_path / "up", V2, "v2.0.0")
    return root


def tool(root: Path, *a: str) -> int:
    return main(["--root", str(root), *a])


def snapshot(root: Path) -> dict[str, bytes]:
    files = [root / "series", root / "sglang.lock", *sorted((root / "patches").iterdir())]
    return {str(p): p.read_bytes() for p in files}


def test_check_classifies_every_status_and_changes_nothing(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0", "--check") == 1  # a conflict
    out, err = capsys.readouterr()
    # The last line says why the exit is non-zero (make turns every exit code into 2).
    assert err.strip().splitlines()[-1].startswith("error (exit 1): 1 patch(es) do not port to v2.0.0 as they are: ")
    for name, status in EXPECTED.items():
        assert f"| {name} | {status} |" in out, name
    assert "files removed upstream: python/sglang/srt/old_name.py" in out
    assert "conflicts in python/sglang/srt/delete_me.py" in out or "| f-conflict.patch | conflict |" in out
    assert "## Range-diff" in out and "A exact" in out
    assert snapshot(proj) == before
    assert (proj / "docs/rebase/v2.0.0.md").read_text().startswith("# Rebase report: v1.0.0 -> v2.0.0")


def test_roll_needs_drop_then_updates_everything(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (proj / "series").write_text((proj / "series").read_text().replace("f-conflict.patch\n", ""))
    (proj / "patches/f-conflict.patch").unlink()
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    assert "d-upstream.patch (already upstream), e-obsolete.patch (obsolete) would leave it" in capsys.readouterr().err
    assert snapshot(proj) == before
    assert tool(proj, "rebase", "--to", "v2.0.0", "--drop") == 0
    assert (proj / "series").read_text() == "# the series\na-exact.patch\nb-offset.patch\nc-merged.patch\n"
    assert not (proj / "patches/d-upstream.patch").exists()
    assert json.loads((proj / "sglang.lock").read_text())["ref"] == "v2.0.0"
    b = (proj / "patches/b-offset.patch").read_text()
    assert "@@ -20,7 +20,7 @@" in b and "Applies-To: v1.0.0, v2.0.0\n" in b
    # the rolled series is consistent: it applies exactly at the new pin and re-exports unchanged
    assert tool(proj, "apply") == 0
    assert tool(proj, "check") == 0
    capsys.readouterr()
    assert tool(proj, "status", "--refs", "v1.0.0") == 0
    out = capsys.readouterr().out
    assert "| patch | v2.0.0 (pinned) | v1.0.0 |" in out
    assert "| b-offset.patch | exact | offset -3 (1/1 hunks) |" in out


def test_conflict_stops_then_continue(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    err = capsys.readouterr().err
    assert "Stopped at f-conflict.patch: resolve the conflicts in" in err and "CONTINUE=1" in err
    assert snapshot(proj) == before
    rt = proj / "build/rebase-v2.0.0"
    (rt / "python/sglang/srt/delete_me.py").write_text("gone = False\n")
    git(rt, "add", "-A")
    assert tool(proj, "rebase", "--to", "v2.0.0", "--continue", "--drop") == 0
    assert "| f-conflict.patch | conflict resolved by hand |" in capsys.readouterr().out
    assert json.loads((proj / "sglang.lock").read_text())["ref"] == "v2.0.0"
    assert "+gone = False" in (proj / "patches/f-conflict.patch").read_text()
    assert tool(proj, "apply") == 0


def test_abort(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    assert "is in progress" in capsys.readouterr().err
    assert tool(proj, "rebase", "--to", "v2.0.0", "--abort") == 0
    assert not (proj / "build/rebase-v2.0.0").exists()
    assert snapshot(proj) == before


# -- the classifications a reviewer needs beyond the six statuses --------------------------------
MODEL_V1 = "class M:\n    def forward(self):\n        return 1\n"
MODEL_V2 = MODEL_V1 + "\n    def hook(self):\n        return 'upstream'\n"
W1 = {
    **UPSTREAM_FILES,
    "python/sglang/srt/model.py": MODEL_V1,
    "python/sglang/srt/v1_worker.py": "w = 1\n",
    "python/sglang/srt/kept.py": "k = 1\n",
}
W2 = {
    **W1,
    "python/sglang/srt/model.py": MODEL_V2,
    "python/sglang/srt/kept.py": "k = 3\n",
    "python/sglang/srt/server_args.py": SA.replace("x5 = 5\n", "x5 = 50\n").replace("x30 = 30\n", "x30 = 300\n"),
}
del W2["python/sglang/srt/v1_worker.py"]


@pytest.fixture
def proj2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    declared = header("H declared").replace("Upstream-Status: not upstream", "Upstream-Status: upstream since v2.0.0")
    edits = [
        (
            header("G own"),
            {
                "python/sglang/srt/model.py": MODEL_V1 + "\n    def _lm(self):\n        return self\n"
                "\n    def hook(self):\n        return self._lm().forward()\n"
            },
        ),
        (declared, {"python/sglang/srt/kept.py": "k = 2\n"}),
        (
            header("I partly"),
            {
                "python/sglang/srt/v1_worker.py": "w = 2\n",
                "python/sglang/srt/server_args.py": SA.replace("x5 = 5\n", "x5 = 5000\n"),
            },
        ),
        (
            header("J creates"),
            {
                "python/sglang/srt/new_mod.py": "n = 1\n",
                "python/sglang/srt/server_args.py": SA.replace("x5 = 5\n", "x5 = 5000\n").replace(
                    "x30 = 30\n", "x30 = 3000\n"
                ),
            },
        ),
        (header("K needs"), {"python/sglang/srt/new_mod.py": "n = 2\n"}),
    ]
    root = _project_with_patches(tmp_path, monkeypatch, W1, "", edits)
    (tmp_path / "up/python/sglang/srt/v1_worker.py").unlink()
    make_upstream(tmp_path / "up", W2, "v2.0.0")
    return root


def test_report_explains_upstream_versions_partial_obsolescence_and_dependencies(
    proj2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tool(proj2, "rebase", "--to", "v2.0.0", "--check") == 1
    rows = {
        ln.split(" | ")[1]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and " | " in ln
    }
    # upstream wrote its own hook(): the patch's hunk still applies exactly, but would duplicate it
    assert "| already upstream | upstream defines what the patch adds" in rows["g-own.patch"]
    assert "python/sglang/srt/model.py: hook" in rows["g-own.patch"] and "_lm" not in rows["g-own.patch"]
    assert "| already upstream | the header declares Upstream-Status: upstream since v2.0.0" in rows["h-declared.patch"]
    # some files removed, some conflicting: both said, the removed one not listed as a conflict
    i = rows["i-partly.patch"]
    assert "| conflict | conflicts in python/sglang/srt/server_args.py;" in i
    assert "obsolete in part: python/sglang/srt/v1_worker.py removed upstream" in i
    assert "conflicts in python/sglang/srt/v1_worker.py" not in i and ", python/sglang/srt/v1_worker.py;" not in i
    # a file an earlier, unported patch creates is not "gone upstream"
    k = rows["k-needs.patch"]
    assert "needs python/sglang/srt/new_mod.py from j-creates.patch, which did not port" in k
    assert "removed upstream" not in k


def test_upstream_version_is_kept_until_drop_and_continue_keeps_resolutions(
    proj2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for n in ("j-creates.patch", "k-needs.patch"):
        (proj2 / "patches" / n).unlink()
    (proj2 / "series").write_text("".join(f"{n}\n" for n in ("g-own.patch", "h-declared.patch", "i-partly.patch")))
    assert tool(proj2, "rebase", "--to", "v2.0.0") == 1  # stops at i-partly
    rt = proj2 / "build/rebase-v2.0.0"
    git(rt, "rm", "-q", "python/sglang/srt/v1_worker.py")
    (rt / "python/sglang/srt/server_args.py").write_text(
        SA.replace("x5 = 5\n", "x5 = 5000\n").replace("x30 = 30\n", "x30 = 300\n")
    )
    git(rt, "add", "-A")
    capsys.readouterr()
    assert tool(proj2, "rebase", "--to", "v2.0.0", "--continue") == 1  # resolved, but two upstream patches
    err = capsys.readouterr().err
    assert "g-own.patch (already upstream), h-declared.patch (already upstream) would leave it" in err
    assert "CONTINUE=1 DROP=1" in err
    assert json.loads((proj2 / "sglang.lock").read_text())["ref"] == "v1.0.0"
    assert tool(proj2, "rebase", "--to", "v2.0.0", "--continue", "--drop") == 0
    out = capsys.readouterr().out
    assert "| i-partly.patch | conflict resolved by hand |" in out
    assert (proj2 / "series").read_text() == "i-partly.patch\n"
    assert "+x5 = 5000" in (proj2 / "patches/i-partly.patch").read_text()
    assert tool(proj2, "apply") == 0


def test_similar_name_hint() -> None:
    from tools.rebase_port import _similar

    added = (
        "python/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
        "python/sglang/test/x_cuda_graph_runner.py",
        "python/sglang/srt/speculative/eagle_worker_v2.py",
    )
    assert _similar("python/sglang/srt/model_executor/cuda_graph_runner.py", added) == [added[0]]
    assert _similar("python/sglang/srt/speculative/eagle_worker.py", added) == []


# -- Requires: and Superseded-By: ----------------------------------------------------------------
@pytest.fixture
def proj3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    needs = header("Q needs P", extra="Requires: p-conflict.patch\n")
    superseded = header("R superseded", extra="Superseded-By: v2.0.0 its own switch for x20\n")
    edits = [
        (header("P conflict"), {"python/sglang/srt/delete_me.py": "gone = False\n"}),
        (needs, {"python/sglang/srt/crlf.txt": "ALPHA\r\nbeta\r\ngamma\r\n"}),  # would port exactly on its own
        (superseded, {"python/sglang/srt/server_args.py": SA.replace("x20 = 20\n", "x20 = 2000\n")}),
    ]
    root = _project_with_patches(tmp_path, monkeypatch, V1, "", edits)
    make_upstream(tmp_path / "up", V2, "v2.0.0")
    return root


def test_a_patch_whose_requirement_did_not_port_is_blocked(proj3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "Requires: p-conflict.patch" in (proj3 / "patches/q-needs-p.patch").read_text()  # refresh keeps it
    assert tool(proj3, "check") == 0
    assert tool(proj3, "rebase", "--to", "v2.0.0", "--check") == 1
    rows = {
        ln.split(" | ")[1]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and " | " in ln
    }
    assert "| conflict |" in rows["p-conflict.patch"]
    assert "| blocked | requires p-conflict.patch (conflict), which did not port |" in rows["q-needs-p.patch"]
    r = rows["r-superseded.patch"]
    assert "| offset (refreshed) |" in r
    assert "upstream serves this patch's purpose since v2.0.0: its own switch for x20; review whether to drop it" in r


def test_superseded_note_waits_for_its_release(proj3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (proj3 / "patches/r-superseded.patch").read_text().replace("Superseded-By: v2.0.0", "Superseded-By: v3.0.0")
    (proj3 / "patches/r-superseded.patch").write_text(text)
    assert tool(proj3, "rebase", "--to", "v2.0.0", "--check") == 1
    assert "review whether to drop it" not in capsys.readouterr().out


def test_a_damaged_patch_is_refused_before_it_ports(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = proj / "patches/b-offset.patch"
    path.write_text(path.read_text().replace("+x20 = 2000", "+x20 = 2001"))  # a hand edit
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0", "--check") == 1
    err = capsys.readouterr().err
    assert "b-offset.patch: python/sglang/srt/server_args.py: damaged: after the patch the file has blob" in err
    assert "not rebasing a damaged series" in err
    assert snapshot(proj) == before
