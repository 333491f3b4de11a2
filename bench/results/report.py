"""Results: JSON (the source of truth), CSV, Markdown table, PNG plot (if matplotlib is present).

The writers take a run's records (bench.results.records.RunResults) and their analysis (`analyse`); the
results.json layout is documented at the top of bench/results.py.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path

from bench.configs import (
    AGAIN,
    BASELINE_NOSPEC,
    BASELINE_SPEC,
    OWN_TREES,
    declared_references,
    first_traffic_name,
)
from bench.results import host_use, open_report
from bench.results.analysis import Recommendation, best_of_ratios, recommend, series
from bench.results.learned import learned_lines
from bench.results.plot import write_throughput_plot
from bench.results.profile_records import section as profile_section
from bench.results.records import Analysis, ConfigRecord, LevelRecord, RateKey, RunResults, levels_of

RATIO_TARGET = 0.95


def analyse(run: RunResults) -> Analysis:
    """The recommendations and ratios from the configs' levels."""
    cfgs = run.configs
    s = {name: series(c.levels) for name, c in cfgs.items()}
    nospec = s.get(BASELINE_NOSPEC)
    rec = recommend(nospec, s[BASELINE_SPEC]) if nospec is not None and BASELINE_SPEC in s else None
    # one recommendation per always-speculative config (the switch configs use their baseline's)
    recs: dict[str, Recommendation] = {}
    for name, c in cfgs.items():
        # a second traffic's records (-then) are not compared with the first traffic's nospec
        if (
            nospec is not None
            and name in s
            and name != BASELINE_NOSPEC
            and _always_speculative(c)
            and not first_traffic_name(name)
        ):
            recs[name] = recommend(nospec, s[name])
    decode = {name: series(c.levels, "decode_tok_per_s") for name, c in cfgs.items()}
    return Analysis(
        recommendation=rec,
        recommendations=recs,
        ratios=_ratios(cfgs, s),
        decode_ratios=_ratios(cfgs, {k: v for k, v in decode.items() if v}),
    )


def _always_speculative(c: ConfigRecord) -> bool:
    """Speculating at every level: not our switch, nor upstream's adaptive mode, whose off tiers
    would pass for speculation that never pays."""
    flags = c.flags or ()
    load_based = ("--speculative-disable-batch-size", "--speculative-adaptive")
    return "--speculative-algorithm" in flags and not any(f in flags for f in load_based)


def _ratios(cfgs: Mapping[str, ConfigRecord], s: Mapping[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """config / max(its compare_to configs) per level."""
    ratios: dict[str, dict[int, float]] = {}
    for name, c in cfgs.items():
        present = [r for r in declared_references(name, c.compare_to) if r in s]
        if present and name in s:
            ratios[name] = best_of_ratios(s[name], *(s[r] for r in present))
    return ratios


def merge(*parts: RunResults) -> RunResults:
    """Combine several runs' results (later ones win per config)."""
    out = RunResults(meta={})
    for p in parts:
        out.meta.update(p.meta)
        out.configs.update(p.configs)
        out.extra.update(p.extra)
    return out


def write_json(run: RunResults, analysis: Analysis, path: Path) -> Path:
    # Not sort_keys: `bench report` draws its tables in the order the configs ran.
    path.write_text(json.dumps(run.to_json(analysis), indent=2) + "\n", encoding="utf-8")
    return path


CSV_FIELDS = [
    "config",
    "concurrency",
    "requests",
    "output_tokens",
    "wall_s",
    "tok_per_s",
    "errors",
    "spec_steps",
    "fallback_steps",
    "switches",
    "ratio_to_best",
    "decode_tok_per_s",
    "decode_ratio_to_best",
]


def write_csv(run: RunResults, analysis: Analysis, path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for name, c in run.configs.items():
            for lv in c.levels:
                cnt = lv.counters
                r = analysis.ratios.get(name, {}).get(lv.concurrency)
                dr = analysis.decode_ratios.get(name, {}).get(lv.concurrency)
                w.writerow(
                    {
                        "config": name,
                        "concurrency": lv.concurrency,
                        "requests": lv.requests,
                        "output_tokens": lv.output_tokens,
                        "wall_s": f"{lv.wall_s:.3f}",
                        "tok_per_s": f"{lv.tok_per_s:.1f}",
                        "errors": len(lv.errors),
                        "spec_steps": "" if cnt is None else cnt.spec_steps,
                        "fallback_steps": "" if cnt is None else cnt.fallback_steps,
                        "switches": "" if cnt is None else cnt.switches,
                        "ratio_to_best": "" if r is None else f"{r:.3f}",
                        "decode_tok_per_s": "" if lv.decode_tok_per_s is None else f"{lv.decode_tok_per_s:.1f}",
                        "decode_ratio_to_best": "" if dr is None else f"{dr:.3f}",
                    }
                )
    return path


def markdown(run: RunResults, analysis: Analysis) -> str:
    levels = levels_of(run)
    cfgs = run.configs
    rec = analysis.recommendation
    spec_row = (
        ["| spec / nospec | " + " | ".join(f"{rec.ratios[c]:.2f}" if c in rec.ratios else "" for c in levels) + " |"]
        if rec and rec.ratios
        else []
    )
    lines = _table(cfgs, levels, "tok_per_s", analysis.ratios, spec_row)
    out = ["Output tokens per second (all requests' output tokens / wall time of the level).", "", *lines, ""]
    out = out if levels else []  # an open-loop run alone: no closed-loop table
    if levels and analysis.ratios:
        out.append(f"Ratios below {RATIO_TARGET} are in bold.")
        out.append("")
    out += _wave_lines(cfgs, levels)
    out += _prefill_lines(cfgs, levels)
    if analysis.decode_ratios or any(lv.decode_tok_per_s for c in cfgs.values() for lv in c.levels):
        out += [
            "Decode-step throughput at bs = C: the median of the server's own `gen throughput` log lines "
            "with `#running-req` = C over intervals of decode steps only (no prefill, no change of batch "
            "size; count in brackets). It leaves out the client, the HTTP stack and the level's ramp-up "
            "and tail, so it isolates the cost of a step.",
            "",
            *_accept_len_caption(cfgs),
            *_table(cfgs, levels, "decode_tok_per_s", analysis.decode_ratios),
            "",
        ]
    out += host_use.section({n: [(lv.concurrency, lv.wall_s, lv.host) for lv in c.levels] for n, c in cfgs.items()})
    out += host_use.compile_lines(
        {n: [(lv.concurrency, lv.triton_compiles) for lv in c.levels] for n, c in cfgs.items()}
    )
    out += open_report.markdown_lines(run)
    out += _noise_lines(run, analysis)
    out += _recommendation_lines(analysis) if levels else []  # none from an open loop alone
    out += learned_lines(run)
    if run.meta:
        out.append(
            "Run: " + ", ".join(f"{k}={v}" for k, v in sorted(run.meta.items()) if not isinstance(v, (dict, list)))
        )
        out.append("")
    for name, c in cfgs.items():
        if first := first_traffic_name(name):
            out.append(f"- `{name}`: `{first}`'s server, after it, on the prompts of then_prompts")
            continue
        env = " ".join(f"{k}={v}" for k, v in c.env.items())
        own = run.meta.get(OWN_TREES, {}).get(name)
        out.append(
            f"- `{name}`: `{(env + ' ') if env else ''}{' '.join(c.flags or ()) or '(no speculation flags)'}`"
            + (f", served from a tree of its own: `{Path(own).name}`" if own else "")
        )
    startup = [startup_line(name, c) for name, c in cfgs.items() if c.startup_s is not None]
    if startup:
        out += ["", "Start-up (server up, s) and the target's CUDA graph sets (batch sizes, capture s, GB):", ""]
        out += startup
    if any(c.profiles for c in cfgs.values()):
        out += [
            "",
            "Profiles (SGLang's torch profiler, rank 0; GPU idle = the window less the union of GPU events):",
            "",
        ]
        references = {
            name: [r for r in dict.fromkeys((BASELINE_NOSPEC, *c.compare_to)) if r != name] for name, c in cfgs.items()
        }
        out += profile_section({name: c.profiles for name, c in cfgs.items() if c.profiles}, references)
    return "\n".join(out) + "\n"


def _accept_len_caption(cfgs: Mapping[str, ConfigRecord]) -> list[str]:
    """How a speculative cell's rate was taken; absent from runs before it was (their rates are the
    steady intervals' own)."""
    if not any(lv.decode_accept_len is not None for c in cfgs.values() for lv in c.levels):
        return []
    return [
        "Cells with A: each steady interval's speculative steps counted at A tokens per request, the mean "
        "accept len over the speculative steps of all decode lines at bs = C, not at the interval's own "
        "(an interval that only speculated: its tok/s x A / its accept len). On a speculative server few "
        "intervals hold no prefill, and their acceptance is not the level's.",
        "",
    ]


def _wave_lines(cfgs: Mapping[str, ConfigRecord], levels: list[int]) -> list[str]:
    """The spread of each level's waves: how much of a ratio above is this run's noise within a level."""
    if not any(len(lv.wave_tok_per_s) > 1 for c in cfgs.values() for lv in c.levels):
        return []
    sent = any(lv.wave_send_spread_s for c in cfgs.values() for lv in c.levels)
    lines = [
        "Output tok/s of the level's waves, slowest-fastest (spread: fastest / slowest - 1)"
        + (
            ", and the longest span over which the client sent one wave's requests (a closed loop sends "
            "each as one finishes)"
            if sent
            else ""
        )
        + ". A slow first wave or wave boundary moves the level's rate above without changing its steps.",
        "",
        *_header(levels),
    ]
    for name, c in cfgs.items():
        by = {lv.concurrency: lv for lv in c.levels}
        lines.append(f"| {name} | " + " | ".join(_wave_cell(by.get(lvl)) for lvl in levels) + " |")
    return lines + [""]


def _prefill_lines(cfgs: Mapping[str, ConfigRecord], levels: list[int]) -> list[str]:
    """Each level's prefill batches, where the servers' logs were read."""
    if not any(lv.prefill_batches is not None for c in cfgs.values() for lv in c.levels):
        return []
    out = [
        "Prefill batches per level (the server's log). In a closed loop whose requests all ask for the "
        "same tokens, a plain server's requests finish at one step and their successors come in one "
        "batch; requests that finish steps apart (after any speculative step) bring one each, and the "
        "decode steps wait for every one. Traffic of varied lengths or arrivals does that to every server.",
        "",
        *_header(levels),
    ]
    for name, c in cfgs.items():
        batches = {lv.concurrency: lv.prefill_batches for lv in c.levels}
        cells = ("" if batches.get(level) is None else str(batches[level]) for level in levels)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out + [""]


def _wave_cell(level: LevelRecord | None) -> str:
    if level is None:
        return ""
    cell = _spread(level.wave_tok_per_s)
    if cell and level.wave_send_spread_s:
        cell += f", sent within {1000 * max(level.wave_send_spread_s):.0f} ms"
    return cell


def _header(levels: list[int]) -> list[str]:
    """A per-level table's first two lines: one column per concurrency."""
    return ["| config | " + " | ".join(f"C={c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]


def _spread(waves: tuple[float, ...]) -> str:
    if len(waves) < 2:
        return ""
    return f"{min(waves):.0f}-{max(waves):.0f} ({100 * (max(waves) / min(waves) - 1):.0f}%)"


def _noise_lines(run: RunResults, analysis: Analysis) -> list[str]:
    """Each config served twice (--repeat): how far its second run is from its first, per kind of rate."""
    out = []
    for name in run.configs:
        if not name.endswith(AGAIN):
            continue
        for label, ratios in (("output tok/s", analysis.ratios), ("decode-step tok/s", analysis.decode_ratios)):
            rs = list(ratios.get(name, {}).values())
            if rs:
                apart = 100 * max(abs(1 - r) for r in rs)
                out.append(
                    f"- Run-to-run noise, `{name[: -len(AGAIN)]}` served twice: {label} second/first "
                    f"{min(rs):.2f}-{max(rs):.2f} over the levels (at most {apart:.1f}% apart)."
                )
    return out + [""] if out else []


def _recommendation_lines(analysis: Analysis) -> list[str]:
    out: list[str] = []
    rec = analysis.recommendation
    if rec:
        out.append(f"**Recommendation** ({rec.kind}): {rec.message}")
        if rec.flags:
            out += ["", "```", rec.flags, "```"]
        for n in rec.notes:
            out.append(f"- note: {n}")
        out.append("")
    for name, r in analysis.recommendations.items():
        if name != BASELINE_SPEC:
            out.append(f"- `{name}` vs nospec ({r.kind}): {r.message}" + (f": `{r.flags}`" if r.flags else ""))
    if analysis.recommendations:
        out.append("")
    return out


def _table(
    cfgs: Mapping[str, ConfigRecord],
    levels: list[int],
    key: RateKey,
    ratios: Mapping[str, Mapping[int, float]],
    extra_rows: list[str] | None = None,
) -> list[str]:
    """One row per config, then extra_rows, then each config's ratio to its references."""
    lines = _header(levels)
    for name, c in cfgs.items():
        by = {lv.concurrency: lv for lv in c.levels}
        cells = []
        for lvl in levels:
            lv = by.get(lvl)
            value = None if lv is None else lv.rate(key)
            if lv is None or value is None:
                cells.append("")
            elif lv.errors:
                cells.append(f"{value:.0f} ({len(lv.errors)} err)")
            elif key == "decode_tok_per_s" and lv.decode_accept_len is not None:
                cells.append(f"{value:.0f} ({lv.decode_lines}, A {lv.decode_accept_len:.2f})")
            elif key == "decode_tok_per_s":
                cells.append(f"{value:.0f} ({lv.decode_lines})")
            else:
                cells.append(f"{value:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += extra_rows or []
    for name, rs in ratios.items():
        refs = cfgs[name].compare_to
        label = f"{name} / max({', '.join(r for r in refs if r in cfgs)})"
        lines.append(
            f"| {label} | "
            + " | ".join(
                (f"**{rs[c]:.2f}**" if rs[c] < RATIO_TARGET else f"{rs[c]:.2f}") if c in rs else "" for c in levels
            )
            + " |"
        )
    return lines


def startup_line(name: str, c: ConfigRecord) -> str:
    sets = "; ".join(
        f"{g.kind} bs {g.sizes[0]}..{g.sizes[-1]} ({len(g.sizes)} sizes) {g.seconds:.1f} s {g.gigabytes:.2f} GB"
        for g in c.graph_sets or ()
    )
    return f"- `{name}`: up in {c.startup_s:.0f} s" + (f"; {sets}" if sets else "")


def write_markdown(run: RunResults, analysis: Analysis, path: Path) -> Path:
    path.write_text(markdown(run, analysis), encoding="utf-8")
    return path


def write_all(run: RunResults, out: Path, plot: bool = True) -> tuple[Analysis, dict[str, Path | None]]:
    """Analyse the run and write results.json, .csv, .md and (with plot) throughput.png and
    open-loop.png to out."""
    out.mkdir(parents=True, exist_ok=True)
    analysis = analyse(run)
    return analysis, {
        "json": write_json(run, analysis, out / "results.json"),
        "csv": write_csv(run, analysis, out / "results.csv"),
        "md": write_markdown(run, analysis, out / "results.md"),
        "png": write_throughput_plot(run, analysis, out / "throughput.png") if plot else None,
        "open_png": open_report.write_plot(run, out / "open-loop.png") if plot else None,
    }
