"""bench/safetensors_bench.py at a tiny size (64 MiB file): both engines
run in their memory cgroups, every tensor's sum is right, the JSON has the
figures docs/benchmarks.md reports. Needs root, zram and a memory cgroup."""

import json
import os
import subprocess
import sys

from conftest import skip_or_fail

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_safetensors_benchmark_runs_tiny(tmp_path):
    if os.geteuid() != 0:
        skip_or_fail("the benchmark needs root (zram, mount, memory cgroups)")
    if not os.path.exists("/sys/class/zram-control/hot_add"):
        skip_or_fail("no zram (modprobe zram): the benchmark's file lives on one")
    out = tmp_path / "st.json"
    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "safetensors_bench.py"),
                        "--tiny", "--json", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["bad"] == 0 and res["tensors"] == 64
    for engine in ("safe_open", "upager"):
        s = res["summary"][engine]
        assert s["read_all_s"]["median"] > 0 and s["open_s"]["median"] > 0
        # The cgroup's limit holds for both sides.
        assert s["peak_all_bytes"]["max"] <= res["cgroup_limit_bytes"]
    for run in res["runs"]["upager"]["all"]:
        assert run["upager"]["resident_peak_bytes"] <= res["upager_budget_bytes"]
