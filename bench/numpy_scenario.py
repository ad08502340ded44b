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
benchmark. Issue 29's targets are for what a user gets with the defaults:
``upager.open_array(path, np.float64, mode="r+", budget=...)`` (the same
call as ``upager.memmap(path, np.float64, mode="r+", budget=...)``), no
folio size and no fault mode: this driver passes ``folio``,
``fault_mode``, ``huge_runs`` and ``readahead_async`` only where the
engine sets them.

Two kinds of data (``data``; `upager bench numpy --data`, both by
default), because the device decides what a miss costs:

- ``compressible``: element i is float(i). zram compresses these pages
  several times over, so every read from the device decompresses (CPU
  work in the reading thread, for numpy.memmap's page cache and upager's
  O_DIRECT reads alike).
- ``incompressible``: element i is the i-th output of splitmix64 seeded
  with ``seed``, its top 53 bits as a float64 in [0, 1) (as numpy's
  ``random()`` makes a double; ``f64_random`` in
  crates/bench/src/pattern.rs makes the file). zram stores such pages as
  they are, so a read is a copy: closer to a fast disk, where the pager's
  own costs weigh more.

Correctness, checked after the phases (untimed; the timed pass only keeps
each slice's sum): compressible data has exact expected slice sums
(integers below 2^53 add exactly in float64); for incompressible data the
suite sends the exact sum of each slice (``slice_sums``, made from the
formula with integer arithmetic) and numpy's sum must be within
``(hi - lo) * 2^-40`` of it, 128 times the rounding of numpy's pairwise
summation of values in [0, 1), while a wrong element moves the sum by
about its value (random in [0, 1)). Every element the gather read is
compared with the formula. A wrong sum or element is counted in
``bad_words`` and fails the run. After the phases the written elements
are read back (through the array, and from the file with pread) and the
old values are written back, so the next run finds the file as it was.

Protocol: started as ``numpy_scenario.py numpy --json '{...}' --wait-go``
by the suite's worker runner (crates/bench/src/worker.rs): prints
``ready <pid>``, waits for ``go`` on stdin, prints ``result <json>`` (the
shape of the Rust workers' WorkerResult) or ``error <message>``. The JSON
is the suite's ``Workload::Numpy``: file, backend ("memmap" or "upager"),
budget, folio_kb (absent or null: upager chooses), fault_mode
("handlers", "in-thread", or "auto": upager chooses), slice_bytes,
random_ops, seed, data ("compressible", the default, or
"incompressible"), slice_sums (incompressible data), huge_runs and
readahead_async (upager's options; absent or null: the package's
default) and mode ("r+", the default, or "r": no write phase).
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
    """upager.open_array with the budget and the options the engine sets
    (none of folio, huge_runs, readahead_async and fault_mode for `upager
    defaults`), in the requested fault mode: the `fault_mode` keyword where
    the package has it, else UPAGER_FAULT_MODE (read by the engine's
    builder when the pager is made)."""
    kwargs = dict(mode=cfg.get("mode", "r+"), budget=cfg["budget"])
    if cfg.get("folio_kb") is not None:
        kwargs["folio"] = cfg["folio_kb"] * 1024
    # issue 23's ablations: mixed folio sizes; every window read by the
    # fault that needs it
    for k in ("huge_runs", "readahead_async"):
        if cfg.get(k) is not None:
            kwargs[k] = bool(cfg[k])
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


GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


def f64_random(np, idx, seed):
    """Elements ``idx`` (int64 array) of an incompressible file made with
    ``seed``: splitmix64's ``mix(seed + i * GOLDEN)`` (``mix`` adds GOLDEN
    first), top 53 bits, times 2^-53 (pattern.rs ``f64_random``). uint64
    arithmetic wraps in numpy arrays, as ``wrapping_*`` does in Rust."""
    u = np.uint64
    z = idx.astype(np.uint64) * u(GOLDEN)
    z += u((seed + GOLDEN) & MASK64)
    z ^= z >> u(30)
    z *= u(0xBF58476D1CE4E5B9)
    z ^= z >> u(27)
    z *= u(0x94D049BB133111EB)
    z ^= z >> u(31)
    return (z >> u(11)).astype(np.float64) * (1.0 / (1 << 53))


def expected_elements(np, cfg, idx):
    """What the file holds at ``idx``, by its kind of data."""
    if cfg.get("data", "compressible") == "incompressible":
        return f64_random(np, idx, int(cfg["seed"]))
    return idx.astype(np.float64)


def wrong_slice_sums(cfg, sums, n, slice_elems):
    """How many of the sequential pass's slice sums (``sums``, in order)
    are wrong for the file's kind of data."""
    bounds = [(lo, min(n, lo + slice_elems)) for lo in range(0, n, slice_elems)]
    if len(sums) != len(bounds):
        raise RuntimeError(f"{len(sums)} slice sums for {len(bounds)} slices")
    if cfg.get("data", "compressible") != "incompressible":
        # element i = i: exact (integers below 2^53 add exactly)
        return sum(1 for (lo, hi), s in zip(bounds, sums) if s != (lo + hi - 1) * (hi - lo) // 2)
    want = cfg.get("slice_sums") or []
    if len(want) != len(bounds):
        raise RuntimeError(f"the suite sent {len(want)} slice sums for {len(bounds)} slices")
    return sum(1 for (lo, hi), s, w in zip(bounds, sums, want)
               if not abs(s - w) <= (hi - lo) * 2.0 ** -40)


def run(cfg, np, upager):
    path = cfg["file"]
    n = os.stat(path).st_size // 8
    ops = int(cfg["random_ops"])
    slice_elems = max(1, int(cfg["slice_bytes"]) // 8)
    rng = np.random.default_rng(int(cfg["seed"]) & ((1 << 63) - 1))
    read_idx = rng.integers(0, n, size=ops, dtype=np.int64)
    write_idx = rng.integers(0, n, size=ops, dtype=np.int64)
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

    # 1. Sequential pass: the sum of each slice (checked after the phases).
    sums = []
    t0 = time.perf_counter()
    for lo in range(0, n, slice_elems):
        hi = min(n, lo + slice_elems)
        sums.append(float(a[lo:hi].sum()))
    seq_s = time.perf_counter() - t0

    # 2. Random element reads: one gather and its sum (each element
    # checked after the phases).
    t = time.perf_counter()
    got = a[read_idx]
    float(got.sum())  # what the user computes from them
    reads_s = time.perf_counter() - t

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
    folio_bytes = region.folio if region is not None else PAGE
    del a
    gc.collect()
    if region is not None:
        region.close()  # unmapped (nothing dirty is left: flushed above)
    # What was read: every slice sum, every element of the gather (after
    # the array is closed: upager's budget is free again for the numpy
    # temporaries, inside the same cgroup).
    bad += wrong_slice_sums(cfg, sums, n, slice_elems)
    bad += int(np.count_nonzero(np.asarray(got) != expected_elements(np, cfg, read_idx)))
    if writable:
        fd = os.open(path, os.O_RDWR)
        try:
            for i in sample[:256]:
                if struct.unpack("<d", os.pread(fd, 8, int(i) * 8))[0] != 1.5:
                    bad += 1
            verify_s = time.perf_counter() - t
            # Restore the old values, so the next run finds the file as it was.
            t = time.perf_counter()
            written = np.unique(write_idx)
            for i, v in zip(written.tolist(), expected_elements(np, cfg, written).tolist()):
                os.pwrite(fd, struct.pack("<d", v), i * 8)
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
    notes = [f"numpy {np.__version__}", f"data {cfg.get('data', 'compressible')}"]
    if backend == "upager":
        for k, v in stats.items():
            extra[f"upager.{k}"] = float(v)
        extra["upager.folio_bytes"] = float(folio_bytes)
        extra["evicted_pages"] = float(stats["evictions"] * folio_bytes // PAGE)
        in_thread = stats.get("faults_in_thread", 0) > 0
        extra["upager.fault_mode_in_thread"] = 1.0 if in_thread else 0.0
        if cfg["fault_mode"] != "auto" and in_thread != (cfg["fault_mode"] == "in-thread"):
            raise RuntimeError(
                f"asked for fault mode {cfg['fault_mode']}, but faults_in_thread = "
                f"{stats.get('faults_in_thread', 0)}: the package does not honour the mode")
        notes.append(f"upager {upager.__version__} from {os.path.dirname(upager.__file__)}, "
                     f"fault mode {cfg['fault_mode']}, folio {folio_bytes // 1024} KiB"
                     + ("" if cfg.get("folio_kb") is not None else " (upager's default)"))
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
