//! The numpy scenario's engines (a numpy user's array larger than memory):
//! `numpy.memmap` and `upager.open_array` driven by one Python process,
//! `bench/numpy_scenario.py` (embedded here, so the suite runs from any
//! directory), which speaks the worker protocol itself (`ready`, `go`,
//! `result`): [`run_worker`] puts it in the memory cgroup and counts its TLB
//! shootdowns exactly as for the Rust worker.
//!
//! Unlike the other upager engines, upager's process runs in the cgroup too:
//! the issue's setting is one Python process in a cgroup of 256 MiB, with
//! upager given a budget of 192 MiB inside it, so the interpreter, numpy and
//! the index arrays are charged to both sides alike.
//!
//! Two kinds of data, one variant and one data file each
//! ([`DataKind`]): element i = i (compressible: zram stores each page
//! compressed several times over, so reading it from the device
//! decompresses it: CPU-bound, single-threaded per fault, as numpy.memmap's
//! page cache and upager's O_DIRECT reads both pay) and random float64s in
//! [0, 1) (incompressible: zram stores each page as it is, so a read is a
//! copy, closer to a fast disk). Which one a pager wins on can differ: the
//! cost of a miss is the device's, the cost of everything else the
//! pager's.
//!
//! The data file is modified by the write phase; the driver writes the old
//! values back after measuring. A run that fails may leave it modified, so
//! the engine removes it and the next run makes it again.
//!
//! The Python interpreter is `$UPAGER_BENCH_PYTHON` or `python3`; it must
//! import numpy and the upager package (`make python`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use upager::FaultMode;

use crate::engine::{BenchError, Engine};
use crate::host::unique_name;
use crate::measurement::Measurement;
use crate::pattern::{ensure_data_file, evict_file, f64_random_slice_sums, DataKind};
use crate::scenario::{Scenario, ScenarioParams};
use crate::worker::{run_worker, RunOptions, WorkerExe};
use crate::workloads::{NumpyBackend, Workload};

/// The driver script (bench/numpy_scenario.py).
pub const NUMPY_SCENARIO_PY: &str = include_str!("../../../bench/numpy_scenario.py");

/// The Python interpreter the numpy scenario runs: `$UPAGER_BENCH_PYTHON`,
/// else `python3`.
pub fn python() -> PathBuf {
    std::env::var_os("UPAGER_BENCH_PYTHON").map_or_else(|| "python3".into(), PathBuf::from)
}

/// Whether [`python`] imports numpy and upager: `Ok` with a line saying
/// which (versions, where upager was installed from), `Err` saying what is
/// missing.
pub fn check_python() -> Result<String, String> {
    let py = python();
    let out = Command::new(&py)
        .args([
            "-c",
            "import numpy, upager; print('numpy', numpy.__version__, '· upager', \
             upager.__version__, 'from', upager.__file__)",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{} cannot import numpy and upager (install them with `make python`): {}",
            py.display(),
            err.trim().lines().last().unwrap_or("")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One side of the numpy scenario: `kernel numpy.memmap`, or upager with
/// the defaults (`upager defaults`), a fault mode (`upager handlers`), or a
/// fault mode and folio size (`upager handlers 4K`), opened "r+" unless the
/// name ends in ` r`.
#[derive(Debug, Clone)]
pub struct NumpyEngine {
    name: String,
    backend: NumpyBackend,
    /// `None`: no folio size given (upager chooses).
    folio_kb: Option<u64>,
    /// `None`: upager chooses (handlers, or in-thread where the
    /// userfaultfd is user-mode-only).
    fault_mode: Option<FaultMode>,
    /// `None`: the package's default.
    huge_runs: Option<bool>,
    /// `None`: the package's default.
    readahead_async: Option<bool>,
    mode: &'static str,
    /// Run by this user and group id (root switches to them).
    user: Option<(u32, u32)>,
    /// Without the batched gather and scatter (`UPAGER_GATHER_FETCH_MIN=0`):
    /// every miss of `a[idx]` and `a[idx] = v` is a fault, as in a loop
    /// over elements (the ablation `fault-path`).
    fault_path: bool,
}

impl NumpyEngine {
    /// The kernel's baseline: `numpy.memmap(mode="r+")`.
    pub fn memmap() -> Self {
        NumpyEngine {
            name: "kernel numpy.memmap".into(),
            backend: NumpyBackend::Memmap,
            ..Self::defaults()
        }
    }

    /// `upager.open_array(mode="r+", budget=…)` and nothing else: what a
    /// user gets by default (`upager defaults`: the folio size and the
    /// fault mode upager chooses). The numpy targets (faster than
    /// numpy.memmap with the defaults) are for this engine.
    pub fn defaults() -> Self {
        NumpyEngine {
            name: "upager defaults".into(),
            backend: NumpyBackend::Upager,
            folio_kb: None,
            fault_mode: None,
            huge_runs: None,
            readahead_async: None,
            mode: "r+",
            user: None,
            fault_path: false,
        }
    }

    /// `upager.open_array(mode="r+")` in fault mode `mode`, the default
    /// folio size (`upager handlers`).
    pub fn mode(mode: FaultMode) -> Self {
        NumpyEngine {
            name: format!("upager {}", mode.name()),
            fault_mode: Some(mode),
            ..Self::defaults()
        }
    }

    /// `upager.open_array(mode="r+")` with `folio_kb` folios in `mode`,
    /// the engine's defaults otherwise (`upager handlers 4K`).
    pub fn upager(folio_kb: u64, mode: FaultMode) -> Self {
        NumpyEngine {
            name: format!("upager {} {}K", mode.name(), folio_kb),
            folio_kb: Some(folio_kb),
            ..Self::mode(mode)
        }
    }

    /// `upager.open_array(mode="r+")` with `folio_kb` folios and the fault
    /// mode upager chooses (`upager default 4K`).
    pub fn upager_default(folio_kb: u64) -> Self {
        NumpyEngine {
            name: format!("upager default {folio_kb}K"),
            folio_kb: Some(folio_kb),
            ..Self::defaults()
        }
    }

    /// This engine run by an ordinary user (`name`, `uid`, `gid`: the
    /// driver's process switches to them; root keeps the cgroup and the
    /// shootdown count). The data file is handed to the user.
    pub fn as_user(self, name: &str, uid: u32, gid: u32) -> Self {
        NumpyEngine {
            user: Some((uid, gid)),
            ..self.named(&format!("as {name}"))
        }
    }

    /// This engine with `suffix` added to its name.
    fn named(self, suffix: &str) -> Self {
        NumpyEngine {
            name: format!("{} {suffix}", self.name),
            ..self
        }
    }

    /// The memmap baseline; upager with the defaults, then with the
    /// default folio size in each of `modes`, then with 4 KiB and 64 KiB
    /// folios in each; the ablations of mixed folio sizes and async
    /// readahead (4 KiB folios with mixed folio sizes, `huge-runs`, and
    /// without async readahead,
    /// `sync-readahead`); the defaults with every miss a fault
    /// (`fault-path`); and both sides opened read-only (` r`).
    pub fn for_modes(modes: &[FaultMode]) -> Vec<Box<dyn Engine>> {
        let mut v: Vec<Box<dyn Engine>> =
            vec![Box::new(Self::memmap()), Box::new(Self::defaults())];
        for &m in modes {
            v.push(Box::new(Self::mode(m)));
        }
        for folio in [4, 64] {
            for &m in modes {
                v.push(Box::new(Self::upager(folio, m)));
            }
        }
        for &m in modes {
            v.push(Box::new(NumpyEngine {
                huge_runs: Some(true),
                ..Self::upager(4, m).named("huge-runs")
            }));
            v.push(Box::new(NumpyEngine {
                readahead_async: Some(false),
                ..Self::upager(4, m).named("sync-readahead")
            }));
        }
        v.push(Box::new(NumpyEngine {
            fault_path: true,
            ..Self::defaults().named("fault-path")
        }));
        v.push(Box::new(NumpyEngine {
            mode: "r",
            ..Self::memmap().named("r")
        }));
        for &m in modes {
            v.push(Box::new(NumpyEngine {
                mode: "r",
                ..Self::upager(4, m).named("r")
            }));
        }
        v
    }

    /// The workload for a variant (its kind of data: `p.data_kind`,
    /// compressible where unset).
    pub fn workload(&self, p: &ScenarioParams) -> Result<Workload, BenchError> {
        let data = p.data_kind.unwrap_or_default();
        let slice_sums = match data {
            DataKind::Compressible => Vec::new(),
            DataKind::Incompressible => {
                f64_random_slice_sums(p.file_bytes / 8, (p.slice_bytes / 8).max(1), p.seed)
            }
        };
        Ok(Workload::Numpy {
            file: p
                .data_file
                .clone()
                .ok_or(BenchError::NoDataFile(Scenario::Numpy))?,
            backend: self.backend,
            budget: p.upager_budget(),
            folio_kb: self.folio_kb,
            fault_mode: self.fault_mode.map_or("auto", FaultMode::name).to_string(),
            slice_bytes: p.slice_bytes,
            random_ops: p.random_ops,
            seed: p.seed,
            data,
            slice_sums,
            huge_runs: self.huge_runs,
            readahead_async: self.readahead_async,
            mode: self.mode.to_string(),
        })
    }
}

impl Engine for NumpyEngine {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn supports(&self, scenario: Scenario) -> bool {
        scenario == Scenario::Numpy
    }

    fn run(&self, scenario: Scenario, p: &ScenarioParams) -> Result<Measurement, BenchError> {
        let w = self.workload(p)?;
        let file = p
            .data_file
            .clone()
            .ok_or(BenchError::NoDataFile(scenario))?;
        ensure_data_file(
            p.data_kind.unwrap_or_default().file(),
            p.file_bytes,
            p.seed,
            &file,
        )?;
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(&file, Some(uid), Some(gid))
                .map_err(|e| BenchError::Other(format!("chown {}: {e}", file.display())))?;
        }
        evict_file(&file)?;
        let script = std::env::temp_dir().join(format!("{}.py", unique_name("numpy")));
        std::fs::write(&script, NUMPY_SCENARIO_PY)
            .map_err(|e| BenchError::Other(format!("writing {}: {e}", script.display())))?;
        let exe = WorkerExe::SelfWithArg(python(), script.display().to_string());
        let opts = RunOptions {
            cgroup_limit: p.use_cgroup.then_some(p.limit_bytes),
            trace_tlb: p.trace_tlb,
            timeout: Duration::from_secs_f64(p.timeout_s.max(1.0)),
            user: self.user,
            env: if self.fault_path {
                vec![("UPAGER_GATHER_FETCH_MIN".into(), "0".into())]
            } else {
                Vec::new()
            },
        };
        let run = run_worker(&exe, &w, &opts);
        let _ = std::fs::remove_file(&script);
        let bad = run.as_ref().map_or(0, |r| r.result.bad_words);
        if run.is_err() || bad > 0 {
            // The write phase may not have been undone: make the file again
            // before the next run.
            let _ = std::fs::remove_file(&file);
        }
        let run = run?;
        if bad > 0 {
            return Err(BenchError::WrongData(bad));
        }
        let mut m = Measurement::from_worker(&run);
        // The cgroup's peak at the end of the measured phases (the checks
        // and the restore after them fill the page cache up to the limit).
        if let Some(&peak) = run.result.extra.get("cgroup_peak_bytes") {
            m.peak_bytes = Some(peak as u64);
        }
        if let Some(&e) = run.result.extra.get("evicted_pages") {
            m.evicted_pages = Some(e as u64);
            m.sends_per_1000_evicted = match m.tlb_sends {
                Some(s) if e > 0.0 => Some(s as f64 * 1000.0 / e),
                _ => None,
            };
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default engine list: the baseline, what a user gets by default,
    /// the default folio in each mode, then the explicit folios and the
    /// ablations; the default engines give upager no folio size (and
    /// `upager defaults` no fault mode either).
    #[test]
    fn engines_in_order_and_what_they_pass() {
        let modes = [FaultMode::Handlers, FaultMode::InThread];
        let names: Vec<String> = NumpyEngine::for_modes(&modes)
            .iter()
            .map(|e| e.name())
            .collect();
        // The spec lists them in the order they run.
        let spec = Scenario::Numpy.spec().engines;
        assert_eq!(names[..spec.len()], *spec);
        assert_eq!(spec[..2], ["kernel numpy.memmap", "upager defaults"]);
        let p = ScenarioParams {
            data_file: Some("/d/f".into()),
            ..Scenario::Numpy.tiny()
        };
        let json = |e: &NumpyEngine| serde_json::to_value(e.workload(&p).unwrap()).unwrap();
        let d = json(&NumpyEngine::defaults());
        assert!(d["folio_kb"].is_null() && d["huge_runs"].is_null(), "{d}");
        assert_eq!(d["fault_mode"], "auto");
        assert_eq!(d["data"], "compressible");
        assert!(d.get("slice_sums").is_none(), "{d}");
        let h = json(&NumpyEngine::mode(FaultMode::Handlers));
        assert!(h["folio_kb"].is_null(), "{h}");
        assert_eq!(h["fault_mode"], "handlers");
        assert_eq!(
            json(&NumpyEngine::upager(4, FaultMode::InThread))["folio_kb"],
            4
        );
        // Incompressible data: the exact slice sums go with the workload.
        let p = ScenarioParams {
            data_kind: Some(DataKind::Incompressible),
            ..p
        };
        let w = serde_json::to_value(NumpyEngine::defaults().workload(&p).unwrap()).unwrap();
        assert_eq!(w["data"], "incompressible");
        let sums = w["slice_sums"].as_array().unwrap();
        assert_eq!(sums.len() as u64, p.file_bytes.div_ceil(p.slice_bytes));
    }
}
