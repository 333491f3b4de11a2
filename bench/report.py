"""Results: JSON (the source of truth), CSV, Markdown table, PNG plot (if matplotlib is present).

Results layout (results.json):
    {"meta": {...}, "configs": {name: {"flags": [...], "env": {...}, "compare_to": [...],
      "levels": [{"concurrency", "requests", "output_tokens", "wall_s", "tok_per_s", "errors",
                  "counters": {"spec_steps", "fallback_steps", "switches"} | null,
                  "decode_tok_per_s", "decode_lines"}]}},
     "recommendation": {...}, "ratios": {config: {concurrency: ratio}},
     "decode_ratios": {config: {concurrency: ratio}}}
"""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from bench.analysis import best_of_ratios, recommend, series
from bench.configs import BASELINE_NOSPEC, BASELINE_SPEC, CONFIGS
from bench.logparse import decode_throughput_by_batch_size
from bench.profile import markdown as profile_markdown

RATIO_TARGET = 0.95


def analyse(results: dict[str, Any]) -> dict[str, Any]:
    """Fill in "recommendation" and "ratios" from the configs' levels (in place; returns it)."""
    cfgs = results.get("configs", {})
    s = {name: series(c.get("levels", [])) for name, c in cfgs.items()}
    if BASELINE_NOSPEC in s and BASELINE_SPEC in s:
        results["recommendation"] = recommend(s[BASELINE_NOSPEC], s[BASELINE_SPEC]).as_dict()
    # one recommendation per always-speculative config (the switch configs use their baseline's)
    recs = {}
    for name, c in cfgs.items():
        if BASELINE_NOSPEC in s and name in s and name != BASELINE_NOSPEC and "--speculative-algorithm" in (c.get("flags") or []) \
                and not any(f == "--speculative-disable-batch-size" for f in c.get("flags") or []):
            recs[name] = recommend(s[BASELINE_NOSPEC], s[name]).as_dict()
    results["recommendations"] = recs
    results["ratios"] = _ratios(cfgs, s)
    decode = {name: series(c.get("levels", []), "decode_tok_per_s") for name, c in cfgs.items()}
    results["decode_ratios"] = _ratios(cfgs, {k: v for k, v in decode.items() if v})
    return results


def _ratios(cfgs: dict[str, Any], s: dict[str, dict[int, float]]) -> dict[str, dict[str, float]]:
    """config / max(its compare_to configs) per level."""
    ratios: dict[str, dict[str, float]] = {}
    for name, c in cfgs.items():
        refs = c.get("compare_to") or (list(CONFIGS[name].compare_to) if name in CONFIGS else [])
        refs = [r for r in refs if r in s]
        if refs and name in s:
            ratios[name] = {str(k): v for k, v in best_of_ratios(s[name], *(s[r] for r in refs)).items()}
    return ratios


def fill_decode_rates(config: dict[str, Any], log_text: str) -> None:
    """Give each level the median of the server's steady decode throughput at bs = its concurrency."""
    by_bs = decode_throughput_by_batch_size(log_text)
    for lv in config.get("levels", []):
        rates = by_bs.get(int(lv["concurrency"]), [])
        lv["decode_lines"] = len(rates)
        lv["decode_tok_per_s"] = round(statistics.median(rates), 1) if rates else None


def merge(*parts: dict[str, Any]) -> dict[str, Any]:
    """Combine several runs' results (later ones win per config)."""
    out: dict[str, Any] = {"meta": {}, "configs": {}}
    for p in parts:
        out["meta"].update(p.get("meta", {}))
        out["configs"].update(p.get("configs", {}))
    return analyse(out)


def levels_of(results: dict[str, Any]) -> list[int]:
    return sorted({int(lv["concurrency"]) for c in results["configs"].values() for lv in c.get("levels", [])})


def write_json(results: dict[str, Any], path: Path) -> Path:
    # Not sort_keys: `bench report` draws its tables in the order the configs ran.
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return path


CSV_FIELDS = ["config", "concurrency", "requests", "output_tokens", "wall_s", "tok_per_s", "errors",
              "spec_steps", "fallback_steps", "switches", "ratio_to_best", "decode_tok_per_s", "decode_ratio_to_best"]


def write_csv(results: dict[str, Any], path: Path) -> Path:
    ratios = results.get("ratios", {})
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for name, c in results["configs"].items():
            for lv in c.get("levels", []):
                cnt = lv.get("counters") or {}
                r = ratios.get(name, {}).get(str(lv["concurrency"]))
                dr = results.get("decode_ratios", {}).get(name, {}).get(str(lv["concurrency"]))
                w.writerow({
                    "config": name, "concurrency": lv["concurrency"], "requests": lv.get("requests", ""),
                    "output_tokens": lv.get("output_tokens", ""), "wall_s": f"{float(lv.get('wall_s', 0)):.3f}",
                    "tok_per_s": f"{float(lv.get('tok_per_s', 0)):.1f}", "errors": len(lv.get("errors") or []),
                    "spec_steps": cnt.get("spec_steps", ""), "fallback_steps": cnt.get("fallback_steps", ""),
                    "switches": cnt.get("switches", ""), "ratio_to_best": "" if r is None else f"{r:.3f}",
                    "decode_tok_per_s": "" if lv.get("decode_tok_per_s") is None else f"{lv['decode_tok_per_s']:.1f}",
                    "decode_ratio_to_best": "" if dr is None else f"{dr:.3f}",
                })
    return path


def markdown(results: dict[str, Any]) -> str:
    levels = levels_of(results)
    cfgs = results["configs"]
    rec = results.get("recommendation")
    spec_row = ["| spec / nospec | " + " | ".join(
        f"{rec['ratios'][str(c)]:.2f}" if str(c) in rec["ratios"] else "" for c in levels) + " |"] \
        if rec and rec.get("ratios") else []
    lines = _table(cfgs, levels, "tok_per_s", results.get("ratios", {}), spec_row)
    out = ["Output tokens per second (all requests' output tokens / wall time of the level).", "", *lines, ""]
    if results.get("ratios"):
        out.append(f"Ratios below {RATIO_TARGET} are in bold.")
        out.append("")
    if results.get("decode_ratios") or any(lv.get("decode_tok_per_s") for c in cfgs.values() for lv in c.get("levels", [])):
        out += ["Decode-step throughput at bs = C: the median of the server's own `gen throughput` log lines "
                "with `#running-req` = C over intervals of decode steps only (no prefill, no change of batch "
                "size; count in brackets). It leaves out the client, the HTTP stack and the level's ramp-up "
                "and tail, so it isolates the cost of a step.", "",
                *_table(cfgs, levels, "decode_tok_per_s", results.get("decode_ratios", {})), ""]
    if rec:
        out.append(f"**Recommendation** ({rec['kind']}): {rec['message']}")
        if rec.get("flags"):
            out += ["", "```", rec["flags"], "```"]
        for n in rec.get("notes") or []:
            out.append(f"- note: {n}")
        out.append("")
    for name, r in (results.get("recommendations") or {}).items():
        if name != BASELINE_SPEC:
            out.append(f"- `{name}` vs nospec ({r['kind']}): {r['message']}" + (f": `{r['flags']}`" if r.get("flags") else ""))
    if results.get("recommendations"):
        out.append("")
    meta = results.get("meta", {})
    if meta:
        out.append("Run: " + ", ".join(f"{k}={v}" for k, v in sorted(meta.items()) if not isinstance(v, (dict, list))))
        out.append("")
    for name, c in cfgs.items():
        env = " ".join(f"{k}={v}" for k, v in (c.get("env") or {}).items())
        out.append(f"- `{name}`: `{(env + ' ') if env else ''}{' '.join(c.get('flags') or []) or '(no speculation flags)'}`")
    startup = [startup_line(name, c) for name, c in cfgs.items() if c.get("startup_s") is not None]
    if startup:
        out += ["", "Start-up (server up, s) and the target's CUDA graph sets (batch sizes, capture s, GB):", ""]
        out += startup
    profiled = [(name, c["profile"]) for name, c in cfgs.items() if c.get("profile")]
    if profiled:
        out += ["", "Profiles (SGLang's torch profiler, rank 0; GPU idle = the window less the union of GPU events):", ""]
        for name, p in profiled:
            out += ([f"- `{name}` at C={p['concurrency']}: failed: {p['error']}"] if p.get("error")
                    else profile_markdown(name, p["concurrency"], p))
    return "\n".join(out) + "\n"


def _table(cfgs: dict[str, Any], levels: list[int], key: str, ratios: dict[str, dict[str, float]],
           extra_rows: list[str] | None = None) -> list[str]:
    """One row per config, then extra_rows, then each config's ratio to its references."""
    lines = ["| config | " + " | ".join(f"C={c}" for c in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for name, c in cfgs.items():
        by = {int(lv["concurrency"]): lv for lv in c.get("levels", [])}
        cells = []
        for lvl in levels:
            lv = by.get(lvl)
            if lv is None or lv.get(key) is None:
                cells.append("")
            elif lv.get("errors"):
                cells.append(f"{float(lv[key]):.0f} ({len(lv['errors'])} err)")
            elif key == "decode_tok_per_s":
                cells.append(f"{float(lv[key]):.0f} ({lv.get('decode_lines', '?')})")
            else:
                cells.append(f"{float(lv[key]):.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += extra_rows or []
    for name, rs in ratios.items():
        refs = cfgs[name].get("compare_to") or []
        label = f"{name} / max({', '.join(r for r in refs if r in cfgs)})"
        lines.append(f"| {label} | " + " | ".join(
            (f"**{rs[str(c)]:.2f}**" if rs[str(c)] < RATIO_TARGET else f"{rs[str(c)]:.2f}") if str(c) in rs else ""
            for c in levels) + " |")
    return lines


def startup_line(name: str, c: dict[str, Any]) -> str:
    sets = "; ".join(f"{g['kind']} bs {g['sizes'][0]}..{g['sizes'][-1]} ({len(g['sizes'])} sizes) "
                     f"{g['seconds']:.1f} s {g['gigabytes']:.2f} GB" for g in c.get("graph_sets") or [])
    return f"- `{name}`: up in {c['startup_s']:.0f} s" + (f"; {sets}" if sets else "")


def write_markdown(results: dict[str, Any], path: Path) -> Path:
    path.write_text(markdown(results), encoding="utf-8")
    return path


def write_plot(results: dict[str, Any], path: Path) -> Path | None:
    """PNG of tok/s against concurrency (log x); None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for name, c in results["configs"].items():
        s = series(c.get("levels", []))
        if s:
            xs = sorted(s)
            ax.plot(xs, [s[x] for x in xs], marker="o", label=name, linestyle="--" if "switch" in name else "-")
    rec = results.get("recommendation") or {}
    if rec.get("crossover"):
        ax.axvline(rec["crossover"], color="grey", linestyle=":", label=f"crossover C~{rec['crossover']:.1f}")
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xticks(levels_of(results))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens / s")
    title = results.get("meta", {}).get("title") or "throughput vs concurrency"
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_all(results: dict[str, Any], out: Path) -> dict[str, Path | None]:
    out.mkdir(parents=True, exist_ok=True)
    analyse(results)
    return {
        "json": write_json(results, out / "results.json"),
        "csv": write_csv(results, out / "results.csv"),
        "md": write_markdown(results, out / "results.md"),
        "png": write_plot(results, out / "throughput.png"),
    }
