//! Regions: the handle applications hold — the memory, `flush`, `unmap`.
//!
//! Contract of the end of a region (unmap, drop, and so a pager's
//! destruction): writes stop (read-only) → flush → out of the table, work in
//! flight drained → the range made inaccessible (`PROT_NONE`) → blocked
//! faults woken into SIGSEGV → LRU, budget, dirty count, swap slots
//! returned → the reservation unmapped with the last reference. Never a
//! range that leaves the userfaultfd while still mapped (it would fill
//! faults with zeros).
//!
//! In a fork child, a handle inherited from the parent stands for the
//! region mapped again on the child's engine (`lineage`): each method that
//! touches the engine asks [`Region::heir`] first and works on that one.
//!
//! Uses: `area`, `error`, `folio`, `gather`, `lineage`, `shared`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use upager_sys::mem::{Access, FixedRange};

use crate::area::Area;
use crate::error::{FlushError, UnmapError};
use crate::folio::{self, Kind};
use crate::gather::{Gather, Mode};
use crate::lineage::{self, Heir};
use crate::shared::{Owner, Shared};

/// A mapped region: an ordinary pointer to `len()` bytes that fault in on
/// first touch and leave under the pager's budget.
///
/// Use the memory through [`Region::as_ptr`] (from any thread, from C, from
/// system calls like `read(fd, ptr, n)`), or through the safe accessors
/// [`Region::bytes`], [`Region::words`], [`Region::read_at`],
/// [`Region::write_at`]. Dropping the region unmaps it (writing dirty data
/// back; use [`Region::unmap`] to see errors).
pub struct Region {
    pub(crate) inner: Arc<Area>,
    pub(crate) owner: Arc<Owner>,
    done: bool,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Region {
    pub(crate) fn new(inner: Arc<Area>, owner: Arc<Owner>) -> Region {
        Region {
            inner,
            owner,
            done: false,
        }
    }
    fn shared(&self) -> &Arc<Shared> {
        &self.owner.shared
    }

    /// The engine objects of a handle that will not unmap (fork.rs keeps
    /// them in the lineage instead).
    pub(crate) fn into_parts(mut self) -> (Arc<Area>, Arc<Owner>) {
        self.done = true;
        (Arc::clone(&self.inner), Arc::clone(&self.owner))
    }

    /// In a fork child, for a handle inherited from an ancestor: a handle
    /// (that does not unmap on drop) of the region mapped again here.
    /// None for a handle of this process's own.
    ///
    /// # Panics
    /// If the region was not inherited (anonymous memory, a store a child
    /// cannot use): the message says why.
    pub(crate) fn heir(&self) -> Option<Region> {
        match lineage::heir_of_region(&self.inner, &self.owner, false)? {
            Heir::Mapped(inner, owner) => Some(Region {
                inner,
                owner,
                done: true,
            }),
            Heir::Refused { why, reserve } => panic!(
                "region at {:#x} ({} bytes) is not usable in this fork child: {why}{}",
                self.inner.base(),
                self.inner.len,
                if reserve.is_some() {
                    " (its range is kept inaccessible: an access raises SIGSEGV)"
                } else {
                    ""
                }
            ),
        }
    }

    /// In a fork child, ends an inherited handle: unmaps what stands for
    /// it here (returned, to be dropped or unmapped by the caller) and lets
    /// the ancestor's objects go without dropping them. None for a handle
    /// of this process's own.
    fn take_heir(&mut self) -> Option<Option<Region>> {
        let heir = lineage::heir_of_region(&self.inner, &self.owner, true)?;
        self.done = true;
        lineage::forget_ancestor(&self.inner);
        lineage::forget_ancestor(&self.owner);
        Some(match heir {
            Heir::Mapped(inner, owner) => Some(Region::new(inner, owner)),
            Heir::Refused { .. } => None, // the reservation goes with the entry
        })
    }
    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.map.as_ptr()
    }
    /// Length in bytes, as requested.
    pub fn len(&self) -> usize {
        self.inner.len as usize
    }
    /// Always false (a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Folio size in bytes.
    pub fn folio_size(&self) -> u64 {
        self.inner.folio
    }
    /// Whether writes are allowed.
    pub fn is_writable(&self) -> bool {
        self.inner.writable
    }
    /// The region as atomic bytes (rounded up to whole folios).
    pub fn bytes(&self) -> &[std::sync::atomic::AtomicU8] {
        &self.inner.map.atomic_bytes()[..self.len()]
    }
    /// The region as atomic 64-bit words (length rounded down).
    pub fn words(&self) -> &[AtomicU64] {
        &self.inner.map.atomic_words()[..self.len() / 8]
    }
    /// Copies bytes out of the region (faulting them in as needed).
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) {
        assert!(
            offset
                .checked_add(buf.len())
                .is_some_and(|e| e <= self.len()),
            "read beyond the region"
        );
        self.inner.map.read_at(offset, buf);
    }
    /// Copies bytes into the region. Panics on a read-only region (a raw
    /// store through [`Region::as_ptr`] would raise SIGSEGV instead).
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(self.inner.writable, "write to a read-only region");
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.len()),
            "write beyond the region"
        );
        self.inner.map.write_at(offset, data);
    }

    /// Writes every dirty folio back and makes the store durable
    /// (fdatasync): when this returns Ok, the store holds every write made
    /// before the call. Anonymous and read-only regions have nothing to do.
    ///
    /// Each batch of dirty folios is write-protected with one call (one TLB
    /// flush) before it is written, so a write racing with the flush faults
    /// and lands after the copy; the folio is then dirty again.
    pub fn flush(&self) -> Result<(), FlushError> {
        let r = &self.inner;
        if !r.writable || r.is_anon() {
            return Ok(());
        }
        if let Some(h) = self.heir() {
            return h.flush();
        }
        flush_area(self.shared(), r)
    }

    /// The recent state changes of the folio holding byte `offset` (and of
    /// its neighbours `span` folios either side), oldest first: which path
    /// moved it (fill, write-protect fault, eviction, write-back, ...),
    /// from which state to which, when and on which thread. For the report
    /// of a check that found the wrong data at `offset`: the region keeps
    /// its last changes (8 per folio, 64 to 1,024), so call it right after the check.
    ///
    /// # Panics
    /// If `offset` is beyond the region.
    pub fn folio_trace(&self, offset: u64, span: usize) -> String {
        if let Some(h) = self.heir() {
            return h.folio_trace(offset, span);
        }
        let r = &self.inner;
        assert!(offset < r.len, "offset {offset} is beyond the region");
        let idx = (offset >> r.shift) as usize;
        let nfolios = r.len.div_ceil(r.folio) as usize;
        let s = folio::load(r.state(idx));
        format!(
            "region {} folio {idx} ({} bytes at offset {}), now {:?}{}{}:\n{}",
            r.id,
            r.folio,
            (idx as u64) << r.shift,
            s.kind(),
            if s.has(folio::PINNED) { ", pinned" } else { "" },
            if s.has(folio::QUEUED) {
                ", on the LRU"
            } else {
                ""
            },
            r.trace
                .dump(idx.saturating_sub(span)..(idx + span + 1).min(nfolios))
        )
    }

    /// Writes dirty data back (like [`Region::flush`]) and unmaps the region,
    /// releasing its memory and swap space. On error the region is handed
    /// back untouched.
    ///
    /// Other threads still using the memory (through `as_ptr`) see the
    /// right data or get SIGSEGV, as with `munmap`: writes stop first (a
    /// store raises SIGSEGV from here on, so every write that landed is in
    /// the flush below), then the range becomes inaccessible, and only then
    /// does the engine let go of it. Never zero-filled or stale memory.
    pub fn unmap(self) -> Result<(), (UnmapError, Region)> {
        self.unmap_then(false).map(drop)
    }

    /// Like [`Region::unmap`], but the region's address range is handed to
    /// the caller instead of being released: it stays reserved
    /// (inaccessible, raising SIGSEGV) until mapped over with
    /// [`MapOptions::at`](crate::MapOptions::at), so nothing else —
    /// the engine's own buffers, another thread's `malloc` — can land in
    /// it in between, as it could after a plain unmap. This is what UMap's
    /// `UMAP_FIXED` needs when it replaces a region. A part of the range
    /// nobody maps over stays reserved (address space only) until the
    /// process ends.
    ///
    /// None in a fork child whose inherited region could not be mapped
    /// again here (its range was left reserved with the lineage entry).
    pub fn unmap_keeping_range(self) -> Result<Option<FixedRange>, (UnmapError, Region)> {
        self.unmap_then(true)
    }

    fn unmap_then(mut self, keep_range: bool) -> Result<Option<FixedRange>, (UnmapError, Region)> {
        if let Some(heir) = self.take_heir() {
            return match heir {
                Some(h) => h.unmap_then(keep_range),
                None => Ok(None), // the reservation went with the lineage entry
            };
        }
        self.stop_writes(true);
        if let Err(e) = self.flush() {
            self.stop_writes(false);
            return Err((UnmapError::Flush(e), self));
        }
        self.teardown();
        // The teardown made the range inaccessible and nothing of the
        // engine uses it any more.
        Ok(keep_range.then(|| self.inner.map.keep_reserved()))
    }

    /// Makes a writable file region read-only (`stop`) or writable again.
    /// Anonymous regions skip it: nothing of theirs is flushed, so a write
    /// racing with their unmap has nothing to land in either way, and the
    /// `mprotect` would walk every resident page (measured: +15% on the
    /// unmap of 1 GiB of 4 KiB folios).
    fn stop_writes(&self, stop: bool) {
        if self.inner.writable && !self.inner.is_anon() {
            let access = if stop {
                Access::Read
            } else {
                Access::ReadWrite
            };
            if let Err(e) = self.inner.map.protect(access) {
                log::error!("mprotect of region {} failed: {e}", self.inner.id);
            }
        }
    }

    /// Removes the region: no fault or eviction is working on it afterwards,
    /// and an access to its range raises SIGSEGV.
    ///
    /// Order (the fix for zero-filled reads during unmap): a range that is
    /// unregistered from the userfaultfd while still mapped fills any fault
    /// with a fresh zero page, so the range is made inaccessible *before* it
    /// leaves the userfaultfd (the `MAP_FIXED` `PROT_NONE` mapping replaces
    /// it, registration included), and faults waiting on it are woken only
    /// after that, to retry into SIGSEGV. The address stays reserved until
    /// the engine drops its last reference (the mapping is unmapped then).
    fn teardown(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let r = &self.inner;
        let sh = self.shared();
        // 1) No new fault, eviction or prefetch starts on the region: a fault
        //    arriving now finds no region and stays blocked until 3).
        r.dying.store(true, Ordering::SeqCst);
        sh.table.remove(r.id);
        // 2) Those in flight finish (a direct-reclaim stall is bounded, so
        //    this ends; say so if it takes long).
        let start = Instant::now();
        let mut warned = false;
        while r.inflight.load(Ordering::SeqCst) != 0 {
            std::thread::sleep(Duration::from_micros(200));
            if !warned && start.elapsed() > Duration::from_secs(10) {
                warned = true;
                log::warn!(
                    "unmap of region {} still waits for faults in flight after 10 s",
                    r.id
                );
            }
        }
        // The warm start's trace (warm.rs), after the flush (the file's
        // mtime, which the trace is tied to, is final) and once no fill can
        // add to it: written beside the file, or a replay's last counts.
        if let Some(w) = &r.warm {
            if let Some(rp) = w.replay() {
                sh.counters.replay_hits.add(rp.take_hits());
            }
            w.save();
        }
        // 3) Inaccessible, then wake the blocked faults: they retry into
        //    SIGSEGV. Every folio is settled (nothing is in flight), so the
        //    state words below are final.
        if let Err(e) = r.map.make_inaccessible() {
            // Cannot happen short of the mapping-count limit (the range may
            // split a merged neighbour). Fall back to PROT_NONE in place;
            // the range stays registered either way, never readable while
            // unregistered, and its pages go with the munmap of the drop.
            log::error!("replacing region {} failed: {e}", r.id);
            if let Err(e) = r.map.protect(Access::None) {
                log::error!("and protecting it failed: {e}; faults there wait");
            }
        }
        for uffd in &sh.uffds {
            let _ = uffd.wake(r.base(), r.map_len());
        }
        if sh.mode == crate::FaultMode::InThread {
            // In-thread faults on the range now get SIGSEGV, not SIGBUS.
            crate::inthread::unregister(r.id, sh);
        }
        // 4) Drop its LRU entries (a fill that finished during 2) may have
        //    queued one), return its budget, its dirty count and its swap
        //    slots (the swap file is shared: punch their space, then free).
        sh.lru.purge(r.id);
        let (mut resident, mut dirty) = (0u64, 0u64);
        let mut slots = Vec::new();
        for idx in r.touched_folios() {
            let s = folio::load(r.state(idx));
            match s.kind() {
                Kind::Clean => resident += r.folio,
                Kind::Dirty => {
                    resident += r.folio;
                    dirty += 1;
                }
                _ => {}
            }
            if let Some(slot) = s.slot() {
                slots.push(slot);
            }
        }
        sh.budget.uncharge(resident);
        sh.dirty_sub(r, dirty);
        // Twins of folios whose write-back failed; the file's writers
        // forget the region.
        sh.budget.uncharge(r.twins.clear() * r.folio);
        if let Some(w) = &r.writers {
            w.leave(r.id);
        }
        if r.folio == crate::thp::HUGE || r.run_folios > 0 {
            sh.thp.unwant(&sh.budget);
        }
        let pinned = r
            .pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .count();
        sh.budget.unpin(pinned as u64 * r.folio);
        if let Some(pool) = &r.slots {
            slots.sort_unstable();
            for run in slots.chunk_by(|a, b| *b == a + 1) {
                let _ = r
                    .store
                    .punch(u64::from(run[0]) * r.folio, run.len() as u64 * r.folio);
            }
            pool.free(&slots, true);
        }
        // 5) Guards drop their reference just after their in-flight count,
        //    and a lookup may still hold the old table snapshot: wait
        //    (bounded) until this handle owns the region alone, so the
        //    address range is released when unmap returns.
        let start = Instant::now();
        while Arc::strong_count(&self.inner) > 1 {
            if start.elapsed() > Duration::from_secs(5) {
                log::warn!(
                    "region {} still referenced 5 s after unmap; it is released later",
                    self.inner.id
                );
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.take_heir().is_some() {
            return; // what stood for it here is dropped (unmapped) now
        }
        self.stop_writes(true);
        if let Err(e) = self.flush() {
            log::warn!("region {} dropped with unwritten data: {e}", self.inner.id);
        }
        self.teardown();
    }
}

/// Writes every dirty folio of `r` back and syncs its store (see
/// [`Region::flush`]); also the fork handlers' `prepare` step.
pub(crate) fn flush_area(sh: &Shared, r: &Arc<Area>) -> Result<(), FlushError> {
    let first_err = write_back_area(sh, r).err();
    let sticky = r.take_error();
    if let Some(e) = first_err.or(sticky) {
        return Err(FlushError::Writeback(e));
    }
    r.store.sync().map_err(FlushError::Sync)?;
    sh.counters.flushes.inc();
    Ok(())
}

/// Writes every dirty folio of `r` back (they stay resident, CLEAN), without
/// making the store durable and without taking the region's sticky error
/// (a flush reports that): what a forked child needs to read the parent's
/// writes from the store. The first write-back error, if any.
pub(crate) fn write_back_area(sh: &Shared, r: &Arc<Area>) -> Result<(), std::io::Error> {
    // A BUSY folio may be a dirty one being evicted (its write-back not
    // done yet) or one being made dirty: collect waits it out, so every
    // write made before this call is on the store when it returns.
    let mut batch = Gather::new(sh, Mode::Writeback, sh.batch_folios(r.folio));
    batch.collect(r, r.touched_folios(), |s| s.kind() == Kind::Dirty);
    match batch.finish() {
        (_, Some(e)) => Err(e),
        (_, None) => Ok(()),
    }
}
