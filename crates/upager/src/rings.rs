//! The io_uring rings of write-back: [`write_together`] submits all the
//! writes of one batch together through a ring taken from the pager's
//! [`RingPool`] (one per thread writing at a time) and returns when every
//! one has completed, so the store works on them in parallel where it can
//! and one batch of scattered 4 KiB folios costs a few `io_uring_enter`
//! calls instead of one `pwrite` each. Where io_uring is unavailable it
//! writes one by one (and logs that once; [`IO_URING_OFF`]). Ordering:
//! Relaxed on [`IO_URING_OFF`] (it only chooses the path); the pool's lock
//! is only tried, never waited for.
//!
//! Uses: `direct`, `store`.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use upager_sys::uring::{WriteOp, WriteRing};

use crate::direct::{Fds, Refused};
use crate::store::{Src, Write, Written};

/// Submission slots of a write-back ring: a batch of 1024 scattered folios
/// (the largest) takes 4 `io_uring_enter` calls. A guess, not measured
/// against other sizes: the enter is cheap next to 256 writes.
const RING_ENTRIES: u32 = 256;

/// Idle rings a pager keeps for reuse; more are closed when returned.
/// About the threads that write back at once (reclaimer, fault handlers,
/// a flushing application thread); a guess.
const IDLE_RINGS: usize = 4;

/// io_uring refused with EPERM/ENOSYS/EACCES somewhere in this process
/// (a sysctl or seccomp filter applies to all of it): write one by one.
pub(crate) static IO_URING_OFF: AtomicBool = AtomicBool::new(false);

/// The write-back rings of one pager's stores: taken by a batch, returned
/// after it. Every store of a pager holds the same pool (see
/// [`Shares`]), so the pager keeps at most [`IDLE_RINGS`] ring descriptors
/// however many files it maps, and closes them with its last store. Never
/// blocks (a busy lock means a fresh ring); rings made before a fork are
/// not used by the child (they are the parent's queues).
#[derive(Debug, Default)]
pub(crate) struct RingPool {
    idle: Mutex<Vec<(u32, WriteRing)>>,
}

impl RingPool {
    fn take(&self) -> Option<WriteRing> {
        if IO_URING_OFF.load(Ordering::Relaxed) {
            return None;
        }
        let pid = std::process::id();
        if let Ok(mut idle) = self.idle.try_lock() {
            idle.retain(|(p, _)| *p == pid);
            if let Some((_, r)) = idle.pop() {
                return Some(r);
            }
        }
        match WriteRing::new(RING_ENTRIES) {
            Ok(r) => Some(r),
            Err(e) => {
                // EINVAL: a kernel before 5.18, which does not know
                // IORING_SETUP_SUBMIT_ALL (before 5.18): pwrite there too.
                let off = matches!(
                    e.raw_os_error(),
                    Some(
                        libc::EPERM | libc::ENOSYS | libc::EACCES | libc::EOPNOTSUPP | libc::EINVAL
                    )
                );
                if off && !IO_URING_OFF.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "io_uring unavailable ({e}): write-back submits one pwrite per write"
                    );
                } else if !off {
                    log::debug!("no write-back ring ({e}): this batch writes one by one");
                }
                None
            }
        }
    }

    fn put(&self, ring: WriteRing) {
        if let Ok(mut idle) = self.idle.try_lock() {
            if idle.len() < IDLE_RINGS {
                idle.push((std::process::id(), ring));
            }
        }
    }
}

/// Writes a batch through one ring, all submitted together (see the module
/// doc), each write to the descriptor `fds` picks for it. A write the ring
/// could not submit, that completed short or was interrupted is finished
/// with `pwrite`; one the direct descriptor refused (EINVAL) is done again
/// whole through the buffered one ([`Fds::write`]). One by one when there
/// is no ring or one write.
pub(crate) fn write_together(rings: &RingPool, fds: &Fds, batch: &[Write<'_>]) -> Written {
    let one_by_one = |batch: &[Write<'_>]| {
        let results: Vec<_> = batch.iter().map(|w| fds.write(w.src, w.offset)).collect();
        Written::new(results, batch.len() as u64)
    };
    if batch.len() < 2 {
        return one_by_one(batch);
    }
    let Some(mut ring) = rings.take() else {
        return one_by_one(batch);
    };
    // Each write's descriptor, and whether it is the direct one.
    let files: Vec<(&File, bool)> = batch
        .iter()
        .map(|w| match fds.pick(w.src.addr(), w.src.len(), w.offset) {
            Some(d) => (d, true),
            None => (&fds.buffered, false),
        })
        .collect();
    let ops: Vec<WriteOp<'_>> = batch
        .iter()
        .zip(&files)
        .map(|(w, (f, _))| WriteOp {
            fd: std::os::fd::AsFd::as_fd(*f),
            addr: w.src.addr(),
            len: w.src.len() as u64,
            offset: w.offset,
        })
        .collect();
    let mut out: Vec<Option<io::Result<u64>>> = (0..batch.len()).map(|_| None).collect();
    let s = ring.write_all(&ops, &mut out);
    if s.stalled {
        log::warn!(
            "io_uring write-back of {} writes made no progress for {} s: cancelled, written with pwrite instead, and that ring dropped",
            batch.len(),
            upager_sys::uring::STALL.as_secs()
        );
    }
    if !s.broken {
        rings.put(ring);
    }
    let mut submissions = s.enters;
    let results = batch
        .iter()
        .zip(out)
        .zip(&files)
        .map(|((w, o), &(f, direct))| {
            let done = match o {
                Some(Ok(n)) if n as usize >= w.src.len() => return Ok(()),
                Some(Ok(n)) => n as usize,
                Some(Err(e)) if direct && fds.refuse(&e, Refused::RingWrite) => {
                    submissions += 1;
                    return w.src.write_to(&fds.buffered, w.offset);
                }
                Some(Err(e)) if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {
                    return Err(e)
                }
                _ => 0,
            };
            submissions += 1;
            let rest = Src {
                map: w.src.map,
                off: w.src.off + done,
                len: w.src.len - done,
            };
            fds.write_at(f, direct, rest, w.offset + done as u64)
        })
        .collect();
    Written::new(results, submissions)
}
