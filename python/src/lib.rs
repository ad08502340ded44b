//! `upager._upager`: the Python face of upager (pyo3).
//!
//! Classes `Pager`, `Region` and `Pin`, and the store functions; the
//! pure-Python part of the package adds `memmap` / `PagedArray` and
//! `open_array` (`upager/_array.py`), .npy files (`npy.py`) and safetensors
//! files (`safetensors.py`). `cow.rs`: the store of copy-on-write regions
//! (mode "c"). Stubs: `upager/_upager.pyi` (keep it in step).
//!
//! - Regions export their memory through the buffer protocol, so
//!   `numpy.frombuffer(region, dtype)` and `memoryview(region)` are
//!   zero-copy. Faults taken by numpy code are served by the pager's handler
//!   threads (fault mode "handlers") or in the faulting thread itself
//!   ("in-thread"), and never need the GIL.
//! - Blocking calls (map, flush, close/unmap, pageout, discard, waiting for
//!   prefetch) release the GIL.
//! - Closing: `Region.close()` refuses (BufferError) while buffer exports
//!   (numpy arrays, memoryviews) are alive, like the standard library's
//!   `mmap.close()`; it is idempotent, and a closed region raises
//!   ValueError instead of touching unmapped memory.
//!
//! unsafe: only the buffer protocol (`__getbuffer__`, which pyo3 declares
//! unsafe, and one `PyBuffer_FillInfo` call); everything else is safe pyo3.
#![deny(unsafe_code)]

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

mod cow;

use pyo3::exceptions::{PyBufferError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use pyo3::{ffi, IntoPyObjectExt};

use upager::{FaultMode, MapOptions, Pager, Region, Residency, Stats, WarmStart};
use upager_redis::{RedisOptions, RedisStore, StoreUrl};
use upager_stores::AnyUrl;

// ---------------------------------------------------------------------------
// Errors: invalid arguments are ValueError; system failures OSError with
// errno (so Python picks FileNotFoundError, PermissionError, ...).
// ---------------------------------------------------------------------------

fn os_error(errno: i32, msg: String) -> PyErr {
    PyOSError::new_err((errno, msg))
}

/// An engine error as a Python exception: bad arguments (EINVAL) are
/// ValueError, the rest OSError with the errno the C face reports too
/// (`upager::ErrorCode`), so Python picks FileNotFoundError, PermissionError...
fn engine_err(e: impl upager::ErrorCode) -> PyErr {
    let msg = upager::error_chain(&e);
    match e.errno() {
        upager::errno::EINVAL => PyValueError::new_err(msg),
        n => os_error(n, msg),
    }
}

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

/// A size given as an int (bytes) or a string like "64KiB", "8M", "1.5G",
/// at least `min` bytes.
fn size_arg_min(v: &Bound<'_, PyAny>, what: &str, min: u64) -> PyResult<u64> {
    let n = size_arg(v, what)?;
    if n < min {
        return Err(PyValueError::new_err(format!(
            "{what} must be at least {min} byte{}, got {n}",
            if min == 1 { "" } else { "s" }
        )));
    }
    Ok(n)
}

/// A size given as an int (bytes) or a string like "64KiB", "8M", "1.5G".
fn size_arg(v: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int or a size string like \"64KiB\", not bool"
        )));
    }
    if let Ok(s) = v.downcast::<PyString>() {
        let s = s.to_str()?;
        return upager::parse_size(s).map_err(|e| PyValueError::new_err(format!("{what}: {e}")));
    }
    match v.extract::<i128>() {
        Ok(n) if n >= 0 && n <= i128::from(u64::MAX) => Ok(n as u64),
        Ok(n) => Err(PyValueError::new_err(format!(
            "{what} is a number of bytes and cannot be negative, got {n}"
        ))),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what} must be an int or a size string like \"64KiB\", got {}",
            v.get_type().name()?
        ))),
    }
}

fn opt_size(v: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<u64>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => size_arg(v, what).map(Some),
    }
}

/// The fault mode a `fault_mode=` argument names: None (the default: the
/// builder reads UPAGER_FAULT_MODE, else handlers) or "handlers" /
/// "in-thread"; ValueError naming the choices for another string.
fn fault_mode_arg(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<FaultMode>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let s = v.downcast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "fault_mode must be \"handlers\", \"in-thread\" or None, not {}",
            v.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    s.to_str()?
        .parse::<FaultMode>()
        .map(Some)
        .map_err(|e| PyValueError::new_err(format!("fault_mode: {e}")))
}

/// A [`upager::PagerInfo`] as a dict (the names every face uses).
fn info_dict<'py>(py: Python<'py>, i: &upager::PagerInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("fault_mode", i.fault_mode.name())?;
    d.set_item("user_mode_only", i.user_mode_only)?;
    d.set_item("syscalls_fault_in", i.syscalls_fault_in())?;
    d.set_item("batched_unmap", i.batched_unmap)?;
    d.set_item("io_uring", i.io_uring)?;
    d.set_item("uffd_move", i.uffd_move)?;
    d.set_item("uffd_poison", i.uffd_poison)?;
    d.set_item("pagemap_scan", i.pagemap_scan)?;
    d.set_item("masked", i.masked.clone())?;
    Ok(d)
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, v) in s.iter() {
        d.set_item(name, v)?;
    }
    Ok(d)
}

// ---------------------------------------------------------------------------
// Pager
// ---------------------------------------------------------------------------

/// A demand pager with a hard memory budget.
///
/// Pager(budget="256MiB", folio="64KiB", *, batch=None, handler_threads=None,
///       readahead=None, swap_dir=None, direct_io=True, background_reclaim=True,
///       dirty_limit=None, fault_mode=None, dirty_expire=None, huge_runs=False,
///       readahead_async=True, warm=None, cache_dir=None, cache_size=None)
///
/// `cache_dir`, `cache_size`: the disk tier. What the read-only regions of
/// an S3 object fetch stays in `cache_dir` on local disk (default the
/// environment variable UPAGER_CACHE_DIR, else ~/.cache/upager/tier),
/// keyed by the object's ETag, for later faults, passes and runs; the
/// directory stays within `cache_size` bytes (default UPAGER_CACHE_SIZE,
/// else 20 GiB or half the disk's free space; 0 turns the tier off).
/// Counters `cache_hits`, `cache_misses`, `cache_hit_bytes`, ... in
/// `Region.store_counters()`; `upager cache list` shows what it holds.
///
/// `warm` ("off", the default, "auto" or "record"): warm starts for the
/// file and dataset regions this pager maps (each map call may say
/// otherwise). "auto": a region replays the trace kept with its data
/// (FILE.upager-trace beside a file; a key next to a Redis dataset) as
/// prefetch if the trace matches the data as it is now, else records the
/// order its folios are first needed and keeps it there at close.
/// "record": always record anew. Counters `replay_reads`, `replay_hits`,
/// `replay_wasted`; `upager trace FILE` shows a file's trace.
///
/// `readahead_async` (default True): once a sequential stream's readahead
/// window has grown to its largest, the prefetch thread reads the next
/// window on another CPU while the stream's own fault reads this one
/// (counter `readahead_async`). False: every window is read by the fault
/// that needs it.
///
/// `huge_runs` (default False): mixed folio sizes — a writable file region
/// of folios below 2 MiB (and at least 8 MiB) fills 2 MiB-aligned runs
/// that are read in sequence as one huge page each (counter `thp_fills`);
/// random faults keep the region's folio size. False: the folio size only.
///
/// `fault_mode`: "handlers" (the default: handler threads resolve faults)
/// or "in-thread" (the faulting thread resolves its own fault in a SIGBUS
/// handler: no handler-thread wakeup, the largest cost of a fault on a VM).
/// None: the environment variable UPAGER_FAULT_MODE, else "handlers". In
/// "in-thread" mode a system call that reads or writes a non-resident page
/// of a region fails with EFAULT (OSError) instead of faulting it in: file
/// I/O straight from or into region memory (`f.write(region)`,
/// `f.readinto(region)`, `array.tofile(f)`) needs `Region.fault_in` on the
/// range first, or a copy (`f.write(bytes(view))`). Enable `faulthandler`
/// before the first "in-thread" pager, not after, and do not disable it
/// later: either replaces upager's SIGBUS handler (the next fault ends the
/// process). Read back as `Pager.fault_mode`.
///
/// `dirty_limit` (default half the budget): most bytes of file data dirty at
/// once; writes beyond it wait for write-back, and a full disk stops writes
/// (SIGBUS) but not reads.
///
/// `dirty_expire` (seconds, default 5; 0 turns it off): file data dirty for
/// longer than this is written back in the background, so a process killed
/// without `flush()` (a `multiprocessing.Pool` worker terminated, SIGKILL,
/// `os._exit`) keeps every write older than this (plus a quarter of it).
///
/// Sizes are ints (bytes) or strings like "64KiB", "512M", "1.5G".
/// `folio` is the default folio size of the regions this pager maps.
/// Regions keep the pager's threads alive: closing the pager only stops
/// new mappings.
#[pyclass(module = "upager", name = "Pager", frozen)]
struct PyPager {
    pager: Mutex<Option<Arc<Pager>>>,
    /// The folio given when the pager was made; None: upager's default for
    /// each kind of region.
    folio: Option<u64>,
    budget: u64,
    /// What the kernel let the pager use (its fault mode among it), kept
    /// for after close().
    info: upager::PagerInfo,
    /// Where copy-on-write regions keep their private writes.
    swap_dir: std::path::PathBuf,
    direct_io: bool,
    /// The warm start of the file and dataset regions it maps, unless a
    /// map call says otherwise.
    warm: WarmStart,
}

/// Parses a `warm` argument: None (`default`), "off", "auto" or "record".
fn warm_arg(warm: Option<&str>, default: WarmStart) -> PyResult<WarmStart> {
    match warm {
        None => Ok(default),
        Some("off") => Ok(WarmStart::Off),
        Some("auto") => Ok(WarmStart::Auto),
        Some("record") => Ok(WarmStart::Record),
        Some(w) => Err(PyValueError::new_err(format!(
            "warm must be \"off\", \"auto\" or \"record\", got {w:?}"
        ))),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PyPager {
    fn get(&self) -> PyResult<Arc<Pager>> {
        lock(&self.pager)
            .clone()
            .ok_or_else(|| PyValueError::new_err("the pager is closed"))
    }
    fn opts(&self, folio: Option<&Bound<'_, PyAny>>) -> PyResult<MapOptions> {
        Ok(match opt_size(folio, "folio")?.or(self.folio) {
            Some(f) => MapOptions::new().folio(f),
            None => MapOptions::new(),
        })
    }

    /// Options of a mapping of part of a file or dataset: mode "r"/"r+",
    /// offset, length (default: to the end), folio.
    fn range_opts(
        &self,
        mode: &str,
        offset: u64,
        length: Option<&Bound<'_, PyAny>>,
        folio: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MapOptions> {
        let mut opts = self
            .opts(folio)?
            .writable(mode_writable(mode)? != Access::ReadOnly)
            .offset(offset);
        if let Some(l) = opt_size(length, "length")? {
            opts = opts.len(l);
        }
        Ok(opts)
    }
}

#[pymethods]
impl PyPager {
    #[new]
    #[pyo3(signature = (budget=None, folio=None, *, batch=None, handler_threads=None, readahead=None, swap_dir=None, direct_io=true, background_reclaim=true, dirty_limit=None, fault_mode=None, dirty_expire=None, huge_runs=false, readahead_async=true, warm=None, cache_dir=None, cache_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        budget: Option<&Bound<'_, PyAny>>,
        folio: Option<&Bound<'_, PyAny>>,
        batch: Option<usize>,
        handler_threads: Option<usize>,
        readahead: Option<&Bound<'_, PyAny>>,
        swap_dir: Option<std::path::PathBuf>,
        direct_io: bool,
        background_reclaim: bool,
        dirty_limit: Option<&Bound<'_, PyAny>>,
        fault_mode: Option<&Bound<'_, PyAny>>,
        dirty_expire: Option<f64>,
        huge_runs: bool,
        readahead_async: bool,
        warm: Option<&str>,
        cache_dir: Option<std::path::PathBuf>,
        cache_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let warm = warm_arg(warm, WarmStart::Off)?;
        let budget = opt_size(budget, "budget")?.unwrap_or(256 << 20);
        let folio_set = opt_size(folio, "folio")?;
        let folio = folio_set.unwrap_or(upager::DEFAULT_FOLIO);
        if !(folio.is_power_of_two() && (upager::MIN_FOLIO..=upager::MAX_FOLIO).contains(&folio)) {
            return Err(PyValueError::new_err(format!(
                "folio size {folio} is not a power of two between 4 KiB and 2 MiB"
            )));
        }
        if budget < folio {
            return Err(PyValueError::new_err(format!(
                "budget {budget} bytes is smaller than one folio ({folio} bytes): give a budget of at least {folio} bytes (in practice a few MiB or more: a budget holds several eviction batches), or a smaller folio"
            )));
        }
        let mut b = Pager::builder()
            .budget(budget)
            .direct_io(direct_io)
            .background_reclaim(background_reclaim)
            .huge_runs(huge_runs)
            .readahead_async(readahead_async);
        if let Some(n) = batch {
            b = b.batch(n);
        }
        if let Some(n) = handler_threads {
            b = b.handler_threads(n);
        }
        if let Some(r) = opt_size(readahead, "readahead")? {
            b = b.readahead(r);
        }
        if let Some(d) = &swap_dir {
            if !d.is_dir() {
                return Err(PyValueError::new_err(format!(
                    "swap_dir {} is not a directory: give an existing directory (anonymous and copy-on-write regions keep their private swap files there)",
                    d.display()
                )));
            }
            b = b.swap_dir(d);
        }
        if let Some(l) = opt_size(dirty_limit, "dirty_limit")? {
            b = b.dirty_limit(l);
        }
        if let Some(d) = cache_dir {
            b = b.cache_dir(d);
        }
        if let Some(n) = opt_size(cache_size, "cache_size")? {
            b = b.cache_size(n);
        }
        if let Some(m) = fault_mode_arg(fault_mode)? {
            b = b.fault_mode(m);
        }
        if let Some(secs) = dirty_expire {
            let age = std::time::Duration::try_from_secs_f64(secs).map_err(|_| {
                PyValueError::new_err(format!(
                    "dirty_expire must be seconds, 0 or more (0 turns the background writer off), got {secs}"
                ))
            })?;
            b = b.dirty_expire(age);
        }
        let pager = py.allow_threads(|| b.build()).map_err(engine_err)?;
        Ok(PyPager {
            info: pager.info(),
            pager: Mutex::new(Some(Arc::new(pager))),
            folio: folio_set,
            budget,
            swap_dir: swap_dir.unwrap_or_else(std::env::temp_dir),
            direct_io,
            warm,
        })
    }

    /// Maps a file: mode "r" (read-only, the default), "r+" (read-write;
    /// writes reach the file on eviction, flush() and close()) or "c"
    /// (copy-on-write: writable, but writes never reach the file; evicted
    /// changes go to a private swap file in the pager's `swap_dir` and are
    /// gone when the region is closed). `offset` must be a multiple of the
    /// folio size; `length` defaults to the rest of the file.
    #[pyo3(signature = (path, mode="r", offset=0, length=None, *, folio=None, warm=None))]
    #[allow(clippy::too_many_arguments)]
    fn map_file(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        mode: &str,
        offset: u64,
        length: Option<&Bound<'_, PyAny>>,
        folio: Option<&Bound<'_, PyAny>>,
        warm: Option<&str>,
    ) -> PyResult<PyRegion> {
        let cow = mode_writable(mode)? == Access::CopyOnWrite;
        let warm = warm_arg(warm, if cow { WarmStart::Off } else { self.warm })?;
        if cow && warm != WarmStart::Off {
            return Err(PyValueError::new_err(
                "warm starts are for modes \"r\" and \"r+\" (a copy-on-write region keeps no trace)",
            ));
        }
        let opts = self.range_opts(mode, offset, length, folio)?.warm(warm);
        let pager = self.get()?;
        let region = if cow {
            let (dir, direct) = (self.swap_dir.clone(), self.direct_io);
            py.allow_threads(move || {
                let store = cow::CopyOnWrite::open(&path, &dir, direct).map_err(|e| {
                    let errno = e.raw_os_error().unwrap_or(upager::errno::EIO);
                    os_error(errno, format!("{}: {e}", path.display()))
                })?;
                pager.map_store(Arc::new(store), &opts).map_err(engine_err)
            })?
        } else {
            py.allow_threads(move || pager.map_file(&path, &opts))
                .map_err(engine_err)?
        };
        Ok(PyRegion::new(
            region,
            format!("file, mode {mode:?}"),
            self.info.clone(),
        ))
    }

    /// Maps a dataset on a store by URL ("redis-cluster://HOST:PORT/NAME",
    /// uploaded with :func:`load` or `upager load`): mode "r" or "r+" as
    /// for :meth:`map_file`; the folio must be a multiple of the dataset's
    /// chunk size. Writes are acknowledged by a replica before memory is
    /// released, and ``flush()`` returns once every earlier write is
    /// replicated. Or an existing object of an S3-compatible store
    /// ("s3://BUCKET/KEY", credentials and endpoint as the AWS SDKs read
    /// them), read-only: mode "r", folio 64 KiB unless one is given.
    #[pyo3(signature = (url, mode="r", offset=0, length=None, *, folio=None, warm=None))]
    #[allow(clippy::too_many_arguments)]
    fn map_store(
        &self,
        py: Python<'_>,
        url: &str,
        mode: &str,
        offset: u64,
        length: Option<&Bound<'_, PyAny>>,
        folio: Option<&Bound<'_, PyAny>>,
        warm: Option<&str>,
    ) -> PyResult<PyRegion> {
        let warm = warm_arg(warm, self.warm)?;
        if mode_writable(mode)? == Access::CopyOnWrite {
            return Err(PyValueError::new_err(
                "mode \"c\" (copy-on-write) is for files; map a dataset with mode \"r\" or \"r+\"",
            ));
        }
        let opts = self.range_opts(mode, offset, length, folio)?.warm(warm);
        let pager = self.get()?;
        let url: AnyUrl = url.parse().map_err(engine_err)?;
        let kind = match &url {
            AnyUrl::S3(u) => format!("object {u}, mode {mode:?}"),
            AnyUrl::Redis(u) => format!("store {u}, mode {mode:?}"),
        };
        let region = py
            .allow_threads(move || upager_stores::map(&pager, &url, &opts))
            .map_err(engine_err)?;
        Ok(PyRegion::new(region, kind, self.info.clone()))
    }

    /// Maps `size` bytes of anonymous memory: zero-filled, writable, swapped
    /// to a private swap file when evicted, or, with ``store`` (a URL such
    /// as "redis-cluster://127.0.0.1:7000"), to that cluster (far memory;
    /// its keys are deleted when the region is closed).
    #[pyo3(signature = (size, *, folio=None, store=None))]
    fn anonymous(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        folio: Option<&Bound<'_, PyAny>>,
        store: Option<&str>,
    ) -> PyResult<PyRegion> {
        let size = size_arg_min(size, "size", 1)?;
        let opts = self.opts(folio)?;
        let pager = self.get()?;
        let url: Option<upager_stores::AnyUrl> =
            store.map(str::parse).transpose().map_err(engine_err)?;
        let kind = match &url {
            Some(u) => format!("anonymous on {u}"),
            None => "anonymous".into(),
        };
        let region = py.allow_threads(move || match &url {
            // Far memory: a Redis Cluster, or an S3 bucket or prefix.
            Some(u) => upager_stores::map_anonymous(&pager, u, size, &opts).map_err(engine_err),
            None => pager.map_anonymous(size, &opts).map_err(engine_err),
        })?;
        Ok(PyRegion::new(region, kind, self.info.clone()))
    }

    /// Counters as a dict, with the stable names shared by the C API and
    /// the `upager stat` command.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.get()?.stats())
    }

    /// The budget in bytes.
    #[getter]
    fn budget(&self) -> u64 {
        self.budget
    }

    /// The folio size of this pager's file and dataset regions unless a
    /// map call gives one: the pager's `folio`, else upager's default for
    /// files (4 KiB; a dataset's default is its chunk size, an anonymous
    /// region's 64 KiB).
    #[getter]
    fn folio(&self) -> u64 {
        self.folio.unwrap_or(upager::DEFAULT_FOLIO)
    }

    /// The `folio` given when the pager was made, or None (upager chooses
    /// for each kind of region).
    #[getter]
    fn folio_option(&self) -> Option<u64> {
        self.folio
    }

    /// How this pager resolves faults: "handlers" or "in-thread".
    #[getter]
    fn fault_mode(&self) -> &'static str {
        self.info.fault_mode.name()
    }

    /// What the kernel (and any seccomp filter) let this pager use, probed
    /// when it started, as a dict with the names every face uses:
    /// `fault_mode`; `user_mode_only` (an ordinary user's userfaultfd:
    /// system calls on non-resident region memory fail with EFAULT);
    /// `syscalls_fault_in`; `batched_unmap` (one TLB flush per eviction
    /// batch, else one per range); `io_uring`; `uffd_move`; `uffd_poison`;
    /// `pagemap_scan`; `masked` (features masked by UPAGER_MASK_FEATURES,
    /// for tests).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        info_dict(py, &self.info)
    }

    /// True after close().
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.pager).is_none()
    }

    /// Releases this handle (idempotent). Regions stay usable: they keep
    /// the pager's threads alive until the last one is closed.
    fn close(&self) {
        lock(&self.pager).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<upager.Pager budget={} folio={} fault_mode={}{}>",
            upager::format_size(self.budget),
            self.folio
                .map_or("default".to_string(), upager::format_size),
            self.info.fault_mode,
            if self.closed() { " closed" } else { "" }
        )
    }
}

// ---------------------------------------------------------------------------
// Region
// ---------------------------------------------------------------------------

/// A pinned range of a region (`Region.pin`): unpinned by `unpin()` or at
/// the end of a `with` block.
#[pyclass(module = "upager", name = "Pin", frozen)]
struct PyPin {
    pinned: Mutex<Option<(Arc<Region>, u64, u64)>>,
}

#[pymethods]
impl PyPin {
    /// Unpins the range (the folios become evictable again); a second call
    /// does nothing.
    fn unpin(&self, py: Python<'_>) -> PyResult<()> {
        let Some((r, o, l)) = lock(&self.pinned).take() else {
            return Ok(());
        };
        py.allow_threads(move || r.unpin(o, l)).map_err(engine_err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.unpin(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match &*lock(&self.pinned) {
            Some((_, o, l)) => format!("<upager.Pin offset={o} length={l}>"),
            None => "<upager.Pin unpinned>".into(),
        }
    }
}

/// A mapped region: `len(region)` bytes that fault in on first touch.
///
/// Supports the buffer protocol (`numpy.frombuffer(region, dtype)`,
/// `memoryview(region)`), writable for "r+", "c" and anonymous regions.
/// close() refuses with BufferError while arrays or memoryviews over the
/// region exist; delete them (or let them go) first.
#[pyclass(module = "upager", name = "Region", frozen)]
struct PyRegion {
    region: Mutex<Option<Arc<Region>>>,
    /// Live buffer exports (numpy arrays, memoryviews).
    exports: AtomicUsize,
    len: u64,
    folio: u64,
    writable: bool,
    kind: String,
    /// What its pager found the kernel lets it use (the fault mode too).
    info: upager::PagerInfo,
}

impl PyRegion {
    fn new(region: Region, kind: String, info: upager::PagerInfo) -> PyRegion {
        PyRegion {
            len: region.len() as u64,
            folio: region.folio_size(),
            writable: region.is_writable(),
            region: Mutex::new(Some(Arc::new(region))),
            exports: AtomicUsize::new(0),
            kind,
            info,
        }
    }
    fn get(&self) -> PyResult<Arc<Region>> {
        lock(&self.region)
            .clone()
            .ok_or_else(|| PyValueError::new_err("the region is closed"))
    }
    /// `(offset, length)` with the length defaulting to the rest.
    fn span(&self, offset: u64, length: Option<u64>) -> PyResult<(u64, u64)> {
        let len = match length {
            Some(l) => l,
            None => self.len.checked_sub(offset).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "offset {offset} is beyond the region's {} bytes",
                    self.len
                ))
            })?,
        };
        Ok((offset, len))
    }
}

fn residency_name(s: Residency) -> &'static str {
    match s {
        Residency::ResidentClean => "resident_clean",
        Residency::ResidentDirty => "resident_dirty",
        Residency::Evicted => "evicted",
        Residency::NeverTouched => "never_touched",
        _ => "busy",
    }
}

// The buffer protocol's methods are unsafe by pyo3's declaration.
#[allow(unsafe_code)]
#[pymethods]
impl PyRegion {
    fn __len__(&self) -> usize {
        self.len as usize
    }

    /// Length in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.len
    }

    /// Folio size in bytes.
    #[getter]
    fn folio(&self) -> u64 {
        self.folio
    }

    /// True for "r+", "c" and anonymous regions.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// Its pager's fault mode: "handlers" or "in-thread".
    #[getter]
    fn fault_mode(&self) -> &'static str {
        self.info.fault_mode.name()
    }

    /// True if system calls on non-resident pages of this region fault
    /// them in (`os.write(fd, memoryview(region))` works); False where they
    /// fail with EFAULT (fault mode "in-thread", or a user-mode-only
    /// userfaultfd: `Pager.info()`): use `fault_in` first, or copy out.
    #[getter]
    fn syscalls_fault_in(&self) -> bool {
        self.info.syscalls_fault_in()
    }

    /// True after close().
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.region).is_none()
    }

    /// Address of the first byte (for ctypes/cffi users).
    #[getter]
    fn address(&self) -> PyResult<usize> {
        Ok(self.get()?.as_ptr() as usize)
    }

    /// Number of live buffer exports (arrays, memoryviews) over the region.
    #[getter]
    fn exports(&self) -> usize {
        self.exports.load(Ordering::SeqCst)
    }

    /// Writes dirty data back and makes the file durable (fdatasync): when
    /// this returns, the file holds every write made before the call.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let r = self.get()?;
        py.allow_threads(move || {
            let res = r.flush();
            drop(r);
            res
        })
        .map_err(engine_err)
    }

    /// Flushes and unmaps, releasing all memory. Idempotent. Raises
    /// BufferError (and leaves the region open) while numpy arrays or
    /// memoryviews over it exist; OSError if writing back fails (the region
    /// stays open: fix the cause and close again).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut r = {
            let mut g = lock(&self.region);
            let n = self.exports.load(Ordering::SeqCst);
            if n > 0 && g.is_some() {
                return Err(PyBufferError::new_err(format!(
                    "cannot close the region: {n} buffer export(s) (numpy arrays or memoryviews) still use it; delete them first"
                )));
            }
            match g.take() {
                Some(r) => r,
                None => return Ok(()),
            }
        };
        // A flush or advice call on another thread may hold the region for
        // a moment: wait for it, without the GIL.
        let res = py.allow_threads(move || loop {
            match Arc::try_unwrap(r) {
                Ok(region) => break region.unmap().map_err(|(e, region)| (e, Arc::new(region))),
                Err(again) => {
                    r = again;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        match res {
            Ok(()) => Ok(()),
            Err((e, region)) => {
                *lock(&self.region) = Some(region);
                Err(engine_err(e))
            }
        }
    }

    /// Counters of the region's pager (dict), and of its store where the
    /// store keeps its own (`store_*`: an S3 object or dataset, a Redis
    /// Cluster dataset: requests and bytes on the wire).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.get()?;
        let d = stats_dict(py, &r.pager_stats())?;
        for (name, v) in r.store_counters() {
            d.set_item(name, v)?;
        }
        Ok(d)
    }

    /// Runs of equal residency over [offset, offset+length) as a list of
    /// (start, end, state) with state one of "resident_clean",
    /// "resident_dirty", "evicted", "never_touched", "busy". No I/O.
    #[pyo3(signature = (offset=0, length=None))]
    fn residency(
        &self,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Vec<(u64, u64, &'static str)>> {
        let (o, l) = self.span(offset, length)?;
        let runs = self.get()?.residency(o, l).map_err(engine_err)?;
        Ok(runs
            .into_iter()
            .map(|(r, s)| (r.start, r.end, residency_name(s)))
            .collect())
    }

    /// mincore(2)-shaped residency: bytes, one per 4 KiB page, 1 = resident.
    #[pyo3(signature = (offset=0, length=None))]
    fn mincore<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let (o, l) = self.span(offset, length)?;
        let v = self.get()?.mincore(o, l).map_err(engine_err)?;
        Ok(pyo3::types::PyBytes::new(py, &v))
    }

    /// Writes back and evicts the range now (like MADV_PAGEOUT); returns the
    /// number of folios evicted.
    #[pyo3(signature = (offset=0, length=None))]
    fn pageout(&self, py: Python<'_>, offset: u64, length: Option<u64>) -> PyResult<u64> {
        let (o, l) = self.span(offset, length)?;
        let r = self.get()?;
        py.allow_threads(move || r.pageout(o, l))
            .map_err(engine_err)
    }

    /// Drops the clean folios the range touches, so the next access reads
    /// the file: how this region sees what another region or process wrote
    /// and flushed after this one read it (close-to-open consistency).
    /// Dirty and pinned folios stay. Returns the number dropped.
    #[pyo3(signature = (offset=0, length=None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, length: Option<u64>) -> PyResult<u64> {
        let (o, l) = self.span(offset, length)?;
        let r = self.get()?;
        py.allow_threads(move || r.invalidate(o, l))
            .map_err(engine_err)
    }

    /// Starts filling the range in the background (like MADV_WILLNEED);
    /// with wait=True, returns when the prefetch has finished.
    #[pyo3(signature = (offset=0, length=None, *, wait=false))]
    fn prefetch(
        &self,
        py: Python<'_>,
        offset: u64,
        length: Option<u64>,
        wait: bool,
    ) -> PyResult<()> {
        let (o, l) = self.span(offset, length)?;
        let r = self.get()?;
        r.prefetch(o, l).map_err(engine_err)?;
        if wait {
            let done = py.allow_threads(move || r.wait_prefetch(Duration::from_secs(60)));
            if !done {
                return Err(PyOSError::new_err((
                    110,
                    "prefetch still running after 60 s",
                )));
            }
        }
        Ok(())
    }

    /// Reads the folios holding the bytes at `offsets` (a buffer of uint64,
    /// e.g. a numpy array, or a sequence of ints) in now, in this thread,
    /// in batches whose reads go to the store together (an object store's
    /// GETs in flight at once, where faults one at a time would each wait
    /// a round trip). Resident folios are skipped; any order, repeats
    /// allowed; makes room for them first (up to half the budget), then
    /// stops early rather than evict more than a batch per batch, so keep
    /// a call's folios well under the budget. Returns the folios read.
    /// PagedArray's fancy indexing calls it for large index arrays.
    /// write=True: the caller is about to write the bytes at every offset
    /// (a scatter, `a[idx] = v`): the folios go in writable and dirty, as
    /// write faults' would, so the writes fault no more (under the dirty
    /// limit, as write faults are; a folio named but not written is
    /// written back unchanged).
    #[pyo3(signature = (offsets, *, write=false))]
    fn fetch(&self, py: Python<'_>, offsets: &Bound<'_, PyAny>, write: bool) -> PyResult<u64> {
        let offs: Vec<u64> = match pyo3::buffer::PyBuffer::<u64>::get(offsets) {
            Ok(b) => b.to_vec(py)?,
            Err(_) => offsets.extract()?,
        };
        let r = self.get()?;
        if write {
            py.allow_threads(move || r.fetch_for_write(&offs))
                .map_err(engine_err)
        } else {
            py.allow_threads(move || r.fetch(&offs)).map_err(engine_err)
        }
    }

    /// Makes [offset, offset+length) resident now, in the calling thread, as
    /// faults there would (write=True: as write faults, the folios become
    /// dirty), without touching the memory; any offset and length. For
    /// system calls on region memory in fault mode "in-thread", where they
    /// fail with EFAULT on a non-resident page: fault the range in, then
    /// make the call (`f.write(memoryview(region)[a:b])`). Nothing pins the
    /// range: keep it well under the budget and retry a call that fails
    /// with EFAULT. Works in both modes.
    #[pyo3(signature = (offset=0, length=None, *, write=false))]
    fn fault_in(
        &self,
        py: Python<'_>,
        offset: u64,
        length: Option<u64>,
        write: bool,
    ) -> PyResult<()> {
        let (o, l) = self.span(offset, length)?;
        let r = self.get()?;
        py.allow_threads(move || r.fault_in(o, l, write))
            .map_err(engine_err)
    }

    /// Pins the range: makes it resident (write=True: writable, as write
    /// faults would) and keeps it so until unpinned, so it can be passed to
    /// system calls in either fault mode and is never evicted meanwhile.
    /// Returns a `Pin`, a context manager that unpins on exit:
    /// `with region.pin(0, 1 << 20): f.write(memoryview(region)[:1 << 20])`.
    /// Pinned bytes count against the budget; at most half of it can be
    /// pinned (beyond that: OSError ENOMEM, nothing pinned).
    #[pyo3(signature = (offset=0, length=None, *, write=false))]
    fn pin(
        &self,
        py: Python<'_>,
        offset: u64,
        length: Option<u64>,
        write: bool,
    ) -> PyResult<PyPin> {
        let (o, l) = self.span(offset, length)?;
        let r = self.get()?;
        let held = r.clone();
        py.allow_threads(move || r.pin(o, l, write))
            .map_err(engine_err)?;
        Ok(PyPin {
            pinned: Mutex::new(Some((held, o, l))),
        })
    }

    /// Drops the range's contents (like MADV_DONTNEED): anonymous memory
    /// reads as zero again; a file range is read from the file again.
    /// Writes not yet flushed or evicted in the range are lost.
    #[pyo3(signature = (offset=0, length=None))]
    fn discard(&self, py: Python<'_>, offset: u64, length: Option<u64>) -> PyResult<()> {
        let (o, l) = self.span(offset, length)?;
        let r = self.get()?;
        py.allow_threads(move || r.discard(o, l))
            .map_err(engine_err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<upager.Region {} {} folio={} fault_mode={}{}>",
            self.kind,
            upager::format_size(self.len),
            upager::format_size(self.folio),
            self.info.fault_mode,
            if self.closed() { " closed" } else { "" }
        )
    }

    /// Buffer protocol: exports the region's memory, one-dimensional
    /// unsigned bytes, read-only unless the region is writable.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let g = lock(&this.region);
        let Some(r) = g.as_ref() else {
            return Err(PyValueError::new_err("the region is closed"));
        };
        if flags & ffi::PyBUF_WRITABLE != 0 && !r.is_writable() {
            return Err(PyBufferError::new_err(
                "the region is read-only (mapped with mode=\"r\"); map it with mode=\"r+\" to write",
            ));
        }
        let len =
            isize::try_from(r.len()).map_err(|_| PyBufferError::new_err("region too large"))?;
        // SAFETY: `view` is the Py_buffer CPython passed to bf_getbuffer,
        // valid for writes; `slf` is a live object (FillInfo takes a new
        // reference to it in view->obj, released by PyBuffer_Release).
        // The memory is the region's mapping of `len` bytes, which stays
        // mapped while exports > 0: close() refuses until
        // __releasebuffer__ has brought the count back to 0, and the region
        // is never unmapped elsewhere while this object holds it.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                r.as_ptr().cast(),
                len,
                c_int::from(!r.is_writable()),
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        this.exports.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a map mode asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// "r"
    ReadOnly,
    /// "r+": writes reach the file or dataset.
    ReadWrite,
    /// "c": writable, writes kept privately (files only).
    CopyOnWrite,
}

/// The access a map mode asks for: "r", "r+" or "c".
fn mode_writable(mode: &str) -> PyResult<Access> {
    match mode {
        "r" => Ok(Access::ReadOnly),
        "r+" => Ok(Access::ReadWrite),
        "c" => Ok(Access::CopyOnWrite),
        m => Err(PyValueError::new_err(format!(
            "mode must be \"r\" (read-only), \"r+\" (read-write) or \"c\" (copy-on-write), got {m:?}"
        ))),
    }
}

/// Reads up to `length` bytes at `offset` of a dataset or object by URL,
/// without mapping it (a file format's header, before the region that
/// maps its data): returns the bytes (fewer at the end; none past it) and
/// the dataset's or object's size.
#[pyfunction]
fn read_store(
    py: Python<'_>,
    url: &str,
    offset: u64,
    length: usize,
) -> PyResult<(Py<pyo3::types::PyBytes>, u64)> {
    let shown = upager_redis::url::redact(url);
    let url: AnyUrl = url.parse().map_err(engine_err)?;
    let (buf, size) = py.allow_threads(move || -> PyResult<(Vec<u8>, u64)> {
        let st = upager_stores::open(&url).map_err(engine_err)?;
        let size = st.len();
        let n = (size.saturating_sub(offset)).min(length as u64) as usize;
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match st.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(os_error(
                        e.raw_os_error().unwrap_or(upager::errno::EIO),
                        format!("{shown}: reading {n} bytes at {offset}: {e}"),
                    ))
                }
            }
        }
        buf.truncate(got);
        Ok((buf, size))
    })?;
    Ok((pyo3::types::PyBytes::new(py, &buf).unbind(), size))
}

/// Uploads the file at `path` as a new dataset on a store, named by `url`
/// ("redis-cluster://HOST:PORT/NAME"; NAME must not exist), in chunks of
/// `chunk` bytes (one key each; regions that map it use a folio of this
/// size or a multiple). `progress(done, total)` is called after each batch
/// if given. Returns the bytes uploaded.
#[pyfunction]
#[pyo3(signature = (path, url, *, chunk=None, replicas=1, progress=None))]
fn upload_dataset(
    py: Python<'_>,
    path: std::path::PathBuf,
    url: &str,
    chunk: Option<&Bound<'_, PyAny>>,
    replicas: usize,
    progress: Option<Py<PyAny>>,
) -> PyResult<u64> {
    let url: StoreUrl = url.parse().map_err(engine_err)?;
    let chunk = opt_size(chunk, "chunk")?.unwrap_or(upager_redis::DEFAULT_CHUNK);
    let opts = RedisOptions {
        replicas,
        ..RedisOptions::default()
    };
    let mut cb_err = None;
    let n = py.allow_threads(|| {
        upager_redis::upload(&path, &url, chunk, &opts, &mut |done, total| {
            if let (Some(cb), None) = (&progress, &cb_err) {
                if let Err(e) = Python::with_gil(|py| cb.call1(py, (done, total))) {
                    cb_err = Some(e);
                }
            }
        })
    });
    if let Some(e) = cb_err {
        return Err(e);
    }
    n.map_err(engine_err)
}

/// Creates an empty dataset (all zeros) of `size` bytes in chunks of
/// `chunk` bytes on a store, named by `url` (NAME must not exist): what
/// ``open_array(None, ..., mode="w+", store=url)`` maps.
#[pyfunction]
#[pyo3(signature = (url, size, *, chunk=None))]
fn create_dataset(
    url: &str,
    size: &Bound<'_, PyAny>,
    chunk: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let size = size_arg(size, "size")?;
    if upager_stores::AnyUrl::is_s3(url) {
        // An S3 dataset (s3://BUCKET/NAME/): `chunk` is its group size.
        let url: upager_s3::S3Url = url.parse().map_err(engine_err)?;
        let group = opt_size(chunk, "chunk")?.unwrap_or(upager_s3::dataset::DEFAULT_GROUP);
        let env = upager_s3::config::ProcessEnv;
        upager_s3::dataset::create(&url, size, group, &upager_s3::S3Options::default(), &env)
            .map_err(engine_err)?;
        return Ok(());
    }
    let url: StoreUrl = url.parse().map_err(engine_err)?;
    let chunk = opt_size(chunk, "chunk")?.unwrap_or(upager_redis::DEFAULT_CHUNK);
    RedisStore::create(&url, size, chunk, &RedisOptions::default()).map_err(engine_err)?;
    Ok(())
}

/// Removes a dataset (every key) from a store, named by `url`, complete or
/// not (an interrupted upload).
#[pyfunction]
fn delete_dataset(url: &str) -> PyResult<()> {
    if upager_stores::AnyUrl::is_s3(url) {
        let url: upager_s3::S3Url = url.parse().map_err(engine_err)?;
        let env = upager_s3::config::ProcessEnv;
        upager_s3::dataset::delete(&url, &upager_s3::S3Options::default(), &env)
            .map_err(engine_err)?;
        return Ok(());
    }
    let url: StoreUrl = url.parse().map_err(engine_err)?;
    upager_redis::delete(&url, &RedisOptions::default(), &mut |_, _| {}).map_err(engine_err)?;
    Ok(())
}

/// The datasets on the cluster `url` names, sorted by name: a list of
/// dicts with "name", "size", "chunk" and "complete" (False: an upload
/// running, interrupted or killed; it does not open; delete_dataset
/// removes it).
#[pyfunction]
fn list_datasets(py: Python<'_>, url: &str) -> PyResult<Vec<Py<PyAny>>> {
    let url: StoreUrl = url.parse().map_err(engine_err)?;
    let all = py
        .allow_threads(|| upager_redis::list(&url, &RedisOptions::default()))
        .map_err(engine_err)?;
    all.into_iter()
        .map(|d| {
            let o = PyDict::new(py);
            o.set_item("name", d.name)?;
            o.set_item("size", d.len)?;
            o.set_item("chunk", d.chunk)?;
            o.set_item("complete", d.complete)?;
            Ok(o.into_any().unbind())
        })
        .collect()
}

/// `url` with the password of its credentials written `***` (for
/// messages that quote a store URL; the same rule as the Rust side).
#[pyfunction]
fn redact_url(url: &str) -> String {
    upager_redis::url::redact(url)
}

/// Parses a size string ("64KiB", "8M", "1.5G") or int into bytes.
#[pyfunction]
fn parse_size(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    size_arg(v, "size")
}

/// Rebuilds a fork child's pagers if the C library's fork handlers did not
/// (`upager::after_fork`: idempotent). `upager` registers it with
/// `os.register_at_fork(after_in_child=...)`.
#[pyfunction]
fn after_fork() {
    upager::after_fork();
}

/// The module.
#[pymodule]
fn _upager(m: &Bound<'_, PyModule>) -> PyResult<()> {
    upager::log_to_stderr();
    m.add_class::<PyPager>()?;
    m.add_class::<PyRegion>()?;
    m.add_class::<PyPin>()?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(upload_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(create_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(delete_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(list_datasets, m)?)?;
    m.add_function(wrap_pyfunction!(redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(read_store, m)?)?;
    m.add("STAT_NAMES", Stats::NAMES.to_vec())?;
    m.add("DEFAULT_FOLIO", upager::DEFAULT_FOLIO)?;
    m.add(
        "FAULT_MODES",
        (FaultMode::Handlers.name(), FaultMode::InThread.name()),
    )?;
    m.add("FAULT_MODE_ENV", FaultMode::ENV)?;
    m.add(
        "__version__",
        env!("CARGO_PKG_VERSION").into_py_any(m.py())?,
    )?;
    Ok(())
}
