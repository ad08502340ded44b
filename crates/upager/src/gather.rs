//! The batch: folios claimed for eviction, write-back or discard, finished
//! together (the kernel's `mmu_gather`). Reclaim, flush, pageout, discard
//! and the dirty limit all add folios to a [`Gather`] and let it run the
//! one contract, in this order, once per batch:
//!
//! ```text
//!   1) claim     victims are BUSY (their owner's claim: reclaim isolates
//!                them from the LRU, the others claim by range)
//!   2) protect   one UFFDIO_WRITEPROTECT per span of dirty victims    (flush per span)
//!   3) write back dirty victims from the now read-only view: per region,
//!                every run (swap: every folio) handed to the store at once,
//!                Store::write_batch (io_uring: submitted together), waited for
//!   4) unmap     one process_madvise(MADV_DONTNEED) over all victims  (one flush)
//!                (a PMD-mapped 2 MiB folio is moved out into a staging
//!                slot instead: thp.rs, one flush each; its charge stays)
//!   5) release   state -> EVICTED/NEVER (wake waiters), budget returned
//! ```
//! `finish_batch` drives the batch, one function per step: `protect_batch`
//! (2), `write_back_batch` (3) and `keep_unwritten` (its failures), then
//! `clean_batch` for `Writeback`, or `unmap_batch` (4) and `release_batch`
//! (5). `discard_batch` is `Discard`'s own path.
//!
//! `Writeback` (flush, the dirty limit) stops after 3) with the folios CLEAN
//! and resident; `Discard` skips 2)–3) (the contents are dropped) and frees
//! swap slots after punching them. Clean victims skip 2)–3): a CLEAN folio
//! is always write-protected in the view. A write racing with the batch hits
//! the protection, finds the folio BUSY, waits, and after 5) refaults it
//! from the store: no write is lost. A failed write-back leaves its folio
//! resident and DIRTY, back on the LRU. 4) and 5) start only after every
//! write of 3) has completed (`write_batch` returns then), and only the
//! folios whose own write succeeded go on: a batch with one failed write
//! keeps exactly that write's folios dirty.
//!
//! Shootdowns: the unmap is one flush per ≤ 1024 ranges; the protect step is
//! one flush per span of dirty victims, where a span joins dirty victims of
//! one region less than [`WP_SPAN_GAP_BYTES`] apart. A batch of clean folios
//! therefore costs 1 flush, one of clustered dirty folios 2, one of dirty
//! folios scattered over a region 1 + (number of 16 MiB-separated clusters):
//! measured 4.2 per batch in `upager demo --size 512M --budget 64M`
//! (random writes, 64 KiB folios), 37.2K flush calls for 8.8K batches of
//! 64 folios — 0.9 per 16 folios evicted, against the kernel's one per page.
//! (Spanning the gaps instead re-protects every resident page between
//! victims, and their next writes fault: 78.6 s against 13.4 s.)
//!
//! Write-back (3) submits a batch's writes together: measured with the
//! randwrite example (random 8-byte writes, 4 KiB folios, ext4 over zram),
//! 845–1,330 `io_uring_enter` calls for ~195K folios instead of one
//! `pwrite` each, at the same writes/s there (zram compresses inside the
//! submitting call: 8–9 µs per folio either way; docs/benchmarks.md).
//!
//! A folio DIRTY in part (PARTIAL, folio.rs: one 4 KiB page of a larger
//! folio written) writes back that page alone.
//!
//! A dirty folio with a twin (its file has several writers, twins.rs) is
//! written in 3) on its own, as a diff against the twin under a byte-range
//! lock, and its twin dropped; a discard drops the twin too.
//!
//! Counters: `evictions`, `evict_{direct,background,pageout}`,
//! `evict_batches`, `tlb_flush_batches`, `writebacks`, `writeback_errors`,
//! `bytes_written`, `writeback_submits` (system calls that submitted the
//! writes: about one per 256 writes with io_uring, one per run without),
//! `discards`, `reclaim_lock_acquisitions` (swap slots).
//!
//! Uses: `area`, `folio`, `shared`, `store`, `warm`.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use upager_sys::mem::{MapRange, MAX_IOV};

use crate::area::{Area, Inflight};
use crate::folio::{self, Kind, State, ACTIVE, QUEUED};
use crate::shared::Shared;
use crate::store::Write;
use crate::trace::Path;

/// Largest gap (bytes) between dirty victims that one write-protect call
/// spans. Every call costs one TLB flush; spanning a gap costs a page-table
/// walk that re-protects present non-victim pages. Measured with
/// `upager demo --reads 50000` (2 GiB, 256 MiB budget, 64 KiB folios, random
/// writes phase; 2 vCPU KVM): gap 2 MiB 14.0 s and 31 flush calls per batch,
/// 16 MiB 13.4 s and 12 per batch, one span per batch (2 GiB walks) 78.6 s
/// and 1.6 per batch. 16 MiB: the fewest flushes at no measured cost.
const WP_SPAN_GAP_BYTES: u64 = 16 << 20;

/// A folio claimed (BUSY) for a batch.
pub(crate) struct Victim {
    pub region: Inflight,
    pub idx: usize,
    /// Its state before the claim.
    pub old: State,
}

/// Who runs a batch, and what happens to its folios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A fault found the budget full (direct reclaim).
    Direct,
    /// The background reclaimer.
    Background,
    /// `Region::pageout`.
    Pageout,
    /// `flush` and the dirty limit: write back, keep resident (CLEAN).
    Writeback,
    /// `Region::discard`: drop the contents (NEVER), free swap slots.
    Discard,
}

/// Folios gathered for one contract run per batch (see the module doc).
pub(crate) struct Gather<'a> {
    sh: &'a Shared,
    mode: Mode,
    max: usize,
    victims: Vec<Victim>,
    done: usize,
    first_err: Option<io::Error>,
}

impl<'a> Gather<'a> {
    /// An empty batch of at most `max` folios (it runs when full).
    pub fn new(sh: &'a Shared, mode: Mode, max: usize) -> Gather<'a> {
        Gather {
            sh,
            mode,
            max: max.clamp(1, MAX_IOV),
            victims: Vec::with_capacity(max.min(MAX_IOV)),
            done: 0,
            first_err: None,
        }
    }

    /// Adds a claimed folio; runs the batch when it is full.
    pub fn add(&mut self, v: Victim) {
        v.region
            .trace
            .record(v.idx, Path::BatchClaim, v.old.kind(), Kind::Busy);
        self.victims.push(v);
        if self.victims.len() >= self.max {
            self.run();
        }
    }

    /// Runs the contract over the folios gathered so far.
    pub fn run(&mut self) {
        if self.victims.is_empty() {
            return;
        }
        let victims = std::mem::take(&mut self.victims);
        let started = std::time::Instant::now();
        let count = victims.len();
        let (n, err) = if self.mode == Mode::Discard {
            (discard_batch(self.sh, victims), None)
        } else {
            finish_batch(self.sh, victims, self.mode)
        };
        self.done += n;
        let took = started.elapsed();
        if took > crate::shared::SLOW_FAULT {
            // Faults waiting on these folios waited as long: say why.
            log::warn!(
                "a {:?} batch of {count} folios took {:.1} s (write-back to the store, or the kernel's calls){}",
                self.mode,
                took.as_secs_f64(),
                err.as_ref().map_or(String::new(), |e| format!("; first error: {e}"))
            );
        }
        // An eviction batch that evicted something succeeded (its failed
        // folios stay dirty and are retried); write-back reports any error.
        if let Some(e) = err {
            if self.mode == Mode::Writeback || n == 0 {
                self.first_err.get_or_insert(e);
            }
        }
    }

    /// Runs what is left; returns the folios evicted, cleaned or dropped,
    /// and the first error.
    pub fn finish(mut self) -> (usize, Option<io::Error>) {
        self.run();
        (self.done, self.first_err.take())
    }

    /// Claims the folios `folios` of `r` whose state `pred` accepts and adds
    /// them, waiting out BUSY ones (a fill or write-back finishes in bounded
    /// time). Before waiting it runs what it holds: the BUSY owner may be a
    /// fill in direct reclaim waiting for budget only those claims can free
    /// (see [`folio::claim_when_idle`]). Stops once `r` is being unmapped.
    pub fn collect(
        &mut self,
        r: &Arc<Area>,
        folios: impl Iterator<Item = usize>,
        pred: impl Fn(State) -> bool,
    ) {
        // Pinned folios stay resident: only write-back (which keeps them)
        // may take them.
        let keep_pins = self.mode != Mode::Writeback;
        let pred = |s: State| pred(s) && !(keep_pins && s.has(folio::PINNED));
        for idx in folios {
            let Some(old) = folio::claim_when_idle(r.state(idx), pred, || self.run()) else {
                continue;
            };
            let Some(guard) = Inflight::enter(r) else {
                r.trace.record(idx, Path::Unclaimed, Kind::Busy, old.kind());
                let prev = folio::release(r.state(idx), |_| old);
                self.sh.wake_if_waiter(r, idx, prev);
                break;
            };
            self.add(Victim {
                region: guard,
                idx,
                old,
            });
        }
    }
}

/// Runs victims through protect → write back → unmap → release (or, for
/// [`Mode::Writeback`], protect → write back → CLEAN). Returns the folios
/// evicted (or cleaned) and the first error: a span the kernel refused to
/// protect, then a failed write (the failed folios stay resident and dirty).
///
/// The stages run in the module's order, each over the whole batch, each
/// only after the one before it has finished: 4) must not unmap a folio
/// whose write 3) has not completed, and 3) must not copy a folio 2) has
/// not protected.
fn finish_batch(sh: &Shared, mut victims: Vec<Victim>, mode: Mode) -> (usize, Option<io::Error>) {
    victims.sort_unstable_by_key(|v| (v.region.id, v.idx));
    let mut first_err: Option<io::Error> = None;
    // 2) protect
    let unprotected = protect_batch(sh, &victims, &mut first_err);
    // 3) write back
    let written = write_back_batch(sh, &victims, &unprotected, &mut first_err);
    let kept = keep_unwritten(sh, victims, &unprotected, written);
    if mode == Mode::Writeback {
        return (clean_batch(sh, kept), first_err);
    }
    // 4) unmap
    let unmapped = unmap_batch(sh, kept);
    // 5) release
    (release_batch(sh, unmapped, mode), first_err)
}

/// Protect (step 2): one write-protect per span of dirty victims, region by
/// region. A span the kernel refused to protect may still be writable: its
/// dirty victims are not written back (a store could land after the copy
/// was taken) and stay resident and DIRTY; they are `true` in the returned
/// vector (by position in `victims`), and the batch reports the refusal as
/// its error (a flush must not say Ok over them).
fn protect_batch(sh: &Shared, victims: &[Victim], first_err: &mut Option<io::Error>) -> Vec<bool> {
    let mut unprotected = vec![false; victims.len()];
    let mut at = 0;
    for group in victims.chunk_by(|a, b| a.region.id == b.region.id) {
        let r = &group[0].region;
        let (spans, refused) = protect_dirty_spans(sh, r, group, first_err);
        for (k, v) in group.iter().enumerate() {
            if v.old.kind() == Kind::Dirty && refused.iter().any(|&(s, e)| (s..=e).contains(&v.idx))
            {
                unprotected[at + k] = true;
            }
        }
        unprotect_pinned(sh, r, group, &spans);
        at += group.len();
    }
    unprotected
}

/// Spans of folios `[first, last]` of one region.
type Spans = Vec<(usize, usize)>;

/// Write-protects the dirty victims of `group` (victims of region `r`), one
/// call per span (see [`WP_SPAN_GAP_BYTES`]). Returns the spans protected
/// and those of them the kernel refused (its first error in `first_err`).
fn protect_dirty_spans(
    sh: &Shared,
    r: &Area,
    group: &[Victim],
    first_err: &mut Option<io::Error>,
) -> (Spans, Spans) {
    let mut span: Option<(usize, usize)> = None;
    let mut refused: Spans = Vec::new();
    let mut spans: Spans = Vec::new();
    let mut protect = |(s, e): (usize, usize)| {
        if let Err(err) = write_protect(sh, r, s, e) {
            refused.push((s, e));
            first_err.get_or_insert(err);
        }
        spans.push((s, e));
    };
    for v in group.iter().filter(|v| v.old.kind() == Kind::Dirty) {
        // A span also protects the folios in its gaps; a pinned one must
        // stay writable (a system call may be writing into it in
        // in-thread mode, where a write-protected page gives EFAULT), so
        // a pinned folio in a gap ends the span.
        let gap_pinned =
            |e: usize| (e + 1..v.idx).any(|i| folio::load(r.state(i)).has(folio::PINNED));
        span = match span {
            Some((s, e))
                if ((v.idx - e) as u64) * r.folio <= WP_SPAN_GAP_BYTES && !gap_pinned(e) =>
            {
                Some((s, v.idx))
            }
            Some(done) => {
                protect(done);
                Some((v.idx, v.idx))
            }
            None => Some((v.idx, v.idx)),
        };
    }
    if let Some(last) = span {
        protect(last);
    }
    (spans, refused)
}

/// What 3) did to each victim of a batch, by position.
struct Written {
    /// Its write-back failed: it stays resident and DIRTY.
    failed: Vec<bool>,
    /// The swap slot it was given for its write-back (anonymous regions).
    new_slots: Vec<Option<u32>>,
}

/// Write back (step 3) the dirty, protected victims: per region, its writes (runs
/// of consecutive folios; one per folio for swap slots) go to its store
/// together, and every one has completed when this returns.
fn write_back_batch(
    sh: &Shared,
    victims: &[Victim],
    unprotected: &[bool],
    first_err: &mut Option<io::Error>,
) -> Written {
    let mut out = Written {
        failed: vec![false; victims.len()],
        new_slots: vec![None; victims.len()],
    };
    let mut i = 0;
    for group in victims.chunk_by(|a, b| a.region.id == b.region.id) {
        let j = i + group.len();
        let r = &group[0].region;
        if r.is_anon() {
            alloc_swap_slots(sh, r, group, &unprotected[i..j], &mut out.new_slots[i..j]);
        }
        write_back_region(
            sh,
            r,
            group,
            &unprotected[i..j],
            &out.new_slots[i..j],
            &mut out.failed[i..j],
            first_err,
        );
        i = j;
    }
    out
}

/// Swap: gives every dirty, protected victim of `group` (victims of the
/// anonymous region `r`) without a slot one, under a single lock
/// acquisition (the batched slot allocation, seed 003).
fn alloc_swap_slots(
    sh: &Shared,
    r: &Area,
    group: &[Victim],
    unprotected: &[bool],
    new_slots: &mut [Option<u32>],
) {
    let need: Vec<usize> = (0..group.len())
        .filter(|&k| {
            group[k].old.kind() == Kind::Dirty && !unprotected[k] && group[k].old.slot().is_none()
        })
        .collect();
    if need.is_empty() {
        return;
    }
    let pool = r.slots.as_ref().expect("anonymous region has slots");
    let before = pool.acquisitions();
    let slots = pool.alloc(need.len(), sh.cfg.batched_removal);
    sh.counters
        .reclaim_lock_acquisitions
        .add(pool.acquisitions() - before);
    for (k, s) in need.into_iter().zip(slots) {
        new_slots[k] = Some(s);
    }
}

/// Writes back the dirty, protected victims of `group` (victims of region
/// `r`; the other slices are theirs, by position): a folio with a twin at
/// once, as a diff; the others as one [`write_back`] of every run (swap:
/// every folio). Marks the folios whose write failed in `failed`.
fn write_back_region(
    sh: &Shared,
    r: &Area,
    group: &[Victim],
    unprotected: &[bool],
    new_slots: &[Option<u32>],
    failed: &mut [bool],
    first_err: &mut Option<io::Error>,
) {
    // `runs[n]`: the victims `[a, b)` and bytes of `writes[n]`.
    let mut writes: Vec<Write<'_>> = Vec::new();
    let mut runs: Vec<(usize, usize, u64)> = Vec::new();
    let mut k = 0;
    while k < group.len() {
        let v = &group[k];
        if v.old.kind() != Kind::Dirty || unprotected[k] {
            k += 1;
            continue;
        }
        if r.is_anon() {
            let slot = new_slots[k].or(v.old.slot()).expect("slot assigned");
            writes.push(Write {
                src: r.src(v.idx, r.folio),
                offset: u64::from(slot) * r.folio,
            });
            runs.push((k, k + 1, r.folio));
            k += 1;
            continue;
        }
        let off = r.store_offset(v.idx, v.old).expect("file offset");
        if r.twins.has(v.idx) {
            // Its file has several writers: only what this region
            // changed goes back, merged into the file (twins.rs).
            let (res, bytes) = match sh.write_back_diff(r, v.idx, off) {
                Ok(n) => (Ok(()), n),
                Err(e) => (Err(e), 0),
            };
            account_write(sh, r, &mut failed[k..k + 1], res, bytes, first_err);
            k += 1;
            continue;
        }
        if v.old.has(folio::PARTIAL) {
            // Dirty in part: its one written page goes back alone (the
            // rest is write-protected, as the store has it).
            let (at, bytes) = r.partial_span(v.idx);
            writes.push(Write {
                src: r.src_at(v.idx, at, bytes),
                offset: off + at,
            });
            runs.push((k, k + 1, bytes));
            k += 1;
            continue;
        }
        let mut e = k + 1;
        while e < group.len()
            && group[e].old.wholly_dirty()
            && !unprotected[e]
            && group[e].idx == group[e - 1].idx + 1
            && !r.twins.has(group[e].idx)
        {
            e += 1;
        }
        let (first, last) = (v.idx, group[e - 1].idx);
        let bytes = ((last - first) as u64 * r.folio) + r.valid_len(last);
        writes.push(Write {
            src: r.src(first, bytes),
            offset: off,
        });
        runs.push((k, e, bytes));
        k = e;
    }
    if !writes.is_empty() {
        let results = write_back(sh, r, &writes);
        for ((a, b, bytes), res) in runs.into_iter().zip(results) {
            account_write(sh, r, &mut failed[a..b], res, bytes, first_err);
        }
    }
}

/// After 3): victims whose write-back failed, or whose span was refused
/// protection, go back resident and DIRTY (their pages may stay
/// write-protected: the next write faults and unprotects them), their new
/// swap slot freed. Returns the others, each with its new slot.
fn keep_unwritten(
    sh: &Shared,
    victims: Vec<Victim>,
    unprotected: &[bool],
    written: Written,
) -> Vec<(Victim, Option<u32>)> {
    let Written { failed, new_slots } = written;
    let mut kept = Vec::with_capacity(victims.len());
    for (k, v) in victims.into_iter().enumerate() {
        if failed[k] || unprotected[k] {
            if let Some(s) = new_slots[k] {
                v.region.slots.as_ref().expect("anon").free(&[s], true);
            }
            // Back on the LRU if isolation took it off, so a later batch
            // retries it.
            requeue(sh, &v, Path::KeptDirty, Kind::Dirty, v.old.slot());
        } else {
            kept.push((v, new_slots[k]));
        }
    }
    kept
}

/// Releases a claimed victim resident, as `kind` with swap slot `slot`, and
/// puts it back on the LRU unless it is still queued there.
fn requeue(sh: &Shared, v: &Victim, path: Path, kind: Kind, slot: Option<u32>) {
    v.region.trace.record(v.idx, path, Kind::Busy, kind);
    let prev = folio::release(v.region.state(v.idx), |s| {
        s.with_kind(kind).with_slot(slot).set(QUEUED, true)
    });
    sh.wake_if_waiter(&v.region, v.idx, prev);
    if !prev.has(QUEUED) {
        sh.lru.add(&v.region, &[(v.idx, false)]);
    }
}

/// [`Mode::Writeback`]'s end, after 3): the written victims stay resident,
/// CLEAN. Returns how many.
fn clean_batch(sh: &Shared, kept: Vec<(Victim, Option<u32>)>) -> usize {
    let n = kept.len();
    for (v, _) in kept {
        if v.old.kind() == Kind::Dirty {
            sh.dirty_sub(&v.region, 1);
        }
        v.region
            .trace
            .record(v.idx, Path::Cleaned, Kind::Busy, Kind::Clean);
        let prev = folio::release(v.region.state(v.idx), |s| s.with_kind(Kind::Clean));
        sh.wake_if_waiter(&v.region, v.idx, prev);
    }
    n
}

/// What 4) leaves for 5).
struct Unmapped {
    /// The victims unmapped (or recycled), each with its new swap slot.
    gone: Vec<(Victim, Option<u32>)>,
    /// Huge runs moved out into staging slots (their charge stays).
    recycled: u64,
    /// Whole huge runs among them.
    huge: u64,
}

/// Unmap (step 4): one process_madvise per ≤ 1024 merged ranges. A huge page
/// moved in whole is moved out into a free staging slot instead (thp.rs:
/// recycled, not freed; its charge stays, as the staged page's).
/// Folios the kernel did not unmap are still mapped, write-protected and
/// written back: they stay resident, CLEAN (never released, or a later
/// refill would copy over a live page and the budget would lie).
fn unmap_batch(sh: &Shared, kept: Vec<(Victim, Option<u32>)>) -> Unmapped {
    let (ranges, recycled, huge) = unmap_ranges(sh, &kept);
    let not_unmapped = dontneed_ranges(sh, &ranges);
    drop(ranges);
    let (gone, stayed): (Vec<_>, Vec<_>) = kept.into_iter().partition(|(v, _)| {
        let a = v.region.folio_addr(v.idx);
        !not_unmapped
            .iter()
            .any(|&(at, len)| at <= a && a < at + len)
    });
    for (v, new_slot) in stayed {
        if v.old.kind() == Kind::Dirty {
            sh.dirty_sub(&v.region, 1);
        }
        let slot = new_slot.or(v.old.slot());
        requeue(sh, &v, Path::Cleaned, Kind::Clean, slot);
    }
    Unmapped {
        gone,
        recycled,
        huge,
    }
}

/// The ranges `kept` (sorted and distinct) unmap, merged, after moving its
/// PMD-mapped huge runs out into staging slots. A huge run of a region of
/// smaller folios (mixed folio sizes) is recycled the same way when the
/// batch holds all its folios (its first and last suffice); evicted in
/// part, it is no longer one PMD. Returns the ranges, the runs recycled and
/// the whole huge runs met.
fn unmap_ranges<'a>(
    sh: &Shared,
    kept: &'a [(Victim, Option<u32>)],
) -> (Vec<MapRange<'a>>, u64, u64) {
    let mut ranges: Vec<MapRange<'_>> = Vec::with_capacity(kept.len());
    let mut recycled = 0u64;
    let mut huge = 0u64;
    let mut i = 0;
    while i < kept.len() {
        let v = &kept[i].0;
        let n = v.region.run_folios;
        let whole_run = n > 0
            && v.idx.is_multiple_of(n)
            && kept
                .get(i + n - 1)
                .is_some_and(|(w, _)| w.region.id == v.region.id && w.idx == v.idx + n - 1);
        let (span, step) = if whole_run && v.region.clear_run_mapped(v.idx) {
            huge += 1;
            (v.region.span(v.idx, n), n)
        } else {
            if v.region.clear_run_mapped(v.idx) {
                // Unmapping part of a huge run splits its PMD: a table.
                v.region.note_table(v.idx, 1);
            }
            (v.region.span(v.idx, 1), 1)
        };
        i += step;
        let pmd = if step > 1 {
            true
        } else {
            v.region.folio == crate::thp::HUGE && v.region.pmd_mapped(v.idx)
        };
        // A read-only region's run moves out through a moment of write
        // access, as it moved in (huge.rs install_huge).
        let ro = step > 1 && !v.region.writable;
        let opened = ro && span.protect(upager_sys::mem::Access::ReadWrite).is_ok();
        let moved = pmd && (!ro || opened) && sh.thp.recycle(&sh.uffds[0], span, &sh.budget);
        if opened {
            sh.close_read_only(&v.region, span, v.idx, false);
        }
        if moved {
            recycled += 1;
            continue;
        }
        if !ranges.last_mut().is_some_and(|last| last.try_extend(&span)) {
            ranges.push(span);
        }
    }
    (ranges, recycled, huge)
}

/// MADV_DONTNEEDs `ranges`, one process_madvise (one flush) per ≤ 1024.
/// Returns the `(address, length)` of what the kernel left mapped.
fn dontneed_ranges(sh: &Shared, ranges: &[MapRange<'_>]) -> Vec<(u64, u64)> {
    let mut not_unmapped: Vec<(u64, u64)> = Vec::new();
    for chunk in ranges.chunks(MAX_IOV) {
        // One flush per process_madvise; one per range without it.
        sh.counters
            .tlb_flush_batches
            .add(sh.pidfd.flushes(chunk.len()));
        let mut rest = chunk;
        // process_madvise advises the ranges in order and returns the bytes
        // it advised: a short count leaves the tail. Retry it once; what the
        // kernel still refuses stays resident.
        for attempt in 0..2 {
            let want: u64 = rest.iter().map(MapRange::len).sum();
            let got = match sh.pidfd.dontneed(rest) {
                Ok(n) => n.min(want),
                Err(e) if attempt == 1 => {
                    sh.counters.kernel_call_errors.inc();
                    log::error!(
                        "unmapping an eviction batch failed: {e}; {} ranges stay resident",
                        rest.len()
                    );
                    break;
                }
                Err(_) => 0,
            };
            if got == want {
                rest = &[];
                break;
            }
            let mut skip = 0u64;
            let mut k = 0;
            while k < rest.len() && skip + rest[k].len() <= got {
                skip += rest[k].len();
                k += 1;
            }
            rest = &rest[k..];
        }
        not_unmapped.extend(rest.iter().map(|m| (m.addr(), m.len())));
    }
    not_unmapped
}

/// Release (step 5): the unmapped victims become EVICTED (or NEVER for
/// never-written anonymous folios), their budget returns (but a recycled
/// huge run's, which stays with its staging slot), and the batch is
/// counted. Returns the folios evicted.
fn release_batch(sh: &Shared, unmapped: Unmapped, mode: Mode) -> usize {
    let Unmapped {
        gone,
        recycled,
        mut huge,
    } = unmapped;
    let pages: u64 = gone.iter().map(|(v, _)| v.region.folio / 4096).sum();
    let seq_end = sh.evict_seq.fetch_add(pages, Ordering::Relaxed) + pages;
    let mut bytes = 0u64;
    let n = gone.len();
    for (v, new_slot) in gone {
        bytes += v.region.folio;
        huge += u64::from(v.region.folio == crate::thp::HUGE);
        evict_one(sh, &v, new_slot, seq_end);
    }
    sh.budget.uncharge(bytes - recycled * crate::thp::HUGE);
    sh.counters.thp_evictions.add(huge);
    sh.counters.thp_recycled.add(recycled);
    sh.counters.evictions.add(n as u64);
    sh.counters.evict_batches.inc();
    match mode {
        Mode::Direct => sh.counters.evict_direct.add(n as u64),
        Mode::Background => sh.counters.evict_background.add(n as u64),
        Mode::Pageout => sh.counters.evict_pageout.add(n as u64),
        Mode::Writeback | Mode::Discard => {}
    }
    n
}

/// Final state of one evicted folio.
fn evict_one(sh: &Shared, v: &Victim, new_slot: Option<u32>, seq: u64) {
    let r = &v.region;
    if v.old.kind() == Kind::Dirty {
        sh.dirty_sub(r, 1);
    }
    let slot = new_slot.or(v.old.slot());
    let kind = if r.is_anon() && slot.is_none() {
        Kind::Never
    } else {
        Kind::Evicted
    };
    r.trace.record(v.idx, Path::Evicted, Kind::Busy, kind);
    if r.warm.as_ref().is_some_and(|w| w.evicted(v.idx)) {
        sh.counters.replay_wasted.inc();
    }
    let prev = folio::release(r.state(v.idx), |s| {
        s.with_kind(kind)
            .with_slot(slot)
            .with_seq(seq)
            .set(ACTIVE, false)
    });
    sh.wake_if_waiter(r, v.idx, prev);
}

/// After the write-protect spans of `group` (victims of one region): a
/// pinned dirty folio in a span's gap that was pinned too late for the span
/// to avoid it is claimed and unprotected again (a write pin promises a
/// writable folio: a system call writing it in in-thread mode would get
/// EFAULT). A folio busy elsewhere is left to its owner.
fn unprotect_pinned(sh: &Shared, r: &Area, group: &[Victim], spans: &[(usize, usize)]) {
    // Only the gaps of the spans were protected (nothing, for a batch of
    // clean folios: walking from the first victim to the last instead cost
    // a scan of two streams 0.5 s of CPU per 2 GiB at 4 KiB folios), and
    // only a region with pins has pinned folios (a pin is counted before
    // its folio is marked, and a write pin unprotects again after marking).
    if spans.is_empty() || r.pins.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return;
    }
    let mut victims = group.iter().map(|v| v.idx).peekable();
    for i in spans.iter().flat_map(|&(s, e)| s..=e) {
        while victims.next_if(|&v| v < i).is_some() {}
        if victims.next_if_eq(&i).is_some() {
            continue;
        }
        let s = folio::load(r.state(i));
        if !(s.kind() == Kind::Dirty && s.has(folio::PINNED)) {
            continue;
        }
        if folio::try_claim(r.state(i), |s| {
            s.kind() == Kind::Dirty && s.has(folio::PINNED)
        })
        .is_some()
        {
            r.note_table(i, 1); // splits a huge run
            if let Err(e) = sh.uffd_of(r, i).writeprotect(r.span(i, 1), false, false) {
                // Still protected: its next write faults and unprotects it.
                sh.counters.kernel_call_errors.inc();
                log::error!("region {}: unprotecting pinned folio {i} failed: {e}", r.id);
            }
            // Writable as a whole now.
            let prev = folio::release(r.state(i), |s| {
                s.with_kind(Kind::Dirty).set(folio::PARTIAL, false)
            });
            sh.wake_if_waiter(r, i, prev);
        }
    }
}

/// Write-protects folios `[first, last]` of `r`; the kernel's error if it
/// refused any part (logged, counted in `kernel_call_errors`): those pages
/// may still be writable, so their folios must not be written back and
/// called clean. (UFFDIO_WRITEPROTECT stops with ENOENT after changing the
/// VMAs before the one it refused, and reports no progress: the whole span
/// counts as refused.)
fn write_protect(sh: &Shared, r: &Area, first: usize, last: usize) -> Result<(), io::Error> {
    // Protecting part of a huge run (mixed folio sizes) splits its PMD.
    for k in [first, last] {
        let run = r.run_start(k);
        if r.run_folios > 0 && (run < first || run + r.run_folios - 1 > last) {
            r.note_table(k, 1);
        }
    }
    // Each shard's part on the userfaultfd it is registered on (a span
    // crosses a shard boundary rarely: one call more then).
    let mut refused = Ok(());
    for (k, m) in r.shard_runs(first, last + 1 - first) {
        let res = sh.uffd_of(r, k).writeprotect(r.span(k, m), true, true);
        sh.counters.tlb_flush_batches.inc();
        if let Err(e) = res {
            sh.counters.kernel_call_errors.inc();
            log::error!(
                "region {}: write-protecting folios {k}..{} before write-back failed: {e}; they stay dirty",
                r.id,
                k + m
            );
            refused = Err(io::Error::new(
                e.kind(),
                format!(
                    "the kernel refused to write-protect dirty folios before writing them back ({e}); they stay dirty in memory"
                ),
            ));
        }
    }
    refused
}

/// Writes one region's share of a batch to its store: all at once
/// ([`Store::write_batch`](crate::Store::write_batch)), or one call per
/// write when batched write-back is off. One result per write, in order.
fn write_back(sh: &Shared, r: &Area, writes: &[Write<'_>]) -> Vec<io::Result<()>> {
    if !sh.cfg.batched_writeback {
        sh.counters.writeback_submits.add(writes.len() as u64);
        return writes
            .iter()
            .map(|w| r.store.write_from(w.src, w.offset))
            .collect();
    }
    let done = r.store.write_batch(writes);
    sh.counters.writeback_submits.add(done.submissions);
    let mut results = done.results;
    if results.len() != writes.len() {
        // A store broke the one-result-per-write rule: whatever it did not
        // report stays dirty (a later batch writes it again).
        debug_assert!(
            false,
            "write_batch returned {} results for {}",
            results.len(),
            writes.len()
        );
        results.resize_with(writes.len(), || {
            Err(io::Error::other(
                "the store reported no result for this write",
            ))
        });
    }
    results
}

fn account_write(
    sh: &Shared,
    r: &Area,
    failed: &mut [bool],
    res: io::Result<()>,
    bytes: u64,
    first: &mut Option<io::Error>,
) {
    match res {
        Ok(()) => {
            r.wb_backoff.record(true);
            sh.counters.writebacks.add(failed.len() as u64);
            sh.counters.bytes_written.add(bytes);
        }
        Err(e) => {
            r.wb_backoff.record(false);
            sh.counters.writeback_errors.add(failed.len() as u64);
            failed.iter_mut().for_each(|f| *f = true);
            r.record_error(io::Error::new(e.kind(), e.to_string()));
            first.get_or_insert(e);
        }
    }
}

/// Drops claimed folios: one process_madvise per ≤ 1024 ranges, holes
/// punched in their swap slots, then the slots freed under one lock. Punch
/// before free: a freed slot can be handed at once to a folio that eviction
/// is writing back (the reclaimer runs concurrently), and a punch after that
/// would wipe the new folio's data. Returns the folios dropped.
fn discard_batch(sh: &Shared, mut victims: Vec<Victim>) -> usize {
    victims.sort_unstable_by_key(|v| (v.region.id, v.idx));
    let mut ranges: Vec<MapRange<'_>> = Vec::new();
    let mut resident = 0u64;
    for v in &victims {
        let r = &v.region;
        if matches!(v.old.kind(), Kind::Clean | Kind::Dirty | Kind::Poisoned) {
            // Part of a huge run unmapped: its PMD splits.
            r.clear_run_mapped(v.idx);
            r.note_table(v.idx, 1);
            let span = r.span(v.idx, 1);
            if !ranges.last_mut().is_some_and(|last| last.try_extend(&span)) {
                ranges.push(span);
            }
        }
        if matches!(v.old.kind(), Kind::Clean | Kind::Dirty) {
            resident += r.folio;
        }
        if v.old.kind() == Kind::Dirty {
            sh.dirty_sub(r, 1);
            sh.drop_twin(r, v.idx);
        }
    }
    for chunk in ranges.chunks(MAX_IOV) {
        // A refusal leaves stale pages mapped over NEVER folios: said loud.
        sh.zap(chunk, "discarded folios", false);
        sh.counters
            .tlb_flush_batches
            .add(sh.pidfd.flushes(chunk.len()));
    }
    for group in victims.chunk_by(|a, b| a.region.id == b.region.id) {
        let r = &group[0].region;
        if let Some(pool) = &r.slots {
            // The slots are still ours (their folios are BUSY): punch first.
            let mut slots: Vec<u32> = group.iter().filter_map(|v| v.old.slot()).collect();
            slots.sort_unstable();
            for run in slots.chunk_by(|a, b| *b == a + 1) {
                let _ = r
                    .store
                    .punch(u64::from(run[0]) * r.folio, run.len() as u64 * r.folio);
            }
            pool.free(&slots, sh.cfg.batched_removal);
        }
    }
    for v in &victims {
        v.region
            .trace
            .record(v.idx, Path::Discarded, Kind::Busy, Kind::Never);
        let prev = folio::release(v.region.state(v.idx), |s| {
            s.with_kind(Kind::Never)
                .with_slot(None)
                .with_seq(0)
                .set(ACTIVE, false)
        });
        sh.wake_if_waiter(&v.region, v.idx, prev);
    }
    sh.budget.uncharge(resident);
    sh.counters.discards.add(victims.len() as u64);
    victims.len()
}

/// Several writers of one file (twins.rs): the diff write-back.
impl Shared {
    /// Writes back claimed, write-protected folio `idx` of `r` as a diff
    /// against its twin (taken from `r`), at store offset `off`. On success
    /// the twin is dropped and its charge returned; on failure it is put
    /// back (the folio stays DIRTY). Returns the bytes written.
    pub(crate) fn write_back_diff(&self, r: &Area, idx: usize, off: u64) -> io::Result<u64> {
        let Some(twin) = r.twins.take(idx) else {
            return Err(io::Error::other("no twin"));
        };
        let len = r.valid_len(idx) as usize;
        let mut view = vec![0u8; len];
        r.map.read_at(idx << r.shift, &mut view);
        let w = r.writers.as_ref().expect("a twin belongs to a shared file");
        match w.write_diff(&view, &twin[..len], off) {
            Ok(n) => {
                self.budget.uncharge(r.folio);
                self.counters.diff_writebacks.inc();
                Ok(n)
            }
            Err(e) => {
                r.twins.insert(idx, twin);
                Err(e)
            }
        }
    }

    /// Drops folio `idx`'s twin, if any (the folio was discarded).
    pub(crate) fn drop_twin(&self, r: &Area, idx: usize) {
        if r.twins.take(idx).is_some() {
            self.budget.uncharge(r.folio);
        }
    }
}
