//! The pager: the public facade. It validates options, starts the threads
//! (fault handlers, prefetch, reclaimer) around the shared core, and maps
//! regions: files (one shared store per distinct file), any store, and
//! anonymous memory (one shared swap file per folio size).
//!
//! Uses: everything below it (`shared`, `area`, `region`, `advice`, `fault`,
//! `prefetch`, `reclaim`, `store`, `table`, `config`, `error`, `stats`).

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use upager_sys::mem::{Advice, Mapping};

use crate::area::Area;
use crate::config::{PagerBuilder, DEFAULT_ANON_FOLIO, DEFAULT_FOLIO, MAX_FOLIO, MIN_FOLIO};
use crate::error::{limit_error, FileKind, MapError, PagerError};
use crate::file_store::FileStore;
use crate::region::Region;
use crate::shared::{Owner, Shared};
use crate::stats::Stats;
use crate::store::Store;
use crate::swap::{Slots, SwapFile};
use crate::twins::FileWriters;
use crate::MapOptions;

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
            .field("budget", &self.owner.shared.budget.limit())
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

    /// Starts a pager's engine (checks, core, threads); `fork.rs`'s
    /// `from_builder` also records it for the fork handlers.
    pub(crate) fn start(cfg: PagerBuilder) -> Result<Pager, PagerError> {
        if cfg.budget < MIN_FOLIO {
            return Err(PagerError::BudgetTooSmall(cfg.budget));
        }
        if !(1..=64).contains(&cfg.handler_threads) {
            return Err(PagerError::HandlerThreads(cfg.handler_threads));
        }
        if let Some(n) = cfg.uffd_shards {
            if !(1..=cfg.handler_threads).contains(&n) {
                return Err(PagerError::UffdShards {
                    shards: n,
                    threads: cfg.handler_threads,
                });
            }
        }
        if let Err(e) = &cfg.fault_mode {
            return Err(PagerError::FaultMode(e.clone()));
        }
        if let Err(e) = &cfg.pool {
            return Err(PagerError::Pool(e.clone()));
        }
        if let Err(e) = &cfg.cache_size {
            return Err(PagerError::Cache(e.clone()));
        }
        if cfg.readahead > crate::config::MAX_READAHEAD {
            return Err(PagerError::Readahead(cfg.readahead));
        }
        if let Some(limit) = cfg.dirty_limit {
            if !(MIN_FOLIO..=cfg.budget).contains(&limit) {
                return Err(PagerError::DirtyLimit {
                    limit,
                    budget: cfg.budget,
                });
            }
        }
        if let Some(b) = cfg.batch {
            if !(1..=upager_sys::mem::MAX_IOV).contains(&b) {
                return Err(PagerError::Batch(b));
            }
        }
        if let Some(bytes) = cfg.batch_bytes {
            if !(MIN_FOLIO..=cfg.budget).contains(&bytes) {
                return Err(PagerError::BatchBytes {
                    bytes,
                    budget: cfg.budget,
                });
            }
        }
        let shared = Arc::new(Shared::new(cfg)?);
        // The mode is known once the userfaultfd is open (Shared::new).
        if shared.mode == crate::FaultMode::InThread {
            crate::inthread::install().map_err(PagerError::SignalHandler)?;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = Arc::new(Owner::new(Arc::clone(&shared), tx));
        for i in 0..shared.cfg.handler_threads {
            let s = Arc::clone(&shared);
            let in_thread = s.mode == crate::FaultMode::InThread;
            owner.adopt(
                std::thread::Builder::new()
                    .name(format!("upager-fault-{i}"))
                    .spawn(move || {
                        if in_thread {
                            s.resolver_main()
                        } else {
                            let shard = i % s.uffds.len();
                            s.handler_main(shard)
                        }
                    })
                    .map_err(PagerError::Spawn)?,
            );
        }
        let s = Arc::clone(&shared);
        owner.adopt(
            std::thread::Builder::new()
                .name("upager-prefetch".into())
                .spawn(move || s.prefetch_main(rx))
                .map_err(PagerError::Spawn)?,
        );
        let s = Arc::clone(&shared);
        owner.adopt(
            std::thread::Builder::new()
                .name("upager-window".into())
                .spawn(move || s.window_main())
                .map_err(PagerError::Spawn)?,
        );
        let s = Arc::clone(&shared);
        owner.adopt(
            std::thread::Builder::new()
                .name("upager-reclaim".into())
                .spawn(move || s.reclaimer_main())
                .map_err(PagerError::Spawn)?,
        );
        Ok(Pager { owner })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.owner.shared
    }

    /// In a fork child, for a handle inherited from an ancestor: a handle
    /// of the pager started for it here. None for this process's own.
    ///
    /// # Panics
    /// If the child could not start one (the error was logged then).
    fn heir(&self) -> Option<Pager> {
        let owner = crate::lineage::heir_of_pager(&self.owner, false)?;
        Some(Pager {
            owner: owner.unwrap_or_else(|| {
                panic!(
                    "this pager was inherited from the parent process, and this fork child \
                     could not start one of its own (see the error logged at the fork)"
                )
            }),
        })
    }

    pub(crate) fn owner(&self) -> &Arc<Owner> {
        &self.owner
    }

    /// Maps `area`, a region of the parent process, again in a fork child:
    /// at its old address (over `reserved`, the child's reservation of that
    /// range), on `store`, cold (every folio is read again from the store).
    pub(crate) fn map_again(
        &self,
        area: &Area,
        store: Arc<dyn Store>,
        reserved: Mapping,
    ) -> Result<Region, MapError> {
        let opts = MapOptions::new()
            .folio(area.folio)
            .writable(area.writable)
            .offset(area.store_off)
            .len(area.len);
        // The file's writers here: a description of the child's own (the
        // inherited one is the parent's too), so each sees the other as
        // another writer and both keep twins (twins.rs).
        let writers = match &area.writers {
            Some(w) => Some(w.reopen_in_child().map_err(|source| MapError::Open {
                path: "<inherited file>".into(),
                source,
            })?),
            None => None,
        };
        self.map_inner_at(
            store,
            None,
            (area.store_off, area.len),
            &opts,
            writers,
            Some(reserved),
        )
    }

    /// Maps a file (or the range `offset..offset+len` of it). Read-only
    /// unless `opts.writable(true)`; writes reach the file on eviction and on
    /// [`Region::flush`].
    pub fn map_file(&self, path: impl AsRef<Path>, opts: &MapOptions) -> Result<Region, MapError> {
        if let Some(p) = self.heir() {
            return p.map_file(path, opts);
        }
        let path = path.as_ref();
        check_folio(opts.folio_bytes())?;
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
        let not_regular = |kind: FileKind| MapError::NotARegularFile {
            path: path.to_path_buf(),
            kind,
            advice: kind.advice(),
        };
        // A file mapped already (by another region) shares its descriptors.
        let meta = std::fs::metadata(path).map_err(open_error)?;
        // Before opening: opening a FIFO waits for a writer.
        if let Some(kind) = crate::file_store::unpageable(&meta) {
            return Err(not_regular(kind));
        }
        let writers = || {
            file_writers(&meta, opts.writable, || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
            })
            .map_err(open_error)
        };
        let opts = &*opts.beside(|| Some(path.to_path_buf()));
        if let Some(store) = self.shared().stores.file(&meta, opts.writable) {
            return self.map_store_of(store, opts, writers()?);
        }
        let store = FileStore::open(path, opts.writable, self.shared().cfg.direct_io)
            .map_err(open_error)?;
        if let Some(kind) = crate::file_store::unpageable_open(store.file(), &meta) {
            return Err(not_regular(kind));
        }
        let store = self.shared().stores.add_file(&meta, opts.writable, store);
        self.map_store_of(store, opts, writers()?)
    }

    /// Maps an already open file. `opts.writable` must match how it was opened.
    pub fn map_open_file(
        &self,
        file: std::fs::File,
        opts: &MapOptions,
    ) -> Result<Region, MapError> {
        if let Some(p) = self.heir() {
            return p.map_open_file(file, opts);
        }
        check_folio(opts.folio_bytes())?;
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
        if let Some(kind) = crate::file_store::unpageable_open(&file, &meta) {
            return Err(MapError::NotARegularFile {
                path: fd_path,
                kind,
                advice: kind.advice(),
            });
        }
        // A warm start keeps its trace beside the file: the path the
        // descriptor was opened by, if it still names this file.
        let opts = &*opts.beside(|| {
            let path = crate::file_store::path_if_same(&file, &meta);
            if path.is_none() {
                log::warn!(
                    "warm start: the mapped descriptor's file has no path of its own (deleted, or renamed over): no trace is kept"
                );
            }
            path
        });
        let writers =
            file_writers(&meta, opts.writable, || file.try_clone()).map_err(|source| {
                MapError::Open {
                    path: fd_path.clone(),
                    source,
                }
            })?;
        if let Some(store) = self.shared().stores.file(&meta, opts.writable) {
            drop(file); // the shared store has descriptors of its own
            return self.map_store_of(store, opts, writers);
        }
        let store = FileStore::from_file(file, opts.writable, self.shared().cfg.direct_io)
            .map_err(|source| {
                limit_error(&source).unwrap_or(MapError::Open {
                    path: fd_path,
                    source,
                })
            })?;
        let store = self.shared().stores.add_file(&meta, opts.writable, store);
        self.map_store_of(store, opts, writers)
    }

    /// Maps any [`Store`] with file semantics (reads come from the store,
    /// writes go back to it).
    pub fn map_store(&self, store: Arc<dyn Store>, opts: &MapOptions) -> Result<Region, MapError> {
        if let Some(p) = self.heir() {
            return p.map_store(store, opts);
        }
        let store = self.tiered(store, opts);
        self.map_store_of(store, opts, None)
    }

    /// `store` behind the disk tier (cache.rs) when it names its bytes
    /// ([`Store::cache_key`]), the region is read-only and the tier is on;
    /// else `store` itself (a tier that cannot open is logged once).
    fn tiered(&self, store: Arc<dyn Store>, opts: &MapOptions) -> Arc<dyn Store> {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let cfg = &self.shared().cfg;
        let (Some(key), Ok(size)) = (store.cache_key(), &cfg.cache_size) else {
            return store;
        };
        let tier = crate::cache::CacheConfig::new(cfg.cache_dir.clone(), *size);
        if opts.writable || store.writable() || !tier.enabled() {
            return store;
        }
        match crate::cache::CachedStore::open(Arc::clone(&store), &key, &tier) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    log::warn!("{} is read without the disk tier: {e}", store.describe());
                }
                store
            }
        }
    }

    /// [`Pager::map_store`] of a file store, with this process's writers of
    /// the file (writable regions: twins when it has several, twins.rs).
    fn map_store_of(
        &self,
        store: Arc<dyn Store>,
        opts: &MapOptions,
        writers: Option<Arc<FileWriters>>,
    ) -> Result<Region, MapError> {
        let opts = &opts.with_default_folio(DEFAULT_FOLIO.max(store.unit()));
        let folio = opts.folio_bytes();
        check_folio(folio)?;
        check_unit(&*store, folio)?;
        if opts.writable && !store.writable() {
            return Err(MapError::StoreReadOnly);
        }
        if !opts.offset.is_multiple_of(folio) {
            return Err(MapError::OffsetNotAligned {
                offset: opts.offset,
                folio,
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
        self.map_inner(store, None, opts.offset, len, opts, writers)
    }

    /// Maps `len` bytes of anonymous memory: zero on first touch, swapped to
    /// a private swap file (created 0600 in the swap directory and unlinked
    /// at once) when evicted. Always writable; `opts.offset` must be 0.
    pub fn map_anonymous(&self, len: u64, opts: &MapOptions) -> Result<Region, MapError> {
        if let Some(p) = self.heir() {
            return p.map_anonymous(len, opts);
        }
        let opts = &check_anonymous(len, opts)?;
        self.check_budget(opts.folio_bytes())?;
        let (swap, slots) = self.swap_space(opts.folio_bytes())?;
        let swap = self.compressed_tier(swap, len, opts);
        self.map_inner(
            swap,
            Some(slots),
            0,
            len,
            &opts.clone().writable(true),
            None,
        )
    }

    /// Maps `len` bytes of anonymous memory that swaps to `store` instead of
    /// the pager's swap file (far memory: a network store). Zero on first
    /// touch; a folio never written is never read from the store. The
    /// region has its own slot allocator: evicted folio `i` goes to store
    /// offset `slot * folio`, and slots are punched ([`Store::punch`]) when
    /// the region discards or unmaps them. Always writable; `opts.offset`
    /// must be 0; `store` must be writable.
    pub fn map_anonymous_on(
        &self,
        store: Arc<dyn Store>,
        len: u64,
        opts: &MapOptions,
    ) -> Result<Region, MapError> {
        if let Some(p) = self.heir() {
            return p.map_anonymous_on(store, len, opts);
        }
        let opts = &check_anonymous(len, opts)?;
        check_unit(&*store, opts.folio_bytes())?;
        if !store.writable() {
            return Err(MapError::StoreReadOnly);
        }
        self.check_budget(opts.folio_bytes())?;
        let slots = Arc::new(Slots::default());
        self.map_inner(
            store,
            Some(slots),
            0,
            len,
            &opts.clone().writable(true),
            None,
        )
    }

    /// `swap` with the compressed tier in front (ztier.rs), if the region's
    /// options or `UPAGER_ZTIER` leave it on and the budget has room for a
    /// pool; else `swap`.
    fn compressed_tier(&self, swap: Arc<dyn Store>, len: u64, opts: &MapOptions) -> Arc<dyn Store> {
        if !crate::ztier::enabled(opts.ztier) {
            return swap;
        }
        let sh = self.shared();
        let folio = opts.folio_bytes();
        let charge = sh.budget.charge_handle();
        match crate::ztier::ZStore::new(Arc::clone(&swap), folio, len.div_ceil(folio), charge) {
            Ok(Some(z)) => {
                let z = Arc::new(z);
                let pool: Arc<dyn crate::budget::PoolTier> = z.clone();
                sh.budget.register_pool(Arc::downgrade(&pool));
                z
            }
            Ok(None) => swap,
            Err(e) => {
                log::warn!("no compressed tier for an anonymous region ({e}): it swaps to the swap file only");
                swap
            }
        }
    }

    /// The swap file and slot allocator of anonymous regions with `folio`
    /// sized folios: shared by all of them, created with the first.
    fn swap_space(&self, folio: u64) -> Result<(Arc<dyn Store>, Arc<Slots>), MapError> {
        let sh = self.shared();
        let dir = &sh.cfg.swap_dir;
        sh.stores
            .swap(folio, || SwapFile::create(dir, sh.cfg.direct_io))
            .map_err(|source| {
                limit_error(&source).unwrap_or(MapError::SwapFile {
                    dir: dir.clone(),
                    source,
                })
            })
    }

    fn check_budget(&self, folio: u64) -> Result<(), MapError> {
        let batch = self.shared().batch_folios(folio) as u64;
        let need = batch * folio;
        if self.shared().budget.limit() < need {
            return Err(MapError::BudgetBelowBatch {
                budget: self.shared().budget.limit(),
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
        opts: &MapOptions,
        writers: Option<Arc<FileWriters>>,
    ) -> Result<Region, MapError> {
        self.map_inner_at(store, slots, (store_off, len), opts, writers, None)
    }

    /// [`Pager::map_inner`] over `reserved` (a range this process reserved
    /// for the region) if given.
    fn map_inner_at(
        &self,
        store: Arc<dyn Store>,
        slots: Option<Arc<Slots>>,
        (store_off, len): (u64, u64),
        opts: &MapOptions,
        writers: Option<Arc<FileWriters>>,
        reserved: Option<Mapping>,
    ) -> Result<Region, MapError> {
        let (folio, writable) = (opts.folio_bytes(), opts.writable);
        let writers = writers.filter(|_| writable);
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
            upager_sys::mem::AtomicTable::zeroed(nfolios.div_ceil(crate::area::CHUNK * 64))
                .map_err(|source| mmap_error(map_len / folio / 64, source))?;
        // The host's page pool of the file (pool.rs): read-only file
        // regions where the pager or the region asks for one.
        let pool = (opts.pool.unwrap_or(matches!(sh.cfg.pool, Ok(true)))
            && !writable
            && slots.is_none()
            && opts.at.is_none()
            && reserved.is_none())
        .then(|| join_pool(sh, &store, store_off, folio))
        .flatten();
        // A warm start's trace (warm.rs): replay windows of up to a quarter
        // of the budget, 1-64 MiB. (Not for pooled regions: their folios
        // are the pool's.)
        let home = match &opts.warm_file {
            _ if opts.warm == crate::WarmStart::Off || slots.is_some() || pool.is_some() => None,
            Some(file) => Some(crate::warm_format::Home::File(file.clone())),
            None if store.trace_version().is_some() => {
                Some(crate::warm_format::Home::Store(Arc::clone(&store)))
            }
            None => None,
        };
        let warm = home.and_then(|home| {
            let window = (sh.budget.limit() / 4).clamp(1 << 20, 64 << 20);
            crate::warm::Warm::open(opts.warm, home, folio, store_off, len, nfolios, window)
                .map(|w| {
                    // A local store: its long sequential runs stream by
                    // readahead, as on demand (where readahead has a
                    // window worth the name: 16 folios or more).
                    let window = (sh.cfg.readahead / folio) as usize;
                    if store.round_trips() || window < 16 {
                        w
                    } else {
                        w.leave_runs_to_readahead(window)
                    }
                })
                .map_err(|e| log::warn!("no warm start for a region of {}: {e}", store.describe()))
                .ok()
        });
        // Mixed folio sizes (huge.rs): writable file regions of
        // folios below 2 MiB, big enough, fill sequential 2 MiB runs as huge
        // pages; their view is 2 MiB-aligned so runs are PMDs. (A fork
        // child's reservation is at the parent's address: aligned alike.)
        let mixed = opts.huge_runs.unwrap_or(sh.cfg.huge_runs)
            && folio < crate::thp::HUGE
            && slots.is_none()
            && len >= crate::config::HUGE_RUNS_MIN_BYTES
            && sh.thp.usable();
        let align = if mixed { crate::thp::HUGE } else { folio };
        let map = match (opts.at, reserved) {
            _ if pool.is_some() => {
                let data = pool.as_ref().map(|v| v.pool.data()).expect("pooled");
                Mapping::shared_file(data, store_off, map_len as usize, align as usize, false)
                    .map_err(|source| mmap_error(map_len, source))?
            }
            (None, Some(place)) => {
                let addr = place.addr();
                if place.len() as u64 != map_len {
                    return Err(MapError::FixedTooSmall {
                        addr,
                        given: place.len() as u64,
                        need: map_len,
                    });
                }
                place
                    .remap(writable)
                    .map_err(|source| MapError::Fixed { addr, source })?
            }
            (None, None) => Mapping::anonymous(map_len as usize, align as usize, writable)
                .map_err(|source| mmap_error(map_len, source))?,
            (Some(at), _) => {
                if !at.addr().is_multiple_of(folio) {
                    return Err(MapError::FixedUnaligned {
                        addr: at.addr(),
                        folio,
                    });
                }
                if at.len() < map_len {
                    return Err(MapError::FixedTooSmall {
                        addr: at.addr(),
                        given: at.len(),
                        need: map_len,
                    });
                }
                Mapping::fixed(at, map_len as usize, writable).map_err(|source| {
                    MapError::Fixed {
                        addr: at.addr(),
                        source,
                    }
                })?
            }
        };
        // THP off: a MISSING-registered range would otherwise get a zeroed
        // 2 MiB page allocated before a write fault is raised. Except for
        // file-backed writable regions of 2 MiB folios (filled by moving
        // huge pages in, thp.rs): there a read fault comes at PMD level
        // (the huge zero page path, nothing allocated) and leaves no page
        // table to drop before the move, a TLB flush saved per fill; a
        // write fault first costs the kernel a zeroed 2 MiB page (freed).
        // Anonymous regions, whose first touch is mostly a write, keep
        // THP off. Not inherited by fork: a child must not see half-paged
        // memory (it gets SIGSEGV).
        let huge_view = folio == crate::thp::HUGE
            && writable
            && slots.is_none()
            && sh.thp.usable()
            && map.addr().is_multiple_of(crate::thp::HUGE);
        let advice = if huge_view {
            Advice::HugePage
        } else {
            Advice::NoHugePage
        };
        let huge_view = huge_view && map.advise(0, map.len(), advice).is_ok();
        if !huge_view {
            let _ = map.advise(0, map.len(), Advice::NoHugePage);
        }

        let run_folios = if mixed && map.addr().is_multiple_of(crate::thp::HUGE) {
            (crate::thp::HUGE / folio) as usize
        } else {
            0
        };
        let runs = upager_sys::mem::AtomicTable::zeroed(if run_folios > 0 {
            nfolios.div_ceil(run_folios).div_ceil(64)
        } else {
            0
        })
        .map_err(|source| mmap_error(map_len / crate::thp::HUGE / 8, source))?;
        let tables = upager_sys::mem::AtomicTable::zeroed(if folio == crate::thp::HUGE {
            nfolios.div_ceil(64)
        } else if run_folios > 0 {
            nfolios.div_ceil(run_folios).div_ceil(64)
        } else {
            0
        })
        .map_err(|source| mmap_error(map_len / folio / 8, source))?;
        // The written page of each folio dirty in part (writable files of
        // folios above 4 KiB and below 2 MiB, on a store that takes single
        // pages: area.rs `partial_pages`).
        let partial_pages = upager_sys::mem::AtomicTable::zeroed(
            if writable
                && slots.is_none()
                && folio > MIN_FOLIO
                && folio < MAX_FOLIO
                && store.takes_pages()
            {
                nfolios
            } else {
                0
            },
        )
        .map_err(|source| mmap_error(map_len / folio * 8, source))?;
        let _ = map.advise(0, map.len(), Advice::DontFork);
        // In-thread: upager's SIGBUS handler must be the process's (a
        // program may have replaced it since the pager was built, e.g.
        // Python's faulthandler.enable()).
        if sh.mode == crate::FaultMode::InThread {
            crate::inthread::install().map_err(MapError::Register)?;
        }
        // Registration is the last step that can fail: if it does, the
        // mapping is dropped (munmap, which ends every registration) before
        // anyone saw its address. One registration per shard, round-robin
        // over the pager's userfaultfds from the region's id.
        let id = sh.next_region_id();
        let shards = crate::area::Shards::new(nfolios, folio, sh.uffds.len());
        let shard_first = id as usize % sh.uffds.len();
        for k in 0..shards.count {
            let first = k * shards.folios;
            let n = shards.folios.min(nfolios - first);
            let range = map.range(first * folio as usize, n * folio as usize);
            sh.uffds[(shard_first + k) % sh.uffds.len()]
                .register(range, true, writable)
                .map_err(MapError::Register)?;
        }
        let inner = Arc::new(Area {
            touched,
            shard_folios: shards.folios,
            shard_first,
            huge_view,
            tables,
            run_folios,
            runs,
            id,
            states,
            map,
            len,
            folio,
            shift: folio.trailing_zeros(),
            store,
            pool,
            store_off,
            slots,
            writable,
            inflight: AtomicU64::new(0),
            dying: std::sync::atomic::AtomicBool::new(false),
            wb_error: Mutex::new(None),
            wb_backoff: crate::area::Backoff::default(),
            pins: Mutex::new(std::collections::HashMap::new()),
            partial_pages,
            trace: crate::trace::Trace::for_folios(len.div_ceil(folio) as usize),
            writers,
            twins: crate::twins::Twins::default(),
            warm,
        });
        if folio == crate::thp::HUGE || run_folios > 0 {
            // Until its teardown: the reclaimer stages huge pages for it.
            sh.thp.want();
            sh.kick_reclaimer();
        }
        sh.table.insert(Arc::clone(&inner));
        if let Some(w) = &inner.warm {
            if w.replay().is_some() {
                // The first window at once, ahead of the first fault.
                sh.ask_ahead(inner.base() | 1);
            }
        }
        if sh.mode == crate::FaultMode::InThread {
            crate::inthread::register(sh, &inner);
        }
        // Another writer of the file (here or in another process): twins
        // for it from now on, once the others have switched (twins.rs).
        if let Some(w) = &inner.writers {
            w.join(inner.id, write_back_all(sh, &inner));
        }
        Ok(Region::new(inner, Arc::clone(&self.owner)))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        if let Some(p) = self.heir() {
            return p.stats();
        }
        let sh = self.shared();
        let mut s = sh.counters.snapshot();
        s.resident_bytes = sh.budget.resident();
        s.resident_peak_bytes = sh.budget.peak();
        s.budget_bytes = sh.budget.limit();
        s.dirty_bytes = sh.budget.dirty();
        s.pinned_bytes = sh.budget.pinned();
        s.evicted_markers = crate::advice::count_markers(sh.table.all().iter());
        s.overhead_bytes = sh.overhead_bytes();
        sh.budget.add_pool_counters(&mut s);
        s
    }

    /// Where fills spend their time, if the pager was built with
    /// [`PagerBuilder::fault_timing`] (None otherwise).
    pub fn fault_phases(&self) -> Option<crate::FaultPhases> {
        if let Some(p) = self.heir() {
            return p.fault_phases();
        }
        let sh = self.shared();
        sh.cfg.fault_timing.then(|| sh.phases.snapshot())
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        if let Some(p) = self.heir() {
            return p.budget();
        }
        self.shared().budget.limit()
    }

    /// What the kernel let this pager use (probed at start, logged once):
    /// the fault mode, a user-mode-only userfaultfd (system calls on
    /// non-resident region memory then fail with EFAULT), batched unmapping,
    /// io_uring, huge-page moves, and any feature masked for tests.
    pub fn info(&self) -> crate::PagerInfo {
        if let Some(p) = self.heir() {
            return p.info();
        }
        self.shared().info.clone()
    }

    /// How this pager resolves faults.
    pub fn fault_mode(&self) -> crate::FaultMode {
        if let Some(p) = self.heir() {
            return p.fault_mode();
        }
        self.shared().mode
    }

    /// How many userfaultfds this pager's faults are queued on
    /// ([`PagerBuilder::uffd_shards`]; 1 in the in-thread mode).
    ///
    /// [`PagerBuilder::uffd_shards`]: crate::PagerBuilder::uffd_shards
    pub fn uffd_shards(&self) -> usize {
        if let Some(p) = self.heir() {
            return p.uffd_shards();
        }
        self.shared().uffds.len()
    }
}

/// The checks every anonymous mapping makes before anything is created: a
/// valid folio, a length, no offset. Returns the options with the folio
/// fixed (the one set, or [`DEFAULT_ANON_FOLIO`]).
fn check_anonymous(len: u64, opts: &MapOptions) -> Result<MapOptions, MapError> {
    let opts = opts.with_default_folio(DEFAULT_ANON_FOLIO);
    check_folio(opts.folio_bytes())?;
    if len == 0 {
        return Err(MapError::ZeroSize);
    }
    if opts.offset != 0 {
        return Err(MapError::AnonymousOffset(opts.offset));
    }
    Ok(opts)
}

fn check_folio(folio: u64) -> Result<(), MapError> {
    if folio.is_power_of_two() && (MIN_FOLIO..=MAX_FOLIO).contains(&folio) {
        Ok(())
    } else {
        Err(MapError::FolioSize(folio))
    }
}

/// A folio of `folio` bytes on `store`: whole units of it
/// ([`Store::unit`]).
fn check_unit(store: &dyn Store, folio: u64) -> Result<(), MapError> {
    let unit = store.unit();
    if folio.is_multiple_of(unit) {
        Ok(())
    } else {
        Err(MapError::FolioBelowUnit {
            folio,
            unit,
            store: store.describe(),
        })
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        // An inherited handle: the pager started for it here goes (with the
        // last of its regions), the parent's is left alone (lineage.rs).
        if let Some(heir) = crate::lineage::heir_of_pager(&self.owner, true) {
            crate::lineage::forget_ancestor(&self.owner);
            drop(heir);
        }
    }
}

impl Region {
    /// Counters of the pager this region belongs to.
    pub fn pager_stats(&self) -> Stats {
        if let Some(h) = self.heir() {
            return h.pager_stats();
        }
        Pager {
            owner: Arc::clone(&self.owner),
        }
        .stats()
    }

    /// The host's page pool this region's view maps, if it is in one
    /// ([`PagerBuilder::pool`](crate::PagerBuilder::pool)): None for a
    /// private region.
    pub fn pool_info(&self) -> Option<crate::PoolInfo> {
        if let Some(h) = self.heir() {
            return h.pool_info();
        }
        self.inner.pool.as_ref().map(|v| v.pool.info())
    }

    /// The counters of the store this region maps, with their stable
    /// names (`store_gets`, `store_bytes_received`, ...:
    /// [`Store::store_counters`](crate::Store::store_counters)); empty for
    /// a store that keeps none (a file, swap).
    pub fn store_counters(&self) -> Vec<(&'static str, u64)> {
        if let Some(h) = self.heir() {
            return h.store_counters();
        }
        let mut c = self.inner.store.store_counters();
        if let Some(v) = &self.inner.pool {
            c.extend(v.pool.counters());
        }
        c
    }
}

/// This process's writers of the file `meta` describes, for a writable
/// mapping of a regular file (`open`: a new read-write description of it);
/// `None` for read-only mappings and block devices.
fn file_writers(
    meta: &std::fs::Metadata,
    writable: bool,
    open: impl FnOnce() -> std::io::Result<std::fs::File>,
) -> std::io::Result<Option<Arc<FileWriters>>> {
    use std::os::unix::fs::MetadataExt;
    if !writable || !meta.file_type().is_file() {
        return Ok(None);
    }
    FileWriters::of(meta.dev(), meta.ino(), open).map(Some)
}

/// What a switch to twins does to region `r` of pager `sh` (twins.rs):
/// write back every dirty folio (made without a twin), keep it resident.
/// Holds both weakly: a no-op once the region or its pager is gone.
fn write_back_all(sh: &Arc<Shared>, r: &Arc<crate::area::Area>) -> crate::twins::WriteBackAll {
    let (sh, r) = (Arc::downgrade(sh), Arc::downgrade(r));
    Box::new(move || {
        let (Some(sh), Some(r)) = (sh.upgrade(), r.upgrade()) else {
            return;
        };
        sh.counters.writer_switches.inc();
        if r.dying.load(std::sync::atomic::Ordering::SeqCst) {
            return; // its unmap flushed it
        }
        if let Err(e) = crate::region::write_back_area(&sh, &r) {
            // Kept dirty and twinless: written whole later.
            log::error!(
                "region {}: writing back its dirty folios before twins were turned on failed: {e}; those folios are written whole later and may overwrite another writer's bytes",
                r.id
            );
            r.record_error(e);
        }
    })
}

/// The host's pool of `store`'s bytes for a region from `store_off`,
/// attached (created if no process has it), or None: the region is then
/// private, and the first such reason of the process is logged.
fn join_pool(
    sh: &Shared,
    store: &Arc<dyn Store>,
    store_off: u64,
    folio: u64,
) -> Option<crate::pool::PoolView> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let key = store.pool_key()?;
    if store.is_empty() || !store_off.is_multiple_of(folio) {
        return None;
    }
    match crate::pool::attach(&key, store.len(), folio, sh.budget.limit()) {
        Ok(pool) => Some(crate::pool::PoolView::new(
            pool,
            (store_off / folio) as usize,
        )),
        Err(e) => {
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!(
                    "{} is mapped privately, not in a page pool: {e}",
                    store.describe()
                );
            }
            None
        }
    }
}
