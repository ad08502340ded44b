//! `upager-ztier-bench`: the compressed tier against swapping without it
//! and against the kernel's zram swap.
//!
//! An anonymous region `--ratio` (4) times the budget is written word by
//! word and read back (anon_fill.rs), on element i = i (float64), sparse
//! state (one word per 4 KiB page) and random words, by:
//! - `kernel zram`: plain anonymous memory in a memory cgroup of the budget,
//!   swapping to a zram device hot-added for the run (its default
//!   compressor; root only);
//! - `upager ztier` / `upager no-ztier`: an upager region of the same
//!   budget with the compressed tier on / off (`UPAGER_ZTIER`), as root
//!   (handler threads, the mode root gets by default);
//! - with `--as-user NAME`, the same two as that ordinary user (in-thread
//!   faults with the user-mode-only userfaultfd, the mode users get).
//!
//! Runs are interleaved (round 1: every kind, every engine; round 2: …),
//! each in a fresh worker process; the report gives medians of the rounds
//! with min..max, and every run, as JSON (`--out DIR/ztier.json`).
//!
//! ```sh
//! cargo build --release -p upager-bench
//! sudo target/release/upager-ztier-bench --rounds 3 --as-user upager-user \
//!     --out bench/results/DATE-ztier
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use upager::FaultMode;
use upager_bench::anon_fill::FillKind;
use upager_bench::{
    run_worker, RunOptions, SwapDevice, SwapKind, UpagerConfig, UpagerJob, WorkerExe, Workload,
};

struct Args {
    budget: u64,
    ratio: u64,
    rounds: usize,
    kinds: Vec<FillKind>,
    as_user: Option<String>,
    out: Option<PathBuf>,
    engines: Option<Vec<String>>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        budget: 256 << 20,
        ratio: 4,
        rounds: 3,
        kinds: FillKind::ALL.to_vec(),
        as_user: None,
        out: None,
        engines: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--budget" => a.budget = upager::parse_size(&v()?).map_err(|e| e.to_string())?,
            "--ratio" => a.ratio = v()?.parse().map_err(|e| format!("--ratio: {e}"))?,
            "--rounds" => a.rounds = v()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--kinds" => {
                a.kinds = v()?
                    .split(',')
                    .map(|s| {
                        FillKind::ALL
                            .into_iter()
                            .find(|k| k.name() == s.trim())
                            .ok_or(format!("unknown kind {s:?} (index, sparse, random)"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--engines" => {
                a.engines = Some(v()?.split(',').map(|s| s.trim().to_string()).collect())
            }
            "--as-user" => a.as_user = Some(v()?),
            "--out" => a.out = Some(PathBuf::from(v()?)),
            "-h" | "--help" => {
                println!(
                    "upager-ztier-bench [--budget 256M] [--ratio 4] [--rounds 3] \
                     [--kinds index,sparse,random] [--engines 'kernel zram,upager ztier,...'] \
                     [--as-user NAME] [--out DIR]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

fn user_ids(name: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let o = std::process::Command::new("id")
            .args([flag, name])
            .output()
            .map_err(|e| e.to_string())?;
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("no such user {name}"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// One engine: its name, and how to run a kind.
struct Engine {
    name: String,
    kernel: bool,
    ztier: bool,
    user: Option<(u32, u32)>,
}

fn main() -> std::process::ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("upager-ztier-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let root = upager_sys_is_root();
    let exe = match WorkerExe::locate() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("upager-ztier-bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let bytes = a.budget * a.ratio;
    let mut engines = Vec::new();
    if root {
        engines.push(Engine {
            name: "kernel zram".into(),
            kernel: true,
            ztier: false,
            user: None,
        });
    } else {
        eprintln!("upager-ztier-bench: not root: no kernel zram baseline");
    }
    for ztier in [true, false] {
        let tag = if ztier { "ztier" } else { "no-ztier" };
        engines.push(Engine {
            name: format!("upager {tag}"),
            kernel: false,
            ztier,
            user: None,
        });
    }
    if let Some(u) = &a.as_user {
        let ids = match user_ids(u) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("upager-ztier-bench: --as-user: {e}");
                return std::process::ExitCode::from(2);
            }
        };
        for ztier in [true, false] {
            let tag = if ztier { "ztier" } else { "no-ztier" };
            engines.push(Engine {
                name: format!("upager {tag} as {u}"),
                kernel: false,
                ztier,
                user: Some(ids),
            });
        }
    }
    if let Some(names) = &a.engines {
        engines.retain(|e| names.contains(&e.name));
    }
    // The kernel's swap: zram sized for the whole region.
    let _swap = if engines.iter().any(|e| e.kernel) {
        match SwapDevice::setup(SwapKind::ZramHotAdd, bytes + (bytes >> 2)) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("upager-ztier-bench: swap device: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut runs = Vec::new();
    // (kind, engine) -> elapsed, write, read seconds per round.
    let mut by: BTreeMap<(String, String), Vec<[f64; 3]>> = BTreeMap::new();
    for round in 0..a.rounds {
        for &kind in &a.kinds {
            for e in &engines {
                let w = if e.kernel {
                    Workload::AnonFill { bytes, kind }
                } else {
                    let mode = if e.user.is_some() {
                        FaultMode::InThread
                    } else {
                        FaultMode::Handlers
                    };
                    Workload::Upager {
                        budget: a.budget,
                        config: UpagerConfig {
                            fault_mode: mode,
                            ..UpagerConfig::default()
                        },
                        job: UpagerJob::AnonFill { bytes, kind },
                    }
                };
                let opts = RunOptions {
                    cgroup_limit: e.kernel.then_some(a.budget),
                    trace_tlb: false,
                    timeout: Duration::from_secs(900),
                    user: e.user,
                    env: vec![(
                        upager::ZTIER_ENV.to_string(),
                        if e.ztier { "on" } else { "off" }.to_string(),
                    )],
                };
                match run_worker(&exe, &w, &opts) {
                    Ok(run) => {
                        let r = &run.result;
                        let ws = r.extra.get("write_s").copied().unwrap_or(f64::NAN);
                        let rs = r.extra.get("read_s").copied().unwrap_or(f64::NAN);
                        eprintln!(
                            "round {} {:7} {:28} {:7.2} s (write {:.2}, read {:.2}; user {:.2} sys {:.2}) bad {}",
                            round + 1,
                            kind.name(),
                            e.name,
                            r.elapsed_s,
                            ws,
                            rs,
                            r.user_s,
                            r.sys_s,
                            r.bad_words
                        );
                        if r.bad_words > 0 {
                            eprintln!("upager-ztier-bench: {} read wrong words", e.name);
                            return std::process::ExitCode::FAILURE;
                        }
                        by.entry((kind.name().into(), e.name.clone()))
                            .or_default()
                            .push([r.elapsed_s, ws, rs]);
                        runs.push(serde_json::json!({
                            "round": round + 1,
                            "kind": kind.name(),
                            "engine": e.name,
                            "result": r,
                            "peak_bytes": run.peak_bytes,
                            "cgroup_stat": run.cgroup_stat,
                            "vmstat": run.vmstat,
                        }));
                    }
                    Err(err) => {
                        eprintln!(
                            "round {} {} {}: failed: {err}",
                            round + 1,
                            kind.name(),
                            e.name
                        );
                        runs.push(serde_json::json!({
                            "round": round + 1, "kind": kind.name(), "engine": e.name,
                            "error": err.to_string(),
                        }));
                    }
                }
            }
        }
    }
    // Medians, and the ratios the targets are about.
    let med = |v: &[f64]| upager_bench::median_of(v);
    let mut summary = Vec::new();
    println!(
        "| data | engine | elapsed s (median, min..max) | write s | read s | vs upager no-ztier | vs kernel zram |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &kind in &a.kinds {
        let k = kind.name().to_string();
        let get = |name: &str| {
            by.get(&(k.clone(), name.to_string()))
                .map(|v| med(&v.iter().map(|x| x[0]).collect::<Vec<_>>()))
        };
        for e in &engines {
            let Some(v) = by.get(&(k.clone(), e.name.clone())) else {
                continue;
            };
            let el: Vec<f64> = v.iter().map(|x| x[0]).collect();
            let m = med(&el);
            let (lo, hi) = el
                .iter()
                .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
            let base = if e.user.is_some() {
                get(&format!(
                    "upager no-ztier as {}",
                    a.as_user.as_deref().unwrap_or("")
                ))
            } else {
                get("upager no-ztier")
            };
            let kern = get("kernel zram");
            let ratio = |b: Option<f64>| b.map_or("".to_string(), |b| format!("{:.2}x", m / b));
            println!(
                "| {k} | {} | {m:.2} ({lo:.2}..{hi:.2}) | {:.2} | {:.2} | {} | {} |",
                e.name,
                med(&v.iter().map(|x| x[1]).collect::<Vec<_>>()),
                med(&v.iter().map(|x| x[2]).collect::<Vec<_>>()),
                ratio(base),
                ratio(kern),
            );
            summary.push(serde_json::json!({
                "kind": k, "engine": e.name, "elapsed_s_median": m, "elapsed_s_min": lo,
                "elapsed_s_max": hi,
                "write_s_median": med(&v.iter().map(|x| x[1]).collect::<Vec<_>>()),
                "read_s_median": med(&v.iter().map(|x| x[2]).collect::<Vec<_>>()),
                "vs_no_ztier": base.map(|b| m / b),
                "vs_kernel_zram": kern.map(|b| m / b),
            }));
        }
    }
    if let Some(dir) = &a.out {
        let report = serde_json::json!({
            "tool": "upager-ztier-bench",
            "command_line": std::env::args().collect::<Vec<_>>().join(" "),
            "budget_bytes": a.budget,
            "region_bytes": bytes,
            "rounds": a.rounds,
            "machine": machine(),
            "summary": summary,
            "runs": runs,
        });
        let _ = std::fs::create_dir_all(dir);
        let path = dir.join("ztier.json");
        match std::fs::write(
            &path,
            serde_json::to_string_pretty(&report).unwrap_or_default(),
        ) {
            Ok(()) => eprintln!("upager-ztier-bench: wrote {}", path.display()),
            Err(e) => eprintln!("upager-ztier-bench: {}: {e}", path.display()),
        }
    }
    std::process::ExitCode::SUCCESS
}

fn upager_sys_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn machine() -> serde_json::Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    serde_json::json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg": read("/proc/loadavg"),
        "zram_comp_algorithm": read("/sys/block/zram0/comp_algorithm"),
        "model": read("/proc/cpuinfo").lines().find(|l| l.starts_with("model name")).unwrap_or("").to_string(),
    })
}
