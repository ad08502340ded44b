//! Positional I/O from mapping addresses, hole punching, poll, eventfd,
//! thread ids, CPU pinning, file-system type and free space, OFD locks.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::time::Duration;

use crate::cvt;

/// `pwrite(fd, addr, len, offset)` where `[addr, addr+len)` is memory of one
/// of the caller's mappings (e.g. a write-protected, resident folio being
/// written back). Returns bytes written (may be short).
///
/// The kernel only reads the source; an address that is not mapped gives
/// `EFAULT`, never undefined behaviour. The caller must make sure the pages
/// are present: a missing page of a userfaultfd-registered range would block
/// the calling thread until some handler resolves it.
pub fn pwrite_from(fd: impl AsFd, addr: u64, len: u64, offset: u64) -> io::Result<u64> {
    // SAFETY: the kernel only reads [addr, addr+len) with copy_from_user
    // semantics (EFAULT on a bad address); no Rust-visible memory is written.
    let r = unsafe {
        libc::pwrite(
            fd.as_fd().as_raw_fd(),
            addr as *const libc::c_void,
            len as usize,
            offset as libc::off_t,
        )
    };
    Ok(cvt(r as libc::c_long)? as u64)
}

/// `pread(fd, dst, len, offset)` into memory the caller only accesses
/// atomically (e.g. a region's atomic view): the kernel writes it the way
/// another process writing shared memory would. Returns bytes read.
pub fn pread_into(
    file: &File,
    dst: &[std::sync::atomic::AtomicU8],
    offset: u64,
) -> io::Result<usize> {
    // SAFETY: `dst` is a live slice of atomics (UnsafeCell-based, so writes
    // behind a shared reference are permitted); the kernel writes at most
    // dst.len() bytes into it, and Rust code never reads it non-atomically.
    let r = unsafe {
        libc::pread(
            file.as_raw_fd(),
            dst.as_ptr() as *mut libc::c_void,
            dst.len(),
            offset as libc::off_t,
        )
    };
    Ok(cvt(r as libc::c_long)? as usize)
}

/// Whether an open file descriptor allows reading and writing
/// (`fcntl(F_GETFL)` access mode).
pub fn access_mode(fd: impl AsFd) -> io::Result<(bool, bool)> {
    // SAFETY: F_GETFL takes no argument and returns the status flags or -1.
    let flags = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_GETFL) };
    let flags = cvt(flags.into())? as i32;
    Ok(match flags & libc::O_ACCMODE {
        libc::O_RDONLY => (true, false),
        libc::O_WRONLY => (false, true),
        _ => (true, true),
    })
}

/// The magic number of the file system holding an open file
/// (`fstatfs(2)` `f_type`, e.g. `PROC_SUPER_MAGIC`).
pub fn fs_magic(fd: impl AsFd) -> io::Result<i64> {
    // SAFETY: a zeroed statfs is a valid value for fstatfs to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one statfs into the live struct passed.
    cvt(unsafe { libc::fstatfs(fd.as_fd().as_raw_fd(), &mut st) }.into())?;
    #[allow(clippy::useless_conversion)] // i64 on x86-64, not on every target
    Ok(i64::from(st.f_type))
}

/// Bytes an unprivileged user may still write to the file system holding
/// `path` (`statvfs(2)`: `f_bavail * f_frsize`).
pub fn free_space(path: &std::path::Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed statvfs is a valid value for statvfs to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive for the call; statvfs
    // writes one statvfs into the live struct passed.
    cvt(unsafe { libc::statvfs(c.as_ptr(), &mut st) }.into())?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Frees the blocks of `[offset, offset+len)` of a file (the size is kept):
/// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`.
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate takes integers only.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    cvt(r.into())?;
    Ok(())
}

/// Waits until one of `fds` is readable, or `timeout` passes. Returns which
/// are (none after a timeout or a signal).
pub fn poll_fds<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    timeout: Duration,
) -> io::Result<[bool; N]> {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `pfds` is a live array of N pollfds the kernel reads and writes.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    match cvt(r.into()) {
        Ok(_) => Ok(pfds.map(|p| p.revents != 0)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok([false; N]),
        Err(e) => Err(e),
    }
}

/// An eventfd used to wake threads blocked in [`poll_fds`].
#[derive(Debug)]
pub struct EventFd {
    file: File,
}

impl EventFd {
    /// A non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes integers and returns a fresh fd or -1.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }.into())?;
        // SAFETY: a fresh fd owned by nobody else.
        let owned = unsafe { File::from_raw_fd(fd as i32) };
        Ok(EventFd { file: owned })
    }

    /// Makes the eventfd readable (wakes every poller; it stays readable).
    pub fn signal(&self) -> io::Result<()> {
        (&self.file).write_all(&1u64.to_ne_bytes())
    }

    /// Resets the counter (non-blocking).
    pub fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.file).read(&mut b);
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Pins the calling thread to one CPU (benchmarks and tests that need a
/// thread on each CPU to see remote TLB shootdowns).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes a bit inside `set` (it bounds-checks cpu).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) }.into())?;
    Ok(())
}

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Number of online CPUs.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The process's open-file limit (`RLIMIT_NOFILE`): `(soft, hard)`.
pub fn open_file_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live struct passed.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }.into())?;
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// The kind of an open-file-description lock ([`ofd_lock`], [`ofd_probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// Shared (`F_RDLCK`): any number of descriptions may hold it at once.
    Read,
    /// Exclusive (`F_WRLCK`).
    Write,
    /// Release (`F_UNLCK`).
    Unlock,
}

fn flock_for(kind: LockKind, start: u64, len: u64) -> io::Result<libc::flock> {
    let bad = || io::Error::from_raw_os_error(libc::EINVAL);
    let start = libc::off_t::try_from(start).map_err(|_| bad())?;
    let len = libc::off_t::try_from(len).map_err(|_| bad())?;
    // SAFETY: flock is a plain C struct of integers; all-zero is valid
    // (l_pid must be 0 for the F_OFD_* commands).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    Ok(fl)
}

/// Sets, changes or releases an open-file-description lock on the bytes
/// `[start, start+len)` of `fd`'s file (`fcntl(F_OFD_SETLKW)` when `wait`,
/// else `F_OFD_SETLK`, which fails with `EAGAIN` on a conflict).
///
/// OFD locks belong to the open file description, not to the process:
/// two descriptions of one file conflict even within one process, a `dup`
/// (or a forked child's copy) of the descriptor shares the lock, and the
/// lock goes away when the description's last descriptor closes. A wait
/// interrupted by a signal returns `EINTR`; the kernel detects no
/// deadlock for OFD locks.
pub fn ofd_lock(fd: impl AsFd, kind: LockKind, start: u64, len: u64, wait: bool) -> io::Result<()> {
    let fl = flock_for(kind, start, len)?;
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    // SAFETY: F_OFD_SETLK(W) reads one struct flock through the pointer,
    // which points to a live local; the kernel keeps no reference to it.
    let r = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), cmd, &fl as *const libc::flock) };
    cvt(r.into()).map(|_| ())
}

/// Whether a lock of `kind` on `[start, start+len)` could be placed through
/// `fd`'s open file description (`fcntl(F_OFD_GETLK)`): `None` if it could,
/// else the kind of a conflicting lock held by another description (the
/// kernel reports one; locks of `fd`'s own description never conflict).
pub fn ofd_probe(
    fd: impl AsFd,
    kind: LockKind,
    start: u64,
    len: u64,
) -> io::Result<Option<LockKind>> {
    let mut fl = flock_for(kind, start, len)?;
    // SAFETY: F_OFD_GETLK reads and overwrites one struct flock through
    // the pointer, which points to a live local of the right type.
    let r = unsafe {
        libc::fcntl(
            fd.as_fd().as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut fl as *mut libc::flock,
        )
    };
    cvt(r.into())?;
    Ok(match i32::from(fl.l_type) {
        libc::F_UNLCK => None,
        libc::F_RDLCK => Some(LockKind::Read),
        _ => Some(LockKind::Write),
    })
}

#[cfg(test)]
mod ofd_tests {
    use super::*;

    /// Two descriptions of one file: a read lock of one is seen by the
    /// other's probe, not by its own; write locks exclude each other.
    #[test]
    fn ofd_locks_conflict_between_descriptions_only() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let a = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(f.path())
            .unwrap();
        let b = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(f.path())
            .unwrap();
        let far = i64::MAX as u64 - 1;
        ofd_lock(&a, LockKind::Read, far, 1, false).unwrap();
        assert_eq!(ofd_probe(&a, LockKind::Write, far, 1).unwrap(), None);
        assert_eq!(
            ofd_probe(&b, LockKind::Write, far, 1).unwrap(),
            Some(LockKind::Read)
        );
        assert_eq!(ofd_probe(&b, LockKind::Read, far, 1).unwrap(), None);
        ofd_lock(&a, LockKind::Write, 0, 4096, true).unwrap();
        let e = ofd_lock(&b, LockKind::Write, 100, 1, false).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
            "{e}"
        );
        ofd_lock(&a, LockKind::Unlock, 0, 4096, false).unwrap();
        ofd_lock(&b, LockKind::Write, 100, 1, false).unwrap();
        drop(a);
        assert_eq!(
            ofd_probe(&b, LockKind::Write, far, 1).unwrap(),
            None,
            "closed: released"
        );
    }
}
