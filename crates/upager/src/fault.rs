//! The fault path's top: handler threads read userfaultfd messages, and
//! [`Shared::resolve`] sends each fault to the mechanism that ends it.
//!
//! Contract:
//! - No lock on the way from a fault message to its resolution: the region
//!   is found in the lock-free table ([`RegionTable`](crate::table)), the
//!   folio is claimed by CAS on its state word ([`folio`]). The only lock a
//!   fill takes is the LRU lock, once, to queue the folios it installed.
//! - By the folio's state: NEVER/EVICTED → claimed and filled (fill.rs,
//!   with readahead: readahead.rs); CLEAN/DIRTY under a write → claimed and
//!   made DIRTY (dirty.rs, with the twin of a file with several writers);
//!   BUSY → see below; POISONED → SIGBUS (poison.rs); resolved already →
//!   stale, wake.
//! - A write that would make a file folio dirty first waits for write-back
//!   above the dirty limit (`balance_dirty`), and is refused (SIGBUS) when
//!   the store refuses writes (dirty.rs, `refuse_write`). Reads never wait
//!   there.
//! - A fault on a BUSY folio sets WAITER and returns: the BUSY owner wakes
//!   it when it is done, and the faulting access retries. In-thread, the
//!   faulting thread waits on the state word itself (bounded by
//!   [`BUSY_WAIT`]).
//! - Every fault ends: resolved, or SIGBUS (poison.rs). In a SIGBUS
//!   handler (`Ctx::in_signal`, inthread.rs) only async-signal-safe steps
//!   are taken; a fault that needs another is handed to a resolver thread
//!   ([`Outcome::HandOff`]) with nothing changed.
//!
//! Where the rest of the fault path lives: fill.rs (read, install,
//! publish), install.rs (`UFFDIO_COPY`, a partly writable install),
//! huge.rs (2 MiB folios and runs moved in as huge pages), readahead.rs
//! (the window), ahead.rs (reads ahead: async readahead, prefetch,
//! replay, the prefetch thread),
//! dirty.rs (write-protect faults, the dirty limit's refusal, twins'
//! hooks), poison.rs (SIGBUS), inthread.rs (the SIGBUS handler's side).
//!
//! Lock order: none here (see fill.rs and dirty.rs).
//!
//! Counters: `faults_missing`, `faults_wp`, `faults_deferred`,
//! `faults_stale`.
//!
//! Uses: `area`, `config`, `dirty`, `fill`, `folio`, `poison`, `reclaim`,
//! `shared`, `table`, `trace`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use upager_sys::futex;
use upager_sys::uffd::Msg;

use crate::area::Area;
use crate::config::FaultMode;
use crate::fill::Outcome;
use crate::folio::{self, Kind};
use crate::shared::{Ctx, Shared, IDLE};
use crate::trace::Path;

/// Longest wait of an in-thread fault on a BUSY folio before it retries
/// (its owner wakes it sooner: this bounds a missed wake).
const BUSY_WAIT: Duration = Duration::from_millis(20);

thread_local! {
    /// In-thread: the page this thread last waited on as BUSY, since when
    /// and when it last waited there (ns of the realtime clock), and
    /// whether that wait was reported slow (const-initialised, no
    /// destructor: signal-safe).
    static BUSY_SINCE: std::cell::Cell<(u64, u64, u64, bool)> = const { std::cell::Cell::new((0, 0, 0, false)) };
}

/// An in-thread fault at `addr` waited on a BUSY folio once more: how long
/// this thread has been waiting at that address, the first time that passes
/// [`SLOW_FAULT`](crate::shared::SLOW_FAULT) (None otherwise). Waits at
/// another address, or after a pause of several `BUSY_WAIT`s (a new wait,
/// not the same one retried), start the clock again.
fn busy_waited(addr: u64) -> Option<Duration> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let page = addr & !(upager_sys::PAGE_SIZE as u64 - 1);
    let gap = 5 * BUSY_WAIT.as_nanos() as u64;
    BUSY_SINCE.with(|c| {
        let (at, since, last, told) = c.get();
        if at != page || now.saturating_sub(last) > gap {
            c.set((page, now, now, false));
            return None;
        }
        let waited = Duration::from_nanos(now.saturating_sub(since));
        if !told && waited > crate::shared::SLOW_FAULT {
            c.set((at, since, now, true));
            return Some(waited);
        }
        c.set((at, since, now, told));
        None
    })
}

impl Shared {
    /// Body of a fault-handler thread: serves the faults queued on
    /// userfaultfd `shard` and, when it has none, on the next one. Each
    /// shard is watched by two handlers (with one shard, all of them): a
    /// fault wakes two threads rather than every handler, and a handler
    /// stuck in a slow store read does not stall its shard.
    pub(crate) fn handler_main(self: Arc<Self>, shard: usize) {
        use std::os::fd::AsFd;
        let n = self.uffds.len();
        let own = &self.uffds[shard % n];
        let next = &self.uffds[(shard + 1) % n];
        let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
        let spin = self.cfg.handler_spin;
        let mut spin_until = std::time::Instant::now();
        while !self.stopping() {
            let mut raw = std::mem::take(&mut ctx.raw);
            let mut msgs = std::mem::take(&mut ctx.msgs);
            let read = match own.read_msgs(&mut raw, &mut msgs) {
                Ok(0) if n > 1 => next.read_msgs(&mut raw, &mut msgs),
                other => other,
            };
            match read {
                Ok(0) if !spin.is_zero() && std::time::Instant::now() < spin_until => {
                    // Just served a fault: the next one usually follows within
                    // microseconds. Yielding (not blocking) lets the woken
                    // thread run on this CPU and saves the cross-CPU wakeup
                    // of a blocked handler (30-70 us on this VM).
                    std::thread::yield_now();
                }
                Ok(0) => {
                    let ready = upager_sys::io::poll_fds(
                        [own.as_fd(), next.as_fd(), self.stop_fd().as_fd()],
                        IDLE,
                    );
                    if matches!(ready, Ok([false, false, false])) {
                        // Idle for a while: give back what a readahead run
                        // grew the buffer to (not between the faults of a
                        // scan: it would be zeroed again at the next fill).
                        self.shrink_ctx(&mut ctx);
                    }
                }
                Ok(_) => {
                    for m in &msgs {
                        if let Msg::PageFault {
                            addr, write, wp, ..
                        } = *m
                        {
                            let _ = self.handle_fault(&mut ctx, addr, write, wp);
                        }
                    }
                    spin_until = std::time::Instant::now() + spin;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::error!("reading userfaultfd failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            ctx.raw = raw;
            ctx.msgs = msgs;
        }
    }

    /// Resolves one fault at `addr` reported by the userfaultfd (handler
    /// mode) or handed over by an in-thread SIGBUS handler.
    pub(crate) fn handle_fault(&self, ctx: &mut Ctx, addr: u64, write: bool, wp: bool) -> Outcome {
        if self.cfg.fault_timing {
            ctx.mark = Some(std::time::Instant::now());
        }
        let Some(r) = self.table.lookup(addr) else {
            // Being unmapped: the unmap wakes the thread once the range is
            // inaccessible, and the retry gets SIGSEGV.
            self.counters.faults_stale.inc();
            return Outcome::Done;
        };
        self.resolve(ctx, &r, addr, write, wp)
    }

    /// Resolves a fault at `addr` in region `r` (pinned by the caller).
    /// `wp`: a write to a resident folio (a write-protect fault). With
    /// `ctx.in_signal`, takes only async-signal-safe steps and returns
    /// [`Outcome::HandOff`], having changed nothing, where it would need
    /// another.
    pub(crate) fn resolve(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        addr: u64,
        write: bool,
        wp: bool,
    ) -> Outcome {
        let in_thread = self.mode == FaultMode::InThread;
        let idx = ((addr - r.base()) >> r.shift) as usize;
        let w = r.state(idx);
        // A pooled region's folios are the pool's (poolfault.rs), but for
        // one whose read failed here: POISONED in this process's table.
        if r.pool.is_some() && folio::load(w).kind() != Kind::Poisoned {
            return self.resolve_pooled(ctx, r, idx);
        }
        // A fault at PTE level: a page table is under this run now (a huge
        // fill there must drop it first; see Area::take_table).
        if r.run_folios > 0 {
            r.note_table(idx, 1);
        }
        // The dirty limit: a write that would make a file folio dirty waits
        // for write-back above it, and is refused (SIGBUS) when the store
        // refuses writes. Reads never wait here.
        // (A pinned folio is exempt: it may not be dropped to refuse a write.)
        let s0 = folio::load(w);
        if (write || wp)
            && r.writable
            && !r.is_anon()
            && s0.kind() != Kind::Dirty
            && !s0.has(folio::PINNED)
        {
            if ctx.in_signal {
                if !self.budget.dirty_fits(r.folio) {
                    return Outcome::HandOff;
                }
            } else if !self.balance_dirty(r) && self.refuse_write(r, idx) {
                return Outcome::Done;
            }
        }
        loop {
            let s = folio::load(w);
            match s.kind() {
                Kind::Never | Kind::Evicted => {
                    if ctx.in_signal && !r.store.signal_safe() {
                        return Outcome::HandOff;
                    }
                    if let Some(old) =
                        folio::try_claim(w, |s| matches!(s.kind(), Kind::Never | Kind::Evicted))
                    {
                        // In a signal handler, counted when the fill is
                        // published (it may still be handed off).
                        if !ctx.in_signal {
                            self.counters.faults_missing.inc();
                        }
                        // A file with several writers is filled for
                        // reading: the write then faults on the protected
                        // folio, which makes its twin (twins.rs).
                        let write = (write && !r.twinning()).then_some(addr);
                        return self.fill(ctx, r, idx, old, write, false);
                    }
                }
                Kind::Busy if in_thread => {
                    // The faulting thread waits on the state word (a
                    // resolver thread does not: the faulting thread retries
                    // and waits itself).
                    if !ctx.in_signal {
                        return Outcome::Done;
                    }
                    self.note_reached(r, idx);
                    if folio::add_waiter(w) {
                        self.counters.faults_deferred.inc();
                        let v = folio::load(w);
                        if v.kind() == Kind::Busy && !v.has(folio::WAITER) {
                            // The BUSY period we registered in ended and a
                            // new one began (a wp fault, an eviction) that
                            // knows of no waiter: its owner would wake
                            // nobody. Register again. (Found by the shuttle
                            // model, tests/model.rs: a 20 ms stall per
                            // occurrence, the BUSY_WAIT timeout.)
                            continue;
                        }
                        if v.kind() == Kind::Busy {
                            futex::wait_low(w, v.0 as u32, Some(BUSY_WAIT));
                        }
                        if let Some(waited) = busy_waited(addr) {
                            self.note_slow_fault(r, idx, waited, true);
                        }
                        return Outcome::Done;
                    }
                }
                Kind::Busy => {
                    self.note_reached(r, idx);
                    if folio::add_waiter(w) {
                        self.counters.faults_deferred.inc();
                        return Outcome::Done;
                    }
                }
                Kind::Clean | Kind::Dirty if wp && r.writable => {
                    // Several writers of the file: a twin first (twins.rs).
                    let twin = match self.twin_charge(ctx.in_signal, r, idx, s) {
                        Ok(t) => t,
                        Err(out) => return out,
                    };
                    let claimed =
                        folio::try_claim(w, |s| matches!(s.kind(), Kind::Clean | Kind::Dirty));
                    self.twin_claimed(r, idx, claimed, twin);
                    if let Some(old) = claimed {
                        self.counters.faults_wp.inc();
                        r.trace.record(idx, Path::WpClaim, old.kind(), Kind::Busy);
                        let fresh = old.kind() == Kind::Clean;
                        if fresh {
                            self.dirty_add(r, 1);
                        }
                        // The first write to a larger folio dirties its
                        // page; a second (the folio DIRTY) the whole folio.
                        let page = (fresh && r.dirties_pages()).then(|| r.page_in_folio(idx, addr));
                        self.make_dirty(r, idx, ctx.in_signal, fresh, page);
                        return Outcome::Done;
                    }
                }
                Kind::Poisoned if in_thread => return Outcome::Sigbus,
                Kind::Poisoned if !self.info.uffd_poison => {
                    // No UFFDIO_POISON (before 6.6), and the folio's
                    // PROT_NONE was lifted (a region-wide mprotect): again,
                    // with the folio claimed. (Unclaimed, this raced the
                    // reclaimer clearing the poison — it restores access,
                    // then this took it away — and left a cleared folio
                    // PROT_NONE for ever: its accesses got EFAULT, and a
                    // neighbour's readahead run across it, two VMAs now,
                    // failed UFFDIO_COPY with ENOENT. Test
                    // read_errors_and_slow_reads_..., masked uffd_poison.)
                    let Some(old) = folio::try_claim(w, |s| s.kind() == Kind::Poisoned) else {
                        continue;
                    };
                    self.counters.faults_stale.inc();
                    self.protect_poisoned(r, idx);
                    let prev = folio::release(w, |_| old);
                    self.wake_if_waiter(r, idx, prev);
                    // The reclaimer may have taken the folio's poisoned
                    // entry meanwhile and passed over it (BUSY): queue it
                    // again (a second entry finds it cleared and is
                    // dropped).
                    self.lru.add_poisoned(r, idx);
                    let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
                    return Outcome::Done;
                }
                Kind::Clean | Kind::Dirty | Kind::Poisoned => {
                    // Resolved before we got here (or poisoned: the retry
                    // raises SIGBUS). Waking is harmless if no one waits.
                    self.counters.faults_stale.inc();
                    if !in_thread {
                        let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
                    }
                    return Outcome::Done;
                }
            }
        }
    }
}
