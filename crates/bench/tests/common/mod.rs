//! Helpers shared by the bench crate's integration tests.
// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use upager_bench::env::in_ci;
use upager_bench::{Report, WorkerExe};

/// The worker binary the scenarios run in.
pub fn exe() -> WorkerExe {
    WorkerExe::Binary(env!("CARGO_BIN_EXE_upager-bench-worker").into())
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by every test of a file so they run one at a time: they share zram0
/// and the cgroup, and their worker processes load both CPUs (a parallel
/// test's worker took the CPU that the remote-flush count needs half the time
/// in CI, halving the IPIs sent).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Prints the report's table and asserts that every engine ran, without
/// error, and measured something.
pub fn assert_all_ran(r: &Report) {
    println!("{}", r.table());
    assert!(!r.runs.is_empty());
    for run in &r.runs {
        assert!(
            run.error.is_none(),
            "{} {}: {:?}",
            run.engine,
            run.variant,
            run.error
        );
        let m = run.measurement.as_ref().unwrap();
        assert!(
            m.ops > 0 && m.elapsed_s > 0.0,
            "{} {}: {m:?}",
            run.engine,
            run.variant
        );
    }
}

/// A test, or part of one, cannot run here: `missing` says what is missing
/// (root, a RAM block device, Python with numpy and upager). Under
/// `CI=true` this fails the test, so CI never reports green for a test that
/// did not run; elsewhere it prints `skipping: <missing>` and the caller
/// returns.
#[track_caller]
pub fn skip_or_fail(missing: &str) {
    if in_ci() {
        panic!("{missing} (under CI=true a test that cannot run fails instead of skipping)");
    }
    eprintln!("skipping: {missing}");
}

/// Whether the tests run as root; if not, [`skip_or_fail`] with `what`
/// and return false.
#[track_caller]
pub fn require_root(what: &str) -> bool {
    if upager_bench::env::is_root() {
        return true;
    }
    skip_or_fail(&format!("not root: {what} needs root"));
    false
}

/// Every upager engine's fault-mode counters agree with its name: an
/// engine named `… in-thread …` took faults in the faulting thread, every
/// other upager engine took none there.
pub fn assert_fault_modes_honoured(r: &Report) {
    for run in &r.runs {
        let Some(m) = &run.measurement else { continue };
        let Some(&n) = m.extra.get("upager.faults_in_thread") else {
            continue;
        };
        if run.engine.contains("in-thread") {
            assert!(n > 0.0, "{}: no fault was resolved in-thread", run.engine);
            assert_eq!(
                m.extra["upager.fault_mode_in_thread"], 1.0,
                "{}",
                run.engine
            );
        } else {
            assert_eq!(n, 0.0, "{}: {n} faults resolved in-thread", run.engine);
        }
    }
}
