"""The closed-loop sweep's plot: output tok/s against concurrency, one line per config."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from bench.results.analysis import series
from bench.results.records import Analysis, RunResults, levels_of


def write_throughput_plot(run: RunResults, analysis: Analysis, path: Path) -> Path | None:
    """PNG of tok/s against concurrency (log x); None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not levels_of(run):
        return None
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for name, c in run.configs.items():
        s = series(c.levels)
        if s:
            xs = sorted(s)
            ax.plot(xs, [s[x] for x in xs], marker="o", label=name, linestyle="--" if "switch" in name else "-")
    rec = analysis.recommendation
    if rec and rec.crossover:
        ax.axvline(rec.crossover, color="grey", linestyle=":", label=f"crossover C~{rec.crossover:.1f}")
    concurrency_axis(ax, levels_of(run))
    ax.set_ylabel("output tokens / s")
    title = run.meta.get("title") or "throughput vs concurrency"
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path


def save_png(fig: Any, path: Path) -> None:
    """A figure as a 256-colour PNG: a third of the bytes of matplotlib's RGBA one, so the plots kept
    in docs/ stay within its size budget (a line plot has far fewer colours than that)."""
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def concurrency_axis(ax: Any, levels: list[int]) -> None:
    """A plot's x axis: the run's concurrency levels, on a log scale, labelled as plain numbers."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_xticks(levels)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("concurrency (requests in flight)")
