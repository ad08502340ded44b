""".npy files under a budget: :func:`load` is ``numpy.load(path,
mmap_mode=...)``'s twin, :func:`open_npy` ``numpy.lib.format.open_memmap``'s.

The header is read and written with numpy's own ``numpy.lib.format``; the
data is mapped at its offset, like numpy.memmap does for ``np.load(path,
mmap_mode="r")``, but paged under a hard memory budget.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
from numpy.lib import format as npformat
from numpy.typing import DTypeLike

from ._array import DEFAULT_BUDGET, MODES, PagedArray, SizeArg, _path, _shape

__all__ = ["load", "open_npy", "read_header"]

_ZIP_MAGIC = b"PK\x03\x04"


#: numpy.load's default limit on the header's length (its ``max_header_size``).
MAX_HEADER_SIZE = 10000


def read_header(path: Any, max_header_size: int = MAX_HEADER_SIZE
                ) -> Tuple[Tuple[int, ...], bool, np.dtype, int]:  # type: ignore[type-arg,unused-ignore]
    """(shape, fortran_order, dtype, data offset) of an .npy file, read with
    ``numpy.lib.format``. ValueError for what is no .npy file, holds Python
    objects (which cannot be mapped) or has a header longer than
    ``max_header_size`` (numpy.load's limit and default)."""
    name = _path(path)
    with open(name, "rb") as f:
        magic = f.read(len(_ZIP_MAGIC))
        if magic == _ZIP_MAGIC:
            raise ValueError(
                f"{name} is an .npz archive (a zip of .npy files), which cannot be "
                "mapped: extract its members (or save them with numpy.save) and "
                "load each .npy"
            )
        f.seek(0)
        try:
            version = npformat.read_magic(f)
        except ValueError as e:
            raise ValueError(f"{name} is not an .npy file ({e})") from None
        if version == (1, 0):
            shape, fortran_order, dtype = npformat.read_array_header_1_0(
                f, max_header_size=max_header_size)
        else:  # (2, 0) and (3, 0): a 4-byte header length
            shape, fortran_order, dtype = npformat.read_array_header_2_0(
                f, max_header_size=max_header_size)
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(
            f"{name} holds Python objects (dtype {dtype}), which cannot be mapped: "
            "use numpy.load(path, allow_pickle=True)"
        )
    return tuple(shape), bool(fortran_order), dtype, offset


def load(file: Any, mmap_mode: Optional[str] = "r", *, budget: SizeArg = DEFAULT_BUDGET,
         max_header_size: int = MAX_HEADER_SIZE, folio: Optional[SizeArg] = None,
         fault_mode: Optional[str] = None, **pager_options: Any) -> PagedArray:
    """Opens an .npy file as a :class:`PagedArray` under a hard budget: what
    ``numpy.load(file, mmap_mode=...)`` does with numpy.memmap.

    mmap_mode: "r" (the default), "r+" (changes reach the file) or "c"
    (copy-on-write), or their long names. ``None`` (numpy.load's default:
    read it all into memory) is refused: that is ``numpy.load(file)``.
    The array's shape, dtype and order are the header's; ``max_header_size``
    is numpy.load's. Other keywords as for :data:`upager.memmap`
    (``budget``, ``fault_mode``...).
    """
    if isinstance(mmap_mode, str) and "://" in mmap_mode:
        raise TypeError(
            "upager.load(file, mmap_mode) opens .npy files like numpy.load; to "
            "upload a file to a store as a dataset use "
            f"upager.upload_dataset(path, {mmap_mode!r})"
        )
    if mmap_mode is None:
        raise ValueError(
            "mmap_mode=None reads the whole file into memory: use numpy.load(file) "
            'for that; upager.load maps it with mmap_mode "r", "r+" or "c"'
        )
    mode = MODES.get(mmap_mode) if isinstance(mmap_mode, str) else None
    if mode == "w+":
        raise ValueError(
            'mmap_mode "w+" would erase the file: create a new one with '
            "upager.open_npy(path, mode=\"w+\", dtype=..., shape=...)"
        )
    if mode is None:
        raise ValueError(
            f'mmap_mode must be "r", "r+" or "c" (or their long names), got {mmap_mode!r}')
    name = _path(file)
    shape, fortran_order, dtype, offset = read_header(name, max_header_size)
    return _map(name, dtype, mode, offset, shape, fortran_order, budget, folio, fault_mode,
                pager_options)


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
    ``version``: the .npy format version to write, (1, 0) or (2, 0); None
    picks the oldest that holds the header, as numpy does.
    """
    name = _path(filename)
    m = MODES.get(mode) if isinstance(mode, str) else None
    if m is None:
        raise ValueError(
            f'mode must be "r", "r+", "w+" or "c" (or their long names), got {mode!r}')
    if m != "w+":
        return load(name, m, budget=budget, max_header_size=max_header_size, folio=folio,
                    fault_mode=fault_mode, **pager_options)
    if dtype is None or shape is None:
        raise ValueError('mode "w+" needs a dtype and a shape: it creates the file')
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError(f"dtype {dt} holds Python objects, which cannot be mapped")
    dims = _shape(shape)
    assert dims is not None
    header = {"descr": npformat.dtype_to_descr(dt), "fortran_order": bool(fortran_order),
              "shape": dims}
    count = 1
    for d in dims:
        count *= d
    with open(name, "wb") as f:
        if version == (1, 0):
            npformat.write_array_header_1_0(f, header)
        elif version == (2, 0):
            npformat.write_array_header_2_0(f, header)
        elif version is None:
            try:
                npformat.write_array_header_1_0(f, header)
            except ValueError:  # too big for version 1.0
                f.seek(0)
                f.truncate()
                npformat.write_array_header_2_0(f, header)
        else:
            raise ValueError(f"version must be (1, 0), (2, 0) or None, got {version!r}")
        offset = f.tell()
        f.truncate(offset + count * dt.itemsize)
    arr = _map(name, dt, "r+", offset, dims, fortran_order, budget, folio, fault_mode,
               pager_options)
    arr.mode = "w+"
    return arr


def _map(name: str, dtype: np.dtype, mode: str, offset: int, shape: Tuple[int, ...],  # type: ignore[type-arg,unused-ignore]
         fortran_order: bool, budget: Any, folio: Any, fault_mode: Any,
         pager_options: Any) -> PagedArray:
    if int(np.prod(shape, dtype=np.int64)) == 0:
        raise ValueError(f"{name} holds an empty array (shape {shape}): nothing to map; "
                         "numpy.load reads it")
    return PagedArray(name, dtype, mode, offset, shape, "F" if fortran_order else "C",
                      budget=budget, folio=folio, fault_mode=fault_mode, **pager_options)
