//! Kernel features upager can do without, and masking them for tests.
//!
//! upager probes what the kernel offers when a pager starts (a feature bit
//! of `UFFDIO_API`, the errno of one harmless call), never the kernel
//! version: distribution kernels backport features, and a container's
//! seccomp profile can refuse a call the kernel has. Where a feature is
//! missing and a slower way exists, the engine takes it and says so once;
//! the table of features, first kernels and costs is in the README.
//!
//! ```text
//!   feature            first kernel   without it
//!   process_madvise    6.13 (self,    one madvise(MADV_DONTNEED) per merged
//!    (MADV_DONTNEED)    any advice)    range of an eviction batch: one TLB
//!                                      flush per range instead of per batch
//!   io_uring           5.6 / 5.18     pwrite, one write at a time
//!   uffd_move          6.8            2 MiB runs copied (UFFDIO_COPY)
//!   pagemap_scan       6.7            no huge pages moved into views
//!                                      (the move's check needs the scan)
//!   uffd_poison        6.6            handlers mode: a folio that cannot
//!                                      be served is PROT_NONE for a while
//!                                      (SIGSEGV instead of SIGBUS)
//!   kernel_faults      -              a user-mode-only userfaultfd: system
//!    (/dev/userfaultfd                 calls on non-resident region memory
//!     or privilege)                    fail with EFAULT
//! ```
//!
//! So that every fallback path runs in CI on a kernel that has all the
//! features, `UPAGER_MASK_FEATURES` (a comma-separated list of the names
//! above, or `all`) makes the wrappers of this crate behave as if the kernel
//! (or a seccomp filter) refused them. It is for tests: a user never needs
//! it. The variable is read once, by [`init`], which the engine calls when a
//! pager starts (outside any signal handler); [`masked`] is then one atomic
//! load (async-signal-safe). Before `init`, nothing is masked.

use std::sync::atomic::{AtomicU32, Ordering};

/// A kernel feature with a fallback, maskable for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Feature {
    /// `process_madvise(MADV_DONTNEED)` on this process: one TLB flush per
    /// call (Linux 6.13 allows the advice on the caller itself, 6.16
    /// batches the flush).
    ProcessMadvise = 0,
    /// io_uring for write-back.
    IoUring = 1,
    /// `UFFDIO_MOVE` (Linux 6.8).
    UffdMove = 2,
    /// The `PAGEMAP_SCAN` ioctl (Linux 6.7).
    PagemapScan = 3,
    /// A userfaultfd that serves faults raised inside system calls
    /// (`/dev/userfaultfd`, or `userfaultfd(2)` with privilege). Masked,
    /// upager opens a user-mode-only one, as an ordinary user gets.
    KernelFaults = 4,
    /// `UFFDIO_POISON` (Linux 6.6).
    UffdPoison = 5,
}

impl Feature {
    /// Every maskable feature.
    pub const ALL: [Feature; 6] = [
        Feature::ProcessMadvise,
        Feature::IoUring,
        Feature::UffdMove,
        Feature::PagemapScan,
        Feature::KernelFaults,
        Feature::UffdPoison,
    ];

    /// Its name in `UPAGER_MASK_FEATURES` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Feature::ProcessMadvise => "process_madvise",
            Feature::IoUring => "io_uring",
            Feature::UffdMove => "uffd_move",
            Feature::PagemapScan => "pagemap_scan",
            Feature::KernelFaults => "kernel_faults",
            Feature::UffdPoison => "uffd_poison",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// The environment variable that masks features (for tests).
pub const MASK_ENV: &str = "UPAGER_MASK_FEATURES";

/// Bit 31: [`init`] ran; bits 0..: masked features.
static MASK: AtomicU32 = AtomicU32::new(0);
const INITIALISED: u32 = 1 << 31;

/// Parses a mask list: names separated by commas (spaces ignored), `all`
/// for every feature. Unknown names are returned as the error.
pub fn parse_mask(list: &str) -> Result<u32, String> {
    let mut bits = 0;
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if name == "all" {
            bits |= Feature::ALL.iter().fold(0, |b, f| b | f.bit());
            continue;
        }
        match Feature::ALL.iter().find(|f| f.name() == name) {
            Some(f) => bits |= f.bit(),
            None => {
                let known: Vec<_> = Feature::ALL.iter().map(|f| f.name()).collect();
                return Err(format!(
                    "{MASK_ENV}: unknown feature {name:?} (known: {}, all)",
                    known.join(", ")
                ));
            }
        }
    }
    Ok(bits)
}

/// Reads [`MASK_ENV`] (first call only; later calls return the same
/// answer). Not async-signal-safe: call it before any fault can happen.
pub fn init() -> Result<(), String> {
    if MASK.load(Ordering::Acquire) & INITIALISED != 0 {
        return Ok(());
    }
    let bits = match std::env::var(MASK_ENV) {
        Ok(v) => parse_mask(&v)?,
        Err(_) => 0,
    };
    MASK.store(bits | INITIALISED, Ordering::Release);
    Ok(())
}

/// Whether `f` is masked by [`MASK_ENV`] (read by [`init`]).
/// Async-signal-safe.
pub fn masked(f: Feature) -> bool {
    MASK.load(Ordering::Acquire) & f.bit() != 0
}

/// The masked features' names (for messages and the pager's info).
pub fn masked_names() -> Vec<&'static str> {
    Feature::ALL
        .iter()
        .filter(|f| masked(**f))
        .map(|f| f.name())
        .collect()
}

/// The error a masked call returns: what a kernel without it (or a seccomp
/// filter refusing it) gives.
pub(crate) fn refused() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOSYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_lists_parse_and_unknown_names_are_refused() {
        assert_eq!(parse_mask(""), Ok(0));
        assert_eq!(
            parse_mask("process_madvise, io_uring"),
            Ok(Feature::ProcessMadvise.bit() | Feature::IoUring.bit())
        );
        assert_eq!(parse_mask("all"), Ok(0b11_1111));
        let e = parse_mask("process_madvise,uring").unwrap_err();
        assert!(e.contains("\"uring\"") && e.contains("io_uring"), "{e}");
    }
}
