//! An area: the engine-side state of one region — its mapping in the
//! application's view, the folio state words, the store behind it, its
//! write-back error and back-off — shared by the region's handle, fault
//! handlers and reclaim (the kernel's `vm_area_struct` plus its
//! `address_space`). [`Inflight`] pins an area against unmap.
//!
//! Uses: `error`, `folio`, `store`.

use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use upager_sys::mem::Mapping;

use crate::error::RangeError;
use crate::folio::State;
use crate::store::{Src, Store};
use crate::swap::Slots;

/// Engine-side state of one region, shared by handles, fault handlers and
/// the reclaimer.
pub(crate) struct Area {
    pub id: u64,
    pub map: Mapping,
    /// Bytes the application asked for (the mapping is rounded up to folios).
    pub len: u64,
    pub folio: u64,
    pub shift: u32,
    pub states: upager_sys::mem::AtomicTable,
    /// One bit per chunk of [`CHUNK`] folios: set once any folio of the chunk
    /// has left NEVER. Whole-region walks (flush, unmap, marker counts) skip
    /// untouched chunks, so a huge sparse region costs what it uses.
    pub touched: upager_sys::mem::AtomicTable,
    pub store: Arc<dyn Store>,
    /// The page pool this region's view maps (pool.rs), if it is pooled:
    /// its faults go to `poolfault`, its folios are the pool's (this
    /// table's words stay NEVER unless a read fails: POISONED).
    pub pool: Option<crate::pool::PoolView>,
    /// Store offset of the region's first byte (file regions).
    pub store_off: u64,
    /// Swap slots (anonymous regions only; shared by the pager's anonymous
    /// regions of this folio size, like their swap file).
    pub slots: Option<Arc<Slots>>,
    pub writable: bool,
    pub inflight: AtomicU64,
    pub dying: AtomicBool,
    /// First write-back error since the last flush reported one.
    pub wb_error: Mutex<Option<io::Error>>,
    /// Write-backs to this region's store back off while it refuses them.
    pub wb_backoff: Backoff,
    /// Pin counts of pinned folios (their state words carry PINNED).
    pub pins: Mutex<std::collections::HashMap<usize, u32>>,
    /// Folios per shard: the range is registered in runs of this many
    /// folios, each on its own userfaultfd (see [`Shards`]).
    pub shard_folios: usize,
    /// The userfaultfd (index modulo the pager's count) of the first shard;
    /// shard `k` is on `shard_first + k`.
    pub shard_first: usize,
    /// The view is `MADV_HUGEPAGE` (file-backed writable regions of 2 MiB
    /// folios, thp.rs): a missing read fault is raised at PMD level and
    /// leaves no page table, so a fill moves its huge page in without first
    /// dropping one.
    pub huge_view: bool,
    /// With 2 MiB folios, one bit per folio: base pages were installed
    /// under it (a copy or poison), so it is not one PMD-mapped huge page
    /// and, in a `huge_view`, a page table is left there, to be dropped
    /// before a huge page is moved in. Empty for other folio sizes.
    pub tables: upager_sys::mem::AtomicTable,
    /// Folios per 2 MiB run where sequential runs are filled as one huge
    /// page (mixed folio sizes); 0: never (folios of 2 MiB, or
    /// read-only, anonymous, small or unaligned regions, or turned off).
    pub run_folios: usize,
    /// One bit per 2 MiB run (with `run_folios`): the run was moved in as
    /// one PMD-mapped huge page and nothing has split it since, as far as
    /// the engine knows. A hint: eviction moves such a run out whole into
    /// a staging slot (thp.rs `recycle`, which checks that it got a huge
    /// page) when a batch holds all of its folios. Cleared by anything
    /// that may split the PMD (a write-protect change or eviction of part
    /// of the run); the kernel keeps a split run correct on its own
    /// (split PTEs keep the uffd-wp bit), only slower to evict.
    pub runs: upager_sys::mem::AtomicTable,
    /// Writable file and store regions of folios above 4 KiB and below
    /// 2 MiB, on a store that takes single pages (`Store::takes_pages`):
    /// one word per
    /// folio, the 4 KiB page written in a folio that is DIRTY in part
    /// (PARTIAL, folio.rs), which write-back writes alone (Linux 6.6's
    /// per-block dirty state of iomap's large folios, for the same reason:
    /// one small write should not write back the whole folio). Read and
    /// written only by the folio's BUSY owner. Empty for other regions.
    pub partial_pages: upager_sys::mem::AtomicTable,
    /// Recent folio state changes (trace.rs), dumped when a check finds a
    /// folio holding the wrong data.
    pub trace: crate::trace::Trace,
    /// This process's writers of the region's file (writable regions of
    /// files only): whether its writes keep twins (twins.rs).
    pub writers: Option<Arc<crate::twins::FileWriters>>,
    /// Twins of this region's dirty folios (empty unless its file has
    /// several writers).
    pub twins: crate::twins::Twins,
    /// Its warm start (`MapOptions::warm`, file regions): the trace being
    /// recorded or replayed.
    pub warm: Option<crate::warm::Warm>,
}

/// How a region of `nfolios` folios of `folio` bytes is split over
/// `uffds` userfaultfds: contiguous shards of `folios` folios (a multiple of
/// 2 MiB and of the folio, so no folio, huge page or fill straddles two of
/// them), at most `uffds` of them, the last one shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shards {
    pub folios: usize,
    pub count: usize,
}

impl Shards {
    pub fn new(nfolios: usize, folio: u64, uffds: usize) -> Shards {
        let align = (crate::config::MAX_FOLIO / folio).max(1) as usize;
        let folios = nfolios
            .div_ceil(uffds.max(1))
            .next_multiple_of(align)
            .max(align);
        Shards {
            folios,
            count: nfolios.div_ceil(folios).max(1),
        }
    }
}

/// Back-off of write-backs to a store that refuses them (full disk, I/O
/// error): after [`Backoff::FAILS`] write-backs in a row failed, reclaim and
/// the dirty limit leave the region's dirty folios alone for a delay that
/// doubles from 10 ms to 1 s, so a full disk costs a few attempts a second
/// instead of millions, and reclaim evicts clean folios meanwhile. A store
/// that fails now and then (a flaky one) never gets there. `flush` ignores
/// the delay (the caller asked). A success lifts the block and halves the
/// delay, and a failure while a delay is set backs off again at once: a
/// full disk still takes the rewrites of blocks it already holds, and those
/// successes must not restart the run of failures (CI saw 19 failed calls in
/// 2 s idle that way).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// Write-backs failed in a row.
    streak: AtomicU64,
    /// Until when (ns on [`Backoff::now_ns`]'s clock); 0: not backing off.
    until_ns: AtomicU64,
    /// Current delay; 0 when not backing off.
    delay_ns: AtomicU64,
}

impl Backoff {
    /// Failures in a row before backing off (a store failing one write in
    /// five does so with a chance of 0.2^16, about 1 in 150 billion).
    const FAILS: u64 = 16;
    const MIN_NS: u64 = 10_000_000;
    const MAX_NS: u64 = 1_000_000_000;

    fn now_ns() -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
    }
    /// Records the outcome of one write-back call.
    pub fn record(&self, ok: bool) {
        if ok {
            if self.streak.load(Ordering::Relaxed) != 0 {
                self.streak.store(0, Ordering::Relaxed);
            }
            let d = self.delay_ns.load(Ordering::Relaxed);
            if d != 0 {
                let half = if d / 2 < Self::MIN_NS { 0 } else { d / 2 };
                self.delay_ns.store(half, Ordering::Relaxed);
                self.until_ns.store(0, Ordering::Release);
            }
            return;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        let backing_off = self.delay_ns.load(Ordering::Relaxed) != 0;
        if (n >= Self::FAILS || backing_off) && !self.blocked() {
            // Once per delay: twice as long as the last one.
            let d = (self.delay_ns.load(Ordering::Relaxed) * 2).clamp(Self::MIN_NS, Self::MAX_NS);
            self.delay_ns.store(d, Ordering::Relaxed);
            self.until_ns.store(Self::now_ns() + d, Ordering::Release);
        }
    }
    /// Within the delay after a run of failures: leave the dirty folios alone.
    pub fn blocked(&self) -> bool {
        let u = self.until_ns.load(Ordering::Acquire);
        u != 0 && Self::now_ns() < u
    }
}

impl std::fmt::Debug for Area {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("base", &self.base())
            .field("len", &self.len)
            .finish()
    }
}

/// Folios per bit of [`Area::touched`].
pub(crate) const CHUNK: usize = 512;

impl Area {
    /// Records that folio `idx` has left NEVER (call before filling it).
    pub fn mark_touched(&self, idx: usize) {
        let (w, bit) = (idx / CHUNK / 64, 1u64 << (idx / CHUNK % 64));
        if self.touched[w].load(Ordering::Acquire) & bit == 0 {
            self.touched[w].fetch_or(bit, Ordering::SeqCst);
        }
    }

    /// Notes that base pages (a page table) may be installed under folios
    /// `idx..idx + n` of a region of 2 MiB folios, or of a region with
    /// huge runs (one bit per run there); no-op otherwise.
    pub fn note_table(&self, idx: usize, n: usize) {
        if self.tables.is_empty() || n == 0 {
            return;
        }
        let per = self.run_folios.max(1);
        for k in idx / per..=(idx + n - 1) / per {
            let bit = 1u64 << (k % 64);
            if self.tables[k / 64].load(Ordering::Acquire) & bit == 0 {
                self.tables[k / 64].fetch_or(bit, Ordering::AcqRel);
            }
        }
    }

    /// Whether resident folio `idx` of a region of 2 MiB folios was moved
    /// in whole (one PMD-mapped huge page, no base pages installed since).
    pub fn pmd_mapped(&self, idx: usize) -> bool {
        !self.tables.is_empty()
            && self.tables[idx / 64].load(Ordering::Acquire) & (1 << (idx % 64)) == 0
    }

    /// Whether a page table may be under folio `idx` (always in a view
    /// that is not `huge_view`: its missing faults allocate one), forgetting
    /// it: the caller drops it.
    ///
    /// With huge runs (mixed folio sizes) a bit stands for a run, and is
    /// set by everything that may leave a page table there: a fault in
    /// the run (`resolve`: a missing fault allocates one before it is
    /// raised, a write-protect fault splits a huge run), base pages copied
    /// in or poisoned, a write-protect change or unmap of part of a huge
    /// run (gather.rs). A run nobody touched has none: a fill moving a huge
    /// page there drops nothing (a TLB flush saved).
    pub fn take_table(&self, idx: usize) -> bool {
        let k = idx / self.run_folios.max(1);
        let had = !self.tables.is_empty()
            && self.tables[k / 64].fetch_and(!(1 << (k % 64)), Ordering::AcqRel) & (1 << (k % 64))
                != 0;
        !(self.huge_view || self.run_folios > 0) || had
    }

    /// The first folio of the 2 MiB run of folio `idx` (with `run_folios`).
    pub fn run_start(&self, idx: usize) -> usize {
        idx - idx % self.run_folios.max(1)
    }

    /// Records that run `[idx, idx + run_folios)` is one PMD-mapped huge page.
    pub fn set_run_mapped(&self, idx: usize) {
        if let Some(k) = idx.checked_div(self.run_folios) {
            self.runs[k / 64].fetch_or(1 << (k % 64), Ordering::AcqRel);
        }
    }

    /// Forgets that the run of folio `idx` may be one PMD-mapped huge
    /// page; true if it was thought to be.
    pub fn clear_run_mapped(&self, idx: usize) -> bool {
        if self.run_folios == 0 {
            return false;
        }
        let k = idx / self.run_folios;
        let bit = 1u64 << (k % 64);
        self.runs[k / 64].load(Ordering::Acquire) & bit != 0
            && self.runs[k / 64].fetch_and(!bit, Ordering::AcqRel) & bit != 0
    }

    /// Whether the run of folio `idx` is thought to be one PMD-mapped huge
    /// page (see [`Area::runs`]).
    pub fn run_mapped(&self, idx: usize) -> bool {
        if self.run_folios == 0 {
            return false;
        }
        let k = idx / self.run_folios;
        self.runs[k / 64].load(Ordering::Acquire) & (1 << (k % 64)) != 0
    }

    /// Bytes of this region's folio tables that may be resident: the touched
    /// bitmap and the state words of the chunks ever touched.
    pub fn table_bytes(&self) -> u64 {
        let chunks: u64 = (0..self.touched.len())
            .map(|w| u64::from(self.touched[w].load(Ordering::Relaxed).count_ones()))
            .sum();
        self.touched.len() as u64 * 8 + (chunks * CHUNK as u64 * 8).min(self.nfolios() as u64 * 8)
    }

    /// Folio indexes of the chunks that were ever touched.
    pub fn touched_folios(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.nfolios();
        self.touched.iter().enumerate().flat_map(move |(w, word)| {
            let bits = word.load(Ordering::Acquire);
            (0..64)
                .filter(move |b| bits & (1 << b) != 0)
                .flat_map(move |b| {
                    let start = (w * 64 + b) * CHUNK;
                    start..(start + CHUNK).min(n)
                })
        })
    }

    /// The folios of [`Area::touched_folios`] from folio `from` on.
    pub fn touched_folios_from(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        let n = self.nfolios();
        (from / CHUNK..n.div_ceil(CHUNK))
            .filter(move |c| self.touched[c / 64].load(Ordering::Acquire) & (1 << (c % 64)) != 0)
            .flat_map(move |c| (c * CHUNK).max(from)..((c + 1) * CHUNK).min(n))
    }

    pub fn base(&self) -> u64 {
        self.map.addr()
    }
    pub fn map_len(&self) -> u64 {
        self.map.len() as u64
    }
    pub fn nfolios(&self) -> usize {
        self.states.len()
    }
    /// The shard of folio `idx` (the pager's userfaultfd index, before
    /// the modulo).
    pub fn shard(&self, idx: usize) -> usize {
        self.shard_first + idx / self.shard_folios
    }
    /// One past the last folio of `idx`'s shard: fills and wakes never
    /// cross it (a userfaultfd fill must stay inside one registration).
    pub fn shard_end(&self, idx: usize) -> usize {
        ((idx / self.shard_folios + 1) * self.shard_folios).min(self.nfolios())
    }
    /// Folios `[idx, idx + n)` cut at shard boundaries, as `(first, count)`
    /// runs: each run is registered on one userfaultfd, so the calls that
    /// wake or protect it go to that one.
    pub fn shard_runs(&self, idx: usize, n: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let end = idx + n;
        let mut k = idx;
        std::iter::from_fn(move || {
            (k < end).then(|| {
                let run_end = self.shard_end(k).min(end);
                let run = (k, run_end - k);
                k = run_end;
                run
            })
        })
    }
    pub fn folio_addr(&self, idx: usize) -> u64 {
        self.base() + ((idx as u64) << self.shift)
    }
    /// Folios `[idx, idx+n)` of the view, for the calls that fill, protect
    /// or drop them.
    pub fn span(&self, idx: usize, n: usize) -> upager_sys::mem::MapRange<'_> {
        self.map.range(idx << self.shift, n << self.shift)
    }
    pub fn state(&self, idx: usize) -> &AtomicU64 {
        &self.states[idx]
    }
    /// Whether a write dirties one 4 KiB page of a folio first (PARTIAL)
    /// rather than the whole folio: folios above 4 KiB and below 2 MiB of
    /// a writable file whose writes keep no twins (a twin's diff finds
    /// what changed). A 2 MiB folio is one huge page mapped by one PMD,
    /// which is what a user chooses it for (one TLB entry): unprotecting
    /// 4 KiB of it would split the mapping, so it stays dirty as a whole.
    pub fn dirties_pages(&self) -> bool {
        !self.partial_pages.is_empty() && !self.twinning()
    }
    /// The 4 KiB page of folio `idx` that `addr` is in.
    pub fn page_in_folio(&self, idx: usize, addr: u64) -> u64 {
        (addr.saturating_sub(self.folio_addr(idx)) >> 12).min((self.folio >> 12) - 1)
    }
    /// Records `page` as the written page of folio `idx` (its BUSY owner,
    /// before it publishes DIRTY|PARTIAL).
    pub fn set_partial_page(&self, idx: usize, page: u64) {
        self.partial_pages[idx].store(page, Ordering::Relaxed);
    }
    /// The bytes of folio `idx` (DIRTY|PARTIAL, claimed) to write back:
    /// (offset in the folio, length) of its written page, cut at the end of
    /// the region.
    pub fn partial_span(&self, idx: usize) -> (u64, u64) {
        let at = self.partial_pages[idx].load(Ordering::Relaxed) << 12;
        (at, 4096.min(self.valid_len(idx).saturating_sub(at)))
    }
    /// Whether a first write to a clean folio must keep a twin (its file
    /// is mapped writable more than once: twins.rs).
    pub fn twinning(&self) -> bool {
        self.writers.as_ref().is_some_and(|w| w.twinning())
    }
    pub fn is_anon(&self) -> bool {
        self.slots.is_some()
    }
    /// Bytes of folio `idx` that belong to the region (the last may be short).
    pub fn valid_len(&self, idx: usize) -> u64 {
        self.folio.min(self.len - ((idx as u64) << self.shift))
    }
    /// Region memory of folios `[idx, idx+n)`, for writing to a store.
    pub fn src(&self, idx: usize, bytes: u64) -> Src<'_> {
        self.src_at(idx, 0, bytes)
    }
    /// Region memory from byte `at` of folio `idx` on, for writing to a store.
    pub fn src_at(&self, idx: usize, at: u64, bytes: u64) -> Src<'_> {
        Src {
            map: &self.map,
            off: (idx << self.shift) + at as usize,
            len: bytes as usize,
        }
    }
    /// Store offset of folio `idx` whose state is `s` (anonymous: its slot).
    pub fn store_offset(&self, idx: usize, s: State) -> Option<u64> {
        if self.is_anon() {
            s.slot().map(|slot| u64::from(slot) * self.folio)
        } else {
            Some(self.store_off + ((idx as u64) << self.shift))
        }
    }
    pub fn record_error(&self, e: io::Error) {
        let mut g = self.wb_error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e);
        }
    }
    /// The kept write-back error's text (not taken: `flush` still reports it).
    pub fn last_error_text(&self) -> Option<String> {
        self.wb_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(ToString::to_string)
    }
    pub fn take_error(&self) -> Option<io::Error> {
        self.wb_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// A region pinned against unmap while a fault or eviction works on it.
pub(crate) struct Inflight(pub Arc<Area>);

impl Inflight {
    /// Pins `r` unless it is being unmapped.
    pub fn enter(r: &Arc<Area>) -> Option<Inflight> {
        r.inflight.fetch_add(1, SeqCst);
        if r.dying.load(SeqCst) {
            r.inflight.fetch_sub(1, SeqCst);
            return None;
        }
        Some(Inflight(Arc::clone(r)))
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, SeqCst);
    }
}

impl std::ops::Deref for Inflight {
    type Target = Arc<Area>;
    fn deref(&self) -> &Arc<Area> {
        &self.0
    }
}

impl Area {
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
    pub(crate) fn whole_folios(&self, offset: u64, len: u64) -> Result<Range<usize>, RangeError> {
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

#[cfg(test)]
mod tests {
    use super::{Backoff, Shards};

    #[test]
    fn shards_are_contiguous_2mib_multiples_and_at_most_asked() {
        let mib = 1usize << 20;
        // 16 MiB of 4 KiB folios over 4: 4 shards of 4 MiB.
        assert_eq!(
            Shards::new(16 * mib / 4096, 4096, 4),
            Shards {
                folios: 1024,
                count: 4
            }
        );
        // 12 MiB of 64 KiB folios over 4: 3 MiB rounds up to 4 MiB, 3 shards.
        assert_eq!(
            Shards::new(192, 64 << 10, 4),
            Shards {
                folios: 64,
                count: 3
            }
        );
        // Small regions: one shard; one userfaultfd: one shard.
        assert_eq!(Shards::new(4, 4096, 4).count, 1);
        assert_eq!(Shards::new(1 << 20, 4096, 1).count, 1);
        // 2 MiB folios: whole folios per shard.
        assert_eq!(
            Shards::new(5, 2 << 20, 2),
            Shards {
                folios: 3,
                count: 2
            }
        );
    }
    use std::sync::atomic::Ordering;

    #[test]
    fn backoff_starts_after_a_run_of_failures_and_ends_with_a_success() {
        let b = Backoff::default();
        for _ in 0..Backoff::FAILS - 1 {
            b.record(false);
        }
        assert!(!b.blocked(), "a few failures are not a refusing store");
        b.record(true);
        for _ in 0..Backoff::FAILS - 1 {
            b.record(false);
        }
        assert!(!b.blocked(), "a success reset the run");
        b.record(false);
        assert!(b.blocked());
        for _ in 0..100 {
            b.record(false); // within the delay: not extended further
        }
        assert_eq!(b.delay_ns.load(Ordering::Relaxed), Backoff::MIN_NS);
        // The delay runs out (set as if it had), the next call fails again:
        // twice as long.
        b.until_ns.store(1, Ordering::Relaxed);
        assert!(!b.blocked());
        b.record(false);
        assert!(b.blocked());
        assert_eq!(b.delay_ns.load(Ordering::Relaxed), 2 * Backoff::MIN_NS);
        b.record(true);
        assert!(!b.blocked(), "a success lifts the block");
        b.record(false);
        assert!(b.blocked(), "one failure after it backs off again");
        assert_eq!(
            b.delay_ns.load(Ordering::Relaxed),
            2 * Backoff::MIN_NS,
            "half the delay, doubled again"
        );
    }

    #[test]
    fn successes_decay_the_delay_to_nothing() {
        let b = Backoff::default();
        for _ in 0..Backoff::FAILS {
            b.record(false);
        }
        assert!(b.blocked());
        b.record(true);
        assert_eq!(b.delay_ns.load(Ordering::Relaxed), 0);
        for _ in 0..Backoff::FAILS - 1 {
            b.record(false);
        }
        assert!(!b.blocked(), "the store recovered: a new run is needed");
    }
}
