//! The pager: one userfaultfd, one budget, its threads and its regions.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use upager_sys::mem::{Advice, Mapping, SelfPidfd};
use upager_sys::uffd::{feature, Uffd};

use crate::config::{PagerBuilder, DEFAULT_BATCH_BYTES, MAX_FOLIO, MIN_FOLIO};
use crate::error::{MapError, PagerError};
use crate::marker::PrefetchRequest;
use crate::reclaim::Lru;
use crate::region::{Region, RegionInner};
use crate::stats::{Counters, Stats};
use crate::store::{FileStore, Slots, Store, SwapFile};
use crate::table::RegionTable;
use crate::MapOptions;

/// State shared by the pager's handles, regions and threads.
pub(crate) struct Shared {
    pub uffd: Uffd,
    pub pidfd: SelfPidfd,
    pub cfg: PagerBuilder,
    pub counters: Counters,
    pub table: RegionTable,
    pub lru: Mutex<Lru>,
    pub budget: u64,
    pub resident: AtomicU64,
    pub peak: AtomicU64,
    pub high_wm: u64,
    pub low_wm: u64,
    /// Pages evicted so far (the clock of refault distances).
    pub evict_seq: AtomicU64,
    /// Prefetch requests queued or in progress.
    pub prefetch_pending: AtomicU64,
    pub kicked: AtomicBool,
    pub kick_lock: Mutex<()>,
    pub kick_cv: Condvar,
    pub stop: AtomicBool,
    pub stop_fd: upager_sys::io::EventFd,
    next_id: AtomicU64,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// Folios per eviction batch for a folio size.
    pub fn batch_folios(&self, folio: u64) -> usize {
        self.cfg
            .batch
            .unwrap_or(((DEFAULT_BATCH_BYTES / folio) as usize).clamp(1, upager_sys::mem::MAX_IOV))
    }
    /// Fill buffer per handler thread: the largest readahead or folio.
    pub fn fill_buf_bytes(&self) -> usize {
        self.cfg.readahead.max(MAX_FOLIO) as usize + MAX_FOLIO as usize
    }
}

/// Owns the threads: dropped when the last handle (pager or region) goes.
pub(crate) struct Owner {
    pub shared: Arc<Shared>,
    /// Requests for the prefetch thread; dropped first on shutdown.
    prefetch_tx: Mutex<Option<std::sync::mpsc::Sender<PrefetchRequest>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Owner {
    /// Queues a prefetch (the thread drops requests of unmapped regions).
    pub fn prefetch(&self, req: PrefetchRequest) {
        if let Some(tx) = self
            .prefetch_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            self.shared.prefetch_pending.fetch_add(1, Ordering::AcqRel);
            if tx.send(req).is_err() {
                self.shared.prefetch_pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.prefetch_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.stop_fd.signal();
        {
            let _g = self
                .shared
                .kick_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.kicked.store(true, Ordering::Release);
            self.shared.kick_cv.notify_all();
        }
        for t in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = t.join();
        }
    }
}

/// A demand pager with a memory budget.
///
/// ```no_run
/// use upager::{MapOptions, Pager};
/// let pager = Pager::builder().budget(256 << 20).build()?;
/// let region = pager.map_file("data.bin", &MapOptions::new().writable(true))?;
/// region.write_at(0, b"hello");       // or use region.as_ptr() as ordinary memory
/// region.flush()?;                    // durable (fdatasync) when this returns
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Threads: `handler_threads` fault handlers and one reclaimer, stopped when
/// the pager and all its regions are dropped.
pub struct Pager {
    owner: Arc<Owner>,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("budget", &self.owner.shared.budget)
            .finish()
    }
}

impl Pager {
    /// Options with their defaults.
    pub fn builder() -> PagerBuilder {
        PagerBuilder::default()
    }

    /// A pager with `budget` bytes and default options.
    pub fn new(budget: u64) -> Result<Pager, PagerError> {
        Self::builder().budget(budget).build()
    }

    pub(crate) fn from_builder(cfg: PagerBuilder) -> Result<Pager, PagerError> {
        if cfg.budget < MIN_FOLIO {
            return Err(PagerError::BudgetTooSmall(cfg.budget));
        }
        if !(1..=64).contains(&cfg.handler_threads) {
            return Err(PagerError::HandlerThreads(cfg.handler_threads));
        }
        if cfg.readahead > crate::config::MAX_READAHEAD {
            return Err(PagerError::Readahead(cfg.readahead));
        }
        if let Some(b) = cfg.batch {
            if !(1..=upager_sys::mem::MAX_IOV).contains(&b) {
                return Err(PagerError::Batch(b));
            }
        }
        let uffd = Uffd::open().map_err(|f| PagerError::NoUserfaultfd {
            device: f.device,
            syscall: f.syscall,
        })?;
        let want = feature::THREAD_ID | feature::PAGEFAULT_FLAG_WP | feature::POISON;
        let got = uffd.api(want).map_err(PagerError::Api)?;
        for (bit, name) in [
            (feature::PAGEFAULT_FLAG_WP, "write-protect faults"),
            (feature::POISON, "UFFDIO_POISON"),
        ] {
            if got & bit == 0 {
                return Err(PagerError::MissingFeature(name));
            }
        }
        let pidfd = SelfPidfd::open().map_err(PagerError::Pidfd)?;
        let budget = cfg.budget;
        let gap = (budget / 8).min(2 * DEFAULT_BATCH_BYTES);
        let shared = Arc::new(Shared {
            uffd,
            pidfd,
            counters: Counters::default(),
            table: RegionTable::new(cfg.lookup),
            lru: Mutex::new(Lru::default()),
            budget,
            resident: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            high_wm: budget - gap / 2,
            low_wm: budget - gap,
            evict_seq: AtomicU64::new(0),
            prefetch_pending: AtomicU64::new(0),
            kicked: AtomicBool::new(false),
            kick_lock: Mutex::new(()),
            kick_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            stop_fd: upager_sys::io::EventFd::new().map_err(PagerError::EventFd)?,
            next_id: AtomicU64::new(1),
            cfg,
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = Arc::new(Owner {
            shared: Arc::clone(&shared),
            prefetch_tx: Mutex::new(Some(tx)),
            threads: Mutex::new(Vec::new()),
        });
        {
            let mut th = owner.threads.lock().unwrap_or_else(|e| e.into_inner());
            for i in 0..shared.cfg.handler_threads {
                let s = Arc::clone(&shared);
                let t = std::thread::Builder::new()
                    .name(format!("upager-fault-{i}"))
                    .spawn(move || s.handler_main())
                    .map_err(PagerError::Spawn)?;
                th.push(t);
            }
            let s = Arc::clone(&shared);
            th.push(
                std::thread::Builder::new()
                    .name("upager-prefetch".into())
                    .spawn(move || s.prefetch_main(rx))
                    .map_err(PagerError::Spawn)?,
            );
            let s = Arc::clone(&shared);
            th.push(
                std::thread::Builder::new()
                    .name("upager-reclaim".into())
                    .spawn(move || s.reclaimer_main())
                    .map_err(PagerError::Spawn)?,
            );
        }
        Ok(Pager { owner })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.owner.shared
    }

    /// Maps a file (or the range `offset..offset+len` of it). Read-only
    /// unless `opts.writable(true)`; writes reach the file on eviction and on
    /// [`Region::flush`].
    pub fn map_file(&self, path: impl AsRef<Path>, opts: &MapOptions) -> Result<Region, MapError> {
        let path = path.as_ref();
        check_folio(opts.folio)?;
        let store =
            FileStore::open(path, opts.writable, self.shared().cfg.direct_io).map_err(|e| {
                let path = path.to_path_buf();
                match e.kind() {
                    std::io::ErrorKind::NotFound => MapError::NotFound { path },
                    std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem
                        if opts.writable =>
                    {
                        match std::fs::File::open(&path) {
                            Ok(_) => MapError::ReadOnlyFile { path, source: e },
                            Err(_) => MapError::PermissionDenied { path },
                        }
                    }
                    std::io::ErrorKind::PermissionDenied => MapError::PermissionDenied { path },
                    _ => MapError::Open { path, source: e },
                }
            })?;
        self.map_store(Arc::new(store), opts)
    }

    /// Maps an already open file. `opts.writable` must match how it was opened.
    pub fn map_open_file(
        &self,
        file: std::fs::File,
        opts: &MapOptions,
    ) -> Result<Region, MapError> {
        check_folio(opts.folio)?;
        let fd_path = std::path::PathBuf::from("<file descriptor>");
        let (readable, writable) =
            upager_sys::io::access_mode(&file).map_err(|source| MapError::Open {
                path: fd_path.clone(),
                source,
            })?;
        if !readable {
            return Err(MapError::Open {
                path: fd_path,
                source: std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "the file was opened write-only; upager must read it",
                ),
            });
        }
        if opts.writable && !writable {
            return Err(MapError::ReadOnlyFile {
                path: fd_path,
                source: std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "the file was opened read-only",
                ),
            });
        }
        let store = FileStore::from_file(file, opts.writable, self.shared().cfg.direct_io)
            .map_err(|source| MapError::Open {
                path: "<file descriptor>".into(),
                source,
            })?;
        self.map_store(Arc::new(store), opts)
    }

    /// Maps any [`Store`] with file semantics (reads come from the store,
    /// writes go back to it).
    pub fn map_store(&self, store: Arc<dyn Store>, opts: &MapOptions) -> Result<Region, MapError> {
        check_folio(opts.folio)?;
        if opts.writable && !store.writable() {
            return Err(MapError::StoreReadOnly);
        }
        if !opts.offset.is_multiple_of(opts.folio) {
            return Err(MapError::OffsetNotAligned {
                offset: opts.offset,
                folio: opts.folio,
            });
        }
        let store_len = store.len();
        let len = match opts.len {
            Some(l) => l,
            None => store_len.saturating_sub(opts.offset),
        };
        if len == 0 {
            return Err(MapError::ZeroSize);
        }
        if opts.offset.checked_add(len).is_none_or(|e| e > store_len) {
            return Err(MapError::BeyondEnd {
                offset: opts.offset,
                len,
                store_len,
            });
        }
        self.map_inner(store, None, opts.offset, len, opts.folio, opts.writable)
    }

    /// Maps `len` bytes of anonymous memory: zero on first touch, swapped to
    /// a private swap file (created 0600 in the swap directory and unlinked
    /// at once) when evicted. Always writable; `opts.offset` must be 0.
    pub fn map_anonymous(&self, len: u64, opts: &MapOptions) -> Result<Region, MapError> {
        check_folio(opts.folio)?;
        if len == 0 {
            return Err(MapError::ZeroSize);
        }
        if opts.offset != 0 {
            return Err(MapError::OffsetNotAligned {
                offset: opts.offset,
                folio: opts.folio,
            });
        }
        self.check_budget(opts.folio)?;
        let dir = &self.shared().cfg.swap_dir;
        let swap = SwapFile::create(dir, self.shared().cfg.direct_io).map_err(|source| {
            MapError::SwapFile {
                dir: dir.clone(),
                source,
            }
        })?;
        self.map_inner(
            Arc::new(swap),
            Some(Slots::default()),
            0,
            len,
            opts.folio,
            true,
        )
    }

    fn check_budget(&self, folio: u64) -> Result<(), MapError> {
        let batch = self.shared().batch_folios(folio) as u64;
        let need = batch * folio;
        if self.shared().budget < need {
            return Err(MapError::BudgetBelowBatch {
                budget: self.shared().budget,
                batch,
                folio,
                need,
            });
        }
        Ok(())
    }

    fn map_inner(
        &self,
        store: Arc<dyn Store>,
        slots: Option<Slots>,
        store_off: u64,
        len: u64,
        folio: u64,
        writable: bool,
    ) -> Result<Region, MapError> {
        self.check_budget(folio)?;
        let sh = self.shared();
        let map_len = len
            .checked_next_multiple_of(folio)
            .filter(|&l| l <= isize::MAX as u64)
            .ok_or(MapError::Mmap {
                len,
                source: std::io::Error::from_raw_os_error(libc_enomem()),
            })?;
        let map =
            Mapping::anonymous(map_len as usize, folio as usize, writable).map_err(|source| {
                MapError::Mmap {
                    len: map_len,
                    source,
                }
            })?;
        // THP off: a MISSING-registered range would otherwise get a zeroed
        // 2 MiB page allocated before the fault is raised. Not inherited by
        // fork: a child must not see half-paged memory.
        let _ = map.advise(0, map.len(), Advice::NoHugePage);
        let _ = map.advise(0, map.len(), Advice::DontFork);
        sh.uffd
            .register(map.addr(), map_len, true, writable)
            .map_err(MapError::Register)?;
        let states =
            upager_sys::mem::AtomicTable::zeroed((map_len / folio) as usize).map_err(|source| {
                MapError::Mmap {
                    len: map_len / folio * 8,
                    source,
                }
            })?;
        let nfolios = (map_len / folio) as usize;
        let touched =
            upager_sys::mem::AtomicTable::zeroed(nfolios.div_ceil(crate::region::CHUNK * 64))
                .map_err(|source| MapError::Mmap {
                    len: map_len / folio / 64,
                    source,
                })?;
        let inner = Arc::new(RegionInner {
            touched,
            id: sh.next_id.fetch_add(1, Ordering::Relaxed),
            states,
            map,
            len,
            folio,
            shift: folio.trailing_zeros(),
            store,
            store_off,
            slots,
            writable,
            inflight: AtomicU64::new(0),
            dying: AtomicBool::new(false),
            wb_error: Mutex::new(None),
        });
        sh.table.insert(Arc::clone(&inner));
        Ok(Region::new(inner, Arc::clone(&self.owner)))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let sh = self.shared();
        let mut s = sh.counters.snapshot();
        s.resident_bytes = sh.resident.load(Ordering::Relaxed);
        s.resident_peak_bytes = sh.peak.load(Ordering::Relaxed);
        s.budget_bytes = sh.budget;
        s.evicted_markers = crate::marker::count_markers(sh.table.all().iter());
        s
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.shared().budget
    }
}

fn libc_enomem() -> i32 {
    12
}

fn check_folio(folio: u64) -> Result<(), MapError> {
    if folio.is_power_of_two() && (MIN_FOLIO..=MAX_FOLIO).contains(&folio) {
        Ok(())
    } else {
        Err(MapError::FolioSize(folio))
    }
}

impl Region {
    /// Counters of the pager this region belongs to.
    pub fn pager_stats(&self) -> Stats {
        Pager {
            owner: Arc::clone(&self.owner),
        }
        .stats()
    }
}
