//! The scenarios of issue 3 as data, the [`Engine`] trait that runs one, the
//! kernel baselines as engines, and [`run_scenario`], which runs every
//! engine on every variant in interleaved rounds and returns a [`Report`].
//!
//! Adding an engine (upager with some configuration) is adding an `impl
//! Engine`: it receives the same [`ScenarioParams`] as the kernel (data file,
//! budget, threads, folio size …) and returns a [`Measurement`]; the ratios,
//! JSON and plots come from here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::env::{self, BenchEnv, ThpKnobs};
use crate::report::{self, Report, RunRecord};
use crate::worker::{run_worker, RunOptions, WorkerError, WorkerExe, WorkerRun};
use crate::workloads::{MapAdvice, Workload};

/// Errors of running a scenario or an engine.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum BenchError {
    /// unknown scenario {0:?}; known: mmap-read, random-read, multi-fault, unmap-folio, swap, residency
    UnknownScenario(String),
    /// scenario {0} needs a data file: call `prepare` with a BenchEnv first (or set `data_file`)
    NoDataFile(String),
    /// engine {engine} does not run scenario {scenario}
    Unsupported {
        /// The engine.
        engine: String,
        /// The scenario.
        scenario: String,
    },
    /// {0}
    Setup(#[from] env::SetupError),
    /// {0}
    Worker(#[from] WorkerError),
    /// {0}
    Tlb(#[from] crate::tlb::TlbCountError),
    /// {0}
    Report(#[from] report::ReportError),
    /// the run read {0} wrong words: the engine returned wrong data
    WrongData(u64),
    /// {0}
    Other(String),
}

/// Every knob of every scenario; each scenario reads the ones it needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ScenarioParams {
    /// The scenario (set by [`run_scenario`]).
    pub scenario: String,
    /// The variant label (e.g. `threads=2`, `folio=64K`; set by [`run_scenario`]).
    pub variant: String,
    /// Memory budget: upager's budget and the kernel's cgroup limit.
    pub limit_bytes: u64,
    /// Run the kernel in a memory cgroup with `limit_bytes`.
    pub use_cgroup: bool,
    /// Data file size (file scenarios).
    pub file_bytes: u64,
    /// The data file (made by [`prepare`]).
    pub data_file: Option<PathBuf>,
    /// Pattern seed of the data file.
    pub seed: u64,
    /// Threads (for scenarios with one thread count).
    pub threads: usize,
    /// Thread counts to sweep (multi-fault, swap); empty = just `threads`.
    pub thread_counts: Vec<usize>,
    /// Reads per thread (random-read).
    pub reads_per_thread: u64,
    /// Duration (multi-fault).
    pub seconds: f64,
    /// Area per thread (multi-fault).
    pub area_bytes: u64,
    /// Region size (unmap-folio).
    pub region_bytes: u64,
    /// Folio size of this variant, KiB.
    pub folio_kb: u64,
    /// Folio sizes to sweep, KiB (unmap-folio).
    pub folio_sizes_kb: Vec<u64>,
    /// Anonymous memory per thread (swap).
    pub bytes_per_thread: u64,
    /// Passes over the memory (swap).
    pub passes: u32,
    /// Interleaved rounds; the median is reported.
    pub rounds: usize,
    /// Drop caches before each run (root).
    pub drop_caches: bool,
    /// Count tlb:tlb_flush for the engine's process (root).
    pub trace_tlb: bool,
    /// Time limit per run, seconds.
    pub timeout_s: f64,
    /// Directory for upager's private swap files (swap scenario; set by
    /// [`prepare`] to the RAM device's ext4 when there is one).
    pub swap_dir: Option<PathBuf>,
}

impl Default for ScenarioParams {
    fn default() -> Self {
        ScenarioParams {
            scenario: String::new(),
            variant: String::new(),
            limit_bytes: 256 << 20,
            use_cgroup: true,
            file_bytes: 2 << 30,
            data_file: None,
            seed: 0x5eed_0000_0000_0001,
            threads: ncpu(),
            thread_counts: Vec::new(),
            reads_per_thread: 100_000,
            seconds: 2.0,
            area_bytes: 2 << 20,
            region_bytes: 1 << 30,
            folio_kb: 4,
            folio_sizes_kb: Vec::new(),
            bytes_per_thread: 256 << 20,
            passes: 2,
            rounds: 3,
            drop_caches: true,
            trace_tlb: true,
            timeout_s: 600.0,
            swap_dir: None,
        }
    }
}

/// Number of CPUs this process may use.
pub fn ncpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The main number of a scenario, for tables, ratios and plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Metric {
    /// Wall time, lower is better.
    ElapsedS,
    /// Operations per second, higher is better.
    OpsPerS,
    /// System CPU time, lower is better.
    SysS,
}

impl Metric {
    /// Read the metric from a measurement.
    pub fn of(self, m: &Measurement) -> f64 {
        match self {
            Metric::ElapsedS => m.elapsed_s,
            Metric::OpsPerS => m.ops_per_s,
            Metric::SysS => m.sys_s,
        }
    }
    /// Whether larger values are better.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::OpsPerS)
    }
    /// Column label.
    pub fn label(self) -> &'static str {
        match self {
            Metric::ElapsedS => "elapsed s",
            Metric::OpsPerS => "ops/s",
            Metric::SysS => "sys s",
        }
    }
}

/// A scenario of issue 3.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name used on the command line.
    pub name: &'static str,
    /// The seed experiment it reproduces.
    pub seed: &'static str,
    /// What it measures and why.
    pub doc: &'static str,
    /// The engines it compares (names as in [`KernelEngine`] and
    /// [`crate::upager_engine::UpagerEngine::all`]).
    pub engines: &'static [&'static str],
    /// The target from issue 3.
    pub target: &'static str,
    /// The main metric.
    pub metric: Metric,
    /// Needs a data file on the RAM device.
    pub needs_file: bool,
    /// Needs a swap device for the kernel.
    pub needs_swap: bool,
    /// Variant whose value the others are compared to within one engine
    /// (unmap-folio: `folio=4K`).
    pub baseline_variant: Option<&'static str>,
    /// Default parameters (a few minutes on 2 vCPUs).
    pub defaults: fn() -> ScenarioParams,
    /// Tiny parameters (tests: seconds).
    pub tiny: fn() -> ScenarioParams,
}

fn mmap_read_defaults() -> ScenarioParams {
    ScenarioParams {
        file_bytes: 2 << 30,
        limit_bytes: 256 << 20,
        ..Default::default()
    }
}
fn mmap_read_tiny() -> ScenarioParams {
    // 8 MiB, not 4: a 4 MiB cgroup is close to the worker's own footprint
    // and the kernel's run was OOM-killed once on a loaded machine.
    ScenarioParams {
        file_bytes: 32 << 20,
        limit_bytes: 8 << 20,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn random_read_defaults() -> ScenarioParams {
    ScenarioParams {
        file_bytes: 2 << 30,
        limit_bytes: 256 << 20,
        reads_per_thread: 100_000,
        ..Default::default()
    }
}
fn random_read_tiny() -> ScenarioParams {
    ScenarioParams {
        file_bytes: 64 << 20,
        limit_bytes: 8 << 20, // see mmap_read_tiny
        reads_per_thread: 2000,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn multi_fault_defaults() -> ScenarioParams {
    ScenarioParams {
        thread_counts: (1..=2 * ncpu()).collect(),
        seconds: 3.0,
        use_cgroup: false,
        ..Default::default()
    }
}
fn multi_fault_tiny() -> ScenarioParams {
    ScenarioParams {
        thread_counts: vec![1, 2],
        seconds: 0.2,
        use_cgroup: false,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn unmap_defaults() -> ScenarioParams {
    let mut sizes = vec![4];
    sizes.extend(env::mthp_sizes_kb().into_iter().filter(|&s| s >= 16));
    ScenarioParams {
        region_bytes: 1 << 30,
        folio_sizes_kb: sizes,
        use_cgroup: false,
        ..Default::default()
    }
}
fn unmap_tiny() -> ScenarioParams {
    let mut sizes = vec![4];
    sizes.extend(env::mthp_sizes_kb().into_iter().filter(|&s| s == 64));
    ScenarioParams {
        region_bytes: 16 << 20,
        folio_sizes_kb: sizes,
        use_cgroup: false,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn swap_defaults() -> ScenarioParams {
    ScenarioParams {
        thread_counts: vec![1, ncpu(), 2 * ncpu()],
        bytes_per_thread: 0, // 0 = 2 × limit spread over the threads
        limit_bytes: 256 << 20,
        passes: 2,
        ..Default::default()
    }
}
fn swap_tiny() -> ScenarioParams {
    ScenarioParams {
        thread_counts: vec![1, 2],
        bytes_per_thread: 0,
        limit_bytes: 8 << 20,
        passes: 2,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}

fn residency_defaults() -> ScenarioParams {
    ScenarioParams {
        region_bytes: 16 << 30,
        use_cgroup: false,
        drop_caches: false,
        ..Default::default()
    }
}
fn residency_tiny() -> ScenarioParams {
    ScenarioParams {
        region_bytes: 64 << 20,
        use_cgroup: false,
        drop_caches: false,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}

static SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "mmap-read",
        seed: "000 (Mel Gorman, TLB flush multiple pages per IPI; vm-scalability lru-file-mmap-read)",
        doc: "NR_CPU threads read a MAP_SHARED file mapping sequentially, each its own part, with data much \
              larger than the memory budget, so every page read evicts one. Measures elapsed time, CPU and \
              TLB shootdowns per second and per 1000 evicted pages: eviction under pressure is where one \
              shootdown per page used to cost 25% of the run.",
        engines: &["kernel", "kernel MADV_SEQUENTIAL", "upager batch=1", "upager"],
        target: "elapsed ≤ 0.6× the kernel's; ≤ 2 TLB shootdowns per 1000 evicted pages (batch=1 ≈ 1000)",
        metric: Metric::ElapsedS,
        needs_file: true,
        needs_swap: false,
        baseline_variant: None,
        defaults: mmap_read_defaults,
        tiny: mmap_read_tiny,
    },
    Scenario {
        name: "random-read",
        seed: "CIDR'22 mmap-in-DBMS study / vmcache lookups",
        doc: "T threads do uniformly random 4 KiB reads over a file 8× the budget, a fixed number each. \
              Measures reads/s and shootdowns: the case where mmap loses to direct I/O in databases, and \
              where a user-space pager pays one fault round trip per miss.",
        engines: &["kernel", "kernel MADV_RANDOM", "upager batch=1", "upager"],
        target: "reads/s ≥ 0.9× the kernel's",
        metric: Metric::OpsPerS,
        needs_file: true,
        needs_swap: false,
        baseline_variant: None,
        defaults: random_read_defaults,
        tiny: random_read_tiny,
    },
    Scenario {
        name: "multi-fault",
        seed: "001 (Kamezawa, speculative page fault; per-VMA locks)",
        doc: "T threads each write-fault their own 2 MiB anonymous area page by page, discard it with \
              MADV_DONTNEED and repeat for D seconds; faults/s for T = 1..2×ncpu. Measures whether the \
              fault path scales with threads or serialises on an address-space lock.",
        engines: &["kernel", "upager", "upager locked-lookup"],
        target: "2 threads ≥ 1.6× the faults/s of 1 thread",
        metric: Metric::OpsPerS,
        needs_file: false,
        needs_swap: false,
        baseline_variant: Some("threads=1"),
        defaults: multi_fault_defaults,
        tiny: multi_fault_tiny,
    },
    Scenario {
        name: "unmap-folio",
        seed: "002 (David Hildenbrand, optimize unmap/zap with PTE-mapped THP)",
        doc: "Unmap a fully resident 1 GiB anonymous region made of 4 KiB pages or of large folios \
              (mTHP 16 KiB … 2 MiB where the kernel offers them). Seconds per folio size and % change \
              vs 4 KiB, the seed's table: large folios are processed as one unit.",
        engines: &["kernel", "upager"],
        target: "≥ 50% less time at 64 KiB than at 4 KiB",
        metric: Metric::ElapsedS,
        needs_file: false,
        needs_swap: false,
        baseline_variant: Some("folio=4K"),
        defaults: unmap_defaults,
        tiny: unmap_tiny,
    },
    Scenario {
        name: "swap",
        seed: "003 (Mel Gorman, batch removal of mappings under a single lock; usemem)",
        doc: "T threads touch anonymous memory larger than the budget (usemem: write each page, read it \
              back), the kernel with a RAM swap device in the cgroup. System time and elapsed per thread \
              count: the cost of removing pages under pressure.",
        engines: &["kernel", "upager batched", "upager unbatched"],
        target: "system time below the kernel's; batched removal beats unbatched",
        metric: Metric::SysS,
        needs_file: false,
        needs_swap: true,
        baseline_variant: None,
        defaults: swap_defaults,
        tiny: swap_tiny,
    },
    Scenario {
        name: "residency",
        seed: "004 (Peter Xu, PTE marker for shmem pageout)",
        doc: "Classify a large file-backed upager region (16 GiB, per 4 MiB: 1 MiB resident, 1 MiB \
              evicted = read then paged out, 2 MiB never touched) into resident / evicted / never \
              touched. `kernel` reads /proc/self/pagemap for the range (one pread), `kernel \
              PAGEMAP_SCAN` walks it with the ioctl; neither can tell evicted from never touched (no PTE \
              either way), which is the seed's point. `upager residency` answers as runs from the folio \
              state words, `upager pagemap` in /proc/pid/pagemap's shape (bit 62 = evicted). Seconds per \
              classification, median of 5 in each run.",
        engines: &["kernel", "kernel PAGEMAP_SCAN", "upager residency", "upager pagemap"],
        target: "upager residency ≥ 10× faster than reading /proc/self/pagemap (≤ 0.1×)",
        metric: Metric::ElapsedS,
        needs_file: false,
        needs_swap: false,
        baseline_variant: None,
        defaults: residency_defaults,
        tiny: residency_tiny,
    },
];

/// All scenarios.
pub fn scenarios() -> &'static [Scenario] {
    SCENARIOS
}

/// A scenario by name.
pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

fn size_label(kb: u64) -> String {
    if kb >= 1024 && kb & 1023 == 0 {
        format!("{}M", kb / 1024)
    } else {
        format!("{kb}K")
    }
}

impl Scenario {
    /// The runs a sweep makes: one [`ScenarioParams`] per variant, with
    /// `scenario`, `variant` and the swept field filled in.
    pub fn variants(&self, p: &ScenarioParams) -> Vec<ScenarioParams> {
        let base = ScenarioParams {
            scenario: self.name.to_string(),
            ..p.clone()
        };
        match self.name {
            "multi-fault" | "swap" => {
                let counts = if p.thread_counts.is_empty() {
                    vec![p.threads]
                } else {
                    p.thread_counts.clone()
                };
                counts
                    .into_iter()
                    .map(|t| ScenarioParams {
                        threads: t,
                        variant: format!("threads={t}"),
                        ..base.clone()
                    })
                    .collect()
            }
            "unmap-folio" => {
                let sizes = if p.folio_sizes_kb.is_empty() {
                    vec![p.folio_kb]
                } else {
                    p.folio_sizes_kb.clone()
                };
                sizes
                    .into_iter()
                    .map(|k| ScenarioParams {
                        folio_kb: k,
                        variant: format!("folio={}", size_label(k)),
                        ..base.clone()
                    })
                    .collect()
            }
            _ => vec![ScenarioParams {
                variant: format!("threads={}", p.threads),
                ..base
            }],
        }
    }
}

/// Create the data file a file scenario needs on the environment's RAM
/// device (reused if it already has the right size), and set `data_file`.
pub fn prepare(
    name: &str,
    params: &ScenarioParams,
    env: &BenchEnv,
) -> Result<ScenarioParams, BenchError> {
    let sc = scenario(name).ok_or_else(|| BenchError::UnknownScenario(name.into()))?;
    let mut p = params.clone();
    if sc.needs_file && p.data_file.is_none() {
        let file = env
            .data_dir()
            .join(format!("data-{}-{:x}", p.file_bytes, p.seed));
        if std::fs::metadata(&file).map(|m| m.len()).ok() != Some(p.file_bytes.div_ceil(8) * 8) {
            let t = env::create_pattern_file(&file, p.file_bytes, p.seed)?;
            eprintln!(
                "upager-bench: made {} ({} MiB) in {:.2} s",
                file.display(),
                p.file_bytes >> 20,
                t.as_secs_f64()
            );
        }
        p.data_file = Some(file);
    }
    if sc.needs_swap && p.swap_dir.is_none() && env.store.is_some() {
        p.swap_dir = Some(env.data_dir());
    }
    Ok(p)
}

/// One engine's measurement of one run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Measurement {
    /// Wall time of the measured part.
    pub elapsed_s: f64,
    /// User CPU time.
    pub user_s: f64,
    /// System CPU time.
    pub sys_s: f64,
    /// Minor faults.
    pub minflt: u64,
    /// Major faults.
    pub majflt: u64,
    /// Operations (pages read, reads, faults, page touches).
    pub ops: u64,
    /// `ops / elapsed_s`.
    pub ops_per_s: f64,
    /// System-wide `TLB` interrupts (/proc/interrupts) during the run.
    pub tlb_irq: Option<u64>,
    /// `tlb_irq` per second.
    pub tlb_irq_per_s: Option<f64>,
    /// Tracepoint `remote IPI send` events of the engine's process.
    pub tlb_sends: Option<u64>,
    /// Tracepoint events per reason 0..=5.
    pub tlb_by_reason: Option<[u64; 6]>,
    /// Pages evicted (kernel: cgroup `pgpgout`; upager: its own counter).
    pub evicted_pages: Option<u64>,
    /// `tlb_sends` per 1000 evicted pages.
    pub sends_per_1000_evicted: Option<f64>,
    /// Peak memory charge (cgroup max_usage) or resident peak.
    pub peak_bytes: Option<u64>,
    /// Scenario-specific values.
    pub extra: BTreeMap<String, f64>,
    /// What was skipped or worth knowing.
    pub notes: Vec<String>,
}

/// Pages the kernel evicted during a worker run, counted per page (the
/// cgroup's `pgpgout` counts folios, and file folios are large on 6.18's
/// ext4): file pages = pages the worker read from block devices (its
/// `read_bytes`, which includes swap-ins) − `pswpin` − growth of the
/// cgroup's page cache; anonymous pages = `pswpout` (system-wide, but only
/// the benchmark swaps here). `None` when neither could be measured.
pub fn evicted_pages(run: &WorkerRun) -> Option<u64> {
    let swapin = run.vmstat.get("pswpin").copied().unwrap_or(0);
    let file = match (
        run.result.extra.get("read_bytes"),
        run.cgroup_stat.get("cache_start"),
        run.cgroup_stat.get("cache_end"),
    ) {
        (Some(&read), Some(&c0), Some(&c1)) => Some(
            ((read as u64) / 4096)
                .saturating_sub(swapin)
                .saturating_sub(c1.saturating_sub(c0) / 4096),
        ),
        _ => None,
    };
    let anon = run.vmstat.get("pswpout").copied();
    match (file, anon) {
        (None, None) => None,
        (f, a) => Some(f.unwrap_or(0) + a.unwrap_or(0)),
    }
}

impl Measurement {
    /// Build a measurement from a worker run.
    pub fn from_worker(run: &WorkerRun) -> Self {
        let r = &run.result;
        let evicted = evicted_pages(run);
        let sends = run.tlb.as_ref().map(|t| t.remote_sends());
        Measurement {
            elapsed_s: r.elapsed_s,
            user_s: r.user_s,
            sys_s: r.sys_s,
            minflt: r.minflt,
            majflt: r.majflt,
            ops: r.ops,
            ops_per_s: if r.elapsed_s > 0.0 {
                r.ops as f64 / r.elapsed_s
            } else {
                0.0
            },
            tlb_irq: run.tlb_irq,
            tlb_irq_per_s: run.tlb_irq.map(|n| {
                if r.elapsed_s > 0.0 {
                    n as f64 / r.elapsed_s
                } else {
                    0.0
                }
            }),
            tlb_sends: sends,
            tlb_by_reason: run.tlb.as_ref().map(|t| t.by_reason),
            evicted_pages: evicted,
            sends_per_1000_evicted: match (sends, evicted) {
                (Some(s), Some(e)) if e > 0 => Some(s as f64 * 1000.0 / e as f64),
                _ => None,
            },
            peak_bytes: run.peak_bytes,
            extra: r.extra.clone(),
            notes: run.notes.clone(),
        }
    }
}

/// Something that runs a scenario: the kernel, or upager in some
/// configuration.
pub trait Engine: Send + Sync {
    /// Name in tables and JSON (e.g. `kernel`, `upager batch=1`).
    fn name(&self) -> String;
    /// Whether it runs this scenario.
    fn supports(&self, _scenario: &str) -> bool {
        true
    }
    /// Run one variant of a scenario once.
    fn run(&self, scenario: &ScenarioParams) -> Result<Measurement, BenchError>;
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
    pub fn plan(&self, p: &ScenarioParams) -> Result<(Workload, RunOptions), BenchError> {
        let file = || {
            p.data_file
                .clone()
                .ok_or_else(|| BenchError::NoDataFile(p.scenario.clone()))
        };
        let w = match p.scenario.as_str() {
            "mmap-read" => Workload::MmapRead {
                file: file()?,
                threads: p.threads,
                seed: p.seed,
                advice: self.advice,
            },
            "random-read" => Workload::RandomRead {
                file: file()?,
                threads: p.threads,
                reads_per_thread: p.reads_per_thread,
                seed: p.seed,
                advice: self.advice,
            },
            "multi-fault" => Workload::MultiFault {
                threads: p.threads,
                seconds: p.seconds,
                area_bytes: p.area_bytes as usize,
            },
            "unmap-folio" => Workload::Unmap {
                bytes: p.region_bytes as usize,
                folio_kb: p.folio_kb,
            },
            "swap" => {
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
            other => return Err(BenchError::UnknownScenario(other.into())),
        };
        let opts = RunOptions {
            cgroup_limit: p.use_cgroup.then_some(p.limit_bytes),
            trace_tlb: p.trace_tlb,
            timeout: Duration::from_secs_f64(p.timeout_s.max(1.0)),
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

    fn supports(&self, scenario: &str) -> bool {
        // Advice only changes the file scenarios; each tuned variant runs
        // where it is the advice a user would give.
        match self.advice {
            MapAdvice::Normal => scenario != "residency",
            MapAdvice::Random => scenario == "random-read",
            MapAdvice::Sequential => scenario == "mmap-read",
        }
    }

    fn run(&self, p: &ScenarioParams) -> Result<Measurement, BenchError> {
        let (w, opts) = self.plan(p)?;
        // Large folios for the unmap scenario: enable exactly that mTHP size.
        let _knobs = match (&w, env::is_root()) {
            (Workload::Unmap { folio_kb, .. }, true) if *folio_kb > 4 => {
                Some(ThpKnobs::only(*folio_kb)?)
            }
            (Workload::Unmap { folio_kb, .. }, false) if *folio_kb > 4 => {
                return Err(env::SetupError::NotRoot {
                    what: "mTHP sizes".into(),
                }
                .into())
            }
            _ => None,
        };
        // The data file must not be in the page cache (charged to whoever
        // read it last) when the run starts: evict it, whatever drop_caches says.
        if let Some(f) = &p.data_file {
            env::evict_file(f)?;
        }
        let run = run_worker(&self.exe, &w, &opts)?;
        if run.result.bad_words > 0 {
            return Err(BenchError::WrongData(run.result.bad_words));
        }
        Ok(Measurement::from_worker(&run))
    }
}

/// Run scenario `name` with `params` on every engine that supports it:
/// for each variant, `params.rounds` rounds of A B C … (interleaved, so slow
/// drift of the machine hits every engine alike), caches dropped before each
/// run (root). Per-run failures are recorded in the report, not fatal.
pub fn run_scenario(
    name: &str,
    params: &ScenarioParams,
    engines: &[Box<dyn Engine>],
) -> Result<Report, BenchError> {
    let sc = scenario(name).ok_or_else(|| BenchError::UnknownScenario(name.into()))?;
    if sc.needs_file && params.data_file.is_none() {
        return Err(BenchError::NoDataFile(name.into()));
    }
    let engines: Vec<&dyn Engine> = engines
        .iter()
        .map(|e| e.as_ref())
        .filter(|e| e.supports(name))
        .collect();
    let variants = sc.variants(params);
    let rounds = params.rounds.max(1);
    let mut runs = Vec::new();
    let total = variants.len() * rounds * engines.len();
    let mut n = 0;
    for v in &variants {
        for (round, idx) in report::interleaved(rounds, engines.len()) {
            let e = engines[idx];
            n += 1;
            if params.drop_caches && env::is_root() {
                if let Err(err) = env::drop_caches() {
                    eprintln!("upager-bench: drop_caches: {err}");
                }
            }
            let r = e.run(v);
            match &r {
                Ok(m) => eprintln!(
                    "[{n}/{total}] {name} {} {} round {}: {} = {:.4}",
                    v.variant,
                    e.name(),
                    round + 1,
                    sc.metric.label(),
                    sc.metric.of(m)
                ),
                Err(err) => eprintln!(
                    "[{n}/{total}] {name} {} {} round {}: FAILED: {err}",
                    v.variant,
                    e.name(),
                    round + 1
                ),
            }
            runs.push(RunRecord {
                engine: e.name(),
                variant: v.variant.clone(),
                round,
                params: v.clone(),
                measurement: r.as_ref().ok().cloned(),
                error: r.err().map(|e| e.to_string()),
            });
        }
    }
    Ok(Report::new(sc, params, runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_complete() {
        for n in [
            "mmap-read",
            "random-read",
            "multi-fault",
            "unmap-folio",
            "swap",
            "residency",
        ] {
            let s = scenario(n).unwrap();
            assert!(!s.doc.is_empty() && !s.target.is_empty() && s.engines.contains(&"kernel"));
            assert!(!s.variants(&(s.tiny)()).is_empty());
        }
        assert!(scenario("nope").is_none());
    }

    #[test]
    fn variants_sweep() {
        let s = scenario("multi-fault").unwrap();
        let v = s.variants(&ScenarioParams {
            thread_counts: vec![1, 2, 4],
            ..Default::default()
        });
        assert_eq!(v.iter().map(|p| p.threads).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(v[2].variant, "threads=4");
        let s = scenario("unmap-folio").unwrap();
        let v = s.variants(&ScenarioParams {
            folio_sizes_kb: vec![4, 64, 2048],
            ..Default::default()
        });
        assert_eq!(
            v.iter().map(|p| p.variant.as_str()).collect::<Vec<_>>(),
            ["folio=4K", "folio=64K", "folio=2M"]
        );
    }

    #[test]
    fn params_json_defaults() {
        let p: ScenarioParams = serde_json::from_str(r#"{"threads": 3}"#).unwrap();
        assert_eq!(p.threads, 3);
        assert_eq!(p.limit_bytes, 256 << 20);
    }
}
