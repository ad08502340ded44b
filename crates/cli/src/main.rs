//! `upager`: the command-line face of the pager.
//!
//! - `upager demo`: the main job end to end — make a dataset bigger than the
//!   budget, page it through a pager (scan, random reads, random writes from
//!   several threads), flush, verify every byte with plain file reads, print
//!   throughput and the engine's counters.
//! - `upager bench <scenario>`: the benchmark suite (see docs/benchmarks.md).
//! - `upager stat`: residency picture of a mapped file after a workload.
#![forbid(unsafe_code)]

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
    upager::log_to_stderr();
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    /// Values tried for an option, in order; the first one its parser
    /// accepts is used.
    const SAMPLES: &[&str] = &["1", "64K", "0.5", "/tmp/upager-cli-test"];

    /// Parses `upager <args>`: a definition/access mismatch in the derive
    /// (a value parser whose type is not the field's) panics here.
    fn parse(args: &[String]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("upager".to_string()).chain(args.iter().cloned()))
    }

    /// Candidate values of `arg`: its possible values, else the samples; two
    /// of them joined by its delimiter when it takes a list.
    fn candidates(arg: &clap::Arg) -> Vec<String> {
        let values: Vec<String> = match arg.get_possible_values() {
            pv if !pv.is_empty() => pv.iter().map(|v| v.get_name().to_string()).collect(),
            _ => SAMPLES.iter().map(|s| s.to_string()).collect(),
        };
        match arg.get_value_delimiter() {
            Some(d) => values.iter().map(|v| format!("{v}{d}{v}")).collect(),
            None => values,
        }
    }

    /// The first candidate command line `upager <prefix> <candidate>` that
    /// parses; fails the test if none does.
    fn first_that_parses(prefix: &[String], arg: &clap::Arg, what: &str) -> Vec<String> {
        for v in candidates(arg) {
            let mut line = prefix.to_vec();
            line.push(v);
            match parse(&line) {
                Ok(_) => return line,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::InvalidValue | ErrorKind::ValueValidation
                    ) => {}
                Err(e) => panic!("`upager {}`: {e}", line.join(" ")),
            }
        }
        panic!("no sample value parses for {what}: add one to SAMPLES");
    }

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every option of every subcommand, alone with a valid value (and every
    /// possible value of the positional ones), parses into the derived
    /// structs: the class of `Mismatch between definition and access`
    /// panics is caught here, not by a user.
    #[test]
    fn every_option_of_every_subcommand_parses() {
        let cmd = Cli::command();
        let mut checked = 0;
        for sub in cmd.get_subcommands() {
            let name = sub.get_name().to_string();
            // The required positionals, with their first valid value.
            let mut base = vec![name.clone()];
            for arg in sub.get_positionals() {
                if arg.is_required_set() {
                    base = first_that_parses(&base, arg, &format!("{name} <{}>", arg.get_id()));
                }
            }
            parse(&base).unwrap_or_else(|e| panic!("`upager {}`: {e}", base.join(" ")));
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.is_positional() {
                    // (The subcommands have at most one positional.)
                    if arg.get_possible_values().is_empty() {
                        first_that_parses(&base[..1], arg, &format!("{name} <{id}>"));
                    }
                    for v in arg.get_possible_values() {
                        let line = vec![name.clone(), v.get_name().to_string()];
                        parse(&line).unwrap_or_else(|e| panic!("`upager {}`: {e}", line.join(" ")));
                    }
                    checked += 1;
                    continue;
                }
                let long = format!(
                    "--{}",
                    arg.get_long()
                        .unwrap_or_else(|| panic!("{name}: option {id} has no long name"))
                );
                let mut line = base.clone();
                line.push(long.clone());
                if arg.get_action().takes_values() {
                    first_that_parses(&line, arg, &format!("{name} {long}"));
                } else {
                    parse(&line).unwrap_or_else(|e| panic!("`upager {}`: {e}", line.join(" ")));
                }
                checked += 1;
            }
        }
        assert!(checked >= 25, "only {checked} options found");
    }
}
