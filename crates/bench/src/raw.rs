//! The only `unsafe` code of this crate, kept to the few calls that have no
//! safe wrapper: a read-only shared file mapping (memmap2 marks it unsafe
//! because another process may change the file), `MADV_DONTNEED` on a private
//! anonymous map (it changes the map's contents), `getrusage` and
//! `sched_setaffinity`, `posix_fadvise`. The workspace rule is that upager's `unsafe` lives in
//! `crates/sys`; this benchmark crate must not depend on the engine's crates
//! (it measures the kernel against them), so it keeps its own four wrappers
//! here, each with its safety argument.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;

use memmap2::{Mmap, MmapMut, MmapOptions, UncheckedAdvice};

/// Map `file` read-only and shared (`MAP_SHARED`, `PROT_READ`), the way the
/// kernel baseline reads a data file through the page cache.
pub(crate) fn map_file_readonly(file: &File) -> io::Result<Mmap> {
    // SAFETY: the mapping is read-only, so this process cannot corrupt it; the
    // benchmark's data files are created and owned by the benchmark and are
    // not modified while a worker maps them. A concurrent truncation would at
    // worst raise SIGBUS in the worker, which the parent reports as a failed
    // run (the worker is a separate process).
    unsafe { MmapOptions::new().map(file) }
}

/// Map `file` read-write and shared (`MAP_SHARED`, `PROT_READ|PROT_WRITE`):
/// the kernel side of `upager demo --compare`, which writes through it.
pub(crate) fn map_file_shared_rw(file: &File) -> io::Result<MmapMut> {
    // SAFETY: the file is the benchmark's own dataset, made for this run and
    // not used by anyone else while mapped; the workload accesses the map
    // only through atomic words (`as_atomic_words`), so concurrent access by
    // its threads is not a data race. A truncation would raise SIGBUS in the
    // worker process, which the parent reports as a failed run.
    unsafe { MmapOptions::new().map_mut(file) }
}

/// The map as atomic 64-bit words (length rounded down).
pub(crate) fn as_atomic_words(map: &MmapMut) -> &[std::sync::atomic::AtomicU64] {
    let ptr = map.as_ptr();
    assert_eq!(ptr as usize % 8, 0, "mappings are page-aligned");
    // SAFETY: the mapping is page-aligned (so 8-byte aligned) and `len / 8`
    // words long; AtomicU64 has the size and alignment of u64 and any bit
    // pattern is valid; the returned slice borrows `map`, so the mapping
    // outlives it; all access through it is atomic, so threads sharing it
    // do not race.
    unsafe { std::slice::from_raw_parts(ptr.cast::<std::sync::atomic::AtomicU64>(), map.len() / 8) }
}

/// `madvise(MADV_DONTNEED)` on `[offset, offset+len)` of an anonymous private
/// map: the pages are freed and read back as zeros on the next touch.
pub(crate) fn discard(map: &MmapMut, offset: usize, len: usize) -> io::Result<()> {
    // SAFETY: the map is private anonymous memory owned by the caller through
    // `&MmapMut`; discarding it only replaces its bytes by zeros, which every
    // caller in this crate expects (the workloads rewrite the area after each
    // discard). No reference into the map's bytes is alive across this call
    // because `map` is borrowed shared and the byte slices are re-borrowed
    // after the call.
    unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, offset, len) }
}

/// CPU time and faults of this whole process (all threads, also the ones that
/// have exited), from `getrusage(RUSAGE_SELF)`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    pub user_s: f64,
    pub sys_s: f64,
    pub minflt: u64,
    pub majflt: u64,
}

pub(crate) fn rusage_self() -> io::Result<Usage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` points to writable memory of the size getrusage writes.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getrusage returned 0, so it filled the whole struct (and it was
    // zero-initialised before anyway).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(Usage {
        user_s: tv(ru.ru_utime),
        sys_s: tv(ru.ru_stime),
        minflt: ru.ru_minflt as u64,
        majflt: ru.ru_majflt as u64,
    })
}

/// Pin the calling thread to one CPU (best effort: an error is returned, the
/// workloads ignore it on machines with fewer CPUs).
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: `cpu` is below the set's capacity (checked above), so CPU_SET
    // writes inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t and its size is passed; pid 0 means
    // the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`: drop the file's clean,
/// unmapped pages from the page cache.
pub(crate) fn evict_file_cache(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is valid for the duration of the call (borrowed from
    // `file`); posix_fadvise only reads its arguments.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}
