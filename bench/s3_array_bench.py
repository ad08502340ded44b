#!/usr/bin/env python3
"""A numpy array on an S3-compatible store: a pass over it and random
element reads, upager against what users run today, each in a 256 MiB
memory cgroup (issue 31, "Measure").

What it measures: a float64 array (default 2 GiB) uploaded to a local
SeaweedFS (scripts/seaweedfs.sh, loopback, data in /dev/shm) with the CLI
(`upager load`), in two kinds: random doubles (incompressible: the server
sends its stored bytes) and element i = i (compressible: SeaweedFS keeps
such chunks gzipped and decompresses one for every ranged GET). Each run
is a fresh Python process in a fresh memory cgroup, rounds interleaved:

- ``limit`` (pass only): a parallel ranged-GET client alone — the
  object_store client upager's S3 store uses, 2 MiB GETs, 8 in flight,
  64 MiB at a time into one buffer, nothing else done with the bytes
  (crates/s3/examples/s3bench.rs with UPAGER_S3_BENCH_ONLY=limit): what
  the store can give one reader; ``limit-8m`` the same with 8 MiB GETs,
  4 in flight (on SeaweedFS a GET's cost is mostly per request: larger
  GETs reach more, 2026-11-29);
- ``download``: s3fs (fsspec) ``get_file`` to /dev/shm, then
  ``numpy.memmap`` of the copy; its cgroup has no limit (the copy is
  tmpfs memory charged to it, so a 256 MiB limit would kill it): its
  peak is what it needs;
- ``s3fs-fuse``: the bucket mounted read-only with s3fs-fuse (Debian's
  s3fs; the daemon in the reader's cgroup, mounted afresh per run so the
  page cache starts cold), then ``numpy.memmap`` of the mounted file;
- ``fsspec``: s3fs's file object with its defaults (read-ahead cache of
  50 MiB blocks), ``seek`` + ``read``; ``fsspec-nocache`` (random reads
  only): ``cache_type="none"``, one ranged GET per read — the best a
  user of the file object can do for scattered reads;
- ``upager``: ``upager.memmap("s3://...", np.float64, mode="r",
  budget="192MiB")``, every other option its default;
- ``upager-user`` (only when asked for with --sides): the same as an
  ordinary account (--user, default ``upbench``, made with ``useradd``
  if missing): no root, so a userfaultfd that catches user-mode faults
  only (``/dev/userfaultfd`` or ``vm.unprivileged_userfaultfd``), as most
  users run it.

Workloads: ``pass`` = the sum of the whole array in 8 MiB slices;
``random`` = element reads at a fixed random index set (up to --reads,
default 100,000): fancy indexing ``a[idx]`` in calls of 25,000 indices
(the memmap sides and upager), or ``seek`` + ``read`` per element
(fsspec), stopped after --cap seconds (default 40; checked between
calls): the rate is reads done / time. Timed from
after the imports (a download's time is in its run). Every sum is
checked against the one computed when the array was written.

Reported: time (pass) or reads/s (random), the cgroup's peak charge
(page cache and tmpfs included: what the machine had to give), and the
bytes fetched, estimated from the loopback interface's byte count
(every SeaweedFS hop counts, the filer's reads from the volume servers
too), scaled so the limit side's pass counts the array's size once.

Why: issue 31 asks, on the same cluster and budget, for the pass within
80% of the parallel GET client's rate, random reads at least 3x the best
of s3fs-fuse and fsspec, and peak memory within the budget where the
download and the FUSE mount are not. The store is on loopback: this
measures the clients' costs, not a network's.

Needs: root (cgroups, FUSE), numpy and s3fs (bench/requirements-s3.txt),
this tree's upager package (make python), the weed binary
(scripts/seaweedfs.sh build), the release CLI and s3bench (cargo build
--release -p upager-cli; cargo build --release -p upager-s3 --example
s3bench), s3fs-fuse (apt-installed if missing).

    python3 bench/s3_array_bench.py --rounds 3 --json bench/results/DATE-s3-array/all-sides.json
    python3 bench/s3_array_bench.py --tiny          # a quick check: 64 MiB, 1 round
    /path/to/venv/bin/python bench/s3_array_bench.py --sides limit,upager --kinds random
                                                    # the pass against the limit, that venv's upager
    python3 bench/s3_array_bench.py --plot RESULTS.json RESULTS.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from s3bench_common import (Cgroup, Mount, Weed, add_output_args, bars, cli,  # noqa: E402
                            have_s3fs, loopback_bytes, require_cli, save_plot)

PORT = 22640
BUCKET = "upager-array-bench"
KINDS = ("random", "ramp")
PASS_SIDES = ("limit", "limit-8m", "download", "s3fs-fuse", "fsspec", "upager", "upager-user")
RANDOM_SIDES = ("download", "s3fs-fuse", "fsspec", "fsspec-nocache", "upager", "upager-user")
# Sides run only when --sides names them.
ASKED_ONLY = ("upager-user",)
MIB = 1 << 20

CHILD = r'''
import json, os, sys, time
side, work, url, path, n, reads, cap, seed = sys.argv[1:9]
n, reads, cap, seed = int(n), int(reads), float(cap), int(seed)
side = "upager" if side == "upager-user" else side  # who runs it differs, not what
stats0 = {"uid": os.getuid()}  # the upager-user side's: not 0
import numpy as np
SLICE = 1 << 20  # elements: 8 MiB
GATHER = 25_000  # indices per fancy-indexing call
stats = dict(stats0)
def opened():
    """The array as the side sees it (after its download, if any)."""
    if side in ("download", "s3fs-fuse"):
        return np.memmap(path, dtype=np.float64, mode="r", shape=(n,))
    if side == "upager":
        import upager
        return upager.memmap(url, np.float64, mode="r", budget="192MiB")
    raise AssertionError(side)
# Imports before the clock, as the model benchmark does.
if side == "upager":
    import upager
elif side in ("download", "fsspec", "fsspec-nocache"):
    import s3fs
t0 = time.perf_counter()
if side == "download":
    import s3fs
    s3fs.S3FileSystem().get_file(url, path)
if work == "pass":
    total = 0.0
    if side in ("limit", "limit-8m"):
        import subprocess
        grid = "2M:8" if side == "limit" else "8M:4"
        out = subprocess.run([os.environ["S3BENCH"], url, "0"], check=True, text=True,
                             capture_output=True, env=dict(os.environ, UPAGER_S3_BENCH_ONLY="limit",
                                                           UPAGER_S3_BENCH_GRID=grid))
        assert out.stdout.startswith("limit"), out.stdout
        total = None
    elif side == "fsspec":
        import s3fs
        with s3fs.S3FileSystem().open(url, "rb") as f:
            while True:
                b = f.read(SLICE * 8)
                if not b:
                    break
                total += float(np.frombuffer(b, dtype=np.float64).sum())
            stats["client_bytes"] = f.cache.total_requested_bytes
    else:
        a = opened()
        for i in range(0, n, SLICE):
            total += float(a[i:i + SLICE].sum())
        if side == "upager":
            stats["client_bytes"] = a.pager_stats()["bytes_read"]
    done = n
    result = total
else:
    idx = np.random.default_rng(seed).integers(0, n, reads)
    total, done = 0.0, 0
    if side in ("fsspec", "fsspec-nocache"):
        import s3fs
        kw = {"cache_type": "none"} if side == "fsspec-nocache" else {}
        with s3fs.S3FileSystem().open(url, "rb", **kw) as f:
            for i in idx:
                f.seek(int(i) * 8)
                total += float(np.frombuffer(f.read(8), dtype=np.float64)[0])
                done += 1
                if done % 100 == 0 and time.perf_counter() - t0 > cap:
                    break
            stats["client_bytes"] = getattr(f.cache, "total_requested_bytes", None)
    else:
        a = opened()
        for c in range(0, reads, GATHER):
            total += float(a[idx[c:c + GATHER]].sum())
            done = min(reads, c + GATHER)
            if time.perf_counter() - t0 > cap:
                break
        if side == "upager":
            stats["client_bytes"] = a.pager_stats()["bytes_read"]
    result = total
el = time.perf_counter() - t0
if side == "download":
    os.unlink(path)
print(json.dumps(dict(seconds=el, done=done, result=result, **stats)))
'''


def expected(a, idx_seed: int, reads: int) -> Dict[str, Any]:
    """The pass's sum of array `a`, and the prefix sums of the random reads
    (a run that stopped early is checked against the reads it did)."""
    import numpy as np
    idx = np.random.default_rng(idx_seed).integers(0, len(a), reads)
    return dict(total=float(a.sum()), prefix=np.cumsum(a[idx]))


def make(kind: str, n: int):
    import numpy as np
    if kind == "random":
        return np.random.default_rng(7).random(n)
    return np.arange(n, dtype=np.float64)


def run_one(side: str, work: str, url: str, n: int, a: argparse.Namespace) -> Dict[str, Any]:
    """One run in a fresh cgroup (no limit for the download: its copy is
    tmpfs memory), with its mount if it needs one."""
    cg = Cgroup(None if side == "download" else a.cgroup_mib * MIB, tag="s3-array")
    path = f"/dev/shm/upager-s3-array-dl-{os.getpid()}"
    mount = (Mount(os.environ["AWS_ENDPOINT_URL"], BUCKET, url.split("/", 3)[3], cg)
             if side == "s3fs-fuse" else None)
    lo0 = loopback_bytes()
    env, start = None, cg.join
    if side == "upager-user":
        import pwd
        pw = pwd.getpwnam(a.user)
        env = dict(os.environ, HOME="/tmp", USER=a.user, LOGNAME=a.user)

        def start() -> None:  # in the child: into the cgroup as root, then the user
            cg.join()
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
    try:
        if mount is not None:
            path = str(mount.__enter__())
        out = subprocess.run(
            [sys.executable, "-c", CHILD, side, work, url, path, str(n), str(a.reads),
             str(a.cap), "11"],
            capture_output=True, text=True, timeout=a.cap + 900, check=False,
            preexec_fn=start, env=env, cwd="/tmp")
        res = dict(peak=cg.peak())
    finally:
        if mount is not None:
            mount.__exit__(None, None, None)
        cg.close()
    if out.returncode != 0:
        tail = out.stderr.strip()[-1500:]
        res.update(error=f"exit {out.returncode}: {tail}")
        return res
    res.update(json.loads(out.stdout.strip().splitlines()[-1]), lo_bytes=loopback_bytes() - lo0)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_args(ap)
    ap.add_argument("--size-mib", type=int, default=2048, help="array size (default 2048)")
    ap.add_argument("--reads", type=int, default=100_000, help="random reads (default 100,000)")
    ap.add_argument("--cap", type=float, default=40.0,
                    help="seconds after which a random-read run stops (default 40)")
    ap.add_argument("--cgroup-mib", type=int, default=256, help="memory cgroup (default 256)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="data kinds (default random,ramp)")
    ap.add_argument("--tiny", action="store_true", help="64 MiB, 2,000 reads, 1 round")
    ap.add_argument("--sides", default=None,
                    help="run only these sides, comma-separated (e.g. limit,upager: an A/B of "
                         "two builds run with two interpreters); default all but upager-user")
    ap.add_argument("--user", default="upbench",
                    help="the ordinary account of the upager-user side (default upbench, "
                         "created if missing)")
    a = ap.parse_args()
    if a.plot:
        plot(*a.plot)
        return
    if a.tiny:
        a.size_mib, a.reads, a.rounds = 64, 2000, 1
    if os.geteuid() != 0:
        sys.exit("run as root: each run gets its own memory cgroup (and s3fs-fuse a mount)")
    only = None if a.sides is None else set(a.sides.split(","))
    require_cli(s3fs=only is None or bool(only & {"download", "fsspec", "fsspec-nocache"}))
    s3bench = cli().parent / "examples" / "s3bench"
    if not s3bench.exists():
        sys.exit(f"s3bench is not built ({s3bench}): "
                 "cargo build --release -p upager-s3 --example s3bench")
    os.environ["S3BENCH"] = str(s3bench)
    n = a.size_mib * MIB // 8
    kinds = a.kinds.split(",")
    if only is not None and not only <= set(PASS_SIDES + RANDOM_SIDES):
        sys.exit(f"--sides: unknown side(s) {sorted(only - set(PASS_SIDES + RANDOM_SIDES))}; "
                 f"the sides are {sorted(set(PASS_SIDES + RANDOM_SIDES))}")
    if only is not None and "upager-user" in only:
        import pwd
        try:
            pwd.getpwnam(a.user)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", a.user], check=True)
    fuse = have_s3fs()
    if not fuse:
        print("s3fs-fuse skipped: s3fs is missing (apt-get install s3fs)", flush=True)
    runs: List[Dict[str, Any]] = []
    with Weed(PORT, BUCKET):
        want = {}
        for kind in kinds:
            f = pathlib.Path("/dev/shm") / f"upager-s3-array-{os.getpid()}.f64"
            arr = make(kind, n)
            arr.tofile(f)
            want[kind] = expected(arr, 11, a.reads)
            del arr
            t0 = time.perf_counter()
            subprocess.run([str(cli()), "load", str(f), f"s3://{BUCKET}/{kind}.f64"],
                           check=True, timeout=1800, capture_output=True)
            print(f"uploaded {kind}: {a.size_mib} MiB in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            f.unlink()
        for rnd in range(a.rounds):
            for kind in kinds:
                url = f"s3://{BUCKET}/{kind}.f64"
                for work, sides in (("pass", PASS_SIDES), ("random", RANDOM_SIDES)):
                    for side in sides:
                        if side == "s3fs-fuse" and not fuse:
                            continue
                        if only is not None and side not in only:
                            continue
                        if only is None and side in ASKED_ONLY:
                            continue
                        res = run_one(side, work, url, n, a)
                        res.update(side=side, work=work, kind=kind, round=rnd + 1)
                        if "error" not in res and res["result"] is None:
                            res["ok"] = True  # the limit reads bytes, sums nothing
                            del res["result"]
                        elif "error" not in res:
                            w = want[kind]
                            ok = (w["total"] if work == "pass"
                                  else float(w["prefix"][res["done"] - 1]))
                            res["ok"] = abs(res.pop("result") - ok) <= 1e-9 * max(1.0, abs(ok))
                        runs.append(res)
                        print(f"[{rnd + 1}/{a.rounds}] {kind:6} {work:6} {side:14} "
                              + describe(res), flush=True)
    summary = summarize(runs, a.size_mib * MIB)
    report(summary)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            machine=dict(cpus=os.cpu_count(), kernel=platform.release(),
                         cpu=platform.processor() or platform.machine()),
            command_line=sys.argv, array_bytes=a.size_mib * MIB, reads=a.reads, cap=a.cap,
            cgroup_mib=a.cgroup_mib, rounds=a.rounds, runs=runs, summary=summary),
            indent=1) + "\n")
        print(f"wrote {a.json}")


def describe(res: Dict[str, Any]) -> str:
    if "error" in res:
        return f"FAILED ({res['error'][-300:]})"
    rate = (f"{res['seconds']:.2f} s" if res["work"] == "pass"
            else f"{res['done'] / res['seconds']:.0f} reads/s ({res['done']} in {res['seconds']:.1f} s)")
    return (f"{rate}  peak {res['peak'] / MIB:.0f} MiB  loopback {res['lo_bytes'] / MIB:.0f} MiB"
            f"  {'ok' if res['ok'] else 'WRONG'}")


def summarize(runs: List[Dict[str, Any]], size: int) -> Dict[str, Any]:
    """Medians per kind, workload and side; bytes fetched scaled by the
    limit's loopback bytes per array byte (same kind)."""
    out: Dict[str, Any] = {}
    for kind in {r["kind"] for r in runs}:
        good = [r for r in runs if r["kind"] == kind and "error" not in r]
        lim = [r["lo_bytes"] for r in good if r["side"] == "limit"]
        hop = statistics.median(lim) / size if lim else None
        for work in ("pass", "random"):
            for side in {r["side"] for r in good if r["work"] == work}:
                rs = [r for r in good if r["work"] == work and r["side"] == side]
                m = dict(seconds=statistics.median(r["seconds"] for r in rs),
                         rate=statistics.median(r["done"] / r["seconds"] for r in rs),
                         peak=statistics.median(r["peak"] for r in rs),
                         runs=len(rs), wrong=sum(1 for r in rs if not r["ok"]),
                         failed=sum(1 for r in runs if r["kind"] == kind and r["work"] == work
                                    and r["side"] == side and "error" in r))
                if hop:
                    m["fetched"] = statistics.median(r["lo_bytes"] for r in rs) / hop
                    m["used"] = (size if work == "pass"
                                 else 8 * statistics.median(r["done"] for r in rs))
                out.setdefault(kind, {}).setdefault(work, {})[side] = m
    return out


def report(summary: Dict[str, Any]) -> None:
    for kind, works in summary.items():
        print(f"\n{kind}: medians")
        for work, sides in works.items():
            for side, m in sorted(sides.items()):
                what = (f"{m['seconds']:8.2f} s" if work == "pass"
                        else f"{m['rate']:8.0f} reads/s")
                fetched = (f"  fetched ~{m['fetched'] / MIB:.0f} MiB for {m['used'] / MIB:.2f} MiB used"
                           if "fetched" in m else "")
                print(f"  {work:6} {side:14} {what}  peak {m['peak'] / MIB:6.0f} MiB{fetched}"
                      f"  runs {m['runs']} wrong {m['wrong']} failed {m['failed']}")


def plot(src: pathlib.Path, png: pathlib.Path) -> None:
    """Per data kind: pass time, random-read rate and peak memory per side
    (medians as bars, each run as a dot)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    r = json.loads(src.read_text())
    kinds = [k for k in KINDS if k in r["summary"]]
    fig, axes = plt.subplots(len(kinds), 3, figsize=(13, 3.4 * len(kinds)), squeeze=False)
    for row, kind in zip(axes, kinds):
        panels = (("pass", "seconds", "pass, s", 1.0), ("random", "rate", "random reads/s", 1.0),
                  ("pass", "peak", "peak memory (pass), MiB", 1 / MIB))
        for ax, (work, key, label, scale) in zip(row, panels):
            order = PASS_SIDES if work == "pass" else RANDOM_SIDES
            med = r["summary"][kind].get(work, {})
            bars(ax, [s for s in order if s in med],
                 lambda side: med[side][key] * scale,
                 lambda side: [(x["done"] / x["seconds"] if key == "rate" else x[key]) * scale
                               for x in r["runs"] if x["side"] == side and x["work"] == work
                               and x["kind"] == kind and "error" not in x],
                 fontsize=7)
            if key == "rate":
                ax.set_yscale("log")
            ax.set_title(f"{kind}: {label}", fontsize=9)
    save_plot(fig, f"{r['array_bytes'] / (1 << 30):.0f} GiB float64 on SeaweedFS (loopback), "
              f"{r['cgroup_mib']} MiB cgroups, medians of {r['rounds']}", r, png)


if __name__ == "__main__":
    main()
