//! The benchmark environment: what the kernel's side of every comparison runs
//! in, set up as root and always taken down again. One module per role, this
//! one ties them together ([`BenchEnv`]) and re-exports them:
//!
//! - `cgroup`: a **memory cgroup** per run ([`Cgroup`], v2 where its memory
//!   controller is available, else v1): the kernel gets the same memory
//!   budget as upager, so its page cache and anonymous memory are reclaimed
//!   under the same pressure; the cgroup's peak charge and `memory.stat` are
//!   what the reports show.
//! - `blockdev`: a **RAM block device with ext4** ([`ZramExt4`], zram0 by
//!   default) for the data files, so storage is the same for every engine
//!   and is not the bottleneck; and who uses a device (mounts, swap).
//! - `swap`: a **swap device** ([`SwapDevice`]) for the kernel's anonymous
//!   runs: a hot-added zram device, or a loop device over a /dev/shm file.
//! - `tracing`: TLB shootdowns from the `tlb:tlb_flush` tracepoint (a
//!   tracefs instance per counter) and /proc/interrupts.
//! - `thp`: [`ThpKnobs`] to enable exactly one mTHP size for a run.
//! - `pattern`: [`create_pattern_file`] for data files whose every 8-byte
//!   word can be checked (`upager_testdata::xor_word`: `offset ^ seed`);
//!   [`drop_caches`] (here) between runs.
//!
//! Everything that changes the machine registers an undo action first (see
//! `undo`): the owning guard's `Drop` runs it, and
//! [`install_signal_cleanup`] runs every pending one on SIGINT/SIGTERM/SIGHUP
//! and exits with status 130. Set-up is idempotent: [`cleanup_stale`]
//! removes what a killed earlier run (whose pid is gone) left behind, and
//! every set-up step checks the state it finds instead of assuming a clean
//! machine.

use std::fs;
use std::path::PathBuf;

pub use crate::blockdev::ZramExt4;
pub use crate::cgroup::{
    parse_memory_stat, Cgroup, CgroupVersion, MemoryHierarchy, CGROUP_MEMORY_ROOT,
};
pub use crate::host::{
    find_tool, in_ci, is_root, ncpu, require_root, require_tools, SetupError, NAME_PREFIX,
};
pub use crate::pattern::{create_pattern_file, evict_file, verify_pattern_file};
pub use crate::swap::{SwapDevice, SwapKind};
pub use crate::thp::{mthp_fault_stats, mthp_sizes_kb, parse_sysfs_choice, ThpKnobs};
pub use crate::undo::{cleanup_all, install_signal_cleanup};

use crate::host::{is_stale_name, run_tool, write_knob_ctx, TOOL_TIMEOUT};
use crate::undo::Undo;
use crate::{blockdev, cgroup, swap, tracing};

/// `sync; echo 3 > /proc/sys/vm/drop_caches` (needs root).
pub fn drop_caches() -> Result<(), SetupError> {
    require_root("dropping the page cache")?;
    run_tool("sync", &[], TOOL_TIMEOUT)?;
    write_knob_ctx("/proc/sys/vm/drop_caches", "3", "dropping caches")
}

/// Remove what an earlier benchmark process that no longer exists left behind:
/// its swap devices, mounts, cgroups, tracefs instances and /dev/shm files
/// (names carry the creator's pid). Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    // Swap first (a swap file on a mount would keep it busy), then mounts.
    let mut done = swap::remove_stale(is_stale_name);
    done.extend(blockdev::remove_stale_mounts(is_stale_name));
    done.extend(cgroup::remove_stale(is_stale_name));
    done.extend(tracing::remove_stale(is_stale_name));
    if let Ok(rd) = fs::read_dir("/dev/shm") {
        for e in rd.flatten() {
            if is_stale_name(&e.file_name().to_string_lossy())
                && Undo::remove_file(e.path()).run().is_ok()
            {
                done.push(e.path().display().to_string());
            }
        }
    }
    done
}

/// What [`BenchEnv::setup`] should prepare.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EnvConfig {
    /// zram device for the data files (ext4), if any; `None` = no file
    /// store. A hot-added device is used instead when this one is busy.
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
    /// Check privileges, the memory cgroup hierarchy and tools, install the
    /// Ctrl-C hook, clean up what a killed earlier run left behind, then
    /// create the configured devices.
    pub fn setup(cfg: &EnvConfig) -> Result<Self, SetupError> {
        require_root("the benchmark environment (cgroup, zram, swap)")?;
        MemoryHierarchy::detect()?;
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
            .map(|i| ZramExt4::setup_or_hot_add(i, cfg.zram_bytes))
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

    /// A real cgroup in this machine's hierarchy (v1 here: the memory
    /// controller is bound to it; the v2 file logic is tested on a fake tree
    /// in `cgroup`).
    #[test]
    fn cgroup_on_this_machine() {
        if !is_root() || MemoryHierarchy::detect().is_err() {
            eprintln!("skipped: needs root and a memory cgroup hierarchy");
            return;
        }
        let cg = Cgroup::create("test", 64 << 20).unwrap();
        assert_eq!(cg.limit_bytes().unwrap(), 64 << 20);
        let stat = cg.stat().unwrap();
        assert!(stat.contains_key("pgfault"), "{stat:?}");
        assert!(cg.page_cache_bytes(&stat).is_some(), "{stat:?}");
        let path = cg.path().to_path_buf();
        drop(cg);
        assert!(!path.exists());
    }
}
