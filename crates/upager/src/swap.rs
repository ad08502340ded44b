//! The swap space of anonymous regions: [`SwapFile`], the private swap
//! file (created 0600 and unlinked at once; its I/O through the shared
//! `O_DIRECT`/buffered descriptors of `direct` and the rings of `rings`),
//! and [`Slots`], the allocator of its slots.
//!
//! [`Slots`] is the store index that reclaim updates (seed 003): a batch of
//! evicted folios gets its slots under one lock acquisition, and a batch of
//! discarded folios returns them under one, their holes punched before (a
//! freed slot may be reused at once, so a punch after the free could wipe
//! the new owner's data). Lock: the slots' one mutex, a leaf.
//!
//! Uses: `direct`, `rings`, `store`.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::direct::{path_of, reopen_direct, Fds};
use crate::rings::{write_together, RingPool};
use crate::store::{Src, Store, Write, Written};

/// The private swap file of an anonymous region: created with mode 0600 and
/// unlinked before anyone else can open it; closing it frees its space.
#[derive(Debug)]
pub struct SwapFile {
    pub(crate) fds: Fds,
    /// Write-back rings: its own, or its pager's once shared.
    pub(crate) rings: Arc<RingPool>,
}

impl SwapFile {
    /// Creates an unnamed file in `dir` (O_TMPFILE, or create + unlink).
    pub fn create(dir: &Path, direct: bool) -> io::Result<SwapFile> {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc_o_tmpfile())
            .open(dir)
        {
            Ok(f) => f,
            Err(_) => {
                let name = dir.join(format!(".upager-swap-{}-{}", std::process::id(), unique()));
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&name)?;
                std::fs::remove_file(&name)?;
                f
            }
        };
        // A second O_DIRECT descriptor on the same unnamed inode.
        let direct = if direct {
            reopen_direct(&file, true)
        } else {
            None
        };
        Ok(SwapFile {
            fds: Fds::new(file, direct),
            rings: Arc::default(),
        })
    }

    /// Whether aligned I/O goes through an `O_DIRECT` descriptor now (as
    /// [`FileStore::direct_io`]).
    pub fn direct_io(&self) -> bool {
        self.fds.direct().is_some()
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        self.fds.report(|| self.describe());
    }
}
fn libc_o_tmpfile() -> i32 {
    libc::O_TMPFILE // includes O_DIRECTORY
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Store for SwapFile {
    fn len(&self) -> u64 {
        u64::MAX
    }
    fn describe(&self) -> String {
        format!("swap file {}", path_of(&self.fds.buffered))
    }
    fn writable(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.fds.read(buf, offset);
        self.fds.report(|| self.describe());
        let n = n?;
        buf[n..].fill(0); // a slot past the file's end reads as zeros
        Ok(buf.len())
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        let res = self.fds.write(src, offset);
        self.fds.report(|| self.describe());
        res
    }
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let done = write_together(&self.rings, &self.fds, batch);
        self.fds.report(|| self.describe());
        done
    }
    fn sync(&self) -> io::Result<()> {
        self.fds.report(|| self.describe());
        Ok(()) // swap contents need not survive the process
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        upager_sys::io::punch_hole(&self.fds.buffered, offset, len)
    }
    fn signal_safe(&self) -> bool {
        true // pread into the caller's buffer
    }
}
/// Allocator of swap slots (the store index reclaim updates, seed 003).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    inner: Mutex<SlotsInner>,
}

#[derive(Debug, Default)]
struct SlotsInner {
    free: Vec<u32>,
    next: u32,
    /// Lock acquisitions, for the test that removal is batched.
    acquisitions: u64,
}

impl Slots {
    /// Hands out `n` slots. `batched`: one lock acquisition for all (seed
    /// 003); otherwise one per slot (the ablation).
    pub fn alloc(&self, n: usize, batched: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(n);
        let one = |g: &mut SlotsInner, out: &mut Vec<u32>| {
            let s = g.free.pop().unwrap_or_else(|| {
                g.next += 1;
                g.next - 1
            });
            out.push(s);
        };
        if batched {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.acquisitions += 1;
            for _ in 0..n {
                one(&mut g, &mut out);
            }
        } else {
            for _ in 0..n {
                let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                g.acquisitions += 1;
                one(&mut g, &mut out);
            }
        }
        out
    }

    /// Returns slots. A slot may be handed out again as soon as this
    /// returns: punch its space (if at all) before calling this.
    pub fn free(&self, slots: &[u32], batched: bool) {
        if slots.is_empty() {
            return;
        }
        if batched {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.acquisitions += 1;
            g.free.extend_from_slice(slots);
        } else {
            for &s in slots {
                let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                g.acquisitions += 1;
                g.free.push(s);
            }
        }
    }

    /// Lock acquisitions so far.
    pub fn acquisitions(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .acquisitions
    }

    /// Slots in use.
    #[cfg(test)]
    pub fn in_use(&self) -> u64 {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        u64::from(g.next) - g.free.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_batch_under_one_lock() {
        let s = Slots::default();
        let a = s.alloc(64, true);
        assert_eq!(a.len(), 64);
        assert_eq!(s.acquisitions(), 1);
        s.free(&a[..10], true);
        assert_eq!(s.acquisitions(), 2);
        assert_eq!(s.in_use(), 54);
        let b = s.alloc(10, false);
        assert_eq!(s.acquisitions(), 12);
        let mut all: Vec<u32> = a[10..].iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 64, "no slot handed out twice");
    }

    #[test]
    fn swap_file_is_private_and_unnamed() {
        let dir = tempfile::tempdir().unwrap();
        let sw = SwapFile::create(dir.path(), true).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "swap file must be unlinked"
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            sw.fds.buffered.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );
        let mut buf = upager_sys::mem::AlignedBuf::zeroed(8192);
        assert_eq!(sw.read_at(&mut buf, 1 << 30).unwrap(), 8192);
    }
}
