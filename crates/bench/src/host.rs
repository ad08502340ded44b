//! The machine as the environment modules see it: the one error type of
//! setting up and tearing down ([`SetupError`]), privilege checks, running
//! the command-line tools (`mount`, `mkfs.ext4`, `swapon` …) with a time
//! limit, reading and writing kernel knob files, and the names this crate
//! gives everything it creates.
//!
//! The lowest layer of the crate: it uses no other module of it.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Prefix of every name this crate creates (cgroups, mount points, files,
/// tracefs instances), followed by `<pid>-…` of the creating process.
pub const NAME_PREFIX: &str = "upager-bench-";

/// Time limit of one set-up tool run (mkfs, mount, swapon …).
pub(crate) const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// no memory cgroup controller is mounted: neither cgroup v2 (a cgroup2 mount whose cgroup.controllers lists `memory`) nor cgroup v1 (a cgroup mount with `-o memory`); mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup` (v2), or `mkdir -p /sys/fs/cgroup/memory && mount -t cgroup -o memory none /sys/fs/cgroup/memory` (v1)
    NoMemoryCgroup,
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

/// Map an I/O error to [`SetupError::Io`] with what was done and where.
pub(crate) fn io_err(
    what: impl Into<String>,
    path: impl Into<PathBuf>,
) -> impl FnOnce(io::Error) -> SetupError {
    let what = what.into();
    let path = path.into();
    move |source| SetupError::Io { what, path, source }
}

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

/// Whether this runs under CI (`CI=true`), where something that cannot run
/// (a fault mode, a test's requirement) fails instead of being left out.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Number of CPUs this process may use.
pub fn ncpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Write `value` to a sysfs/procfs/cgroupfs/tracefs file (one `write`).
pub(crate) fn write_knob(path: impl AsRef<Path>, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(false)
        .open(path.as_ref())?;
    f.write_all(value.as_bytes())
}

/// [`write_knob`] with the error saying what the write was for.
pub(crate) fn write_knob_ctx(
    path: impl AsRef<Path>,
    value: &str,
    what: &str,
) -> Result<(), SetupError> {
    let path = path.as_ref();
    write_knob(path, value).map_err(io_err(format!("{what}: writing {value:?}"), path))
}

/// A knob file's contents without surrounding white space.
pub(crate) fn read_trim(path: impl AsRef<Path>) -> Result<String, SetupError> {
    let path = path.as_ref();
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(io_err("reading", path))
}

/// Whether process `pid` exists.
pub(crate) fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// A fresh name `upager-bench-<pid>-<what><n>` (unique within this process;
/// the pid makes it unique on the machine and lets [`is_stale_name`] tell
/// what a dead process left behind).
pub(crate) fn unique_name(what: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "{NAME_PREFIX}{}-{what}{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether `name` was made by [`unique_name`] in a process that no longer
/// exists (and is not this one).
pub(crate) fn is_stale_name(name: &str) -> bool {
    name.strip_prefix(NAME_PREFIX)
        .and_then(|r| r.split(['-', '.']).next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id() && !pid_alive(pid))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_names() {
        // 4194304 = 2^22 is above the largest pid Linux hands out.
        assert!(is_stale_name(&format!("{NAME_PREFIX}4194304-run0")));
        assert!(!is_stale_name(&unique_name("run")));
        assert!(
            !is_stale_name(&format!("{NAME_PREFIX}1-run0")),
            "init is alive"
        );
        assert!(!is_stale_name("something-else-17"));
    }
}
