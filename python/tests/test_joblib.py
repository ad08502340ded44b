"""joblib.Parallel with upager arrays as arguments (issue 30 item 8): each
worker gets the array as a upager.memmap over the same file, opened again
with a pager of its own (upager's pickling), never a copy of the data (nor
the copy joblib's memmapping reducer dumps into its temporary folder for
large plain arrays), under both process backends joblib uses."""

import os

import numpy as np
import pytest

import upager
from conftest import MIB, skip_or_fail


def _joblib():
    try:
        import joblib
    except ImportError:
        skip_or_fail("joblib is not installed (python/requirements-dev.txt)")
    return joblib


def _work(x, lo, hi, value):
    """Runs in a worker: what it was given, and a write to its block."""
    seen = (type(x).__name__, isinstance(x, np.memmap), str(x.filename),
            x.region is not None, float(x[lo:hi].sum()), os.getpid())
    x[lo:hi] = value
    x.flush()
    return seen


@pytest.mark.parametrize("backend", ["loky", "multiprocessing"])
def test_parallel_workers_map_the_file_instead_of_copying_it(scratch, backend):
    joblib = _joblib()
    path = os.path.join(scratch, "data")
    n = 4 * MIB // 8  # 4 MiB of float64: above joblib's 1 MB dumping threshold
    np.arange(n, dtype=np.float64).tofile(path)
    a = upager.memmap(path, np.float64, "r+", budget="1MiB")
    blocks = [(i * n // 4, (i + 1) * n // 4) for i in range(4)]
    with joblib.Parallel(n_jobs=2, backend=backend, timeout=120) as parallel:
        out = parallel(joblib.delayed(_work)(a, lo, hi, -float(i))
                       for i, (lo, hi) in enumerate(blocks))
    for (lo, hi), (kind, is_memmap, filename, mapped, total, pid) in zip(blocks, out):
        assert kind == "PagedArray" and is_memmap and mapped
        assert filename == os.path.abspath(path)  # the file itself, no joblib copy
        assert total == float(np.arange(lo, hi, dtype=np.float64).sum())
        assert pid != os.getpid()
    a.region.invalidate()  # drop clean copies: read what the workers wrote
    for i, (lo, hi) in enumerate(blocks):
        assert (a[lo:hi] == -float(i)).all()
    # a view is sent as a view of the file
    with joblib.Parallel(n_jobs=2, backend=backend, timeout=120) as parallel:
        out = parallel(joblib.delayed(_work)(a[blocks[1][0]:], 0, 8, 7.0) for _ in range(1))
    assert out[0][2] == os.path.abspath(path) and out[0][4] == -8.0
    a.region.invalidate()
    assert (a[blocks[1][0]:blocks[1][0] + 8] == 7.0).all()
