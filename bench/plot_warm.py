"""Plots warm-start results (crates/bench/examples/warm-start.rs --out).

    python3 bench/plot_warm.py OUT.png RESULT.json [RESULT.json ...]

One group of bars per result file (its source, data kind and added
latency): the median time of each engine (on demand, replayed, a trace of
other rows) relative to on demand's, with each run as a dot, so the spread
of the interleaved rounds shows beside the median. What it shows: how much
a replayed trace saves on each kind of store, and that a trace of other
inputs costs little.
"""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(r):
    src = r.get("source", "file")
    kind = "file" if src == "file" else src.split("://")[0]
    extra = r.get("added_latency_ms", 0)
    work = r.get("work_ns", 0)
    if r.get("workload") == "model":
        what = f"model of {r['file_mib']} MiB\n({r['rows'] // 100} lookups + 48 layers)"
    else:
        what = f"{r['rows']} rows of {r['file_mib']} MiB"
    parts = [kind, r.get("data", "compressible"), what, f"budget {r['budget_mib']} MiB"]
    if extra:
        parts.append(f"+{extra} ms/request")
    if work:
        parts.append(f"{work / 1000:g} µs/row")
    return "\n".join(parts)


def rel_bars(ax, groups, engines):
    """One group of bars per entry of ``groups`` (a dict: engine -> its
    runs' times): each engine's median time relative to the first engine's
    median, each run a dot. Engines a group lacks are left out."""
    width = 0.8 / len(engines)
    for g, times in enumerate(groups):
        base = statistics.median(times[engines[0]])
        for k, e in enumerate(engines):
            if not times.get(e):
                continue
            x = g + (k - (len(engines) - 1) / 2) * width
            rel = [s / base for s in times[e]]
            ax.bar(x, statistics.median(rel), width, color=f"C{k}",
                   label=e if g == 0 else None)
            ax.plot([x] * len(rel), rel, "k.", markersize=4)


def main(out, paths):
    results = [json.load(open(p)) for p in paths]
    engines = [e["engine"] for e in results[0]["engines"]]
    fig, ax = plt.subplots(figsize=(2.2 + 3.0 * len(results), 4.6))
    rel_bars(ax, [{e["engine"]: e["secs"] for e in r["engines"]} for r in results], engines)
    ax.set_xticks(range(len(results)), [label(r) for r in results], fontsize=8)
    ax.set_ylabel("time / on demand's (median of rounds; dots: runs)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_title("warm starts: cold, on demand / replayed / a trace of other inputs",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
