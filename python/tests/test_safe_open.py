"""upager.safetensors.safe_open against safetensors.safe_open(framework="np")
on the same files: each method (keys, offset_keys, metadata, get_tensor,
get_tensors, get_slice with get_shape / get_dtype / indexing, the context
manager, reading after close), the errors (SafetensorError and its
messages), corrupt files, dtypes numpy has no type for, shapes whose element
count overflows, and reads of a file larger than the budget."""

import json
import os
import random

import numpy as np
import pytest

import upager
import upager.safetensors as ust
from conftest import skip_or_fail

MIB = 1 << 20


@pytest.fixture(scope="module")
def real():
    """The safetensors package (python/requirements-dev.txt): writes the
    files and is the reference every result is compared with."""
    try:
        import safetensors
        import safetensors.numpy  # noqa: F401
    except ImportError:
        skip_or_fail("the safetensors package (python/requirements-dev.txt) is the reference")
    if tuple(int(p) for p in safetensors.__version__.split(".")[:2]) < (0, 8):
        skip_or_fail(f"safetensors {safetensors.__version__}: the reference is >= 0.8 "
                     "(slices with steps and Ellipsis)")
    return safetensors


def _raw_file(path, header, data=b""):
    """A file of `header` (a dict, or the JSON text as str/bytes) and `data`."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + data)


def _outcome(fn):
    """("ok", value) or ("err", class, message); SafetensorError subclasses
    (ours are also ValueError / TypeError) named as SafetensorError."""
    try:
        return ("ok", fn())
    except ust.SafetensorError as e:
        return ("err", "SafetensorError", str(e))
    except Exception as e:
        return ("err", type(e).__name__, str(e))


def _same_array(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape,
                                                                 want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


def _tensors():
    """One tensor of each dtype numpy has, a scalar, empty ones; names whose
    sorted order differs from the order of their data."""
    rng = np.random.default_rng(3)
    return {
        "z.f32": rng.standard_normal((33, 17), dtype=np.float32),
        "y.f64": rng.standard_normal(100),
        "x.f16": rng.standard_normal((4, 5, 6)).astype(np.float16),
        "B.bool": rng.random((3, 7)) > 0.5,
        "a.u8": rng.integers(0, 255, 99, dtype=np.uint8),
        "w.i8": rng.integers(-128, 127, (2, 2), dtype=np.int8),
        "v.u16": rng.integers(0, 1 << 16, 10, dtype=np.uint16),
        "u.i16": rng.integers(-300, 300, 11, dtype=np.int16),
        "t.u32": rng.integers(0, 1 << 32, 12, dtype=np.uint32),
        "s.i32": rng.integers(-(1 << 31), 1 << 31, (3, 4), dtype=np.int32),
        "r.u64": rng.integers(0, 1 << 63, 5, dtype=np.uint64),
        "q.i64": rng.integers(-5, 5, (7, 11, 13), dtype=np.int64),
        "p.c64": (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64),
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "é.unicode": np.arange(3, dtype=np.int32),
    }


@pytest.fixture
def model(scratch, real):
    from safetensors.numpy import save_file
    tensors = _tensors()
    path = os.path.join(scratch, "model.safetensors")
    save_file(tensors, path, metadata={"format": "np", "step": "7"})
    return path, tensors


# -- the methods -------------------------------------------------------------

def test_keys_offset_keys_metadata_and_tensors_are_safe_opens(model, real):
    path, tensors = model
    with real.safe_open(path, framework="np") as ref, \
            ust.safe_open(path, framework="np", budget="1MiB") as f:
        assert f.keys() == ref.keys() == sorted(tensors)
        assert f.offset_keys() == ref.offset_keys()
        assert f.offset_keys() != f.keys()  # the file is not in name order
        assert f.metadata() == ref.metadata() == {"format": "np", "step": "7"}
        for name in ref.keys():
            got, want = f.get_tensor(name), ref.get_tensor(name)
            _same_array(got, want)
            _same_array(got, tensors[name])
        got_all, want_all = f.get_tensors(), ref.get_tensors()
        assert list(got_all) == list(want_all) == f.offset_keys()
        for name in want_all:
            _same_array(got_all[name], want_all[name])


def test_metadata_is_none_without_it_and_numpy_is_a_framework_name(scratch, real):
    from safetensors.numpy import save_file
    path = os.path.join(scratch, "m.safetensors")
    save_file({"a": np.arange(4)}, path)
    for framework in ("np", "numpy"):
        with ust.safe_open(path, framework=framework, device="cpu") as f, \
                real.safe_open(path, framework=framework, device="cpu") as ref:
            assert f.metadata() is None and ref.metadata() is None
            _same_array(f.get_tensor("a"), ref.get_tensor("a"))


def test_tensors_are_read_only_views_or_with_copy_writable_copies(model, real):
    path, tensors = model
    with real.safe_open(path, framework="np") as ref:
        assert ref.get_tensor("z.f32").flags.writeable  # safetensors gives copies
    with ust.safe_open(path, framework="np", budget="1MiB") as f:
        w = f.get_tensor("z.f32")
        assert isinstance(w, upager.PagedArray) and not w.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            w[0, 0] = 1.0
        part = f.get_slice("z.f32")[1:5, ::2]
        assert isinstance(part, upager.PagedArray) and not part.flags.writeable
        assert np.shares_memory(part, w) or part.region is w.region
    with ust.safe_open(path, framework="np", budget="1MiB", copy=True) as f:
        c = f.get_tensor("z.f32")
        assert type(c) is np.ndarray and c.flags.writeable and c.flags.c_contiguous
        c[:] = 0.0
        _same_array(f.get_tensor("z.f32"), tensors["z.f32"])  # a new copy each time
        s = f.get_slice("z.f32")[1:5, ::2]
        assert type(s) is np.ndarray and s.flags.writeable and s.flags.c_contiguous
        s[:] = 1.0
        _same_array(f.get_slice("z.f32")[1:5, ::2], tensors["z.f32"][1:5, ::2])
    with real.safe_open(path, framework="np") as ref:  # the file never changed
        _same_array(ref.get_tensor("z.f32"), tensors["z.f32"])


GOOD_SLICES = [
    np.s_[:], np.s_[()], np.s_[:2], np.s_[:, :2], np.s_[0, :2], np.s_[2:, 0], np.s_[2:, -1],
    np.s_[2:, -5], [], np.s_[::2], np.s_[1:8:3], np.s_[..., 1], np.s_[...], np.s_[1, ...],
    np.s_[1, 2], np.s_[-1], np.s_[0:0], np.s_[3:3], np.s_[:, 1:3], np.s_[:, ::7],
    np.s_[np.int64(1)], np.s_[True], np.s_[9:], np.s_[..., ::2], np.s_[:0], np.s_[::100],
]


@pytest.mark.parametrize("index", GOOD_SLICES, ids=repr)
def test_get_slice_gives_what_safe_open_gives(scratch, real, index):
    from safetensors.numpy import save_file
    a = np.random.default_rng(7).random((10, 5))
    path = os.path.join(scratch, "s.safetensors")
    save_file({"a": a}, path)
    with ust.safe_open(path, framework="np", budget="1MiB") as f, \
            real.safe_open(path, framework="np") as ref:
        s, r = f.get_slice("a"), ref.get_slice("a")
        assert s.get_shape() == r.get_shape() == [10, 5]
        assert s.get_dtype() == r.get_dtype() == "F64"
        got, want = s[index], r[index]
        _same_array(got, want)
        if not isinstance(index, (list, bool)):  # numpy: [] and True are masks
            _same_array(np.asarray(got), np.asarray(a[index]))


BAD_SLICES = [
    np.s_[2:, -6], [0, 1], np.s_[2:, 20], np.s_[:20], np.s_[:, :20], np.s_[-3:], np.s_[:-1],
    np.s_[None], np.s_[1.0], np.s_[:, ::-1], np.s_[::0], np.s_[2 ** 31], np.s_[-11],
    np.s_[10], np.s_[1, 2, 3], np.s_[..., ...], np.s_["a"], np.s_[1.5:],
    np.s_[:2 ** 64], np.s_[::1.5], np.s_[np.bool_(True)], np.s_[(0,), 1], [slice(None)],
    np.s_[10:10], np.s_[..., None],
]


@pytest.mark.parametrize("index", BAD_SLICES, ids=repr)
def test_get_slice_refuses_what_safe_open_refuses_with_its_error(scratch, real, index):
    from safetensors.numpy import save_file
    path = os.path.join(scratch, "s.safetensors")
    save_file({"a": np.random.default_rng(7).random((10, 5))}, path)
    with ust.safe_open(path, framework="np") as f, real.safe_open(path, framework="np") as ref:
        got = _outcome(lambda: f.get_slice("a")[index])
        want = _outcome(lambda: ref.get_slice("a")[index])
        assert want[0] == "err", want
        assert got == want


def test_a_slice_whose_start_is_after_its_stop_is_refused_clearly(scratch, real):
    """safetensors fails on these inside (SystemError, a panic, or numpy's
    reshape of a wrapped-around size); upager says what is wrong."""
    from safetensors.numpy import save_file
    path = os.path.join(scratch, "s.safetensors")
    save_file({"a": np.arange(50.0).reshape(10, 5)}, path)
    with ust.safe_open(path, framework="np") as f, real.safe_open(path, framework="np") as ref:
        for index in (np.s_[5:2], np.s_[:, 3:1], np.s_[9:1:2]):
            assert _outcome(lambda: ref.get_slice("a")[index])[0] == "err"
            with pytest.raises(ust.SafetensorError, match="start . is after stop ."):
                f.get_slice("a")[index]


def _random_index(rng):
    def bound():
        return rng.choice([None, None, 0, 1, 2, 3, 5, 9, 10, 11, -1, 2 ** 63, 2 ** 64, 1.5,
                           True, np.int64(2)])

    def item():
        c = rng.random()
        if c < 0.45:
            return slice(bound(), bound(), rng.choice([None, None, 1, 2, 3, 0, -1, 7, True]))
        if c < 0.8:
            return rng.choice([0, 1, 2, -1, -2, -3, -6, 4, 5, 9, 10, 2 ** 31, -2 ** 31,
                               True, np.int32(1), np.array(1)])
        if c < 0.9:
            return Ellipsis
        return rng.choice([None, "a", 1.0, [], [0], (0,), np.array([1])])
    c = rng.random()
    if c < 0.1:
        return rng.choice([[], [0], (), Ellipsis])
    if c < 0.3:
        return item()
    return tuple(item() for _ in range(rng.randint(0, 6)))


def _start_after_stop(index, shape):
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(it, slice) and isinstance(it.start, (int, np.integer))
               and isinstance(it.stop, (int, np.integer)) and 0 <= it.stop < it.start
               for it in items)


def test_random_slices_give_safe_opens_results_and_errors(scratch, real):
    from safetensors.numpy import save_file
    tensors = {"a": np.arange(120, dtype=np.int32).reshape(2, 3, 4, 5),
               "s": np.array(7, np.int64), "e": np.zeros((0, 3), np.int16),
               "v": np.arange(10, dtype=np.uint8), "z": np.zeros((3, 0, 2), np.float32),
               "b": np.array([[True, False, True]])}
    path = os.path.join(scratch, "f.safetensors")
    save_file(tensors, path)
    rng = random.Random(20261127)
    compared = 0
    with ust.safe_open(path, framework="np") as f, real.safe_open(path, framework="np") as ref:
        for _ in range(2000):
            name = rng.choice(sorted(tensors))
            index = _random_index(rng)
            got = _outcome(lambda: f.get_slice(name)[index])
            if got[0] == "err" and "is after stop" in got[2]:
                continue  # safetensors fails inside (the test above)
            want = _outcome(lambda: ref.get_slice(name)[index])
            if got[0] == want[0] == "ok":
                _same_array(got[1], want[1])
            else:
                assert got == want, (name, index)
            compared += 1
    assert compared > 1500


# -- closing, errors ---------------------------------------------------------

def test_after_the_with_block_every_method_says_file_is_closed(model, real):
    path, tensors = model
    with real.safe_open(path, framework="np") as ref:
        pass
    with ust.safe_open(path, framework="np", budget="1MiB") as f:
        t = f.get_tensor("q.i64")
        s = f.get_slice("z.f32")
    calls = [lambda g: g.keys(), lambda g: g.offset_keys(), lambda g: g.metadata(),
             lambda g: g.get_tensors(), lambda g: g.get_tensor("a.u8"),
             lambda g: g.get_slice("a.u8")]
    for call in calls:
        assert _outcome(lambda: call(f)) == _outcome(lambda: call(ref)) == \
            ("err", "SafetensorError", "File is closed")
    assert f.closed
    # what was taken before stays readable, as safetensors' copies and slices do
    _same_array(t, tensors["q.i64"])
    _same_array(s[3:9, ::4], tensors["z.f32"][3:9, ::4])
    assert f.__enter__() is f
    f.close()  # idempotent
    with pytest.raises(ust.SafetensorError, match="File is closed"):
        f.stats()


def test_opening_errors_are_safe_opens(model, scratch, real):
    path, _ = model
    missing = os.path.join(scratch, "notafile")
    cases = [
        lambda so: so(missing, framework="np"),
        lambda so: so(missing, framework="pt"),  # the file is looked for first
        lambda so: so(path, framework="nope"),
        lambda so: so(missing, framework="nope"),  # the name is checked first
        lambda so: so(path, framework="NP"),
        lambda so: so(path, framework="np", device="cuda"),
        lambda so: so(path, framework="np", device="cuda:1"),
        lambda so: so(path, framework="np", device=0),
        lambda so: so(path, framework="np", device="foo"),
        lambda so: so(path, framework="np", device="mps:1"),
        lambda so: so(path, framework="np", device="mps:0"),
        lambda so: so(path, framework="np", device="cpu:0"),
        lambda so: so(path, framework="np", backend="x"),
        lambda so: so(path, framework=None),
    ]
    for case in cases:
        got, want = _outcome(lambda: case(ust.safe_open)), _outcome(lambda: case(real.safe_open))
        assert want[0] == "err"
        assert got[:2] == want[:2], (got, want)
        if want[1] != "TypeError":  # pyo3's wording of argument types
            assert got == want
    assert str(_outcome(lambda: ust.safe_open(missing, framework="np"))[2]) == \
        f"No such file or directory: {missing}"
    for other in ("pt", "torch", "tf", "flax", "jax", "mlx", "paddle"):
        with pytest.raises(ust.SafetensorError, match=f"framework {other} is not supported.*"
                           'framework="np"'):
            ust.safe_open(path, framework=other)
    import pathlib
    for backend in ("mmap", "pread"):
        with ust.safe_open(pathlib.Path(path), "np", None, backend=backend) as f:
            assert f.keys() == sorted(_tensors())


def test_a_tensor_the_file_has_not_is_safe_opens_error(model, real):
    path, _ = model
    with ust.safe_open(path, framework="np") as f, real.safe_open(path, framework="np") as ref:
        for call in (lambda g: g.get_tensor("nope"), lambda g: g.get_slice("nope")):
            assert _outcome(lambda: call(f)) == _outcome(lambda: call(ref)) == \
                ("err", "SafetensorError", "File does not contain tensor nope")


def test_safetensor_error_is_safetensors_own(real):
    assert ust.SafetensorError is real.SafetensorError
    assert issubclass(ust.HeaderError, real.SafetensorError)
    assert issubclass(ust.HeaderError, ValueError)  # upager.safetensors.open's, before
    assert issubclass(ust.DtypeError, real.SafetensorError)
    assert issubclass(ust.DtypeError, TypeError)


def test_safe_open_handle_takes_an_open_file(model, real):
    path, tensors = model
    with open(path, "rb") as fh:
        with ust._safe_open_handle(fh, framework="np", budget="1MiB") as f:
            assert f.keys() == sorted(tensors)
            _same_array(f.get_tensor("y.f64"), tensors["y.f64"])
    with pytest.raises(AttributeError):
        ust._safe_open_handle(object(), framework="np")


# -- corrupt files -----------------------------------------------------------

U8 = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}

HEADERS = {
    "bytes mismatch": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4),
    "beyond the data": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 4),
    "unknown dtype": ({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, 1),
    "lowercase dtype": ({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}}, 4),
    "hole": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, 2),
    "overlap": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, 3),
    "end before start": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}}, 2),
    "bytes after": ({"a": U8}, 2),
    "metadata not strings": ({"__metadata__": {"k": 1}}, 0),
    "metadata a list": ({"__metadata__": []}, 0),
    "metadata null value": ({"__metadata__": {"k": None}}, 0),
    "negative dim": ({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, 0),
    "float dim": ({"a": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}}, 1),
    "bool dim": ({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, 1),
    "dim of 2^64": ({"a": {"dtype": "U8", "shape": [2 ** 64], "data_offsets": [0, 0]}}, 0),
    "shape null": ({"a": {"dtype": "U8", "shape": None, "data_offsets": [0, 1]}}, 1),
    "no shape": ({"a": {"dtype": "U8", "data_offsets": [0, 1]}}, 1),
    "no dtype": ({"a": {"shape": [1], "data_offsets": [0, 1]}}, 1),
    "no offsets": ({"a": {"dtype": "U8", "shape": [1]}}, 1),
    "three offsets": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, 1),
    "float offset": ({"a": {"dtype": "U8", "shape": [0], "data_offsets": [0.0, 0]}}, 0),
    "tensor a number": ({"a": 5}, 0),
    "tensor a short list": ({"a": ["U8", [1]]}, 1),
    "F4 half a byte": ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2),
    "F6 of one": ({"a": {"dtype": "F6_E2M3", "shape": [1], "data_offsets": [0, 1]}}, 1),
    "wrong size before a later hole": ({"a": {"dtype": "U8", "shape": [2],
                                              "data_offsets": [0, 1]},
                                        "b": {"dtype": "U8", "shape": [1],
                                              "data_offsets": [2, 3]}}, 3),
    # accepted by both
    "empty": ({}, 0),
    "metadata null": ({"__metadata__": None}, 0),
    "metadata empty": ({"__metadata__": {}}, 0),
    "extra field": ({"a": dict(U8, extra=5)}, 1),
    "tensor as a list": ({"a": ["U8", [1], [0, 1]]}, 1),
    "empty name": ({"": U8}, 1),
    "scalar": ({"a": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}}, 1),
    "F6 of four": ({"a": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [0, 3]}}, 3),
}

TEXTS = {
    "not JSON": ("{no}", b""),
    "a list": ("[]", b""),
    "a string": ('"abc"', b""),
    "null": ("null", b""),
    "NaN": ('{"a": NaN}', b""),
    "trailing NUL": ("{}\0", b""),
    "trailing garbage": ("{}x", b""),
    "BOM": ("\ufeff{}", b""),
    "form feed": ("\f{}", b""),
    "bad UTF-8": (b'{"\xff": 1}', b""),
    "lone surrogate": ('{"\\ud800": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}',
                       b""),
    "control character": ('{"a\x01": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
                          b"\0"),
    "-0 offset": ('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [-0, 1]}}', b"\0"),
    "1e0 offset": ('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1e0]}}', b"\0"),
    "duplicate metadata": ('{"__metadata__": {"a": "1"}, "__metadata__": {"b": "2"}}', b""),
    "duplicate dtype": ('{"a": {"dtype": "U8", "dtype": "I8", "shape": [1], '
                        '"data_offsets": [0, 1]}}', b"\0"),
    "empty header": ("", b""),
    # accepted by both
    "spaces around": (" \t\n{} \r\n", b""),
    "duplicate name: the last wins": ('{"a": {"dtype": "U8", "shape": [1], "data_offsets": '
                                      '[0, 1]}, "a": {"dtype": "U8", "shape": [2], '
                                      '"data_offsets": [0, 2]}}', b"\1\2"),
    "duplicate metadata key: the last wins": ('{"__metadata__": {"a": "1", "a": "2"}}', b""),
    "duplicate unknown field": ('{"a": {"dtype": "U8", "e": 1, "e": 2, "shape": [1], '
                                '"data_offsets": [0, 1]}}', b"\7"),
    "escaped control character": ('{"a\\u0001": {"dtype": "U8", "shape": [1], '
                                  '"data_offsets": [0, 1]}}', b"\7"),
    "unicode names": ('{"\\u00e9": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}, '
                      '"z": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}, '
                      '"Z": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                      '"\\ud83d\\ude00": {"dtype": "U8", "shape": [0], '
                      '"data_offsets": [1, 1]}}', b"\7"),
}


def _compare_opening(real, path):
    def look(so):
        with so(path, framework="np") as f:
            tensors = [_outcome(lambda: f.get_tensor(k).tobytes()) for k in f.offset_keys()]
            return (f.keys(), f.metadata(), [t[1] if t[0] == "ok" else "error" for t in tensors])
    got, want = _outcome(lambda: look(ust.safe_open)), _outcome(lambda: look(real.safe_open))
    if want[0] == "ok":
        assert got == want
        return None
    assert got[:2] == want[:2] == ("err", "SafetensorError"), (got, want)
    # safetensors' message, and upager's details after it; for JSON that
    # does not parse, the details are serde's and Python's.
    prefix = want[2]
    for kind in ("invalid JSON in header: ", "invalid UTF-8 in header: "):
        if kind in prefix:
            prefix = prefix[:prefix.index(kind) + len(kind)]
    assert got[2].startswith(prefix), (got, want)
    return got[2]


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_corrupt_headers_are_refused_as_safe_open_refuses_them(scratch, real, case):
    header, nbytes = HEADERS[case]
    path = os.path.join(scratch, "bad.safetensors")
    _raw_file(path, header, bytes(range(nbytes)))
    message = _compare_opening(real, path)
    if message is not None:  # upager.safetensors.open refuses it too, as a ValueError
        with pytest.raises(ValueError) as e:
            ust.open(path, budget="1MiB")
        assert str(e.value) == message


@pytest.mark.parametrize("case", sorted(TEXTS))
def test_header_texts_are_read_as_safe_open_reads_them(scratch, real, case):
    text, data = TEXTS[case]
    path = os.path.join(scratch, "bad.safetensors")
    _raw_file(path, text, data)
    _compare_opening(real, path)


@pytest.mark.parametrize("head", [b"", b"\0" * 7, (0).to_bytes(8, "little"),
                                  (3).to_bytes(8, "little") + b"{}",
                                  (100_000_001).to_bytes(8, "little") + b"{}",
                                  (1 << 40).to_bytes(8, "little") + b"{}",
                                  b"\xff" * 8 + b"{}"], ids=repr)
def test_truncated_files_and_impossible_header_lengths(scratch, real, head):
    path = os.path.join(scratch, "bad.safetensors")
    with open(path, "wb") as f:
        f.write(head)
    assert _compare_opening(real, path) is not None


# -- dtypes numpy has no type for (issue 30 item 6) --------------------------

# name in the file, dtype name for safetensors' TensorSpec (None: it writes
# no such tensors; the header is written by hand), elements, bytes
ODD_DTYPES = [("BF16", "bfloat16", 4, 8), ("F8_E4M3", "float8_e4m3fn", 4, 4),
              ("F8_E5M2", "float8_e5m2", 4, 4), ("F8_E4M3FNUZ", "float8_e4m3fnuz", 4, 4),
              ("F8_E5M2FNUZ", "float8_e5m2fnuz", 4, 4), ("F8_E8M0", "float8_e8m0fnu", 4, 4),
              ("F4", "float4_e2m1fn_x2", 8, 4), ("F6_E2M3", None, 4, 3),
              ("F6_E3M2", None, 8, 6)]


def _odd_file(real, path, code, spec_name, count, nbytes):
    """A file with an F32 tensor, a tensor of dtype `code`, an I64 one."""
    ok = np.arange(6, dtype=np.float32).reshape(2, 3)
    last = np.arange(3, dtype=np.int64)
    odd = np.arange(1, nbytes + 1, dtype=np.uint8)
    if spec_name is not None:
        from safetensors import TensorSpec, serialize_file
        specs = {}
        # F4's TensorSpec takes the shape of its bytes (two elements a byte)
        odd_shape = [count // 2] if code == "F4" else [count]
        for name, arr, dt, shape in (("ok", ok, "float32", [2, 3]),
                                     ("odd", odd, spec_name, odd_shape),
                                     ("z", last, "int64", [3])):
            specs[name] = TensorSpec(dtype=dt, shape=shape, data_ptr=arr.ctypes.data,
                                     data_len=arr.nbytes)
        serialize_file(specs, path)
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            assert json.loads(f.read(n))["odd"]["dtype"] == code  # what safetensors wrote
    else:
        header = {"ok": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                  "odd": {"dtype": code, "shape": [count], "data_offsets": [24, 24 + nbytes]},
                  "z": {"dtype": "I64", "shape": [3], "data_offsets": [24 + nbytes,
                                                                       48 + nbytes]}}
        _raw_file(path, header, ok.tobytes() + odd.tobytes() + last.tobytes())
    return ok, odd.tobytes(), last


@pytest.mark.parametrize("code,spec_name,count,nbytes", ODD_DTYPES, ids=lambda v: str(v))
def test_a_tensor_numpy_has_no_type_for_leaves_the_others_readable(scratch, real, code,
                                                                   spec_name, count, nbytes):
    path = os.path.join(scratch, "odd.safetensors")
    ok, odd_bytes, last = _odd_file(real, path, code, spec_name, count, nbytes)
    try:
        import ml_dtypes  # noqa: F401
        has_ml = True
    except ImportError:
        has_ml = False
    with ust.safe_open(path, framework="np") as f, real.safe_open(path, framework="np") as ref:
        assert f.keys() == ref.keys() == ["odd", "ok", "z"]
        _same_array(f.get_tensor("ok"), ref.get_tensor("ok"))
        _same_array(f.get_tensor("z"), ref.get_tensor("z"))
        _same_array(f.get_slice("z")[1:], last[1:])
        s, r = f.get_slice("odd"), ref.get_slice("odd")
        assert (s.get_dtype(), s.get_shape()) == (r.get_dtype(), r.get_shape()) == (code, [count])
        readable = has_ml and code in ust._ML_DTYPES
        for read in (lambda g: g.get_tensor("odd"), lambda g: g.get_slice("odd")[...],
                     lambda g: g.get_tensors()):
            got = _outcome(lambda: read(f))
            if readable:  # as ml_dtypes' type, the file's bytes
                import ml_dtypes
                t = got[1]["odd"] if isinstance(got[1], dict) else got[1]
                assert t.dtype == np.dtype(getattr(ml_dtypes, ust._ML_DTYPES[code]))
                assert t.shape == (count,) and t.tobytes() == odd_bytes
                if code == "BF16":  # safetensors reads it once ml_dtypes is imported
                    _same_array(t, ref.get_tensor("odd"))
            else:
                assert got[:2] == ("err", "SafetensorError"), got
                assert f"tensor 'odd' is {code}" in got[2] and "numpy has no type" in got[2]
                with pytest.raises(TypeError):  # a DtypeError is a TypeError too
                    read(f)
                # safetensors fails on these too (AttributeError, TypeError or its own)
                assert _outcome(lambda: read(ref))[0] == "err"
    with ust.open(path, budget="1MiB") as st:  # the older interface opens it too
        assert st.dtype_name("odd") == code and bytes(st.raw("odd")) == odd_bytes
        _same_array(st["ok"], ok)


# -- element counts that overflow (issue 30 item 7) --------------------------

@pytest.mark.parametrize("dtype,shape,refused", [
    ("F32", [2 ** 62, 4, 0], "overflow"),   # overflows before the 0: refused
    ("F32", [0, 2 ** 62, 4], None),         # the 0 first: no overflow, opens
    ("F32", [2 ** 62, 4], "overflow"),
    ("U8", [2 ** 63, 2, 0], "overflow"),
    ("F64", [2 ** 61], "overflow"),         # the count fits, its bits do not
    ("F64", [2 ** 61, 0], None),
    ("U8", [2 ** 61], "overflow"),          # 2^64 bits
    ("U8", [2 ** 60], "invalid shape"),     # 2^63 bits fit: 0 bytes are too few
    ("U8", [2 ** 64 - 1, 0], None),
    ("U8", [2 ** 32, 2 ** 31, 0], None),
], ids=str)
def test_shapes_whose_element_count_overflows_are_refused_as_safe_open_does(
        scratch, real, dtype, shape, refused):
    path = os.path.join(scratch, "big.safetensors")
    _raw_file(path, {"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]},
                     "y": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\1\2")
    got = _outcome(lambda: ust.safe_open(path, framework="np").keys())
    want = _outcome(lambda: real.safe_open(path, framework="np").keys())
    assert got[:2] == want[:2]
    assert (want[0] == "err") == (refused is not None)
    if refused:
        assert want[2].startswith(f"Error while deserializing header: {refused}")
        assert got[2].startswith(want[2]) and "`x`" in got[2]
        with pytest.raises(ValueError, match=refused):
            ust.open(path, budget="1MiB")
    else:
        assert got == want == ("ok", ["x", "y"])
        with ust.safe_open(path, framework="np") as f, \
                real.safe_open(path, framework="np") as ref:
            _same_array(f.get_tensor("y"), ref.get_tensor("y"))
            # numpy itself cannot make such an array: both give its error
            assert _outcome(lambda: f.get_tensor("x"))[:2] == \
                _outcome(lambda: ref.get_tensor("x"))[:2] == ("err", "ValueError")


# -- the budget --------------------------------------------------------------

def test_a_file_larger_than_the_budget_reads_under_it(scratch, real):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(11)
    tensors = {f"layer.{i}": rng.standard_normal((512, 1024), dtype=np.float32)
               for i in range(12)}  # 24 MiB
    path = os.path.join(scratch, "big.safetensors")
    save_file(tensors, path)
    budget = 4 * MIB
    for copy in (False, True):
        with ust.safe_open(path, framework="np", budget=budget, copy=copy) as f, \
                real.safe_open(path, framework="np") as ref:
            for name in f.keys():
                got = f.get_tensor(name)
                assert float(got.sum(dtype=np.float64)) == \
                    float(ref.get_tensor(name).sum(dtype=np.float64))
                part = f.get_slice(name)[100:300, ::16]
                _same_array(np.ascontiguousarray(part), ref.get_slice(name)[100:300, ::16])
                del got, part
            stats = f.stats()
            assert stats["resident_peak_bytes"] <= budget, stats
            assert stats["evictions"] > 0, stats
