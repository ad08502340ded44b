//! What runs a scenario: the [`Engine`] trait, the kernel's own memory
//! management as engines ([`KernelEngine`], one per `madvise` advice), and
//! [`BenchError`].
//!
//! Adding an engine (upager with some configuration, see
//! `upager_engine`) is adding an `impl Engine`: it receives the same
//! [`ScenarioParams`] as the kernel (data file, budget, threads, folio size
//! …) and returns a [`Measurement`]; the ratios, JSON and plots come from
//! `report`.

use std::time::Duration;

use crate::host::{is_root, SetupError};
use crate::measurement::Measurement;
use crate::pattern::evict_file;
use crate::scenario::{Scenario, ScenarioParams};
use crate::thp::ThpKnobs;
use crate::tracing::TlbCountError;
use crate::worker::{run_worker, RunOptions, WorkerError, WorkerExe};
use crate::workloads::{MapAdvice, Workload};

/// Errors of running a scenario or an engine.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum BenchError {
    /// scenario {0} needs a data file: call `prepare` with a BenchEnv first (or set `data_file`)
    NoDataFile(Scenario),
    /// engine {engine} does not run scenario {scenario}
    Unsupported {
        /// The engine.
        engine: String,
        /// The scenario.
        scenario: Scenario,
    },
    /// {0}
    Setup(#[from] SetupError),
    /// {0}
    Worker(#[from] WorkerError),
    /// {0}
    Tlb(#[from] TlbCountError),
    /// the run read {0} wrong words: the engine returned wrong data
    WrongData(u64),
    /// fault mode {mode} cannot run: {why}
    FaultMode {
        /// The mode (`in-thread`).
        mode: &'static str,
        /// Why (the probe's error).
        why: String,
    },
    /// {0}
    Other(String),
}

/// Something that runs a scenario: the kernel, or upager in some
/// configuration.
pub trait Engine: Send + Sync {
    /// Name in tables and JSON (e.g. `kernel`, `upager batch=1`).
    fn name(&self) -> String;
    /// Whether it runs this scenario.
    fn supports(&self, _scenario: Scenario) -> bool {
        true
    }
    /// Run one variant of a scenario once (`params` as made by
    /// [`Scenario::variants`]).
    fn run(&self, scenario: Scenario, params: &ScenarioParams) -> Result<Measurement, BenchError>;
}

/// The kernel's own memory management: each scenario's workload in a worker
/// process, in a memory cgroup with the scenario's budget.
///
/// For the file scenarios the mapping's `madvise` advice is part of the
/// engine: `kernel` is a plain mmap (MADV_NORMAL: read-around of up to
/// 128 KiB per miss, which on random reads over a file 8× the budget evicts
/// ~30 pages per read), `kernel MADV_RANDOM` is what a tuned mmap user runs.
#[derive(Debug, Clone)]
pub struct KernelEngine {
    exe: WorkerExe,
    advice: MapAdvice,
}

impl KernelEngine {
    /// Use the `upager-bench-worker` found by [`WorkerExe::locate`].
    pub fn new() -> Result<Self, BenchError> {
        Ok(KernelEngine {
            exe: WorkerExe::locate()?,
            advice: MapAdvice::Normal,
        })
    }
    /// Use a given worker executable.
    pub fn with_worker(exe: WorkerExe) -> Self {
        KernelEngine {
            exe,
            advice: MapAdvice::Normal,
        }
    }
    /// The same engine with another `madvise` advice on file mappings.
    pub fn with_advice(self, advice: MapAdvice) -> Self {
        KernelEngine { advice, ..self }
    }

    /// The workload and run options for a variant.
    pub fn plan(
        &self,
        scenario: Scenario,
        p: &ScenarioParams,
    ) -> Result<(Workload, RunOptions), BenchError> {
        let file = || p.data_file.clone().ok_or(BenchError::NoDataFile(scenario));
        let w = match scenario {
            Scenario::MmapRead => Workload::MmapRead {
                file: file()?,
                threads: p.threads,
                seed: p.seed,
                advice: self.advice,
            },
            Scenario::RandomRead => Workload::RandomRead {
                file: file()?,
                threads: p.threads,
                reads_per_thread: p.reads_per_thread,
                seed: p.seed,
                advice: self.advice,
            },
            Scenario::MultiFault => Workload::MultiFault {
                threads: p.threads,
                seconds: p.seconds,
                area_bytes: p.area_bytes as usize,
            },
            Scenario::UnmapFolio => Workload::Unmap {
                bytes: p.region_bytes as usize,
                folio_kb: p.folio_kb,
            },
            Scenario::TlbReach => Workload::TlbReach {
                bytes: p.region_bytes as usize,
                reads: p.reads_per_thread,
            },
            Scenario::Swap => {
                let per = if p.bytes_per_thread > 0 {
                    p.bytes_per_thread
                } else {
                    2 * p.limit_bytes / p.threads.max(1) as u64
                };
                Workload::Usemem {
                    threads: p.threads,
                    bytes_per_thread: per as usize,
                    passes: p.passes,
                }
            }
            Scenario::Residency | Scenario::Numpy => {
                return Err(BenchError::Unsupported {
                    engine: self.name(),
                    scenario,
                })
            }
        };
        let opts = RunOptions {
            cgroup_limit: p.use_cgroup.then_some(p.limit_bytes),
            trace_tlb: p.trace_tlb,
            timeout: Duration::from_secs_f64(p.timeout_s.max(1.0)),
            user: None,
            env: Vec::new(),
        };
        Ok((w, opts))
    }
}

impl Engine for KernelEngine {
    fn name(&self) -> String {
        match self.advice {
            MapAdvice::Normal => "kernel".into(),
            MapAdvice::Random => "kernel MADV_RANDOM".into(),
            MapAdvice::Sequential => "kernel MADV_SEQUENTIAL".into(),
        }
    }

    fn supports(&self, scenario: Scenario) -> bool {
        // Advice only changes the file scenarios; each tuned variant runs
        // where it is the advice a user would give.
        match self.advice {
            MapAdvice::Normal => !matches!(scenario, Scenario::Residency | Scenario::Numpy),
            MapAdvice::Random => scenario == Scenario::RandomRead,
            MapAdvice::Sequential => scenario == Scenario::MmapRead,
        }
    }

    fn run(&self, scenario: Scenario, p: &ScenarioParams) -> Result<Measurement, BenchError> {
        let (w, opts) = self.plan(scenario, p)?;
        // Large folios for the unmap scenario: enable exactly that mTHP size.
        let _knobs = match (&w, is_root()) {
            (Workload::Unmap { folio_kb, .. }, true) if *folio_kb > 4 => {
                Some(ThpKnobs::only(*folio_kb)?)
            }
            (Workload::Unmap { folio_kb, .. }, false) if *folio_kb > 4 => {
                return Err(SetupError::NotRoot {
                    what: "mTHP sizes".into(),
                }
                .into())
            }
            _ => None,
        };
        // The data file must not be in the page cache (charged to whoever
        // read it last) when the run starts: evict it, whatever drop_caches says.
        if let Some(f) = &p.data_file {
            evict_file(f)?;
        }
        let run = run_worker(&self.exe, &w, &opts)?;
        if run.result.bad_words > 0 {
            return Err(BenchError::WrongData(run.result.bad_words));
        }
        Ok(Measurement::from_worker(&run))
    }
}
