#!/usr/bin/env python3
"""fork and multiprocessing with upager (issue 21): what a forked child
pays to use an inherited region, and a Pool summing a file larger than
its budgets, against numpy.memmap in a memory cgroup.

What it measures:

1. ``first-access``: a parent maps a 64 MiB float64 file (budget 128 MiB,
   64 KiB folios) and reads it once; then, ``--rounds`` times, it forks a
   child that reads one element. Reported per round: the parent's
   ``os.fork()`` call (upager's ``prepare`` handler flushes the writable
   regions first: clean here, and again with 16 MiB dirty), and the time
   from just before ``fork()`` in the parent to the end of the child's
   first read of the inherited array (the child's fork handler starts a
   pager and maps the region again, cold, then the read faults one folio
   in). The same with numpy.memmap (the child's first access is a page
   cache hit through the inherited shared mapping) and with no mapping at
   all (the cost of fork and of the child starting), on CLOCK_MONOTONIC,
   which both processes share.
2. ``pool-sum``: a 2 GiB float64 file on /dev/shm, summed by a
   ``multiprocessing.Pool`` of 2 workers, each its half in 8 MiB slices:
   upager with 128 MiB budgets (the fork start method: each worker uses the
   array it inherited, on a pager of its own with the parent's 128 MiB
   budget; and spawn: each worker gets the array pickled and opens it
   again), and numpy.memmap with the parent and its workers in a memory
   cgroup of 256 MiB (v2 at /sys/fs/cgroup/unified if it has the memory
   controller, else v1 at /sys/fs/cgroup/memory). Reported: wall time of
   the map (pool started before the clock), GB/s, the workers' largest
   peak RSS (for numpy.memmap it counts the tmpfs pages it maps), and the
   cgroup's peak charge (memmap). The sums are checked
   against the exact value (element i is float(i); integer sums below 2^53
   are exact in float64).

Why: issue 21 asked whether forking is usable with upager and what it
costs: a child's first access pays a pager start (threads, userfaultfd)
and cold reads instead of the kernel's shared page cache, and fork()
itself pays a flush of the parent's writable regions.

A caveat the numbers carry: the file is on tmpfs (/dev/shm), whose pages
are charged to the cgroup of the process that wrote them (this script,
outside the cgroup), so the cgroup does not bound numpy.memmap's resident
file pages there: its peak is what its processes allocated themselves.

Usage: ``python3 bench/fork_bench.py [--rounds 20] [--dir /dev/shm]
[--skip-first] [--skip-pool]``; needs root for the cgroup, the upager Python package
(``make python``) and numpy. Prints a Markdown table per part.
"""
import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

import upager

MIB = 1 << 20
GIB = 1 << 30


def ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def fork_first_access(arr, write_dirty=None):
    """Forks a child that reads arr[0] (if arr is not None) and reports the
    time its read ended; returns (fork call ns, fork-to-first-read ns, the
    read alone ns)."""
    r, w = os.pipe()
    if write_dirty is not None:
        write_dirty()
    t0 = ns()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        tr = ns()
        if arr is not None:
            float(arr[0])
        t = ns()
        os.write(w, f"{t} {t - tr}".encode())
        os._exit(0)
    t1 = ns()
    os.close(w)
    with os.fdopen(r) as f:
        t_child, read = (int(x) for x in f.read().split())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return t1 - t0, t_child - t0, read


def median_us(xs):
    return statistics.median(xs) / 1e3


def row(name, res):
    return (name,) + tuple(median_us([x[k] for x in res]) for k in range(3))


def part_first_access(d, rounds):
    path = os.path.join(d, "fork-first.f64")
    n = 64 * MIB // 8
    np.arange(n, dtype=np.float64).tofile(path)
    rows = []
    # No mapping: fork and the child's start alone.
    base = [fork_first_access(None) for _ in range(rounds)]
    rows.append(row("no mapping", base))
    mm = np.memmap(path, np.float64, mode="r+")
    float(mm.sum())
    res = [fork_first_access(mm) for _ in range(rounds)]
    rows.append(row("numpy.memmap (r+)", res))
    del mm
    a = upager.memmap(path, np.float64, mode="r+", budget="128MiB")
    float(a.sum())
    res = [fork_first_access(a) for _ in range(rounds)]
    rows.append(row("upager (r+, clean)", res))
    dirty = 16 * MIB // 8

    def make_dirty():
        a[:dirty] += 0.0  # every folio of 16 MiB dirty, values unchanged

    res = [fork_first_access(a, make_dirty) for _ in range(rounds)]
    rows.append(row("upager (r+, 16 MiB dirty)", res))
    ro = upager.memmap(path, np.float64, mode="r", budget="128MiB")
    del a
    float(ro.sum())
    res = [fork_first_access(ro) for _ in range(rounds)]
    rows.append(row("upager (r)", res))
    del ro
    os.unlink(path)
    print(f"\n### First access in a forked child (64 MiB file, median of {rounds})\n")
    print("| parent maps | fork() call µs | fork to child's first read done µs "
          "| the first read alone µs |")
    print("|---|---:|---:|---:|")
    for name, call, first, read in rows:
        print(f"| {name} | {call:.0f} | {first:.0f} | {read:.0f} |")


# -- part 2: a Pool summing 2 GiB ---------------------------------------------

_ARR = None


def _pid(_):
    return os.getpid()


def _sum_inherited(lo, hi):
    return _sum_slices(_ARR, lo, hi)


def _sum_slices(a, lo, hi):
    s = 0.0
    step = 8 * MIB // 8
    for i in range(lo, hi, step):
        s += float(a[i:min(hi, i + step)].sum())
    return s, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sum_memmap(path, lo, hi):
    a = np.memmap(path, np.float64, mode="r")
    return _sum_slices(a, lo, hi)


def memory_hierarchy():
    """("v2", root) if the unified hierarchy has the memory controller,
    else ("v1", root of the memory hierarchy)."""
    uni = "/sys/fs/cgroup/unified"
    try:
        with open(os.path.join(uni, "cgroup.controllers")) as f:
            if "memory" in f.read().split():
                return "v2", uni
    except OSError:
        pass
    return "v1", "/sys/fs/cgroup/memory"


class Cgroup:
    """A memory cgroup of `limit` bytes this process joins (and leaves)."""

    def __init__(self, limit):
        self.version, root = memory_hierarchy()
        self.root = root
        self.path = os.path.join(root, f"upager-fork-bench-{os.getpid()}")
        os.mkdir(self.path)
        name = "memory.max" if self.version == "v2" else "memory.limit_in_bytes"
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(limit))

    def join(self, pid):
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def leave(self, pid):
        with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def peak(self):
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        with open(os.path.join(self.path, name)) as f:
            return int(f.read())

    def close(self):
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.05)


def part_pool(d):
    global _ARR
    path = os.path.join(d, "fork-pool.f64")
    n = 2 * GIB // 8
    with open(path, "wb") as f:
        step = 64 * MIB // 8
        for i in range(0, n, step):
            np.arange(i, min(n, i + step), dtype=np.float64).tofile(f)
    want = float(n) * (n - 1) / 2
    halves = [(0, n // 2), (n // 2, n)]
    rows = []

    def run(name, ctx, fn, args, cg=None):
        with ctx.Pool(2) as pool:
            pool.map(_pid, range(2))  # started before the clock
            t = time.perf_counter()
            out = pool.starmap_async(fn, args).get(timeout=1800)
            dt = time.perf_counter() - t
        total = sum(s for s, _ in out)
        ok = total == want
        rss = max(p for _, p in out)
        cgpeak = f"{cg.peak() / MIB:.0f}" if cg else "-"
        rows.append((name, dt, 2 * GIB / dt / 1e9, rss / MIB, cgpeak, ok))

    a = upager.memmap(path, np.float64, mode="r", budget="128MiB")
    _ARR = a
    run("upager, fork (inherited array), 128 MiB each", mp.get_context("fork"),
        _sum_inherited, halves)
    _ARR = None
    run("upager, spawn (pickled array), 128 MiB each", mp.get_context("spawn"),
        _sum_slices, [(a, lo, hi) for lo, hi in halves])
    del a
    cg = Cgroup(256 * MIB)
    try:
        cg.join(os.getpid())
        try:
            run("numpy.memmap, fork, cgroup 256 MiB", mp.get_context("fork"),
                _sum_memmap, [(path, lo, hi) for lo, hi in halves], cg)
        finally:
            cg.leave(os.getpid())
    finally:
        cg.close()
    os.unlink(path)
    print("\n### A Pool of 2 workers summing a 2 GiB float64 file on /dev/shm\n")
    print("| engine | time s | GB/s | max worker peak RSS MiB | cgroup peak MiB | sum exact |")
    print("|---|---:|---:|---:|---:|---|")
    for name, dt, rate, rss, cgpeak, ok in rows:
        print(f"| {name} | {dt:.2f} | {rate:.2f} | {rss:.0f} | {cgpeak} | {ok} |")
    if not all(r[-1] for r in rows):
        sys.exit("a sum was wrong")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--skip-pool", action="store_true")
    ap.add_argument("--skip-first", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="upager-fork-bench-", dir=args.dir) as d:
        if not args.skip_first:
            part_first_access(d, args.rounds)
        if not args.skip_pool:
            part_pool(d)


if __name__ == "__main__":
    main()
