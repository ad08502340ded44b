//! The `O_DIRECT`/buffered descriptors of a store ([`Fds`]), shared by the
//! file store and the swap file: aligned I/O goes through an `O_DIRECT`
//! descriptor when the file system allows it, so the kernel's page cache
//! keeps no second copy outside the budget; the unaligned tail uses the
//! buffered descriptor.
//!
//! O_DIRECT refused after open. Some file systems accept `O_DIRECT` at
//! open and fail the I/O with `EINVAL` (FUSE file systems such as LazyFS;
//! `EOPNOTSUPP` is treated alike). Contract of
//! [`FileStore`](crate::FileStore) and [`SwapFile`](crate::SwapFile)
//! (their shared [`Fds`]):
//!
//! ```text
//!   I/O through the direct descriptor fails with EINVAL/EOPNOTSUPP
//!     1) mark the store's direct descriptor refused (one atomic, never cleared)
//!     2) do the same I/O again, whole, through the buffered descriptor
//!        (a write may have landed in part: rewriting the same bytes is harmless)
//!     3) every later I/O of the store goes buffered
//!     4) log once, naming the file and the refused call, outside any SIGBUS
//!        handler: at the next store call that is not in one, or at close
//! ```
//!
//! Steps 1-3 are async-signal-safe (an atomic and `pread`/`pwrite`, no
//! allocation, no lock): an in-thread fault's read falls back inside the
//! SIGBUS handler and the access goes on. Only the log waits. No access
//! ends because of the refusal: the error is returned only if the buffered
//! I/O fails too. Ordering: Relaxed everywhere, the flag only chooses
//! between two descriptors that are valid at all times, and the kernel
//! keeps direct and buffered I/O of one inode coherent.
//!
//! Uses: `store`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use upager_sys::PAGE_SIZE;

use crate::store::Src;

pub(crate) fn libc_o_direct() -> i32 {
    libc::O_DIRECT // 0o40000 on x86-64, 0o200000 on arm64: never typed by hand
}

/// Reads until `buf` is full or the file ends.
pub(crate) fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // O_DIRECT may stop at an unaligned EOF; the next read returns 0.
    }
    Ok(done)
}

/// What `/proc/self/fd` says an open file is: the path it was opened by
/// (with " (deleted)" after it once unlinked), or another name for what
/// has none (`pipe:[...]`).
pub(crate) fn fd_link(f: &File) -> Option<std::path::PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).ok()
}

/// The path of an open file (`/proc/self/fd`), for messages.
pub(crate) fn path_of(f: &File) -> String {
    fd_link(f).map_or_else(|| "(unknown path)".into(), |p| p.display().to_string())
}
/// An O_DIRECT descriptor to the same inode as `file` (through
/// /proc/self/fd), if the file system allows O_DIRECT.
pub(crate) fn reopen_direct(file: &File, writable: bool) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc_o_direct())
        .open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(file)
        ))
        .ok()
}

/// The call through the direct descriptor that a file system refused
/// (for the message).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refused {
    Read = 1,
    Write = 2,
    RingWrite = 3,
}

/// A store's descriptors to one file: the buffered one, and an `O_DIRECT`
/// one where the file system accepted the flag at open, used for aligned
/// I/O until the file system refuses an I/O on it (module doc, "O_DIRECT
/// refused after open"). Every method but [`Fds::report`] is
/// async-signal-safe.
#[derive(Debug)]
pub(crate) struct Fds {
    pub(crate) buffered: File,
    direct: Option<File>,
    /// 0 while the direct descriptor is in use; else why it is not any
    /// more: `(Refused as u32) << 16 | errno`, of the first refusal. Set
    /// once, never cleared.
    pub(crate) refused: AtomicU32,
    /// The refusal was logged (or is being logged, by one thread).
    pub(crate) logged: AtomicBool,
}

impl Fds {
    pub(crate) fn new(buffered: File, direct: Option<File>) -> Fds {
        Fds {
            buffered,
            direct,
            refused: AtomicU32::new(0),
            logged: AtomicBool::new(false),
        }
    }

    /// The direct descriptor, unless there is none or it was refused.
    pub(crate) fn direct(&self) -> Option<&File> {
        if self.refused.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.direct.as_ref()
    }

    /// The direct descriptor for `len` bytes at memory `addr` and file
    /// `offset`, if it may take them (all three page-aligned); None: the
    /// buffered one.
    pub(crate) fn pick(&self, addr: u64, len: usize, offset: u64) -> Option<&File> {
        let aligned = addr.is_multiple_of(PAGE_SIZE as u64)
            && len.is_multiple_of(PAGE_SIZE)
            && offset.is_multiple_of(PAGE_SIZE as u64);
        self.direct().filter(|_| aligned)
    }

    /// Whether `e`, the error of `call` through the direct descriptor, is
    /// the file system refusing direct I/O (EINVAL, EOPNOTSUPP); if so the
    /// direct descriptor is not used any more (the first refusal's reason
    /// is kept for the message).
    pub(crate) fn refuse(&self, e: &io::Error, call: Refused) -> bool {
        let Some(errno @ (libc::EINVAL | libc::EOPNOTSUPP)) = e.raw_os_error() else {
            return false;
        };
        let why = ((call as u32) << 16) | (errno as u32 & 0xffff);
        let _ = self
            .refused
            .compare_exchange(0, why, Ordering::Relaxed, Ordering::Relaxed);
        true
    }

    /// Reads into `buf` from `offset` until it is full or the file ends:
    /// through the direct descriptor if [`Fds::pick`] gives it, again
    /// through the buffered one if the file system refuses that.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(d) = self.pick(buf.as_ptr() as u64, buf.len(), offset) {
            match test_refusal().map_or_else(|| read_full(d, buf, offset), Err) {
                Err(e) if self.refuse(&e, Refused::Read) => {}
                res => return res,
            }
        }
        read_full(&self.buffered, buf, offset)
    }

    /// Writes all of `src` at `offset`, as [`Fds::read`] reads.
    pub(crate) fn write(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        match self.pick(src.addr(), src.len(), offset) {
            Some(d) => self.write_at(d, true, src, offset),
            None => src.write_to(&self.buffered, offset),
        }
    }

    /// Writes all of `src` at `offset` through `file` (`direct`: the
    /// direct descriptor); if the file system refuses the direct write,
    /// all of `src` again through the buffered descriptor (a part that
    /// landed is written over with the same bytes: the source is
    /// write-protected memory).
    pub(crate) fn write_at(
        &self,
        file: &File,
        direct: bool,
        src: Src<'_>,
        offset: u64,
    ) -> io::Result<()> {
        let res = match test_refusal().filter(|_| direct) {
            Some(e) => Err(e),
            None => src.write_to(file, offset),
        };
        match res {
            Err(e) if direct && self.refuse(&e, Refused::Write) => {
                src.write_to(&self.buffered, offset)
            }
            res => res,
        }
    }

    /// Logs a refusal once, naming the store (`what`, called only then)
    /// and the refused call. Not in a SIGBUS handler (no logging there):
    /// the store calls this after each I/O and when it closes, so a
    /// refusal met in a handler is logged by the next call outside one.
    pub(crate) fn report(&self, what: impl FnOnce() -> String) {
        let why = self.refused.load(Ordering::Relaxed);
        if why == 0
            || self.logged.load(Ordering::Relaxed)
            || upager_sys::signal::in_sigbus_handler()
            || self.logged.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let call = match why >> 16 {
            1 => "read",
            2 => "write",
            _ => "write (io_uring)",
        };
        let err = io::Error::from_raw_os_error((why & 0xffff) as i32);
        log::warn!(
            "{}: the file system accepted O_DIRECT at open but refused an O_DIRECT {call} ({err}): \
             this store reads and writes through the page cache from now on (the kernel may keep \
             cached copies of its data outside the budget); a pager built with \
             `direct_io(false)` (Python `direct_io=False`) skips the attempt",
            what()
        );
    }
}

#[cfg(test)]
thread_local! {
    /// Unit tests: this thread's `pread`/`pwrite` on direct descriptors
    /// fail with EINVAL, as on LazyFS (io_uring writes are not affected).
    pub(crate) static REFUSE_DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The error a unit test makes direct I/O fail with; None outside tests.
#[inline]
fn test_refusal() -> Option<io::Error> {
    #[cfg(test)]
    if REFUSE_DIRECT.with(std::cell::Cell::get) {
        return Some(io::Error::from_raw_os_error(libc::EINVAL));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors that are not a refusal of direct I/O keep the direct
    /// descriptor (a bad descriptor, an I/O error).
    #[test]
    fn only_einval_and_eopnotsupp_disable_direct_io() {
        let f = tempfile::tempfile().unwrap();
        let fds = Fds::new(f, None);
        for errno in [libc::EIO, libc::ENOSPC, libc::EBADF, libc::EINTR] {
            let e = io::Error::from_raw_os_error(errno);
            assert!(!fds.refuse(&e, Refused::Read), "{e}");
        }
        assert_eq!(fds.refused.load(Ordering::Relaxed), 0);
        let e = io::Error::from_raw_os_error(libc::EOPNOTSUPP);
        assert!(fds.refuse(&e, Refused::RingWrite));
        let e = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(fds.refuse(&e, Refused::Read));
        assert_eq!(
            fds.refused.load(Ordering::Relaxed),
            ((Refused::RingWrite as u32) << 16) | libc::EOPNOTSUPP as u32,
            "the first refusal is the one reported"
        );
    }
}
