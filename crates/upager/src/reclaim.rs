//! Reclaim: batched eviction under the budget.
//!
//! Ordering rule of one batch ([`Shared::shrink_list`]), as in
//! `include/asm-generic/tlb.h` and seed 000's third patch:
//!
//! ```text
//!   1) isolate    claim victims (state -> BUSY) under ONE lru lock
//!   2) protect    one UFFDIO_WRITEPROTECT per span of dirty victims   (flush #1)
//!   3) write back dirty victims from the now read-only view
//!   4) unmap      one process_madvise(MADV_DONTNEED) over all victims (flush #2)
//!   5) release    state -> EVICTED/NEVER (wake waiters), budget returned
//! ```
//! Clean victims skip 2–3 (their pages are write-protected already: a CLEAN
//! folio is always write-protected in the view). A write racing with the
//! batch hits the protection, finds the folio BUSY, waits, and after step 5
//! refaults the folio from the store: no write is lost. A batch costs at most
//! two shootdowns, whatever its size (≤ 1024 ranges per process_madvise
//! call; more calls if more ranges).
//!
//! Lock order (outer → inner): `lru` → nothing. The lru lock is held only to
//! isolate or add entries, never across a syscall; swap-slot locks
//! ([`Slots`](crate::store::Slots)) are taken once per batch, after isolation.
//!
//! Access information (not plain FIFO): two lists as in mm/workingset.c.
//! New folios enter the inactive list. Eviction stamps the folio's state word
//! with the pager's eviction counter (in pages); a refault within
//! `budget/2` pages of eviction is a working-set folio that was evicted only
//! because the inactive list was too short, so it goes to the active list.
//! The active list is capped at half the budget; its oldest entries are
//! deactivated when it grows past that or when the inactive list runs dry. A
//! scan streams through the inactive list and never evicts a hot set
//! smaller than half the budget. (Accessed bits are not visible from user
//! space here; refault distance is what the kernel uses for the same job.)
//!
//! Counters: `reclaim_scanned`, `evictions`, `evict_{direct,background,pageout}`,
//! `evict_batches`, `tlb_flush_batches`, `writebacks`, `writeback_errors`,
//! `deactivations`, `direct_reclaim_stalls`.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use upager_sys::mem::{MapRange, MAX_IOV};

use crate::folio::{self, Kind, State, ACTIVE, QUEUED, WAITER};
use crate::pager::Shared;
use crate::region::RegionInner;
use crate::table::Inflight;

/// Largest gap (bytes) between dirty victims that one write-protect call
/// spans. Every call costs one TLB flush; spanning a gap costs a page-table
/// walk that re-protects present non-victim pages. Measured with
/// `upager demo --reads 50000` (2 GiB, 256 MiB budget, 64 KiB folios, random
/// writes phase; 2 vCPU KVM): gap 2 MiB 14.0 s and 31 flush calls per batch,
/// 16 MiB 13.4 s and 12 per batch, one span per batch (2 GiB walks) 78.6 s
/// and 1.6 per batch. 16 MiB: the fewest flushes at no measured cost.
const WP_SPAN_GAP_BYTES: u64 = 16 << 20;

/// How long a poisoned folio keeps raising SIGBUS before the reclaimer
/// clears it, so that an access after the store recovers succeeds.
pub(crate) const POISON_HOLD: Duration = Duration::from_millis(100);

/// A direct reclaimer that frees nothing for this long fails its fault
/// with SIGBUS rather than hang (every fault ends).
const DIRECT_RECLAIM_GIVE_UP: Duration = Duration::from_secs(5);

/// A write fault held at the dirty limit that can clean nothing for this
/// long (the dirty data belongs to stores refusing writes) gets SIGBUS.
const DIRTY_WAIT_GIVE_UP: Duration = Duration::from_secs(1);

/// One entry of an LRU list.
pub(crate) struct Entry {
    pub region: Arc<RegionInner>,
    pub idx: usize,
}

/// The two LRU lists and the poisoned folios awaiting clearing.
#[derive(Default)]
pub(crate) struct Lru {
    inactive: VecDeque<Entry>,
    active: VecDeque<Entry>,
    active_bytes: u64,
    poisoned: VecDeque<(Entry, Instant)>,
}

/// A folio claimed (BUSY) for eviction or write-back.
pub(crate) struct Victim {
    pub region: Inflight,
    pub idx: usize,
    /// Its state before the claim.
    pub old: State,
}

/// Who runs a batch, and whether the folios leave memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A fault found the budget full.
    Direct,
    /// The background reclaimer.
    Background,
    /// `Region::pageout`.
    Pageout,
    /// `flush`: write back, keep resident (CLEAN).
    Writeback,
}

impl Shared {
    /// Adds newly filled folios to the LRU: one lock for the group.
    pub(crate) fn lru_add(&self, r: &Arc<RegionInner>, items: &[(usize, bool)]) {
        if items.is_empty() {
            return;
        }
        let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        for &(idx, active) in items {
            let e = Entry {
                region: Arc::clone(r),
                idx,
            };
            if active {
                lru.active_bytes += r.folio;
                lru.active.push_back(e);
            } else {
                lru.inactive.push_back(e);
            }
        }
    }

    /// Records a poisoned folio for the reclaimer to clear later.
    pub(crate) fn lru_add_poisoned(&self, r: &Arc<RegionInner>, idx: usize) {
        let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        lru.poisoned.push_back((
            Entry {
                region: Arc::clone(r),
                idx,
            },
            Instant::now(),
        ));
    }

    /// Drops every LRU entry of a region being unmapped (one lock).
    pub(crate) fn purge_region(&self, id: u64) {
        let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        lru.inactive.retain(|e| e.region.id != id);
        lru.active.retain(|e| e.region.id != id);
        lru.active_bytes = lru.active.iter().map(|e| e.region.folio).sum();
        lru.poisoned.retain(|(e, _)| e.region.id != id);
    }

    /// Isolates up to one batch of victims: one lru lock acquisition for the
    /// batch (seed 003), or one per folio when batched removal is off.
    fn isolate(&self, want_bytes: u64, max_folios: usize) -> Vec<Victim> {
        let mut victims = Vec::new();
        let mut got = 0u64;
        let active_cap = self.budget / 2;
        let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        let mut acquisitions = 1;
        let mut budget_scan = lru.inactive.len() + 2 * lru.active.len() + 8;
        // Inactive entries passed over because their store refuses writes:
        // once the whole inactive list was, the active list must give folios
        // back, or a budget of stuck dirty data plus active clean data would
        // leave reads nothing to evict.
        let mut skipped = 0usize;
        while got < want_bytes && victims.len() < max_folios && budget_scan > 0 {
            budget_scan -= 1;
            self.counters.reclaim_scanned.inc();
            let inactive_stuck = skipped >= lru.inactive.len();
            if (lru.active_bytes > active_cap || inactive_stuck) && !lru.active.is_empty() {
                let e = lru.active.pop_front().expect("checked non-empty");
                lru.active_bytes -= e.region.folio;
                match folio::load(e.region.state(e.idx)).kind() {
                    Kind::Clean | Kind::Dirty => {
                        folio::set_flag(e.region.state(e.idx), ACTIVE, false);
                        self.counters.deactivations.inc();
                        lru.inactive.push_back(e);
                    }
                    Kind::Busy => {
                        lru.active_bytes += e.region.folio;
                        lru.active.push_back(e);
                    }
                    _ => drop_stale(e, &mut lru),
                }
                continue;
            }
            let Some(e) = lru.inactive.pop_front() else {
                break;
            };
            let s = folio::load(e.region.state(e.idx));
            match s.kind() {
                Kind::Clean | Kind::Dirty if s.has(ACTIVE) => {
                    lru.active_bytes += e.region.folio;
                    lru.active.push_back(e);
                }
                // A store refusing writes: leave its dirty folios alone for
                // the back-off delay, evict clean ones meanwhile.
                Kind::Dirty if e.region.wb_backoff.blocked() => {
                    skipped += 1;
                    lru.inactive.push_back(e);
                }
                Kind::Clean | Kind::Dirty => {
                    let Some(guard) = Inflight::enter(&e.region) else {
                        continue;
                    };
                    let blocked = e.region.wb_backoff.blocked();
                    let claimed = folio::try_claim(e.region.state(e.idx), |s| match s.kind() {
                        Kind::Clean => !s.has(ACTIVE),
                        Kind::Dirty => !s.has(ACTIVE) && !blocked,
                        _ => false,
                    });
                    match claimed {
                        Some(old) => {
                            folio::set_flag(e.region.state(e.idx), QUEUED, false);
                            got += e.region.folio;
                            victims.push(Victim {
                                region: guard,
                                idx: e.idx,
                                old,
                            });
                            if !self.cfg.batched_removal {
                                // Ablation: drop and retake the lock per folio.
                                drop(lru);
                                lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
                                acquisitions += 1;
                            }
                        }
                        None => lru.inactive.push_back(e),
                    }
                }
                Kind::Busy => lru.inactive.push_back(e),
                _ => drop_stale(e, &mut lru),
            }
        }
        if !victims.is_empty() {
            self.counters.reclaim_lock_acquisitions.add(acquisitions);
        }
        victims
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
        self.shrink_list(victims, mode).map_or(0, |n| n)
    }

    /// Runs victims through protect → write back → unmap → release (or,
    /// for [`Mode::Writeback`], protect → write back → CLEAN). Returns the
    /// number of folios evicted (or written back), or the first write error
    /// (the failed folios stay resident and dirty).
    pub(crate) fn shrink_list(&self, victims: Vec<Victim>, mode: Mode) -> io::Result<usize> {
        match (self.shrink_list_counted(victims, mode), mode) {
            ((n, None), _) => Ok(n),
            ((_, Some(e)), Mode::Writeback) => Err(e),
            ((0, Some(e)), _) => Err(e),
            ((n, Some(_)), _) => Ok(n),
        }
    }

    /// [`Shared::shrink_list`] that also counts what succeeded when some
    /// write-backs failed: `(folios evicted or cleaned, first error)`.
    fn shrink_list_counted(
        &self,
        mut victims: Vec<Victim>,
        mode: Mode,
    ) -> (usize, Option<io::Error>) {
        victims.sort_unstable_by_key(|v| (v.region.id, v.idx));
        let mut first_err: Option<io::Error> = None;

        // 2) protect: one write-protect per span of dirty victims.
        for group in victims.chunk_by(|a, b| a.region.id == b.region.id) {
            let r = &group[0].region;
            let mut span: Option<(usize, usize)> = None;
            for v in group.iter().filter(|v| v.old.kind() == Kind::Dirty) {
                span = match span {
                    Some((s, e)) if ((v.idx - e) as u64) * r.folio <= WP_SPAN_GAP_BYTES => {
                        Some((s, v.idx))
                    }
                    Some((s, e)) => {
                        self.write_protect(r, s, e);
                        Some((v.idx, v.idx))
                    }
                    None => Some((v.idx, v.idx)),
                };
            }
            if let Some((s, e)) = span {
                self.write_protect(r, s, e);
            }
        }

        // 3) write back dirty victims, in runs of consecutive folios.
        let mut failed = vec![false; victims.len()];
        let mut new_slots: Vec<Option<u32>> = vec![None; victims.len()];
        let mut i = 0;
        while i < victims.len() {
            if victims[i].old.kind() != Kind::Dirty {
                i += 1;
                continue;
            }
            let r = Arc::clone(&victims[i].region);
            if r.is_anon() {
                // Swap: give every dirty victim of this region without a slot
                // one, under a single lock acquisition (seed 003).
                let mut j = i;
                let mut need = Vec::new();
                while j < victims.len() && victims[j].region.id == r.id {
                    if victims[j].old.kind() == Kind::Dirty && victims[j].old.slot().is_none() {
                        need.push(j);
                    }
                    j += 1;
                }
                let pool = r.slots.as_ref().expect("anonymous region has slots");
                let before = pool.acquisitions();
                let slots = pool.alloc(need.len(), self.cfg.batched_removal);
                self.counters
                    .reclaim_lock_acquisitions
                    .add(pool.acquisitions() - before);
                for (k, s) in need.into_iter().zip(slots) {
                    new_slots[k] = Some(s);
                }
                for k in i..j {
                    let v = &victims[k];
                    if v.old.kind() != Kind::Dirty {
                        continue;
                    }
                    let slot = new_slots[k].or(v.old.slot()).expect("slot assigned");
                    let res = r
                        .store
                        .write_from(r.src(v.idx, r.folio), u64::from(slot) * r.folio);
                    self.account_write(&r, &mut failed[k..=k], res, r.folio, &mut first_err);
                }
                i = j;
                continue;
            }
            let mut j = i + 1;
            while j < victims.len()
                && victims[j].region.id == r.id
                && victims[j].old.kind() == Kind::Dirty
                && victims[j].idx == victims[j - 1].idx + 1
            {
                j += 1;
            }
            let first = victims[i].idx;
            let last = victims[j - 1].idx;
            let bytes = ((last - first) as u64 * r.folio) + r.valid_len(last);
            let off = r.store_offset(first, victims[i].old).expect("file offset");
            let res = r.store.write_from(r.src(first, bytes), off);
            self.account_write(&r, &mut failed[i..j], res, bytes, &mut first_err);
            i = j;
        }

        // Failed write-backs stay resident and dirty (their pages may stay
        // write-protected: the next write faults and unprotects them).
        let mut kept = Vec::with_capacity(victims.len());
        for (k, v) in victims.into_iter().enumerate() {
            if failed[k] {
                if let Some(s) = new_slots[k] {
                    v.region.slots.as_ref().expect("anon").free(&[s], true);
                }
                // Resident and dirty again, and back on the LRU if isolation
                // took it off, so a later batch retries it.
                let prev = folio::release(v.region.state(v.idx), |s| {
                    s.with_kind(Kind::Dirty)
                        .with_slot(v.old.slot())
                        .set(QUEUED, true)
                });
                self.wake_if_waiter(&v.region, v.idx, prev);
                if !prev.has(QUEUED) {
                    self.lru_add(&v.region, &[(v.idx, false)]);
                }
            } else {
                kept.push((v, new_slots[k]));
            }
        }

        if mode == Mode::Writeback {
            let n = kept.len();
            for (v, _) in kept {
                if v.old.kind() == Kind::Dirty {
                    self.dirty_sub(&v.region, 1);
                }
                let prev = folio::release(v.region.state(v.idx), |s| s.with_kind(Kind::Clean));
                self.wake_if_waiter(&v.region, v.idx, prev);
            }
            return (n, first_err);
        }

        // 4) unmap: one process_madvise per ≤ 1024 merged ranges.
        let mut ranges: Vec<MapRange<'_>> = Vec::with_capacity(kept.len());
        for (v, _) in &kept {
            let span = v.region.span(v.idx, 1);
            if !ranges.last_mut().is_some_and(|last| last.try_extend(&span)) {
                ranges.push(span);
            }
        }
        for chunk in ranges.chunks(MAX_IOV) {
            if let Err(e) = self.pidfd.dontneed(chunk) {
                // Cannot happen for live, pinned regions; keep going so the
                // budget stays consistent, and report it.
                first_err.get_or_insert(e);
            }
            self.counters.tlb_flush_batches.inc();
        }

        // 5) release: EVICTED (or NEVER for never-written anonymous folios).
        let pages: u64 = kept.iter().map(|(v, _)| v.region.folio / 4096).sum();
        let seq_end = self.evict_seq.fetch_add(pages, Ordering::Relaxed) + pages;
        let mut bytes = 0u64;
        let n = kept.len();
        for (v, new_slot) in kept {
            bytes += v.region.folio;
            self.evict_one(&v, new_slot, seq_end);
        }
        self.unreserve(bytes);
        self.counters.evictions.add(n as u64);
        self.counters.evict_batches.inc();
        match mode {
            Mode::Direct => self.counters.evict_direct.add(n as u64),
            Mode::Background => self.counters.evict_background.add(n as u64),
            Mode::Pageout => self.counters.evict_pageout.add(n as u64),
            Mode::Writeback => {}
        }
        (n, first_err)
    }

    /// Final state of one evicted folio.
    fn evict_one(&self, v: &Victim, new_slot: Option<u32>, seq: u64) {
        let r = &v.region;
        if v.old.kind() == Kind::Dirty {
            self.dirty_sub(r, 1);
        }
        let slot = new_slot.or(v.old.slot());
        let prev = folio::release(r.state(v.idx), |s| {
            let kind = if r.is_anon() && slot.is_none() {
                Kind::Never
            } else {
                Kind::Evicted
            };
            s.with_kind(kind)
                .with_slot(slot)
                .with_seq(seq)
                .set(ACTIVE, false)
        });
        self.wake_if_waiter(r, v.idx, prev);
    }

    fn write_protect(&self, r: &RegionInner, first: usize, last: usize) {
        // Failure leaves pages writable; the write-back that follows may then
        // race with a writer, so treat it as fatal to the invariant: it
        // cannot fail on a live registered range, and the debug build says so.
        let res = self
            .uffd
            .writeprotect(r.span(first, last + 1 - first), true, true);
        debug_assert!(
            res.is_ok(),
            "write-protect of a registered range failed: {res:?}"
        );
        self.counters.tlb_flush_batches.inc();
    }

    fn account_write(
        &self,
        r: &RegionInner,
        failed: &mut [bool],
        res: io::Result<()>,
        bytes: u64,
        first: &mut Option<io::Error>,
    ) {
        match res {
            Ok(()) => {
                r.wb_backoff.record(true);
                self.counters.writebacks.add(failed.len() as u64);
                self.counters.bytes_written.add(bytes);
            }
            Err(e) => {
                r.wb_backoff.record(false);
                self.counters.writeback_errors.add(failed.len() as u64);
                failed.iter_mut().for_each(|f| *f = true);
                r.record_error(io::Error::new(e.kind(), e.to_string()));
                first.get_or_insert(e);
            }
        }
    }

    /// The dirty limit (the kernel's `balance_dirty_pages`), for a write
    /// fault about to make a folio of file region `r` dirty: below the
    /// limit it returns true at once; above it, the faulting side writes
    /// dirty folios back (keeping them resident, CLEAN) until there is
    /// room. False when the write must be refused: `r`'s store refuses
    /// writes (backing off after a failure), or nothing could be cleaned
    /// for [`DIRTY_WAIT_GIVE_UP`] (other stores refusing).
    pub(crate) fn balance_dirty(&self, r: &RegionInner) -> bool {
        let room = |sh: &Self| sh.dirty.load(Ordering::Acquire) + r.folio <= sh.dirty_limit;
        if room(self) {
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
            if room(self) {
                return true;
            }
        }
    }

    /// Writes back up to one batch of dirty file-backed folios, oldest
    /// first, and keeps them resident (CLEAN): the flusher's half of the
    /// dirty limit. Skips stores that are backing off. Returns the folios
    /// cleaned, or the first write error.
    fn clean_batch(&self) -> (usize, Option<io::Error>) {
        let want = self.batch_bytes();
        let mut victims = Vec::new();
        let mut got = 0u64;
        {
            let lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
            for e in lru.inactive.iter().chain(lru.active.iter()) {
                if got >= want || victims.len() >= MAX_IOV {
                    break;
                }
                let r = &e.region;
                if r.is_anon() || folio::load(r.state(e.idx)).kind() != Kind::Dirty {
                    continue;
                }
                if r.wb_backoff.blocked() {
                    continue;
                }
                let Some(guard) = Inflight::enter(r) else {
                    continue;
                };
                if let Some(old) = folio::try_claim(r.state(e.idx), |s| s.kind() == Kind::Dirty) {
                    got += r.folio;
                    victims.push(Victim {
                        region: guard,
                        idx: e.idx,
                        old,
                    });
                }
            }
        }
        if victims.is_empty() {
            return (0, None);
        }
        self.shrink_list_counted(victims, Mode::Writeback)
    }

    /// Wakes faults waiting on folio `idx` if `prev` (the BUSY value just
    /// replaced) says there are any.
    pub(crate) fn wake_if_waiter(&self, r: &RegionInner, idx: usize, prev: State) {
        if prev.has(WAITER) {
            let _ = self.uffd.wake(r.folio_addr(idx), r.folio);
        }
    }

    /// Reserves `bytes` of budget without reclaiming.
    pub(crate) fn try_reserve(&self, bytes: u64) -> bool {
        let mut cur = self.resident.load(Ordering::Relaxed);
        loop {
            if cur + bytes > self.budget {
                return false;
            }
            match self.resident.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(cur + bytes, Ordering::Relaxed);
                    return true;
                }
                Err(v) => cur = v,
            }
        }
    }

    /// Reserves `bytes`, reclaiming directly while the budget is full.
    /// False if nothing could be freed for [`DIRECT_RECLAIM_GIVE_UP`].
    pub(crate) fn reserve(&self, bytes: u64) -> bool {
        if self.try_reserve(bytes) {
            return true;
        }
        self.counters.direct_reclaim_stalls.inc();
        let mut last_progress = Instant::now();
        loop {
            if self.evict_batch(Mode::Direct) > 0 {
                last_progress = Instant::now();
            } else {
                // Everything resident is busy (fills or write-backs in
                // flight elsewhere) or failing to write back: back off.
                std::thread::sleep(Duration::from_micros(200));
            }
            if self.try_reserve(bytes) {
                return true;
            }
            if last_progress.elapsed() > DIRECT_RECLAIM_GIVE_UP || self.stopping() {
                return false;
            }
        }
    }

    pub(crate) fn unreserve(&self, bytes: u64) {
        if bytes > 0 {
            self.resident.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Wakes the background reclaimer if usage passed the high watermark.
    pub(crate) fn maybe_kick_reclaimer(&self) {
        if self.cfg.background_reclaim
            && (self.resident.load(Ordering::Relaxed) > self.high_wm
                || self.dirty.load(Ordering::Relaxed) > self.dirty_background())
            && !self.kicked.swap(true, Ordering::AcqRel)
        {
            let _g = self.kick_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.kick_cv.notify_one();
        }
    }

    /// Dirty file-backed bytes above which the background reclaimer cleans
    /// (the kernel's `dirty_background_ratio`): half the dirty limit, so
    /// write faults rarely reach the limit and do the writing themselves.
    pub(crate) fn dirty_background(&self) -> u64 {
        self.dirty_limit / 2
    }

    /// Background reclaimer: sleeps until usage passes the high watermark,
    /// then evicts batches down to the low watermark; cleans dirty folios
    /// (write back, keep resident) down to [`Shared::dirty_background`];
    /// also clears poisoned folios whose hold time has passed.
    pub(crate) fn reclaimer_main(self: Arc<Self>) {
        while !self.stopping() {
            {
                let g = self.kick_lock.lock().unwrap_or_else(|e| e.into_inner());
                if !self.kicked.load(Ordering::Acquire) {
                    let _ = self.kick_cv.wait_timeout(g, Duration::from_millis(50));
                }
            }
            self.kicked.store(false, Ordering::Release);
            if self.cfg.background_reclaim {
                while self.resident.load(Ordering::Relaxed) > self.low_wm && !self.stopping() {
                    if self.evict_batch(Mode::Background) == 0 {
                        break;
                    }
                }
                while self.dirty.load(Ordering::Relaxed) > self.dirty_background()
                    && !self.stopping()
                {
                    if self.clean_batch().0 == 0 {
                        break;
                    }
                }
            }
            self.clear_poison(false);
        }
    }

    /// Zaps poisoned folios held for [`POISON_HOLD`] (all if `all`), so the
    /// next access faults and tries the store again.
    pub(crate) fn clear_poison(&self, all: bool) {
        let due: Vec<Entry> = {
            let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
            let mut out = Vec::new();
            while let Some((_, t)) = lru.poisoned.front() {
                if !all && t.elapsed() < POISON_HOLD {
                    break;
                }
                out.push(lru.poisoned.pop_front().expect("non-empty").0);
            }
            out
        };
        for e in due {
            let Some(guard) = Inflight::enter(&e.region) else {
                continue;
            };
            let w = guard.state(e.idx);
            if folio::try_claim(w, |s| s.kind() == Kind::Poisoned).is_none() {
                continue;
            }
            let _ = self.pidfd.dontneed(&[guard.span(e.idx, 1)]);
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

/// An entry whose folio is no longer resident: clear QUEUED unless a fill
/// made it resident again meanwhile (then it keeps its entry).
fn drop_stale(e: Entry, lru: &mut Lru) {
    let w = e.region.state(e.idx);
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let s = State(cur);
        if matches!(s.kind(), Kind::Clean | Kind::Dirty | Kind::Busy) {
            lru.inactive.push_back(e);
            return;
        }
        match w.compare_exchange_weak(cur, cur & !QUEUED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(v) => cur = v,
        }
    }
}
