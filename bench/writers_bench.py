#!/usr/bin/env python3
"""Several writers of one file: N processes each write their own block of
rows of one file, the blocks' boundaries not folio-aligned, through
upager.open_array (each with its own budget) or numpy.memmap (all in one
memory cgroup of the same total).

What it measures (issue 21, "Numbers to report"): wall time from the
workers' start to the last one's exit (open, write, flush), bytes the
upager workers wrote back (their `bytes_written`, summed), the twins they
kept (`twins_made`) and the diffs they wrote (`diff_writebacks`), and the
values lost: after the join, every element of the file is checked against
what its owner wrote (element i holds i + 1). Before twins and diffs
(issue 21 item 2) upager lost values at the blocks' boundaries; numpy.memmap
never does (the kernel's page cache is one copy).

Why: the people upager is for fan work out to processes (a
multiprocessing pool, one rank per core); each reopens the file r+ and
writes its own rows. A boundary folio is then held by two processes, and
only a diff against a twin keeps both halves.

How: the file (zeros, `--size`, default 2 GiB) is made on `--dir` (default
/dev/shm) by this process, outside any cgroup. Workers are spawned
(multiprocessing "spawn"); each opens the file, waits at a barrier (all
have mapped), writes its rows 1 MiB at a time (`a[lo:hi] = arange + 1`),
flushes. memmap workers run in a cgroup v1 memory group limited to
`workers * budget` (created under /sys/fs/cgroup/memory, needs root;
without it they run unconstrained and the report says so). On tmpfs the
file's pages are the page cache, charged to this process that made them,
so the cgroup bounds memmap's anonymous memory only: the comparison is of
time and correctness, not of memory.

Engine `upager-own-files` runs the same writes with each worker writing
its block to a file of its own (one writer per file: no twins), to price
the twins.

Usage:
    python3 bench/writers_bench.py [--size 2GiB] [--workers 4]
        [--budget 64MiB] [--dir /dev/shm]
        [--engines upager,memmap,upager-own-files]
Prints one line per engine and a markdown table at the end.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

ROW = 3  # uint64 values per row: 24-byte rows, never folio-aligned
CHUNK_ROWS = (1 << 20) // (ROW * 8)


def parse_size(s):
    s = s.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("kmg")) * mult)


def worker(engine, path, rows, lo, hi, budget, barrier, q):
    base = 0
    if engine == "upager-own-files":
        # The same writes, each worker to a file of its own (its block):
        # the single-writer path, for the cost of twins.
        import upager

        path, base, rows = f"{path}.{lo}", lo, hi - lo
        a = upager.open_array(path, np.uint64, (rows, ROW), mode="r+", budget=budget)
    elif engine == "upager":
        import upager

        a = upager.open_array(path, np.uint64, (rows, ROW), mode="r+", budget=budget)
    else:
        a = np.memmap(path, dtype=np.uint64, mode="r+", shape=(rows, ROW))
    barrier.wait(timeout=600)
    for s in range(lo, hi, CHUNK_ROWS):
        e = min(s + CHUNK_ROWS, hi)
        a[s - base:e - base] = np.arange(s * ROW, e * ROW, dtype=np.uint64).reshape(-1, ROW) + 1
    a.flush()
    stats = {}
    if engine.startswith("upager"):
        st = a.pager_stats()
        stats = {k: st[k] for k in ("bytes_written", "twins_made", "diff_writebacks",
                                     "writer_switches", "resident_peak_bytes")}
    del a
    q.put(stats)


class Cgroup:
    """A cgroup v1 memory group this process joins while it starts the
    workers (they inherit it), left again right after."""

    def __init__(self, limit):
        self.dir = f"/sys/fs/cgroup/memory/upager-writers-{os.getpid()}"
        self.ok = False
        try:
            os.makedirs(self.dir, exist_ok=True)
            with open(f"{self.dir}/memory.limit_in_bytes", "w") as f:
                f.write(str(limit))
            self.ok = True
        except OSError as e:
            print(f"no memory cgroup ({e}): memmap runs unconstrained", file=sys.stderr)

    def join(self, pid):
        if self.ok:
            with open(f"{self.dir}/cgroup.procs", "w") as f:
                f.write(str(pid))

    def leave(self):
        if self.ok:
            with open("/sys/fs/cgroup/memory/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def peak(self):
        try:
            with open(f"{self.dir}/memory.max_usage_in_bytes") as f:
                return int(f.read())
        except OSError:
            return None

    def remove(self):
        if self.ok:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass


def run(engine, path, rows, workers, budget):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    q = ctx.Queue()
    bounds = [rows * k // workers for k in range(workers + 1)]
    cg = Cgroup(workers * budget) if engine == "memmap" else None
    t0 = time.monotonic()
    if cg:
        cg.join(os.getpid())
    procs = [ctx.Process(target=worker,
                         args=(engine, path, rows, bounds[k], bounds[k + 1], budget, barrier, q))
             for k in range(workers)]
    for p in procs:
        p.start()
    if cg:
        cg.leave()
    import queue

    stats = []
    deadline = time.monotonic() + 1800
    while len(stats) < workers:
        try:
            stats.append(q.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                if cg:
                    cg.remove()
                raise SystemExit(f"{engine}: a worker died ({dead}; -9: the OOM killer?) or timed out")
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise SystemExit(f"{engine} worker exited with {p.exitcode}")
    took = time.monotonic() - t0
    peak = cg.peak() if cg else None
    if cg:
        cg.remove()
    lost = 0
    parts = [(path, 0)]
    if engine == "upager-own-files":
        parts = [(f"{path}.{bounds[k]}", bounds[k] * ROW) for k in range(workers)]
    for part, first in parts:
        got = np.memmap(part, dtype=np.uint64, mode="r")
        for s in range(0, got.size, 1 << 22):
            e = min(s + (1 << 22), got.size)
            want = np.arange(first + s, first + e, dtype=np.uint64) + 1
            lost += int((got[s:e] != want).sum())
        del got
        if part != path:
            os.unlink(part)
    out = {"engine": engine, "seconds": took, "lost": lost}
    for k in ("bytes_written", "twins_made", "diff_writebacks", "writer_switches"):
        if stats and k in stats[0]:
            out[k] = sum(s[k] for s in stats)
    if stats and "resident_peak_bytes" in stats[0]:
        out["peak_per_worker"] = max(s["resident_peak_bytes"] for s in stats)
    if peak is not None:
        out["cgroup_peak"] = peak
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--engines", default="upager,memmap")
    args = ap.parse_args()
    size, budget = parse_size(args.size), parse_size(args.budget)
    rows = size // (ROW * 8)
    path = os.path.join(args.dir, f"writers-bench-{os.getpid()}.bin")
    results = []
    try:
        for engine in args.engines.split(","):
            files = [(path, rows)]
            if engine == "upager-own-files":
                b = [rows * k // args.workers for k in range(args.workers + 1)]
                files = [(f"{path}.{b[k]}", b[k + 1] - b[k]) for k in range(args.workers)]
            for name, nrows in files:
                with open(name, "wb") as f:  # zeros, allocated here (not sparse)
                    chunk = bytes(8 << 20)
                    left = nrows * ROW * 8
                    while left > 0:
                        left -= f.write(chunk[:min(left, len(chunk))])
            r = run(engine, path, rows, args.workers, budget)
            print(r, flush=True)
            results.append(r)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print(f"\n{args.workers} processes, {rows * ROW * 8 / (1 << 30):.2f} GiB file on {args.dir}, "
          f"rows of {ROW * 8} bytes, {budget >> 20} MiB budget each\n")
    print("| engine | time | bytes written | twins | diff write-backs | values lost |")
    print("|---|---|---|---|---|---|")
    for r in results:
        bw = f"{r['bytes_written'] / (1 << 30):.2f} GiB" if "bytes_written" in r else "(page cache)"
        print(f"| {r['engine']} | {r['seconds']:.1f} s | {bw} | {r.get('twins_made', '-')} | "
              f"{r.get('diff_writebacks', '-')} | {r['lost']} |")


if __name__ == "__main__":
    main()
