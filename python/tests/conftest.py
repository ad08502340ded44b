import os
import shutil
import tempfile

import numpy as np
import pytest

MIB = 1 << 20


@pytest.fixture
def scratch():
    """A directory on /dev/shm (RAM), removed afterwards."""
    base = os.environ.get("UPAGER_TEST_DIR", "/dev/shm")
    d = tempfile.mkdtemp(prefix="upager-py-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_file(path, nbytes, seed=1):
    """A file of pseudo-random uint64 words; returns them."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 1 << 62, size=nbytes // 8, dtype=np.uint64)
    words.tofile(path)
    return words


@pytest.fixture
def data64(scratch):
    """A 64 MiB file (8x the tests' 8 MiB budget) and its words."""
    path = os.path.join(scratch, "data64")
    return path, make_file(path, 64 * MIB)
