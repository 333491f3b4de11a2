"""One sweep split across runs: each config's ratio to its references, taken inside the run that
measured it, laid side by side per level (never a rate of one run against a rate of another).

A sweep too long for one device call is run in parts, each with its own nospec. Merging the parts'
configs (`bench report A B`) would compare one run's switch with another run's nospec; this keeps
each ratio within its run and states, per level, how far the runs' own nospec rates lie apart
(the cross-run noise the ratios cannot see).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.configs import BASELINE_NOSPEC, declared_references
from bench.results import plot, records
from bench.results.analysis import series
from bench.results.records import Analysis, RateKey, RunResults

RATIO_TARGET = 0.97  # the switch's goal against the better reference (report.py bolds below 0.95)
RATE_LABELS: dict[RateKey, str] = {"tok_per_s": "output tok/s", "decode_tok_per_s": "decode-step tok/s"}


@dataclass(frozen=True)
class Part:
    """One run of a split sweep: its label (its folder's name), records and analysis."""

    label: str
    run: RunResults
    analysis: Analysis


@dataclass(frozen=True)
class RunRatio:
    """A config's ratio at one level, from one run, the references that run had and those it lacked."""

    part: str
    ratio: float
    refs: tuple[str, ...]
    missing: tuple[str, ...] = ()


Ratios = dict[str, dict[int, tuple[RunRatio, ...]]]  # config -> level -> one per run that measured it


def ratios_by_level(parts: Sequence[Part], key: RateKey) -> Ratios:
    """Each config's ratio to max(its references present in the same run), per level, per run."""
    out: Ratios = {}
    for p in parts:
        table = p.analysis.ratios if key == "tok_per_s" else p.analysis.decode_ratios
        for name, by_level in table.items():
            declared = declared_references(name, p.run.configs[name].compare_to)
            refs = tuple(r for r in declared if r in p.run.configs)
            missing = tuple(r for r in declared if r not in p.run.configs)
            for level, ratio in by_level.items():
                cell = out.setdefault(name, {}).setdefault(level, ())
                out[name][level] = (*cell, RunRatio(p.label, ratio, refs, missing))
    return out


def baseline_spread(parts: Sequence[Part], key: RateKey, name: str = BASELINE_NOSPEC) -> dict[int, float]:
    """Per level measured by two runs or more: fastest / slowest - 1 of the baseline across runs."""
    by_level: dict[int, list[float]] = {}
    for p in parts:
        if name in p.run.configs:
            for level, rate in series(p.run.configs[name].levels, key).items():
                by_level.setdefault(level, []).append(rate)
    return {c: max(v) / min(v) - 1 for c, v in sorted(by_level.items()) if len(v) > 1}


def levels_of(parts: Sequence[Part]) -> list[int]:
    return sorted({c for p in parts for c in records.levels_of(p.run)})


def markdown(parts: Sequence[Part]) -> str:
    levels = levels_of(parts)
    out = [
        f"Runs: {', '.join(f'`{p.label}`' for p in parts)}. Each ratio is taken inside the run named beside it, "
        'against the best of the config\'s references that run measured ("vs nospec only": the run lacked the others). '
        f"Below {RATIO_TARGET} in bold.",
        "",
    ]
    for key, label in RATE_LABELS.items():
        ratios = ratios_by_level(parts, key)
        if not ratios:
            continue
        out += [
            f"{label[0].upper()}{label[1:]}, ratio per level:",
            "",
            "| config | " + " | ".join(f"C={c}" for c in levels) + " |",
            "|---|" + "---|" * len(levels),
        ]
        for name, by_level in ratios.items():
            out.append(f"| {name} | " + " | ".join(_cell(by_level.get(c, ())) for c in levels) + " |")
        spread = baseline_spread(parts, key)
        if spread:
            out.append(
                f"| {BASELINE_NOSPEC} across runs (spread) | "
                + " | ".join(f"{100 * spread[c]:.0f}%" if c in spread else "" for c in levels)
                + " |"
            )
        out.append("")
    return "\n".join(out)


def _cell(ratios: tuple[RunRatio, ...]) -> str:
    return "<br>".join(
        (f"**{r.ratio:.2f}**" if r.ratio < RATIO_TARGET else f"{r.ratio:.2f}")
        + f" ({r.part}"
        + (f", vs {'/'.join(r.refs)} only" if r.missing else "")
        + ")"
        for r in ratios
    )


def write_plot(parts: Sequence[Part], path: Path, title: str) -> Path | None:
    """Ratio against concurrency (log x), one line per config and run, hollow where the run lacked a
    reference; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=120, sharey=True)
    for ax, (key, label) in zip(axes, RATE_LABELS.items(), strict=True):
        for name, by_level in ratios_by_level(parts, key).items():
            for part in dict.fromkeys(r.part for cell in by_level.values() for r in cell):
                points = sorted((c, r) for c, cell in by_level.items() for r in cell if r.part == part)
                (line,) = ax.plot([c for c, _ in points], [r.ratio for _, r in points], label=f"{name} ({part})")
                for c, r in points:
                    ax.plot(c, r.ratio, marker="o", color=line.get_color(), fillstyle="none" if r.missing else "full")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.axhline(RATIO_TARGET, color="grey", linestyle=":", label=f"{RATIO_TARGET}")
        plot.concurrency_axis(ax, levels_of(parts))
        ax.set_title(
            f"{label}: ratio to the best reference in its run\n(hollow: a reference missing from that run)", fontsize=9
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ratio")
    axes[0].legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 120), fontsize=9)
    fig.tight_layout()
    plot.save_png(fig, path)
    plt.close(fig)
    return path


def write(parts: Sequence[Part], out: Path, title: str) -> list[Path]:
    """split.md and (with matplotlib) split.png in out."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / "split.md"
    md.write_text(f"# {title}\n\n" + markdown(parts), encoding="utf-8")
    png = write_plot(parts, out / "split.png", title)
    return [md, png] if png else [md]
