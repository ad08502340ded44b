#!/usr/bin/env python3
"""Plot an upager benchmark report (JSON written by upager-bench) as a PNG.

Usage: python3 bench/plot.py REPORT.json OUT.png

One bar group per variant (thread count, folio size, ...), one bar per engine,
height = median of the scenario's metric over the interleaved rounds, with the
min..max of the rounds as an error bar and the ratio vs the kernel on top.
Scenarios that time single accesses (random-read, multi-fault) get a second
panel with each engine's p50 and p99 latency (log scale); scenarios with
phases (numpy) get a second panel with each phase's rate as a ratio of the
baseline engine's (numpy.memmap = 1).
Exit status 3 means matplotlib is missing (pip install -r bench/requirements.txt).
"""
import json
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.stderr.write("matplotlib is missing: pip install -r bench/requirements.txt\n")
    sys.exit(3)

LABELS = {"ElapsedS": "elapsed (s, lower is better)", "OpsPerS": "operations/s (higher is better)",
          "SysS": "system CPU (s, lower is better)"}


def main(src, dst):
    with open(src) as f:
        rep = json.load(f)
    rows = rep["summary"]
    variants, engines = [], []
    for r in rows:
        if r["variant"] not in variants:
            variants.append(r["variant"])
        if r["engine"] not in engines:
            engines.append(r["engine"])
    by = {(r["variant"], r["engine"]): r for r in rows}
    width = 0.8 / max(1, len(engines))
    latency = any(r.get("latency_p50_ns") for r in rows)
    phases = rep.get("phase_names") or []
    base_w = max(6, 1.4 * len(variants) * max(1, len(engines)) / 2 + 3)
    if latency or phases:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(2 * min(base_w, 8), 4.5))
    else:
        fig, ax = plt.subplots(figsize=(base_w, 4.5))
        ax2 = None
    for i, e in enumerate(engines):
        xs, ys, lo, hi, notes = [], [], [], [], []
        for j, v in enumerate(variants):
            r = by.get((v, e))
            if not r or r["runs"] == 0 or r["value"] is None:
                continue
            xs.append(j + (i - (len(engines) - 1) / 2) * width)
            ys.append(r["value"])
            mn, mx = r["range"]
            lo.append(max(0.0, r["value"] - mn))
            hi.append(max(0.0, mx - r["value"]))
            notes.append(r.get("vs_kernel"))
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=e, color=f"C{i}")
        for b, n in zip(bars, notes):
            if n is not None and e != rep.get("baseline_engine", "kernel"):
                ax.annotate(f"{n:.2f}×", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=8)
    vals = [r["value"] for r in rows if r.get("value")]
    if vals and min(vals) > 0 and max(vals) / min(vals) > 50:
        ax.set_yscale("log")
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants)
    ax.set_ylabel(LABELS.get(rep["metric"], rep["metric"]))
    m = rep["machine"]
    seed = rep["seed"].split(" ")[0] if rep["seed"][:1].isdigit() else rep["seed"].split(" (")[0]
    ax.set_title(f"{rep['scenario']} — seed {seed}\n"
                 f"{m['nproc']} CPUs, Linux {m['kernel']}, {rep['date']}", fontsize=10)
    ax.legend(fontsize=8)
    if ax2 is not None and latency:
        latency_panel(ax2, rows, variants, engines, by)
    elif ax2 is not None:
        phase_panel(ax2, rows, engines, phases, rep.get("baseline_engine", "kernel"))
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


def latency_panel(ax, rows, variants, engines, by):
    """p50 (solid) and p99 (hatched, stacked above p50) of each engine, µs."""
    width = 0.8 / max(1, len(engines))
    lows = [r["latency_p50_ns"] / 1000 for r in rows if r.get("latency_p50_ns")]
    for i, e in enumerate(engines):
        xs, p50, p99 = [], [], []
        for j, v in enumerate(variants):
            r = by.get((v, e))
            if not r or r.get("latency_p50_ns") is None:
                continue
            xs.append(j + (i - (len(engines) - 1) / 2) * width)
            p50.append(r["latency_p50_ns"] / 1000)
            p99.append(r["latency_p99_ns"] / 1000)
        ax.bar(xs, p50, width, label=f"{e} p50", color=f"C{i}")
        ax.bar(xs, [b - a for a, b in zip(p50, p99)], width, bottom=p50, alpha=0.35,
               color=f"C{i}", hatch="//")
    ax.set_yscale("log")
    if lows:
        ax.set_ylim(bottom=min(lows) / 2)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants)
    ax.set_ylabel("latency of one access, µs (p50 solid, p99 hatched; log)")
    ax.set_title("access latency (p50, p99)", fontsize=10)
    ax.legend(fontsize=7)


def phase_panel(ax, rows, engines, phases, baseline):
    """Each phase's rate as a ratio of the baseline engine's."""
    width = 0.8 / max(1, len(engines))
    for i, e in enumerate(engines):
        r = next((x for x in rows if x["engine"] == e), None)
        vs = (r or {}).get("phases_vs_kernel") or {}
        pts = [(j + (i - (len(engines) - 1) / 2) * width, vs[p]) for j, p in enumerate(phases) if p in vs]
        if not pts:
            continue
        xs, ys = zip(*pts)
        bars = ax.bar(xs, ys, width, label=e, color=f"C{i}")
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.2f}×", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(phases)))
    ax.set_xticklabels(phases)
    ax.set_ylabel(f"rate vs {baseline} (higher is better)")
    ax.set_title("per phase", fontsize=10)
    ax.legend(fontsize=7)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
