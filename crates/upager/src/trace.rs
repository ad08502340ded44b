//! The folio trace: a small always-on ring of recent state changes per
//! region, dumped when a check finds a folio holding the wrong data (the
//! kernel's `page_owner` / `dump_page()` idea), so a rare loss explains
//! itself: which path moved the folio, from which state to which, when, on
//! which thread.
//!
//! Contract:
//! - Recording is async-signal-safe and lock-free (a SIGBUS handler records
//!   its fills): one `fetch_add` on the ring's cursor and two relaxed
//!   stores; no allocation, no lock. A reader may see a slot half-written
//!   by a concurrent recorder (the dump says so: the time and the event of
//!   one slot disagree at worst); it is a debugging aid, never a
//!   synchronisation point.
//! - The ring keeps the last [`RING`] events of the whole region (fewer for
//!   a region of few folios: 8 per folio, at least 64; 16 bytes each) (not per
//!   folio): enough for the last moves of a folio in a soak that checks
//!   after every flush.
//!
//! Event word: `folio index (40 bits) | path (8) | old kind (4) | new kind
//! (4) | thread tag (8)`; time word: ns since the region was created.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Instant;

use crate::folio::Kind;

/// Events kept per region (16 KiB of ring; a guess that holds a few
/// hundred rounds of a soak's last folios).
const RING: usize = 1024;

/// Which code path moved a folio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Path {
    /// A fault or prefetch claimed it for a fill.
    FillClaim = 1,
    /// The fill published it resident.
    FillPublish,
    /// A fill in a SIGBUS handler was undone (handed off), nothing kept.
    FillUndo,
    /// The fill failed: poisoned (SIGBUS for the access).
    FillFailed,
    /// A write-protect fault claimed a resident folio.
    WpClaim,
    /// ... and made it DIRTY (unprotected).
    WpDirty,
    /// A batch (reclaim, flush, pageout, discard, age) claimed it.
    BatchClaim,
    /// A batch wrote it back and kept it resident (CLEAN).
    Cleaned,
    /// A batch evicted it (EVICTED / NEVER).
    Evicted,
    /// Its write-back (or protect) failed: resident and DIRTY again.
    KeptDirty,
    /// Discarded (contents dropped).
    Discarded,
    /// A write was refused (the store refuses writes).
    Refused,
    /// The reclaimer cleared its poison.
    Unpoisoned,
    /// A claim let go without a change (a batch stopping early).
    Unclaimed,
}

impl Path {
    fn name(v: u8) -> &'static str {
        match v {
            1 => "fill-claim",
            2 => "fill-publish",
            3 => "fill-undo",
            4 => "fill-failed",
            5 => "wp-claim",
            6 => "wp-dirty",
            7 => "batch-claim",
            8 => "cleaned",
            9 => "evicted",
            10 => "kept-dirty",
            11 => "discarded",
            12 => "refused",
            13 => "unpoisoned",
            14 => "unclaimed",
            _ => "?",
        }
    }
}

fn kind_name(v: u64) -> &'static str {
    match v {
        0 => "NEVER",
        1 => "EVICTED",
        2 => "CLEAN",
        3 => "DIRTY",
        4 => "BUSY",
        5 => "POISONED",
        _ => "?",
    }
}

/// Thread tags: 1, 2, ... in the order threads first record (mod 256).
static NEXT_TAG: AtomicU8 = AtomicU8::new(1);

thread_local! {
    /// This thread's tag (const-initialised, no destructor: safe in a
    /// signal handler).
    static TAG: Cell<u8> = const { Cell::new(0) };
}

fn thread_tag() -> u8 {
    TAG.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let n = NEXT_TAG.fetch_add(1, Relaxed).max(1);
        t.set(n);
        n
    })
}

/// One region's ring of folio state changes.
pub(crate) struct Trace {
    born: Instant,
    cursor: AtomicU64,
    slots: Box<[[AtomicU64; 2]]>,
    /// When the region last logged an error (ns since `born`, + 1; 0:
    /// never), and the messages held back since: [`Trace::may_report`].
    reported: AtomicU64,
    held: AtomicU64,
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new(RING)
    }
}

impl Trace {
    /// A ring for a region of `nfolios` folios.
    pub fn for_folios(nfolios: usize) -> Trace {
        Trace::new(nfolios.saturating_mul(8).clamp(64, RING))
    }

    fn new(events: usize) -> Trace {
        Trace {
            born: Instant::now(),
            cursor: AtomicU64::new(0),
            slots: (0..events)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            reported: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }
}

impl Trace {
    /// Whether the region may log an error now: at most one a second, so a
    /// store that fails every read cannot flood the log. `Some(n)`: yes,
    /// and `n` messages were held back since the last one.
    pub fn may_report(&self) -> Option<u64> {
        let now = self.born.elapsed().as_nanos() as u64 + 1;
        let last = self.reported.load(Relaxed);
        if last != 0 && now - last < 1_000_000_000 {
            self.held.fetch_add(1, Relaxed);
            return None;
        }
        if self
            .reported
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
        {
            self.held.fetch_add(1, Relaxed);
            return None;
        }
        Some(self.held.swap(0, Relaxed))
    }

    /// Records that `path` moved folio `idx` from `old` to `new`.
    pub fn record(&self, idx: usize, path: Path, old: Kind, new: Kind) {
        let t = self.born.elapsed().as_nanos() as u64;
        let ev = ((idx as u64) << 24)
            | (u64::from(path as u8) << 16)
            | ((old as u64) << 12)
            | ((new as u64) << 8)
            | u64::from(thread_tag());
        let at = self.cursor.fetch_add(1, Relaxed) as usize % self.slots.len();
        self.slots[at][0].store(t, Relaxed);
        self.slots[at][1].store(ev, Relaxed);
    }

    /// The recorded events (oldest first) of the folios in `folios`, one a
    /// line, with how many events the ring has seen in all.
    pub fn dump(&self, folios: std::ops::Range<usize>) -> String {
        let end = self.cursor.load(Relaxed);
        let start = end.saturating_sub(self.slots.len() as u64);
        let mut out = String::new();
        let mut shown = 0;
        for i in start..end {
            let s = &self.slots[i as usize % self.slots.len()];
            let (t, ev) = (s[0].load(Relaxed), s[1].load(Relaxed));
            let idx = (ev >> 24) as usize;
            if ev == 0 || !folios.contains(&idx) {
                continue;
            }
            shown += 1;
            let _ = writeln!(
                out,
                "  {:>12.6} s  folio {idx:<8} {:<13} {:>8} -> {:<8} thread {}",
                t as f64 / 1e9,
                Path::name((ev >> 16) as u8),
                kind_name((ev >> 12) & 0xf),
                kind_name((ev >> 8) & 0xf),
                ev & 0xff,
            );
        }
        let _ = writeln!(
            out,
            "  ({shown} events of folios {}..{} among the last {} of the region; {} in all)",
            folios.start,
            folios.end,
            end - start,
            end
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_dumps_one_folios_events_in_order() {
        let t = Trace::default();
        t.record(5, Path::FillClaim, Kind::Never, Kind::Busy);
        t.record(6, Path::FillClaim, Kind::Never, Kind::Busy);
        t.record(5, Path::FillPublish, Kind::Busy, Kind::Dirty);
        let d = t.dump(5..6);
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 3, "{d}");
        assert!(lines[0].contains("fill-claim") && lines[0].contains("NEVER -> BUSY"));
        assert!(lines[1].contains("fill-publish") && lines[1].contains("BUSY -> DIRTY"));
        assert!(lines[2].contains("2 events") && lines[2].contains("3 in all"));
    }

    #[test]
    fn the_ring_keeps_the_last_events() {
        let t = Trace::default();
        for k in 0..(RING + 10) {
            t.record(k, Path::Evicted, Kind::Busy, Kind::Evicted);
        }
        assert!(!t.dump(0..10).contains("evicted"));
        assert!(t.dump(RING + 9..RING + 10).contains("evicted"));
    }
}
