"""safetensors files (how model weights ship) as numpy arrays under a hard
memory budget.

``upager.safetensors.safe_open`` is ``safetensors.safe_open(path,
framework="np")`` with a budget: the same methods (``keys()`` sorted by
name, ``offset_keys()``, ``metadata()``, ``get_tensor``, ``get_tensors``,
``get_slice`` with ``get_shape``, ``get_dtype`` and slicing), the same
errors (:class:`SafetensorError`, "File is closed" after the ``with``
block) and the same refusals of corrupt files, but the file is one upager
region: each tensor is read when it is used, a folio at a time, never more
than ``budget`` resident::

    from upager.safetensors import safe_open

    with safe_open("model.safetensors", framework="np", budget="512MiB") as f:
        for name in f.keys():
            w = f.get_tensor(name)       # a read-only view, nothing read yet
                                         # (from an s3:// URL: read in now)
            print(name, w.shape, float(np.abs(w).max()))

Tensors are read-only views of the paged file, where safetensors returns
writable copies: a copy of a tensor larger than the budget would take its
whole size in memory outside the budget. ``safe_open(..., copy=True)``
gives writable copies, as safetensors does.

``upager.safetensors.open(path, budget=...)`` is the older interface: a
read-only mapping from names to views (in file order), with modes "r+"
(tensors written back to the file) and "c", ``raw(name)`` for the bytes of
any tensor, and ValueError / KeyError / TypeError for errors.

Both read the file format from its specification, not through the
``safetensors`` package: 8 bytes of header length (little-endian u64), that
many bytes of JSON (``{"NAME": {"dtype": "F32", "shape": [..],
"data_offsets": [begin, end]}, "__metadata__": {..}}``), then the tensors'
bytes, offsets relative to the end of the header. They check what
safetensors checks, in its order, and refuse what it refuses (offsets
inside the data and matching each shape and dtype, no holes or overlaps, a
header of at most 100 MB, element counts that overflow 64 bits).
"""

from __future__ import annotations

import builtins
import json
import operator
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Type, cast

import numpy as np

from ._array import DEFAULT_BUDGET, PagedArray, SizeArg, _path, read_head, store_url

__all__ = ["safe_open", "SafetensorError", "SafeSlice", "HeaderError", "DtypeError", "open",
           "SafetensorsFile", "DTYPES"]


def _error_class() -> Type[Exception]:
    """safetensors' own SafetensorError when the package is installed (so
    ``except safetensors.SafetensorError`` catches upager's errors, and
    ``except upager.safetensors.SafetensorError`` catches safetensors'),
    else a class of upager's."""
    try:
        from safetensors import SafetensorError as real
    except ImportError:
        class SafetensorError(Exception):
            """Custom Python Exception for Safetensor errors (upager's: the
            safetensors package is not installed)."""
        SafetensorError.__module__ = __name__
        return SafetensorError
    return cast(Type[Exception], real)


#: The exception safe_open raises: ``safetensors.SafetensorError`` itself
#: when the safetensors package is installed, else upager's own class.
SafetensorError: Type[Exception] = _error_class()


class HeaderError(SafetensorError, ValueError):  # type: ignore[misc,valid-type]
    """A file that breaks the safetensors format (a SafetensorError, and a
    ValueError as ``upager.safetensors.open`` raised before)."""


class DtypeError(SafetensorError, TypeError):  # type: ignore[misc,valid-type]
    """A tensor of a dtype numpy has no type for (BF16 and F8 without the
    ml_dtypes package, F4, F6): the file opens, the other tensors read."""


#: The format's dtype names and numpy's (little-endian).
DTYPES: Dict[str, str] = {
    "BOOL": "|b1",
    "U8": "|u1",
    "I8": "|i1",
    "U16": "<u2",
    "I16": "<i2",
    "F16": "<f2",
    "U32": "<u4",
    "I32": "<i4",
    "F32": "<f4",
    "U64": "<u8",
    "I64": "<i8",
    "F64": "<f8",
    "C64": "<c8",
}

#: Bits per element of every dtype the format defines, in safetensors'
#: order (its Dtype enum).
_BITS: Dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}

#: Types numpy has not: given by the ml_dtypes package when it is installed.
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
              "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
              "F8_E8M0": "float8_e8m0fnu"}

#: The specification's limit on the header.
MAX_HEADER = 100_000_000

_U64 = 1 << 64


# -- the header --------------------------------------------------------------

class _Entry(NamedTuple):
    dtype: str
    shape: Tuple[int, ...]
    begin: int
    end: int


class _Header(NamedTuple):
    metadata: Optional[Dict[str, str]]
    entries: Dict[str, _Entry]      # in the order of their data
    data_start: int
    size: int


def _bad(what: str) -> HeaderError:
    return HeaderError(f"Error while deserializing header: {what}")


class _Pairs(List[Tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, duplicates kept."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _int(text: str) -> Any:
    # serde_json reads "-0" as the float -0.0, which no size accepts.
    return -0.0 if text == "-0" else int(text)


def _is_usize(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _U64


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which serde_json refuses
        return False
    return True


def _json_error(what: str) -> HeaderError:
    return _bad(f"invalid JSON in header: {what}")


def _header_bytes(head: bytes, size: int) -> int:
    """The header's length from the file's first 8 bytes (`head`), checked
    against the format's limit and the file's `size`."""
    if len(head) < 8:
        raise _bad(f"header too small: the file has {size} bytes, fewer than the 8 of "
                   "the header's length")
    n = int.from_bytes(head[:8], "little")
    if n > MAX_HEADER:
        raise _bad(f"header too large: header length {n} is beyond the format's "
                   f"{MAX_HEADER} bytes")
    if 8 + n > size:
        raise _bad(f"invalid header length: header length {n} is beyond the file's "
                   f"{size} bytes (truncated?)")
    return n


def _read_raw_header(name: str, mapped: Optional[PagedArray] = None) -> Tuple[bytes, int]:
    """The header's JSON bytes and the file's size: from `mapped`, the
    file's bytes mapped already (an object of a store: read through the
    region, so the header and the tensors are one version of the object,
    every read checked against its ETag, and no second connection); from
    a store by URL (two ranged reads: the length, then the header); or
    from the file."""
    if mapped is not None:
        size = len(mapped)
        n = _header_bytes(bytes(mapped[:8]), size)
        return bytes(mapped[8:8 + n]), size
    url = store_url(name)
    if url is not None:
        head, size = read_head(url, 8, "safetensors")
        n = _header_bytes(head, size)
        raw, _ = read_head(url, 8 + n, "safetensors")
        return raw[8:], size
    with builtins.open(name, "rb") as f:
        head = f.read(8)
        size = f.seek(0, 2)
        n = _header_bytes(head, size)
        f.seek(8)
        return f.read(n), size


def _parse_header(name: str, mapped: Optional[PagedArray] = None) -> _Header:
    """Reads and checks the header of file `name` (or a store URL; from
    `mapped` if given, its bytes mapped) as safetensors does
    (SafeTensors::read_metadata, then the Metadata checks in their order):
    HeaderError for a file that breaks the format; OSError from opening."""
    raw, size = _read_raw_header(name, mapped)
    n = len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(f"invalid UTF-8 in header: {e}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_no_constant,
                         parse_int=_int)
    except ValueError as e:  # json.JSONDecodeError, NaN / Infinity
        raise _json_error(f"the header is not valid JSON ({e})") from None
    if not isinstance(doc, _Pairs):
        raise _json_error(f"the header is {type(doc).__name__}, not a JSON object")
    metadata: Optional[Dict[str, str]] = None
    seen_metadata = False
    tensors: Dict[str, Any] = {}
    for key, value in doc:
        if not _utf8(key):
            raise _json_error(f"key {key!r} holds a lone surrogate")
        if key == "__metadata__":
            if seen_metadata:
                raise _json_error("duplicate field `__metadata__`")
            seen_metadata = True
            metadata = _check_metadata(value)
        else:
            tensors[key] = value  # a repeated name: the last wins, as in safetensors
    entries = [(key, _check_info(key, info)) for key, info in tensors.items()]
    entries.sort(key=lambda kv: (kv[1].begin, kv[1].end))
    at = 0
    for key, ent in entries:
        if ent.begin != at or ent.end < ent.begin:
            raise _bad(f"invalid offset for tensor `{key}`: data_offsets [{ent.begin}, {ent.end}] "
                       f"where the tensor must start at data offset {at} (the format "
                       "allows no holes or overlaps between tensors)")
        at = ent.end
        count = 1
        for d in ent.shape:
            count *= d
            if count >= _U64:
                raise _bad("overflow computing buffer size from shape and/or element type: "
                           f"tensor `{key}` of shape {list(ent.shape)}")
        bits = count * _BITS[ent.dtype]
        if bits >= _U64:
            raise _bad("overflow computing buffer size from shape and/or element type: "
                       f"tensor `{key}` of shape {list(ent.shape)} and dtype {ent.dtype}")
        if bits % 8:
            raise _bad("The slice is slicing for subbytes dtypes, and the slice does not end "
                       "up at a byte boundary, this is invalid. (Tensor "
                       f"`{key}` of shape {list(ent.shape)} and dtype {ent.dtype} is {bits} bits.)")
        if ent.end - ent.begin != bits // 8:
            raise _bad(f"invalid shape, data type, or offset for tensor `{key}`: it has "
                       f"{ent.end - ent.begin} bytes but shape {list(ent.shape)} of {ent.dtype} "
                       f"needs {bits // 8}")
    data_len = size - 8 - n
    if at != data_len:
        where = ("outside the data" if at > data_len
                 else "the format allows no bytes after them")
        raise _bad(f"incomplete metadata, file not fully covered: the tensors cover {at} of "
                   f"the {data_len} data bytes; {where}")
    return _Header(metadata, dict(entries), 8 + n, size)


def _check_metadata(value: Any) -> Optional[Dict[str, str]]:
    if value is None:
        return None
    if not isinstance(value, _Pairs):
        raise _json_error("__metadata__ must map strings to strings, not be "
                          f"{type(value).__name__}")
    out: Dict[str, str] = {}
    for k, v in value:
        if not (isinstance(v, str) and _utf8(k) and _utf8(v)):
            raise _json_error(f"__metadata__ must map strings to strings: {k!r} maps to "
                              f"{v!r}")
        out[k] = v  # a repeated key: the last wins, as in safetensors
    return out


def _check_info(key: str, info: Any) -> _Entry:
    fields: Dict[str, Any] = {}
    if isinstance(info, _Pairs):
        for k, v in info:
            if k in ("dtype", "shape", "data_offsets"):
                if k in fields:
                    raise _json_error(f"tensor {key!r} has a duplicate field `{k}`")
                fields[k] = v
        for k in ("dtype", "shape", "data_offsets"):
            if k not in fields:
                raise _json_error(f"tensor {key!r} has no field `{k}`")
    elif isinstance(info, list) and len(info) == 3:  # serde reads a struct from a list
        fields = dict(zip(("dtype", "shape", "data_offsets"), info))
    else:
        raise _json_error(f"tensor {key!r} is described by {json.dumps(info)[:80]}, not "
                          "an object with dtype, shape and data_offsets")
    kind, shape, offs = fields["dtype"], fields["shape"], fields["data_offsets"]
    if not isinstance(kind, str) or kind not in _BITS:
        raise _json_error(f"tensor {key!r} has dtype {kind!r}, which the format does not "
                          f"define (one of {', '.join(_BITS)})")
    if not (isinstance(shape, list) and all(_is_usize(d) for d in shape)):
        raise _json_error(f"tensor {key!r} has shape {shape!r}, not a list of sizes "
                          "(integers from 0 to 2^64-1)")
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_usize(o) for o in offs)):
        raise _json_error(f"tensor {key!r} has data_offsets {offs!r}, not [begin, end]")
    return _Entry(kind, tuple(shape), offs[0], offs[1])


def _numpy_dtype(kind: str, name: str) -> np.dtype:  # type: ignore[type-arg,unused-ignore]
    """numpy's type for tensor `name` of format dtype `kind`; DtypeError if
    numpy has none."""
    if kind in DTYPES:
        return np.dtype(DTYPES[kind])
    ml_name = _ML_DTYPES.get(kind)
    if ml_name is not None:
        try:
            import ml_dtypes  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            raise DtypeError(
                f"tensor {name!r} is {kind}, which numpy has no type for: install ml_dtypes "
                f"(pip install ml-dtypes) to read it as ml_dtypes.{ml_name}; its bytes: "
                f"upager.safetensors.open(path).raw({name!r})") from None
        ml_type = getattr(ml_dtypes, ml_name, None)
        if ml_type is not None:
            return cast(np.dtype, np.dtype(ml_type))  # type: ignore[type-arg,unused-ignore]
        raise DtypeError(f"tensor {name!r} is {kind}: the installed ml_dtypes has no "
                         f"{ml_name} (a newer ml_dtypes has)")
    raise DtypeError(
        f"tensor {name!r} is {kind} ({_BITS[kind]} bits an element, packed), which numpy has "
        f"no type for; its bytes: upager.safetensors.open(path).raw({name!r})")


def _view(raw: PagedArray, header: _Header, name: str) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
    """Tensor `name` as a view of the file's region."""
    e = header.entries[name]
    dtype = _numpy_dtype(e.dtype, name)
    start = header.data_start
    return cast(np.ndarray,  # type: ignore[type-arg,unused-ignore]
                raw[start + e.begin:start + e.end].view(dtype).reshape(e.shape))


def _read_tensor_in(raw: PagedArray, header: _Header, name: str, filename: str) -> None:
    """Reads tensor `name`'s bytes in now, where the region is on a store:
    the caller is about to use the whole tensor (safetensors reads it
    eagerly too), and each miss of a network store is a round trip that
    readahead only halves at each step, where one `Region.fetch` has its
    GETs in flight together (measured, a 1 GiB model from SeaweedFS: every
    tensor in 2.8 s against 4.4 s by faults and readahead, 7.5 s by a
    background prefetch). Up to a quarter of the budget; the rest of a
    larger tensor faults in, with readahead."""
    region = raw.region
    if region is None or store_url(filename) is None:
        return
    e = header.entries[name]
    if e.end == e.begin:
        return
    # The folios the tensor's bytes lie in.
    f = region.folio
    start = (header.data_start + e.begin) // f * f
    end = min(-(-(header.data_start + e.end) // f) * f, len(region))
    quarter = max(f, int(region.stats()["budget_bytes"]) // 4 // f * f)
    region.fetch(np.arange(start, min(end, start + quarter), f, dtype=np.uint64))


def _map(name: str, size: Optional[int], mode: str, budget: SizeArg, folio: Optional[SizeArg],
         fault_mode: Optional[str], pager_options: Dict[str, Any]) -> PagedArray:
    return PagedArray(name, np.uint8, mode, 0, None if size is None else (size,),
                      budget=budget, folio=folio, fault_mode=fault_mode, **pager_options)


def _open_file(name: str, mode: str, budget: SizeArg, folio: Optional[SizeArg],
               fault_mode: Optional[str], pager_options: Dict[str, Any]
               ) -> Tuple[_Header, PagedArray]:
    """File `name`'s header, checked, and its bytes mapped. A file: the
    header read first (a file that breaks the format maps nothing). An
    object of a store: mapped first, its header read through the region
    (one open of the store, a client and a HEAD, where reading the header
    first took three more; and the header's reads are checked against
    the object's ETag like the tensors')."""
    if store_url(name) is None:
        header = _parse_header(name)
        return header, _map(name, header.size, mode, budget, folio, fault_mode, pager_options)
    try:
        raw = _map(name, None, mode, budget, folio, fault_mode, pager_options)
    except ValueError:
        # An empty object maps nothing: say what safetensors says of it.
        _parse_header(name)
        raise
    try:
        return _parse_header(name, raw), raw
    except BaseException:
        raw.close()
        raise


# -- safe_open ---------------------------------------------------------------

#: safetensors' framework names, to the name its messages use.
_FRAMEWORKS = {"pt": "pytorch", "torch": "pytorch", "pytorch": "pytorch", "np": "numpy",
               "numpy": "numpy", "tf": "tensorflow", "tensorflow": "tensorflow",
               "jax": "flax", "flax": "flax", "mlx": "mlx", "paddle": "paddle"}

#: safetensors' device names, to the name its messages use.
_DEVICES = {"cpu": "cpu", "cuda": "cuda:0", "musa": "musa:0", "mps": "mps", "npu": "npu:0",
            "xpu": "xpu:0", "xla": "xla:0", "mlu": "mlu:0", "hpu": "hpu:0"}


def _framework(framework: Any) -> str:
    if not isinstance(framework, str):
        raise TypeError(f"argument 'framework': {type(framework).__name__!r} is not an "
                        "instance of 'str'")
    if framework not in _FRAMEWORKS:
        raise SafetensorError(f"framework {framework} is invalid")
    return _FRAMEWORKS[framework]


def _device(device: Any) -> str:
    """The device's name as safetensors writes it in messages; SafetensorError
    for a name safetensors does not know."""
    if device is None:
        return "cpu"
    if isinstance(device, str):
        if device in _DEVICES:
            return _DEVICES[device]
        kind, sep, index = device.partition(":")
        if sep and kind in _DEVICES and kind != "cpu" and index.isascii() and index.isdigit():
            if kind == "mps" and int(index) != 0:
                raise SafetensorError(f"device {device} is invalid: only mps or mps:0 is "
                                      "supported")
            return f"{kind}:{int(index)}" if kind != "mps" else "mps"
        raise SafetensorError(f"device {device} is invalid")
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return str(device)
    raise SafetensorError(f"device {device!r} is invalid")


def _backend(backend: Any) -> None:
    if not isinstance(backend, str):
        raise TypeError(f"argument 'backend': {type(backend).__name__!r} is not an "
                        "instance of 'str'")
    if backend not in ("mmap", "pread"):
        raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", '
                              '"pread")')


class safe_open:  # noqa: N801 (safetensors' name)
    """``safetensors.safe_open(filename, framework="np")`` under a hard
    memory budget.

    filename: str or os.PathLike (bytes and open files too), or a store URL
    ("s3://BUCKET/KEY.safetensors", "redis-cluster://HOST:PORT/NAME"): the
    header is read with two ranged reads, the tensors paged from the
    store. framework:
    "np" or "numpy" (safetensors' other names open nothing: upager gives
    numpy arrays). device: "cpu". backend: "mmap" or "pread", accepted and
    ignored (upager pages the file either way).

    upager's own keywords: ``budget`` (bytes or a string like "512MiB";
    default 256 MiB: never more of the file resident), ``copy`` (False:
    tensors are read-only views of the paged file, read when used; True:
    writable copies, as safetensors returns, which take memory outside the
    budget), ``folio``, ``fault_mode`` and any option of
    :class:`upager.Pager`.

    Errors are :class:`SafetensorError` with safetensors' messages (a
    corrupt file: "Error while deserializing header: ...", an unknown
    name: "File does not contain tensor NAME", any method after the
    ``with`` block: "File is closed"), FileNotFoundError for a missing
    file. A tensor of a dtype numpy has no type for (BF16 and F8 without
    the ml_dtypes package, F4, F6) does not stop the file from opening:
    reading it raises a SafetensorError that is also a TypeError.
    """

    def __init__(self, filename: Any, framework: str, device: Any = "cpu", *,
                 backend: str = "mmap", budget: SizeArg = DEFAULT_BUDGET, copy: bool = False,
                 folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
                 **pager_options: Any) -> None:
        self._raw: Optional[PagedArray] = None
        name = _path(filename)
        fw = _framework(framework)
        dev = _device(device)
        _backend(backend)
        try:
            if store_url(name) is None:
                with builtins.open(name, "rb"):
                    pass
        except FileNotFoundError:
            # safetensors' message (no errno: it has none either)
            raise FileNotFoundError(f"No such file or directory: {name}") from None
        if fw != "numpy":
            raise SafetensorError(
                f"framework {framework} is not supported by upager.safetensors.safe_open, "
                'which gives numpy arrays: use framework="np" (torch.from_numpy(t) makes a '
                "torch tensor of one)")
        if dev != "cpu":
            raise SafetensorError(f"Device {dev} is not supported for framework numpy")
        self.filename = name
        self.copy = bool(copy)
        self._header, self._raw = _open_file(name, "r", budget, folio, fault_mode,
                                             pager_options)

    def _open(self) -> Tuple[_Header, PagedArray]:
        raw = self._raw
        if raw is None or raw.closed:
            raise SafetensorError("File is closed")
        return self._header, raw

    def _entry(self, name: str) -> None:
        if name not in self._header.entries:
            raise SafetensorError(f"File does not contain tensor {name}")

    def metadata(self) -> Optional[Dict[str, str]]:
        """The header's ``__metadata__`` (str to str), or None."""
        header, _ = self._open()
        return None if header.metadata is None else dict(header.metadata)

    def keys(self) -> List[str]:
        """The tensor names, sorted."""
        header, _ = self._open()
        return sorted(header.entries)

    def offset_keys(self) -> List[str]:
        """The tensor names in the order of their data in the file."""
        header, _ = self._open()
        return list(header.entries)

    def get_tensor(self, name: str) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
        """Tensor `name`: a read-only view of the paged file (nothing read
        until used; from a store URL, its bytes up to a quarter of the
        budget are read in now, the reads in flight together), or a
        writable copy if opened with ``copy=True``."""
        header, raw = self._open()
        self._entry(name)
        view = _view(raw, header, name)
        _read_tensor_in(raw, header, name, self.filename)
        return np.array(view) if self.copy else view

    def get_tensors(self) -> Dict[str, np.ndarray]:  # type: ignore[type-arg,unused-ignore]
        """Every tensor, keyed by name, in the order of their data."""
        header, _ = self._open()
        return {name: self.get_tensor(name) for name in header.entries}

    def get_slice(self, name: str) -> "SafeSlice":
        """Tensor `name` to slice: ``f.get_slice(name)[:, ::8]`` reads only
        the part asked for. Keeps working after the file is closed, as
        safetensors' does."""
        header, raw = self._open()
        self._entry(name)
        return SafeSlice(raw, header, name, self.copy)

    # -- upager's ---------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._raw is None or self._raw.closed

    def close(self) -> None:
        """What leaving the ``with`` block does: every method raises "File is
        closed" after it, and the file's resident pages are released now.
        Tensors and slices taken before stay readable (they fault pages in
        again, under the budget) until they are gone. Idempotent."""
        if self._raw is not None:
            self._raw.close()

    def stats(self) -> Dict[str, int]:
        """Counters of the pager behind the file (``resident_peak_bytes``...)."""
        _, raw = self._open()
        return raw.pager_stats()

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<upager.safetensors.safe_open {getattr(self, 'filename', None)!r}{state}>"


class _safe_open_handle(safe_open):  # noqa: N801 (safetensors' name)
    """safetensors' ``_safe_open_handle(f, framework)``: safe_open of an open
    file object (its ``name``)."""

    def __init__(self, f: Any, framework: str, device: Any = "cpu", **kwargs: Any) -> None:
        getattr(f, "fileno")  # AttributeError for objects that are no files, as safetensors
        super().__init__(f.name, framework, device, **kwargs)


# -- slices ------------------------------------------------------------------

_Index = Tuple[str, Optional[int], Optional[int], int]  # ("select"|"narrow", start, stop, step)


def _usize(v: Any) -> Optional[int]:
    """A slice bound as safetensors reads it (an unsigned size)."""
    if v is None:
        return None
    i = operator.index(v)  # TypeError: "'float' object cannot be interpreted as an integer"
    if i < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if i >= _U64:
        raise OverflowError("int too big to convert")
    return i


def _show(indexers: List[_Index]) -> str:
    parts = []
    for kind, start, stop, step in indexers:
        if kind == "select":
            parts.append(str(start))
        else:
            part = f"{'' if start is None else start}:{'' if stop is None else stop}"
            parts.append(part + (f":{step}" if step != 1 else ""))
    return "[" + ", ".join(parts) + "]"


def _indexers(index: Any, shape: Tuple[int, ...]) -> List[_Index]:
    """safetensors' reading of ``slice_[index]``: a slice (steps > 0 only,
    bounds >= 0), an int (negative counts from the end), Ellipsis, a tuple of
    those, or an empty list (nothing of the first axis)."""
    if isinstance(index, list):
        if index:
            raise SafetensorError("Non empty lists are not implemented")
        items: List[Any] = [slice(0, 0)]
    elif isinstance(index, tuple):
        items = list(index)
    else:
        items = [index]
    ellipses = [i for i, it in enumerate(items) if it is Ellipsis]
    if len(ellipses) > 1:
        raise SafetensorError("Only one ellipsis (...) is allowed in slice index")
    if ellipses:
        at = ellipses[0]
        fill = max(0, len(shape) - (len(items) - 1))
        items = items[:at] + [slice(None)] * fill + items[at + 1:]
    out: List[_Index] = []
    for pos, it in enumerate(items):
        if isinstance(it, slice):
            start, stop = _usize(it.start), _usize(it.stop)
            step = 1 if it.step is None else operator.index(it.step)
            if step <= 0:
                raise SafetensorError(f"Slice step must be a positive integer, got {step}")
            out.append(("narrow", start, stop, step))
            continue
        try:
            i = operator.index(it)
        except TypeError:
            i = None
        if i is None or not -(1 << 31) <= i < (1 << 31):
            raise SafetensorError(f"Unsupported slice index at position {pos}: expected "
                                  "slice, int, or ellipsis")
        if i < 0:
            size = shape[pos] if pos < len(shape) else 0
            if i + size < 0:
                raise SafetensorError(f"Invalid index {i} for dimension {pos} of size {size}")
            i += size
        out.append(("select", i, None, 1))
    fail = f"Error during slicing {_show(out)} with shape {list(shape)}: "
    if len(out) > len(shape):
        raise SafetensorError(fail + "more slicing indexes than dimensions in tensor")
    # safetensors checks the last axis first
    for dim, ((kind, start, stop, _), size) in reversed(list(enumerate(zip(out, shape)))):
        first = start or 0
        if first >= size:
            raise SafetensorError(fail + f"index {first} out of bounds for tensor dimension "
                                  f"#{dim} of size {size}")
        if kind == "narrow" and stop is not None and stop > size:
            raise SafetensorError(fail + f"index {stop - 1} out of bounds for tensor "
                                  f"dimension #{dim} of size {size}")
    for dim, (kind, start, stop, _) in enumerate(out):
        if kind == "narrow" and stop is not None and (start or 0) > stop:
            # safetensors fails here with SystemError ("Negative size passed
            # to PyByteArray_FromStringAndSize"); numpy would give nothing.
            raise SafetensorError(fail + f"start {start} is after stop {stop} in tensor "
                                  f"dimension #{dim}")
    return out


class SafeSlice:
    """What ``safe_open.get_slice(name)`` returns (safetensors'
    PySafeSlice): ``get_shape()``, ``get_dtype()``, and indexing with what
    safetensors accepts: slices with steps > 0 and bounds >= 0, ints
    (negative ones count from the end), one Ellipsis, a tuple of those, or
    ``[]``; refused with safetensors' errors otherwise. The result is a view
    of the paged file (a writable copy if the file was opened with
    ``copy=True``)."""

    def __init__(self, raw: PagedArray, header: _Header, name: str, copy: bool) -> None:
        self._raw, self._header, self._name, self._copy = raw, header, name, copy
        self._entry = header.entries[name]

    def get_shape(self) -> List[int]:
        """The shape of the whole tensor."""
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        """The dtype of the tensor as the format names it ("F32", "BF16"...)."""
        return self._entry.dtype

    def __getitem__(self, index: Any) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
        indexers = _indexers(index, self._entry.shape)
        view = _view(self._raw, self._header, self._name)
        key = tuple(start if kind == "select" else slice(start, stop, step)
                    for kind, start, stop, step in indexers)
        part = view[key + (Ellipsis,)]  # Ellipsis: a 0-d array, never a scalar
        return np.array(part) if self._copy else part

    def __repr__(self) -> str:
        return (f"<upager.safetensors.SafeSlice {self._name!r} {self._entry.dtype} "
                f"{list(self._entry.shape)}>")


# -- the older interface -----------------------------------------------------

class SafetensorsFile(Mapping[str, np.ndarray]):  # type: ignore[type-arg,unused-ignore]
    """An open safetensors file: a read-only mapping from tensor names to
    numpy arrays that are views into one upager region of the file. See
    :func:`open`."""

    def __init__(self, path: Any, *, budget: SizeArg = DEFAULT_BUDGET, mode: str = "r",
                 folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
                 **pager_options: Any) -> None:
        name = _path(path)
        self.filename = name
        if mode not in ("r", "r+", "c"):
            raise ValueError(f'mode must be "r", "r+" or "c", got {mode!r}')
        self._header, self._raw = _open_file(name, mode, budget, folio, fault_mode,
                                             pager_options)
        self._metadata = self._header.metadata
        self._entries = self._header.entries

    # -- the Mapping ------------------------------------------------------

    def __getitem__(self, name: str) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
        return self.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (f"<upager.safetensors file {self.filename!r}, {len(self)} tensors"
                f"{' closed' if self.closed else ''}>")

    # -- safe_open's interface --------------------------------------------

    def keys(self) -> List[str]:  # type: ignore[override]
        """The tensor names, in the order of their data in the file."""
        return list(self._entries)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The header's ``__metadata__`` (str to str), or None."""
        return None if self._metadata is None else dict(self._metadata)

    def get_tensor(self, name: str) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
        """Tensor `name` as a numpy array viewing the file's bytes (a
        PagedArray; read-only unless the file was opened with mode "r+" or
        "c"). Nothing is read until it is used (from a store URL, its bytes
        up to a quarter of the budget are read in now, the reads in flight
        together). TypeError (a DtypeError)
        for a dtype numpy has no type for (see :meth:`raw`)."""
        if name not in self._entries:
            raise KeyError(f"no tensor {name!r} in {self.filename} "
                           f"({len(self)} tensors; see keys())")
        view = _view(self._raw, self._header, name)
        _read_tensor_in(self._raw, self._header, name, self.filename)
        return view

    def raw(self, name: str) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
        """Tensor `name`'s bytes (uint8 view), whatever its dtype: for the
        dtypes numpy has no type for (BF16 and F8 without ml_dtypes, F4,
        F6)."""
        if name not in self._entries:
            raise KeyError(f"no tensor {name!r} in {self.filename}")
        e = self._entries[name]
        start = self._header.data_start
        return cast(np.ndarray,  # type: ignore[type-arg,unused-ignore]
                    self._raw[start + e.begin:start + e.end])

    def dtype_name(self, name: str) -> str:
        """Tensor `name`'s dtype as the format names it ("F32", "BF16"...)."""
        return self._entries[name].dtype

    # -- the region -------------------------------------------------------

    @property
    def array(self) -> PagedArray:
        """The whole file as one uint8 PagedArray (the region's view)."""
        return self._raw

    def stats(self) -> Dict[str, int]:
        """Counters of the pager behind the file."""
        return self._raw.pager_stats()

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def close(self) -> None:
        """Releases the file's memory now (PagedArray.close(): flushes in mode
        "r+", evicts every resident page); the mapping goes with the last
        tensor array still referenced."""
        self._raw.close()

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open(path: Any, *, budget: SizeArg = DEFAULT_BUDGET, mode: str = "r",
         folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
         **pager_options: Any) -> SafetensorsFile:
    """Opens a safetensors file under a hard memory budget: a mapping from
    tensor names to numpy arrays that view one region of the file.

    mode: "r" (default), "r+" (tensors writable in place; ``close()`` or
    the region's flush writes changes back) or "c" (writable, the file
    never changes). ``budget``, ``folio``, ``fault_mode`` and other options
    as for :data:`upager.memmap`. ValueError (a :class:`SafetensorError`
    too) for a file that breaks the format. For safetensors' own interface
    use :class:`safe_open`.
    """
    return SafetensorsFile(path, budget=budget, mode=mode, folio=folio,
                           fault_mode=fault_mode, **pager_options)
