//! RAM block devices: zram (the data store, and hot-added devices for swap),
//! loop devices over /dev/shm files, the ext4 file system the data files
//! live on, and who uses a device (mounts, swap).
//!
//! The data files live on **ext4 on zram** ([`ZramExt4`], zram0 by default),
//! so storage is the same for every engine and is not the bottleneck. zram
//! is synchronous (~4 µs per random 4 KiB read here); a loop device over
//! /dev/shm costs ~45 µs per I/O (its worker thread and wakeups), so with a
//! loop device every engine would measure the loop driver. Loop devices are
//! only the swap device's fallback (`crate::swap`).
//!
//! A device is never reset while anyone uses it: set-up checks the mount
//! table and /proc/swaps first ([`SetupError::DeviceBusy`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::host::{
    io_err, read_trim, require_root, require_tools, run_tool, unique_name, write_knob,
    write_knob_ctx, SetupError, TOOL_TIMEOUT,
};
use crate::undo::{defer_until_ok, register_undo, undo_now, Undo, UndoId, TEARDOWN_TIMEOUT};

/// Whether a file system is mounted on `dir`.
pub(crate) fn is_mounted(dir: &Path) -> bool {
    let d = dir.to_string_lossy();
    fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(1) == Some(&d)))
        .unwrap_or(false)
}

/// Where `dev` is mounted, if anywhere.
fn mount_of_device(dev: &str) -> Option<String> {
    fs::read_to_string("/proc/mounts").ok().and_then(|m| {
        m.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(dev)).then(|| f.next().unwrap_or("").to_string())
        })
    })
}

/// Whether `dev` is an active swap device (listed in /proc/swaps).
pub(crate) fn swap_active(dev: &Path) -> bool {
    let d = dev.to_string_lossy();
    fs::read_to_string("/proc/swaps")
        .map(|m| {
            m.lines()
                .skip(1)
                .any(|l| l.split_whitespace().next() == Some(&d))
        })
        .unwrap_or(false)
}

/// The file behind loop device `dev` (e.g. `/dev/loop3`), if it is one.
pub(crate) fn loop_backing_file(dev: &str) -> Option<String> {
    let name = Path::new(dev).file_name()?.to_string_lossy().into_owned();
    fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .ok()
        .map(|s| s.trim().to_string())
}

// ---------------------------------------------------------------------------
// Undo actions.

impl Undo {
    /// umount a file system (lazily if busy), then remove the mount point.
    pub(crate) fn unmount(dir: PathBuf) -> Self {
        Undo::new(format!("umount {}", dir.display()), move || {
            let d = dir.to_string_lossy();
            let r = if is_mounted(&dir) {
                // Busy (e.g. Ctrl-C while the main thread still writes a data
                // file): detach lazily; the file system goes when the last
                // file closes, at the latest when this process exits.
                run_tool("umount", &[&d], TEARDOWN_TIMEOUT)
                    .or_else(|_| run_tool("umount", &["-l", &d], TEARDOWN_TIMEOUT))
                    .map(|_| ())
            } else {
                Ok(())
            };
            let _ = fs::remove_dir(&dir);
            r.map_err(|e| e.to_string())
        })
    }

    /// `echo 1 > /sys/block/zramN/reset` (retried after exit while busy).
    pub(crate) fn reset_zram(i: u32) -> Self {
        Undo::new(format!("reset zram{i}"), move || {
            let p = format!("/sys/block/zram{i}/reset");
            match write_knob(&p, "1") {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    defer_until_ok(&format!("echo 1 > {p}"));
                    Ok(())
                }
                r => r.map_err(|e| format!("reset zram{i}: {e}")),
            }
        })
    }

    /// `echo N > /sys/class/zram-control/hot_remove` (retried after exit
    /// while busy).
    pub(crate) fn hot_remove_zram(i: u32) -> Self {
        Undo::new(format!("hot_remove zram{i}"), move || {
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
        })
    }

    /// `losetup -d`.
    pub(crate) fn detach_loop(dev: PathBuf) -> Self {
        Undo::new(format!("losetup -d {}", dev.display()), move || {
            run_tool("losetup", &["-d", &dev.to_string_lossy()], TEARDOWN_TIMEOUT)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

// ---------------------------------------------------------------------------
// zram.

/// Fail with [`SetupError::DeviceBusy`] if `/dev/zram<index>` is mounted or
/// used as swap.
pub(crate) fn zram_check_free(index: u32) -> Result<(), SetupError> {
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

/// Size a free zram device to `size_bytes` (resetting a leftover size).
pub(crate) fn zram_init(index: u32, size_bytes: u64) -> Result<(), SetupError> {
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

/// Whether zram devices can be hot-added (/sys/class/zram-control).
pub(crate) fn zram_hot_add_available() -> bool {
    Path::new("/sys/class/zram-control/hot_add").exists()
}

/// Hot-add a zram device; returns its number. The caller registers
/// [`Undo::hot_remove_zram`].
pub(crate) fn zram_hot_add() -> Result<u32, SetupError> {
    // Reading hot_add creates a device and returns its number.
    read_trim("/sys/class/zram-control/hot_add")?
        .parse()
        .map_err(|_| SetupError::Io {
            what: "parsing the zram number from hot_add".into(),
            path: "/sys/class/zram-control/hot_add".into(),
            source: io::ErrorKind::InvalidData.into(),
        })
}

/// A zram device with a fresh ext4 file system mounted on a temporary
/// directory; unmounted and reset on drop.
#[derive(Debug)]
pub struct ZramExt4 {
    index: u32,
    mount: PathBuf,
    undo_reset: UndoId,
    undo_mount: UndoId,
    /// A hot-added device's removal (after the reset), if it was hot-added.
    undo_remove: Option<UndoId>,
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
        let undo_reset = register_undo(Undo::reset_zram(index));
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
        let undo_mount = register_undo(Undo::unmount(mount.clone()));
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
            undo_remove: None,
        })
    }

    /// [`ZramExt4::setup`] on `/dev/zram<index>`; when someone else uses
    /// that device (mounted or swap: the machine may be shared) and zram
    /// devices can be hot-added, on a hot-added device instead, removed
    /// again on drop. Says on stderr which device it took.
    pub fn setup_or_hot_add(index: u32, size_bytes: u64) -> Result<Self, SetupError> {
        match zram_check_free(index) {
            Err(SetupError::DeviceBusy { device, why }) if zram_hot_add_available() => {
                require_root("hot-adding a zram device")?;
                let n = zram_hot_add()?;
                let undo_remove = register_undo(Undo::hot_remove_zram(n));
                eprintln!("upager-bench: {device} is busy ({why}): using a hot-added /dev/zram{n}");
                match Self::setup(n, size_bytes) {
                    Ok(mut z) => {
                        z.undo_remove = Some(undo_remove);
                        Ok(z)
                    }
                    Err(e) => {
                        let _ = undo_now(undo_remove);
                        Err(e)
                    }
                }
            }
            _ => Self::setup(index, size_bytes),
        }
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
        if let Some(u) = self.undo_remove {
            let _ = undo_now(u);
        }
    }
}

// ---------------------------------------------------------------------------
// Loop devices.

/// `losetup --find --show <file>`: the loop device now backed by `file`. The
/// caller registers [`Undo::detach_loop`].
pub(crate) fn loop_attach(file: &Path) -> Result<PathBuf, SetupError> {
    require_tools(&["losetup"])?;
    let out = run_tool(
        "losetup",
        &["--find", "--show", &file.to_string_lossy()],
        TOOL_TIMEOUT,
    )?;
    Ok(PathBuf::from(out.trim()))
}

/// Unmount what dead benchmark processes left mounted (mount points named
/// by [`unique_name`]) and reset their zram devices; returns what was
/// removed.
pub(crate) fn remove_stale_mounts(is_stale: impl Fn(&str) -> bool) -> Vec<String> {
    let mut done = Vec::new();
    if let Ok(mounts) = fs::read_to_string("/proc/mounts") {
        for line in mounts.lines() {
            let mut f = line.split_whitespace();
            let (Some(dev), Some(mnt)) = (f.next(), f.next()) else {
                continue;
            };
            let name = Path::new(mnt)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            if name.as_deref().is_some_and(&is_stale) {
                let _ = Undo::unmount(mnt.into()).run();
                if let Some(i) = dev.strip_prefix("/dev/zram").and_then(|i| i.parse().ok()) {
                    let _ = Undo::reset_zram(i).run();
                }
                done.push(format!("mount {mnt}"));
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::is_root;
    use crate::pattern::{create_pattern_file, verify_pattern_file};

    #[test]
    fn zram_ext4() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        if zram_check_free(0).is_err()
            || !read_trim("/sys/block/zram0/disksize").is_ok_and(|s| s == "0")
        {
            eprintln!("skipped: zram0 is in use");
            return;
        }
        let z = ZramExt4::setup(0, 64 << 20).unwrap();
        let f = z.mount_point().join("data");
        create_pattern_file(&f, 4 << 20, 7).unwrap();
        assert_eq!(verify_pattern_file(&f, 7).unwrap(), None);
        let mnt = z.mount_point().to_path_buf();
        drop(z);
        assert!(!is_mounted(&mnt));
        assert_eq!(read_trim("/sys/block/zram0/disksize").unwrap(), "0");
    }
}
