//! Benchmark infrastructure of upager (issue 3): the environment the
//! comparisons run in, the kernel's own side of each seed experiment, TLB
//! shootdown counting from outside the measured code, and reports.
//!
//! - [`env`]: memory cgroup v1, ext4 on zram, a RAM swap device, dropping
//!   caches, pattern files, mTHP knobs; every change undone on drop and on
//!   Ctrl-C.
//! - [`tlb`]: TLB shootdowns from /proc/interrupts and from the
//!   `tlb:tlb_flush` tracepoint filtered to a process's thread group.
//! - [`workloads`] and [`worker`]: the kernel workloads, run in a child
//!   process (`upager-bench-worker`) placed in the cgroup before it starts.
//! - [`scenario`]: the scenarios of issue 3 as data, the [`Engine`] trait,
//!   the kernel baseline engine, and [`run_scenario`].
//! - [`report`]: JSON, medians of interleaved rounds, ratios, table, PNG.
//!
//! This crate measures the kernel against upager, so it depends on neither
//! of upager's crates; its few `unsafe` calls (mapping a file, MADV_DONTNEED,
//! getrusage, CPU pinning) are in one private module with their safety
//! arguments.
#![deny(unsafe_code)]

pub mod env;
mod raw;
pub mod report;
pub mod scenario;
pub mod tlb;
pub mod worker;
pub mod workloads;

pub use env::{BenchEnv, Cgroup, EnvConfig, SetupError, SwapDevice, SwapKind, ThpKnobs, ZramExt4};
pub use report::{plot, Report, ReportError};
pub use scenario::{
    prepare, run_scenario, scenario, scenarios, BenchError, Engine, KernelEngine, Measurement,
    Metric, Scenario, ScenarioParams,
};
pub use tlb::{InterruptCount, Target, TlbCountError, TlbCounter, TlbCounts};
pub use worker::{run_worker, RunOptions, WorkerError, WorkerExe, WorkerRun};
pub use workloads::{WorkerResult, Workload, WorkloadError};
