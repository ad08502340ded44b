//! Reading ahead: one pipeline for every read issued before an access
//! asks for its folio.
//!
//! Four sources decide WHAT to read ahead; [`Shared::read_ahead`] decides
//! HOW, for all of them:
//! - Async readahead windows (readahead.rs): a stream's fault posts the
//!   address of its next window (`Shared::ask_ahead`, eight slots and a
//!   futex doorbell); the prefetch thread passes the window's folios
//!   ([`Shared::fill_ahead`]) unless the stream, or anyone, got to its
//!   first folio first. The window is the readahead (2 MiB by default);
//!   on a store whose reads are round trips, a prefetch batch
//!   ([`FETCH_BATCH_BYTES`]): its reads in flight together (the S3
//!   store cuts it in GETs of its part size) in the buffer such a batch
//!   uses anyway, the folios charged to the budget as any; a window the
//!   stream reached while it was read is followed by the next at once
//!   (readahead.rs, `note_reached`), read by the other window reader
//!   (the window thread, [`Shared::window_main`]), so that two windows
//!   are in flight; and once read, by the next window neither reader has
//!   (the one after the next, if the other reader has the next), so that
//!   two windows asked together are not done together with none after.
//!   A window whose folio before it is neither resident nor being read is
//!   not read: a stream's window follows its last (an ask served after the
//!   stream had passed, its folios evicted, read them again).
//!   A window ends where the store's offsets reach a multiple of its
//!   size (readahead.rs, `window_aligned_end`): a stream's windows are
//!   aligned after its first, as a server's chunks are.
//! - Warm-start replay windows (warm.rs, [`Shared::replay_step`]): the
//!   trace's next window, as runs of folios in recorded order.
//! - Prefetch requests (`Region::prefetch`, `WILLNEED`: advice.rs), in the
//!   prefetch thread.
//! - `Region::fetch` and `fetch_for_write` (advice.rs), in the caller's
//!   thread, which waits for them.
//!
//! The pipeline, a batch at a time (batches of [`PREFETCH_BATCH_BYTES`] of
//! folios; [`FETCH_BATCH_BYTES`] where the store's reads are round trips,
//! `Store::round_trips`, and for a caller's fetch; a readahead window is
//! one batch): room (at most one batch of reclaim per batch; on a network
//! store room for the whole batch, so that it is one read: the reclaim a
//! batch read in parts would take anyway) → claim the
//! batch's non-resident folios, each charged to the budget without
//! reclaim before it is claimed (BUSY) → read them with one
//! [`Store::read_batch`](crate::Store::read_batch) (a network store sends
//! them together: one round trip per server, many in flight; folios whose
//! store bytes are adjacent are one read, `read_runs`) → install each run
//! of adjacent folios with the fill's own steps (fill.rs, `fill_claimed`:
//! one `UFFDIO_COPY` per run, `install_run`). A whole 2 MiB run of a
//! region that fills runs (huge.rs), all of it non-resident, is claimed
//! whole and filled as one huge page. A merged read that fails is read
//! again folio by folio, so a bad folio costs only itself; a folio whose
//! read failed goes back to its old state (waking waiters; a later fault
//! reads it again and gets the error itself). `fetch_for_write`'s folios
//! go in as write fills ([`Install::Write`]): one at a time, writable and
//! DIRTY, claimed only while the dirty limit has room (else
//! `balance_dirty` first, as a write fault). A request stops when a batch
//! of reclaim frees nothing (reading ahead must not push out the working
//! set wholesale).
//!
//! A fault's own readahead window (sync readahead) is claimed by the same
//! window policy (readahead.rs, `claim_readahead`) but read by the fault,
//! with the faulting folio in one read into the fault's buffer: a SIGBUS
//! handler may run it, where the pipeline's batches (which allocate) may
//! not.
//!
//! The window thread ([`Shared::window_main`]) serves the windows of
//! network stores only, beside the prefetch thread, so that a stream's
//! next window is read while the prefetch thread reads this one; each
//! reader says which window it is reading (`Ahead::reading`) for a stream
//! that reaches it. The prefetch thread ([`Shared::prefetch_main`]) serves windows first:
//! between the batches of a request (a replay window runs to 64 MiB) it
//! fills the readahead windows posted meanwhile, as a stream needs its
//! next window sooner than the request its next batch. The batch buffer
//! is kept from batch to batch (`take_pre_buf`) until the thread idles.
//! Unmap waits for a request (it holds the region in flight): it stops at
//! the next batch once the region is dying.
//!
//! Lock order: none of its own (a fill's: fill.rs).
//!
//! Counters: `readahead_async` (windows filled), `replay_reads`,
//! `replay_hits`, `read_errors`, `bytes_read` (and a fill's,
//! `fills_readahead` among them).
//!
//! Uses: `area`, `fill`, `folio`, `gather`, `readahead`, `reclaim`,
//! `shared`, `store`, `thp`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use upager_sys::futex;

use crate::area::Area;
use crate::fill::{Claimed, Outcome};
use crate::folio::{self, Kind, State};
use crate::shared::{Ctx, Shared, IDLE};

/// Bytes of folios a prefetch request reads with one `Store::read_batch`
/// (1 MiB: 16 folios of 64 KiB; a guess that bounds the prefetch thread's
/// extra buffer; measured for replay from a file: batches of 4 MiB were
/// worse, the program waiting on folios claimed early and installed
/// late, of 256 KiB no better). A store whose reads are round trips
/// ([`Store::round_trips`](crate::Store::round_trips)) gets
/// [`FETCH_BATCH_BYTES`] instead: one batch's reads are in flight
/// together, and 1 MiB was one GET of an object store at a time.
pub(crate) const PREFETCH_BATCH_BYTES: u64 = 1 << 20;

/// Bytes of folios one `Store::read_batch` of [`Region::fetch`] reads: a
/// gather's caller waits for its reads, so a batch is larger than a
/// background prefetch's (8 MiB: 128 GETs of 64 KiB folios for an object
/// store, 16 at a time), a buffer freed when the call returns.
///
/// [`Region::fetch`]: crate::Region::fetch
pub(crate) const FETCH_BATCH_BYTES: u64 = 8 << 20;

/// Bytes of folios of `r` a background prefetch or replay batch reads:
/// [`FETCH_BATCH_BYTES`] where the store's reads are round trips, else
/// [`PREFETCH_BATCH_BYTES`].
fn prefetch_batch_bytes(r: &Area) -> u64 {
    if r.store.round_trips() {
        FETCH_BATCH_BYTES
    } else {
        PREFETCH_BATCH_BYTES
    }
}

/// How [`Shared::read_ahead`] installs the folios it reads.
#[derive(Clone, Copy)]
pub(crate) enum Install<'a> {
    /// CLEAN, write-protected, in runs of adjacent folios (readahead,
    /// prefetch, replay, a gather): a later write faults as on any clean
    /// folio.
    Read,
    /// DIRTY and writable, one folio at a time, as a write fault's fill,
    /// for a caller about to write every folio it names (a scatter): its
    /// writes then fault no more. The function gives the one 4 KiB page
    /// of folio `idx` to be written (`None`: more than one), which a region
    /// that dirties pages makes writable alone (DIRTY|PARTIAL, dirty.rs).
    /// Under the dirty limit as a write fault is (`balance_dirty`). Where a
    /// write fault would fill for reading (a file with several writers
    /// keeps twins; 2 MiB folios), the folios go in as `Read`.
    Write(&'a dyn Fn(usize) -> Option<u64>),
}

/// How [`Shared::read_ahead`] reads one source's folios.
#[derive(Clone, Copy)]
pub(crate) struct Batches<'a> {
    /// Bytes of folios one `Store::read_batch` reads (a 2 MiB folio is
    /// read alone, into its staged huge page).
    pub bytes: u64,
    /// How the folios go in.
    pub install: Install<'a>,
    /// In the prefetch thread, serve the readahead windows posted
    /// meanwhile between batches (a request's; a window's own read does
    /// not stop for another window).
    pub windows_between: bool,
}

impl Shared {
    /// Body of the prefetch thread: fills the readahead windows faults ask
    /// for ([`Shared::ask_ahead`], async readahead) and requested folios
    /// that are not resident, as a fault would, without a faulting thread.
    /// Stops a request when the budget is full after one batch of reclaim.
    /// Windows go first, between requests (a stream is waiting for them; a
    /// request in progress, such as a long `WILLNEED`, is finished first,
    /// and a stream reaching a window not read yet reads it itself).
    pub(crate) fn prefetch_main(
        self: Arc<Self>,
        rx: std::sync::mpsc::Receiver<crate::shared::PrefetchRequest>,
    ) {
        let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
        ctx.prefetcher = true;
        loop {
            let bell = self.ahead.bell.load(Ordering::Acquire);
            let mut worked = self.serve_windows(&mut ctx, true);
            match rx.try_recv() {
                Ok(req) => {
                    self.prefetch_one(&mut ctx, req);
                    self.prefetch_pending.fetch_sub(1, Ordering::AcqRel);
                    worked = true;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            }
            if self.stopping() {
                return;
            }
            if !worked && !futex::wait(&self.ahead.bell, bell, Some(IDLE)) {
                self.shrink_ctx(&mut ctx);
            }
        }
    }

    /// Body of the window thread, the second window reader: serves the
    /// async readahead windows of stores whose reads are round trips, so
    /// that a stream there has two windows in flight (the next one asked
    /// for when the stream reaches the one being read: readahead.rs,
    /// `note_reached`), each one GET or more, where one thread kept one
    /// in flight and the stream waited for each (a 1 GiB pass over an S3
    /// object: 8 MiB windows of 15 ms back to back, the stream working
    /// on each for under 1 ms). Leaves every other window, and replay
    /// steps, to the prefetch thread.
    pub(crate) fn window_main(self: Arc<Self>) {
        let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
        ctx.reader = 1;
        loop {
            let bell = self.ahead.window_bell.load(Ordering::Acquire);
            let worked = self.serve_windows(&mut ctx, false);
            if self.stopping() {
                return;
            }
            if !worked && !futex::wait(&self.ahead.window_bell, bell, Some(IDLE)) {
                self.shrink_ctx(&mut ctx);
            }
        }
    }

    /// Serves the posted readahead windows (`replay_too`: and replay
    /// steps; else those stay posted, for when the request in progress,
    /// which may be the replay, is done; the window thread, reader 1,
    /// serves network stores' windows only). Whether it served any.
    fn serve_windows(&self, ctx: &mut Ctx, replay_too: bool) -> bool {
        let mut worked = false;
        for slot in &self.ahead.slots {
            let addr = slot.load(Ordering::Acquire);
            if addr == 0 || (!replay_too && addr & 1 == 1) || self.stopping() {
                continue;
            }
            if ctx.reader > 0
                && !self
                    .table
                    .lookup(addr)
                    .is_some_and(|r| r.store.round_trips())
            {
                continue;
            }
            if slot
                .compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.fill_ahead(ctx, addr);
                worked = true;
            }
        }
        worked
    }

    /// Async readahead: reads the window from `addr` that a sequential
    /// stream's fault asked for (`ask_next_window`) through
    /// [`Shared::read_ahead`] as one batch — a whole 2 MiB run where the
    /// region fills runs (the pipeline fills it as one huge page), else up
    /// to the readahead window of its folios — unless the stream, or
    /// anyone, got to its first folio first.
    fn fill_ahead(&self, ctx: &mut Ctx, addr: u64) {
        if addr & 1 == 1 {
            // Not a window: a warm-start replay asks for its next one.
            return self.replay_step(ctx, addr & !1);
        }
        let Some(r) = self.table.lookup(addr) else {
            return;
        };
        let idx = ((addr - r.base()) >> r.shift) as usize;
        if r.pool.is_some() {
            return self.fill_pooled_ahead(ctx, &r, idx);
        }
        let kind = |k: usize| folio::load(r.state(k)).kind();
        if idx >= r.nfolios() || r.is_anon() || !matches!(kind(idx), Kind::Never | Kind::Evicted) {
            return;
        }
        // A stream's window follows folios resident or being read. One
        // asked for twice was read at the first ask; the second, served
        // after the stream had passed and its folios were evicted, read
        // them again (a test's 128 MiB stream: 128-384 folios twice in 2
        // of 8 runs): not read.
        if idx > 0 && !matches!(kind(idx - 1), Kind::Busy | Kind::Clean | Kind::Dirty) {
            return;
        }
        let n = r.run_folios;
        let want = if n > 0 && idx.is_multiple_of(n) {
            n
        } else if r.store.round_trips() {
            // A network store: the batch a prefetch reads there, its reads
            // in flight together (one GET of 2 MiB a window kept a pass
            // over an S3 object to two GETs in flight), in the buffer such
            // a batch uses anyway; the folios are in the budget as any.
            ((prefetch_batch_bytes(&r) / r.folio) as usize).max(self.window_max(&r))
        } else {
            self.window_max(&r)
        };
        let end = self.window_end(&r, idx, self.window_aligned_end(&r, idx, want));
        if end <= idx {
            return; // past the end of the store (truncated meanwhile)
        }
        let how = Batches {
            bytes: (end - idx) as u64 * r.folio,
            install: Install::Read,
            windows_between: false,
        };
        let (first, past) = (r.folio_addr(idx), r.folio_addr(end));
        // Where a stream reaching it finds it (readahead.rs, `note_reached`):
        // set before its folios are claimed, cleared once they went in.
        let reading = &self.ahead.reading[ctx.reader];
        let network = r.store.round_trips() && end < r.nfolios();
        if network {
            reading.first.store(first, Ordering::SeqCst);
            reading.past.store(past, Ordering::SeqCst);
        }
        if self.read_ahead(ctx, &r, idx..end, how, &mut |_| {}) > 0 {
            self.counters.readahead_async.inc();
        }
        if network {
            reading.past.store(0, Ordering::SeqCst);
        }
        // A stream that reached this window while it was read: the next
        // window not yet read or being read, now (within two windows: the
        // one after this, if the other reader has it already, as when the
        // stream asked for it at once). Without the skip, two windows
        // asked together were done together, the stream read through
        // both and faulted at the next (a 1 GiB S3 pass: 25-33 faults).
        let reached = &self.ahead.reached;
        let at = reached.load(Ordering::SeqCst);
        if (first..past).contains(&at)
            && reached
                .compare_exchange(at, 0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            && end < r.nfolios()
        {
            let limit = self.window_end(&r, end, end + 2 * want);
            if let Some(next) =
                (end..limit).find(|&k| matches!(kind(k), Kind::Never | Kind::Evicted))
            {
                let _ = self.ask_window(&r, r.folio_addr(next));
            }
        }
    }

    /// Fills the folios of one prefetch request through
    /// [`Shared::read_ahead`].
    fn prefetch_one(&self, ctx: &mut Ctx, req: crate::shared::PrefetchRequest) {
        let Some(r) = crate::area::Inflight::enter(&req.region) else {
            return;
        };
        let how = Batches {
            bytes: prefetch_batch_bytes(&r),
            install: Install::Read,
            windows_between: true,
        };
        self.read_ahead(ctx, &r, req.folios, how, &mut |_| {});
    }

    /// Warm-start replay (warm.rs): reads the next window of the trace of
    /// the region at `base` through [`Shared::read_ahead`], unless the
    /// replay is done or stopped; counts the hits its last windows had.
    fn replay_step(&self, ctx: &mut Ctx, base: u64) {
        let Some(r) = self.table.lookup(base) else {
            return;
        };
        let Some(rp) = r.warm.as_ref().and_then(|w| w.replay()) else {
            return;
        };
        self.counters.replay_hits.add(rp.take_hits());
        let Some(runs) = rp.next_window() else {
            return;
        };
        let how = Batches {
            bytes: prefetch_batch_bytes(&r),
            install: Install::Read,
            windows_between: true,
        };
        let flat = runs.into_iter().flatten();
        ctx.replaying = true;
        let read = self.read_ahead(ctx, &r, flat, how, &mut |idx| rp.read_one(idx));
        ctx.replaying = false;
        self.counters.replay_reads.add(read);
    }

    /// The pipeline (see the module's comment): fills `folios` of `r` (in
    /// flight) that are not resident, in their order, a batch at a time —
    /// room, claim, one [`Store::read_batch`], install — as `how` says.
    /// When the budget has no room even after a batch of reclaim, the
    /// request ends; when a folio cannot be charged while reclaim still
    /// frees room, it goes the way of a fault (fill reserves, reclaiming).
    /// `on_read(idx)` for each folio filled; returns how many.
    ///
    /// [`Store::read_batch`]: crate::Store::read_batch
    pub(crate) fn read_ahead(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        folios: impl IntoIterator<Item = usize>,
        how: Batches<'_>,
        on_read: &mut dyn FnMut(usize),
    ) -> u64 {
        let per_batch = if r.folio >= crate::thp::HUGE {
            1 // staged huge pages read into their own buffers
        } else {
            (how.bytes / r.folio).max(1) as usize
        };
        // Write installs: writable regions below 2 MiB folios whose writes
        // keep no twins (a twin is made by the write-protect fault).
        let pages = match how.install {
            Install::Write(pages) if r.writable && r.folio < crate::thp::HUGE && !r.twinning() => {
                Some(pages)
            }
            _ => None,
        };
        // The dirty limit, as a write fault keeps it (a file's folios).
        let limited = pages.is_some() && !r.is_anon();
        // Whole 2 MiB runs as huge pages (read installs of a region that
        // fills runs): a batch ends at a run's first folio, so that the
        // next one can see the whole run queued.
        let run = if pages.is_none() { r.run_folios } else { 0 };
        let nfolios = r.nfolios();
        let mut folios = folios.into_iter().filter(|&i| i < nfolios);
        let cap = per_batch.max(run);
        let mut queue: VecDeque<usize> = VecDeque::with_capacity(cap);
        let mut claimed: Vec<(usize, State)> = Vec::with_capacity(per_batch);
        let mut run_olds: Vec<State> = Vec::with_capacity(per_batch);
        let mut read = 0;
        let mut first = true;
        loop {
            let room = cap - queue.len();
            queue.extend(folios.by_ref().take(room));
            if queue.is_empty() {
                return read;
            }
            // Unmap waits for this request (it holds the region in flight):
            // stop at the next batch once the region is dying.
            if self.stopping() || r.dying.load(Ordering::SeqCst) {
                return read;
            }
            // A stream's async readahead window posted meanwhile goes
            // first: the stream needs it sooner than this request's next
            // batch (a replay window runs to 64 MiB).
            if how.windows_between && ctx.prefetcher && !std::mem::take(&mut first) {
                // (A stream's window is the program's fill, not replay's.)
                let replaying = std::mem::take(&mut ctx.replaying);
                self.serve_windows(ctx, false);
                ctx.replaying = replaying;
            }
            let whole = whole_run_queued(&queue, run);
            // Make room by evicting at most one batch per batch; stop when
            // even that frees nothing (reading ahead must not push out the
            // working set wholesale).
            let need = r.folio * if whole { run as u64 } else { 1 };
            if !self.budget.fits(need) && self.evict_batch(crate::gather::Mode::Background) == 0 {
                return read;
            }
            // On a network store a batch is one GET only if it is claimed
            // whole: room for all of it, the same bytes evicted as for its
            // parts (a 1 GiB pass over an S3 object: 195 GETs for 128
            // windows of 8 MiB when each took the room there was); at most
            // a quarter of the budget, so that a batch never empties it.
            if r.store.round_trips() {
                let all =
                    (r.folio * queue.len().min(per_batch) as u64).min(self.budget.limit() / 4);
                while !self.budget.fits(all)
                    && self.evict_batch(crate::gather::Mode::Background) > 0
                {}
            }
            if whole {
                if let Some(n) = self.fill_run_ahead(ctx, r, queue[0]) {
                    // (n counts the run's folios from its first that went
                    // in: all, 1, or none if the fill failed.)
                    for j in queue.drain(..run).take(n as usize) {
                        on_read(j);
                    }
                    read += n;
                    continue;
                }
            }
            claimed.clear();
            while claimed.len() < per_batch {
                let Some(&next) = queue.front() else {
                    break;
                };
                if run > 0 && !claimed.is_empty() && next.is_multiple_of(run) {
                    break; // a run's first folio starts the next batch
                }
                if limited
                    && !self
                        .budget
                        .dirty_fits_beside(claimed.len() as u64 * r.folio, r.folio)
                {
                    if !claimed.is_empty() {
                        break; // this batch first: its write-back frees room
                    }
                    if !self.balance_dirty(r) {
                        return read; // the store refuses writes: the writes fault
                    }
                }
                if !self.budget.try_charge(r.folio) {
                    break;
                }
                match folio::try_claim(r.state(next), |s| {
                    matches!(s.kind(), Kind::Never | Kind::Evicted)
                }) {
                    Some(old) => claimed.push((next, old)),
                    None => self.budget.uncharge(r.folio),
                }
                queue.pop_front();
            }
            if claimed.is_empty() {
                if !self.budget.fits(r.folio) {
                    // No room without reclaim: one folio as a fault would.
                    let next = queue.pop_front().expect("the queue was not empty");
                    if let Some(old) = folio::try_claim(r.state(next), |s| {
                        matches!(s.kind(), Kind::Never | Kind::Evicted)
                    }) {
                        if self.fill(ctx, r, next, old, None, true) == Outcome::Done {
                            on_read(next);
                            read += 1;
                        }
                    }
                }
                continue;
            }
            read += self.read_batch_in(ctx, r, &claimed, pages, &mut run_olds, on_read);
        }
    }

    /// Claims the whole 2 MiB run from `start` (`claim_run_ahead`) and
    /// fills it as one huge page (fill.rs takes a staged huge page for a
    /// whole run). How many folios it filled; `None` if the run could not
    /// be claimed whole.
    fn fill_run_ahead(&self, ctx: &mut Ctx, r: &Arc<Area>, start: usize) -> Option<u64> {
        let mut extras = std::mem::take(&mut ctx.extras);
        extras.clear();
        let filled = self.claim_run_ahead(r, start, &mut extras).map(|old| {
            let c = Claimed {
                r,
                idx: start,
                old,
                extras: &extras,
                write: false,
                page: None,
                prefetch: true,
            };
            if self.fill_claimed(ctx, &c) != Outcome::Done {
                return 0;
            }
            // A run whose read failed was cut to its first folio, read
            // again alone (fill.rs): then its last folio is not resident.
            let last = start + extras.len();
            match folio::load(r.state(last)).kind() {
                Kind::Clean | Kind::Dirty => 1 + extras.len() as u64,
                _ => 1,
            }
        });
        ctx.extras = extras;
        filled
    }

    /// Claims all folios of the 2 MiB run from `start` (mixed folio
    /// sizes) if every one is non-resident and the budget has room without
    /// reclaim: the first one's old state is returned, the others' pushed
    /// to `out`. Nothing is claimed (or charged) otherwise.
    pub(crate) fn claim_run_ahead(
        &self,
        r: &Area,
        start: usize,
        out: &mut Vec<State>,
    ) -> Option<State> {
        let n = r.run_folios;
        let end_folio = r.store.len().saturating_sub(r.store_off).div_ceil(r.folio) as usize;
        let gone = |k: usize| matches!(folio::load(r.state(k)).kind(), Kind::Never | Kind::Evicted);
        if start + n > end_folio.min(r.nfolios())
            || r.shard_end(start) < start + n
            || !(start..start + n).all(gone)
            || !self.budget.try_charge(r.folio * n as u64)
        {
            return None;
        }
        let pred = |s: State| matches!(s.kind(), Kind::Never | Kind::Evicted);
        let mut first = None;
        for k in start..start + n {
            match folio::try_claim(r.state(k), pred) {
                Some(o) if k == start => first = Some(o),
                Some(o) => out.push(o),
                None => {
                    // Someone else got there: give back what was claimed.
                    for (j, o) in first.iter().chain(out.iter()).enumerate() {
                        let prev = folio::release(r.state(start + j), |_| *o);
                        self.wake_if_waiter(r, start + j, prev);
                    }
                    out.clear();
                    self.budget.uncharge(r.folio * n as u64);
                    return None;
                }
            }
        }
        first
    }

    /// Reads one claimed batch (`prefetch_read`) and installs it: each run
    /// of adjacent folios read fine as one fill (`install_run`), a write
    /// install one folio at a time (`pages`: the page each write is for);
    /// a folio whose read failed goes back to its old state. `on_read(idx)`
    /// for each folio filled; returns how many.
    fn read_batch_in(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        claimed: &[(usize, State)],
        pages: Option<&dyn Fn(usize) -> Option<u64>>,
        run_olds: &mut Vec<State>,
        on_read: &mut dyn FnMut(usize),
    ) -> u64 {
        let ok = self.prefetch_read(ctx, r, claimed);
        let mut read = 0;
        let mut k = 0;
        while k < claimed.len() {
            let (idx, old) = claimed[k];
            if !ok[k] {
                self.counters.read_errors.inc();
                self.budget.uncharge(r.folio);
                let prev = folio::release(r.state(idx), |_| old);
                self.wake_if_waiter(r, idx, prev);
                k += 1;
                continue;
            }
            // Adjacent folios of the batch, read fine, go in as one run
            // (one UFFDIO_COPY), as a fault's readahead window does; a
            // write install is one folio at a time, as a write fill.
            let n = if pages.is_none() {
                install_run(r, &claimed[k..], &ok[k..])
            } else {
                1
            };
            run_olds.clear();
            run_olds.extend(claimed[k + 1..k + n].iter().map(|&(_, o)| o));
            if claimed.len() > 1 {
                // Read with its batch (a batch of one is read by its fill,
                // not into the kept buffer: prefetch_read).
                ctx.pre = Some((idx, k * r.folio as usize));
            }
            let c = Claimed {
                r,
                idx,
                old,
                extras: run_olds,
                write: pages.is_some(),
                page: pages.and_then(|p| p(idx)).filter(|_| r.dirties_pages()),
                prefetch: true,
            };
            if self.fill_claimed(ctx, &c) == Outcome::Done {
                for j in idx..idx + n {
                    on_read(j);
                }
                read += n as u64;
            }
            ctx.pre = None;
            k += n;
        }
        read
    }

    /// The prefetch batch buffer of `ctx`, at least `bytes` long: the one
    /// kept from the last batch when it is large enough (a fresh mapping
    /// per batch cost a page fault per page and a munmap with its TLB
    /// shootdown per batch), else a new one. Kept until the thread idles
    /// ([`Shared::shrink_ctx`]) and counted in `overhead_bytes` meanwhile.
    fn take_pre_buf(&self, ctx: &mut Ctx, bytes: usize) -> upager_sys::mem::AlignedBuf {
        match ctx.pre_buf.take() {
            Some(b) if b.len() >= bytes => b,
            old => {
                self.release_pre_buf(old);
                self.note_pre_buf(bytes);
                upager_sys::mem::AlignedBuf::zeroed(bytes)
            }
        }
    }

    /// Reads the claimed folios of a prefetch batch into `ctx.pre_buf`
    /// (folio k of the batch at k folios in) with one
    /// [`Store::read_batch`](crate::Store::read_batch): folios whose store
    /// bytes are adjacent (a run of a file) are one read each run
    /// ([`read_runs`]); never-written anonymous folios are zeros, not read.
    /// Whether each folio's read succeeded.
    fn prefetch_read(&self, ctx: &mut Ctx, r: &Area, claimed: &[(usize, State)]) -> Vec<bool> {
        if claimed.len() == 1 {
            return vec![true]; // fill_claimed reads it, as for a fault
        }
        let folio = r.folio as usize;
        let mut buf = self.take_pre_buf(ctx, claimed.len() * folio);
        let store_len = r.store.len();
        let wants: Vec<Option<(u64, usize)>> = claimed
            .iter()
            .map(|&(idx, old)| {
                let off = r.store_offset(idx, old)?;
                let want = (folio as u64).min(store_len.saturating_sub(off)) as usize;
                (want > 0).then_some((off, want))
            })
            .collect();
        // The buffer is reused from batch to batch: what is not read into
        // it (never-written anonymous folios) is zeroed here, a short
        // read's tail below.
        for (k, w) in wants.iter().enumerate() {
            if w.is_none() {
                buf[k * folio..(k + 1) * folio].fill(0);
            }
        }
        let runs = read_runs(&wants, folio);
        let mut ok = vec![true; claimed.len()];
        let mut failed = Vec::new();
        for (run, res) in runs
            .iter()
            .zip(read_into(&*r.store, &mut buf, folio, &runs))
        {
            let got = res.unwrap_or(0);
            for k in run.first..run.first + run.folios {
                let (_, want) = wants[k].expect("a folio of a read run has bytes to read");
                if got >= (k - run.first) * folio + want {
                    self.counters.bytes_read.add(want as u64);
                    buf[k * folio + want..(k + 1) * folio].fill(0);
                } else if run.folios > 1 {
                    // A merged read failed: this folio is read once more on
                    // its own, so that one bad folio costs only itself.
                    failed.push(k);
                } else {
                    ok[k] = false;
                }
            }
        }
        // What a failed read left in the buffer is overwritten, or its
        // folio never installed.
        let retries: Vec<ReadRun> = failed
            .iter()
            .map(|&k| {
                let (offset, want) = wants[k].expect("a failed folio had bytes to read");
                ReadRun {
                    first: k,
                    folios: 1,
                    offset,
                    buf_len: want.next_multiple_of(upager_sys::PAGE_SIZE).min(folio),
                }
            })
            .collect();
        for (run, res) in retries
            .iter()
            .zip(read_into(&*r.store, &mut buf, folio, &retries))
        {
            let k = run.first;
            let (_, want) = wants[k].expect("a failed folio had bytes to read");
            if matches!(res, Ok(n) if n >= want) {
                self.counters.bytes_read.add(want as u64);
                buf[k * folio + want..(k + 1) * folio].fill(0);
            } else {
                ok[k] = false;
            }
        }
        ctx.pre_buf = Some(buf);
        ok
    }
}

/// One read of a prefetch batch: `folios` folios from the batch's folio
/// `first`, whose store bytes start at `offset`, into `buf_len` bytes of
/// the batch's buffer from folio `first` on.
#[derive(Debug, PartialEq, Eq)]
struct ReadRun {
    first: usize,
    folios: usize,
    offset: u64,
    buf_len: usize,
}

/// Reads `runs` (in buffer order) into their parts of `buf` with one
/// `read_batch`; one result per run.
fn read_into(
    store: &dyn crate::Store,
    buf: &mut [u8],
    folio: usize,
    runs: &[ReadRun],
) -> Vec<std::io::Result<usize>> {
    if runs.is_empty() {
        return Vec::new();
    }
    let mut reqs = Vec::with_capacity(runs.len());
    let mut rest = buf;
    let mut at = 0;
    for run in runs {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(run.first * folio - at);
        let (part, tail) = tail.split_at_mut(run.buf_len);
        reqs.push(crate::store::ReadReq {
            buf: part,
            offset: run.offset,
        });
        rest = tail;
        at = run.first * folio + run.buf_len;
    }
    store.read_batch(&mut reqs)
}

/// The reads of a prefetch batch: `wants[k]` is folio k's (store offset,
/// bytes to read), None for a folio that is not read (zeros). Folios next
/// to each other in the batch whose store bytes follow each other (each
/// before the last read whole) are one read: a file region's adjacent
/// folios, not swap slots scattered over a swap file. Each read's buffer
/// length is rounded up to whole pages (direct I/O).
fn read_runs(wants: &[Option<(u64, usize)>], folio: usize) -> Vec<ReadRun> {
    let mut runs: Vec<ReadRun> = Vec::new();
    let mut prev: Option<(usize, u64, usize)> = None; // (k, offset, want)
    for (k, w) in wants.iter().enumerate() {
        let Some((off, want)) = *w else {
            prev = None;
            continue;
        };
        let extends = matches!(prev, Some((pk, poff, pwant))
            if pk + 1 == k && pwant == folio && poff + folio as u64 == off);
        let rounded = want.next_multiple_of(upager_sys::PAGE_SIZE).min(folio);
        match runs.last_mut() {
            Some(run) if extends => {
                run.folios += 1;
                run.buf_len = (k - run.first) * folio + rounded;
            }
            _ => runs.push(ReadRun {
                first: k,
                folios: 1,
                offset: off,
                buf_len: rounded,
            }),
        }
        prev = Some((k, off, want));
    }
    runs
}

/// Whether `queue` starts with a whole 2 MiB run of `run` folios (0: the
/// region does not fill runs): the run's first folio, then each of the
/// others in order.
fn whole_run_queued(queue: &VecDeque<usize>, run: usize) -> bool {
    run > 0
        && queue.len() >= run
        && queue[0].is_multiple_of(run)
        && queue
            .iter()
            .take(run)
            .enumerate()
            .all(|(k, &i)| i == queue[0] + k)
}

/// How many folios from the first of `claimed` (a prefetch batch from
/// some folio on, `ok` its reads' results) go into the view as one run:
/// the following ones while each is the next folio of the region, read
/// fine, and in the same registration (a `UFFDIO_COPY` stays inside one),
/// short of a whole 2 MiB run where the region fills those as huge pages
/// (fill.rs would read such a run again into a staged huge page).
fn install_run(r: &Area, claimed: &[(usize, State)], ok: &[bool]) -> usize {
    let idx = claimed[0].0;
    let limit = if r.run_folios > 0 {
        r.run_folios - 1
    } else {
        usize::MAX
    };
    let shard_end = r.shard_end(idx);
    let mut n = 1;
    while n < claimed.len() && n < limit && claimed[n].0 == idx + n && idx + n < shard_end && ok[n]
    {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: usize = 4096;

    #[test]
    fn adjacent_folios_of_a_file_are_one_read() {
        let w = |off: u64, want: usize| Some((off, want));
        // 0-2 adjacent; 3 not read; 4-5 adjacent; 6 jumps back (a swap
        // slot); 7 follows 6 but 6 was short (the end of the store).
        let wants = [
            w(0, F),
            w(4096, F),
            w(8192, F),
            None,
            w(16384, F),
            w(20480, F),
            w(4096 * 100, 100),
            w(4096 * 101, F),
        ];
        let runs = read_runs(&wants, F);
        let run = |first, folios, offset, buf_len| ReadRun {
            first,
            folios,
            offset,
            buf_len,
        };
        assert_eq!(
            runs,
            vec![
                run(0, 3, 0, 3 * F),
                run(4, 2, 16384, 2 * F),
                run(6, 1, 409_600, F),
                run(7, 1, 413_696, F),
            ]
        );
        // A short last folio: its buffer is a whole page, not a folio.
        let runs = read_runs(&[w(0, 2 * F), w(2 * F as u64, 100)], 2 * F);
        assert_eq!(runs, vec![run(0, 2, 0, 2 * F + F)]);
        assert!(read_runs(&[None, None], F).is_empty());
    }
}
