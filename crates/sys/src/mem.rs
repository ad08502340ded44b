//! Anonymous mappings, madvise, batched process_madvise, page-aligned buffers.
//!
//! A [`Mapping`] is memory the engine hands to applications as a raw pointer;
//! Rust code never holds `&`/`&mut` references to plain bytes inside it
//! (other threads and the kernel change it at any time), only atomic views
//! ([`Mapping::atomic_bytes`]) and copies ([`Mapping::read_at`],
//! [`Mapping::write_at`]).
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use crate::{cvt, last_err, PAGE_SIZE};

/// Private anonymous memory, aligned, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: NonNull<u8>,
    len: usize,
    /// Set by [`Mapping::keep_reserved`]: the drop leaves the range mapped.
    keep: AtomicBool,
}

// SAFETY: a Mapping is plain memory owned by the process; the struct only
// holds its address and length, and every access through it is atomic or a
// copy, so sharing it between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// An address range a caller hands over to be replaced by a region's
/// mapping, as `MAP_FIXED` does (UMap's `UMAP_FIXED`): created only by the
/// `unsafe` [`FixedRange::new`], where the caller vouches for the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedRange {
    addr: u64,
    len: u64,
}

impl FixedRange {
    /// A range to be mapped over.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` belongs to the caller, who gives it up: whatever
    /// is mapped there (typically the caller's own `PROT_NONE` reservation)
    /// may be replaced, and no Rust reference, other thread or library uses
    /// that memory any more. `addr` and `len` must be page-aligned and the
    /// range must not wrap.
    pub unsafe fn new(addr: u64, len: u64) -> FixedRange {
        FixedRange { addr, len }
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True if the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Mapping {
    fn owned(addr: NonNull<u8>, len: usize) -> Mapping {
        Mapping {
            addr,
            len,
            keep: AtomicBool::new(false),
        }
    }

    /// Maps `len` bytes (a multiple of the page size) of private anonymous,
    /// `MAP_NORESERVE` memory at the start of `at` (`MAP_FIXED`: whatever
    /// the caller had there is replaced), readable and, if `writable`,
    /// writable. `len` must fit in `at`.
    pub fn fixed(at: FixedRange, len: usize, writable: bool) -> io::Result<Mapping> {
        assert!(len > 0 && len.is_multiple_of(PAGE_SIZE) && len as u64 <= at.len);
        if !at.addr.is_multiple_of(PAGE_SIZE as u64) || at.addr == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
        // SAFETY: the caller of FixedRange::new gave up this range (nothing
        // refers to its memory), and `len` lies inside it.
        let raw = unsafe { libc::mmap(at.addr as *mut libc::c_void, len, prot, flags, -1, 0) };
        if raw == libc::MAP_FAILED {
            return Err(last_err());
        }
        let addr = NonNull::new(raw.cast::<u8>()).expect("MAP_FIXED at a non-zero address");
        Ok(Mapping::owned(addr, len))
    }

    /// Maps `len` bytes (a multiple of the page size) of private anonymous,
    /// `MAP_NORESERVE` memory with `access` at exactly `addr` if nothing is
    /// mapped in `[addr, addr + len)` (`MAP_FIXED_NOREPLACE`: EEXIST if
    /// anything is). A fork child reserves (`Access::None`) the ranges of
    /// the regions it inherited this way, where its parent had them (they
    /// were `MADV_DONTFORK`, so they are free in the child), and maps each
    /// again over its reservation ([`Mapping::remap`]).
    pub fn vacant(addr: u64, len: usize, access: Access) -> io::Result<Mapping> {
        assert!(len > 0 && len.is_multiple_of(PAGE_SIZE));
        if !addr.is_multiple_of(PAGE_SIZE as u64) || addr == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let flags = libc::MAP_PRIVATE
            | libc::MAP_ANONYMOUS
            | libc::MAP_NORESERVE
            | libc::MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping: the call
        // fails (EEXIST) if any part of the range is in use, so no memory
        // anything refers to is affected.
        let raw = unsafe { libc::mmap(addr as *mut libc::c_void, len, prot(access), flags, -1, 0) };
        if raw == libc::MAP_FAILED {
            return Err(last_err());
        }
        if raw as u64 != addr {
            // Kernels before 4.17 ignore the flag and pick another address.
            // SAFETY: the mapping was just created here and is not used.
            unsafe { libc::munmap(raw, len) };
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        let addr = NonNull::new(raw.cast::<u8>()).expect("a non-zero address was asked for");
        Ok(Mapping::owned(addr, len))
    }

    /// Replaces this mapping (typically a reservation made by
    /// [`Mapping::vacant`]) with fresh private anonymous `MAP_NORESERVE`
    /// memory at the same address (`MAP_FIXED`), readable and, if
    /// `writable`, writable. Consumes it: nothing refers to its memory.
    pub fn remap(self, writable: bool) -> io::Result<Mapping> {
        let access = if writable {
            Access::ReadWrite
        } else {
            Access::Read
        };
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
        // SAFETY: `self` is owned and consumed here: no view of its memory
        // outlives this call (atomic views borrow it), so replacing the
        // range affects nothing anyone refers to.
        let raw = unsafe {
            libc::mmap(
                self.addr.as_ptr().cast(),
                self.len,
                prot(access),
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(last_err()); // `self` drops: the range is unmapped
        }
        let m = Mapping::owned(self.addr, self.len);
        std::mem::forget(self); // its range is `m` now
        Ok(m)
    }

    /// Maps `len` bytes (a multiple of the page size) of private anonymous,
    /// `MAP_NORESERVE` memory at an address aligned to `align` (a power of
    /// two ≥ the page size), readable and, if `writable`, writable.
    pub fn anonymous(len: usize, align: usize, writable: bool) -> io::Result<Mapping> {
        assert!(
            len > 0
                && len.is_multiple_of(PAGE_SIZE)
                && align.is_power_of_two()
                && align >= PAGE_SIZE
        );
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let total = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses;
        // no existing memory is affected.
        let raw = unsafe { libc::mmap(std::ptr::null_mut(), total, prot, flags, -1, 0) };
        if raw == libc::MAP_FAILED {
            return Err(last_err());
        }
        let start = raw as usize;
        let aligned = (start + align - 1) & !(align - 1);
        let head = aligned - start;
        let tail = total - head - len;
        // SAFETY: both trims lie inside the mapping just created and nothing
        // refers to them.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        let addr = NonNull::new(aligned as *mut u8).expect("mmap never returns 0 here");
        Ok(Mapping::owned(addr, len))
    }

    /// Maps `len` bytes (a multiple of the page size) of `file` from
    /// `offset` (page-aligned) `MAP_SHARED`, at an address aligned to
    /// `align` (a power of two ≥ the page size), readable and, if
    /// `writable`, writable: a view of a page pool that other processes map
    /// too (pool.rs). The pages are the file's: a write through any view is
    /// seen by every other at once, and a hole punched in the file removes
    /// its pages from every view. Unmapped on drop like any `Mapping`.
    pub fn shared_file(
        file: &std::fs::File,
        offset: u64,
        len: usize,
        align: usize,
        writable: bool,
    ) -> io::Result<Mapping> {
        let place = Mapping::anonymous(len, align, false)?;
        let off = libc::off_t::try_from(offset)
            .ok()
            .filter(|o| (*o as u64).is_multiple_of(PAGE_SIZE as u64))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        // SAFETY: MAP_FIXED replaces exactly the reservation `place` just
        // made (owned here, nothing refers to it); the file's pages are
        // mapped shared, and Rust code never holds references to plain
        // bytes of a Mapping, only atomic views and copies.
        let raw = unsafe {
            libc::mmap(
                place.as_ptr().cast(),
                len,
                prot,
                flags,
                file.as_raw_fd(),
                off,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(last_err()); // `place` drops: the range is unmapped
        }
        let m = Mapping::owned(place.addr, len);
        std::mem::forget(place); // its range is `m` now
        Ok(m)
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr.as_ptr() as u64
    }

    /// Start as a raw pointer, for applications.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `madvise` over a sub-range (offset and length page-aligned).
    pub fn advise(&self, offset: usize, len: usize, advice: Advice) -> io::Result<()> {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: the range lies inside this mapping; the advice values used
        // (NOHUGEPAGE, DONTFORK, DONTNEED, POPULATE_WRITE, which faults in
        // zero pages and changes no byte) never touch Rust-owned memory, and
        // no Rust reference to plain bytes of the mapping exists.
        let ret =
            unsafe { libc::madvise(self.addr.as_ptr().add(offset).cast(), len, advice as i32) };
        cvt(ret.into())?;
        Ok(())
    }

    /// Changes the mapping's protection (`mprotect`). An access the new
    /// protection forbids raises SIGSEGV; userfaultfd write-protection of
    /// its pages is kept either way.
    pub fn protect(&self, access: Access) -> io::Result<()> {
        let prot = prot(access);
        // SAFETY: the range is exactly this mapping; changing its protection
        // frees nothing and moves nothing. A later access through a view that
        // the protection forbids raises SIGSEGV (a crash, like any protected
        // page); it cannot reach memory it should not.
        let ret = unsafe { libc::mprotect(self.addr.as_ptr().cast(), self.len, prot) };
        cvt(ret.into())?;
        Ok(())
    }

    /// Replaces the whole mapping with inaccessible memory
    /// (`mmap(MAP_FIXED, PROT_NONE)`): its pages are freed, a userfaultfd
    /// registration of the range ends with it, and every later access raises
    /// SIGSEGV — never zero-filled memory, which is what a still-mapped range
    /// gives once it is unregistered. The address range stays reserved (no
    /// other mapping can land there) until the `Mapping` is dropped.
    ///
    /// Call it only once nothing will use the memory again: an atomic view
    /// used after it raises SIGSEGV.
    pub fn make_inaccessible(&self) -> io::Result<()> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
        // SAFETY: MAP_FIXED replaces exactly the range this Mapping owns
        // (nothing else of the process is affected); Rust code holds no
        // reference to plain bytes of it, only atomic views, and those fault
        // (SIGSEGV) rather than read freed memory.
        let raw = unsafe {
            libc::mmap(
                self.addr.as_ptr().cast(),
                self.len,
                libc::PROT_NONE,
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(last_err());
        }
        debug_assert_eq!(raw as usize, self.addr.as_ptr() as usize);
        Ok(())
    }

    /// Hands the address range over once this mapping is dropped: the drop
    /// leaves whatever is mapped there (after [`Mapping::make_inaccessible`],
    /// an inaccessible reservation) in place instead of unmapping it, so no
    /// other mapping can land in the range before its next owner maps over
    /// it with `MAP_FIXED` (a [`FixedRange`]). A range nobody maps over
    /// stays reserved (address space only) until the process ends.
    ///
    /// As with [`Mapping::make_inaccessible`], call it only once nothing
    /// will use the memory again: an atomic view used after the next owner
    /// mapped over the range reaches that owner's memory.
    pub fn keep_reserved(&self) -> FixedRange {
        self.keep.store(true, Ordering::Release);
        // The range is this mapping's own, page-aligned and not wrapping;
        // from here on nothing unmaps it and the caller owns it.
        FixedRange {
            addr: self.addr.as_ptr() as u64,
            len: self.len as u64,
        }
    }

    /// The mapping as atomic bytes: safe shared access from any thread (a
    /// read of a missing page faults it in like any access).
    pub fn atomic_bytes(&self) -> &[AtomicU8] {
        // SAFETY: the memory is mapped for the lifetime of &self, AtomicU8
        // has the layout of u8 and every bit pattern is valid; atomics make
        // concurrent access by other threads sound.
        unsafe { std::slice::from_raw_parts(self.addr.as_ptr().cast::<AtomicU8>(), self.len) }
    }

    /// The mapping as atomic 64-bit words (the length rounded down).
    pub fn atomic_words(&self) -> &[AtomicU64] {
        // SAFETY: as for atomic_bytes; the start is page-aligned, so 8-byte
        // aligned.
        unsafe { std::slice::from_raw_parts(self.addr.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }

    /// Copies bytes out of the mapping at `offset`.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) {
        assert!(
            offset.checked_add(buf.len()).is_some_and(|e| e <= self.len),
            "read out of the mapping"
        );
        // SAFETY: the source range is inside the mapping (checked above), the
        // destination is a live exclusive slice, they cannot overlap (the
        // mapping is never lent out as a Rust slice). Concurrent writers make
        // the bytes read unspecified, as for memory shared with another
        // process, never the copy itself unsound.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.addr.as_ptr().add(offset),
                buf.as_mut_ptr(),
                buf.len(),
            )
        }
    }

    /// Copies bytes into the mapping at `offset` (faults in a write-protected
    /// page like any store; SIGSEGV if the mapping is read-only).
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.len),
            "write out of the mapping"
        );
        // SAFETY: the destination is inside the mapping, which no Rust
        // reference covers; the source is a live slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr.as_ptr().add(offset), data.len())
        }
    }
}

/// What a [`Mapping`] allows ([`Mapping::protect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: every access raises SIGSEGV.
    None,
    /// Loads only.
    Read,
    /// Loads and stores.
    ReadWrite,
}

/// The `PROT_*` bits of `access`.
fn prot(access: Access) -> libc::c_int {
    match access {
        Access::None => libc::PROT_NONE,
        Access::Read => libc::PROT_READ,
        Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
    }
}

/// Part of a [`Mapping`]. Operations that replace or discard memory
/// ([`SelfPidfd::dontneed`], and the userfaultfd fills of
/// [`Uffd`](crate::uffd::Uffd)) take these instead of raw addresses: the
/// range is proof that the memory belongs to a mapping the caller owns,
/// which Rust code reaches only through atomic views and copies — never
/// memory the program holds plain references to (its heap, its stacks).
#[derive(Debug, Clone, Copy)]
pub struct MapRange<'a> {
    map: &'a Mapping,
    off: usize,
    len: usize,
}

impl Mapping {
    /// `[off, off+len)` of this mapping; page-aligned, non-empty, inside it.
    pub fn range(&self, off: usize, len: usize) -> MapRange<'_> {
        assert!(
            off.is_multiple_of(PAGE_SIZE)
                && len.is_multiple_of(PAGE_SIZE)
                && len > 0
                && off.checked_add(len).is_some_and(|e| e <= self.len),
            "range {off}+{len} is not page-aligned inside a mapping of {} bytes",
            self.len
        );
        MapRange {
            map: self,
            off,
            len,
        }
    }

    /// The whole mapping as a range.
    pub fn whole(&self) -> MapRange<'_> {
        self.range(0, self.len)
    }
}

impl MapRange<'_> {
    /// First address.
    pub fn addr(&self) -> u64 {
        self.map.addr() + self.off as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }
    /// Always false: ranges are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// `[off, off+len)` of this range (page-aligned, inside it).
    #[must_use]
    pub fn sub(&self, off: usize, len: usize) -> Self {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        self.map.range(self.off + off, len)
    }
    /// Changes the protection of this range of its mapping (`mprotect`;
    /// the kernel splits the mapping's VMA, and merges the parts again when
    /// the protections match once more — not always: anonymous parts that
    /// got anon_vmas of their own while apart stay apart, and a
    /// `UFFDIO_COPY` across them fails with ENOENT). Async-signal-safe (one
    /// system call).
    pub fn protect(&self, access: Access) -> io::Result<()> {
        let prot = match access {
            Access::None => libc::PROT_NONE,
            Access::Read => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: the range lies inside the mapping (checked when it was
        // made) and the mapping is alive for 'a; changing its protection
        // frees nothing and moves nothing. An access the new protection
        // forbids raises SIGSEGV; it cannot reach memory it should not.
        let ret = unsafe {
            libc::mprotect(
                (self.map.addr() as usize + self.off) as *mut libc::c_void,
                self.len,
                prot,
            )
        };
        cvt(ret.into())?;
        Ok(())
    }
    /// Extends this range by `next` if `next` starts where it ends, in the
    /// same mapping; false (nothing changed) otherwise.
    pub fn try_extend(&mut self, next: &MapRange<'_>) -> bool {
        if std::ptr::eq(self.map, next.map) && self.off + self.len == next.off {
            self.len += next.len;
            true
        } else {
            false
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.keep.load(Ordering::Acquire) {
            return; // handed over: the next owner maps over the range
        }
        // SAFETY: the mapping was created by Mapping::anonymous and is
        // unmapped once; atomic views borrow &self so none outlives it.
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

/// madvise advice values used by upager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Advice {
    /// Drop the pages (private anonymous: zero-fill or uffd fault on next touch).
    DontNeed = libc::MADV_DONTNEED,
    /// No transparent huge pages in this range.
    NoHugePage = libc::MADV_NOHUGEPAGE,
    /// Transparent huge pages welcome.
    HugePage = libc::MADV_HUGEPAGE,
    /// Not inherited by a child after fork.
    DontFork = libc::MADV_DONTFORK,
    /// Fault the range in now, as writes would (Linux 5.14; EINVAL before).
    PopulateWrite = libc::MADV_POPULATE_WRITE,
}

/// The most ranges one `process_madvise` call accepts (`UIO_MAXIOV`).
pub const MAX_IOV: usize = 1024;

/// How this process drops pages of its own mappings: one
/// `process_madvise(MADV_DONTNEED)` per batch of ranges through a pidfd of
/// itself, or — where the kernel (before 6.13) or a seccomp filter refuses
/// that — one `madvise(MADV_DONTNEED)` per range.
///
/// The cost of the fallback is TLB shootdowns: `process_madvise` gathers
/// every range of a call in one mmu_gather (one flush, Linux 6.16), while
/// each `madvise` flushes for itself. [`SelfPidfd::batched`] says which
/// way is in use; callers count flushes by [`SelfPidfd::flushes`].
#[derive(Debug)]
pub struct SelfPidfd {
    /// `None`: the per-range `madvise` fallback.
    fd: Option<OwnedFd>,
    /// Why the fallback is in use (the probe's error).
    why_not: Option<io::Error>,
}

impl SelfPidfd {
    /// `pidfd_open(getpid())`, then one `process_madvise(MADV_DONTNEED)` of
    /// a scratch page to see that the kernel and any seccomp filter allow
    /// it. Never fails: without it, [`SelfPidfd::dontneed`] falls back to
    /// `madvise` per range (see [`SelfPidfd::unbatched_reason`]).
    pub fn open() -> SelfPidfd {
        match Self::open_batched() {
            Ok(fd) => SelfPidfd {
                fd: Some(fd),
                why_not: None,
            },
            Err(e) => SelfPidfd {
                fd: None,
                why_not: Some(e),
            },
        }
    }

    fn open_batched() -> io::Result<OwnedFd> {
        if crate::features::masked(crate::features::Feature::ProcessMadvise) {
            return Err(crate::features::refused());
        }
        // SAFETY: getpid and pidfd_open take integers and return an fd or -1.
        let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) })?;
        // SAFETY: a fresh fd owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let scratch = Mapping::anonymous(PAGE_SIZE, PAGE_SIZE, true)?;
        scratch.write_at(0, &[1]);
        let iov = libc::iovec {
            iov_base: scratch.as_ptr().cast(),
            iov_len: PAGE_SIZE,
        };
        // SAFETY: one iovec over the scratch mapping this function owns and
        // no reference covers; the kernel only reads the iovec.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                owned.as_raw_fd(),
                &raw const iov,
                1usize,
                libc::MADV_DONTNEED,
                0,
            )
        };
        cvt(r)?;
        Ok(owned)
    }

    /// One call drops all ranges with one TLB flush (`process_madvise`).
    pub fn batched(&self) -> bool {
        self.fd.is_some()
    }

    /// Why `process_madvise` is not used (`None` when it is).
    pub fn unbatched_reason(&self) -> Option<&io::Error> {
        self.why_not.as_ref()
    }

    /// The TLB flushes one [`SelfPidfd::dontneed`] of `ranges` ranges
    /// (merged, at most [`MAX_IOV`]) costs: one batched, one per range
    /// otherwise.
    pub fn flushes(&self, ranges: usize) -> u64 {
        if self.batched() {
            1
        } else {
            ranges as u64
        }
    }

    /// `MADV_DONTNEED` over up to [`MAX_IOV`] ranges of this process's own
    /// mappings: one `process_madvise` (one mmu_gather, so one TLB flush for
    /// the whole call on Linux 6.16+), or one `madvise` per range in order
    /// (see [`SelfPidfd::open`]). The pages read as zero (or raise a
    /// userfaultfd fault) afterwards. Returns the number of bytes advised:
    /// ranges are advised in order, and a short count leaves the tail (an
    /// error only if nothing was advised). Allocates nothing for up to 16
    /// ranges (async-signal-safe then).
    pub fn dontneed(&self, ranges: &[MapRange<'_>]) -> io::Result<u64> {
        assert!(ranges.len() <= MAX_IOV);
        let Some(fd) = &self.fd else {
            return dontneed_each(ranges);
        };
        let to_iovec = |r: &MapRange<'_>| libc::iovec {
            iov_base: r.addr() as *mut libc::c_void,
            iov_len: r.len,
        };
        // Up to 16 ranges on the stack: no allocation (a SIGBUS handler
        // undoing a fill calls this).
        let mut small = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 16];
        let heap: Vec<libc::iovec>;
        let iov: &[libc::iovec] = if ranges.len() <= small.len() {
            for (slot, r) in small.iter_mut().zip(ranges) {
                *slot = to_iovec(r);
            }
            &small[..ranges.len()]
        } else {
            heap = ranges.iter().map(to_iovec).collect();
            &heap
        };
        // Injected: the first half of the ranges, or EAGAIN for one range.
        let iov = if crate::inject::fires(crate::inject::Call::ProcessMadvise) {
            if iov.len() < 2 {
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            &iov[..iov.len() / 2]
        } else {
            iov
        };
        // SAFETY: `iov` is a live array of `iov.len()` iovecs the kernel only
        // reads. Every range lies inside a Mapping (MapRange proves it), whose
        // memory no Rust reference covers except atomic views: dropping its
        // pages is like another thread storing zeros.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                fd.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                libc::MADV_DONTNEED,
                0,
            )
        };
        Ok(cvt(r)? as u64)
    }
}

/// The fallback of [`SelfPidfd::dontneed`]: one `madvise(MADV_DONTNEED)`
/// per range, in order; stops at the first refusal and returns the bytes
/// advised before it (the error if none were). Async-signal-safe.
fn dontneed_each(ranges: &[MapRange<'_>]) -> io::Result<u64> {
    // Injected: the first half of the ranges, or EAGAIN for one range
    // (as for process_madvise).
    let ranges = if crate::inject::fires(crate::inject::Call::ProcessMadvise) {
        if ranges.len() < 2 {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        &ranges[..ranges.len() / 2]
    } else {
        ranges
    };
    let mut done = 0u64;
    for r in ranges {
        // SAFETY: the range lies inside a Mapping (MapRange proves it),
        // whose memory no Rust reference covers except atomic views:
        // dropping its pages is like another thread storing zeros.
        let ret =
            unsafe { libc::madvise(r.addr() as *mut libc::c_void, r.len, libc::MADV_DONTNEED) };
        if ret != 0 {
            return if done == 0 { Err(last_err()) } else { Ok(done) };
        }
        done += r.len();
    }
    Ok(done)
}

/// `mincore` of `[addr, addr+len)`: one byte per page, bit 0 = resident.
/// Works on any address range; unmapped ranges give ENOMEM.
pub fn mincore(addr: u64, len: u64) -> io::Result<Vec<u8>> {
    let pages = len.div_ceil(PAGE_SIZE as u64) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: the kernel writes `pages` bytes into `vec` and only inspects
    // page tables of the given range.
    let ret = unsafe { libc::mincore(addr as *mut libc::c_void, len as usize, vec.as_mut_ptr()) };
    cvt(ret.into())?;
    Ok(vec)
}

/// A zero-filled, page-aligned buffer (for O_DIRECT and UFFDIO_COPY),
/// backed by its own anonymous mapping: pages become resident only when
/// used, so a handler's fill buffer sized for the largest readahead (4 MiB)
/// costs what its fills touch. (A heap allocation of that alignment is
/// zeroed by writing it: 12 MiB resident for a pager's three buffers
/// before any fault.)
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf uniquely owns its mapping, like Vec<u8> its allocation.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only yields &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to the page size. Aborts like
    /// a failed allocation if no memory can be mapped.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let bytes = len.max(1).next_multiple_of(PAGE_SIZE);
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // chooses; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            let layout = Layout::from_size_align(bytes, PAGE_SIZE).expect("valid layout");
            alloc::handle_alloc_error(layout);
        }
        let ptr = NonNull::new(raw.cast::<u8>()).expect("mmap never returns 0 here");
        AlignedBuf { ptr, len }
    }

    /// A zeroed buffer of `len` bytes (a multiple of 2 MiB) aligned to
    /// 2 MiB and advised `MADV_HUGEPAGE`: touching it faults in transparent
    /// huge pages where the kernel has them (a staging area for huge
    /// folios). None if no memory could be mapped.
    pub fn huge(len: usize) -> Option<AlignedBuf> {
        const HUGE: usize = 2 << 20;
        assert!(
            len > 0 && len.is_multiple_of(HUGE),
            "huge buffers are whole 2 MiB pages"
        );
        // SAFETY: a fresh private anonymous mapping at an address the kernel
        // chooses; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + HUGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let base = raw as usize;
        let start = base.next_multiple_of(HUGE);
        // SAFETY: the head [base, start) and the tail [start + len, base +
        // len + HUGE) are parts of the mapping just made, not referenced by
        // anything; what stays is [start, start + len).
        unsafe {
            if start > base {
                libc::munmap(base as *mut libc::c_void, start - base);
            }
            let tail = base + len + HUGE - (start + len);
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        let ptr = NonNull::new(start as *mut u8).expect("mmap never returns 0 here");
        Some(AlignedBuf { ptr, len })
    }

    /// First byte's address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The buffer as atomic 64-bit words (benchmarks read plain memory the
    /// way they read a region's).
    pub fn atomic_words(&mut self) -> &[std::sync::atomic::AtomicU64] {
        // SAFETY: the buffer is page-aligned, owned, and borrowed mutably
        // for the returned lifetime, so viewing its first len/8 words as
        // atomics aliases nothing; AtomicU64 has u64's size and alignment.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.as_ptr().cast::<std::sync::atomic::AtomicU64>(),
                self.len / 8,
            )
        }
    }

    fn mapped_len(&self) -> usize {
        self.len.max(1).next_multiple_of(PAGE_SIZE)
    }

    /// Gives the memory of the buffer from byte `off` (rounded up to a page)
    /// back to the system: it reads as zeros again and is resident only once
    /// touched (`MADV_DONTNEED`). The buffer's length does not change.
    pub fn release_from(&mut self, off: usize) {
        let start = off.next_multiple_of(PAGE_SIZE);
        if start >= self.mapped_len() {
            return;
        }
        // SAFETY: [ptr + start, ptr + mapped_len) lies inside this buffer's
        // own private anonymous mapping, and &mut self means no slice of it
        // is borrowed; DONTNEED only replaces its contents with zeros.
        let r = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(start).cast(),
                self.mapped_len() - start,
                libc::MADV_DONTNEED,
            )
        };
        debug_assert_eq!(r, 0, "madvise(DONTNEED) of an own mapping");
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for Deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `zeroed` with this length, unmapped once; no
        // slice of it outlives &self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped_len()) };
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// A table of atomic words, all zero at first. Small tables live on the
/// heap (no mapping of their own: a pager with thousands of small regions
/// does not spend thousands of memory mappings on them); large ones are
/// anonymous `MAP_NORESERVE` memory, so a huge, sparsely used table costs
/// only the pages touched, and asking for more address space than exists is
/// an error (ENOMEM), not an abort.
#[derive(Debug)]
pub struct AtomicTable {
    store: TableStore,
    n: usize,
}

#[derive(Debug)]
enum TableStore {
    Heap(Box<[AtomicU64]>),
    Map(Mapping),
}

/// Tables up to this many bytes live on the heap.
const HEAP_TABLE_BYTES: usize = 64 << 10;

/// Mapped tables up to this many bytes are faulted in as writes when made
/// (`MADV_POPULATE_WRITE`); larger ones page in as they are touched. A page
/// of a table first *read* maps the shared zero page, and the first write
/// to it then replaces that page with a flush of the TLB on every CPU the
/// process runs on: one IPI per 4 KiB of table, per 512 folios of 4 KiB —
/// measured 2.3 extra shootdowns per 1000 evicted pages on a sequential
/// scan (`upager bench mmap-read`; bench/tlb_sites.sh found
/// them in `do_wp_page`). 16 MiB is the folio table of an 8 GiB region of
/// 4 KiB folios.
const POPULATE_TABLE_BYTES: usize = 16 << 20;

impl AtomicTable {
    /// A table of `n` zero words.
    pub fn zeroed(n: usize) -> io::Result<AtomicTable> {
        let bytes = n
            .checked_mul(8)
            .and_then(|b| b.checked_next_multiple_of(PAGE_SIZE))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let store = if bytes <= HEAP_TABLE_BYTES {
            TableStore::Heap((0..n).map(|_| AtomicU64::new(0)).collect())
        } else {
            let m = Mapping::anonymous(bytes, PAGE_SIZE, true)?;
            if bytes <= POPULATE_TABLE_BYTES {
                // Best effort: before 5.14 the pages fault in as touched.
                let _ = m.advise(0, bytes, Advice::PopulateWrite);
            }
            TableStore::Map(m)
        };
        Ok(AtomicTable { store, n })
    }
}

impl std::ops::Deref for AtomicTable {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        match &self.store {
            TableStore::Heap(b) => b,
            TableStore::Map(m) => &m.atomic_words()[..self.n],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_mapping_reads_writes_and_drops_pages() {
        let m = Mapping::anonymous(1 << 21, 1 << 21, true).unwrap();
        assert_eq!(m.addr() % (1 << 21), 0);
        m.write_at(4096, b"hello");
        let mut b = [0u8; 5];
        m.read_at(4096, &mut b);
        assert_eq!(&b, b"hello");
        assert_eq!(mincore(m.addr(), 8192).unwrap()[1] & 1, 1);
        let pid = SelfPidfd::open();
        assert!(pid.batched(), "{:?}", pid.unbatched_reason());
        assert_eq!(pid.dontneed(&[m.range(4096, 4096)]).unwrap(), 4096);
        let mut r = m.range(0, 4096);
        assert!(r.try_extend(&m.range(4096, 8192)) && r.len() == 12288);
        assert!(!r.try_extend(&m.range(4 * 4096, 4096)), "not adjacent");
        assert_eq!(mincore(m.addr(), 8192).unwrap()[1] & 1, 0);
        m.read_at(4096, &mut b);
        assert_eq!(b, [0; 5]);
    }

    /// The fallback (a kernel before 6.13, or seccomp): one madvise per
    /// range, in order, bytes counted; one flush per range.
    #[test]
    fn dontneed_each_drops_every_range() {
        let m = Mapping::anonymous(8 * PAGE_SIZE, PAGE_SIZE, true).unwrap();
        for p in 0..8 {
            m.write_at(p * PAGE_SIZE, b"x");
        }
        let unbatched = SelfPidfd {
            fd: None,
            why_not: Some(io::Error::from_raw_os_error(libc::EPERM)),
        };
        assert!(!unbatched.batched() && unbatched.flushes(3) == 3);
        let ranges = [
            m.range(0, PAGE_SIZE),
            m.range(2 * PAGE_SIZE, 2 * PAGE_SIZE),
            m.range(7 * PAGE_SIZE, PAGE_SIZE),
        ];
        assert_eq!(unbatched.dontneed(&ranges).unwrap(), 4 * PAGE_SIZE as u64);
        let resident = mincore(m.addr(), 8 * PAGE_SIZE as u64).unwrap();
        let kept: Vec<usize> = (0..8).filter(|&p| resident[p] & 1 == 1).collect();
        assert_eq!(kept, [1, 4, 5, 6]);
    }

    #[test]
    fn inaccessible_mapping_stays_reserved() {
        let m = Mapping::anonymous(1 << 16, PAGE_SIZE, true).unwrap();
        m.write_at(0, b"x");
        m.protect(Access::Read).unwrap();
        let mut b = [0u8; 1];
        m.read_at(0, &mut b);
        assert_eq!(&b, b"x");
        m.protect(Access::ReadWrite).unwrap();
        m.make_inaccessible().unwrap();
        // Still mapped (reserved), no page resident.
        assert!(mincore(m.addr(), 1 << 16)
            .unwrap()
            .iter()
            .all(|&p| p & 1 == 0));
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.starts_with(&format!("{:x}-", m.addr())))
            .expect("the range is still reserved");
        assert!(line.contains(" ---p "), "{line}");
    }

    #[test]
    fn zeroed_table_and_buffer() {
        let t = AtomicTable::zeroed(1000).unwrap();
        assert_eq!(t.len(), 1000);
        let big = AtomicTable::zeroed(1 << 20).unwrap();
        assert_eq!(big.len(), 1 << 20);
        big[(1 << 20) - 1].store(7, std::sync::atomic::Ordering::Relaxed);
        assert!(AtomicTable::zeroed(0).unwrap().is_empty());
        assert!(AtomicTable::zeroed(usize::MAX / 4).is_err());
        assert!(t
            .iter()
            .all(|w| w.load(std::sync::atomic::Ordering::Relaxed) == 0));
        let mut b = AlignedBuf::zeroed(1 << 22);
        assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0);
        assert!(b[..8192].iter().all(|&x| x == 0));
        b[4096] = 7;
        // Only the pages used are resident.
        let resident = mincore(b.as_ptr() as u64, 1 << 22)
            .unwrap()
            .iter()
            .filter(|&&p| p & 1 != 0)
            .count();
        assert!(resident <= 2, "{resident} pages resident");
        assert_eq!(AlignedBuf::zeroed(0).len(), 0);
    }
}
