#!/usr/bin/env python3
"""The `numpy` scenario of `upager bench`: a numpy user's float64 array
larger than memory, through numpy.memmap or upager.open_array.

What it measures: one Python process, in a memory cgroup of the budget
(the suite puts it there before it starts measuring), opens a float64 file
on ext4 on a RAM block device read-write and runs, timed one by one:

1. a sequential pass: the sum of every 8 MiB slice (``a[lo:hi].sum()``);
2. N random element reads in one gather (``a[idx].sum()``);
3. N random element writes in one scatter (``a[idx] = 1.5``), then
   ``flush()`` (msync / upager's write-back and fdatasync) — not when the
   array is opened with mode "r" (read-only: the first two phases only).

It reports each phase's time and rate; `upager bench numpy` compares them
with numpy.memmap's. Time outside the phases (starting Python, drawing the
indices, opening the array, checking and restoring) is not measured.

Why: issue 12 found that numpy users feel a user-space pager first where
every access is a fault (fancy indexing into an array larger than memory).
numpy.memmap with a memory cgroup is what they use today: its random reads
pay the kernel's read-around into a small page cache, its writes are cheap
until msync. upager gives a hard budget without a cgroup and reads exactly
one folio per miss; its random writes cost a fill and a write-back each.
This is the table of the issue's section "As a numpy user sees it", as a
benchmark.

Correctness: element i of the file is float(i) (`upager bench` makes it),
so every slice sum and the gather's sum have exact expected values (integers
below 2^53 add exactly in float64); a wrong one is counted in
``bad_words`` and fails the run. After the phases the written elements are
read back (through the array, and from the file with pread) and the old
values are written back, so the next run finds the file as it was.

Protocol: started as ``numpy_scenario.py numpy --json '{...}' --wait-go``
by the suite's worker runner (crates/bench/src/worker.rs): prints
``ready <pid>``, waits for ``go`` on stdin, prints ``result <json>`` (the
shape of the Rust workers' WorkerResult) or ``error <message>``. The JSON
is the suite's ``Workload::Numpy``: file, backend ("memmap" or "upager"),
budget, folio_kb, fault_mode ("handlers", "in-thread", or "auto": upager
chooses), slice_bytes,
random_ops, seed, huge_runs (upager's mixed folio sizes, default false),
readahead_async (default true) and mode ("r+", the default, or "r": no
write phase).
"""
import gc
import json
import os
import resource
import struct
import sys
import time

PAGE = 4096


def read_bytes():
    """Bytes this process caused to be read from block devices."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cgroup_peak_bytes():
    """The peak memory charge of this process's memory cgroup so far
    (v1 memory.max_usage_in_bytes, v2 memory.peak), or None. Read right
    after the measured phases: the checks and the restore afterwards go
    through the page cache and would raise it to the limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidates = [f"/sys/fs/cgroup/memory{path}/memory.max_usage_in_bytes"]
        elif controllers == "":
            candidates = [f"/sys/fs/cgroup{path}/memory.peak"]
        else:
            continue
        for c in candidates:
            try:
                with open(c) as f:
                    return int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return None


def open_upager(upager, path, np, cfg):
    """upager.open_array in the requested fault mode: the `fault_mode`
    keyword where the package has it, else UPAGER_FAULT_MODE (read by the
    engine's builder when the pager is made)."""
    kwargs = dict(mode=cfg.get("mode", "r+"), budget=cfg["budget"],
                  folio=cfg["folio_kb"] * 1024,
                  # issue 23's ablations: mixed folio sizes; every window
                  # read by the fault that needs it
                  huge_runs=bool(cfg.get("huge_runs", False)),
                  readahead_async=bool(cfg.get("readahead_async", True)))
    if cfg["fault_mode"] == "auto":
        # upager chooses (issue 28: in-thread where the userfaultfd is
        # user-mode-only, as an ordinary user's is).
        os.environ.pop("UPAGER_FAULT_MODE", None)
        return upager.open_array(path, np.float64, **kwargs)
    os.environ["UPAGER_FAULT_MODE"] = cfg["fault_mode"]
    try:
        return upager.open_array(path, np.float64, fault_mode=cfg["fault_mode"], **kwargs)
    except TypeError as e:
        if "fault_mode" not in str(e):
            raise
        return upager.open_array(path, np.float64, **kwargs)


def run(cfg, np, upager):
    path = cfg["file"]
    n = os.stat(path).st_size // 8
    ops = int(cfg["random_ops"])
    slice_elems = max(1, int(cfg["slice_bytes"]) // 8)
    rng = np.random.default_rng(int(cfg["seed"]) & ((1 << 63) - 1))
    read_idx = rng.integers(0, n, size=ops, dtype=np.int64)
    write_idx = rng.integers(0, n, size=ops, dtype=np.int64)
    want_read_sum = int(read_idx.sum())
    backend = cfg["backend"]
    writable = cfg.get("mode", "r+") != "r"

    t = time.perf_counter()
    if backend == "memmap":
        a = np.memmap(path, dtype=np.float64, mode=cfg.get("mode", "r+"))
    else:
        a = open_upager(upager, path, np, cfg)
    open_s = time.perf_counter() - t

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    io0 = read_bytes()
    bad = 0

    # 1. Sequential pass: the sum of each slice, checked.
    t0 = time.perf_counter()
    for lo in range(0, n, slice_elems):
        hi = min(n, lo + slice_elems)
        if float(a[lo:hi].sum()) != (lo + hi - 1) * (hi - lo) // 2:
            bad += 1
    seq_s = time.perf_counter() - t0

    # 2. Random element reads: one gather, checked.
    t = time.perf_counter()
    got = float(a[read_idx].sum())
    reads_s = time.perf_counter() - t
    if got != want_read_sum:
        bad += 1

    # 3. Random element writes, then flush (not in mode "r").
    writes_s = flush_s = verify_s = restore_s = 0.0
    if writable:
        t = time.perf_counter()
        a[write_idx] = 1.5
        writes_s = time.perf_counter() - t
        t = time.perf_counter()
        a.flush()
        flush_s = time.perf_counter() - t
    elapsed_s = time.perf_counter() - t0

    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    io1 = read_bytes()
    peak = cgroup_peak_bytes()

    # Unmeasured: the writes are there (through the array and in the file).
    t = time.perf_counter()
    sample = write_idx[: min(ops, 1000)]
    if writable:
        bad += int(np.count_nonzero(np.asarray(a[sample]) != 1.5))
    stats = a.pager_stats() if backend == "upager" else {}
    region = getattr(a, "region", None)
    del a
    gc.collect()
    if region is not None:
        region.close()  # unmapped (nothing dirty is left: flushed above)
    if writable:
        fd = os.open(path, os.O_RDWR)
        try:
            for i in sample[:256]:
                if struct.unpack("<d", os.pread(fd, 8, int(i) * 8))[0] != 1.5:
                    bad += 1
            verify_s = time.perf_counter() - t
            # Restore the old values, so the next run finds element i = i.
            t = time.perf_counter()
            for i in np.unique(write_idx):
                os.pwrite(fd, struct.pack("<d", float(i)), int(i) * 8)
            os.fsync(fd)
            restore_s = time.perf_counter() - t
        finally:
            os.close(fd)

    writes_flush_s = writes_s + flush_s
    extra = {
        "elements": float(n),
        "bytes": float(n * 8),
        "slices": float((n + slice_elems - 1) // slice_elems),
        "random_ops": float(ops),
        "open_s": open_s,
        "seq_s": seq_s,
        "seq_gb_per_s": n * 8 / max(seq_s, 1e-9) / 1e9,
        "reads_s": reads_s,
        "reads_per_s": ops / max(reads_s, 1e-9),
        "verify_s": verify_s,
        "restore_s": restore_s,
    }
    if writable:
        extra.update({
            "writes_s": writes_s,
            "flush_s": flush_s,
            "writes_flush_s": writes_flush_s,
            "writes_per_s": ops / max(writes_flush_s, 1e-9),
        })
    if io0 is not None and io1 is not None:
        extra["read_bytes"] = float(io1 - io0)
    if peak is not None:
        extra["cgroup_peak_bytes"] = float(peak)
    notes = [f"numpy {np.__version__}"]
    if backend == "upager":
        for k, v in stats.items():
            extra[f"upager.{k}"] = float(v)
        extra["evicted_pages"] = float(stats["evictions"] * cfg["folio_kb"] * 1024 // PAGE)
        in_thread = stats.get("faults_in_thread", 0) > 0
        extra["upager.fault_mode_in_thread"] = 1.0 if in_thread else 0.0
        if cfg["fault_mode"] != "auto" and in_thread != (cfg["fault_mode"] == "in-thread"):
            raise RuntimeError(
                f"asked for fault mode {cfg['fault_mode']}, but faults_in_thread = "
                f"{stats.get('faults_in_thread', 0)}: the package does not honour the mode")
        notes.append(f"upager {upager.__version__} from {os.path.dirname(upager.__file__)}, "
                     f"fault mode {cfg['fault_mode']}")
    return {
        "elapsed_s": elapsed_s,
        "user_s": ru1.ru_utime - ru0.ru_utime,
        "sys_s": ru1.ru_stime - ru0.ru_stime,
        "minflt": ru1.ru_minflt - ru0.ru_minflt,
        "majflt": ru1.ru_majflt - ru0.ru_majflt,
        "ops": (2 if writable else 1) * ops,
        "bad_words": bad,
        "extra": extra,
        "notes": notes,
    }


def main(argv):
    wait_go = "--wait-go" in argv
    args = [a for a in argv if a != "--wait-go"]
    if len(args) != 3 or args[0] != "numpy" or args[1] != "--json":
        sys.stderr.write(__doc__)
        return 2
    cfg = json.loads(args[2])
    try:
        import numpy as np
        upager = None
        if cfg["backend"] == "upager":
            import upager
    except ImportError as e:
        print(f"error {sys.executable} cannot import {e.name} (install it with `make python`): {e}",
              flush=True)
        return 1
    if wait_go:
        print(f"ready {os.getpid()}", flush=True)
        line = sys.stdin.readline()
        if line.strip() != "go":
            print(f"error expected `go` on stdin, got {line!r}", flush=True)
            return 2
    try:
        result = run(cfg, np, upager)
    except Exception as e:  # reported to the suite, which records the run as failed
        print(f"error {type(e).__name__}: {e}", flush=True)
        return 1
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
