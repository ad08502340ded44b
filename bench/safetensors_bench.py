#!/usr/bin/env python3
"""safetensors under a memory budget: upager.safetensors.open against
safetensors.safe_open(framework="np"), side by side (issue 22).

What it measures: a model file 4x the budget (default 1 GiB of float32
tensors, 64 of 16 MiB, against a 256 MiB budget), written by the
safetensors package onto ext4 on a RAM block device (a zram device this
script adds and removes). Each side runs in a fresh Python process that is
put in a memory cgroup limited to the budget before it starts (cgroup v2 if
its memory controller is available, else v1: the convention of
crates/bench/src/cgroup.rs), the file dropped from the page cache before
every run. Timed, in that process, after its imports:

- open: ``safe_open(path, framework="np")`` / ``upager.safetensors.open(path)``;
- all: read every tensor once (``get_tensor(name)``, then its sum);
- one: in a second fresh process, open and read one tensor in the middle
  of the file (the 33rd of 64): the cost of touching one layer of a large
  model;

and the cgroup's peak charge (memory.peak / memory.max_usage_in_bytes) of
each run: the interpreter, numpy, the page cache and anonymous memory all
count. safe_open maps the file with the kernel's mmap and returns each
tensor as a copy; upager's tensors are views into one region read through
its own budget (``budget`` = the cgroup limit minus ``--headroom``, default
64 MiB, for the interpreter: upager's memory is charged to the cgroup too,
and the cgroup has no swap to fall back on).

Why: issue 22 asks whether a model larger than memory can be opened under
a budget and its tensors read on demand, and how that compares with what
model-weights users run today. Every tensor's sum is checked against the
sum computed when the file was written (``bad`` counts mismatches).

Rounds are interleaved (safe_open, upager, safe_open, upager...); the
medians and min-max of each phase are printed and, with --json, written
with the machine's description. Needs root (zram, mount, cgroups),
/dev/userfaultfd, numpy, safetensors and this tree's upager package (make
python).

    python3 bench/safetensors_bench.py --json bench/results/DATE-safetensors/safetensors.json
    python3 bench/safetensors_bench.py --tiny      # a quick check: 64 MiB, 16 MiB
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ENGINES = ("safe_open", "upager")
MIB = 1 << 20


# -- the worker: one engine, one phase, in its cgroup -------------------------

def worker(args):
    import numpy as np

    if args.engine == "upager":
        import upager
    else:
        from safetensors import safe_open
    names = json.loads(args.names)
    t0 = time.perf_counter()
    if args.engine == "upager":
        f = upager.safetensors.open(args.file, budget=args.upager_budget)
        get = f.get_tensor
    else:
        cm = safe_open(args.file, framework="np")
        f = cm.__enter__()
        get = f.get_tensor
    t_open = time.perf_counter() - t0
    sums = {}
    t0 = time.perf_counter()
    for name in names:
        t = get(name)
        sums[name] = float(t.sum(dtype=np.float64))
        del t
    t_read = time.perf_counter() - t0
    out = {"open_s": t_open, "read_s": t_read, "sums": sums}
    if args.engine == "upager":
        s = f.stats()
        out["upager"] = {k: s[k] for k in ("resident_peak_bytes", "budget_bytes",
                                           "evictions", "fills", "bytes_read")}
    print("result " + json.dumps(out), flush=True)


# -- setup: zram + ext4, cgroups ----------------------------------------------

def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Zram:
    """A hot-added zram device with ext4 on it, mounted on a fresh directory."""

    def __init__(self, size):
        with open("/sys/class/zram-control/hot_add") as f:
            self.dev = int(f.read())
        self.mnt = None
        try:
            with open(f"/sys/block/zram{self.dev}/disksize", "w") as f:
                f.write(str(size))
            sh("mkfs.ext4", "-q", "-F", f"/dev/zram{self.dev}")
            self.mnt = tempfile.mkdtemp(prefix="upager-st-bench-")
            sh("mount", f"/dev/zram{self.dev}", self.mnt)
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.mnt:
            subprocess.run(["umount", self.mnt], check=False)
            os.rmdir(self.mnt)
            self.mnt = None
        for _ in range(50):
            try:
                with open("/sys/class/zram-control/hot_remove", "w") as f:
                    f.write(str(self.dev))
                return
            except OSError:
                time.sleep(0.1)


def memory_hierarchy():
    """("v2", root) when the unified hierarchy has the memory controller,
    else ("v1", root) of the memory hierarchy."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    for dev, mnt, fstype, opts, *_ in mounts:
        if fstype == "cgroup2":
            try:
                with open(os.path.join(mnt, "cgroup.controllers")) as c:
                    if "memory" in c.read().split():
                        return "v2", mnt
            except OSError:
                pass
    for dev, mnt, fstype, opts, *_ in mounts:
        if fstype == "cgroup" and "memory" in opts.split(","):
            return "v1", mnt
    raise SystemExit("no memory cgroup hierarchy is mounted")


class Cgroup:
    def __init__(self, version, root, limit):
        self.version = version
        self.path = os.path.join(root, f"upager-st-bench-{os.getpid()}-{time.monotonic_ns()}")
        if version == "v2":
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        os.mkdir(self.path)
        limit_file = "memory.max" if version == "v2" else "memory.limit_in_bytes"
        self._write(limit_file, str(limit))

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def peak(self):
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        with open(os.path.join(self.path, name)) as f:
            return int(f.read())

    def join(self):
        """Runs in the child before exec: moves it into the cgroup."""
        self._write("cgroup.procs", str(os.getpid()))

    def close(self):
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.05)


# -- the file -----------------------------------------------------------------

def make_model(path, total, tensor):
    import numpy as np
    from safetensors.numpy import save_file

    n = total // tensor
    rng = np.random.default_rng(22)
    tensors = {f"layers.{i:03d}.weight": rng.standard_normal(tensor // 4, dtype=np.float32)
               .reshape(-1, 1024) for i in range(n)}
    sums = {k: float(v.sum(dtype=np.float64)) for k, v in tensors.items()}
    save_file(tensors, path, metadata={"what": "upager safetensors benchmark"})
    return sums


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


def run_one(engine, phase, path, names, cg_spec, budget, upager_budget):
    drop_cache(path)
    cg = Cgroup(*cg_spec, budget)
    try:
        cmd = [sys.executable, os.path.abspath(__file__), "worker", "--engine", engine,
               "--file", path, "--names", json.dumps(names),
               "--upager-budget", str(upager_budget)]
        p = subprocess.run(cmd, preexec_fn=cg.join, capture_output=True, text=True,
                           timeout=900)
        peak = cg.peak()
    finally:
        cg.close()
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("result ")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"{engine} {phase} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    res = json.loads(lines[0][len("result "):])
    res["peak_bytes"] = peak
    return res


def machine():
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""
    model = next((ln.split(":", 1)[1].strip() for ln in read("/proc/cpuinfo").splitlines()
                  if ln.startswith("model name")), platform.machine())
    mem = next((ln.split()[1] for ln in read("/proc/meminfo").splitlines()
                if ln.startswith("MemTotal")), "0")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                                ).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": model, "nproc": os.cpu_count(), "mem_gib": round(int(mem) / (1 << 20), 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "loadavg_start": read("/proc/loadavg").split()[:3], "commit": commit}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--engine", choices=ENGINES, required=True)
    w.add_argument("--file", required=True)
    w.add_argument("--names", required=True)
    w.add_argument("--upager-budget", type=int, required=True)
    ap.add_argument("--file-size", type=int, default=1024, help="MiB (default 1024)")
    ap.add_argument("--tensor", type=int, default=16, help="MiB per tensor (default 16)")
    ap.add_argument("--budget", type=int, default=256, help="cgroup limit, MiB (default 256)")
    ap.add_argument("--headroom", type=int, default=64,
                    help="MiB of the cgroup left to the interpreter: upager's budget is "
                         "the limit minus this (default 64)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="64 MiB file, 16 MiB budget, 1 round")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.cmd == "worker":
        return worker(args)
    if args.tiny:
        args.file_size, args.tensor, args.budget, args.headroom, args.rounds = 64, 1, 96, 80, 1
    budget = args.budget * MIB
    upager_budget = budget - args.headroom * MIB
    cg_spec = memory_hierarchy()
    info = machine()
    zram = Zram(args.file_size * MIB * 2 + 256 * MIB)
    try:
        path = os.path.join(zram.mnt, "model.safetensors")
        t0 = time.perf_counter()
        want = make_model(path, args.file_size * MIB, args.tensor * MIB)
        print(f"wrote {path}: {os.path.getsize(path) / MIB:.0f} MiB, {len(want)} tensors, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        names = list(want)
        middle = [names[len(names) // 2]]
        runs = {e: {"all": [], "one": []} for e in ENGINES}
        bad = 0
        for r in range(args.rounds):
            for engine in ENGINES:
                for phase, which in (("all", names), ("one", middle)):
                    res = run_one(engine, phase, path, which, cg_spec, budget, upager_budget)
                    bad += sum(1 for k, v in res.pop("sums").items()
                               if abs(v - want[k]) > 1e-6 * max(1.0, abs(want[k])))
                    runs[engine][phase].append(res)
                    print(f"round {r + 1} {engine:9s} {phase}: open {res['open_s'] * 1e3:7.1f} ms"
                          f"  read {res['read_s']:7.3f} s  peak {res['peak_bytes'] / MIB:6.0f} MiB",
                          flush=True)
    finally:
        zram.close()

    def stat(engine, phase, key):
        v = [x[key] for x in runs[engine][phase]]
        return {"median": statistics.median(v), "min": min(v), "max": max(v)}

    summary = {}
    for e in ENGINES:
        summary[e] = {"open_s": stat(e, "all", "open_s"), "read_all_s": stat(e, "all", "read_s"),
                      "read_one_s": stat(e, "one", "read_s"),
                      "peak_all_bytes": stat(e, "all", "peak_bytes"),
                      "peak_one_bytes": stat(e, "one", "peak_bytes")}
    print(f"\n{'':24s}" + "".join(f"{e:>22s}" for e in ENGINES))
    for key, unit, scale in (("open_s", "ms", 1e3), ("read_all_s", "s", 1),
                             ("read_one_s", "ms", 1e3), ("peak_all_bytes", "MiB", 1 / MIB),
                             ("peak_one_bytes", "MiB", 1 / MIB)):
        cells = "".join(f"{summary[e][key]['median'] * scale:13.1f} {unit:3s}"
                        f"({summary[e][key]['min'] * scale:.0f}-{summary[e][key]['max'] * scale:.0f})"
                        .rjust(22) for e in ENGINES)
        print(f"{key:24s}{cells}")
    print(f"bad sums: {bad}")
    out = {"scenario": "safetensors", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": info, "cgroup": cg_spec[0], "file_bytes": args.file_size * MIB,
           "tensor_bytes": args.tensor * MIB, "tensors": len(names), "middle": middle[0],
           "cgroup_limit_bytes": budget, "upager_budget_bytes": upager_budget,
           "rounds": args.rounds, "bad": bad, "summary": summary, "runs": runs,
           "loadavg_end": open("/proc/loadavg").read().split()[:3]}
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    if bad:
        raise SystemExit(f"{bad} tensor sums were wrong")


if __name__ == "__main__":
    main()
