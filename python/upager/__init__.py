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

Or as ``numpy.memmap`` with a hard budget: ``upager.memmap`` takes
numpy.memmap's arguments in its order (plus ``budget``), and
``upager.load`` / ``upager.open_npy`` are ``numpy.load(path, mmap_mode=)``
and ``numpy.lib.format.open_memmap`` for .npy files::

    a = upager.memmap("big.f64", dtype=np.float64, mode="r+", budget="256MiB")
    a[:] += 1
    a.flush()
    w = upager.load("weights.npy", mmap_mode="r", budget="256MiB")

Model weights in safetensors files: ``upager.safetensors.open(path,
budget=...)`` gives each tensor as a numpy view into one region.

Processes: a ``fork`` child (``os.fork``, :mod:`multiprocessing`'s
"fork" start method) can use every file-backed array and region it
inherited, at the same addresses: before ``fork()`` returns in the child,
upager starts a pager of its own there for each of the parent's (same
options, a budget of the same size, new threads) and maps each file region
again, cold. The parent's writes made before the fork are flushed first, so
the child sees them; later writes of either process reach the other
through the file (flush, eviction) as with ``numpy.memmap``'s shared
mapping. Anonymous regions, mode "c" arrays and dataset (store) arrays are
not inherited: touching them in the child raises SIGSEGV. A pickled
PagedArray (a :mod:`multiprocessing` argument under any start method,
``concurrent.futures.ProcessPoolExecutor``) carries its path or store URL,
mode, dtype, shape, strides, offset and pager options, and the receiving
process opens it again (a pager of its own, with the same budget)::

    a = upager.memmap(path, np.float64, mode="r+", shape=(rows, cols))

    def work(a, lo, hi):
        a[lo:hi] = compute(lo, hi)   # a is opened again here
        a.flush()

    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.starmap(work, [(a, lo, hi) for lo, hi in blocks])

Several processes writing one file (or several arrays over it): no write
is lost, wherever their blocks begin and end. Once a file is mapped
writable more than once, upager keeps a copy (twin) of each folio at its
first write and writes back only the bytes that changed (counters
``twins_made``, ``diff_writebacks``); each process sees another's writes
once that one has flushed and it reads the folio again
(``Region.invalidate``).

joblib: ``joblib.Parallel`` sends upager arrays the same way (workers map
the file, nothing is copied), under its "loky" and "multiprocessing"
backends; flush before the call for the workers to see your writes.

Closing a region (or dropping the last array over it) behaves like munmap for
other threads still using it: they see the right data or get SIGSEGV.

Fault mode: ``fault_mode="handlers"`` (handler threads resolve faults) or
``"in-thread"`` (the faulting thread resolves its own fault in a SIGBUS
handler upager installs; no handler-thread wakeup, the largest cost of a
fault on a VM), on :class:`Pager`, :data:`memmap` and :func:`open_array`;
when not given, the environment variable ``UPAGER_FAULT_MODE`` chooses,
else upager: "handlers" where the process may have a userfaultfd that
serves system calls (root, or access to /dev/userfaultfd), "in-thread"
where it may not (an ordinary user: no setup is needed, upager opens a
user-mode-only userfaultfd, which Linux allows every process).
``Pager.info()`` says which (``user_mode_only``, ``syscalls_fault_in``) and
what else the kernel allowed. Where ``Region.syscalls_fault_in`` is False, a
system call that reads or writes a non-resident page of a region fails with
EFAULT (``OSError``) instead of faulting it in: before file I/O straight
from or into region memory (``f.write(region)``, ``f.readinto(region)``,
``array.tofile(f)``) call ``Region.fault_in`` on the range (and retry on
EFAULT: nothing pins it), or copy first (``f.write(a.tobytes())``;
``PagedArray.tofile`` and ``numpy.save`` of a PagedArray do it for you, in
chunks). upager's SIGBUS handler must stay
installed: enable :mod:`faulthandler` before the first "in-thread" pager
(``python -X faulthandler``; pytest does). Enabling or disabling it later
replaces upager's handler: faults end the process with SIGBUS until upager
installs its handler again, which it does when it maps the next region::

    a = upager.memmap("big.f64", np.float64, mode="r", budget="256MiB",
                      fault_mode="in-thread")
    a.region.fault_in(0, 1 << 20)          # before a system call on it

Requirements: Linux 5.11+ (x86-64; docs/kernels.md's feature table says what
each newer kernel adds), no privilege. Counters (``Pager.stats()``) use the same stable names
as the C API and the ``upager stat`` command.
"""

import os

from . import safetensors
from ._array import MODES, PagedArray, memmap, open_array
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
    parse_size,
    upload_dataset,
)
from .npy import load, open_npy
from ._upager import after_fork as _after_fork

# The C library's fork handlers rebuild a child's pagers already (before
# fork() returns there); this idempotent call is the belt to those braces,
# for a child made by something that bypasses them.
os.register_at_fork(after_in_child=_after_fork)

__all__ = [
    "Pager",
    "Pin",
    "Region",
    "PagedArray",
    "memmap",
    "open_array",
    "load",
    "open_npy",
    "safetensors",
    "parse_size",
    "upload_dataset",
    "create_dataset",
    "delete_dataset",
    "list_datasets",
    "MODES",
    "STAT_NAMES",
    "DEFAULT_FOLIO",
    "FAULT_MODES",
    "FAULT_MODE_ENV",
    "__version__",
]
