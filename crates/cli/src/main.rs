//! `upager`: the command-line face of the pager.
//!
//! - `upager demo`: the main job end to end — make a dataset bigger than the
//!   budget, page it through a pager (scan, random reads, random writes from
//!   several threads), flush, verify every byte with plain file reads, print
//!   throughput and the engine's counters.
//! - `upager bench <scenario>`: the benchmark suite (see docs/benchmarks.md).
//! - `upager stat`: residency picture of a mapped file after a workload.

mod bench;
mod demo;
mod stat;

use clap::{Parser, Subcommand};

/// A user-space demand pager: regions of any size, backed by a file or
/// private swap, paged under a hard memory budget with batched TLB
/// shootdowns.
#[derive(Parser, Debug)]
#[command(name = "upager", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Page a dataset larger than the budget through upager and verify it.
    Demo(demo::DemoArgs),
    /// Run the benchmark suite: the five seed experiments (and residency),
    /// upager side by side with the kernel.
    Bench(Box<bench::BenchArgs>),
    /// Show a region's residency map (resident, evicted markers, never
    /// touched) after each step of a short workload.
    Stat(stat::StatArgs),
}

fn main() -> std::process::ExitCode {
    if let Some(code) = bench::worker_hook() {
        return code;
    }
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Stat(a) => stat::run(&a),
    };
    if let Err(e) = res {
        eprintln!("upager: {e}");
        std::process::exit(1);
    }
    std::process::ExitCode::SUCCESS
}

/// Parses a size argument (`512M`, `2G`, `64K`).
pub(crate) fn size_arg(s: &str) -> Result<u64, String> {
    upager::parse_size(s)
}
