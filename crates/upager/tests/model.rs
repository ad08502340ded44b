//! Model checking the folio state word and the protocols built on it, with
//! shuttle (randomized and PCT schedules of real threads, every atomic
//! operation and lock a scheduling point).
//!
//! The state-word code is the engine's own: `src/folio.rs` is compiled into
//! this test crate (`#[path]`), against the `sync` module below, whose
//! `AtomicU64` is shuttle's inside a model run and `std`'s outside it (the
//! file's own unit tests run here too, outside any model), and whose
//! `yield_now`/`sleep` are shuttle yields. The protocols of `fault.rs`
//! (with `fill.rs`, `dirty.rs`, `huge.rs`), `gather.rs`, `reclaim.rs` and
//! `inthread.rs` are transcribed step by step (those files need a kernel);
//! each step names its function.
//!
//! The kernel is a model too: per folio `{present, write_protected, data}`
//! plus `unsaved` (a store landed that the store does not have), the wait
//! queue of `handle_userfault` (a fault re-checks the page under the lock
//! before it sleeps, as `userfaultfd_must_wait` does; `UFFDIO_WAKE` wakes
//! every waiter of the range) and a futex (`FUTEX_WAIT` compares the word
//! under the lock; no timeout, so a missed wake is a deadlock that shuttle
//! reports). The store is `{data}` per folio, with injected write failures.
//!
//! Invariants, each an assertion where it can first be seen broken:
//! - (a) a folio is dropped (MADV_DONTNEED, or published CLEAN) only with
//!   no unsaved store in it: a dirty folio goes only after its write-back
//!   succeeded, and nothing was written after that write-back read it.
//! - (b) a store lands only in a DIRTY folio or one BUSY with an owner that
//!   will publish it DIRTY or write it back after the store (never CLEAN,
//!   never in a write-back past its protect step: checked by `unsaved` at
//!   write-back time and at the drop).
//! - (c) every load returns the last store that landed; after a final flush
//!   the store holds it.
//! - (d) no folio is left BUSY or with WAITER.
//! - (e) nobody waits forever: every fault asleep in the kernel or on the
//!   futex is woken (shuttle fails a run whose threads all block).
//!
//! Knobs: `UPAGER_MODEL_ITERS` (schedules per model, default below),
//! `UPAGER_MODEL_SEED` (a random seed instead of the fixed one).

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use shuttle::scheduler::{PctScheduler, RandomScheduler, Scheduler};
use shuttle::sync::{Arc, Condvar, Mutex};
use shuttle::{thread, Runner};

/// What `src/folio.rs` imports as `crate::sync`: shuttle's primitives in a
/// model run, `std`'s outside one.
mod sync {
    pub(crate) use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn in_model() -> bool {
        shuttle::current::try_get_current_task().is_some()
    }

    /// An `AtomicU64` that is shuttle's (each operation a scheduling point)
    /// inside a model run and `std`'s outside it. A value lives on one side
    /// only: the models create their words inside the run.
    pub(crate) struct AtomicU64 {
        model: shuttle::sync::atomic::AtomicU64,
        plain: std::sync::atomic::AtomicU64,
    }

    impl AtomicU64 {
        pub(crate) const fn new(v: u64) -> Self {
            AtomicU64 {
                model: shuttle::sync::atomic::AtomicU64::new(v),
                plain: std::sync::atomic::AtomicU64::new(v),
            }
        }
        pub(crate) fn load(&self, o: Ordering) -> u64 {
            if in_model() {
                self.model.load(o)
            } else {
                self.plain.load(o)
            }
        }
        pub(crate) fn compare_exchange_weak(
            &self,
            cur: u64,
            new: u64,
            s: Ordering,
            f: Ordering,
        ) -> Result<u64, u64> {
            if in_model() {
                self.model.compare_exchange_weak(cur, new, s, f)
            } else {
                self.plain.compare_exchange_weak(cur, new, s, f)
            }
        }
        pub(crate) fn fetch_or(&self, v: u64, o: Ordering) -> u64 {
            if in_model() {
                self.model.fetch_or(v, o)
            } else {
                self.plain.fetch_or(v, o)
            }
        }
        pub(crate) fn fetch_and(&self, v: u64, o: Ordering) -> u64 {
            if in_model() {
                self.model.fetch_and(v, o)
            } else {
                self.plain.fetch_and(v, o)
            }
        }
    }

    pub(crate) fn yield_now() {
        if in_model() {
            shuttle::thread::yield_now();
        } else {
            std::thread::yield_now();
        }
    }

    /// Shuttle has no time: a sleep is a yield.
    pub(crate) fn sleep(d: Duration) {
        if in_model() {
            shuttle::thread::yield_now();
        } else {
            std::thread::sleep(d);
        }
    }
}

#[allow(dead_code)]
#[path = "../src/folio.rs"]
mod folio;

use folio::{Kind, State, QUEUED, WAITER};

// ---------------------------------------------------------------------------
// Configuration of one model.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Faults sleep in the kernel; handler threads resolve them.
    Handlers,
    /// The faulting thread resolves its own fault (SIGBUS handler), handing
    /// off to a resolver thread what it cannot do.
    InThread,
}

/// The in-thread fill's order of LRU queueing and installing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InThreadFill {
    /// The fill before the lost-write fixes (then in fault.rs): copy (writable for a
    /// write), then try the LRU lock; on failure MADV_DONTNEED the folio
    /// and restore its old state.
    CopyThenQueue,
    /// Try the LRU lock first; on failure nothing was installed (fill.rs
    /// `fill_claimed` since the lost-write fixes).
    QueueThenCopy,
}

/// How an in-thread fault that found the folio BUSY waits (fault.rs
/// `resolve`, arm `Kind::Busy if in_thread`): `add_waiter`, load the word
/// again, and futex-wait on the value loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BusyWait {
    /// fault.rs today: wait if the value loaded is BUSY. Between
    /// `add_waiter` and the load the BUSY period can end and another begin
    /// (no WAITER in it): its owner sees no waiter and wakes nobody, and
    /// the fault sleeps until the futex timeout (`BUSY_WAIT`, 20 ms).
    AnyBusy,
    /// Wait only if the value loaded is BUSY with WAITER (else register
    /// again): the owner of that BUSY period will see the WAITER.
    OwnWaiter,
}

/// One application access.
#[derive(Debug, Clone, Copy)]
enum Op {
    Load(usize),
    Store(usize, u64),
}

#[derive(Debug, Clone)]
struct Cfg {
    mode: Mode,
    fill: InThreadFill,
    busy_wait: BusyWait,
    /// Read fills go as huge.rs `install_huge` does for a 2 MiB folio:
    /// UFFDIO_MOVE installs it writable, then it is write-protected, then
    /// a digest of the view against the staged data tells whether a write
    /// landed in between (the folio is then published DIRTY).
    huge: bool,
    /// A deliberately broken batch: write back before the protect step
    /// (the model must catch the store that lands in between).
    writeback_before_protect: bool,
    /// Resident folios the budget allows (0: no limit). A fill charges
    /// one (handler or resolver: reclaiming directly while it is full,
    /// `Shared::reserve`; a SIGBUS handler: only tries, else undoes and
    /// hands off), an eviction returns them.
    budget: usize,
    folios: usize,
    /// Per application thread, its accesses in order.
    apps: Vec<Vec<Op>>,
    /// Handler threads (handlers mode) or resolver threads (in-thread).
    resolvers: usize,
    /// Eviction batches the evictor thread runs (0: no evictor).
    evictions: usize,
    /// Flushes the flusher thread runs (0: no flusher).
    flushes: usize,
    /// Store writes that fail before they start succeeding.
    write_failures: u32,
}

/// What the store holds before any write.
const INITIAL: u64 = 7;

// ---------------------------------------------------------------------------
// The kernel, the store and the engine's shared state.

#[derive(Debug, Clone, Copy, Default)]
struct Page {
    present: bool,
    wp: bool,
    data: u64,
    /// A store landed that no write-back has read since.
    unsaved: bool,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    folio: usize,
    write: bool,
    wp: bool,
}

struct Kernel {
    pages: Vec<Page>,
    /// Per folio, bumped by UFFDIO_WAKE: a faulting thread sleeps until it
    /// changes.
    wake_gen: Vec<u64>,
    /// The userfaultfd's message queue (handlers mode).
    msgs: VecDeque<Msg>,
    stop: bool,
    /// Per folio, the last store that landed.
    landed: Vec<Option<u64>>,
}

struct Store {
    data: Vec<u64>,
    failures_left: u32,
}

struct Handoff {
    posted: VecDeque<(usize, Msg)>,
    done: Vec<bool>,
    stop: bool,
}

struct World {
    cfg: Cfg,
    states: Vec<sync::AtomicU64>,
    kernel: Mutex<Kernel>,
    kcv: Condvar,
    store: Mutex<Store>,
    lru: Mutex<VecDeque<usize>>,
    /// Resident folios charged.
    budget: Mutex<usize>,
    futex: Mutex<Vec<u64>>,
    fcv: Condvar,
    handoff: Mutex<Handoff>,
    hcv: Condvar,
    /// Recent events, dumped when an invariant fails (a rare failure
    /// explains itself).
    log: Mutex<Vec<String>>,
}

/// How a resolution attempt ended (fill.rs `Outcome`, less `Sigbus`: the
/// model has no poison).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    HandOff,
}

macro_rules! check {
    ($w:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $w.fail(&format!($($msg)+));
        }
    };
}

impl World {
    fn new(cfg: Cfg) -> World {
        let n = cfg.folios;
        let apps = cfg.apps.len();
        let failures_left = cfg.write_failures;
        World {
            states: (0..n).map(|_| sync::AtomicU64::new(0)).collect(),
            kernel: Mutex::new(Kernel {
                pages: vec![Page::default(); n],
                wake_gen: vec![0; n],
                msgs: VecDeque::new(),
                stop: false,
                landed: vec![None; n],
            }),
            kcv: Condvar::new(),
            store: Mutex::new(Store {
                data: vec![INITIAL; n],
                failures_left,
            }),
            lru: Mutex::new(VecDeque::new()),
            budget: Mutex::new(0),
            futex: Mutex::new(vec![0; n]),
            fcv: Condvar::new(),
            handoff: Mutex::new(Handoff {
                posted: VecDeque::new(),
                done: vec![false; apps],
                stop: false,
            }),
            hcv: Condvar::new(),
            log: Mutex::new(Vec::new()),
            cfg,
        }
    }

    fn note(&self, s: String) {
        let mut l = self.log.lock().unwrap();
        if l.len() >= 64 {
            l.remove(0);
        }
        l.push(s);
    }

    fn fail(&self, what: &str) -> ! {
        let mut out = format!("invariant violated: {what}\nrecent events:\n");
        if let Ok(l) = self.log.try_lock() {
            for e in l.iter() {
                let _ = writeln!(out, "  {e}");
            }
        }
        panic!("{out}");
    }

    fn state(&self, i: usize) -> State {
        folio::load(&self.states[i])
    }

    // -- the kernel's operations (each one step under the page-table lock) --

    /// UFFDIO_COPY (DONTWAKE): installs `data`, write-protected if `wp`.
    fn k_copy(&self, i: usize, data: u64, wp: bool) {
        let mut k = self.kernel.lock().unwrap();
        check!(
            self,
            !k.pages[i].present,
            "UFFDIO_COPY over a present page (folio {i})"
        );
        k.pages[i] = Page {
            present: true,
            wp,
            data,
            unsaved: false,
        };
        drop(k);
        self.note(format!("copy f{i} data={data} wp={wp}"));
    }

    /// UFFDIO_WRITEPROTECT, without waking.
    fn k_writeprotect(&self, i: usize, on: bool) {
        let mut k = self.kernel.lock().unwrap();
        if k.pages[i].present {
            k.pages[i].wp = on;
        }
        drop(k);
        self.note(format!("writeprotect f{i} {on}"));
    }

    /// MADV_DONTNEED: the page's data is gone. Invariant (a): nothing in it
    /// that the store lacks.
    fn k_dontneed(&self, i: usize, who: &str) {
        let mut k = self.kernel.lock().unwrap();
        let p = k.pages[i];
        if p.present && p.unsaved {
            drop(k);
            self.fail(&format!(
                "lost write: {who} dropped folio {i} holding store {} that the store does not have",
                p.data
            ));
        }
        k.pages[i] = Page::default();
        drop(k);
        self.note(format!("dontneed f{i} ({who})"));
    }

    /// UFFDIO_WAKE over the folio: every fault asleep on it retries.
    fn k_wake(&self, i: usize) {
        let mut k = self.kernel.lock().unwrap();
        k.wake_gen[i] += 1;
        drop(k);
        self.kcv.notify_all();
    }

    fn futex_wait(&self, i: usize, val: u32) {
        let mut f = self.futex.lock().unwrap();
        if self.state(i).0 as u32 != val {
            return;
        }
        let gen = f[i];
        while f[i] == gen {
            f = self.fcv.wait(f).unwrap();
        }
    }

    fn futex_wake(&self, i: usize) {
        let mut f = self.futex.lock().unwrap();
        f[i] += 1;
        drop(f);
        self.fcv.notify_all();
    }

    // -- the store --

    fn store_read(&self, i: usize) -> u64 {
        self.store.lock().unwrap().data[i]
    }

    /// Writes the folio's page to the store (the view is read while the
    /// page is write-protected: checked).
    fn store_write(&self, i: usize) -> bool {
        self.store_write_as(i, true)
    }

    /// `store_write` without the protection check, for the broken batch
    /// (its loss must be caught where the data goes).
    fn store_write_unchecked(&self, i: usize) -> bool {
        self.store_write_as(i, false)
    }

    fn store_write_as(&self, i: usize, protected: bool) -> bool {
        let mut s = self.store.lock().unwrap();
        if s.failures_left > 0 {
            s.failures_left -= 1;
            drop(s);
            self.note(format!("write-back f{i} FAILED"));
            return false;
        }
        let mut k = self.kernel.lock().unwrap();
        let p = k.pages[i];
        check!(
            self,
            p.present,
            "write-back of folio {i}, which is not present"
        );
        check!(
            self,
            p.wp || !protected,
            "write-back of folio {i} while it is writable: a store may land after it"
        );
        s.data[i] = p.data;
        k.pages[i].unsaved = false;
        drop(k);
        drop(s);
        self.note(format!("write-back f{i} data={}", p.data));
        true
    }

    // -- shared.rs: wakes --

    /// `wake_folios`: UFFDIO_WAKE in handlers mode, the futex in-thread.
    fn wake_folio(&self, i: usize) {
        match self.cfg.mode {
            Mode::Handlers => self.k_wake(i),
            Mode::InThread => self.futex_wake(i),
        }
    }

    fn wake_if_waiter(&self, i: usize, prev: State) {
        if prev.has(WAITER) {
            self.wake_folio(i);
        }
    }

    /// Ends a BUSY period (folio::release) after checking what the new
    /// state promises about the page.
    fn publish(&self, i: usize, f: impl Fn(State) -> State, who: &str) -> State {
        let new = f(self.state(i));
        {
            let k = self.kernel.lock().unwrap();
            let p = k.pages[i];
            match new.kind() {
                Kind::Clean => {
                    check!(
                        self,
                        p.present && p.wp,
                        "{who}: CLEAN folio {i} not write-protected: {p:?}"
                    );
                    check!(
                        self,
                        !p.unsaved,
                        "{who}: folio {i} published CLEAN with an unsaved store: {p:?}"
                    );
                }
                Kind::Dirty => check!(self, p.present, "{who}: DIRTY folio {i} not present"),
                Kind::Never | Kind::Evicted => {
                    check!(
                        self,
                        !p.present,
                        "{who}: folio {i} released {:?} but mapped",
                        new.kind()
                    )
                }
                k => self.fail(&format!("{who}: released to {k:?}")),
            }
        }
        let prev = folio::release(&self.states[i], f);
        self.note(format!("{who}: f{i} {:?} -> {:?}", prev, self.state(i)));
        prev
    }

    fn lru_add(&self, i: usize) {
        self.lru.lock().unwrap().push_back(i);
    }

    // -- application accesses --

    fn access(&self, app: usize, op: Op) {
        match self.cfg.mode {
            Mode::Handlers => self.access_handlers(op),
            Mode::InThread => self.access_in_thread(app, op),
        }
    }

    /// Tries the access on the page; `Err(present)` if it faults. Checks
    /// (b) for a store that lands and (c) for a load.
    fn try_access(&self, op: Op) -> Result<(), bool> {
        let mut k = self.kernel.lock().unwrap();
        match op {
            Op::Load(i) => {
                let p = k.pages[i];
                if !p.present {
                    return Err(false);
                }
                let want = k.landed[i].unwrap_or(INITIAL);
                check!(
                    self,
                    p.data == want,
                    "load of folio {i} read {} after store {want} landed",
                    p.data
                );
                Ok(())
            }
            Op::Store(i, v) => {
                let p = k.pages[i];
                if !p.present || p.wp {
                    return Err(p.present);
                }
                let s = self.state(i);
                check!(
                    self,
                    matches!(s.kind(), Kind::Dirty | Kind::Busy),
                    "store {v} landed in folio {i} in state {s:?} (not DIRTY/BUSY)"
                );
                k.pages[i].data = v;
                k.pages[i].unsaved = true;
                k.landed[i] = Some(v);
                drop(k);
                self.note(format!("store f{i} = {v} landed"));
                Ok(())
            }
        }
    }

    /// Handlers mode: a fault sleeps in the kernel until a wake, then the
    /// access retries.
    fn access_handlers(&self, op: Op) {
        loop {
            let Err(present) = self.try_access(op) else {
                return;
            };
            let (i, write) = match op {
                Op::Load(i) => (i, false),
                Op::Store(i, _) => (i, true),
            };
            // handle_userfault: queue the message and sleep, re-checking
            // the page under the lock first (it may have been resolved
            // since the access).
            let mut k = self.kernel.lock().unwrap();
            let p = k.pages[i];
            let still = if write {
                !p.present || p.wp
            } else {
                !p.present
            };
            if !still {
                continue;
            }
            let gen = k.wake_gen[i];
            k.msgs.push_back(Msg {
                folio: i,
                write,
                wp: present,
            });
            self.kcv.notify_all();
            while k.wake_gen[i] == gen {
                k = self.kcv.wait(k).unwrap();
            }
        }
    }

    /// In-thread: the faulting thread runs `resolve` itself (SIGBUS
    /// handler), and on `HandOff` posts the fault to a resolver thread and
    /// waits for it (inthread.rs `hand_off`).
    fn access_in_thread(&self, app: usize, op: Op) {
        loop {
            if self.try_access(op).is_ok() {
                return;
            }
            // resolve_in_thread: on x86-64 wp = write.
            let (i, write) = match op {
                Op::Load(i) => (i, false),
                Op::Store(i, _) => (i, true),
            };
            if self.resolve(true, i, write, write) == Outcome::HandOff {
                let mut h = self.handoff.lock().unwrap();
                h.done[app] = false;
                h.posted.push_back((
                    app,
                    Msg {
                        folio: i,
                        write,
                        wp: write,
                    },
                ));
                self.hcv.notify_all();
                while !h.done[app] {
                    h = self.hcv.wait(h).unwrap();
                }
            }
        }
    }

    // -- fault.rs, dirty.rs and fill.rs --

    /// Handler thread (`handler_main`) or resolver thread (`resolver_main`).
    fn resolver_main(&self) {
        match self.cfg.mode {
            Mode::Handlers => loop {
                let mut k = self.kernel.lock().unwrap();
                let m = loop {
                    if let Some(m) = k.msgs.pop_front() {
                        break Some(m);
                    }
                    if k.stop {
                        break None;
                    }
                    k = self.kcv.wait(k).unwrap();
                };
                drop(k);
                let Some(m) = m else { return };
                let _ = self.resolve(false, m.folio, m.write, m.wp);
            },
            Mode::InThread => loop {
                let mut h = self.handoff.lock().unwrap();
                let p = loop {
                    if let Some(p) = h.posted.pop_front() {
                        break Some(p);
                    }
                    if h.stop {
                        break None;
                    }
                    h = self.hcv.wait(h).unwrap();
                };
                drop(h);
                let Some((app, m)) = p else { return };
                let _ = self.resolve(false, m.folio, m.write, m.wp);
                self.handoff.lock().unwrap().done[app] = true;
                self.hcv.notify_all();
            },
        }
    }

    /// `Shared::resolve` (the dirty limit, poison and prefetch left out).
    fn resolve(&self, in_signal: bool, i: usize, write: bool, wp: bool) -> Outcome {
        let in_thread = self.cfg.mode == Mode::InThread;
        let w = &self.states[i];
        loop {
            let s = folio::load(w);
            match s.kind() {
                Kind::Never | Kind::Evicted => {
                    if let Some(old) =
                        folio::try_claim(w, |s| matches!(s.kind(), Kind::Never | Kind::Evicted))
                    {
                        return self.fill(in_signal, i, old, write);
                    }
                }
                Kind::Busy if in_thread => {
                    if !in_signal {
                        return Outcome::Done;
                    }
                    if folio::add_waiter(w) {
                        let v = folio::load(w);
                        let wait = match self.cfg.busy_wait {
                            BusyWait::AnyBusy => v.kind() == Kind::Busy,
                            BusyWait::OwnWaiter => v.kind() == Kind::Busy && v.has(WAITER),
                        };
                        if wait {
                            self.futex_wait(i, v.0 as u32);
                        } else if self.cfg.busy_wait == BusyWait::OwnWaiter
                            && v.kind() == Kind::Busy
                        {
                            continue; // another BUSY period: register in it
                        }
                        return Outcome::Done;
                    }
                }
                Kind::Busy => {
                    if folio::add_waiter(w) {
                        return Outcome::Done;
                    }
                }
                Kind::Clean | Kind::Dirty if wp => {
                    if folio::try_claim(w, |s| matches!(s.kind(), Kind::Clean | Kind::Dirty))
                        .is_some()
                    {
                        self.make_dirty(i);
                        return Outcome::Done;
                    }
                }
                Kind::Clean | Kind::Dirty => {
                    if !in_thread {
                        self.k_wake(i);
                    }
                    return Outcome::Done;
                }
                Kind::Poisoned => self.fail("poisoned folio in a model without poison"),
            }
        }
    }

    /// `make_dirty`: unprotect without waking, publish DIRTY, wake.
    fn make_dirty(&self, i: usize) {
        self.k_writeprotect(i, false);
        let prev = self.publish(i, |s| s.with_kind(Kind::Dirty), "make_dirty");
        // wake_resolved
        match self.cfg.mode {
            Mode::InThread if !prev.has(WAITER) => {}
            _ => self.wake_folio(i),
        }
    }

    /// `fill` + `fill_claimed` for one folio (no readahead, no budget).
    fn fill(&self, in_signal: bool, i: usize, old: State, write: bool) -> Outcome {
        if in_signal {
            if !self.try_charge() {
                self.note(format!("fill f{i}: no budget in the handler"));
                return self.fill_undo(i, old, false);
            }
        } else {
            self.reserve(i);
        }
        let data = self.store_read(i);
        let queue = !self.state(i).has(QUEUED);
        let try_queue = || -> bool {
            if !queue {
                return true;
            }
            match self.lru.try_lock() {
                Ok(mut l) => {
                    l.push_back(i);
                    true
                }
                Err(_) => false,
            }
        };
        if in_signal && self.cfg.fill == InThreadFill::QueueThenCopy && !try_queue() {
            self.note(format!("fill f{i}: LRU try-lock failed before the copy"));
            return self.fill_undo(i, old, true);
        }
        // Write faults install writable (DIRTY), read faults protected.
        let mut raced = false;
        if self.cfg.huge && !write {
            self.k_copy(i, data, false); // UFFDIO_MOVE: writable
            self.k_writeprotect(i, true);
            raced = self.kernel.lock().unwrap().pages[i].data != data;
        } else {
            self.k_copy(i, data, !write);
        }
        if in_signal && self.cfg.fill == InThreadFill::CopyThenQueue && !try_queue() {
            self.note(format!("fill f{i}: LRU try-lock failed after the copy"));
            self.k_dontneed(i, "in-thread fill undo");
            return self.fill_undo(i, old, true);
        }
        let kind = if write || raced {
            Kind::Dirty
        } else {
            Kind::Clean
        };
        let prev = self.publish(i, |s| s.with_kind(kind).set(QUEUED, true), "fill");
        match self.cfg.mode {
            Mode::InThread => {
                if prev.has(WAITER) {
                    self.futex_wake(i);
                }
            }
            Mode::Handlers => self.k_wake(i),
        }
        if !in_signal && queue {
            self.lru_add(i);
        }
        Outcome::Done
    }

    /// `fill_undo`: the folio goes back to its old state.
    fn fill_undo(&self, i: usize, old: State, charged: bool) -> Outcome {
        if charged {
            self.uncharge(1);
        }
        let prev = self.publish(i, |_| old, "fill_undo");
        self.wake_if_waiter(i, prev);
        Outcome::HandOff
    }

    // -- budget.rs and reclaim.rs --

    fn try_charge(&self) -> bool {
        let mut b = self.budget.lock().unwrap();
        if self.cfg.budget > 0 && *b >= self.cfg.budget {
            return false;
        }
        *b += 1;
        true
    }

    fn uncharge(&self, n: usize) {
        let mut b = self.budget.lock().unwrap();
        check!(self, *b >= n, "budget returned more than charged");
        *b -= n;
    }

    /// `Shared::reserve` + `Budget::charge`: direct reclaim while the
    /// budget is full. The engine gives up (SIGBUS) after 5 s without
    /// progress; here 200 rounds in which nothing could be evicted are a
    /// failure (the model has no time, and nothing in it is slow).
    fn reserve(&self, i: usize) {
        if self.try_charge() {
            return;
        }
        let mut idle = 0;
        loop {
            let progressed = self.evict_batch() > 0;
            if self.try_charge() {
                return;
            }
            if progressed {
                idle = 0;
            } else {
                idle += 1;
                check!(
                    self,
                    idle < 200,
                    "fill of folio {i}: no budget and nothing to evict"
                );
                thread::yield_now();
            }
        }
    }

    // -- reclaim.rs and gather.rs --

    /// `evict_batch`: `isolate` under one LRU lock, then the batch.
    fn evict_batch(&self) -> usize {
        let mut victims = Vec::new();
        {
            let mut lru = self.lru.lock().unwrap();
            for _ in 0..lru.len() + 2 {
                let Some(i) = lru.pop_front() else { break };
                match self.state(i).kind() {
                    Kind::Clean | Kind::Dirty => {
                        match folio::try_claim(&self.states[i], |s| {
                            matches!(s.kind(), Kind::Clean | Kind::Dirty)
                        }) {
                            Some(old) => {
                                folio::set_flag(&self.states[i], QUEUED, false);
                                self.note(format!("isolate f{i} ({:?})", old.kind()));
                                victims.push((i, old));
                            }
                            None => lru.push_back(i),
                        }
                    }
                    Kind::Busy => lru.push_back(i),
                    _ => {} // drop_stale
                }
            }
        }
        self.finish_batch(victims, false)
    }

    /// `Region::flush`: `Gather::collect` (claim_when_idle DIRTY, running
    /// what it holds before a wait) then the batch in write-back mode.
    fn flush(&self) -> bool {
        let held = std::cell::RefCell::new(Vec::new());
        let failed = std::cell::Cell::new(false);
        for i in 0..self.cfg.folios {
            let got = folio::claim_when_idle(
                &self.states[i],
                |s| s.kind() == Kind::Dirty,
                || {
                    let b = std::mem::take(&mut *held.borrow_mut());
                    let n = b.len();
                    if self.finish_batch(b, true) < n {
                        failed.set(true);
                    }
                },
            );
            if let Some(old) = got {
                held.borrow_mut().push((i, old));
            }
        }
        let b = held.take();
        let n = b.len();
        if self.finish_batch(b, true) < n {
            failed.set(true);
        }
        !failed.get()
    }

    /// `finish_batch`: protect the dirty victims, write them back, then
    /// (eviction) drop all and release EVICTED, or (write-back) release
    /// CLEAN; a failed write-back leaves its folio DIRTY and queued.
    fn finish_batch(&self, victims: Vec<(usize, State)>, writeback: bool) -> usize {
        let early = self.cfg.writeback_before_protect;
        let mut ok = vec![true; victims.len()];
        for (k, &(i, old)) in victims.iter().enumerate() {
            if old.kind() == Kind::Dirty && early {
                ok[k] = self.store_write_unchecked(i);
            }
        }
        for &(i, old) in &victims {
            if old.kind() == Kind::Dirty {
                self.k_writeprotect(i, true);
            }
        }
        let mut kept = Vec::new();
        for (k, (i, old)) in victims.into_iter().enumerate() {
            let ok = old.kind() != Kind::Dirty || if early { ok[k] } else { self.store_write(i) };
            if ok {
                kept.push((i, old));
                continue;
            }
            let prev = self.publish(
                i,
                |s| s.with_kind(Kind::Dirty).set(QUEUED, true),
                "write-back failed",
            );
            self.wake_if_waiter(i, prev);
            if !prev.has(QUEUED) {
                self.lru_add(i);
            }
        }
        let n = kept.len();
        if writeback {
            for (i, _) in kept {
                let prev = self.publish(i, |s| s.with_kind(Kind::Clean), "flush");
                self.wake_if_waiter(i, prev);
            }
            return n;
        }
        for &(i, _) in &kept {
            self.k_dontneed(i, "eviction");
        }
        for (i, _) in kept {
            let prev = self.publish(i, |s| s.with_kind(Kind::Evicted), "evict");
            self.wake_if_waiter(i, prev);
        }
        self.uncharge(n);
        n
    }
}

// ---------------------------------------------------------------------------
// One run of a model.

fn run_model(cfg: &Cfg) {
    let w = Arc::new(World::new(cfg.clone()));
    let resolvers: Vec<_> = (0..cfg.resolvers)
        .map(|_| {
            let w = Arc::clone(&w);
            thread::spawn(move || w.resolver_main())
        })
        .collect();
    let apps: Vec<_> = cfg
        .apps
        .iter()
        .cloned()
        .enumerate()
        .map(|(a, ops)| {
            let w = Arc::clone(&w);
            thread::spawn(move || {
                for op in ops {
                    w.access(a, op);
                }
            })
        })
        .collect();
    let evictor = (cfg.evictions > 0).then(|| {
        let w = Arc::clone(&w);
        let n = cfg.evictions;
        thread::spawn(move || {
            for _ in 0..n {
                w.evict_batch();
                thread::yield_now();
            }
        })
    });
    let flusher = (cfg.flushes > 0).then(|| {
        let w = Arc::clone(&w);
        let n = cfg.flushes;
        thread::spawn(move || {
            for _ in 0..n {
                let _ = w.flush();
            }
        })
    });
    for t in apps {
        t.join().unwrap();
    }
    for t in evictor.into_iter().chain(flusher) {
        t.join().unwrap();
    }
    w.kernel.lock().unwrap().stop = true;
    w.kcv.notify_all();
    w.handoff.lock().unwrap().stop = true;
    w.hcv.notify_all();
    for t in resolvers {
        t.join().unwrap();
    }
    // (d) nothing BUSY, nobody registered as waiting.
    for i in 0..cfg.folios {
        let s = w.state(i);
        check!(
            w,
            s.kind() != Kind::Busy && !s.has(WAITER),
            "folio {i} left {s:?}"
        );
    }
    // (c) a final flush (retried past injected failures) leaves the last
    // landed store in the store, and the view agrees.
    let mut tries = 0;
    while !w.flush() {
        tries += 1;
        check!(w, tries < 8, "final flush keeps failing");
    }
    let k = w.kernel.lock().unwrap();
    let st = w.store.lock().unwrap();
    let resident = k.pages.iter().filter(|p| p.present).count();
    let charged = *w.budget.lock().unwrap();
    check!(
        w,
        charged == resident,
        "budget holds {charged} folios, {resident} resident"
    );
    for i in 0..cfg.folios {
        let want = k.landed[i].unwrap_or(INITIAL);
        check!(
            w,
            st.data[i] == want,
            "folio {i}: store has {} after flush, last store {want}",
            st.data[i]
        );
        let p = k.pages[i];
        check!(
            w,
            !p.present || (p.data == want && !p.unsaved),
            "folio {i}: view {p:?}, last store {want}"
        );
        let s = w.state(i);
        check!(w, s.kind() != Kind::Dirty, "folio {i} DIRTY after a flush");
    }
}

/// Schedules per model: `UPAGER_MODEL_ITERS`, else `default`.
fn iters(default: usize) -> usize {
    std::env::var("UPAGER_MODEL_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("UPAGER_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_f011)
}

/// Runs `cfg` under PCT (depth 3) and the random scheduler, `n` schedules
/// each. Returns the schedules run.
fn check_model(name: &str, cfg: Cfg, n: usize) -> usize {
    let t = Instant::now();
    let mut total = 0;
    let schedulers: Vec<Box<dyn Scheduler + Send>> = vec![
        Box::new(PctScheduler::new_from_seed(seed(), 3, n)),
        Box::new(RandomScheduler::new_from_seed(seed() ^ 1, n)),
    ];
    for s in schedulers {
        let cfg = cfg.clone();
        total += Runner::new(s, quiet()).run(move || run_model(&cfg));
    }
    eprintln!(
        "model {name}: {total} schedules, {:.1} s",
        t.elapsed().as_secs_f64()
    );
    total
}

/// Runs `f` until a schedule fails, at most `n` schedules under PCT
/// (depth 3), then `n` under the random scheduler: the failure's message
/// and the schedules it took, or None.
fn find_failure(n: usize, f: impl Fn() + Send + Sync + 'static) -> Option<(String, usize)> {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let t = Instant::now();
    let counter = std::sync::Arc::new(AtomicUsize::new(0));
    let f = std::sync::Arc::new(f);
    let schedulers: Vec<Box<dyn Scheduler + Send>> = vec![
        Box::new(PctScheduler::new_from_seed(seed(), 3, n)),
        Box::new(RandomScheduler::new_from_seed(seed() ^ 1, n)),
    ];
    for s in schedulers {
        let (c2, f2) = (std::sync::Arc::clone(&counter), std::sync::Arc::clone(&f));
        let res = catch_unwind(AssertUnwindSafe(move || {
            Runner::new(s, quiet()).run(move || {
                c2.fetch_add(1, Relaxed);
                f2();
            })
        }));
        if let Err(e) = res {
            let ran = counter.load(Relaxed);
            let msg = panic_message(&*e);
            eprintln!(
                "failure found after {ran} schedules, {:.1} s: {}",
                t.elapsed().as_secs_f64(),
                msg.lines().next().unwrap_or("")
            );
            return Some((msg, ran));
        }
    }
    None
}

/// Shuttle's configuration, without its warning that it runs every
/// ordering as SeqCst (said once in docs/reliability.md).
fn quiet() -> shuttle::Config {
    let mut c = shuttle::Config::new();
    c.silence_warnings = true;
    c
}

fn base(mode: Mode) -> Cfg {
    Cfg {
        mode,
        fill: InThreadFill::CopyThenQueue,
        busy_wait: BusyWait::OwnWaiter,
        huge: false,
        writeback_before_protect: false,
        budget: 0,
        folios: 1,
        apps: vec![],
        resolvers: 1,
        evictions: 0,
        flushes: 0,
        write_failures: 0,
    }
}

// ---------------------------------------------------------------------------
// The models.

/// The state word alone, every schedule (DFS): of two claims racing with a
/// flag being set, exactly one wins; the release keeps the flag set under
/// it (release's CAS loop must not lose it) and clears nothing but WAITER.
#[test]
fn state_word_claims_are_exclusive_and_keep_flags() {
    let t = Instant::now();
    let n = Runner::new(shuttle::scheduler::DfsScheduler::new(None, false), quiet()).run(|| {
        let w = Arc::new(World::new(base(Mode::Handlers)));
        w.states[0].fetch_or(State(0).with_kind(Kind::Clean).0, sync::Ordering::AcqRel);
        let won = Arc::new(Mutex::new(0));
        let claimers: Vec<_> = (0..2)
            .map(|_| {
                let (w, won) = (Arc::clone(&w), Arc::clone(&won));
                thread::spawn(move || {
                    if folio::try_claim(&w.states[0], |s| s.kind() == Kind::Clean).is_some() {
                        *won.lock().unwrap() += 1;
                        let prev = folio::release(&w.states[0], |s| s.with_kind(Kind::Dirty));
                        assert_eq!(prev.kind(), Kind::Busy);
                    }
                })
            })
            .collect();
        let flagger = {
            let w = Arc::clone(&w);
            thread::spawn(move || folio::set_flag(&w.states[0], folio::ACTIVE, true))
        };
        for t in claimers.into_iter().chain([flagger]) {
            t.join().unwrap();
        }
        let s = w.state(0);
        assert_eq!(*won.lock().unwrap(), 1, "claims that won");
        assert_eq!(s.kind(), Kind::Dirty);
        assert!(
            s.has(folio::ACTIVE),
            "release lost a flag set while BUSY: {s:?}"
        );
    });
    eprintln!(
        "state word claims: {n} schedules (all), {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(n > 100, "DFS explored only {n} schedules");
}

/// One waiter, the BUSY owner and a second claimer. The waiter runs
/// fault.rs `resolve`'s `Kind::Busy if in_thread` arm (in a signal handler,
/// waiting as `rule` says) until the folio is not BUSY; the owner releases
/// it CLEAN and, if `wake`, wakes the waiters its release reports; the
/// claimer (a write-protect fault) claims it CLEAN, releases it DIRTY and
/// wakes likewise.
fn waiter_model(rule: BusyWait, wake: bool) {
    let w = Arc::new(World::new(base(Mode::InThread)));
    let claimed = folio::try_claim(&w.states[0], |s| s.kind() == Kind::Never);
    assert!(claimed.is_some());
    let waiter = {
        let w = Arc::clone(&w);
        thread::spawn(move || loop {
            if !folio::add_waiter(&w.states[0]) {
                break;
            }
            let v = folio::load(&w.states[0]);
            let wait = match rule {
                BusyWait::AnyBusy => v.kind() == Kind::Busy,
                BusyWait::OwnWaiter => v.kind() == Kind::Busy && v.has(WAITER),
            };
            if wait {
                w.futex_wait(0, v.0 as u32);
            }
        })
    };
    let owner = {
        let w = Arc::clone(&w);
        thread::spawn(move || {
            let prev = folio::release(&w.states[0], |s| s.with_kind(Kind::Clean));
            if wake {
                w.wake_if_waiter(0, prev);
            }
        })
    };
    let claimer = {
        let w = Arc::clone(&w);
        thread::spawn(move || {
            if folio::try_claim(&w.states[0], |s| s.kind() == Kind::Clean).is_some() {
                let prev = folio::release(&w.states[0], |s| s.with_kind(Kind::Dirty));
                if wake {
                    w.wake_if_waiter(0, prev);
                }
            }
        })
    };
    for t in [waiter, owner, claimer] {
        t.join().unwrap();
    }
    assert!(!w.state(0).has(WAITER));
    assert_ne!(w.state(0).kind(), Kind::Busy);
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// The state word alone: a fault that registers as waiter
/// and waits only on a BUSY value that has its WAITER is always woken,
/// whatever the order of the releases and of a second claim (invariant
/// (e)).
#[test]
fn state_word_waiter_is_always_woken() {
    let t = Instant::now();
    let n = iters(2000) * 4;
    let s = PctScheduler::new_from_seed(seed(), 3, n);
    let ran = Runner::new(s, quiet()).run(|| waiter_model(BusyWait::OwnWaiter, true));
    eprintln!(
        "state word waiter: {ran} schedules, {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// The model stays honest about (e): owners that forget the wake leave the
/// waiter asleep in some schedule, and the checker reports the hang.
#[test]
fn state_word_missed_wake_is_found() {
    let found = find_failure(20_000, || waiter_model(BusyWait::OwnWaiter, false));
    let (msg, _) = found.expect("the checker did not find the missed wake");
    assert!(msg.contains("deadlock"), "unexpected failure: {msg}");
}

/// Found by this model: fault.rs's in-thread BUSY wait (`add_waiter`, load,
/// futex-wait if the value is BUSY) can sleep on a later BUSY period whose
/// owner never saw a WAITER: no wake comes, and only the futex timeout
/// (`BUSY_WAIT`, 20 ms) ends the sleep. The checker must find that.
#[test]
fn state_word_in_thread_busy_wait_misses_a_wake() {
    let found = find_failure(20_000, || waiter_model(BusyWait::AnyBusy, true));
    let (msg, _) = found.expect("the checker did not find the missed wake of AnyBusy");
    assert!(msg.contains("deadlock"), "unexpected failure: {msg}");
}

/// Handlers mode, one folio: a reader-then-writer and a second writer
/// against two handler threads, an evictor (two batches) and a flush.
#[test]
fn handlers_faults_evict_flush() {
    let cfg = Cfg {
        apps: vec![
            vec![Op::Load(0), Op::Store(0, 11), Op::Store(0, 12)],
            vec![Op::Store(0, 21), Op::Load(0)],
        ],
        resolvers: 2,
        evictions: 2,
        flushes: 1,
        ..base(Mode::Handlers)
    };
    check_model("handlers_faults_evict_flush", cfg, iters(2000));
}

/// Handlers mode, two folios, the store failing its first write-back (the
/// folio must stay resident and DIRTY, and a later batch write it).
#[test]
fn handlers_two_folios_writeback_failure() {
    let cfg = Cfg {
        folios: 2,
        apps: vec![
            vec![Op::Store(0, 11), Op::Load(1), Op::Store(1, 12)],
            vec![Op::Load(0), Op::Store(1, 21), Op::Store(0, 22)],
        ],
        resolvers: 1,
        evictions: 2,
        flushes: 1,
        write_failures: 1,
        ..base(Mode::Handlers)
    };
    check_model("handlers_two_folios_writeback_failure", cfg, iters(2000));
}

/// Handlers mode, huge-folio read fills (installed writable by the move,
/// then protected, a write in between caught by the digest): a reader and
/// two writers race the fill, with an evictor and a flush.
#[test]
fn handlers_huge_read_fill_window() {
    let cfg = Cfg {
        huge: true,
        apps: vec![
            vec![Op::Load(0), Op::Store(0, 11)],
            vec![Op::Store(0, 21), Op::Load(0)],
            vec![Op::Load(0)],
        ],
        resolvers: 2,
        evictions: 1,
        flushes: 1,
        ..base(Mode::Handlers)
    };
    check_model("handlers_huge_read_fill_window", cfg, iters(2000));
}

/// The model stays honest about (a) and (b): a batch that writes back
/// before it write-protects lets a store land after the write-back, and the
/// eviction that follows drops it; the checker must find that.
#[test]
fn handlers_writeback_before_protect_loses_a_write() {
    let cfg = Cfg {
        writeback_before_protect: true,
        apps: vec![
            vec![Op::Store(0, 11), Op::Store(0, 12)],
            vec![Op::Store(0, 21)],
        ],
        resolvers: 1,
        evictions: 2,
        ..base(Mode::Handlers)
    };
    let found = find_failure(iters(2000).max(20_000), move || run_model(&cfg));
    let (msg, _) = found.expect("the checker did not find the write-back-first loss");
    assert!(
        msg.contains("lost write") || msg.contains("unsaved"),
        "unexpected failure: {msg}"
    );
}

/// Handlers mode, a budget of one folio for two, no background evictor:
/// every fill of the second folio reclaims the first directly, while a
/// flush holds claims (it runs them before it waits on a BUSY folio).
#[test]
fn handlers_direct_reclaim_budget_of_one() {
    let cfg = Cfg {
        folios: 2,
        budget: 1,
        apps: vec![
            vec![Op::Store(0, 11), Op::Store(1, 12), Op::Load(0)],
            vec![Op::Load(1), Op::Store(0, 21)],
        ],
        resolvers: 2,
        flushes: 2,
        ..base(Mode::Handlers)
    };
    check_model("handlers_direct_reclaim_budget_of_one", cfg, iters(2000));
}

/// In-thread mode, a budget of one folio for two: a SIGBUS handler finding
/// it full undoes the fill and hands off to the resolver, which reclaims.
#[test]
fn in_thread_direct_reclaim_budget_of_one() {
    let cfg = Cfg {
        fill: InThreadFill::QueueThenCopy,
        folios: 2,
        budget: 1,
        apps: vec![
            vec![Op::Store(0, 11), Op::Store(1, 12), Op::Load(0)],
            vec![Op::Load(1), Op::Store(0, 21)],
        ],
        resolvers: 1,
        flushes: 2,
        ..base(Mode::InThread)
    };
    check_model("in_thread_direct_reclaim_budget_of_one", cfg, iters(2000));
}

/// The in-thread configuration shared by the fill-order models: two
/// writers of one folio, a resolver, an evictor whose isolation holds the
/// LRU lock (so a SIGBUS handler's try-lock can fail) and a flush.
fn in_thread_writers(fill: InThreadFill) -> Cfg {
    Cfg {
        fill,
        apps: vec![
            vec![Op::Store(0, 11), Op::Load(0)],
            vec![Op::Store(0, 21), Op::Store(0, 22)],
        ],
        resolvers: 1,
        evictions: 2,
        flushes: 1,
        ..base(Mode::InThread)
    }
}

/// In-thread mode with the fill queued on the LRU before the copy: a
/// failed try-lock leaves nothing installed, and no write is lost.
#[test]
fn in_thread_queue_then_copy_loses_nothing() {
    check_model(
        "in_thread_queue_then_copy",
        in_thread_writers(InThreadFill::QueueThenCopy),
        iters(2000),
    );
}

/// Found by this model: in the full in-thread protocol too, the BUSY wait
/// as fault.rs has it sleeps through a wake (here without the futex
/// timeout that bounds it in the engine).
#[test]
fn in_thread_any_busy_wait_misses_a_wake() {
    let cfg = Cfg {
        busy_wait: BusyWait::AnyBusy,
        ..in_thread_writers(InThreadFill::QueueThenCopy)
    };
    let found = find_failure(iters(2000).max(20_000), move || run_model(&cfg));
    let (msg, _) = found.expect("the checker did not find the missed wake of AnyBusy");
    assert!(msg.contains("deadlock"), "unexpected failure: {msg}");
}

/// In-thread mode, two folios and a failing write-back, fill queued first.
#[test]
fn in_thread_two_folios_writeback_failure() {
    let cfg = Cfg {
        fill: InThreadFill::QueueThenCopy,
        folios: 2,
        apps: vec![
            vec![Op::Store(0, 11), Op::Load(1), Op::Store(1, 12)],
            vec![Op::Load(0), Op::Store(1, 21), Op::Store(0, 22)],
        ],
        resolvers: 1,
        evictions: 2,
        flushes: 1,
        write_failures: 1,
        ..base(Mode::InThread)
    };
    check_model("in_thread_two_folios_writeback_failure", cfg, iters(2000));
}

/// The model stays honest: the in-thread fill as it was before the lost-write fixes
/// (install writable, then try the LRU lock, and on failure MADV_DONTNEED
/// and restore the old state) loses a store another thread made in
/// between, and the checker must find that schedule.
#[test]
fn in_thread_copy_then_queue_loses_a_write() {
    let cfg = in_thread_writers(InThreadFill::CopyThenQueue);
    let found = find_failure(iters(2000).max(20_000), move || run_model(&cfg));
    let (msg, _) = found.expect("the checker did not find the lost write of copy-then-queue");
    assert!(msg.contains("lost write"), "unexpected failure: {msg}");
}
