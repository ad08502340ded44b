//! `upager-soak`: the lost-write soak (crates/stress/src/soak.rs
//! says what a round does and checks).
//!
//! ```text
//! cargo run --release -p upager-stress --bin upager-soak -- --duration 2m --variant in-thread/1/anon/readers
//! cargo run --release -p upager-stress --bin upager-soak -- --duration 4h --variant all --slice 60s
//! ```
//! Several variants (`all`, `ci`, or a comma-separated list) run in turn,
//! `--slice` each (a fresh pager and file every slice), until `--duration`
//! is used up. Exit status 0: nothing lost, no wp-bit violation, no stall;
//! 1: a finding (printed as it happens, summed up at the end); 2: usage or
//! setup; 3: a hang (no progress for `--hang`).
#![forbid(unsafe_code)]

#[path = "../duration.rs"]
mod duration;
#[allow(dead_code)]
#[path = "../soak.rs"]
mod soak;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;

/// The lost-write soak: writer threads store self-describing words into a
/// file region several times the budget, flush, and compare the file and
/// the region (and its uffd-wp bits) with a model, round after round.
#[derive(Parser, Debug)]
#[command(name = "upager-soak", about, long_about = None)]
struct Args {
    /// Total run time (e.g. 60s, 10m, 4h).
    #[arg(long, default_value = "60s", value_parser = duration::parse_duration)]
    duration: std::time::Duration,
    /// Variants: `all` (16), `ci` (the 4 of the CI test), or a
    /// comma-separated list of MODE/SHARDS/anon|noanon/readers|noreaders,
    /// e.g. in-thread/1/anon/readers.
    #[arg(long, default_value = "ci", value_parser = parse_variants)]
    variant: Variants,
    /// Run time of each variant in turn when several are given.
    #[arg(long, default_value = "60s", value_parser = duration::parse_duration)]
    slice: Duration,
    /// Folio size of both regions.
    #[arg(long, default_value = "16K", value_parser = upager::parse_size)]
    folio: u64,
    /// Pager budget.
    #[arg(long, default_value = "8M", value_parser = upager::parse_size)]
    budget: u64,
    /// Size of the file region.
    #[arg(long, default_value = "32M", value_parser = upager::parse_size)]
    file_size: u64,
    /// Size of the anonymous region (variants with `anon`).
    #[arg(long, default_value = "16M", value_parser = upager::parse_size)]
    anon_size: u64,
    /// Sweep stride in words (the sweep stores every this many words;
    /// as many random stores again).
    #[arg(long, default_value_t = 509, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(2..))]
    stride: u64,
    /// Writer threads (1 to 14).
    #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=14))]
    writers: usize,
    /// Reader threads (variants with `readers`).
    #[arg(long, default_value_t = 2)]
    readers: usize,
    /// Mixed folio sizes: add a sequential scanner thread, so
    /// the pager fills 2 MiB runs of the file region as huge pages among
    /// the writers' folios. With the default sizes it also raises the file
    /// to 128 MiB and the budget to 32 MiB (staged huge pages need a
    /// budget of 16 MiB or more).
    #[arg(long)]
    mixed: bool,
    /// Sequential scanner threads (default 0; 1 with --mixed): their faults
    /// are a stream, so the pager reads ahead, asynchronously,
    /// among the writers' folios (without --mixed, in base folios).
    #[arg(long)]
    scanners: Option<usize>,
    /// Handler threads (handler mode; raised to the shards).
    #[arg(long, default_value_t = 2)]
    handler_threads: usize,
    /// Seed of the stores' plan and of the readers.
    #[arg(long, default_value_t = 20)]
    seed: u64,
    /// Directory for the data file and swap (RAM-backed is best)
    /// [default: /dev/shm, else /tmp].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A round this much over the recent median, or 1000 accesses taking
    /// this long, is a stall.
    #[arg(long, default_value = "1s", value_parser = duration::parse_duration)]
    stall: Duration,
    /// No progress of a round's phase for this long is a hang (exit 3).
    #[arg(long, default_value = "120s", value_parser = duration::parse_duration)]
    hang: Duration,
    /// Check the checker: one round of the first variant, with one store
    /// undone in the file and one folio left writable after the flush;
    /// exits 1 with a LOST and a WP-BIT report when the checks work.
    #[arg(long)]
    self_test: bool,
    /// Stop at the first round with a finding.
    #[arg(long)]
    stop_on_failure: bool,
    /// Print a progress line this often.
    #[arg(long, default_value = "10s", value_parser = duration::parse_duration, overrides_with = "quiet")]
    progress: Duration,
    /// No progress lines.
    #[arg(long, overrides_with = "progress")]
    quiet: bool,
}

/// The variants of `--variant`.
#[derive(Debug, Clone)]
struct Variants(Vec<soak::Variant>);

fn parse_variants(s: &str) -> Result<Variants, String> {
    soak::Variant::parse_list(s).map(Variants)
}

fn main() {
    let args = Args::parse();
    let variants: Vec<soak::Variant> = args.variant.0.clone();
    let base = args.dir.clone().unwrap_or_else(|| {
        PathBuf::from(if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
    });
    let dir = match tempfile::Builder::new()
        .prefix("upager-soak")
        .tempdir_in(&base)
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "upager-soak: cannot create a directory in {}: {e}",
                base.display()
            );
            std::process::exit(2);
        }
    };
    let mut cfg = soak::Config::new(dir.path());
    cfg.file_bytes = args.file_size;
    cfg.anon_bytes = args.anon_size;
    cfg.budget = args.budget;
    cfg.folio = args.folio;
    cfg.stride_words = args.stride;
    cfg.writers = args.writers;
    cfg.readers = args.readers;
    if let Some(n) = args.scanners {
        cfg.scanners = n;
    }
    if args.mixed {
        cfg.huge_runs = true;
        cfg.scanners = cfg.scanners.max(1);
        if cfg.file_bytes == 32 << 20 && cfg.budget == 8 << 20 {
            cfg.file_bytes = 128 << 20;
            cfg.budget = 32 << 20;
        }
    }
    cfg.handler_threads = args.handler_threads;
    cfg.seed = args.seed;
    cfg.stall = args.stall;
    cfg.stop_on_failure = args.stop_on_failure;
    cfg.self_test = args.self_test;
    cfg.progress = (!args.quiet).then_some(args.progress);
    let slice = if variants.len() == 1 {
        args.duration
    } else {
        args.slice
    };
    eprintln!(
        "upager-soak: {:?} over {} variant(s), {:?} each in turn; file {}, anonymous {}, budget {}, folio {}, {} writers, {} readers, {} scanners, seed {}, in {}",
        args.duration,
        variants.len(),
        slice,
        upager::format_size(cfg.file_bytes),
        upager::format_size(cfg.anon_bytes),
        upager::format_size(cfg.budget),
        upager::format_size(cfg.folio),
        cfg.writers,
        cfg.readers,
        cfg.scanners,
        cfg.seed,
        dir.path().display()
    );

    // Watchdog: a phase of a round that makes no progress for `--hang`.
    let progress = Arc::new(soak::Progress::default());
    let current = Arc::new(Mutex::new(String::new()));
    {
        let (progress, current, hang) = (Arc::clone(&progress), Arc::clone(&current), args.hang);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let idle = progress.idle();
            if idle > hang {
                let v = current.lock().map(|c| c.clone()).unwrap_or_default();
                println!(
                    "upager-soak: FAIL: HANG in {v}: {} made no progress for {idle:?}",
                    progress.describe()
                );
                std::process::exit(3);
            }
        });
    }

    let start = Instant::now();
    let mut totals: BTreeMap<String, soak::Outcome> = BTreeMap::new();
    let mut k = 0usize;
    let mut failed = false;
    while start.elapsed() < args.duration {
        let v = variants[k % variants.len()];
        k += 1;
        cfg.duration = slice.min(args.duration.saturating_sub(start.elapsed()));
        if let Ok(mut c) = current.lock() {
            *c = v.to_string();
        }
        // A different plan every slice of a long run.
        let mut run_cfg = cfg.clone();
        run_cfg.seed = cfg.seed.wrapping_add(k as u64 - 1);
        match soak::run(&run_cfg, v, &progress) {
            Ok(o) => {
                println!("upager-soak: {}", o.line());
                println!("  counters: {}", o.counters);
                failed |= o.failed();
                totals.entry(o.variant.clone()).or_default().merge(&o);
            }
            Err(e) => {
                println!("upager-soak: FAIL: {v} could not run: {e}");
                drop(dir);
                std::process::exit(2);
            }
        }
        if (failed && args.stop_on_failure) || args.self_test {
            break;
        }
    }
    println!("upager-soak: totals after {:.0?}:", start.elapsed());
    for o in totals.values() {
        println!("  {}", o.line());
    }
    // exit() skips destructors: remove the directory first.
    drop(dir);
    if failed {
        println!("upager-soak: FAIL");
        std::process::exit(1);
    }
    println!("upager-soak: PASS");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("upager-soak").chain(line.split_whitespace()))
    }

    #[test]
    fn command_definition_is_consistent() {
        Args::command().debug_assert();
    }

    /// Every flag, as docs/reliability.md lists them, and the defaults.
    #[test]
    fn every_flag_parses() {
        let a = parse(
            "--duration 4h --variant all --slice 30s --folio 64K --budget 16M --file-size 64M \
             --anon-size 8M --stride 1021 --writers 3 --readers 1 --handler-threads 4 --seed 9 \
             --dir /tmp/x --stall 2s --hang 60s --stop-on-failure --self-test --progress 1s",
        )
        .unwrap();
        assert_eq!(a.duration, Duration::from_secs(4 * 3600));
        assert_eq!(a.variant.0.len(), 16);
        assert_eq!(a.slice, Duration::from_secs(30));
        assert_eq!((a.folio, a.budget), (64 << 10, 16 << 20));
        assert_eq!((a.file_size, a.anon_size), (64 << 20, 8 << 20));
        assert_eq!((a.stride, a.writers, a.readers), (1021, 3, 1));
        assert_eq!((a.handler_threads, a.seed), (4, 9));
        assert_eq!(a.dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(
            (a.stall, a.hang),
            (Duration::from_secs(2), Duration::from_secs(60))
        );
        assert!(a.stop_on_failure && a.self_test && !a.quiet);
        let d = parse("").unwrap();
        assert_eq!(d.duration, Duration::from_secs(60));
        let ci: Vec<String> = d.variant.0.iter().map(|v| v.to_string()).collect();
        assert_eq!(
            ci,
            [
                "handlers/1/anon/readers",
                "in-thread/1/anon/readers",
                "handlers/2/noanon/noreaders",
                "in-thread/2/noanon/readers"
            ]
        );
        assert_eq!(
            (d.folio, d.budget, d.file_size),
            (16 << 10, 8 << 20, 32 << 20)
        );
        assert_eq!((d.writers, d.readers, d.stride), (2, 2, 509));
        assert_eq!(d.stall, Duration::from_secs(1));
        let two = parse("--variant in-thread/1/anon/readers,handlers/2/noanon/noreaders").unwrap();
        assert_eq!(two.variant.0.len(), 2);
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for line in [
            "--writers 0",
            "--writers 15",
            "--variant handlers/3/anon/readers",
            "--variant fast/1/anon/readers",
            "--stride 1",
            "--duration 3days",
            "--budget lots",
            "extra",
        ] {
            let e = parse(line).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{line}: {e}");
        }
    }
}
