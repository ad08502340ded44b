//! Regions: the memory applications use, and its folio states.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use upager_sys::mem::Mapping;

use crate::error::{FlushError, UnmapError};
use crate::folio::{self, Kind, State};
use crate::pager::{Owner, Shared};
use crate::reclaim::Mode;
use crate::store::{Slots, Src, Store};
use crate::table::Inflight;

/// Engine-side state of one region, shared by handles, fault handlers and
/// the reclaimer.
pub(crate) struct RegionInner {
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
}

/// Back-off of write-backs to a store that refuses them (full disk, I/O
/// error): after [`Backoff::FAILS`] write-backs in a row failed, reclaim and
/// the dirty limit leave the region's dirty folios alone for a delay that
/// doubles from 10 ms to 1 s, so a full disk costs a few attempts a second
/// instead of millions, and reclaim evicts clean folios meanwhile. A store
/// that fails now and then (a flaky one) never gets there. `flush` ignores
/// the delay (the caller asked). A success ends it.
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
            if self.delay_ns.load(Ordering::Relaxed) != 0 {
                self.delay_ns.store(0, Ordering::Relaxed);
                self.until_ns.store(0, Ordering::Release);
            }
            return;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= Self::FAILS && !self.blocked() {
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

impl std::fmt::Debug for RegionInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("base", &self.base())
            .field("len", &self.len)
            .finish()
    }
}

/// Folios per bit of [`RegionInner::touched`].
pub(crate) const CHUNK: usize = 512;

impl RegionInner {
    /// Records that folio `idx` has left NEVER (call before filling it).
    pub fn mark_touched(&self, idx: usize) {
        let (w, bit) = (idx / CHUNK / 64, 1u64 << (idx / CHUNK % 64));
        if self.touched[w].load(Ordering::Acquire) & bit == 0 {
            self.touched[w].fetch_or(bit, Ordering::SeqCst);
        }
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

    pub fn base(&self) -> u64 {
        self.map.addr()
    }
    pub fn map_len(&self) -> u64 {
        self.map.len() as u64
    }
    pub fn nfolios(&self) -> usize {
        self.states.len()
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
    pub fn is_anon(&self) -> bool {
        self.slots.is_some()
    }
    /// Bytes of folio `idx` that belong to the region (the last may be short).
    pub fn valid_len(&self, idx: usize) -> u64 {
        self.folio.min(self.len - ((idx as u64) << self.shift))
    }
    /// Region memory of folios `[idx, idx+n)`, for writing to a store.
    pub fn src(&self, idx: usize, bytes: u64) -> Src<'_> {
        Src {
            map: &self.map,
            off: (idx << self.shift),
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
    pub fn take_error(&self) -> Option<io::Error> {
        self.wb_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// A mapped region: an ordinary pointer to `len()` bytes that fault in on
/// first touch and leave under the pager's budget.
///
/// Use the memory through [`Region::as_ptr`] (from any thread, from C, from
/// system calls like `read(fd, ptr, n)`), or through the safe accessors
/// [`Region::bytes`], [`Region::words`], [`Region::read_at`],
/// [`Region::write_at`]. Dropping the region unmaps it (writing dirty data
/// back; use [`Region::unmap`] to see errors).
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
    pub(crate) owner: Arc<Owner>,
    done: bool,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Region {
    pub(crate) fn new(inner: Arc<RegionInner>, owner: Arc<Owner>) -> Region {
        Region {
            inner,
            owner,
            done: false,
        }
    }
    fn shared(&self) -> &Arc<Shared> {
        &self.owner.shared
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
        let sh = self.shared();
        let batch = sh.batch_folios(r.folio);
        let mut first_err = None;
        let mut victims = Vec::with_capacity(batch);
        let mut run = |victims: &mut Vec<crate::reclaim::Victim>| {
            if let Err(e) = sh.shrink_list(std::mem::take(victims), Mode::Writeback) {
                first_err.get_or_insert(e);
            }
        };
        for idx in r.touched_folios() {
            // A BUSY folio may be a dirty one being evicted (its write-back
            // not done yet) or one being made dirty: wait it out, so every
            // write made before this call is on the store when we sync.
            // Write back what we hold before waiting (see claim_when_idle).
            let Some(old) = folio::claim_when_idle(
                r.state(idx),
                |s| s.kind() == Kind::Dirty,
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
            victims.push(crate::reclaim::Victim {
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
        let sticky = r.take_error();
        if let Some(e) = first_err.or(sticky) {
            return Err(FlushError::Writeback(e));
        }
        r.store.sync().map_err(FlushError::Sync)?;
        sh.counters.flushes.inc();
        Ok(())
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
    pub fn unmap(mut self) -> Result<(), (UnmapError, Region)> {
        self.stop_writes(true);
        if let Err(e) = self.flush() {
            self.stop_writes(false);
            return Err((UnmapError::Flush(e), self));
        }
        self.teardown();
        Ok(())
    }

    /// Makes a writable region read-only (`stop`) or writable again.
    fn stop_writes(&self, stop: bool) {
        if self.inner.writable {
            if let Err(e) = self.inner.map.set_writable(!stop) {
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
        // 3) Inaccessible, then wake the blocked faults: they retry into
        //    SIGSEGV. Every folio is settled (nothing is in flight), so the
        //    state words below are final.
        if let Err(e) = r.map.make_inaccessible() {
            // Cannot happen short of the mapping-count limit; the fallback
            // still ends every access in SIGSEGV, pages are freed below.
            log::error!("replacing region {} failed: {e}", r.id);
            let _ = r.map.set_writable(false);
            let _ = sh.uffd.unregister(&r.map);
            let _ = sh.pidfd.dontneed(&[r.map.whole()]);
        }
        let _ = sh.uffd.wake(r.base(), r.map_len());
        // 4) Drop its LRU entries (a fill that finished during 2) may have
        //    queued one), return its budget, its dirty count and its swap
        //    slots (the swap file is shared: punch their space, then free).
        sh.purge_region(r.id);
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
        sh.unreserve(resident);
        sh.dirty_sub(r, dirty);
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
        self.stop_writes(true);
        if let Err(e) = self.flush() {
            log::warn!("region {} dropped with unwritten data: {e}", self.inner.id);
        }
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;

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
        assert_eq!(
            b.delay_ns.load(std::sync::atomic::Ordering::Relaxed),
            Backoff::MIN_NS
        );
        b.record(true);
        assert!(!b.blocked());
    }
}
