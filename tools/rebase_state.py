"""What a rebase has done so far, kept in the rebase tree across a conflict; and its report."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from tools.gitutil import Git
from tools.progress import count_summary
from tools.rebase_port import PatchOutcome, RebaseStatus

STATE_FILE = "sglang-rebase.json"


# -- state across a conflict ----------------------------------------------------------------
@dataclass(frozen=True)
class State:
    old_ref: str
    new_ref: str
    old_base: str
    old_head: str
    new_base: str
    names: tuple[str, ...]
    outcomes: tuple[PatchOutcome, ...] = ()
    conflict_head: str = ""  # HEAD when the rebase stopped at a conflict

    @property
    def complete(self) -> bool:
        return len(self.outcomes) == len(self.names) and not (
            self.outcomes and self.outcomes[-1].status is RebaseStatus.CONFLICT
        )

    def with_outcomes(self, outcomes: list[PatchOutcome]) -> State:
        return replace(self, outcomes=tuple(outcomes))

    def save(self, repo: Git) -> None:
        data = {
            **asdict(self),
            "outcomes": [{"name": o.name, "status": o.status.value, "detail": o.detail} for o in self.outcomes],
        }
        (repo.path / ".git" / STATE_FILE).write_text(json.dumps(data, indent=1))

    @staticmethod
    def load(repo: Git) -> State | None:
        p = repo.path / ".git" / STATE_FILE
        if not p.exists():
            return None
        data = json.loads(p.read_text())
        outcomes = tuple(
            PatchOutcome(o["name"], RebaseStatus(o["status"]), o.get("detail", "")) for o in data.pop("outcomes")
        )
        return State(**{**data, "names": tuple(data["names"]), "outcomes": outcomes})


# -- report ---------------------------------------------------------------------------------
def report_markdown(state: State, outcomes: list[PatchOutcome], range_diff: str, note: str) -> str:
    lines = [f"# Rebase report: {state.old_ref} -> {state.new_ref}", ""]
    if note:
        lines += [note, ""]
    lines += ["Summary: " + count_summary((o.status.value for o in outcomes), "empty series"), ""]
    lines += ["| # | patch | status | detail |", "|---|---|---|---|"]
    for i, o in enumerate(outcomes, 1):
        lines.append(f"| {i} | {o.name} | {o.status.value} | {o.detail.replace('|', '/')} |")
    pending = state.names[len(outcomes) :]
    for j, n in enumerate(pending, len(outcomes) + 1):
        lines.append(f"| {j} | {n} | not reached | |")
    lines += [
        "",
        "## Range-diff (old series vs ported series)",
        "",
        "```",
        range_diff.rstrip() or "(no commits)",
        "```",
        "",
    ]
    return "\n".join(lines)


def _range_diff(repo: Git, state: State) -> str:
    new_head = repo.head() or state.new_base
    if new_head == state.new_base or state.old_head == state.old_base:
        # range-diff refuses an empty range; say plainly what was not carried over
        old = repo.out("log", "--reverse", "--format=%h %s", f"{state.old_base}..{state.old_head}")
        return "no ported commits; the old series was:\n" + (old or "(empty)")
    res = repo.run(
        "range-diff", "--no-color", f"{state.old_base}..{state.old_head}", f"{state.new_base}..{new_head}", check=False
    )
    return res.stdout if res.returncode == 0 else f"(range-diff failed: {res.stderr.strip()})"
