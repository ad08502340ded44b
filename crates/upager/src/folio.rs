//! The state word of one folio: the lock-free heart of the engine.
//!
//! Every folio of every region has one `AtomicU64`. Fault handlers, the
//! reclaimer, flush, pageout and discard move folios between states only by
//! compare-and-swap on this word, so the fault path takes no lock, and the
//! word doubles as the evicted-page marker of seed 004 (residency is answered
//! from it without touching the store).
//!
//! ```text
//!  bits  0..3  kind: NEVER | EVICTED | CLEAN | DIRTY | BUSY | POISONED
//!  bit   3     WAITER  a fault found the folio BUSY and waits for a wake
//!  bit   4     ACTIVE  belongs on the active list (refaulted soon after eviction)
//!  bit   5     QUEUED  an entry for this folio sits on an LRU list
//!  bit   6     PINNED  resident until unpinned: reclaim, pageout and discard
//!                      leave it alone (counts in `Area::pins`)
//!  bit   7     PARTIAL DIRTY in part (folios above 4 KiB of writable files):
//!                      one 4 KiB page was written, `Area::partial_page`
//!                      says which; the folio's other pages are still
//!                      write-protected. Only on DIRTY (and the BUSY that
//!                      claimed a DIRTY one): any other kind clears it.
//!  bits  8..32 eviction sequence number (pages), for the refault distance
//!  bits 32..64 swap slot + 1 (anonymous regions; 0 = no slot)
//! ```
//!
//! State machine (who moves it):
//!
//! ```text
//!   NEVER/EVICTED --fault/prefetch claims--> BUSY --fill done--> CLEAN (read) / DIRTY (write)
//!   CLEAN --wp fault claims--> BUSY --unprotected--> DIRTY (a folio above 4 KiB:
//!         DIRTY|PARTIAL, its written page unprotected; a second page's wp
//!         fault claims it again --whole folio unprotected--> DIRTY)
//!   CLEAN/DIRTY --reclaim/pageout/flush claims--> BUSY --> EVICTED | NEVER | CLEAN (flush) | DIRTY (I/O failed)
//!   BUSY --store read failed--> POISONED --reclaimer clears--> NEVER/EVICTED
//! ```
//!
//! Invariants:
//! - Only the thread that moved a folio to BUSY moves it out of BUSY.
//! - A CLEAN folio's pages are write-protected (uffd-wp) in the application's
//!   view, so the first write raises a fault and the folio becomes DIRTY
//!   before the write lands: dirty tracking is exact.
//! - Leaving BUSY clears WAITER; whoever sees WAITER in the value it replaced
//!   issues `UFFDIO_WAKE` for the folio (the waiters' faults retry).

// Through `crate::sync` (std here): tests/model.rs builds this file against
// the model checker's atomics and scheduling points.
use crate::sync::{sleep, yield_now, AtomicU64, Ordering};

/// What a folio is doing, from its state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Never filled: reads come from the store (file) or are zero (anonymous).
    Never = 0,
    /// Was resident, now only in the store (the seed-004 marker).
    Evicted = 1,
    /// Resident, same as the store (write-protected in the view).
    Clean = 2,
    /// Resident, written since last written back.
    Dirty = 3,
    /// A fill, eviction, write-back or unprotect is in flight.
    Busy = 4,
    /// The store read failed: access raises SIGBUS until the reclaimer clears it.
    Poisoned = 5,
}

const KIND_MASK: u64 = 0x7;
pub(crate) const WAITER: u64 = 1 << 3;
pub(crate) const ACTIVE: u64 = 1 << 4;
pub(crate) const QUEUED: u64 = 1 << 5;
pub(crate) const PINNED: u64 = 1 << 6;
pub(crate) const PARTIAL: u64 = 1 << 7;
const SEQ_SHIFT: u32 = 8;
/// Width of the eviction sequence field; distances are taken modulo 2^24
/// pages (64 GiB of evictions), far above any budget this targets.
pub(crate) const SEQ_BITS: u32 = 24;
pub(crate) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const SLOT_SHIFT: u32 = 32;

/// A decoded state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State(pub u64);

impl State {
    pub fn kind(self) -> Kind {
        match self.0 & KIND_MASK {
            0 => Kind::Never,
            1 => Kind::Evicted,
            2 => Kind::Clean,
            3 => Kind::Dirty,
            4 => Kind::Busy,
            _ => Kind::Poisoned,
        }
    }
    pub fn has(self, bit: u64) -> bool {
        self.0 & bit != 0
    }
    /// Swap slot, if the folio owns one.
    pub fn slot(self) -> Option<u32> {
        match (self.0 >> SLOT_SHIFT) as u32 {
            0 => None,
            s => Some(s - 1),
        }
    }
    pub fn seq(self) -> u64 {
        (self.0 >> SEQ_SHIFT) & SEQ_MASK
    }
    /// Same flags, new kind; WAITER cleared (it belongs to a BUSY period),
    /// and PARTIAL unless the new kind is DIRTY or BUSY (a claim keeps it
    /// for its owner; a folio that is clean, evicted or never filled has
    /// no written page).
    #[must_use]
    pub fn with_kind(self, k: Kind) -> State {
        let keep = if matches!(k, Kind::Dirty | Kind::Busy) {
            !(KIND_MASK | WAITER)
        } else {
            !(KIND_MASK | WAITER | PARTIAL)
        };
        State((self.0 & keep) | k as u64)
    }
    /// DIRTY as a whole: every page may have been written (not PARTIAL).
    pub fn wholly_dirty(self) -> bool {
        self.kind() == Kind::Dirty && !self.has(PARTIAL)
    }
    #[must_use]
    pub fn with_slot(self, slot: Option<u32>) -> State {
        let s = slot.map_or(0, |s| u64::from(s) + 1);
        State((self.0 & ((1 << SLOT_SHIFT) - 1)) | (s << SLOT_SHIFT))
    }
    #[must_use]
    pub fn with_seq(self, seq: u64) -> State {
        State((self.0 & !(SEQ_MASK << SEQ_SHIFT)) | ((seq & SEQ_MASK) << SEQ_SHIFT))
    }
    #[must_use]
    pub fn set(self, bit: u64, on: bool) -> State {
        if on {
            State(self.0 | bit)
        } else {
            State(self.0 & !bit)
        }
    }
}

/// Loads a state word (Acquire: pairs with the Release of [`release`], so a
/// thread that sees CLEAN/DIRTY also sees the pages the filler installed).
pub(crate) fn load(w: &AtomicU64) -> State {
    State(w.load(Ordering::Acquire))
}

/// Claims a folio: moves it to BUSY if `pred` accepts its current state.
/// Returns the state it had. Keeps every flag but WAITER.
pub(crate) fn try_claim(w: &AtomicU64, pred: impl Fn(State) -> bool) -> Option<State> {
    let mut cur = load(w);
    loop {
        if !pred(cur) {
            return None;
        }
        match w.compare_exchange_weak(
            cur.0,
            cur.with_kind(Kind::Busy).0,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(cur),
            Err(v) => cur = State(v),
        }
    }
}

/// Ends a BUSY period: stores `f(current)` (whose kind must not be BUSY) and
/// returns the BUSY value it replaced; if that has WAITER, a fault waits on
/// the folio and the caller must wake it.
pub(crate) fn release(w: &AtomicU64, f: impl Fn(State) -> State) -> State {
    let mut cur = load(w);
    loop {
        debug_assert_eq!(cur.kind(), Kind::Busy, "only the BUSY owner releases");
        let new = f(cur);
        debug_assert_ne!(new.kind(), Kind::Busy);
        match w.compare_exchange_weak(
            cur.0,
            State(new.0 & !WAITER).0,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return cur,
            Err(v) => cur = State(v),
        }
    }
}

/// Like [`try_claim`], but first waits while the folio is BUSY (someone
/// else's fill, write-back or eviction finishes in bounded time), then
/// decides on the state it settles in.
///
/// `before_wait` runs once, the first time the folio is seen BUSY: a caller
/// holding claims of its own (a batch being collected) must let them go
/// there, because the BUSY owner may be a fill waiting in direct reclaim for
/// budget that only those claimed folios can free — waiting while holding
/// them would stall the fill until it gives up (SIGBUS after 5 s).
pub(crate) fn claim_when_idle(
    w: &AtomicU64,
    pred: impl Fn(State) -> bool,
    before_wait: impl FnOnce(),
) -> Option<State> {
    let mut before_wait = Some(before_wait);
    let mut spins = 0u32;
    loop {
        let s = load(w);
        if s.kind() != Kind::Busy {
            if !pred(s) {
                return None;
            }
            if let Some(old) = try_claim(w, |s| s.kind() != Kind::Busy && pred(s)) {
                return Some(old);
            }
            continue;
        }
        if let Some(f) = before_wait.take() {
            f();
        }
        spins += 1;
        if spins < 64 {
            yield_now();
        } else {
            sleep(std::time::Duration::from_micros(50));
        }
    }
}

/// A fault found the folio BUSY: records that it waits. Returns false if the
/// folio left BUSY meanwhile (re-examine it).
pub(crate) fn add_waiter(w: &AtomicU64) -> bool {
    let mut cur = load(w);
    loop {
        if cur.kind() != Kind::Busy {
            return false;
        }
        if cur.has(WAITER) {
            return true;
        }
        match w.compare_exchange_weak(cur.0, cur.0 | WAITER, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(v) => cur = State(v),
        }
    }
}

/// Sets or clears a flag bit without changing the kind.
/// Sets `bit` if the state `pred` accepts (one CAS loop); false if not.
pub(crate) fn set_flag_if(w: &AtomicU64, bit: u64, pred: impl Fn(State) -> bool) -> bool {
    let mut cur = load(w);
    loop {
        if !pred(cur) {
            return false;
        }
        match w.compare_exchange_weak(cur.0, cur.0 | bit, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(v) => cur = State(v),
        }
    }
}

pub(crate) fn set_flag(w: &AtomicU64, bit: u64, on: bool) {
    if on {
        w.fetch_or(bit, Ordering::AcqRel);
    } else {
        w.fetch_and(!bit, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let s = State(0)
            .with_kind(Kind::Evicted)
            .with_slot(Some(77))
            .with_seq(123_456)
            .set(ACTIVE, true);
        assert_eq!(s.kind(), Kind::Evicted);
        assert_eq!(s.slot(), Some(77));
        assert_eq!(s.seq(), 123_456);
        assert!(s.has(ACTIVE) && !s.has(QUEUED));
        assert_eq!(s.with_slot(None).slot(), None);
        assert_eq!(s.with_seq(SEQ_MASK + 5).seq(), 4);
    }

    #[test]
    fn partial_lives_only_on_dirty_and_its_claim() {
        let d = State(0).with_kind(Kind::Dirty).set(PARTIAL, true);
        assert!(!d.wholly_dirty());
        let busy = d.with_kind(Kind::Busy);
        assert!(busy.has(PARTIAL));
        assert!(busy.with_kind(Kind::Dirty).has(PARTIAL));
        for k in [Kind::Clean, Kind::Evicted, Kind::Never, Kind::Poisoned] {
            assert!(!busy.with_kind(k).has(PARTIAL), "{k:?}");
        }
        assert!(d.set(PARTIAL, false).wholly_dirty());
    }

    #[test]
    fn claim_wait_release() {
        let w = AtomicU64::new(State(0).with_kind(Kind::Clean).set(QUEUED, true).0);
        assert!(try_claim(&w, |s| s.kind() == Kind::Never).is_none());
        let old = try_claim(&w, |s| s.kind() == Kind::Clean).unwrap();
        assert_eq!(old.kind(), Kind::Clean);
        assert!(add_waiter(&w));
        assert!(release(&w, |s| s.with_kind(Kind::Dirty)).has(WAITER));
        let now = load(&w);
        assert_eq!(now.kind(), Kind::Dirty);
        assert!(now.has(QUEUED) && !now.has(WAITER));
        assert!(!add_waiter(&w));
    }
}
