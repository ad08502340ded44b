#!/usr/bin/env python3
"""Model weights on an S3-compatible store: time to the first tensor and
to all of them, upager against what users run today (issue 31).

What it measures: a safetensors file (default 1 GiB: 64 float32 tensors of
16 MiB) uploaded to a local SeaweedFS (scripts/seaweedfs.sh, on loopback,
data in /dev/shm) with the CLI (`upager load`). Each side runs in a fresh
Python process, rounds interleaved; in that process, after its imports:

- ``download``: s3fs (fsspec) ``get_file`` to /dev/shm, then the real
  ``safetensors.safe_open(framework="np")`` on the copy: what most users
  do today;
- ``fsspec``: s3fs's file object (its default read-ahead block cache),
  the header parsed by hand and each tensor read with ``seek`` + ``read``
  (a ranged GET per cache miss): streaming without a local copy;
- ``s3fs-fuse``: the bucket mounted read-only with s3fs-fuse (Debian's
  s3fs, path-style requests; mounted afresh for each run, so the kernel's
  page cache of it starts cold), then the real ``safetensors.safe_open``
  on the mounted file, which maps it: what users of numpy.memmap do with
  a FUSE mount, with no budget (skipped, with a line, where s3fs is
  missing and cannot be installed: it is apt-installed when run as root);
- ``upager``: ``upager.safetensors.safe_open("s3://...", framework="np")``
  with the default options and a 256 MiB budget (4x smaller than the
  model): the header by two ranged GETs, tensors paged in 64 KiB folios,
  readahead many GETs in flight.

Timed: ``first`` = start to the first tensor summed (a middle layer, the
33rd of 64, as a program touching one layer would), ``all`` = start to
every tensor summed, in reverse file order (not the order readahead
likes); the process's peak RSS (VmHWM, the peak since exec). Every sum is checked against
the one computed when the file was written.

Why: issue 31 asks for the time to first tensor and for comparisons with
download + memmap and fsspec. The store is on loopback, so this measures
the clients' own costs, not a network's; a remote store adds its latency
to every round trip, which favours whoever makes fewer of them.

Needs: numpy, safetensors, s3fs (bench/requirements-s3.txt), this tree's
upager package (make python), the weed binary (scripts/seaweedfs.sh build)
and the release CLI (cargo build --release -p upager-cli).

    python3 -m pip install -r bench/requirements-s3.txt
    python3 bench/s3_model_bench.py --rounds 3 --json bench/results/DATE-s3-model/model.json
    python3 bench/s3_model_bench.py --tiny        # a quick check: 64 MiB
    python3 bench/s3_model_bench.py --plot RESULTS.json RESULTS.png
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
from s3bench_common import (Mount, Weed, add_output_args, bars, cli,  # noqa: E402
                            have_s3fs, require_cli, save_plot)

PORT = 22600
BUCKET = "upager-bench"
KEY = "models/model.safetensors"
SIDES = ("download", "fsspec", "s3fs-fuse", "upager")

CHILD = r'''
import json, os, sys, time
t0 = time.perf_counter()
side, url, names, first, tmp = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
import numpy as np
sums = {}
def done(name, a):
    sums[name] = float(np.asarray(a, dtype=np.float64).sum())
t_import = time.perf_counter() - t0
t0 = time.perf_counter()
order = [first] + [n for n in reversed(names) if n != first]
if side == "upager":
    import upager.safetensors
    with upager.safetensors.safe_open(url, framework="np", budget="256MiB") as st:
        for i, n in enumerate(order):
            done(n, st.get_tensor(n))
            if i == 0:
                t_first = time.perf_counter() - t0
elif side == "s3fs-fuse":
    import safetensors
    with safetensors.safe_open(tmp, framework="np") as st:
        for i, n in enumerate(order):
            done(n, st.get_tensor(n))
            if i == 0:
                t_first = time.perf_counter() - t0
elif side == "download":
    import s3fs, safetensors
    fs = s3fs.S3FileSystem()
    fs.get_file(url, tmp)
    try:
        with safetensors.safe_open(tmp, framework="np") as st:
            for i, n in enumerate(order):
                done(n, st.get_tensor(n))
                if i == 0:
                    t_first = time.perf_counter() - t0
    finally:
        os.unlink(tmp)
else:
    import s3fs
    fs = s3fs.S3FileSystem()
    with fs.open(url, "rb") as f:
        n8 = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n8))
        base = 8 + n8
        for i, n in enumerate(order):
            e = hdr[n]
            b, end = e["data_offsets"]
            f.seek(base + b)
            a = np.frombuffer(f.read(end - b), dtype=np.float32)
            done(n, a)
            if i == 0:
                t_first = time.perf_counter() - t0
t_all = time.perf_counter() - t0
# VmHWM: the peak of this process's memory since exec (ru_maxrss would
# carry the parent's peak over the fork).
rss = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps(dict(first=t_first, all=t_all, import_s=t_import, peak_rss=rss, sums=sums)))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_args(ap)
    ap.add_argument("--tensors", type=int, default=64, help="tensors (default 64)")
    ap.add_argument("--tensor-mib", type=int, default=16, help="MiB per tensor (default 16)")
    ap.add_argument("--tiny", action="store_true", help="16 tensors of 4 MiB, 1 round")
    a = ap.parse_args()
    if a.plot:
        plot(*a.plot)
        return
    if a.tiny:
        a.tensors, a.tensor_mib, a.rounds = 16, 4, 1
    require_cli()
    import numpy as np
    from safetensors.numpy import save_file

    with Weed(PORT, BUCKET):
        rng = np.random.default_rng(5)
        cols = 1024
        rows = a.tensor_mib * (1 << 20) // 4 // cols
        names = [f"layers.{i:03}.w" for i in range(a.tensors)]
        tensors = {n: rng.random((rows, cols), dtype=np.float32) for n in names}
        want = {n: float(t.astype(np.float64).sum()) for n, t in tensors.items()}
        f = pathlib.Path("/dev/shm") / f"upager-s3-model-{os.getpid()}.safetensors"
        save_file(tensors, str(f))
        del tensors
        size = f.stat().st_size
        url = f"s3://{BUCKET}/{KEY}"
        t0 = time.perf_counter()
        subprocess.run([str(cli()), "load", str(f), url], check=True, timeout=600,
                       capture_output=True)
        print(f"uploaded {size / (1 << 20):.0f} MiB in {time.perf_counter() - t0:.1f} s",
              flush=True)
        f.unlink()
        first = names[len(names) // 2]
        sides = [s for s in SIDES if s != "s3fs-fuse" or have_s3fs()]
        if "s3fs-fuse" not in sides:
            print("s3fs-fuse skipped: s3fs is missing (apt-get install s3fs)", flush=True)
        runs: List[Dict[str, Any]] = []
        for r in range(a.rounds):
            for side in sides:
                tmp = f"/dev/shm/upager-s3-model-dl-{os.getpid()}"
                mount = (Mount(os.environ["AWS_ENDPOINT_URL"], BUCKET, KEY)
                         if side == "s3fs-fuse" else None)
                if mount is not None:
                    tmp = str(mount.__enter__())
                try:
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, side, url, json.dumps(names), first, tmp],
                        capture_output=True, text=True, timeout=900, check=False)
                finally:
                    if mount is not None:
                        mount.__exit__(None, None, None)
                if out.returncode != 0:
                    sys.exit(f"{side}: {out.stderr.strip()[-2000:]}")
                res = json.loads(out.stdout.strip().splitlines()[-1])
                bad = sum(1 for n, s in res.pop("sums").items()
                          if abs(s - want[n]) > 1e-6 * abs(want[n]))
                res.update(side=side, round=r + 1, bad=bad)
                runs.append(res)
                print(f"[{r + 1}/{a.rounds}] {side:9} first {res['first']:.3f} s  all "
                      f"{res['all']:.3f} s  peak RSS {res['peak_rss'] / (1 << 20):.0f} MiB"
                      f"  bad {bad}", flush=True)
    summary = {}
    for side in sides:
        rs = [x for x in runs if x["side"] == side]
        summary[side] = {k: statistics.median(x[k] for x in rs)
                         for k in ("first", "all", "peak_rss")}
        summary[side]["bad"] = sum(x["bad"] for x in rs)
    base = summary["download"]
    print(f"\nmedians of {a.rounds} interleaved rounds, {size / (1 << 20):.0f} MiB model, "
          f"{a.tensors} tensors, SeaweedFS on loopback:")
    print(f"{'side':10}{'first s':>10}{'all s':>10}{'peak RSS MiB':>14}"
          f"{'first vs download':>20}{'all vs download':>18}")
    for side, m in summary.items():
        print(f"{side:10}{m['first']:>10.3f}{m['all']:>10.3f}{m['peak_rss'] / (1 << 20):>14.0f}"
              f"{base['first'] / m['first']:>19.2f}x{base['all'] / m['all']:>17.2f}x")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            machine=dict(cpus=os.cpu_count(), kernel=platform.release(),
                         cpu=platform.processor() or platform.machine()),
            command_line=sys.argv, model_bytes=size, tensors=a.tensors,
            rounds=a.rounds, runs=runs, summary=summary), indent=1) + "\n")
        print(f"wrote {a.json}")


def plot(src: pathlib.Path, png: pathlib.Path) -> None:
    """Bars of the medians (first tensor, all tensors, peak RSS) per side,
    each run's value as a dot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    r = json.loads(src.read_text())
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for ax, (key, label, scale) in zip(axes, (("first", "first tensor, s", 1.0),
                                              ("all", "all tensors, s", 1.0),
                                              ("peak_rss", "peak RSS, MiB", 1 / (1 << 20)))):
        bars(ax, [s for s in SIDES if s in r["summary"]],
             lambda side: r["summary"][side][key] * scale,
             lambda side: [x[key] * scale for x in r["runs"] if x["side"] == side])
        ax.set_title(label)
    save_plot(fig, f"{r['model_bytes'] / (1 << 30):.0f} GiB safetensors model on SeaweedFS "
              f"(loopback), medians of {r['rounds']}", r, png)


if __name__ == "__main__":
    main()
