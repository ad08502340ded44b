# Type stubs of the extension module (python/src/lib.rs), checked with mypy
# by python/tests/test_packaging.py. Keep them in step with lib.rs.
import os
from types import TracebackType
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple, Type, Union

from typing_extensions import Buffer as _Buffer

_Size = Union[int, str]
_Path = Union[str, "os.PathLike[str]"]
_Mode = Literal["r", "r+", "c"]
_FaultMode = Literal["handlers", "in-thread"]
_Warm = Literal["off", "auto", "record"]
_State = Literal["resident_clean", "resident_dirty", "evicted", "never_touched", "busy"]

__version__: str
DEFAULT_FOLIO: int
FAULT_MODE_ENV: str
FAULT_MODES: Tuple[str, str]
STAT_NAMES: List[str]

class Pager:
    """A demand pager with a hard memory budget."""

    def __init__(
        self,
        budget: Optional[_Size] = None,
        folio: Optional[_Size] = None,
        *,
        batch: Optional[int] = None,
        handler_threads: Optional[int] = None,
        readahead: Optional[_Size] = None,
        swap_dir: Optional[_Path] = None,
        direct_io: bool = True,
        background_reclaim: bool = True,
        dirty_limit: Optional[_Size] = None,
        fault_mode: Optional[_FaultMode] = None,
        dirty_expire: Optional[float] = None,
        huge_runs: bool = False,
        readahead_async: bool = True,
        warm: Optional[_Warm] = None,
        cache_dir: Optional[_Path] = None,
        cache_size: Optional[_Size] = None,
    ) -> None: ...
    def map_file(
        self,
        path: _Path,
        mode: _Mode = "r",
        offset: int = 0,
        length: Optional[_Size] = None,
        *,
        folio: Optional[_Size] = None,
        warm: Optional[_Warm] = None,
    ) -> Region: ...
    def map_store(
        self,
        url: str,
        mode: Literal["r", "r+"] = "r",
        offset: int = 0,
        length: Optional[_Size] = None,
        *,
        folio: Optional[_Size] = None,
        warm: Optional[_Warm] = None,
    ) -> Region: ...
    def anonymous(
        self, size: _Size, *, folio: Optional[_Size] = None, store: Optional[str] = None
    ) -> Region: ...
    def stats(self) -> Dict[str, int]: ...
    def info(self) -> Dict[str, Any]: ...
    @property
    def budget(self) -> int: ...
    @property
    def folio(self) -> int: ...
    @property
    def folio_option(self) -> Optional[int]: ...
    @property
    def fault_mode(self) -> _FaultMode: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Pager: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Region(_Buffer):
    """A mapped region: len(region) bytes that fault in on first touch."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    @property
    def size(self) -> int: ...
    @property
    def folio(self) -> int: ...
    @property
    def writable(self) -> bool: ...
    @property
    def fault_mode(self) -> _FaultMode: ...
    @property
    def syscalls_fault_in(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def address(self) -> int: ...
    @property
    def exports(self) -> int: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    def residency(
        self, offset: int = 0, length: Optional[int] = None
    ) -> List[Tuple[int, int, _State]]: ...
    def mincore(self, offset: int = 0, length: Optional[int] = None) -> bytes: ...
    def pageout(self, offset: int = 0, length: Optional[int] = None) -> int: ...
    def invalidate(self, offset: int = 0, length: Optional[int] = None) -> int: ...
    def prefetch(
        self, offset: int = 0, length: Optional[int] = None, *, wait: bool = False
    ) -> None: ...
    def fetch(self, offsets: Any, *, write: bool = False) -> int: ...
    def fault_in(
        self, offset: int = 0, length: Optional[int] = None, *, write: bool = False
    ) -> None: ...
    def pin(
        self, offset: int = 0, length: Optional[int] = None, *, write: bool = False
    ) -> Pin: ...
    def discard(self, offset: int = 0, length: Optional[int] = None) -> None: ...
    def __enter__(self) -> Region: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Pin:
    """A pinned range of a region (Region.pin)."""

    def unpin(self) -> None: ...
    def __enter__(self) -> Pin: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def parse_size(v: _Size) -> int: ...
def after_fork() -> None: ...
def upload_dataset(
    path: _Path,
    url: str,
    *,
    chunk: Optional[_Size] = None,
    replicas: int = 1,
    progress: Optional[Callable[[int, int], object]] = None,
) -> int: ...
def create_dataset(url: str, size: _Size, *, chunk: Optional[_Size] = None) -> None: ...
def delete_dataset(url: str) -> None: ...
def list_datasets(url: str) -> List[Dict[str, Union[str, int, bool]]]: ...
def redact_url(url: str) -> str: ...
def read_store(url: str, offset: int, length: int) -> Tuple[bytes, int]: ...
