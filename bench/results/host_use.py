"""What each of a server's processes did on the host over one level (bench.run.host_sampling reads
it from /proc), and results.md's table of the scheduler's.

At small batches a v2 speculative step waits on its host, and on one H100 the same server's host
ran the same calls 1.4-1.5x slower after it had speculated at C=250 (docs/measurements.md, GPU 25),
and a switching server's 1.22x slower than an always-speculating one's with the same calls. Where
the scheduler's main thread ran, how often it was preempted or moved between CPUs, which other
thread took CPU time beside it and how its memory grew tell a slower core, a busy neighbour or a
larger heap apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.results.fields import Fields

SCHEDULER = "sglang::sched"  # the title SGLang gives a scheduler (sglang::scheduler_TP0), or its first 15 characters


@dataclass(frozen=True)
class ProcessUse:
    """One server process over one level."""

    name: str  # SGLang's process title (sglang::scheduler_TP0), else the kernel's name for it
    cpu_s: float  # user and system CPU time of all its threads
    main_cpu_s: float  # its main thread's
    busiest_other: str  # the name of its other thread with the most CPU time ("": none ran)
    busiest_other_cpu_s: float
    involuntary_switches: int  # the main thread's preemptions
    migrations: int | None  # the main thread's moves between CPUs (None: the kernel does not say)
    threads: int  # at the level's end
    rss_mb: float  # at the level's end

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str) -> ProcessUse:
        r = Fields(data, where)
        out = cls(
            name=r.text("name"),
            cpu_s=r.number("cpu_s"),
            main_cpu_s=r.number("main_cpu_s"),
            busiest_other=r.text("busiest_other"),
            busiest_other_cpu_s=r.number("busiest_other_cpu_s"),
            involuntary_switches=r.integer("involuntary_switches"),
            migrations=r.nullable(r.integer, "migrations"),
            threads=r.integer("threads"),
            rss_mb=r.number("rss_mb"),
        )
        r.closed()
        return out


def scheduler(processes: Sequence[ProcessUse]) -> ProcessUse | None:
    """The first rank's scheduler: the process that runs the decode loop."""
    return next((p for p in sorted(processes, key=lambda p: p.name) if SCHEDULER in p.name), None)


def cell(p: ProcessUse, wall_s: float) -> str:
    busy = f"{100 * p.main_cpu_s / wall_s:.0f}%" if wall_s > 0 else "-"
    other = f"{p.busiest_other} {p.busiest_other_cpu_s:.1f} s" if p.busiest_other else "none"
    moved = "?" if p.migrations is None else str(p.migrations)
    return f"{busy}; {other}; {p.involuntary_switches} / {moved}; {p.threads}; {p.rss_mb:.0f} MB"


def section(levels_by_config: Mapping[str, Sequence[tuple[int, float, Sequence[ProcessUse]]]]) -> list[str]:
    """The table, with a row per config whose levels sampled a scheduler: (concurrency, wall_s, processes)."""
    rows = {
        name: {c: cell(s, wall) for c, wall, procs in levels if (s := scheduler(procs)) is not None}
        for name, levels in levels_by_config.items()
    }
    rows = {name: cells for name, cells in rows.items() if cells}
    if not rows:
        return []
    columns = sorted({c for cells in rows.values() for c in cells})
    out = [
        "The scheduler process on the host over each level (/proc): its main thread's CPU time over the "
        "level's wall time; its busiest other thread and that thread's CPU time; the main thread's "
        "preemptions / moves between CPUs; its threads and resident memory at the level's end. A v2 "
        "speculative step at small batches waits on this thread.",
        "",
        "| config | " + " | ".join(f"C={c}" for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name, cells in rows.items():
        out.append(f"| {name} | " + " | ".join(cells.get(c, "") for c in columns) + " |")
    return out + [""]


def compile_lines(levels_by_config: Mapping[str, Sequence[tuple[int, int | None]]]) -> list[str]:
    """The levels in which the server compiled Triton kernels: (concurrency, compiles) per config."""
    cells = [
        f"`{name}` C={c}: {n}"
        for name, levels in levels_by_config.items()
        for c, n in levels
        if n is not None and n > 0
    ]
    if not cells:
        return []
    return [
        "Triton kernels compiled during measured levels (new entries in the server's Triton cache: shapes "
        "the warm-up did not meet, each a stall of the step that met them): " + "; ".join(cells) + ".",
        "",
    ]
