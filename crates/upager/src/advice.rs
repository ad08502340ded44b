//! Residency, pageout, prefetch and discard: the folio state word as the
//! marker of evicted pages (seed 004).
//!
//! Seed 004 (PTE markers for paged-out shmem) exists because without a
//! marker the kernel cannot tell "paged out" from "never touched" without a
//! lookup per page. upager keeps a state word per folio anyway, so:
//!
//! - [`Region::residency`] answers from the state words alone: no store
//!   access, no system call, one load per folio, returned as runs.
//!   [`Region::mincore`] and [`Region::pagemap`] give the same answer in the
//!   shapes existing tools parse (`mincore(2)` bytes; `/proc/pid/pagemap`
//!   words with bit 63 = present, bit 62 = swapped, i.e. in the store).
//! - [`Region::pageout`] evicts resident folios now, like `MADV_PAGEOUT`,
//!   through the same batch pipeline as reclaim (write-protect dirty → write
//!   back → one `process_madvise` per batch → release): the folios become
//!   EVICTED markers.
//! - [`Region::prefetch`] queues folios for the pager's prefetch thread,
//!   like `MADV_WILLNEED`, and returns at once.
//! - [`Region::discard`] drops contents like `MADV_DONTNEED` on private
//!   memory: anonymous folios read as zero again and their swap slots are
//!   freed (holes punched); file-backed folios are read from the file again.
//!   **Writes not yet flushed or evicted in the range are lost.**
//!
//! Markers (EVICTED) survive eviction and pageout; discard and unmap clear
//! them. Ranges: offsets are relative to the region; residency queries need
//! a 4 KiB-aligned start, pageout/prefetch/discard a folio-aligned start and
//! a length that is a multiple of the folio size or reaches the region's end.
//!
//! Pageout and discard are batches of the one batch type (`gather`), claimed
//! by range.
//!
//! Counters: `evict_pageout`, `discards`, `fills_readahead` (prefetch fills),
//! `evicted_markers` (gauge, computed by `Pager::stats`).
//!
//! Uses: `area`, `error`, `fault`, `fill`, `folio`, `gather`, `region`, `shared`.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use upager_sys::mem::MAX_IOV;
use upager_sys::pagemap::{PM_PRESENT, PM_SWAPPED};

use crate::ahead::{Batches, Install};
use crate::area::Area;
use crate::error::{AdviseError, RangeError};
use crate::fill::Outcome;
use crate::folio::{self, Kind, State};
use crate::gather::{Gather, Mode};
use crate::region::Region;
use crate::shared::{Ctx, PrefetchRequest};

/// What a range of a region holds, from its folio states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Residency {
    /// In memory, same as the store.
    ResidentClean = 0,
    /// In memory, written since last written back.
    ResidentDirty = 1,
    /// Evicted: contents are in the store (the marker).
    Evicted = 2,
    /// Never filled (or discarded): zero (anonymous) or the store's bytes.
    NeverTouched = 3,
    /// A fill, eviction or write-back is in flight (or a failed read is
    /// being reported). It settles without any access. A folio whose first
    /// access has just returned can still read `Busy` for a moment: the
    /// kernel lets the faulting thread go once the page is mapped, which
    /// may be before the filler publishes the folio's state.
    Busy = 4,
}

impl Residency {
    /// One character for pictures: `#` dirty, `+` clean, `.` evicted, space
    /// never touched, `~` busy.
    pub fn symbol(self) -> char {
        match self {
            Residency::ResidentDirty => '#',
            Residency::ResidentClean => '+',
            Residency::Evicted => '.',
            Residency::NeverTouched => ' ',
            Residency::Busy => '~',
        }
    }

    fn of(kind: Kind) -> Residency {
        match kind {
            Kind::Clean => Residency::ResidentClean,
            Kind::Dirty => Residency::ResidentDirty,
            Kind::Evicted => Residency::Evicted,
            Kind::Never => Residency::NeverTouched,
            Kind::Busy | Kind::Poisoned => Residency::Busy,
        }
    }
}

impl Region {
    /// Run-length residency of `[offset, offset+len)`: `(byte range, state)`
    /// pairs covering the range, adjacent equal states merged. No store
    /// access and no system call.
    pub fn residency(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(Range<u64>, Residency)>, RangeError> {
        if let Some(h) = self.heir() {
            return h.residency(offset, len);
        }
        let r = &self.inner;
        let folios = r.folio_range(offset, len, 4096)?;
        let end = offset + len;
        let mut out: Vec<(Range<u64>, Residency)> = Vec::new();
        for idx in folios {
            let state = Residency::of(folio::load(r.state(idx)).kind());
            let lo = ((idx as u64) << r.shift).max(offset);
            let hi = ((idx as u64 + 1) << r.shift).min(end);
            match out.last_mut() {
                Some((range, s)) if *s == state => range.end = hi,
                _ => out.push((lo..hi, state)),
            }
        }
        Ok(out)
    }

    /// Bytes of the region the view maps with huge pages now (2 MiB folios
    /// moved in whole; `PAGEMAP_SCAN`): 0 for other folio sizes, and for
    /// folios that were copied in as base pages (`thp_fill_fallback`).
    /// With mixed folio sizes, the 2 MiB runs of smaller folios
    /// moved in whole count too.
    pub fn huge_bytes(&self) -> std::io::Result<u64> {
        if let Some(h) = self.heir() {
            return h.huge_bytes();
        }
        let r = &self.inner;
        let step = if r.folio == crate::thp::HUGE {
            1
        } else if r.run_folios > 0 {
            r.run_folios
        } else {
            return Ok(0);
        };
        let huge = crate::thp::HUGE;
        let pagemap = std::fs::File::open("/proc/self/pagemap")?;
        let mut bytes = 0;
        for idx in r.touched_folios().filter(|i| i.is_multiple_of(step)) {
            if r.folio_addr(idx) + huge <= r.base() + r.map_len()
                && upager_sys::pagemap::is_huge(&pagemap, r.folio_addr(idx), huge)?
            {
                bytes += huge;
            }
        }
        Ok(bytes)
    }

    /// `mincore(2)`-shaped residency: one byte per 4 KiB page of the range,
    /// bit 0 set when the page is in memory.
    pub fn mincore(&self, offset: u64, len: u64) -> Result<Vec<u8>, RangeError> {
        if let Some(h) = self.heir() {
            return h.mincore(offset, len);
        }
        self.per_page(offset, len, |s| {
            u8::from(matches!(
                s,
                Residency::ResidentClean | Residency::ResidentDirty
            ))
        })
    }

    /// `/proc/pid/pagemap`-shaped residency: one u64 per 4 KiB page, bit 63
    /// ("present") for pages in memory, bit 62 ("swapped") for pages whose
    /// contents are in the store (evicted).
    pub fn pagemap(&self, offset: u64, len: u64) -> Result<Vec<u64>, RangeError> {
        if let Some(h) = self.heir() {
            return h.pagemap(offset, len);
        }
        self.per_page(offset, len, |s| match s {
            Residency::ResidentClean | Residency::ResidentDirty => PM_PRESENT,
            Residency::Evicted => PM_SWAPPED,
            _ => 0,
        })
    }

    fn per_page<T: Copy>(
        &self,
        offset: u64,
        len: u64,
        f: impl Fn(Residency) -> T,
    ) -> Result<Vec<T>, RangeError> {
        let r = &self.inner;
        r.folio_range(offset, len, 4096)?;
        let pages = offset / 4096..(offset + len).div_ceil(4096);
        let mut out = Vec::with_capacity(pages.end as usize - pages.start as usize);
        let mut cached: Option<(usize, T)> = None;
        for p in pages {
            let idx = ((p * 4096) >> r.shift) as usize;
            let v = match cached {
                Some((i, v)) if i == idx => v,
                _ => f(Residency::of(folio::load(r.state(idx)).kind())),
            };
            cached = Some((idx, v));
            out.push(v);
        }
        Ok(out)
    }

    /// Writes back (if dirty) and evicts the resident folios of the range
    /// now, in batches (one TLB shootdown per batch), like `MADV_PAGEOUT`.
    /// Waits for folios busy with a fill or write-back to settle first.
    /// Returns the number of folios evicted.
    pub fn pageout(&self, offset: u64, len: u64) -> Result<u64, AdviseError> {
        if let Some(h) = self.heir() {
            return h.pageout(offset, len);
        }
        let r = &self.inner;
        let folios = r.whole_folios(offset, len)?;
        let sh = &self.owner.shared;
        let mut batch = Gather::new(sh, Mode::Pageout, sh.batch_folios(r.folio));
        batch.collect(r, folios, |s| matches!(s.kind(), Kind::Clean | Kind::Dirty));
        let (evicted, first_err) = batch.finish();
        let evicted = evicted as u64;
        match first_err {
            Some(e) => Err(AdviseError::Writeback(e)),
            None => Ok(evicted),
        }
    }

    /// Drops the clean resident folios that the range touches (any byte
    /// of them), so the next access reads the store again: how a region
    /// sees what another region or process wrote to the same file and
    /// flushed after this region read it. (A region sees others' flushed
    /// writes to a folio it faults in after that flush — close-to-open
    /// consistency, as NFS gives — and not later ones until it drops its
    /// copy.) Dirty folios are kept: this region's own writes are newer
    /// (flush first to drop them too); pinned ones stay. No write-back, one
    /// TLB shootdown per batch. Anonymous regions have nothing to re-read
    /// (nothing is dropped). Returns the folios dropped.
    pub fn invalidate(&self, offset: u64, len: u64) -> Result<u64, RangeError> {
        if let Some(h) = self.heir() {
            return h.invalidate(offset, len);
        }
        let r = &self.inner;
        let head = offset % r.folio;
        let folios = r.folio_range(offset - head, len.saturating_add(head), 1)?;
        if r.is_anon() {
            return Ok(0);
        }
        let sh = &self.owner.shared;
        let mut batch = Gather::new(sh, Mode::Pageout, sh.batch_folios(r.folio));
        batch.collect(r, folios, |s| s.kind() == Kind::Clean);
        let (dropped, _) = batch.finish();
        Ok(dropped as u64)
    }

    /// Starts filling the range in the background, like `MADV_WILLNEED`,
    /// and returns at once. Folios already resident are left alone; a later
    /// access to a folio whose fill finished does not fault. Prefetch stops
    /// early rather than evict more than one batch to make room.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), RangeError> {
        if let Some(h) = self.heir() {
            return h.prefetch(offset, len);
        }
        let folios = self.inner.folio_range(offset, len, self.inner.folio)?;
        if self.inner.pool.is_some() {
            // A pooled region's pages come in through the pool, on demand
            // or by `fetch`; a background prefetch of them is not built.
            return Ok(());
        }
        self.owner.prefetch(PrefetchRequest {
            region: Arc::clone(&self.inner),
            folios,
        });
        Ok(())
    }

    /// Reads the folios holding the bytes at `offsets` in now, in the
    /// calling thread, in batches of up to 8 MiB of folios, each batch one
    /// [`Store::read_batch`](crate::Store::read_batch): a network store
    /// has a batch's reads in flight together, where faults one at a time
    /// would each wait a round trip (a GET of an object store: milliseconds);
    /// on such a store, adjacent folios of 16 MiB or more (a tensor) are
    /// read by this thread and a helper, a half each, so that two batches
    /// are in flight (each one GET of the part size when adjacent).
    /// For a gather whose index set is known before it runs (numpy fancy
    /// indexing: `upager.memmap` arrays do this for large index arrays).
    /// Folios already resident are skipped; offsets may repeat and come in
    /// any order (they are read in address order). It first makes room for
    /// its folios (up to half the budget) by reclaim, as faults would;
    /// beyond that, like [`Region::prefetch`], it stops early rather than
    /// evict more than one batch per batch: keep one call's folios well
    /// under the budget (what it did not read, the accesses fault in).
    /// Returns the folios read.
    pub fn fetch(&self, offsets: &[u64]) -> Result<u64, RangeError> {
        if let Some(h) = self.heir() {
            return h.fetch(offsets);
        }
        self.fetch_folios(offsets, false)
    }

    /// [`Region::fetch`] for a scatter: the caller is about to write the
    /// bytes at every one of `offsets`, so the folios read go in as a write
    /// fault's would — writable and DIRTY (in a file region of folios above
    /// 4 KiB, only the 4 KiB page the offsets fall in, when they fall in
    /// one) — and the writes that follow fault no more: a random
    /// scatter's misses become batched reads (numpy's `a[idx] = v` on
    /// `upager.memmap` arrays). Under the dirty limit, as write faults are
    /// (it waits for write-back above it, and stops where the store
    /// refuses writes). A folio named but not written is written back
    /// unchanged. Where a write fault would fill for reading (a file that
    /// several processes map writable keeps twins of clean folios; 2 MiB
    /// folios) the folios are read as by [`Region::fetch`]. Resident
    /// folios are left as they are (their first write faults as usual).
    /// Returns the folios read.
    pub fn fetch_for_write(&self, offsets: &[u64]) -> Result<u64, AdviseError> {
        if let Some(h) = self.heir() {
            return h.fetch_for_write(offsets);
        }
        if !self.inner.writable {
            return Err(AdviseError::Unsupported(
                "a write to a read-only region (map it writable)",
            ));
        }
        Ok(self.fetch_folios(offsets, true)?)
    }

    /// The folios of `offsets` read in, in address order (`write`: as
    /// write fills): [`Region::fetch`] and [`Region::fetch_for_write`].
    fn fetch_folios(&self, offsets: &[u64], write: bool) -> Result<u64, RangeError> {
        let r = &self.inner;
        if let Some(v) = &r.pool {
            // Pooled: each folio the pool lacks, filled in address order.
            let mut idxs = offsets
                .iter()
                .map(|&o| r.folio_range(o, 1, 1).map(|f| f.start))
                .collect::<Result<Vec<_>, _>>()?;
            idxs.sort_unstable();
            idxs.dedup();
            let mut ctx = Ctx::new(self.owner.shared.fill_buf_bytes(), false);
            let mut read = 0;
            for idx in idxs {
                if !v.pool.is_resident(v.first + idx) {
                    read += 1;
                    let _ = self.make_resident(&mut ctx, idx, false);
                }
            }
            return Ok(read);
        }
        // Each folio with the 4 KiB page written in it (u64::MAX: more
        // than one), in address order.
        let mut folios: Vec<(usize, u64)> = Vec::with_capacity(offsets.len());
        for &offset in offsets {
            let idx = r.folio_range(offset, 1, 1)?.start;
            folios.push((idx, r.page_in_folio(idx, r.base() + offset)));
        }
        folios.sort_unstable();
        folios.dedup_by(|b, a| {
            if a.0 != b.0 {
                return false;
            }
            if a.1 != b.1 {
                a.1 = u64::MAX;
            }
            true
        });
        let Some(r) = crate::area::Inflight::enter(r) else {
            return Ok(0); // being unmapped
        };
        let sh = &self.owner.shared;
        // Room first, reclaiming as a fault would (up to half the budget),
        // so a budget full of older pages does not cut the fetch short
        // (read_ahead evicts at most a batch per batch).
        let room = (folios.len() as u64 * r.folio).min(sh.budget.limit() / 2);
        if sh.reserve(room) {
            sh.budget.uncharge(room);
        }
        let mut ctx = Ctx::new(sh.fill_buf_bytes(), false);
        let page = |idx: usize| {
            let k = folios.partition_point(|f| f.0 < idx);
            folios
                .get(k)
                .filter(|f| f.0 == idx && f.1 != u64::MAX)
                .map(|f| f.1)
        };
        let install = if write {
            Install::Write(&page)
        } else {
            Install::Read
        };
        let how = |install| Batches {
            bytes: crate::ahead::FETCH_BATCH_BYTES,
            install,
            windows_between: false,
        };
        // On a network store, adjacent folios of two batches or more (a
        // tensor) are read by two threads, a half each: a batch of
        // adjacent folios is one GET of the part size, so one thread had
        // one GET in flight. Not a gather's scattered folios, whose
        // batch has its GETs in flight together already (and a second
        // batch buffer took the random-read benchmark past its cgroup).
        let batch = (crate::ahead::FETCH_BATCH_BYTES / r.folio).max(1) as usize;
        let adjacent = folios.len() >= 2 * batch
            && folios[folios.len() - 1].0 - folios[0].0 + 1 == folios.len();
        let half = if !write && adjacent && r.store.round_trips() {
            (folios.len() / 2).next_multiple_of(batch)
        } else {
            folios.len()
        };
        let (mine, theirs) = folios.split_at(half);
        let read = std::thread::scope(|s| {
            let other = (!theirs.is_empty()).then(|| {
                s.spawn(|| {
                    let mut ctx = Ctx::new(sh.fill_buf_bytes(), false);
                    let idxs = theirs.iter().map(|f| f.0);
                    let read = sh.read_ahead(&mut ctx, &r, idxs, how(Install::Read), &mut |_| {});
                    sh.shrink_ctx(&mut ctx);
                    read
                })
            });
            let idxs = mine.iter().map(|f| f.0);
            let read = sh.read_ahead(&mut ctx, &r, idxs, how(install), &mut |_| {});
            read + other.map_or(0, |t| {
                t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        });
        sh.shrink_ctx(&mut ctx);
        Ok(read)
    }

    /// Makes the range resident now, in the calling thread, as faults
    /// there would (`write`: as write faults: the folios become dirty, as
    /// the system call that follows will make them), without touching the
    /// memory: a folio that cannot be filled is an error here, not a
    /// SIGBUS. For passing region memory to a system call under
    /// [`FaultMode::InThread`](crate::FaultMode::InThread), where a system
    /// call on a non-resident page fails with EFAULT instead of faulting it
    /// in: fault the range in, then make the call. Nothing pins the range:
    /// under memory pressure a folio may be evicted again before the call,
    /// so keep such ranges well under the budget and retry a call that
    /// fails with EFAULT (or use [`Region::read_at`] / [`Region::write_at`],
    /// which copy through memory accesses). Works in both fault modes.
    pub fn fault_in(&self, offset: u64, len: u64, write: bool) -> Result<(), AdviseError> {
        if let Some(h) = self.heir() {
            return h.fault_in(offset, len, write);
        }
        let r = &self.inner;
        let folios = r.folio_range(offset, len, 1)?;
        if write && !r.writable {
            return Err(AdviseError::Unsupported(
                "a write to a read-only region (map it writable)",
            ));
        }
        let mut ctx = Ctx::new(self.owner.shared.fill_buf_bytes(), false);
        for idx in folios {
            self.make_resident(&mut ctx, idx, write)?;
        }
        Ok(())
    }

    /// Resolves folio `idx` as a (write) fault would, in this thread.
    fn make_resident(&self, ctx: &mut Ctx, idx: usize, write: bool) -> Result<(), AdviseError> {
        let (r, sh) = (&self.inner, &self.owner.shared);
        let addr = r.folio_addr(idx);
        if let Some(v) = &r.pool {
            // Pooled (read-only): in the pool, or filled into it now.
            if !v.pool.is_resident(v.first + idx) {
                let _ = sh.resolve(ctx, r, addr, false, false);
            }
            return match folio::load(r.state(idx)).kind() {
                Kind::Poisoned => Err(AdviseError::Unfilled {
                    offset: idx as u64 * r.folio,
                }),
                _ => Ok(()),
            };
        }
        loop {
            let s = folio::load(r.state(idx));
            match s.kind() {
                Kind::Clean | Kind::Dirty if !write => return Ok(()),
                // A dirty folio may still be write-protected (a write-back
                // that failed leaves it so): unprotect it as a write fault
                // would (no flush if it was not).
                // A folio dirty in part (PARTIAL) is unprotected whole by
                // its second write fault: this one.
                Kind::Clean | Kind::Dirty => {
                    if sh.resolve(ctx, r, addr, true, true) == Outcome::Done
                        && folio::load(r.state(idx)).wholly_dirty()
                    {
                        return Ok(());
                    }
                }
                Kind::Poisoned => {
                    return Err(AdviseError::Unfilled {
                        offset: idx as u64 * r.folio,
                    })
                }
                // Someone else's fill, write-back or eviction: it ends in
                // bounded time.
                Kind::Busy => std::thread::sleep(std::time::Duration::from_micros(50)),
                // A write fill installs the folio writable and DIRTY: done
                // (unprotecting it again would cost an ioctl for nothing);
                // a larger folio's is DIRTY in part, and the next round
                // unprotects the rest.
                Kind::Never | Kind::Evicted => {
                    if sh.resolve(ctx, r, addr, write, write) == Outcome::Done
                        && folio::load(r.state(idx)).wholly_dirty()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Pins the range: makes its folios resident (as [`Region::fault_in`];
    /// `write`: dirty) and keeps them so — reclaim, `pageout` and `discard`
    /// leave them alone — until [`Region::unpin`]. Pins are counted: each
    /// pin of a folio needs one unpin. For buffer pools (vmcache's
    /// fix/unfix) and for passing region memory to system calls in
    /// [`FaultMode::InThread`](crate::FaultMode::InThread). Pinned folios
    /// count against the budget, and at most half the budget may be pinned
    /// (beyond that: an error, nothing pinned). `flush` still writes pinned
    /// folios back (they stay resident). Unmap drops every pin.
    pub fn pin(&self, offset: u64, len: u64, write: bool) -> Result<(), AdviseError> {
        if let Some(h) = self.heir() {
            return h.pin(offset, len, write);
        }
        let r = &self.inner;
        let folios = r.folio_range(offset, len, 1)?;
        if r.pool.is_some() {
            return Err(AdviseError::Unsupported(
                "pinning in a region in a page pool (map it with the pool off)",
            ));
        }
        if write && !r.writable {
            return Err(AdviseError::Unsupported(
                "a write to a read-only region (map it writable)",
            ));
        }
        let sh = &self.owner.shared;
        // Count first (so the bytes are reserved), then make resident and
        // mark each folio.
        {
            let mut pins = r.pins.lock().unwrap_or_else(|e| e.into_inner());
            let new = folios.clone().filter(|i| !pins.contains_key(i)).count() as u64;
            if !sh.budget.try_pin(new * r.folio) {
                return Err(AdviseError::PinLimit {
                    want: new * r.folio,
                    pinned: sh.budget.pinned(),
                    budget: sh.budget.limit(),
                });
            }
            for i in folios.clone() {
                *pins.entry(i).or_insert(0) += 1;
            }
        }
        let mut ctx = Ctx::new(sh.fill_buf_bytes(), false);
        for idx in folios.clone() {
            let marked = loop {
                // Resident (and for a write pin dirty: the dirty limit may
                // refuse it, an error here), then marked while resident
                // (reclaim may have taken it in between: fill it again);
                // then, for a write pin, unprotected once more after the
                // mark, so a write-back batch whose write-protect span
                // covered it meanwhile cannot leave it read-only (gather
                // unprotects marked folios in its spans' gaps).
                if let Err(e) = self.make_resident(&mut ctx, idx, write) {
                    break Err(e);
                }
                let resident = |s: State| {
                    matches!(s.kind(), Kind::Clean | Kind::Dirty) && (!write || s.wholly_dirty())
                };
                if folio::set_flag_if(r.state(idx), folio::PINNED, resident) {
                    break if write {
                        self.make_resident(&mut ctx, idx, true)
                    } else {
                        Ok(())
                    };
                }
            };
            if let Err(e) = marked {
                self.unpin_folios(folios.start..idx + 1);
                self.unpin_folios(idx + 1..folios.end);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Undoes one [`Region::pin`] of the range. Unpinning a folio that is
    /// not pinned is an error, and then nothing is unpinned.
    pub fn unpin(&self, offset: u64, len: u64) -> Result<(), AdviseError> {
        if let Some(h) = self.heir() {
            return h.unpin(offset, len);
        }
        let r = &self.inner;
        let folios = r.folio_range(offset, len, 1)?;
        {
            let pins = r.pins.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = folios.clone().find(|i| !pins.contains_key(i)) {
                return Err(AdviseError::NotPinned {
                    offset: i as u64 * r.folio,
                });
            }
        }
        self.unpin_folios(folios);
        Ok(())
    }

    /// Drops one pin of each folio in `folios` (those without a pin are
    /// skipped); a folio whose last pin goes is unmarked.
    fn unpin_folios(&self, folios: Range<usize>) {
        let r = &self.inner;
        let sh = &self.owner.shared;
        let mut pins = r.pins.lock().unwrap_or_else(|e| e.into_inner());
        for i in folios {
            let Some(n) = pins.get_mut(&i) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                pins.remove(&i);
                folio::set_flag(r.state(i), folio::PINNED, false);
                sh.budget.unpin(r.folio);
            }
        }
    }

    /// Waits until every prefetch queued so far (by any region of this
    /// pager) has finished, or `timeout` passes; true if they finished.
    pub fn wait_prefetch(&self, timeout: std::time::Duration) -> bool {
        if let Some(h) = self.heir() {
            return h.wait_prefetch(timeout);
        }
        let deadline = std::time::Instant::now() + timeout;
        while self.owner.shared.prefetch_pending.load(Ordering::Acquire) != 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        true
    }

    /// Drops the contents of the range like `MADV_DONTNEED` on private
    /// memory. Anonymous: the folios read as zero again and their swap space
    /// is freed. File-backed: the next access reads the file again; **writes
    /// in the range that were not flushed or evicted are lost**. Waits for
    /// folios busy with I/O.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), AdviseError> {
        if let Some(h) = self.heir() {
            return h.discard(offset, len);
        }
        let r = &self.inner;
        let folios = r.whole_folios(offset, len)?;
        // Everything in the range goes, whatever its state.
        let sh = &self.owner.shared;
        let mut batch = Gather::new(sh, Mode::Discard, MAX_IOV);
        batch.collect(r, folios, |_| true);
        batch.finish();
        Ok(())
    }
}

/// Folios in the EVICTED state over `regions` (the `evicted_markers` gauge).
pub(crate) fn count_markers<'a>(regions: impl Iterator<Item = &'a Arc<Area>>) -> u64 {
    regions
        .map(|r| {
            r.touched_folios()
                .filter(|&i| folio::load(r.state(i)).kind() == Kind::Evicted)
                .count() as u64
        })
        .sum()
}
