//! Installing a fill's bytes in the view: `UFFDIO_COPY` with its retries,
//! and what to do when a writable install stops part-way.
//!
//! Contract:
//! - [`Shared::copy_all`] copies without waking (the fill wakes the
//!   faulting thread once it has published the folios' states), retries a
//!   partial copy (`EAGAIN`), and drops a leftover page it finds mapped in
//!   a range its caller owns (`EEXIST`: an earlier fill interrupted
//!   part-way) before copying again, and copies a folio at a time where the
//!   range spans VMAs (`ENOENT`: an mprotect split the region). It reports
//!   how much of the range's start it filled when it gives up.
//! - A folio installed writable is never dropped once part of it is in:
//!   other threads may store into it without a fault from the first page
//!   copied on. [`Shared::settle_writable`] retries the rest for
//!   [`SETTLE_FOR`]; then, in this order: 1) write-protect what is
//!   installed (no store lands after this) 2) compare it with the data
//!   copied 3) unchanged: it may be dropped; changed: write it to the store
//!   first. Only when the protection or that write fails can a store be
//!   lost (logged, counted).
//! - A write fill that dirties one page of a larger folio
//!   ([`Shared::copy_page_writable`], dirty.rs) installs the protected
//!   pages first and the written page last: until that last copy, nothing
//!   writable is in, and a 4 KiB copy is in whole or not at all.
//! - Async-signal-safe when `quiet` (in a SIGBUS handler): no allocation,
//!   no message (the resolver thread that redoes the fill logs).
//!
//! Counters: `writes_lost`.
//!
//! Uses: `area`, `folio`, `shared`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use upager_sys::mem::MapRange;
use upager_sys::uffd::Fill;

use crate::area::Area;
use crate::folio;
use crate::shared::Shared;

/// How long a fill keeps retrying the install of a folio that is already
/// partly mapped writable (see `settle_writable`) before giving up on it.
const SETTLE_FOR: Duration = Duration::from_secs(1);

impl Shared {
    /// UFFDIO_COPY of `src` to `dst`, retrying partial copies. `Err(done)`
    /// if the range could not be filled, with the bytes at its start that
    /// were (logged unless `quiet`: in a signal handler, the resolver thread
    /// that redoes the fill logs it).
    pub(crate) fn copy_all(
        &self,
        r: &Area,
        dst: MapRange<'_>,
        src: &[u8],
        wp: bool,
        quiet: bool,
    ) -> Result<(), usize> {
        let mut done = 0usize;
        let len = src.len();
        // Bytes per call: the whole range, until the kernel says it spans
        // two VMAs (`ENOENT`), then one folio per call. (The region is one
        // VMA when mapped; an mprotect of some of its folios — the user's,
        // or a poisoned folio's PROT_NONE before 6.6, poison.rs — splits
        // it, and the kernel does not always merge the parts again once
        // their protections agree: anonymous parts that got anon_vmas of
        // their own while apart stay apart. Every split is at a folio
        // boundary. Test read_errors_and_slow_reads_... with uffd_poison
        // masked.)
        let mut step = len;
        let folio = r.folio as usize;
        // Base pages (and their page table) under these folios from now on.
        let first = ((dst.addr() - r.base()) >> r.shift) as usize;
        r.note_table(first, (len as u64).div_ceil(r.folio) as usize);
        // Any userfaultfd of the pager may fill a registered range (the run
        // stays inside one shard's registration); the wake comes later.
        let uffd = self.uffd_of(r, ((dst.addr() - r.base()) >> r.shift) as usize);
        // Calls that filled less than asked, before giving up.
        let mut stalls = 0;
        while done < len && stalls < 16 {
            // (To the next folio boundary, once a folio at a time.)
            let want = (step - done % step).min(len - done);
            match uffd.copy(dst.sub(done, want), &src[done..done + want], wp, false) {
                Ok(Fill::Done) => done += want,
                Ok(Fill::Retry { done: d }) => {
                    done += d as usize;
                    stalls += 1;
                }
                Ok(Fill::Exists { done: d }) => {
                    // A page we own (BUSY) is mapped: a leftover (e.g. an
                    // earlier fill interrupted part-way). Drop the rest of
                    // the range we own and copy again. (Never a page this
                    // fill installed: those are before `done`.)
                    done += d as usize;
                    stalls += 1;
                    if done < len {
                        self.zap(&[dst.sub(done, len - done)], "a leftover page", quiet);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && want > folio => {
                    step = folio;
                    stalls += 1;
                }
                Err(_) if quiet => return Err(done),
                Err(e) => {
                    log::error!(
                        "UFFDIO_COPY at {:#x} (region {}) failed: {e}",
                        dst.addr() + done as u64,
                        r.id
                    );
                    return Err(done);
                }
            }
        }
        if done >= len {
            Ok(())
        } else {
            Err(done)
        }
    }

    /// A write fill of folio `idx` that dirties one page (dirty.rs): the
    /// folio's other pages installed write-protected first (a failure may
    /// still drop them: nothing writable is in), then `page` writable — one
    /// page, so it is in whole or not at all. True when all of it is in.
    pub(crate) fn copy_page_writable(
        &self,
        r: &Area,
        idx: usize,
        page: u64,
        src: &[u8],
        quiet: bool,
    ) -> bool {
        const PAGE: usize = 4096;
        let (at, end) = ((page as usize) * PAGE, src.len());
        let span = r.span(idx, 1);
        let protected = |from: usize, to: usize| {
            from == to
                || self
                    .copy_all(r, span.sub(from, to - from), &src[from..to], true, quiet)
                    .is_ok()
        };
        protected(0, at)
            && protected(at + PAGE, end)
            && self
                .copy_all(r, span.sub(at, PAGE), &src[at..at + PAGE], false, quiet)
                .is_ok()
    }

    /// A writable install of `dst` (one folio, from `src`) stopped after
    /// `done` bytes. Those bytes are mapped writable: another thread may
    /// have stored into them already, so they must not be dropped. Retries
    /// the rest for up to [`SETTLE_FOR`]; true once the folio is whole (the
    /// caller publishes it DIRTY). If the kernel keeps refusing, the
    /// installed part is write-protected and compared with `src`: unchanged
    /// (no store landed), it may be dropped (false); changed, it is written
    /// to the store first (file regions), and only a store that refuses that
    /// loses the store — logged, and counted in `writes_lost`.
    pub(crate) fn settle_writable(
        &self,
        r: &Area,
        dst: MapRange<'_>,
        mut done: usize,
        src: &[u8],
        quiet: bool,
    ) -> bool {
        let len = dst.len() as usize;
        let deadline = std::time::Instant::now() + SETTLE_FOR;
        while std::time::Instant::now() < deadline {
            match self.copy_all(r, dst.sub(done, len - done), &src[done..len], false, true) {
                Ok(()) => return true,
                Err(d) => done += d,
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let idx = ((dst.addr() - r.base()) >> r.shift) as usize;
        let installed = dst.sub(0, done);
        if self
            .uffd_of(r, idx)
            .writeprotect(installed, true, false)
            .is_err()
        {
            // Stores to it cannot be stopped, so its contents cannot be
            // known: report.
            self.counters.writes_lost.inc();
            if !quiet {
                log::error!(
                    "region {}: folio {idx} could neither be installed whole nor protected; stores to its first {done} bytes may be lost",
                    r.id
                );
            }
            return false;
        }
        // Compare in place (no allocation: this may run in a SIGBUS
        // handler). `done` is a multiple of the page size.
        let first = (idx << r.shift) / 8;
        let view = &r.map.atomic_words()[first..first + done / 8];
        let changed = view
            .iter()
            .zip(src[..done].chunks_exact(8))
            .any(|(w, b)| w.load(Ordering::Relaxed).to_ne_bytes() != b);
        if !changed {
            return false; // nothing landed: dropping loses nothing
        }
        // Anonymous regions have no slot for a folio being filled: nowhere
        // to save it.
        let saved = !r.is_anon()
            && r.store_offset(idx, folio::load(r.state(idx)))
                .is_some_and(|o| r.store.write_from(r.src(idx, done as u64), o).is_ok());
        if !saved {
            self.counters.writes_lost.inc();
            log::error!(
                "region {}: folio {idx} could not be installed whole and the stores that landed in its first {done} bytes could not be saved to the store",
                r.id
            );
        }
        false
    }
}
