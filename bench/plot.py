#!/usr/bin/env python3
"""Plot an upager benchmark report (JSON written by upager-bench) as a PNG.

Usage: python3 bench/plot.py REPORT.json OUT.png

One bar group per variant (thread count, folio size, ...), one bar per engine,
height = median of the scenario's metric over the interleaved rounds, with the
min..max of the rounds as an error bar and the ratio vs the kernel on top.
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
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(variants) * max(1, len(engines)) / 2 + 3), 4.5))
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
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=e)
        for b, n in zip(bars, notes):
            if n is not None and e != "kernel":
                ax.annotate(f"{n:.2f}×", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=8)
    vals = [r["value"] for r in rows if r.get("value")]
    if vals and min(vals) > 0 and max(vals) / min(vals) > 50:
        ax.set_yscale("log")
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants)
    ax.set_ylabel(LABELS.get(rep["metric"], rep["metric"]))
    m = rep["machine"]
    ax.set_title(f"{rep['scenario']} — seed {rep['seed'].split(' ')[0]}\n"
                 f"{m['nproc']} CPUs, Linux {m['kernel']}, {rep['date']}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
