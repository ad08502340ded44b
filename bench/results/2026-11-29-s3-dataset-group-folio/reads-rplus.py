"""Reads from a writable S3 dataset map, its default folio (the group,
256 KiB) against 64 KiB: what the group folio costs reads (docs/benchmarks.md,
"S3 datasets: a writable map's folio is its group"). A 512 MiB dataset of
random doubles (256 KiB groups) on a SeaweedFS of its own (port 22640);
per round and folio a fresh process maps it "r+" under 64 MiB, gathers
2,000 random elements (timed), then reads 200 of them one by one (timed;
most were evicted). Run from a checkout at /work/main after `make python`
and the release CLI build: python3 reads-rplus.py
"""
import json, os, subprocess, sys, time, statistics, tempfile, pathlib
import numpy as np
ROOT = "/work/main"; CLI = ROOT + "/target/release/upager"; PORT = "22640"
def weed(*a):
    return subprocess.run(["bash", ROOT + "/scripts/seaweedfs.sh", *a], check=True, capture_output=True, text=True,
                          env=dict(os.environ, UPAGER_WEED_PORT=PORT)).stdout
CHILD = r'''
import sys, time, json, numpy as np, upager
url, folio, seed, k = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4])
a = upager.memmap(url, np.float64, mode="r+", budget="64MiB", folio=folio)
idx = np.random.default_rng(seed).integers(0, a.size, k)
t0 = time.perf_counter(); s = float(a[idx].sum()); g = time.perf_counter() - t0
t0 = time.perf_counter(); s2 = sum(float(a[int(i)]) for i in idx[:200]); e = time.perf_counter() - t0
print(json.dumps(dict(gather=g, scalar200=e, folio=a._mmap.folio, bytes_read=a.pager_stats()["bytes_read"])))
'''
weed("start")
for part in weed("env").replace("export ", "").split():
    k, _, v = part.partition("="); os.environ[k] = v
weed("mb", "rrb")
f = pathlib.Path(tempfile.mkdtemp(dir="/dev/shm")) / "a.f64"
np.random.default_rng(1).random(64 << 20).tofile(f)
url = "s3://rrb/a/"
subprocess.run([CLI, "load", str(f), url], check=True, capture_output=True)
res = {"": [], "64K": []}
try:
    for rnd in range(4):
        for fo in res:
            out = json.loads(subprocess.run([sys.executable, "-c", CHILD, url, fo, str(rnd), "2000"], check=True,
                                            capture_output=True, text=True).stdout)
            print(rnd, fo or "default", out, flush=True); res[fo].append(out)
finally:
    weed("stop"); f.unlink()
for fo, rs in res.items():
    print(fo or "default", "gather median", statistics.median(r["gather"] for r in rs),
          "scalar200 median", statistics.median(r["scalar200"] for r in rs))
