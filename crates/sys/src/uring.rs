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
//! A stall (no completion for [`STALL`], 4 s; seen once here: a swap-file batch
//! of 128 writes to tmpfs sat queued with no io-wq worker to run it, in a
//! loaded in-thread test run) is not waited out for ever: the ring cancels
//! what is still in flight (`IORING_OP_ASYNC_CANCEL`, any request; 5.19),
//! waits for those completions too (a cancelled write did not happen, or
//! completed: either way the kernel is done with its memory), hands the
//! cancelled ops back as not submitted (`None`: the caller writes them with
//! `pwrite`) and reports the ring broken, so it is not used again. Where
//! the timeout or the cancel is not available, the wait stays unbounded.
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

/// How long [`WriteRing::write_all`] waits without a completion before it
/// cancels what is in flight (see the module doc). A batch of writes to a
/// RAM disk completes in milliseconds, a slow disk's in seconds; below the
/// engine's 5 s bound on a fault waiting for room, so a stalled ring does
/// not turn into SIGBUS. A cancel that comes early costs only speed: a
/// write already running completes, the rest are written with `pwrite`.
pub const STALL: std::time::Duration = std::time::Duration::from_secs(4);

/// `user_data` of the cancel entry (op indices are below `ops.len()`).
const CANCEL_TAG: u64 = u64::MAX;

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
    /// The ring refused a submission with nothing in flight, or stalled
    /// and had its writes cancelled: the ops left `None` were not
    /// submitted (or were cancelled), and the ring must be dropped.
    pub broken: bool,
    /// The ring stalled for [`STALL`] and what was in flight was cancelled.
    pub stalled: bool,
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
        self.write_all_within(ops, out, STALL)
    }

    /// [`WriteRing::write_all`] with `stall` in place of [`STALL`].
    pub fn write_all_within(
        &mut self,
        ops: &[WriteOp<'_>],
        out: &mut [Option<io::Result<u64>>],
        stall: std::time::Duration,
    ) -> Submitted {
        assert_eq!(ops.len(), out.len(), "one result per op");
        out.iter_mut().for_each(|o| *o = None);
        let mut done = Submitted::default();
        let mut next = 0usize;
        let mut inflight = 0usize;
        // A cancel entry is in flight (after a stall).
        let mut cancelling = false;
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
            // The cancel entry, once pushed, is counted as any entry: queued,
            // then in flight until its completion is reaped.
            let want = inflight + queued;
            let ts = types::Timespec::from(stall);
            let bounded = !cancelling && self.ring.params().is_feature_ext_arg();
            let res = if bounded {
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            } else {
                self.ring.submit_and_wait(want)
            };
            done.enters += 1;
            // Count what the kernel took from the queue, whatever the call
            // returned (it may submit and then be interrupted waiting).
            inflight += queued - self.ring.submission().len();
            if let Err(e) = &res {
                if e.raw_os_error() == Some(libc::ETIME)
                    && self.ring.completion().is_empty()
                    && inflight > 0
                {
                    // A stall: cancel what is in flight, then wait for it.
                    // (An enter that submits returns its count, not ETIME, so
                    // this is reached only once every op was submitted: the
                    // cancel covers all that is left.)
                    let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                        .build()
                        .user_data(CANCEL_TAG);
                    // SAFETY: a cancel entry names no memory.
                    let pushed = unsafe { self.ring.submission().push(&cancel) };
                    if pushed.is_ok() {
                        cancelling = true;
                        done.stalled = true;
                    }
                    continue;
                }
            }
            if let Err(e) = res {
                let retry = matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ETIME)
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
                if cqe.user_data() == CANCEL_TAG {
                    cancelling = false;
                    inflight -= 1;
                    continue;
                }
                let i = cqe.user_data() as usize;
                let r = cqe.result();
                out[i] = match r {
                    // Cancelled after a stall: not written, the caller does.
                    _ if r == -libc::ECANCELED && done.stalled => None,
                    _ if r < 0 => Some(Err(io::Error::from_raw_os_error(-r))),
                    _ => Some(Ok(r as u64)),
                };
                inflight -= 1;
            }
            if done.stalled && inflight == 0 && !cancelling {
                // The rest (if any) is not submitted: the caller writes it.
                done.broken = true;
                return done;
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

    /// A write that can never complete (to a full pipe nobody reads) is
    /// cancelled after the stall time and handed back as not written; the
    /// ring reports the stall and asks to be dropped; a write to a file in
    /// the same batch keeps its result.
    #[test]
    fn a_stalled_batch_is_cancelled_and_handed_back() {
        let Some(mut ring) = ring() else { return };
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
        assert_eq!(rc, 0);
        // SAFETY: pipe2 returned these two new descriptors, owned here.
        let (rd, wr) = unsafe {
            use std::os::fd::FromRawFd;
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        // Fill the pipe, then make it blocking: a write now waits for a
        // reader that never comes.
        let mut w = std::fs::File::from(wr.try_clone().unwrap());
        while std::io::Write::write(&mut w, &[7u8; 4096]).is_ok() {}
        // SAFETY: F_SETFL on a descriptor owned here; no memory involved.
        assert_eq!(unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETFL, 0) }, 0);
        let f = tempfile::tempfile().unwrap();
        let buf = AlignedBuf::zeroed(8192);
        let ops = [
            WriteOp {
                fd: f.as_fd(),
                addr: buf.as_ptr() as u64,
                len: 4096,
                offset: 0,
            },
            WriteOp {
                fd: wr.as_fd(),
                addr: buf.as_ptr() as u64 + 4096,
                len: 4096,
                offset: 0,
            },
        ];
        let mut out: Vec<Option<io::Result<u64>>> = vec![None, None];
        let t = std::time::Instant::now();
        let s = ring.write_all_within(&ops, &mut out, std::time::Duration::from_millis(200));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert!(s.stalled && s.broken, "{s:?}");
        assert!(matches!(out[0], Some(Ok(4096))), "{:?}", out[0]);
        assert!(
            out[1].is_none(),
            "the stalled write is handed back: {:?}",
            out[1]
        );
        drop(rd);
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
