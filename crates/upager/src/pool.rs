//! Page pools: one copy of a file's pages per host, shared by every process
//! that maps the file (the kernel's page cache, from user space).
//!
//! A pool is two files in a directory only its user can enter
//! (`/dev/shm/upager-UID/`, or `UPAGER_POOL_DIR`), named by a hash of the
//! data's identity ([`Store::pool_key`]: a file's device, inode, size and
//! times): `NAME.data`, the pages themselves (tmpfs, sparse: a folio is
//! resident where the file has a page), and `NAME.meta`, a header and one
//! state word per folio. Every process maps both `MAP_SHARED`. A region's
//! view is the data file mapped over the region's range and registered
//! with userfaultfd for MISSING faults only, so:
//! - a page any process (or this one's readahead) brought in is mapped by
//!   the kernel's own shmem fault path, with fault-around, no round trip
//!   to user space;
//! - only a page no process holds raises a fault here, resolved by one
//!   store read and one `UFFDIO_COPY` into the view, which puts the page in
//!   the shared file whole (a page is never visible half-written: that is
//!   why fills copy and do not `pread` into the file);
//! - eviction punches holes in the data file (`fallocate(PUNCH_HOLE)`),
//!   which removes the pages from every process's view at once, and a
//!   later access faults here again.
//!
//! Contract (state word per folio, in the meta file):
//! - `EMPTY` → `FILLING(slot)` → `RESIDENT(stamp)` → `EVICTING(slot)` →
//!   `EMPTY`. Only the owner of a FILLING or EVICTING word (the process in
//!   attach slot `slot`) moves it on. A folio's bytes are in the data file
//!   exactly while its word is RESIDENT (or FILLING/EVICTING, in part).
//! - Budget: the header's `resident` counts the bytes of FILLING, RESIDENT
//!   and EVICTING folios. A fill reserves its bytes before it claims
//!   (evicting first while the reservation does not fit), an eviction
//!   returns them after the hole is punched: the pool's pages never exceed
//!   its budget, whatever the number of processes (one exception, counted
//!   in `pool_overcommits`: a fill that found nothing to evict for
//!   [`ROOM_WAIT`] goes ahead, so that every fault ends).
//! - Eviction ([`Pool::evict_batch`] drives, one word per step): a CLOCK
//!   hand over the state words, shared by all processes; a RESIDENT word
//!   is claimed EVICTING if it is old: filled at least half a budget's
//!   worth of fills ago (its stamp, the pool's fill count then), so a
//!   stream's current window and other processes' fresh fills stay; a
//!   lap that finds no old one takes any. Then one `fallocate(PUNCH_HOLE)` per run
//!   of adjacent victims, then the words go EMPTY and the budget back.
//! - Waiting: a fault on a FILLING or EVICTING word sets WAITERS and sleeps
//!   on the word (a shared futex) until its owner moves it on; after each
//!   [`OWNER_CHECK`] without progress it checks that the owner's process
//!   lives (its slot's lock, below). A dead owner's word is taken over: its
//!   partial pages are punched and the fill starts again (or the eviction
//!   finishes), so a process killed mid-fill or mid-eviction leaves the
//!   pool whole for the others.
//! - Read-only regions only: the pool holds clean copies, so an eviction
//!   never writes back. (Writable regions stay private: the engine's
//!   write-protect, write-back and flush path.)
//!
//! Life cycle, with open-file-description locks on bytes of the meta file
//! (a process's locks go when it dies):
//! - `INIT` (exclusive) serialises attach and detach;
//! - `ATTACHED` (shared) is held by every attached process: an attacher
//!   that finds nobody else holding it (re)initialises the pool (a new
//!   pool, or one whose processes all died: its stale pages are dropped);
//!   a detacher that finds nobody else holding it removes the files (the
//!   last process out releases the pool);
//! - `SLOT + k` (exclusive) marks attach slot `k` taken by a live process:
//!   the owner field of FILLING and EVICTING words.
//!
//! Counters (in the meta header, pool-wide, as `pool_*` beside the store's
//! counters of every region of the pool): `pool_fills`, `pool_fill_bytes`,
//! `pool_evictions`, `pool_evict_batches`, `pool_punches`,
//! `pool_takeovers`, `pool_waits`, `pool_overcommits`, `pool_punch_errors`,
//! and the gauges
//! `pool_resident_bytes`, `pool_budget_bytes`, `pool_procs`.
//!
//! Uses: nothing of the engine (its faults are resolved in `poolfault`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::private_dir::PrivateDirError;
use std::time::{Duration, Instant};

use upager_sys::futex;
use upager_sys::io::{ofd_lock, ofd_probe, LockKind};
use upager_sys::mem::Mapping;

/// Where pools live unless `UPAGER_POOL_DIR` says otherwise: tmpfs.
const POOL_ROOT: &str = "/dev/shm";
/// The environment variable naming the directory of this user's pools.
pub const POOL_DIR_ENV: &str = "UPAGER_POOL_DIR";

const MAGIC: u64 = u64::from_le_bytes(*b"upgpool1");
/// Header words (the meta file's first [`STATES`] words).
const W_MAGIC: usize = 0;
const W_SHIFT: usize = 1;
const W_FOLIOS: usize = 2;
const W_BUDGET: usize = 3;
const W_RESIDENT: usize = 4;
const W_HAND: usize = 5;
const W_FILLS: usize = 6;
const W_FILL_BYTES: usize = 7;
const W_EVICTIONS: usize = 8;
const W_EVICT_BATCHES: usize = 9;
const W_PUNCHES: usize = 10;
const W_TAKEOVERS: usize = 11;
const W_WAITS: usize = 12;
const W_OVERCOMMITS: usize = 13;
const W_PUNCH_ERRORS: usize = 14;
const W_KEY_LEN: usize = 15;
/// The identity key, up to [`KEY_WORDS`] words.
const W_KEY: usize = 16;
const KEY_WORDS: usize = 48;
/// Attach slots: the pid of each slot's process (0: free).
const W_SLOTS: usize = 64;
/// Processes that may attach to one pool at once.
pub(crate) const MAX_SLOTS: usize = 128;
/// The first state word.
const STATES: usize = W_SLOTS + MAX_SLOTS;

/// Lock bytes in the meta file (far past its data; locks need no bytes).
const L_INIT: u64 = 1 << 40;
const L_ATTACHED: u64 = L_INIT + 1;
const L_SLOT: u64 = L_INIT + 16;

/// State word: kind in the low two bits, WAITERS, the owner's slot + 1
/// (bits 8-15), and a RESIDENT word's fill stamp (the high half).
const EMPTY: u64 = 0;
const FILLING: u64 = 1;
const RESIDENT: u64 = 2;
const EVICTING: u64 = 3;
const KIND: u64 = 3;
const WAITERS: u64 = 1 << 2;
const OWNER_SHIFT: u32 = 8;
/// A RESIDENT word's high half: the pool's fill count when it was filled.
const STAMP_SHIFT: u32 = 32;

/// How long a waiter sleeps before it checks that the owner lives.
pub(crate) const OWNER_CHECK: Duration = Duration::from_millis(20);
/// How long a fill waits for room (nothing evictable: every other folio
/// being filled) before it goes over the budget.
pub(crate) const ROOM_WAIT: Duration = Duration::from_secs(2);
/// Most folios one eviction batch takes (one stack array: async-signal-safe).
const MAX_BATCH: usize = 256;
/// State words the hand advances per step of a scan.
const SCAN_STEP: u64 = 64;

/// Why a region could not join a pool (it is then mapped privately, and
/// the reason logged once).
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum PoolError {
    /// the pool directory {dir} is not this user's alone (owner uid {owner}, mode {mode:o}): remove it or set UPAGER_POOL_DIR to a directory only you can enter
    NotPrivate {
        /// The directory.
        dir: String,
        /// Its owner.
        owner: u32,
        /// Its mode.
        mode: u32,
    },
    /// the pool {path} was made for other data or another folio size ({what}); it is used by other processes: this region is mapped privately
    Mismatch {
        /// The meta file.
        path: String,
        /// What differs.
        what: &'static str,
    },
    /// {dir} has {free} bytes free, less than the pool's budget of {need}: set UPAGER_POOL_DIR to a larger tmpfs (a container's /dev/shm is 64 MiB unless --shm-size says more)
    NoRoom {
        /// The directory.
        dir: String,
        /// Bytes free there.
        free: u64,
        /// The budget.
        need: u64,
    },
    /// every one of the pool's {max} process slots is taken
    Full {
        /// The slots.
        max: usize,
    },
    /// could not open the pool in {dir}: {source}
    Io {
        /// The directory.
        dir: String,
        /// The cause.
        source: io::Error,
    },
}

/// A page pool, as [`Region::pool_info`](crate::Region::pool_info) and
/// [`pools`] report it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolInfo {
    /// The pool's data file (its pages; the meta file is beside it).
    pub data_path: PathBuf,
    /// What the pool holds: its data's identity (for a file: `file
    /// DEV:INODE SIZE MTIME CTIME`).
    pub key: String,
    /// The pool's budget in bytes, set by the process that made it.
    pub budget: u64,
    /// Bytes in the pool now (being filled, resident or being evicted).
    pub resident: u64,
    /// Processes attached to it now.
    pub procs: usize,
    /// Their process ids (as each saw itself when it attached).
    pub pids: Vec<u32>,
    /// The pool's counters (`pool_fills`, `pool_evictions`, ...).
    pub counters: Vec<(&'static str, u64)>,
}

/// The page pools in this user's pool directory (`/dev/shm/upager-UID`,
/// or `UPAGER_POOL_DIR`), read without attaching to them; a pool being
/// made or removed as it is read may be missing.
pub fn pools() -> Result<Vec<PoolInfo>, PoolError> {
    let dir = pool_dir()?;
    let entries = std::fs::read_dir(&dir).map_err(|source| PoolError::Io {
        dir: dir.display().to_string(),
        source,
    })?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "meta") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Ok(p) = Pool::peek(&dir, name) {
            out.push(p.info());
        }
    }
    out.sort_by(|a, b| a.data_path.cmp(&b.data_path));
    Ok(out)
}

/// One attached pool: its files, its shared header and state words, and
/// this process's attach slot. One per pool per process ([`attach`]).
#[derive(Debug)]
pub(crate) struct Pool {
    /// The meta file's mapping (header, slots, state words): declared
    /// before the files, so it is unmapped first.
    meta: Mapping,
    meta_file: File,
    data: File,
    meta_path: PathBuf,
    data_path: PathBuf,
    n: usize,
    folio: u64,
    shift: u32,
    slot: usize,
    /// Set once the slot is taken: only then does the drop detach.
    attached: bool,
    /// The process that attached: a fork child's copy of the pool (its
    /// locks are the parent's open file description) detaches nothing.
    pid: u32,
}

/// The pools this process has attached, by name and the pid that attached
/// them: a second region of the same data joins the same `Pool` (one slot
/// per process). A fork child's entries are its parent's (their slot
/// locks are the parent's open file description): it attaches anew.
static ATTACHED: Mutex<Vec<(String, u32, Weak<Pool>)>> = Mutex::new(Vec::new());

/// How a claim of a state word ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Claim {
    /// This process owns the word (FILLING) and holds its budget.
    Claimed,
    /// The folio is in the pool.
    Resident,
    /// Another process is filling or evicting it: wait, then look again.
    Busy(u64),
}

/// Attaches this process to the pool of the data `key` names (`len` bytes
/// in folios of `folio`), creating it with `budget` if no process has it.
pub(crate) fn attach(key: &str, len: u64, folio: u64, budget: u64) -> Result<Arc<Pool>, PoolError> {
    let name = format!("{:016x}-{}", fnv1a(key.as_bytes()), folio.trailing_zeros());
    let mut list = ATTACHED.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    list.retain(|(_, by, w)| *by == pid && w.strong_count() > 0);
    if let Some(p) = list
        .iter()
        .find(|(n, _, _)| *n == name)
        .and_then(|(_, _, w)| w.upgrade())
    {
        return Ok(p);
    }
    let dir = pool_dir()?;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_dead(&dir));
    let io_err = |source| PoolError::Io {
        dir: dir.display().to_string(),
        source,
    };
    let pool = Pool::open(&dir, &name, key, len, folio, budget).map_err(|e| match e {
        OpenError::Io(e) => io_err(e),
        OpenError::Pool(p) => p,
    })?;
    let pool = Arc::new(pool);
    list.push((name, pid, Arc::downgrade(&pool)));
    Ok(pool)
}

/// This user's pool directory, made private (0700) if new and checked to
/// be this user's alone if not.
fn pool_dir() -> Result<PathBuf, PoolError> {
    pool_dir_at(std::env::var_os(POOL_DIR_ENV))
}

/// [`pool_dir`] with `UPAGER_POOL_DIR` as `var`.
fn pool_dir_at(var: Option<std::ffi::OsString>) -> Result<PathBuf, PoolError> {
    let uid = crate::private_dir::my_uid().map_err(|source| PoolError::Io {
        dir: "/proc/self".into(),
        source,
    })?;
    let dir = match var.filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => Path::new(POOL_ROOT).join(format!("upager-{uid}")),
    };
    match crate::private_dir::make_private_dir(&dir, false) {
        Ok(()) => Ok(dir),
        Err(PrivateDirError::Io(source)) => Err(PoolError::Io {
            dir: dir.display().to_string(),
            source,
        }),
        Err(PrivateDirError::NotPrivate { owner, mode }) => Err(PoolError::NotPrivate {
            dir: dir.display().to_string(),
            owner,
            mode,
        }),
    }
}

/// Removes the pools in `dir` that no live process is attached to (left
/// by processes that were killed: tmpfs keeps their pages until then).
/// Each is checked under its INIT lock, taken without waiting (a pool
/// being attached or detached is left alone). Once per process, at its
/// first attach.
fn sweep_dead(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "meta") {
            continue;
        }
        let Ok(f) = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        else {
            continue;
        };
        if ofd_lock(&f, LockKind::Write, L_INIT, 1, false).is_err() {
            continue;
        }
        if matches!(ofd_probe(&f, LockKind::Write, L_ATTACHED, 1), Ok(None)) {
            let _ = std::fs::remove_file(path.with_extension("data"));
            let _ = std::fs::remove_file(&path);
            log::info!(
                "removed the page pool {} (no process attached)",
                path.display()
            );
        }
    }
}

/// FNV-1a, 64 bits: a pool's file name from its key (the key itself is
/// kept in the header and compared, so a collision is refused, not shared).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

enum OpenError {
    Io(io::Error),
    Pool(PoolError),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

fn open_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Retries `f` while it fails with EINTR (a wait for a lock).
fn no_eintr(mut f: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

impl Pool {
    fn open(
        dir: &Path,
        name: &str,
        key: &str,
        len: u64,
        folio: u64,
        budget: u64,
    ) -> Result<Pool, OpenError> {
        let meta_path = dir.join(format!("{name}.meta"));
        let data_path = dir.join(format!("{name}.data"));
        let key_bytes = key.as_bytes();
        let key_bytes = &key_bytes[..key_bytes.len().min(KEY_WORDS * 8)];
        let n = len.div_ceil(folio) as usize;
        let meta_len = ((STATES + n) * 8).next_multiple_of(upager_sys::PAGE_SIZE) as u64;
        // Hold INIT on a meta file that is still linked (a detacher that
        // removed it held INIT; its file is unlinked once we get INIT).
        let meta_file = loop {
            let f = open_private(&meta_path)?;
            no_eintr(|| ofd_lock(&f, LockKind::Write, L_INIT, 1, true))?;
            if f.metadata()?.nlink() > 0 {
                break f;
            }
        };
        let data = open_private(&data_path)?;
        let alone = ofd_probe(&meta_file, LockKind::Write, L_ATTACHED, 1)?.is_none();
        if alone {
            // Room for the budget (a container's /dev/shm is 64 MiB by
            // default): a fill that finds the file system full could only
            // fail its access.
            let need = budget.min(n as u64 * folio);
            let free = upager_sys::io::free_space(dir)?;
            if free < need {
                return Err(OpenError::Pool(PoolError::NoRoom {
                    dir: dir.display().to_string(),
                    free,
                    need,
                }));
            }
            // New, or left by processes that all died: start empty.
            data.set_len(0)?;
            data.set_len(n as u64 * folio)?;
            meta_file.set_len(0)?;
            meta_file.set_len(meta_len)?;
        } else if meta_file.metadata()?.len() < meta_len {
            return Err(OpenError::Pool(PoolError::Mismatch {
                path: meta_path.display().to_string(),
                what: "size",
            }));
        }
        let meta = Mapping::shared_file(
            &meta_file,
            0,
            meta_len as usize,
            upager_sys::PAGE_SIZE,
            true,
        )?;
        let pool = Pool::from_parts(meta, meta_file, data, (meta_path, data_path), n, folio);
        let mut key_words = [0u64; KEY_WORDS];
        for (i, c) in key_bytes.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            key_words[i] = u64::from_le_bytes(w);
        }
        if alone {
            pool.hdr(W_SHIFT)
                .store(u64::from(pool.shift), Ordering::Relaxed);
            pool.hdr(W_FOLIOS).store(n as u64, Ordering::Relaxed);
            pool.hdr(W_BUDGET).store(budget, Ordering::Relaxed);
            pool.hdr(W_KEY_LEN)
                .store(key_bytes.len() as u64, Ordering::Relaxed);
            for (i, w) in key_words.iter().enumerate() {
                pool.hdr(W_KEY + i).store(*w, Ordering::Relaxed);
            }
            pool.hdr(W_MAGIC).store(MAGIC, Ordering::Release);
        } else {
            let what = if pool.hdr(W_MAGIC).load(Ordering::Acquire) != MAGIC {
                Some("header")
            } else if pool.hdr(W_SHIFT).load(Ordering::Relaxed) != u64::from(pool.shift) {
                Some("folio size")
            } else if pool.hdr(W_FOLIOS).load(Ordering::Relaxed) != n as u64 {
                Some("size")
            } else if pool.hdr(W_KEY_LEN).load(Ordering::Relaxed) != key_bytes.len() as u64
                || (0..KEY_WORDS)
                    .any(|i| pool.hdr(W_KEY + i).load(Ordering::Relaxed) != key_words[i])
            {
                Some("identity")
            } else {
                None
            };
            if let Some(what) = what {
                return Err(OpenError::Pool(PoolError::Mismatch {
                    path: pool.meta_path.display().to_string(),
                    what,
                }));
            }
        }
        no_eintr(|| ofd_lock(&pool.meta_file, LockKind::Read, L_ATTACHED, 1, true))?;
        let slot = (0..MAX_SLOTS).find(|&k| {
            ofd_lock(
                &pool.meta_file,
                LockKind::Write,
                L_SLOT + k as u64,
                1,
                false,
            )
            .is_ok()
        });
        let Some(slot) = slot else {
            return Err(OpenError::Pool(PoolError::Full { max: MAX_SLOTS }));
        };
        pool.hdr(W_SLOTS + slot)
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        let mut pool = pool;
        pool.slot = slot;
        pool.attached = true;
        ofd_lock(&pool.meta_file, LockKind::Unlock, L_INIT, 1, false)?;
        Ok(pool)
    }

    /// A pool of these files, not attached (no slot yet).
    fn from_parts(
        meta: Mapping,
        meta_file: File,
        data: File,
        (meta_path, data_path): (PathBuf, PathBuf),
        n: usize,
        folio: u64,
    ) -> Pool {
        Pool {
            meta,
            meta_file,
            data,
            meta_path,
            data_path,
            n,
            folio,
            shift: folio.trailing_zeros(),
            slot: usize::MAX,
            attached: false,
            pid: std::process::id(),
        }
    }

    fn hdr(&self, w: usize) -> &AtomicU64 {
        &self.meta.atomic_words()[w]
    }

    fn word(&self, idx: usize) -> &AtomicU64 {
        &self.meta.atomic_words()[STATES + idx]
    }

    fn owned(&self, kind: u64) -> u64 {
        kind | ((self.slot as u64 + 1) << OWNER_SHIFT)
    }

    /// Folios in the pool.
    pub(crate) fn folios(&self) -> usize {
        self.n
    }

    /// The data file, for regions' views.
    pub(crate) fn data(&self) -> &File {
        &self.data
    }

    /// The pool's budget in bytes (set by its first process).
    pub(crate) fn budget(&self) -> u64 {
        self.hdr(W_BUDGET).load(Ordering::Relaxed)
    }

    /// A pool's files opened read-only, to be looked at ([`pools`]): not
    /// attached (no slot; its drop detaches nothing).
    fn peek(dir: &Path, name: &str) -> io::Result<Pool> {
        let meta_path = dir.join(format!("{name}.meta"));
        let data_path = dir.join(format!("{name}.data"));
        let ro = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(p)
        };
        let meta_file = ro(&meta_path)?;
        let data = ro(&data_path)?;
        let len = meta_file.metadata()?.len() as usize;
        if len < STATES * 8 {
            return Err(io::ErrorKind::InvalidData.into());
        }
        let meta = Mapping::shared_file(&meta_file, 0, len, upager_sys::PAGE_SIZE, false)?;
        let words = meta.atomic_words();
        if words[W_MAGIC].load(Ordering::Acquire) != MAGIC {
            return Err(io::ErrorKind::InvalidData.into());
        }
        let shift = words[W_SHIFT].load(Ordering::Relaxed) as u32;
        let n = (words[W_FOLIOS].load(Ordering::Relaxed) as usize).min(len / 8 - STATES);
        let folio = 1 << shift.min(30);
        Ok(Pool::from_parts(
            meta,
            meta_file,
            data,
            (meta_path, data_path),
            n,
            folio,
        ))
    }

    /// What [`Region::pool_info`](crate::Region::pool_info) and [`pools`]
    /// report.
    pub(crate) fn info(&self) -> PoolInfo {
        let len = (self.hdr(W_KEY_LEN).load(Ordering::Relaxed) as usize).min(KEY_WORDS * 8);
        let key: Vec<u8> = (0..KEY_WORDS)
            .flat_map(|i| self.hdr(W_KEY + i).load(Ordering::Relaxed).to_le_bytes())
            .take(len)
            .collect();
        let pids = (0..MAX_SLOTS)
            .filter(|&k| self.slot_alive(k))
            .map(|k| self.hdr(W_SLOTS + k).load(Ordering::Relaxed) as u32)
            .collect::<Vec<_>>();
        PoolInfo {
            data_path: self.data_path.clone(),
            key: String::from_utf8_lossy(&key).into_owned(),
            budget: self.budget(),
            resident: self.hdr(W_RESIDENT).load(Ordering::Relaxed),
            procs: pids.len(),
            pids,
            counters: self.counters(),
        }
    }

    /// Processes attached now (slots taken by live processes).
    pub(crate) fn procs(&self) -> usize {
        (0..MAX_SLOTS).filter(|&k| self.slot_alive(k)).count()
    }

    fn slot_alive(&self, k: usize) -> bool {
        k == self.slot
            || !matches!(
                ofd_probe(&self.meta_file, LockKind::Write, L_SLOT + k as u64, 1),
                Ok(None)
            )
    }

    /// The pool's counters, with their stable names.
    pub(crate) fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = |w| self.hdr(w).load(Ordering::Relaxed);
        vec![
            ("pool_fills", c(W_FILLS)),
            ("pool_fill_bytes", c(W_FILL_BYTES)),
            ("pool_evictions", c(W_EVICTIONS)),
            ("pool_evict_batches", c(W_EVICT_BATCHES)),
            ("pool_punches", c(W_PUNCHES)),
            ("pool_takeovers", c(W_TAKEOVERS)),
            ("pool_waits", c(W_WAITS)),
            ("pool_overcommits", c(W_OVERCOMMITS)),
            ("pool_punch_errors", c(W_PUNCH_ERRORS)),
            ("pool_resident_bytes", c(W_RESIDENT)),
            ("pool_budget_bytes", c(W_BUDGET)),
            ("pool_procs", self.procs() as u64),
        ]
    }

    /// Reserves `bytes` of the budget, evicting while they do not fit.
    /// Without `wait`, gives up (false) when nothing is left to evict; with
    /// it, waits up to [`ROOM_WAIT`] for room, then goes over the budget.
    /// Async-signal-safe.
    fn reserve(&self, bytes: u64, batch_bytes: u64, wait: bool) -> bool {
        let resident = self.hdr(W_RESIDENT);
        let budget = self.budget();
        let mut since: Option<Instant> = None;
        loop {
            let r = resident.load(Ordering::Acquire);
            if r + bytes <= budget {
                if resident
                    .compare_exchange(r, r + bytes, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            if self.evict_batch(bytes.max(batch_bytes)) > 0 {
                continue;
            }
            if !wait {
                return false;
            }
            // Nothing evictable: every folio is being filled or evicted.
            let t0 = *since.get_or_insert_with(Instant::now);
            if t0.elapsed() >= ROOM_WAIT {
                resident.fetch_add(bytes, Ordering::AcqRel);
                self.hdr(W_OVERCOMMITS).fetch_add(1, Ordering::Relaxed);
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn unreserve(&self, bytes: u64) {
        self.hdr(W_RESIDENT).fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Claims folio `idx` for a fill: reserves its budget and moves its
    /// word EMPTY → FILLING. `fault`: the fill a fault waits for, which
    /// gets room whatever it takes; else (readahead) a budget that has
    /// nothing left to evict ends the claim as `Busy`.
    pub(crate) fn claim(&self, idx: usize, batch_bytes: u64, fault: bool) -> Claim {
        let w = self.word(idx);
        loop {
            let s = w.load(Ordering::Acquire);
            match s & KIND {
                EMPTY => {}
                RESIDENT => return Claim::Resident,
                _ => return Claim::Busy(s),
            }
            if !self.reserve(self.folio, batch_bytes, fault) {
                return Claim::Busy(s);
            }
            if w.compare_exchange(s, self.owned(FILLING), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Claim::Claimed;
            }
            self.unreserve(self.folio);
        }
    }

    /// Moves the word of a folio this process filled or evicted on to
    /// `to`, waking whoever waits on it.
    fn release(&self, idx: usize, to: u64) {
        let prev = self.word(idx).swap(to, Ordering::AcqRel);
        debug_assert_eq!(
            (prev >> OWNER_SHIFT) as u8,
            self.slot as u8 + 1,
            "{prev:#x}"
        );
        if prev & WAITERS != 0 {
            futex::wake_low_shared(self.word(idx));
        }
    }

    /// Publishes folios `[idx, idx+n)`, filled by this process: RESIDENT.
    pub(crate) fn publish(&self, idx: usize, n: usize) {
        let first = self.hdr(W_FILLS).fetch_add(n as u64, Ordering::AcqRel);
        for (k, i) in (idx..idx + n).enumerate() {
            let stamp = u64::from((first + k as u64) as u32) << STAMP_SHIFT;
            self.release(i, RESIDENT | stamp);
        }
        self.hdr(W_FILL_BYTES)
            .fetch_add(n as u64 * self.folio, Ordering::Relaxed);
    }

    /// Gives up folios `[idx, idx+n)` claimed for a fill that failed: their
    /// pages (if any got in) are punched, the words go EMPTY.
    pub(crate) fn abandon(&self, idx: usize, n: usize) {
        let _ =
            upager_sys::io::punch_hole(&self.data, idx as u64 * self.folio, n as u64 * self.folio);
        for i in idx..idx + n {
            self.release(i, EMPTY);
        }
        self.unreserve(n as u64 * self.folio);
    }

    /// Waits while folio `idx`'s word is `seen` (FILLING or EVICTING by
    /// another process), at most [`OWNER_CHECK`]; if its owner died, takes
    /// the word over and ends what it was doing. Async-signal-safe.
    pub(crate) fn wait(&self, idx: usize, seen: u64) {
        let w = self.word(idx);
        let v = seen | WAITERS;
        if seen & WAITERS == 0
            && w.compare_exchange(seen, v, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return; // moved on already
        }
        self.hdr(W_WAITS).fetch_add(1, Ordering::Relaxed);
        if futex::wait_low_shared(w, v as u32, Some(OWNER_CHECK)) {
            return;
        }
        let owner = (v >> OWNER_SHIFT) as usize;
        if owner == 0 || self.slot_alive(owner - 1) {
            return;
        }
        // Its process died mid-fill or mid-eviction: take it over. The
        // budget its claim reserved stays counted until the word is EMPTY.
        if w.compare_exchange(v, self.owned(v & KIND), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        self.hdr(W_TAKEOVERS).fetch_add(1, Ordering::Relaxed);
        let _ = upager_sys::io::punch_hole(&self.data, idx as u64 * self.folio, self.folio);
        self.release(idx, EMPTY | WAITERS);
        self.unreserve(self.folio);
    }

    /// Evicts up to `bytes` (at least one folio, at most [`MAX_BATCH`]) of
    /// the pool's folios, from wherever the shared CLOCK hand is: claims
    /// the victims (EVICTING), punches each run of adjacent ones out of the
    /// data file (every process's view loses them at once), then frees
    /// their words and budget. Returns the folios evicted; 0 when a full
    /// lap found none to take. Async-signal-safe (no allocation).
    pub(crate) fn evict_batch(&self, bytes: u64) -> usize {
        let want = ((bytes >> self.shift) as usize).clamp(1, MAX_BATCH);
        let mut victims = [0u32; MAX_BATCH];
        let mut got = 0;
        // Folios filled within the last half budget's worth of fills are
        // young: a first lap passes over them (a stream's current window,
        // another process's fresh fills); a second takes any.
        let now = self.hdr(W_FILLS).load(Ordering::Acquire);
        let young = (self.budget() >> self.shift) / 2;
        for min_age in [young, 0] {
            let mut scanned = 0u64;
            while got < want && scanned < self.n as u64 + SCAN_STEP {
                let start = self.hdr(W_HAND).fetch_add(SCAN_STEP, Ordering::AcqRel);
                for k in 0..SCAN_STEP {
                    let idx = ((start + k) % self.n as u64) as usize;
                    if got < want && self.evict_one(idx, now, min_age) {
                        victims[got] = idx as u32;
                        got += 1;
                    }
                }
                scanned += SCAN_STEP;
            }
            if got > 0 {
                break;
            }
        }
        let victims = &mut victims[..got];
        victims.sort_unstable();
        let mut runs = 0u64;
        let mut k = 0;
        while k < victims.len() {
            let mut e = k + 1;
            while e < victims.len() && victims[e] == victims[e - 1] + 1 {
                e += 1;
            }
            let (first, n) = (u64::from(victims[k]), (e - k) as u64);
            // A failed punch leaves correct bytes (a clean copy) in the
            // file, outside the budget's count: counted, not logged (this
            // may run in a SIGBUS handler).
            if upager_sys::io::punch_hole(&self.data, first << self.shift, n << self.shift).is_err()
            {
                self.hdr(W_PUNCH_ERRORS).fetch_add(1, Ordering::Relaxed);
            }
            runs += 1;
            k = e;
        }
        for &v in victims.iter() {
            self.release(v as usize, EMPTY);
        }
        if got > 0 {
            self.unreserve((got as u64) << self.shift);
            self.hdr(W_EVICTIONS)
                .fetch_add(got as u64, Ordering::Relaxed);
            self.hdr(W_EVICT_BATCHES).fetch_add(1, Ordering::Relaxed);
            self.hdr(W_PUNCHES).fetch_add(runs, Ordering::Relaxed);
        }
        got
    }

    /// One step of the CLOCK: a RESIDENT folio filled at least `min_age`
    /// fills before `now` (the pool's fill count) is claimed for eviction
    /// (true).
    fn evict_one(&self, idx: usize, now: u64, min_age: u64) -> bool {
        let w = self.word(idx);
        let s = w.load(Ordering::Acquire);
        if s & KIND != RESIDENT {
            return false;
        }
        let age = (now as u32).wrapping_sub((s >> STAMP_SHIFT) as u32);
        if u64::from(age) < min_age {
            return false;
        }
        w.compare_exchange(
            s,
            self.owned(EVICTING) | (s & WAITERS),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// Whether folio `idx` is in the pool now.
    pub(crate) fn is_resident(&self, idx: usize) -> bool {
        self.word(idx).load(Ordering::Acquire) & KIND == RESIDENT
    }
}

impl Drop for Pool {
    /// Detaches: frees this process's slot and, if no other process is
    /// attached, removes the pool's files (the last process out).
    fn drop(&mut self) {
        if !self.attached || self.pid != std::process::id() {
            // A failed open (closing the meta file releases INIT), or a
            // fork child's copy: the parent's locks stay the parent's.
            return;
        }
        if no_eintr(|| ofd_lock(&self.meta_file, LockKind::Write, L_INIT, 1, true)).is_err() {
            return; // the files stay; the next first opener starts them anew
        }
        self.hdr(W_SLOTS + self.slot).store(0, Ordering::Relaxed);
        let _ = ofd_lock(
            &self.meta_file,
            LockKind::Unlock,
            L_SLOT + self.slot as u64,
            1,
            false,
        );
        let _ = ofd_lock(&self.meta_file, LockKind::Unlock, L_ATTACHED, 1, false);
        if matches!(
            ofd_probe(&self.meta_file, LockKind::Write, L_ATTACHED, 1),
            Ok(None)
        ) {
            let _ = std::fs::remove_file(&self.data_path);
            let _ = std::fs::remove_file(&self.meta_path);
        }
        // Closing the meta file releases INIT.
    }
}

/// A region's place in a pool: the pool, the pool folio of the region's
/// first folio, and this process's readahead state for the region.
#[derive(Debug)]
pub(crate) struct PoolView {
    pub pool: Arc<Pool>,
    /// Pool folio index of the region's folio 0.
    pub first: usize,
    /// The folio after the last window this process filled: a fault there
    /// continues a stream and fills a whole window.
    pub next: AtomicUsize,
}

impl PoolView {
    pub(crate) fn new(pool: Arc<Pool>, first: usize) -> PoolView {
        PoolView {
            pool,
            first,
            next: AtomicUsize::new(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_pool_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        d
    }

    fn open(dir: &Path, key: &str, budget: u64) -> Pool {
        match Pool::open(dir, "t", key, 64 << 12, 4096, budget) {
            Ok(p) => p,
            Err(OpenError::Io(e)) => panic!("{e}"),
            Err(OpenError::Pool(e)) => panic!("{e}"),
        }
    }

    /// Claims and fills by hand (no view): the budget holds, eviction
    /// punches the data file, and the words go round their states.
    #[test]
    fn claims_stay_within_the_budget_and_evictions_punch_the_file() {
        let d = tmp_pool_dir();
        let p = open(d.path(), "k", 8 * 4096);
        for i in 0..8 {
            assert_eq!(p.claim(i, 4096, false), Claim::Claimed);
            std::os::unix::fs::FileExt::write_all_at(&p.data, &[1u8; 4096], i as u64 * 4096)
                .unwrap();
            p.publish(i, 1);
        }
        assert_eq!(p.claim(8, 4096, true), Claim::Claimed, "evicts first");
        assert!(p.hdr(W_RESIDENT).load(Ordering::Relaxed) <= 8 * 4096);
        assert!(p.hdr(W_EVICTIONS).load(Ordering::Relaxed) >= 1);
        let blocks = p.data.metadata().unwrap().blocks() * 512;
        assert!(blocks <= 8 * 4096, "{blocks} bytes allocated");
        assert_eq!(p.claim(0, 4096, false), Claim::Claimed, "evicts too");
        assert!(p.is_resident(7));
    }

    /// The second attacher joins the first's pool (same budget, sees its
    /// words); one with another key or folio is refused; the last one out
    /// removes the files.
    #[test]
    fn attachers_share_one_pool_and_the_last_removes_it() {
        let d = tmp_pool_dir();
        let a = open(d.path(), "k", 8 * 4096);
        assert_eq!(a.claim(3, 4096, false), Claim::Claimed);
        a.publish(3, 1);
        let b = open(d.path(), "k", 1 << 30);
        assert_eq!(b.budget(), 8 * 4096, "the first opener's budget");
        assert!(b.is_resident(3));
        assert_ne!(a.slot, b.slot);
        assert_eq!(a.procs(), 2);
        assert!(matches!(
            Pool::open(d.path(), "t", "other", 64 << 12, 4096, 1),
            Err(OpenError::Pool(PoolError::Mismatch {
                what: "identity",
                ..
            }))
        ));
        drop(a);
        assert!(d.path().join("t.meta").exists(), "b still attached");
        drop(b);
        assert!(!d.path().join("t.meta").exists() && !d.path().join("t.data").exists());
    }

    /// A filler that died (its slot's lock gone) leaves a FILLING word: a
    /// waiter takes it over, punches its partial page and frees the word.
    #[test]
    fn a_dead_filler_s_folio_is_taken_over() {
        let d = tmp_pool_dir();
        let a = open(d.path(), "k", 8 * 4096);
        let b = open(d.path(), "k", 8 * 4096);
        assert_eq!(b.claim(5, 4096, false), Claim::Claimed);
        std::os::unix::fs::FileExt::write_all_at(&b.data, &[9u8; 4096], 5 * 4096).unwrap();
        // b's process "dies": its slot lock goes, its word stays FILLING.
        ofd_lock(
            &b.meta_file,
            LockKind::Unlock,
            L_SLOT + b.slot as u64,
            1,
            false,
        )
        .unwrap();
        let seen = a.word(5).load(Ordering::Acquire);
        assert_eq!(seen & KIND, FILLING);
        a.wait(5, seen);
        assert_eq!(a.word(5).load(Ordering::Acquire) & KIND, EMPTY);
        assert_eq!(a.hdr(W_TAKEOVERS).load(Ordering::Relaxed), 1);
        assert_eq!(a.hdr(W_RESIDENT).load(Ordering::Relaxed), 0);
        let blocks = a.data.metadata().unwrap().blocks();
        assert_eq!(blocks, 0, "the partial page was punched");
        assert_eq!(a.claim(5, 4096, false), Claim::Claimed);
        std::mem::forget(b); // its detach would trip over its released slot
    }

    /// A fork child's copy of an attached pool detaches nothing when it
    /// drops (the slot and ATTACHED locks belong to the parent's open file
    /// description): here, the last copy out leaves the files.
    #[test]
    fn a_fork_child_s_copy_detaches_nothing() {
        let d = tmp_pool_dir();
        let mut a = open(d.path(), "k", 8 * 4096);
        let slot = a.slot;
        let slot_pid = a.hdr(W_SLOTS + slot).load(Ordering::Relaxed);
        a.pid = std::process::id().wrapping_add(1); // as a child sees it
        let meta = a.meta_path.clone();
        let words = Mapping::shared_file(&a.meta_file, 0, 4096, 4096, false).unwrap();
        drop(a);
        assert!(meta.exists(), "not removed by a copy");
        let kept = words.atomic_words()[W_SLOTS + slot].load(Ordering::Relaxed);
        assert_eq!(kept, slot_pid, "the slot still names the parent");
    }

    /// A pool no process is attached to (all were killed) is swept; one
    /// in use is not.
    #[test]
    fn dead_pools_are_swept() {
        let d = tmp_pool_dir();
        let live = open(d.path(), "k", 8 * 4096);
        let dead = Pool::open(d.path(), "u", "k2", 64 << 12, 4096, 1 << 20)
            .map_err(|_| ())
            .unwrap();
        let (meta, data) = (dead.meta_path.clone(), dead.data_path.clone());
        // "Killed": its locks go without a detach.
        ofd_lock(&dead.meta_file, LockKind::Unlock, 0, 0, false).unwrap();
        std::mem::forget(dead);
        assert!(meta.exists() && data.exists());
        sweep_dead(d.path());
        assert!(!meta.exists() && !data.exists(), "swept");
        assert!(live.meta_path.exists(), "in use: kept");
    }

    #[test]
    fn a_shared_pool_dir_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("p");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let e = pool_dir_at(Some(dir.into_os_string())).unwrap_err();
        assert!(matches!(e, PoolError::NotPrivate { .. }), "{e}");
        assert!(e.to_string().contains("UPAGER_POOL_DIR"), "{e}");
    }
}
