"""The file formats numpy and model-weights users have (issue 22): .npy
through upager.load / upager.open_npy, and safetensors files written by
the safetensors package, opened with upager.safetensors under a budget."""

import gc
import json
import io
import os
import pickle

import numpy as np
import pytest

import upager
from conftest import MIB

BUDGET = 8 * MIB


# -- .npy -------------------------------------------------------------------

def test_load_is_numpy_loads_twin(scratch):
    rng = np.random.default_rng(3)
    cases = {
        "c.npy": rng.random((512, 1024)),  # 4 MiB float64
        "f.npy": np.asfortranarray(rng.integers(0, 1000, (300, 70), dtype=np.int32)),
        "rec.npy": np.array([(i, i * 0.5, b"ab") for i in range(5000)],
                            dtype=[("i", "<i4"), ("x", ">f8"), ("s", "S2")]),
        "big-endian.npy": np.arange(10000, dtype=">u2"),
    }
    for name, arr in cases.items():
        path = os.path.join(scratch, name)
        np.save(path, arr)
        want = np.load(path, mmap_mode="r")
        got = upager.load(path, mmap_mode="r", budget="1MiB")
        assert isinstance(got, upager.PagedArray)
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert got.flags.f_contiguous == want.flags.f_contiguous, name
        assert got.offset == want.offset and got.mode == "r", name
        assert np.array_equal(got, arr), name
        del got, want
    # A header numpy writes as version 2.0 (more than 65535 bytes of it).
    wide = np.zeros(3, dtype=[(f"field{i:05d}", "u1") for i in range(5000)])
    wide["field00042"] = 42
    path = os.path.join(scratch, "wide.npy")
    with pytest.warns(UserWarning, match="format 2.0"):
        np.save(path, wide)
    with open(path, "rb") as f:
        assert f.read(8)[6:8] == b"\x02\x00"
    with pytest.raises(ValueError, match="max_header_size"):  # numpy.load's limit
        upager.load(path, budget="1MiB")
    got = upager.load(path, budget="1MiB", max_header_size=200000)
    assert got.dtype == wide.dtype and np.array_equal(got["field00042"], [42, 42, 42])


def test_load_r_plus_writes_the_file_and_c_does_not(scratch):
    path = os.path.join(scratch, "w.npy")
    np.save(path, np.zeros((64, 64)))
    a = upager.load(path, "r+", budget="1MiB")
    a[3] = 7.0
    a.close()
    assert np.load(path)[3].tolist() == [7.0] * 64
    c = upager.load(path, "copyonwrite", budget="1MiB")
    c[:] = -1
    assert (c == -1).all()
    del a, c
    gc.collect()
    assert np.load(path).sum() == 7.0 * 64


def test_open_npy_creates_files_numpy_reads(scratch):
    path = os.path.join(scratch, "new.npy")
    a = upager.open_npy(path, mode="w+", dtype=np.float32, shape=(2048, 1024),
                        budget="2MiB")  # 8 MiB of data through a 2 MiB budget
    assert a.mode == "w+" and a.shape == (2048, 1024) and not a[::512].any()
    a[:, 0] = np.arange(2048)
    a[-1] = 2.5
    a.flush()
    assert a.pager_stats()["evictions"] > 0
    want = np.load(path)
    assert want.dtype == np.float32 and want.shape == (2048, 1024)
    assert np.array_equal(want[:-1, 0], np.arange(2047)) and (want[-1] == 2.5).all()
    ref = np.lib.format.open_memmap(os.path.join(scratch, "ref.npy"), mode="w+",
                                    dtype=np.float32, shape=(2048, 1024))
    assert a.offset == ref.offset  # the same header numpy writes
    del ref
    f = upager.open_npy(os.path.join(scratch, "f.npy"), "w+", "<i8", (3, 4),
                        fortran_order=True, version=(2, 0), budget="1MiB")
    f[:] = np.arange(12).reshape(3, 4)
    f.flush()
    back = np.load(os.path.join(scratch, "f.npy"))
    assert back.flags.f_contiguous and np.array_equal(back, np.arange(12).reshape(3, 4))
    r = upager.open_npy(path, mode="r", budget="1MiB")
    assert r[-1, 3] == 2.5 and r.mode == "r"


def test_npy_misuse_is_explained(scratch):
    path = os.path.join(scratch, "x.npy")
    np.save(path, np.arange(10))
    with pytest.raises(TypeError, match="upload_dataset"):
        upager.load(path, "redis-cluster://127.0.0.1:7000/x")
    with pytest.raises(ValueError, match="open_npy"):
        upager.load(path, mmap_mode="w+")
    np.save(os.path.join(scratch, "obj.npy"), np.array([{}, []], dtype=object))
    with pytest.raises(ValueError, match="Python objects"):
        upager.load(os.path.join(scratch, "obj.npy"))
    with open(os.path.join(scratch, "raw"), "wb") as f:
        f.write(b"\x00" * 4096)
    with pytest.raises(ValueError, match="allow_pickle"):  # numpy.load's refusal
        upager.load(os.path.join(scratch, "raw"))
    with pytest.raises(ValueError, match="not an .npy file"):
        upager.open_npy(os.path.join(scratch, "raw"), mode="r")
    with pytest.raises(ValueError, match="not an .npy file"):
        upager.npy.read_header(os.path.join(scratch, "raw"))
    with pytest.raises(ValueError, match="needs a dtype and a shape"):
        upager.open_npy(os.path.join(scratch, "y.npy"), mode="w+")
    assert not os.path.exists(os.path.join(scratch, "y.npy"))
    with pytest.raises(ValueError, match="no file on disk"):
        upager.load(io.BytesIO(open(path, "rb").read()), mmap_mode="r")


def test_load_takes_numpy_loads_keywords_and_does_what_it_does(scratch):
    """mmap_mode=None, .npz, pickles, allow_pickle, max_header_size: what
    numpy.load does with them."""
    path = os.path.join(scratch, "x.npy")
    np.save(path, np.arange(10.0))
    got = upager.load(path, mmap_mode=None)  # read into memory, as numpy.load
    assert type(got) is np.ndarray and np.array_equal(got, np.arange(10.0))
    z = os.path.join(scratch, "z.npz")
    np.savez(z, a=np.arange(3), b=np.eye(2))
    for mode in ("r", None):
        with upager.load(z, mmap_mode=mode) as npz:
            assert isinstance(npz, np.lib.npyio.NpzFile) and sorted(npz.files) == ["a", "b"]
            assert np.array_equal(npz["b"], np.eye(2))
    p = os.path.join(scratch, "obj.pkl")
    with open(p, "wb") as f:
        pickle.dump({"k": 1}, f)
    with pytest.raises(ValueError, match="allow_pickle"):
        upager.load(p, mmap_mode="r")
    assert upager.load(p, mmap_mode="r", allow_pickle=True) == {"k": 1}
    big = os.path.join(scratch, "big_header.npy")
    arr = np.zeros(3, dtype="i," * 10000 + "i")
    with pytest.warns(UserWarning, match="format 2.0"):
        np.save(big, arr)
    with pytest.raises(ValueError, match="Header.*large"):
        upager.load(big, mmap_mode="r")
    a = upager.load(big, mmap_mode="r", allow_pickle=True)  # trusted: no limit
    b = upager.load(big, mmap_mode="r", max_header_size=10**6)
    assert type(a) is upager.memmap and np.array_equal(a, arr) and np.array_equal(b, arr)
    with open(path, "ab") as f:  # two arrays in one file, as np.save can write
        np.save(f, np.arange(5, dtype=np.int16))
    with open(path, "rb") as f:  # an open file: mapped through its descriptor
        c = upager.load(f, mmap_mode="r", budget="1MiB")
        d = upager.load(f, mmap_mode="r", budget="1MiB")  # left after the first
        assert f.tell() == os.path.getsize(path)
    assert np.array_equal(c, np.arange(10.0)) and np.array_equal(d, np.arange(5))


def test_open_npy_version_and_empty_arrays_as_numpy(scratch):
    dt = np.dtype([(str(i) * 100, "f8") for i in range(500)])  # a header > 64 KiB
    p = os.path.join(scratch, "v.npy")
    with pytest.raises(ValueError):
        upager.open_npy(p, mode="w+", dtype=dt, shape=(3,), version=(1, 0))
    assert not os.path.exists(p)  # refused before the file was made
    with pytest.raises(ValueError, match="version"):
        upager.open_npy(p, mode="w+", dtype="f8", shape=(3,), version=(9, 9))
    assert not os.path.exists(p)
    with pytest.warns(UserWarning, match="format 2.0"):  # numpy's warning
        a = upager.open_npy(p, mode="w+", dtype=dt, shape=(3,), version=None)
    a[1] = tuple(range(500))
    a.flush()
    assert np.load(p, allow_pickle=True)[1][499] == 499
    e = os.path.join(scratch, "empty.npy")
    z = upager.open_npy(e, mode="w+", dtype="f4", shape=(0, 3))
    assert z.shape == (0, 3) and isinstance(z, np.memmap)
    want = np.lib.format.open_memmap(os.path.join(scratch, "ref.npy"), mode="w+",
                                     dtype="f4", shape=(0, 3))
    assert os.path.getsize(e) == os.path.getsize(os.path.join(scratch, "ref.npy"))
    del want
    r = upager.load(e, mmap_mode="r")
    assert r.shape == (0, 3) and r.dtype == np.float32 and np.load(e).shape == (0, 3)


# -- safetensors --------------------------------------------------------------

@pytest.fixture
def st_numpy():
    """The safetensors package's numpy API, which writes the test files."""
    return pytest.importorskip("safetensors.numpy", reason="the safetensors package "
                               "(python/requirements-dev.txt) writes the test files")


def _model(seed=5):
    """Tensors of every dtype the numpy API writes, ~64 MiB in all."""
    rng = np.random.default_rng(seed)
    t = {f"layers.{i}.weight": rng.standard_normal((1024, 1024), dtype=np.float32)
         for i in range(15)}
    t.update({
        "embed": rng.standard_normal((512, 4096)).astype(np.float16),
        "bias64": rng.standard_normal(1000),
        "ids": rng.integers(-5, 5, (7, 11, 13), dtype=np.int64),
        "u8": rng.integers(0, 255, 333, dtype=np.uint8),
        "i16": rng.integers(-300, 300, 99, dtype=np.int16),
        "u32": rng.integers(0, 1 << 31, 1, dtype=np.uint32),
        "mask": rng.random(17) > 0.5,
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    })
    return t


def test_safetensors_files_open_as_views_under_the_budget(scratch, st_numpy):
    from safetensors import safe_open

    tensors = _model()
    path = os.path.join(scratch, "model.safetensors")
    st_numpy.save_file(tensors, path, metadata={"format": "np", "step": "7"})
    assert os.path.getsize(path) > 7 * BUDGET
    with upager.safetensors.open(path, budget=BUDGET) as st:
        with safe_open(path, framework="np") as ref:
            assert sorted(st.keys()) == sorted(ref.keys()) == sorted(tensors)
            assert st.metadata() == ref.metadata() == {"format": "np", "step": "7"}
            for name in ref.keys():
                got, want = st[name], ref.get_tensor(name)
                assert got.dtype == want.dtype and got.shape == want.shape, name
                assert np.array_equal(got, want), name
                assert np.array_equal(st.get_tensor(name), tensors[name]), name
        w = st["layers.7.weight"]
        assert isinstance(w, upager.PagedArray) and w.region is st.array.region
        assert not w.flags.writeable
        assert float(w.sum()) == pytest.approx(float(tensors["layers.7.weight"].sum()),
                                               rel=1e-5)
        s = st.stats()
        assert s["resident_peak_bytes"] <= BUDGET and s["evictions"] > 0
        assert len(st) == len(tensors) and "embed" in st
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            st["nope"]
    assert st.closed


def test_safetensors_r_plus_changes_the_file(scratch, st_numpy):
    path = os.path.join(scratch, "m.safetensors")
    st_numpy.save_file({"a": np.zeros(1000, np.float32), "b": np.ones(10, np.int64)}, path)
    with upager.safetensors.open(path, budget="1MiB", mode="r+") as st:
        st["a"][::10] = 2.0
    back = st_numpy.load_file(path)
    assert back["a"].sum() == 200.0 and back["b"].sum() == 10


def _write_raw(path, header, data=b""):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


@pytest.mark.parametrize("header,data,message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4,
     "has 4 bytes but shape \\[2\\] of F32 needs 8"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4,
     "outside the data"),
    ({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "does not define"),
    ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0\0", "no holes"),
    ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0\0",
     "no bytes after them"),
    ({"__metadata__": {"k": 1}}, b"", "strings to strings"),
])
def test_safetensors_that_break_the_format_are_refused(scratch, header, data, message):
    path = os.path.join(scratch, "bad.safetensors")
    _write_raw(path, header, data)
    with pytest.raises(ValueError, match=message):
        upager.safetensors.open(path, budget="1MiB")


def test_safetensors_truncated_or_not_json(scratch):
    path = os.path.join(scratch, "bad.safetensors")
    with open(path, "wb") as f:
        f.write((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header length"):
        upager.safetensors.open(path, budget="1MiB")
    with open(path, "wb") as f:
        f.write((4).to_bytes(8, "little") + b"{no}")
    with pytest.raises(ValueError, match="not valid JSON"):
        upager.safetensors.open(path, budget="1MiB")
    _write_raw(path, {"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}},
               b"\x80\x3f\x00\x40")
    st = upager.safetensors.open(path, budget="1MiB")
    assert st.dtype_name("x") == "BF16" and bytes(st.raw("x")) == b"\x80\x3f\x00\x40"
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(TypeError, match="ml_dtypes"):
            st["x"]
    else:
        assert st["x"].astype(np.float32).tolist() == [1.0, 2.0]
