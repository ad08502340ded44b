//! One error enum per operation. The doc comment of each variant is its
//! message (displaydoc); messages say what to do.

use std::io;
use std::path::PathBuf;

/// Why a [`Pager`](crate::Pager) could not be created.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum PagerError {
    /// no usable userfaultfd: {tried}. {fix}
    NoUserfaultfd {
        /// Each way tried and its error.
        tried: String,
        /// What to do.
        fix: &'static str,
        /// The errno the C API reports.
        errno: i32,
    },
    /// the kernel's userfaultfd lacks {0} (docs/kernels.md's table of kernel features says which kernel has it)
    MissingFeature(&'static str),
    /// {0}
    Userfaultfd(String),
    /// {0}
    MaskFeatures(String),
    /// userfaultfd handshake (UFFDIO_API) failed: {0}
    Api(#[source] io::Error),
    /// the budget must be at least one folio (4096 bytes, the smallest folio size), got {0} bytes; each region also needs one eviction batch of its folios within the budget (65536 bytes with the default 64 KiB folio)
    BudgetTooSmall(u64),
    /// the number of fault-handler threads must be 1 to 64, got {0}
    HandlerThreads(usize),
    /// the userfaultfd shards must be 1 to the number of handler threads ({threads}), got {shards}
    UffdShards {
        /// Shards asked for.
        shards: usize,
        /// Handler threads.
        threads: usize,
    },
    /// the eviction batch must be 1 to 1024 folios, got {0}
    Batch(usize),
    /// the eviction batch must be 4 KiB to the budget ({budget} bytes), got {bytes} bytes
    BatchBytes {
        /// The batch asked for.
        bytes: u64,
        /// The pager's budget.
        budget: u64,
    },
    /// the dirty limit must be at least 4 KiB and at most the budget ({budget} bytes), got {limit} bytes
    DirtyLimit {
        /// The dirty limit asked for.
        limit: u64,
        /// The budget.
        budget: u64,
    },
    /// readahead {0} bytes is more than the 64 MiB upager allows (each fault handler keeps a buffer of that size)
    Readahead(u64),
    /// {0}
    FaultMode(String),
    /// {0}
    Pool(String),
    /// {0}
    Cache(String),
    /// could not install upager's SIGBUS handler for fault mode in-thread: {0}
    SignalHandler(#[source] io::Error),
    /// could not start a pager thread: {0}
    Spawn(#[source] io::Error),
    /// could not create an eventfd: {0}
    EventFd(#[source] io::Error),
}

/// Why a region could not be mapped. Nothing is left half-done on error.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// region size is 0: give a length of at least one byte
    ZeroSize,
    /// folio size {0} is not a power of two between 4 KiB and 2 MiB
    FolioSize(u64),
    /// budget {budget} bytes cannot hold one eviction batch of this region ({batch} folio(s) of {folio} bytes = {need} bytes): raise the budget to at least {need} bytes, or map with a smaller folio or batch
    BudgetBelowBatch {
        /// The pager's budget.
        budget: u64,
        /// Folios per eviction batch.
        batch: u64,
        /// This region's folio size.
        folio: u64,
        /// `batch * folio`.
        need: u64,
    },
    /// folio size {folio} is not a multiple of {unit} bytes, the unit {store} reads and writes whole: use a folio of {unit} bytes or a multiple (or leave it unset)
    FolioBelowUnit {
        /// The region's folio size.
        folio: u64,
        /// The store's unit ([`crate::Store::unit`]).
        unit: u64,
        /// The store ([`crate::Store::describe`]).
        store: String,
    },
    /// offset {offset} is not a multiple of the folio size {folio}: map from the folio boundary below it and index from there
    OffsetNotAligned {
        /// Requested file offset.
        offset: u64,
        /// Region folio size.
        folio: u64,
    },
    /// {path}: no such file (create it first, or map anonymous memory)
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// {path}: permission denied (check the file's mode and owner)
    PermissionDenied {
        /// The path given.
        path: PathBuf,
    },
    /// {path} can only be opened read-only ({source}): map it read-only, or fix its permissions
    ReadOnlyFile {
        /// The path given.
        path: PathBuf,
        /// Why opening it for writing failed.
        source: io::Error,
    },
    /// {path} is {kind}, which upager cannot page (it pages regular files and block devices): {advice}
    NotARegularFile {
        /// The path given (`<file descriptor>` for a descriptor).
        path: PathBuf,
        /// What it is.
        kind: FileKind,
        /// What to pass instead ([`FileKind::advice`]).
        advice: &'static str,
    },
    /// {path}: {source}
    Open {
        /// The path given.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// range offset {offset} + length {len} goes beyond the end of the store ({store_len} bytes): extend the file first or map a shorter range
    BeyondEnd {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Size of the file or store.
        store_len: u64,
    },
    /// the store is read-only but a writable mapping was requested
    StoreReadOnly,
    /// could not reserve {len} bytes of address space: {source}
    Mmap {
        /// Requested length.
        len: u64,
        /// The cause.
        source: io::Error,
    },
    /// userfaultfd registration failed: {0}
    Register(#[source] io::Error),
    /// {limit} ({source}): {advice}
    Limit {
        /// Which limit was hit, with its value.
        limit: String,
        /// What to do about it.
        advice: &'static str,
        /// The error the system call returned (EMFILE, ENFILE, ENOMEM).
        source: io::Error,
    },
    /// could not create the private swap file in {dir}: {source} (choose another directory with the pager's swap_dir option)
    SwapFile {
        /// Directory tried.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// anonymous memory has no file offset: leave the offset at 0 (got {0})
    AnonymousOffset(u64),
    /// fixed address {addr:#x} is not a multiple of the folio size {folio}: align it, or use a smaller folio
    FixedUnaligned {
        /// The address given.
        addr: u64,
        /// Region folio size.
        folio: u64,
    },
    /// the fixed range of {given} bytes at {addr:#x} is smaller than the region ({need} bytes: its length rounded up to the folio size)
    FixedTooSmall {
        /// The address given.
        addr: u64,
        /// Length of the range given.
        given: u64,
        /// Bytes the region needs.
        need: u64,
    },
    /// could not map the region at the fixed address {addr:#x}: {source}
    Fixed {
        /// The address given.
        addr: u64,
        /// The cause.
        source: io::Error,
    },
}

/// A kind of file upager refuses to map ([`MapError::NotARegularFile`]):
/// none has a fixed size and data at stable offsets, so a mapping would
/// either fail at the first access (SIGBUS) or show a made-up length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, displaydoc::Display)]
#[non_exhaustive]
pub enum FileKind {
    /// a directory
    Directory,
    /// a FIFO (named pipe)
    Fifo,
    /// a socket
    Socket,
    /// a character device
    CharDevice,
    /// a pseudo-file of a kernel file system (/proc, /sys: its size says nothing of its content, made up on each read)
    PseudoFile,
}

impl FileKind {
    /// What to pass instead.
    pub fn advice(self) -> &'static str {
        match self {
            FileKind::Directory => "pass the path of a file inside it",
            FileKind::Fifo | FileKind::Socket => {
                "a stream has no offsets to page; copy its data into a regular file and map that"
            }
            FileKind::CharDevice => {
                "pass a regular file or a block device (for memory that starts as zeros, map anonymous memory)"
            }
            FileKind::PseudoFile => {
                "copy it into a regular file (`cat FILE > copy`) and map the copy"
            }
        }
    }

    /// The errno the C and Python faces report: EISDIR for a directory
    /// (Python: IsADirectoryError), ENODEV for the others (what mmap(2)
    /// returns for a file it cannot map).
    pub fn errno(self) -> i32 {
        match self {
            FileKind::Directory => errno::EISDIR,
            _ => errno::ENODEV,
        }
    }
}

/// Why `flush()` failed. Dirty data that could not be written stays resident
/// and dirty; a later flush retries it.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// writing dirty data back to the store failed: {0} (the data is still in memory; flush again once the store is fixed)
    Writeback(#[source] io::Error),
    /// making the store durable (fdatasync) failed: {0}
    Sync(#[source] io::Error),
}

/// Why `unmap()` failed; the region is handed back intact.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum UnmapError {
    /// could not write the region's dirty data back before unmapping: {0}
    Flush(#[source] FlushError),
}

/// Why a range argument was refused.
#[derive(Debug, displaydoc::Display, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RangeError {
    /// empty range: give a length of at least one byte
    Empty,
    /// range {offset}+{len} is outside the region of {region_len} bytes
    OutOfRegion {
        /// Start offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Region length.
        region_len: u64,
    },
    /// range start {offset} is not a multiple of {folio} bytes, the alignment this call needs (4096 for residency and mincore, the region's folio size for pageout and discard)
    Unaligned {
        /// Start offset.
        offset: u64,
        /// Folio size.
        folio: u64,
    },
}

/// Why `pageout`/`discard` failed.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum AdviseError {
    /// {0}
    Range(#[from] RangeError),
    /// writing dirty data back failed: {0} (the data is still in memory)
    Writeback(#[source] io::Error),
    /// the region is read-only or its store cannot drop data: {0}
    Unsupported(&'static str),
    /// the folio at offset {offset} cannot be made resident: its store read failed or its store refuses writes (an access there raises SIGBUS; see the log)
    Unfilled {
        /// Offset of the folio in the region.
        offset: u64,
    },
    /// pinning {want} more bytes would pin more than half the budget ({pinned} of {budget} bytes pinned already): unpin first, or raise the budget
    PinLimit {
        /// Bytes the pin would add.
        want: u64,
        /// Bytes pinned now.
        pinned: u64,
        /// The budget.
        budget: u64,
    },
    /// the folio at offset {offset} is not pinned: nothing was unpinned
    NotPinned {
        /// Offset of the folio in the region.
        offset: u64,
    },
}

/// The errno a C or Python face reports for an error (Linux numbering):
/// EINVAL for bad arguments, the underlying OS error where there is one.
/// One mapping for every face, so C's negative errno and Python's exception
/// class agree.
pub trait ErrorCode: std::error::Error {
    /// The errno value (positive).
    fn errno(&self) -> i32;
}

/// Linux errno values used by [`ErrorCode`] (from `libc`, so they hold on
/// every architecture).
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = libc::EPERM;
    /// No such file or directory.
    pub const ENOENT: i32 = libc::ENOENT;
    /// I/O error.
    pub const EIO: i32 = libc::EIO;
    /// Out of memory (or address space).
    pub const ENOMEM: i32 = libc::ENOMEM;
    /// Bad address (memory that cannot be made resident).
    pub const EFAULT: i32 = libc::EFAULT;
    /// Permission denied.
    pub const EACCES: i32 = libc::EACCES;
    /// Invalid argument.
    pub const EINVAL: i32 = libc::EINVAL;
    /// Too many open files in the system.
    pub const ENFILE: i32 = libc::ENFILE;
    /// Too many open files in this process.
    pub const EMFILE: i32 = libc::EMFILE;
    /// No space left on device.
    pub const ENOSPC: i32 = libc::ENOSPC;
    /// Function not implemented.
    pub const ENOSYS: i32 = libc::ENOSYS;
    /// Is a directory.
    pub const EISDIR: i32 = libc::EISDIR;
    /// No such device (a file type that cannot be mapped).
    pub const ENODEV: i32 = libc::ENODEV;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = libc::EOPNOTSUPP;
}

/// The limit behind `e`, if it is one (EMFILE, ENFILE, or ENOMEM from mmap
/// with the memory-map count at `vm.max_map_count`), as a [`MapError`] that
/// names it and says what to do.
pub(crate) fn limit_error(e: &io::Error) -> Option<MapError> {
    let copy = || io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(errno::EIO));
    match e.raw_os_error()? {
        errno::EMFILE => {
            let limit = match upager_sys::io::open_file_limit() {
                Ok((soft, _)) => {
                    format!("the process's open-file limit (RLIMIT_NOFILE = {soft}) is reached")
                }
                Err(_) => "the process's open-file limit (RLIMIT_NOFILE) is reached".to_string(),
            };
            Some(MapError::Limit {
                limit,
                advice: "upager keeps two descriptors per distinct mapped file and two per folio size for anonymous regions' swap; close files, map fewer distinct files, or raise the limit (`ulimit -n`)",
                source: copy(),
            })
        }
        errno::ENFILE => Some(MapError::Limit {
            limit: "the system's open-file table is full (fs.file-max)".to_string(),
            advice: "close files, or raise the system limit (`sysctl fs.file-max=...`)",
            source: copy(),
        }),
        errno::ENOMEM => {
            let max: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count")
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let now = std::fs::read_to_string("/proc/self/maps")
                .ok()?
                .lines()
                .count() as u64;
            // Within a few mappings of the limit: that is why mmap failed.
            (now + 8 >= max).then(|| MapError::Limit {
                limit: format!("the process has {now} memory mappings, at the limit vm.max_map_count = {max}"),
                advice: "unmap regions or other mappings, or raise the limit (`sysctl vm.max_map_count=...`)",
                source: copy(),
            })
        }
        _ => None,
    }
}

/// The error for a userfaultfd that could not be opened (`f` says how each
/// way tried failed), with the fix that applies.
pub(crate) fn no_userfaultfd(f: upager_sys::uffd::OpenFailure) -> PagerError {
    let mut tried = Vec::new();
    if let Some(e) = &f.device {
        tried.push(format!("opening /dev/userfaultfd failed ({e})"));
    }
    if let Some(e) = &f.syscall {
        tried.push(format!("userfaultfd(2) failed ({e})"));
    }
    if let Some(e) = &f.user_mode {
        tried.push(format!("user-mode-only userfaultfd(2) failed ({e})"));
    }
    let code = |e: &Option<io::Error>| e.as_ref().and_then(io::Error::raw_os_error);
    let (fix, errno) = match code(&f.user_mode) {
        // Not tried: only one that serves system calls was allowed.
        None => (
            "UPAGER_USERFAULTFD=kernel-faults (or the builder's Userfaultfd::KernelFaults) asks for one that serves system calls: run as root, or give your user the device (`sudo setfacl -m u:$USER:rw /dev/userfaultfd`), or allow unprivileged use (`sudo sysctl vm.unprivileged_userfaultfd=1`); or leave the choice to upager (`auto`), which runs with a user-mode-only userfaultfd where that is all it may have",
            match code(&f.device) {
                Some(errno::ENOENT) | None => errno::EPERM,
                Some(n) => n,
            },
        ),
        // The kernel predates UFFD_USER_MODE_ONLY.
        Some(errno::EINVAL) => (
            "this kernel allows userfaultfd to ordinary users only from Linux 5.11 on: run as root, or give your user the device (`sudo setfacl -m u:$USER:rw /dev/userfaultfd`), or allow unprivileged use (`sudo sysctl vm.unprivileged_userfaultfd=1`)",
            errno::EPERM,
        ),
        // The kernel allows a user-mode-only userfaultfd to every process:
        // refused, it is a seccomp filter (or a kernel built without it).
        Some(n) => (
            "Linux (5.11 and later) allows a user-mode-only userfaultfd to every process, so a seccomp filter refuses userfaultfd(2) here, as the default profiles of Docker, Podman and Kubernetes' RuntimeDefault do (or the kernel was built without CONFIG_USERFAULTFD). In a container, run it with a seccomp profile that allows userfaultfd: `python3 scripts/seccomp-profile.py` writes one from your runtime's default, then `docker run --security-opt seccomp=upager-seccomp.json ...`; docs/containers.md has the details for Docker, Podman and Kubernetes",
            n,
        ),
    };
    PagerError::NoUserfaultfd {
        tried: tried.join(", "),
        fix,
        errno,
    }
}

fn io_errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(errno::EIO)
}

impl ErrorCode for PagerError {
    fn errno(&self) -> i32 {
        match self {
            PagerError::NoUserfaultfd { errno, .. } => *errno,
            PagerError::MissingFeature(_) => errno::ENOSYS,
            PagerError::Userfaultfd(_) | PagerError::MaskFeatures(_) => errno::EINVAL,
            PagerError::BudgetTooSmall(_)
            | PagerError::HandlerThreads(_)
            | PagerError::UffdShards { .. }
            | PagerError::Batch(_)
            | PagerError::BatchBytes { .. }
            | PagerError::DirtyLimit { .. }
            | PagerError::Readahead(_)
            | PagerError::FaultMode(_)
            | PagerError::Pool(_)
            | PagerError::Cache(_) => errno::EINVAL,
            PagerError::Api(s)
            | PagerError::Spawn(s)
            | PagerError::EventFd(s)
            | PagerError::SignalHandler(s) => io_errno(s),
        }
    }
}

impl ErrorCode for MapError {
    fn errno(&self) -> i32 {
        match self {
            MapError::ZeroSize
            | MapError::FolioSize(_)
            | MapError::FolioBelowUnit { .. }
            | MapError::BudgetBelowBatch { .. }
            | MapError::OffsetNotAligned { .. }
            | MapError::AnonymousOffset(_)
            | MapError::BeyondEnd { .. }
            | MapError::FixedUnaligned { .. }
            | MapError::FixedTooSmall { .. } => errno::EINVAL,
            MapError::NotFound { .. } => errno::ENOENT,
            MapError::NotARegularFile { kind, .. } => kind.errno(),
            // A read-only file or descriptor mapped for writing: mmap(2)
            // says EACCES too.
            MapError::PermissionDenied { .. }
            | MapError::ReadOnlyFile { .. }
            | MapError::StoreReadOnly => errno::EACCES,
            MapError::Open { source, .. }
            | MapError::SwapFile { source, .. }
            | MapError::Limit { source, .. }
            | MapError::Fixed { source, .. } => io_errno(source),
            MapError::Mmap { .. } => errno::ENOMEM,
            MapError::Register(s) => io_errno(s),
        }
    }
}

impl ErrorCode for FlushError {
    fn errno(&self) -> i32 {
        match self {
            FlushError::Writeback(s) | FlushError::Sync(s) => io_errno(s),
        }
    }
}

impl ErrorCode for UnmapError {
    fn errno(&self) -> i32 {
        match self {
            UnmapError::Flush(f) => f.errno(),
        }
    }
}

impl ErrorCode for RangeError {
    fn errno(&self) -> i32 {
        errno::EINVAL
    }
}

impl ErrorCode for AdviseError {
    fn errno(&self) -> i32 {
        match self {
            AdviseError::Range(_) => errno::EINVAL,
            AdviseError::Writeback(s) => io_errno(s),
            AdviseError::Unsupported(_) => errno::EOPNOTSUPP,
            AdviseError::Unfilled { .. } => errno::EFAULT,
            AdviseError::PinLimit { .. } => errno::ENOMEM,
            AdviseError::NotPinned { .. } => errno::EINVAL,
        }
    }
}

/// An error and its causes as one line ("a: b: c"), skipping causes the
/// message already quotes (displaydoc messages embed their `{0}`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_tell_what_to_do() {
        // Asked for one that serves system calls, and not allowed it.
        let e = no_userfaultfd(upager_sys::uffd::OpenFailure {
            device: Some(io::Error::from_raw_os_error(libc_eacces())),
            syscall: Some(io::Error::from_raw_os_error(1)),
            user_mode: None,
        });
        let m = e.to_string();
        assert!(
            m.starts_with(
                "no usable userfaultfd: opening /dev/userfaultfd failed (Permission denied"
            ),
            "{m}"
        );
        assert!(
            m.contains("setfacl")
                && m.contains("vm.unprivileged_userfaultfd=1")
                && m.contains("UPAGER_USERFAULTFD"),
            "{m}"
        );
        assert_eq!(e.errno(), errno::EACCES);
        // Refused in every form: a seccomp filter (containers).
        let e = no_userfaultfd(upager_sys::uffd::OpenFailure {
            device: Some(io::Error::from_raw_os_error(errno::ENOENT)),
            syscall: Some(io::Error::from_raw_os_error(errno::EPERM)),
            user_mode: Some(io::Error::from_raw_os_error(errno::EPERM)),
        });
        let m = e.to_string();
        assert!(
            m.contains("user-mode-only userfaultfd(2) failed (Operation not permitted")
                && m.contains("seccomp")
                && m.contains("docs/containers.md"),
            "{m}"
        );
        // A kernel before 5.11 does not know UFFD_USER_MODE_ONLY.
        let m = no_userfaultfd(upager_sys::uffd::OpenFailure {
            device: Some(io::Error::from_raw_os_error(errno::ENOENT)),
            syscall: Some(io::Error::from_raw_os_error(errno::EPERM)),
            user_mode: Some(io::Error::from_raw_os_error(errno::EINVAL)),
        })
        .to_string();
        assert!(m.contains("Linux 5.11") && m.contains("setfacl"), "{m}");
        let m = MapError::BudgetBelowBatch {
            budget: 1 << 20,
            batch: 64,
            folio: 65536,
            need: 4 << 20,
        }
        .to_string();
        assert_eq!(
            m,
            "budget 1048576 bytes cannot hold one eviction batch of this region (64 folio(s) of 65536 bytes = 4194304 bytes): raise the budget to at least 4194304 bytes, or map with a smaller folio or batch"
        );
        let m = FlushError::Writeback(io::Error::from_raw_os_error(5)).to_string();
        assert!(
            m.starts_with("writing dirty data back to the store failed: Input/output error"),
            "{m}"
        );
    }

    fn libc_eacces() -> i32 {
        errno::EACCES
    }

    #[test]
    fn every_face_gets_the_same_errno_and_chain() {
        assert_eq!(MapError::ZeroSize.errno(), errno::EINVAL);
        assert_eq!(
            MapError::NotFound { path: "x".into() }.errno(),
            errno::ENOENT
        );
        let f = FlushError::Writeback(io::Error::from_raw_os_error(28));
        assert_eq!(f.errno(), 28);
        assert_eq!(UnmapError::Flush(f).errno(), 28);
        let e = no_userfaultfd(upager_sys::uffd::OpenFailure {
            device: Some(io::Error::from_raw_os_error(errno::ENOENT)),
            syscall: Some(io::Error::from_raw_os_error(errno::EPERM)),
            user_mode: None,
        });
        assert_eq!(e.errno(), errno::EPERM);
        let c = error_chain(&UnmapError::Flush(FlushError::Sync(
            io::Error::from_raw_os_error(5),
        )));
        assert_eq!(c, "could not write the region's dirty data back before unmapping: making the store durable (fdatasync) failed: Input/output error (os error 5)");
    }
}
