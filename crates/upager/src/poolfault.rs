//! Faults on pooled regions (pool.rs): a MISSING fault means no process
//! holds the folio; this process claims it in the pool (and, continuing a
//! stream, the rest of a readahead window), reads the store once, copies
//! the folios into its view with one `UFFDIO_COPY` (which puts them in the
//! pool whole, for every process), and publishes them.
//!
//! Ordering: 1) claim (the pool reserves the budget, evicting a batch from
//! every process's view if it must) 2) read 3) copy, waking the faulting
//! thread 4) publish (RESIDENT: waiters in any process wake). A read that
//! fails gives the claims back and poisons the folio in this process's
//! view (the access gets SIGBUS); a copy that fails (the view is being
//! unmapped) gives them back.
//!
//! Counters: `faults_missing`, `faults_stale`, `bytes_read`, `read_errors`
//! here; the pool's own (`pool_*`) in pool.rs.
//!
//! Uses: `area`, `fill` (Outcome), `folio`, `install` (copy_all), `pool`,
//! `shared`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::area::Area;
use crate::fill::Outcome;
use crate::folio::{self, Kind};
use crate::pool::Claim;
use crate::shared::{Ctx, Shared};

impl Shared {
    /// Resolves a MISSING fault on folio `idx` of pooled region `r`: the
    /// folio is in no process's view because the pool does not hold it
    /// (or held it until a moment ago). Claims it (and, continuing a
    /// stream, the rest of a readahead window), reads the store once,
    /// copies the folios into this view (and so into the pool), publishes
    /// them. A folio another process is filling is waited for.
    pub(crate) fn resolve_pooled(&self, ctx: &mut Ctx, r: &Arc<Area>, idx: usize) -> Outcome {
        let Some(view) = r.pool.as_ref() else {
            return Outcome::Done;
        };
        let pool = &view.pool;
        let in_thread = self.mode == crate::FaultMode::InThread;
        if ctx.in_signal && !r.store.signal_safe() {
            return Outcome::HandOff;
        }
        let pi = view.first + idx;
        let batch = self.pool_batch(r);
        loop {
            match pool.claim(pi, batch, true) {
                Claim::Claimed => break,
                Claim::Resident => {
                    // Filled by someone else since the fault was raised:
                    // the retry maps it.
                    self.counters.faults_stale.inc();
                    if !in_thread {
                        let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
                    }
                    return Outcome::Done;
                }
                Claim::Busy(s) => pool.wait(pi, s),
            }
        }
        if !ctx.in_signal {
            self.counters.faults_missing.inc();
        }
        // A stream (a fault where this process's last window ended, or at
        // the start) gets a whole readahead window, as far as it can claim,
        // and asks for the next one (async readahead: the prefetch thread
        // fills it while the program reads this one).
        let stream = idx == 0 || view.next.load(Ordering::Relaxed) == idx;
        let out = self.fill_pooled(ctx, r, idx, stream, stream);
        if ctx.in_signal && out == Outcome::Done {
            self.counters.faults_missing.inc();
        }
        out
    }

    /// Fills folio `idx` of pooled region `r`, claimed by the caller, and,
    /// for a `stream`, the rest of a readahead window after it, as far as
    /// the folios can be claimed without waiting: one store read, one
    /// `UFFDIO_COPY` (which wakes the threads waiting in the range), then
    /// the words published. With `ask`, a whole window also asks the
    /// prefetch thread for the next one (`fill_pooled_ahead`, which does
    /// not ask in turn: the stream's next fault, at the end of that
    /// window, does).
    fn fill_pooled(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        idx: usize,
        stream: bool,
        ask: bool,
    ) -> Outcome {
        let Some(view) = r.pool.as_ref() else {
            return Outcome::Done;
        };
        let (pool, pi) = (&view.pool, view.first + idx);
        let batch = self.pool_batch(r);
        let window = if stream {
            ((self.cfg.readahead >> r.shift) as usize).max(1)
        } else {
            1
        };
        // At most a quarter of the pool's budget, as the engine's windows;
        // within the folio's shard: one UFFDIO_COPY fills the window, and
        // each shard is a VMA of its own, registered on its own
        // userfaultfd (a copy across the boundary fails part-way).
        let window = window
            .min(((pool.budget() / 4) >> r.shift) as usize)
            .min(ctx.buf.len() >> r.shift)
            .min(r.shard_end(idx) - idx)
            .min(pool.folios() - pi)
            .max(1);
        let mut n = 1;
        while n < window && pool.claim(pi + n, batch, false) == Claim::Claimed {
            n += 1;
        }
        let bytes = n << r.shift;
        let buf = &mut ctx.buf[..bytes];
        let off = r.store_off + ((idx as u64) << r.shift);
        let got = match r.store.read_at(buf, off) {
            Ok(got) => got,
            Err(e) => {
                if !ctx.in_signal {
                    self.counters.read_errors.inc();
                }
                return self.pooled_failed(ctx, r, idx, n, || {
                    log::error!("reading {} at {off} failed: {e}", r.store.describe());
                });
            }
        };
        buf[got..].fill(0);
        // One copy of the window, retried as every fill's is (install.rs),
        // then one wake over it (copy_all does not wake).
        let dst = r.map.range(idx << r.shift, bytes);
        if self
            .copy_all(r, dst, &ctx.buf[..bytes], false, ctx.in_signal)
            .is_err()
        {
            // The view is going away (unmap), or the kernel refused (the
            // pool's file system is full): copy_all logged why.
            return self.pooled_failed(ctx, r, idx, n, || {});
        }
        let _ = self.uffd_of(r, idx).wake(dst.addr(), dst.len());
        pool.publish(pi, n);
        view.next.store(idx + n, Ordering::Relaxed);
        self.counters.bytes_read.add(got as u64);
        let next = idx + n;
        if ask && n == window && next < r.nfolios() && self.cfg.readahead_async {
            self.ask_ahead(r.folio_addr(next));
        }
        Outcome::Done
    }

    /// The prefetch thread's async window at folio `idx` of pooled region
    /// `r` (asked for by a stream's fill): filled if its first folio can
    /// be claimed without waiting; a window some process holds or fills
    /// already is left to it.
    pub(crate) fn fill_pooled_ahead(&self, ctx: &mut Ctx, r: &Arc<Area>, idx: usize) {
        let Some(view) = r.pool.as_ref() else {
            return;
        };
        if idx >= r.nfolios() {
            return;
        }
        let batch = self.pool_batch(r);
        if view.pool.claim(view.first + idx, batch, false) == Claim::Claimed {
            let _ = self.fill_pooled(ctx, r, idx, true, false);
        }
    }

    /// Bytes a pooled fill evicts at once when the pool is full: the
    /// engine's batch, at most an eighth of the pool's budget.
    fn pool_batch(&self, r: &Area) -> u64 {
        let budget = r.pool.as_ref().map_or(u64::MAX, |v| v.pool.budget());
        (self.batch_folios(r.folio) as u64 * r.folio).min(budget / 8)
    }

    /// A pooled fill of folios `[idx, idx+n)` that cannot complete: the
    /// claims go back to the pool, and the access fails (this process's
    /// folio is poisoned: SIGBUS) rather than fault here for ever. In a
    /// SIGBUS handler: handed to a resolver thread, which tries again.
    fn pooled_failed(
        &self,
        ctx: &Ctx,
        r: &Arc<Area>,
        idx: usize,
        n: usize,
        log: impl FnOnce(),
    ) -> Outcome {
        if let Some(v) = r.pool.as_ref() {
            v.pool.abandon(v.first + idx, n);
        }
        if ctx.in_signal {
            return Outcome::HandOff;
        }
        log(); // not in a signal handler: it may allocate
        if let Some(_old) = folio::try_claim(r.state(idx), |s| {
            matches!(s.kind(), Kind::Never | Kind::Evicted)
        }) {
            self.poison(r, idx);
        }
        Outcome::Done
    }
}
