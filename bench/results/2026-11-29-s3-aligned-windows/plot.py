"""The pass of bench/s3_array_bench.py against its 8 MiB x 4 GET client,
per round, for the builds compared here (unaligned-N.json: windows and
GETs as before; aligned-N.json: windows and GETs on the grid;
final-N.json: that and the chained windows), random and compressible
data: `python3 plot.py` writes ab.png and prints the ratios."""
import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
BUILDS = [b for b in ("unaligned", "aligned", "final") if list(HERE.glob(f"{b}-*.json"))]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for ax, kind in zip(axes, ("random", "ramp")):
    for x, build in enumerate(BUILDS):
        ratios = []
        for f in sorted(HERE.glob(f"{build}-*.json")):
            runs = {(r["work"], r["side"]): r for r in json.loads(f.read_text())["runs"]
                    if r["kind"] == kind and "error" not in r}
            ratios.append(runs[("pass", "limit-8m")]["seconds"] / runs[("pass", "upager")]["seconds"])
        med = statistics.median(ratios)
        print(f"{kind:6} {build:9} pass / limit-8m per round {[round(r, 2) for r in ratios]}"
              f" median {med:.2f}")
        ax.bar(x, med, color="#4a7ab0")
        ax.plot([x] * len(ratios), ratios, "k.")
    ax.axhline(0.8, color="red", lw=1, ls="--")
    ax.set_xticks(range(len(BUILDS)), BUILDS)
    ax.set_ylim(0, 1)
    ax.set_title(f"{kind}: pass speed / 8 MiB x 4 GET client", fontsize=9)
fig.suptitle("2 GiB float64 on SeaweedFS (loopback), 256 MiB cgroups, 2026-11-29, 2 vCPU EPYC KVM",
             fontsize=9)
fig.tight_layout()
fig.savefig(HERE / "ab.png", dpi=110)
