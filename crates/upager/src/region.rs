//! Regions: the memory applications use, and its folio states.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Swap slots (anonymous regions only).
    pub slots: Option<Slots>,
    pub writable: bool,
    pub inflight: AtomicU64,
    pub dying: AtomicBool,
    /// First write-back error since the last flush reported one.
    pub wb_error: Mutex<Option<io::Error>>,
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
    pub fn unmap(mut self) -> Result<(), (UnmapError, Region)> {
        if let Err(e) = self.flush() {
            return Err((UnmapError::Flush(e), self));
        }
        self.teardown();
        Ok(())
    }

    /// Removes the region: no fault or eviction is working on it afterwards.
    fn teardown(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let r = &self.inner;
        let sh = self.shared();
        // 1) No new fault, eviction or prefetch starts on the region.
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
                eprintln!(
                    "upager: unmap of region {} still waits for faults in flight after 10 s",
                    r.id
                );
            }
        }
        // 3) Only now drop its LRU entries: a fill that finished during 2)
        //    may have queued one.
        sh.purge_region(r.id);
        let mut resident = 0u64;
        for idx in r.touched_folios() {
            if matches!(folio::load(r.state(idx)).kind(), Kind::Clean | Kind::Dirty) {
                resident += r.folio;
            }
        }
        sh.unreserve(resident);
        // Wakes anything still waiting on the range; later accesses fault
        // as on any unmapped memory.
        let _ = sh.uffd.unregister(r.base(), r.map_len());
        // 4) Guards drop their reference just after their in-flight count,
        //    and a lookup may still hold the old table snapshot: wait
        //    (bounded) until this handle owns the region alone, so the
        //    mapping and the swap file are released when unmap returns.
        let start = Instant::now();
        while Arc::strong_count(&self.inner) > 1 {
            if start.elapsed() > Duration::from_secs(5) {
                eprintln!(
                    "upager: region {} still referenced 5 s after unmap; it is released later",
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
        if let Err(e) = self.flush() {
            eprintln!(
                "upager: region {} dropped with unwritten data: {e}",
                self.inner.id
            );
        }
        self.teardown();
    }
}
