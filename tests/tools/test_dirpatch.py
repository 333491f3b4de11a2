from pathlib import Path

import pytest

from tools.dirpatch import apply_to_directory
from tools.errors import ApplyError
from tools.patchfile import parse_patch_text, read_patch, reversed_patch

from conftest import UPSTREAM_FILES, git, make_upstream

DATA = Path(__file__).parent / "data"


def _files(root) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and ".git" not in f.parts
    }


def _multi_hunk_patch(tmp_path) -> str:
    """A patch git wrote, whose hunks move the lines below them (so its two sides' line numbers differ)."""
    repo = make_upstream(tmp_path / "made")
    f = repo / "python/sglang/srt/server_args.py"
    lines = f.read_text().splitlines(keepends=True)
    lines[4:5] = ["x5 = 5\n", "x5b = 55\n", "x5c = 555\n"]
    lines[30:32] = ["x31 = 3100\n"]
    f.write_text("".join(lines))
    diff = git(repo, "diff", "--full-index") + "\n"
    return (DATA / "exact.patch").read_text().split("diff --git")[0] + diff


@pytest.mark.parametrize("name", ["exact.patch", "no-newline.patch", "rename.patch", "create-delete.patch", "multi"])
def test_a_patch_then_its_reverse_give_what_git_gives_and_then_the_base_back(tmp_path, name) -> None:
    text = _multi_hunk_patch(tmp_path) if name == "multi" else (DATA / name).read_text()
    patch = parse_patch_text(text, name)
    by_git = make_upstream(tmp_path / "git")
    (tmp_path / "p.patch").write_text(text)
    git(by_git, "apply", str(tmp_path / "p.patch"))
    ours = make_upstream(tmp_path / "ours")

    apply_to_directory(patch, ours)
    assert _files(ours) == _files(by_git)

    changed = apply_to_directory(reversed_patch(patch), ours)
    assert _files(ours) == {k: v.encode() for k, v in UPSTREAM_FILES.items()}
    assert changed and set(changed) <= {fp.source for fp in patch.files} | {fp.target for fp in patch.files}


def test_a_reverse_that_does_not_apply_names_the_hunk_and_writes_nothing(tmp_path) -> None:
    patch = read_patch(DATA / "exact.patch")
    root = make_upstream(tmp_path / "tree")
    apply_to_directory(patch, root)
    # A later change to the lines the patch wrote: undoing it alone is no longer possible.
    args = root / "python/sglang/srt/server_args.py"
    args.write_text(args.read_text().replace("x20 = 2000\n", "x20 = 2001\n"))
    before = _files(root)

    with pytest.raises(ApplyError) as e:
        apply_to_directory(reversed_patch(patch), root)
    msg = str(e.value)
    assert "exact.patch (reversed): python/sglang/srt/server_args.py: hunk @@ -17,7 +17,7 @@" in msg
    assert "expected: 'x20 = 2000\\n'" in msg and "actual:   'x20 = 2001\\n'" in msg
    assert msg.splitlines()[-1].endswith(
        "1 of 1 hunk(s) do not apply exactly to " + str(root) + "; nothing was written"
    )
    assert _files(root) == before


def test_a_reverse_whose_lines_a_later_change_moved_applies_only_when_offsets_are_allowed(tmp_path) -> None:
    patch = read_patch(DATA / "exact.patch")
    root = make_upstream(tmp_path / "tree")
    apply_to_directory(patch, root)
    args = root / "python/sglang/srt/server_args.py"
    args.write_text("x0 = 0\n" + args.read_text())  # a later patch's line above the hunk

    with pytest.raises(ApplyError, match=r"applies 1 line\(s\) below where it says \(line 17 -> 18\)"):
        apply_to_directory(reversed_patch(patch), root)
    apply_to_directory(reversed_patch(patch), root, allow_offset=True)
    assert args.read_text() == "x0 = 0\n" + UPSTREAM_FILES["python/sglang/srt/server_args.py"]
