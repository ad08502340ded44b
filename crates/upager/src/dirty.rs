//! Write-protect faults: the first write to a resident folio, a write the
//! dirty limit refuses, and the twin a file with several writers keeps.
//!
//! Contract:
//! - The first write to a CLEAN folio raises a write-protect fault: the
//!   folio is claimed (`resolve`), unprotected (one ioctl, one flush) and
//!   becomes DIRTY ([`Shared::make_dirty`]). Ordering: 1) unprotect without
//!   waking 2) publish DIRTY (Release; a folio that was CLEAN starts its
//!   dirty age now) 3) wake, so when the faulting thread's write lands the
//!   folio is DIRTY already. In a huge run the unprotect splits the PMD:
//!   the run is base pages from then on.
//! - Dirty per 4 KiB in a larger folio (iomap's per-block dirty
//!   state for large folios, Linux 6.6): in a writable file region of
//!   folios above 4 KiB and below 2 MiB (a 2 MiB folio is one PMD-mapped
//!   huge page: unprotecting part of it would split it) whose writes keep
//!   no twins, the first write to a CLEAN folio unprotects only its 4 KiB
//!   page and publishes DIRTY|PARTIAL with that page in
//!   `Area::partial_pages`; write-back writes that page alone (gather.rs). A write to another page of it
//!   faults on the protection (the folio is DIRTY, claimed again) and
//!   unprotects the whole folio: DIRTY, written back whole. So a random
//!   8-byte write writes back 4 KiB whatever the folio, and a sequential
//!   writer pays one extra fault per folio. A missing write fault installs
//!   the folio the same way: its page writable, the rest protected
//!   (fill.rs).
//! - A write that needs new dirty memory beyond the dirty limit while the
//!   store refuses write-backs gets SIGBUS, and nothing is lost
//!   ([`Shared::refuse_write`]): a CLEAN folio is dropped (write-protected:
//!   no store landed in it), a missing one poisoned (poison.rs).
//! - Several writers of one file (twins.rs): the write-protect fault keeps
//!   a twin of a CLEAN folio before unprotecting it — charged before the
//!   claim ([`Shared::twin_charge`]: may reclaim, so never in a SIGBUS
//!   handler), copied after it ([`Shared::twin_claimed`]) — and a missing
//!   write fault is filled as a read so that it does.
//!
//! Lock order: the region's twin map (`Twins`, to insert a twin), under
//! nothing and with nothing under it.
//!
//! Counters: `wp_unprotects`, `writes_refused`, `faults_failed`,
//! `faults_deferred`, `faults_stale`, `tlb_flush_batches`,
//! `kernel_call_errors`, `twins_made` (`faults_wp` is counted by `resolve`).
//!
//! Uses: `area`, `config`, `fill`, `folio`, `poison`, `reclaim`, `shared`,
//! `trace`, `twins`.

use std::sync::Arc;

use crate::area::Area;
use crate::config::FaultMode;
use crate::fill::Outcome;
use crate::folio::{self, Kind, State};
use crate::shared::Shared;
use crate::trace::Path;

impl Shared {
    /// A write fault on folio `idx` that the dirty limit refuses (the store
    /// refuses writes): the access gets SIGBUS (EFAULT in a system call)
    /// and nothing is lost — a clean folio is dropped (the store has its
    /// data) and poisoned for a moment, a missing one is poisoned. Returns
    /// false if the folio turned out dirty already (the write needs no new
    /// dirty memory: resolve it as usual).
    pub(crate) fn refuse_write(&self, r: &Arc<Area>, idx: usize) -> bool {
        let w = r.state(idx);
        loop {
            let s = folio::load(w);
            match s.kind() {
                Kind::Dirty => return false,
                Kind::Never | Kind::Evicted | Kind::Clean => {
                    let Some(old) = folio::try_claim(w, |t| t.kind() == s.kind()) else {
                        continue;
                    };
                    if old.kind() == Kind::Clean {
                        // CLEAN: write-protected, so no store landed in it.
                        self.zap(&[r.span(idx, 1)], "a clean folio refused a write", false);
                        self.counters.tlb_flush_batches.inc();
                        self.budget.uncharge(r.folio);
                    }
                    self.counters.writes_refused.inc();
                    self.counters.faults_failed.inc();
                    r.trace.record(idx, Path::Refused, old.kind(), Kind::Busy);
                    self.report_sigbus(
                        r,
                        idx,
                        format_args!(
                            "a write needs dirty memory beyond the dirty limit and the store refuses write-backs ({}); writes resume once it accepts them",
                            r.last_error_text().unwrap_or_else(|| "no error kept".into())
                        ),
                    );
                    self.poison(r, idx);
                    return true;
                }
                Kind::Busy => {
                    if self.mode == FaultMode::InThread || folio::add_waiter(w) {
                        self.counters.faults_deferred.inc();
                        return true;
                    }
                }
                Kind::Poisoned => {
                    self.counters.faults_stale.inc();
                    self.wake_resolved(r, idx, 1, false);
                    return true;
                }
            }
        }
    }

    /// A write to a claimed resident folio: unprotect it, mark it dirty.
    /// `fresh`: it was CLEAN (its dirty age starts now). `page`: unprotect
    /// only this 4 KiB page of the folio and publish DIRTY|PARTIAL (the
    /// first write to a CLEAN folio above 4 KiB); `None`: the whole folio,
    /// DIRTY (a 4 KiB folio, or a second page written).
    pub(crate) fn make_dirty(
        &self,
        r: &Area,
        idx: usize,
        quiet: bool,
        fresh: bool,
        page: Option<u64>,
    ) {
        // Unprotect without waking, publish DIRTY, then wake: when the
        // faulting thread's write lands, the folio is already DIRTY.
        // (In a huge run this splits the PMD: the run is base pages now.)
        r.clear_run_mapped(idx);
        let span = match page {
            Some(p) => r.span(idx, 1).sub((p << 12) as usize, 4096),
            None => r.span(idx, 1),
        };
        let res = self.uffd_of(r, idx).writeprotect(span, false, false);
        if let Err(e) = res {
            // Still protected: DIRTY is right either way (a DIRTY folio may
            // be protected: the next write faults and unprotects again).
            self.counters.kernel_call_errors.inc();
            if !quiet {
                log::error!(
                    "region {}: removing the write protection of folio {idx} failed: {e}; the write will fault again",
                    r.id
                );
            }
        }
        self.counters.wp_unprotects.inc();
        if let Some(p) = page {
            r.set_partial_page(idx, p);
        }
        r.trace.record(idx, Path::WpDirty, Kind::Busy, Kind::Dirty);
        let tick = self.dirty_tick();
        let prev = folio::release(r.state(idx), |s| {
            let s = s.with_kind(Kind::Dirty).set(folio::PARTIAL, page.is_some());
            if fresh {
                s.with_seq(tick)
            } else {
                s
            }
        });
        self.wake_resolved(r, idx, 1, prev.has(folio::WAITER));
        self.maybe_kick_reclaimer();
    }

    /// After resolving a fault on folios `[idx, idx+n)`: in handler mode,
    /// wake the faulting thread and any waiters (`UFFDIO_WAKE`); in-thread,
    /// the faulting thread is running, so wake only waiters (`waiters`:
    /// some replaced state had WAITER).
    fn wake_resolved(&self, r: &Area, idx: usize, n: usize, waiters: bool) {
        match self.mode {
            FaultMode::InThread if !waiters => {}
            _ => self.wake_folios(r, idx, n),
        }
    }

    /// Before a write-protect fault claims folio `idx` (state `s`) of `r`:
    /// if it is CLEAN and its file keeps twins, charge the twin's memory.
    /// `Ok(true)`: charged (hand it to [`Shared::twin_claimed`]). `Err`:
    /// the fault ends here (handed off from a signal handler, which may not
    /// allocate; or refused because the budget has no room).
    pub(crate) fn twin_charge(
        &self,
        in_signal: bool,
        r: &Arc<Area>,
        idx: usize,
        s: State,
    ) -> Result<bool, Outcome> {
        if s.kind() != Kind::Clean || !r.twinning() {
            return Ok(false);
        }
        if in_signal {
            return Err(Outcome::HandOff);
        }
        if self.reserve(r.folio) {
            return Ok(true);
        }
        log::error!(
            "region {}: no room in the budget for the twin of folio {idx} (its file has several writers): the write is refused",
            r.id
        );
        if self.refuse_write(r, idx) {
            return Err(Outcome::Done);
        }
        Ok(false)
    }

    /// After the claim of folio `idx` (previous state `old`) by a
    /// write-protect fault that charged a twin (`charged`): keep the copy
    /// if the folio was CLEAN, else give the charge back.
    pub(crate) fn twin_claimed(&self, r: &Area, idx: usize, old: Option<State>, charged: bool) {
        if !charged {
            return;
        }
        if old.is_some_and(|o| o.kind() == Kind::Clean) {
            let mut t = vec![0u8; r.folio as usize].into_boxed_slice();
            r.map.read_at(idx << r.shift, &mut t);
            r.twins.insert(idx, t);
            self.counters.twins_made.inc();
        } else {
            self.budget.uncharge(r.folio);
        }
    }
}
