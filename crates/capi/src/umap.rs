//! LLNL UMap's C API (`include/umap/umap.h`) over one process-wide pager.
//!
//! Configuration comes from UMap's environment variables, read once at the
//! first call of any `umap*` function (as UMap reads them when its
//! singleton is created):
//!
//! | variable | UMap meaning, default | upager |
//! |---|---|---|
//! | `UMAP_PAGESIZE` | page size in bytes, system page size | the folio size (power of two, 4 KiB..2 MiB) |
//! | `UMAP_BUFSIZE` | buffer size in pages, 90 % of available memory | the hard budget: pages × page size; any size works |
//! | `UMAP_PAGE_FILLERS` | filler threads, CPUs | fault-handler threads (1..64) |
//! | `UMAP_PAGE_EVICTORS` | evictor threads, CPUs | reported only: one reclaimer thread plus direct reclaim |
//! | `UMAP_EVICT_HIGH_WATER_THRESHOLD` / `_LOW_` | % of the buffer where eviction starts / stops, 90 / 70 | their difference sets the eviction batch in bytes (capped at 4 MiB and 1024 pages: one TLB shootdown per batch), the same for a region of larger pages (a store's, `UPAGER_UMAP_STORE`) |
//! | `UMAP_MAX_FAULT_EVENTS` | fault messages read at once, 256 | reported only |
//! | `UMAP_READ_AHEAD` | pages read ahead of every fault, 0 | largest readahead (pages) on sequential faults; unset = upager's adaptive 2 MiB |
//! | `UMAP_LOG_LEVEL` | ERROR/WARNING/INFO/DEBUG, INFO (on stdout) | same names, default WARNING, on stderr |
//! | `UPAGER_FAULT_MODE` | (upager's own) | `handlers` (default) or `in-thread`: read by the engine's builder default when the pager is created; a name that is no mode makes `umap()` fail with EINVAL |
//! | `UPAGER_WARM` | (upager's own) | warm starts of `umap()` file regions: `off` (default), `on` (replay the trace beside the file, `FILE.upager-trace`, if it matches the file, else record one, written at `uunmap`; not at exit), `record` (always record anew) |
//! | `UPAGER_UMAP_STORE` | (upager's own) | `PATH=URL[;PATH=URL...]`: a `umap()` of the file at PATH pages from the store URL names instead (`redis-cluster://HOST:PORT/NAME`, `s3://BUCKET/KEY`, `s3://BUCKET/NAME/`), the file (the data uploaded from it, or a placeholder of its size) only naming it; see [`store_for`] |
//!
//! Regions live in a table keyed by their address; `uunmap` writes dirty
//! data back and releases the memory; regions still mapped at `exit()` are
//! flushed by an `atexit` handler (file writes persist, as with
//! `MAP_SHARED`).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_long, c_void};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use engine::{MapOptions, Pager, Region};
use upager_stores::AnyUrl;

use crate::error::{self, Failure};
use crate::native;

/// `struct umap_prefetch_item`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct umap_prefetch_item {
    /// Address of a page (any address inside it works).
    pub page_base_addr: *mut c_void,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Error = 0,
    Warning = 1,
    Info = 2,
    Debug = 3,
}

/// The UMap knobs, as read from the environment.
#[derive(Debug)]
struct Config {
    page_size: u64,
    /// Whether UMAP_PAGESIZE was given (else a store region gets its
    /// store's default page, [`upager_stores::default_folio`]).
    page_size_set: bool,
    buf_pages: u64,
    fillers: u64,
    evictors: u64,
    high: c_int,
    low: c_int,
    max_fault_events: u64,
    /// UMAP_READ_AHEAD in pages; None = upager's adaptive default.
    read_ahead: Option<u64>,
    level: Level,
    /// UPAGER_WARM: record and replay the order file regions' pages are
    /// first needed.
    warm: engine::WarmStart,
    /// UPAGER_UMAP_STORE: files whose data a store serves, or why the
    /// variable names none (then every `umap()` of a file fails: a
    /// placeholder's zeros must not be served as the data).
    stores: Result<Vec<(PathBuf, AnyUrl)>, String>,
}

/// Parses `UPAGER_UMAP_STORE`: `PATH=URL` entries separated by `;` (a PATH
/// holds no `=`; blank entries are skipped).
fn parse_stores(v: &str) -> Result<Vec<(PathBuf, AnyUrl)>, String> {
    v.split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .enumerate()
        .map(|(i, e)| {
            // The entry is not quoted: its URL may hold a password.
            let (path, url) = e
                .split_once('=')
                .ok_or_else(|| format!("UPAGER_UMAP_STORE: entry {} is not PATH=URL", i + 1))?;
            let (path, url) = (path.trim(), url.trim());
            if path.is_empty() {
                return Err(format!(
                    "UPAGER_UMAP_STORE: entry {} has no PATH before its =",
                    i + 1
                ));
            }
            let url = url
                .parse::<AnyUrl>()
                .map_err(|err| format!("UPAGER_UMAP_STORE: the URL for {path}: {err}"))?;
            Ok((PathBuf::from(path), url))
        })
        .collect()
}

const SYS_PAGE: u64 = 4096;
/// upager's default largest readahead (bytes) when UMAP_READ_AHEAD is unset.
const DEFAULT_READAHEAD: u64 = 2 << 20;
/// Largest eviction batch in bytes (engine default: 1024 base pages).
const MAX_BATCH_BYTES: u64 = 4 << 20;

fn cpus() -> u64 {
    std::thread::available_parallelism().map_or(16, |n| n.get() as u64)
}

/// 90 % of MemAvailable (UMap: 90 % of available memory), in bytes.
fn default_buffer_bytes() -> u64 {
    let avail_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
        })
        .unwrap_or(1 << 20);
    avail_kb * 1024 / 10 * 9
}

fn read_env(name: &str, warnings: &mut Vec<String>) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let t = v.trim();
    match t.parse::<u64>() {
        Ok(n) => Some(n),
        Err(_) => match engine::parse_size(t) {
            // Sizes like "64K" are accepted too (an upager extension).
            Ok(n) => Some(n),
            Err(_) => {
                warnings.push(format!("{name}={v:?} is not a number; using the default"));
                None
            }
        },
    }
}

impl Config {
    fn from_env() -> (Config, Vec<String>) {
        let mut w = Vec::new();
        let level = match std::env::var("UMAP_LOG_LEVEL") {
            Err(_) => Level::Warning,
            Ok(v) => match v.trim().to_ascii_uppercase().as_str() {
                "ERROR" => Level::Error,
                "WARNING" => Level::Warning,
                "INFO" => Level::Info,
                "DEBUG" => Level::Debug,
                _ => {
                    w.push(format!("UMAP_LOG_LEVEL={v:?} is not one of ERROR, WARNING, INFO, DEBUG; using WARNING"));
                    Level::Warning
                }
            },
        };
        let page_size_env = read_env("UMAP_PAGESIZE", &mut w);
        let page_size = page_size_env.unwrap_or(SYS_PAGE);
        let buf_pages = match read_env("UMAP_BUFSIZE", &mut w) {
            Some(0) => {
                w.push("UMAP_BUFSIZE=0: using 1 page".into());
                1
            }
            Some(n) => n,
            None => (default_buffer_bytes() / page_size.max(1)).max(1),
        };
        let fillers = read_env("UMAP_PAGE_FILLERS", &mut w).unwrap_or_else(cpus);
        let evictors = read_env("UMAP_PAGE_EVICTORS", &mut w).unwrap_or_else(cpus);
        let mut pct = |name: &str, default: c_int| match read_env(name, &mut w) {
            Some(n) if n <= 100 => n as c_int,
            Some(n) => {
                w.push(format!(
                    "{name}={n} is not a percentage (0..100); using {default}"
                ));
                default
            }
            None => default,
        };
        let mut high = pct("UMAP_EVICT_HIGH_WATER_THRESHOLD", 90);
        let mut low = pct("UMAP_EVICT_LOW_WATER_THRESHOLD", 70);
        if low > high {
            w.push(format!("UMAP_EVICT_LOW_WATER_THRESHOLD ({low}) is above UMAP_EVICT_HIGH_WATER_THRESHOLD ({high}); using 70 and 90"));
            (high, low) = (90, 70);
        }
        let max_fault_events = read_env("UMAP_MAX_FAULT_EVENTS", &mut w).unwrap_or(256);
        let read_ahead = read_env("UMAP_READ_AHEAD", &mut w);
        let warm = match std::env::var("UPAGER_WARM") {
            Err(_) => engine::WarmStart::Off,
            Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
                "" | "0" | "off" => engine::WarmStart::Off,
                "1" | "on" | "auto" => engine::WarmStart::Auto,
                "record" => engine::WarmStart::Record,
                _ => {
                    w.push(format!(
                        "UPAGER_WARM={v:?} is not one of off, on, record; warm starts stay off"
                    ));
                    engine::WarmStart::Off
                }
            },
        };
        let stores =
            std::env::var("UPAGER_UMAP_STORE").map_or(Ok(Vec::new()), |v| parse_stores(&v));
        (
            Config {
                page_size,
                page_size_set: page_size_env.is_some(),
                buf_pages,
                fillers,
                evictors,
                high,
                low,
                max_fault_events,
                read_ahead,
                level,
                warm,
                stores,
            },
            w,
        )
    }

    /// Folios per eviction batch: the pages between the watermarks, at
    /// least 1, at most 4 MiB worth and 1024.
    fn batch(&self) -> usize {
        let between = self.buf_pages * (self.high - self.low).max(0) as u64 / 100;
        let cap = (MAX_BATCH_BYTES / self.page_size.max(1)).clamp(1, 1024);
        between.clamp(1, cap) as usize
    }

    /// Bytes per eviction batch: [`batch`](Self::batch) pages (a region
    /// whose pages are larger, a store's, evicts as many bytes per batch in
    /// fewer pages), within 4 KiB and the budget.
    fn batch_bytes(&self) -> u64 {
        let budget = self.buf_pages.saturating_mul(self.page_size).max(SYS_PAGE);
        (self.batch() as u64)
            .saturating_mul(self.page_size)
            .clamp(SYS_PAGE, budget)
    }

    fn read_ahead_pages(&self) -> u64 {
        self.read_ahead
            .unwrap_or(DEFAULT_READAHEAD / self.page_size.max(1))
    }
}

fn cfg() -> &'static Config {
    static CFG: OnceLock<Config> = OnceLock::new();
    CFG.get_or_init(|| {
        let (c, warnings) = Config::from_env();
        for w in warnings {
            log_at(c.level, Level::Warning, &w);
        }
        c
    })
}

fn log_at(cur: Level, level: Level, msg: &str) {
    if level <= cur {
        let tag = match level {
            Level::Error => "ERROR",
            Level::Warning => "WARNING",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        };
        eprintln!("upager(umap) [{tag}] {msg}");
    }
}

fn log(level: Level, msg: &str) {
    log_at(cfg().level, level, msg);
}

/// The process-wide pager, created at the first `umap()`.
fn pager() -> Result<&'static Pager, Failure> {
    static PAGER: OnceLock<Result<Pager, (c_int, String)>> = OnceLock::new();
    let r = PAGER.get_or_init(|| {
        engine::log_to_stderr();
        let c = cfg();
        // The builder's default fault mode is UPAGER_FAULT_MODE's (handlers
        // if unset); a bad value fails build() with EINVAL, naming it.
        let mut b = Pager::builder()
            .budget(c.buf_pages.saturating_mul(c.page_size))
            .batch_bytes(c.batch_bytes())
            .handler_threads(c.fillers.clamp(1, 64) as usize);
        if let Some(pages) = c.read_ahead {
            b = b.readahead(pages.saturating_mul(c.page_size));
        }
        match b.build() {
            Ok(p) => {
                log(Level::Info, &format!("pager: budget {} pages of {} bytes, eviction batch {} pages, {} fault-handler threads, fault mode {}", c.buf_pages, c.page_size, c.batch(), c.fillers.clamp(1, 64), p.fault_mode()));
                register_atexit();
                Ok(p)
            }
            Err(e) => {
                let f = Failure::from(e);
                Err((f.errno, f.msg))
            }
        }
    });
    r.as_ref().map_err(|(n, m)| Failure::new(*n, m.clone()))
}

/// Mapped regions by base address.
fn regions() -> MutexGuard<'static, BTreeMap<usize, Arc<Region>>> {
    static REGIONS: OnceLock<Mutex<BTreeMap<usize, Arc<Region>>>> = OnceLock::new();
    REGIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The region containing `addr`, and the offset of `addr` in it.
fn containing(addr: usize) -> Option<(Arc<Region>, usize)> {
    let t = regions();
    let (base, r) = t.range(..=addr).next_back()?;
    let off = addr - base;
    (off < r.len()).then(|| (Arc::clone(r), off))
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always
    // valid and writable by this thread.
    unsafe { *libc::__errno_location() = e };
}

/// Records a failure of the UMap face: log, last-error message, errno.
fn fail(what: &str, f: Failure) {
    let msg = format!("{what}: {}", f.msg);
    log(Level::Error, &msg);
    error::set_last(&msg);
    set_errno(f.errno);
}

fn catch<T>(what: &str, on_err: T, f: impl FnOnce() -> Result<T, Failure>) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            fail(what, e);
            on_err
        }
        Err(_) => {
            fail(
                what,
                Failure::new(
                    libc::EIO,
                    "internal error in upager (a bug; please report it)",
                ),
            );
            on_err
        }
    }
}

const UMAP_FAILED: *mut c_void = usize::MAX as *mut c_void;

/// What a umap region pages from.
enum Source {
    /// An open file (duplicated).
    Fd(c_int),
    /// A store of the program's callbacks (`upager_umap_store`, C++
    /// `Umap::umap_ex` with a `Umap::Store`).
    Store(crate::store::CallbackStore),
}

fn umap_inner(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    source: Source,
    offset: libc::off_t,
) -> Result<*mut c_void, Failure> {
    let c = cfg();
    if prot & !(libc::PROT_READ | libc::PROT_WRITE) != 0 {
        return Err(Failure::inval(format!(
            "prot {prot:#x}: only PROT_READ and PROT_WRITE are supported"
        )));
    }
    if flags & libc::MAP_PRIVATE == 0 || flags & !(libc::MAP_PRIVATE | libc::MAP_FIXED) != 0 {
        return Err(Failure::inval(format!(
            "flags {flags:#x}: give UMAP_PRIVATE (optionally with UMAP_FIXED) and nothing else"
        )));
    }
    if length == 0 {
        return Err(Failure::inval("length is 0"));
    }
    if offset < 0 {
        return Err(Failure::inval(format!("offset {offset} is negative")));
    }
    if !c.page_size.is_power_of_two() || !(SYS_PAGE..=(2 << 20)).contains(&c.page_size) {
        return Err(Failure::inval(format!(
            "UMAP_PAGESIZE={} is not supported: upager needs a power of two from 4096 to 2097152",
            c.page_size
        )));
    }
    let writable = prot & libc::PROT_WRITE != 0;
    let mut opts = MapOptions::new()
        .writable(writable)
        .folio(c.page_size)
        .offset(offset as u64)
        .len(length as u64);
    if flags & libc::MAP_FIXED != 0 {
        // UMAP_FIXED: the region replaces [addr, addr + length rounded up
        // to the page size), which must not reach into another region.
        let (start, len) = (addr as u64, (length as u64).next_multiple_of(c.page_size));
        if addr.is_null() || !start.is_multiple_of(c.page_size) {
            return Err(Failure::inval(format!(
                "UMAP_FIXED address {addr:p} is not a multiple of UMAP_PAGESIZE ({})",
                c.page_size
            )));
        }
        // Regions of ours in the range are replaced, as MAP_FIXED replaces
        // mappings: umapsort's multi-file mode umaps its base file, then
        // maps each file with UMAP_FIXED over part of it. A region only
        // partly inside is unmapped whole (its dirty data written back
        // first; MAP_FIXED would keep the rest mapped). Its range stays
        // reserved, inaccessible, never a hole: an engine buffer or a
        // malloc of another thread mapped into a hole would be mapped over
        // below (seen: a fill's read buffer became region memory, EFAULT).
        // The part outside this range stays reserved for the program's
        // next UMAP_FIXED, as the rest of a mapping does under MAP_FIXED.
        let overlapping: Vec<usize> = regions()
            .iter()
            .filter(|(b, r)| {
                **b as u64 + (r.len() as u64).next_multiple_of(r.folio_size()) > start
                    && (**b as u64) < start + len
            })
            .map(|(b, _)| *b)
            .collect();
        for b in overlapping {
            log(
                Level::Warning,
                &format!(
                    "umap: UMAP_FIXED range {addr:p}+{len:#x} replaces the umap region at {b:#x}: it is written back and unmapped whole (what lies outside the range stays reserved, inaccessible)"
                ),
            );
            remove_region(b as *mut c_void, 0, true)?;
        }
        // SAFETY: UMAP_FIXED hands the range over, as MAP_FIXED does
        // (umap.h), and no region of ours is left in it.
        opts = opts.at(unsafe { engine::FixedRange::new(start, len) });
    }
    let (region, from) = match source {
        Source::Fd(fd) => {
            let file = native::dup_fd(fd, writable)?;
            let opts = opts.warm(c.warm);
            match store_for(&file, fd)? {
                Some((path, url, size)) => {
                    let store = upager_stores::open_for(url, writable)?;
                    if store.len() != size {
                        return Err(Failure::inval(format!(
                            "UPAGER_UMAP_STORE: {} is {size} bytes but {url} holds {}: they are not the same data (upload the file again, e.g. `upager load FILE {url}`, or give a placeholder of the data's size)",
                            path.display(),
                            store.len()
                        )));
                    }
                    // A folio below the store's unit (a Redis dataset's
                    // chunk) cannot be read or written alone; without
                    // UMAP_PAGESIZE the store's own default (an S3 GET
                    // per 4 KiB page would be a round trip each).
                    let least = if c.page_size_set {
                        store.unit()
                    } else {
                        upager_stores::default_folio(url, store.as_ref())
                    };
                    let folio = c.page_size.max(least);
                    if folio != c.page_size {
                        log(Level::Info, &format!("umap(fd {fd}): {url}: its region's pages are {folio} bytes (the store's unit or default; UMAP_PAGESIZE {})", c.page_size));
                    }
                    let region = pager()?.map_store(store, &opts.folio(folio))?;
                    (region, format!("fd {fd} ({}) from {url}", path.display()))
                }
                None => (pager()?.map_open_file(file, &opts)?, format!("fd {fd}")),
            }
        }
        Source::Store(store) => (
            pager()?.map_store(Arc::new(store), &opts)?,
            "a store".to_string(),
        ),
    };
    let base = region.as_ptr();
    log(
        Level::Debug,
        &format!("umap({from}, offset {offset}, length {length}, prot {prot:#x}) = {base:p}"),
    );
    regions().insert(base as usize, Arc::new(region));
    Ok(base.cast())
}

/// The `UPAGER_UMAP_STORE` entry for the file open as `file` (descriptor
/// `fd`), and the file's size: the entry whose PATH is that file (the same
/// device and inode, so any name of it matches), if any.
///
/// The store's data must be the file's: what its size can check is
/// checked (by the caller, against the store's); a warm-start trace is the
/// store's, tied to its version of the data as for any store region. A
/// PATH that cannot be looked up is logged at every `umap()` and skipped:
/// a map of another file is no reason to fail.
fn store_for(
    file: &std::fs::File,
    fd: c_int,
) -> Result<Option<(&'static PathBuf, &'static AnyUrl, u64)>, Failure> {
    let entries = cfg()
        .stores
        .as_ref()
        .map_err(|m| Failure::inval(m.clone()))?;
    if entries.is_empty() {
        return Ok(None);
    }
    let this = file.metadata().map_err(|e| {
        Failure::new(
            e.raw_os_error().unwrap_or(libc::EBADF),
            format!("fstat of file descriptor {fd}: {e}"),
        )
    })?;
    for (path, url) in entries {
        match std::fs::metadata(path) {
            Ok(m) if (m.dev(), m.ino()) == (this.dev(), this.ino()) => {
                return Ok(Some((path, url, this.len())))
            }
            Ok(_) => {}
            Err(e) => log(
                Level::Warning,
                &format!(
                    "UPAGER_UMAP_STORE: {}: {e}; its entry is skipped",
                    path.display()
                ),
            ),
        }
    }
    Ok(None)
}

/// `umap`: maps `length` bytes of `fd` from `offset`; UMAP_FAILED and errno
/// on failure.
#[no_mangle]
pub extern "C" fn umap(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    catch("umap", UMAP_FAILED, || {
        umap_inner(addr, length, prot, flags, Source::Fd(fd), offset)
    })
}

/// `upager_umap_store`: `umap` over a store of the program's callbacks
/// instead of a descriptor (what C++ `Umap::umap_ex` with a `Umap::Store`
/// calls); UMAP_FAILED and errno on failure.
///
/// # Safety
/// `ops` is NULL or an initialised `struct upager_store_ops` whose
/// callbacks and context meet upager.h's contract.
#[no_mangle]
pub unsafe extern "C" fn upager_umap_store(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    ops: *const crate::store::upager_store_ops,
    offset: libc::off_t,
) -> *mut c_void {
    catch("umap_ex", UMAP_FAILED, || {
        // SAFETY: forwarded contract.
        let store = unsafe { crate::store::store_from(ops) }?;
        umap_inner(addr, length, prot, flags, Source::Store(store), offset)
    })
}

/// `uunmap`: writes the region's dirty data back and unmaps it; 0, or -1
/// and errno (the region then stays mapped).
#[no_mangle]
pub extern "C" fn uunmap(addr: *mut c_void, length: usize) -> c_int {
    catch("uunmap", -1, || {
        remove_region(addr, length, false).map(|_| 0)
    })
}

/// [`uunmap`]'s work: the region at `addr` written back and unmapped
/// (`length` 0: not checked), or with `keep_range` its range left reserved
/// for a UMAP_FIXED mapping over it.
fn remove_region(addr: *mut c_void, length: usize, keep_range: bool) -> Result<(), Failure> {
    {
        let key = addr as usize;
        let Some(mut r) = regions().remove(&key) else {
            return Err(Failure::inval(format!(
                "{addr:p} is not an address returned by umap()"
            )));
        };
        let rlen = r.len();
        if length > rlen.next_multiple_of(r.folio_size() as usize) {
            regions().insert(key, r);
            return Err(Failure::inval(format!(
                "length {length} is beyond the region's {rlen} bytes (upager unmaps whole regions)"
            )));
        }
        // Another thread may hold the region for a moment (umap_flush,
        // prefetch): wait for it to finish.
        let region = loop {
            match Arc::try_unwrap(r) {
                Ok(region) => break region,
                Err(again) => {
                    r = again;
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
        };
        let done = if keep_range {
            region.unmap_keeping_range().map(drop)
        } else {
            region.unmap()
        };
        match done {
            Ok(()) => {
                if cfg().level >= Level::Info {
                    let s = pager()?.stats();
                    log(
                        Level::Info,
                        &format!(
                            "uunmap({addr:p}): pager counters: faults_missing {}, bytes_read {}, resident_peak_bytes {}, replay_reads {}, replay_hits {}, replay_wasted {}",
                            s.faults_missing,
                            s.bytes_read,
                            s.resident_peak_bytes,
                            s.replay_reads,
                            s.replay_hits,
                            s.replay_wasted
                        ),
                    );
                }
                Ok(())
            }
            Err((e, region)) => {
                regions().insert(key, Arc::new(region));
                Err(e.into())
            }
        }
    }
}

/// Flushes every umap region; the first error wins.
fn flush_all() -> Result<(), Failure> {
    let all: Vec<Arc<Region>> = regions().values().cloned().collect();
    let mut first = None;
    for r in all {
        if let Err(e) = r.flush() {
            first.get_or_insert(Failure::from(e));
        }
    }
    first.map_or(Ok(()), Err)
}

/// `umap_flush`: writes every region's dirty data back (fdatasync); 0, or
/// -1 and errno.
#[no_mangle]
pub extern "C" fn umap_flush() -> c_int {
    catch("umap_flush", -1, || flush_all().map(|()| 0))
}

extern "C" fn flush_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Err(e) = flush_all() {
            log(Level::Error, &format!("at exit: {}", e.msg));
        }
    });
}

fn register_atexit() {
    // SAFETY: atexit stores a function pointer; `flush_at_exit` is a plain
    // extern "C" fn with no arguments that never unwinds.
    if unsafe { libc::atexit(flush_at_exit) } != 0 {
        log(
            Level::Warning,
            "atexit registration failed: regions still mapped at exit are not flushed",
        );
    }
}

/// The folio-aligned part of `[off, off+len)` inside `r`, as (start, len).
fn folio_span(r: &Region, off: usize, len: usize) -> (u64, u64) {
    let folio = r.folio_size();
    let start = off as u64 - off as u64 % folio;
    let end = (off as u64).saturating_add(len as u64).min(r.len() as u64);
    (start, end.saturating_sub(start))
}

/// Queues `[off, off+len)` of `r` for the pager's prefetch thread (one
/// large read per run of folios).
fn queue(r: &Region, off: usize, len: usize) -> Result<(), Failure> {
    let (start, n) = folio_span(r, off, len);
    if n > 0 {
        r.prefetch(start, n)?;
    }
    Ok(())
}

/// Makes sure `[off, off+len)` of `r` is in: touches one byte per folio
/// (no fault where the prefetch already filled it; a normal fault where
/// it stopped early to respect the budget). Touching never changes data.
fn touch(r: &Region, off: usize, len: usize) {
    let (start, n) = folio_span(r, off, len);
    let bytes = r.bytes();
    let mut a = start;
    while a < start + n {
        let _ = bytes[a as usize].load(std::sync::atomic::Ordering::Relaxed);
        a += r.folio_size();
    }
}

/// How long prefetch waits for the prefetch thread before touching.
const PREFETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `umap_prefetch`: brings the listed pages in.
///
/// # Safety
/// `page_array` is valid for reading `npages` items (or NULL with
/// `npages <= 0`).
#[no_mangle]
pub unsafe extern "C" fn umap_prefetch(npages: c_int, page_array: *mut umap_prefetch_item) {
    if npages <= 0 {
        return;
    }
    if page_array.is_null() {
        fail("umap_prefetch", Failure::inval("page_array is NULL"));
        return;
    }
    // SAFETY: non-NULL and valid for `npages` items by this function's
    // contract; only read while the call lasts.
    let items = unsafe { std::slice::from_raw_parts(page_array, npages as usize) };
    let ps = cfg().page_size as usize;
    catch("umap_prefetch", (), || {
        let mut found = Vec::with_capacity(items.len());
        for it in items {
            let a = it.page_base_addr as usize;
            let Some((r, off)) = containing(a) else {
                return Err(Failure::inval(format!(
                    "{a:#x} is not inside a region mapped by umap()"
                )));
            };
            queue(&r, off, ps)?;
            found.push((r, off));
        }
        if let Some((r, _)) = found.first() {
            r.wait_prefetch(PREFETCH_WAIT);
        }
        for (r, off) in &found {
            touch(r, *off, ps);
        }
        Ok(())
    });
}

/// `umap_fetch_and_pin`: brings `[paddr, paddr+size)` in (capped at the
/// region's end). upager does not pin: see umap.h.
#[no_mangle]
pub extern "C" fn umap_fetch_and_pin(paddr: *mut c_char, size: u64) {
    catch("umap_fetch_and_pin", (), || {
        let a = paddr as usize;
        let Some((r, off)) = containing(a) else {
            return Err(Failure::inval(format!(
                "{paddr:p} is not inside a region mapped by umap()"
            )));
        };
        // Pinned until uunmap (UMap has no unpin); beyond half the buffer,
        // fetched without a pin, as before.
        let size = (size as usize).min(r.len() - off);
        if let Err(e) = r.pin(off as u64, size as u64, false) {
            log(
                Level::Warning,
                &format!("umap_fetch_and_pin: {e}; fetching without pinning"),
            );
            queue(&r, off, size)?;
            r.wait_prefetch(PREFETCH_WAIT);
            touch(&r, off, size);
        }
        Ok(())
    });
}

/// `umap_has_write_support`: 1 (regions mapped with PROT_WRITE write back).
#[no_mangle]
pub extern "C" fn umap_has_write_support() -> c_int {
    1
}

/// `umapcfg_get_system_page_size`.
#[no_mangle]
pub extern "C" fn umapcfg_get_system_page_size() -> c_long {
    SYS_PAGE as c_long
}
/// `umapcfg_get_umap_page_size`: UMAP_PAGESIZE.
#[no_mangle]
pub extern "C" fn umapcfg_get_umap_page_size() -> u64 {
    cfg().page_size
}
/// `umapcfg_get_max_fault_events`: UMAP_MAX_FAULT_EVENTS.
#[no_mangle]
pub extern "C" fn umapcfg_get_max_fault_events() -> u64 {
    cfg().max_fault_events
}
/// `umapcfg_get_num_fillers`: UMAP_PAGE_FILLERS.
#[no_mangle]
pub extern "C" fn umapcfg_get_num_fillers() -> u64 {
    cfg().fillers
}
/// `umapcfg_get_num_evictors`: UMAP_PAGE_EVICTORS.
#[no_mangle]
pub extern "C" fn umapcfg_get_num_evictors() -> u64 {
    cfg().evictors
}
/// `umapcfg_get_max_pages_in_buffer`: UMAP_BUFSIZE (pages).
#[no_mangle]
pub extern "C" fn umapcfg_get_max_pages_in_buffer() -> u64 {
    cfg().buf_pages
}
/// `umapcfg_get_read_ahead`: UMAP_READ_AHEAD (pages).
#[no_mangle]
pub extern "C" fn umapcfg_get_read_ahead() -> u64 {
    cfg().read_ahead_pages()
}
/// `umapcfg_get_evict_low_water_threshold`: percent.
#[no_mangle]
pub extern "C" fn umapcfg_get_evict_low_water_threshold() -> c_int {
    cfg().low
}
/// `umapcfg_get_evict_high_water_threshold`: percent.
#[no_mangle]
pub extern "C" fn umapcfg_get_evict_high_water_threshold() -> c_int {
    cfg().high
}

/// `upager_umap_stat`: a counter of the pager behind umap().
///
/// # Safety
/// `name` is a NUL-terminated string; `value` valid for one u64 write.
#[no_mangle]
pub unsafe extern "C" fn upager_umap_stat(name: *const c_char, value: *mut u64) -> c_int {
    error::guard(|| {
        let p = pager()?;
        // SAFETY: forwarded contract.
        unsafe { native::stat_by_name(&p.stats(), name, value) }
    })
}

/// `upager_umap_fault_mode`: the fault mode of the pager behind umap()
/// (`UPAGER_FAULT_*`), creating it if no umap() call has yet.
#[no_mangle]
pub extern "C" fn upager_umap_fault_mode() -> c_int {
    error::guard(|| native::fault_mode_code(pager()?.fault_mode()))
}

/// `upager_umap_info`: what the kernel let the pager behind umap() use
/// (`struct upager_info`), creating it as `upager_umap_fault_mode` does.
///
/// # Safety
/// `out` is NULL or valid for reading and writing one `struct upager_info`.
#[no_mangle]
pub unsafe extern "C" fn upager_umap_info(out: *mut native::upager_info) -> c_int {
    error::guard(|| {
        // SAFETY: by this function's contract (NULL is refused by as_mut).
        let o = unsafe { out.as_mut() }.ok_or_else(|| Failure::inval("info is NULL"))?;
        native::fill_info(o, pager()?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_follows_the_watermarks() {
        let mut c = Config {
            page_size: 4096,
            page_size_set: false,
            buf_pages: 100,
            fillers: 2,
            evictors: 2,
            high: 90,
            low: 70,
            max_fault_events: 256,
            read_ahead: None,
            level: Level::Warning,
            warm: engine::WarmStart::Off,
            stores: Ok(Vec::new()),
        };
        assert_eq!(c.batch(), 20);
        assert_eq!(c.batch_bytes(), 20 * 4096);
        c.buf_pages = 2;
        assert_eq!(c.batch(), 1);
        c.buf_pages = 1 << 30;
        assert_eq!(c.batch(), 1024);
        c.page_size = 64 << 10;
        assert_eq!(c.batch(), 64);
        assert_eq!(c.batch_bytes(), 4 << 20);
        assert_eq!(c.read_ahead_pages(), 32);
    }

    #[test]
    fn store_entries_are_path_equals_url() {
        let e = parse_stores(
            " /data/g.csr = redis-cluster://127.0.0.1:7000/g ;; w.bin=s3://bucket/k=1;",
        )
        .unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0, PathBuf::from("/data/g.csr"));
        assert!(matches!(&e[0].1, AnyUrl::Redis(u) if u.name.as_deref() == Some("g")));
        assert_eq!(e[1].0, PathBuf::from("w.bin"));
        assert!(matches!(&e[1].1, AnyUrl::S3(_)));
        assert!(parse_stores("").unwrap().is_empty());
        // Errors name the entry, never print its URL (a password).
        let err = parse_stores("a=redis-cluster://h:1/x;redis-cluster://:pw@h:1/y").unwrap_err();
        assert!(err.contains("entry 2 is not PATH=URL"), "{err}");
        assert!(!err.contains("pw"), "{err}");
        let err = parse_stores("=s3://b/k").unwrap_err();
        assert!(err.contains("no PATH"), "{err}");
        let err = parse_stores("f=ftp://:secret@h/x").unwrap_err();
        assert!(
            err.starts_with("UPAGER_UMAP_STORE: the URL for f:"),
            "{err}"
        );
        assert!(!err.contains("secret"), "{err}");
    }
}
