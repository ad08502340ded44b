#!/usr/bin/env python3
"""Read twice, fetch once: a numpy array on S3 read in two runs, upager's
disk tier against what users run today, each run in a 256 MiB memory
cgroup (issue 48, "Measure").

What it measures: a float64 array (default 1 GiB) uploaded to a local
SeaweedFS (scripts/seaweedfs.sh, loopback) with the CLI, in two kinds:
random doubles (the server sends its stored bytes) and element i = i
(SeaweedFS keeps such chunks gzipped and decompresses one for every
ranged GET). Each side starts cold (its caches emptied), then:

- run 1, a fresh Python process in a fresh cgroup: a pass (the sum of the
  array in 8 MiB slices), random element reads (--reads, default 20,000,
  fancy indexing in calls of 25,000: one `a[idx]`), and a second pass;
- run 2, another fresh process and cgroup: a pass and the random reads
  again (the next run of the program).

Sides:

- ``upager``: ``upager.memmap("s3://...", np.float64, mode="r",
  budget="160MiB")`` (--budget), every other option its default: the disk tier on,
  in a cache directory of its own (UPAGER_CACHE_DIR, emptied first);
- ``upager-notier``: the same with ``UPAGER_CACHE_SIZE=0`` (the path
  before the tier: every miss is a GET);
- ``s3fs-fuse``: the bucket mounted read-only by s3fs-fuse with its
  defaults (Debian's s3fs; its daemon outside the reader's cgroup, as
  users run it, one mount for both runs), then ``numpy.memmap`` of the
  mounted file;
- ``s3fs-cache``: the same with ``-o use_cache=DIR`` (a local copy of
  what it fetched, on the same disk as upager's tier);
- ``local``: ``numpy.memmap`` of the same array in a local file on the
  same disk, its page cache dropped before each run
  (``posix_fadvise(DONTNEED)``): the speed the tier aims at.

Reported per side, kind and step: seconds (passes) or reads/s, the
cgroup's peak, and bytes over loopback. Medians of --rounds interleaved
rounds. Every sum is checked against the one computed when the array was
written.

Why: the targets of issue 48 are random reads after a pass at least 2x
s3fs-fuse's, and the second pass and second run at least 0.8x the speed
of the same array in a local file.

Needs: root (cgroups, FUSE), numpy (bench/requirements-s3.txt), this
tree's upager package (make python), the release CLI (cargo build
--release -p upager-cli), the weed binary (scripts/seaweedfs.sh build),
s3fs-fuse (apt-installed if missing).

    python3 bench/s3_tier_bench.py --rounds 3 --json bench/results/DATE-s3-tier/all.json
    python3 bench/s3_tier_bench.py --tiny            # 64 MiB, 1 round: a quick check
    python3 bench/s3_tier_bench.py --plot RESULTS.json RESULTS.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from s3bench_common import (Cgroup, Mount, Weed, add_output_args, bars, cli,  # noqa: E402
                            have_s3fs, loopback_bytes, require_cli, save_plot)

PORT = 22660
BUCKET = "upager-tier-bench"
KINDS = ("random", "ramp")
SIDES = ("upager", "upager-notier", "s3fs-fuse", "s3fs-cache", "local")
MIB = 1 << 20
WORK = pathlib.Path(os.environ.get("UPAGER_TIER_BENCH_DIR", "/root/.cache/upager-tier-bench"))

CHILD = r'''
import json, os, sys, time
side, steps, url, path, n, reads, seed = sys.argv[1:8]
n, reads, seed = int(n), int(reads), int(seed)
import numpy as np
if side.startswith("upager"):
    import upager
SLICE = 1 << 20  # elements: 8 MiB
GATHER = 25_000  # indices per fancy-indexing call (as the array bench)
if side.startswith("upager"):
    a = upager.memmap(url, np.float64, mode="r", budget=os.environ["TIER_BENCH_BUDGET"])
else:
    a = np.memmap(path, dtype=np.float64, mode="r", shape=(n,))
idx = np.random.default_rng(seed).integers(0, n, reads)
out = {}
for step in steps.split(","):
    t0 = time.perf_counter()
    if step.startswith("pass"):
        total = 0.0
        for i in range(0, n, SLICE):
            total += float(a[i:i + SLICE].sum())
    else:
        total = 0.0
        for c in range(0, reads, GATHER):
            total += float(a[idx[c:c + GATHER]].sum())
    out[step] = dict(seconds=time.perf_counter() - t0, result=total)
if side.startswith("upager"):
    out["counters"] = {k: v for k, v in a.pager_stats().items()
                       if k.startswith("cache_") or k in ("store_gets", "store_bytes_received")}
print(json.dumps(out))
'''


def make(kind: str, n: int):
    import numpy as np
    if kind == "random":
        return np.random.default_rng(7).random(n)
    return np.arange(n, dtype=np.float64)


def drop_page_cache(path: pathlib.Path) -> None:
    """Drops the kernel's cached pages of one file (no other file's)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages (a file just written) are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_child(side: str, steps: str, url: str, path: str, n: int, a: argparse.Namespace,
              env: Dict[str, str]) -> Dict[str, Any]:
    """One run in a fresh cgroup of --cgroup-mib."""
    cg = Cgroup(a.cgroup_mib * MIB, tag="s3-tier")
    lo0 = loopback_bytes()
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, side, steps, url, path, str(n), str(a.reads), "11"],
            capture_output=True, text=True, timeout=1800, check=False,
            preexec_fn=cg.join, env=env, cwd="/tmp")
        res: Dict[str, Any] = dict(peak=cg.peak())
    finally:
        cg.close()
    if out.returncode != 0:
        res.update(error=f"exit {out.returncode}: {out.stderr.strip()[-1500:]}")
        return res
    res.update(json.loads(out.stdout.strip().splitlines()[-1]), lo_bytes=loopback_bytes() - lo0)
    return res


def run_side(side: str, kind: str, n: int, local: pathlib.Path,
             a: argparse.Namespace) -> List[Dict[str, Any]]:
    """Both runs of one side, from cold."""
    url = f"s3://{BUCKET}/{kind}.f64"
    env = dict(os.environ)
    tier = WORK / "tier"
    shutil.rmtree(tier, ignore_errors=True)
    if side == "upager":
        env["UPAGER_CACHE_DIR"] = str(tier)
        env.pop("UPAGER_CACHE_SIZE", None)
    elif side == "upager-notier":
        env["UPAGER_CACHE_SIZE"] = "0"
    s3fs_cache = WORK / "s3fs-cache"
    shutil.rmtree(s3fs_cache, ignore_errors=True)
    mount = None
    path = str(local)
    if side in ("s3fs-fuse", "s3fs-cache"):
        extra = ["-o", f"use_cache={s3fs_cache}"] if side == "s3fs-cache" else []
        s3fs_cache.mkdir(parents=True, exist_ok=True)
        mount = Mount(os.environ["AWS_ENDPOINT_URL"], BUCKET, f"{kind}.f64", None, extra)
        path = str(mount.__enter__())
    out = []
    try:
        for run, steps in ((1, "pass,random,pass2"), (2, "pass,random")):
            if side == "local":
                drop_page_cache(local)
            res = run_child(side, steps, url, path, n, a, env)
            res.update(side=side, kind=kind, run=run)
            out.append(res)
    finally:
        if mount is not None:
            mount.__exit__(None, None, None)
        shutil.rmtree(tier, ignore_errors=True)
        shutil.rmtree(s3fs_cache, ignore_errors=True)
    return out


def check(res: Dict[str, Any], want: Dict[str, float]) -> None:
    """Marks each step of a run right or wrong against the array's sums."""
    for step, v in res.items():
        if isinstance(v, dict) and "result" in v:
            ok = want["pass" if step.startswith("pass") else "random"]
            v["ok"] = abs(v.pop("result") - ok) <= 1e-9 * max(1.0, abs(ok))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_args(ap)
    ap.add_argument("--size-mib", type=int, default=1024, help="array size (default 1024)")
    ap.add_argument("--reads", type=int, default=20_000, help="random reads (default 20,000)")
    ap.add_argument("--cgroup-mib", type=int, default=256, help="memory cgroup (default 256)")
    ap.add_argument("--budget", default="160MiB",
                    help="upager's budget (default 160MiB: a 256 MiB cgroup holds it, the "
                         "interpreter and the S3 client's buffers, which are outside it)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="data kinds (default random,ramp)")
    ap.add_argument("--sides", default=",".join(SIDES), help="sides, comma-separated")
    ap.add_argument("--tiny", action="store_true", help="64 MiB, 2,000 reads, 1 round")
    a = ap.parse_args()
    if a.plot:
        plot(*a.plot)
        return
    if a.tiny:
        a.size_mib, a.reads, a.rounds = 64, 2000, 1
    if os.geteuid() != 0:
        sys.exit("run as root: each run gets its own memory cgroup (and s3fs-fuse a mount)")
    require_cli(s3fs=False)
    sides = a.sides.split(",")
    if any(s.startswith("s3fs") for s in sides) and not have_s3fs():
        print("s3fs-fuse sides skipped: s3fs is missing (apt-get install s3fs)", flush=True)
        sides = [s for s in sides if not s.startswith("s3fs")]
    os.environ["TIER_BENCH_BUDGET"] = a.budget
    n = a.size_mib * MIB // 8
    kinds = a.kinds.split(",")
    WORK.mkdir(parents=True, exist_ok=True)
    runs: List[Dict[str, Any]] = []
    with Weed(PORT, BUCKET):
        want, local = {}, {}
        for kind in kinds:
            import numpy as np
            f = WORK / f"{kind}.f64"
            arr = make(kind, n)
            arr.tofile(f)
            idx = np.random.default_rng(11).integers(0, n, a.reads)
            want[kind] = dict(random=float(sum(float(arr[idx[c:c + 25_000]].sum())
                                               for c in range(0, a.reads, 25_000))))
            want[kind]["pass"] = float(sum(float(arr[i:i + (1 << 20)].sum())
                                           for i in range(0, n, 1 << 20)))
            del arr
            t0 = time.perf_counter()
            subprocess.run([str(cli()), "load", str(f), f"s3://{BUCKET}/{kind}.f64"],
                           check=True, timeout=1800, capture_output=True)
            print(f"uploaded {kind}: {a.size_mib} MiB in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            local[kind] = f
        for rnd in range(a.rounds):
            for kind in kinds:
                for side in sides:
                    for res in run_side(side, kind, n, local[kind], a):
                        res["round"] = rnd + 1
                        if "error" not in res:
                            check(res, want[kind])
                        runs.append(res)
                        print(f"[{rnd + 1}/{a.rounds}] {kind:6} {side:14} run {res['run']} "
                              + describe(res, a.size_mib, a.reads), flush=True)
        for f in local.values():
            f.unlink(missing_ok=True)
    summary = summarize(runs, a.size_mib, a.reads)
    report(summary)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            machine=dict(cpus=os.cpu_count(), kernel=platform.release(),
                         cpu=platform.processor() or platform.machine()),
            command_line=sys.argv, array_bytes=a.size_mib * MIB, reads=a.reads, budget=a.budget,
            cgroup_mib=a.cgroup_mib, rounds=a.rounds, runs=runs, summary=summary),
            indent=1) + "\n")
        print(f"wrote {a.json}")


STEPS = (("1", "pass"), ("1", "random"), ("1", "pass2"), ("2", "pass"), ("2", "random"))


def describe(res: Dict[str, Any], size_mib: int, reads: int) -> str:
    if "error" in res:
        return "ERROR " + res["error"][-300:]
    parts = []
    for step in ("pass", "random", "pass2"):
        v = res.get(step)
        if v is None:
            continue
        bad = "" if v.get("ok") else " WRONG"
        if step == "random":
            parts.append(f"random {reads / v['seconds']:8.0f}/s{bad}")
        else:
            parts.append(f"{step} {v['seconds']:6.2f} s ({size_mib / v['seconds']:5.0f} MiB/s){bad}")
    parts.append(f"peak {res['peak'] / MIB:.0f} MiB, lo {res['lo_bytes'] / MIB:.0f} MiB")
    return "; ".join(parts)


def summarize(runs: List[Dict[str, Any]], size_mib: int, reads: int) -> Dict[str, Any]:
    """Medians per kind, side and step: MiB/s of passes, reads/s."""
    out: Dict[str, Any] = {}
    for r in runs:
        if "error" in r:
            continue
        for step in ("pass", "random", "pass2"):
            v = r.get(step)
            if v is None or not v.get("ok"):
                continue
            rate = (reads if step == "random" else size_mib) / v["seconds"]
            key = f"run{r['run']}-{step}"
            out.setdefault(r["kind"], {}).setdefault(r["side"], {}).setdefault(key, []).append(rate)
    return {k: {s: {step: statistics.median(v) for step, v in steps.items()}
                for s, steps in sides.items()} for k, sides in out.items()}


def report(summary: Dict[str, Any]) -> None:
    cols = ("run1-pass", "run1-random", "run1-pass2", "run2-pass", "run2-random")
    print("\nmedians: passes in MiB/s, random in reads/s")
    for kind, sides in summary.items():
        print(f"\n{kind}: {'side':14} " + " ".join(f"{c:>12}" for c in cols))
        for side, steps in sides.items():
            print(f"{'':8}{side:14} " + " ".join(f"{steps.get(c, float('nan')):12.0f}" for c in cols))


def plot(src: pathlib.Path, png: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    r = json.loads(src.read_text())
    kinds = list(r["summary"])
    cols = ("run1-pass", "run1-random", "run1-pass2", "run2-pass", "run2-random")
    fig, axes = plt.subplots(len(kinds), len(cols), figsize=(3.2 * len(cols), 3.2 * len(kinds)),
                             squeeze=False)
    for i, kind in enumerate(kinds):
        sides = list(r["summary"][kind])
        for j, col in enumerate(cols):
            ax = axes[i][j]
            step = col.split("-", 1)[1]
            run = int(col[3])

            def vals(side: str, step: str = step, run: int = run) -> List[float]:
                return [(r["reads"] if step == "random" else r["array_bytes"] / MIB)
                        / x[step]["seconds"] for x in r["runs"]
                        if x.get("side") == side and x.get("kind") == kind
                        and x.get("run") == run and step in x and x[step].get("ok")]
            bars(ax, sides, lambda s: r["summary"][kind][s].get(col, 0.0), vals, fontsize=6)
            ax.set_title(f"{kind}: {col} ({'reads/s' if step == 'random' else 'MiB/s'})",
                         fontsize=8)
    save_plot(fig, f"{r['array_bytes'] >> 20} MiB array on S3, {r['cgroup_mib']} MiB cgroup",
              r, png)


if __name__ == "__main__":
    main()
