"""A server's processes read from /proc before and after a level (bench.results.host_use says why),
and the kernels Triton compiled meanwhile.

The server runs in a process group of its own (bench.run.server.Server), so its processes are those
of that group: the launcher, each rank's scheduler, the detokenizer. Linux only; elsewhere, or for a
process gone between two reads, there is simply no sample. Triton writes each kernel it compiles to
a directory of its own in its cache: new ones during a level are compiles the warm-up did not do
(a shape first met there), each a stall of the step that met it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.results.host_use import ProcessUse

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ThreadSample:
    tid: int
    name: str
    cpu_s: float
    involuntary_switches: int
    migrations: int | None


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    name: str
    cpu_s: float  # every thread's, those ended included
    threads: tuple[ThreadSample, ...]  # the main thread first
    rss_mb: float


def _stat_fields(text: str) -> tuple[str, list[str]]:
    """The name in parentheses (it may hold spaces and parentheses) and the fields after it."""
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def _status_value(text: str, key: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _thread(task: Path) -> ThreadSample | None:
    """None: the thread ended while it was read."""
    try:
        name, fields = _stat_fields((task / "stat").read_text())
        status = (task / "status").read_text()
    except OSError:
        return None
    try:
        sched = (task / "sched").read_text()
    except OSError:  # kernels without scheduler statistics
        sched = ""
    moved = next((line.split(":")[1] for line in sched.splitlines() if line.startswith("se.nr_migrations")), None)
    return ThreadSample(
        tid=int(task.name),
        name=name,
        cpu_s=_cpu_s(fields),
        involuntary_switches=_status_value(status, "nonvoluntary_ctxt_switches") or 0,
        migrations=None if moved is None else int(moved),
    )


def _title(pid_dir: Path, comm: str) -> str:
    first = (pid_dir / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
    return first if first.startswith("sglang::") else comm


def sample(pid: int, proc: Path = PROC) -> ProcessSample | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return _sample(proc / str(pid), stat)


def _sample(pid_dir: Path, stat: str) -> ProcessSample | None:
    """None: the process ended while it was read, or this is not Linux's /proc."""
    pid = int(pid_dir.name)
    try:
        comm, fields = _stat_fields(stat)
        tasks = sorted(pid_dir.glob("task/*"), key=lambda t: (t.name != str(pid), t.name))
        threads = [t for t in map(_thread, tasks) if t is not None]
        if not threads or threads[0].tid != pid:
            return None  # its main thread gone: the process is
        rss_kb = _status_value((pid_dir / "status").read_text(), "VmRSS") or 0
        return ProcessSample(pid, _title(pid_dir, comm), _cpu_s(fields), tuple(threads), rss_kb / 1024)
    except (OSError, ValueError, IndexError):
        return None


def group(pgid: int, proc: Path = PROC) -> dict[int, ProcessSample]:
    """Every process of the process group, sampled (each one's stat read once)."""
    out = {}
    for pid_dir in proc.glob("[0-9]*"):
        try:
            stat = (pid_dir / "stat").read_text()
        except OSError:
            continue
        fields = _stat_fields(stat)[1]
        if len(fields) > 2 and fields[2] == str(pgid) and (s := _sample(pid_dir, stat)) is not None:
            out[s.pid] = s
    return out


def triton_cache(env: Mapping[str, str]) -> Path:
    """Where a process with this environment keeps Triton's compiled kernels (Triton's own rule)."""
    if env.get("TRITON_CACHE_DIR"):
        return Path(env["TRITON_CACHE_DIR"])
    return Path(env.get("TRITON_HOME") or Path.home()) / ".triton" / "cache"


def cache_entries(cache: Path) -> int | None:
    """None: no cache yet (nothing compiled, or not Triton's layout)."""
    try:
        return sum(1 for entry in cache.iterdir() if entry.is_dir())
    except OSError:
        return None


@dataclass(frozen=True)
class HostSample:
    processes: dict[int, ProcessSample]
    triton_entries: int | None


@dataclass(frozen=True)
class ServerHost:
    """What to read of one running server: its process group, and its Triton cache."""

    group: int
    triton_cache: Path

    def sample(self) -> HostSample:
        return HostSample(group(self.group), cache_entries(self.triton_cache))


@dataclass(frozen=True)
class LevelUse:
    processes: tuple[ProcessUse, ...] = ()
    triton_compiles: int | None = None  # None: not sampled, or no Triton cache


def level_use(before: HostSample | None, after: HostSample | None) -> LevelUse:
    if before is None or after is None:
        return LevelUse()
    compiles = None
    if after.triton_entries is not None:
        compiles = after.triton_entries - (before.triton_entries or 0)
    return LevelUse(use_between(before.processes, after.processes), compiles)


def use_between(before: dict[int, ProcessSample], after: dict[int, ProcessSample]) -> tuple[ProcessUse, ...]:
    """What each process sampled at both ends did in between (a thread born meanwhile counts whole;
    one ended meanwhile counts in the process's CPU time only)."""
    return tuple(_use(before[pid], after[pid]) for pid in sorted(after) if pid in before)


def _use(before: ProcessSample, after: ProcessSample) -> ProcessUse:
    earlier = {t.tid: t for t in before.threads}

    def spent(t: ThreadSample) -> float:
        return t.cpu_s - (earlier[t.tid].cpu_s if t.tid in earlier else 0.0)

    main, *others = after.threads
    main_before = earlier.get(main.tid, ThreadSample(main.tid, main.name, 0.0, 0, 0))
    busiest = max(others, key=spent, default=None)
    busiest_s = spent(busiest) if busiest else 0.0
    moved = None
    if main.migrations is not None and main_before.migrations is not None:
        moved = main.migrations - main_before.migrations
    return ProcessUse(
        name=after.name,
        cpu_s=round(after.cpu_s - before.cpu_s, 2),
        main_cpu_s=round(spent(main), 2),
        busiest_other=busiest.name if busiest and busiest_s > 0 else "",
        busiest_other_cpu_s=round(busiest_s, 2) if busiest_s > 0 else 0.0,
        involuntary_switches=main.involuntary_switches - main_before.involuntary_switches,
        migrations=moved,
        threads=len(after.threads),
        rss_mb=round(after.rss_mb, 1),
    )
