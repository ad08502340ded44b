//! Benchmark infrastructure of upager: the environment the
//! comparisons run in, the kernel's own side of each seed experiment, TLB
//! shootdown counting from outside the measured code, upager's side, and
//! reports.
//!
//! - [`env`](mod@env): the environment — a memory cgroup per run (v2 or v1), ext4 on
//!   zram, a RAM swap device, dropping caches, pattern files, mTHP knobs;
//!   every change undone on drop and on Ctrl-C.
//! - [`tracing`]: TLB shootdowns from /proc/interrupts and from the
//!   `tlb:tlb_flush` tracepoint filtered to a process's thread group.
//! - [`workloads`] and [`worker`]: the workloads (the kernel's and
//!   upager's), run in a child process (`upager-bench-worker`) placed in the
//!   cgroup before it starts.
//! - [`scenario`]: the scenarios (kernel experiments and workloads) as data ([`Scenario`]);
//!   [`engine`]: the [`Engine`] trait and the kernel baseline engines;
//!   [`upager_engine`]: upager's engines, in each fault mode and
//!   with the ablations, and the residency methods of seed 004;
//!   [`numpy_engine`]: the numpy scenario's engines (a Python driver);
//!   [`suite`]: [`run_scenario`].
//! - [`latency`]: per-access latency histograms (p50/p99/max), measured the
//!   same way by the kernel's and upager's workloads.
//! - [`report`]: JSON, medians of interleaved rounds, ratios, table, PNG.
//!
//! The kernel's side uses no upager code; upager's side uses only its public
//! API (and `upager-sys`'s pagemap readers for the kernel's residency
//! answer). Both check every word they read against the data files'
//! pattern and draw random offsets from one generator, both from
//! `upager-testdata` (shared with the engine's tests, the stress run and the
//! demo). The crate's few `unsafe` calls (mapping a file, MADV_DONTNEED,
//! getrusage, CPU pinning) are in one private module with their safety
//! arguments.
//!
//! # Layout
//!
//! The modules are layers: each uses only modules in rows above its own
//! (`tests/layers.rs` reads every `crate::…` path in the sources, fails on a
//! use this table does not list, and so on any cycle). `lib.rs` is only the
//! facade.
//!
//! | module | role | uses |
//! |---|---|---|
//! | `raw` | the only `unsafe`: mmap, madvise, getrusage, affinity, fadvise | — |
//! | `remote` | [`Remote`]: data on a Redis Cluster or S3 for the examples, uploaded, deleted, reached through delaying proxies | — |
//! | `host` | [`SetupError`], root and CI checks, tools, knob files, names | — |
//! | `latency` | [`Histogram`] of access latencies, [`LatencySummary`] | — |
//! | `undo` | undo actions, Ctrl-C cleanup | host |
//! | `pattern` | data files: made, synced, dropped from the page cache, checked | host, raw |
//! | `meter` | [`WorkerResult`], `Meter`, `median` | latency, raw |
//! | `tlb_reach` | random reads over a resident region, huge-page share | meter |
//! | `anon_fill` | the compressed tier's workload: an anonymous region several times the budget, written and read back, by the kernel and by upager | meter |
//! | `cgroup` | memory cgroups, v2 and v1 | host, undo |
//! | `blockdev` | zram, loop devices, ext4; mounts and swaps | host, pattern, undo |
//! | `swap` | the kernel's swap device | blockdev, host, undo |
//! | `thp` | mTHP knobs and counters | host, undo |
//! | `tracing` | TLB shootdowns: tracepoint, /proc/interrupts | host, undo |
//! | `env` | [`BenchEnv`], stale clean-up; re-exports the environment | blockdev, cgroup, host, pattern, swap, thp, tracing, undo |
//! | `kernel_workloads` | the kernel's workloads | host, latency, meter, raw, thp, tlb_reach |
//! | `upager_workloads` | upager's workloads, in the worker | anon_fill, host, latency, meter, raw, tlb_reach |
//! | `workloads` | [`Workload`], `run_workload` | anon_fill, kernel_workloads, meter, pattern, upager_workloads |
//! | `worker` | the worker process: protocol, [`run_worker`] | cgroup, host, tracing, undo, workloads |
//! | `measurement` | [`Measurement`], [`Metric`] | latency, worker |
//! | `scenario` | [`Scenario`], its spec and parameters | host, measurement, pattern, thp |
//! | `report` | [`Report`]: summary, table, JSON, plot | host, measurement, meter, scenario |
//! | `engine` | [`Engine`], [`BenchError`], [`KernelEngine`] | host, measurement, pattern, scenario, thp, tracing, worker, workloads |
//! | `numpy_engine` | [`NumpyEngine`]: the numpy scenario's Python driver | engine, host, measurement, pattern, scenario, worker, workloads |
//! | `upager_engine` | [`UpagerEngine`], [`ResidencyEngine`], fault-mode selection | engine, host, measurement, numpy_engine, pattern, scenario, upager_workloads, worker, workloads |
//! | `suite` | [`prepare`], [`run_scenario`] | engine, env, host, pattern, report, scenario |
#![deny(unsafe_code)]

pub mod anon_fill;
mod blockdev;
mod cgroup;
pub mod engine;
pub mod env;
mod host;
mod kernel_workloads;
pub mod latency;
pub mod measurement;
mod meter;
pub mod numpy_engine;
mod pattern;
mod raw;
pub mod remote;
pub mod report;
pub mod scenario;
pub mod suite;
mod swap;
mod thp;
mod tlb_reach;
pub mod tracing;
mod undo;
pub mod upager_engine;
pub mod upager_workloads;
pub mod worker;
pub mod workloads;

pub use engine::{BenchError, Engine, KernelEngine};
pub use env::{
    BenchEnv, Cgroup, CgroupVersion, EnvConfig, MemoryHierarchy, SetupError, SwapDevice, SwapKind,
    ThpKnobs, ZramExt4,
};
pub use latency::{Histogram, LatencySummary};
pub use measurement::{Measurement, Metric};
pub use meter::median as median_of;
pub use numpy_engine::NumpyEngine;
pub use pattern::{create_pattern_file, evict_file};
pub use remote::Remote;
pub use report::{plot, results_dir, Report, ReportError};
pub use scenario::{
    DataFile, DataKind, ParseDataKindError, ParseScenarioError, Phase, Scenario, ScenarioParams,
    ScenarioSpec,
};
pub use suite::{prepare, run_scenario};
pub use tracing::{InterruptCount, Target, TlbCountError, TlbCounter, TlbCounts};
pub use upager_engine::{
    probe_fault_mode, select_fault_modes, select_fault_modes_with, ResidencyEngine, UpagerEngine,
};
pub use upager_workloads::{ResidencyMethod, UpagerConfig, UpagerJob};
pub use worker::{run_worker, RunOptions, WorkerError, WorkerExe, WorkerRun};
pub use workloads::{NumpyBackend, WorkerResult, Workload, WorkloadError};

/// CPU time of this whole process so far, user and system, all threads
/// (`getrusage(RUSAGE_SELF)`), in seconds.
pub fn process_cpu_secs() -> std::io::Result<f64> {
    raw::rusage_self().map(|u| u.user_s + u.sys_s)
}
