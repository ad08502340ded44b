//! The compressed tier of anonymous regions (the kernel's zswap idea):
//! [`ZStore`], a store in front of the swap file that keeps evicted folios
//! compressed in memory charged to the budget, and serves their refaults by
//! decompressing instead of reading the swap file.
//!
//! Contract:
//! - **Part of the budget.** The pool's bytes are in the budget's resident
//!   count (budget.rs, [`Charge`]): a folio leaves the budget and its
//!   compressed copy enters it. The pool may take at most
//!   [`MAX_POOL_PERCENT`] of the budget, over all regions' tiers.
//! - **Adaptive.** A batch is measured before it is kept: its first
//!   [`SAMPLE`] folios are compressed, and if they do not shrink below
//!   [`MAX_RATIO`] of their size the whole batch goes to the swap file
//!   uncompressed (counter `ztier_rejects`); so is any single folio of a
//!   kept batch that does not shrink that far. A folio that is a few runs
//!   of equal differences of consecutive 64-bit words (arrays of indexes,
//!   counters, timestamps) is kept as those runs ([`Codec::Runs`]); the
//!   others, per batch, as LZ4, or LZ4 over the word differences,
//!   whichever shrinks the batch's first such folio more.
//! - **Shrinks under pressure.** The pool is a log (a ring in one
//!   mapping): new entries at its head, the oldest at its tail. When the
//!   pool is at its cap, or the budget finds nothing to evict
//!   ([`PoolTier::shrink`]), the entries at the tail that are still live
//!   are decompressed and written to the swap file together (one
//!   `Store::write_batch`), then dropped; the ring's pages behind the tail
//!   are given back (`MADV_DONTNEED`) and uncharged.
//! - **No lost write.** `write_batch` returns only once each folio is in
//!   the pool or, by the swap file's own `write_batch`, in the swap file:
//!   the engine unmaps a folio only after that. A folio sent to the swap
//!   file first drops its slot's pool entry (under the log lock), so an
//!   older copy can neither be served nor written over the new one by a
//!   shrink (shrinks hold the log lock across their writes).
//! - **Signal-safe reads.** [`Store::read_at`] may run in a SIGBUS handler
//!   (in-thread fault mode): it reads the slot's entry word from a table of
//!   atomics, copies the compressed bytes out of the ring into one of
//!   [`LOAD_BUFS`] preallocated buffers (`try_lock`), checks the entry word
//!   again, and decodes the copy into the caller's buffer (`lz4_flex` block
//!   decoding: no allocation, no lock, bounds-checked). The pairing, a
//!   seqlock's:
//!
//! ```text
//!   writer (under the log lock)            reader (any thread, any context)
//!   drop:  word := 0                       e1 := word            (Acquire)
//!          ... later, reuse of the ring:   copy ring[e1]
//!          fence(Release)                  fence(Acquire)
//!          write ring bytes                e2 := word
//!   publish: write ring bytes;             e1 == e2: the bytes were e1's
//!          word := e (Release)             else: try again (or the swap file)
//! ```
//!   A reader that copied bytes a writer was replacing sees the
//!   word changed (the entry is dropped before its space is reused) and
//!   retries; the entry word carries the ring lap, so a word republished
//!   at the same place is a different word. An entry is dropped only
//!   after its bytes are in the swap file, so a reader that finds no entry
//!   reads the swap file and gets them.
//! - Loads keep their entry (a folio refaulted clean may be evicted again
//!   without a write: its copy must stay); an entry goes when its slot is
//!   written again, punched (discard, unmap) or written out by a shrink.
//!
//! Lock: the log's mutex, a leaf, taken by writers only (store, punch,
//! shrink), never by a read.
//!
//! Counters: `ztier_stores`, `ztier_loads`, `ztier_rejects`,
//! `ztier_writebacks`, `ztier_folios`, `ztier_bytes`, `ztier_pool_bytes`,
//! `ztier_saved_bytes`, `ztier_compress_ns`, `ztier_decompress_ns`.
//!
//! Uses: `budget`, `stats`, `store`.

use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use upager_sys::mem::{Advice, AtomicTable, Mapping};

use crate::budget::{Charge, PoolTier};
use crate::stats::Stats;
use crate::store::{Src, Store, Write, Written};

/// The environment variable that turns the tier on or off where no code
/// does (`on`/`off`).
pub const ZTIER_ENV: &str = "UPAGER_ZTIER";

/// Most of the budget the pools may take, in percent. (Measured: the
/// compressible benchmark data needs well under 1%; 50 leaves half the
/// budget to resident folios whatever the data. A guess beyond that.)
pub(crate) const MAX_POOL_PERCENT: u64 = 50;

/// A folio is kept only if it compresses to at most this share of its
/// size (3/4, as the issue asks: a smaller saving does not pay for the
/// decompression and the pool's space).
pub(crate) const MAX_RATIO: (usize, usize) = (3, 4);

/// Folios of a batch compressed to decide whether it compresses.
pub(crate) const SAMPLE: usize = 2;

/// Most entries one shrink step writes out together.
const SHRINK_ENTRIES: usize = 64;

/// Pages behind the tail are given back in runs of at least this.
const RELEASE_CHUNK: u64 = 64 << 10;

const PAGE: usize = 4096;

/// Buffers a region's loads copy compressed bytes into (a load that finds
/// all taken in a SIGBUS handler is handed to a resolver thread; anywhere
/// else it allocates one).
const LOAD_BUFS: usize = 8;

/// Entry header in the ring: slot (u32) and compressed length (u32).
const HDR: u64 = 8;
/// Slot of a padding record (the rest of the ring before it wraps).
const PAD: u32 = u32::MAX;

// Entry word: valid (1) | codec (2) | lap (7) | len (22) | off/8 (32).
const VALID: u64 = 1 << 63;
const CODEC_SHIFT: u32 = 61;
const LAP_SHIFT: u32 = 54;
const LEN_SHIFT: u32 = 32;
const LEN_MASK: u64 = (1 << 22) - 1;
const OFF_MASK: u64 = (1 << 32) - 1;

/// How an entry is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    /// LZ4 block.
    Lz4 = 0,
    /// LZ4 block of the differences of consecutive 64-bit words.
    DeltaLz4 = 1,
    /// Runs of equal differences of consecutive 64-bit words: (difference
    /// u64, count u32) each, little-endian. Arrays of indexes, counters,
    /// timestamps in 1 or 2 runs a folio: decoding is a loop of additions
    /// (2 µs per 64 KiB, against 20 µs for LZ4 of the same deltas).
    Runs = 2,
}

impl Codec {
    fn of(bits: u64) -> Codec {
        match bits & 3 {
            0 => Codec::Lz4,
            1 => Codec::DeltaLz4,
            _ => Codec::Runs,
        }
    }
}

fn pack(at: u64, len: usize, lap: u64, codec: Codec) -> u64 {
    VALID
        | ((codec as u64) << CODEC_SHIFT)
        | ((lap & 0x7f) << LAP_SHIFT)
        | ((len as u64 & LEN_MASK) << LEN_SHIFT)
        | ((at >> 3) & OFF_MASK)
}

/// `(ring offset, compressed length, codec)` of a valid entry word.
fn unpack(e: u64) -> (usize, usize, Codec) {
    (
        ((e & OFF_MASK) << 3) as usize,
        ((e >> LEN_SHIFT) & LEN_MASK) as usize,
        Codec::of(e >> CODEC_SHIFT),
    )
}

/// Decodes `src` into `out` (one folio); false if it does not decode to
/// exactly that. Async-signal-safe: no allocation.
fn decode(codec: Codec, src: &[u8], out: &mut [u8]) -> bool {
    match codec {
        Codec::Lz4 | Codec::DeltaLz4 => {
            if !matches!(lz4_flex::block::decompress_into(src, out), Ok(n) if n == out.len()) {
                return false;
            }
            if codec == Codec::DeltaLz4 {
                undelta(out);
            }
            true
        }
        Codec::Runs => {
            if !src.len().is_multiple_of(12) {
                return false;
            }
            let words = out.len() / 8;
            let (mut acc, mut at) = (0u64, 0usize);
            for r in src.chunks_exact(12) {
                let d = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
                let n = u32::from_le_bytes(r[8..].try_into().expect("4 bytes")) as usize;
                if n > words - at {
                    return false;
                }
                for w in out[at * 8..(at + n) * 8].chunks_exact_mut(8) {
                    acc = acc.wrapping_add(d);
                    w.copy_from_slice(&acc.to_le_bytes());
                }
                at += n;
            }
            at == words
        }
    }
}

/// `src` as runs of equal word differences ([`Codec::Runs`]) if that takes
/// at most `max` bytes.
fn encode_runs(src: &[u8], max: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut prev, mut run) = (0u64, None::<(u64, u32)>);
    for w in src.chunks_exact(8) {
        let x = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let d = x.wrapping_sub(prev);
        prev = x;
        run = match run {
            Some((rd, n)) if rd == d => Some((rd, n + 1)),
            Some((rd, n)) => {
                out.extend_from_slice(&rd.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
                if out.len() + 12 > max {
                    return None;
                }
                Some((d, 1))
            }
            None => Some((d, 1)),
        };
    }
    if let Some((rd, n)) = run {
        out.extend_from_slice(&rd.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    (out.len() <= max).then_some(out)
}

fn align8(n: u64) -> u64 {
    (n + 7) & !7
}

/// Whether the tier is on for a pager built with `setting` (None: the
/// `UPAGER_ZTIER` environment variable, else on).
pub(crate) fn enabled(setting: Option<bool>) -> bool {
    if let Some(on) = setting {
        return on;
    }
    match std::env::var(ZTIER_ENV) {
        Ok(v) => {
            match v.trim().to_ascii_lowercase().as_str() {
                "" | "on" | "1" | "true" | "yes" => true,
                "off" | "0" | "false" | "no" => false,
                other => {
                    log::warn!("{ZTIER_ENV}={other:?}: use \"on\" or \"off\"; the compressed tier stays on");
                    true
                }
            }
        }
        Err(_) => true,
    }
}

/// The tier's counters (atomics: a load in a SIGBUS handler counts too).
#[derive(Debug, Default)]
struct ZCounters {
    stores: AtomicU64,
    loads: AtomicU64,
    rejects: AtomicU64,
    writebacks: AtomicU64,
    compress_ns: AtomicU64,
    decompress_ns: AtomicU64,
    /// Gauges: folios held, their compressed bytes, the pool's charge.
    folios: AtomicU64,
    bytes: AtomicU64,
    pool: AtomicU64,
}

/// The log's positions (absolute byte positions; ring offset = pos % cap).
#[derive(Debug, Default)]
struct Log {
    /// Next append.
    head: u64,
    /// Oldest byte still in use.
    tail: u64,
    /// Pages below this were given back (≤ tail, a multiple of the chunk
    /// or the tail itself); `head - released` is the pool's charge.
    released: u64,
    /// Scratch for writing entries out (mapped when first needed).
    scratch: Option<Mapping>,
}

/// The buffers loads copy compressed bytes into ([`LOAD_BUFS`] of them).
type LoadBufs = Box<[Mutex<Box<[u8]>>]>;

/// An anonymous region's store with the compressed tier in front of its
/// swap file (see the module doc).
pub(crate) struct ZStore {
    inner: Arc<dyn Store>,
    folio: usize,
    /// Entry word per slot.
    table: AtomicTable,
    /// The ring.
    ring: Mapping,
    cap: u64,
    /// Most bytes all pools of the budget may hold.
    pool_max: u64,
    charge: Arc<Charge>,
    log: Mutex<Log>,
    /// Made by the first store (a region never evicted has no entries).
    load_bufs: std::sync::OnceLock<LoadBufs>,
    c: ZCounters,
}

impl std::fmt::Debug for ZStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZStore")
            .field("inner", &self.inner)
            .field("folio", &self.folio)
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl ZStore {
    /// The tier in front of `inner` (the swap file) for a region of
    /// `folios` folios of `folio` bytes, charged to `charge`. None when the
    /// budget is too small for a pool of a few folios (the region then
    /// swaps as before).
    pub fn new(
        inner: Arc<dyn Store>,
        folio: u64,
        folios: u64,
        charge: Arc<Charge>,
    ) -> io::Result<Option<ZStore>> {
        let pool_max = charge.limit() / 100 * MAX_POOL_PERCENT;
        let cap = pool_max & !(PAGE as u64 - 1);
        if folio > u64::from(u32::MAX) || cap < 8 * folio || cap >> 3 > OFF_MASK {
            return Ok(None);
        }
        // Slots are shared by the pager's anonymous regions of this folio
        // size: room for twice this region's folios; a slot beyond the
        // table goes to the swap file.
        let slots = (folios.saturating_mul(2) + 4096).min(1 << 28) as usize;
        Ok(Some(ZStore {
            inner,
            folio: folio as usize,
            table: AtomicTable::zeroed(slots)?,
            ring: Mapping::anonymous(cap as usize, PAGE, true)?,
            cap,
            pool_max,
            charge,
            log: Mutex::new(Log::default()),
            load_bufs: std::sync::OnceLock::new(),
            c: ZCounters::default(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decompresses slot `slot`'s entry into `out` (one folio); false if
    /// the tier does not hold it. Async-signal-safe.
    fn load(&self, slot: usize, out: &mut [u8]) -> io::Result<bool> {
        let Some(word) = self.table.get(slot) else {
            return Ok(false);
        };
        if word.load(Ordering::Acquire) & VALID == 0 {
            return Ok(false);
        }
        let started = Instant::now();
        // A buffer for the compressed bytes: no allocation in a handler.
        let bufs = self.load_bufs.get().map_or(&[][..], |b| &b[..]);
        let mut own;
        let mut taken = bufs.iter().find_map(|b| b.try_lock().ok());
        let cbuf: &mut [u8] = match taken.as_deref_mut() {
            Some(b) => b,
            None if upager_sys::signal::in_sigbus_handler() => {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            None => {
                own = vec![0u8; self.folio];
                &mut own
            }
        };
        for _ in 0..8 {
            let e1 = word.load(Ordering::Acquire);
            if e1 & VALID == 0 {
                return Ok(false);
            }
            let (at, len, codec) = unpack(e1);
            self.ring.read_at(at, &mut cbuf[..len]);
            fence(Ordering::Acquire);
            if word.load(Ordering::Relaxed) != e1 {
                continue; // replaced or dropped meanwhile: look again
            }
            // The copy is the entry's (the word did not change): decode it.
            if !decode(codec, &cbuf[..len], out) {
                // (No message: this may run in a SIGBUS handler, where
                // io::Error::new would allocate.)
                return Err(io::Error::from(io::ErrorKind::InvalidData));
            }
            self.c.loads.fetch_add(1, Ordering::Relaxed);
            self.c
                .decompress_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            return Ok(true);
        }
        // Changing under us again and again: the swap file has it once
        // its entry is dropped; let the fault try again later.
        Err(io::Error::from(io::ErrorKind::Interrupted))
    }

    /// Drops slot `slot`'s entry (its bytes become a hole in the ring).
    fn drop_entry(&self, slot: usize) {
        if let Some(w) = self.table.get(slot) {
            let old = w.swap(0, Ordering::AcqRel);
            if old & VALID != 0 {
                self.forget(old);
            }
        }
    }

    fn forget(&self, e: u64) {
        let (_, len, _) = unpack(e);
        self.c.folios.fetch_sub(1, Ordering::Relaxed);
        self.c.bytes.fetch_sub(len as u64, Ordering::Relaxed);
    }

    /// Appends `data` as slot `slot`'s entry (dropping its old one); false
    /// if no room could be made.
    fn append(&self, log: &mut Log, slot: usize, data: &[u8], codec: Codec) -> bool {
        let need = align8(HDR + data.len() as u64);
        let at = log.head % self.cap;
        let pad = if at + need > self.cap {
            self.cap - at
        } else {
            0
        };
        if !self.make_room(log, pad + need) {
            return false;
        }
        // Space about to be written may have been read by a reader holding
        // a dropped entry: it sees the word changed (module doc).
        fence(Ordering::Release);
        if pad > 0 {
            self.write_hdr(at as usize, PAD, pad as u32);
            log.head += pad;
        }
        let at = (log.head % self.cap) as usize;
        self.write_hdr(at, slot as u32, data.len() as u32);
        // Room was made for it, and it does not wrap; no live entry uses it.
        self.ring.write_at(at + HDR as usize, data);
        let lap = log.head / self.cap;
        let e = pack(at as u64 + HDR, data.len(), lap, codec);
        let old = self.table[slot].swap(e, Ordering::Release);
        if old & VALID != 0 {
            self.forget(old);
        }
        log.head += need;
        self.c.folios.fetch_add(1, Ordering::Relaxed);
        self.c.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.charge.pool_grow(pad + need);
        self.c.pool.fetch_add(pad + need, Ordering::Relaxed);
        true
    }

    fn write_hdr(&self, at: usize, slot: u32, len: u32) {
        let mut h = [0u8; 8];
        h[..4].copy_from_slice(&slot.to_le_bytes());
        h[4..].copy_from_slice(&len.to_le_bytes());
        // `at` is 8-aligned and at most `cap - 8` (the ring's size and every
        // record are multiples of 8).
        self.ring.write_at(at, &h);
    }

    fn read_hdr(&self, at: usize) -> (u32, u32) {
        let mut h = [0u8; 8];
        self.ring.read_at(at, &mut h);
        (
            u32::from_le_bytes(h[..4].try_into().expect("4 bytes")),
            u32::from_le_bytes(h[4..].try_into().expect("4 bytes")),
        )
    }

    /// Makes room for `need` more bytes: within the ring and within the
    /// pools' share of the budget, writing out the oldest entries.
    fn make_room(&self, log: &mut Log, need: u64) -> bool {
        loop {
            // From `released`, not the tail: the pages between them are
            // given back later, and must not hold new entries by then.
            let in_ring = log.head + need - log.released <= self.cap;
            let in_share = self.charge.pool_bytes() + need <= self.pool_max;
            if in_ring && in_share {
                return true;
            }
            let before = log.tail;
            if log.tail == log.head {
                return false;
            }
            self.shrink_locked(log);
            if log.tail == before {
                return false; // the oldest entry could not be written out
            }
        }
    }

    /// Writes the oldest live entries (up to [`SHRINK_ENTRIES`]) out to the
    /// swap file, drops them, moves the tail past them and gives back the
    /// pages behind it. Returns the bytes uncharged.
    fn shrink_locked(&self, log: &mut Log) -> u64 {
        let folio = self.folio;
        // 1) the entries from the tail: (slot, word, end of its record).
        let mut live: Vec<(usize, u64, u64)> = Vec::new();
        let mut pos = log.tail;
        let mut ends = Vec::new(); // record ends, for the tail to stop at
        while pos < log.head && live.len() < SHRINK_ENTRIES {
            let at = pos % self.cap;
            let (slot, len) = self.read_hdr(at as usize);
            let end = if slot == PAD {
                pos + u64::from(len)
            } else {
                pos + align8(HDR + u64::from(len))
            };
            if slot != PAD {
                let e = self
                    .table
                    .get(slot as usize)
                    .map_or(0, |w| w.load(Ordering::Acquire));
                let (eat, _, _) = unpack(e);
                if e & VALID != 0 && eat as u64 == at + HDR {
                    live.push((slot as usize, e, end));
                }
            }
            ends.push(end);
            pos = end;
        }
        // 2) decompress them into the scratch and write them out together.
        let mut upto = pos; // the tail may move this far
        if !live.is_empty() {
            let scratch = match &log.scratch {
                Some(m) => m,
                None => match Mapping::anonymous(SHRINK_ENTRIES * folio, PAGE, true) {
                    Ok(m) => log.scratch.insert(m),
                    Err(e) => {
                        log::warn!("compressed tier: no scratch to write entries out: {e}");
                        return 0;
                    }
                },
            };
            let mut writes = Vec::with_capacity(live.len());
            let mut cbuf = vec![0u8; folio];
            let mut out = vec![0u8; folio];
            for (k, &(slot, e, _)) in live.iter().enumerate() {
                let (at, len, codec) = unpack(e);
                // The entry cannot change: its writers hold the log lock.
                self.ring.read_at(at, &mut cbuf[..len]);
                if !decode(codec, &cbuf[..len], &mut out) {
                    log::error!("compressed tier: entry of slot {slot} is corrupt; kept");
                    upto = upto.min(live[k].2 - align8(HDR + len as u64));
                    break;
                }
                scratch.write_at(k * folio, &out);
                writes.push(Write {
                    src: Src {
                        map: scratch,
                        off: k * folio,
                        len: folio,
                    },
                    offset: (slot * folio) as u64,
                });
            }
            let done = self.inner.write_batch(&writes);
            for (k, res) in done.results.iter().enumerate() {
                let (slot, e, end) = live[k];
                if let Err(err) = res {
                    log::warn!("compressed tier: writing slot {slot} out to the swap file failed: {err}; kept");
                    upto = upto.min(end - align8(HDR + unpack(e).1 as u64));
                    break;
                }
                // Dropped only now that the swap file has its bytes.
                if self.table[slot]
                    .compare_exchange(e, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    self.forget(e);
                    self.c.writebacks.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // 3) the tail moves to the last record end not past `upto`.
        let new_tail = ends
            .iter()
            .copied()
            .filter(|&e| e <= upto)
            .max()
            .unwrap_or(log.tail);
        log.tail = new_tail;
        self.release(log)
    }

    /// Gives back the ring's pages behind the tail; returns the bytes
    /// uncharged.
    fn release(&self, log: &mut Log) -> u64 {
        let to = if log.tail == log.head {
            log.tail
        } else {
            log.tail - log.tail % RELEASE_CHUNK
        };
        if to <= log.released {
            return 0;
        }
        let page = PAGE as u64;
        // The whole pages of [released, to), per stretch of the ring (a
        // page cut by `to` is the head's, still in use, when tail == head).
        let mut from = log.released;
        while from < to {
            let at = from % self.cap;
            let run = (to - from).min(self.cap - at);
            let (first, last) = (at.next_multiple_of(page), (at + run) / page * page);
            if last > first {
                let _ = self
                    .ring
                    .advise(first as usize, (last - first) as usize, Advice::DontNeed);
            }
            from += run;
        }
        let freed = to - log.released;
        log.released = to;
        self.charge.pool_shrink(freed);
        self.c.pool.fetch_sub(freed, Ordering::Relaxed);
        freed
    }

    /// Compresses `src` into `out` (room for the worst case); kept if at
    /// most [`MAX_RATIO`] of its size:
    /// the compressed length, or None if it does not shrink that far.
    fn compress(src: &[u8], delta: bool, tmp: &mut [u8], out: &mut [u8]) -> Option<usize> {
        let input = if delta {
            let mut prev = 0u64;
            for (o, w) in tmp.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                let x = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                o.copy_from_slice(&x.wrapping_sub(prev).to_le_bytes());
                prev = x;
            }
            &*tmp
        } else {
            src
        };
        let max = src.len() * MAX_RATIO.0 / MAX_RATIO.1;
        // (`out` must have room for the worst case: the encoder checks
        // that before it starts.)
        lz4_flex::block::compress_into(input, out)
            .ok()
            .filter(|&n| n <= max)
    }

    /// The tier's half of a batch: which writes it kept (true), the others
    /// to go to the swap file (their old entries dropped already).
    fn keep_batch(&self, batch: &[Write<'_>]) -> Vec<bool> {
        let folio = self.folio;
        let max_out = lz4_flex::block::get_maximum_output_size(folio);
        let slot_of = |w: &Write<'_>| -> Option<usize> {
            let s = (w.offset / folio as u64) as usize;
            (w.src.len() == folio && w.offset.is_multiple_of(folio as u64) && s < self.table.len())
                .then_some(s)
        };
        let started = Instant::now();
        self.load_bufs.get_or_init(|| {
            (0..LOAD_BUFS)
                .map(|_| Mutex::new(vec![0u8; folio].into_boxed_slice()))
                .collect()
        });
        let mut raw = vec![0u8; folio];
        let mut tmp = vec![0u8; folio];
        let mut outs: Vec<Option<(Vec<u8>, Codec)>> = vec![None; batch.len()];
        // A folio of 1 or a few runs of equal differences is kept as runs.
        let runs_max = folio / 64;
        let eligible: Vec<usize> = (0..batch.len())
            .filter(|&k| slot_of(&batch[k]).is_some())
            .collect();
        // 1) the codec, from the first folio that is not runs; the sample
        // decides.
        let mut delta = false;
        let mut chosen = false;
        let mut sample_in = 0usize;
        let mut sample_out = 0usize;
        let mut out = vec![0u8; max_out];
        for (n, &k) in eligible.iter().enumerate() {
            batch[k].src.copy_to(&mut raw);
            let got = if let Some(r) = encode_runs(&raw, runs_max) {
                Some((r, Codec::Runs))
            } else if !chosen {
                chosen = true;
                let plain =
                    Self::compress(&raw, false, &mut tmp, &mut out).map(|l| out[..l].to_vec());
                let mut out2 = vec![0u8; max_out];
                let d = Self::compress(&raw, true, &mut tmp, &mut out2).map(|l| {
                    out2.truncate(l);
                    out2
                });
                match (plain, d) {
                    (Some(p), Some(d)) if d.len() < p.len() => {
                        delta = true;
                        Some((d, Codec::DeltaLz4))
                    }
                    (None, Some(d)) => {
                        delta = true;
                        Some((d, Codec::DeltaLz4))
                    }
                    (p, _) => p.map(|p| (p, Codec::Lz4)),
                }
            } else {
                let codec = if delta { Codec::DeltaLz4 } else { Codec::Lz4 };
                Self::compress(&raw, delta, &mut tmp, &mut out).map(|l| (out[..l].to_vec(), codec))
            };
            if n < SAMPLE {
                sample_in += folio;
                sample_out += got.as_ref().map_or(folio, |g| g.0.len());
                if n + 1 == SAMPLE.min(eligible.len())
                    && sample_out * MAX_RATIO.1 > sample_in * MAX_RATIO.0
                {
                    // The batch does not compress: all of it to swap.
                    outs.iter_mut().for_each(|o| *o = None);
                    break;
                }
            }
            outs[k] = got;
        }
        self.c
            .compress_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // 2) under the log lock: keep what compressed, drop the old entries
        // of the rest (before their swap write: module doc).
        let mut kept = vec![false; batch.len()];
        let mut log = self.lock();
        for (k, w) in batch.iter().enumerate() {
            let Some(slot) = slot_of(w) else {
                continue; // beyond the table: never in the tier
            };
            match &outs[k] {
                Some((data, codec)) if self.append(&mut log, slot, data, *codec) => {
                    kept[k] = true;
                }
                _ => self.drop_entry(slot),
            }
        }
        drop(log);
        let n_kept = kept.iter().filter(|&&k| k).count() as u64;
        self.c.stores.fetch_add(n_kept, Ordering::Relaxed);
        self.c
            .rejects
            .fetch_add(eligible.len() as u64 - n_kept, Ordering::Relaxed);
        kept
    }
}

/// Undoes the delta filter in place: word i becomes the sum of words 0..=i.
fn undelta(buf: &mut [u8]) {
    let mut acc = 0u64;
    for w in buf.chunks_exact_mut(8) {
        acc = acc.wrapping_add(u64::from_le_bytes((&*w).try_into().expect("8 bytes")));
        w.copy_from_slice(&acc.to_le_bytes());
    }
}

impl Drop for ZStore {
    fn drop(&mut self) {
        let log = self.log.get_mut().unwrap_or_else(|e| e.into_inner());
        let held = log.head - log.released;
        self.charge.pool_shrink(held);
        // The cumulative counters stay with the pager (the gauges go to 0).
        let c = &self.c;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.charge.retire(|s| {
            s.ztier_stores += get(&c.stores);
            s.ztier_loads += get(&c.loads);
            s.ztier_rejects += get(&c.rejects);
            s.ztier_writebacks += get(&c.writebacks);
            s.ztier_compress_ns += get(&c.compress_ns);
            s.ztier_decompress_ns += get(&c.decompress_ns);
        });
    }
}

impl Store for ZStore {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn describe(&self) -> String {
        format!("compressed tier over {}", self.inner.describe())
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let folio = self.folio;
        if !offset.is_multiple_of(folio as u64) || !buf.len().is_multiple_of(folio) {
            return self.inner.read_at(buf, offset); // never asked for by the engine
        }
        // Runs of folios the tier does not hold go to the swap file in one
        // read each.
        let first = (offset / folio as u64) as usize;
        let n = buf.len() / folio;
        let mut miss_from: Option<usize> = None;
        let mut k = 0;
        while k <= n {
            let hit = k < n && self.load(first + k, &mut buf[k * folio..(k + 1) * folio])?;
            if !hit && k < n {
                miss_from.get_or_insert(k);
            } else if let Some(m) = miss_from.take() {
                let part = &mut buf[m * folio..k * folio];
                // The swap file reads as zeros past its end.
                let got = self.inner.read_at(part, offset + (m * folio) as u64)?;
                part[got..].fill(0);
            }
            k += 1;
        }
        Ok(buf.len())
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        let mut done = self.write_batch(&[Write { src, offset }]);
        done.results.pop().unwrap_or(Ok(()))
    }
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let kept = self.keep_batch(batch);
        let rest: Vec<Write<'_>> = batch
            .iter()
            .zip(&kept)
            .filter(|(_, &k)| !k)
            .map(|(w, _)| *w)
            .collect();
        if rest.is_empty() {
            return Written::new(batch.iter().map(|_| Ok(())).collect(), 0);
        }
        let done = self.inner.write_batch(&rest);
        let mut res = done.results.into_iter();
        let results = kept
            .iter()
            .map(|&k| {
                if k {
                    Ok(())
                } else {
                    res.next().unwrap_or_else(|| {
                        Err(io::Error::other("the swap file reported no result"))
                    })
                }
            })
            .collect();
        Written::new(results, done.submissions)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        let folio = self.folio as u64;
        {
            let _log = self.lock();
            let first = offset / folio;
            let end = (offset + len).div_ceil(folio);
            for s in first..end.min(self.table.len() as u64) {
                self.drop_entry(s as usize);
            }
        }
        self.inner.punch(offset, len)
    }
    fn store_counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.store_counters()
    }
    fn signal_safe(&self) -> bool {
        self.inner.signal_safe() // and the tier's loads are (module doc)
    }
}

impl PoolTier for ZStore {
    fn shrink(&self) -> u64 {
        let mut log = self.lock();
        let mut freed = 0;
        // Until some bytes are uncharged (the tail may move within a
        // release chunk first), or nothing is left, or a write-out fails.
        while freed == 0 && log.tail < log.head {
            let before = log.tail;
            freed += self.shrink_locked(&mut log);
            if log.tail == before {
                break;
            }
        }
        freed
    }
    fn add_counters(&self, s: &mut Stats) {
        let c = &self.c;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.ztier_stores += get(&c.stores);
        s.ztier_loads += get(&c.loads);
        s.ztier_rejects += get(&c.rejects);
        s.ztier_writebacks += get(&c.writebacks);
        s.ztier_compress_ns += get(&c.compress_ns);
        s.ztier_decompress_ns += get(&c.decompress_ns);
        s.ztier_folios += get(&c.folios);
        s.ztier_bytes += get(&c.bytes);
        s.ztier_pool_bytes += get(&c.pool);
        s.ztier_saved_bytes += (get(&c.folios) * self.folio as u64).saturating_sub(get(&c.pool));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;

    /// A swap file in memory.
    #[derive(Debug, Default)]
    struct MemStore(Mutex<std::collections::HashMap<u64, Vec<u8>>>);

    impl Store for MemStore {
        fn len(&self) -> u64 {
            u64::MAX
        }
        fn writable(&self) -> bool {
            true
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let m = self.0.lock().unwrap();
            for (k, c) in buf.chunks_mut(PAGE).enumerate() {
                match m.get(&(offset + (k * PAGE) as u64)) {
                    Some(v) => c.copy_from_slice(v),
                    None => c.fill(0),
                }
            }
            Ok(buf.len())
        }
        fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
            let mut v = vec![0u8; src.len()];
            src.copy_to(&mut v);
            let mut m = self.0.lock().unwrap();
            for (k, c) in v.chunks(PAGE).enumerate() {
                m.insert(offset + (k * PAGE) as u64, c.to_vec());
            }
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
            let mut m = self.0.lock().unwrap();
            m.retain(|&o, _| o < offset || o >= offset + len);
            Ok(())
        }
    }

    /// Folio `n`, version `v`: half words that count (the delta codec
    /// likes them), half noise of a kind, so entries differ in size.
    fn folio_bytes(n: u64, v: u64, folio: usize) -> Vec<u8> {
        let mut out = vec![0u8; folio];
        for (i, w) in out.chunks_mut(8).enumerate() {
            let i = i as u64;
            let x = if (i / 64).is_multiple_of(2) {
                n * 1_000_000 + i + v
            } else {
                (n ^ v)
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .rotate_left((i % 61) as u32)
                    & 0xff
            };
            w.copy_from_slice(&x.to_le_bytes());
        }
        out
    }

    #[test]
    fn entry_words_pack_and_unpack() {
        for (at, len, lap, codec) in [
            (8, 1, 0, Codec::Lz4),
            (1 << 34, 3 << 19, 127, Codec::DeltaLz4),
            (4096, 40000, 7, Codec::Runs),
        ] {
            let e = pack(at, len, lap, codec);
            assert!(e & VALID != 0);
            assert_eq!(unpack(e), (at as usize, len, codec));
        }
        assert_ne!(
            pack(8, 1, 0, Codec::Lz4),
            pack(8, 1, 1, Codec::Lz4),
            "the lap tells reuse apart"
        );
    }

    #[test]
    fn the_delta_filter_round_trips() {
        let src: Vec<u8> = (0..4096u64).flat_map(|i| (i * i).to_le_bytes()).collect();
        let mut tmp = vec![0u8; src.len()];
        let mut out = vec![0u8; lz4_flex::block::get_maximum_output_size(src.len())];
        let n =
            ZStore::compress(&src, true, &mut tmp, &mut out).expect("squares compress as deltas");
        let mut back = vec![0u8; src.len()];
        assert!(decode(Codec::DeltaLz4, &out[..n], &mut back));
        assert_eq!(back, src);
    }

    #[test]
    fn runs_of_equal_differences_round_trip() {
        // float64 0, 1, 2, …: one run per binade; u64 counters: one run.
        let floats: Vec<u8> = (0..8192u64)
            .flat_map(|i| (i as f64).to_bits().to_le_bytes())
            .collect();
        let counters: Vec<u8> = (5..8197u64).flat_map(|i| (3 * i).to_le_bytes()).collect();
        for src in [floats, counters] {
            let r = encode_runs(&src, src.len() / 64).expect("few runs");
            assert!(r.len() <= 20 * 12, "{} bytes", r.len());
            let mut back = vec![0u8; src.len()];
            assert!(decode(Codec::Runs, &r, &mut back));
            assert_eq!(back, src);
            assert!(!decode(Codec::Runs, &r[..r.len() - 12], &mut back), "short");
        }
        let noise: Vec<u8> = (0..8192u64)
            .flat_map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 7).to_le_bytes())
            .collect();
        assert!(encode_runs(&noise, noise.len() / 64).is_none());
    }

    /// Many more folios than the pool holds, written twice: the ring wraps,
    /// the pool writes its oldest out, the charge stays within the share,
    /// and every folio reads back as last written (from the pool or the
    /// swap file); dropping the tier returns its charge.
    #[test]
    fn a_small_pool_wraps_shrinks_and_serves_the_last_write() {
        let folio = PAGE;
        let budget = Budget::new(1 << 20, None);
        let inner = Arc::new(MemStore::default());
        let z = ZStore::new(inner.clone(), folio as u64, 4096, budget.charge_handle())
            .unwrap()
            .expect("room for a pool");
        let n = 1500u64;
        let view = Mapping::anonymous(folio * 64, PAGE, true).unwrap();
        for v in 0..2 {
            for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
                let mut writes = Vec::new();
                for (k, &f) in chunk.iter().enumerate() {
                    view.write_at(k * folio, &folio_bytes(f, v, folio));
                    writes.push(Write {
                        src: Src {
                            map: &view,
                            off: k * folio,
                            len: folio,
                        },
                        offset: f * folio as u64,
                    });
                }
                let done = z.write_batch(&writes);
                assert!(done.results.iter().all(Result::is_ok));
                // The evicted folios are uncharged (they were never charged
                // here: the pending growth is settled against nothing).
                assert!(z.charge.pool_bytes() <= z.pool_max);
            }
        }
        let mut s = Stats::default();
        z.add_counters(&mut s);
        assert!(s.ztier_stores >= 2 * n - 10, "{s:?}");
        assert!(
            s.ztier_writebacks > 100,
            "the pool wrote out its oldest: {s:?}"
        );
        assert!(s.ztier_pool_bytes <= z.pool_max);
        let mut buf = vec![0u8; folio];
        for f in 0..n {
            z.read_at(&mut buf, f * folio as u64).unwrap();
            assert!(buf == folio_bytes(f, 1, folio), "folio {f}");
        }
        // A punched slot is gone from the pool and the swap file.
        z.punch(0, 8 * folio as u64).unwrap();
        z.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        drop(z);
        assert_eq!(budget.charge_handle().pool_bytes(), 0);
    }

    /// Under pressure (the budget's reclaim found nothing to evict) a pool
    /// holding an eighth of the budget or more writes its oldest entries
    /// out and shrinks; every folio still reads back.
    #[test]
    fn the_budget_shrinks_a_pool_under_pressure() {
        let folio = PAGE;
        let budget = Budget::new(1 << 20, None);
        let inner = Arc::new(MemStore::default());
        let z = Arc::new(
            ZStore::new(inner.clone(), folio as u64, 4096, budget.charge_handle())
                .unwrap()
                .expect("room for a pool"),
        );
        let pool: Arc<dyn PoolTier> = z.clone();
        budget.register_pool(Arc::downgrade(&pool));
        let view = Mapping::anonymous(folio * 64, PAGE, true).unwrap();
        let n = 512u64;
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let mut writes = Vec::new();
            for (k, &f) in chunk.iter().enumerate() {
                view.write_at(k * folio, &folio_bytes(f, 0, folio));
                writes.push(Write {
                    src: Src {
                        map: &view,
                        off: k * folio,
                        len: folio,
                    },
                    offset: f * folio as u64,
                });
            }
            assert!(z.write_batch(&writes).results.iter().all(Result::is_ok));
        }
        let before = budget.charge_handle().pool_bytes();
        assert!(before >= (1 << 20) / 8, "the pool holds {before} bytes");
        assert!(budget.shrink_pools());
        let after = budget.charge_handle().pool_bytes();
        assert!(after < before, "{before} -> {after}");
        let mut s = Stats::default();
        budget.add_pool_counters(&mut s);
        assert!(s.ztier_writebacks > 0, "{s:?}");
        let mut buf = vec![0u8; folio];
        for f in 0..n {
            z.read_at(&mut buf, f * folio as u64).unwrap();
            assert!(buf == folio_bytes(f, 0, folio), "folio {f}");
        }
    }

    #[test]
    fn the_env_switch_reads_on_and_off() {
        assert!(enabled(Some(true)));
        assert!(!enabled(Some(false)));
    }
}
