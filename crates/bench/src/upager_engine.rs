//! upager's engines: upager in each configuration of issue 3 (with its
//! ablations, [`UpagerEngine::all`]) and the residency classifications of
//! seed 004 ([`ResidencyEngine`]). Each runs its scenario's job
//! (`upager_workloads`) in a worker process, like the kernel's engines, but
//! without a memory cgroup: upager enforces its own budget, which is the
//! cgroup limit the kernel gets in the same scenario.
//!
//! What is counted from outside is the same as for the kernel (wall time,
//! CPU of the whole process — handler and reclaim threads included — and
//! `tlb:tlb_flush` remote sends of the worker's thread group); evicted pages
//! come from the engine's `evictions` counter. The data file is evicted
//! from the page cache before each run.

use std::time::Duration;

use crate::engine::{BenchError, Engine};
use crate::measurement::Measurement;
use crate::pattern::evict_file;
use crate::scenario::{Scenario, ScenarioParams};
use crate::upager_workloads::{ResidencyMethod, UpagerConfig, UpagerJob};
use crate::worker::{run_worker, RunOptions, WorkerExe, WorkerRun};
use crate::workloads::Workload;

/// upager in one configuration, running every scenario it supports in a
/// worker process (same workloads as the kernel, no memory cgroup).
#[derive(Debug, Clone)]
pub struct UpagerEngine {
    exe: WorkerExe,
    name: String,
    config: UpagerConfig,
    scenarios: &'static [Scenario],
}

const FILE_AND_ANON: &[Scenario] = &[
    Scenario::MmapRead,
    Scenario::RandomRead,
    Scenario::MultiFault,
    Scenario::UnmapFolio,
];

impl UpagerEngine {
    /// An engine named `name` with `config` for `scenarios`.
    pub fn new(
        exe: WorkerExe,
        name: &str,
        config: UpagerConfig,
        scenarios: &'static [Scenario],
    ) -> Self {
        UpagerEngine {
            exe,
            name: name.into(),
            config,
            scenarios,
        }
    }

    /// The standard set of upager engines of issue 3 (with each ablation),
    /// plus the residency methods of seed 004.
    pub fn all(exe: &WorkerExe) -> Vec<Box<dyn Engine>> {
        let e = |name: &str, config: UpagerConfig, sc: &'static [Scenario]| {
            Box::new(UpagerEngine::new(exe.clone(), name, config, sc)) as Box<dyn Engine>
        };
        let d = UpagerConfig::default;
        let mut v = vec![
            e(
                "upager batch=1",
                UpagerConfig {
                    batch: Some(1),
                    ..d()
                },
                &[Scenario::MmapRead, Scenario::RandomRead],
            ),
            e("upager", d(), FILE_AND_ANON),
            e(
                "upager folio=4K",
                UpagerConfig { folio_kb: 4, ..d() },
                &[Scenario::RandomRead],
            ),
            e(
                "upager locked-lookup",
                UpagerConfig {
                    locked_lookup: true,
                    ..d()
                },
                &[Scenario::MultiFault],
            ),
            e(
                "upager batched",
                UpagerConfig { folio_kb: 4, ..d() },
                &[Scenario::Swap],
            ),
            e(
                "upager unbatched",
                UpagerConfig {
                    folio_kb: 4,
                    batched_removal: false,
                    ..d()
                },
                &[Scenario::Swap],
            ),
            e("upager 64K", d(), &[Scenario::Swap]),
        ];
        for (name, m) in [
            ("kernel", ResidencyMethod::ProcPagemap),
            ("kernel PAGEMAP_SCAN", ResidencyMethod::PagemapScan),
            ("upager residency", ResidencyMethod::UpagerRuns),
            ("upager pagemap", ResidencyMethod::UpagerPagemap),
        ] {
            v.push(Box::new(ResidencyEngine {
                exe: exe.clone(),
                name: name.into(),
                method: m,
            }));
        }
        v
    }

    /// The job for a scenario variant.
    pub fn job(
        &self,
        scenario: Scenario,
        p: &ScenarioParams,
    ) -> Result<(u64, UpagerConfig, UpagerJob), BenchError> {
        let file = || p.data_file.clone().ok_or(BenchError::NoDataFile(scenario));
        let mut c = self.config.clone();
        let job = match scenario {
            Scenario::MmapRead => UpagerJob::MmapRead {
                file: file()?,
                threads: p.threads,
                seed: p.seed,
            },
            Scenario::RandomRead => UpagerJob::RandomRead {
                file: file()?,
                threads: p.threads,
                reads_per_thread: p.reads_per_thread,
                seed: p.seed,
            },
            Scenario::MultiFault => UpagerJob::MultiFault {
                threads: p.threads,
                seconds: p.seconds,
                area_bytes: p.area_bytes,
            },
            Scenario::UnmapFolio => {
                c.folio_kb = p.folio_kb;
                UpagerJob::Unmap {
                    bytes: p.region_bytes,
                }
            }
            Scenario::Swap => {
                if c.swap_dir.is_none() {
                    c.swap_dir.clone_from(&p.swap_dir);
                }
                let per = if p.bytes_per_thread > 0 {
                    p.bytes_per_thread
                } else {
                    2 * p.limit_bytes / p.threads.max(1) as u64
                };
                UpagerJob::Usemem {
                    threads: p.threads,
                    bytes_per_thread: per,
                    passes: p.passes,
                }
            }
            // Classified by the residency engines.
            Scenario::Residency => {
                return Err(BenchError::Unsupported {
                    engine: self.name.clone(),
                    scenario,
                })
            }
        };
        Ok((p.limit_bytes, c, job))
    }
}

fn finish(run: &WorkerRun) -> Result<Measurement, BenchError> {
    if run.result.bad_words > 0 {
        return Err(BenchError::WrongData(run.result.bad_words));
    }
    let mut m = Measurement::from_worker(run);
    let x = &run.result.extra;
    if let Some(&e) = x.get("evicted_pages") {
        m.evicted_pages = Some(e as u64);
        m.sends_per_1000_evicted = match m.tlb_sends {
            Some(s) if e > 0.0 => Some(s as f64 * 1000.0 / e),
            _ => None,
        };
    }
    if let Some(&peak) = x.get("upager.resident_peak_bytes") {
        m.peak_bytes = Some(peak as u64);
    }
    Ok(m)
}

fn run_upager(
    exe: &WorkerExe,
    p: &ScenarioParams,
    budget: u64,
    config: UpagerConfig,
    job: UpagerJob,
) -> Result<Measurement, BenchError> {
    if let Some(f) = &p.data_file {
        evict_file(f)?;
    }
    let w = Workload::Upager {
        budget,
        config,
        job,
    };
    let opts = RunOptions {
        cgroup_limit: None,
        trace_tlb: p.trace_tlb,
        timeout: Duration::from_secs_f64(p.timeout_s.max(1.0)),
    };
    finish(&run_worker(exe, &w, &opts)?)
}

impl Engine for UpagerEngine {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn supports(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }
    fn run(&self, scenario: Scenario, p: &ScenarioParams) -> Result<Measurement, BenchError> {
        let (budget, config, job) = self.job(scenario, p)?;
        run_upager(&self.exe, p, budget, config, job)
    }
}

/// One way of classifying a large upager region (seed 004's experiment):
/// upager's own answer from its state words, or the kernel's pagemap.
#[derive(Debug, Clone)]
pub struct ResidencyEngine {
    exe: WorkerExe,
    name: String,
    method: ResidencyMethod,
}

impl Engine for ResidencyEngine {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn supports(&self, scenario: Scenario) -> bool {
        scenario == Scenario::Residency
    }
    fn run(&self, _scenario: Scenario, p: &ScenarioParams) -> Result<Measurement, BenchError> {
        let job = UpagerJob::Residency {
            bytes: p.region_bytes,
            method: self.method,
            repeats: 5,
        };
        run_upager(&self.exe, p, 0, UpagerConfig::default(), job)
    }
}
