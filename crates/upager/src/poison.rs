//! Poison: how a fault that cannot be resolved still ends.
//!
//! Contract:
//! - Every fault ends: a fill whose store read fails, a read beyond the end
//!   of the store, a fill the kernel refuses to install, no room in the
//!   budget, or a write the dirty limit refuses — the folio is poisoned
//!   ([`Shared::poison`]: `UFFDIO_POISON`), so the access gets SIGBUS (a
//!   system call gets EFAULT). The reclaimer clears the poison after
//!   [`POISON_HOLD`](crate::reclaim::POISON_HOLD), so a later access
//!   retries.
//! - Ordering: 1) say why ([`Shared::report_sigbus`], before the access is
//!   answered: a program killed by the signal leaves a reason behind)
//!   2) install the marker (`UFFDIO_POISON`; before 6.6, in handler mode:
//!   `PROT_NONE`, [`Shared::protect_poisoned`]) 3) publish POISONED
//!   (Release) 4) wake the faulting thread and any waiter 5) queue the folio
//!   for the reclaimer (the LRU's poisoned list, its lock).
//! - Without `UFFDIO_POISON`, in-thread: the woken access faults again and
//!   finds the folio POISONED (SIGBUS then: `resolve`).
//!
//! Lock order: `lru` (to queue the poisoned folio), nothing under it.
//!
//! Counters: none of its own (the callers count `faults_failed`,
//! `read_errors`, `writes_refused`).
//!
//! Uses: `area`, `config`, `folio`, `lru`, `shared`, `trace`.

use std::sync::Arc;

use upager_sys::uffd::Fill;

use crate::area::Area;
use crate::config::FaultMode;
use crate::folio::{self, Kind};
use crate::shared::Shared;
use crate::trace::Path;

impl Shared {
    /// Logs (at most once a second per region) why an access to folio `idx`
    /// of `r` is about to get SIGBUS (EFAULT in a system call): the store,
    /// the offset, the reason — before the access is answered, so a program
    /// killed by the signal leaves a reason behind. Never in a signal
    /// handler (those hand the fault to a resolver thread, which logs).
    pub(crate) fn report_sigbus(&self, r: &Area, idx: usize, why: std::fmt::Arguments<'_>) {
        let Some(held) = r.trace.may_report() else {
            return;
        };
        let more = if held > 0 {
            format!(" ({held} more such errors in this region since the last message)")
        } else {
            String::new()
        };
        log::error!(
            "region {} ({}): the access at region offset {} gets SIGBUS (EFAULT in a system call): {why}{more}",
            r.id,
            r.store.describe(),
            (idx as u64) << r.shift,
        );
    }

    /// Where the kernel has no `UFFDIO_POISON`, handler mode: folio `idx`
    /// of `r` becomes inaccessible (an access gets SIGSEGV, a system call
    /// EFAULT; never a fault that would come back here for ever). The
    /// reclaimer restores its access when it clears the poison.
    pub(crate) fn protect_poisoned(&self, r: &Area, idx: usize) {
        if self.mode == FaultMode::InThread {
            return;
        }
        if let Err(e) = r.span(idx, 1).protect(upager_sys::mem::Access::None) {
            log::error!("protecting a poisoned folio failed: {e}; the access will fault again");
        }
    }

    /// Makes an access to claimed folio `idx` raise SIGBUS (EFAULT in a
    /// system call) until the reclaimer clears it (without UFFDIO_POISON,
    /// in handler mode: SIGSEGV, see [`Shared::protect_poisoned`]). Holds
    /// no budget.
    pub(crate) fn poison(&self, r: &Arc<Area>, idx: usize) {
        r.note_table(idx, 1);
        // Without UFFDIO_POISON (before 6.6): in-thread, the woken access
        // faults again and finds the folio POISONED (SIGBUS then: resolve);
        // handler threads make the folio PROT_NONE instead (SIGSEGV for an
        // access, EFAULT for a system call) until the reclaimer clears it.
        if !self.info.uffd_poison {
            self.protect_poisoned(r, idx);
        }
        let poisoned = self.info.uffd_poison && {
            let res = self.uffd_of(r, idx).poison(r.span(idx, 1));
            if !matches!(res, Ok(Fill::Done)) {
                log::error!("UFFDIO_POISON failed ({res:?}); the access will fault again");
            }
            matches!(res, Ok(Fill::Done))
        };
        r.trace
            .record(idx, Path::FillFailed, Kind::Busy, Kind::Poisoned);
        let prev = folio::release(r.state(idx), |s| s.with_kind(Kind::Poisoned));
        if poisoned {
            self.wake_if_waiter(r, idx, prev);
        } else {
            // The POISON did not wake the faulting thread: wake it (and any
            // waiter) so it retries rather than sleeping for ever.
            let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
        }
        self.lru.add_poisoned(r, idx);
    }
}
