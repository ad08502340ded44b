#!/usr/bin/env python3
"""Random element writes to an array on S3, then flush: an upager dataset
(s3://BUCKET/NAME/, mapped "r+" under a budget) against what a user does
today without one (download the object, change it with numpy, upload it
whole).

What it measures and why: issue 31 item 3 (read-write datasets). A
dataset's write-back rewrites whole group objects (read-modify-write where
the writes do not cover a group), so its cost grows with the groups
touched, not with the array; the download/upload round trip costs the
whole array both ways whatever is written. Reported per side: seconds
for the writes + flush (upager) or download + change + upload, bytes sent
and received, and the peak RSS (VmHWM) of the process doing it (each side
in a fresh process). Every side's result is read back and checked.

With --sweep, per group size instead: the time of `upager load` and of a
sequential pass (sum of 8 MiB slices, "r", under the budget), what a
larger group buys (fewer objects and requests) against what it costs
scattered writes.

Usage: python3 bench/s3_dataset_bench.py [--size-mib 256] [--writes 2000,20000]
       [--groups 256K,64K] [--budget 64MiB] [--rounds 3] [--sweep] [--json OUT]
       python3 bench/s3_dataset_bench.py --plot REPORT.json OUT.png
Starts its own SeaweedFS on ports 22620.. (scripts/seaweedfs.sh) and the
release CLI uploads the data (`upager load`).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLI = ROOT / "target" / "release" / "upager"
BUCKET = "dsbench"
PORT = "22620"

CHILD = r"""
import json, os, sys, time
import numpy as np
side, url, n, writes, budget, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
folio = sys.argv[7] or None  # None: the map's default (a writable dataset's group, up to 1 MiB)
idx = np.random.default_rng(seed).integers(0, n, writes)
t0 = time.perf_counter()
out = {}
if side == "upager":
    import upager
    a = upager.memmap(url, np.float64, mode="r+", budget=budget, folio=folio)
    out["folio"] = a._mmap.folio
    a[idx] = -2.0
    a.flush()
    out["seconds"] = time.perf_counter() - t0
    s = a._mmap.stats()
    out["resident_peak_bytes"] = s["resident_peak_bytes"]
    out["writebacks"] = s["writebacks"]
    out["store_rmw_groups"] = s["store_rmw_groups"]
    del a
else:
    import boto3
    s3 = boto3.client("s3")
    bucket, key = url[len("s3://"):].split("/", 1)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    a = np.frombuffer(body, dtype=np.float64).copy()
    del body
    a[idx] = -2.0
    s3.put_object(Bucket=bucket, Key=key, Body=a.tobytes())
    out["seconds"] = time.perf_counter() - t0
# VmHWM: this process image's own peak (ru_maxrss would carry the parent's
# resident size over the fork).
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
out["peak_rss_mib"] = int(hwm.split()[1]) / 1024
print(json.dumps(out))
"""

PASS = r"""
import json, sys, time, numpy as np, upager
url, budget = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
a = upager.memmap(url, np.float64, mode="r", budget=budget)
step = (8 << 20) // 8
acc = 0.0
for i in range(0, a.size, step):
    acc += float(a[i:i + step].sum())
print(json.dumps({"seconds": time.perf_counter() - t0, "sum": acc}))
"""

CHECK = r"""
import sys, numpy as np, upager
url, n, writes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
idx = np.random.default_rng(seed).integers(0, n, writes)
a = upager.memmap(url, np.float64, mode="r", budget="64MiB")
ok = bool((a[idx] == -2.0).all())
print("ok" if ok else "WRONG")
"""


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def weed(*args):
    env = dict(os.environ, UPAGER_WEED_PORT=PORT)
    return subprocess.run(["bash", str(ROOT / "scripts" / "seaweedfs.sh"), *args],
                          check=True, capture_output=True, text=True, env=env).stdout


def delete(url):
    """Removes `url` and has SeaweedFS compact its volumes: a deleted
    object's bytes stay in its volume files (on /dev/shm, twice with
    replication 001) until a vacuum, and a run of many sides and rounds
    would otherwise fill the machine's memory."""
    import urllib.request
    subprocess.run([str(CLI), "delete", url], capture_output=True)
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/vol/vacuum?garbageThreshold=0.01",
                                timeout=300) as r:
        r.read()


def plot(json_path, png_path):
    """Bars of the medians in a JSON report of this script."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = json.loads(pathlib.Path(json_path).read_text())
    rs = d["results"]
    fig, ax = plt.subplots(figsize=(11, 4))
    if rs and "group" in rs[0]:
        groups = list(dict.fromkeys(r["group"] for r in rs))
        med = {(g, k): statistics.median(r[k] for r in rs if r["group"] == g)
               for g in groups for k in ("load_s", "pass_s")}
        xs = range(len(groups))
        ax.bar([x - 0.2 for x in xs], [med[(g, "load_s")] for g in groups], 0.4, label="upager load")
        ax.bar([x + 0.2 for x in xs], [med[(g, "pass_s")] for g in groups], 0.4, label="sequential pass")
        ax.set_xticks(list(xs), [f"group {g}" for g in groups])
        title = "S3 dataset: group size"
    else:
        import textwrap
        names = [textwrap.fill(r["side"], 20) + f"\n({r['peak_rss_mib_median']:.0f} MiB peak)"
                 for r in rs]
        ax.bar(range(len(rs)), [r["seconds_median"] for r in rs])
        ax.set_xticks(range(len(rs)), names, fontsize=8)
        title = f"S3 dataset: {rs[0]['writes']} random writes + flush" if rs else ""
    m = d["meta"]
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"{title}, {m['size_mib']} MiB array, {m['date']}, {m['machine']}", fontsize=9)
    if rs and "group" in rs[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--writes", default="2000,20000")
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--groups", default="4M",
                    help="group sizes of the dataset side, e.g. 4M,256K (upager load --group); "
                         "GROUP@FOLIO maps that side with that folio instead of the default")
    ap.add_argument("--sweep", action="store_true",
                    help="per group size: upager load and a sequential pass, timed")
    ap.add_argument("--json")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"),
                    help="only draw the plot of a report")
    a = ap.parse_args()
    if a.plot:
        plot(*a.plot)
        return
    weed("start")
    env = {}
    for part in weed("env").replace("export ", "").split():
        k, _, v = part.partition("=")
        env[k] = v
    os.environ.update(env)
    weed("mb", BUCKET)
    n = a.size_mib * (1 << 20) // 8
    tmp = pathlib.Path(tempfile.mkdtemp(dir="/dev/shm"))
    f = tmp / "a.f64"
    import numpy as np
    np.random.default_rng(1).random(n).tofile(f)
    results = []
    try:
        if a.sweep:
            for rnd in range(a.rounds):
                for g in a.groups.split(","):
                    url = f"s3://{BUCKET}/sweep{g}r{rnd}/"
                    delete(url)
                    t0 = time.perf_counter()
                    sh(str(CLI), "load", str(f), url, "--group", g.split("@")[0])
                    load_s = time.perf_counter() - t0
                    p = json.loads(sh(sys.executable, "-c", PASS, url, a.budget))
                    r = {"group": g, "round": rnd, "load_s": load_s, "pass_s": p["seconds"]}
                    print(r, flush=True)
                    results.append(r)
                    delete(url)
            for g in a.groups.split(","):
                rs = [r for r in results if r["group"] == g]
                print(f"group {g:>5}: load {statistics.median(r['load_s'] for r in rs):6.2f} s, "
                      f"sequential pass {statistics.median(r['pass_s'] for r in rs):6.2f} s (medians)")
            a.writes = ""
        for writes in [int(w) for w in a.writes.split(",") if w]:
            specs = {f"upager dataset, groups of {g.split('@')[0]}"
                     + (f" (folio {g.split('@')[1]})" if "@" in g else ""): g
                     for g in a.groups.split(",")}
            sides = list(specs)
            sides.append("download + upload")
            runs = {s: [] for s in sides}
            for rnd in range(a.rounds):
                for k, side in enumerate(sides):
                    ds = side.startswith("upager")
                    # An object and a dataset of one name cannot both be on
                    # SeaweedFS (its filer has files and directories).
                    url = f"s3://{BUCKET}/s{k}w{writes}r{rnd}" + ("/" if ds else "")
                    delete(url)
                    # "GROUP@FOLIO": the map sets that folio, else the default.
                    spec = specs.get(side, "")
                    group = ["--group", spec.split("@")[0]] if ds else []
                    folio = spec.split("@")[1] if "@" in spec else ""
                    sh(str(CLI), "load", str(f), url, *group)
                    out = json.loads(sh(sys.executable, "-c", CHILD, "upager" if ds else "boto3",
                                        url, str(n), str(writes), a.budget, str(rnd), folio))
                    check = sh(sys.executable, "-c", CHECK, url, str(n), str(writes), str(rnd)).strip()
                    out["check"] = check
                    runs[side].append(out)
                    print(f"writes {writes} round {rnd + 1} {side}: {out}", flush=True)
                    delete(url)
            for side, rs in runs.items():
                results.append({
                    "writes": writes, "side": side,
                    "seconds_median": statistics.median(r["seconds"] for r in rs),
                    "peak_rss_mib_median": statistics.median(r["peak_rss_mib"] for r in rs),
                    "runs": rs,
                })
    finally:
        weed("stop")
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    print(f"{'writes':>8}  {'side':<32} {'s (median)':>10} {'peak RSS MiB':>13}")
    for r in [r for r in results if "writes" in r]:
        print(f"{r['writes']:>8}  {r['side']:<32} {r['seconds_median']:>10.2f} {r['peak_rss_mib_median']:>13.0f}")
    if a.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
                "size_mib": a.size_mib, "budget": a.budget, "rounds": a.rounds,
                "groups": a.groups,
                "folio": "the default (a writable dataset's group up to 1 MiB, else 64 KiB) unless GROUP@FOLIO"}
        pathlib.Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
