"""Several writers of one file (issue 21, item 2): two arrays of one file in
one process, and spawned workers writing their own unaligned blocks of
rows, all dirty before any flushes. Every write lands (twins and diffs)."""

import os

import numpy as np
import pytest

import upager
from conftest import MIB


def test_two_arrays_of_one_file_keep_both_writes(scratch):
    path = os.path.join(scratch, "two")
    np.zeros(1024, dtype=np.uint64).tofile(path)
    a = upager.open_array(path, np.uint64, (1024,), mode="r+", budget="8MiB")
    b = upager.open_array(path, np.uint64, (1024,), mode="r+", budget="8MiB")
    a[0] = 111
    b[1] = 222
    a.flush()
    b.flush()
    assert list(np.fromfile(path, dtype=np.uint64)[:3]) == [111, 222, 0]
    # and in the other order, on folios both hold already
    b[2] = 333
    a[3] = 444
    b.flush()
    a.flush()
    assert list(np.fromfile(path, dtype=np.uint64)[:5]) == [111, 222, 333, 444, 0]
    s = a.pager_stats()
    assert s["twins_made"] > 0 and s["diff_writebacks"] > 0
    del a, b


def _write_block(path, n, lo, hi, barrier):
    """Runs in a spawned worker: reopens the file r+, writes rows [lo, hi),
    waits until every worker has written (so every copy of a shared folio
    is dirty), flushes."""
    a = upager.open_array(path, np.uint64, (n, 3), mode="r+", budget="8MiB")
    barrier.wait(timeout=120)
    a[lo:hi] = np.arange(lo * 3, hi * 3, dtype=np.uint64).reshape(-1, 3) + 1
    barrier.wait(timeout=120)
    a.flush()
    del a


@pytest.mark.parametrize("workers", [3, 7])
def test_spawned_workers_writing_unaligned_blocks_lose_nothing(scratch, workers):
    import multiprocessing as mp

    n = 349_525  # rows of 3 values: 1,048,575 values, 8 MiB
    path = os.path.join(scratch, "rows")
    np.zeros((n, 3), dtype=np.uint64).tofile(path)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    bounds = [n * k // workers for k in range(workers + 1)]
    procs = [
        ctx.Process(target=_write_block, args=(path, n, bounds[k], bounds[k + 1], barrier))
        for k in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    got = np.fromfile(path, dtype=np.uint64)
    want = np.arange(n * 3, dtype=np.uint64) + 1
    lost = int((got != want).sum())
    assert lost == 0, f"{lost} values lost of {n * 3}"
    assert got.nbytes == 8 * MIB - 8
