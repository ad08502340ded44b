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

from ._upager import Pager, Region, create_dataset, redact_url

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

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
ShapeArg = Union[int, Tuple[int, ...], None]
SizeArg = Union[int, str]


class _Mapping:
    """What every array over one region shares: the region, whether the
    arrays were closed, and how it was opened (for pickling: ``path`` or
    ``store``, ``mode``, ``start`` the file offset of the region's first
    byte, and the pager's options)."""

    __slots__ = ("region", "closed", "opened", "__weakref__")

    def __init__(self, region: Region, opened: Optional[Dict[str, Any]] = None) -> None:
        self.region = region
        self.closed = False
        self.opened = opened


class PagedArray(np.ndarray):  # type: ignore[type-arg,unused-ignore]
    """A numpy array whose memory is a upager region: ``numpy.memmap`` with
    a hard memory budget.

    ``upager.memmap`` is this class; construct it with numpy.memmap's
    arguments, in numpy.memmap's order::

        a = upager.memmap("big.f64", dtype=np.float64, mode="r+", shape=(n,),
                          budget="256MiB")

    filename: str, bytes, os.PathLike, or an open file (its ``name``).
    dtype: default uint8. mode: "r" / "readonly", "r+" / "readwrite" (the
    default), "w+" / "write" (create or overwrite; needs ``shape``), "c" /
    "copyonwrite" (writable, the file never changes). offset: bytes, any
    value. shape: int or tuple; None maps the rest of the file as a 1-D
    array (its size must be a multiple of the dtype's). order: "C" or "F".
    As with numpy.memmap, "r+" and "w+" extend a file shorter than
    ``offset`` plus the array.

    upager's own keywords: ``budget`` (bytes or a string like "256MiB";
    default 256 MiB), ``folio`` (default 4 KiB: a random access reads and
    writes back 4 KiB, a sequential pass is read a readahead window at a
    time; a larger folio writes back only the 4 KiB page written first),
    ``fault_mode`` ("handlers" or "in-thread", default the environment
    variable UPAGER_FAULT_MODE, else "in-thread" where the kernel gives
    this process a user-mode-only userfaultfd, else "handlers"),
    ``store`` (a dataset's URL instead of a file), and any option of
    :class:`Pager` (``batch``, ``readahead``, ``swap_dir``...).

    Views (slices, ``.T``, ``reshape`` without a copy) are PagedArrays over
    the same region; results that are new arrays (``copy()``, fancy
    indexing, ``astype``, ``np.sort``, ufuncs, reductions) are plain ndarrays
    or scalars and do not keep the region, as with numpy.memmap.

    Processes: a fork child uses the arrays it inherited (a pager of its
    own, started before ``fork()`` returns there; mode "c" and dataset
    arrays excepted). Pickling (multiprocessing arguments under any start
    method) sends where the array is: path or store URL, mode ("w+" as
    "r+"), dtype, shape, strides, offset and the pager's options; unpickling
    opens it again with a pager of its own. Mode "c" arrays pickle their
    data, as numpy.memmap's do.

    Attributes: ``filename`` (absolute path; a resolved ``pathlib.Path``
    when given one, as numpy.memmap; None for a store), ``offset``,
    ``mode`` (the short name), ``region`` (the :class:`Region`; None once
    closed or for arrays that are not views of one), ``closed``.
    """

    filename: Union[str, pathlib.Path, None]
    offset: int
    mode: Optional[str]
    _mapping: Optional[_Mapping]

    # numpy.memmap's: results of mixed operations take the other operand's
    # type.
    __array_priority__ = -100.0

    def __new__(
        cls,
        filename: Any,
        dtype: DTypeLike = np.uint8,
        mode: str = "r+",
        offset: int = 0,
        shape: ShapeArg = None,
        order: str = "C",
        *,
        budget: SizeArg = DEFAULT_BUDGET,
        folio: Optional[SizeArg] = None,
        fault_mode: Optional[str] = None,
        store: Optional[str] = None,
        **pager_options: Any,
    ) -> "PagedArray":
        if store is not None:
            path = None
            if filename is not None:
                raise ValueError(
                    f"give a filename or a store URL ({redact_url(store)}), not both: "
                    "pass None as the filename"
                )
        else:
            path = _path(filename)
        arr = _open(path, dtype, shape, mode, offset, order, budget, folio,
                    fault_mode, store, pager_options)
        if isinstance(filename, pathlib.Path):
            arr.filename = filename.resolve()  # as numpy.memmap keeps it
        return arr

    # -- keeping the region only in views ---------------------------------

    def __array_finalize__(self, obj: Any) -> None:
        mapping = getattr(obj, "_mapping", None)
        if mapping is not None and np.may_share_memory(self, obj):
            self._mapping = mapping
            self.filename = obj.filename
            self.offset = obj.offset
            self.mode = obj.mode
        else:
            self._mapping = None
            self.filename = None
            self.offset = 0
            self.mode = None

    def __array_wrap__(self, arr: Any, context: Any = None,
                       return_scalar: bool = False) -> Any:
        if _NUMPY2:
            arr = super().__array_wrap__(arr, context, return_scalar)
        else:  # numpy 1.x: no return_scalar
            arr = super().__array_wrap__(arr, context)
        if isinstance(arr, PagedArray) and arr._mapping is None:
            # numpy 2 says when a scalar is wanted; numpy 1.x hands 0-d
            # results of reductions over here (numpy.memmap's rule).
            if return_scalar or (not _NUMPY2 and arr.shape == ()):
                return arr[()]
            return arr.view(np.ndarray)
        return arr

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _plain(super().__array_function__(func, types, args, kwargs))

    def __getitem__(self, index: Any) -> Any:
        return _plain(super().__getitem__(index))

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
        m.region.flush()

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
            m.region.flush()
        m.region.pageout()
        m.closed = True
        self.flags.writeable = False

    def __enter__(self) -> "PagedArray":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def pager_stats(self) -> Dict[str, int]:
        """Counters of the pager behind this array."""
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
    flat = _open(spec["path"], np.uint8, (spec["nbytes"],), spec["mode"], spec["low"],
                 "C", spec["budget"], spec["folio"], spec["fault_mode"], spec["store"],
                 dict(spec["options"]))
    arr = np.ndarray(spec["shape"], dtype=spec["dtype"], buffer=flat,
                     offset=spec["first"], strides=spec["strides"])
    if spec["mode"] == "r":
        arr.flags.writeable = False
    out = cast(PagedArray, arr.view(PagedArray))
    out._mapping = flat._mapping
    out.filename = spec["filename"]
    out.offset = spec["offset"]
    out.mode = spec["mode"]
    return out


def _plain(res: Any) -> Any:
    """`res` with every PagedArray that is not a view of a region turned
    into a plain ndarray (tuples and lists of results too)."""
    if isinstance(res, PagedArray):
        return res.view(np.ndarray) if res._mapping is None else res
    if isinstance(res, tuple):
        return tuple(_plain(r) for r in res)
    if isinstance(res, list):
        return [_plain(r) for r in res]
    return res


def _plain_method(name: str) -> Any:
    base = getattr(np.ndarray, name)

    def method(self: PagedArray, *args: Any, **kwargs: Any) -> Any:
        return _plain(base(self, *args, **kwargs))

    method.__name__ = name
    method.__qualname__ = f"PagedArray.{name}"
    method.__doc__ = base.__doc__
    return method


# ndarray methods that return new arrays (or, like ravel and reshape,
# sometimes views): their copies come back as plain ndarrays.
for _name in ("copy", "astype", "flatten", "ravel", "reshape", "repeat", "take",
              "compress", "choose", "diagonal", "squeeze", "transpose",
              "swapaxes", "argsort", "argpartition", "nonzero", "searchsorted",
              "dot", "round", "conj", "conjugate", "byteswap", "newbyteorder",
              "__copy__", "__deepcopy__"):
    if hasattr(np.ndarray, _name):
        setattr(PagedArray, _name, _plain_method(_name))
del _name

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
    ("redis-cluster://HOST:PORT/NAME"; ``path`` must then be None). Mode
    "r"/"r+" maps a dataset uploaded with :func:`upload_dataset` (or
    ``upager load``); "w+" creates it (all zeros, sized to hold the array;
    NAME must not exist). The folio defaults to the dataset's chunk size
    (64 KiB unless it was uploaded with another); a folio given must be a
    multiple of it. ``flush()`` returns
    once every change is acknowledged by a replica.

    The array keeps its region and pager alive; they are unmapped
    (flushing changes) when the last array using them goes.
    """
    if isinstance(shape, str) and shape in MODES:
        raise TypeError(
            f"open_array(path, dtype, shape, mode) got the mode {shape!r} as its "
            "shape: pass mode= by keyword, or use upager.memmap(filename, dtype, "
            "mode, offset, shape, order), which takes numpy.memmap's order"
        )
    if store is not None:
        if path is not None:
            raise ValueError(
                f"give a path or a store URL ({redact_url(store)}), not both: "
                "pass None as the path")
        fpath = None
    else:
        fpath = _path(path)
    return _open(fpath, dtype, shape, mode, offset, order, budget, folio, fault_mode,
                 store, pager_options)


def _open(path: Optional[str], dtype: DTypeLike, shape: Any, mode: Any, offset: Any,
          order: Any, budget: Any, folio: Any, fault_mode: Any, store: Optional[str],
          pager_options: Dict[str, Any]) -> PagedArray:
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
    try:
        if store is not None:
            region, dims = _map_store(pager, store, dt, dims, mode, offset)
            name = None
        else:
            assert path is not None
            region, dims = _map_file(pager, path, dt, dims, mode, offset)
            name = os.path.abspath(path)
    finally:
        pager.close()  # the region keeps the pager's threads alive
    count = _nbytes(dims, dt) // dt.itemsize
    delta = offset % region.folio
    flat = np.frombuffer(memoryview(region), dtype=dt, count=count, offset=delta)
    arr = cast(PagedArray, flat.reshape(dims, order=order).view(PagedArray))
    opened = dict(path=path, store=store, start=offset - delta, budget=budget,
                  folio=folio, fault_mode=fault_mode, options=dict(pager_options))
    arr._mapping = _Mapping(region, opened)
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


def _map_file(pager: Pager, path: str, dt: np.dtype, dims: Optional[Tuple[int, ...]],  # type: ignore[type-arg,unused-ignore]
              mode: str, offset: int) -> Tuple[Region, Tuple[int, ...]]:
    if mode == "w+":
        assert dims is not None
        with open(path, "w+b") as f:
            f.truncate(offset + _nbytes(dims, dt))
        mode = "r+"
    if dims is None:
        size = os.stat(path).st_size
        if not stat.S_ISREG(os.stat(path).st_mode):
            # A block device (st_size 0), or what the pager refuses (a
            # directory: IsADirectoryError): the pager knows its size.
            probe = pager.map_file(path, mode="r" if mode == "r" else "r+")
            size = len(probe)
            probe.close()
        dims = _size_from_file(size, dt, offset, path)
    nbytes = _check_nonempty(dims, dt)
    if mode == "r+" and stat.S_ISREG(os.stat(path).st_mode):
        size = os.stat(path).st_size
        if size < offset + nbytes:  # numpy.memmap extends the file too
            with open(path, "r+b") as f:
                f.truncate(offset + nbytes)
    start = offset - offset % pager.folio  # regions start at a folio boundary
    region = pager.map_file(path, mode=cast(Literal["r", "r+", "c"], mode), offset=start,
                            length=offset - start + nbytes)
    return region, dims


def _map_store(pager: Pager, url: str, dt: np.dtype, dims: Optional[Tuple[int, ...]],  # type: ignore[type-arg,unused-ignore]
               mode: str, offset: int) -> Tuple[Region, Tuple[int, ...]]:
    if mode == "c":
        raise ValueError('mode "c" (copy-on-write) is for files; map a dataset with '
                         '"r", "r+" or "w+"')
    if mode == "w+":
        assert dims is not None
        # the pager's folio if one was given, else the store's default chunk
        create_dataset(url, offset + _nbytes(dims, dt), chunk=pager.folio_option)
        mode = "r+"
    smode = cast(Literal["r", "r+"], mode)
    whole = pager.map_store(url, mode=smode)
    size, folio = whole.size, whole.folio  # the dataset's chunk unless a folio was given
    whole.close()
    if dims is None:
        dims = _size_from_file(size, dt, offset, redact_url(url))
    elif offset > size:
        raise ValueError(
            f"offset {offset} is beyond the end of {redact_url(url)} ({size} bytes)")
    nbytes = _check_nonempty(dims, dt)
    start = offset - offset % folio
    region = pager.map_store(url, mode=smode, offset=start, length=offset - start + nbytes)
    return region, dims
