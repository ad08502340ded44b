"""Warm starts from Python (issue 32): ``warm="auto"`` records the order a
file's folios are first needed beside it (FILE.upager-trace) and the next
map replays it as prefetch; bad values and copy-on-write are refused; the
``upager trace`` view of it agrees."""

import os
import time

import numpy as np
import pytest

import upager
from conftest import MIB


def gather(path, idx, **kw):
    a = upager.memmap(path, np.float64, "r", budget="8MiB", **kw)
    total = 0.0
    for i in idx:  # one row at a time, with a little work, as a program has
        total += float(a[i])
        t = time.perf_counter()
        while time.perf_counter() - t < 20e-6:
            pass
    stats = a.pager_stats()
    del a
    return total, stats


def test_a_gather_replays_in_recorded_order(scratch):
    path = os.path.join(scratch, "rows.f64")
    np.arange(4 * MIB, dtype=np.float64).tofile(path)  # 32 MiB
    idx = np.random.default_rng(7).permutation(4 * MIB)[:2000]
    trace = path + ".upager-trace"
    total, off = gather(path, idx)
    assert total == float(idx.sum())
    assert not os.path.exists(trace), "no trace unless asked"
    _, cold = gather(path, idx, warm="auto")
    assert os.path.exists(trace)
    assert cold["replay_reads"] == 0
    total, warm = gather(path, idx, warm="auto")
    assert total == float(idx.sum())
    assert warm["replay_reads"] >= 1500, warm
    assert warm["faults_missing"] * 4 <= cold["faults_missing"], (cold, warm)
    assert warm["resident_peak_bytes"] <= 8 * MIB
    # "record" records anew rather than replaying.
    _, rec = gather(path, idx, warm="record")
    assert rec["replay_reads"] == 0
    # A Pager's default, overridden per map.
    p = upager.Pager(budget="8MiB", warm="auto")
    r = p.map_file(path, warm="off")
    r.close()
    p.close()


def test_bad_warm_values_are_refused(scratch):
    path = os.path.join(scratch, "f")
    np.zeros(1024, dtype=np.float64).tofile(path)
    with pytest.raises(ValueError, match='warm must be "off", "auto" or "record"'):
        upager.Pager(budget="8MiB", warm="yes")
    p = upager.Pager(budget="8MiB")
    with pytest.raises(ValueError, match="warm must be"):
        p.map_file(path, warm="on")
    with pytest.raises(ValueError, match="copy-on-write"):
        p.map_file(path, mode="c", warm="auto")
    assert not os.path.exists(path + ".upager-trace")
    p.close()
