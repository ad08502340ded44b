//! In-thread fault resolution ([`FaultMode::InThread`]): the faulting thread
//! resolves its own fault in a SIGBUS handler.
//!
//! A pager in this mode opens its userfaultfd with `UFFD_FEATURE_SIGBUS`, so
//! a fault in one of its regions raises SIGBUS in the faulting thread
//! instead of waking a handler thread on another CPU (50-60 µs on a VM).
//! The handler (`upager_sys::signal`, one per process) calls [`on_fault`],
//! which finds the region in the process-wide [`REGISTRY`] and runs the
//! same resolution as a handler thread ([`Shared::resolve`]) with
//! `Ctx::in_signal` set; the access retries when the handler returns.
//!
//! Contract (what a signal handler may do, and how this keeps to it):
//! - No allocation and no lock the interrupted thread may hold. The region
//!   is found in a [`SignalSafeCell`] (atomic counters, no thread-local
//!   state); scratch space comes from a pool taken with `try_lock`; the
//!   fill reads with `pread` (stores that say [`Store::signal_safe`]),
//!   installs with `UFFDIO_COPY`, and queues on the LRU with a lock that is
//!   only tried, into lists with room kept spare. Engine code never touches
//!   region memory while it holds an engine lock, so the interrupted thread
//!   holds none of those.
//! - Whatever needs more (reclaim when the budget is full, the dirty limit,
//!   a store that may allocate, an error to report, a poisoned fill) is
//!   undone and handed to a resolver thread through a slot of
//!   [`Handoff`](crate::shared::Handoff); the faulting thread waits on the
//!   slot's futex (with a timeout, in a loop) and retries the access. A
//!   fault on a resolver thread itself (a store's read touching region
//!   memory) is resolved in place, without the hand-off.
//! - A folio BUSY elsewhere: set WAITER and wait on the low half of its
//!   state word (futex, bounded); whoever releases it wakes the waiters.
//! - Not ours (no region at the address, a poisoned folio whose marker
//!   raises `BUS_MCEERR_AR`, another library's mapping): the signal goes to
//!   the handler installed before upager's, or gets the default action.
//! - A region being unmapped: the handler sleeps briefly and lets the
//!   access retry until the range is inaccessible (then it gets SIGSEGV),
//!   as a handler-mode fault stays blocked until then.
//! - Stack: the handler runs on the thread's stack; the fill path keeps
//!   its buffers in the pooled context, not on the stack.
//!
//! Registry order: a region is registered after it is in the pager's
//! table and unregistered after its range is inaccessible (region
//! teardown), so a SIGBUS at a live region's address always finds it.
//!
//! Counters: `faults_in_thread`, `faults_handed_off`.
//!
//! Uses: `area`, `config`, `fault`, `fill`, `shared`.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, TryLockError};
use std::time::Duration;

use upager_sys::futex;
use upager_sys::signal::{self, BusFault};
use upager_sys::snapshot::SignalSafeCell;

use crate::area::{Area, Inflight};
use crate::fill::Outcome;
use crate::shared::{Ctx, Shared};

#[cfg(doc)]
use crate::{config::FaultMode, store::Store};

/// One registered region of an in-thread pager.
#[derive(Clone)]
struct Entry {
    base: u64,
    end: u64,
    area: Arc<Area>,
    shared: Arc<Shared>,
}

/// Every in-thread pager's regions, sorted by address.
static REGISTRY: LazyLock<SignalSafeCell<Vec<Entry>>> =
    LazyLock::new(|| SignalSafeCell::new(Vec::new()));

/// The address ranges of the last [`TOMBSTONES`] regions unregistered: a
/// SIGBUS raised by an access before its region became inaccessible can be
/// delivered after the region left [`REGISTRY`] (the thread was preempted
/// between the fault and its handler); passed on as foreign, it killed the
/// process (3 of 4 runs of two readers racing an unmap did). A
/// SIGBUS in such a range is retried: the access now gets SIGSEGV.
static TOMBS: LazyLock<SignalSafeCell<Vec<(u64, u64)>>> =
    LazyLock::new(|| SignalSafeCell::new(Vec::new()));

/// Ranges kept in [`TOMBS`] (a guess: far more regions than are unmapped
/// while a thread sits between a fault and its handler).
const TOMBSTONES: usize = 64;

thread_local! {
    /// The last address this thread retried because it was in a tombstone
    /// (const-initialised, no destructor): a second SIGBUS at the same
    /// address is not a late one (the range was reused by a mapping that
    /// raises SIGBUS of its own) and is passed on.
    static TOMB_RETRY: Cell<u64> = const { Cell::new(0) };
}

thread_local! {
    /// This thread is a resolver (const-initialised, no destructor: safe to
    /// read in a signal handler).
    static RESOLVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Slot states of a hand-off.
const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const POSTED: u32 = 2;
const TAKEN: u32 = 3;
const DONE: u32 = 4;

/// How long a faulting thread sleeps before retrying an access to a region
/// being unmapped.
const DYING_RETRY: Duration = Duration::from_micros(100);
/// Longest single futex wait of a faulting thread (it re-checks and waits
/// again: a stuck resolver shows as a loop, not a hang in the kernel).
const HANDOFF_WAIT: Duration = Duration::from_millis(100);

/// Installs the process's SIGBUS handler (once).
pub(crate) fn install() -> std::io::Result<()> {
    LazyLock::force(&REGISTRY);
    signal::install_sigbus(on_fault)
}

/// Makes region `r` of `sh` visible to the SIGBUS handler.
pub(crate) fn register(sh: &Arc<Shared>, r: &Arc<Area>) {
    let (base, end) = (r.base(), r.base() + r.map_len());
    TOMBS.update(|t| {
        t.iter()
            .filter(|&&(b, e)| e <= base || b >= end)
            .copied()
            .collect()
    });
    let e = Entry {
        base: r.base(),
        end: r.base() + r.map_len(),
        area: Arc::clone(r),
        shared: Arc::clone(sh),
    };
    REGISTRY.update(|v| {
        let mut n = v.clone();
        let i = n.partition_point(|x| x.base < e.base);
        n.insert(i, e);
        n
    });
}

/// Before a fork (the `prepare` handler): the registry and tombstones are
/// initialised (a child must not find their initialisation in progress on
/// a thread it does not have).
pub(crate) fn before_fork() {
    LazyLock::force(&REGISTRY);
    LazyLock::force(&TOMBS);
}

/// In a fork child, before its engines start: empties the registry and
/// the tombstones. Their entries are the parent's regions (whose ranges
/// the child maps again, on its own engines); they are leaked, not
/// dropped, and a reader or writer the parent had in flight is forgotten
/// (its thread does not exist here).
pub(crate) fn forget_parent() {
    REGISTRY.replace_in_child(Vec::new());
    TOMBS.replace_in_child(Vec::new());
}

/// Removes region `id` from the registry (after its range is inaccessible).
pub(crate) fn unregister(id: u64, sh: &Shared) {
    let mine = |e: &Entry| e.area.id == id && std::ptr::eq(Arc::as_ptr(&e.shared), sh);
    let range = REGISTRY.read(|v| v.iter().find(|e| mine(e)).map(|e| (e.base, e.end)));
    if let Some(range) = range {
        TOMBS.update(|t| {
            let mut n = t.clone();
            if n.len() >= TOMBSTONES {
                n.remove(0);
            }
            n.push(range);
            n
        });
    }
    REGISTRY.update(|v| v.iter().filter(|e| !mine(e)).cloned().collect());
}

/// A SIGBUS at `addr` that no live region claims: true if it is a late one
/// from a region unmapped since (retry the access: it gets SIGSEGV now).
fn late_from_unmapped(addr: u64) -> bool {
    if !TOMBS.read(|t| t.iter().any(|&(b, e)| b <= addr && addr < e)) {
        return false;
    }
    TOMB_RETRY.with(|last| {
        if last.get() == addr {
            last.set(0);
            false
        } else {
            last.set(addr);
            true
        }
    })
}

/// What the registry says about a faulting address.
enum Found {
    Region(Inflight, Arc<Shared>),
    Dying,
    NotOurs,
}

/// The resolver given to the SIGBUS handler: true if the fault was in an
/// in-thread region (resolved, or to be retried).
fn on_fault(f: &BusFault) -> bool {
    let found = REGISTRY.read(|v| {
        let i = v.partition_point(|e| e.base <= f.addr);
        let Some(e) = i.checked_sub(1).and_then(|i| v.get(i)) else {
            return Found::NotOurs;
        };
        if f.addr >= e.end {
            return Found::NotOurs;
        }
        match Inflight::enter(&e.area) {
            Some(g) => Found::Region(g, Arc::clone(&e.shared)),
            None => Found::Dying,
        }
    });
    match found {
        Found::NotOurs => late_from_unmapped(f.addr),
        Found::Dying => {
            std::thread::sleep(DYING_RETRY);
            true
        }
        Found::Region(g, sh) => {
            let resolved = sh.resolve_in_thread(&g, f);
            // The registry entry (alive while `g` pins the region) holds
            // another reference: this one is never the last.
            drop(sh);
            drop(g);
            resolved
        }
    }
}

impl Shared {
    /// Resolves a fault in region `r` from the SIGBUS handler of the
    /// faulting thread. False: the access must get SIGBUS (a poisoned
    /// folio).
    fn resolve_in_thread(&self, r: &Arc<Area>, f: &BusFault) -> bool {
        self.counters.faults_in_thread.inc();
        // Unknown (not x86-64): fill for reading; a write to a resident
        // folio is the only other reason to fault.
        let (write, wp) = (f.write.unwrap_or(false), f.write.unwrap_or(true));
        if RESOLVER_THREAD.get() {
            // A resolver's own access (a store's read touching region
            // memory): nobody else would resolve it; do it here in full.
            let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
            return self.resolve(&mut ctx, r, f.addr, write, wp) != Outcome::Sigbus;
        }
        let ctx = self.sig_ctxs.iter().find_map(|m| match m.try_lock() {
            Ok(c) => Some(c),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        });
        let out = match ctx {
            Some(mut ctx) => {
                if self.cfg.fault_timing {
                    ctx.mark = Some(std::time::Instant::now());
                }
                self.resolve(&mut ctx, r, f.addr, write, wp)
            }
            None => Outcome::HandOff,
        };
        match out {
            Outcome::HandOff => {
                self.counters.faults_handed_off.inc();
                self.hand_off(r, f);
                true
            }
            Outcome::Sigbus => false,
            Outcome::Done => true,
        }
    }

    /// Posts the fault to a resolver thread and waits until it is done.
    /// With every slot taken, yields and lets the access retry.
    fn hand_off(&self, r: &Area, f: &BusFault) {
        let Some(slot) = self.handoff.slots.iter().find(|s| {
            s.state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        }) else {
            std::thread::yield_now();
            return;
        };
        slot.addr.store(f.addr, Ordering::Relaxed);
        slot.write
            .store(f.write.map_or(2, u32::from), Ordering::Relaxed);
        slot.state.store(POSTED, Ordering::Release);
        self.handoff.bell.fetch_add(1, Ordering::AcqRel);
        futex::wake(&self.handoff.bell, 1);
        let started = std::time::Instant::now();
        let mut told = false;
        loop {
            let st = slot.state.load(Ordering::Acquire);
            if st == DONE || self.stopping() {
                break;
            }
            futex::wait(&slot.state, st, Some(HANDOFF_WAIT));
            if !told && started.elapsed() > crate::shared::SLOW_FAULT {
                told = true;
                let idx = ((f.addr - r.base()) >> r.shift) as usize;
                self.note_slow_fault(r, idx, started.elapsed(), true);
            }
        }
        // A resolver that took the slot finishes with it before DONE; only
        // on shutdown can it still be POSTED (no resolver runs any more).
        slot.state.store(FREE, Ordering::Release);
    }

    /// Body of a resolver thread (in-thread mode's handler threads):
    /// resolves handed-off faults in normal context (reclaim, the dirty
    /// limit, any store), then wakes the faulting thread.
    pub(crate) fn resolver_main(self: Arc<Self>) {
        RESOLVER_THREAD.set(true);
        let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
        while !self.stopping() {
            let seen = self.handoff.bell.load(Ordering::Acquire);
            let mut served = false;
            for slot in &self.handoff.slots {
                if slot
                    .state
                    .compare_exchange(POSTED, TAKEN, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                let addr = slot.addr.load(Ordering::Relaxed);
                let (write, wp) = match slot.write.load(Ordering::Relaxed) {
                    0 => (false, false),
                    1 => (true, true),
                    _ => (false, true),
                };
                let _ = self.handle_fault(&mut ctx, addr, write, wp);
                slot.state.store(DONE, Ordering::Release);
                futex::wake(&slot.state, 1);
                served = true;
            }
            if !served && !futex::wait(&self.handoff.bell, seen, Some(crate::shared::IDLE)) {
                // Idle for a while: give back what a readahead run grew the
                // buffer to.
                self.shrink_ctx(&mut ctx);
            }
        }
    }
}
