//! `upager-stress`: the reliability stress run (see `workload.rs` and
//! docs/reliability.md).
//!
//! ```text
//! cargo run --release -p upager-stress -- --duration 30s
//! cargo run --release -p upager-stress -- --duration 4h --progress 60s
//! ```
//! Exit status 0: every invariant held; 1: a violation (printed); 2: usage;
//! 3: no result 5 minutes after the duration (a hang).

mod workload;

use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "usage: upager-stress [--duration 30s|10m|4h] [--budget 24M] [--region-mult 3]
                     [--workers 4] [--handler-threads 2] [--dir /dev/shm] [--seed N]
                     [--no-inject] [--progress 10s] [--quiet]";

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s, m or h)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

fn parse_args() -> Result<(workload::Config, PathBuf), String> {
    let mut duration = Duration::from_secs(30);
    let mut base = PathBuf::from(if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    });
    let mut cfg = workload::Config::ci(&base, duration);
    cfg.progress = Some(Duration::from_secs(5));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--duration" => duration = parse_duration(&val()?)?,
            "--budget" => cfg.budget = upager::parse_size(&val()?)?,
            "--region-mult" => {
                cfg.region_mult = val()?.parse().map_err(|e| format!("--region-mult: {e}"))?
            }
            "--workers" => cfg.workers = val()?.parse().map_err(|e| format!("--workers: {e}"))?,
            "--handler-threads" => {
                cfg.handler_threads = val()?
                    .parse()
                    .map_err(|e| format!("--handler-threads: {e}"))?
            }
            "--dir" => base = PathBuf::from(val()?),
            "--seed" => cfg.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--no-inject" => cfg.inject = false,
            "--progress" => cfg.progress = Some(parse_duration(&val()?)?),
            "--quiet" => cfg.progress = None,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if cfg.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    cfg.duration = duration;
    Ok((cfg, base))
}

fn main() {
    let (mut cfg, base) = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("upager-stress: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let dir = match tempfile::Builder::new()
        .prefix("upager-stress")
        .tempdir_in(&base)
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "upager-stress: cannot create a directory in {}: {e}",
                base.display()
            );
            std::process::exit(2);
        }
    };
    cfg.dir = dir.path().to_path_buf();
    eprintln!(
        "upager-stress: {:?}, budget {}, regions {} x budget, {} workers, {} handler threads, faults {}, in {}",
        cfg.duration,
        upager::format_size(cfg.budget),
        cfg.region_mult,
        cfg.workers,
        cfg.handler_threads,
        if cfg.inject { "injected" } else { "not injected" },
        cfg.dir.display()
    );
    // Every wait is bounded: a run that has not finished 5 minutes after its
    // duration is reported as a hang.
    let deadline = cfg.duration + std::time::Duration::from_secs(300);
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        println!("upager-stress: FAIL: no result {deadline:?} after the start (a hang)");
        std::process::exit(3);
    });
    match workload::run(cfg) {
        Ok(summary) => {
            println!("upager-stress: PASS\n{summary}");
        }
        Err(e) => {
            println!("upager-stress: FAIL: {e}");
            std::process::exit(1);
        }
    }
}
