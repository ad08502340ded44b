"""Where the CPU of a pass over an S3 object goes: upager's numpy pass
against the parallel ranged-GET client alone (the issue-31 limit), with
the server's CPU beside each.

A pass over an object on a 2-vCPU machine shares the CPUs with the
server (SeaweedFS decompresses, checks signatures and copies for every
GET), so a reader that costs more CPU per byte than the GET client leaves
the server less: this prints, for one run, the wall time, the reader's
own CPU (user + system, the client's child process included), the CPU
the `weed` processes used meanwhile (from /proc/PID/stat), how busy the
machine was (/proc/stat), and for upager its counters (GETs, faults,
async windows).

Needs a running server and its environment, e.g.:

    eval "$(UPAGER_WEED_PORT=22700 bash scripts/seaweedfs.sh env)"
    python3 bench/s3_pass_cpu.py upager s3://bench/rand1g.bin
    python3 bench/s3_pass_cpu.py limit s3://bench/rand1g.bin    # 8 MiB GETs, 4 in flight

(the limit side runs crates/s3/examples/s3bench with UPAGER_S3_BENCH_ONLY=limit:
`cargo build --release -p upager-s3 --examples` first). Default options:
only the budget is set (192 MiB), as in bench/s3_array_bench.py.
"""
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLICE = 1 << 20  # elements summed per step: 8 MiB


def weed_cpu():
    """CPU seconds used so far by the processes whose command line names weed."""
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"weed" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass  # gone meanwhile
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_ticks():
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("upager", "limit"):
        sys.exit(__doc__)
    side, url = sys.argv[1:]
    if side == "upager":
        import numpy as np
        import upager
    w0, s0, t0 = weed_cpu(), cpu_ticks(), time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    extra = ""
    if side == "upager":
        a = upager.memmap(url, np.float64, mode="r", budget="192MiB")
        total = 0.0
        with np.errstate(all="ignore"):  # random bytes as float64: NaNs, infinities
            for i in range(0, a.size, SLICE):
                total += float(a[i:i + SLICE].sum())
        st = a.pager_stats()
        extra = "  " + " ".join(f"{k}={st[k]}" for k in (
            "store_gets", "faults_missing", "faults_deferred", "readahead_async",
            "store_gets_in_flight_peak"))
    else:
        env = dict(os.environ, UPAGER_S3_BENCH_ONLY="limit", UPAGER_S3_BENCH_GRID="8M:4")
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        subprocess.run([str(target / "release/examples/s3bench"), url, "256M"],
                       env=env, check=True, capture_output=True, timeout=600)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    w1, s1 = weed_cpu(), cpu_ticks()
    d = [b - a for a, b in zip(s0, s1)]
    busy = 1 - (d[3] + d[4]) / sum(d)  # idle + iowait
    user = r1.ru_utime - r0.ru_utime + rc.ru_utime
    sys_ = r1.ru_stime - r0.ru_stime + rc.ru_stime
    print(f"{side}: {wall:.2f} s  own cpu {user + sys_:.2f} s (user {user:.2f} sys {sys_:.2f})"
          f"  weed cpu {w1 - w0:.2f} s  machine busy {100 * busy:.0f}%{extra}")


if __name__ == "__main__":
    main()
