//! Undo actions: how every change to the machine is taken back, by its
//! owner's `Drop` or by the Ctrl-C handler.
//!
//! Everything that changes the machine registers an [`Undo`] first (each
//! environment module makes its own: `cgroup` removes a cgroup, `blockdev`
//! unmounts and resets zram, `swap` swaps off, `tracing` removes a tracefs
//! instance). The owning guard's `Drop` runs it with [`undo_now`];
//! [`install_signal_cleanup`] installs a SIGINT/SIGTERM/SIGHUP handler that
//! runs every pending action (newest first: worker processes are killed
//! before their cgroup is removed) and exits with status 130. Each action
//! runs at most once.

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::host::{self, SetupError};

type Action = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// One action that returns the machine to how it was.
pub(crate) struct Undo {
    label: String,
    action: Action,
}

impl std::fmt::Debug for Undo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

impl Undo {
    /// An action described by `label` (shown when it fails).
    pub(crate) fn new(
        label: impl Into<String>,
        action: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Self {
        Undo {
            label: label.into(),
            action: Box::new(action),
        }
    }

    /// SIGKILL a worker process (so its cgroup can be removed).
    pub(crate) fn kill_pid(pid: u32) -> Self {
        Undo::new(format!("kill -KILL {pid}"), move || {
            if host::pid_alive(pid) {
                let _ = host::run_tool("kill", &["-KILL", &pid.to_string()], TEARDOWN_TIMEOUT);
            }
            Ok(())
        })
    }

    /// rm a file (gone already is fine).
    pub(crate) fn remove_file(path: PathBuf) -> Self {
        Undo::new(
            format!("rm {}", path.display()),
            move || match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    Err(format!("rm {}: {e}", path.display()))
                }
                _ => Ok(()),
            },
        )
    }

    /// Run the action now (not registered, or already taken off the list),
    /// reporting a failure on stderr.
    pub(crate) fn run(self) -> Result<(), String> {
        let Undo { label, action } = self;
        let r = action();
        if let Err(e) = &r {
            eprintln!("upager-bench: cleanup {label} failed: {e}");
        }
        r
    }
}

/// Time limit of one teardown tool run (kill, umount, losetup -d).
pub(crate) const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Handle of a registered undo action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UndoId(u64);

static UNDO: Mutex<Vec<(u64, Undo)>> = Mutex::new(Vec::new());
static NEXT_UNDO: AtomicU64 = AtomicU64::new(1);

fn undo_list() -> MutexGuard<'static, Vec<(u64, Undo)>> {
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
        Some(u) => u.run(),
        None => Ok(()),
    }
}

/// Forget an undo action without running it (the resource was handed over or
/// already released by other means).
pub(crate) fn forget_undo(id: UndoId) {
    undo_list().retain(|(i, _)| *i != id.0);
}

/// A device still busy because this process holds a file open on it (the
/// signal handler runs while the main thread is mid-write): retry the step
/// from a detached shell for up to 60 s, which outlives this process.
pub(crate) fn defer_until_ok(step: &str) {
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
                let _ = u.run();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undo_runs_once() {
        let p = std::env::temp_dir().join(host::unique_name("undo"));
        std::fs::write(&p, b"x").unwrap();
        let id = register_undo(Undo::remove_file(p.clone()));
        undo_now(id).unwrap();
        assert!(!p.exists());
        std::fs::write(&p, b"x").unwrap();
        undo_now(id).unwrap(); // already done: no-op
        assert!(p.exists());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn forgotten_undo_does_not_run() {
        let p = std::env::temp_dir().join(host::unique_name("undo"));
        std::fs::write(&p, b"x").unwrap();
        let id = register_undo(Undo::remove_file(p.clone()));
        forget_undo(id);
        undo_now(id).unwrap();
        assert!(p.exists());
        std::fs::remove_file(&p).unwrap();
    }
}
