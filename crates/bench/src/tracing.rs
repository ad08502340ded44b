//! Counting TLB shootdowns from outside the measured code.
//!
//! Seed 000's whole point is the number of TLB flush IPIs that evicting pages
//! costs, so the benchmarks (and upager's integration tests: "≤ 2 shootdowns
//! per 1000 evicted pages") count them with the kernel's own instruments, not
//! with upager's counters:
//!
//! - [`InterruptCount`]: the `TLB` row of /proc/interrupts, summed over CPUs,
//!   before/after. It counts IPIs *received* (incremented in the receiving
//!   CPU's flush handler), for the whole system: other processes add to it,
//!   and KVM may skip IPIs to preempted vCPUs, so it runs low on a VM. Good
//!   for "shootdowns per second" of a whole run, as seed 000 reported.
//! - [`TlbCounter`]: the `tlb:tlb_flush` tracepoint, in a tracefs instance of
//!   its own (`/sys/kernel/tracing/instances/upager-bench-<pid>-tlbN`), so
//!   concurrent users (another counter, another engineer's trace session) do
//!   not collide; the instance is removed on stop or drop. Reason 4
//!   (`remote IPI send`) is the sender side: one event per
//!   `flush_tlb_multi` call that had other CPUs to interrupt — the number a
//!   test can assert on.
//!
//! **Attributing events to a process.** The tracepoint's `common_pid` is the
//! thread id of the task running when the event fires, and a process's threads
//! all have different tids. The counter makes the kernel filter on the whole
//! thread group: it writes every tid in `/proc/<pid>/task` to the instance's
//! `set_event_pid` and turns on `options/event-fork`, which adds every thread
//! (and child process) that a listed task creates afterwards. A thread created
//! between reading `/proc/<pid>/task` and the write is caught by reading the
//! task list again after the write, until it no longer grows (each new thread
//! was created either before the last read, and is listed, or after the write
//! by a listed thread, and is followed). `options/record-tgid` puts the tgid
//! on each trace line, so [`TlbCounts::by_tgid`] shows whose events they were
//! (child processes included). Events are read continuously from
//! `trace_pipe` by a drain thread (the buffer never fills on long runs), and
//! the per-CPU `dropped events`/`overrun` statistics are checked at stop: a
//! lost event is an error, never a silently low count.
//!
//! Events are filtered to `reason != 0` (a flush on task switch is not a
//! shootdown), in the kernel.
//!
//! **Where each send came from.** The instance records a kernel stack with
//! every event (`options/stacktrace`), and [`Assembler`] joins each event to
//! the stack printed after it on the same CPU; [`origin_of`] names the
//! stack's cause: the process's own system calls (`process_madvise`,
//! `madvise`, `munmap`, `mmap`, `mprotect`, `userfaultfd`), its exit, or
//! kernel work that merely ran on one of its threads (`reclaim`: direct
//! reclaim unmapping pages of any process, `migration`: compaction). The
//! kernel engine's own eviction is `reclaim`; for upager, which evicts by
//! system calls, `reclaim` and `migration` are the machine's memory
//! pressure, not upager's batching ([`TlbCounts::sends_by_origin`]).

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::host::{self, is_root, write_knob};
use crate::undo::{defer_until_ok, register_undo, undo_now, Undo, UndoId};

const TRACEFS: &str = "/sys/kernel/tracing";

impl Undo {
    /// Disable tracing in a tracefs instance and rmdir it (retried after
    /// exit while this process's drain thread still holds `trace_pipe`).
    pub(crate) fn remove_trace_instance(p: PathBuf) -> Self {
        Undo::new(format!("rmdir {}", p.display()), move || {
            let _ = write_knob(p.join("tracing_on"), "0");
            let _ = write_knob(p.join("events/tlb/tlb_flush/enable"), "0");
            match fs::remove_dir(&p) {
                // Busy while this process's drain thread holds trace_pipe
                // open (Ctrl-C path): remove it once the process has exited.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    defer_until_ok(&format!("rmdir '{}'", p.display()));
                    Ok(())
                }
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    Err(format!("rmdir {}: {e}", p.display()))
                }
                _ => Ok(()),
            }
        })
    }
}

/// Remove the tracefs instances that dead benchmark processes left behind;
/// returns what was removed.
pub(crate) fn remove_stale(is_stale: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(rd) = fs::read_dir(Path::new(TRACEFS).join("instances")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| is_stale(&e.file_name().to_string_lossy()))
        .filter(|e| Undo::remove_trace_instance(e.path()).run().is_ok())
        .map(|e| e.path().display().to_string())
        .collect()
}

/// Errors of counting TLB shootdowns.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum TlbCountError {
    /// /proc/interrupts has no `TLB` row: this kernel or architecture does not count TLB shootdown IPIs there (x86 only)
    NoTlbRow,
    /// the tlb:tlb_flush tracepoint needs root (tracefs): run as root
    NotRoot,
    /// tracefs is not available at /sys/kernel/tracing and could not be mounted ({0}); run `mount -t tracefs nodev /sys/kernel/tracing`
    NoTracefs(String),
    /// this kernel has no tlb:tlb_flush tracepoint (needs CONFIG_TRACEPOINTS on x86)
    NoTracepoint,
    /// {what} ({path}): {source}
    Io {
        /// What was being done.
        what: String,
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// process {0} does not exist (it must be alive when counting starts)
    NoSuchProcess(u32),
    /// the trace buffer lost {0} events (dropped or overrun): counts would be low; use a larger buffer (TlbCounter::with_buffer_kb) or a shorter run
    Lost(u64),
    /// the trace drain thread panicked
    DrainPanicked,
}

fn tio(what: &str, path: &Path) -> impl FnOnce(io::Error) -> TlbCountError {
    let what = what.to_string();
    let path = path.to_path_buf();
    move |source| TlbCountError::Io { what, path, source }
}

// ---------------------------------------------------------------------------
// /proc/interrupts

/// Sum of the per-CPU counts of the row named `name` (e.g. `"TLB"`) of
/// /proc/interrupts text; `None` if there is no such row.
pub fn parse_interrupts_row(text: &str, name: &str) -> Option<u64> {
    let want = format!("{name}:");
    let line = text.lines().find(|l| l.trim_start().starts_with(&want))?;
    let rest = &line.trim_start()[want.len()..];
    // Numbers up to the description text ("TLB shootdowns").
    Some(
        rest.split_whitespace()
            .map_while(|w| w.parse::<u64>().ok())
            .sum(),
    )
}

/// Read the `TLB` row of /proc/interrupts (summed over CPUs).
pub fn tlb_interrupts() -> Result<u64, TlbCountError> {
    let p = Path::new("/proc/interrupts");
    let text = fs::read_to_string(p).map_err(tio("reading", p))?;
    parse_interrupts_row(&text, "TLB").ok_or(TlbCountError::NoTlbRow)
}

/// A before/after count of the system-wide `TLB` interrupt row.
#[derive(Debug, Clone, Copy)]
pub struct InterruptCount {
    start: u64,
    t0: Instant,
}

impl InterruptCount {
    /// Take the "before" reading.
    pub fn start() -> Result<Self, TlbCountError> {
        Ok(InterruptCount {
            start: tlb_interrupts()?,
            t0: Instant::now(),
        })
    }
    /// IPIs received system-wide since [`InterruptCount::start`], and the
    /// seconds elapsed.
    pub fn stop(&self) -> Result<(u64, f64), TlbCountError> {
        Ok((
            tlb_interrupts()?.saturating_sub(self.start),
            self.t0.elapsed().as_secs_f64(),
        ))
    }
}

// ---------------------------------------------------------------------------
// Trace lines

/// `tlb_flush` reasons (arch/x86 `enum tlb_flush_reason`).
pub const REASONS: [&str; 6] = [
    "flush on task switch",
    "remote shootdown",
    "local shootdown",
    "local MM shootdown",
    "remote IPI send",
    "remote wrong CPU",
];
/// The sender side of a shootdown: one per `flush_tlb_multi` with remote CPUs.
pub const REASON_REMOTE_SEND: usize = 4;
/// A flush done on a CPU because of an IPI it received.
pub const REASON_REMOTE_RECEIVED: usize = 1;

/// One `tlb_flush` event parsed from a trace line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlbEvent {
    /// Task name.
    pub comm: String,
    /// Thread id (`common_pid`).
    pub tid: u32,
    /// Thread group id, when `record-tgid` recorded it.
    pub tgid: Option<u32>,
    /// CPU the event fired on.
    pub cpu: u32,
    /// Pages flushed (-1 = full flush).
    pub pages: i64,
    /// The reason number (see [`REASONS`]).
    pub reason: u8,
}

/// Parse one line of tracefs `trace`/`trace_pipe` output, with or without the
/// tgid column, e.g.
/// `   bash-3046    (   3046) [000] d..2.   303.59: tlb_flush: pages:1 reason:local MM shootdown (3)`.
/// Returns `None` for other lines (headers, other events).
pub fn parse_trace_line(line: &str) -> Option<TlbEvent> {
    let (head, ev) = line.split_once(": tlb_flush: ")?;
    // Event part: "pages:%ld reason:%s (%d)".
    let pages = ev
        .strip_prefix("pages:")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let open = ev.rfind('(')?;
    let close = ev[open..].find(')')? + open;
    let reason = ev[open + 1..close].trim().parse().ok()?;
    // Head: "comm-tid [(tgid)] [cpu] flags timestamp". comm may contain '-' and
    // spaces, so find the CPU field "[ddd]" first and split around it.
    let (cpu_open, cpu) = cpu_field(head)?;
    let mut task = head[..cpu_open].trim_end();
    let mut tgid = None;
    if task.ends_with(')') {
        let p = task.rfind('(')?;
        tgid = task[p + 1..task.len() - 1].trim().parse().ok(); // "-----" = unknown
        task = task[..p].trim_end();
    }
    let task = task.trim_start();
    let dash = task.rfind('-')?;
    Some(TlbEvent {
        comm: task[..dash].to_string(),
        tid: task[dash + 1..].parse().ok()?,
        tgid,
        cpu,
        pages,
        reason,
    })
}

/// Origins that are the kernel's memory management running on a target's
/// thread, not a call the target made (see the module doc).
pub const KERNEL_WORK: [&str; 2] = ["reclaim", "migration"];

/// The cause of a flush, from its kernel stack (innermost frame first): the
/// first frame that names one. `unknown` when there was no stack, `other`
/// when no frame matched.
pub fn origin_of<S: AsRef<str>>(frames: &[S]) -> &'static str {
    if frames.is_empty() {
        return "unknown";
    }
    for f in frames {
        // " => name" or " => name+0x1c/0x30".
        let f = f.as_ref();
        let name = f.split(['+', ' ']).next().unwrap_or(f);
        let o = match name {
            "shrink_folio_list" | "try_to_unmap_flush" | "shrink_node" | "kswapd" => "reclaim",
            "migrate_pages" | "migrate_pages_batch" | "compact_zone" => "migration",
            "vector_madvise" | "__do_sys_process_madvise" => "process_madvise",
            "do_madvise" | "__x64_sys_madvise" => "madvise",
            "__vm_munmap" | "__x64_sys_munmap" => "munmap",
            "__mmap_region" | "do_mmap" => "mmap",
            "do_mprotect_pkey" | "__x64_sys_mprotect" => "mprotect",
            "userfaultfd_ioctl" => "userfaultfd",
            "exit_mmap" => "exit",
            "do_user_addr_fault" | "handle_mm_fault" => "fault",
            _ => continue,
        };
        return o;
    }
    "other"
}

/// Joins `tlb_flush` events to the `<stack trace>` entries printed after
/// them. trace_pipe merges the per-CPU buffers by time, so another CPU's
/// lines may come between an event and its stack; the stack entry is the
/// next one in the same CPU's buffer, so events wait per CPU.
#[derive(Debug, Default)]
pub struct Assembler {
    pending: BTreeMap<u32, TlbEvent>,
    stack: Option<(u32, Vec<String>)>,
}

impl Assembler {
    /// Feed one line; `out` gets each event once its origin is known.
    pub fn feed(&mut self, line: &str, out: &mut impl FnMut(&TlbEvent, &str)) {
        if let Some(frame) = line.trim_start().strip_prefix("=>") {
            if let Some((_, frames)) = self.stack.as_mut() {
                frames.push(frame.trim().to_string());
            }
            return;
        }
        self.end_stack(out);
        if let Some(e) = parse_trace_line(line) {
            if let Some(old) = self.pending.insert(e.cpu, e) {
                out(&old, origin_of::<&str>(&[]));
            }
        } else if line.contains("<stack trace>") {
            if let Some((_, cpu)) = cpu_field(line) {
                self.stack = Some((cpu, Vec::new()));
            }
        }
    }

    /// Emit everything still waiting (at the end of the stream).
    pub fn finish(&mut self, out: &mut impl FnMut(&TlbEvent, &str)) {
        self.end_stack(out);
        for (_, e) in std::mem::take(&mut self.pending) {
            out(&e, origin_of::<&str>(&[]));
        }
    }

    fn end_stack(&mut self, out: &mut impl FnMut(&TlbEvent, &str)) {
        if let Some((cpu, frames)) = self.stack.take() {
            if let Some(e) = self.pending.remove(&cpu) {
                out(&e, origin_of(&frames));
            }
        }
    }
}

/// The CPU field `[ddd]` of a trace line's head, and where it starts.
fn cpu_field(line: &str) -> Option<(usize, u32)> {
    let open = line.find(" [")?;
    let close = line[open..].find(']')? + open;
    Some((open, line[open + 2..close].trim().parse().ok()?))
}

// ---------------------------------------------------------------------------
// The tracepoint counter

/// What to count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The calling process (all its threads, and processes it starts later).
    ThisProcess,
    /// These processes (all their threads, and processes they start later).
    Pids(Vec<u32>),
}

/// Counts by reason, from the tracepoint and from /proc/interrupts.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TlbCounts {
    /// Tracepoint events per reason number 0..=5 (0 is filtered out).
    pub by_reason: [u64; 6],
    /// Events per thread group id (0 = tgid not recorded).
    pub by_tgid: BTreeMap<u32, u64>,
    /// Remote sends (reason 4) per origin, see [`origin_of`].
    #[serde(default)]
    pub sends_by_origin: BTreeMap<String, u64>,
    /// System-wide `TLB` interrupts (received) during the count.
    pub irq_total: u64,
    /// Seconds counted.
    pub seconds: f64,
}

impl TlbCounts {
    /// Shootdowns sent by the target (reason 4, `remote IPI send`).
    pub fn remote_sends(&self) -> u64 {
        self.by_reason[REASON_REMOTE_SEND]
    }
    /// Flushes done on behalf of an IPI received while a target task ran
    /// (reason 1).
    pub fn remote_received(&self) -> u64 {
        self.by_reason[REASON_REMOTE_RECEIVED]
    }
    /// Remote sends per 1000 pages (e.g. evicted pages).
    pub fn sends_per_1000(&self, pages: u64) -> f64 {
        if pages == 0 {
            0.0
        } else {
            self.remote_sends() as f64 * 1000.0 / pages as f64
        }
    }
    /// Remote sends whose stack was not kernel reclaim or migration running
    /// on one of the target's threads: the sends its own system calls (and
    /// exit) caused.
    pub fn sends_by_own_calls(&self) -> u64 {
        self.remote_sends()
            - self
                .sends_by_origin
                .iter()
                .filter(|(o, _)| KERNEL_WORK.contains(&o.as_str()))
                .map(|(_, n)| n)
                .sum::<u64>()
    }
    fn add(&mut self, e: &TlbEvent, origin: &str) {
        if let Some(c) = self.by_reason.get_mut(e.reason as usize) {
            *c += 1;
        }
        *self.by_tgid.entry(e.tgid.unwrap_or(0)).or_default() += 1;
        if e.reason as usize == REASON_REMOTE_SEND {
            *self.sends_by_origin.entry(origin.to_string()).or_default() += 1;
        }
    }
}

/// Counts `tlb:tlb_flush` events of a set of processes; see the module doc.
#[derive(Debug)]
pub struct TlbCounter {
    dir: PathBuf,
    undo: UndoId,
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<TlbCounts>>,
    drain: Option<JoinHandle<Result<(), TlbCountError>>>,
    irq: Option<InterruptCount>,
}

fn ensure_tracefs() -> Result<(), TlbCountError> {
    if !is_root() {
        return Err(TlbCountError::NotRoot);
    }
    let t = Path::new(TRACEFS);
    if !t.join("instances").exists() {
        // Mounted on demand, and left mounted: other users may rely on it.
        host::run_tool(
            "mount",
            &["-t", "tracefs", "nodev", TRACEFS],
            Duration::from_secs(10),
        )
        .map_err(|e| TlbCountError::NoTracefs(e.to_string()))?;
    }
    if !t.join("events/tlb/tlb_flush").exists() {
        return Err(TlbCountError::NoTracepoint);
    }
    Ok(())
}

fn tids_of(pid: u32) -> Result<Vec<u32>, TlbCountError> {
    let rd =
        fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| TlbCountError::NoSuchProcess(pid))?;
    Ok(rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect())
}

impl TlbCounter {
    /// Start counting with a 16 MiB per-CPU buffer.
    pub fn start(target: Target) -> Result<Self, TlbCountError> {
        Self::with_buffer_kb(target, 16 << 10)
    }

    /// Start counting with `buffer_kb` of trace buffer per CPU.
    pub fn with_buffer_kb(target: Target, buffer_kb: u64) -> Result<Self, TlbCountError> {
        ensure_tracefs()?;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{}{}-tlb{}",
            host::NAME_PREFIX,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = Path::new(TRACEFS).join("instances").join(name);
        fs::create_dir(&dir).map_err(tio("creating a tracefs instance", &dir))?;
        let undo = register_undo(Undo::remove_trace_instance(dir.clone()));
        let mut c = TlbCounter {
            dir,
            undo,
            stop: Arc::new(AtomicBool::new(false)),
            counts: Arc::new(Mutex::new(TlbCounts::default())),
            drain: None,
            irq: None,
        };
        let w = |rel: &str, v: &str| -> Result<(), TlbCountError> {
            let p = c.dir.join(rel);
            write_knob(&p, v).map_err(tio(&format!("writing {v:?}"), &p))
        };
        w("tracing_on", "0")?;
        w("buffer_size_kb", &buffer_kb.to_string())?;
        w("options/overwrite", "0")?; // full buffer drops new events (counted), never overwrites silently
        w("options/record-tgid", "1")?;
        w("options/event-fork", "1")?;
        w("options/stacktrace", "1")?; // each event's origin (module doc)
        let pids = match target {
            Target::ThisProcess => vec![std::process::id()],
            Target::Pids(p) => p,
        };
        // Thread-group filter (see module doc): write tids until stable.
        let set_pid = c.dir.join("set_event_pid");
        let mut written: Vec<u32> = Vec::new();
        loop {
            let mut new = Vec::new();
            for &p in &pids {
                for t in tids_of(p)? {
                    if !written.contains(&t) && !new.contains(&t) {
                        new.push(t);
                    }
                }
            }
            if new.is_empty() {
                break;
            }
            // Appending keeps the pids already written (O_APPEND on
            // set_event_pid adds; a plain write replaces).
            let mut f = OpenOptions::new()
                .append(true)
                .open(&set_pid)
                .map_err(tio("opening", &set_pid))?;
            let list = new.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
            io::Write::write_all(&mut f, list.as_bytes()).map_err(tio("writing tids", &set_pid))?;
            written.extend(new);
        }
        w("events/tlb/tlb_flush/filter", "reason != 0")?;
        w("events/tlb/tlb_flush/enable", "1")?;
        // Drain thread: non-blocking reads of trace_pipe every 20 ms.
        let pipe_path = c.dir.join("trace_pipe");
        let mut pipe = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&pipe_path)
            .map_err(tio("opening", &pipe_path))?;
        let stop = c.stop.clone();
        let counts = c.counts.clone();
        c.drain = Some(std::thread::spawn(move || -> Result<(), TlbCountError> {
            let mut buf = vec![0u8; 1 << 16];
            let mut carry = String::new();
            let mut asm = Assembler::default();
            let mut idle_after_stop = 0;
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => idle_after_stop += 1,
                    Ok(n) => {
                        carry.push_str(&String::from_utf8_lossy(&buf[..n]));
                        let last_nl = carry.rfind('\n').map_or(0, |i| i + 1);
                        let mut cs = counts.lock().unwrap_or_else(|p| p.into_inner());
                        for line in carry[..last_nl].lines() {
                            asm.feed(line, &mut |e, o| cs.add(e, o));
                        }
                        drop(cs);
                        carry.drain(..last_nl);
                        idle_after_stop = 0;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => idle_after_stop += 1,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(tio("reading", &pipe_path)(e)),
                }
                if stop.load(Ordering::Acquire) {
                    // Tracing is off; two empty reads in a row mean drained.
                    if idle_after_stop >= 2 {
                        let mut cs = counts.lock().unwrap_or_else(|p| p.into_inner());
                        asm.finish(&mut |e, o| cs.add(e, o));
                        return Ok(());
                    }
                } else {
                    idle_after_stop = 0;
                }
                std::thread::sleep(Duration::from_millis(if stop.load(Ordering::Acquire) {
                    2
                } else {
                    20
                }));
            }
        }));
        c.irq = InterruptCount::start().ok();
        w("tracing_on", "1")?;
        Ok(c)
    }

    /// Counts so far (the drain thread lags by up to 20 ms).
    pub fn peek(&self) -> TlbCounts {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stop counting, drain the buffer, check for lost events, remove the
    /// instance, and return the counts.
    pub fn stop(mut self) -> Result<TlbCounts, TlbCountError> {
        let _ = write_knob(self.dir.join("tracing_on"), "0");
        let irq = self.irq.and_then(|i| i.stop().ok());
        self.stop.store(true, Ordering::Release);
        let r = self.drain.take().map(|h| h.join());
        let lost = lost_events(&self.dir);
        let _ = undo_now(self.undo);
        match r {
            Some(Ok(Ok(()))) | None => {}
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(_)) => return Err(TlbCountError::DrainPanicked),
        }
        if lost > 0 {
            return Err(TlbCountError::Lost(lost));
        }
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some((n, s)) = irq {
            c.irq_total = n;
            c.seconds = s;
        }
        Ok(c)
    }
}

fn lost_events(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir.join("per_cpu")) else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| fs::read_to_string(e.path().join("stats")).ok())
        .map(|s| parse_lost(&s))
        .sum()
}

/// Sum of `overrun` and `dropped events` in a per-CPU `stats` file.
pub fn parse_lost(stats: &str) -> u64 {
    stats
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            matches!(k.trim(), "overrun" | "dropped events")
                .then(|| v.trim().parse::<u64>().ok())?
        })
        .sum()
}

impl Drop for TlbCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = write_knob(self.dir.join("tracing_on"), "0");
        if let Some(h) = self.drain.take() {
            let _ = h.join();
        }
        let _ = undo_now(self.undo);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERRUPTS: &str = "           CPU0       CPU1       \n  \
 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n\
 NMI:          0          0   Non-maskable interrupts\n\
 CAL:      32484      19227   Function call interrupts\n\
 TLB:       1647       1639   TLB shootdowns\n\
 ERR:          0\n";

    #[test]
    fn interrupts_row() {
        assert_eq!(parse_interrupts_row(INTERRUPTS, "TLB"), Some(3286));
        assert_eq!(parse_interrupts_row(INTERRUPTS, "CAL"), Some(51711));
        assert_eq!(parse_interrupts_row(INTERRUPTS, "ERR"), Some(0));
        assert_eq!(parse_interrupts_row(INTERRUPTS, "XYZ"), None);
    }

    #[test]
    fn interrupts_live() {
        if let Ok(text) = fs::read_to_string("/proc/interrupts") {
            if text.contains("TLB:") {
                assert!(tlb_interrupts().is_ok());
            }
        }
    }

    #[test]
    fn trace_lines() {
        let l = "            bash-3046    (   3046) [000] d..2.   303.593974: tlb_flush: pages:1 reason:local MM shootdown (3)";
        assert_eq!(
            parse_trace_line(l),
            Some(TlbEvent {
                comm: "bash".into(),
                tid: 3046,
                tgid: Some(3046),
                cpu: 0,
                pages: 1,
                reason: 3
            })
        );
        let l =
            " kworker/u8:2-mm-12 [001] d.h1. 5.1: tlb_flush: pages:-1 reason:remote IPI send (4)";
        let e = parse_trace_line(l).unwrap();
        assert_eq!(
            (e.comm.as_str(), e.tid, e.tgid, e.cpu, e.pages, e.reason),
            ("kworker/u8:2-mm", 12, None, 1, -1, 4)
        );
        let l = "   my prog-77    (-------) [001] ..... 9.0: tlb_flush: pages:0 reason:remote shootdown (1)";
        let e = parse_trace_line(l).unwrap();
        assert_eq!(
            (e.comm.as_str(), e.tid, e.tgid, e.reason),
            ("my prog", 77, None, 1)
        );
        assert_eq!(parse_trace_line("# tracer: nop"), None);
        assert_eq!(
            parse_trace_line(" a-1 [000] ..... 1.0: sched_switch: prev=x"),
            None
        );
    }

    #[test]
    fn events_get_the_origin_of_their_own_cpus_stack() {
        // Two CPUs interleaved as trace_pipe merges them: CPU 1's event comes
        // between CPU 0's event and CPU 0's stack.
        let text = "\
 upager-reclaim-10 (    9) [000] ...1. 1.000001: tlb_flush: pages:-1 reason:remote IPI send (4)
 upager-fault-0-11 (    9) [001] ...1. 1.000002: tlb_flush: pages:-1 reason:remote IPI send (4)
 upager-reclaim-10 (    9) [000] ...1. 1.000003: <stack trace>
 => trace_event_raw_event_tlb_flush
 => native_flush_tlb_multi
 => tlb_finish_mmu
 => vector_madvise
 => __do_sys_process_madvise
 upager-fault-0-11 (    9) [001] ...1. 1.000004: <stack trace>
 => arch_tlbbatch_flush
 => try_to_unmap_flush
 => shrink_folio_list
 => do_try_to_free_pages
 upager-fault-0-11 (    9) [001] ...1. 1.000005: tlb_flush: pages:-1 reason:remote IPI send (4)
 upager-fault-0-11 (    9) [001] ...1. 1.000006: <stack trace>
 => tlb_finish_mmu
 => vms_clear_ptes
 => __vm_munmap
 => __x64_sys_munmap
 upager-fault-0-11 (    9) [001] ...1. 1.000007: tlb_flush: pages:1 reason:local MM shootdown (3)
";
        let mut c = TlbCounts::default();
        let mut asm = Assembler::default();
        for line in text.lines() {
            asm.feed(line, &mut |e, o| c.add(e, o));
        }
        assert_eq!(c.remote_sends(), 3);
        assert_eq!(c.by_reason[3], 0, "the last event waits for its stack");
        asm.finish(&mut |e, o| c.add(e, o));
        assert_eq!(c.by_reason[3], 1);
        let o = |k: &str| c.sends_by_origin.get(k).copied().unwrap_or(0);
        assert_eq!(
            (o("process_madvise"), o("reclaim"), o("munmap")),
            (1, 1, 1),
            "{c:?}"
        );
        assert_eq!(c.sends_by_own_calls(), 2);
        assert_eq!(origin_of::<&str>(&[]), "unknown");
        assert_eq!(origin_of(&["native_flush_tlb_multi", "schedule"]), "other");
    }

    #[test]
    fn lost_stats() {
        let s = "entries: 999\noverrun: 2\ncommit overrun: 0\nbytes: 28092\ndropped events: 3\nread events: 0\n";
        assert_eq!(parse_lost(s), 5);
    }
}
