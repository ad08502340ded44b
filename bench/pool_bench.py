#!/usr/bin/env python3
"""Several processes over one file: page pools against private regions
and numpy.memmap.

What it measures, and why: numpy.memmap's users run several processes
over one file (multiprocessing, DataLoader workers, web workers serving one
model). The kernel's page cache holds the file once for all of them; a
private upager region holds a copy, under a budget, per process. A page
pool (UPAGER_POOL=on) holds one copy under one budget for every process.

For each side and each worker count N (spawn start method, as
DataLoader/joblib use), a group of N workers, started together, each:
opens the file read-only with the defaults (``upager.memmap(path,
dtype=float64, mode="r")``: 256 MiB budget), sums it twice (two passes),
then reads ``--reads`` random elements. The whole group runs in a memory
cgroup of its own (limit ``--limit``, far above what any side needs, so
the peak is what the side holds, not what the limit allowed).

Sides:
- ``memmap``: numpy.memmap, the kernel's page cache (dropped first);
- ``private``: upager.memmap with ``UPAGER_POOL=off``;
- ``pool``: upager.memmap with ``UPAGER_POOL=on``;
- ``idle``: the N interpreters with numpy and upager imported, nothing
  mapped (what every side pays before it maps anything).

Reported per run: the group's cgroup peak, the wall time from the
workers' common start to the last one's end, each phase's slowest worker
(pass 1, pass 2, random reads), and the sums (checked equal). Runs are
interleaved (round by round, every side and N in turn); the summary gives
medians of the rounds.

The data: a file of random doubles (a read is a copy: nothing compresses)
on ext4 on a fresh zram device, so a miss costs what a fast local disk
costs and memmap's page cache is charged to the group that reads it.

Needs root (zram, mount, cgroups). Command (about 10 minutes)::

    python3 bench/pool_bench.py --size 512M --workers 1,2,4,8 --rounds 3

Results: JSON and a table in ``--out`` (default
bench/results/DATE-pool/), with the machine.
"""

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_bench import Cgroup, Zram, drop_cache, memory_hierarchy  # noqa: E402

SIDES = ("idle", "memmap", "private", "pool")


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("IB").rstrip("B")
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def _worker(side, path, reads, barrier, q):
    import numpy as np

    import upager

    barrier.wait()
    t0 = time.monotonic()
    if side == "idle":
        q.put({"t0": t0, "phases": [0, 0, 0], "sums": [], "end": time.monotonic()})
        return
    if side == "memmap":
        a = np.memmap(path, dtype=np.float64, mode="r")
    else:
        a = upager.memmap(path, dtype=np.float64, mode="r")
    sums, phases = [], []
    for _ in range(2):
        t = time.monotonic()
        s = 0.0
        step = 1 << 20  # 8 MiB of doubles per slice
        for lo in range(0, a.shape[0], step):
            s += float(a[lo:lo + step].sum())
        sums.append(s)
        phases.append(time.monotonic() - t)
    rng = np.random.default_rng(os.getpid())
    idx = rng.integers(0, a.shape[0], reads)
    t = time.monotonic()
    acc = 0.0
    for i in idx:
        acc += float(a[i])
    phases.append(time.monotonic() - t)
    q.put({"t0": t0, "phases": phases, "sums": sums, "end": time.monotonic()})


def group_main(side, n, path, reads):
    """Runs inside the group's cgroup: N spawn workers, started together."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(side, path, reads, barrier, q)) for _ in range(n)]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    start = time.monotonic()
    res = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    end = max(r["end"] for r in res)
    sums = {round(s, 3) for r in res for s in r["sums"]}
    out = {
        "wall_s": end - start,
        "pass1_s": max(r["phases"][0] for r in res),
        "pass2_s": max(r["phases"][1] for r in res),
        "reads_s": max(r["phases"][2] for r in res),
        "sums": sorted(sums),
    }
    print("result " + json.dumps(out), flush=True)


def run_group(side, n, path, reads, limit, hierarchy):
    version, root = hierarchy
    if side == "memmap":
        drop_cache(path)
    cg = Cgroup(version, root, limit)
    env = dict(os.environ, UPAGER_POOL="on" if side == "pool" else "off")
    try:
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--group", side, str(n), path, str(reads)],
            env=env, capture_output=True, text=True, timeout=900,
            preexec_fn=cg.join,
        )
        if p.returncode != 0:
            raise SystemExit(f"{side} x{n} failed:\n{p.stderr[-3000:]}")
        line = next(line for line in p.stdout.splitlines() if line.startswith("result "))
        res = json.loads(line[len("result "):])
        res["peak_bytes"] = cg.peak()
        return res
    finally:
        cg.close()


def write_data(path, size):
    import numpy as np

    rng = np.random.default_rng(47)
    chunk = 8 << 20
    with open(path, "wb") as f:
        for _ in range(size // chunk):
            f.write(rng.random(chunk // 8).tobytes())
        os.fsync(f.fileno())


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--group":
        group_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="512M", help="data file size (default 512M)")
    ap.add_argument("--workers", default="1,2,4,8", help="worker counts (default 1,2,4,8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--reads", type=int, default=20000, help="random element reads per worker")
    ap.add_argument("--limit", default="8G", help="the group's cgroup limit (default 8G)")
    ap.add_argument("--sides", default=",".join(SIDES), help="sides to run")
    ap.add_argument("--out", default=None, help="results folder")
    a = ap.parse_args()
    size = parse_size(a.size)
    workers = [int(x) for x in a.workers.split(",")]
    sides = a.sides.split(",")
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                time.strftime("%Y-%m-%d") + "-pool")
    os.makedirs(out, exist_ok=True)
    hierarchy = memory_hierarchy()
    z = Zram(size + (256 << 20))
    runs = []
    try:
        path = os.path.join(z.mnt, "data.f64")
        write_data(path, size)
        os.chmod(z.mnt, 0o755)
        for rnd in range(a.rounds):
            for n in workers:
                for side in sides:
                    r = run_group(side, n, path, a.reads, parse_size(a.limit), hierarchy)
                    r.update(side=side, workers=n, round=rnd)
                    runs.append(r)
                    print(f"round {rnd} {side:8} x{n}: peak {r['peak_bytes'] >> 20:5} MiB, "
                          f"wall {r['wall_s']:6.2f} s (pass1 {r['pass1_s']:.2f}, pass2 "
                          f"{r['pass2_s']:.2f}, reads {r['reads_s']:.2f})", flush=True)
    finally:
        z.close()
    sums = {tuple(r["sums"]) for r in runs if r["sums"]}
    summary = []
    for n in workers:
        for side in sides:
            rs = [r for r in runs if r["side"] == side and r["workers"] == n]
            summary.append({
                "side": side, "workers": n,
                **{k: median([r[k] for r in rs]) for k in
                   ("peak_bytes", "wall_s", "pass1_s", "pass2_s", "reads_s")},
            })
    doc = {
        "what": "N spawn workers: two passes over one file of random doubles, then random reads",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "cpu": platform.processor() or platform.machine()},
        "size": size, "reads": a.reads, "rounds": a.rounds, "limit": a.limit,
        "sums_agree": len(sums) <= 1,
        "runs": runs, "summary": summary,
    }
    with open(os.path.join(out, "pool_bench.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = ["| workers | side | cgroup peak MiB | wall s | pass 1 s | pass 2 s | reads s |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['workers']} | {s['side']} | {s['peak_bytes'] >> 20} | {s['wall_s']:.2f} | "
                     f"{s['pass1_s']:.2f} | {s['pass2_s']:.2f} | {s['reads_s']:.2f} |")
    table = "\n".join(lines)
    with open(os.path.join(out, "pool_bench.md"), "w") as f:
        f.write(f"Medians of {a.rounds} interleaved rounds, {a.size} file, {doc['date']}, "
                f"{doc['machine']}\n\n{table}\n")
    print(table)
    if not doc["sums_agree"]:
        raise SystemExit(f"the sums differ between runs: {sums}")


if __name__ == "__main__":
    main()
