//! Copy-on-write file regions: `numpy.memmap`'s mode "c".
//!
//! A [`CopyOnWrite`] store reads a file and never writes it: folios written
//! back (on eviction or flush) go to a private, unlinked swap file at the
//! same offsets, and a bitmap of 4 KiB pages remembers which ones. Reads
//! take each page from the swap file when it was written, else from the
//! file. So a region over it is writable, its writes survive eviction, and
//! the file is never changed; they are gone when the region is closed.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use upager::{FileStore, Src, Store, SwapFile, Write, Written};

const PAGE: u64 = 4096;

/// A read-only file with private writes (see the module's documentation).
#[derive(Debug)]
pub struct CopyOnWrite {
    base: FileStore,
    private: SwapFile,
    /// One bit per 4 KiB page of the file: 1 = its data is in `private`.
    written: Vec<AtomicU64>,
}

impl CopyOnWrite {
    /// Opens `path` read-only; private writes go to an unnamed file in
    /// `swap_dir`.
    pub fn open(path: &Path, swap_dir: &Path, direct: bool) -> io::Result<CopyOnWrite> {
        let base = FileStore::open(path, false, direct)?;
        let private = SwapFile::create(swap_dir, direct).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "could not create the private file of a copy-on-write region in {}: {e} (pass swap_dir= to choose another directory)",
                    swap_dir.display()
                ),
            )
        })?;
        let pages = base.len().div_ceil(PAGE);
        let written = (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(CopyOnWrite {
            base,
            private,
            written,
        })
    }

    fn is_written(&self, page: u64) -> bool {
        self.written
            .get((page / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page % 64)) != 0)
    }

    fn mark_written(&self, offset: u64, len: u64) {
        for page in offset / PAGE..(offset + len).div_ceil(PAGE) {
            if let Some(w) = self.written.get((page / 64) as usize) {
                w.fetch_or(1 << (page % 64), Ordering::Release);
            }
        }
    }
}

impl Store for CopyOnWrite {
    fn len(&self) -> u64 {
        self.base.len()
    }

    fn writable(&self) -> bool {
        true
    }

    /// Runs of pages from one source each; a short read from the file (its
    /// end) zero-fills the rest, as the file store does.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let total = buf.len();
        let mut done = 0usize;
        while done < total {
            let first = (offset + done as u64) / PAGE;
            let private = self.is_written(first);
            let mut end = done + PAGE as usize;
            while end < total && self.is_written((offset + end as u64) / PAGE) == private {
                end += PAGE as usize;
            }
            let end = end.min(total);
            let chunk = &mut buf[done..end];
            let at = offset + done as u64;
            let n = if private {
                self.private.read_at(chunk, at)?
            } else {
                self.base.read_at(chunk, at)?
            };
            if n < chunk.len() {
                chunk[n..].fill(0);
                if !private {
                    return Ok(done + n); // the end of the file
                }
            }
            done = end;
        }
        Ok(total)
    }

    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        self.private.write_from(src, offset)?;
        self.mark_written(offset, src.len() as u64);
        Ok(())
    }

    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let done = self.private.write_batch(batch);
        for (w, r) in batch.iter().zip(&done.results) {
            if r.is_ok() {
                self.mark_written(w.offset, w.src.len() as u64);
            }
        }
        done
    }

    /// Nothing reaches the file: private writes need not survive the process.
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    /// `pread`s and atomic loads only, like both stores it reads.
    fn signal_safe(&self) -> bool {
        self.base.signal_safe() && self.private.signal_safe()
    }
}
