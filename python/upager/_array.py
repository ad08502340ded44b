"""PagedArray (``upager.memmap``) and :func:`open_array`: numpy arrays over
files and datasets, paged under a hard memory budget."""

from __future__ import annotations

import operator
import os
import stat
import pathlib
from typing import Any, Dict, Iterator, Literal, Optional, Tuple, Union, cast

import numpy as np
from numpy.typing import DTypeLike

from ._upager import Pager, Region, create_dataset, read_store, redact_url

#: numpy.memmap's modes and their long names, to the short name.
MODES: Dict[str, str] = {
    "r": "r",
    "readonly": "r",
    "r+": "r+",
    "readwrite": "r+",
    "w+": "w+",
    "write": "w+",
    "c": "c",
    "copyonwrite": "c",
}

#: The budget of an array opened without one.
DEFAULT_BUDGET = "256MiB"

_NUMPY2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"

# Fancy indexing with at least this many indices reads the folios it needs
# first (Region.fetch: batches whose reads go to the store together), then
# gathers from resident memory (_gather). 0 turns it off; the environment
# variable UPAGER_GATHER_FETCH_MIN sets it (benchmarks compare both ways).
GATHER_FETCH_MIN = int(os.environ.get("UPAGER_GATHER_FETCH_MIN", "64"))

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
ShapeArg = Union[int, Tuple[int, ...], None]
SizeArg = Union[int, str]


class _Mapping:
    """What every array over one region shares: the region, whether the
    arrays were closed, and how it was opened (for pickling: ``path`` or
    ``store``, ``mode``, ``start`` the file offset of the region's first
    byte, and the pager's options; None when it cannot be opened again, as
    for an open file that has no name). ``sync_dir``: the directory of a
    file mode "w+" created, to fsync at the first flush (then None)."""

    __slots__ = ("region", "closed", "opened", "sync_dir", "__weakref__")

    def __init__(self, region: Region, opened: Optional[Dict[str, Any]] = None,
                 sync_dir: Optional[str] = None) -> None:
        self.region = region
        self.closed = False
        self.opened = opened
        self.sync_dir = sync_dir

    def flush(self) -> None:
        """The region's flush (write-back, fdatasync), then, the first time,
        an fsync of the directory of a file "w+" created, so the file's
        name is as durable as its data."""
        self.region.flush()
        d = self.sync_dir
        if d is not None:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self.sync_dir = None


class PagedArray(np.memmap):  # type: ignore[type-arg,unused-ignore]
    """A ``numpy.memmap`` whose memory is a upager region: numpy.memmap with
    a hard memory budget (a subclass: ``isinstance(a, numpy.memmap)`` is
    True).

    ``upager.memmap`` is this class; construct it with numpy.memmap's
    arguments, in numpy.memmap's order::

        a = upager.memmap("big.f64", dtype=np.float64, mode="r+", shape=(n,),
                          budget="256MiB")

    filename: str, bytes, os.PathLike, or an open file object (mapped
    through its descriptor after its Python buffers are flushed, so a
    ``TemporaryFile()`` works). dtype: default uint8. mode: "r" /
    "readonly", "r+" / "readwrite" (the default), "w+" / "write" (create or
    overwrite a named file; needs ``shape``), "c" / "copyonwrite"
    (writable, the file never changes). offset: bytes, any value. shape:
    int or sequence; None maps the rest of the file as a 1-D array (its
    size must be a multiple of the dtype's). order: "C" or "F". As with
    numpy.memmap, "r+" and "w+" extend a file shorter than ``offset`` plus
    the array (to at least one byte), and an empty shape is allowed (mode
    "r" and "c" of an empty file: ValueError, as numpy's "cannot mmap an
    empty file").

    upager's own keywords: ``budget`` (bytes or a string like "256MiB";
    default 256 MiB), ``folio`` (default 4 KiB: a random access reads and
    writes back 4 KiB, a sequential pass is read a readahead window at a
    time; a larger folio writes back only the 4 KiB page written first),
    ``fault_mode`` ("handlers" or "in-thread", default the environment
    variable UPAGER_FAULT_MODE, else "in-thread" where the kernel gives
    this process a user-mode-only userfaultfd, else "handlers"),
    ``store`` (a dataset's URL instead of a file), and any option of
    :class:`Pager` (``batch``, ``readahead``, ``swap_dir``...).

    Result types are numpy.memmap's (numpy 2.x): views (slices, ``.T``,
    ``reshape`` without a copy) are PagedArrays over the same region;
    ufunc results, reductions along an axis and fancy indexing are plain
    ndarrays, full reductions scalars; ``copy()``, ``astype``, ``np.sort``
    and the like are PagedArrays that map nothing (``filename``,
    ``offset``, ``mode`` and ``region`` None), as numpy.memmap's copies are
    memmaps over nothing. Subclasses keep their class in every result, as
    numpy.memmap's do. docs/numpy.md has the table.

    Processes: a fork child uses the arrays it inherited (a pager of its
    own, started before ``fork()`` returns there; mode "c" and dataset
    arrays excepted). Pickling (multiprocessing arguments under any start
    method, joblib) sends where the array is: path or store URL, mode ("w+"
    as "r+"), dtype, shape, strides, offset and the pager's options;
    unpickling opens it again with a pager of its own. Mode "c" arrays,
    arrays over a file that has no name and arrays that map nothing pickle
    their data, as numpy.memmap's do.

    Attributes: ``filename`` (absolute path; a resolved ``pathlib.Path``
    when given one, as numpy.memmap; None for a store, an unnamed file and
    a copy), ``offset``, ``mode`` (the short name), ``region`` (the
    :class:`Region`; None once closed or for arrays that are not views of
    one), ``closed``; ``_mmap`` is the region (numpy.memmap's attribute,
    which code that looks for mapped arrays checks), None for copies.
    """

    filename: Union[str, pathlib.Path, None]  # type: ignore[assignment]
    offset: Optional[int]  # type: ignore[assignment]
    mode: Optional[str]  # type: ignore[assignment]
    _mapping: Optional[_Mapping]
    _mmap: Optional[Region]

    def __new__(
        cls,
        filename: Any,
        dtype: DTypeLike = np.uint8,
        mode: str = "r+",
        offset: int = 0,
        shape: Any = None,
        order: str = "C",
        *,
        budget: SizeArg = DEFAULT_BUDGET,
        folio: Optional[SizeArg] = None,
        fault_mode: Optional[str] = None,
        store: Optional[str] = None,
        **pager_options: Any,
    ) -> "PagedArray":
        if store is None and store_url(filename) is not None:
            store, filename = filename, None
        if store is not None:
            if filename is not None:
                raise ValueError(
                    f"give a filename or a store URL ({redact_url(store)}), not both: "
                    "pass None as the filename"
                )
            src = _Source(None)
        else:
            src = _source(filename)
        arr = _open(src, dtype, shape, mode, offset, order, budget, folio,
                    fault_mode, store, pager_options, cls)
        if isinstance(filename, os.PathLike):
            # as numpy.memmap keeps it
            arr.filename = pathlib.Path(os.fsdecode(filename)).resolve()
        return arr

    # -- numpy.memmap's result types ----------------------------------------

    def __array_finalize__(self, obj: Any) -> None:
        mapping = getattr(obj, "_mapping", None)
        if mapping is not None and np.may_share_memory(self, obj):
            self._mapping = mapping
            self._mmap = mapping.region
            self.filename = obj.filename
            self.offset = obj.offset
            self.mode = obj.mode
        else:
            self._mapping = None
            self._mmap = None
            self.filename = None
            self.offset = None
            self.mode = None

    def __array_wrap__(self, arr: Any, context: Any = None,
                       return_scalar: bool = False) -> Any:
        # numpy.memmap's rule: a ufunc's output given as out= stays as it
        # is; other results of ufuncs and reductions are plain ndarrays or
        # scalars, except for subclasses, which keep their class.
        if _NUMPY2:
            arr = np.ndarray.__array_wrap__(self, arr, context, return_scalar)
        else:  # numpy 1.x: no return_scalar; 0-d results come here
            arr = np.ndarray.__array_wrap__(self, arr, context)
        if self is arr or type(self) is not PagedArray:
            return arr
        if return_scalar or (not _NUMPY2 and arr.shape == ()):
            return arr[()]
        return arr.view(np.ndarray)

    # An int, slice or tuple index is never a gather or scatter
    # (_fancy_rows): straight to numpy, so element and slice accesses pay
    # one isinstance more than numpy.memmap's.
    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, (int, slice, tuple)) or not _scatter(self, index, value):
            np.ndarray.__setitem__(self, index, value)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, (int, slice, tuple)):
            gathered = _gather(self, index)
            if gathered is not None:
                return gathered
        res = np.ndarray.__getitem__(self, index)
        if type(res) is PagedArray and res._mapping is None:
            return res.view(np.ndarray)  # fancy indexing: a copy
        return res

    def __reduce__(self) -> Any:
        return self.__reduce_ex__(2)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A view of a region pickles as where it is (path or store URL,
        # mode, dtype, shape, strides, file offset, the pager's options);
        # unpickling opens it again (multiprocessing's spawn and
        # forkserver, ProcessPoolExecutor). Mode "c" (private changes) and
        # arrays that are no view of a region carry their data, as
        # numpy.memmap's pickles do.
        spec = _spec(self)
        if spec is None:
            return np.asarray(self).__reduce_ex__(protocol)
        return (_reopen, (spec,))

    # -- numpy.memmap's interface, and closing ----------------------------

    @property
    def region(self) -> Optional[Region]:
        """The region under this array; None for an array that is no view of
        one, and once closed."""
        m = self._mapping
        return None if m is None or m.closed else m.region

    @property
    def closed(self) -> bool:
        """True after close() (on this array or another view of its region)."""
        m = self._mapping
        return m is None or m.closed

    def flush(self) -> None:
        """Writes changes back to the file and makes them durable (fdatasync;
        for a store: replicated). Does nothing in modes "r" and "c" and on
        arrays that are no view of a region."""
        m = self._mapping
        if m is None or self.mode in ("r", "c"):
            return
        if m.closed:
            raise ValueError("the array is closed: flush() before close()")
        m.flush()

    def close(self) -> None:
        """Flushes changes (modes "r+" and "w+"), evicts every resident page
        of the region, so its memory is released now, and marks every array
        over the region closed: ``flush()``, ``region`` and
        ``pager_stats()`` stop working and this array becomes read-only.
        Idempotent; also the end of a ``with`` block.

        The address range stays mapped until the last array over it is
        gone (numpy arrays cannot be revoked: unmapping memory they point to
        would crash the process): reading a closed array still works and
        faults pages in again. Delete the arrays to release the rest.
        """
        m = self._mapping
        if m is None or m.closed:
            return
        if self.mode in ("r+", "w+"):
            m.flush()
        m.region.pageout()
        m.closed = True
        self.flags.writeable = False

    def __enter__(self) -> "PagedArray":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def pager_stats(self) -> Dict[str, int]:
        """Counters of the pager behind this array, and of its store where
        the store keeps its own (``store_*``: an S3 object or dataset, a
        Redis Cluster dataset: requests, bytes on the wire)."""
        region = self.region
        if region is None:
            raise ValueError(
                "this array is not backed by an open upager region (closed, or "
                "a new array computed from one)"
            )
        return region.stats()

    def tofile(self, fid: Any, sep: str = "", format: str = "%s") -> None:
        """numpy's ``tofile``. Where system calls do not fault region pages
        in (fault mode "in-thread", or a user-mode-only userfaultfd: an
        ordinary user's, see ``Pager.info()``) the binary form copies the
        data out in 8 MiB chunks first: the write(2) numpy makes straight
        from region memory would fail with EFAULT on pages not resident."""
        region = self.region
        if sep or region is None or region.syscalls_fault_in:
            super().tofile(fid, sep, format)
            return
        if isinstance(fid, (str, bytes, os.PathLike)):
            with open(fid, "wb") as f:
                for chunk in _chunks(self):
                    f.write(chunk)
        else:
            for chunk in _chunks(self):
                fid.write(chunk)


def _byte_bounds(a: np.ndarray) -> Tuple[int, int]:  # type: ignore[type-arg,unused-ignore]
    """The first and one past the last byte address `a` uses."""
    try:
        from numpy.lib.array_utils import byte_bounds  # numpy 2
    except ImportError:  # numpy 1.x
        byte_bounds = np.byte_bounds  # type: ignore[attr-defined,unused-ignore]
    lo, hi = byte_bounds(a)
    return int(lo), int(hi)


def _fancy_rows(a: "PagedArray", index: Any) -> Optional[Tuple[Region, np.ndarray, np.ndarray, int, int]]:  # type: ignore[type-arg,unused-ignore]
    """What a gather or a scatter through Region.fetch needs, for a 1-D
    integer index array of at least GATHER_FETCH_MIN entries on the first
    axis of a region-backed array whose rows each fit in a folio: the
    region, the indices (int64, made non-negative), their address order,
    the byte offset in the region of row 0 and the bytes of a row. None
    where it does not apply (numpy indexes as usual, errors included)."""
    if GATHER_FETCH_MIN <= 0 or a.ndim < 1 or isinstance(index, tuple):
        return None
    if isinstance(index, list):
        if len(index) < GATHER_FETCH_MIN or not all(type(i) is int for i in index):
            return None
        index = np.asarray(index, dtype=np.intp)
    if (not isinstance(index, np.ndarray) or index.ndim != 1
            or index.dtype.kind not in "iu" or index.size < GATHER_FETCH_MIN):
        return None
    region = a.region
    if region is None:
        return None
    n = a.shape[0]
    row = a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    if row == 0 or row > region.folio or (a.ndim > 1 and not a[0:1].flags.c_contiguous):
        return None
    idx = index.astype(np.int64, copy=False)
    if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
        return None  # numpy raises its IndexError
    idx = np.where(idx < 0, idx + n, idx)
    start = a.__array_interface__["data"][0] - region.address
    order = np.argsort(idx if a.strides[0] >= 0 else -idx, kind="stable")
    return region, idx, order, start, row


def _fancy_chunks(a: "PagedArray", region: Region, idx: np.ndarray, order: np.ndarray,  # type: ignore[type-arg,unused-ignore]
                  start: int, row: int, write: bool) -> Iterator[Tuple[np.ndarray, np.ndarray]]:  # type: ignore[type-arg,unused-ignore]
    """The chunks of a gather or scatter, in address order, a quarter of
    the budget each: (positions in the index array, their rows), each
    chunk's folios read in with Region.fetch first (write: as writes)."""
    chunk = max(16, int(region.stats()["budget_bytes"]) // (4 * region.folio))
    for c in range(0, idx.size, chunk):
        at = order[c:c + chunk]
        part = idx[at]
        first = start + part * a.strides[0]
        region.fetch(np.concatenate((first, first + (row - 1))).astype(np.uint64), write=write)
        yield at, part


def _gather(a: "PagedArray", index: Any) -> Optional[np.ndarray]:  # type: ignore[type-arg,unused-ignore]
    """``a[index]`` for a large integer index array (_fancy_rows says
    which): the indices in address order, in chunks of a quarter of the
    budget, each chunk's folios read in with Region.fetch (neighbouring
    folios as one read, a batch's reads in flight together: an object
    store's GETs, where numpy's gather would fault the folios in one at a
    time in index order, a round trip each), then gathered from memory
    into their places. None where it does not apply."""
    rows = _fancy_rows(a, index)
    if rows is None:
        return None
    region, idx, order, start, row = rows
    out = np.empty((idx.size,) + a.shape[1:], dtype=a.dtype)
    plain = a.view(np.ndarray)
    for at, part in _fancy_chunks(a, region, idx, order, start, row, write=False):
        out[at] = plain[part]
    return out


def _scatter(a: "PagedArray", index: Any, value: Any) -> bool:
    """``a[index] = value`` for a large integer index array (_fancy_rows
    says which) into a writable array, where the value broadcasts to the
    rows as it is and casts to the array's dtype within its kind: as
    _gather, chunk by chunk in address order, each chunk's folios read in
    with Region.fetch(write=True) — writable and dirty, as write faults
    would leave them, so the stores that follow fault no more — then the
    chunk's rows stored. Repeated indices: the last value wins, as in
    numpy (a stable sort keeps their order). False where it does not
    apply (numpy assigns as usual, errors included)."""
    rows = _fancy_rows(a, index)
    if rows is None or not a.flags.writeable:
        return False
    region, idx, order, start, row = rows
    if not region.writable:
        return False
    vals = np.asarray(value)
    if not np.can_cast(vals.dtype, a.dtype, casting="same_kind"):
        return False
    if np.may_share_memory(vals, a):
        vals = vals.copy()  # numpy reads all of it before it stores
    try:
        vals = np.broadcast_to(vals, (idx.size,) + a.shape[1:])
    except ValueError:
        return False
    plain = a.view(np.ndarray)
    same = vals.strides[0] == 0  # one row (or a scalar) for every index
    for at, part in _fancy_chunks(a, region, idx, order, start, row, write=True):
        plain[part] = vals[0] if same else vals[at]
    return True


def _spec(a: PagedArray) -> Optional[Dict[str, Any]]:
    """How to open `a` again in another process, or None if it cannot be
    (not a view of a region, closed, mode "c")."""
    m = a._mapping
    if m is None or m.closed or m.opened is None or a.mode == "c":
        return None
    if a.size == 0:
        return None
    lo, hi = _byte_bounds(a)
    base = m.region.address
    addr = a.__array_interface__["data"][0]
    return dict(
        m.opened,
        mode="r+" if a.mode == "w+" else a.mode,  # never truncate again
        dtype=a.dtype,
        shape=a.shape,
        strides=a.strides,
        low=m.opened["start"] + (lo - base),
        nbytes=hi - lo,
        first=addr - lo,
        filename=a.filename,
        offset=a.offset,
    )


def _reopen(spec: Dict[str, Any]) -> PagedArray:
    """Unpickles a PagedArray: maps the bytes it spans again (a pager of
    its own, with the same options) and views them as it did."""
    flat = _open(_Source(spec["path"]), np.uint8, (spec["nbytes"],), spec["mode"],
                 spec["low"], "C", spec["budget"], spec["folio"], spec["fault_mode"],
                 spec["store"], dict(spec["options"]))
    out = np.ndarray.__new__(PagedArray, spec["shape"], dtype=spec["dtype"], buffer=flat,
                             offset=spec["first"], strides=spec["strides"])
    if spec["mode"] == "r":
        out.flags.writeable = False
    out._mapping = flat._mapping
    out._mmap = flat._mmap
    out.filename = spec["filename"]
    out.offset = spec["offset"]
    out.mode = spec["mode"]
    return out


#: ``upager.memmap(filename, dtype, mode, offset, shape, order, *, budget)``:
#: numpy.memmap's twin (the class of the arrays it returns).
memmap = PagedArray


def _chunks(a: np.ndarray, nbytes: int = 8 << 20) -> Iterator[bytes]:
    """The bytes of `a` in C order, in pieces of about `nbytes`."""
    if a.ndim == 0 or a.size == 0:
        yield a.tobytes()
    elif a.flags.c_contiguous:
        flat = a.reshape(-1)
        step = max(1, nbytes // a.itemsize)
        for i in range(0, flat.size, step):
            yield flat[i:i + step].tobytes()
    else:
        for row in a:
            yield from _chunks(np.asarray(row), nbytes)


def _path(filename: Any) -> str:
    """A filename as numpy.memmap takes it, as a str path."""
    if hasattr(filename, "fileno") and hasattr(filename, "name") and not isinstance(
            filename, (str, bytes, os.PathLike)):
        filename = filename.name  # an open file, as numpy.memmap allows
    try:
        return os.fsdecode(os.fspath(filename))
    except TypeError:
        raise TypeError(
            "filename must be a str, bytes or os.PathLike path or an open file, "
            f"not {type(filename).__name__}"
        ) from None


#: URL schemes that name a store rather than a file: a Redis Cluster's
#: dataset, or an object of an S3-compatible store.
STORE_SCHEMES = ("redis-cluster://", "rediss-cluster://", "s3://")


def store_url(filename: Any) -> Optional[str]:
    """`filename` if it is a store URL (a str starting with one of
    :data:`STORE_SCHEMES`), else None."""
    if isinstance(filename, str) and filename.startswith(STORE_SCHEMES):
        return filename
    return None


def read_head(url: str, length: int, what: str) -> Tuple[bytes, int]:
    """The first `length` bytes (fewer if it is shorter) of the dataset or
    object `url` names, and its size: a file format's header, read before
    mapping the data after it. `what` names the format in a failure."""
    try:
        return read_store(url, 0, length)
    except OSError as e:
        raise type(e)(e.errno, f"cannot read the {what} header of {redact_url(url)}: "
                               f"{e.strerror}") from None


class _Source:
    """A file to map: ``path`` to open (its name, or /proc/self/fd/N for an
    open file object), ``name`` (absolute, for ``filename`` and pickling;
    None for a file object without one, like ``TemporaryFile()``) and the
    file object if one was given."""

    __slots__ = ("path", "name", "fileobj")

    def __init__(self, path: Optional[str], name: Optional[str] = None,
                 fileobj: Any = None) -> None:
        self.path = path
        self.name = name if name is not None or path is None or fileobj is not None \
            else os.path.abspath(path)
        self.fileobj = fileobj


def _source(filename: Any) -> _Source:
    """A filename or open file as numpy.memmap takes it. An open file is
    mapped through its descriptor (so a file without a name works), after
    moving to its end as numpy.memmap does, which flushes what Python still
    buffers."""
    if isinstance(filename, (str, bytes, os.PathLike)) or not (
            hasattr(filename, "read") or hasattr(filename, "fileno")):
        return _Source(_path(filename))
    try:
        fd = filename.fileno()
    except (AttributeError, OSError, ValueError) as e:
        raise TypeError(
            f"{type(filename).__name__} has no file descriptor to map ({e}): give a "
            "path or a file object of a real file") from None
    if hasattr(filename, "seek"):
        filename.seek(0, 2)  # numpy.memmap does this; it flushes Python's buffer
    elif hasattr(filename, "flush"):
        filename.flush()
    name = getattr(filename, "name", None)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    named = os.path.abspath(name) if isinstance(name, str) else None
    return _Source(f"/proc/self/fd/{fd}", named, filename)


def _mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(
            'mode must be one of "r", "r+", "w+", "c" (or "readonly", '
            f'"readwrite", "write", "copyonwrite"), got {mode!r}'
        )
    return MODES[mode]


def _shape(shape: Any) -> Optional[Tuple[int, ...]]:
    if shape is None:
        return None
    if isinstance(shape, str):
        raise TypeError(
            f"shape must be an int or a tuple of ints, got the string {shape!r}"
        )
    try:
        dims: Tuple[int, ...] = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(
                f"shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {dims} has a negative dimension")
    return dims


def _nbytes(dims: Tuple[int, ...], dtype: np.dtype) -> int:  # type: ignore[type-arg,unused-ignore]
    n = 1
    for d in dims:
        n *= d
    return n * dtype.itemsize


def open_array(path: Any, dtype: DTypeLike, shape: ShapeArg = None, mode: str = "r",
               *, budget: SizeArg = DEFAULT_BUDGET, offset: int = 0,
               folio: Optional[SizeArg] = None, order: str = "C",
               fault_mode: Optional[str] = None, store: Optional[str] = None,
               **pager_options: Any) -> PagedArray:
    """Opens a file as a numpy array paged under a hard memory budget.

    Arguments in the order (path, dtype, shape, mode) and mode "r" by
    default; :data:`upager.memmap` takes numpy.memmap's order (filename,
    dtype, mode, offset, shape, order) and mode "r+" by default. Both
    return a :class:`PagedArray`, and take the same keywords: see it for
    the modes, ``budget`` (bytes or a string like "256MiB"), ``fault_mode``
    and the rest.

    ``store``: a dataset on a Redis Cluster instead of a file, by URL
    ("redis-cluster://HOST:PORT/NAME"; ``path`` must then be None; a
    ``path`` that is such a URL is taken as ``store``). Mode
    "r"/"r+" maps a dataset uploaded with :func:`upload_dataset` (or
    ``upager load``); "w+" creates it (all zeros, sized to hold the array;
    NAME must not exist). The folio defaults to the dataset's chunk size
    (64 KiB unless it was uploaded with another); a folio given must be a
    multiple of it. ``flush()`` returns
    once every change is acknowledged by a replica. Or an existing object
    of an S3-compatible store, "s3://BUCKET/KEY" (credentials, region and
    endpoint from ``AWS_*`` variables or ``~/.aws``, as the AWS SDKs read
    them), read-only (mode "r"), in folios of 64 KiB unless one is given:
    a fault is one ranged GET, readahead many in flight. Or a read-write
    dataset on such a store, named by a prefix, "s3://BUCKET/NAME/"
    ("r", "r+", or "w+" to create it; group objects of 256 KiB, each
    write-back a conditional PUT, so a second writer of a group gets an
    error instead of losing the first one's writes; "r+" and "w+" map it
    in folios of its group, up to 1 MiB, unless one is given, so that a
    write-back never reads a group back first).

    The array keeps its region and pager alive; they are unmapped
    (flushing changes) when the last array using them goes.
    """
    if isinstance(shape, str) and shape in MODES:
        raise TypeError(
            f"open_array(path, dtype, shape, mode) got the mode {shape!r} as its "
            "shape: pass mode= by keyword, or use upager.memmap(filename, dtype, "
            "mode, offset, shape, order), which takes numpy.memmap's order"
        )
    if store is None and store_url(path) is not None:
        store, path = path, None
    if store is not None:
        if path is not None:
            raise ValueError(
                f"give a path or a store URL ({redact_url(store)}), not both: "
                "pass None as the path")
        src = _Source(None)
    else:
        src = _source(path)
    return _open(src, dtype, shape, mode, offset, order, budget, folio, fault_mode,
                 store, pager_options)


def _open(src: _Source, dtype: DTypeLike, shape: Any, mode: Any, offset: Any,
          order: Any, budget: Any, folio: Any, fault_mode: Any, store: Optional[str],
          pager_options: Dict[str, Any], cls: type = PagedArray) -> PagedArray:
    mode = _mode(mode)
    if order not in ("C", "F"):
        raise ValueError(f'order must be "C" or "F", got {order!r}')
    dt = np.dtype(dtype)
    if dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no size")
    if dt.hasobject:
        raise ValueError(f"dtype {dt} holds Python objects, which cannot be mapped")
    offset = operator.index(offset)
    if offset < 0:
        raise ValueError(f"offset must be at least 0, got {offset}")
    dims = _shape(shape)
    if mode == "w+" and dims is None:
        raise ValueError('mode "w+" needs a shape: it creates the file to hold the array')
    pager = Pager(budget=budget, folio=folio, fault_mode=fault_mode, **pager_options)
    sync_dir = None
    region: Optional[Region]
    try:
        if store is not None:
            region, dims = _map_store(pager, store, dt, dims, mode, offset)
            name = None
        else:
            region, dims, sync_dir = _map_file(pager, src, dt, dims, mode, offset)
            name = src.name
    finally:
        pager.close()  # the region keeps the pager's threads alive
    if region is None:  # an empty array: no bytes to map, as numpy.memmap allows
        arr = cast(PagedArray, np.ndarray.__new__(cls, dims, dtype=dt, order=order))
        if mode == "r":
            arr.flags.writeable = False
        arr.filename = name
        arr.offset = offset
        arr.mode = mode
        return arr
    delta = offset % region.folio
    # The array's base is a memoryview of the region (not another array), so
    # numpy stops there: np.asarray(a).base is a, as for numpy.memmap.
    arr = cast(PagedArray, np.ndarray.__new__(cls, dims, dtype=dt, buffer=memoryview(region),
                                              offset=delta, order=order))
    path = src.path if src.fileobj is None else src.name
    opened = None
    if path is not None or store is not None:
        opened = dict(path=path, store=store, start=offset - delta, budget=budget,
                      folio=folio, fault_mode=fault_mode, options=dict(pager_options))
    arr._mapping = _Mapping(region, opened, sync_dir)
    arr._mmap = region
    arr.filename = name
    arr.offset = offset
    arr.mode = mode
    return arr


def _size_from_file(size: int, dt: np.dtype, offset: int, what: str) -> Tuple[int, ...]:  # type: ignore[type-arg,unused-ignore]
    """The 1-D shape of the rest of `what` (`size` bytes) after `offset`."""
    if offset > size:
        raise ValueError(f"offset {offset} is beyond the end of {what} ({size} bytes)")
    rest = size - offset
    if rest % dt.itemsize:
        raise ValueError(
            f"the {rest} bytes of {what} after offset {offset} are not a multiple of "
            f"the {dt} item size ({dt.itemsize} bytes): give a shape, or check the "
            "dtype and the offset"
        )
    return (rest // dt.itemsize,)


def _check_nonempty(dims: Tuple[int, ...], dt: np.dtype) -> int:  # type: ignore[type-arg,unused-ignore]
    nbytes = _nbytes(dims, dt)
    if nbytes == 0:
        raise ValueError("the array would be empty: give a shape with at least one element")
    return nbytes


def _map_file(pager: Pager, src: _Source, dt: np.dtype,  # type: ignore[type-arg,unused-ignore]
              dims: Optional[Tuple[int, ...]], mode: str, offset: int
              ) -> Tuple[Optional[Region], Tuple[int, ...], Optional[str]]:
    """The region of the array (None for an empty one), its shape, and the
    directory to fsync at the first flush (of a file "w+" created)."""
    path = src.path
    assert path is not None
    sync_dir = None
    if mode == "w+":
        assert dims is not None
        if src.fileobj is None:  # numpy.memmap truncates a named file, not an open one
            with open(path, "w+b") as f:
                f.truncate(max(offset + _nbytes(dims, dt), 1))
            sync_dir = os.path.dirname(os.path.abspath(path))
        mode = "r+"
    if dims is None:
        size = os.stat(path).st_size
        if not stat.S_ISREG(os.stat(path).st_mode):
            # A block device (st_size 0), or what the pager refuses (a
            # directory: IsADirectoryError): the pager knows its size.
            probe = pager.map_file(path, mode="r" if mode == "r" else "r+")
            size = len(probe)
            probe.close()
        dims = _size_from_file(size, dt, offset, src.name or path)
    nbytes = _nbytes(dims, dt)
    st = os.stat(path)
    if mode == "r+" and stat.S_ISREG(st.st_mode):
        # numpy.memmap extends the file too (to one byte at least)
        if st.st_size < max(offset + nbytes, 1):
            os.truncate(path, max(offset + nbytes, 1))
    elif nbytes == 0 and stat.S_ISREG(st.st_mode) and st.st_size == 0:
        raise ValueError(f"cannot map an empty file ({src.name or path} has no bytes): "
                         'an empty array of mode "r" or "c" needs a file of one byte '
                         "at least, as for numpy.memmap")
    if nbytes == 0:
        return None, dims, sync_dir
    start = offset - offset % pager.folio  # regions start at a folio boundary
    region = pager.map_file(path, mode=cast(Literal["r", "r+", "c"], mode), offset=start,
                            length=offset - start + nbytes)
    return region, dims, sync_dir


def _map_store(pager: Pager, url: str, dt: np.dtype, dims: Optional[Tuple[int, ...]],  # type: ignore[type-arg,unused-ignore]
               mode: str, offset: int) -> Tuple[Region, Tuple[int, ...]]:
    if mode == "c":
        raise ValueError('mode "c" (copy-on-write) is for files; map a dataset with '
                         '"r", "r+" or "w+"')
    if url.startswith("s3://") and mode != "r" and not url.split("?")[0].endswith("/"):
        raise ValueError(
            f'{redact_url(url)}: an object of an S3 store maps read-only: use mode "r", '
            f'not {mode!r}; to change data on S3, make it a dataset, named by a prefix '
            "ending in '/' (upager load FILE s3://BUCKET/NAME/), and map that with \"r+\"")
    if mode == "w+":
        assert dims is not None
        # the pager's folio if one was given, else the store's default chunk
        create_dataset(url, offset + _nbytes(dims, dt), chunk=pager.folio_option)
        mode = "r+"
    smode = cast(Literal["r", "r+"], mode)
    whole = pager.map_store(url, mode=smode)
    size, folio = whole.size, whole.folio  # the dataset's chunk unless a folio was given
    try:
        if dims is None:
            dims = _size_from_file(size, dt, offset, redact_url(url))
        elif offset > size:
            raise ValueError(
                f"offset {offset} is beyond the end of {redact_url(url)} ({size} bytes)")
        nbytes = _check_nonempty(dims, dt)
    except BaseException:
        whole.close()
        raise
    start = offset - offset % folio
    length = offset - start + nbytes
    if start == 0 and length == size:
        # The whole of it (the usual case): the region mapped already (a
        # second map would open the store again: a connection and a HEAD).
        return whole, dims
    whole.close()
    region = pager.map_store(url, mode=smode, offset=start, length=length)
    return region, dims
