//! The stress run at CI size: the same workload as the
//! `upager-stress` binary (crates/stress/src/workload.rs, included here), for
//! `UPAGER_STRESS_SECS` seconds (default 20). Worker threads write, read and
//! verify checksummed records over two file regions and one anonymous
//! region, each three times the budget, with write errors, short writes,
//! read errors and slow I/O injected, while regions are mapped and unmapped,
//! flushed, paged out and discarded; residency is sampled from outside
//! (mincore) every millisecond; at the end every record is checked with
//! plain reads of the files.
//!
//! For hours: `cargo run --release -p upager-stress -- --duration 4h`.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

#[allow(dead_code)]
#[path = "../../stress/src/workload.rs"]
mod workload;

use std::time::Duration;

#[test]
fn stress_with_faults_injected_loses_no_write_and_holds_the_budget() {
    let secs: f64 = std::env::var("UPAGER_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20.0);
    let dir = common::ram_dir();
    let mut cfg = workload::Config::ci(dir.path(), Duration::from_secs_f64(secs));
    cfg.progress = Some(Duration::from_secs(5));
    let limit = cfg.duration + Duration::from_secs(60);
    // Run on a thread so a hang fails the test after `limit` instead of
    // blocking CI.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(workload::run(cfg));
    });
    let summary = match rx.recv_timeout(limit) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => panic!("stress run failed: {e}"),
        Err(_) => panic!("stress run did not finish within {limit:?}"),
    };
    eprintln!("{summary}");
    assert!(summary.final_writes_verified > 10_000, "{summary}");
    assert!(summary.faults_injected > 100, "{summary}");
    assert!(summary.churn_cycles >= 1, "{summary}");
    assert!(
        summary.max_mapped <= summary.budget + summary.batch_bytes,
        "{summary}"
    );
}
