//! The warm-start recorder: each folio's first fill — by a fault, its
//! readahead window, a prefetch — appends the folio's index to the
//! region's trace ([`Recorder`]). A set-once bit per folio (`fetch_or`)
//! and slots of a preallocated table, one `fetch_add` for a fill's new
//! folios (consecutive entries: two threads' fills do not interleave folio
//! by folio): lock-free, no allocation (a SIGBUS handler records its
//! fills), bounded ([`MAX_ENTRIES`]). A time mark (ms since the map) every
//! [`MARK_EVERY`] entries. Ordering: a slot is written (Release) after its
//! `fetch_add`, read (Acquire) by [`Recorder::trace`]; a slot still 0 was
//! taken and not written yet, and is skipped.
//!
//! Lock order: none (atomics).
//!
//! Uses: `warm_format`.

use std::io;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::Instant;

use upager_sys::mem::AtomicTable;

use crate::warm_format::{Trace, MARK_EVERY, MAX_ENTRIES};

/// Folios recorded as one group of consecutive entries, at most (a
/// readahead window of 4 KiB folios is 512 at the default 2 MiB).
pub(crate) const RECORD_CHUNK: usize = 1024;

/// The trace being recorded: lock-free, preallocated, async-signal-safe.
pub(crate) struct Recorder {
    /// One bit per folio: recorded already.
    seen: AtomicTable,
    /// Entry `k`: folio index + 1 (0: a recorder took the slot and has not
    /// written it yet, or never will: skipped).
    order: AtomicTable,
    next: AtomicUsize,
    marks: AtomicTable,
    t0: Instant,
}

impl Recorder {
    pub(crate) fn new(nfolios: usize) -> io::Result<Recorder> {
        let cap = nfolios.min(MAX_ENTRIES);
        Ok(Recorder {
            seen: AtomicTable::zeroed(nfolios.div_ceil(64))?,
            order: AtomicTable::zeroed(cap)?,
            next: AtomicUsize::new(0),
            marks: AtomicTable::zeroed(cap / MARK_EVERY + 1)?,
            t0: Instant::now(),
        })
    }

    #[cfg(test)]
    pub(crate) fn record(&self, idx: usize) {
        self.record_run(idx, 1);
    }

    /// Records the folios of `idx .. idx + n` (at most [`RECORD_CHUNK`],
    /// one fill's) filled for the first time, as consecutive entries: one
    /// `fetch_add` for the lot, so that fills recorded at the same moment
    /// by two threads (a fault's window and the prefetch thread's next
    /// one) do not interleave folio by folio, and a readahead window stays
    /// one sequential run of the trace (replay from a local file leaves
    /// those to readahead: `leave_runs_to_readahead`).
    pub(crate) fn record_run(&self, idx: usize, n: usize) {
        debug_assert!(n <= RECORD_CHUNK);
        let n = n.min(RECORD_CHUNK); // (a SIGBUS handler must not panic)
        let mut new = [0u64; RECORD_CHUNK / 64];
        let mut count = 0;
        for j in 0..n {
            let f = idx + j;
            let bit = 1u64 << (f % 64);
            let Some(word) = self.seen.get(f / 64) else {
                break;
            };
            if word.fetch_or(bit, AcqRel) & bit == 0 {
                new[j / 64] |= 1 << (j % 64);
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let first = self.next.fetch_add(count, Relaxed);
        let fresh = (0..n).filter(|&j| new[j / 64] & (1 << (j % 64)) != 0);
        for (k, j) in (first..).zip(fresh) {
            let Some(slot) = self.order.get(k) else {
                return; // full: the trace keeps the first MAX_ENTRIES
            };
            slot.store((idx + j) as u64 + 1, Release);
            if k.is_multiple_of(MARK_EVERY) {
                if let Some(m) = self.marks.get(k / MARK_EVERY) {
                    m.store(self.t0.elapsed().as_millis() as u64, Relaxed);
                }
            }
        }
    }

    /// The entries recorded so far.
    pub(crate) fn trace(&self) -> Trace {
        let n = self.next.load(Acquire).min(self.order.len());
        let order: Vec<usize> = self.order[..n]
            .iter()
            .map(|w| w.load(Acquire))
            .filter(|&v| v != 0)
            .map(|v| v as usize - 1)
            .collect();
        let marks_ms = self.marks[..order.len().div_ceil(MARK_EVERY).min(self.marks.len())]
            .iter()
            .map(|w| w.load(Relaxed))
            .collect();
        Trace { order, marks_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_is_recorded_as_consecutive_entries_of_its_new_folios() {
        let rec = Recorder::new(4000).unwrap();
        rec.record(5);
        rec.record_run(3, 4); // 3, 4, 6 new; 5 seen
        rec.record_run(2000, 1024);
        rec.record_run(2000, 10); // all seen
        let order = rec.trace().order;
        assert_eq!(&order[..4], &[5, 3, 4, 6]);
        assert_eq!(&order[4..], &(2000..3024).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn a_recorder_keeps_first_fills_once_in_order() {
        let rec = Recorder::new(100).unwrap();
        for idx in [3, 4, 3, 99, 0, 4, 50] {
            rec.record(idx);
        }
        assert_eq!(rec.trace().order, vec![3, 4, 99, 0, 50]);
        assert_eq!(rec.trace().marks_ms.len(), 1);
    }
}
