//! Batched write-back: a batch's writes reach the store together
//! (`Store::write_batch`, io_uring in the file store), and a failed write
//! keeps exactly its own folios dirty.

// Integration tests are a crate of their own (the lint is for unit tests).
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use common::{pattern_file, ram_dir, skip_or_fail, under_seccomp_filter, wait_until, word};
use upager::{FileStore, MapOptions, Pager, Residency, Src, Store, Write, Written};

const FOLIO: u64 = 4096;

/// A file store that records how the engine calls it, and fails the writes
/// that touch chosen byte offsets (the others go to the file store's own
/// batched path together).
#[derive(Debug)]
struct Recorder {
    inner: FileStore,
    /// Writes per `write_batch` call, in call order.
    batches: Mutex<Vec<usize>>,
    /// The store offsets of each `write_batch` call's writes.
    offsets: Mutex<Vec<Vec<u64>>>,
    /// `write_from` calls made by the engine itself (not by a batch).
    singles: AtomicU64,
    /// Submissions the inner store reported.
    submissions: AtomicU64,
    fail_at: Mutex<Vec<u64>>,
}

impl Recorder {
    fn new(path: &std::path::Path) -> Recorder {
        Recorder {
            inner: FileStore::open(path, true, true).unwrap(),
            batches: Mutex::new(Vec::new()),
            offsets: Mutex::new(Vec::new()),
            singles: AtomicU64::new(0),
            submissions: AtomicU64::new(0),
            fail_at: Mutex::new(Vec::new()),
        }
    }
    fn fails(&self, w: &Write<'_>) -> bool {
        let range = w.offset..w.offset + w.src.len() as u64;
        self.fail_at
            .lock()
            .unwrap()
            .iter()
            .any(|o| range.contains(o))
    }
}

impl Store for Recorder {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn writable(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        self.singles.fetch_add(1, SeqCst);
        if self.fails(&Write { src, offset }) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_from(src, offset)
    }
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        self.batches.lock().unwrap().push(batch.len());
        self.offsets
            .lock()
            .unwrap()
            .push(batch.iter().map(|w| w.offset).collect());
        let good: Vec<Write<'_>> = batch.iter().filter(|w| !self.fails(w)).copied().collect();
        let done = self.inner.write_batch(&good);
        self.submissions.fetch_add(done.submissions, SeqCst);
        let mut ok = done.results.into_iter();
        let results = batch
            .iter()
            .map(|w| {
                if self.fails(w) {
                    Err(io::Error::from_raw_os_error(libc::EIO))
                } else {
                    ok.next().expect("one result per good write")
                }
            })
            .collect();
        Written::new(results, done.submissions)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// Whether io_uring works here (a ring can be made); under CI it must,
/// unless a seccomp filter refuses it on purpose (scripts/test.sh runs the
/// suite so, as in a container).
fn io_uring_works() -> bool {
    match upager_sys::uring::WriteRing::new(8) {
        Ok(_) => true,
        Err(e) if under_seccomp_filter() => {
            eprintln!("skipped: io_uring refused under this process's seccomp filter ({e})");
            false
        }
        Err(e) => {
            skip_or_fail(&format!("io_uring unavailable: {e}"));
            false
        }
    }
}

/// 1024 scattered dirty 4 KiB folios (every fourth of 16 MiB) and one
/// flush: the engine hands all 1024 writes to the store in ONE call, and
/// the file store submits them in a few io_uring_enter calls, not 1024
/// pwrites. Every word reaches the file. Fails if write-back goes back to
/// one store call per run of folios.
#[test]
fn a_batch_of_scattered_dirty_folios_is_submitted_together() {
    let dir = ram_dir();
    let len = 16 << 20;
    let path = pattern_file(dir.path(), "data", len, 7);
    let (store, pager, r) = recorded(&path);
    let dirty: Vec<u64> = (0..len / FOLIO).step_by(4).collect();
    for &f in &dirty {
        r.words()[(f * FOLIO / 8) as usize].store(!word(f * FOLIO, 7), Relaxed);
    }
    let before = pager.stats();
    r.flush().unwrap();
    let s = pager.stats();
    assert_eq!(s.writebacks - before.writebacks, dirty.len() as u64);
    assert_eq!(
        *store.batches.lock().unwrap(),
        vec![dirty.len()],
        "one store call with every write of the batch"
    );
    assert_eq!(store.singles.load(SeqCst), 0, "no write_from per folio");
    let submits = s.writeback_submits - before.writeback_submits;
    assert_eq!(
        submits,
        store.submissions.load(SeqCst),
        "counted as reported"
    );
    if io_uring_works() {
        assert!(
            submits <= 8,
            "1024 writes took {submits} submissions: not submitted together"
        );
    }
    drop(r);
    let data = std::fs::read(&path).unwrap();
    for f in 0..len / FOLIO {
        let off = f * FOLIO;
        let got = u64::from_ne_bytes(data[off as usize..off as usize + 8].try_into().unwrap());
        let want = if f % 4 == 0 {
            !word(off, 7)
        } else {
            word(off, 7)
        };
        assert_eq!(got, want, "folio {f}");
    }
}

/// The comparison: with `batched_writeback(false)` the same flush makes one
/// store call and one submission per run of folios (here per folio).
#[test]
fn unbatched_write_back_submits_one_write_per_run() {
    let dir = ram_dir();
    let len = 4 << 20;
    let path = pattern_file(dir.path(), "data", len, 8);
    let store = Arc::new(Recorder::new(&path));
    let pager = Pager::builder()
        .budget(64 << 20)
        .batched_writeback(false)
        .build()
        .unwrap();
    let r = pager
        .map_store(
            store.clone(),
            &MapOptions::new().writable(true).folio(FOLIO),
        )
        .unwrap();
    for f in (0..len / FOLIO).step_by(2) {
        r.words()[(f * FOLIO / 8) as usize].store(1, Relaxed);
    }
    r.flush().unwrap();
    let s = pager.stats();
    assert!(store.batches.lock().unwrap().is_empty());
    assert_eq!(store.singles.load(SeqCst), len / FOLIO / 2);
    assert_eq!(s.writeback_submits, len / FOLIO / 2);
}

/// Folios (or runs of folios) whose write fails in a batch stay resident
/// and DIRTY, and only they: the rest of the batch is CLEAN and on the
/// file; the failed ones are not on the file until a later flush succeeds.
/// Then the same for eviction (pageout): failed folios stay resident and
/// dirty, the others are evicted.
#[test]
fn a_failed_write_in_a_batch_keeps_exactly_its_folios_dirty() {
    let dir = ram_dir();
    let len = 8 << 20;
    let path = pattern_file(dir.path(), "data", len, 9);
    let (store, pager, r) = recorded(&path);
    let n = len / FOLIO;
    // Every sixth folio dirty, plus one run of three consecutive folios
    // between two of them (one write of three folios).
    let mut dirty: Vec<u64> = (0..n).step_by(6).collect();
    dirty.extend([1004, 1005, 1006]);
    dirty.sort_unstable();
    dirty.dedup();
    // Fail one lone folio and (through its middle) the run.
    let failing = [300u64, 1005];
    *store.fail_at.lock().unwrap() = failing.iter().map(|f| f * FOLIO + 8).collect();
    let failed_folios = [300u64, 1004, 1005, 1006];
    for &f in &dirty {
        r.words()[(f * FOLIO / 8) as usize].store(f | 1 << 63, Relaxed);
    }
    let before = pager.stats();
    let err = r.flush().expect_err("two writes failed");
    assert!(
        matches!(&err, upager::FlushError::Writeback(e) if e.raw_os_error() == Some(libc::EIO)),
        "{err}"
    );
    let s = pager.stats();
    assert_eq!(
        s.writeback_errors - before.writeback_errors,
        failed_folios.len() as u64
    );
    assert_eq!(
        s.writebacks - before.writebacks,
        (dirty.len() - failed_folios.len()) as u64
    );
    let on_file = |f: u64| {
        let mut b = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(&path).unwrap(),
            &mut b,
            f * FOLIO,
        )
        .unwrap();
        u64::from_ne_bytes(b)
    };
    for &f in &dirty {
        let state = r.residency(f * FOLIO, FOLIO).unwrap()[0].1;
        if failed_folios.contains(&f) {
            assert_eq!(state, Residency::ResidentDirty, "failed folio {f}");
            assert_eq!(
                on_file(f),
                word(f * FOLIO, 9),
                "failed folio {f} not written"
            );
        } else {
            assert_eq!(state, Residency::ResidentClean, "written folio {f}");
            assert_eq!(on_file(f), f | 1 << 63, "folio {f} on the file");
        }
    }

    // Eviction: the failed folios stay, the rest of the batch leaves.
    let before = pager.stats();
    // Its batches evict folios, so they report no error.
    r.pageout(0, len).unwrap();
    let s = pager.stats();
    assert_eq!(
        s.writeback_errors - before.writeback_errors,
        failed_folios.len() as u64
    );
    for &f in &dirty {
        let state = r.residency(f * FOLIO, FOLIO).unwrap()[0].1;
        if failed_folios.contains(&f) {
            assert_eq!(state, Residency::ResidentDirty, "failed folio {f}");
        } else {
            assert_eq!(state, Residency::Evicted, "folio {f}");
        }
    }

    // The store recovers: a flush writes the rest (and reports the error
    // the pageout met, as fsync reports an earlier write-back error once),
    // every word is right, the next flush is clean.
    store.fail_at.lock().unwrap().clear();
    assert!(r.flush().is_err(), "the pageout's error is reported once");
    r.flush().unwrap();
    for &f in &failed_folios {
        assert_eq!(on_file(f), f | 1 << 63, "folio {f} after recovery");
    }
    for &f in &dirty {
        assert_eq!(
            r.words()[(f * FOLIO / 8) as usize].load(Relaxed),
            f | 1 << 63
        );
    }
}

/// The smallest arc of a circle of `len` bytes that holds every offset:
/// how much of a region a batch that may wrap at its end spans.
fn circular_span(offsets: &[u64], len: u64) -> u64 {
    let mut o = offsets.to_vec();
    o.sort_unstable();
    let wrap_gap = o[0] + len - o[o.len() - 1];
    let largest_gap = o.windows(2).map(|w| w[1] - w[0]).fold(wrap_gap, u64::max);
    len - largest_gap
}

/// The dirty limit's cleaner writes a batch in address order from the
/// oldest dirty folio, over at most 64 MiB of the region: random writes
/// over 1 GiB, cleaned in batches that each span a fraction of it (the
/// write-protect step walks only that span). Oldest-first batches span the
/// whole region and fail this.
#[test]
fn the_dirty_limit_cleans_in_address_order_from_the_oldest_dirty_folio() {
    let dir = ram_dir();
    let len: u64 = 1 << 30;
    let path = dir.path().join("sparse");
    std::fs::File::create(&path).unwrap().set_len(len).unwrap();
    let store = Arc::new(Recorder::new(&path));
    let pager = Pager::builder()
        .budget(64 << 20)
        .dirty_limit(8 << 20)
        .build()
        .unwrap();
    let r = pager
        .map_store(
            store.clone(),
            &MapOptions::new().writable(true).folio(FOLIO),
        )
        .unwrap();
    let mut x = upager_testdata::GOLDEN;
    // The first folios written, in order. Which of them the engine counts
    // as oldest can differ by a place or two: a fault's folio joins the
    // LRU after its thread is woken, so the next write's fault, on the
    // other handler thread, may get there first.
    let mut first = Vec::new();
    for _ in 0..3000 {
        let f = upager_testdata::xorshift64(&mut x) % (len / FOLIO);
        if first.len() < 4 {
            first.push(f);
        }
        r.words()[(f * FOLIO / 8) as usize].store(f | 1, Relaxed);
    }
    // Above half the limit (4 MiB, 1024 folios) the cleaner writes back.
    wait_until("the cleaner to write back", 20, || {
        pager.stats().dirty_bytes <= 4 << 20 && pager.stats().writebacks > 0
    });
    let batches = store.offsets.lock().unwrap().clone();
    assert!(!batches.is_empty(), "the cleaner wrote through write_batch");
    assert!(
        first.iter().any(|f| batches[0].contains(&(f * FOLIO))),
        "the first batch starts at one of the oldest dirty folios {first:?}"
    );
    for (i, b) in batches.iter().enumerate() {
        let span = circular_span(b, len);
        assert!(
            span <= 64 << 20,
            "batch {i} of {} writes spans {} MiB of the region",
            b.len(),
            span >> 20
        );
    }
    r.flush().unwrap();
}

/// A writable region of `path` through a [`Recorder`] store, 4 KiB
/// folios, on a pager with a 64 MiB budget.
fn recorded(path: &std::path::Path) -> (Arc<Recorder>, Pager, upager::Region) {
    let store = Arc::new(Recorder::new(path));
    let pager = Pager::builder().budget(64 << 20).build().unwrap();
    let r = pager
        .map_store(
            store.clone(),
            &MapOptions::new().writable(true).folio(FOLIO),
        )
        .unwrap();
    (store, pager, r)
}
