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
//! Uses: `area`, `fill` (Outcome), `folio`, `pool`, `shared`.

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
        // Batches of the engine's size, at most an eighth of the pool's budget.
        let batch = (self.batch_folios(r.folio) as u64 * r.folio).min(pool.budget() / 8);
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
        // the start) gets a whole readahead window, as far as it can claim.
        let window = if idx == 0 || view.next.load(Ordering::Relaxed) == idx {
            ((self.cfg.readahead >> r.shift) as usize).max(1)
        } else {
            1
        };
        // At most a quarter of the pool's budget, as the engine's windows.
        let window = window
            .min(((pool.budget() / 4) >> r.shift) as usize)
            .min(ctx.buf.len() >> r.shift)
            // Within the folio's shard: one UFFDIO_COPY fills the window,
            // and each shard is a VMA of its own, registered on its own
            // userfaultfd (a copy across the boundary fails part-way).
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
        let read = r.store.read_at(buf, off);
        let got = match read {
            Ok(got) => got,
            Err(e) => {
                if !ctx.in_signal {
                    self.counters.read_errors.inc();
                }
                let what = format_args!("reading {} at {off}", r.store.describe());
                return self.pooled_failed(ctx, r, idx, n, what, &e);
            }
        };
        buf[got..].fill(0);
        let uffd = self.uffd_of(r, idx);
        let mut done = 0u64;
        let total = bytes as u64;
        let mut failed = None;
        while done < total {
            let dst = r
                .map
                .range((idx << r.shift) + done as usize, (total - done) as usize);
            match uffd.copy(dst, &ctx.buf[done as usize..bytes], false, true) {
                Ok(upager_sys::uffd::Fill::Done) => done = total,
                // Already mapped here (a page of a folio another process
                // filled before this claim could see it is not possible:
                // FILLING is ours; but a retry after EAGAIN may meet its
                // own pages): skip the page.
                Ok(upager_sys::uffd::Fill::Exists { done: d }) => {
                    done += d + upager_sys::PAGE_SIZE as u64;
                }
                Ok(upager_sys::uffd::Fill::Retry { done: d }) => done += d,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            // The view is going away (unmap), or the kernel refused (the
            // pool's file system is full).
            let what = format_args!("filling a page pool's folio");
            return self.pooled_failed(ctx, r, idx, n, what, &e);
        }
        pool.publish(pi, n);
        view.next.store(idx + n, Ordering::Relaxed);
        self.counters.bytes_read.add(got as u64);
        if ctx.in_signal {
            self.counters.faults_missing.inc();
        }
        Outcome::Done
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
        what: std::fmt::Arguments<'_>,
        e: &std::io::Error,
    ) -> Outcome {
        if let Some(v) = r.pool.as_ref() {
            v.pool.abandon(v.first + idx, n);
        }
        if ctx.in_signal {
            return Outcome::HandOff;
        }
        log::error!("{what} failed: {e}");
        if let Some(_old) = folio::try_claim(r.state(idx), |s| {
            matches!(s.kind(), Kind::Never | Kind::Evicted)
        }) {
            self.poison(r, idx);
        }
        Outcome::Done
    }
}
