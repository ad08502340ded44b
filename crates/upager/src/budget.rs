//! The budget: the one owner of resident and dirty byte counts.
//!
//! Contract:
//! - Resident bytes never exceed the limit: a charge is a CAS that never
//!   passes it ([`Budget::try_charge`]); memory is uncharged only after its
//!   pages are gone. The highest value reached is the `resident_peak_bytes`
//!   counter, a tested number.
//! - Waiting for room ([`Budget::charge`]) runs the caller's reclaim step
//!   while the budget is full and gives up after [`DIRECT_RECLAIM_GIVE_UP`]
//!   without progress (the fault then ends in SIGBUS: every fault ends).
//! - Watermarks for the background reclaimer: it starts above `high_wm` and
//!   evicts down to `low_wm` (budget − min(budget/8, 8 MiB), and half that
//!   gap below the budget).
//! - Dirty file-backed bytes are counted here too, against the dirty limit
//!   (default half the budget, the kernel's `dirty_ratio`) and its
//!   background half (`dirty_background_ratio`).
//! - Pinned bytes (resident folios reclaim must leave alone) at most half the
//!   budget, so reclaim always has room to work with.
//! - Compressed pools (ztier.rs) are part of the budget, never beside it:
//!   the bytes a pool holds are in the same `resident` count as folios.
//!   A pool grows while an eviction batch writes back, before that batch's
//!   folios are unmapped and uncharged; so its growth is first *pending*
//!   ([`Charge::pool_grow`]), and the next [`Budget::uncharge`] (the
//!   batch's own, or any other) turns pending bytes into charged ones by
//!   returning that much less. The count therefore never passes the limit
//!   and never counts less than folios + pool once the batch is released;
//!   between the pool's growth and the unmap, the compressed copies of the
//!   batch in flight coexist with its pages (at most 3/4 of one batch,
//!   ztier.rs `MAX_RATIO`), as in the kernel's zswap.
//!   When a charge finds nothing to evict, the registered pools are asked
//!   to shrink ([`PoolTier::shrink`]: their oldest entries go to the swap
//!   file).
//!
//! Uses: `config`, `stats`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::config::{DEFAULT_BATCH_BYTES, MIN_FOLIO};

/// A waiter for room that frees nothing for this long gives up (its fault
/// gets SIGBUS rather than hang).
pub(crate) const DIRECT_RECLAIM_GIVE_UP: Duration = Duration::from_secs(5);

/// A pool of compressed folios charged to the budget (ztier.rs): the
/// budget asks it to shrink under pressure and reads its counters.
pub(crate) trait PoolTier: Send + Sync {
    /// Writes out the pool's oldest entries (to the swap file) and frees
    /// their space; returns the bytes freed (0: nothing to free).
    fn shrink(&self) -> u64;
    /// Adds the pool's counters to `s` (the `ztier_` ones).
    fn add_counters(&self, s: &mut crate::stats::Stats);
}

/// The counts a pool shares with its budget: resident bytes (folios and
/// pools), the peak, and the pool's bytes not yet charged (see the module
/// doc). Held by the budget and by each pool.
#[derive(Debug, Default)]
pub(crate) struct Charge {
    resident: AtomicU64,
    peak: AtomicU64,
    /// Pool bytes grown and not yet charged (settled by `uncharge`).
    pending: AtomicU64,
    /// Bytes all pools hold (charged or pending).
    pool: AtomicU64,
    limit: u64,
    /// The cumulative counters of pools that are gone (their regions
    /// unmapped), so the pager's counters never go back.
    retired: Mutex<crate::stats::Stats>,
}

impl Charge {
    /// A pool grew by `bytes` while the folios it took are still charged:
    /// charged by the next uncharge.
    pub fn pool_grow(&self, bytes: u64) {
        self.pool.fetch_add(bytes, Ordering::AcqRel);
        self.pending.fetch_add(bytes, Ordering::AcqRel);
    }
    /// A pool freed `bytes` (pending ones first).
    pub fn pool_shrink(&self, bytes: u64) {
        self.pool.fetch_sub(bytes, Ordering::AcqRel);
        let rest = bytes - self.take_pending(bytes);
        if rest > 0 {
            self.resident.fetch_sub(rest, Ordering::AcqRel);
        }
    }
    /// Bytes all pools hold now.
    pub fn pool_bytes(&self) -> u64 {
        self.pool.load(Ordering::Relaxed)
    }
    /// The budget's limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// A pool going away adds its cumulative counters here.
    pub fn retire(&self, add: impl FnOnce(&mut crate::stats::Stats)) {
        add(&mut self.retired.lock().unwrap_or_else(|e| e.into_inner()));
    }
    /// Takes up to `most` pending bytes; returns how many.
    fn take_pending(&self, most: u64) -> u64 {
        let mut cur = self.pending.load(Ordering::Relaxed);
        while cur > 0 {
            let take = cur.min(most);
            match self.pending.compare_exchange_weak(
                cur,
                cur - take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(v) => cur = v,
            }
        }
        0
    }
}

/// Resident and dirty bytes of one pager against its limits.
pub(crate) struct Budget {
    limit: u64,
    /// Resident bytes (folios and compressed pools) and their peak.
    charge: Arc<Charge>,
    /// The compressed pools charged here (ztier.rs), for pressure and stats.
    pools: Mutex<Vec<Weak<dyn PoolTier>>>,
    high_wm: u64,
    low_wm: u64,
    dirty: AtomicU64,
    dirty_limit: u64,
    pinned: AtomicU64,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit)
            .field("charge", &self.charge)
            .field("dirty", &self.dirty)
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// A budget of `limit` bytes; `dirty_limit` defaults to half of it.
    pub fn new(limit: u64, dirty_limit: Option<u64>) -> Budget {
        let gap = (limit / 8).min(2 * DEFAULT_BATCH_BYTES);
        Budget {
            limit,
            charge: Arc::new(Charge {
                limit,
                ..Charge::default()
            }),
            pools: Mutex::new(Vec::new()),
            high_wm: limit - gap / 2,
            low_wm: limit - gap,
            dirty: AtomicU64::new(0),
            dirty_limit: dirty_limit.unwrap_or(limit / 2).clamp(MIN_FOLIO, limit),
            pinned: AtomicU64::new(0),
        }
    }

    /// Counts `bytes` more as pinned if the total stays within half the
    /// budget.
    pub fn try_pin(&self, bytes: u64) -> bool {
        self.pinned
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |p| {
                (p + bytes <= self.limit / 2).then_some(p + bytes)
            })
            .is_ok()
    }
    /// `bytes` are no longer pinned.
    pub fn unpin(&self, bytes: u64) {
        self.pinned.fetch_sub(bytes, Ordering::AcqRel);
    }
    /// Bytes pinned now.
    pub fn pinned(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Bytes charged now (folios and compressed pools).
    pub fn resident(&self) -> u64 {
        self.charge.resident.load(Ordering::Relaxed)
    }
    /// Highest charge seen.
    pub fn peak(&self) -> u64 {
        self.charge.peak.load(Ordering::Relaxed)
    }
    /// The counts a compressed pool shares with the budget.
    pub fn charge_handle(&self) -> Arc<Charge> {
        Arc::clone(&self.charge)
    }
    /// Registers a compressed pool: asked to shrink when a charge finds
    /// nothing to evict, and read for counters.
    pub fn register_pool(&self, p: Weak<dyn PoolTier>) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.retain(|w| w.strong_count() > 0);
        pools.push(p);
    }
    /// The live compressed pools.
    pub fn pools(&self) -> Vec<Arc<dyn PoolTier>> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.iter().filter_map(Weak::upgrade).collect()
    }
    /// Adds the pools' counters (live pools and gone ones) to `s`.
    pub fn add_pool_counters(&self, s: &mut crate::stats::Stats) {
        let gone = *self
            .charge
            .retired
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (name, v) in gone.iter().filter(|&(_, v)| v > 0) {
            s.add(name, v);
        }
        for p in self.pools() {
            p.add_counters(s);
        }
    }
    /// Asks the pools to shrink, if they hold an eighth of the budget or
    /// more (below that, what they could give back is not what keeps the
    /// budget full: a reclaim that found nothing had every folio busy);
    /// true if any freed bytes. (An eighth: a guess, the background
    /// reclaimer's watermark gap at most.)
    pub fn shrink_pools(&self) -> bool {
        if self.charge.pool_bytes() < self.limit / 8 {
            return false;
        }
        let mut freed = 0;
        for p in self.pools() {
            freed += p.shrink();
        }
        freed > 0
    }
    /// Whether `bytes` more would still fit.
    pub fn fits(&self, bytes: u64) -> bool {
        self.resident() + bytes <= self.limit
    }
    /// Above the high watermark: time for background reclaim.
    pub fn above_high(&self) -> bool {
        self.resident() > self.high_wm
    }
    /// Above the low watermark: background reclaim goes on.
    pub fn above_low(&self) -> bool {
        self.resident() > self.low_wm
    }

    /// Charges `bytes` if they fit, without waiting.
    pub fn try_charge(&self, bytes: u64) -> bool {
        let c = &*self.charge;
        let mut cur = c.resident.load(Ordering::Relaxed);
        loop {
            if cur + bytes > self.limit {
                return false;
            }
            match c.resident.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    c.peak.fetch_max(cur + bytes, Ordering::Relaxed);
                    return true;
                }
                Err(v) => cur = v,
            }
        }
    }

    /// Charges `bytes`, calling `reclaim` while the budget is full (it
    /// returns whether it freed anything; backs off 200 µs when not). False
    /// when nothing was freed for [`DIRECT_RECLAIM_GIVE_UP`] or `stop` says
    /// the pager is shutting down.
    pub fn charge(
        &self,
        bytes: u64,
        mut reclaim: impl FnMut() -> bool,
        stop: impl Fn() -> bool,
    ) -> bool {
        let mut last_progress = Instant::now();
        loop {
            // Nothing evictable: the compressed pools give back space
            // (their oldest entries written out to the swap file).
            if reclaim() || self.shrink_pools() {
                last_progress = Instant::now();
            } else {
                // Everything resident is busy (fills or write-backs in
                // flight elsewhere) or failing to write back: back off.
                std::thread::sleep(Duration::from_micros(200));
            }
            if self.try_charge(bytes) {
                return true;
            }
            if last_progress.elapsed() > DIRECT_RECLAIM_GIVE_UP || stop() {
                return false;
            }
        }
    }

    /// Returns `bytes` whose pages are gone, less the pools' pending
    /// growth, which is charged instead (see the module doc).
    pub fn uncharge(&self, bytes: u64) {
        let rest = bytes - self.charge.take_pending(bytes);
        if rest > 0 {
            self.charge.resident.fetch_sub(rest, Ordering::AcqRel);
        }
    }

    /// Dirty file-backed bytes now.
    pub fn dirty(&self) -> u64 {
        self.dirty.load(Ordering::Acquire)
    }
    /// `bytes` of file-backed memory became dirty.
    pub fn dirty_charge(&self, bytes: u64) {
        self.dirty.fetch_add(bytes, Ordering::AcqRel);
    }
    /// `bytes` of dirty file-backed memory were written back or dropped.
    pub fn dirty_uncharge(&self, bytes: u64) {
        self.dirty.fetch_sub(bytes, Ordering::AcqRel);
    }
    /// Whether `bytes` more may become dirty under the dirty limit. One
    /// folio may always be dirty when none is, whatever the limit: a dirty
    /// limit below one folio (half a budget of one folio) would otherwise
    /// refuse every first write (seen: a 64 KiB budget with 64 KiB
    /// folios died by SIGBUS at the first write).
    pub fn dirty_fits(&self, bytes: u64) -> bool {
        let dirty = self.dirty();
        dirty == 0 || dirty + bytes <= self.dirty_limit
    }
    /// Whether `bytes` more may become dirty beside `claimed` bytes
    /// already claimed to become dirty (a batch of write installs, dirty
    /// once published): the first as [`dirty_fits`](Self::dirty_fits),
    /// the rest only within the limit (the one-folio allowance is for one
    /// folio, not a batch).
    pub fn dirty_fits_beside(&self, claimed: u64, bytes: u64) -> bool {
        if claimed == 0 {
            self.dirty_fits(bytes)
        } else {
            self.dirty() + claimed + bytes <= self.dirty_limit
        }
    }
    /// Above half the dirty limit: the background reclaimer cleans.
    pub fn dirty_above_background(&self) -> bool {
        self.dirty() > self.dirty_limit / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_never_pass_the_limit_and_record_the_peak() {
        let b = Budget::new(1 << 20, None);
        assert!(b.try_charge(1 << 19));
        assert!(b.try_charge(1 << 19));
        assert!(!b.try_charge(4096));
        assert_eq!(b.peak(), 1 << 20);
        b.uncharge(1 << 19);
        assert_eq!(b.resident(), 1 << 19);
        let mut calls = 0;
        assert!(b.charge(
            1 << 19,
            || {
                calls += 1;
                true
            },
            || false
        ));
        assert_eq!(calls, 1);
        assert!(!b.charge(4096, || false, || true), "stop ends the wait");
        // Nothing dirty: one folio of any size fits (a one-folio budget).
        assert!(b.dirty_fits(1 << 19) && b.dirty_fits(1 << 20));
        b.dirty_charge(4096);
        assert!(b.dirty_fits((1 << 19) - 4096) && !b.dirty_fits((1 << 19) - 4095));
        b.dirty_uncharge(4096);
        b.dirty_charge(1 << 18);
        assert!(!b.dirty_above_background());
        b.dirty_charge(1);
        assert!(b.dirty_above_background());
    }

    /// A pool's growth is pending until the next uncharge, which returns
    /// that much less: the count never passes the limit and ends as folios
    /// + pool.
    #[test]
    fn a_pools_growth_is_charged_by_the_next_uncharge() {
        let b = Budget::new(1 << 20, None);
        let c = b.charge_handle();
        assert!(b.try_charge(1 << 20));
        c.pool_grow(3000); // a batch compressed, its folios still charged
        assert_eq!(b.resident(), 1 << 20);
        b.uncharge(8192); // the batch unmapped
        assert_eq!(b.resident(), (1 << 20) - 8192 + 3000);
        c.pool_shrink(1000);
        assert_eq!(b.resident(), (1 << 20) - 8192 + 2000);
        c.pool_grow(500);
        c.pool_shrink(700); // pending first, then charged bytes
        assert_eq!(b.resident(), (1 << 20) - 8192 + 1800);
        assert_eq!(c.pool_bytes(), 1800);
        assert!(b.peak() <= 1 << 20);
    }
}
