"""safetensors files (how model weights ship) as numpy arrays under a hard
memory budget.

``upager.safetensors.open(path, budget="1GiB")`` maps the whole file as one
region and gives each tensor as a numpy array that is a view into it: a
model larger than memory opens at once, and each tensor is read when it is
used, a folio at a time, never more than ``budget`` resident::

    with upager.safetensors.open("model.safetensors", budget="512MiB") as st:
        for name in st:                 # or st.keys()
            w = st[name]                # a view, no copy, nothing read yet
            print(name, w.shape, float(np.abs(w).max()))

It reads the file format from its specification, not through the
``safetensors`` package: 8 bytes of header length (little-endian u64), that
many bytes of JSON (``{"NAME": {"dtype": "F32", "shape": [..],
"data_offsets": [begin, end]}, "__metadata__": {..}}``), then the tensors'
bytes, offsets relative to the end of the header. The spec's rules are
checked (offsets inside the data and matching each shape and dtype, no
overlaps or holes, a header of at most 100 MB).

``get_tensor(name)``, ``keys()`` and ``metadata()`` are those of
``safetensors.safe_open(path, framework="np")``, except that tensors are
views into the file instead of copies (``np.array(t)`` copies one).
"""

from __future__ import annotations

import builtins
import json
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, cast

import numpy as np

from ._array import DEFAULT_BUDGET, PagedArray, SizeArg, _path

__all__ = ["open", "SafetensorsFile", "DTYPES"]

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

#: Types numpy has not: given by the ml_dtypes package when it is installed.
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}

#: Item sizes of every dtype the format names, to check offsets.
_ITEMSIZE = {**{k: np.dtype(v).itemsize for k, v in DTYPES.items()},
             "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}

#: The specification's limit on the header.
MAX_HEADER = 100_000_000


class SafetensorsFile(Mapping[str, np.ndarray]):  # type: ignore[type-arg,unused-ignore]
    """An open safetensors file: a read-only mapping from tensor names to
    numpy arrays that are views into one upager region of the file. See
    :func:`open`."""

    def __init__(self, path: Any, *, budget: SizeArg = DEFAULT_BUDGET, mode: str = "r",
                 folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
                 **pager_options: Any) -> None:
        name = _path(path)
        self.filename = name
        header, data_start, size = _read_header(name)
        self._metadata: Optional[Dict[str, str]] = header.pop("__metadata__", None)
        self._entries = _check_entries(name, header, size - data_start)
        self._data_start = data_start
        if mode not in ("r", "r+", "c"):
            raise ValueError(f'mode must be "r", "r+" or "c", got {mode!r}')
        self._raw: PagedArray = PagedArray(name, np.uint8, mode, 0, (size,), budget=budget,
                                           folio=folio, fault_mode=fault_mode,
                                           **pager_options)

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
        "c"). Nothing is read until it is used."""
        entry = self._entries.get(name)
        if entry is None:
            raise KeyError(f"no tensor {name!r} in {self.filename} "
                           f"({len(self)} tensors; see keys())")
        kind, shape, begin, end = entry
        dtype = _numpy_dtype(kind, name)
        start = self._data_start + begin
        raw = self._raw[start:self._data_start + end]
        return cast(np.ndarray, raw.view(dtype).reshape(shape))  # type: ignore[type-arg,unused-ignore]

    def raw(self, name: str) -> np.ndarray:  # type: ignore[type-arg,unused-ignore]
        """Tensor `name`'s bytes (uint8 view), whatever its dtype: for the
        dtypes numpy has no type for (BF16 and F8 without ml_dtypes)."""
        if name not in self._entries:
            raise KeyError(f"no tensor {name!r} in {self.filename}")
        _, _, begin, end = self._entries[name]
        return cast(np.ndarray,  # type: ignore[type-arg,unused-ignore]
                    self._raw[self._data_start + begin:self._data_start + end])

    def dtype_name(self, name: str) -> str:
        """Tensor `name`'s dtype as the format names it ("F32", "BF16"...)."""
        return self._entries[name][0]

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
    as for :data:`upager.memmap`. ValueError for a file that breaks the
    format.
    """
    return SafetensorsFile(path, budget=budget, mode=mode, folio=folio,
                           fault_mode=fault_mode, **pager_options)


_Entry = Tuple[str, Tuple[int, ...], int, int]


def _read_header(name: str) -> Tuple[Dict[str, Any], int, int]:
    """The header's JSON object, where the data starts, the file's size."""
    with builtins.open(name, "rb") as f:
        head = f.read(8)
        size = f.seek(0, 2)
        if len(head) < 8:
            raise ValueError(f"{name} is not a safetensors file: {size} bytes, fewer "
                             "than the 8 of the header's length")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(
                f"{name} is not a safetensors file (or is truncated): its header "
                f"length {n} is beyond the file's {size} bytes or the format's "
                f"{MAX_HEADER}")
        f.seek(8)
        text = f.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{name}: the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name}: the safetensors header is not a JSON object")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        raise ValueError(f"{name}: __metadata__ must map strings to strings")
    return header, 8 + n, size


def _check_entries(name: str, header: Dict[str, Any], data_len: int) -> Dict[str, _Entry]:
    """The tensors, in data order, checked against the specification."""
    entries: Dict[str, _Entry] = {}
    for key, info in header.items():
        if not isinstance(info, dict):
            raise ValueError(f"{name}: tensor {key!r} is not described by an object")
        kind, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if kind not in _ITEMSIZE:
            raise ValueError(f"{name}: tensor {key!r} has dtype {kind!r}, which the "
                             f"format does not define (one of {sorted(_ITEMSIZE)})")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ValueError(f"{name}: tensor {key!r} has shape {shape!r}, not a list of "
                             "sizes")
        if not (isinstance(offs, list) and len(offs) == 2
                and all(isinstance(o, int) for o in offs)):
            raise ValueError(f"{name}: tensor {key!r} has data_offsets {offs!r}, not "
                             "[begin, end]")
        begin, end = offs
        count = 1
        for d in shape:
            count *= d
        if not 0 <= begin <= end <= data_len:
            raise ValueError(f"{name}: tensor {key!r} has data_offsets [{begin}, {end}] "
                             f"outside the data ({data_len} bytes)")
        if end - begin != count * _ITEMSIZE[kind]:
            raise ValueError(
                f"{name}: tensor {key!r} has {end - begin} bytes but shape {shape} of "
                f"{kind} needs {count * _ITEMSIZE[kind]}")
        entries[key] = (kind, tuple(shape), begin, end)
    ordered = dict(sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])))
    at = 0
    for key, (_, _, begin, end) in ordered.items():
        if begin != at:
            raise ValueError(
                f"{name}: tensor {key!r} starts at data offset {begin}, expected {at}: "
                "the format allows no holes or overlaps between tensors")
        at = end
    if at != data_len:
        raise ValueError(f"{name}: the tensors cover {at} of the {data_len} data bytes; "
                         "the format allows no bytes after them")
    return ordered


def _numpy_dtype(kind: str, name: str) -> np.dtype:  # type: ignore[type-arg,unused-ignore]
    if kind in DTYPES:
        return np.dtype(DTYPES[kind])
    try:
        import ml_dtypes  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise TypeError(
            f"tensor {name!r} is {kind}, which numpy has no type for: install ml_dtypes "
            f"(pip install ml-dtypes), or read its bytes with .raw({name!r})") from None
    return cast(np.dtype,  # type: ignore[type-arg,unused-ignore]
                np.dtype(getattr(ml_dtypes, _ML_DTYPES[kind])))
