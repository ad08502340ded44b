//! Run the kernel's side of the benchmark scenarios on their own (until the
//! `upager bench` command adds upager's engines next to it):
//!
//! ```text
//! cargo run --release -p upager-bench --example kernel-baselines -- SCENARIO|all
//!     [--tiny] [--rounds N] [--limit-mib N] [--file-mib N] [--threads N]
//!     [--out DIR]          # writes DIR/<scenario>.json and .png
//!                          # (default: bench/results/<today>-kernel-baselines)
//! ```
//!
//! As root it sets up zram0 + ext4 for the file scenarios, a hot-added zram
//! swap device for `swap`, a memory cgroup per run, and removes all of it at
//! the end or on Ctrl-C. This binary is also its own worker: it re-executes
//! itself with `__worker`, which is how the `upager` CLI can embed the suite.
use std::process::ExitCode;

use upager_bench::workloads::MapAdvice;
use upager_bench::{
    plot, prepare, run_scenario, BenchEnv, Engine, EnvConfig, KernelEngine, NumpyEngine, Scenario,
    ScenarioParams, SwapKind, WorkerExe,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("__worker") {
        return upager_bench::worker::worker_main(&args[1..]);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kernel-baselines: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let mut names = Vec::new();
    let (mut tiny, mut rounds, mut limit, mut file, mut threads) = (false, None, None, None, None);
    let mut out = upager_bench::results_dir("kernel-baselines");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = || -> Result<u64, Box<dyn std::error::Error>> {
            Ok(it.next().ok_or(format!("{a} needs a value"))?.parse()?)
        };
        match a.as_str() {
            "--tiny" => tiny = true,
            "--rounds" => rounds = Some(num()? as usize),
            "--limit-mib" => limit = Some(num()? << 20),
            "--file-mib" => file = Some(num()? << 20),
            "--threads" => threads = Some(num()? as usize),
            "--out" => out = it.next().ok_or("--out needs a value")?.into(),
            "all" => names.extend(Scenario::ALL),
            n if !n.starts_with("--") => names.push(n.parse::<Scenario>()?),
            other => {
                return Err(format!("unknown argument {other:?}; scenarios: {}", list()).into())
            }
        }
    }
    if names.is_empty() {
        return Err(format!("name a scenario or `all`: {}", list()).into());
    }
    std::fs::create_dir_all(&out)?;
    let exe = WorkerExe::SelfWithArg(std::env::current_exe()?, "__worker".into());
    let engines: Vec<Box<dyn Engine>> = vec![
        Box::new(KernelEngine::with_worker(exe.clone())),
        Box::new(KernelEngine::with_worker(exe.clone()).with_advice(MapAdvice::Random)),
        Box::new(KernelEngine::with_worker(exe).with_advice(MapAdvice::Sequential)),
        Box::new(NumpyEngine::memmap()),
    ];
    for name in names {
        let sc = name.spec();
        let mut p: ScenarioParams = if tiny { name.tiny() } else { name.defaults() };
        if let Some(r) = rounds {
            p.rounds = r;
        }
        if let Some(l) = limit {
            p.limit_bytes = l;
        }
        if let Some(f) = file {
            p.file_bytes = f;
        }
        if let Some(t) = threads {
            p.threads = t;
        }
        let cfg = EnvConfig {
            zram_index: sc.needs_file().then_some(0),
            zram_bytes: p.file_bytes + p.file_bytes / 8 + (64 << 20),
            swap: sc.needs_swap.then_some(SwapKind::ZramHotAdd),
            swap_bytes: 4 * p.limit_bytes.max(p.bytes_per_thread * p.threads as u64) + (64 << 20),
        };
        let env = BenchEnv::setup(&cfg)?;
        let p = prepare(name, &p, &env)?;
        let report = run_scenario(name, &p, &engines)?;
        drop(env);
        println!("{}", report.table());
        let json = out.join(format!("{name}.json"));
        report.save_json(&json)?;
        let png = out.join(format!("{name}.png"));
        if plot(&json, &png)? {
            println!("wrote {} and {}", json.display(), png.display());
        } else {
            println!("wrote {}", json.display());
        }
    }
    Ok(())
}

fn list() -> String {
    Scenario::ALL.map(Scenario::name).join(", ")
}
