//! Thin wrappers for every syscall and ioctl upager uses.
//!
//! This crate is the only place in upager with `unsafe` code. Each wrapper
//! takes plain Rust values, returns `io::Result` (errno kept open-ended), and
//! states in a `// SAFETY:` comment why the call cannot violate memory safety.
//! The engine (`upager`) above it is safe Rust.
//!
//! Kernels: the engine probes features, not versions ([`features`]: what
//! each costs where it is missing, and how tests mask it); the oldest kernel
//! it runs on is stated in the README's feature table. The system's uapi
//! headers may be older than the kernel (Debian 12 ships 6.1), so the newer
//! ioctl numbers are computed here and the structs come from
//! `linux-raw-sys`.
//!
//! Modules:
//! - [`features`]: kernel features with a fallback, masked for tests by
//!   `UPAGER_MASK_FEATURES`.
//! - [`uffd`]: userfaultfd — open, register, resolve (COPY, WRITEPROTECT,
//!   POISON, WAKE), read fault messages.
//! - [`mem`]: anonymous mappings, `madvise`, one-call batched
//!   `process_madvise`, `mincore`, page-aligned buffers, zeroed atomic tables.
//! - [`io`]: positional I/O from raw mapping addresses, hole punching, poll,
//!   eventfd, thread ids and CPU pinning, open-file-description byte-range
//!   locks (`F_OFD_SETLK(W)`, `F_OFD_GETLK`).
//! - [`pagemap`]: `/proc/self/pagemap` and the `PAGEMAP_SCAN` ioctl.
//! - [`fork`]: `pthread_atfork` handlers (regions rebuilt in a fork child).
//! - [`futex`]: futex wait/wake on atomics (async-signal-safe waits).
//! - [`signal`]: the process's SIGBUS handler for in-thread faults.
//! - [`snapshot`]: a value readable from a signal handler while replaced.
//! - [`term`]: SIGINT/SIGTERM/SIGHUP blocked and waited for (clean-up on
//!   Ctrl-C without a signal handler).
//! - [`uring`]: io_uring for write-back, the writes of one batch submitted
//!   and waited for together.
//! - [`inject`]: kernel-call failures on demand for tests (feature
//!   `fail-inject`; nothing without it).

pub mod features;
pub mod fork;
pub mod futex;
pub mod inject;
pub mod io;
pub mod mem;
pub mod pagemap;
pub mod seccomp;
pub mod signal;
pub mod snapshot;
pub mod term;
pub mod uffd;
pub mod uring;

/// Size of a base page on the architectures upager supports (x86-64, arm64
/// with 4 KiB pages).
pub const PAGE_SIZE: usize = 4096;

/// `_IOC(dir, type, nr, size)` of `include/uapi/asm-generic/ioctl.h`.
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}
const IOC_NONE: u32 = 0;
const IOC_READ_WRITE: u32 = 3;

/// The last OS error, as an `io::Error`.
fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Converts a `-1 on error` return value to `io::Result`.
fn cvt(ret: libc::c_long) -> std::io::Result<libc::c_long> {
    if ret < 0 {
        Err(last_err())
    } else {
        Ok(ret)
    }
}
