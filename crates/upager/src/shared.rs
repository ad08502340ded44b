//! The shared core of a pager: the state its handles, regions and threads share
//! ([`Shared`]), and the owner of its threads ([`Owner`]).
//!
//! `Shared` holds one of each service the mechanisms above it use — the
//! userfaultfd, the pidfd for batched `process_madvise`, the options, the
//! counters, the region table, the budget, the LRU lists, the shared stores
//! — and the small amount of state of its own (the eviction clock, the
//! reclaimer's kick, the stop flag). Each mechanism adds its behaviour in
//! its own module (`reclaim`, `gather`, `fault`), never the other way round.
//!
//! Lifetime: regions hold the [`Owner`], so a pager's threads and its
//! userfaultfd outlive every region; dropping the last handle stops the
//! threads (`stop`, the stop eventfd, the reclaimer's kick) and joins them.
//!
//! Uses: `area`, `budget`, `config`, `error`, `folio`, `lru`, `stats`,
//! `store`, `table`.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use upager_sys::mem::SelfPidfd;
use upager_sys::uffd::{feature, Uffd};

use crate::area::Area;
use crate::budget::Budget;
use crate::config::{FaultMode, PagerBuilder, DEFAULT_BATCH_BYTES, MAX_FOLIO, MIN_FOLIO};
use crate::error::PagerError;
use crate::folio::{State, WAITER};
use crate::lru::Lru;
use crate::stats::{Counters, PhaseClock};
use crate::store::Shares;
use crate::table::RegionTable;

/// State shared by a pager's handles, regions and threads.
pub(crate) struct Shared {
    pub uffd: Uffd,
    pub pidfd: SelfPidfd,
    pub cfg: PagerBuilder,
    /// How faults are resolved (from `cfg`, checked by the builder).
    pub mode: FaultMode,
    pub counters: Counters,
    /// Phase times of fills, when `fault_timing` is on.
    pub phases: PhaseClock,
    pub table: RegionTable,
    pub budget: Budget,
    pub lru: Lru,
    /// Stores shared between regions (files, swap).
    pub stores: Shares,
    /// Pages evicted so far (the clock of refault distances).
    pub evict_seq: AtomicU64,
    /// Prefetch requests queued or in progress.
    pub prefetch_pending: AtomicU64,
    kick: Kick,
    stop: AtomicBool,
    stop_fd: upager_sys::io::EventFd,
    next_id: AtomicU64,
}

/// The background reclaimer's doorbell.
#[derive(Default)]
struct Kick {
    kicked: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Shared {
    /// Opens the userfaultfd (with the features upager needs) and the pidfd.
    pub fn new(cfg: PagerBuilder) -> Result<Shared, PagerError> {
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
        Ok(Shared {
            uffd,
            pidfd: SelfPidfd::open().map_err(PagerError::Pidfd)?,
            counters: Counters::default(),
            phases: PhaseClock::default(),
            table: RegionTable::new(cfg.lookup),
            budget: Budget::new(cfg.budget, cfg.dirty_limit),
            lru: Lru::default(),
            stores: Shares::default(),
            evict_seq: AtomicU64::new(0),
            prefetch_pending: AtomicU64::new(0),
            kick: Kick::default(),
            stop: AtomicBool::new(false),
            stop_fd: upager_sys::io::EventFd::new().map_err(PagerError::EventFd)?,
            next_id: AtomicU64::new(1),
            mode: cfg.fault_mode.clone().unwrap_or_default(),
            cfg,
        })
    }

    /// A new region id.
    pub fn next_region_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
    /// The pager is shutting down.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// Readable when the pager shuts down (handlers poll it beside the uffd).
    pub fn stop_fd(&self) -> &upager_sys::io::EventFd {
        &self.stop_fd
    }
    /// Bytes an eviction batch covers when no batch size was chosen: 4 MiB,
    /// or half the budget if that is less (small budgets work with the
    /// defaults).
    pub fn batch_bytes(&self) -> u64 {
        DEFAULT_BATCH_BYTES
            .min(self.budget.limit() / 2)
            .max(MIN_FOLIO)
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
    /// `n` folios of `r` became DIRTY (file-backed areas are counted).
    pub fn dirty_add(&self, r: &Area, n: u64) {
        if !r.is_anon() && n > 0 {
            self.budget.dirty_charge(n * r.folio);
        }
    }
    /// `n` DIRTY folios of `r` were written back, evicted or dropped.
    pub fn dirty_sub(&self, r: &Area, n: u64) {
        if !r.is_anon() && n > 0 {
            self.budget.dirty_uncharge(n * r.folio);
        }
    }
    /// Wakes faults waiting on folio `idx` if `prev` (the BUSY value just
    /// replaced) says there are any.
    pub fn wake_if_waiter(&self, r: &Area, idx: usize, prev: State) {
        if prev.has(WAITER) {
            let _ = self.uffd.wake(r.folio_addr(idx), r.folio);
        }
    }

    /// Rings the reclaimer's doorbell (once until it answers).
    pub fn kick_reclaimer(&self) {
        if !self.kick.kicked.swap(true, Ordering::AcqRel) {
            let _g = self.kick.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.kick.cv.notify_one();
        }
    }
    /// The reclaimer waits for its doorbell, at most `timeout`.
    pub fn wait_for_kick(&self, timeout: Duration) {
        {
            let g = self.kick.lock.lock().unwrap_or_else(|e| e.into_inner());
            if !self.kick.kicked.load(Ordering::Acquire) {
                let _ = self.kick.cv.wait_timeout(g, timeout);
            }
        }
        self.kick.kicked.store(false, Ordering::Release);
    }

    /// Tells every thread to stop.
    fn shut_down(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.stop_fd.signal();
        let _g = self.kick.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.kick.kicked.store(true, Ordering::Release);
        self.kick.cv.notify_all();
    }
}

/// A prefetch request for the prefetch thread.
pub(crate) struct PrefetchRequest {
    pub region: Arc<Area>,
    pub folios: Range<usize>,
}

/// Owns the threads: dropped when the last handle (pager or region) goes.
pub(crate) struct Owner {
    pub shared: Arc<Shared>,
    /// Requests for the prefetch thread; dropped first on shutdown.
    prefetch_tx: Mutex<Option<std::sync::mpsc::Sender<PrefetchRequest>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Owner {
    /// An owner of `shared` whose prefetch requests go to `tx`.
    pub fn new(shared: Arc<Shared>, tx: std::sync::mpsc::Sender<PrefetchRequest>) -> Owner {
        Owner {
            shared,
            prefetch_tx: Mutex::new(Some(tx)),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Adopts a started thread (joined when the owner drops).
    pub fn adopt(&self, t: JoinHandle<()>) {
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
    }

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
        self.shared.shut_down();
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
