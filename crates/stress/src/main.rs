//! `upager-stress`: the reliability stress run (see `workload.rs` and
//! docs/reliability.md).
//!
//! ```text
//! cargo run --release -p upager-stress -- --duration 30s
//! cargo run --release -p upager-stress -- --duration 4h --progress 60s
//! ```
//! Exit status 0: every invariant held; 1: a violation (printed); 2: usage;
//! 3: no result 5 minutes after the duration (a hang).
#![forbid(unsafe_code)]

mod duration;
mod workload;

use duration::parse_duration;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

/// Long-running reliability stress of upager: checksummed records over
/// regions many times the budget, with faults injected, regions mapped and
/// unmapped, flushes and eviction running; verified at the end with plain
/// reads.
#[derive(Parser, Debug)]
#[command(name = "upager-stress", about, long_about = None)]
struct Args {
    /// How long the workers run (e.g. 30s, 10m, 4h; units ms, s, m, h).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    duration: Duration,
    /// Pager budget [default: 24M].
    #[arg(long, value_parser = upager::parse_size)]
    budget: Option<u64>,
    /// Each shared region is this many times the budget [default: 3].
    #[arg(long)]
    region_mult: Option<u64>,
    /// Worker threads, at least 1 [default: 4].
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    workers: Option<usize>,
    /// Fault-handler threads [default: 2].
    #[arg(long)]
    handler_threads: Option<usize>,
    /// Directory for the files and the swap files (RAM-backed is best)
    /// [default: /dev/shm, else /tmp].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of every random choice [default: 24301].
    #[arg(long)]
    seed: Option<u64>,
    /// Do not inject faults.
    #[arg(long)]
    no_inject: bool,
    /// Print a progress line this often.
    #[arg(long, default_value = "5s", value_parser = parse_duration, overrides_with = "quiet")]
    progress: Duration,
    /// No progress lines.
    #[arg(long, overrides_with = "progress")]
    quiet: bool,
}

impl Args {
    /// The run's configuration (the directory is made in `base` later).
    fn config(&self) -> (workload::Config, PathBuf) {
        let base = self.dir.clone().unwrap_or_else(|| {
            PathBuf::from(if Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
        });
        let mut cfg = workload::Config::ci(&base, self.duration);
        if let Some(b) = self.budget {
            cfg.budget = b;
        }
        if let Some(m) = self.region_mult {
            cfg.region_mult = m;
        }
        if let Some(w) = self.workers {
            cfg.workers = w;
        }
        if let Some(h) = self.handler_threads {
            cfg.handler_threads = h;
        }
        if let Some(s) = self.seed {
            cfg.seed = s;
        }
        cfg.inject = !self.no_inject;
        cfg.progress = (!self.quiet).then_some(self.progress);
        (cfg, base)
    }
}

fn main() {
    // Usage errors exit with status 2 (clap's, as before).
    let (mut cfg, base) = Args::parse().config();
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("upager-stress").chain(line.split_whitespace()))
    }

    #[test]
    fn command_definition_is_consistent() {
        Args::command().debug_assert();
    }

    /// The defaults the help text states are `Config::ci`'s.
    #[test]
    fn defaults_are_the_ci_config() {
        let (cfg, base) = parse("").unwrap().config();
        let ci = workload::Config::ci(&base, Duration::from_secs(30));
        assert_eq!(cfg.duration, Duration::from_secs(30));
        assert_eq!((cfg.budget, ci.budget), (24 << 20, 24 << 20));
        assert_eq!((cfg.region_mult, ci.region_mult), (3, 3));
        assert_eq!((cfg.workers, ci.workers), (4, 4));
        assert_eq!((cfg.handler_threads, ci.handler_threads), (2, 2));
        assert_eq!((cfg.seed, ci.seed), (24301, 24301));
        assert!(cfg.inject);
        assert_eq!(cfg.progress, Some(Duration::from_secs(5)));
        let shm = Path::new("/dev/shm").is_dir();
        assert_eq!(base, PathBuf::from(if shm { "/dev/shm" } else { "/tmp" }));
    }

    /// Every flag, as docs/reliability.md lists them.
    #[test]
    fn every_flag_parses() {
        let (cfg, base) = parse(
            "--duration 1.5m --budget 64M --region-mult 5 --workers 3 --handler-threads 1 \
             --dir /tmp/x --seed 7 --no-inject --progress 250ms",
        )
        .unwrap()
        .config();
        assert_eq!(cfg.duration, Duration::from_secs(90));
        assert_eq!(cfg.budget, 64 << 20);
        assert_eq!(cfg.region_mult, 5);
        assert_eq!(cfg.workers, 3);
        assert_eq!(cfg.handler_threads, 1);
        assert_eq!(base, PathBuf::from("/tmp/x"));
        assert_eq!(cfg.seed, 7);
        assert!(!cfg.inject);
        assert_eq!(cfg.progress, Some(Duration::from_millis(250)));
        for (line, h) in [("--duration 4h", 4.0 * 3600.0), ("--duration 10min", 600.0)] {
            let d = parse(line).unwrap().duration;
            assert_eq!(d, Duration::from_secs_f64(h));
        }
    }

    #[test]
    fn quiet_and_progress_last_one_wins() {
        assert_eq!(parse("--quiet").unwrap().config().0.progress, None);
        assert_eq!(
            parse("--quiet --progress 10s").unwrap().config().0.progress,
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse("--progress 10s --quiet").unwrap().config().0.progress,
            None
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for line in [
            "--workers 0",
            "--duration 3days",
            "--budget lots",
            "--seed -1",
            "--frobnicate",
            "extra",
        ] {
            let e = parse(line).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{line}: {e}");
        }
    }
}
