//! One error enum per operation. The doc comment of each variant is its
//! message (displaydoc); messages say what to do.

use std::io;
use std::path::PathBuf;

/// Why a [`Pager`](crate::Pager) could not be created.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum PagerError {
    /// no access to userfaultfd: opening /dev/userfaultfd failed ({device}) and userfaultfd(2) failed ({syscall}). Run as root, or give your user the device (`sudo setfacl -m u:$USER:rw /dev/userfaultfd`), or allow unprivileged use (`sudo sysctl vm.unprivileged_userfaultfd=1`). upager does not fall back to user-mode-only userfaultfd, where system calls on region memory would fail with EFAULT.
    NoUserfaultfd {
        /// Error from the device.
        device: io::Error,
        /// Error from the system call.
        syscall: io::Error,
    },
    /// the kernel's userfaultfd lacks {0}; upager needs Linux 6.16 or later
    MissingFeature(&'static str),
    /// userfaultfd handshake (UFFDIO_API) failed: {0}
    Api(#[source] io::Error),
    /// pidfd_open of this process failed: {0} (upager needs Linux 6.16 or later for batched process_madvise)
    Pidfd(#[source] io::Error),
    /// the budget must be at least one folio (4 KiB), got {0} bytes
    BudgetTooSmall(u64),
    /// the number of fault-handler threads must be 1 to 64, got {0}
    HandlerThreads(usize),
    /// the eviction batch must be 1 to 1024 folios, got {0}
    Batch(usize),
    /// readahead {0} bytes is more than the 64 MiB upager allows (each fault handler keeps a buffer of that size)
    Readahead(u64),
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
    /// budget {budget} bytes is smaller than one eviction batch ({batch} folios of {folio} bytes = {need} bytes): raise the budget or lower the batch or folio size
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
    /// offset {offset} is not a multiple of the folio size {folio}
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
    /// could not create the private swap file in {dir}: {source} (set another directory with PagerBuilder::swap_dir)
    SwapFile {
        /// Directory tried.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
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
    /// range start {offset} is not a multiple of the folio size {folio}
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_tell_what_to_do() {
        let e = PagerError::NoUserfaultfd {
            device: io::Error::from_raw_os_error(libc_eacces()),
            syscall: io::Error::from_raw_os_error(1),
        };
        let m = e.to_string();
        assert!(
            m.starts_with(
                "no access to userfaultfd: opening /dev/userfaultfd failed (Permission denied"
            ),
            "{m}"
        );
        assert!(
            m.contains("setfacl") && m.contains("vm.unprivileged_userfaultfd=1"),
            "{m}"
        );
        let m = MapError::BudgetBelowBatch {
            budget: 1 << 20,
            batch: 64,
            folio: 65536,
            need: 4 << 20,
        }
        .to_string();
        assert_eq!(
            m,
            "budget 1048576 bytes is smaller than one eviction batch (64 folios of 65536 bytes = 4194304 bytes): raise the budget or lower the batch or folio size"
        );
        let m = FlushError::Writeback(io::Error::from_raw_os_error(5)).to_string();
        assert!(
            m.starts_with("writing dirty data back to the store failed: Input/output error"),
            "{m}"
        );
    }

    fn libc_eacces() -> i32 {
        13
    }
}
