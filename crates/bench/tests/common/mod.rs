//! Helpers shared by the bench crate's integration tests.

use std::sync::{Mutex, MutexGuard};

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
