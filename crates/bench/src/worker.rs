//! Running a workload in a child process placed in a memory cgroup.
//!
//! The kernel baselines must run under the same memory budget as upager, and
//! only their own memory may count against it, so each runs in a fresh child
//! process: the `upager-bench-worker` binary of this crate (or any binary that
//! calls [`worker_main`] for a hidden subcommand, see [`WorkerExe`]).
//!
//! Protocol (one line each, on the child's stdin/stdout):
//! 1. child → `ready <pid>` once it has parsed its arguments;
//! 2. the parent moves the child into the cgroup, starts the TLB counters,
//!    and sends `go`;
//! 3. child runs the workload, prints `result <json WorkerResult>` (or
//!    `error <message>`) and exits.
//!
//! Every wait has a time limit; a child that overruns it is killed. While a
//! child runs, a kill action is registered with the Ctrl-C cleanup, so the
//! cgroup can be removed on interrupt.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cgroup::{parse_memory_stat, Cgroup};
use crate::host::{is_root, SetupError};
use crate::tracing::{InterruptCount, Target, TlbCountError, TlbCounter, TlbCounts};
use crate::undo::{forget_undo, register_undo, Undo, UndoId};
use crate::workloads::{run_workload, WorkerResult, Workload};

/// Errors of running a worker process.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum WorkerError {
    /// the worker binary was not found (looked at {0}): build it with `cargo build -p upager-bench --bins` (same profile), or set UPAGER_BENCH_WORKER to its path
    NotFound(String),
    /// could not start the worker {exe}: {source}
    Spawn {
        /// The executable.
        exe: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// the worker did not {what} within {secs:.0} s (killed); raise the timeout or shrink the run
    Timeout {
        /// What it did not do.
        what: &'static str,
        /// The limit.
        secs: f64,
    },
    /// the worker failed: {0}
    Failed(String),
    /// the worker exited without a result ({status}); stderr: {stderr}
    Died {
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// the worker printed a result that is not valid JSON: {0}
    BadResult(String),
    /// setting up the run: {0}
    Setup(#[from] SetupError),
    /// counting TLB shootdowns: {0}
    Tlb(#[from] TlbCountError),
}

/// How to start a worker process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerExe {
    /// A binary whose first arguments are the workload subcommand.
    Binary(PathBuf),
    /// A binary that dispatches `<arg> <subcommand…>` to [`worker_main`]
    /// (e.g. the `upager` CLI re-executing itself).
    SelfWithArg(PathBuf, String),
}

impl WorkerExe {
    /// `$UPAGER_BENCH_WORKER`, else `upager-bench-worker` next to the current
    /// executable or one directory up (test binaries live in `target/*/deps`).
    pub fn locate() -> Result<Self, WorkerError> {
        if let Some(p) = std::env::var_os("UPAGER_BENCH_WORKER") {
            return Ok(WorkerExe::Binary(p.into()));
        }
        let exe = std::env::current_exe().map_err(|e| WorkerError::NotFound(e.to_string()))?;
        let mut tried = Vec::new();
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("upager-bench-worker");
            if p.is_file() {
                return Ok(WorkerExe::Binary(p));
            }
            tried.push(p.display().to_string());
        }
        Err(WorkerError::NotFound(tried.join(", ")))
    }

    fn command(&self) -> Command {
        match self {
            WorkerExe::Binary(p) => Command::new(p),
            WorkerExe::SelfWithArg(p, a) => {
                let mut c = Command::new(p);
                c.arg(a);
                c
            }
        }
    }
}

/// The worker's subcommand line for a workload: `<name> --json <workload>`.
pub fn workload_args(w: &Workload) -> Vec<String> {
    let json = serde_json::to_string(w).unwrap_or_default();
    let name = serde_json::to_value(w)
        .ok()
        .and_then(|v| {
            v.get("workload")
                .and_then(|n| n.as_str())
                .map(str::to_string)
        })
        .unwrap_or_default();
    vec![name, "--json".into(), json]
}

/// Parse the worker's command line: `<subcommand> --json '{…}'`, or
/// `<subcommand> --key value …` with the workload's field names
/// (`mmap-read --file /mnt/data --threads 2 --seed 1`).
pub fn parse_worker_args(args: &[String]) -> Result<(Workload, bool), String> {
    let mut it = args.iter();
    let sub = it.next().ok_or(
        "missing subcommand (mmap-read, random-read, multi-fault, unmap, usemem, madvise-loop)",
    )?;
    let mut obj = serde_json::Map::new();
    obj.insert("workload".into(), sub.clone().into());
    let mut wait_go = false;
    let mut json = None;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--wait-go" => wait_go = true,
            "--json" => json = Some(it.next().ok_or("--json needs a value")?.clone()),
            k if k.starts_with("--") => {
                let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
                let key = k[2..].replace('-', "_");
                let val = v.parse::<u64>().map(serde_json::Value::from).or_else(|_| {
                    v.parse::<f64>()
                        .map(serde_json::Value::from)
                        .map_err(|_| ())
                });
                obj.insert(key, val.unwrap_or_else(|()| v.clone().into()));
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let w: Workload = match json {
        Some(j) => serde_json::from_str(&j).map_err(|e| format!("bad --json: {e}"))?,
        None => serde_json::from_value(obj.into())
            .map_err(|e| format!("bad arguments for {sub}: {e}"))?,
    };
    Ok((w, wait_go))
}

/// The worker's `main`: parse `args` (without the program name), optionally
/// wait for `go`, run, print the result line.
pub fn worker_main(args: &[String]) -> ExitCode {
    let (w, wait_go) = match parse_worker_args(args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("upager-bench-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout();
    if wait_go {
        let _ = writeln!(out, "ready {}", std::process::id());
        let _ = out.flush();
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_err() || line.trim() != "go" {
            eprintln!("upager-bench-worker: expected `go` on stdin, got {line:?}");
            return ExitCode::from(2);
        }
    }
    match run_workload(&w) {
        Ok(r) => {
            let _ = writeln!(
                out,
                "result {}",
                serde_json::to_string(&r).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(out, "error {e}");
            ExitCode::from(1)
        }
    }
}

/// Options of one worker run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Put the worker in a fresh memory cgroup with this limit (needs root).
    pub cgroup_limit: Option<u64>,
    /// Count `tlb:tlb_flush` for the worker (needs root; skipped otherwise).
    pub trace_tlb: bool,
    /// Time limit for the whole run.
    pub timeout: Duration,
    /// Run the worker as this user and group id (root only): an ordinary
    /// user's process, as upager's users meet it.
    pub user: Option<(u32, u32)>,
    /// Extra environment variables for the worker (e.g.
    /// `UPAGER_MASK_FEATURES`: upager without a kernel feature).
    pub env: Vec<(String, String)>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            cgroup_limit: None,
            trace_tlb: true,
            timeout: Duration::from_secs(600),
            user: None,
            env: Vec::new(),
        }
    }
}

/// What a worker run measured, from inside and outside the worker.
#[derive(Debug, Clone, Default)]
pub struct WorkerRun {
    /// What the worker measured itself.
    pub result: WorkerResult,
    /// Tracepoint counts for the worker (None without root).
    pub tlb: Option<TlbCounts>,
    /// System-wide `TLB` interrupts during the run.
    pub tlb_irq: Option<u64>,
    /// Peak memory charge of the cgroup.
    pub peak_bytes: Option<u64>,
    /// `memory.stat` deltas of the cgroup (`pgfault`, `pgmajfault`; on
    /// cgroup v1 also `pgpgin`/`pgpgout`, which count folios, not pages),
    /// plus `cache_start`/`cache_end` (page cache bytes charged before and
    /// after: v1 `cache`, v2 `file`).
    pub cgroup_stat: std::collections::BTreeMap<String, u64>,
    /// /proc/vmstat deltas (system-wide): `pswpout`, `pswpin` (pages).
    pub vmstat: std::collections::BTreeMap<String, u64>,
    /// Notes (what was skipped and why).
    pub notes: Vec<String>,
}

struct Reaper {
    child: Child,
    undo: UndoId,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        forget_undo(self.undo);
    }
}

/// Start `w` in a worker, place it in a cgroup (if asked and root), count its
/// TLB shootdowns, collect its result.
pub fn run_worker(
    exe: &WorkerExe,
    w: &Workload,
    opts: &RunOptions,
) -> Result<WorkerRun, WorkerError> {
    let deadline = Instant::now() + opts.timeout;
    let mut run = WorkerRun::default();
    let root = is_root();
    // The cgroup first, so it outlives the child (guards drop in reverse).
    let cgroup = match (opts.cgroup_limit, root) {
        (Some(l), true) => Some(Cgroup::create("run", l)?),
        (Some(_), false) => {
            run.notes
                .push("not root: ran without a memory cgroup".into());
            None
        }
        (None, _) => None,
    };
    let mut cmd = exe.command();
    cmd.args(workload_args(w)).arg("--wait-go");
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    if let Some((uid, gid)) = opts.user {
        // std drops the supplementary groups too (setgroups) when root
        // switches to another uid.
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    let exe_name = format!("{exe:?}");
    let child = cmd.spawn().map_err(|source| WorkerError::Spawn {
        exe: exe_name,
        source,
    })?;
    let pid = child.id();
    let mut reaper = Reaper {
        child,
        undo: register_undo(Undo::kill_pid(pid)),
    };
    let stdout = reaper
        .child
        .stdout
        .take()
        .ok_or_else(|| WorkerError::Failed("no stdout".into()))?;
    let stderr = reaper
        .child
        .stderr
        .take()
        .ok_or_else(|| WorkerError::Failed("no stderr".into()))?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let left = |d: Instant| d.saturating_duration_since(Instant::now());
    let died = |reaper: &mut Reaper, err_thread: std::thread::JoinHandle<String>| {
        let status = reaper
            .child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_default();
        WorkerError::Died {
            status,
            stderr: err_thread.join().unwrap_or_default().trim().to_string(),
        }
    };
    match rx.recv_timeout(left(deadline).min(Duration::from_secs(30))) {
        Ok(l) if l.starts_with("ready") => {}
        // A worker that cannot start (the Python driver without numpy)
        // says why.
        Ok(l) if l.starts_with("error ") => return Err(WorkerError::Failed(l[6..].to_string())),
        Ok(l) => return Err(WorkerError::Failed(format!("unexpected first line {l:?}"))),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(WorkerError::Timeout {
                what: "start",
                secs: 30.0,
            })
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => return Err(died(&mut reaper, err_thread)),
    }
    let mut stat0 = Default::default();
    if let Some(cg) = &cgroup {
        cg.add_pid(pid)?;
        cg.reset_max_usage()?;
        stat0 = cg.stat()?;
    }
    let tlb = if opts.trace_tlb && root {
        Some(TlbCounter::start(Target::Pids(vec![pid]))?)
    } else {
        if opts.trace_tlb {
            run.notes.push("not root: no tlb:tlb_flush counts".into());
        }
        None
    };
    let irq = InterruptCount::start().ok();
    let vm0 = vmstat();
    {
        let stdin = reaper
            .child
            .stdin
            .as_mut()
            .ok_or_else(|| WorkerError::Failed("no stdin".into()))?;
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .map_err(|e| WorkerError::Failed(format!("sending go: {e}")))?;
    }
    let line = loop {
        match rx.recv_timeout(left(deadline)) {
            Ok(l) if l.starts_with("result ") || l.starts_with("error ") => break l,
            Ok(_) => continue,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(WorkerError::Timeout {
                    what: "finish",
                    secs: opts.timeout.as_secs_f64(),
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(died(&mut reaper, err_thread)),
        }
    };
    run.tlb_irq = irq.and_then(|i| i.stop().ok()).map(|(n, _)| n);
    let vm1 = vmstat();
    for (k, b) in &vm1 {
        if let Some(a) = vm0.get(k) {
            run.vmstat.insert(k.clone(), b.saturating_sub(*a));
        }
    }
    if let Some(t) = tlb {
        run.tlb = Some(t.stop()?);
    }
    if let Some(cg) = &cgroup {
        run.peak_bytes = cg.max_usage_bytes().ok();
        if let Ok(s1) = cg.stat() {
            for k in ["pgpgin", "pgpgout", "pgfault", "pgmajfault"] {
                if let (Some(a), Some(b)) = (stat0.get(k), s1.get(k)) {
                    run.cgroup_stat.insert(k.to_string(), b.saturating_sub(*a));
                }
            }
            for (k, s) in [("cache_start", &stat0), ("cache_end", &s1)] {
                if let Some(v) = cg.page_cache_bytes(s) {
                    run.cgroup_stat.insert(k.to_string(), v);
                }
            }
        }
    }
    // Let it exit (bounded), then reap.
    let exit_by = Instant::now() + Duration::from_secs(10);
    while reaper.child.try_wait().ok().flatten().is_none() && Instant::now() < exit_by {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(reaper);
    drop(cgroup);
    if let Some(msg) = line.strip_prefix("error ") {
        return Err(WorkerError::Failed(msg.to_string()));
    }
    let json = line.strip_prefix("result ").unwrap_or_default();
    run.result =
        serde_json::from_str(json).map_err(|e| WorkerError::BadResult(format!("{e}: {json}")))?;
    Ok(run)
}

/// Page-granular swap counters of /proc/vmstat.
fn vmstat() -> std::collections::BTreeMap<String, u64> {
    std::fs::read_to_string("/proc/vmstat")
        .map(|s| parse_memory_stat(&s))
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == "pswpout" || k == "pswpin")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_roundtrip() {
        let w = Workload::RandomRead {
            file: "/x".into(),
            threads: 2,
            reads_per_thread: 7,
            seed: 1,
            advice: crate::workloads::MapAdvice::Random,
        };
        let a = workload_args(&w);
        assert_eq!(a[0], "random-read");
        assert_eq!(parse_worker_args(&a).unwrap(), (w, false));
        let a: Vec<String> = [
            "multi-fault",
            "--threads",
            "3",
            "--seconds",
            "0.5",
            "--area-bytes",
            "4096",
            "--wait-go",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            parse_worker_args(&a).unwrap(),
            (
                Workload::MultiFault {
                    threads: 3,
                    seconds: 0.5,
                    area_bytes: 4096
                },
                true
            )
        );
        assert!(parse_worker_args(&["nope".to_string()]).is_err());
    }
}
