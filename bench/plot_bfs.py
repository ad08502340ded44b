"""Plots UMap bfs results (crates/bench/examples/umap-bfs.rs --out).

    python3 bench/plot_bfs.py OUT.png RESULT.json [RESULT.json ...]

One group of bars per result file (its budget and where the graph lives):
each engine's median wall time (upager on demand, replayed from the trace
a first run recorded, the kernel's mmap in a memory cgroup of the same
budget) relative to upager on demand's, with each run as a dot. The one
recording run is left out (a single run, the first after the graph was
made). What it shows: whether replay pays on a traversal that reads its
graph mostly in streams, and where upager stands against the kernel.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from plot_warm import rel_bars  # noqa: E402  (bench/, beside this file)

ENGINES = ["upager on demand", "upager replayed", "kernel mmap, cgroup"]


def label(r):
    where = "tmpfs" if r["data"].startswith("/dev/shm") else "ext4 on zram"
    return (f"scale {r['scale']} ({r['graph_bytes'] >> 20} MiB)\n{where}\n"
            f"budget {r['budget_bytes'] >> 20} MiB, {r['threads']} threads")


def main(out, paths):
    results = [json.load(open(p)) for p in paths]
    fig, ax = plt.subplots(figsize=(2.2 + 3.0 * len(results), 4.6))
    rel_bars(ax, [{e: [x["wall_s"] for x in r["runs"] if x["engine"] == e] for e in ENGINES}
                  for r in results], ENGINES)
    ax.set_xticks(range(len(results)), [label(r) for r in results], fontsize=8)
    ax.set_ylabel("wall time / upager on demand's (median; dots: runs)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_title("UMap bfs through the drop-in, each run cold", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
