"""A config's profile records (bench.results.profile's summaries) and their results.json form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.results import profile_compare
from bench.results.fields import Fields, ResultsError, ranked_row
from bench.results.host_calls import HostCalls, beyond
from bench.results.profile import ProfileSummary, ProfileWindow, markdown


@dataclass(frozen=True)
class ProfileRecord:
    """The profile of one wave at `concurrency` after a config's levels: a summary, or why there is none."""

    concurrency: int
    summary: ProfileSummary | None = None
    error: str | None = None
    window: ProfileWindow = ProfileWindow.FULL_BATCH

    def __post_init__(self) -> None:
        if (self.summary is None) == (self.error is None):
            raise ValueError("a profile has either a summary or an error")

    def to_json(self) -> dict[str, Any]:
        head: dict[str, Any] = {"concurrency": self.concurrency}
        if self.window is not ProfileWindow.FULL_BATCH:  # absent: full-batch, as files before it have it
            head["profiled_steps"] = self.window.value
        if self.summary is None:
            return {**head, "error": self.error}
        s = self.summary
        return {
            **head,
            "window_ms": s.window_ms,
            "gpu_busy_ms": s.gpu_busy_ms,
            "gpu_idle_fraction": s.gpu_idle_fraction,
            "kernels": s.kernels,
            "top_cpu_ops": [list(row) for row in s.top_cpu_ops],
            "top_kernels": [list(row) for row in s.top_kernels],
            "top_runtime_calls": [list(row) for row in s.top_runtime_calls],
            "note": s.note,
            # Absent without --profile-stacks, as files before it have it.
            **({"host_calls": [asdict(h) for h in s.host_calls]} if s.host_calls else {}),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> ProfileRecord:
        r = Fields(data, where)
        c = r.integer("concurrency")
        window = _window(r.opt(r.text, "profiled_steps") or ProfileWindow.FULL_BATCH.value, f"{where}.profiled_steps")
        if r.has("error"):
            out = cls(c, error=r.text("error"), window=window)
        else:

            def ranked(key: str) -> list[tuple[str, float, int]]:
                return [ranked_row(row, f"{where}.{key}[{i}]") for i, row in enumerate(r.items(key))]

            out = cls(
                c,
                ProfileSummary(
                    window_ms=r.number("window_ms"),
                    gpu_busy_ms=r.number("gpu_busy_ms"),
                    gpu_idle_fraction=r.number("gpu_idle_fraction"),
                    kernels=r.integer("kernels"),
                    top_cpu_ops=ranked("top_cpu_ops"),
                    top_kernels=ranked("top_kernels"),
                    top_runtime_calls=ranked("top_runtime_calls"),
                    note=r.text("note"),
                    host_calls=[
                        _host_calls(h, f"{where}.host_calls[{i}]")
                        for i, h in enumerate(r.opt(r.items, "host_calls") or [])
                    ],
                ),
                window=window,
            )
        r.closed()
        return out


def profiles_from_json(value: Any, where: str) -> tuple[ProfileRecord, ...]:
    """A run that profiled one level wrote its profile alone, as every run before lists did."""
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(ProfileRecord.from_json(p, f"{where}[{i}]") for i, p in enumerate(value))
    return (ProfileRecord.from_json(value, where),)


def _window(value: str, where: str) -> ProfileWindow:
    try:
        return ProfileWindow(value)
    except ValueError:
        raise ResultsError(
            f"{where}: {value!r} is not a profile window ({', '.join(w.value for w in ProfileWindow)})"
        ) from None


def _host_calls(data: Any, where: str) -> HostCalls:
    r = Fields(data, where)
    out = HostCalls(
        r.text("function"), r.integer("launches"), r.integer("copies"), r.integer("syncs"), r.number("sync_ms")
    )
    r.closed()
    return out


def section(profiles: Mapping[str, tuple[ProfileRecord, ...]], references: Mapping[str, Sequence[str]]) -> list[str]:
    """results.md's profiles: each config's, and against each of its references (the plain server, and
    the configs it is compared with: a switch's always-speculating server) profiled at the same level
    and window, its times over theirs and, where both were traced with stacks, the host calls it made
    beyond theirs."""
    out = []
    for name, records in profiles.items():
        for p in records:
            if p.summary is None:
                out.append(f"- `{name}` at C={p.concurrency}: failed: {p.error}")
                continue
            out += markdown(name, p.concurrency, p.summary, p.window)
            for reference in references.get(name, ()):
                out += _against(p.summary, reference, _same_level(p, profiles.get(reference, ())))
    return out


def _same_level(p: ProfileRecord, theirs: tuple[ProfileRecord, ...]) -> ProfileSummary | None:
    return next((q.summary for q in theirs if (q.concurrency, q.window) == (p.concurrency, p.window)), None)


def _against(mine: ProfileSummary, reference: str, theirs: ProfileSummary | None) -> list[str]:
    if theirs is None:
        return []
    ratios = profile_compare.compare(mine, theirs)
    out = [profile_compare.markdown(reference, ratios)] if ratios else []
    if mine.host_calls and theirs.host_calls:
        extra = beyond(mine.host_calls, theirs.host_calls)
        listed = ", ".join(f"{h.function} +{h.launches}/+{h.copies}/+{h.syncs}" for h in extra) or "none"
        out.append(f"  - host calls beyond `{reference}`'s (launches/copies/syncs): {listed}")
    return out
