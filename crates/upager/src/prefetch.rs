//! The prefetch thread: folios filled ahead of any fault.
//!
//! One thread per pager ([`Shared::prefetch_main`]) serves two kinds of
//! work, windows first:
//! - Async readahead windows (readahead.rs): a stream's fault posts the
//!   address of its next window (`Shared::ask_ahead`, eight slots and a
//!   futex doorbell); [`Shared::fill_ahead`] fills it as a fault would — a
//!   whole 2 MiB run as one huge page where the region fills runs (huge.rs),
//!   else up to the readahead window — unless the stream, or anyone, got to
//!   its first folio first.
//! - Prefetch requests (`Region::prefetch`, `WILLNEED`: advice.rs):
//!   [`Shared::prefetch_one`] claims up to [`PREFETCH_BATCH_BYTES`] of
//!   non-resident folios at a time, reads them with one
//!   [`Store::read_batch`](crate::Store::read_batch) (a network store sends
//!   them together: one round trip per server) and installs each with the
//!   fill's own steps (fill.rs, `fill_claimed`). A request in progress is
//!   finished before the next window (a stream reaching a window not read
//!   yet reads it itself).
//!
//! Ordering: each folio's budget is charged (without reclaim) before it is
//! claimed; a folio whose read failed goes back to its old state (waking
//! waiters; a later fault reads it again and gets the error itself). Room:
//! at most one batch of reclaim per window or batch, and a request stops
//! when that frees nothing (a prefetch must not push out the working set
//! wholesale). Unmap waits for a request (it holds the region in flight):
//! it stops at the next batch once the region is dying.
//!
//! Lock order: none of its own (a fill's: fill.rs).
//!
//! Counters: `readahead_async` (windows filled), `read_errors`,
//! `bytes_read` (and a fill's, `fills_readahead` among them).
//!
//! Uses: `area`, `fill`, `folio`, `gather`, `readahead`, `reclaim`,
//! `shared`, `store`, `thp`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use upager_sys::futex;

use crate::area::Area;
use crate::fill::{Claimed, Outcome};
use crate::folio::{self, Kind, State};
use crate::shared::{Ctx, Shared, IDLE};

/// Bytes of folios a prefetch request reads with one `Store::read_batch`
/// (1 MiB: 16 folios of 64 KiB; a guess that bounds the prefetch thread's
/// extra buffer while giving a network store a batch worth a round trip).
const PREFETCH_BATCH_BYTES: u64 = 1 << 20;

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
        loop {
            let bell = self.ahead.bell.load(Ordering::Acquire);
            let mut worked = false;
            for slot in &self.ahead.slots {
                let addr = slot.swap(0, Ordering::AcqRel);
                if addr != 0 && !self.stopping() {
                    self.fill_ahead(&mut ctx, addr);
                    worked = true;
                }
            }
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

    /// Async readahead: fills the window from `addr` that a sequential
    /// stream's fault asked for (`ask_next_window`) — a whole 2 MiB run as one
    /// huge page where the region fills runs, else up to the readahead
    /// window of its folios — unless the stream, or anyone, got to its
    /// first folio first. Makes room with one batch of reclaim when the
    /// budget is full; gives up when that frees nothing.
    fn fill_ahead(&self, ctx: &mut Ctx, addr: u64) {
        if addr & 1 == 1 {
            // Not a window: a warm-start replay asks for its next one.
            return self.replay_step(ctx, addr & !1);
        }
        let Some(r) = self.table.lookup(addr) else {
            return;
        };
        let idx = ((addr - r.base()) >> r.shift) as usize;
        if idx >= r.nfolios() || r.is_anon() {
            return;
        }
        let n = r.run_folios;
        let run_start = n > 0 && idx.is_multiple_of(n);
        let want = if run_start { n } else { self.window_max(&r) };
        if !self.budget.fits(r.folio * want as u64)
            && self.evict_batch(crate::gather::Mode::Background) == 0
        {
            return;
        }
        let mut extras = std::mem::take(&mut ctx.extras);
        extras.clear();
        let first = if run_start {
            self.claim_run_ahead(&r, idx, &mut extras)
        } else {
            None
        };
        let first = first.or_else(|| {
            let end = self.window_end(&r, idx, idx + want);
            self.claim_free(&r, idx..end, &mut extras);
            (!extras.is_empty()).then(|| extras.remove(0))
        });
        if let Some(old) = first {
            self.counters.readahead_async.inc();
            let c = Claimed {
                r: &r,
                idx,
                old,
                extras: &extras,
                write: false,
                page: None,
                prefetch: true,
            };
            let _ = self.fill_claimed(ctx, &c);
        }
        ctx.extras = extras;
    }

    /// Fills the folios of one prefetch request, a batch at a time: claim
    /// up to [`PREFETCH_BATCH_BYTES`] of non-resident folios (budget charged
    /// without reclaim), read them with one [`Store::read_batch`] (a
    /// network store sends them together: one round trip per server), then
    /// install each. A folio whose read failed goes back to its old state
    /// (a later fault reads it again and gets the error itself). When the
    /// budget has no room, one folio goes the way of a fault (fill
    /// reserves, reclaiming).
    ///
    /// [`Store::read_batch`]: crate::Store::read_batch
    fn prefetch_one(&self, ctx: &mut Ctx, req: crate::shared::PrefetchRequest) {
        let Some(r) = crate::area::Inflight::enter(&req.region) else {
            return;
        };
        self.prefetch_folios(ctx, &r, req.folios, &mut |_| {});
    }

    /// Warm-start replay (warm.rs): reads the next window of the trace of
    /// the region at `base` through [`Shared::prefetch_folios`], unless the
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
        let read = self.prefetch_folios(ctx, &r, runs.into_iter().flatten(), &mut |idx| {
            rp.read_one(idx)
        });
        self.counters.replay_reads.add(read);
    }

    /// Fills `folios` of `r` (in flight) that are not resident, in their
    /// order, a batch at a time: claim up to [`PREFETCH_BATCH_BYTES`] of
    /// them (budget charged without reclaim), read them with one
    /// [`Store::read_batch`] (a network store sends them together: one
    /// round trip per server), then install each. A folio whose read
    /// failed goes back to its old state (a later fault reads it again and
    /// gets the error itself). When the budget has no room, one folio goes
    /// the way of a fault (fill reserves, reclaiming). `on_read(idx)` for
    /// each folio filled; returns how many.
    ///
    /// [`Store::read_batch`]: crate::Store::read_batch
    pub(crate) fn prefetch_folios(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        folios: impl IntoIterator<Item = usize>,
        on_read: &mut dyn FnMut(usize),
    ) -> u64 {
        let per_batch = if r.folio >= crate::thp::HUGE {
            1 // staged huge pages read into their own buffers
        } else {
            (PREFETCH_BATCH_BYTES / r.folio).max(1) as usize
        };
        let nfolios = r.nfolios();
        let mut folios = folios.into_iter().filter(|&i| i < nfolios).peekable();
        let mut claimed: Vec<(usize, State)> = Vec::with_capacity(per_batch);
        let mut read = 0;
        while folios.peek().is_some() {
            // Unmap waits for this request (it holds the region in flight):
            // stop at the next batch once the region is dying.
            if self.stopping() || r.dying.load(Ordering::SeqCst) {
                return read;
            }
            // Make room by evicting at most one batch per batch; stop when
            // even that frees nothing (a prefetch must not push out the
            // working set wholesale).
            let full = !self.budget.fits(r.folio);
            if full && self.evict_batch(crate::gather::Mode::Background) == 0 {
                break;
            }
            claimed.clear();
            while claimed.len() < per_batch {
                let Some(&next) = folios.peek() else {
                    break;
                };
                if !self.budget.try_charge(r.folio) {
                    break;
                }
                match folio::try_claim(r.state(next), |s| {
                    matches!(s.kind(), Kind::Never | Kind::Evicted)
                }) {
                    Some(old) => claimed.push((next, old)),
                    None => self.budget.uncharge(r.folio),
                }
                folios.next();
            }
            if claimed.is_empty() {
                if let Some(next) = folios.next_if(|_| !self.budget.fits(r.folio)) {
                    // No room without reclaim: one folio as a fault would.
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
            let ok = self.prefetch_read(ctx, r, &claimed);
            for (k, &(idx, old)) in claimed.iter().enumerate() {
                if !ok[k] {
                    self.counters.read_errors.inc();
                    self.budget.uncharge(r.folio);
                    let prev = folio::release(r.state(idx), |_| old);
                    self.wake_if_waiter(r, idx, prev);
                    continue;
                }
                if per_batch > 1 {
                    ctx.pre = Some((idx, k * r.folio as usize));
                }
                let c = Claimed {
                    r,
                    idx,
                    old,
                    extras: &[],
                    write: false,
                    page: None,
                    prefetch: true,
                };
                if self.fill_claimed(ctx, &c) == Outcome::Done {
                    on_read(idx);
                    read += 1;
                }
                ctx.pre = None;
            }
            ctx.pre_buf = None;
        }
        read
    }

    /// Reads the claimed folios of a prefetch batch into `ctx.pre_buf` with
    /// one [`Store::read_batch`](crate::Store::read_batch) (never-written
    /// anonymous folios are zeros, not read). Whether each read succeeded.
    fn prefetch_read(&self, ctx: &mut Ctx, r: &Area, claimed: &[(usize, State)]) -> Vec<bool> {
        if claimed.len() == 1 {
            return vec![true]; // fill_claimed reads it, as for a fault
        }
        let folio = r.folio as usize;
        let mut buf = upager_sys::mem::AlignedBuf::zeroed(claimed.len() * folio);
        let mut reqs = Vec::with_capacity(claimed.len());
        let mut which = Vec::with_capacity(claimed.len());
        let mut ok = vec![true; claimed.len()];
        let store_len = r.store.len();
        for ((k, part), &(idx, old)) in buf.chunks_mut(folio).enumerate().zip(claimed) {
            if let Some(off) = r.store_offset(idx, old) {
                let want = (folio as u64).min(store_len.saturating_sub(off)) as usize;
                if want > 0 {
                    reqs.push(crate::store::ReadReq {
                        buf: &mut part[..want.next_multiple_of(upager_sys::PAGE_SIZE).min(folio)],
                        offset: off,
                    });
                    which.push((k, want));
                }
            }
        }
        let done = r.store.read_batch(&mut reqs);
        drop(reqs);
        for ((k, want), res) in which.into_iter().zip(done) {
            match res {
                Ok(n) if n >= want => {
                    self.counters.bytes_read.add(want as u64);
                    buf[k * folio + want..(k + 1) * folio].fill(0);
                }
                _ => ok[k] = false,
            }
        }
        ctx.pre_buf = Some(buf);
        ok
    }
}
