//! The native C API (`include/upager.h`).
//!
//! Handles are boxed engine objects behind opaque pointers:
//! `upager_t` owns a [`engine::Pager`], `upager_region_t` an
//! [`engine::Region`]. A region keeps its pager's threads alive, so
//! `upager_destroy` may come before the regions are unmapped.
//!
//! Every function returns 0 (or a count) on success and `-errno` on
//! failure, and leaves the failure's full message for `upager_last_error()`
//! on the calling thread.
//!
//! Uses: `error`, `store`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::BorrowedFd;
use std::sync::{Mutex, OnceLock};

use engine::{FaultMode, MapOptions, Pager, Region, Stats};

use crate::error::{self, checked_size, guard, Failure};

/// Opaque pager handle (`upager_t` in C).
#[derive(Debug)]
pub struct upager_t {
    pager: Pager,
}

/// Opaque region handle (`upager_region_t` in C). `None` only while
/// `upager_unmap` runs.
#[derive(Debug)]
pub struct upager_region_t {
    region: Option<Region>,
}

/// Pager options (`struct upager_options`); see upager.h.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct upager_options {
    /// `sizeof(struct upager_options)`, set by `upager_options_init`.
    pub size: usize,
    /// Most bytes resident at once, over all regions.
    pub budget: u64,
    /// Folios per eviction batch; 0 = default.
    pub batch: u32,
    /// Fault-handler threads; 0 = default.
    pub handler_threads: u32,
    /// Largest readahead in bytes; -1 = default; 0 = off.
    pub readahead: i64,
    /// Directory of anonymous regions' swap files; NULL = default.
    pub swap_dir: *const c_char,
    /// O_DIRECT store I/O: -1 default (on), 0 off, 1 on.
    pub direct_io: c_int,
    /// Background reclaimer: -1 default (on), 0 off, 1 on.
    pub background_reclaim: c_int,
    /// Most dirty file-backed bytes at once; 0 = default (half the budget).
    pub dirty_limit: u64,
    /// `UPAGER_FAULT_*`: how faults are resolved.
    pub fault_mode: c_int,
    /// Background write-back of data dirty this long (ms); -1 default, 0 off.
    pub dirty_expire_ms: i64,
    /// Fill sequential 2 MiB runs as huge pages (mixed folio sizes):
    /// -1 default (off), 0 off, 1 on.
    pub huge_runs: c_int,
    /// Async readahead: -1 default (on), 0 off, 1 on.
    pub readahead_async: c_int,
    /// The disk tier's directory; NULL = default.
    pub cache_dir: *const c_char,
    /// The disk tier's size in bytes; -1 = default, 0 = off.
    pub cache_size: i64,
}

/// Region options (`struct upager_map_options`); see upager.h.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct upager_map_options {
    /// `sizeof(struct upager_map_options)`, set by `upager_map_options_init`.
    pub size: usize,
    /// Start in the file; a multiple of the folio size.
    pub offset: u64,
    /// Bytes to map; 0 = to the end of the file.
    pub length: u64,
    /// Folio size; 0 = default (64 KiB).
    pub folio: u64,
    /// `UPAGER_MAP_*` flags.
    pub flags: u32,
    /// NULL, or the fixed address to map at (`MAP_FIXED`).
    pub addr: *mut c_void,
    /// NULL, or a store URL (`redis-cluster://HOST:PORT[/NAME]`): the
    /// region's data lives there instead of in a file or local swap.
    pub store: *const c_char,
}

/// `UPAGER_MAP_WRITE`: map read-write (writes reach the file).
pub const UPAGER_MAP_WRITE: u32 = 1;
/// `UPAGER_MAP_WARM`: a warm start (`WarmStart::Auto`).
pub const UPAGER_MAP_WARM: u32 = 2;
/// `UPAGER_MAP_WARM_RECORD`: record a new trace (`WarmStart::Record`).
pub const UPAGER_MAP_WARM_RECORD: u32 = 4;
/// Every map flag.
const MAP_FLAGS: u32 = UPAGER_MAP_WRITE | UPAGER_MAP_WARM | UPAGER_MAP_WARM_RECORD;
/// `UPAGER_UNMAP_FORCE`: unmap even if writing dirty data back fails.
pub const UPAGER_UNMAP_FORCE: u32 = 1;
/// `UPAGER_FAULT_IN_WRITE`: `upager_fault_in` as write faults (dirty).
pub const UPAGER_FAULT_IN_WRITE: u32 = 1;

/// `UPAGER_FAULT_FROM_ENV`: the mode `UPAGER_FAULT_MODE` names when
/// `upager_create` runs (handlers if unset); a name that is no mode is
/// EINVAL there.
pub const UPAGER_FAULT_FROM_ENV: c_int = -1;
/// `UPAGER_FAULT_HANDLERS`: [`FaultMode::Handlers`].
pub const UPAGER_FAULT_HANDLERS: c_int = 0;
/// `UPAGER_FAULT_IN_THREAD`: [`FaultMode::InThread`].
pub const UPAGER_FAULT_IN_THREAD: c_int = 1;

/// The C value of a fault mode (upager.h `enum upager_fault_mode`).
pub(crate) fn fault_mode_code(m: FaultMode) -> Result<c_int, Failure> {
    match m {
        FaultMode::Handlers => Ok(UPAGER_FAULT_HANDLERS),
        FaultMode::InThread => Ok(UPAGER_FAULT_IN_THREAD),
        // A mode a later engine adds gets its constant with its C support.
        other => Err(Failure::new(
            libc::ENOTSUP,
            format!(
                "fault mode {other} has no UPAGER_FAULT_* constant in this version of the C API"
            ),
        )),
    }
}

/// The fault mode `fault_mode` names: `None` for `UPAGER_FAULT_FROM_ENV`
/// (the builder's default reads `UPAGER_FAULT_MODE` and reports a bad
/// value), EINVAL for a value that is no `UPAGER_FAULT_*`.
fn fault_mode_arg(v: c_int) -> Result<Option<FaultMode>, Failure> {
    match v {
        UPAGER_FAULT_FROM_ENV => Ok(None),
        UPAGER_FAULT_HANDLERS => Ok(Some(FaultMode::Handlers)),
        UPAGER_FAULT_IN_THREAD => Ok(Some(FaultMode::InThread)),
        _ => Err(Failure::inval(format!(
            "fault_mode must be UPAGER_FAULT_HANDLERS (0), UPAGER_FAULT_IN_THREAD (1) or UPAGER_FAULT_FROM_ENV (-1), got {v}"
        ))),
    }
}

/// `fault_mode` as `upager_options_init` fills it: the mode
/// `UPAGER_FAULT_MODE` names; `UPAGER_FAULT_FROM_ENV` when it is unset or
/// empty (upager chooses: handlers where the userfaultfd serves system
/// calls, in-thread where it is user-mode-only) and when it names no mode,
/// so that `upager_create` fails with EINVAL and the engine's message
/// naming the variable (init itself cannot fail).
fn fault_mode_from_env() -> c_int {
    match FaultMode::from_env() {
        Ok(Some(m)) => fault_mode_code(m).unwrap_or(UPAGER_FAULT_FROM_ENV),
        // Unset: upager chooses when the userfaultfd is open.
        Ok(None) | Err(_) => UPAGER_FAULT_FROM_ENV,
    }
}

const DEFAULT_BUDGET: u64 = 256 << 20;

fn default_options() -> upager_options {
    upager_options {
        size: std::mem::size_of::<upager_options>(),
        budget: DEFAULT_BUDGET,
        batch: 0,
        handler_threads: 0,
        readahead: -1,
        swap_dir: std::ptr::null(),
        direct_io: -1,
        background_reclaim: -1,
        dirty_limit: 0,
        fault_mode: fault_mode_from_env(),
        dirty_expire_ms: -1,
        huge_runs: -1,
        readahead_async: -1,
        cache_dir: std::ptr::null(),
        cache_size: -1,
    }
}

fn default_map_options() -> upager_map_options {
    upager_map_options {
        size: std::mem::size_of::<upager_map_options>(),
        offset: 0,
        length: 0,
        folio: 0,
        flags: 0,
        addr: std::ptr::null_mut(),
        store: std::ptr::null(),
    }
}

/// Reads a C string argument.
///
/// # Safety
/// - `p` is NULL or points to a NUL-terminated string that stays valid and
///   unchanged for `'a`.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::inval(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and, by this function's contract, NUL-terminated and
    // valid for 'a.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| Failure::inval(format!("{what} is not valid UTF-8")))
}

/// Borrows a handle.
///
/// # Safety
/// - `p` is NULL or a pointer this library returned that has not been
///   freed, and no call frees it while the reference lives.
unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: by this function's contract, a non-NULL `p` points to a live T
    // allocated by this library; as_ref handles NULL.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::inval(format!("{what} is NULL")))
}

/// Stores a new handle through an out-pointer.
///
/// # Safety
/// - `out` is NULL or valid for one pointer-sized write.
unsafe fn put<T>(out: *mut *mut T, v: T) -> Result<c_int, Failure> {
    if out.is_null() {
        return Err(Failure::inval("the output pointer is NULL"));
    }
    let p = Box::into_raw(Box::new(v));
    // SAFETY: `out` is non-NULL and, by this function's contract, writable.
    unsafe { out.write(p) };
    Ok(0)
}

/// `upager_options_init`: fills `o` with the defaults (`fault_mode` from
/// `UPAGER_FAULT_MODE`).
///
/// # Safety
/// `o` is NULL or valid for writing one `struct upager_options`.
#[no_mangle]
pub unsafe extern "C" fn upager_options_init(o: *mut upager_options) {
    if !o.is_null() {
        // SAFETY: non-NULL and writable by this function's contract.
        unsafe { o.write(default_options()) };
    }
}

/// `upager_map_options_init`: fills `o` with the defaults.
///
/// # Safety
/// `o` is NULL or valid for writing one `struct upager_map_options`.
#[no_mangle]
pub unsafe extern "C" fn upager_map_options_init(o: *mut upager_map_options) {
    if !o.is_null() {
        // SAFETY: non-NULL and writable by this function's contract.
        unsafe { o.write(default_map_options()) };
    }
}

fn tri(v: c_int, what: &str) -> Result<Option<bool>, Failure> {
    match v {
        -1 => Ok(None),
        0 => Ok(Some(false)),
        1 => Ok(Some(true)),
        _ => Err(Failure::inval(format!(
            "{what} must be -1 (default), 0 or 1, got {v}"
        ))),
    }
}

/// `upager_create`: a new pager.
///
/// # Safety
/// `opts` is NULL or points to an initialised `struct upager_options` whose
/// `swap_dir` and `cache_dir` are NULL or NUL-terminated strings; `out` is
/// valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn upager_create(
    opts: *const upager_options,
    out: *mut *mut upager_t,
) -> c_int {
    guard(|| {
        // SAFETY: NULL or a valid struct, by this function's contract.
        let o = match unsafe { opts.as_ref() } {
            Some(o) => *o,
            None => default_options(),
        };
        checked_size(
            o.size,
            std::mem::size_of::<upager_options>(),
            "upager_options",
        )?;
        engine::log_to_stderr();
        let mut b = Pager::builder().budget(o.budget);
        if o.batch != 0 {
            b = b.batch(o.batch as usize);
        }
        if o.dirty_limit != 0 {
            b = b.dirty_limit(o.dirty_limit);
        }
        match o.dirty_expire_ms {
            -1 => {}
            ms if ms >= 0 => b = b.dirty_expire(std::time::Duration::from_millis(ms as u64)),
            ms => {
                return Err(Failure::inval(format!(
                    "dirty_expire_ms must be -1 (default: 5000), 0 (off) or milliseconds, got {ms}"
                )))
            }
        }
        if o.handler_threads != 0 {
            b = b.handler_threads(o.handler_threads as usize);
        }
        match o.readahead {
            -1 => {}
            r if r >= 0 => b = b.readahead(r as u64),
            r => {
                return Err(Failure::inval(format!(
                    "readahead must be -1 (default) or a byte count, got {r}"
                )))
            }
        }
        if !o.swap_dir.is_null() {
            // SAFETY: a non-NULL swap_dir is a NUL-terminated string valid
            // for this call, by this function's contract.
            let dir = unsafe { c_str(o.swap_dir, "swap_dir") }?;
            if !std::path::Path::new(&dir).is_dir() {
                return Err(Failure::inval(format!(
                    "swap_dir {dir} is not a directory: give an existing directory (anonymous regions keep their private swap files there)"
                )));
            }
            b = b.swap_dir(dir);
        }
        if let Some(on) = tri(o.direct_io, "direct_io")? {
            b = b.direct_io(on);
        }
        if let Some(on) = tri(o.background_reclaim, "background_reclaim")? {
            b = b.background_reclaim(on);
        }
        if let Some(on) = tri(o.huge_runs, "huge_runs")? {
            b = b.huge_runs(on);
        }
        if let Some(on) = tri(o.readahead_async, "readahead_async")? {
            b = b.readahead_async(on);
        }
        if let Some(m) = fault_mode_arg(o.fault_mode)? {
            b = b.fault_mode(m);
        }
        if !o.cache_dir.is_null() {
            // SAFETY: a non-NULL cache_dir is a NUL-terminated string valid
            // for this call, by this function's contract.
            b = b.cache_dir(unsafe { c_str(o.cache_dir, "cache_dir") }?);
        }
        match o.cache_size {
            -1 => {}
            n if n >= 0 => b = b.cache_size(n as u64),
            n => {
                return Err(Failure::inval(format!(
                    "cache_size must be -1 (default), 0 (off) or a byte count, got {n}"
                )))
            }
        }
        let pager = b.build()?;
        // SAFETY: `out` is writable by this function's contract.
        unsafe { put(out, upager_t { pager }) }
    })
}

/// `upager_fault_mode`: how the pager resolves faults (`UPAGER_FAULT_*`).
///
/// # Safety
/// `p` is NULL or a live pager handle.
#[no_mangle]
pub unsafe extern "C" fn upager_fault_mode(p: *const upager_t) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let h = unsafe { handle(p, "pager") }?;
        fault_mode_code(h.pager.fault_mode())
    })
}

/// What the kernel let a pager use (`struct upager_info`); see upager.h.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct upager_info {
    /// `sizeof(struct upager_info)`, set by the caller.
    pub size: usize,
    /// `UPAGER_FAULT_*`.
    pub fault_mode: c_int,
    /// 1: a user-mode-only userfaultfd.
    pub user_mode_only: c_int,
    /// 1: system calls on non-resident region memory fault it in.
    pub syscalls_fault_in: c_int,
    /// 1: one process_madvise (one TLB flush) per eviction batch.
    pub batched_unmap: c_int,
    /// 1: io_uring write-back.
    pub io_uring: c_int,
    /// 1: UFFDIO_MOVE of huge pages into views.
    pub uffd_move: c_int,
    /// 1: UFFDIO_POISON.
    pub uffd_poison: c_int,
    /// 1: the PAGEMAP_SCAN ioctl.
    pub pagemap_scan: c_int,
}

/// `upager_info`: what the kernel let the pager use (probed when it was
/// created), into `*out` (`out->size` set by the caller).
///
/// # Safety
/// `p` is NULL or a live pager handle; `out` is NULL or valid for reading
/// and writing one `struct upager_info`.
#[no_mangle]
pub unsafe extern "C" fn upager_info(p: *const upager_t, out: *mut upager_info) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let h = unsafe { handle(p, "pager") }?;
        // SAFETY: by this function's contract (NULL is refused by as_mut).
        let o = unsafe { out.as_mut() }.ok_or_else(|| Failure::inval("info is NULL"))?;
        fill_info(o, &h.pager)
    })
}

/// Fills `o` (its `size` checked) with `pager`'s info: `upager_info` and
/// `upager_umap_info`.
pub(crate) fn fill_info(o: &mut upager_info, pager: &Pager) -> Result<c_int, Failure> {
    checked_size(o.size, std::mem::size_of::<upager_info>(), "upager_info")?;
    let i = pager.info();
    *o = upager_info {
        size: o.size,
        fault_mode: fault_mode_code(i.fault_mode)?,
        user_mode_only: c_int::from(i.user_mode_only),
        syscalls_fault_in: c_int::from(i.syscalls_fault_in()),
        batched_unmap: c_int::from(i.batched_unmap),
        io_uring: c_int::from(i.io_uring),
        uffd_move: c_int::from(i.uffd_move),
        uffd_poison: c_int::from(i.uffd_poison),
        pagemap_scan: c_int::from(i.pagemap_scan),
    };
    Ok(0)
}

/// `upager_fault_mode_name`: "handlers", "in-thread", or NULL for a value
/// that is no mode (`UPAGER_FAULT_FROM_ENV` included); static strings.
#[no_mangle]
pub extern "C" fn upager_fault_mode_name(mode: c_int) -> *const c_char {
    match mode {
        UPAGER_FAULT_HANDLERS => c"handlers".as_ptr(),
        UPAGER_FAULT_IN_THREAD => c"in-thread".as_ptr(),
        _ => std::ptr::null(),
    }
}

/// `upager_destroy`: releases the pager handle.
///
/// # Safety
/// `p` is NULL or a live handle from `upager_create`, not used afterwards
/// and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn upager_destroy(p: *mut upager_t) {
    if !p.is_null() {
        // SAFETY: `p` came from Box::into_raw in upager_create and is
        // released once, by this function's contract.
        let b = unsafe { Box::from_raw(p) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(b)));
    }
}

/// Reads the map options (NULL: defaults).
///
/// # Safety
/// `o` is NULL or points to an initialised `struct upager_map_options`.
unsafe fn map_opts(
    o: *const upager_map_options,
) -> Result<(MapOptions, upager_map_options), Failure> {
    // SAFETY: NULL or valid, by this function's contract.
    let o = match unsafe { o.as_ref() } {
        Some(o) => *o,
        None => default_map_options(),
    };
    checked_size(
        o.size,
        std::mem::size_of::<upager_map_options>(),
        "upager_map_options",
    )?;
    if o.flags & !MAP_FLAGS != 0 {
        return Err(Failure::inval(format!(
            "unknown map flags {:#x}",
            o.flags & !MAP_FLAGS
        )));
    }
    let warm = if o.flags & UPAGER_MAP_WARM_RECORD != 0 {
        engine::WarmStart::Record
    } else if o.flags & UPAGER_MAP_WARM != 0 {
        engine::WarmStart::Auto
    } else {
        engine::WarmStart::Off
    };
    let mut m = MapOptions::new()
        .writable(o.flags & UPAGER_MAP_WRITE != 0)
        .offset(o.offset)
        .warm(warm);
    if o.folio != 0 {
        m = m.folio(o.folio);
    }
    if o.length != 0 {
        m = m.len(o.length);
    }
    if !o.addr.is_null() {
        let folio = if o.folio == 0 {
            engine::DEFAULT_FOLIO
        } else {
            o.folio
        };
        if o.length == 0 || !folio.is_power_of_two() {
            return Err(Failure::inval(
                "a fixed address (upager_map_options.addr) needs the length too".to_string(),
            ));
        }
        let len = o.length.div_ceil(folio) * folio;
        // SAFETY: the C caller hands [addr, addr + len) over by setting
        // `addr` (upager.h: the range is replaced as MAP_FIXED does).
        m = m.at(unsafe { engine::FixedRange::new(o.addr as u64, len) });
    }
    Ok((m, o))
}

/// The store URL of the map options (`store`), if set.
///
/// # Safety
/// `o.store` is NULL or a NUL-terminated string (upager.h).
unsafe fn store_url(o: &upager_map_options) -> Result<Option<upager_stores::AnyUrl>, Failure> {
    if o.store.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated by this function's contract.
    let s = unsafe { c_str(o.store, "upager_map_options.store") }?;
    Ok(Some(s.parse()?))
}

/// Refuses a store URL where the call takes its data from elsewhere.
fn no_store_url(url: Option<upager_stores::AnyUrl>, call: &str, from: &str) -> Result<(), Failure> {
    match url {
        None => Ok(()),
        Some(u) => Err(Failure::inval(format!(
            "{call} maps {from}, but upager_map_options.store is set ({u}): leave it NULL, or map the store with upager_map_file(pager, NULL, opts, out)"
        ))),
    }
}

/// `upager_map_file`: maps a file by path.
///
/// # Safety
/// `p` is a live pager handle; `path` a NUL-terminated string; `opts` NULL
/// or initialised; `out` valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn upager_map_file(
    p: *const upager_t,
    path: *const c_char,
    opts: *const upager_map_options,
    out: *mut *mut upager_region_t,
) -> c_int {
    guard(|| {
        // SAFETY: all four pointers meet the contract stated above (a NULL
        // path is allowed with a store URL).
        let (h, (m, o)) = unsafe { (handle(p, "pager")?, map_opts(opts)?) };
        // SAFETY: `o` came from the caller's initialised options.
        let region = match (unsafe { store_url(&o) }?, path.is_null()) {
            (Some(url), true) => upager_stores::map(&h.pager, &url, &m)?,
            (Some(url), false) => {
                return Err(Failure::inval(format!(
                    "give a path or a store URL (upager_map_options.store = {url}), not both: the path must be NULL to map the store"
                )))
            }
            (None, _) => {
                // SAFETY: as above.
                let path = unsafe { c_str(path, "path") }?;
                h.pager.map_file(path, &m)?
            }
        };
        // SAFETY: as above.
        unsafe {
            put(
                out,
                upager_region_t {
                    region: Some(region),
                },
            )
        }
    })
}

/// `upager_map_store`: maps a store of the program's own callbacks
/// (`struct upager_store_ops`, see [`crate::store`]).
///
/// # Safety
/// `p` is a live pager handle; `ops` NULL or initialised (its callbacks
/// and context as upager.h requires); `opts` NULL or initialised; `out`
/// valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn upager_map_store(
    p: *const upager_t,
    ops: *const crate::store::upager_store_ops,
    opts: *const upager_map_options,
    out: *mut *mut upager_region_t,
) -> c_int {
    guard(|| {
        // SAFETY: the pointers meet the contract stated above.
        let (h, (m, o), store) = unsafe {
            (
                handle(p, "pager")?,
                map_opts(opts)?,
                crate::store::store_from(ops)?,
            )
        };
        // SAFETY: `o` came from the caller's initialised options.
        let url = unsafe { store_url(&o) }?;
        no_store_url(url, "upager_map_store", "the callbacks' store")?;
        let region = h.pager.map_store(std::sync::Arc::new(store), &m)?;
        // SAFETY: as above.
        unsafe {
            put(
                out,
                upager_region_t {
                    region: Some(region),
                },
            )
        }
    })
}

/// Access mode of a descriptor (O_RDONLY / O_WRONLY / O_RDWR), or EBADF.
pub(crate) fn fd_access_mode(fd: c_int) -> Result<c_int, Failure> {
    // SAFETY: F_GETFL takes no pointer argument and only reads the
    // descriptor table; any integer is safe to pass (EBADF if not open).
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(Failure::new(
            libc::EBADF,
            format!("file descriptor {fd} is not open"),
        ));
    }
    Ok(fl & libc::O_ACCMODE)
}

/// Duplicates `fd` into a `File` the region owns, after checking that it
/// allows the access asked for.
pub(crate) fn dup_fd(fd: c_int, writable: bool) -> Result<std::fs::File, Failure> {
    let mode = fd_access_mode(fd)?;
    if mode == libc::O_WRONLY {
        return Err(Failure::new(libc::EACCES, format!("file descriptor {fd} is open write-only: upager needs to read it (open it O_RDONLY or O_RDWR)")));
    }
    if writable && mode != libc::O_RDWR {
        return Err(Failure::new(libc::EACCES, format!("file descriptor {fd} is open read-only but a writable mapping was asked for: open it O_RDWR, or map it read-only")));
    }
    // SAFETY: fcntl(F_GETFL) just succeeded, so `fd` is open; the borrow
    // lasts only for the duplication below, during which the caller keeps
    // it open (upager.h: the descriptor must stay open during the call).
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    let owned = b.try_clone_to_owned().map_err(|e| {
        Failure::new(
            e.raw_os_error().unwrap_or(libc::EBADF),
            format!("duplicating file descriptor {fd}: {e}"),
        )
    })?;
    Ok(std::fs::File::from(owned))
}

/// `upager_map_fd`: maps an open file (the descriptor is duplicated).
///
/// # Safety
/// `p` is a live pager handle; `opts` NULL or initialised; `out` valid for
/// one pointer write.
#[no_mangle]
pub unsafe extern "C" fn upager_map_fd(
    p: *const upager_t,
    fd: c_int,
    opts: *const upager_map_options,
    out: *mut *mut upager_region_t,
) -> c_int {
    guard(|| {
        // SAFETY: the pointers meet the contract stated above.
        let (h, (m, o)) = unsafe { (handle(p, "pager")?, map_opts(opts)?) };
        // SAFETY: `o` came from the caller's initialised options.
        let url = unsafe { store_url(&o) }?;
        no_store_url(url, "upager_map_fd", "a file descriptor")?;
        let file = dup_fd(fd, o.flags & UPAGER_MAP_WRITE != 0)?;
        let region = h.pager.map_open_file(file, &m)?;
        // SAFETY: as above.
        unsafe {
            put(
                out,
                upager_region_t {
                    region: Some(region),
                },
            )
        }
    })
}

/// `upager_map_anonymous`: maps zero-filled memory backed by private swap.
///
/// # Safety
/// `p` is a live pager handle; `opts` NULL or initialised; `out` valid for
/// one pointer write.
#[no_mangle]
pub unsafe extern "C" fn upager_map_anonymous(
    p: *const upager_t,
    length: u64,
    opts: *const upager_map_options,
    out: *mut *mut upager_region_t,
) -> c_int {
    guard(|| {
        // SAFETY: the pointers meet the contract stated above.
        let (h, (m, o)) = unsafe { (handle(p, "pager")?, map_opts(opts)?) };
        if o.length != 0 {
            return Err(Failure::inval(
                "upager_map_anonymous takes its length as an argument: leave opts.length 0",
            ));
        }
        // SAFETY: `o` came from the caller's initialised options.
        let region = match unsafe { store_url(&o) }? {
            // Far memory: a Redis Cluster, or an S3 bucket or prefix.
            Some(url) => upager_stores::map_anonymous(&h.pager, &url, length, &m)?,
            None => h.pager.map_anonymous(length, &m)?,
        };
        // SAFETY: as above.
        unsafe {
            put(
                out,
                upager_region_t {
                    region: Some(region),
                },
            )
        }
    })
}

/// `upager_store_load`: uploads the file at `path` as the new dataset
/// `url` names, in chunks of `chunk` bytes (0: 64 KiB).
///
/// # Safety
/// `path` and `url` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn upager_store_load(
    path: *const c_char,
    url: *const c_char,
    chunk: u64,
) -> c_int {
    guard(|| {
        // SAFETY: both strings meet the contract stated above.
        let (path, url) = unsafe { (c_str(path, "path")?, c_str(url, "url")?) };
        let url: upager_redis::StoreUrl = url.parse()?;
        let chunk = if chunk == 0 {
            upager_redis::DEFAULT_CHUNK
        } else {
            chunk
        };
        upager_redis::upload(
            path.as_ref(),
            &url,
            chunk,
            &upager_redis::RedisOptions::default(),
            &mut |_, _| {},
        )?;
        Ok(0)
    })
}

/// `struct upager_dataset`: one dataset, as `upager_store_list` reports it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct upager_dataset {
    /// The name, NUL-terminated (names are at most 200 bytes).
    pub name: [c_char; 256],
    /// Bytes.
    pub length: u64,
    /// Chunk size (one key each).
    pub chunk: u64,
    /// 1: complete (opens); 0: an upload running, interrupted or killed.
    pub complete: c_int,
}

/// `upager_store_list`: the datasets on the cluster `url` names, complete
/// or not, sorted by name; the first `cap` into `out`, returns how many.
///
/// # Safety
/// `url` is a NUL-terminated string; `out` is valid for `cap` writes (or
/// NULL with `cap == 0`).
#[no_mangle]
pub unsafe extern "C" fn upager_store_list(
    url: *const c_char,
    out: *mut upager_dataset,
    cap: usize,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let url: upager_redis::StoreUrl = unsafe { c_str(url, "url")? }.parse()?;
        if out.is_null() && cap != 0 {
            return Err(Failure::inval("out is NULL"));
        }
        let all = upager_redis::list(&url, &upager_redis::RedisOptions::default())?;
        for (i, d) in all.iter().take(cap).enumerate() {
            let mut e = upager_dataset {
                name: [0; 256],
                length: d.len,
                chunk: d.chunk,
                complete: c_int::from(d.complete),
            };
            for (dst, &b) in e.name.iter_mut().zip(d.name.as_bytes().iter().take(255)) {
                *dst = b as c_char;
            }
            // SAFETY: i < cap and `out` has room for cap entries.
            unsafe { out.add(i).write(e) };
        }
        c_int::try_from(all.len()).map_err(|_| Failure::new(libc::EOVERFLOW, "too many datasets"))
    })
}

/// `upager_store_delete`: removes the dataset `url` names, complete or not.
///
/// # Safety
/// `url` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn upager_store_delete(url: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let url: upager_redis::StoreUrl = unsafe { c_str(url, "url")? }.parse()?;
        upager_redis::delete(&url, &upager_redis::RedisOptions::default(), &mut |_, _| {})?;
        Ok(0)
    })
}

/// Borrows the live region of a handle.
///
/// # Safety
/// As [`handle`].
unsafe fn region<'a>(r: *const upager_region_t) -> Result<&'a Region, Failure> {
    // SAFETY: forwarded contract.
    let h = unsafe { handle(r, "region") }?;
    h.region
        .as_ref()
        .ok_or_else(|| Failure::inval("region is being unmapped by another thread"))
}

/// `upager_region_addr`: first byte of the region (NULL for NULL).
///
/// # Safety
/// `r` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_region_addr(r: *const upager_region_t) -> *mut c_void {
    // SAFETY: by this function's contract.
    match unsafe { region(r) } {
        Ok(r) => r.as_ptr().cast(),
        Err(_) => std::ptr::null_mut(),
    }
}

/// `upager_region_length`: bytes mapped (0 for NULL).
///
/// # Safety
/// `r` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_region_length(r: *const upager_region_t) -> u64 {
    // SAFETY: by this function's contract.
    unsafe { region(r) }.map_or(0, |r| r.len() as u64)
}

/// `upager_region_folio`: folio size (0 for NULL).
///
/// # Safety
/// `r` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_region_folio(r: *const upager_region_t) -> u64 {
    // SAFETY: by this function's contract.
    unsafe { region(r) }.map_or(0, |r| r.folio_size())
}

/// `upager_region_writable`: 1 if writable, 0 if read-only or NULL.
///
/// # Safety
/// `r` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_region_writable(r: *const upager_region_t) -> c_int {
    // SAFETY: by this function's contract.
    unsafe { region(r) }.map_or(0, |r| c_int::from(r.is_writable()))
}

/// `upager_after_fork`: rebuilds a fork child's pagers if its fork
/// handlers did not (see `upager::after_fork`).
#[no_mangle]
pub extern "C" fn upager_after_fork() {
    engine::after_fork();
}

/// `upager_flush`: writes dirty data back and fdatasyncs.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_flush(r: *const upager_region_t) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        r.flush()?;
        Ok(0)
    })
}

/// `upager_unmap`: flushes, unmaps and frees the handle.
///
/// # Safety
/// `r` is NULL or a live region handle that no other thread uses during the
/// call; on success (and with `UPAGER_UNMAP_FORCE`, always) it is freed.
#[no_mangle]
pub unsafe extern "C" fn upager_unmap(r: *mut upager_region_t, flags: u32) -> c_int {
    guard(|| {
        if r.is_null() {
            return Ok(0);
        }
        if flags & !UPAGER_UNMAP_FORCE != 0 {
            return Err(Failure::inval(format!(
                "unknown unmap flags {:#x}",
                flags & !UPAGER_UNMAP_FORCE
            )));
        }
        // SAFETY: `r` is a live handle used by no other thread now, by this
        // function's contract, so a unique reference is sound.
        let h = unsafe { &mut *r };
        let Some(reg) = h.region.take() else {
            return Err(Failure::inval("region is being unmapped by another thread"));
        };
        let result = match reg.unmap() {
            Ok(()) => Ok(0),
            Err((e, reg)) => {
                let fail = Failure::from(e);
                if flags & UPAGER_UNMAP_FORCE == 0 {
                    h.region = Some(reg);
                    return Err(fail);
                }
                // Dropping unmaps; the unwritten data is lost, as asked.
                drop(reg);
                Err(fail)
            }
        };
        // SAFETY: `r` came from Box::into_raw in a map function and its
        // region is gone; it is freed once, here.
        drop(unsafe { Box::from_raw(r) });
        result
    })
}

fn c_names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| {
        Stats::NAMES
            .iter()
            .map(|n| CString::new(*n).unwrap_or_default())
            .collect()
    })
}

/// `upager_stat_count`: number of counters.
#[no_mangle]
pub extern "C" fn upager_stat_count() -> usize {
    Stats::NAMES.len()
}

/// `upager_stat_name`: name of counter `i` (NULL past the end); static.
#[no_mangle]
pub extern "C" fn upager_stat_name(i: usize) -> *const c_char {
    c_names().get(i).map_or(std::ptr::null(), |c| c.as_ptr())
}

/// Looks one counter up by name and stores it.
///
/// # Safety
/// `name` is a NUL-terminated string; `value` is valid for one u64 write.
pub(crate) unsafe fn stat_by_name(
    stats: &Stats,
    name: *const c_char,
    value: *mut u64,
) -> Result<c_int, Failure> {
    // SAFETY: forwarded contract.
    unsafe { stat_or_store_by_name(stats, &[], name, value) }
}

/// [`stat_by_name`] that also knows a store's own counters (`store`:
/// `Region::store_counters`).
///
/// # Safety
/// As [`stat_by_name`].
unsafe fn stat_or_store_by_name(
    stats: &Stats,
    store: &[(&'static str, u64)],
    name: *const c_char,
    value: *mut u64,
) -> Result<c_int, Failure> {
    // SAFETY: forwarded contract.
    let name = unsafe { c_str(name, "name") }?;
    let own = store.iter().find(|(n, _)| *n == name).map(|&(_, v)| v);
    let v = own.or_else(|| stats.get(name)).ok_or_else(|| {
        let store_names: Vec<&str> = store.iter().map(|(n, _)| *n).collect();
        Failure::new(
            libc::ENOENT,
            format!(
                "no counter called {name:?}; the names are: {}{}{}",
                Stats::NAMES.join(", "),
                if store.is_empty() {
                    ""
                } else {
                    "; the store's: "
                },
                store_names.join(", ")
            ),
        )
    })?;
    if value.is_null() {
        return Err(Failure::inval("value is NULL"));
    }
    // SAFETY: non-NULL and writable by this function's contract.
    unsafe { value.write(v) };
    Ok(0)
}

/// `upager_stat`: one counter of a pager, by name.
///
/// # Safety
/// `p` is a live pager handle; `name` a NUL-terminated string; `value`
/// valid for one write.
#[no_mangle]
pub unsafe extern "C" fn upager_stat(
    p: *const upager_t,
    name: *const c_char,
    value: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let h = unsafe { handle(p, "pager") }?;
        // SAFETY: by this function's contract.
        unsafe { stat_by_name(&h.pager.stats(), name, value) }
    })
}

/// `upager_region_stat`: one counter of the pager a region belongs to.
///
/// # Safety
/// `r` is a live region handle; `name` a NUL-terminated string; `value`
/// valid for one write.
#[no_mangle]
pub unsafe extern "C" fn upager_region_stat(
    r: *const upager_region_t,
    name: *const c_char,
    value: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        // SAFETY: by this function's contract.
        unsafe { stat_or_store_by_name(&r.pager_stats(), &r.store_counters(), name, value) }
    })
}

/// `upager_stats`: all counters in name order; returns how many exist.
///
/// # Safety
/// `p` is a live pager handle; `values` is valid for `n` u64 writes (or
/// NULL with `n == 0`).
#[no_mangle]
pub unsafe extern "C" fn upager_stats(p: *const upager_t, values: *mut u64, n: usize) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let h = unsafe { handle(p, "pager") }?;
        if values.is_null() && n != 0 {
            return Err(Failure::inval("values is NULL"));
        }
        let s = h.pager.stats();
        for (i, (_, v)) in s.iter().take(n).enumerate() {
            // SAFETY: i < n and `values` has room for n u64s, by contract.
            unsafe { values.add(i).write(v) };
        }
        Ok(Stats::NAMES.len() as c_int)
    })
}

/// `upager_strerror`: static text for an errno (either sign).
#[no_mangle]
pub extern "C" fn upager_strerror(err: c_int) -> *const c_char {
    static CACHE: OnceLock<Mutex<HashMap<c_int, &'static CStr>>> = OnceLock::new();
    let mut m = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = err.checked_abs().unwrap_or(0);
    let s: &'static CStr = m.entry(key).or_insert_with(|| {
        // Leaked once per distinct errno value (a few dozen at most): the
        // pointer must stay valid forever.
        Box::leak(
            CString::new(error::errno_text(key))
                .unwrap_or_default()
                .into_boxed_c_str(),
        )
    });
    s.as_ptr()
}

/// `upager_last_error`: message of the last failed call on this thread.
#[no_mangle]
pub extern "C" fn upager_last_error() -> *const c_char {
    error::last_ptr()
}

/// `upager_version`: the library version, like "0.1.0".
#[no_mangle]
pub extern "C" fn upager_version() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(c) => c,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}

/// One run of equal residency (`struct upager_extent`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct upager_extent {
    /// Start, in bytes from the region's start.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// `UPAGER_RESIDENT_CLEAN` .. `UPAGER_BUSY`.
    pub state: c_int,
}

/// The C value of a residency state (upager.h `UPAGER_*`).
fn residency_code(s: engine::Residency) -> c_int {
    match s {
        engine::Residency::ResidentClean => 0,
        engine::Residency::ResidentDirty => 1,
        engine::Residency::Evicted => 2,
        engine::Residency::NeverTouched => 3,
        // Busy, and any state a later engine adds.
        _ => 4,
    }
}

/// `upager_residency`: runs of equal residency over a range.
///
/// # Safety
/// `r` is a live region handle; `out` is valid for `cap` writes (or NULL
/// with `cap == 0`).
#[no_mangle]
pub unsafe extern "C" fn upager_residency(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
    out: *mut upager_extent,
    cap: usize,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        if out.is_null() && cap != 0 {
            return Err(Failure::inval("out is NULL"));
        }
        let runs = r.residency(offset, length)?;
        for (i, (range, s)) in runs.iter().take(cap).enumerate() {
            let e = upager_extent {
                offset: range.start,
                length: range.end - range.start,
                state: residency_code(*s),
            };
            // SAFETY: i < cap and `out` has room for cap extents.
            unsafe { out.add(i).write(e) };
        }
        c_int::try_from(runs.len()).map_err(|_| Failure::new(libc::EOVERFLOW, "too many extents"))
    })
}

/// `upager_mincore`: one byte per 4 KiB page, bit 0 = resident.
///
/// # Safety
/// `r` is a live region handle; `vec` is valid for `(length + 4095) / 4096`
/// byte writes.
#[no_mangle]
pub unsafe extern "C" fn upager_mincore(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
    vec: *mut u8,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        if vec.is_null() {
            return Err(Failure::inval("vec is NULL"));
        }
        let v = r.mincore(offset, length)?;
        // SAFETY: the engine returns one byte per page of the range, which
        // is the size the caller provides by this function's contract; the
        // buffers cannot overlap (`v` is freshly allocated).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), vec, v.len()) };
        Ok(0)
    })
}

/// `upager_pageout`: evicts the range now; returns folios evicted.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_pageout(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
) -> i64 {
    // SAFETY: by this function's contract.
    counted(|| Ok(unsafe { region(r) }?.pageout(offset, length)?))
}

/// `upager_invalidate`: drops the clean folios the range touches; returns
/// how many.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_invalidate(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
) -> i64 {
    // SAFETY: by this function's contract.
    counted(|| Ok(unsafe { region(r) }?.invalidate(offset, length)?))
}

/// `UPAGER_FETCH_WRITE`: `upager_fetch` for a scatter (writable, dirty).
pub const UPAGER_FETCH_WRITE: u32 = 1;

/// `upager_fetch`: reads the folios holding the bytes at `offsets` in now,
/// in batches; returns how many it read.
///
/// # Safety
/// `r` is a live region handle; `offsets` points to `count` readable
/// `u64`s (or is anything when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn upager_fetch(
    r: *const upager_region_t,
    offsets: *const u64,
    count: usize,
    flags: u32,
) -> i64 {
    counted(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        check_flags(flags, UPAGER_FETCH_WRITE, "fetch")?;
        if count == 0 {
            return Ok(0);
        }
        if offsets.is_null() {
            return Err(Failure::inval("offsets is NULL"));
        }
        // SAFETY: by this function's contract, `count` u64s at `offsets`
        // (not NULL, checked above), read only during this call.
        let offs = unsafe { std::slice::from_raw_parts(offsets, count) };
        Ok(if flags & UPAGER_FETCH_WRITE != 0 {
            r.fetch_for_write(offs)?
        } else {
            r.fetch(offs)?
        })
    })
}

/// EINVAL for any of `flags` outside `known` (of the call `what`).
fn check_flags(flags: u32, known: u32, what: &str) -> Result<(), Failure> {
    if flags & !known != 0 {
        return Err(Failure::inval(format!(
            "unknown {what} flags {:#x}",
            flags & !known
        )));
    }
    Ok(())
}

/// Runs `f` under [`guard`]: its count, or the negative errno of its error.
fn counted(f: impl FnOnce() -> Result<u64, Failure>) -> i64 {
    let mut n = 0u64;
    let rc = guard(|| {
        n = f()?;
        Ok(0)
    });
    if rc < 0 {
        i64::from(rc)
    } else {
        n as i64
    }
}

/// `upager_prefetch`: starts filling the range in the background.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_prefetch(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        r.prefetch(offset, length)?;
        Ok(0)
    })
}

/// `upager_fault_in`: makes the range resident now, in the calling thread
/// (for system calls on region memory in in-thread mode).
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_fault_in(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
    flags: u32,
) -> c_int {
    // SAFETY: by this function's contract.
    unsafe {
        with_write_flag(r, flags, UPAGER_FAULT_IN_WRITE, "fault-in", |r, w| {
            r.fault_in(offset, length, w)
        })
    }
}

/// `UPAGER_PIN_WRITE`: `upager_pin` as write faults (dirty, writable).
pub const UPAGER_PIN_WRITE: u32 = 1;

/// `upager_pin`: pins the range (resident until unpinned).
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_pin(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
    flags: u32,
) -> c_int {
    // SAFETY: by this function's contract.
    unsafe {
        with_write_flag(r, flags, UPAGER_PIN_WRITE, "pin", |r, w| {
            r.pin(offset, length, w)
        })
    }
}

/// The body of the range calls whose only flag is a write flag
/// (`upager_fault_in`, `upager_pin`): checks the flags, runs `call`.
///
/// # Safety
/// `r` is a live region handle.
unsafe fn with_write_flag(
    r: *const upager_region_t,
    flags: u32,
    write_flag: u32,
    what: &str,
    call: impl FnOnce(&Region, bool) -> Result<(), engine::AdviseError>,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        check_flags(flags, write_flag, what)?;
        call(r, flags & write_flag != 0)?;
        Ok(0)
    })
}

/// `upager_unpin`: undoes one pin of the range.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_unpin(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        r.unpin(offset, length)?;
        Ok(0)
    })
}

/// `upager_prefetch_wait`: waits for queued prefetches.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_prefetch_wait(r: *const upager_region_t, timeout_ms: u32) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        if r.wait_prefetch(std::time::Duration::from_millis(u64::from(timeout_ms))) {
            Ok(0)
        } else {
            Err(Failure::new(
                libc::ETIMEDOUT,
                format!("prefetches still running after {timeout_ms} ms"),
            ))
        }
    })
}

/// `upager_discard`: drops the range's contents.
///
/// # Safety
/// `r` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn upager_discard(
    r: *const upager_region_t,
    offset: u64,
    length: u64,
) -> c_int {
    guard(|| {
        // SAFETY: by this function's contract.
        let r = unsafe { region(r) }?;
        r.discard(offset, length)?;
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C constants and names are the engine's modes and names (one
    /// name on every face), and every constant round-trips.
    #[test]
    fn fault_mode_constants_and_names_are_the_engines() {
        for m in [FaultMode::Handlers, FaultMode::InThread] {
            let code = fault_mode_code(m).unwrap();
            assert_eq!(fault_mode_arg(code).unwrap(), Some(m));
            // SAFETY: upager_fault_mode_name returns NULL or a static
            // NUL-terminated string; it is not NULL for a mode's code.
            let name = unsafe { CStr::from_ptr(upager_fault_mode_name(code)) };
            assert_eq!(name.to_str().unwrap(), m.name());
        }
        assert_eq!(fault_mode_arg(UPAGER_FAULT_FROM_ENV).unwrap(), None);
        assert!(upager_fault_mode_name(UPAGER_FAULT_FROM_ENV).is_null());
        let e = fault_mode_arg(2).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        assert!(e.msg.contains("UPAGER_FAULT_IN_THREAD (1)"), "{}", e.msg);
    }
}
