//! userfaultfd: open, API handshake, register, resolve, read messages.
//!
//! Every resolving ioctl takes a range the caller owns inside a mapping it
//! registered; the kernel validates the range against the registered VMAs and
//! fails with an errno otherwise, so none of these calls can touch memory that
//! Rust code holds a reference to (the destination is region memory, which
//! the engine never lends out as `&mut`).
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use linux_raw_sys::general as k;
use linux_raw_sys::ioctl as kio;

use crate::mem::MapRange;
use crate::{cvt, ioc, last_err, IOC_NONE, IOC_READ_WRITE};

const UFFDIO: u32 = 0xAA;
/// `USERFAULTFD_IOC_NEW` (`_IO(0xAA, 0x00)`, Linux 6.1): a new userfaultfd
/// from `/dev/userfaultfd`, which is allowed to handle kernel-mode faults.
const USERFAULTFD_IOC_NEW: u32 = ioc(IOC_NONE, UFFDIO, 0x00, 0);
/// `UFFDIO_POISON` (Linux 6.6), missing from 6.1 headers.
const UFFDIO_POISON: u32 = ioc(
    IOC_READ_WRITE,
    UFFDIO,
    k::_UFFDIO_POISON,
    size_of::<k::uffdio_poison>(),
);
/// `UFFDIO_MOVE` (Linux 6.8), missing from 6.1 headers.
const UFFDIO_MOVE: u32 = ioc(
    IOC_READ_WRITE,
    UFFDIO,
    k::_UFFDIO_MOVE,
    size_of::<k::uffdio_move>(),
);
/// `UFFDIO_MOVE_MODE_DONTWAKE`: not exported by linux-raw-sys 0.12 (its
/// bindgen drops the uapi's `((__u64)1<<0)` macros) nor by libc; the uapi
/// gives it the bit of `UFFDIO_COPY_MODE_DONTWAKE`, which is exported.
const UFFDIO_MOVE_MODE_DONTWAKE: u64 = k::UFFDIO_COPY_MODE_DONTWAKE as u64;

/// `UFFDIO_WRITEPROTECT_MODE_WP` (not exported by linux-raw-sys).
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`.
const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

/// Feature bits upager asks for (see `UFFDIO_API`).
pub mod feature {
    use linux_raw_sys::general as k;
    /// Report the faulting thread's tid in each message.
    pub const THREAD_ID: u64 = k::UFFD_FEATURE_THREAD_ID as u64;
    /// Write-protect faults on anonymous memory.
    pub const PAGEFAULT_FLAG_WP: u64 = k::UFFD_FEATURE_PAGEFAULT_FLAG_WP as u64;
    /// `UFFDIO_POISON`: a range that raises SIGBUS when touched.
    pub const POISON: u64 = k::UFFD_FEATURE_POISON as u64;
    /// `UFFDIO_MOVE`.
    pub const MOVE: u64 = k::UFFD_FEATURE_MOVE as u64;
    /// Faults raise SIGBUS in the faulting thread instead of queueing a
    /// message (in-thread resolution).
    pub const SIGBUS: u64 = k::UFFD_FEATURE_SIGBUS as u64;
    /// Write-protect-async mode (no fault, PAGEMAP_SCAN reports written pages).
    pub const WP_ASYNC: u64 = k::UFFD_FEATURE_WP_ASYNC as u64;
}

/// Which userfaultfds [`Uffd::open`] may open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenPolicy {
    /// One that serves faults raised inside system calls if the process may
    /// have one, else a user-mode-only one (what an ordinary user gets).
    #[default]
    Auto,
    /// Only one that serves faults raised inside system calls.
    KernelFaults,
    /// Only a user-mode-only one (`UFFD_USER_MODE_ONLY`), even where more is
    /// allowed: the same behaviour on every machine.
    UserModeOnly,
}

/// Why a userfaultfd could not be opened: every way the policy allows was
/// tried (`None`: not tried).
#[derive(Debug)]
pub struct OpenFailure {
    /// `open("/dev/userfaultfd")` or its `USERFAULTFD_IOC_NEW` ioctl.
    pub device: Option<io::Error>,
    /// `userfaultfd(2)` without `UFFD_USER_MODE_ONLY`.
    pub syscall: Option<io::Error>,
    /// `userfaultfd(2)` with `UFFD_USER_MODE_ONLY`.
    pub user_mode: Option<io::Error>,
}

/// A userfaultfd file descriptor, non-blocking and close-on-exec.
#[derive(Debug)]
pub struct Uffd {
    fd: File,
    /// Opened with `UFFD_USER_MODE_ONLY`: faults raised inside system calls
    /// are not delivered (the call fails with `EFAULT`).
    user_mode_only: bool,
}

/// Outcome of a resolving ioctl that may stop part-way.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// The whole range was filled (and waiters woken unless DONTWAKE).
    Done,
    /// `EEXIST`: a page in the range is already mapped; `done` bytes before it
    /// were filled.
    Exists {
        /// Bytes filled before the mapped page.
        done: u64,
    },
    /// `EAGAIN`: the address space changed under the call; `done` bytes were
    /// filled, retry the rest.
    Retry {
        /// Bytes filled before the call stopped.
        done: u64,
    },
}

/// One message read from a userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A page fault on a registered range.
    PageFault {
        /// Faulting address (not rounded).
        addr: u64,
        /// The access was a write.
        write: bool,
        /// Write-protect fault (the page is present but write-protected).
        wp: bool,
        /// Faulting thread id (with [`feature::THREAD_ID`]).
        tid: u32,
    },
    /// Any other event (fork, remap, remove, unmap), by its event number.
    Other(u8),
}

/// Size of one `struct uffd_msg`.
pub const MSG_SIZE: usize = size_of::<k::uffd_msg>();

impl Msg {
    /// Parses one 32-byte `struct uffd_msg` (layout of
    /// `include/uapi/linux/userfaultfd.h`).
    pub fn parse(raw: &[u8]) -> Msg {
        debug_assert_eq!(raw.len(), MSG_SIZE);
        let event = raw[0];
        if u32::from(event) != k::UFFD_EVENT_PAGEFAULT {
            return Msg::Other(event);
        }
        let u64_at = |o: usize| u64::from_ne_bytes(raw[o..o + 8].try_into().expect("8 bytes"));
        let flags = u64_at(8);
        Msg::PageFault {
            addr: u64_at(16),
            write: flags & u64::from(k::UFFD_PAGEFAULT_FLAG_WRITE) != 0,
            wp: flags & u64::from(k::UFFD_PAGEFAULT_FLAG_WP) != 0,
            tid: u32::from_ne_bytes(raw[24..28].try_into().expect("4 bytes")),
        }
    }
}

impl Uffd {
    /// Opens a userfaultfd as `policy` allows, non-blocking and
    /// close-on-exec. One that can serve faults raised inside the kernel
    /// (e.g. `read(fd, region, n)`) is tried first: through
    /// `/dev/userfaultfd` (its permissions decide), then `userfaultfd(2)`
    /// (which needs `CAP_SYS_PTRACE` or `vm.unprivileged_userfaultfd = 1`).
    /// Then, unless the policy forbids it, a user-mode-only one, which the
    /// kernel gives every process (Linux 5.11): faults raised inside system
    /// calls then fail the call with `EFAULT`. [`Uffd::user_mode_only`]
    /// says which was opened. The masked feature
    /// [`KernelFaults`](crate::features::Feature::KernelFaults) skips the
    /// first two, as an ordinary user's process sees them.
    pub fn open(policy: OpenPolicy) -> Result<Uffd, OpenFailure> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let mut why = OpenFailure {
            device: None,
            syscall: None,
            user_mode: None,
        };
        let kernel = policy != OpenPolicy::UserModeOnly;
        if kernel && crate::features::masked(crate::features::Feature::KernelFaults) {
            why.device = Some(crate::features::refused());
            why.syscall = Some(crate::features::refused());
        } else if kernel {
            match Self::open_device(flags) {
                Ok(u) => return Ok(u),
                Err(e) => why.device = Some(e),
            }
            match Self::open_syscall(flags, false) {
                Ok(u) => return Ok(u),
                Err(e) => why.syscall = Some(e),
            }
        }
        if policy != OpenPolicy::KernelFaults {
            match Self::open_syscall(flags, true) {
                Ok(u) => return Ok(u),
                Err(e) => why.user_mode = Some(e),
            }
        }
        Err(why)
    }

    /// A userfaultfd from `/dev/userfaultfd` (`USERFAULTFD_IOC_NEW`, 6.1).
    fn open_device(flags: i32) -> io::Result<Uffd> {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/userfaultfd")?;
        // SAFETY: USERFAULTFD_IOC_NEW takes its flags by value and returns
        // a new fd or -1; no memory is passed.
        let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
        if fd < 0 {
            return Err(last_err());
        }
        // SAFETY: the ioctl returned a fresh fd that nothing else owns.
        let owned = unsafe { File::from_raw_fd(fd) };
        Ok(Uffd {
            fd: owned,
            user_mode_only: false,
        })
    }

    /// `userfaultfd(2)`, with `UFFD_USER_MODE_ONLY` if `user_mode_only`.
    fn open_syscall(flags: i32, user_mode_only: bool) -> io::Result<Uffd> {
        let flags = if user_mode_only {
            flags | k::UFFD_USER_MODE_ONLY as i32
        } else {
            flags
        };
        // SAFETY: userfaultfd(2) takes flags by value and returns an fd or -1.
        let fd = cvt(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
        // SAFETY: a fresh fd that nothing else owns.
        let owned = unsafe { File::from_raw_fd(fd as i32) };
        Ok(Uffd {
            fd: owned,
            user_mode_only,
        })
    }

    /// Opened with `UFFD_USER_MODE_ONLY`: a fault raised inside a system
    /// call on a non-resident page of a registered range fails that call
    /// with `EFAULT` instead of being delivered.
    pub fn user_mode_only(&self) -> bool {
        self.user_mode_only
    }

    /// `UFFDIO_API`: enables `features`; returns the features the kernel
    /// supports (call once, before any registration).
    /// A masked [`UffdMove`](crate::features::Feature::UffdMove) or
    /// [`UffdPoison`](crate::features::Feature::UffdPoison) is neither
    /// asked for nor reported.
    pub fn api(&self, features: u64) -> io::Result<u64> {
        use crate::features::{masked, Feature};
        let mut hidden = 0;
        if masked(Feature::UffdMove) {
            hidden |= feature::MOVE;
        }
        if masked(Feature::UffdPoison) {
            hidden |= feature::POISON;
        }
        let mut api = k::uffdio_api {
            api: k::UFFD_API as u64,
            features: features & !hidden,
            ioctls: 0,
        };
        // SAFETY: `api` is a valid uffdio_api the kernel reads and writes.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), kio::UFFDIO_API as _, &mut api) }.into())?;
        Ok(api.features & !hidden)
    }

    /// `UFFDIO_REGISTER` of a range of a mapping (the whole mapping, or one
    /// shard of it when a region's range is spread over several
    /// userfaultfds: the kernel then splits the mapping into one VMA per
    /// registration) for missing and optionally write-protect faults;
    /// returns the ioctl mask the range supports.
    ///
    /// Only [`MapRange`]s of [`Mapping`](crate::mem::Mapping)s can be registered, so the fills
    /// below (which the kernel allows only in registered ranges) can only
    /// ever write memory of a mapping the caller owns.
    pub fn register(&self, range: MapRange<'_>, missing: bool, wp: bool) -> io::Result<u64> {
        let (start, len) = (range.addr(), range.len());
        let mut mode = 0u64;
        if missing {
            mode |= u64::from(k::UFFDIO_REGISTER_MODE_MISSING);
        }
        if wp {
            mode |= u64::from(k::UFFDIO_REGISTER_MODE_WP);
        }
        let mut reg = k::uffdio_register {
            range: k::uffdio_range { start, len },
            mode,
            ioctls: 0,
        };
        // SAFETY: `reg` is a valid uffdio_register; the kernel checks the range.
        let ret = unsafe { libc::ioctl(self.fd.as_raw_fd(), kio::UFFDIO_REGISTER as _, &mut reg) };
        cvt(ret.into())?;
        Ok(reg.ioctls)
    }

    /// `UFFDIO_COPY` of `src` to `dst` (a registered range of `src.len()`
    /// bytes); `wp` installs the pages write-protected; without `wake` the
    /// threads waiting on the range stay asleep until [`Uffd::wake`].
    pub fn copy(&self, dst: MapRange<'_>, src: &[u8], wp: bool, wake: bool) -> io::Result<Fill> {
        assert_eq!(
            dst.len(),
            src.len() as u64,
            "copy of {} bytes into {dst:?}",
            src.len()
        );
        let mut mode = if wp {
            u64::from(k::UFFDIO_COPY_MODE_WP)
        } else {
            0
        };
        if !wake {
            mode |= u64::from(k::UFFDIO_COPY_MODE_DONTWAKE);
        }
        // Injected: only the first page, then EAGAIN with that progress.
        let short = src.len() > crate::PAGE_SIZE && crate::inject::fires(crate::inject::Call::Copy);
        let len = if short { crate::PAGE_SIZE } else { src.len() };
        let mut c = k::uffdio_copy {
            dst: dst.addr(),
            src: src.as_ptr() as u64,
            len: len as u64,
            mode,
            copy: 0,
        };
        // SAFETY: the kernel only reads `src.len()` bytes from `src` (a live
        // slice) and fills missing pages of the destination, a range of a
        // registered Mapping (never Rust-referenced memory; the kernel refuses
        // unregistered ranges); `c` is a valid uffdio_copy.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), kio::UFFDIO_COPY as _, &mut c) };
        if short && r == 0 {
            return Ok(Fill::Retry {
                done: crate::PAGE_SIZE as u64,
            });
        }
        fill_outcome(r, c.copy)
    }

    /// `UFFDIO_WRITEPROTECT`: `protect` sets, otherwise clears write
    /// protection over the range (clearing wakes waiters unless `!wake`;
    /// setting never wakes, and the kernel refuses DONTWAKE with it, so
    /// `wake` is ignored then). Each call that changes a present page costs
    /// one TLB flush.
    pub fn writeprotect(&self, r: MapRange<'_>, protect: bool, wake: bool) -> io::Result<()> {
        let (start, len) = (r.addr(), r.len());
        let mut mode = if protect {
            UFFDIO_WRITEPROTECT_MODE_WP
        } else {
            0
        };
        if !wake && !protect {
            mode |= UFFDIO_WRITEPROTECT_MODE_DONTWAKE;
        }
        if protect && crate::inject::fires(crate::inject::Call::WriteProtect) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let mut wp = k::uffdio_writeprotect {
            range: k::uffdio_range { start, len },
            mode,
        };
        // SAFETY: `wp` is a valid uffdio_writeprotect; the kernel checks the range.
        let ret =
            unsafe { libc::ioctl(self.fd.as_raw_fd(), kio::UFFDIO_WRITEPROTECT as _, &mut wp) };
        cvt(ret.into())?;
        Ok(())
    }

    /// `UFFDIO_WAKE`: wakes threads waiting on faults in the range.
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = k::uffdio_range { start, len };
        // SAFETY: `range` is a valid uffdio_range.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), kio::UFFDIO_WAKE as _, &mut range) }.into())?;
        Ok(())
    }

    /// `UFFDIO_POISON`: the range raises SIGBUS on access (EFAULT inside a
    /// syscall) until it is zapped with `MADV_DONTNEED`.
    pub fn poison(&self, r: MapRange<'_>) -> io::Result<Fill> {
        let mut p = k::uffdio_poison {
            range: k::uffdio_range {
                start: r.addr(),
                len: r.len(),
            },
            mode: 0,
            updated: 0,
        };
        // SAFETY: `p` is a valid uffdio_poison; the kernel checks the range.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_POISON as _, &mut p) };
        fill_outcome(r, p.updated)
    }

    /// `UFFDIO_MOVE` of the anonymous pages of `src` to `dst` (same length):
    /// `src` reads as missing afterwards, so it too must be a mapping the
    /// caller owns (a staging area), never memory Rust code references.
    pub fn mv(&self, dst: MapRange<'_>, src: MapRange<'_>) -> io::Result<Fill> {
        assert_eq!(dst.len(), src.len());
        let mut m = k::uffdio_move {
            dst: dst.addr(),
            src: src.addr(),
            len: src.len(),
            mode: 0,
            move_: 0,
        };
        // SAFETY: `m` is a valid uffdio_move; both ranges are parts of
        // Mappings (atomic views only), the destination registered here.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut m) };
        fill_outcome(r, m.move_)
    }

    /// `UFFDIO_MOVE` of `src[off..off + dst.len()]` (anonymous pages of an
    /// engine-owned buffer, e.g. a staged huge page) into `dst`, without
    /// waking. A PMD-mapped transparent huge page moves whole when both
    /// sides are 2 MiB-aligned and the destination has no page table there;
    /// otherwise the kernel splits it and moves base pages. The moved part of
    /// `src` reads as zeros afterwards.
    pub fn move_in(
        &self,
        dst: MapRange<'_>,
        src: &mut crate::mem::AlignedBuf,
        off: usize,
    ) -> io::Result<Fill> {
        assert!(off
            .checked_add(dst.len() as usize)
            .is_some_and(|e| e <= src.len()));
        let mut m = k::uffdio_move {
            dst: dst.addr(),
            src: src.addr() + off as u64,
            len: dst.len(),
            mode: UFFDIO_MOVE_MODE_DONTWAKE,
            move_: 0,
        };
        // SAFETY: `m` is a valid uffdio_move; the destination is part of a
        // Mapping (atomic views only) and `src` is borrowed mutably, so no
        // slice of the pages that leave it is alive; what is left there is
        // unmapped anonymous memory, which reads as zeros.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut m) };
        fill_outcome(r, m.move_)
    }

    /// `UFFDIO_MOVE` of the anonymous pages of `src` (a registered range of
    /// an application view whose folio the caller owns and has written
    /// back) into `dst[off..off + src.len()]` (an engine-owned buffer
    /// registered with this userfaultfd, [`Uffd::register_buf`]), without
    /// waking: a PMD-mapped huge page moves whole when both sides are 2 MiB
    /// aligned and `dst` has no page table there. `src` reads as missing
    /// afterwards (its next access faults).
    pub fn move_out(
        &self,
        src: MapRange<'_>,
        dst: &mut crate::mem::AlignedBuf,
        off: usize,
    ) -> io::Result<Fill> {
        assert!(off
            .checked_add(src.len() as usize)
            .is_some_and(|e| e <= dst.len()));
        let mut m = k::uffdio_move {
            dst: dst.addr() + off as u64,
            src: src.addr(),
            len: src.len(),
            mode: UFFDIO_MOVE_MODE_DONTWAKE,
            move_: 0,
        };
        // SAFETY: `m` is a valid uffdio_move; `src` is part of a Mapping
        // (atomic views only: the pages leaving it are never referenced as
        // Rust data), and `dst` is borrowed mutably, so no slice of the
        // buffer is alive while its pages are replaced.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut m) };
        fill_outcome(r, m.move_)
    }

    /// Registers engine-owned buffer `buf` for write-protect only (no
    /// missing faults: touching it allocates memory as usual): the buffer
    /// can then receive pages by [`Uffd::move_out`] through this
    /// userfaultfd (the kernel moves only into ranges registered with the
    /// descriptor the ioctl is made on).
    pub fn register_buf(&self, buf: &crate::mem::AlignedBuf) -> io::Result<u64> {
        let mut reg = k::uffdio_register {
            range: k::uffdio_range {
                start: buf.addr(),
                len: buf.len() as u64,
            },
            mode: u64::from(k::UFFDIO_REGISTER_MODE_WP),
            ioctls: 0,
        };
        // SAFETY: `reg` is a valid uffdio_register over `buf`'s own mapping;
        // registration changes no memory.
        let ret = unsafe { libc::ioctl(self.fd.as_raw_fd(), kio::UFFDIO_REGISTER as _, &mut reg) };
        cvt(ret.into())?;
        Ok(reg.ioctls)
    }

    /// Reads pending messages into `out` (non-blocking); returns how many were
    /// read, 0 when none was pending.
    pub fn read_msgs(&self, buf: &mut [u8], out: &mut Vec<Msg>) -> io::Result<usize> {
        out.clear();
        match (&self.fd).read(buf) {
            Ok(n) => {
                out.extend(buf[..n].chunks_exact(MSG_SIZE).map(Msg::parse));
                Ok(out.len())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// The raw descriptor, for `poll`.
    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl std::os::fd::AsFd for Uffd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<Uffd> for OwnedFd {
    fn from(u: Uffd) -> OwnedFd {
        u.fd.into()
    }
}

/// Maps the return of a COPY-like ioctl plus its progress field to [`Fill`].
fn fill_outcome(ret: i32, progress: i64) -> io::Result<Fill> {
    if ret == 0 {
        return Ok(Fill::Done);
    }
    let err = last_err();
    let done = progress.max(0) as u64;
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(Fill::Exists { done }),
        Some(libc::EAGAIN) => Ok(Fill::Retry { done }),
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // Values from Linux 6.8 include/uapi/linux/userfaultfd.h on x86-64.
        assert_eq!(UFFDIO_POISON, 0xC020_AA08);
        assert_eq!(UFFDIO_MOVE, 0xC028_AA05);
        assert_eq!(USERFAULTFD_IOC_NEW, 0xAA00);
        assert_eq!(MSG_SIZE, 32);
    }

    #[test]
    fn parses_a_write_fault_message() {
        let mut raw = [0u8; MSG_SIZE];
        raw[0] = k::UFFD_EVENT_PAGEFAULT as u8;
        raw[8..16].copy_from_slice(&u64::from(k::UFFD_PAGEFAULT_FLAG_WRITE).to_ne_bytes());
        raw[16..24].copy_from_slice(&0x7f00_1234_5678u64.to_ne_bytes());
        raw[24..28].copy_from_slice(&42u32.to_ne_bytes());
        assert_eq!(
            Msg::parse(&raw),
            Msg::PageFault {
                addr: 0x7f00_1234_5678,
                write: true,
                wp: false,
                tid: 42
            }
        );
        raw[0] = 0x14;
        assert_eq!(Msg::parse(&raw), Msg::Other(0x14));
    }
}
