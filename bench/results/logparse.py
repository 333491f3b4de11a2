"""Parse what the patched server reports about the speculation switch.

Tolerant of small format changes. Recognised:
- state lines: ``spec-switch: on=<bool> spec_steps=<int> fallback_steps=<int> switches=<int>`` or
  ``spec steps: A, fallback steps: B, switches: C`` (cumulative counters);
- events: ``speculation OFF at bs=<n>`` / ``speculation ON at bs=<n>``;
- SGLang's ``Decode batch, #running-req: N, ... cuda graph: True|False, gen throughput (token/s): T``
  lines, and its ``Prefill batch`` lines (an interval with a prefill is not a steady decode);
- the rank from the log prefix ``[... TP<k>]`` (rank 0 when absent);
- Prometheus counters ``sglang:spec_switch_{spec_steps,fallback_steps,switches}_total`` and the
  learned threshold ``sglang:spec_switch_threshold`` (read with prometheus_client's parser);
- a learning switch's changes: ``spec-switch: threshold A -> B (...); ... tok/s spec/plain
  (acceptance) by batch size: L: S/P (A), ...; surely pays up to N`` (0014);
- CUDA graph capture: ``Capture cuda graph bs [..]`` followed by ``Capture cuda graph end`` (the
  target's own set) or ``Capture plain-decode cuda graph ... end`` (the plain-decode graphs patch's set), with their
  ``Time elapsed: X s`` and ``mem usage=Y GB``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

_RANK = re.compile(r"\bTP(\d+)\b")
_STATE = re.compile(
    r"spec[-_ ]switch:?\s*on[=:]\s*(?P<on>\w+)\W+spec[_ ]steps[=:]\s*(?P<spec>\d+)\W+"
    r"fallback[_ ]steps[=:]\s*(?P<fb>\d+)\W+switches[=:]\s*(?P<sw>\d+)",
    re.I,
)
_STATE_ALT = re.compile(
    r"spec steps:\s*(?P<spec>\d+),\s*fallback steps:\s*(?P<fb>\d+),\s*switches:\s*(?P<sw>\d+)", re.I
)
_EVENT = re.compile(r"speculation\s+(?P<dir>OFF|ON)\s+at\s+bs\s*=\s*(?P<bs>\d+)", re.I)
_DECODE = re.compile(r"Decode batch\b.*?#running-req:\s*(?P<bs>\d+)", re.I)
_GRAPH = re.compile(r"cuda graph:\s*(?P<g>True|False)", re.I)
_GEN = re.compile(r"gen throughput \(token/s\):\s*(?P<t>[\d.]+)", re.I)
_ACCEPT_LEN = re.compile(r"accept len:\s*(?P<a>[\d.]+)", re.I)
_CAPTURE_BS = re.compile(r"Capture cuda graph bs \[(?P<bs>[\d,\s]*)\]")
_CAPTURE_END = re.compile(
    r"Capture (?P<plain>plain-decode )?cuda graph\b.*?\bend\b.*?Time elapsed:\s*(?P<s>[\d.]+)\s*s"
    r".*?mem usage=\s*(?P<gb>[-\d.]+)\s*GB"
)
_THRESHOLD_CHANGE = re.compile(
    r"spec-switch: threshold \d+ -> (?P<new>\d+)\b.*?by batch size:(?P<buckets>[^;]*);"
    r"\s*surely pays up to (?P<sure>\d+)"
)
_BUCKET = re.compile(r"(?P<lower>\d+):\s*[\d.]+/[\d.]+")
PROFILING = "Profiling starts"  # SGLang's log line when /start_profile begins
METRIC_KEYS = {"spec_steps": "spec_steps", "fallback_steps": "fallback_steps", "switches": "switches"}


def _bool(s: str) -> bool:
    return s.strip().lower() in ("true", "1", "yes", "on")


def rank_of(line: str) -> int:
    head = line[: line.find("]") + 1] if line.startswith("[") else line[:80]
    m = _RANK.search(head)
    return int(m.group(1)) if m else 0


@dataclass
class Counters:
    spec_steps: int = 0
    fallback_steps: int = 0
    switches: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"spec_steps": self.spec_steps, "fallback_steps": self.fallback_steps, "switches": self.switches}


@dataclass
class DecodeLine:
    rank: int
    batch_size: int
    cuda_graph: bool | None
    spec_on: bool | None  # the switch state when the line was written (None: unknown)
    line: str
    gen_tok_per_s: float | None = None  # over the steps since the previous decode line
    # Those steps were all decodes at this batch size: no prefill ran since the previous decode
    # line, which had the same batch size.
    steady: bool = False
    # Tokens per request per verify step over those steps (accepted drafts + 1), on speculative servers.
    accept_len: float | None = None
    # The switch's cumulative step counters as the line prints them (None: a server without the switch);
    # two lines' difference tells the kinds of step between them.
    counters: Counters | None = None
    # Prefill batches the rank ran since its previous decode line (their time is in this line's interval).
    prefills: int = 0


@dataclass
class RankLog:
    rank: int
    counters: Counters | None = None  # last state line
    events: list[tuple[str, int]] = field(default_factory=list)  # ("OFF"|"ON", batch size)
    decode: list[DecodeLine] = field(default_factory=list)


@dataclass(frozen=True)
class GraphSet:
    kind: str  # "target" (the runner's own set: verify on a speculative server) or "plain-decode"
    sizes: tuple[int, ...]
    seconds: float
    gigabytes: float


@dataclass(frozen=True)
class ThresholdChange:
    """A learning switch's logged change of threshold (rank 0), with what it was learnt from: the
    batch-size buckets timed in both modes, and where speculation surely pays by the bounds."""

    threshold: int
    timed: tuple[int, ...]  # each bucket's lower batch size
    sure: int


def threshold_changes(text: str) -> list[ThresholdChange]:
    """The learned threshold's changes in the log, in order (rank 0's, the entry rank that learns)."""
    out = []
    for line in text.splitlines():
        m = _THRESHOLD_CHANGE.search(line)
        if m and rank_of(line) == 0:
            timed = tuple(int(b.group("lower")) for b in _BUCKET.finditer(m.group("buckets")))
            out.append(ThresholdChange(int(m.group("new")), timed, int(m.group("sure"))))
    return out


def captured_graph_sets(text: str, rank: int = 0) -> list[GraphSet]:
    """The target model's CUDA graph sets of one rank, in capture order."""
    sets: list[GraphSet] = []
    sizes: tuple[int, ...] = ()
    for line in text.splitlines():
        if "Capture" not in line or rank_of(line) != rank:
            continue
        m = _CAPTURE_BS.search(line)
        if m:
            sizes = tuple(int(x) for x in m.group("bs").replace(",", " ").split())
            continue
        e = _CAPTURE_END.search(line)
        if e and sizes:
            kind = "plain-decode" if e.group("plain") else "target"
            sets.append(GraphSet(kind, sizes, float(e.group("s")), float(e.group("gb"))))
            sizes = ()
    return sets


def parse_log(text: str) -> dict[int, RankLog]:
    ranks: dict[int, RankLog] = {}
    state: dict[int, bool | None] = {}
    prefilled: dict[int, int] = {}  # prefill batches each rank ran since its last decode line
    for line in text.splitlines():
        if "Prefill batch" in line:
            r = rank_of(line)
            prefilled[r] = prefilled.get(r, 0) + 1
            continue
        if "spec" not in line.lower() and "Decode batch" not in line:
            continue
        r = rank_of(line)
        rl = ranks.setdefault(r, RankLog(r))
        own_state: bool | None = None
        own_counters: Counters | None = None
        m = _STATE.search(line)
        if m:
            own_state = _bool(m.group("on"))
            rl.counters = own_counters = Counters(int(m.group("spec")), int(m.group("fb")), int(m.group("sw")))
        else:
            m2 = _STATE_ALT.search(line)
            if m2:
                rl.counters = own_counters = Counters(int(m2.group("spec")), int(m2.group("fb")), int(m2.group("sw")))
        e = _EVENT.search(line)
        if e:
            d = e.group("dir").upper()
            rl.events.append((d, int(e.group("bs"))))
            state[r] = d == "ON"
        d_m = _DECODE.search(line)
        if d_m:
            g = _GRAPH.search(line)
            t = _GEN.search(line)
            a = _ACCEPT_LEN.search(line)
            on = own_state if own_state is not None else state.get(r)
            bs = int(d_m.group("bs"))
            prefills = prefilled.pop(r, 0)
            steady = bool(rl.decode) and rl.decode[-1].batch_size == bs and not prefills
            rl.decode.append(
                DecodeLine(
                    r,
                    bs,
                    _bool(g.group("g")) if g else None,
                    on,
                    line,
                    float(t.group("t")) if t else None,
                    steady,
                    float(a.group("a")) if a else None,
                    own_counters,
                    prefills,
                )
            )
        if own_state is not None:
            state[r] = own_state
    return ranks


def before_profile(text: str) -> str:
    """The log up to the bench's profile after the levels: its steps run under the profiler."""
    return text.split(PROFILING)[0]


def _samples(text: str) -> Iterator[Sample]:
    """The samples of a /metrics page, as far as prometheus_client's parser reads it (a page cut
    short ends the samples there)."""
    try:
        for family in text_string_to_metric_families(text):
            yield from family.samples
    except ValueError:
        return


def parse_metrics(text: str) -> Counters | None:
    """Sum the spec-switch counters over label sets; None when none is exported."""
    found: dict[str, float] = {}
    for sample in _samples(text):
        name = sample.name
        if "spec_switch_" not in name or name.endswith("_created"):
            continue
        base = name.split("spec_switch_", 1)[1]
        base = base[: -len("_total")] if base.endswith("_total") else base
        if base in METRIC_KEYS:
            found[base] = found.get(base, 0.0) + sample.value
    if not found:
        return None
    return Counters(int(found.get("spec_steps", 0)), int(found.get("fallback_steps", 0)), int(found.get("switches", 0)))


def parse_threshold(text: str) -> int | None:
    """The learned switch threshold (``sglang:spec_switch_threshold``); None when not exported."""
    for sample in _samples(text):
        if sample.name == "sglang:spec_switch_threshold":
            return int(sample.value)
    return None


def counters_from_log(text: str, rank: int = 0) -> Counters | None:
    rl = parse_log(text).get(rank)
    return rl.counters if rl else None
