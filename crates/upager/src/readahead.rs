//! Readahead: which folios a fill claims after the faulting one, and when
//! a fault asks the prefetch thread for the next window.
//!
//! Readahead (read faults only: read-ahead folios are installed
//! write-protected, so a writer would pay an unprotect flush for each): when
//! the two folios before the faulting one are resident (a sequential
//! stream, whatever thread runs it), the fill also claims the
//! following non-resident folios, up to twice the run of resident folios
//! before the fault and at most the configured readahead: the window grows
//! 2, 4, 8, … like the kernel's context readahead, with no per-stream state
//! ([`Shared::claim_readahead`]). A window is cut at the end of the store
//! and of the faulting folio's shard (one `UFFDIO_COPY` fills it, inside
//! one registration), and, with mixed folio sizes (huge.rs), once grown to
//! 2 MiB, at the end of the faulting folio's 2 MiB run. A full window (and
//! an async one) ends where the store's offset is a multiple of its size
//! ([`Shared::window_aligned_end`]): after a stream's first, its windows
//! are aligned, as a server's chunks are.
//!
//! Async readahead (`readahead_async`, on by default): a fault
//! whose window has grown to the full readahead asks the prefetch thread
//! for the next window ([`Shared::ask_next_window`], through
//! `Shared::ask_ahead`: a free slot of eight takes its address, a futex
//! doorbell wakes the thread; async-signal-safe) before it reads its own,
//! so the two windows are read on two CPUs at once, and the stream's next
//! fault comes two windows on. The prefetch thread reads the window
//! through the pipeline every read ahead takes (ahead.rs: a whole run as
//! one huge page where the region fills runs), unless its first folio is
//! taken already. Asking one window ahead balances the two CPUs best when
//! reading a window costs more than working on it (a numpy sum over data
//! decompressed from zram: 1.4 ms against 0.2 ms per 2 MiB).
//!
//! On a store whose reads are round trips (`Store::round_trips`), a
//! stream whose fault waits for a folio of a window still being read
//! notes it ([`Shared::note_reached`]) and asks for the next window at
//! once, which the other window reader (the prefetch thread or the
//! window thread, ahead.rs) reads while this one is read: two windows in
//! flight (the kernel's readahead marker, with the one access a
//! userfaultfd pager sees: a fault). A stream that reaches a window just
//! as its reader is done (the reader no longer says so) is still seen by
//! the reader's check of the note, which then asks for the next.
//!
//! Ordering: each folio is claimed (CAS to BUSY) only after its budget is
//! charged without reclaim; a claim that fails gives its charge back and
//! ends the window there (a window is consecutive folios). Nothing here
//! allocates or blocks (a SIGBUS handler runs it).
//!
//! Counters: none of its own (the fill counts `fills_readahead`, the
//! prefetch thread `readahead_async`).
//!
//! Uses: `area`, `budget`, `folio`, `shared`.

use crate::area::Area;
use crate::folio::{self, Kind, State};
use crate::shared::Shared;
use std::sync::atomic::Ordering::SeqCst;

impl Shared {
    /// Claims up to the readahead window of non-resident folios after `idx`
    /// (file regions only), each with budget reserved without reclaiming.
    /// Pushes their old states to `out` (whose capacity the window never
    /// exceeds: no allocation).
    pub(crate) fn claim_readahead(&self, r: &Area, idx: usize, out: &mut Vec<State>) {
        let max = self.window_max(r);
        if r.is_anon() || self.cfg.readahead < r.folio || idx == 0 {
            return;
        }
        let mut run = 0;
        // BUSY counts: the COPY of the previous run wakes the faulting thread
        // before its filler publishes CLEAN.
        while run < max
            && run < idx
            && matches!(
                folio::load(r.state(idx - 1 - run)).kind(),
                Kind::Clean | Kind::Dirty | Kind::Busy
            )
        {
            run += 1;
        }
        // One resident predecessor is weak evidence: with 1/8 of a file
        // resident, random faults see one 1/8 of the time (15-17% of fills
        // were readahead in the random-read benchmark). Two in a row is a
        // stream (1/64 by chance).
        if run < 2 {
            return;
        }
        let mut end = self.window_end(r, idx, idx + 1 + (2 * run).min(max - 1));
        // A full window ends where the store's offsets reach a multiple of
        // its size, so the stream's next windows are aligned ones.
        if 2 * run >= max - 1 {
            end = end.min(self.window_aligned_end(r, idx, max));
        }
        // Mixed folio sizes: once the window has grown to 2 MiB, it ends
        // at the end of the faulting folio's 2 MiB run, so the stream's
        // next fault starts a run, which fill_claimed fills as one huge
        // page (a whole run claimed from its first folio). A run cut by
        // the end of the file or a resident folio stays base folios.
        if r.run_folios > 0 && 2 * run >= r.run_folios {
            end = end.min(r.run_start(idx) + r.run_folios);
        }
        self.claim_free(r, idx + 1..end, out);
    }

    /// Folios in a full readahead window of `r` (the faulting one
    /// included): the configured readahead, bounded by the fill buffer;
    /// at least 1.
    pub(crate) fn window_max(&self, r: &Area) -> usize {
        ((self.cfg.readahead / r.folio) as usize)
            .min(self.fill_buf_bytes() / r.folio as usize)
            .max(1)
    }

    /// The end of a window of `want` folios from `idx`, cut at the first
    /// folio after `idx` whose store offset is a multiple of the window's
    /// bytes: a stream's windows, each asked for where the last ended,
    /// are then aligned after its first. Servers keep objects in chunks
    /// (SeaweedFS: 4 MiB; a multipart object: its parts), and one
    /// compressed chunk is decompressed whole for every GET that touches
    /// it: a pass's 8 MiB windows from 3.375 MiB touched 1.45 chunks per
    /// chunk of the object (docs/benchmarks.md, "Aligned windows and
    /// chained windows for an S3 pass").
    ///
    /// A region that fills 2 MiB runs (huge.rs) keeps its windows on its
    /// runs, which are aligned in the view: there the window is not cut.
    pub(crate) fn window_aligned_end(&self, r: &Area, idx: usize, want: usize) -> usize {
        if r.run_folios > 0 {
            return idx + want;
        }
        let bytes = want as u64 * r.folio;
        let off = r.store_off + idx as u64 * r.folio;
        idx + ((bytes - off % bytes) / r.folio).max(1) as usize
    }

    /// `end` of a window from `idx`, cut at the end of the store and of
    /// `idx`'s shard (a window is filled by one UFFDIO_COPY, which must
    /// stay inside one registration).
    pub(crate) fn window_end(&self, r: &Area, idx: usize, end: usize) -> usize {
        let end_folio = r.store.len().saturating_sub(r.store_off).div_ceil(r.folio) as usize;
        end.min(r.shard_end(idx)).min(end_folio)
    }

    /// Claims the non-resident folios of `span` in order, each with budget
    /// reserved without reclaiming, up to the first that is resident or
    /// busy or does not fit; pushes their old states to `out`.
    pub(crate) fn claim_free(&self, r: &Area, span: std::ops::Range<usize>, out: &mut Vec<State>) {
        for j in span {
            if !self.budget.try_charge(r.folio) {
                break;
            }
            match folio::try_claim(r.state(j), |s| {
                matches!(s.kind(), Kind::Never | Kind::Evicted)
            }) {
                Some(o) => out.push(o),
                None => {
                    self.budget.uncharge(r.folio);
                    break;
                }
            }
        }
    }

    /// Async readahead kept going on a store whose reads are round trips
    /// (`Store::round_trips`): a fault that waits for BUSY folio `idx`,
    /// the two folios before it resident, is a stream that reached a
    /// window still being read. It notes where (`Ahead::reached`: the
    /// reader, its window done, asks for the next, ahead.rs `fill_ahead`)
    /// and, if a window reader says it is reading that window
    /// (`Ahead::reading`), asks for the next window now, which the other
    /// reader reads while this one is read — the kernel's
    /// readahead marker: the next window is asked for when the stream
    /// reaches one, not when it has passed it. Not for local
    /// stores: there the stream's own faults read every other window on
    /// the second CPU (a read is CPU work), which chaining would take
    /// away. Noted before the fault registers as a waiter, so that the
    /// window's filler, which releases the folio after that, sees it.
    /// Async-signal-safe.
    pub(crate) fn note_reached(&self, r: &Area, idx: usize) {
        if !self.cfg.readahead_async || r.is_anon() || idx < 2 || !r.store.round_trips() {
            return;
        }
        let resident =
            |k: usize| matches!(folio::load(r.state(k)).kind(), Kind::Clean | Kind::Dirty);
        if !(resident(idx - 1) && resident(idx - 2)) {
            return;
        }
        let addr = r.folio_addr(idx);
        self.ahead.reached.store(addr, SeqCst);
        // A window a reader is reading now: the next one goes to the other
        // reader at once, so that two are in flight while the stream waits
        // for this one. (`past` is inside the region: fill_ahead registers
        // no window that ends the region.)
        for w in &self.ahead.reading {
            let past = w.past.load(SeqCst);
            if (w.first.load(SeqCst)..past).contains(&addr) {
                let _ = self.ask_window(r, past);
            }
        }
    }

    /// Async readahead: after a fault claimed the `n` folios of a window
    /// from `idx` (`old`: the faulting folio's previous state), asks the
    /// prefetch thread for the next window if this one has grown to its
    /// largest.
    pub(crate) fn ask_next_window(&self, r: &Area, idx: usize, old: State, n: usize) {
        // A window grown to its largest is a stream; the prefetch thread
        // reads the next window on another CPU while this fault reads this
        // one (and while the stream works on it), so the stream's faults
        // read every other window. (Asking for one window ahead balances
        // the two CPUs best: the stream's next fault comes two windows on,
        // and reads in parallel again.)
        if n > 1 && n >= self.window_max(r) && self.cfg.readahead_async {
            let next = idx + n;
            if next < r.nfolios() && r.store_offset(next, old).is_some_and(|o| o < r.store.len()) {
                let _ = self.ask_window(r, r.folio_addr(next));
            }
        }
    }
}
