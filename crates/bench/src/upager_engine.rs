//! upager's engines: upager in each configuration of the suite (with its
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

use upager::FaultMode;

use crate::engine::{BenchError, Engine};
use crate::host::in_ci;
use crate::measurement::Measurement;
use crate::numpy_engine::NumpyEngine;
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
    /// Extra environment of its workers (a masked kernel feature).
    env: Vec<(String, String)>,
}

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
            env: Vec::new(),
        }
    }

    /// This engine with `UPAGER_MASK_FEATURES=features` in its workers:
    /// upager as it runs where the kernel (or a seccomp filter) refuses
    /// them (`upager_sys::features`).
    pub fn masking(mut self, features: &str) -> Self {
        self.env
            .push(("UPAGER_MASK_FEATURES".into(), features.into()));
        self
    }

    /// Every upager engine: both fault modes ([`UpagerEngine::for_modes`]).
    pub fn all(exe: &WorkerExe) -> Vec<Box<dyn Engine>> {
        Self::for_modes(exe, &[FaultMode::Handlers, FaultMode::InThread])
    }

    /// The standard set of upager engines: `upager <mode>` for each of
    /// `modes` (the configuration each scenario's target is
    /// about), the ablations of the suite (in handlers mode, the default), the
    /// residency methods of seed 004 and the numpy engines (4 KiB and
    /// 64 KiB folios in each of `modes`).
    pub fn for_modes(exe: &WorkerExe, modes: &[FaultMode]) -> Vec<Box<dyn Engine>> {
        let e = |name: &str, config: UpagerConfig, sc: &'static [Scenario]| {
            Box::new(UpagerEngine::new(exe.clone(), name, config, sc)) as Box<dyn Engine>
        };
        let d = UpagerConfig::default;
        let mut v = Vec::new();
        for &mode in modes {
            let name = format!("upager {}", mode.name());
            // One name, two configurations on disjoint scenarios: each
            // scenario runs the mode at the folio size its target is about.
            v.push(e(
                &name,
                UpagerConfig {
                    fault_mode: mode,
                    ..d()
                },
                &[Scenario::MmapRead, Scenario::MultiFault],
            ));
            v.push(e(
                &name,
                UpagerConfig {
                    folio_kb: 4,
                    fault_mode: mode,
                    ..d()
                },
                &[Scenario::RandomRead, Scenario::Swap],
            ));
            // The ablations of mixed folio sizes and async readahead: with
            // mixed folio sizes, without async readahead.
            v.push(e(
                &format!("upager {} huge-runs", mode.name()),
                UpagerConfig {
                    fault_mode: mode,
                    huge_runs: Some(true),
                    ..d()
                },
                &[Scenario::MmapRead],
            ));
            v.push(e(
                &format!("upager {} sync-readahead", mode.name()),
                UpagerConfig {
                    fault_mode: mode,
                    readahead_async: Some(false),
                    ..d()
                },
                &[Scenario::MmapRead],
            ));
        }
        v.extend([
            e(
                "upager batch=1",
                UpagerConfig {
                    batch: Some(1),
                    ..d()
                },
                &[Scenario::MmapRead, Scenario::RandomRead],
            ),
            e(
                "upager 64K",
                UpagerConfig {
                    folio_kb: 64,
                    ..d()
                },
                &[Scenario::MmapRead, Scenario::RandomRead, Scenario::Swap],
            ),
            e(
                "upager 2M",
                UpagerConfig {
                    folio_kb: 2048,
                    writable: true,
                    ..d()
                },
                &[Scenario::MmapRead, Scenario::TlbReach],
            ),
            e(
                "upager 4K",
                UpagerConfig { folio_kb: 4, ..d() },
                &[Scenario::TlbReach],
            ),
            // The defaults mapped read-write, with and without mixed folio
            // sizes.
            e(
                "upager rw",
                UpagerConfig {
                    writable: true,
                    ..d()
                },
                &[Scenario::MmapRead],
            ),
            e(
                "upager rw huge-runs",
                UpagerConfig {
                    writable: true,
                    huge_runs: Some(true),
                    ..d()
                },
                &[Scenario::MmapRead],
            ),
            e(
                "upager handlers 1-uffd",
                UpagerConfig {
                    uffd_shards: Some(1),
                    ..d()
                },
                &[Scenario::MultiFault],
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
                "upager unbatched",
                UpagerConfig {
                    folio_kb: 4,
                    batched_removal: false,
                    ..d()
                },
                &[Scenario::Swap],
            ),
            e("upager", d(), &[Scenario::UnmapFolio]),
            // The kernel features' fallbacks, priced next to the defaults.
            Box::new(
                UpagerEngine::new(
                    exe.clone(),
                    "upager no-process_madvise",
                    d(),
                    &[Scenario::MmapRead],
                )
                .masking("process_madvise"),
            ),
            Box::new(
                UpagerEngine::new(
                    exe.clone(),
                    "upager no-process_madvise",
                    UpagerConfig { folio_kb: 4, ..d() },
                    &[Scenario::RandomRead],
                )
                .masking("process_madvise"),
            ),
            Box::new(
                UpagerEngine::new(
                    exe.clone(),
                    "upager no-io_uring",
                    UpagerConfig { folio_kb: 4, ..d() },
                    &[Scenario::Swap],
                )
                .masking("io_uring"),
            ),
            Box::new(
                UpagerEngine::new(
                    exe.clone(),
                    "upager 2M no-uffd_move",
                    UpagerConfig {
                        folio_kb: 2048,
                        writable: true,
                        ..d()
                    },
                    &[Scenario::MmapRead],
                )
                .masking("uffd_move"),
            ),
        ]);
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
        v.extend(NumpyEngine::for_modes(modes));
        v
    }

    /// upager with its data on the Redis Cluster at `url`, 64
    /// KiB folios, on the scenarios that read a data file or swap:
    /// `upager redis` (each batch one pipeline per node) and `upager redis
    /// per-folio` (one round trip per folio: the ablation of batching).
    pub fn for_store(exe: &WorkerExe, url: &str) -> Vec<Box<dyn Engine>> {
        const ON: &[Scenario] = &[Scenario::MmapRead, Scenario::RandomRead, Scenario::Swap];
        [("upager redis", true), ("upager redis per-folio", false)]
            .into_iter()
            .map(|(name, pipelined)| {
                let config = UpagerConfig {
                    store: Some(url.to_string()),
                    store_pipelined: pipelined,
                    folio_kb: 64,
                    ..UpagerConfig::default()
                };
                Box::new(UpagerEngine::new(exe.clone(), name, config, ON)) as Box<dyn Engine>
            })
            .collect()
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
            Scenario::TlbReach => UpagerJob::TlbReach {
                bytes: p.region_bytes,
                reads: p.reads_per_thread,
            },
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
            // Classified by the residency engines; numpy runs in Python.
            Scenario::Residency | Scenario::Numpy => {
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
    env: &[(String, String)],
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
        user: None,
        env: env.to_vec(),
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
        run_upager(&self.exe, p, budget, config, job, &self.env)
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
        run_upager(&self.exe, p, 0, UpagerConfig::default(), job, &[])
    }
}

/// Whether a pager in fault mode `mode` can be built and resolve faults
/// here: a tiny job ([`UpagerJob::Probe`]) in a worker process, like the
/// runs. `Err` says why not (e.g. the engine refuses the mode: "fault mode
/// in-thread: not built yet").
pub fn probe_fault_mode(exe: &WorkerExe, mode: FaultMode) -> Result<(), String> {
    let w = Workload::Upager {
        budget: 16 << 20,
        config: UpagerConfig {
            fault_mode: mode,
            ..UpagerConfig::default()
        },
        job: UpagerJob::Probe,
    };
    let opts = RunOptions {
        cgroup_limit: None,
        trace_tlb: false,
        timeout: Duration::from_secs(60),
        user: None,
        env: Vec::new(),
    };
    let run = run_worker(exe, &w, &opts).map_err(|e| e.to_string())?;
    if run.result.bad_words > 0 {
        return Err(format!(
            "{} of 256 words read back wrong",
            run.result.bad_words
        ));
    }
    Ok(())
}

/// The fault modes a run can use, of those `requested`, probed with
/// [`probe_fault_mode`]. A mode that cannot run is left out with a note
/// saying so (for the report and the terminal), so the run goes on with the
/// others; with `strict` (what [`select_fault_modes`] uses under
/// `CI=true`) it is an error instead. No mode left is always an error.
pub fn select_fault_modes_with(
    exe: &WorkerExe,
    requested: &[FaultMode],
    strict: bool,
) -> Result<(Vec<FaultMode>, Vec<String>), BenchError> {
    let (mut ok, mut notes) = (Vec::new(), Vec::new());
    for &mode in requested {
        match probe_fault_mode(exe, mode) {
            Ok(()) => ok.push(mode),
            Err(why) if strict => {
                return Err(BenchError::FaultMode {
                    mode: mode.name(),
                    why: format!("{why} (under CI=true a requested mode that cannot run fails the run)"),
                })
            }
            Err(why) => notes.push(format!(
                "fault mode {} is not available ({why}): its engines (upager {}…) were left out of this run",
                mode.name(),
                mode.name()
            )),
        }
    }
    if ok.is_empty() {
        return Err(BenchError::FaultMode {
            mode: "any requested",
            why: notes.join("; "),
        });
    }
    Ok((ok, notes))
}

/// [`select_fault_modes_with`], strict under `CI=true`.
pub fn select_fault_modes(
    exe: &WorkerExe,
    requested: &[FaultMode],
) -> Result<(Vec<FaultMode>, Vec<String>), BenchError> {
    select_fault_modes_with(exe, requested, in_ci())
}
