//! The benchmark environment: what the kernel's side of every comparison runs
//! in, set up as root and always taken down again.
//!
//! - A **memory cgroup (v1)** per run ([`Cgroup`]): the kernel gets the same
//!   memory budget as upager (`memory.limit_in_bytes`), so its page cache and
//!   anonymous memory are reclaimed under the same pressure; its
//!   `memory.max_usage_in_bytes` and `memory.stat` (`pgpgout`: pages
//!   uncharged, i.e. evicted) are what the reports show.
//! - A **RAM block device with ext4** ([`ZramExt4`], zram0 by default): the
//!   data files live there, so storage is the same for every engine and is not
//!   the bottleneck. zram is synchronous (~4 µs per random 4 KiB read here); a
//!   loop device over /dev/shm costs ~45 µs per I/O (its worker thread and
//!   wakeups), so with a loop device every engine would measure the loop
//!   driver.
//! - A **swap device** ([`SwapDevice`]) for the kernel's anonymous runs: a
//!   second, hot-added zram device (the file scenarios use zram0), or a loop
//!   device over a /dev/shm file where zram cannot be hot-added.
//! - [`drop_caches`] between runs, [`create_pattern_file`] for data files
//!   whose every 8-byte word can be checked ([`pattern_word`]), and
//!   [`ThpKnobs`] to enable exactly one mTHP size for a run.
//!
//! Everything that changes the machine registers an undo action first. The
//! owning guard's `Drop` runs it; [`install_signal_cleanup`] installs a
//! SIGINT/SIGTERM/SIGHUP handler that runs every pending undo action (newest
//! first: worker processes are killed before their cgroup is removed) and
//! exits with status 130. Set-up is idempotent: [`cleanup_stale`] removes what
//! a killed earlier run (whose pid is gone) left behind, and every set-up step
//! checks the state it finds instead of assuming a clean machine.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Prefix of every name this crate creates (cgroups, mount points, files,
/// tracefs instances), followed by `<pid>-…` of the creating process.
pub const NAME_PREFIX: &str = "upager-bench-";
/// Where the cgroup v1 memory controller is mounted.
pub const CGROUP_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of setting up or tearing down the benchmark environment.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum SetupError {
    /// {what} needs root: run the benchmark as root (e.g. `sudo upager bench …`)
    NotRoot {
        /// What needed root.
        what: String,
    },
    /// `{tool}` is not installed: run `apt-get install {package}`
    MissingTool {
        /// The program that was not found on PATH.
        tool: String,
        /// The Debian package that has it.
        package: String,
    },
    /// the cgroup v1 memory controller is not mounted at /sys/fs/cgroup/memory: mount it with `mkdir -p /sys/fs/cgroup/memory && mount -t cgroup -o memory none /sys/fs/cgroup/memory`
    NoCgroupV1,
    /// {what} ({path}): {source}
    Io {
        /// What was being done.
        what: String,
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `{command}` failed ({status}): {stderr}
    Tool {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// {what} did not finish within {secs} s; check `dmesg` and the device, then retry
    Timeout {
        /// What was waited for.
        what: String,
        /// The time limit.
        secs: u64,
    },
    /// {device} is in use ({why}): free it first (umount, swapoff, or `echo 1 > /sys/block/<dev>/reset`), or pick another device
    DeviceBusy {
        /// The device.
        device: String,
        /// Who uses it.
        why: String,
    },
    /// /dev/zram{index} does not exist: run `modprobe zram` (or `modprobe zram num_devices=2`)
    NoZram {
        /// The zram device number.
        index: u32,
    },
    /// this kernel has no mTHP size {size_kb} KiB (no /sys/kernel/mm/transparent_hugepage/hugepages-{size_kb}kB/enabled); pick one of the sizes listed there
    NoThpSize {
        /// The folio size asked for.
        size_kb: u64,
    },
    /// could not install the Ctrl-C cleanup handler: {0}
    Signal(String),
}

fn io_err(
    what: impl Into<String>,
    path: impl Into<PathBuf>,
) -> impl FnOnce(io::Error) -> SetupError {
    let what = what.into();
    let path = path.into();
    move |source| SetupError::Io { what, path, source }
}

// ---------------------------------------------------------------------------
// Small helpers.

/// Whether this process runs with effective uid 0.
pub use upager_sys::io::is_root;

/// Fail with [`SetupError::NotRoot`] unless running as root.
pub fn require_root(what: &str) -> Result<(), SetupError> {
    if is_root() {
        Ok(())
    } else {
        Err(SetupError::NotRoot {
            what: what.to_string(),
        })
    }
}

/// Write `value` to a sysfs/procfs/cgroupfs/tracefs file (one `write`).
pub(crate) fn write_knob(path: impl AsRef<Path>, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(false)
        .open(path.as_ref())?;
    f.write_all(value.as_bytes())
}

fn write_knob_ctx(path: impl AsRef<Path>, value: &str, what: &str) -> Result<(), SetupError> {
    let path = path.as_ref();
    write_knob(path, value).map_err(io_err(format!("{what}: writing {value:?}"), path))
}

fn read_trim(path: impl AsRef<Path>) -> Result<String, SetupError> {
    let path = path.as_ref();
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(io_err("reading", path))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Find `tool` on PATH (and the sbin directories, which a non-login root
/// shell may lack).
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file());
    found
}

/// Check that the command-line tools the environment needs exist, naming the
/// Debian package to install for the first one missing.
pub fn require_tools(tools: &[&str]) -> Result<(), SetupError> {
    for &tool in tools {
        if find_tool(tool).is_none() {
            let package = match tool {
                "mkfs.ext4" => "e2fsprogs",
                "losetup" | "mount" | "umount" | "swapon" | "swapoff" => "mount",
                "mkswap" => "util-linux",
                "python3" => "python3",
                _ => "coreutils",
            };
            return Err(SetupError::MissingTool {
                tool: tool.to_string(),
                package: package.to_string(),
            });
        }
    }
    Ok(())
}

/// Run a tool with a time limit; return its stdout. The child is killed when
/// the limit passes.
pub(crate) fn run_tool(tool: &str, args: &[&str], timeout: Duration) -> Result<String, SetupError> {
    let exe = find_tool(tool).ok_or_else(|| match require_tools(&[tool]) {
        Err(e) => e,
        Ok(()) => SetupError::MissingTool {
            tool: tool.into(),
            package: "coreutils".into(),
        },
    })?;
    let command = format!("{tool} {}", args.join(" "));
    let mut child = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("starting `{command}`"), &exe))?;
    let start = Instant::now();
    let status = loop {
        match child
            .try_wait()
            .map_err(io_err(format!("waiting for `{command}`"), &exe))?
        {
            Some(s) => break s,
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SetupError::Timeout {
                    what: format!("`{command}`"),
                    secs: timeout.as_secs(),
                });
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(SetupError::Tool {
            command,
            status: status.to_string(),
            stderr: err.trim().to_string(),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Undo registry and the signal hook.

/// One action that returns the machine to how it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Undo {
    /// SIGKILL a worker process (so its cgroup can be removed).
    KillPid(u32),
    /// rmdir a cgroup, after its tasks have gone.
    RemoveCgroup(PathBuf),
    /// umount a file system, then remove the mount-point directory.
    Unmount(PathBuf),
    /// `echo 1 > /sys/block/zramN/reset`.
    ResetZram(u32),
    /// `echo N > /sys/class/zram-control/hot_remove`.
    HotRemoveZram(u32),
    /// swapoff a device.
    Swapoff(PathBuf),
    /// `losetup -d`.
    DetachLoop(PathBuf),
    /// rm a file.
    RemoveFile(PathBuf),
    /// Write a saved value back to a sysfs knob.
    RestoreKnob(PathBuf, String),
    /// Disable tracing in a tracefs instance and rmdir it.
    RemoveTraceInstance(PathBuf),
}

/// Handle of a registered undo action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UndoId(u64);

static UNDO: Mutex<Vec<(u64, Undo)>> = Mutex::new(Vec::new());
static NEXT_UNDO: AtomicU64 = AtomicU64::new(1);

fn undo_list() -> std::sync::MutexGuard<'static, Vec<(u64, Undo)>> {
    UNDO.lock().unwrap_or_else(|p| p.into_inner())
}

/// Register an undo action; the caller runs it with [`undo_now`] (normally
/// from its `Drop`), or the signal handler runs it.
pub(crate) fn register_undo(u: Undo) -> UndoId {
    let id = NEXT_UNDO.fetch_add(1, Ordering::Relaxed);
    undo_list().push((id, u));
    UndoId(id)
}

/// Run and forget an undo action, unless the signal handler already ran it.
pub(crate) fn undo_now(id: UndoId) -> Result<(), String> {
    let u = {
        let mut l = undo_list();
        l.iter()
            .position(|(i, _)| *i == id.0)
            .map(|p| l.remove(p).1)
    };
    match u {
        Some(u) => run_undo(&u),
        None => Ok(()),
    }
}

/// Forget an undo action without running it (the resource was handed over or
/// already released by other means).
pub(crate) fn forget_undo(id: UndoId) {
    undo_list().retain(|(i, _)| *i != id.0);
}

fn run_undo(u: &Undo) -> Result<(), String> {
    let t = Duration::from_secs(30);
    let r: Result<(), String> = match u {
        Undo::KillPid(pid) => {
            if pid_alive(*pid) {
                let _ = run_tool("kill", &["-KILL", &pid.to_string()], t);
            }
            Ok(())
        }
        Undo::RemoveCgroup(path) => {
            remove_cgroup_dir(path, Duration::from_secs(10)).map_err(|e| e.to_string())
        }
        Undo::Unmount(dir) => {
            let d = dir.to_string_lossy();
            let r = if is_mounted(dir) {
                // Busy (e.g. Ctrl-C while the main thread still writes a data
                // file): detach lazily; the file system goes when the last
                // file closes, at the latest when this process exits.
                run_tool("umount", &[&d], t)
                    .or_else(|_| run_tool("umount", &["-l", &d], t))
                    .map(|_| ())
            } else {
                Ok(())
            };
            let _ = fs::remove_dir(dir);
            r.map_err(|e| e.to_string())
        }
        Undo::ResetZram(i) => {
            let p = format!("/sys/block/zram{i}/reset");
            match write_knob(&p, "1") {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    defer_until_ok(&format!("echo 1 > {p}"));
                    Ok(())
                }
                r => r.map_err(|e| format!("reset zram{i}: {e}")),
            }
        }
        Undo::HotRemoveZram(i) => {
            let p = "/sys/class/zram-control/hot_remove";
            match write_knob(p, &i.to_string()) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    defer_until_ok(&format!(
                        "echo 1 > /sys/block/zram{i}/reset; echo {i} > {p}"
                    ));
                    Ok(())
                }
                r => r.map_err(|e| format!("hot_remove zram{i}: {e}")),
            }
        }
        Undo::Swapoff(dev) => {
            if swap_active(dev) {
                run_tool(
                    "swapoff",
                    &[&dev.to_string_lossy()],
                    Duration::from_secs(120),
                )
                .map(|_| ())
                .map_err(|e| e.to_string())
            } else {
                Ok(())
            }
        }
        Undo::DetachLoop(dev) => run_tool("losetup", &["-d", &dev.to_string_lossy()], t)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Undo::RemoveFile(p) => match fs::remove_file(p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(format!("rm {}: {e}", p.display()))
            }
            _ => Ok(()),
        },
        Undo::RestoreKnob(p, v) => {
            write_knob(p, v).map_err(|e| format!("restore {} = {v}: {e}", p.display()))
        }
        Undo::RemoveTraceInstance(p) => {
            let _ = write_knob(p.join("tracing_on"), "0");
            let _ = write_knob(p.join("events/tlb/tlb_flush/enable"), "0");
            match fs::remove_dir(p) {
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
        }
    };
    if let Err(e) = &r {
        eprintln!("upager-bench: cleanup {u:?} failed: {e}");
    }
    r
}

/// A device still busy because this process holds a file open on it (the
/// signal handler runs while the main thread is mid-write): retry the step
/// from a detached shell for up to 60 s, which outlives this process.
fn defer_until_ok(step: &str) {
    eprintln!("upager-bench: device busy; `{step}` will be retried after exit");
    let script = format!(
        "i=0; while [ $i -lt 600 ]; do ({step}) 2>/dev/null && exit 0; i=$((i+1)); sleep 0.1; done; exit 1"
    );
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// Run every pending undo action, newest first. Called by the signal handler;
/// safe to call at any time (each action runs at most once).
pub fn cleanup_all() {
    loop {
        let u = undo_list().pop();
        match u {
            Some((_, u)) => {
                let _ = run_undo(&u);
            }
            None => break,
        }
    }
}

/// Install (once per process) a SIGINT/SIGTERM/SIGHUP handler that runs
/// [`cleanup_all`] and exits with status 130.
pub fn install_signal_cleanup() -> Result<(), SetupError> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            ctrlc::set_handler(|| {
                eprintln!("upager-bench: interrupted, cleaning up…");
                cleanup_all();
                std::process::exit(130);
            })
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(SetupError::Signal)
}

/// Remove what an earlier benchmark process that no longer exists left behind:
/// its cgroups, mounts, swap devices and tracefs instances (names carry the
/// creator's pid). Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    let mut done = Vec::new();
    let stale = |name: &str| -> bool {
        name.strip_prefix(NAME_PREFIX)
            .and_then(|r| r.split(['-', '.']).next())
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| pid != std::process::id() && !pid_alive(pid))
    };
    // Swap first (a swap file on a mount would keep it busy), then mounts.
    if let Ok(swaps) = fs::read_to_string("/proc/swaps") {
        for line in swaps.lines().skip(1) {
            let Some(dev) = line.split_whitespace().next() else {
                continue;
            };
            if let Some(backing) = loop_backing_file(dev) {
                let name = Path::new(&backing)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                if name.as_deref().is_some_and(stale) {
                    let _ = run_undo(&Undo::Swapoff(dev.into()));
                    let _ = run_undo(&Undo::DetachLoop(dev.into()));
                    let _ = run_undo(&Undo::RemoveFile(backing.into()));
                    done.push(format!("swap {dev}"));
                }
            }
        }
    }
    if let Ok(mounts) = fs::read_to_string("/proc/mounts") {
        for line in mounts.lines() {
            let mut f = line.split_whitespace();
            let (Some(dev), Some(mnt)) = (f.next(), f.next()) else {
                continue;
            };
            let name = Path::new(mnt)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            if name.as_deref().is_some_and(stale) {
                let _ = run_undo(&Undo::Unmount(mnt.into()));
                if let Some(i) = dev.strip_prefix("/dev/zram").and_then(|i| i.parse().ok()) {
                    let _ = run_undo(&Undo::ResetZram(i));
                }
                done.push(format!("mount {mnt}"));
            }
        }
    }
    for (dir, is_cgroup) in [
        (CGROUP_MEMORY_ROOT, true),
        ("/sys/kernel/tracing/instances", false),
        ("/dev/shm", false),
    ] {
        let Ok(rd) = fs::read_dir(dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !stale(&name) {
                continue;
            }
            let u = if is_cgroup {
                Undo::RemoveCgroup(e.path())
            } else if dir == "/dev/shm" {
                Undo::RemoveFile(e.path())
            } else {
                Undo::RemoveTraceInstance(e.path())
            };
            if run_undo(&u).is_ok() {
                done.push(e.path().display().to_string());
            }
        }
    }
    done
}

fn loop_backing_file(dev: &str) -> Option<String> {
    let name = Path::new(dev).file_name()?.to_string_lossy().into_owned();
    fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn is_mounted(dir: &Path) -> bool {
    let d = dir.to_string_lossy();
    fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(1) == Some(&d)))
        .unwrap_or(false)
}

fn mount_of_device(dev: &str) -> Option<String> {
    fs::read_to_string("/proc/mounts").ok().and_then(|m| {
        m.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(dev)).then(|| f.next().unwrap_or("").to_string())
        })
    })
}

fn swap_active(dev: &Path) -> bool {
    let d = dev.to_string_lossy();
    fs::read_to_string("/proc/swaps")
        .map(|m| {
            m.lines()
                .skip(1)
                .any(|l| l.split_whitespace().next() == Some(&d))
        })
        .unwrap_or(false)
}

fn unique_name(what: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "{NAME_PREFIX}{}-{what}{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

// ---------------------------------------------------------------------------
// Memory cgroup v1.

/// A memory cgroup (v1) created for one run; removed on drop (after its tasks
/// have exited: live tasks are killed first if they were registered as
/// workers, and any task still inside after 10 s is moved to the root).
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    undo: UndoId,
}

impl Cgroup {
    /// Create `/sys/fs/cgroup/memory/upager-bench-<pid>-<tag><n>` with
    /// `memory.limit_in_bytes = limit_bytes`. Swap is not limited separately
    /// (memsw is left unlimited), so with a swap device on, anonymous memory
    /// beyond the limit goes to swap instead of triggering the OOM killer.
    pub fn create(tag: &str, limit_bytes: u64) -> Result<Self, SetupError> {
        require_root("creating a memory cgroup")?;
        let root = Path::new(CGROUP_MEMORY_ROOT);
        if !root.join("memory.limit_in_bytes").exists() {
            return Err(SetupError::NoCgroupV1);
        }
        let path = root.join(unique_name(tag));
        if !path.exists() {
            fs::create_dir(&path).map_err(io_err("creating the cgroup", &path))?;
        }
        let undo = register_undo(Undo::RemoveCgroup(path.clone()));
        let cg = Cgroup { path, undo };
        write_knob_ctx(
            cg.path.join("memory.limit_in_bytes"),
            &limit_bytes.to_string(),
            "setting the cgroup's limit",
        )?;
        Ok(cg)
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Move a process (all its threads) into the cgroup.
    pub fn add_pid(&self, pid: u32) -> Result<(), SetupError> {
        write_knob_ctx(
            self.path.join("cgroup.procs"),
            &pid.to_string(),
            "moving a process into the cgroup",
        )
    }

    /// Processes in the cgroup.
    pub fn procs(&self) -> Result<Vec<u32>, SetupError> {
        Ok(read_trim(self.path.join("cgroup.procs"))?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    fn read_u64(&self, file: &str) -> Result<u64, SetupError> {
        let p = self.path.join(file);
        let s = read_trim(&p)?;
        s.parse().map_err(|_| SetupError::Io {
            what: format!("parsing {s:?}"),
            path: p,
            source: io::ErrorKind::InvalidData.into(),
        })
    }

    /// `memory.limit_in_bytes`.
    pub fn limit_bytes(&self) -> Result<u64, SetupError> {
        self.read_u64("memory.limit_in_bytes")
    }
    /// `memory.usage_in_bytes`.
    pub fn usage_bytes(&self) -> Result<u64, SetupError> {
        self.read_u64("memory.usage_in_bytes")
    }
    /// `memory.max_usage_in_bytes`: the peak charge since creation or the
    /// last [`Cgroup::reset_max_usage`].
    pub fn max_usage_bytes(&self) -> Result<u64, SetupError> {
        self.read_u64("memory.max_usage_in_bytes")
    }
    /// Reset the peak to the current usage.
    pub fn reset_max_usage(&self) -> Result<(), SetupError> {
        write_knob_ctx(
            self.path.join("memory.max_usage_in_bytes"),
            "0",
            "resetting the peak usage",
        )
    }
    /// `memory.stat` as name → value.
    pub fn stat(&self) -> Result<BTreeMap<String, u64>, SetupError> {
        Ok(parse_memory_stat(&read_trim(
            self.path.join("memory.stat"),
        )?))
    }

    /// Remove the cgroup now (waits up to 10 s for its tasks to exit).
    pub fn remove(self) -> Result<(), SetupError> {
        let id = self.undo;
        std::mem::forget(self);
        undo_now(id).map_err(|e| SetupError::Tool {
            command: "rmdir cgroup".into(),
            status: "failed".into(),
            stderr: e,
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = undo_now(self.undo);
    }
}

/// Parse `memory.stat` (lines of `name value`).
pub fn parse_memory_stat(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

fn remove_cgroup_dir(path: &Path, timeout: Duration) -> Result<(), SetupError> {
    if !path.exists() {
        return Ok(());
    }
    let start = Instant::now();
    let procs = |p: &Path| -> Vec<String> {
        fs::read_to_string(p.join("cgroup.procs"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    };
    while !procs(path).is_empty() && start.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Tasks still inside (not ours to kill): move them out so rmdir works.
    for p in procs(path) {
        let _ = write_knob(Path::new(CGROUP_MEMORY_ROOT).join("cgroup.procs"), &p);
    }
    // rmdir can fail with EBUSY for a moment after the last task left.
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if start.elapsed() > timeout + Duration::from_secs(5) => {
                return Err(io_err("removing the cgroup", path)(e));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

// ---------------------------------------------------------------------------
// Dropping caches.

/// `sync; echo 3 > /proc/sys/vm/drop_caches` (needs root).
pub fn drop_caches() -> Result<(), SetupError> {
    require_root("dropping the page cache")?;
    run_tool("sync", &[], TOOL_TIMEOUT)?;
    write_knob_ctx("/proc/sys/vm/drop_caches", "3", "dropping caches")
}

// ---------------------------------------------------------------------------
// zram + ext4.

/// A zram device with a fresh ext4 file system mounted on a temporary
/// directory; unmounted and reset on drop.
#[derive(Debug)]
pub struct ZramExt4 {
    index: u32,
    mount: PathBuf,
    undo_reset: UndoId,
    undo_mount: UndoId,
}

fn zram_check_free(index: u32) -> Result<(), SetupError> {
    let dev = format!("/dev/zram{index}");
    if let Some(m) = mount_of_device(&dev) {
        return Err(SetupError::DeviceBusy {
            device: dev,
            why: format!("mounted at {m}"),
        });
    }
    if swap_active(Path::new(&dev)) {
        return Err(SetupError::DeviceBusy {
            device: dev,
            why: "used as swap".into(),
        });
    }
    Ok(())
}

fn zram_init(index: u32, size_bytes: u64) -> Result<(), SetupError> {
    let sys = PathBuf::from(format!("/sys/block/zram{index}"));
    if !sys.exists() {
        return Err(SetupError::NoZram { index });
    }
    zram_check_free(index)?;
    // A device with a size but no user is left over: reset it (idempotent).
    if read_trim(sys.join("disksize"))? != "0" {
        write_knob_ctx(sys.join("reset"), "1", "resetting zram")?;
    }
    write_knob_ctx(sys.join("disksize"), &size_bytes.to_string(), "sizing zram")
}

impl ZramExt4 {
    /// Reset `/dev/zram<index>`, size it to `size_bytes`, `mkfs.ext4` it and
    /// mount it (noatime) on `/tmp/upager-bench-<pid>-zram<n>`. Fails with
    /// [`SetupError::DeviceBusy`] if the device is mounted or used as swap by
    /// anyone (never resets a device in use).
    pub fn setup(index: u32, size_bytes: u64) -> Result<Self, SetupError> {
        require_root("setting up a zram block device")?;
        require_tools(&["mkfs.ext4", "mount", "umount"])?;
        let dev = format!("/dev/zram{index}");
        zram_init(index, size_bytes)?;
        let undo_reset = register_undo(Undo::ResetZram(index));
        let fail = |e: SetupError| {
            let _ = undo_now(undo_reset);
            e
        };
        // Initialise inode tables and journal now, so no ext4lazyinit thread
        // writes in the background while we measure.
        run_tool(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &dev,
            ],
            TOOL_TIMEOUT,
        )
        .map_err(fail)?;
        let mount = std::env::temp_dir().join(unique_name("zram"));
        fs::create_dir_all(&mount)
            .map_err(io_err("creating the mount point", &mount))
            .map_err(fail)?;
        let undo_mount = register_undo(Undo::Unmount(mount.clone()));
        if let Err(e) = run_tool(
            "mount",
            &["-o", "noatime", &dev, &mount.to_string_lossy()],
            TOOL_TIMEOUT,
        ) {
            let _ = undo_now(undo_mount);
            return Err(fail(e));
        }
        Ok(ZramExt4 {
            index,
            mount,
            undo_reset,
            undo_mount,
        })
    }

    /// Where the file system is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount
    }
    /// The device, e.g. `/dev/zram0`.
    pub fn device(&self) -> String {
        format!("/dev/zram{}", self.index)
    }
}

impl Drop for ZramExt4 {
    fn drop(&mut self) {
        let _ = undo_now(self.undo_mount);
        let _ = undo_now(self.undo_reset);
    }
}

// ---------------------------------------------------------------------------
// Swap.

/// Which RAM device carries the kernel's swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SwapKind {
    /// A zram device hot-added for the run (removed afterwards).
    ZramHotAdd,
    /// A loop device over a sparse /dev/shm file.
    LoopShm,
}

/// An active swap device on RAM; swapped off and removed on drop.
#[derive(Debug)]
pub struct SwapDevice {
    device: PathBuf,
    kind: SwapKind,
    undos: Vec<UndoId>,
}

impl SwapDevice {
    /// Create and enable a swap device of `size_bytes`. With
    /// [`SwapKind::ZramHotAdd`], falls back to a loop device when
    /// /sys/class/zram-control is missing.
    pub fn setup(kind: SwapKind, size_bytes: u64) -> Result<Self, SetupError> {
        require_root("setting up a swap device")?;
        require_tools(&["mkswap", "swapon", "swapoff"])?;
        let mut undos = Vec::new();
        let cleanup = |undos: &mut Vec<UndoId>| {
            while let Some(u) = undos.pop() {
                let _ = undo_now(u);
            }
        };
        let kind = if kind == SwapKind::ZramHotAdd
            && !Path::new("/sys/class/zram-control/hot_add").exists()
        {
            SwapKind::LoopShm
        } else {
            kind
        };
        let device = match kind {
            SwapKind::ZramHotAdd => {
                // Reading hot_add creates a device and returns its number.
                let n: u32 = read_trim("/sys/class/zram-control/hot_add")?
                    .parse()
                    .map_err(|_| SetupError::Io {
                        what: "parsing the zram number from hot_add".into(),
                        path: "/sys/class/zram-control/hot_add".into(),
                        source: io::ErrorKind::InvalidData.into(),
                    })?;
                undos.push(register_undo(Undo::HotRemoveZram(n)));
                if let Err(e) = zram_init(n, size_bytes) {
                    cleanup(&mut undos);
                    return Err(e);
                }
                undos.push(register_undo(Undo::ResetZram(n)));
                PathBuf::from(format!("/dev/zram{n}"))
            }
            SwapKind::LoopShm => {
                require_tools(&["losetup"])?;
                let file = Path::new("/dev/shm").join(format!("{}.swap", unique_name("swap")));
                undos.push(register_undo(Undo::RemoveFile(file.clone())));
                let r = File::create(&file)
                    .and_then(|f| f.set_len(size_bytes))
                    .map_err(io_err("creating the swap file", &file));
                if let Err(e) = r {
                    cleanup(&mut undos);
                    return Err(e);
                }
                match run_tool(
                    "losetup",
                    &["--find", "--show", &file.to_string_lossy()],
                    TOOL_TIMEOUT,
                ) {
                    Ok(out) => {
                        let dev = PathBuf::from(out.trim());
                        undos.push(register_undo(Undo::DetachLoop(dev.clone())));
                        dev
                    }
                    Err(e) => {
                        cleanup(&mut undos);
                        return Err(e);
                    }
                }
            }
        };
        let d = device.to_string_lossy().into_owned();
        if let Err(e) = run_tool("mkswap", &[&d], TOOL_TIMEOUT) {
            cleanup(&mut undos);
            return Err(e);
        }
        undos.push(register_undo(Undo::Swapoff(device.clone())));
        if let Err(e) = run_tool("swapon", &[&d], TOOL_TIMEOUT) {
            cleanup(&mut undos);
            return Err(e);
        }
        Ok(SwapDevice {
            device,
            kind,
            undos,
        })
    }

    /// The swap device.
    pub fn device(&self) -> &Path {
        &self.device
    }
    /// What kind of device it turned out to be.
    pub fn kind(&self) -> SwapKind {
        self.kind
    }
}

impl Drop for SwapDevice {
    fn drop(&mut self) {
        while let Some(u) = self.undos.pop() {
            let _ = undo_now(u);
        }
    }
}

// ---------------------------------------------------------------------------
// THP knobs.

/// Anonymous mTHP sizes (KiB) this kernel offers, smallest first: the
/// /sys/kernel/mm/transparent_hugepage/hugepages-*kB directories that have an
/// `enabled` file (some sizes, e.g. 8 KiB, exist for shmem only).
pub fn mthp_sizes_kb() -> Vec<u64> {
    let mut v: Vec<u64> = fs::read_dir("/sys/kernel/mm/transparent_hugepage")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("enabled").exists())
                .filter_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("hugepages-")
                        .and_then(|s| s.strip_suffix("kB"))
                        .and_then(|s| s.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The selected word of a sysfs choice file (`always [madvise] never`).
pub fn parse_sysfs_choice(text: &str) -> Option<String> {
    let s = text.find('[')?;
    let e = text[s..].find(']')?;
    Some(text[s + 1..s + e].to_string())
}

/// Per-size mTHP settings changed for one run; restored on drop.
#[derive(Debug)]
pub struct ThpKnobs {
    undos: Vec<UndoId>,
}

impl ThpKnobs {
    /// Set `hugepages-<size_kb>kB/enabled` to `always` and every other size to
    /// `never`, so anonymous faults allocate exactly that folio size where
    /// alignment allows (the kernel tries the largest enabled size first).
    pub fn only(size_kb: u64) -> Result<Self, SetupError> {
        require_root("changing the mTHP settings")?;
        let sizes = mthp_sizes_kb();
        if !sizes.contains(&size_kb) {
            return Err(SetupError::NoThpSize { size_kb });
        }
        let mut k = ThpKnobs { undos: Vec::new() };
        for s in sizes {
            let p = PathBuf::from(format!(
                "/sys/kernel/mm/transparent_hugepage/hugepages-{s}kB/enabled"
            ));
            let cur = parse_sysfs_choice(&read_trim(&p)?).unwrap_or_else(|| "never".into());
            let want = if s == size_kb { "always" } else { "never" };
            if cur != want {
                k.undos
                    .push(register_undo(Undo::RestoreKnob(p.clone(), cur)));
                write_knob_ctx(&p, want, "setting an mTHP size")?;
            }
        }
        Ok(k)
    }
}

impl Drop for ThpKnobs {
    fn drop(&mut self) {
        while let Some(u) = self.undos.pop() {
            let _ = undo_now(u);
        }
    }
}

/// `anon_fault_alloc` and `anon_fault_fallback` of one mTHP size (counts of
/// large folios allocated at fault time, and of fallbacks to smaller ones).
pub fn mthp_fault_stats(size_kb: u64) -> Option<(u64, u64)> {
    let d = format!("/sys/kernel/mm/transparent_hugepage/hugepages-{size_kb}kB/stats");
    let r = |f: &str| {
        fs::read_to_string(format!("{d}/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((r("anon_fault_alloc")?, r("anon_fault_fallback")?))
}

// ---------------------------------------------------------------------------
// Pattern files.

/// The 8-byte little-endian word stored at byte `offset` (a multiple of 8)
/// of a pattern file made with `seed`.
pub fn pattern_word(offset: u64, seed: u64) -> u64 {
    offset ^ seed
}

/// Create (or replace) `path` with `len` bytes (rounded up to 8) where the
/// word at each offset is [`pattern_word`]. Writes 4 MiB chunks and fsyncs.
/// Returns the time taken.
pub fn create_pattern_file(path: &Path, len: u64, seed: u64) -> Result<Duration, SetupError> {
    let t = Instant::now();
    let len = len.div_ceil(8) * 8;
    let mut f = File::create(path).map_err(io_err("creating the data file", path))?;
    const CHUNK: usize = 4 << 20;
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        for (i, w) in buf[..n].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&pattern_word(off + 8 * i as u64, seed).to_le_bytes());
        }
        f.write_all(&buf[..n])
            .map_err(io_err("writing the data file", path))?;
        off += n as u64;
    }
    f.sync_all()
        .map_err(io_err("syncing the data file", path))?;
    // Not left in the page cache: it would be charged to this process's
    // cgroup, and a run reading it would hit it without charging its own.
    crate::raw::evict_file_cache(&f)
        .map_err(io_err("evicting the data file from the page cache", path))?;
    Ok(t.elapsed())
}

/// Drop a file's clean, unmapped pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`), so the next run reads it from the
/// device and charges it to its own cgroup. Targeted, unlike [`drop_caches`],
/// and needs no privilege.
pub fn evict_file(path: &Path) -> Result<(), SetupError> {
    let f = File::open(path).map_err(io_err("opening the data file", path))?;
    crate::raw::evict_file_cache(&f)
        .map_err(io_err("evicting the data file from the page cache", path))
}

/// Check every word of a pattern file; returns the offset of the first wrong
/// word, if any.
pub fn verify_pattern_file(path: &Path, seed: u64) -> Result<Option<u64>, SetupError> {
    let mut f = File::open(path).map_err(io_err("opening the data file", path))?;
    let mut buf = vec![0u8; 4 << 20];
    let mut off = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io_err("reading the data file", path))?;
        if n == 0 {
            return Ok(None);
        }
        for (i, w) in buf[..n - n % 8].chunks_exact(8).enumerate() {
            let o = off + 8 * i as u64;
            if u64::from_le_bytes(w.try_into().unwrap_or_default()) != pattern_word(o, seed) {
                return Ok(Some(o));
            }
        }
        off += n as u64;
    }
}

// ---------------------------------------------------------------------------
// The whole environment.

/// What [`BenchEnv::setup`] should prepare.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EnvConfig {
    /// zram device for the data files (ext4), if any; `None` = no file store.
    pub zram_index: Option<u32>,
    /// Size of that zram device.
    pub zram_bytes: u64,
    /// Swap device for anonymous runs, if any.
    pub swap: Option<SwapKind>,
    /// Size of the swap device.
    pub swap_bytes: u64,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            zram_index: Some(0),
            zram_bytes: 3 << 30,
            swap: None,
            swap_bytes: 2 << 30,
        }
    }
}

/// The benchmark environment: the RAM block device with ext4 and the swap
/// device, plus the signal hook. Dropping it removes everything.
/// Cgroups are made per run with [`Cgroup::create`].
#[derive(Debug)]
pub struct BenchEnv {
    /// The data store (ext4 on zram), if configured.
    pub store: Option<ZramExt4>,
    /// The swap device, if configured.
    pub swap: Option<SwapDevice>,
}

impl BenchEnv {
    /// Check privileges and tools, install the Ctrl-C hook, clean up what a
    /// killed earlier run left behind, then create the configured devices.
    pub fn setup(cfg: &EnvConfig) -> Result<Self, SetupError> {
        require_root("the benchmark environment (cgroup, zram, swap)")?;
        if !Path::new(CGROUP_MEMORY_ROOT)
            .join("memory.limit_in_bytes")
            .exists()
        {
            return Err(SetupError::NoCgroupV1);
        }
        let mut tools = vec!["sync", "mount", "umount"];
        if cfg.zram_index.is_some() {
            tools.push("mkfs.ext4");
        }
        if cfg.swap.is_some() {
            tools.extend(["mkswap", "swapon", "swapoff", "losetup"]);
        }
        require_tools(&tools)?;
        install_signal_cleanup()?;
        for s in cleanup_stale() {
            eprintln!("upager-bench: removed leftover {s}");
        }
        let store = cfg
            .zram_index
            .map(|i| ZramExt4::setup(i, cfg.zram_bytes))
            .transpose()?;
        let swap = cfg
            .swap
            .map(|k| SwapDevice::setup(k, cfg.swap_bytes))
            .transpose()?;
        Ok(BenchEnv { store, swap })
    }

    /// Directory for data files (the ext4 mount, or the temp dir without one).
    pub fn data_dir(&self) -> PathBuf {
        self.store
            .as_ref()
            .map_or_else(std::env::temp_dir, |s| s.mount_point().to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stat_parses() {
        let m = parse_memory_stat("cache 4096\nrss 8192\npgpgout 17\ntotal_pgpgout 20\nbad line\n");
        assert_eq!(m["pgpgout"], 17);
        assert_eq!(m["rss"], 8192);
        assert!(!m.contains_key("bad"));
    }

    #[test]
    fn sysfs_choice_parses() {
        assert_eq!(
            parse_sysfs_choice("always inherit madvise [never]").as_deref(),
            Some("never")
        );
        assert_eq!(
            parse_sysfs_choice("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(parse_sysfs_choice("nothing"), None);
    }

    #[test]
    fn pattern_file_roundtrip() {
        let p = std::env::temp_dir().join(unique_name("pattern"));
        create_pattern_file(&p, (1 << 20) + 12, 0xfeed).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), (1 << 20) + 16);
        assert_eq!(verify_pattern_file(&p, 0xfeed).unwrap(), None);
        assert_eq!(verify_pattern_file(&p, 0xbeef).unwrap(), Some(0));
        fs::remove_file(&p).unwrap();
    }

    #[test]
    fn undo_runs_once() {
        let p = std::env::temp_dir().join(unique_name("undo"));
        fs::write(&p, b"x").unwrap();
        let id = register_undo(Undo::RemoveFile(p.clone()));
        undo_now(id).unwrap();
        assert!(!p.exists());
        fs::write(&p, b"x").unwrap();
        undo_now(id).unwrap(); // already done: no-op
        assert!(p.exists());
        fs::remove_file(&p).unwrap();
    }

    #[test]
    fn cgroup_and_zram_and_swap() {
        if !is_root() || !Path::new(CGROUP_MEMORY_ROOT).exists() {
            eprintln!("skipped: needs root and the cgroup v1 memory controller");
            return;
        }
        let cg = Cgroup::create("test", 64 << 20).unwrap();
        assert_eq!(cg.limit_bytes().unwrap(), 64 << 20);
        assert!(cg.stat().unwrap().contains_key("pgpgout"));
        let path = cg.path().to_path_buf();
        drop(cg);
        assert!(!path.exists());

        if zram_check_free(0).is_ok()
            && read_trim("/sys/block/zram0/disksize").is_ok_and(|s| s == "0")
        {
            let z = ZramExt4::setup(0, 64 << 20).unwrap();
            let f = z.mount_point().join("data");
            create_pattern_file(&f, 4 << 20, 7).unwrap();
            assert_eq!(verify_pattern_file(&f, 7).unwrap(), None);
            let mnt = z.mount_point().to_path_buf();
            drop(z);
            assert!(!is_mounted(&mnt));
            assert_eq!(read_trim("/sys/block/zram0/disksize").unwrap(), "0");
        } else {
            eprintln!("zram0 part skipped: zram0 is in use");
        }
        let s = SwapDevice::setup(SwapKind::LoopShm, 32 << 20).unwrap();
        let dev = s.device().to_path_buf();
        assert!(swap_active(&dev));
        drop(s);
        assert!(!swap_active(&dev));
    }
}
