//! The swap device of the kernel's anonymous runs: a second, hot-added zram
//! device (the file scenarios use zram0), or a loop device over a /dev/shm
//! file where zram cannot be hot-added. Swapped off and removed on drop.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::blockdev::{
    loop_attach, loop_backing_file, swap_active, zram_hot_add, zram_hot_add_available, zram_init,
};
use crate::host::{
    io_err, require_root, require_tools, run_tool, unique_name, SetupError, TOOL_TIMEOUT,
};
use crate::undo::{register_undo, undo_now, Undo, UndoId};

/// Which RAM device carries the kernel's swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SwapKind {
    /// A zram device hot-added for the run (removed afterwards).
    ZramHotAdd,
    /// A loop device over a sparse /dev/shm file.
    LoopShm,
}

impl Undo {
    /// swapoff a device (if it is still swap).
    pub(crate) fn swapoff(dev: PathBuf) -> Self {
        Undo::new(format!("swapoff {}", dev.display()), move || {
            if swap_active(&dev) {
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
        })
    }
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
        let kind = if kind == SwapKind::ZramHotAdd && !zram_hot_add_available() {
            SwapKind::LoopShm
        } else {
            kind
        };
        let device = match kind {
            SwapKind::ZramHotAdd => {
                let n = zram_hot_add()?;
                undos.push(register_undo(Undo::hot_remove_zram(n)));
                if let Err(e) = zram_init(n, size_bytes) {
                    cleanup(&mut undos);
                    return Err(e);
                }
                undos.push(register_undo(Undo::reset_zram(n)));
                PathBuf::from(format!("/dev/zram{n}"))
            }
            SwapKind::LoopShm => {
                require_tools(&["losetup"])?;
                let file = Path::new("/dev/shm").join(format!("{}.swap", unique_name("swap")));
                undos.push(register_undo(Undo::remove_file(file.clone())));
                let r = File::create(&file)
                    .and_then(|f| f.set_len(size_bytes))
                    .map_err(io_err("creating the swap file", &file));
                if let Err(e) = r {
                    cleanup(&mut undos);
                    return Err(e);
                }
                match loop_attach(&file) {
                    Ok(dev) => {
                        undos.push(register_undo(Undo::detach_loop(dev.clone())));
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
        undos.push(register_undo(Undo::swapoff(device.clone())));
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

/// Swap off and remove the loop-backed swap files that dead benchmark
/// processes left active; returns what was removed.
pub(crate) fn remove_stale(is_stale: impl Fn(&str) -> bool) -> Vec<String> {
    let mut done = Vec::new();
    let Ok(swaps) = fs::read_to_string("/proc/swaps") else {
        return done;
    };
    for line in swaps.lines().skip(1) {
        let Some(dev) = line.split_whitespace().next() else {
            continue;
        };
        if let Some(backing) = loop_backing_file(dev) {
            let name = Path::new(&backing)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            if name.as_deref().is_some_and(&is_stale) {
                let _ = Undo::swapoff(dev.into()).run();
                let _ = Undo::detach_loop(dev.into()).run();
                let _ = Undo::remove_file(backing.into()).run();
                done.push(format!("swap {dev}"));
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::is_root;

    #[test]
    fn loop_swap() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let s = SwapDevice::setup(SwapKind::LoopShm, 32 << 20).unwrap();
        let dev = s.device().to_path_buf();
        assert!(swap_active(&dev));
        drop(s);
        assert!(!swap_active(&dev));
    }
}
