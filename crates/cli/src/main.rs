//! `upager`: the command-line face of the pager.
//!
//! - `upager demo`: the main job end to end — make a dataset bigger than the
//!   budget, page it through a pager (scan, random reads, random writes from
//!   several threads), flush, verify every byte with plain file reads, print
//!   throughput and the engine's counters.
//! - `upager bench <scenario>`: the benchmark suite (see docs/benchmarks.md).
//! - `upager stat`: residency picture of a mapped file after a workload.
//! - `upager load`: upload a file as a dataset on a Redis Cluster or as an
//!   S3 object or dataset.
//! - `upager list`, `upager delete`: the datasets on a Redis Cluster, the
//!   objects and datasets of an S3 bucket.
//! - `upager trace`: the warm-start trace beside a file.
#![forbid(unsafe_code)]

mod bench;
mod cache;
mod datasets;
mod demo;
mod load;
mod stat;
mod trace;

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
    /// Upload a file once as a dataset on a Redis Cluster
    /// (redis-cluster://HOST:PORT/NAME), an S3 object (s3://BUCKET/KEY) or
    /// an S3 dataset (s3://BUCKET/NAME/); regions then map it by URL.
    Load(load::LoadArgs),
    /// List the datasets on a Redis Cluster, or the objects and datasets of
    /// an S3 bucket: name, size, and whether complete (incomplete: an
    /// upload running, interrupted or killed).
    List(datasets::ListArgs),
    /// Delete a dataset (complete or not) from a Redis Cluster
    /// (redis-cluster://HOST:PORT/NAME), or an S3 object or dataset.
    Delete(datasets::DeleteArgs),
    /// The disk tier: what remote stores' regions keep on local disk
    /// (stat, list, clear).
    Cache(cache::CacheArgs),
    /// Show the warm-start trace beside a file (FILE.upager-trace): how many
    /// folios it holds, and whether a map would replay it now.
    Trace(trace::TraceArgs),
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
        Cmd::Load(a) => load::run(&a),
        Cmd::List(a) => datasets::list(&a),
        Cmd::Delete(a) => datasets::delete(&a),
        Cmd::Trace(a) => trace::run(&a),
        Cmd::Cache(a) => cache::run(&a),
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

/// Parser of `--fault-mode`: the names of [`upager::FaultMode`] (the same
/// on every face), listed with a line each in `--help`.
/// What a pager's info says a user should know, one line each: the
/// fallbacks upager took (none on a kernel and machine that allow every
/// feature).
pub(crate) fn info_lines(i: &upager::PagerInfo) -> Vec<String> {
    let mut v = Vec::new();
    if i.user_mode_only {
        v.push(format!(
            "userfaultfd: user-mode-only (no privilege needed; system calls on non-resident region memory fail with EFAULT), fault mode {}",
            i.fault_mode
        ));
    }
    if !i.batched_unmap {
        v.push("process_madvise refused (kernel before 6.13, or seccomp): eviction unmaps with one madvise per range, one TLB flush each".into());
    }
    if !i.io_uring {
        v.push("io_uring unavailable: write-back with pwrite".into());
    }
    if !i.uffd_poison {
        v.push(
            "no UFFDIO_POISON (kernel before 6.6): a failed access gets SIGBUS from upager".into(),
        );
    }
    if !i.masked.is_empty() {
        v.push(format!(
            "masked for tests (UPAGER_MASK_FEATURES): {}",
            i.masked.join(", ")
        ));
    }
    v
}

pub(crate) fn fault_mode_arg() -> impl clap::builder::TypedValueParser<Value = upager::FaultMode> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    use upager::FaultMode;
    PossibleValuesParser::new([
        PossibleValue::new(FaultMode::Handlers.name())
            .help("handler threads resolve faults (the default)"),
        PossibleValue::new(FaultMode::InThread.name()).help(
            "the faulting thread resolves its own fault (SIGBUS handler): no handler-thread \
             wakeup; system calls on non-resident region memory fail with EFAULT",
        ),
    ])
    .try_map(|s| s.parse::<FaultMode>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    /// Values tried for an option, in order; the first one its parser
    /// accepts is used.
    const SAMPLES: &[&str] = &[
        "1",
        "64K",
        "0.5",
        "/tmp/upager-cli-test",
        "redis-cluster://127.0.0.1:7000/x",
    ];

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
        first_that_parses_so_far(prefix, arg, what, false)
    }

    /// As [`first_that_parses`]; with `more` (required positionals follow
    /// this one), a line that lacks only those counts as parsing.
    fn first_that_parses_so_far(
        prefix: &[String],
        arg: &clap::Arg,
        what: &str,
        more: bool,
    ) -> Vec<String> {
        for v in candidates(arg) {
            let mut line = prefix.to_vec();
            line.push(v);
            match parse(&line) {
                Ok(_) => return line,
                Err(e) if more && e.kind() == ErrorKind::MissingRequiredArgument => return line,
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

    /// `--fault-mode` takes the one name of each mode on every
    /// command that builds a pager, lists the choices in --help and when a
    /// value is wrong, and leaves the default (UPAGER_FAULT_MODE, else
    /// handlers or in-thread by the userfaultfd) to the builder when absent.
    #[test]
    fn fault_mode_takes_the_names_of_the_modes() {
        use upager::FaultMode;
        let mode_of = |args: &[&str]| -> Result<Option<FaultMode>, clap::Error> {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            Ok(match parse(&args)?.cmd {
                Cmd::Demo(a) => a.fault_mode,
                Cmd::Stat(a) => a.fault_mode,
                Cmd::Bench(_)
                | Cmd::Load(_)
                | Cmd::List(_)
                | Cmd::Delete(_)
                | Cmd::Trace(_)
                | Cmd::Cache(_) => {
                    unreachable!("no --fault-mode there")
                }
            })
        };
        for sub in ["demo", "stat"] {
            assert_eq!(mode_of(&[sub]).unwrap(), None, "{sub}");
            for m in [FaultMode::Handlers, FaultMode::InThread] {
                assert_eq!(
                    mode_of(&[sub, "--fault-mode", m.name()]).unwrap(),
                    Some(m),
                    "{sub} --fault-mode {m}"
                );
            }
            let e = mode_of(&[sub, "--fault-mode", "sigbus"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidValue, "{sub}");
            let msg = e.to_string();
            assert!(
                msg.contains("handlers") && msg.contains("in-thread"),
                "{sub}: {msg}"
            );
            let help = Cli::command()
                .find_subcommand_mut(sub)
                .expect("subcommand")
                .render_long_help()
                .to_string();
            for needle in ["--fault-mode", "handlers", "in-thread", "EFAULT"] {
                assert!(
                    help.contains(needle),
                    "{sub} --help lacks {needle}:\n{help}"
                );
            }
        }
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
            let required: Vec<_> = sub
                .get_positionals()
                .filter(|a| a.is_required_set())
                .collect();
            for (i, arg) in required.iter().enumerate() {
                let what = format!("{name} <{}>", arg.get_id());
                base = first_that_parses_so_far(&base, arg, &what, i + 1 < required.len());
            }
            parse(&base).unwrap_or_else(|e| panic!("`upager {}`: {e}", base.join(" ")));
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.is_positional() {
                    // Several required positionals were all checked above
                    // (`load FILE URL`); a lone one is tried alone here.
                    if required.len() > 1 {
                        checked += 1;
                        continue;
                    }
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
