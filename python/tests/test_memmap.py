"""upager.memmap as numpy.memmap's twin (issue 22): its arguments, modes
and paths, results that are new arrays being plain ndarrays that do not
keep the region, close() and ``with``, and clear errors."""

import gc
import os
import pathlib

import numpy as np
import pytest

import upager
from conftest import MIB, make_file

BUDGET = 8 * MIB


def test_numpy_memmap_calls_work_with_the_name_changed(data64):
    path, words = data64
    calls = [
        lambda m: m(path, np.uint64, "r"),
        lambda m: m(path, dtype=np.uint64, mode="r"),
        lambda m: m(filename=path, dtype=np.uint64, mode="readonly", offset=0, shape=None,
                    order="C"),
        lambda m: m(path, np.uint64, "r", 0, (words.size // 2, 2)),
        lambda m: m(pathlib.Path(path), "<u8", "c"),
        lambda m: m(os.fsencode(path), np.uint64, "r", 8 * 1024, words.size - 1024),
    ]
    for call in calls:
        want = call(np.memmap)
        got = call(lambda *a, **k: upager.memmap(*a, budget=BUDGET, **k))
        assert isinstance(got, upager.memmap) and isinstance(got, np.ndarray)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert np.array_equal(got[::997], want[::997])
        assert got.mode == want.mode and got.offset == want.offset
        assert os.fspath(got.filename) == os.path.abspath(path)
        if want.filename is not None:  # numpy.memmap keeps none for a bytes path
            assert got.filename == want.filename
        assert got.flags.writeable == want.flags.writeable
        del got, want
    with open(path, "rb") as f:  # an open file, as numpy.memmap takes
        a = upager.memmap(f, np.uint64, "r", budget=BUDGET)
        assert int(a[5]) == int(words[5])


def test_default_mode_is_read_write_and_extends_the_file(scratch):
    path = os.path.join(scratch, "grow")
    make_file(path, 64 * 1024)
    a = upager.memmap(path, np.uint32, shape=(32 * 1024,), budget="1MiB")  # mode "r+"
    assert a.mode == "r+" and a.flags.writeable
    assert os.path.getsize(path) == 128 * 1024  # numpy.memmap extends "r+" files too
    a[-1] = 7
    a.flush()
    assert np.fromfile(path, np.uint32)[-1] == 7
    b = upager.memmap(path, np.float32, "write", shape=(3, 5), order="F", budget="1MiB")
    assert b.mode == "w+" and os.path.getsize(path) == 60 and not b.any()
    b[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    b.flush()
    assert np.array_equal(np.fromfile(path, np.float32).reshape(3, 5, order="F"), b)


def test_copy_on_write_keeps_the_file_unchanged_even_after_eviction(data64):
    path, words = data64
    a = upager.memmap(path, np.uint64, "c", budget=BUDGET)
    assert a.flags.writeable and a.mode == "c"
    a[::4] += np.uint64(1)  # 64 MiB of writes through an 8 MiB budget: evicted
    s = a.pager_stats()
    assert s["evictions"] > 0 and s["resident_peak_bytes"] <= BUDGET
    want = words.copy()
    want[::4] += np.uint64(1)
    assert np.array_equal(a, want)  # read back after eviction: the private copy
    a.flush()
    del a
    gc.collect()
    assert np.array_equal(np.fromfile(path, np.uint64), words)  # the file never changed


def test_new_arrays_are_plain_and_do_not_keep_the_region(data64):
    path, words = data64
    a = upager.memmap(path, np.uint64, "r", shape=(words.size // 4, 4), budget=BUDGET)
    region = a.region
    idx = np.array([3, 1, 4, 1, 5])
    plain = {
        "copy": a[:10].copy(),
        "np.copy": np.copy(a[:10]),
        "fancy": a[idx],
        "mask": a[:4][a[:4] > 0],
        "astype": a[:10].astype(np.float64),
        "np.sort": np.sort(a[:10], axis=None),
        "ufunc": a[:10] + np.uint64(1),
        "flatten": a[:10].flatten(),
        "concatenate": np.concatenate([a[:2], a[5:7]]),
        "np.array": np.array(a[:3]),
    }
    for what, b in plain.items():
        assert type(b) is np.ndarray, what
    assert type(a.sum()) is np.uint64 and type(a[0, 0]) is np.uint64
    views = {"slice": a[10:20], "T": a.T, "reshape": a.reshape(-1), "row": a[5],
             "ravel": a.ravel(), "step": a[::7]}
    for what, v in views.items():
        assert type(v) is upager.PagedArray and v.region is region, what
        assert v.filename == a.filename and v.mode == "r"
    assert np.array_equal(plain["copy"], words[:40].reshape(10, 4))
    # The copies hold nothing: once a and its views go, nothing uses the region.
    del a, views, v
    gc.collect()
    assert region.exports == 0
    region.close()  # would raise BufferError if a copy still used it
    assert int(plain["copy"][9, 3]) == int(words[39])


def test_close_and_with_release_the_memory(data64):
    path, words = data64
    with upager.memmap(path, np.uint64, "r+", budget=BUDGET) as a:
        a[:1024] = 5
        view = a[:10]
        assert a.pager_stats()["resident_bytes"] > 0 and not a.closed
        region = a.region
    assert a.closed and view.closed and a.region is None
    assert region.stats()["resident_bytes"] == 0  # evicted at close
    assert np.array_equal(np.fromfile(path, np.uint64, count=1024), np.full(1024, 5))
    with pytest.raises(ValueError):
        a[0] = 1  # a closed array is read-only
    with pytest.raises(ValueError, match="closed"):
        a.flush()
    with pytest.raises(ValueError, match="not backed by an open upager region"):
        a.pager_stats()
    a.close()  # idempotent
    del a, view
    gc.collect()
    assert region.exports == 0


def test_a_size_that_the_dtype_does_not_divide_is_an_error(scratch):
    path = os.path.join(scratch, "odd")
    make_file(path, 1 * MIB)
    with pytest.raises(ValueError, match="not a multiple of the .* item size \\(24 bytes\\)"):
        upager.memmap(path, np.dtype("V24"), "r", budget="1MiB")
    with pytest.raises(ValueError, match="not a multiple"):
        upager.memmap(path, np.uint64, "r", offset=4, budget="1MiB")
    a = upager.memmap(path, np.dtype("V24"), "r", shape=(1000,), budget="1MiB")
    assert a.shape == (1000,)


def test_misuse_is_explained(data64, scratch):
    path, _ = data64
    with pytest.raises(TypeError, match="upager.memmap"):
        upager.open_array(path, np.float64, "r+")  # memmap's order given to open_array
    with pytest.raises(ValueError, match='"r", "r\\+", "w\\+", "c"'):
        upager.memmap(path, np.uint8, "rw")
    with pytest.raises(ValueError, match="needs a shape"):
        upager.memmap(os.path.join(scratch, "new"), np.uint8, "w+")
    with pytest.raises(TypeError, match="filename must be"):
        upager.memmap(12.5, np.uint8, "r")
    with pytest.raises(ValueError, match="beyond the end"):
        upager.memmap(path, np.uint8, "r", offset=65 * MIB)
    with pytest.raises(FileNotFoundError):
        upager.memmap(os.path.join(scratch, "missing"), np.uint8, "c")


def test_sizes_say_the_rule(scratch):
    with pytest.raises(ValueError, match="cannot be negative, got -1"):
        upager.Pager(budget=-1)
    for small in (0, 100):
        with pytest.raises(ValueError, match="smaller than one folio \\(4096 bytes\\)"):
            upager.Pager(budget=small)
    with pytest.raises(ValueError, match="smaller than one folio \\(65536 bytes\\)"):
        upager.Pager(budget=4096, folio="64KiB")
    upager.Pager(budget=4096).close()  # one 4 KiB folio (the default) is enough for it
    with upager.Pager(budget=BUDGET) as pager:
        with pytest.raises(ValueError, match="size must be at least 1 byte, got 0"):
            pager.anonymous(0)
        with pytest.raises(ValueError, match="cannot be negative, got -1"):
            pager.anonymous(-1)
    with pytest.raises(ValueError, match="swap_dir .* is not a directory"):
        upager.Pager(budget=BUDGET, swap_dir=os.path.join(scratch, "nowhere"))


def test_tofile_works_in_each_fault_mode(data64, scratch):
    """ndarray.tofile writes straight from region memory; in fault mode
    "in-thread" PagedArray.tofile copies out first (no EFAULT)."""
    path, words = data64
    for mode in upager.FAULT_MODES:
        a = upager.memmap(path, np.uint64, "r", budget=BUDGET, fault_mode=mode)
        out = os.path.join(scratch, f"out-{mode}")
        a[: 2 * MIB].tofile(out)
        with open(out, "ab") as f:
            a[::3][:1000].tofile(f)  # not contiguous
        got = np.fromfile(out, np.uint64)
        assert np.array_equal(got[: 2 * MIB], words[: 2 * MIB])
        assert np.array_equal(got[2 * MIB:], words[::3][:1000])
        del a


def test_the_migration_page_example_runs(scratch):
    """docs/numpy.md's first Python block, run as it is (in a scratch
    directory, as a user would paste it)."""
    import re
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "docs", "numpy.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    example = next(b for b in blocks if "import upager" in b)
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", example], cwd=scratch,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
