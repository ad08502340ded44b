//! What a pager found the kernel lets it use: probed once at start
//! (features, never the kernel version), logged once, and reported the same
//! on every face (Rust [`Pager::info`](crate::Pager::info), C
//! `upager_info`, Python `Pager.info()`, the CLI's demo header).

use crate::FaultMode;

/// What the kernel (and any seccomp filter) let a pager use, and how it
/// resolves faults. Field names are shared by every face.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PagerInfo {
    /// How faults are resolved.
    pub fault_mode: FaultMode,
    /// The userfaultfd is user-mode-only (an ordinary user's, or
    /// `UPAGER_USERFAULTFD=user-mode-only`): a system call that reads or
    /// writes a non-resident page of a region fails with EFAULT.
    pub user_mode_only: bool,
    /// Eviction batches are unmapped with one `process_madvise` (one TLB
    /// flush per batch); false: one `madvise` per merged range (one flush
    /// per range), where the kernel or a seccomp filter refuses it.
    pub batched_unmap: bool,
    /// Write-back may use io_uring (else `pwrite`).
    pub io_uring: bool,
    /// 2 MiB runs may enter views as huge pages (`UFFDIO_MOVE` and
    /// `PAGEMAP_SCAN`); else they are copied.
    pub uffd_move: bool,
    /// `UFFDIO_POISON` (Linux 6.6) makes an access that cannot be served
    /// raise SIGBUS (a system call EFAULT); without it, the in-thread mode
    /// raises SIGBUS all the same, and the handlers mode makes the folio
    /// inaccessible for a while: SIGSEGV for an access, EFAULT for a
    /// system call.
    pub uffd_poison: bool,
    /// The `PAGEMAP_SCAN` ioctl works.
    pub pagemap_scan: bool,
    /// Features masked by `UPAGER_MASK_FEATURES` (tests).
    pub masked: Vec<&'static str>,
}

impl PagerInfo {
    /// System calls on non-resident region memory fault the pages in
    /// (`read(fd, region, n)` works); false: they fail with EFAULT (pin or
    /// fault the range in first, or use the region's `read_at`/`write_at`).
    pub fn syscalls_fault_in(&self) -> bool {
        self.fault_mode == FaultMode::Handlers && !self.user_mode_only
    }

    /// Logs what is missing, once per process and fallback (a program may
    /// build many pagers). `unbatched` is why `process_madvise` is not used.
    pub(crate) fn log_once(&self, unbatched: Option<&std::io::Error>) {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        static USER_MODE: AtomicBool = AtomicBool::new(false);
        static UNBATCHED: AtomicBool = AtomicBool::new(false);
        static NO_MOVE: AtomicBool = AtomicBool::new(false);
        static NO_POISON: AtomicBool = AtomicBool::new(false);
        if !self.masked.is_empty() {
            log::info!(
                "kernel features masked by UPAGER_MASK_FEATURES (for tests): {}",
                self.masked.join(", ")
            );
        }
        if self.user_mode_only && !USER_MODE.swap(true, Relaxed) {
            log::warn!(
                "userfaultfd is user-mode-only here (no access to /dev/userfaultfd, or UPAGER_USERFAULTFD=user-mode-only): system calls that read or write non-resident region memory fail with EFAULT; fault mode {}",
                self.fault_mode
            );
        }
        if let Some(e) = unbatched {
            if !UNBATCHED.swap(true, Relaxed) {
                log::warn!(
                    "process_madvise(MADV_DONTNEED) on this process is refused ({e}: a kernel before 6.13 or a seccomp filter): eviction unmaps each range with its own madvise, one TLB flush per range instead of one per batch"
                );
            }
        }
        if !self.uffd_poison && !NO_POISON.swap(true, Relaxed) {
            log::warn!(
                "no UFFDIO_POISON (Linux 6.6): an access upager cannot serve gets SIGBUS in the in-thread fault mode, SIGSEGV in the handlers mode (system calls EFAULT in both)"
            );
        }
        if !self.uffd_move && !NO_MOVE.swap(true, Relaxed) {
            log::debug!(
                "UFFDIO_MOVE or PAGEMAP_SCAN unavailable: 2 MiB runs are copied into views, not moved in as huge pages"
            );
        }
    }
}
