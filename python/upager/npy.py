""".npy files under a budget: :func:`load` is ``numpy.load(path,
mmap_mode=...)``'s twin, :func:`open_npy` ``numpy.lib.format.open_memmap``'s.

The header is read and written with numpy's own ``numpy.lib.format``; the
data is mapped at its offset, like numpy.memmap does for ``np.load(path,
mmap_mode="r")``, but paged under a hard memory budget.
"""

from __future__ import annotations

import io
import os
import pathlib
from typing import Any, Literal, Optional, Tuple, Union, overload

import numpy as np
from numpy.lib import format as npformat
from numpy.typing import DTypeLike

from ._array import (DEFAULT_BUDGET, MODES, PagedArray, SizeArg, _path, _shape, _Source,
                     _source, _open, read_head, store_url)
from ._upager import redact_url

try:  # numpy 2
    from numpy.lib._format_impl import _write_array_header  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # numpy 1.x
    _write_array_header = npformat._write_array_header  # type: ignore[attr-defined,unused-ignore]

__all__ = ["load", "open_npy", "read_header"]

_ZIP_MAGIC = b"PK\x03\x04"
_ZIP_EMPTY = b"PK\x05\x06"  # an empty zip archive starts with this

#: numpy.load, untyped: it takes what numpy's stubs do not list (mmap_mode
#: long names, any encoding string) and returns what it read.
_np_load: Any = np.load

#: numpy.load's default limit on the header's length (its ``max_header_size``).
MAX_HEADER_SIZE = 10000


def read_header(path: Any, max_header_size: int = MAX_HEADER_SIZE
                ) -> Tuple[Tuple[int, ...], bool, np.dtype, int]:  # type: ignore[type-arg,unused-ignore]
    """(shape, fortran_order, dtype, data offset) of an .npy file, read with
    ``numpy.lib.format``. ValueError for what is no .npy file, holds Python
    objects (which cannot be mapped) or has a header longer than
    ``max_header_size`` (numpy.load's limit and default)."""
    url = store_url(path)
    if url is not None:
        return _store_header(url, max_header_size)
    name = _path(path)
    with open(name, "rb") as f:
        return _read_header(f, name, max_header_size)


def _store_header(url: str, max_header_size: int
                  ) -> Tuple[Tuple[int, ...], bool, np.dtype, int]:  # type: ignore[type-arg,unused-ignore]
    """:func:`read_header` of a dataset or object by URL: its first bytes,
    then as many as the header's length field says (numpy's limit checks
    run on them as on a file's)."""
    head, _ = read_head(url, 12, ".npy")
    want = len(head)
    if head.startswith(npformat.MAGIC_PREFIX) and len(head) == 12:
        major = head[len(npformat.MAGIC_PREFIX)]
        if major == 1:
            want = 10 + int.from_bytes(head[8:10], "little")
        elif major in (2, 3):
            want = 12 + int.from_bytes(head[8:12], "little")
        # past numpy's limit, enough to let numpy say so
        want = min(want, 12 + max_header_size + 1)
    if want > len(head):
        head, _ = read_head(url, want, ".npy")
    return _read_header(io.BytesIO(head), redact_url(url), max_header_size)


def _read_header(f: Any, name: str, max_header_size: int
                 ) -> Tuple[Tuple[int, ...], bool, np.dtype, int]:  # type: ignore[type-arg,unused-ignore]
    start = f.tell()
    magic = f.read(len(_ZIP_MAGIC))
    if magic in (_ZIP_MAGIC, _ZIP_EMPTY):
        raise ValueError(
            f"{name} is an .npz archive (a zip of .npy files), which cannot be "
            "mapped as one array: upager.load(path) gives numpy.load's NpzFile"
        )
    f.seek(start)
    try:
        version = npformat.read_magic(f)
    except ValueError as e:
        raise ValueError(f"{name} is not an .npy file ({e})") from None
    try:
        if version == (1, 0):
            shape, fortran_order, dtype = npformat.read_array_header_1_0(
                f, max_header_size=max_header_size)
        else:  # (2, 0) and (3, 0): a 4-byte header length
            shape, fortran_order, dtype = npformat.read_array_header_2_0(
                f, max_header_size=max_header_size)
    except (ValueError, OSError):
        raise
    except Exception as e:  # noqa: BLE001 (numpy's header parser lets others out)
        # numpy raised tokenize.TokenError for a header it could not
        # tokenize (found by fuzz/python/npy_header.py): still "no .npy
        # file", ValueError as documented.
        raise ValueError(f"{name} is not an .npy file: its header cannot be read "
                         f"({type(e).__name__}: {e})") from None
    offset = f.tell()
    if dtype.hasobject:
        raise ValueError(
            f"Array can't be memory-mapped: Python objects in dtype ({name}, dtype "
            f"{dtype}): use numpy.load(path, allow_pickle=True)"
        )
    return tuple(shape), bool(fortran_order), dtype, offset


def _kind(file: Any) -> str:
    """What `file` (a path or an open file, at its position) holds, as
    numpy.load tells: "npy", "npz" or "other" (a pickle, or nothing)."""
    url = store_url(file)
    if url is not None:
        magic, _ = read_head(url, len(npformat.MAGIC_PREFIX), ".npy")
    elif isinstance(file, (str, bytes, os.PathLike)):
        with open(file, "rb") as f:
            magic = f.read(len(npformat.MAGIC_PREFIX))
    else:
        pos = file.tell()
        magic = file.read(len(npformat.MAGIC_PREFIX))
        file.seek(pos)
    if magic.startswith((_ZIP_MAGIC, _ZIP_EMPTY)):
        return "npz"
    return "npy" if magic == npformat.MAGIC_PREFIX else "other"


@overload
def load(file: Any, mmap_mode: str = "r", allow_pickle: Literal[False] = False,
         fix_imports: bool = True, encoding: str = "ASCII", *,
         max_header_size: int = MAX_HEADER_SIZE, budget: SizeArg = DEFAULT_BUDGET,
         folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
         **pager_options: Any) -> Union[PagedArray, "np.lib.npyio.NpzFile[np.generic[object]]"]: ...
@overload
def load(file: Any, mmap_mode: Optional[str] = "r", allow_pickle: bool = False,
         fix_imports: bool = True, encoding: str = "ASCII", *,
         max_header_size: int = MAX_HEADER_SIZE, budget: SizeArg = DEFAULT_BUDGET,
         folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
         **pager_options: Any) -> Any: ...
def load(file: Any, mmap_mode: Optional[str] = "r", allow_pickle: bool = False,
         fix_imports: bool = True, encoding: str = "ASCII", *,
         max_header_size: int = MAX_HEADER_SIZE, budget: SizeArg = DEFAULT_BUDGET,
         folio: Optional[SizeArg] = None, fault_mode: Optional[str] = None,
         **pager_options: Any) -> Any:
    """``numpy.load`` that maps .npy files as :class:`PagedArray` under a
    hard budget, where numpy.load(file, mmap_mode=...) maps them with
    numpy.memmap.

    mmap_mode: "r" (the default; numpy.load's is None), "r+" (changes reach
    the file) or "c" (copy-on-write), or their long names: an .npy file is
    mapped (the header's shape, dtype and order). None: numpy.load itself
    (the array read into memory; no budget). As numpy.load does whatever
    the mode, an .npz archive gives numpy's ``NpzFile`` (members read into
    memory when accessed) and a pickle is loaded only with
    ``allow_pickle=True``. ``allow_pickle``, ``fix_imports``, ``encoding``
    and ``max_header_size`` are numpy.load's (``allow_pickle=True`` lifts
    the header limit, as numpy.load does). ``file``: a path, or an open
    file of a real file (mapped through its descriptor, its data after the
    header at the file's position; the file is left after the array, as
    numpy.load leaves it); or a store URL ("s3://BUCKET/KEY.npy", mapped
    read-only; "redis-cluster://HOST:PORT/NAME", "r" or "r+"), its header
    read with ranged reads and its data paged from the store. Other
    keywords as for :data:`upager.memmap` (``budget``, ``fault_mode``...).
    """
    if isinstance(mmap_mode, str) and "://" in mmap_mode:
        raise TypeError(
            "upager.load(file, mmap_mode) opens .npy files like numpy.load; to "
            "upload a file to a store as a dataset use "
            f"upager.upload_dataset(path, {mmap_mode!r})"
        )
    url = store_url(file)
    if url is not None:
        return _load_store(url, mmap_mode, max_header_size, allow_pickle, budget, folio,
                           fault_mode, pager_options)
    if not mmap_mode:  # numpy.load's test: None (and "") read into memory
        return _np_load(file, mmap_mode, allow_pickle, fix_imports, encoding,
                       max_header_size=max_header_size)
    mode = MODES.get(mmap_mode) if isinstance(mmap_mode, str) else None
    if mode == "w+":
        raise ValueError(
            'mmap_mode "w+" would erase the file: create a new one with '
            "upager.open_npy(path, mode=\"w+\", dtype=..., shape=...)"
        )
    if mode is None:
        raise ValueError(
            f'mmap_mode must be "r", "r+" or "c" (or their long names), got {mmap_mode!r}')
    if not isinstance(file, (str, bytes, os.PathLike)) and not hasattr(file, "read"):
        _path(file)  # the TypeError naming what a file can be
    if _kind(file) != "npy":
        return _np_load(file, mmap_mode, allow_pickle, fix_imports, encoding,
                       max_header_size=max_header_size)
    if allow_pickle:
        max_header_size = 2**64  # numpy.load: a trusted file has no header limit
    if isinstance(file, (str, bytes, os.PathLike)):
        name = _path(file)
        shape, fortran_order, dtype, offset = read_header(name, max_header_size)
        src = _Source(name)
    else:
        src = _source_at(file)
        shape, fortran_order, dtype, offset = _read_header(
            file, src.name or "the file", max_header_size)
    arr = _map(src, dtype, mode, offset, shape, fortran_order, budget, folio, fault_mode,
               pager_options)
    if src.fileobj is not None:  # after the array, as numpy.load(f) leaves it
        file.seek(offset + arr.nbytes)
    if isinstance(file, os.PathLike):
        arr.filename = pathlib.Path(os.fsdecode(file)).resolve()  # as numpy.memmap
    return arr


def _load_store(url: str, mmap_mode: Any, max_header_size: int, allow_pickle: bool,
                budget: Any, folio: Any, fault_mode: Any, pager_options: Any) -> PagedArray:
    """:func:`load` of an .npy file on a store: mapped read-only ("r") or
    read-write ("r+", a Redis Cluster dataset)."""
    mode = MODES.get(mmap_mode) if isinstance(mmap_mode, str) else None
    if mode not in ("r", "r+"):
        raise ValueError(
            f'{redact_url(url)}: an .npy file on a store maps with mmap_mode "r" (or "r+" '
            f"on a Redis Cluster), got {mmap_mode!r}: numpy.load cannot read a URL "
            "either; download the file to load it otherwise")
    if _kind(url) != "npy":
        raise ValueError(
            f"{redact_url(url)} is not an .npy file: upager.load maps .npy files from a "
            "store; an .npz archive or a pickle must be downloaded and loaded with "
            "numpy.load")
    if allow_pickle:
        max_header_size = 2**64  # numpy.load: a trusted file has no header limit
    shape, fortran_order, dtype, offset = _store_header(url, max_header_size)
    return _map(_Source(None), dtype, mode, offset, shape, fortran_order, budget, folio,
                fault_mode, pager_options, store=url)


def _source_at(f: Any) -> _Source:
    """An open file to map, leaving its position where it is."""
    try:
        f.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        raise ValueError(
            f"{type(f).__name__} is no file on disk, which cannot be mapped: give a "
            "path, a file object of a real file, or mmap_mode=None") from None
    pos = f.tell()
    try:
        return _source(f)
    finally:
        f.seek(pos)


def open_npy(filename: Any, mode: str = "r+", dtype: Optional[DTypeLike] = None,
             shape: Any = None, fortran_order: bool = False,
             version: Optional[Tuple[int, int]] = None, *,
             budget: SizeArg = DEFAULT_BUDGET, max_header_size: int = MAX_HEADER_SIZE,
             folio: Optional[SizeArg] = None,
             fault_mode: Optional[str] = None, **pager_options: Any) -> PagedArray:
    """``numpy.lib.format.open_memmap``'s twin: opens an .npy file, or with
    mode "w+" creates one of ``shape`` and ``dtype`` (zeros; the file is
    sparse until written), as a :class:`PagedArray` under a hard budget.

    Modes as for :func:`load`, plus "w+" (which overwrites ``filename``).
    ``version``: the .npy format version to write, (1, 0), (2, 0) or
    (3, 0); None picks the oldest that holds the header, with numpy's
    UserWarning when that is not 1.0. A request that cannot be met (a bad
    version, dtype or shape) raises before the file is touched, and a file
    "w+" wrote is removed if it cannot be mapped: nothing is left half done.
    The first ``flush()`` also fsyncs the directory, so the new file's
    name is as durable as its data.
    """
    m = MODES.get(mode) if isinstance(mode, str) else None
    if m is None:
        raise ValueError(
            f'mode must be "r", "r+", "w+" or "c" (or their long names), got {mode!r}')
    url = store_url(filename)
    if url is not None:
        if m == "w+":
            raise ValueError(
                f'{redact_url(url)}: open_npy(mode="w+") creates an .npy file on disk; '
                "on a store, upload one (upager.upload_dataset) and map it")
        shape, fortran_order, dt, offset = read_header(url, max_header_size)
        return _map(_Source(None), dt, m, offset, shape, fortran_order, budget, folio,
                    fault_mode, pager_options, store=url)
    if m != "w+":  # numpy's open_memmap reads .npy files only
        name = _path(filename)
        shape, fortran_order, dt, offset = read_header(name, max_header_size)
        return _map(_Source(name), dt, m, offset, shape, fortran_order, budget, folio,
                    fault_mode, pager_options)
    name = _path(filename)
    if version not in ((1, 0), (2, 0), (3, 0), None):
        raise ValueError(f"version must be (1, 0), (2, 0), (3, 0) or None, got {version!r}")
    if dtype is None or shape is None:
        raise ValueError('mode "w+" needs a dtype and a shape: it creates the file')
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError("Array can't be memory-mapped: Python objects in dtype "
                         f"{dt}")
    dims = _shape(shape)
    assert dims is not None
    header = {"descr": npformat.dtype_to_descr(dt), "fortran_order": bool(fortran_order),
              "shape": dims}
    buf = io.BytesIO()  # the header first, so a bad request touches no file
    _write_array_header(buf, header, version)
    count = 1
    for d in dims:
        count *= d
    with open(name, "wb") as f:
        f.write(buf.getvalue())
        offset = f.tell()
        f.truncate(offset + count * dt.itemsize)
    try:
        arr = _map(_Source(name), dt, "r+", offset, dims, fortran_order, budget, folio,
                   fault_mode, pager_options, created=True)
    except BaseException:
        os.unlink(name)
        raise
    arr.mode = "w+"
    if isinstance(filename, os.PathLike):
        arr.filename = pathlib.Path(os.fsdecode(filename)).resolve()  # as numpy.memmap
    return arr


def _map(src: _Source, dtype: np.dtype, mode: str, offset: int,  # type: ignore[type-arg,unused-ignore]
         shape: Tuple[int, ...], fortran_order: bool, budget: Any, folio: Any,
         fault_mode: Any, pager_options: Any, created: bool = False,
         store: Optional[str] = None) -> PagedArray:
    arr = _open(src, dtype, shape, mode, offset, "F" if fortran_order else "C", budget,
                folio, fault_mode, store, pager_options)
    if created and arr._mapping is not None:
        arr._mapping.sync_dir = os.path.dirname(os.path.abspath(src.path or "."))
    return arr
