//! The warm-start replayer ([`Replayer`]): the prefetch thread reads the
//! folios of a trace in recorded order, a window at a time (a sixteenth of
//! the budget at first, doubling each time the program faults on a folio
//! replay had not read yet, up to a quarter, 1-64 MiB), through the
//! pipeline every read ahead takes (ahead.rs: many reads in one
//! `Store::read_batch`, each folio's budget charged first, at most one
//! batch of reclaim per batch). Pacing is the kernel's PG_readahead marker:
//! one folio in the middle of each window is left unread, and the program's
//! fault on it asks for the next window — so replay runs at most a window
//! and a half ahead of the program, never further than its budget allows,
//! and stops by itself when the program goes elsewhere (it never reaches
//! the marker). Faults on folios the trace does not hold, or holds more
//! than a window away from where replay is (a program on other inputs that
//! shares some folios with the trace), count as unpredicted and do not
//! move replay on; when they outnumber the predicted ones four to one
//! (after [`DIVERGED_MIN`]), replay stops and says so. From a store whose
//! reads are not round trips (a local file: `Store::round_trips` false),
//! the trace's sequential runs of at least a readahead window (of 16
//! folios or more) are left to readahead ([`long_streams`]): replay does
//! not read them, the program's faults stream them as on demand, and their
//! places still pace replay.
//!
//! What "used" means here: userfaultfd does not see a read of an installed
//! page, so a replayed folio counts as a hit (`replay_hits`) once the
//! program's faults have passed its place in the trace, and as wasted
//! (`replay_wasted`) if it is evicted before that. Folios still resident
//! past the program's last fault when the region goes count as neither.
//!
//! Counters: `replay_reads` (folios replay read), `replay_hits`,
//! `replay_wasted`.
//!
//! Lock order: none (atomics; the prefetch thread alone steps a replay).
//!
//! Uses: none.

use std::io;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use upager_sys::mem::AtomicTable;

/// Unpredicted faults before replay may judge the program diverged.
const DIVERGED_MIN: u64 = 64;

/// A trace being replayed: the prefetch thread reads a window at a time; a
/// fault on the window's marker asks for the next one.
pub(crate) struct Replayer {
    order: Vec<usize>,
    /// Per folio: its first place in `order` + 1 (0: not in the trace).
    place: AtomicTable,
    /// Per place, one bit: replay read that folio.
    replayed: AtomicTable,
    /// Per place, one bit: left to readahead (a long sequential run of a
    /// store whose reads are not round trips: `leave_runs_to_readahead`).
    streamed: Option<AtomicTable>,
    /// Places handed to the prefetch path so far.
    issued: AtomicUsize,
    /// The place + 1 of the folio left unread in the last window: a fault
    /// there or beyond asks for the next window (at first 0: the
    /// program's first predicted fault).
    marker: AtomicUsize,
    /// One past the furthest place the program faulted at.
    reached: AtomicUsize,
    /// Places below this were counted as hits.
    counted: AtomicUsize,
    /// Places per window: starts at a quarter of `max_window` and doubles
    /// each time the program faults on a place replay had not read yet
    /// (it was late), as readahead's window grows.
    window: AtomicUsize,
    max_window: usize,
    predicted: AtomicU64,
    unpredicted: AtomicU64,
    stopped: AtomicBool,
}

/// Streams followed at once ([`long_streams`]).
const STREAMS: usize = 8;
/// Largest step (folios) from one folio of a stream to its next.
const STREAM_GAP: usize = 32;

/// A stream [`long_streams`] follows.
struct Stream {
    /// Its last folio, and that entry's position in the trace.
    last: usize,
    at: usize,
    /// Its entries' positions while it is shorter than `min`; empty once
    /// it is long (they were marked, and so is every entry after).
    short: Vec<u32>,
}

/// Calls `mark` with the position of every entry of `order` that belongs
/// to a stream of at least `min` entries. An entry continues the most
/// recently continued of the [`STREAMS`] latest streams that ended at most
/// [`STREAM_GAP`] folios before it, else starts a new stream (replacing
/// the least recently continued, which ends there). Memory: at most `min`
/// positions per stream followed, whatever the trace's length.
fn long_streams(order: &[usize], min: usize, mut mark: impl FnMut(usize)) {
    let min = min.max(2);
    let mut live: Vec<Stream> = Vec::with_capacity(STREAMS);
    for (p, &idx) in order.iter().enumerate() {
        let cont = live
            .iter_mut()
            .filter(|s| idx > s.last && idx - s.last <= STREAM_GAP)
            .max_by_key(|s| s.at);
        match cont {
            Some(s) => {
                (s.last, s.at) = (idx, p);
                if s.short.is_empty() {
                    mark(p); // long already
                } else {
                    s.short.push(p as u32);
                    if s.short.len() >= min {
                        s.short.drain(..).for_each(|q| mark(q as usize));
                    }
                }
            }
            // A new stream: in a free slot, else in the least recently
            // continued one's (its buffer reused: a scattered trace starts
            // a stream per entry, and allocates nothing for it).
            None => {
                if live.len() < STREAMS {
                    live.push(Stream {
                        last: idx,
                        at: p,
                        short: vec![p as u32],
                    });
                } else if let Some(lru) = live.iter_mut().min_by_key(|s| s.at) {
                    (lru.last, lru.at) = (idx, p);
                    lru.short.clear();
                    lru.short.push(p as u32);
                }
            }
        }
    }
}

impl Replayer {
    pub(crate) fn new(
        order: Vec<usize>,
        nfolios: usize,
        window: usize,
        max_window: usize,
    ) -> io::Result<Replayer> {
        let place = AtomicTable::zeroed(nfolios)?;
        for (p, &idx) in order.iter().enumerate() {
            if let Some(w) = place.get(idx) {
                if w.load(Relaxed) == 0 {
                    w.store(p as u64 + 1, Relaxed);
                }
            }
        }
        Ok(Replayer {
            replayed: AtomicTable::zeroed(order.len().div_ceil(64).max(1))?,
            streamed: None,
            order,
            place,
            issued: AtomicUsize::new(0),
            marker: AtomicUsize::new(0),
            reached: AtomicUsize::new(0),
            counted: AtomicUsize::new(0),
            window: AtomicUsize::new(window.clamp(2, max_window.max(2))),
            max_window: max_window.max(2),
            predicted: AtomicU64::new(0),
            unpredicted: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        })
    }

    /// Leaves every sequential stream of at least `min` folios in the
    /// trace to readahead: replay does not read it (the program's faults
    /// stream it, the faulting thread and the prefetch thread reading
    /// windows side by side), but its places still pace replay. For stores
    /// whose reads are not round trips (a local file): there a fault that
    /// streams costs little more than replay's read of the same bytes,
    /// and one replay thread reading everything left the program waiting
    /// on it with a CPU idle (measured: model from a file, 0.83-0.87x of
    /// on demand; docs/benchmarks.md).
    ///
    /// A stream is what readahead would see: folios in ascending order,
    /// each at most [`STREAM_GAP`] folios past the one before (the folios
    /// between were needed earlier), interleaved in the trace with others
    /// ([`STREAMS`] followed at once: threads of the program each
    /// streaming their part, as an OpenMP loop's static schedule does:
    /// UMap's bfs; measured there, steps of up to 32 folios left to
    /// readahead made replay 1.18x of on demand where 8 gave 0.90x,
    /// docs/benchmarks.md).
    pub(crate) fn leave_runs_to_readahead(&mut self, min: usize) {
        let Ok(bits) = AtomicTable::zeroed(self.order.len().div_ceil(64).max(1)) else {
            return; // no memory for the bits: replay reads everything
        };
        long_streams(&self.order, min, |q| {
            if let Some(w) = bits.get(q / 64) {
                w.fetch_or(1 << (q % 64), Relaxed);
            }
        });
        self.streamed = Some(bits);
    }

    pub(crate) fn is_streamed(&self, place: usize) -> bool {
        self.streamed.as_ref().is_some_and(|b| {
            b.get(place / 64)
                .is_some_and(|w| w.load(Relaxed) & (1 << (place % 64)) != 0)
        })
    }

    /// The program faulted on folio `idx` (not a prefetch): whether to ask
    /// the prefetch thread for the next window. Async-signal-safe.
    pub(crate) fn on_fault(&self, idx: usize) -> bool {
        if self.stopped.load(Relaxed) {
            return false;
        }
        let p = self.place.get(idx).map_or(0, |w| w.load(Relaxed)) as usize;
        // In step: at most a window behind the marker or ahead of what was
        // issued. A fault elsewhere in the trace (a program on other inputs
        // that shares some folios with it) is not progress through it.
        let issued = self.issued.load(Acquire);
        let marker = self.marker.load(Acquire);
        let window = self.window.load(Relaxed);
        if p == 0 || p + window < marker || p > issued + window {
            self.unpredicted.fetch_add(1, Relaxed);
            return false;
        }
        self.predicted.fetch_add(1, Relaxed);
        self.reached.fetch_max(p, Relaxed);
        if p != marker && p > 1 {
            // A place replay should have read by now: it was late.
            self.window
                .store((window * 2).min(self.max_window), Relaxed);
        }
        p >= marker && issued < self.order.len()
    }

    /// Whether the program left the trace: replay stopped for it, or
    /// would at its next window (the program may never ask for one).
    pub(crate) fn left(&self) -> bool {
        self.stopped.load(Relaxed) || self.diverged()
    }

    /// Whether the program went elsewhere: faults off the trace, or out of
    /// step with it, outnumber those in step four to one.
    pub(crate) fn diverged(&self) -> bool {
        let u = self.unpredicted.load(Relaxed);
        u >= DIVERGED_MIN && u > 4 * self.predicted.load(Relaxed)
    }

    /// The next window, for the prefetch thread: runs of consecutive folios
    /// in recorded order (the marker left out), or None when the trace is
    /// done or replay stopped. Moves the marker.
    pub(crate) fn next_window(&self) -> Option<Vec<std::ops::Range<usize>>> {
        if self.stopped.load(Relaxed) {
            return None;
        }
        if self.diverged() {
            self.stopped.store(true, Relaxed);
            log::info!(
                "warm start: the program's faults left the recorded trace ({} unpredicted, {} \
                 predicted): replay stopped",
                self.unpredicted.load(Relaxed),
                self.predicted.load(Relaxed)
            );
            return None;
        }
        let start = self.issued.load(Acquire);
        let end = (start + self.window.load(Relaxed)).min(self.order.len());
        if start >= end {
            return None;
        }
        let marker = start + (end - start) / 2;
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for (p, &idx) in self.order[start..end].iter().enumerate() {
            if start + p == marker && end < self.order.len() {
                continue; // left for the program's fault (the last window has none)
            }
            if self.is_streamed(start + p) {
                continue; // readahead's
            }
            match runs.last_mut() {
                Some(r) if r.end == idx => r.end += 1,
                _ => runs.push(idx..idx + 1),
            }
        }
        self.issued.store(end, Release);
        self.marker.store(marker + 1, Release);
        Some(runs)
    }

    /// Replay read folio `idx`.
    pub(crate) fn read_one(&self, idx: usize) {
        let p = self.place.get(idx).map_or(0, |w| w.load(Relaxed)) as usize;
        if p > 0 {
            if let Some(w) = self.replayed.get((p - 1) / 64) {
                w.fetch_or(1 << ((p - 1) % 64), Relaxed);
            }
        }
    }

    /// Replayed folios the program has passed since the last call (hits).
    pub(crate) fn take_hits(&self) -> u64 {
        let upto = self.reached.load(Relaxed).min(self.order.len());
        let from = self.counted.fetch_max(upto, AcqRel);
        self.count_replayed(from, upto)
    }

    /// Folio `idx` is being evicted: whether replay read it and the
    /// program had not reached its place (wasted: read for nothing, at
    /// least this time). Async-signal-safe.
    pub(crate) fn on_evict(&self, idx: usize) -> bool {
        let p = self.place.get(idx).map_or(0, |w| w.load(Relaxed)) as usize;
        if p == 0 || p <= self.reached.load(Relaxed) {
            return false;
        }
        let bit = 1u64 << ((p - 1) % 64);
        self.replayed
            .get((p - 1) / 64)
            .is_some_and(|w| w.fetch_and(!bit, Relaxed) & bit != 0)
    }

    pub(crate) fn count_replayed(&self, from: usize, to: usize) -> u64 {
        (from..to)
            .filter(|&p| {
                self.replayed
                    .get(p / 64)
                    .is_some_and(|w| w.load(Relaxed) & (1 << (p % 64)) != 0)
            })
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_windows_follow_the_trace_leave_a_marker_and_stop_on_divergence() {
        let order: Vec<usize> = vec![10, 11, 12, 13, 40, 41, 2, 3, 90, 91];
        let r = Replayer::new(order, 100, 4, 4).unwrap();
        // First window: places 0..4 with place 2 (folio 12) left unread.
        assert_eq!(r.next_window(), Some(vec![10..12, 13..14]));
        assert!(!r.on_fault(11), "before the marker");
        assert!(r.on_fault(12), "the marker asks for the next window");
        assert_eq!(r.next_window(), Some(vec![40..42, 3..4]));
        // The last window has no marker.
        assert!(r.on_fault(2));
        let last = vec![std::ops::Range { start: 90, end: 92 }];
        assert_eq!(r.next_window(), Some(last));
        assert_eq!(r.next_window(), None);
        for idx in [10, 11, 13, 40, 90] {
            r.read_one(idx);
        }
        assert!(!r.on_evict(40), "reached: not wasted");
        assert!(r.on_evict(90), "evicted before the program got there");
        assert!(!r.on_evict(90), "counted once");
        assert_eq!(
            r.take_hits(),
            4,
            "places 0, 1, 3, 4 are below the furthest fault"
        );
        assert_eq!(r.take_hits(), 0, "counted once");

        let d = Replayer::new((0..1000).collect(), 2000, 8, 8).unwrap();
        assert!(d.next_window().is_some());
        assert!(!d.on_fault(500), "far ahead of the replay: out of step");
        assert_eq!(d.reached.load(Relaxed), 0, "and no progress");
        assert!(d.on_fault(9), "in step, past the marker");
        assert!(!d.left());
        for idx in 1000..1000 + DIVERGED_MIN as usize {
            assert!(!d.on_fault(idx));
        }
        assert!(d.left(), "left before any window said so");
        assert_eq!(d.next_window(), None, "diverged: replay stops");
        assert!(d.left());
    }

    #[test]
    fn long_runs_are_left_to_readahead_and_still_pace_replay() {
        // A run of 6 (places 1..7), scattered folios, a run of 3.
        let order: Vec<usize> = vec![50, 10, 11, 12, 13, 14, 15, 90, 130, 131, 132];
        let mut r = Replayer::new(order, 100, 11, 11).unwrap();
        r.leave_runs_to_readahead(4);
        // One window of everything (no marker in the last): the run of 6
        // is readahead's, the run of 3 is read.
        assert_eq!(r.next_window(), Some(vec![50..51, 90..91, 130..133]));
        let mut r = Replayer::new(vec![1, 2, 3, 4, 99, 77, 55], 100, 4, 4).unwrap();
        r.leave_runs_to_readahead(4);
        // Window 0..4, marker place 2 (folio 3): all streamed, nothing
        // read; a fault in the run still asks for the next window.
        assert_eq!(r.next_window(), Some(vec![]));
        assert!(r.on_fault(3), "the marker, in a streamed run");
        assert_eq!(r.next_window(), Some(vec![99..100, 77..78, 55..56]));
    }

    #[test]
    fn streams_interleaved_by_threads_are_told_apart() {
        let marked = |order: &[usize], min: usize| {
            let mut v = Vec::new();
            long_streams(order, min, |q| v.push(q));
            v.sort_unstable();
            v
        };
        // Two threads streaming their halves (one with a gap of 3: folios
        // needed earlier), their windows interleaved in the trace, and
        // scattered folios between: the stream of 8 entries is long, the
        // one of 4 and the lone folios are not.
        let order = vec![0, 1, 2, 500, 501, 3, 4, 900, 502, 7, 8, 503, 80, 9];
        assert_eq!(marked(&order, 5), vec![0, 1, 2, 5, 6, 9, 10, 13]);
        assert_eq!(
            marked(&order, 4),
            vec![0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 13]
        );
        let mut r = Replayer::new(order, 1000, 14, 14).unwrap();
        r.leave_runs_to_readahead(5);
        assert_eq!(
            r.next_window(),
            Some(vec![500..502, 900..901, 502..504, 80..81])
        );
        // Past STREAMS live streams the oldest is forgotten: a stream that
        // comes back after 8 others is a new one.
        let mut order: Vec<usize> = vec![0];
        order.extend((1..=STREAMS).map(|k| k * 1000));
        order.push(1);
        assert_eq!(marked(&order, 2), Vec::<usize>::new());
        order.insert(STREAMS, 1); // back before the eighth other one
        assert_eq!(marked(&order, 2), vec![0, STREAMS]);
        // Descending and far steps start new streams.
        assert_eq!(marked(&[10, 9, 60, 61], 2), vec![2, 3]);
        // Steps up to STREAM_GAP continue a stream, longer ones do not.
        assert_eq!(marked(&[0, STREAM_GAP, STREAM_GAP * 3], 2), vec![0, 1]);
    }
}
