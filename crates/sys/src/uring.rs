//! io_uring for write-back: the positional writes of one batch submitted
//! together and waited for together.
//!
//! ```text
//!   fill the submission queue (up to its size) with IORING_OP_WRITE entries
//!   one io_uring_enter: submit them and wait until all of them completed
//!   reap the completions (one result per write, by index), repeat
//! ```
//!
//! The contract that makes [`WriteRing::write_all`] safe to call with raw
//! addresses, as [`pwrite_from`](crate::io::pwrite_from) is: the kernel only
//! reads `[addr, addr+len)` (an address that is not mapped fails that write
//! with `EFAULT`), and `write_all` returns only after every write it
//! submitted has completed, so no kernel access to the memory outlives the
//! call. A caller that releases the memory after the call (upager's
//! eviction) therefore never has the kernel read it afterwards. The wait
//! is not bounded by a timeout for that reason.
//!
//! Minimum kernel 5.6 (`IORING_OP_WRITE`); `IORING_SETUP_SUBMIT_ALL` (5.18)
//! is asked for, so one bad entry does not stop the rest of a submission.
//! io_uring may be disabled (`kernel.io_uring_disabled`, seccomp, old
//! kernels): [`WriteRing::new`] then fails with `EPERM`, `ENOSYS` or
//! `EACCES` and the caller writes with `pwrite`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, types, IoUring};

/// Largest write one entry asks for; the kernel caps a write at
/// `MAX_RW_COUNT` (2 GiB − 4 KiB) anyway: a longer op completes short and
/// the caller writes the rest.
const MAX_OP_LEN: u64 = 1 << 30;

/// One positional write of a batch: `len` bytes at mapping address `addr`
/// to `fd` at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct WriteOp<'a> {
    /// The file written.
    pub fd: BorrowedFd<'a>,
    /// First byte of the source, memory of one of the caller's mappings.
    pub addr: u64,
    /// Bytes to write.
    pub len: u64,
    /// File offset.
    pub offset: u64,
}

/// How a [`WriteRing::write_all`] call went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use]
pub struct Submitted {
    /// `io_uring_enter` calls made (submissions to the kernel).
    pub enters: u64,
    /// The ring refused a submission with nothing in flight: the ops left
    /// `None` were not submitted, and the ring must be dropped (its queue
    /// still holds them).
    pub broken: bool,
}

/// An io_uring instance used only for batches of writes, by one thread at
/// a time (`&mut self`).
pub struct WriteRing {
    ring: IoUring,
}

impl std::fmt::Debug for WriteRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRing")
            .field("fd", &self.ring.as_raw_fd())
            .finish()
    }
}

impl WriteRing {
    /// A ring of `entries` submission slots (a power of two).
    /// A masked [`IoUring`](crate::features::Feature::IoUring) fails with
    /// `ENOSYS`, as a kernel without io_uring does.
    pub fn new(entries: u32) -> io::Result<WriteRing> {
        if crate::features::masked(crate::features::Feature::IoUring) {
            return Err(crate::features::refused());
        }
        let ring = IoUring::builder().setup_submit_all().build(entries)?;
        Ok(WriteRing { ring })
    }

    /// Submission slots: the writes one `io_uring_enter` can carry.
    pub fn entries(&mut self) -> usize {
        self.ring.submission().capacity()
    }

    /// Writes every op of `ops`, `entries()` at a time with one
    /// `io_uring_enter` that submits them and waits for all of them, and
    /// returns once every submitted op has completed. `out[i]` becomes the
    /// bytes op `i` wrote (possibly fewer than asked: the caller writes the
    /// rest) or its error; it stays `None` if the op was not submitted
    /// ([`Submitted::broken`]). `out.len()` must equal `ops.len()`.
    pub fn write_all(
        &mut self,
        ops: &[WriteOp<'_>],
        out: &mut [Option<io::Result<u64>>],
    ) -> Submitted {
        assert_eq!(ops.len(), out.len(), "one result per op");
        out.iter_mut().for_each(|o| *o = None);
        let mut done = Submitted::default();
        let mut next = 0usize;
        let mut inflight = 0usize;
        while next < ops.len() || inflight > 0 {
            {
                let mut sq = self.ring.submission();
                while next < ops.len() && !sq.is_full() {
                    let op = &ops[next];
                    let e = opcode::Write::new(
                        types::Fd(op.fd.as_raw_fd()),
                        op.addr as *const u8,
                        op.len.min(MAX_OP_LEN) as u32,
                    )
                    .offset(op.offset)
                    .build()
                    .user_data(next as u64);
                    // SAFETY: the entry names a live descriptor (`op.fd` is
                    // borrowed for the call) and a source the kernel only
                    // reads (EFAULT if unmapped, never a write to Rust
                    // memory); this function does not return before the
                    // op's completion is reaped below, so nothing the
                    // kernel reads outlives the call. The queue is not
                    // full (checked above).
                    let pushed = unsafe { sq.push(&e) };
                    debug_assert!(pushed.is_ok(), "queue was not full");
                    next += 1;
                }
            }
            let queued = self.ring.submission().len();
            let want = inflight + queued;
            let res = self.ring.submit_and_wait(want);
            done.enters += 1;
            // Count what the kernel took from the queue, whatever the call
            // returned (it may submit and then be interrupted waiting).
            inflight += queued - self.ring.submission().len();
            if let Err(e) = res {
                let retry = matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                );
                if inflight == 0 && !retry {
                    done.broken = true;
                    return done;
                }
                if !retry {
                    // Cannot happen with a valid ring; the writes in flight
                    // must still be waited for (see the module doc).
                    debug_assert!(false, "io_uring_enter failed with writes in flight: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                let r = cqe.result();
                out[i] = Some(if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r as u64)
                });
                inflight -= 1;
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::AlignedBuf;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    fn ring() -> Option<WriteRing> {
        match WriteRing::new(8) {
            Ok(r) => Some(r),
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("io_uring unavailable under CI: {e}")
            }
            Err(e) => {
                eprintln!("skipping: io_uring unavailable: {e}");
                None
            }
        }
    }

    /// 20 scattered writes through an 8-entry ring: 3 enters, every byte
    /// where it belongs; a write from an unmapped address fails alone.
    #[test]
    fn writes_are_submitted_in_ring_sized_groups_and_fail_one_by_one() {
        let Some(mut ring) = ring() else { return };
        let f = tempfile::tempfile().unwrap();
        let mut buf = AlignedBuf::zeroed(20 * 4096);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i / 4096) as u8 + 1;
        }
        let base = buf.as_ptr() as u64;
        let mut ops: Vec<WriteOp<'_>> = (0..20u64)
            .map(|i| WriteOp {
                fd: f.as_fd(),
                addr: base + i * 4096,
                len: 4096,
                offset: (19 - i) * 3 * 4096,
            })
            .collect();
        ops[7].addr = 8; // the first page is never mapped
        let mut out: Vec<Option<io::Result<u64>>> = (0..20).map(|_| None).collect();
        let s = ring.write_all(&ops, &mut out);
        assert_eq!(s.enters, 3, "20 writes, 8 per enter");
        assert!(!s.broken);
        for (i, o) in out.iter().enumerate() {
            let o = o.as_ref().expect("every op completed");
            if i == 7 {
                assert_eq!(o.as_ref().unwrap_err().raw_os_error(), Some(libc::EFAULT));
                continue;
            }
            assert_eq!(*o.as_ref().unwrap(), 4096, "op {i}");
            let mut got = [0u8; 4096];
            f.read_exact_at(&mut got, (19 - i as u64) * 3 * 4096)
                .unwrap();
            assert!(got.iter().all(|&b| b == i as u8 + 1), "op {i}'s data");
        }
        let mut hole = [1u8; 4096];
        f.read_exact_at(&mut hole, (19 - 7) * 3 * 4096).unwrap();
        assert!(hole.iter().all(|&b| b == 0), "the failed op wrote nothing");
    }
}
