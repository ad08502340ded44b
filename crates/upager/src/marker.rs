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
//! Counters: `evict_pageout`, `discards`, `fills_readahead` (prefetch fills),
//! `evicted_markers` (gauge, computed by `Pager::stats`).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use upager_sys::mem::MAX_IOV;
use upager_sys::pagemap::{PM_PRESENT, PM_SWAPPED};

use crate::error::{AdviseError, RangeError};
use crate::folio::{self, Kind, ACTIVE};
use crate::reclaim::{Mode, Victim};
use crate::region::{Region, RegionInner};
use crate::table::Inflight;

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
    /// being reported).
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

/// A prefetch request for the prefetch thread.
pub(crate) struct PrefetchRequest {
    pub region: Arc<RegionInner>,
    pub folios: Range<usize>,
}

impl RegionInner {
    /// Validates `[offset, offset+len)`: non-empty, inside the region,
    /// start aligned to `align`. Returns the folios it touches.
    pub(crate) fn folio_range(
        &self,
        offset: u64,
        len: u64,
        align: u64,
    ) -> Result<Range<usize>, RangeError> {
        if len == 0 {
            return Err(RangeError::Empty);
        }
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(RangeError::OutOfRegion {
                offset,
                len,
                region_len: self.len,
            });
        }
        if !offset.is_multiple_of(align) {
            return Err(RangeError::Unaligned {
                offset,
                folio: align,
            });
        }
        let first = (offset >> self.shift) as usize;
        let last = ((offset + len - 1) >> self.shift) as usize;
        Ok(first..last + 1)
    }

    /// Like [`folio_range`](Self::folio_range) for operations that act on
    /// whole folios: the end must be folio-aligned or the region's end.
    fn whole_folios(&self, offset: u64, len: u64) -> Result<Range<usize>, RangeError> {
        let r = self.folio_range(offset, len, self.folio)?;
        let end = offset + len;
        if !end.is_multiple_of(self.folio) && end != self.len {
            return Err(RangeError::Unaligned {
                offset: end,
                folio: self.folio,
            });
        }
        Ok(r)
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

    /// `mincore(2)`-shaped residency: one byte per 4 KiB page of the range,
    /// bit 0 set when the page is in memory.
    pub fn mincore(&self, offset: u64, len: u64) -> Result<Vec<u8>, RangeError> {
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
        let r = &self.inner;
        let folios = r.whole_folios(offset, len)?;
        let sh = &self.owner.shared;
        let batch = sh.batch_folios(r.folio);
        let mut evicted = 0u64;
        let mut first_err = None;
        let mut victims = Vec::with_capacity(batch);
        let mut run = |victims: &mut Vec<Victim>| match sh
            .shrink_list(std::mem::take(victims), Mode::Pageout)
        {
            Ok(n) => evicted += n as u64,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        };
        for idx in folios {
            // Evict what we hold before waiting on a BUSY folio (see
            // claim_when_idle).
            let Some(old) = folio::claim_when_idle(
                r.state(idx),
                |s| matches!(s.kind(), Kind::Clean | Kind::Dirty),
                || {
                    if !victims.is_empty() {
                        run(&mut victims);
                    }
                },
            ) else {
                continue;
            };
            let Some(guard) = Inflight::enter(r) else {
                let prev = folio::release(r.state(idx), |_| old);
                sh.wake_if_waiter(r, idx, prev);
                break;
            };
            victims.push(Victim {
                region: guard,
                idx,
                old,
            });
            if victims.len() >= batch {
                run(&mut victims);
            }
        }
        if !victims.is_empty() {
            run(&mut victims);
        }
        match first_err {
            Some(e) => Err(AdviseError::Writeback(e)),
            None => Ok(evicted),
        }
    }

    /// Starts filling the range in the background, like `MADV_WILLNEED`,
    /// and returns at once. Folios already resident are left alone; a later
    /// access to a folio whose fill finished does not fault. Prefetch stops
    /// early rather than evict more than one batch to make room.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), RangeError> {
        let folios = self.inner.folio_range(offset, len, self.inner.folio)?;
        self.owner.prefetch(PrefetchRequest {
            region: Arc::clone(&self.inner),
            folios,
        });
        Ok(())
    }

    /// Waits until every prefetch queued so far (by any region of this
    /// pager) has finished, or `timeout` passes; true if they finished.
    pub fn wait_prefetch(&self, timeout: std::time::Duration) -> bool {
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
        let r = &self.inner;
        let folios = r.whole_folios(offset, len)?;
        let Some(_guard) = Inflight::enter(r) else {
            return Ok(());
        };
        let mut claimed = Vec::new();
        for idx in folios {
            // Drop what we hold before waiting on a BUSY folio (see
            // claim_when_idle): its owner may be a fill that needs the
            // budget our claimed folios hold.
            let old = folio::claim_when_idle(
                r.state(idx),
                |_| true,
                || {
                    self.discard_claimed(std::mem::take(&mut claimed));
                },
            );
            if let Some(old) = old {
                claimed.push((idx, old));
            }
            if claimed.len() >= MAX_IOV {
                self.discard_claimed(std::mem::take(&mut claimed));
            }
        }
        self.discard_claimed(claimed);
        Ok(())
    }

    /// Drops claimed folios: one process_madvise per ≤ 1024 ranges, holes
    /// punched in their swap slots, then the slots freed under one lock.
    /// Punch before free: a freed slot can be handed at once to a folio
    /// that eviction is writing back (the reclaimer runs concurrently), and
    /// a punch after that would wipe the new folio's data.
    fn discard_claimed(&self, claimed: Vec<(usize, folio::State)>) {
        if claimed.is_empty() {
            return;
        }
        let r = &self.inner;
        let sh = &self.owner.shared;
        let mut ranges: Vec<upager_sys::mem::MapRange<'_>> = Vec::new();
        let mut resident = 0u64;
        let mut slots = Vec::new();
        for &(idx, old) in &claimed {
            if matches!(old.kind(), Kind::Clean | Kind::Dirty | Kind::Poisoned) {
                let span = r.span(idx, 1);
                if !ranges.last_mut().is_some_and(|last| last.try_extend(&span)) {
                    ranges.push(span);
                }
            }
            if matches!(old.kind(), Kind::Clean | Kind::Dirty) {
                resident += r.folio;
            }
            if old.kind() == Kind::Dirty {
                sh.dirty_sub(r, 1);
            }
            if let Some(s) = old.slot() {
                slots.push(s);
            }
        }
        for chunk in ranges.chunks(MAX_IOV) {
            let _ = sh.pidfd.dontneed(chunk);
            sh.counters.tlb_flush_batches.inc();
        }
        if let Some(pool) = &r.slots {
            // The slots are still ours (their folios are BUSY): punch first.
            slots.sort_unstable();
            for run in slots.chunk_by(|a, b| b == &(a + 1)) {
                let _ = r
                    .store
                    .punch(u64::from(run[0]) * r.folio, run.len() as u64 * r.folio);
            }
            pool.free(&slots, sh.cfg.batched_removal);
        }
        for &(idx, _) in &claimed {
            let prev = folio::release(r.state(idx), |s| {
                s.with_kind(Kind::Never)
                    .with_slot(None)
                    .with_seq(0)
                    .set(ACTIVE, false)
            });
            sh.wake_if_waiter(r, idx, prev);
        }
        sh.unreserve(resident);
        sh.counters.discards.add(claimed.len() as u64);
    }
}

/// Folios in the EVICTED state over `regions` (the `evicted_markers` gauge).
pub(crate) fn count_markers<'a>(regions: impl Iterator<Item = &'a Arc<RegionInner>>) -> u64 {
    regions
        .map(|r| {
            r.touched_folios()
                .filter(|&i| folio::load(r.state(i)).kind() == Kind::Evicted)
                .count() as u64
        })
        .sum()
}
