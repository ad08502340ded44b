//! The folio state word under the C11 memory model, with loom: every
//! interleaving (within a preemption bound) and the weak-memory behaviours
//! that the orderings in `src/folio.rs` allow. Shuttle (`tests/model.rs`)
//! runs the protocols with every atomic as SeqCst; these small models check
//! that the orderings themselves are enough:
//!
//! - what a filler writes before `release` is visible to a thread that
//!   then sees the folio CLEAN through `load` (Acquire/Release), and to one
//!   that claims it (`try_claim`, AcqRel): loom reports the read of the
//!   data as a race otherwise;
//! - of two claims, one wins, and a flag set while BUSY survives `release`;
//! - a fault whose `add_waiter` succeeded is always seen by the owner's
//!   `release` (WAITER in the value it replaced): no missed wake.
//!
//! As in `tests/model.rs`, `src/folio.rs` is compiled into this crate
//! against a `sync` of its own: loom's `AtomicU64` and yield inside a
//! model, `std`'s outside (the file's unit tests). `LOOM_MAX_PREEMPTIONS`
//! bounds the preemptions (default 3 here, about 1 s for the file);
//! `UPAGER_LOOM_UNBOUNDED=1` (with `LOOM_MAX_PREEMPTIONS` unset) explores
//! every interleaving (90 s).

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use loom::sync::Arc;
use loom::thread;

thread_local! {
    /// A loom model runs on this OS thread (loom runs its threads as
    /// coroutines of the thread that called `check`).
    static IN_MODEL: Cell<bool> = const { Cell::new(false) };
}

/// What `src/folio.rs` imports as `crate::sync`.
mod sync {
    pub(crate) use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn in_model() -> bool {
        super::IN_MODEL.with(Cell::get)
    }
    use std::cell::Cell;

    /// loom's `AtomicU64` when created inside a model, `std`'s otherwise.
    pub(crate) enum AtomicU64 {
        Model(loom::sync::atomic::AtomicU64),
        Plain(std::sync::atomic::AtomicU64),
    }

    impl AtomicU64 {
        pub(crate) fn new(v: u64) -> Self {
            if in_model() {
                AtomicU64::Model(loom::sync::atomic::AtomicU64::new(v))
            } else {
                AtomicU64::Plain(std::sync::atomic::AtomicU64::new(v))
            }
        }
        pub(crate) fn load(&self, o: Ordering) -> u64 {
            match self {
                AtomicU64::Model(a) => a.load(o),
                AtomicU64::Plain(a) => a.load(o),
            }
        }
        pub(crate) fn compare_exchange_weak(
            &self,
            cur: u64,
            new: u64,
            s: Ordering,
            f: Ordering,
        ) -> Result<u64, u64> {
            match self {
                AtomicU64::Model(a) => a.compare_exchange_weak(cur, new, s, f),
                AtomicU64::Plain(a) => a.compare_exchange_weak(cur, new, s, f),
            }
        }
        pub(crate) fn fetch_or(&self, v: u64, o: Ordering) -> u64 {
            match self {
                AtomicU64::Model(a) => a.fetch_or(v, o),
                AtomicU64::Plain(a) => a.fetch_or(v, o),
            }
        }
        pub(crate) fn fetch_and(&self, v: u64, o: Ordering) -> u64 {
            match self {
                AtomicU64::Model(a) => a.fetch_and(v, o),
                AtomicU64::Plain(a) => a.fetch_and(v, o),
            }
        }
    }

    pub(crate) fn yield_now() {
        if in_model() {
            loom::thread::yield_now();
        } else {
            std::thread::yield_now();
        }
    }

    pub(crate) fn sleep(d: Duration) {
        if in_model() {
            loom::thread::yield_now();
        } else {
            std::thread::sleep(d);
        }
    }
}

#[allow(dead_code)]
#[path = "../src/folio.rs"]
mod folio;

use folio::{Kind, State, ACTIVE, WAITER};

/// Runs `f` under loom (preemptions bounded by `LOOM_MAX_PREEMPTIONS`,
/// default 3); returns the interleavings explored.
fn check(name: &str, f: impl Fn() + Sync + Send + 'static) -> usize {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let t = Instant::now();
    let before = RUNS.load(std::sync::atomic::Ordering::Relaxed);
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() && std::env::var_os("UPAGER_LOOM_UNBOUNDED").is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(move || {
        IN_MODEL.with(|m| m.set(true));
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    IN_MODEL.with(|m| m.set(false));
    // Tests run in parallel: the count is this test's only if it ran alone
    // (cargo test -- --test-threads=1); it is a lower bound of the total.
    let n = RUNS.load(std::sync::atomic::Ordering::Relaxed) - before;
    eprintln!(
        "loom {name}: {n} interleavings, {:.1} s",
        t.elapsed().as_secs_f64()
    );
    n
}

fn word(k: Kind) -> sync::AtomicU64 {
    sync::AtomicU64::new(State(0).with_kind(k).0)
}

/// A fill writes the folio's data, then publishes CLEAN; a reader that
/// sees CLEAN, and an evictor that claims the folio, must both see that
/// data. The data is a Relaxed atomic, so loom lets a read return any
/// value the memory model allows: without the Release of `release`
/// pairing with the Acquire of `load` (and of `try_claim`'s AcqRel), a
/// stale 0 would be one.
#[test]
fn loom_publish_is_seen_with_its_data() {
    use std::sync::atomic::Ordering::Relaxed;
    check("publish", || {
        let w = Arc::new(word(Kind::Never));
        let page = Arc::new(loom::sync::atomic::AtomicU64::new(0));
        assert!(folio::try_claim(&w, |s| s.kind() == Kind::Never).is_some());
        let filler = {
            let (w, page) = (Arc::clone(&w), Arc::clone(&page));
            thread::spawn(move || {
                page.store(42, Relaxed);
                folio::release(&w, |s| s.with_kind(Kind::Clean));
            })
        };
        let reader = {
            let (w, page) = (Arc::clone(&w), Arc::clone(&page));
            thread::spawn(move || {
                if folio::load(&w).kind() == Kind::Clean {
                    assert_eq!(page.load(Relaxed), 42, "saw CLEAN without its data");
                }
            })
        };
        let evictor = {
            let (w, page) = (Arc::clone(&w), Arc::clone(&page));
            thread::spawn(move || {
                if folio::try_claim(&w, |s| s.kind() == Kind::Clean).is_some() {
                    assert_eq!(page.load(Relaxed), 42, "claimed CLEAN without its data");
                    folio::release(&w, |s| s.with_kind(Kind::Evicted));
                }
            })
        };
        filler.join().unwrap();
        reader.join().unwrap();
        evictor.join().unwrap();
    });
}

/// Of two claims of a CLEAN folio, exactly one wins; a flag set while it
/// is BUSY survives the winner's `release`.
#[test]
fn loom_one_claim_wins_and_flags_survive() {
    check("claims", || {
        let w = Arc::new(word(Kind::Clean));
        let won = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let claimers: Vec<_> = (0..2)
            .map(|_| {
                let (w, won) = (Arc::clone(&w), Arc::clone(&won));
                thread::spawn(move || {
                    if folio::try_claim(&w, |s| s.kind() == Kind::Clean).is_some() {
                        won.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        folio::release(&w, |s| s.with_kind(Kind::Dirty));
                    }
                })
            })
            .collect();
        folio::set_flag(&w, ACTIVE, true);
        for c in claimers {
            c.join().unwrap();
        }
        assert_eq!(won.load(std::sync::atomic::Ordering::Relaxed), 1);
        let s = folio::load(&w);
        assert_eq!(s.kind(), Kind::Dirty);
        assert!(s.has(ACTIVE), "release lost a flag: {s:?}");
    });
}

/// A fault that registered as waiter (`add_waiter` true) is always in the
/// value the owner's `release` replaced (so the owner wakes it), unless it
/// registered in a later BUSY period; two faults register at once.
#[test]
fn loom_a_registered_waiter_is_seen_by_the_release() {
    check("waiter", || {
        let w = Arc::new(word(Kind::Never));
        assert!(folio::try_claim(&w, |s| s.kind() == Kind::Never).is_some());
        let registered = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let faults: Vec<_> = (0..2)
            .map(|_| {
                let (w, registered) = (Arc::clone(&w), Arc::clone(&registered));
                thread::spawn(move || {
                    if folio::add_waiter(&w) {
                        registered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let prev = folio::release(&w, |s| s.with_kind(Kind::Clean));
        for f in faults {
            f.join().unwrap();
        }
        // The faults ran in one BUSY period (nobody claims again): if any
        // registered, the release saw WAITER.
        if registered.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            assert!(
                prev.has(WAITER),
                "a registered waiter missed by release: {prev:?}"
            );
        }
        assert!(!folio::load(&w).has(WAITER));
    });
}

/// The check has teeth: the same publish with a Relaxed store of the state
/// word instead of `release` lets a reader see CLEAN and stale data, and
/// loom must find it.
#[test]
fn loom_a_relaxed_publish_is_caught() {
    use std::sync::atomic::Ordering::Relaxed;
    let res = std::panic::catch_unwind(|| {
        check("relaxed publish", || {
            let w = Arc::new(word(Kind::Busy));
            let page = Arc::new(loom::sync::atomic::AtomicU64::new(0));
            let filler = {
                let (w, page) = (Arc::clone(&w), Arc::clone(&page));
                thread::spawn(move || {
                    page.store(42, Relaxed);
                    if let sync::AtomicU64::Model(a) = &*w {
                        a.store(State(0).with_kind(Kind::Clean).0, Relaxed);
                    }
                })
            };
            if folio::load(&w).kind() == Kind::Clean {
                assert_eq!(page.load(Relaxed), 42, "saw CLEAN without its data");
            }
            filler.join().unwrap();
        });
    });
    IN_MODEL.with(|m| m.set(false));
    let e = res.expect_err("loom did not find the stale read of a Relaxed publish");
    let msg = e
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains("without its data"),
        "unexpected failure: {msg}"
    );
}
