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
//!
//! Uses: `config`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::{DEFAULT_BATCH_BYTES, MIN_FOLIO};

/// A waiter for room that frees nothing for this long gives up (its fault
/// gets SIGBUS rather than hang).
pub(crate) const DIRECT_RECLAIM_GIVE_UP: Duration = Duration::from_secs(5);

/// Resident and dirty bytes of one pager against its limits.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    resident: AtomicU64,
    peak: AtomicU64,
    high_wm: u64,
    low_wm: u64,
    dirty: AtomicU64,
    dirty_limit: u64,
    pinned: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes; `dirty_limit` defaults to half of it.
    pub fn new(limit: u64, dirty_limit: Option<u64>) -> Budget {
        let gap = (limit / 8).min(2 * DEFAULT_BATCH_BYTES);
        Budget {
            limit,
            resident: AtomicU64::new(0),
            peak: AtomicU64::new(0),
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
    /// Bytes charged now.
    pub fn resident(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }
    /// Highest charge seen.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
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
        let mut cur = self.resident.load(Ordering::Relaxed);
        loop {
            if cur + bytes > self.limit {
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
            if reclaim() {
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

    /// Returns `bytes` whose pages are gone.
    pub fn uncharge(&self, bytes: u64) {
        if bytes > 0 {
            self.resident.fetch_sub(bytes, Ordering::AcqRel);
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
}
