//! `upager bench <scenario>|all`: the benchmark suite — each seed
//! experiment run on the kernel and on upager (with its ablations) in
//! interleaved rounds, printed as a table with ratios, saved as JSON and PNG.
//! See docs/benchmarks.md for what each scenario measures and the results.
//!
//! This binary is also the suite's worker: `upager __bench-worker <workload>
//! --json … --wait-go` runs one workload in a fresh process (the kernel's in
//! a memory cgroup, upager's with its own budget), see
//! `upager_bench::worker`.

use std::path::PathBuf;
use std::sync::LazyLock;

use clap::builder::PossibleValue;
use upager::FaultMode;
use upager_bench::env::in_ci;
use upager_bench::workloads::MapAdvice;
use upager_bench::{
    plot, prepare, results_dir, run_scenario, select_fault_modes, BenchEnv, DataKind, Engine,
    EnvConfig, KernelEngine, NumpyEngine, Scenario, ScenarioParams, SwapKind, UpagerEngine,
    WorkerExe,
};

use crate::size_arg;

/// The hidden first argument that makes this binary a bench worker.
pub const WORKER_ARG: &str = "__bench-worker";

/// If this process was started as a bench worker, run the workload and
/// return its exit code.
pub fn worker_hook() -> Option<std::process::ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    (args.first().map(String::as_str) == Some(WORKER_ARG))
        .then(|| upager_bench::worker::worker_main(&args[1..]))
}

/// This executable as the worker of the suite.
pub fn worker_exe() -> Result<WorkerExe, std::io::Error> {
    Ok(WorkerExe::SelfWithArg(
        std::env::current_exe()?,
        WORKER_ARG.into(),
    ))
}

/// What `upager bench` runs: one scenario, or `all` of them in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScenarioArg {
    /// Every scenario.
    All,
    /// One scenario.
    One(Scenario),
}

impl ScenarioArg {
    /// The scenarios to run, in order.
    pub fn scenarios(self) -> Vec<Scenario> {
        match self {
            ScenarioArg::All => Scenario::ALL.to_vec(),
            ScenarioArg::One(s) => vec![s],
        }
    }
}

impl clap::ValueEnum for ScenarioArg {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: LazyLock<Vec<ScenarioArg>> = LazyLock::new(|| {
            let mut v: Vec<ScenarioArg> = Scenario::ALL.map(ScenarioArg::One).to_vec();
            v.push(ScenarioArg::All);
            v
        });
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            ScenarioArg::All => PossibleValue::new("all").help("every scenario in turn"),
            ScenarioArg::One(s) => PossibleValue::new(s.name()).help(s.spec().seed),
        })
    }
}

/// One element of a comma-separated size list (`4K,64K,2M`).
fn size_item(s: &str) -> Result<u64, String> {
    size_arg(s.trim())
}

/// One element of a comma-separated fault mode list (`handlers,in-thread`),
/// by `FaultMode`'s names (shown in --help).
fn mode_item() -> impl clap::builder::TypedValueParser<Value = FaultMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(
        [FaultMode::Handlers, FaultMode::InThread].map(FaultMode::name),
    )
    .try_map(|s| s.parse::<FaultMode>())
}

/// One element of a comma-separated data kind list
/// (`compressible,incompressible`), by `DataKind`'s names (shown in --help).
fn data_item() -> impl clap::builder::TypedValueParser<Value = DataKind> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(DataKind::ALL.map(DataKind::name))
        .try_map(|s| s.parse::<DataKind>())
}

/// One element of a comma-separated thread count list (`1,2,4`).
fn count_item(s: &str) -> Result<usize, String> {
    s.trim().parse::<usize>().map_err(|e| format!("{s:?}: {e}"))
}

/// Options of `upager bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// The scenario, or `all`.
    #[arg(value_enum)]
    pub scenario: ScenarioArg,
    /// Write the JSON report here (one scenario; with `all`, use --out).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the PNG plot here (one scenario; with `all`, use --out).
    #[arg(long)]
    pub png: Option<PathBuf>,
    /// Directory for `<prefix><scenario>.json/.png` when --json/--png are
    /// not given (default: `bench/results/<today, UTC>-<scenario>`, or
    /// `…-suite` with `all`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// File name prefix in --out (e.g. `faultin-`).
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Interleaved rounds (median reported; ≥ 3 for a ratio worth quoting).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Tiny sizes (seconds; proves the pipeline, numbers mean little).
    #[arg(long)]
    pub tiny: bool,
    /// Memory budget: upager's budget and the kernel's cgroup limit.
    #[arg(long, value_parser = size_arg)]
    pub budget: Option<u64>,
    /// Data file size (mmap-read, random-read).
    #[arg(long, value_parser = size_arg)]
    pub file_size: Option<u64>,
    /// Threads (mmap-read, random-read).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Thread counts to sweep, e.g. 1,2,4 (multi-fault, swap).
    #[arg(long, value_delimiter = ',', value_parser = count_item)]
    pub thread_counts: Option<Vec<usize>>,
    /// Random reads per thread (random-read; tlb-reach: reads in all).
    #[arg(long)]
    pub reads: Option<u64>,
    /// Seconds per run (multi-fault).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Region size (unmap-folio, residency, tlb-reach).
    #[arg(long, value_parser = size_arg)]
    pub region: Option<u64>,
    /// Folio sizes to sweep, e.g. 4K,64K,2M (unmap-folio).
    #[arg(long, value_delimiter = ',', value_parser = size_item)]
    pub folios: Option<Vec<u64>>,
    /// Fault modes of the `upager <mode>` engines, e.g. `handlers` or
    /// `handlers,in-thread` (default: both). A mode the engine cannot run
    /// here is left out with a note (under CI=true: the run fails). The
    /// ablations (batch=1, locked-lookup, unbatched, 64K) run in handlers
    /// mode whatever this says.
    #[arg(long, value_delimiter = ',', value_parser = mode_item())]
    pub fault_mode: Option<Vec<FaultMode>>,
    /// Random element reads and writes (numpy).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Kinds of data, one row per engine each (numpy; default both):
    /// `compressible` (element i = i: zram compresses it, a read from the
    /// device decompresses) and `incompressible` (random float64s: zram
    /// stores them as they are, a read is a copy).
    #[arg(long, value_delimiter = ',', value_parser = data_item())]
    pub data: Option<Vec<DataKind>>,
    /// upager's budget inside the cgroup of --budget (numpy; default
    /// three quarters of it).
    #[arg(long, value_parser = size_arg)]
    pub upager_budget: Option<u64>,
    /// Only the kernel's engines.
    #[arg(long, conflicts_with = "upager_only")]
    pub kernel_only: bool,
    /// Only upager's engines.
    #[arg(long)]
    pub upager_only: bool,
    /// Also run upager with its data on this Redis Cluster
    /// (redis-cluster://HOST:PORT; start a local one with
    /// scripts/redis-cluster.sh start): engines `upager redis` (batches
    /// pipelined per node) and `upager redis per-folio` (one round trip per
    /// folio) on mmap-read, random-read and swap, 64 KiB folios, next to
    /// `upager handlers` / `upager 64K` on the file store and local swap.
    #[arg(long, value_name = "URL", value_parser = crate::datasets::StoreUrlParser)]
    pub store: Option<upager_redis::StoreUrl>,
    /// Run only these engines (exact names, comma-separated, as the report
    /// prints them, e.g. "kernel,upager handlers,upager redis").
    #[arg(long, value_delimiter = ',')]
    pub engines: Option<Vec<String>>,
    /// numpy: also run upager as this ordinary user (an existing account,
    /// e.g. one made with `useradd`; needs root): engines `upager defaults
    /// as NAME` and `upager default 4K/64K as NAME` (the fault mode upager
    /// chooses: in-thread, with the user-mode-only userfaultfd an ordinary
    /// user gets; the default folio size, then 4K and 64K) and `upager
    /// handlers 4K as NAME`, side by side with root's.
    #[arg(long, value_name = "NAME")]
    pub as_user: Option<String>,
}

/// The user and group id of account `name` (`id -u`, `id -g`).
fn user_ids(name: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = std::process::Command::new("id")
            .args([flag, name])
            .output()
            .map_err(|e| format!("running id: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "--as-user {name}: no such user ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| format!("id {flag} {name}: {e}"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// The engines of a run; `user`: the `--as-user` account, resolved.
fn engines(
    a: &BenchArgs,
    exe: &WorkerExe,
    modes: &[FaultMode],
    user: Option<&(String, u32, u32)>,
) -> Vec<Box<dyn Engine>> {
    let mut v: Vec<Box<dyn Engine>> = vec![
        Box::new(KernelEngine::with_worker(exe.clone())),
        Box::new(KernelEngine::with_worker(exe.clone()).with_advice(MapAdvice::Random)),
        Box::new(KernelEngine::with_worker(exe.clone()).with_advice(MapAdvice::Sequential)),
    ];
    v.extend(UpagerEngine::for_modes(exe, modes));
    if let Some(url) = &a.store {
        v.extend(UpagerEngine::for_store(exe, &url.to_string()));
    }
    if let Some((name, uid, gid)) = user {
        for e in [
            NumpyEngine::defaults(),
            NumpyEngine::upager_default(4),
            NumpyEngine::upager_default(64),
            NumpyEngine::upager(4, FaultMode::Handlers),
        ] {
            v.push(Box::new(e.as_user(name, *uid, *gid)));
        }
    }
    v.retain(|e| {
        let kernel = e.name().starts_with("kernel");
        let chosen = a
            .engines
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n.trim() == e.name()));
        chosen && !(a.upager_only && kernel || a.kernel_only && !kernel)
    });
    v
}

/// The fault modes to run: the requested ones (default both) that can run
/// here, and notes on those left out. Kernel-only runs need none.
fn fault_modes(
    a: &BenchArgs,
    exe: &WorkerExe,
) -> Result<(Vec<FaultMode>, Vec<String>), Box<dyn std::error::Error>> {
    let requested = a
        .fault_mode
        .clone()
        .unwrap_or_else(|| vec![FaultMode::Handlers, FaultMode::InThread]);
    if a.kernel_only {
        return Ok((requested, Vec::new()));
    }
    let (modes, notes) = select_fault_modes(exe, &requested)?;
    for n in &notes {
        eprintln!("upager bench: {n}");
    }
    Ok((modes, notes))
}

/// Runs `upager bench`.
pub fn run(a: &BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let names = a.scenario.scenarios();
    if names.len() > 1 && (a.json.is_some() || a.png.is_some()) {
        return Err("--json/--png name one scenario's files; with `all`, use --out DIR".into());
    }
    let exe = worker_exe()?;
    let (modes, mode_notes) = fault_modes(a, &exe)?;
    let user = match &a.as_user {
        Some(n) => {
            let (uid, gid) = user_ids(n)?;
            Some((n.clone(), uid, gid))
        }
        None => None,
    };
    let engines = engines(a, &exe, &modes, user.as_ref());
    let out = a.out.clone().unwrap_or_else(|| {
        results_dir(match a.scenario {
            ScenarioArg::All => "suite",
            ScenarioArg::One(s) => s.name(),
        })
    });
    let mut failed = Vec::new();
    for name in names {
        let sc = name.spec();
        let mut p: ScenarioParams = if a.tiny { name.tiny() } else { name.defaults() };
        if let Some(r) = a.rounds {
            p.rounds = r;
        }
        if let Some(b) = a.budget {
            p.limit_bytes = b;
        }
        if let Some(f) = a.file_size {
            p.file_bytes = f;
        }
        if let Some(t) = a.threads {
            p.threads = t;
        }
        if let Some(t) = &a.thread_counts {
            p.thread_counts.clone_from(t);
        }
        if let Some(r) = a.reads {
            p.reads_per_thread = r;
        }
        if let Some(s) = a.seconds {
            p.seconds = s;
        }
        if let Some(r) = a.region {
            p.region_bytes = r;
        }
        if let Some(f) = &a.folios {
            p.folio_sizes_kb = f.iter().map(|b| b / 1024).collect();
        }
        if let Some(n) = a.ops {
            p.random_ops = n;
        }
        if let (Some(d), false) = (&a.data, p.data_kinds.is_empty()) {
            p.data_kinds.clone_from(d);
            p.data_kinds.dedup();
        }
        if let Some(b) = a.upager_budget {
            p.budget_bytes = b;
        } else if a.budget.is_some() && p.budget_bytes > 0 {
            // The numpy default: upager gets 3/4 of the cgroup (192 of 256 MiB).
            p.budget_bytes = p.limit_bytes / 4 * 3;
        }
        eprintln!("== {name}: seed {}", sc.seed);
        eprintln!("   {}", sc.doc);
        let per_thread = if p.bytes_per_thread > 0 {
            p.bytes_per_thread
        } else {
            2 * p.limit_bytes
        };
        let max_threads = p
            .thread_counts
            .iter()
            .copied()
            .max()
            .unwrap_or(p.threads)
            .max(1) as u64;
        let anon_bytes = per_thread.max(2 * p.limit_bytes)
            * if p.bytes_per_thread > 0 {
                max_threads
            } else {
                1
            };
        let needs_env = sc.needs_file() || sc.needs_swap;
        let env = if needs_env {
            let zram_bytes = if sc.needs_file() {
                // One file per kind of data (numpy), incompressible ones
                // stored at full size.
                let files = p.data_kinds.len().max(1) as u64;
                files * p.file_bytes + p.file_bytes / 8 + (64 << 20)
            } else {
                // upager's private swap files on the same kind of RAM device.
                anon_bytes + anon_bytes / 4 + (64 << 20)
            };
            Some(BenchEnv::setup(&EnvConfig {
                zram_index: Some(0),
                zram_bytes,
                swap: sc.needs_swap.then_some(SwapKind::ZramHotAdd),
                swap_bytes: 2 * anon_bytes + (64 << 20),
            })?)
        } else {
            if upager_bench::env::is_root() {
                upager_bench::env::install_signal_cleanup()?;
            }
            None
        };
        let p = match &env {
            Some(env) => prepare(name, &p, env)?,
            None => p,
        };
        let mut report = run_scenario(name, &p, &engines)?;
        drop(env);
        report.notes.extend(mode_notes.iter().cloned());
        failed.extend(report.failures().into_iter().map(|f| format!("{name} {f}")));
        println!("{}", report.table());
        let json = a
            .json
            .clone()
            .unwrap_or_else(|| out.join(format!("{}{name}.json", a.prefix)));
        let png = a
            .png
            .clone()
            .unwrap_or_else(|| out.join(format!("{}{name}.png", a.prefix)));
        for f in [&json, &png] {
            if let Some(d) = f.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(d)?;
            }
        }
        report.save_json(&json)?;
        if plot(&json, &png)? {
            println!("wrote {} and {}", json.display(), png.display());
        } else {
            println!("wrote {}", json.display());
        }
    }
    if in_ci() && !failed.is_empty() {
        return Err(format!(
            "{} run(s) failed (under CI=true a failed run fails `upager bench`):\n  {}",
            failed.len(),
            failed.join("\n  ")
        )
        .into());
    }
    Ok(())
}

/// What the kernel measured for `upager demo --compare`.
pub struct KernelDemo {
    /// Phase times, seconds: scan, random reads, random writes, msync.
    pub scan_s: f64,
    /// Random reads phase.
    pub reads_s: f64,
    /// Random writes phase.
    pub writes_s: f64,
    /// msync.
    pub flush_s: f64,
    /// Peak memory charge of the cgroup.
    pub peak_bytes: Option<u64>,
    /// TLB shootdowns (remote sends) of the worker.
    pub tlb_sends: Option<u64>,
    /// Notes (e.g. not root: no cgroup).
    pub notes: Vec<String>,
}

/// The RAM block device `upager demo --compare` puts both datasets on (ext4
/// on zram0), so the kernel pages from a real device, not from tmpfs.
pub fn compare_env(size: u64) -> Result<BenchEnv, Box<dyn std::error::Error>> {
    Ok(BenchEnv::setup(&EnvConfig {
        zram_index: Some(0),
        zram_bytes: 2 * size + size / 4 + (64 << 20),
        swap: None,
        swap_bytes: 0,
    })?)
}

/// Runs the demo's workload (scan, random reads, random writes, flush)
/// through the kernel's mmap of a `size` dataset in `dir`, in a memory
/// cgroup limited to `budget`, in a worker process.
pub fn kernel_demo(
    dir: &std::path::Path,
    size: u64,
    budget: u64,
    threads: usize,
    reads: u64,
    writes: u64,
) -> Result<KernelDemo, Box<dyn std::error::Error>> {
    let file = dir.join("kernel-dataset.bin");
    let seed = 0xdec0;
    upager_bench::env::create_pattern_file(&file, size, seed)?;
    upager_bench::env::evict_file(&file)?;
    let w = upager_bench::Workload::Mixed {
        file: file.clone(),
        threads,
        reads_per_thread: reads,
        writes_per_thread: writes,
        seed,
    };
    let run = upager_bench::run_worker(
        &worker_exe()?,
        &w,
        &upager_bench::RunOptions {
            cgroup_limit: Some(budget),
            trace_tlb: true,
            timeout: std::time::Duration::from_secs(1800),
            user: None,
            env: Vec::new(),
        },
    );
    let _ = std::fs::remove_file(&file);
    let run = run?;
    if run.result.bad_words > 0 {
        return Err(format!("kernel run read {} wrong words", run.result.bad_words).into());
    }
    let x = |k: &str| run.result.extra.get(k).copied().unwrap_or(f64::NAN);
    Ok(KernelDemo {
        scan_s: x("scan_s"),
        reads_s: x("reads_s"),
        writes_s: x("writes_s"),
        flush_s: x("flush_s"),
        peak_bytes: run.peak_bytes,
        tlb_sends: run.tlb.as_ref().map(upager_bench::TlbCounts::remote_sends),
        notes: run.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Top {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(line: &str) -> BenchArgs {
        Top::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
            .unwrap_or_else(|e| panic!("`upager bench {line}`: {e}"))
            .bench
    }

    /// These two command lines used to panic inside clap ("Mismatch
    /// between definition and access of `thread_counts`" / "`folios`").
    #[test]
    fn issue_11_list_options_parse() {
        let a = parse("multi-fault --thread-counts 1,2");
        assert_eq!(a.scenario, ScenarioArg::One(Scenario::MultiFault));
        assert_eq!(a.thread_counts, Some(vec![1, 2]));
        let a = parse("unmap-folio --folios 4K,64K,2M");
        assert_eq!(a.scenario, ScenarioArg::One(Scenario::UnmapFolio));
        assert_eq!(a.folios, Some(vec![4 << 10, 64 << 10, 2 << 20]));
        // Repeating the option adds to the list.
        let a = parse("swap --thread-counts 1 --thread-counts 4");
        assert_eq!(a.thread_counts, Some(vec![1, 4]));
    }

    #[test]
    fn fault_mode_and_numpy_options_parse() {
        let a = parse("random-read --fault-mode handlers,in-thread");
        assert_eq!(
            a.fault_mode,
            Some(vec![FaultMode::Handlers, FaultMode::InThread])
        );
        assert_eq!(
            parse("swap --fault-mode in-thread").fault_mode,
            Some(vec![FaultMode::InThread])
        );
        assert_eq!(
            parse("swap").fault_mode,
            None,
            "default: both, chosen in run()"
        );
        let e =
            Top::try_parse_from(["bench", "swap", "--fault-mode", "handlers,sigbus"]).unwrap_err();
        assert!(e.to_string().contains("sigbus"), "{e}");
        let a = parse("numpy --ops 1000 --budget 64M --upager-budget 40M");
        assert_eq!(a.scenario, ScenarioArg::One(Scenario::Numpy));
        assert_eq!(
            (a.ops, a.budget, a.upager_budget),
            (Some(1000), Some(64 << 20), Some(40 << 20))
        );
        assert_eq!(a.data, None, "default: both kinds");
        assert_eq!(
            parse("numpy --data incompressible,compressible").data,
            Some(vec![DataKind::Incompressible, DataKind::Compressible])
        );
        let e = Top::try_parse_from(["bench", "numpy", "--data", "zeros"]).unwrap_err();
        assert!(e.to_string().contains("incompressible"), "{e}");
    }

    /// Which engines run: the mode engines only in the modes chosen, the
    /// kernel's alone with --kernel-only, none of them with --upager-only.
    #[test]
    fn engines_follow_modes_and_filters() {
        let exe = WorkerExe::Binary("/nonexistent".into());
        let names = |line: &str, modes: &[FaultMode]| -> Vec<String> {
            engines(&parse(line), &exe, modes, None)
                .iter()
                .map(|e| e.name())
                .collect()
        };
        let both = names("random-read", &[FaultMode::Handlers, FaultMode::InThread]);
        for e in [
            "upager handlers",
            "upager in-thread",
            "upager in-thread 4K",
            "kernel numpy.memmap",
        ] {
            assert!(both.iter().any(|n| n == e), "{e} missing from {both:?}");
        }
        let one = names("random-read", &[FaultMode::Handlers]);
        assert!(!one.iter().any(|n| n.contains("in-thread")), "{one:?}");
        assert!(one.iter().any(|n| n == "upager handlers 64K"), "{one:?}");
        let k = names("numpy --kernel-only", &[FaultMode::Handlers]);
        assert!(
            k.iter().all(|n| n.starts_with("kernel")) && k.len() >= 4,
            "{k:?}"
        );
        let u = names("numpy --upager-only", &[FaultMode::Handlers]);
        assert!(u.iter().all(|n| !n.starts_with("kernel")), "{u:?}");
        // The numpy engines named by what they leave to upager.
        let a = Top::try_parse_from([
            "bench",
            "numpy",
            "--engines",
            "kernel numpy.memmap,upager defaults,upager in-thread",
        ])
        .unwrap()
        .bench;
        let numpy: Vec<String> = engines(&a, &exe, &[FaultMode::InThread], None)
            .iter()
            .filter(|e| e.supports(Scenario::Numpy))
            .map(|e| e.name())
            .collect();
        assert_eq!(
            numpy,
            ["kernel numpy.memmap", "upager defaults", "upager in-thread"]
        );
    }

    #[test]
    fn scenarios_parse_once_from_their_names() {
        for sc in Scenario::ALL {
            assert_eq!(parse(sc.name()).scenario.scenarios(), [sc]);
        }
        assert_eq!(parse("all").scenario.scenarios(), Scenario::ALL);
        let e = Top::try_parse_from(["bench", "nope"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(e.to_string().contains("mmap-read"), "{e}");
        assert!(Top::try_parse_from(["bench", "swap", "--folios", "4K,lots"]).is_err());
    }
}
