//! Fills: a claimed folio (and its readahead run) read from the store,
//! installed in the view and published.
//!
//! Contract:
//! - A folio is filled as one unit: one store read (with readahead: one
//!   read for the whole run) and one `UFFDIO_COPY` (seed 002), or one
//!   `UFFDIO_MOVE` of a staged huge page (huge.rs). Read faults install the
//!   folio write-protected (CLEAN); write faults install it writable
//!   (DIRTY).
//! - Ordering ([`Shared::fill`] drives, [`Shared::fill_claimed`] for the
//!   claimed folios): 1) reserve the budget (direct reclaim if full; never
//!   in a SIGBUS handler) 2) claim the readahead folios (readahead.rs) and
//!   ask for the next window 3) read 4) in a SIGBUS handler only: queue the
//!   LRU entries (before anything is installed, see `fill_claimed`)
//!   5) install without waking 6) publish the counters and the state words
//!   (Release) 7) one `UFFDIO_WAKE` over the run wakes the faulting thread,
//!   so whatever it does next (a write, a residency query) sees the folios
//!   resident (measured: no cost, 115K random reads/s either way) 8) queue
//!   the LRU entries (one lock).
//! - A fill that cannot complete: in a SIGBUS handler it is undone (the
//!   folios go back to their old states, the budget is returned) and the
//!   fault handed to a resolver thread ([`Outcome::HandOff`]); a prefetch
//!   fill is undone too (no access asked for its folios); elsewhere the
//!   reason is logged and the folio poisoned (poison.rs). A window whose
//!   read fails is cut to its first folio, read again alone: a bad folio
//!   ahead never fails the one a fault asked for. A folio
//!   installed writable is never dropped once part of it is in
//!   (install.rs, `settle_writable`).
//!
//! Lock order: a fill takes the LRU lock once, to queue the folios it
//! installed (only tried in a SIGBUS handler, where it may hold a staged
//! huge page's slot, taken with `try_lock`, meanwhile: slot → `lru`).
//!
//! Counters: `fills`, `fills_readahead`, `bytes_read`, `read_errors`,
//! `refaults`, `refaults_activated`, `faults_failed`, `faults_missing` (a
//! fill in a SIGBUS handler counts its fault when it publishes),
//! `thp_fill_fallback`, and the fault phases (`fault_timing`).
//!
//! Uses: `area`, `budget`, `config`, `folio`, `huge`, `install`, `lru`,
//! `poison`, `readahead`, `shared`, `stats`, `thp`, `trace`.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use crate::area::Area;
use crate::config::FaultMode;
use crate::folio::{self, Kind, State, ACTIVE, QUEUED, SEQ_MASK};
use crate::shared::{Ctx, Shared};
use crate::thp::Staged;
use crate::trace::Path;

/// How a fault ended in one resolution attempt (`Shared::resolve`, and
/// each step of it that can end one: a fill, a write-protect fault). Here,
/// with the fill, the lowest of those layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Outcome {
    /// Resolved, or left to someone who will wake the faulting thread.
    Done,
    /// In a SIGBUS handler, a step that is not async-signal-safe is needed
    /// (reclaim, the dirty limit, a store that may allocate, an error):
    /// nothing was changed; hand the fault to a resolver thread. For a
    /// prefetch fill (no fault): it failed, and its folios are back as
    /// they were.
    HandOff,
    /// In-thread: the folio is poisoned (its store read failed, or a write
    /// was refused): the access must end in SIGBUS, as the kernel's
    /// poison marker gives in handler mode.
    Sigbus,
}

/// The folios one fill has claimed (BUSY, budget charged): the faulting
/// one and the readahead run after it.
pub(crate) struct Claimed<'a> {
    /// The region (pinned by the caller).
    pub r: &'a Arc<Area>,
    /// The faulting folio.
    pub idx: usize,
    /// Its state before the claim.
    pub old: State,
    /// The previous states of the readahead folios `idx + 1 ..`, in order.
    pub extras: &'a [State],
    /// A write fault: installed writable and published DIRTY (no
    /// readahead).
    pub write: bool,
    /// A write fault into a folio above 4 KiB of a region that dirties
    /// pages (dirty.rs): the 4 KiB page written, installed writable alone
    /// (the rest write-protected), published DIRTY|PARTIAL.
    pub page: Option<u64>,
    /// Filled by the prefetch thread: no faulting thread to wake.
    pub prefetch: bool,
}

impl Claimed<'_> {
    /// Folios in the fill.
    fn n(&self) -> usize {
        1 + self.extras.len()
    }

    /// The previous state of folio `idx + k`.
    fn old_of(&self, k: usize) -> State {
        if k == 0 {
            self.old
        } else {
            self.extras[k - 1]
        }
    }
}

impl Shared {
    /// Fills claimed folio `idx` (previous state `old`), plus readahead.
    /// `write`: a write fault, at this address.
    pub(crate) fn fill(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        idx: usize,
        old: State,
        write: Option<u64>,
        prefetch: bool,
    ) -> Outcome {
        let folio = r.folio;
        let page = write
            .filter(|_| r.dirties_pages())
            .map(|at| r.page_in_folio(idx, at));
        let write = write.is_some();
        // Counted at its start, like `faults_missing`: the faulting thread
        // may read the counters as soon as the wake below lets it go.
        if self.lap(&mut ctx.mark, &self.phases.lookup) && !ctx.in_signal {
            self.phases.fills.inc();
        }
        let beyond_end =
            !r.is_anon() && r.store_offset(idx, old).is_some_and(|o| o >= r.store.len());
        if ctx.in_signal {
            // No reclaim here: the background reclaimer keeps room ahead of
            // the faults; when it is behind, a resolver thread reclaims.
            if beyond_end || !self.budget.try_charge(folio) {
                self.kick_reclaimer();
                let c = Claimed {
                    r,
                    idx,
                    old,
                    extras: &[],
                    write,
                    page,
                    prefetch,
                };
                return self.fill_undo(&c, false, false);
            }
        } else if beyond_end || !self.reserve(folio) {
            self.counters.faults_failed.inc();
            if beyond_end {
                self.report_sigbus(
                    r,
                    idx,
                    format_args!(
                        "it is beyond the end of the store ({} bytes): was the file truncated under the mapping?",
                        r.store.len()
                    ),
                );
            } else {
                self.report_sigbus(
                    r,
                    idx,
                    format_args!(
                        "no memory could be freed within the budget ({} bytes) for {} s: every resident folio is pinned, busy or dirty with a store refusing writes",
                        self.budget.limit(),
                        crate::budget::DIRECT_RECLAIM_GIVE_UP.as_secs()
                    ),
                );
            }
            self.poison(r, idx);
            return Outcome::Done;
        }
        self.lap(&mut ctx.mark, &self.phases.reserve);
        // Readahead on read faults only: folios read ahead are installed
        // write-protected (CLEAN), so a writer streaming through them would
        // pay one write-protect fault and one unprotect flush per folio
        // (2,042 shootdowns for 2,048 folios written in order, test
        // tlb_dirty); without readahead each folio costs one missing fault
        // and no flush.
        let mut extras = std::mem::take(&mut ctx.extras);
        extras.clear();
        if !write {
            self.claim_readahead(r, idx, &mut extras);
        }
        // Async readahead (readahead.rs, ahead.rs): the prefetch thread reads the
        // next window while this fault reads this one.
        if !prefetch {
            self.ask_next_window(r, idx, old, 1 + extras.len());
        }
        let c = Claimed {
            r,
            idx,
            old,
            extras: &extras,
            write,
            page,
            prefetch,
        };
        let out = self.fill_claimed(ctx, &c);
        ctx.extras = extras;
        out
    }

    /// [`fill`](Self::fill) once the budget is reserved and the readahead
    /// folios are claimed (also the prefetch thread's fills): drives the
    /// steps — take a staged huge page ([`fill_stage`](Self::fill_stage)),
    /// read, queue the LRU entries (first, in a SIGBUS handler), install,
    /// publish and wake — and ends a fill that fails
    /// ([`fill_abort`](Self::fill_abort)).
    pub(crate) fn fill_claimed(&self, ctx: &mut Ctx, c: &Claimed<'_>) -> Outcome {
        let (r, idx) = (c.r, c.idx);
        let started = std::time::Instant::now();
        // Before anything can see these folios resident (whole-region walks
        // visit touched chunks only).
        for k in 0..c.n() {
            r.mark_touched(idx + k);
            r.trace
                .record(idx + k, Path::FillClaim, c.old_of(k).kind(), Kind::Busy);
        }
        let mut staged = self.fill_stage(c);
        let prefetched = match self.fill_read(ctx, c, staged.as_deref_mut()) {
            Ok(p) => p,
            Err(e) => {
                drop(staged);
                if !ctx.in_signal {
                    self.counters.read_errors.inc();
                }
                if !c.extras.is_empty() {
                    // A window's read failed: its readahead folios go back
                    // as they were (an access reads each itself) and the
                    // claimed folio is read on its own — as the kernel
                    // reads a page whose readahead failed — so a bad folio
                    // ahead never fails the one asked for.
                    self.undo_extras(c, false);
                    self.budget.uncharge(r.folio * c.extras.len() as u64);
                    return self.fill_claimed(ctx, &Claimed { extras: &[], ..*c });
                }
                return self.fill_abort(
                    ctx,
                    c,
                    false,
                    format_args!("reading it from the store failed: {e}"),
                );
            }
        };
        self.lap(&mut ctx.mark, &self.phases.read);
        let now = self.evict_seq.load(Ordering::Relaxed);
        // The LRU entries: (folio, active) for each folio without one. In a
        // SIGBUS handler they are queued BEFORE anything is installed (the
        // folios are BUSY: reclaim passes over them), with a lock that is
        // only tried and lists that must have room; when that fails the
        // fill is undone and handed off with nothing installed. (Queueing
        // after the install and undoing it on failure lost writes: a write
        // fill is installed writable, and a store another thread made to
        // the page before the undo's MADV_DONTNEED was thrown away; test
        // `concurrent_stores_to_fresh_folios_survive_a_failed_lru_try`.)
        self.fill_lru_entries(ctx, c, now);
        let queued_early = ctx.in_signal;
        if ctx.in_signal && !self.lru.try_add(r, &ctx.queue) {
            drop(staged);
            return self.fill_undo(c, true, false);
        }
        // (A region that dirties pages has folios below 2 MiB: a write fill
        // takes no staged huge page.)
        let partial = c.page.is_some() && staged.is_none();
        let installed = self.fill_install(ctx, c, staged.as_deref_mut(), prefetched);
        drop(staged);
        // A huge read fill that a write raced (see install_huge) is DIRTY.
        let Some(raced) = installed else {
            // Drop whatever part of the run was installed before giving up
            // (nothing of it was writable: see fill_install and
            // install_huge).
            self.zap(&[r.span(idx, c.n())], "a failed fill", ctx.in_signal);
            return self.fill_abort(
                ctx,
                c,
                queued_early,
                format_args!("the kernel refused to install it (UFFDIO_COPY/MOVE; logged above)"),
            );
        };
        self.lap(&mut ctx.mark, &self.phases.copy);
        // Counted before the faulting thread is woken (it may read the
        // counters next).
        let took = started.elapsed();
        if took > crate::shared::SLOW_FAULT {
            self.note_slow_fault(r, idx, took, ctx.in_signal);
        }
        self.fill_publish(ctx, c, raced, partial, now);
        if let Some(w) = &r.warm {
            // A warm start's trace (warm.rs): recorded, or the program's
            // progress through a replayed one.
            w.filled(idx, c.n(), ctx.replaying);
            if !c.prefetch && w.wants_next(idx) {
                self.ask_ahead(r.base() | 1);
            }
        }
        Outcome::Done
    }

    /// The staged huge page a fill reads into and moves in whole (huge.rs),
    /// if it fills a 2 MiB folio or a whole 2 MiB run and the pool has one
    /// (counts the fills that copy base pages instead).
    fn fill_stage(&self, c: &Claimed<'_>) -> Option<MutexGuard<'_, Staged>> {
        let (r, idx, n) = (c.r, c.idx, c.n());
        // A 2 MiB folio is read into a staged huge page and moved in whole
        // (thp.rs); without one it is copied as base pages. Read-only
        // regions copy: UFFDIO_MOVE moves only between writable mappings
        // (EINVAL otherwise).
        // A region of smaller folios fills a whole 2 MiB-aligned run the
        // same way (mixed folio sizes: claim_readahead ends a sequential
        // window at its run's end, so a stream's next fault starts a run).
        let run = r.run_folios > 0 && n == r.run_folios && idx.is_multiple_of(n);
        let huge = (r.folio == crate::thp::HUGE && n == 1 || run) && self.thp.usable();
        // (A huge run of a read-only region is moved in through a moment of
        // write access: install_huge.)
        if huge && !r.writable && !run {
            self.counters.thp_fill_fallback.inc();
        }
        if huge && (r.writable || run) {
            let s = self.thp.take(&self.budget);
            if s.is_none() {
                self.counters.thp_fill_fallback.inc();
            }
            s
        } else {
            None
        }
    }

    /// Reads the claimed folios: into `staged` if the fill has a staged
    /// huge page, else into `ctx.buf` — unless the prefetch batch read
    /// this folio already: then the offset of its bytes in `ctx.pre_buf`.
    fn fill_read(
        &self,
        ctx: &mut Ctx,
        c: &Claimed<'_>,
        staged: Option<&mut Staged>,
    ) -> io::Result<Option<usize>> {
        let (r, idx, old, n) = (c.r, c.idx, c.old, c.n());
        match staged {
            // Never-written anonymous memory is zeros: a fresh staged page
            // is zeros already.
            Some(st) if st.fresh && r.store_offset(idx, old).is_none() => Ok(None),
            Some(st) => {
                st.fresh = false;
                self.read_folios(r, idx, old, &mut st.buf[..])
                    .map(|()| None)
            }
            None => match (ctx.pre.take(), ctx.pre_buf.is_some()) {
                // Read already, with the rest of its prefetch batch: it
                // (and the run after it, adjacent in that batch's buffer)
                // is copied into the view straight from that buffer.
                (Some((at, off)), true) if at == idx => Ok(Some(off)),
                _ => {
                    let total = n * r.folio as usize;
                    self.note_buf_use(ctx, total);
                    self.read_folios(r, idx, old, &mut ctx.buf[..total])
                        .map(|()| None)
                }
            },
        }
    }

    /// Pushes to `ctx.queue` the LRU entries of the claimed folios that
    /// have none yet: (folio, active), a refault close to its eviction
    /// entering active (`now`: the eviction clock).
    fn fill_lru_entries(&self, ctx: &mut Ctx, c: &Claimed<'_>, now: u64) {
        ctx.queue.clear();
        for k in 0..c.n() {
            let o = c.old_of(k);
            let hot = o.kind() == Kind::Evicted && self.refault_is_hot(now, o);
            if !folio::load(c.r.state(c.idx + k)).has(QUEUED) {
                ctx.queue.push((c.idx + k, hot));
            }
        }
    }

    /// Installs the data read in the view, without waking: a staged huge
    /// page moved in (huge.rs), else copied from `ctx.buf` or, at
    /// `prefetched`, from the prefetch batch's buffer. `None` if it could
    /// not be installed; else whether a write landed in a huge read fill
    /// before its protection (it is DIRTY).
    fn fill_install(
        &self,
        ctx: &Ctx,
        c: &Claimed<'_>,
        staged: Option<&mut Staged>,
        prefetched: Option<usize>,
    ) -> Option<bool> {
        let (r, idx, n) = (c.r, c.idx, c.n());
        let quiet = ctx.in_signal;
        if let Some(st) = staged {
            return self.install_huge(r, idx, n, st, c.write, quiet);
        }
        let total = n * r.folio as usize;
        let src: &[u8] = match (prefetched, ctx.pre_buf.as_deref()) {
            (Some(off), Some(pre)) => &pre[off..off + total],
            _ => &ctx.buf[..total],
        };
        let ok = if let Some(p) = c.page {
            self.copy_page_writable(r, idx, p, &src[..r.folio as usize], quiet)
        } else if c.write {
            // Installed writable: from the first page copied on, other
            // threads may store into it without a fault. It is never
            // dropped once part of it is in (see settle_writable).
            debug_assert!(c.extras.is_empty(), "write fills read no ahead");
            let folio = r.folio as usize;
            match self.copy_all(r, r.span(idx, 1), &src[..folio], false, quiet) {
                Ok(()) => true,
                Err(0) => false,
                Err(done) => self.settle_writable(r, r.span(idx, 1), done, src, quiet),
            }
        } else {
            // Installed write-protected (or into a read-only region): no
            // store can land before the folio is published, so a
            // failure may drop what was installed.
            self.copy_all(r, r.span(idx, n), src, r.writable, quiet)
                .is_ok()
        };
        ok.then_some(false)
    }

    /// Publishes an installed fill: counters and state words (Release),
    /// then wakes the faulting thread and any waiters (the install did
    /// not: whoever runs next sees the folios resident and counted), then
    /// the LRU (one lock) unless queued before the install. `partial`: the write fill installed its page alone. `raced`: a
    /// store landed in a huge read fill before its protection.
    fn fill_publish(&self, ctx: &mut Ctx, c: &Claimed<'_>, raced: bool, partial: bool, now: u64) {
        let (r, idx, n) = (c.r, c.idx, c.n());
        // A store that raced the protection of a huge run landed in one of
        // its folios, which one is not known: all of them are DIRTY.
        let all_dirty = raced && n > 1;
        let write = c.write || raced;
        if all_dirty {
            self.dirty_add(r, n as u64);
        } else if write {
            self.dirty_add(r, 1);
        }
        if ctx.in_signal && !c.prefetch {
            self.counters.faults_missing.inc();
            if ctx.mark.is_some() {
                self.phases.fills.inc();
            }
        }
        self.counters.fills.add(n as u64);
        self.counters
            .fills_readahead
            .add(c.extras.len() as u64 + u64::from(c.prefetch));
        let mut waiters = false;
        let tick = self.dirty_tick();
        for k in 0..n {
            let o = c.old_of(k);
            let hot = o.kind() == Kind::Evicted && self.refault_is_hot(now, o);
            if o.kind() == Kind::Evicted {
                self.counters.refaults.inc();
                self.counters.refaults_activated.add(u64::from(hot));
            }
            let kind = if (k == 0 && write) || all_dirty {
                Kind::Dirty
            } else {
                Kind::Clean
            };
            r.trace.record(idx + k, Path::FillPublish, Kind::Busy, kind);
            // A DIRTY folio's sequence field holds when it became dirty
            // (the age the background writer goes by); a CLEAN one keeps
            // its eviction sequence (unused while resident).
            let partial = k == 0 && partial && !raced;
            if let Some(p) = c.page.filter(|_| partial) {
                r.set_partial_page(idx, p);
            }
            let prev = folio::release(r.state(idx + k), |s| {
                let s = s
                    .with_kind(kind)
                    .set(ACTIVE, hot)
                    .set(QUEUED, true)
                    .set(folio::PARTIAL, partial);
                if kind == Kind::Dirty {
                    s.with_seq(tick)
                } else {
                    s
                }
            });
            waiters |= prev.has(folio::WAITER);
        }
        match self.mode {
            FaultMode::InThread => {
                if waiters {
                    self.wake_folios(r, idx, n);
                }
            }
            _ => {
                if !c.prefetch || waiters {
                    let total = n as u64 * r.folio;
                    let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), total);
                }
            }
        }
        self.lap(&mut ctx.mark, &self.phases.wake);
        if !ctx.in_signal {
            self.lru.add(r, &ctx.queue);
        }
        self.maybe_kick_reclaimer();
        self.lap(&mut ctx.mark, &self.phases.lru);
        ctx.mark = None;
    }

    /// A claimed fill read or installed nothing it can keep: in a SIGBUS
    /// handler, undone for a resolver thread (`queued`: its LRU entries were
    /// pushed); a prefetch fill is undone too (no access asked for it);
    /// else the reason is logged and the faulting folio poisoned
    /// (`fill_failed`).
    fn fill_abort(
        &self,
        ctx: &Ctx,
        c: &Claimed<'_>,
        queued: bool,
        why: std::fmt::Arguments<'_>,
    ) -> Outcome {
        if ctx.in_signal {
            return self.fill_undo(c, true, queued);
        }
        if c.prefetch {
            // No access asked for these folios: they go back as they were
            // (not poisoned), and an access reads them itself (and gets
            // SIGBUS then if the store still fails).
            if c.r.trace.may_report().is_some() {
                log::warn!(
                    "region {} ({}): reading ahead at region offset {} failed: {why}; left unfilled (an access reads it again)",
                    c.r.id,
                    c.r.store.describe(),
                    (c.idx as u64) << c.r.shift
                );
            }
            return self.fill_undo(c, true, queued);
        }
        self.report_sigbus(c.r, c.idx, why);
        self.fill_failed(c);
        Outcome::Done
    }

    /// Undoes a fill started in a SIGBUS handler, so that a resolver thread
    /// can do it again from the start: the readahead folios and the
    /// faulting one go back to their old states (waking waiters) and the
    /// budget is returned (`charged`: also the faulting folio's).
    fn fill_undo(&self, c: &Claimed<'_>, charged: bool, queued: bool) -> Outcome {
        let (r, idx, old, extras) = (c.r, c.idx, c.old, c.extras);
        // `queued`: LRU entries were pushed for them (QUEUED is kept so the
        // entry is not doubled by a later fill; reclaim drops it as stale).
        let back = |o: State| o.set(QUEUED, o.has(QUEUED) || queued);
        self.undo_extras(c, queued);
        let n = extras.len() as u64 + u64::from(charged);
        self.budget.uncharge(r.folio * n);
        r.trace.record(idx, Path::FillUndo, Kind::Busy, old.kind());
        let prev = folio::release(r.state(idx), |_| back(old));
        self.wake_if_waiter(r, idx, prev);
        Outcome::HandOff
    }

    /// Adds the time since the last mark to `phase` and marks now, when a
    /// fault is being timed (`fault_timing`; prefetch fills are not).
    /// Returns whether it timed.
    fn lap(&self, mark: &mut Option<std::time::Instant>, phase: &crate::stats::Padded) -> bool {
        let Some(then) = *mark else {
            return false;
        };
        let now = std::time::Instant::now();
        phase.add(now.duration_since(then).as_nanos() as u64);
        *mark = Some(now);
        true
    }

    /// A claimed fill could not complete: readahead folios go back to their
    /// old state, the faulting folio is poisoned, the budget is returned.
    fn fill_failed(&self, c: &Claimed<'_>) {
        let (r, idx, extras) = (c.r, c.idx, c.extras);
        self.counters.faults_failed.inc();
        self.undo_extras(c, false);
        self.budget.uncharge(r.folio * (1 + extras.len() as u64));
        self.poison(r, idx);
    }

    /// The readahead folios of a fill that did not complete go back to
    /// their old states, waking waiters (`queued`: their LRU entries were
    /// pushed: QUEUED is kept, so a later fill does not double the entry;
    /// reclaim drops it as stale). Their budget is the caller's to return.
    fn undo_extras(&self, c: &Claimed<'_>, queued: bool) {
        let (r, idx) = (c.r, c.idx);
        for (k, o) in c.extras.iter().enumerate() {
            r.trace
                .record(idx + 1 + k, Path::FillUndo, Kind::Busy, o.kind());
            let prev = folio::release(r.state(idx + 1 + k), |_| {
                o.set(QUEUED, o.has(QUEUED) || queued)
            });
            self.wake_if_waiter(r, idx + 1 + k, prev);
        }
    }

    /// A refault within half the budget (in pages) of its eviction.
    fn refault_is_hot(&self, now: u64, old: State) -> bool {
        let distance = (now.wrapping_sub(old.seq())) & SEQ_MASK;
        distance <= (self.budget.limit() / 4096 / 2).min(SEQ_MASK)
    }

    /// Reads folios `[idx, idx + buf.len()/folio)` into `buf`.
    fn read_folios(&self, r: &Area, idx: usize, old: State, buf: &mut [u8]) -> io::Result<()> {
        let Some(off) = r.store_offset(idx, old) else {
            buf.fill(0); // anonymous, never written: zero
            return Ok(());
        };
        // Read what the store has for this range; a store may return short
        // reads, so keep reading, and fail (SIGBUS) if it stops early.
        let want = (buf.len() as u64).min(r.store.len().saturating_sub(off)) as usize;
        let mut got = 0;
        while got < want {
            match r.store.read_at(&mut buf[got..], off + got as u64)? {
                // The store returned fewer bytes than its length promises
                // (no message: this may run in a signal handler).
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => got += n,
            }
        }
        buf[got..].fill(0);
        self.counters.bytes_read.add(got as u64);
        Ok(())
    }
}
