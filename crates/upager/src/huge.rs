//! Huge fills: a 2 MiB folio, or a 2 MiB run of smaller folios, moved into
//! the view as one huge page.
//!
//! A 2 MiB folio is read into a staged huge page (thp.rs) and moved in
//! whole with one `UFFDIO_MOVE` of the PMD ([`Shared::install_huge`]);
//! without a staged page it is copied as base pages (`thp_fill_fallback`).
//!
//! Mixed folio sizes (`huge_runs`, off by default; file regions of
//! folios below 2 MiB, at least 8 MiB, 2 MiB-aligned view): once the
//! readahead window has grown to 2 MiB (a stream of 1 MiB resident before
//! the fault), it ends at the end of the faulting folio's 2 MiB run
//! (readahead.rs), so the stream's next fault starts a run; a read fault at
//! a run's first folio with the window grown claims the whole run and fills
//! it as one huge page, as 2 MiB folios are (fill.rs); with async readahead
//! the prefetch thread fills the next run the same way (ahead.rs,
//! `claim_run_ahead`), as it does a whole run that a prefetch or replay
//! reads. A run filled ahead of the stream has
//! no page table to drop first (nobody touched it), unless a thread touches
//! it while it is being filled: that fault allocates one, and the move then
//! splits the huge page and moves base pages (`thp_fill_fallback`;
//! [`Shared::install_huge`] counts what left the staged page itself,
//! `moved_from`). Random faults, write faults, a run cut by the end of the
//! file or by a resident folio, and fills that find no staged page stay
//! the region's folios. The folio state words stay per folio: a huge run
//! is N folios CLEAN (or DIRTY) together. The first write to one of them
//! unprotects that folio only (the kernel splits the PMD and keeps the
//! uffd-wp bit on the other PTEs); eviction takes a run that is still one
//! PMD whole (reclaim.rs `claim_run_rest`, gather.rs: moved out into a
//! staging slot or unmapped with one range).
//!
//! Ordering of one huge install (the folios are BUSY throughout):
//! 1) drop a page table under the run (else the move splits the page)
//! 2) a read-only region: make the run writable (the kernel moves only into
//!    writable mappings) 3) `UFFDIO_MOVE`, no wake 4) read-only again
//!    ([`Shared::close_read_only`]) 5) the staged page's charge goes back
//! 6) a read fill of a writable region: write-protect (CLEAN) 7) a move the
//!    kernel refused or made partly: copy the rest from the staged page
//! 8) compare the digests taken before the move and after the protection:
//!    a store that landed in the window between 3) and 6) makes the run
//!    DIRTY. The fill then publishes and wakes.
//!
//! Lock order: runs under the fill's staged slot (a `ThpPool` slot lock,
//! only tried), takes none.
//!
//! Counters: `thp_fills`, `thp_fill_fallback`, `thp_fill_raced`,
//! `kernel_call_errors`.
//!
//! Uses: `area`, `install`, `shared`, `thp`.

use upager_sys::mem::MapRange;
use upager_sys::uffd::Fill;

use crate::area::Area;
use crate::shared::Shared;

/// What left a staged huge page in a move that did not report success
/// (`Shared::moved_from`).
enum Left {
    /// These first bytes (what moves goes in address order).
    Prefix(usize),
    /// Pages left that are not one prefix (never seen).
    Scattered,
    /// The pagemap could not tell: the kernel's count is all there is.
    Unknown,
}

impl Shared {
    /// Installs claimed 2 MiB folio `idx` (or the `n` folios of a 2 MiB run
    /// from `idx`, mixed folio sizes) from staged huge page `st`
    /// (holding its data): one `UFFDIO_MOVE` of the whole PMD, then, for a
    /// read fill of a writable region, write-protect it (CLEAN) before
    /// anyone is woken. A move the kernel refuses (or makes partly) is
    /// finished by copying the rest from the staged page. `None` if the
    /// folio could not be installed; else whether a write landed in it
    /// before the protection (the caller publishes it DIRTY).
    ///
    /// That window is real: the kernel installs a moved PMD writable
    /// whatever the source was (`move_pages_huge_pmd`), and write-protects
    /// only in the next call, so a thread touching the folio for the first
    /// time in between writes without a fault. A read fill therefore takes
    /// a digest of the staged page before the move and of the protected
    /// view after it: a write in the window changed the data, and the
    /// folio is DIRTY, not CLEAN (a write that left the data as it was
    /// loses nothing). After the protection every write faults and waits
    /// for this fill to publish.
    pub(crate) fn install_huge(
        &self,
        r: &Area,
        idx: usize,
        n: usize,
        st: &mut crate::thp::Staged,
        write: bool,
        quiet: bool,
    ) -> Option<bool> {
        let uffd = self.uffd_of(r, idx);
        let span = r.span(idx, n);
        let wp = !write && r.writable;
        let len = span.len() as usize;
        let before = wp.then(|| crate::thp::digest_bytes(&st.buf[..len]));
        // A page table under the folio must go first, or the move splits
        // the huge page into base pages: drop it (CONFIG_PT_RECLAIM frees
        // empty page tables on MADV_DONTNEED; a TLB flush). A missing fault
        // leaves one in a view that may not hold huge pages (the kernel
        // allocates it before it raises the fault); in a `huge_view` read
        // faults come at PMD level and leave none, so only folios that had
        // base pages installed (copy, poison) have one.
        if r.take_table(idx) {
            self.zap(&[span], "a page table before a huge fill", quiet);
        }
        // A read-only region (a huge run, mixed folio sizes): the kernel
        // moves pages only into writable mappings (validate_move_areas), so
        // the run is writable from just before the move until just after
        // it (two mprotect calls; the second flushes the run's TLB entry).
        // Its folios are BUSY meanwhile: a thread touching the run waits on
        // the fault, except one that touches it in that window for the
        // first time, whose store lands instead of raising SIGSEGV; a
        // read-only region is never written back, so the store reaches no
        // file, and it is gone at the next eviction (docs/benchmarks.md).
        let opened = !r.writable && span.protect(upager_sys::mem::Access::ReadWrite).is_ok();
        let moved = if !r.writable && !opened {
            None
        } else {
            Some(uffd.move_in(span, &mut st.buf, 0))
        };
        // Moved whole as one PMD (not split into base pages on the way).
        let whole = matches!(moved, Some(Ok(Fill::Done)));
        let mut done = match moved {
            None => 0,
            Some(Ok(Fill::Done)) => len,
            Some(other) => {
                let reported = match other {
                    Ok(Fill::Retry { done } | Fill::Exists { done }) => done as usize,
                    _ => 0,
                };
                match self.moved_from(st, len) {
                    Left::Prefix(d) => d,
                    Left::Unknown => reported,
                    Left::Scattered => {
                        // Never seen: the run cannot be completed from the
                        // staged page. Dropped by the caller (nothing of it
                        // was published; its data is in the store).
                        self.counters.kernel_call_errors.inc();
                        if opened {
                            self.close_read_only(r, span, idx, quiet);
                        }
                        st.ready = false;
                        st.buf.release_from(0);
                        self.budget.uncharge(crate::thp::HUGE);
                        return None;
                    }
                }
            }
        };
        if opened {
            self.close_read_only(r, span, idx, quiet);
        }
        if done > 0 {
            // The staged page left (all or part of it): its charge goes
            // back, the fill's own charge covers the folio.
            st.ready = false;
            self.budget.uncharge(crate::thp::HUGE);
            self.kick_reclaimer();
        }
        // A read fill of a writable region is CLEAN: write-protected before
        // any faulting thread is woken (the move woke no one); a thread that
        // touched the folio in between is caught by the digest below. If
        // the protect fails the folio is published DIRTY (a DIRTY folio may
        // be writable; a CLEAN one may not): never dropped, since the moved
        // PMD is writable and a store may have landed in it.
        let mut protect_failed = false;
        if done > 0 && wp {
            if let Err(e) = uffd.writeprotect(span.sub(0, done), true, false) {
                protect_failed = true;
                self.counters.kernel_call_errors.inc();
                if !quiet {
                    log::error!(
                        "region {}: write-protecting huge folio {idx} after its move failed: {e}; kept dirty",
                        r.id
                    );
                }
            }
        }
        if done == len && whole {
            self.counters.thp_fills.inc();
            r.set_run_mapped(idx);
        } else if done == len {
            // Moved as base pages (a fault put a page table under the run
            // while it was being filled): whole, but not one PMD.
            self.counters.thp_fill_fallback.inc();
        } else {
            self.counters.thp_fill_fallback.inc();
            // What did not move is still in the staged buffer (what moved
            // reads as zeros there now): copy the rest, write-protected if
            // need be. What moved is writable: if the copy fails it must
            // not be dropped (settle_writable retries, then saves it).
            match self.copy_all(r, span.sub(done, len - done), &st.buf[done..], wp, quiet) {
                Ok(()) => done = len,
                Err(d) if done == 0 && d == 0 => return None,
                // Nothing moved, and what was copied is protected.
                Err(_) if done == 0 && wp => return None,
                Err(d) => {
                    // `st.buf` holds zeros where the moved part was: give
                    // settle_writable the data it must compare with only
                    // for the copied rest; the moved part counts as written.
                    let installed = done + d;
                    if self.settle_writable(r, span, installed, &st.buf[..], quiet) {
                        return Some(true);
                    }
                    return None;
                }
            }
        }
        if done < len {
            return None;
        }
        if protect_failed {
            return Some(true);
        }
        let first = (idx << r.shift) / 8;
        let view = &r.map.atomic_words()[first..first + len / 8];
        let raced = before.is_some_and(|b| b != crate::thp::digest_words(view));
        if raced {
            self.counters.thp_fill_raced.inc();
        }
        Some(raced)
    }

    /// After a `UFFDIO_MOVE` out of staged page `st` (its first `len`
    /// bytes) that did not report success: what left it, for the view —
    /// what is still present in the staged page did not move. The kernel's
    /// own count is not trusted: on Linux 6.18 a move whose destination got
    /// a page table while the run was being filled (a thread touching the
    /// run waits on it as BUSY, and its fault allocates one) split the huge
    /// page, moved every base page, and reported EEXIST with nothing moved;
    /// copying "the rest" from the emptied staged page then put zeros in
    /// the view, and a digest that saw them took them for a racing store
    /// and wrote them back (`tests/mixed.rs`).
    fn moved_from(&self, st: &crate::thp::Staged, len: usize) -> Left {
        use upager_sys::pagemap::{present_runs, PRESENT_RUNS};
        let Some(pagemap) = self.thp.pagemap() else {
            return Left::Unknown;
        };
        let base = st.buf.addr();
        let mut runs = [(0, 0); PRESENT_RUNS];
        match present_runs(pagemap, base, len as u64, &mut runs) {
            Ok(Some(0)) => Left::Prefix(len),
            Ok(Some(1)) if runs[0].1 == base + len as u64 => {
                Left::Prefix((runs[0].0 - base) as usize)
            }
            Ok(_) => Left::Scattered,
            Err(_) => Left::Unknown,
        }
    }

    /// Makes `span` of read-only region `r` read-only again after a huge
    /// page moved through it (see install_huge, gather.rs); a refusal is
    /// logged (unless `quiet`) and counted: stores there would land
    /// without SIGSEGV (never written back: nothing is lost).
    pub(crate) fn close_read_only(&self, r: &Area, span: MapRange<'_>, idx: usize, quiet: bool) {
        if let Err(e) = span.protect(upager_sys::mem::Access::Read) {
            self.counters.kernel_call_errors.inc();
            if !quiet {
                log::error!(
                    "region {}: making folios {idx}.. of the read-only region read-only again failed: {e}; stores there land without SIGSEGV",
                    r.id
                );
            }
        }
    }
}
