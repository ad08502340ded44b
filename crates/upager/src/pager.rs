//! The pager: one userfaultfd, one budget, its threads and its regions.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

use upager_sys::mem::{Advice, Mapping, SelfPidfd};
use upager_sys::uffd::{feature, Uffd};

use crate::config::{PagerBuilder, DEFAULT_BATCH_BYTES, MAX_FOLIO, MIN_FOLIO};
use crate::error::{limit_error, MapError, PagerError};
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
    /// Bytes of file-backed folios that are DIRTY now (the dirty limit's
    /// gauge, like the kernel's NR_FILE_DIRTY).
    pub dirty: AtomicU64,
    /// Most dirty file-backed bytes before a write fault must first clean
    /// some (the kernel's dirty_ratio / balance_dirty_pages).
    pub dirty_limit: u64,
    /// Open files shared by the regions that map them: one store (two
    /// descriptors) per distinct file, whatever the number of regions.
    files: Mutex<HashMap<FileKey, Weak<FileStore>>>,
    /// Swap space shared by the anonymous regions of one folio size: one
    /// private swap file and one slot allocator each (slots are in folio
    /// units), dropped with the last region that uses them.
    swap: Mutex<HashMap<u64, SwapSpace>>,
    next_id: AtomicU64,
}

/// A file's identity for sharing its store: device, inode, writable.
type FileKey = (u64, u64, bool);

/// The swap file and slot allocator shared by anonymous regions of one
/// folio size (weak: they go with the last region using them).
type SwapSpace = (Weak<SwapFile>, Weak<Slots>);

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// Bytes an eviction batch covers when no batch size was chosen: 4 MiB,
    /// or half the budget if that is less (small budgets work with the
    /// defaults).
    pub fn batch_bytes(&self) -> u64 {
        DEFAULT_BATCH_BYTES.min(self.budget / 2).max(MIN_FOLIO)
    }
    /// Folios per eviction batch for a folio size.
    pub fn batch_folios(&self, folio: u64) -> usize {
        self.cfg
            .batch
            .unwrap_or(((self.batch_bytes() / folio) as usize).clamp(1, upager_sys::mem::MAX_IOV))
    }
    /// Fill buffer per handler thread: the largest readahead or folio.
    pub fn fill_buf_bytes(&self) -> usize {
        self.cfg.readahead.max(MAX_FOLIO) as usize + MAX_FOLIO as usize
    }
    /// `n` folios of `r` became DIRTY (file-backed regions are counted).
    pub fn dirty_add(&self, r: &RegionInner, n: u64) {
        if !r.is_anon() && n > 0 {
            self.dirty.fetch_add(n * r.folio, Ordering::AcqRel);
        }
    }
    /// `n` DIRTY folios of `r` were written back, evicted or dropped.
    pub fn dirty_sub(&self, r: &RegionInner, n: u64) {
        if !r.is_anon() && n > 0 {
            self.dirty.fetch_sub(n * r.folio, Ordering::AcqRel);
        }
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
        let dirty_limit = cfg
            .dirty_limit
            .unwrap_or(budget / 2)
            .clamp(MIN_FOLIO, budget);
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
            dirty: AtomicU64::new(0),
            dirty_limit,
            files: Mutex::new(HashMap::new()),
            swap: Mutex::new(HashMap::new()),
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
        let open_error = |e: std::io::Error| {
            let path = path.to_path_buf();
            if let Some(limit) = limit_error(&e) {
                return limit;
            }
            match e.kind() {
                std::io::ErrorKind::NotFound => MapError::NotFound { path },
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
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
        };
        // A file mapped already (by another region) shares its descriptors.
        let meta = std::fs::metadata(path).map_err(open_error)?;
        if let Some(store) = self.shared_file(&meta, opts.writable) {
            return self.map_store(store, opts);
        }
        let store = FileStore::open(path, opts.writable, self.shared().cfg.direct_io)
            .map_err(open_error)?;
        let store = self.share_file(&meta, opts.writable, store);
        self.map_store(store, opts)
    }

    /// The store of a file some live region maps already, if its size is
    /// still the one the store knows (a read-only mapping may use a
    /// writable store).
    fn shared_file(&self, meta: &std::fs::Metadata, writable: bool) -> Option<Arc<dyn Store>> {
        use std::os::unix::fs::MetadataExt;
        let files = self
            .shared()
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let keys: &[bool] = if writable { &[true] } else { &[false, true] };
        keys.iter().find_map(|&w| {
            let st = files.get(&(meta.dev(), meta.ino(), w))?.upgrade()?;
            (st.len() == meta.len()).then_some(st as Arc<dyn Store>)
        })
    }

    /// Records an opened file store for sharing; returns it as a store.
    fn share_file(
        &self,
        meta: &std::fs::Metadata,
        writable: bool,
        store: FileStore,
    ) -> Arc<dyn Store> {
        use std::os::unix::fs::MetadataExt;
        let store = Arc::new(store);
        let mut files = self
            .shared()
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        files.retain(|_, w| w.strong_count() > 0);
        files.insert((meta.dev(), meta.ino(), writable), Arc::downgrade(&store));
        store
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
        let meta = file.metadata().map_err(|source| MapError::Open {
            path: fd_path.clone(),
            source,
        })?;
        if let Some(store) = self.shared_file(&meta, opts.writable) {
            drop(file); // the shared store has descriptors of its own
            return self.map_store(store, opts);
        }
        let store = FileStore::from_file(file, opts.writable, self.shared().cfg.direct_io)
            .map_err(|source| {
                limit_error(&source).unwrap_or(MapError::Open {
                    path: fd_path,
                    source,
                })
            })?;
        let store = self.share_file(&meta, opts.writable, store);
        self.map_store(store, opts)
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
        let (swap, slots) = self.swap_space(opts.folio)?;
        self.map_inner(swap, Some(slots), 0, len, opts.folio, true)
    }

    /// The swap file and slot allocator of anonymous regions with `folio`
    /// sized folios: shared by all of them, created with the first.
    fn swap_space(&self, folio: u64) -> Result<(Arc<dyn Store>, Arc<Slots>), MapError> {
        let sh = self.shared();
        let mut swap = sh.swap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((f, s)) = swap.get(&folio) {
            if let (Some(f), Some(s)) = (f.upgrade(), s.upgrade()) {
                return Ok((f, s));
            }
        }
        let dir = &sh.cfg.swap_dir;
        let file = SwapFile::create(dir, sh.cfg.direct_io).map_err(|source| {
            limit_error(&source).unwrap_or(MapError::SwapFile {
                dir: dir.clone(),
                source,
            })
        })?;
        let (file, slots) = (Arc::new(file), Arc::new(Slots::default()));
        swap.insert(folio, (Arc::downgrade(&file), Arc::downgrade(&slots)));
        Ok((file, slots))
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
        slots: Option<Arc<Slots>>,
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
                source: std::io::Error::from_raw_os_error(libc::ENOMEM),
            })?;
        let mmap_error = |len: u64, source: std::io::Error| {
            limit_error(&source).unwrap_or(MapError::Mmap { len, source })
        };
        let nfolios = (map_len / folio) as usize;
        let states = upager_sys::mem::AtomicTable::zeroed(nfolios)
            .map_err(|source| mmap_error(map_len / folio * 8, source))?;
        let touched =
            upager_sys::mem::AtomicTable::zeroed(nfolios.div_ceil(crate::region::CHUNK * 64))
                .map_err(|source| mmap_error(map_len / folio / 64, source))?;
        let map = Mapping::anonymous(map_len as usize, folio as usize, writable)
            .map_err(|source| mmap_error(map_len, source))?;
        // THP off: a MISSING-registered range would otherwise get a zeroed
        // 2 MiB page allocated before the fault is raised. Not inherited by
        // fork: a child must not see half-paged memory (it gets SIGSEGV).
        let _ = map.advise(0, map.len(), Advice::NoHugePage);
        let _ = map.advise(0, map.len(), Advice::DontFork);
        // Registration is the last step that can fail: if it does, the
        // mapping is dropped (munmap) before anyone saw its address.
        sh.uffd
            .register(&map, true, writable)
            .map_err(MapError::Register)?;
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
            wb_backoff: crate::region::Backoff::default(),
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
        s.dirty_bytes = sh.dirty.load(Ordering::Relaxed);
        s.evicted_markers = crate::marker::count_markers(sh.table.all().iter());
        s
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.shared().budget
    }
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
