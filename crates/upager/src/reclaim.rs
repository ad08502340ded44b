//! Reclaim: choosing what leaves memory, and when (seeds 000 and 003).
//!
//! - [`Shared::evict_batch`] drives: it isolates up to one batch of victims
//!   from the LRU under ONE lock acquisition (seed 003) and hands them to a
//!   [`Gather`], which runs the batch contract (protect → one flush → write
//!   back → unmap, one flush → release; see `gather`).
//! - [`Shared::reserve`] charges the budget for a fill, evicting directly
//!   while it is full (direct reclaim; bounded, see `budget`).
//! - [`Shared::reclaimer_main`] is the background reclaimer: above the high
//!   watermark it evicts down to the low one; above half the dirty limit it
//!   cleans dirty folios (write back, keep resident); it clears poisoned
//!   folios after [`POISON_HOLD`].
//! - [`Shared::balance_dirty`] is the dirty limit on the writer's side.
//!
//! Lock order (outer → inner): `lru` → nothing. The lru lock is held only to
//! isolate or add entries, never across a system call; swap-slot locks are
//! taken once per batch, after isolation (in `gather`).
//!
//! Access information (not plain FIFO): two lists as in mm/workingset.c.
//! New folios enter the inactive list. Eviction stamps the folio's state word
//! with the pager's eviction counter (in pages); a refault within
//! `budget/2` pages of eviction is a working-set folio that was evicted only
//! because the inactive list was too short, so it goes to the active list.
//! The active list is capped at half the budget; its oldest entries are
//! deactivated when it grows past that or when nothing on the inactive list
//! can be evicted. A scan streams through the inactive list and never evicts
//! a hot set smaller than half the budget. (Accessed bits are not visible
//! from user space here; refault distance is what the kernel uses.)
//!
//! A store that refuses writes (16 failed write-backs in a row, see
//! `area::Backoff`) has its dirty folios passed over for a back-off delay;
//! clean folios are evicted around them.
//!
//! Counters: `reclaim_scanned`, `deactivations`, `direct_reclaim_stalls`,
//! `reclaim_lock_acquisitions`, `dirty_throttled` (and the batch counters of
//! `gather`).
//!
//! Uses: `area`, `budget`, `folio`, `gather`, `lru`, `shared`.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use upager_sys::mem::MAX_IOV;

use crate::area::{Area, Inflight};
use crate::folio::{self, Kind, ACTIVE, PINNED, QUEUED};
use crate::gather::{Gather, Mode, Victim};
use crate::shared::Shared;

/// Shortest period of the dirty-age scan (a guess: a region's state words
/// are walked at most 20 times a second however short the expiry).
const DIRTY_SCAN_MIN: Duration = Duration::from_millis(50);

/// How long a poisoned folio keeps raising SIGBUS before the reclaimer
/// clears it, so that an access after the store recovers succeeds.
pub(crate) const POISON_HOLD: Duration = Duration::from_millis(100);

/// How far (bytes of region) one cleaning batch looks for dirty folios
/// after its first, in address order. The batch's write-protect step walks
/// the page tables of the span its dirty folios cover; oldest-first
/// batches of random writes covered the whole region. Measured with the
/// randwrite example (2 GiB file on ext4 over zram, budget 192 MiB, 200K
/// random 8-byte writes, 4 KiB folios, 2 vCPU KVM, loaded): oldest-first
/// batches walked ~480K entries each (1.9 s of CPU in the protect step);
/// in address order within 64 MiB, 17.2K -> 30.1K writes/s (handlers,
/// medians of 4 interleaved rounds) and 28.4K -> 52.0K (in-thread), with
/// 20-35% less CPU (docs/benchmarks.md, "Random writes + flush"). 16, 64
/// and 256 MiB were within the noise of each other; 64 MiB bounds the walk
/// at 16K entries of 4 KiB folios.
const CLEAN_SCAN_BYTES: u64 = 64 << 20;

/// A write fault held at the dirty limit that can clean nothing for this
/// long (the dirty data belongs to stores refusing writes) gets SIGBUS.
const DIRTY_WAIT_GIVE_UP: Duration = Duration::from_secs(1);

impl Shared {
    /// Isolates up to one batch of victims: one lru lock acquisition for the
    /// batch (seed 003), or one per folio when batched removal is off.
    fn isolate(&self, want_bytes: u64, max_folios: usize) -> Vec<Victim> {
        let mut victims = Vec::new();
        let mut got = 0u64;
        let active_cap = self.budget.limit() / 2;
        let mut lru = self.lru.lock();
        let mut acquisitions = 1;
        let mut budget_scan = lru.inactive_len() + 2 * lru.active_len() + 8;
        // Inactive entries passed over because their store refuses writes:
        // once the whole inactive list was, the active list must give folios
        // back, or a budget of stuck dirty data plus active clean data would
        // leave reads nothing to evict.
        let mut skipped = 0usize;
        while got < want_bytes && victims.len() < max_folios && budget_scan > 0 {
            budget_scan -= 1;
            self.counters.reclaim_scanned.inc();
            let inactive_stuck = skipped >= lru.inactive_len();
            if lru.active_bytes() > active_cap || inactive_stuck {
                if let Some(e) = lru.pop_active() {
                    match folio::load(e.region.state(e.idx)).kind() {
                        Kind::Clean | Kind::Dirty => {
                            folio::set_flag(e.region.state(e.idx), ACTIVE, false);
                            self.counters.deactivations.inc();
                            lru.push_inactive(e);
                        }
                        Kind::Busy => lru.push_active(e),
                        _ => lru.drop_stale(e),
                    }
                    continue;
                }
            }
            let Some(e) = lru.pop_inactive() else {
                break;
            };
            let s = folio::load(e.region.state(e.idx));
            match s.kind() {
                // Active, or pinned: not a candidate now.
                Kind::Clean | Kind::Dirty if s.has(ACTIVE) || s.has(PINNED) => lru.push_active(e),
                // A store refusing writes: leave its dirty folios alone for
                // the back-off delay, evict clean ones meanwhile.
                Kind::Dirty if e.region.wb_backoff.blocked() => {
                    skipped += 1;
                    lru.push_inactive(e);
                }
                // A huge run (mixed folio sizes) leaves whole: it goes in the
                // next batch if this one has no room left for all of it.
                Kind::Clean | Kind::Dirty
                    if e.region.run_mapped(e.idx)
                        && !victims.is_empty()
                        && victims.len() + e.region.run_folios > max_folios =>
                {
                    lru.push_inactive(e);
                    break;
                }
                Kind::Clean | Kind::Dirty => {
                    let Some(guard) = Inflight::enter(&e.region) else {
                        continue;
                    };
                    let blocked = e.region.wb_backoff.blocked();
                    let claimed = folio::try_claim(e.region.state(e.idx), |s| match s.kind() {
                        Kind::Clean => !s.has(ACTIVE) && !s.has(PINNED),
                        Kind::Dirty => !s.has(ACTIVE) && !s.has(PINNED) && !blocked,
                        _ => false,
                    });
                    match claimed {
                        Some(old) => {
                            folio::set_flag(e.region.state(e.idx), QUEUED, false);
                            got += e.region.folio;
                            let run = e.region.run_mapped(e.idx);
                            victims.push(Victim {
                                region: guard,
                                idx: e.idx,
                                old,
                            });
                            if run {
                                got += self.claim_run_rest(&e.region, e.idx, &mut victims);
                            }
                            if !self.cfg.batched_removal {
                                // Ablation: drop and retake the lock per folio.
                                drop(lru);
                                lru = self.lru.lock();
                                acquisitions += 1;
                            }
                        }
                        None => lru.push_inactive(e),
                    }
                }
                Kind::Busy => lru.push_inactive(e),
                _ => lru.drop_stale(e),
            }
        }
        if !victims.is_empty() {
            self.counters.reclaim_lock_acquisitions.add(acquisitions);
        }
        victims
    }

    /// Mixed folio sizes: claims the other folios of the huge run of
    /// victim `idx` (resident, not pinned), so that the batch evicts the
    /// run whole (one huge page moved out or unmapped, no PMD split). Their
    /// LRU entries stay queued (found stale later). Returns the bytes
    /// claimed. A folio it cannot claim (busy, pinned) stays: the run is
    /// then evicted in part, the kernel splitting its PMD.
    fn claim_run_rest(&self, r: &Arc<Area>, idx: usize, victims: &mut Vec<Victim>) -> u64 {
        let blocked = r.wb_backoff.blocked();
        let first = r.run_start(idx);
        let mut got = 0;
        for k in (first..first + r.run_folios).filter(|&k| k != idx && k < r.nfolios()) {
            let Some(guard) = Inflight::enter(r) else {
                break;
            };
            let claimed = folio::try_claim(r.state(k), |s| match s.kind() {
                Kind::Clean => !s.has(PINNED),
                Kind::Dirty => !s.has(PINNED) && !blocked,
                _ => false,
            });
            if let Some(old) = claimed {
                got += r.folio;
                victims.push(Victim {
                    region: guard,
                    idx: k,
                    old,
                });
            }
        }
        got
    }

    /// Evicts one batch; returns the folios evicted (0: nothing evictable).
    pub(crate) fn evict_batch(&self, mode: Mode) -> usize {
        let (want, max) = match self.cfg.batch {
            Some(n) => (u64::MAX, n),
            None => (self.batch_bytes(), MAX_IOV),
        };
        let victims = self.isolate(want, max);
        if victims.is_empty() {
            return 0;
        }
        let mut batch = Gather::new(self, mode, victims.len());
        for v in victims {
            batch.add(v);
        }
        batch.finish().0
    }

    /// The dirty limit (the kernel's `balance_dirty_pages`), for a write
    /// fault about to make a folio of file region `r` dirty: below the
    /// limit it returns true at once; above it, the faulting side writes
    /// dirty folios back (keeping them resident, CLEAN) until there is
    /// room. False when the write must be refused: `r`'s store refuses
    /// writes (backing off after failures), or nothing could be cleaned
    /// for [`DIRTY_WAIT_GIVE_UP`] (other stores refusing).
    pub(crate) fn balance_dirty(&self, r: &Area) -> bool {
        if self.budget.dirty_fits(r.folio) {
            return true;
        }
        self.counters.dirty_throttled.inc();
        let mut last_progress = Instant::now();
        loop {
            if self.stopping() {
                return false;
            }
            if self.clean_batch().0 > 0 {
                last_progress = Instant::now();
            } else if r.wb_backoff.blocked() {
                // Nothing cleaned, and this region's store failed every
                // write-back lately: it refuses writes.
                return false;
            } else if last_progress.elapsed() > DIRTY_WAIT_GIVE_UP {
                return false;
            } else {
                // Dirty folios busy elsewhere (write-back in flight), or
                // belonging to stores that are backing off.
                std::thread::sleep(Duration::from_micros(200));
            }
            if self.budget.dirty_fits(r.folio) {
                return true;
            }
        }
    }

    /// Writes back up to one batch of dirty file-backed folios and keeps
    /// them resident (CLEAN): the flusher's half of the dirty limit. The
    /// batch starts at the oldest dirty folio (LRU order) and goes on
    /// through the same region in address order, wrapping at its end, for
    /// at most [`CLEAN_SCAN_BYTES`] of it (the kernel's flusher writes a
    /// file's pages in index order, `range_cyclic`). Why not the oldest
    /// `batch` dirty folios wherever they are: scattered over a region, they
    /// make the write-protect step walk the whole region's page tables for
    /// every batch (see [`CLEAN_SCAN_BYTES`]). Skips stores that are backing
    /// off, and pinned folios. Returns the folios cleaned, and the first
    /// write error.
    fn clean_batch(&self) -> (usize, Option<io::Error>) {
        let want = self.batch_bytes();
        let start = {
            let lru = self.lru.lock();
            let oldest = lru
                .iter()
                .find(|e| {
                    let r = &e.region;
                    let s = folio::load(r.state(e.idx));
                    !r.is_anon()
                        && !r.wb_backoff.blocked()
                        && s.kind() == Kind::Dirty
                        && !s.has(PINNED)
                })
                .map(|e| (Arc::clone(&e.region), e.idx));
            oldest
        };
        let Some((r, first)) = start else {
            return (0, None);
        };
        // The lru lock is dropped: the batch runs without it (a failed
        // write-back puts its folio back on the LRU).
        let scan = (CLEAN_SCAN_BYTES / r.folio).max(1) as usize;
        let from_first = r.touched_folios_from(first);
        let wrapped = r.touched_folios().take_while(|&i| i < first);
        let mut batch = Gather::new(self, Mode::Writeback, MAX_IOV);
        let mut got = 0u64;
        let mut claimed = 0usize;
        let n = r.nfolios();
        for idx in from_first.chain(wrapped) {
            // Distance in address order from the first, wrapping: the span
            // the batch's write-protect step will walk.
            let dist = if idx >= first {
                idx - first
            } else {
                idx + n - first
            };
            if got >= want || claimed >= MAX_IOV || dist >= scan {
                break;
            }
            let Some(guard) = Inflight::enter(&r) else {
                break;
            };
            // Pinned folios are left to flush: a system call writing into
            // one must not meet the write-protection of a write-back in
            // flight (EFAULT in in-thread mode).
            let dirty = |s: folio::State| s.kind() == Kind::Dirty && !s.has(PINNED);
            if let Some(old) = folio::try_claim(r.state(idx), dirty) {
                got += r.folio;
                claimed += 1;
                batch.add(Victim {
                    region: guard,
                    idx,
                    old,
                });
            }
        }
        batch.finish()
    }

    /// Reserves `bytes` of budget for a fill, reclaiming directly while the
    /// budget is full. False if nothing could be freed for the budget's
    /// give-up time (the fault then ends in SIGBUS).
    pub(crate) fn reserve(&self, bytes: u64) -> bool {
        if self.budget.try_charge(bytes) {
            return true;
        }
        self.counters.direct_reclaim_stalls.inc();
        self.budget.charge(
            bytes,
            || self.evict_batch(Mode::Direct) > 0,
            || self.stopping(),
        )
    }

    /// Wakes the background reclaimer if usage passed the high watermark or
    /// dirty data half the dirty limit.
    pub(crate) fn maybe_kick_reclaimer(&self) {
        if self.cfg.background_reclaim
            && (self.budget.above_high() || self.budget.dirty_above_background())
        {
            self.kick_reclaimer();
        }
    }

    /// Background reclaimer: sleeps until kicked (or 50 ms), evicts batches
    /// down to the low watermark, cleans dirty folios down to half the dirty
    /// limit, and clears poisoned folios whose hold time has passed.
    pub(crate) fn reclaimer_main(self: Arc<Self>) {
        let mut quiet = Duration::ZERO;
        let mut aged_at = Instant::now();
        while !self.stopping() {
            // Huge pages staged for 2 MiB fills, off the fault path.
            self.thp.refill(&self.budget);
            if self.wait_for_kick(Duration::from_millis(50)) {
                quiet = Duration::ZERO;
            } else {
                quiet += Duration::from_millis(50);
                if quiet == crate::shared::IDLE {
                    // Quiet for a while: the SIGBUS handlers' scratch
                    // spaces that a readahead run grew give it back.
                    self.shrink_sig_ctxs();
                }
            }
            if self.cfg.background_reclaim {
                while self.budget.above_low() && !self.stopping() {
                    // Nothing evictable: the compressed pools shrink
                    // (their oldest entries to the swap file, ztier.rs).
                    if self.evict_batch(Mode::Background) == 0 && !self.budget.shrink_pools() {
                        break;
                    }
                }
                while self.budget.dirty_above_background() && !self.stopping() {
                    if self.clean_batch().0 == 0 {
                        break;
                    }
                }
            }
            let expire = self.cfg.dirty_expire;
            if !expire.is_zero() && aged_at.elapsed() >= (expire / 4).max(DIRTY_SCAN_MIN) {
                aged_at = Instant::now();
                if self.budget.dirty() > 0 {
                    self.writeback_aged(expire);
                }
            }
            self.clear_poison(false);
            self.log_slow_fault();
            // Another process started writing a file mapped writable here
            // alone so far? Then twins from now on (twins.rs).
            for r in self.table.all() {
                if let Some(w) = r.writers.as_ref().filter(|w| !w.twinning()) {
                    w.poll();
                }
            }
        }
    }

    /// Writes back (and keeps resident, CLEAN) every file-backed folio
    /// dirty for at least `expire`: the background writer that bounds what
    /// a killed process loses (the kernel's flusher and its
    /// `dirty_expire_centisecs`). Claims without waiting (a BUSY folio is
    /// someone else's business, and its turn comes at the next scan), skips
    /// stores that are backing off, and reports write errors the way
    /// eviction does (the next `flush` returns them). Walks only touched
    /// chunks of writable file regions.
    fn writeback_aged(&self, expire: Duration) {
        let now = self.dirty_tick();
        let age = (expire.as_millis() / crate::shared::DIRTY_TICK.as_millis()) as u64;
        let old_enough = |s: folio::State| {
            s.kind() == Kind::Dirty && (now.wrapping_sub(s.seq()) & folio::SEQ_MASK) >= age
        };
        for r in self.table.all() {
            if !r.writable || r.is_anon() || r.wb_backoff.blocked() {
                continue;
            }
            let mut batch = Gather::new(self, Mode::Writeback, self.batch_folios(r.folio));
            for idx in r.touched_folios() {
                if self.stopping() || !old_enough(folio::load(r.state(idx))) {
                    continue;
                }
                let Some(old) = folio::try_claim(r.state(idx), old_enough) else {
                    continue;
                };
                let Some(guard) = Inflight::enter(&r) else {
                    let prev = folio::release(r.state(idx), |_| old);
                    self.wake_if_waiter(&r, idx, prev);
                    break;
                };
                self.counters.writebacks_aged.inc();
                batch.add(crate::gather::Victim {
                    region: guard,
                    idx,
                    old,
                });
            }
            let _ = batch.finish();
        }
    }

    /// Zaps poisoned folios held for [`POISON_HOLD`] (all if `all`), so the
    /// next access faults and tries the store again.
    pub(crate) fn clear_poison(&self, all: bool) {
        for e in self.lru.take_poisoned(POISON_HOLD, all) {
            let Some(guard) = Inflight::enter(&e.region) else {
                continue;
            };
            let w = guard.state(e.idx);
            if folio::try_claim(w, |s| s.kind() == Kind::Poisoned).is_none() {
                continue;
            }
            self.zap(&[guard.span(e.idx, 1)], "a poisoned folio", false);
            if !self.info.uffd_poison && self.mode == crate::FaultMode::Handlers {
                // Its PROT_NONE (poison.rs protect_poisoned) lifted.
                let access = if guard.writable {
                    upager_sys::mem::Access::ReadWrite
                } else {
                    upager_sys::mem::Access::Read
                };
                if let Err(e) = guard.span(e.idx, 1).protect(access) {
                    log::error!("restoring access to a poisoned folio failed: {e}");
                }
            }
            guard.trace.record(
                e.idx,
                crate::trace::Path::Unpoisoned,
                Kind::Poisoned,
                Kind::Never,
            );
            let prev = folio::release(w, |s| {
                s.with_kind(if s.slot().is_some() {
                    Kind::Evicted
                } else {
                    Kind::Never
                })
            });
            self.wake_if_waiter(&guard, e.idx, prev);
        }
    }
}
