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
//! - [`upager_engine`]: upager's side of every scenario (same workloads, a
//!   worker process without a cgroup: upager enforces its own budget), with
//!   the ablations as engines, and the residency methods of seed 004.
//!
//! The kernel's side uses no upager code; upager's side uses only its public
//! API (and `upager-sys`'s pagemap readers for the kernel's residency
//! answer). The crate's few `unsafe` calls (mapping a file, MADV_DONTNEED,
//! getrusage, CPU pinning) are in one private module with their safety
//! arguments.
#![deny(unsafe_code)]

pub mod env;
mod raw;
pub mod report;
pub mod scenario;
pub mod tlb;
pub mod upager_engine;
pub mod worker;
pub mod workloads;

pub use env::{BenchEnv, Cgroup, EnvConfig, SetupError, SwapDevice, SwapKind, ThpKnobs, ZramExt4};
pub use report::{plot, Report, ReportError};
pub use scenario::{
    prepare, run_scenario, scenario, scenarios, BenchError, Engine, KernelEngine, Measurement,
    Metric, Scenario, ScenarioParams,
};
pub use tlb::{InterruptCount, Target, TlbCountError, TlbCounter, TlbCounts};
pub use upager_engine::{ResidencyEngine, ResidencyMethod, UpagerConfig, UpagerEngine, UpagerJob};
pub use worker::{run_worker, RunOptions, WorkerError, WorkerExe, WorkerRun};
pub use workloads::{WorkerResult, Workload, WorkloadError};
