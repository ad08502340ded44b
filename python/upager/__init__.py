"""upager: arrays and buffers larger than memory, under a hard budget.

A :class:`Pager` owns a memory budget; regions it maps (files or anonymous
memory) are ordinary memory that faults in on first touch and is evicted in
batches when the budget is full, dirty pages written back first. Regions
support the buffer protocol, so numpy works on them without copying::

    import numpy as np, upager
    with upager.Pager(budget="256MiB") as pager:
        region = pager.map_file("big.f64", mode="r+")
        a = np.frombuffer(region, dtype=np.float64)   # zero-copy
        a *= 2.0                                      # never above 256 MiB
        region.flush()                                # durable (fdatasync)
        del a
        region.close()

Or, like ``numpy.memmap`` with a hard budget::

    a = upager.open_array("big.f64", np.float64, (1 << 30,), mode="r+",
                          budget="256MiB")
    a[:] += 1
    a.flush()

Processes: regions are not inherited by ``fork`` (a forked child gets
SIGSEGV when it touches one). With :mod:`multiprocessing`, use the "spawn"
or "forkserver" start method and open the array again in the child (pass
the path, not the array)::

    def work(path):
        a = upager.open_array(path, np.float64, budget="256MiB")
        return float(a[::4096].sum())

    with multiprocessing.get_context("spawn").Pool(4) as pool:
        print(pool.map(work, [path] * 4))

Closing a region (or dropping the last array over it) behaves like munmap for
other threads still using it: they see the right data or get SIGSEGV.

Fault mode: ``fault_mode="handlers"`` (the default: handler threads resolve
faults) or ``"in-thread"`` (the faulting thread resolves its own fault in a
SIGBUS handler upager installs; no handler-thread wakeup, the largest cost
of a fault on a VM), on :class:`Pager` and :func:`open_array`; when not
given, the environment variable ``UPAGER_FAULT_MODE`` chooses, else
"handlers". In "in-thread" mode a system call that reads or writes a
non-resident page of a region fails with EFAULT (``OSError``) instead of
faulting it in: before file I/O straight from or into region memory
(``f.write(region)``, ``f.readinto(region)``, ``array.tofile(f)``) call
``Region.fault_in`` on the range (and retry on EFAULT: nothing pins it), or
copy first (``f.write(bytes(view))``). upager's SIGBUS handler must stay
installed: enable :mod:`faulthandler` before the first "in-thread" pager
(``python -X faulthandler``; pytest does). Enabling or disabling it later
replaces upager's handler: faults end the process with SIGBUS until upager
installs its handler again, which it does when it maps the next region::

    a = upager.open_array("big.f64", np.float64, budget="256MiB",
                          fault_mode="in-thread")
    a.region.fault_in(0, 1 << 20)          # before a system call on it

Requirements: Linux 6.16+, access to /dev/userfaultfd (root, or the
device's permissions). Counters (``Pager.stats()``) use the same stable names
as the C API and the ``upager stat`` command.
"""

import operator
import os
import stat

import numpy as np

from ._upager import (
    DEFAULT_FOLIO,
    FAULT_MODE_ENV,
    FAULT_MODES,
    STAT_NAMES,
    Pager,
    Pin,
    Region,
    __version__,
    create_dataset,
    delete_dataset,
    list_datasets,
    load,
    parse_size,
)

__all__ = [
    "Pager",
    "Pin",
    "Region",
    "PagedArray",
    "open_array",
    "parse_size",
    "load",
    "create_dataset",
    "delete_dataset",
    "list_datasets",
    "STAT_NAMES",
    "DEFAULT_FOLIO",
    "FAULT_MODES",
    "FAULT_MODE_ENV",
    "__version__",
]


class PagedArray(np.ndarray):
    """A numpy array over a upager region, returned by :func:`open_array`.

    Behaves like ``numpy.memmap``: an ndarray whose memory is paged in on
    demand under the pager's budget. ``flush()`` writes changes back to the
    file; ``region`` and ``pager_stats()`` give access to the region.
    Results of computations that do not share its memory (reductions,
    ``a + 1``) are plain ndarrays or scalars.
    """

    def __array_finalize__(self, obj):
        self.region = getattr(obj, "region", None)

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        arr = super().__array_wrap__(arr, context, return_scalar)
        if arr is self or type(self) is not PagedArray:
            return arr
        # A new array (not a view of the region): plain ndarray or scalar.
        if return_scalar:
            return arr[()]
        return arr.view(np.ndarray)

    def __getitem__(self, index):
        res = super().__getitem__(index)
        if type(res) is PagedArray and res.region is None:
            return res.view(np.ndarray)
        return res

    def flush(self):
        """Writes changes back to the file and makes it durable."""
        if self.region is not None:
            self.region.flush()

    def pager_stats(self):
        """Counters of the pager behind this array (dict)."""
        if self.region is None:
            raise ValueError("this array is not backed by a upager region")
        return self.region.stats()


def _shape(shape):
    if shape is None:
        return None
    try:
        dims = (operator.index(shape),)
    except TypeError:
        dims = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {dims} has a negative dimension")
    return dims


def open_array(path, dtype, shape=None, mode="r", *, budget="256MiB", offset=0,
               folio=None, order="C", fault_mode=None, store=None, **pager_options):
    """Opens a file as a numpy array paged under a hard memory budget.

    Like ``numpy.memmap(path, dtype, mode, offset, shape, order)``, but the
    pages in memory never exceed ``budget`` (bytes or a string like
    "256MiB"), whatever the file size.

    mode: "r" read-only, "r+" read-write, "w+" create or overwrite the file
    (sized to hold the array; needs ``shape``). ``shape=None`` uses the rest
    of the file as a 1-D array. ``offset`` is in bytes and need not be
    aligned. ``fault_mode``: "handlers" or "in-thread" (None: the
    environment variable ``UPAGER_FAULT_MODE``, else "handlers"; see the
    module's documentation: in "in-thread" mode, system calls on
    non-resident parts of the array fail with EFAULT). Extra keyword
    arguments go to :class:`Pager` (``batch``, ``handler_threads``,
    ``readahead``...).

    ``store``: a dataset on a Redis Cluster instead of a file, by URL
    ("redis-cluster://HOST:PORT/NAME"; ``path`` must then be None). Mode
    "r"/"r+" maps a dataset uploaded with :func:`load` (or ``upager
    load``); "w+" creates it (all zeros, sized to hold the array; NAME must
    not exist). The folio defaults to the pager's (64 KiB), which must be a
    multiple of the dataset's chunk size. ``flush()`` returns once every
    change is acknowledged by a replica.

    The returned :class:`PagedArray` keeps its region and pager alive; they
    are unmapped (flushing changes) when the last array using them goes.
    Call ``flush()`` to make changes durable earlier.
    """
    if mode not in ("r", "r+", "w+"):
        raise ValueError(f'mode must be "r", "r+" or "w+", got {mode!r}')
    if order not in ("C", "F"):
        raise ValueError(f'order must be "C" or "F", got {order!r}')
    dtype = np.dtype(dtype)
    if dtype.itemsize == 0:
        raise ValueError(f"dtype {dtype} has no size")
    offset = operator.index(offset)
    if offset < 0:
        raise ValueError(f"offset must be at least 0, got {offset}")
    dims = _shape(shape)
    if store is not None:
        return _open_store_array(path, store, dtype, dims, mode, budget, offset,
                                 folio, order, fault_mode, pager_options)
    path = os.fspath(path)
    if mode == "w+":
        if dims is None:
            raise ValueError('mode "w+" needs a shape')
        nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        with open(path, "w+b") as f:
            f.truncate(offset + nbytes)
        mode = "r+"
    pager = Pager(budget=budget, folio=folio, fault_mode=fault_mode, **pager_options)
    if dims is None:
        size = os.stat(path).st_size
        if not stat.S_ISREG(os.stat(path).st_mode):
            # A block device (st_size 0), or what the pager refuses (a
            # directory: IsADirectoryError): the pager knows its size.
            probe = pager.map_file(path, mode=mode)
            size = len(probe)
            probe.close()
        if offset > size:
            raise ValueError(f"offset {offset} is beyond the end of {path} ({size} bytes)")
        dims = ((size - offset) // dtype.itemsize,)
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        raise ValueError("the array would be empty: give a shape with at least one element")
    # Regions start at a folio boundary; numpy.memmap aligns the same way.
    start = offset - offset % pager.folio
    delta = offset - start
    region = pager.map_file(path, mode=mode, offset=start, length=delta + nbytes)
    pager.close()  # the region keeps the pager's threads alive
    flat = np.frombuffer(region, dtype=dtype, count=count, offset=delta)
    arr = flat.reshape(dims, order=order).view(PagedArray)
    arr.region = region
    return arr


def _open_store_array(path, url, dtype, dims, mode, budget, offset, folio, order,
                      fault_mode, pager_options):
    """open_array over a dataset on a store (``store=url``)."""
    if path is not None:
        raise ValueError(
            f"give a path or a store URL ({url}), not both: pass None as the path")
    pager = Pager(budget=budget, folio=folio, fault_mode=fault_mode, **pager_options)
    try:
        if mode == "w+":
            if dims is None:
                raise ValueError('mode "w+" needs a shape')
            nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
            create_dataset(url, offset + nbytes, chunk=pager.folio)
            mode = "r+"
        whole = pager.map_store(url, mode=mode)
        size = whole.size
        whole.close()
        if offset > size:
            raise ValueError(f"offset {offset} is beyond the end of {url} ({size} bytes)")
        if dims is None:
            dims = ((size - offset) // dtype.itemsize,)
        count = int(np.prod(dims, dtype=np.int64))
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            raise ValueError("the array would be empty: give a shape with at least one element")
        start = offset - offset % pager.folio
        delta = offset - start
        region = pager.map_store(url, mode=mode, offset=start, length=delta + nbytes)
    finally:
        pager.close()  # the region keeps the pager's threads alive
    flat = np.frombuffer(region, dtype=dtype, count=count, offset=delta)
    arr = flat.reshape(dims, order=order).view(PagedArray)
    arr.region = region
    return arr
