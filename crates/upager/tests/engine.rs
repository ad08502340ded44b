//! Engine behaviour: budget, no lost write, exact dirty tracking,
//! unmap vs faults in flight, folios as units, batched removal, errors,
//! faults inside system calls, anonymous regions, hot set vs scan.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upager::{MapError, MapOptions, Pager, PagerError, Stats};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

fn small_pager(budget: u64) -> Pager {
    Pager::builder()
        .budget(budget)
        .build()
        .expect("pager (needs /dev/userfaultfd: run as root)")
}

#[test]
fn budget_holds_with_threads_over_a_region_8x_the_budget() {
    let dir = ram_dir();
    let budget = 16 * MIB;
    let path = pattern_file(dir.path(), "data", 8 * budget, 1);
    let pager = small_pager(budget);
    let r = Arc::new(
        pager
            .map_file(&path, &MapOptions::new().writable(true))
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    // Sampled from outside the engine: pages the kernel has mapped.
    let sampler = {
        let (r, stop) = (Arc::clone(&r), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(SeqCst) {
                max = max.max(resident_pages(r.as_ptr() as u64, r.len() as u64) * 4096);
                // The sampling period, not a wait for anything.
                std::thread::sleep(Duration::from_millis(1));
            }
            max
        })
    };
    let words = r.len() / 8;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                let mut x = t + 1;
                for i in 0..60_000u64 {
                    let w = (upager_testdata::xorshift64(&mut x) % words as u64) as usize;
                    if i % 4 == 0 && w % 4 == t as usize {
                        r.words()[w].store(!word(w as u64 * 8, 1), Relaxed);
                    } else {
                        let v = r.words()[w].load(Relaxed);
                        assert!(
                            v == word(w as u64 * 8, 1) || v == !word(w as u64 * 8, 1),
                            "word {w} corrupt"
                        );
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, SeqCst);
    let sampled = sampler.join().unwrap();
    let s = pager.stats();
    eprintln!(
        "peak {} sampled {} evictions {}",
        s.resident_peak_bytes, sampled, s.evictions
    );
    assert!(s.evictions > 0, "the workload must evict");
    assert!(
        s.resident_peak_bytes <= budget,
        "peak {} over budget {budget}",
        s.resident_peak_bytes
    );
    assert!(
        sampled <= budget + 4 * MIB,
        "kernel saw {sampled} bytes mapped, budget {budget} + one batch"
    );
    Arc::try_unwrap(r).unwrap().unmap().unwrap();
    assert_eq!(pager.stats().resident_bytes, 0);
}

#[test]
fn no_write_is_lost_while_eviction_runs_with_a_tiny_budget() {
    let dir = ram_dir();
    let len = 24 * MIB;
    let path = pattern_file(dir.path(), "data", len, 2);
    for (folio, batch) in [(16 << 10, None), (64 << 10, Some(1)), (4 << 10, Some(64))] {
        let mut b = Pager::builder().budget(4 * MIB);
        if let Some(n) = batch {
            b = b.batch(n);
        }
        let pager = b.build().unwrap();
        let r = Arc::new(
            pager
                .map_file(&path, &MapOptions::new().writable(true).folio(folio))
                .unwrap(),
        );
        let words = r.len() / 8;
        let nthreads = 4;
        let rounds = 3u64;
        let threads: Vec<_> = (0..nthreads)
            .map(|t| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    // Thread t owns the words w with w % nthreads == t and
                    // writes round-stamped values over the whole region.
                    for round in 1..=rounds {
                        for w in (t..words).step_by(nthreads * 37) {
                            r.words()[w].store(round << 56 | w as u64, Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        r.flush().unwrap();
        let file = std::fs::read(&path).unwrap();
        let mut written = 0;
        for w in 0..words {
            let got = u64::from_le_bytes(file[w * 8..w * 8 + 8].try_into().unwrap());
            let want = if w % (nthreads * 37) < nthreads {
                rounds << 56 | w as u64
            } else {
                word(w as u64 * 8, 2)
            };
            assert_eq!(got, want, "folio {folio} batch {batch:?}: word {w}");
            if w % (nthreads * 37) < nthreads {
                written += 1;
            }
        }
        let s = pager.stats();
        eprintln!(
            "folio {folio} batch {batch:?}: {written} writes verified, {} evictions, {} writebacks",
            s.evictions, s.writebacks
        );
        assert!(s.evictions > 0 && s.writebacks > 0);
        // Restore the pattern for the next configuration.
        for w in (0..words).filter(|w| w % (nthreads * 37) < nthreads) {
            r.words()[w].store(word(w as u64 * 8, 2), Relaxed);
        }
        Arc::try_unwrap(r).unwrap().unmap().unwrap();
    }
}

#[test]
fn clean_folios_are_never_written() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 32 * MIB, 3);
    let pager = small_pager(4 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true))
        .unwrap();
    let mut sum = 0u64;
    for w in r.words().iter().step_by(512) {
        sum = sum.wrapping_add(w.load(Relaxed));
    }
    r.flush().unwrap();
    let s = pager.stats();
    assert!(s.evictions > 100, "{s:?}");
    assert_eq!(
        (s.writebacks, s.bytes_written),
        (0, 0),
        "read-only use wrote back: {s:?} ({sum})"
    );
    // One write dirties exactly one folio (4 KiB by default).
    r.words()[12345].store(7, Relaxed);
    r.flush().unwrap();
    let s2 = pager.stats();
    assert_eq!(
        (s2.writebacks, s2.bytes_written),
        (1, upager::DEFAULT_FOLIO),
        "{s2:?}\n{}",
        r.folio_trace(12345 * 8, 2)
    );
}

#[test]
fn unmap_waits_for_faults_in_flight_and_does_not_block_other_regions() {
    let dir = ram_dir();
    let a_path = pattern_file(dir.path(), "a", 4 * MIB, 4);
    let b_path = pattern_file(dir.path(), "b", 8 * MIB, 5);
    let pager = small_pager(32 * MIB);
    let store = Arc::new(TestStore::new(&a_path, false));
    let a = pager.map_store(store.clone(), &MapOptions::new()).unwrap();
    // Base folios only: a huge run's fill keeps a staged huge page charged
    // (thp.rs), and this test counts B's resident bytes exactly.
    let b = pager
        .map_file(&b_path, &MapOptions::new().huge_runs(false))
        .unwrap();
    store.set_gate(true);
    // A system call reading A's memory faults inside the kernel and stays in
    // flight while A's store is blocked (in-thread: a prefetch).
    let syscall = blocked_syscall_fault(&store, dir.path(), &a);
    // Unmap starts and blocks: it waits for the fault in flight.
    let unmapper = spawn_until_blocked("unmap of a region with a fault in flight", 10, move || {
        a.unmap().unwrap();
        Instant::now()
    });
    // Meanwhile faults on B are served.
    for w in (0..b.len() / 8).step_by(512) {
        assert_eq!(b.words()[w].load(Relaxed), word(w as u64 * 8, 5));
    }
    assert!(
        !unmapper.is_finished(),
        "unmap must wait for the fault in flight"
    );
    let opened = Instant::now();
    store.set_gate(false);
    let done = unmapper.join().unwrap();
    assert!(
        done >= opened,
        "unmap finished before the fault it waited for"
    );
    // The woken system call either completed or (if it retried after the
    // unmap) saw unmapped memory; it never hangs.
    match syscall.join().unwrap() {
        Ok(n) => assert_eq!(n, 4096),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EFAULT)),
    }
    assert_eq!(pager.stats().resident_bytes, b.len() as u64);
}

#[test]
fn a_folio_is_filled_read_and_accounted_as_one_unit() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 7);
    let pager = Pager::builder()
        .budget(64 * MIB)
        .readahead(0)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(64 << 10))
        .unwrap();
    for p in 0..r.len() / 4096 {
        assert_eq!(r.words()[p * 512].load(Relaxed), word(p as u64 * 4096, 7));
    }
    let s = pager.stats();
    assert_eq!(
        s.faults_missing, 64,
        "one fault per 64 KiB folio, not per page: {s:?}"
    );
    assert_eq!(s.fills, 64);
    assert_eq!(s.bytes_read, 4 * MIB);
    assert_eq!(s.resident_bytes, 4 * MIB);
    // Readahead fills several folios per fault on a sequential scan.
    let pager = small_pager(64 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().folio(16 << 10))
        .unwrap();
    for p in 0..r.len() / 4096 {
        assert_eq!(r.words()[p * 512].load(Relaxed), word(p as u64 * 4096, 7));
    }
    let s = pager.stats();
    assert_eq!(s.fills, 256);
    assert!(s.faults_missing < 40, "readahead should cut faults: {s:?}");
}

/// Async readahead: once a stream's window has grown to the
/// readahead size, the fault that fills one window asks the prefetch
/// thread for the next, so about every other window is read without a
/// fault of the stream; off, every window costs the stream a fault.
#[test]
fn a_sequential_stream_reads_every_other_window_on_the_prefetch_thread() {
    let dir = ram_dir();
    let len = 64 * MIB;
    let path = pattern_file(dir.path(), "data", len, 9);
    let windows = len / (2 * MIB); // default readahead: 2 MiB
    for on in [true, false] {
        let pager = Pager::builder()
            .budget(16 * MIB)
            .readahead_async(on)
            .build()
            .unwrap();
        let r = pager
            .map_file(&path, &MapOptions::new().folio(PAGE))
            .unwrap();
        for p in 0..(len / PAGE) as usize {
            // A stream that does some work per window (1 ms per 2 MiB):
            // the prefetch thread gets its turn on a loaded 2-CPU machine,
            // where a stream faster than the thread is scheduled fills
            // every window itself (the thread's reads find them filled).
            if p % (2 * MIB / PAGE) as usize == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let w = p * (PAGE as usize / 8);
            assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 9), "on {on}");
        }
        let s = pager.stats();
        assert_eq!(s.fills, len / PAGE, "on {on}: every page once: {s:?}");
        assert!(s.resident_peak_bytes <= 16 * MIB, "{s:?}");
        if on {
            // The first windows grow (2, 4, 8, ... folios) before the
            // stream is a stream; from then on the prefetch thread reads
            // about half of them (all of them when the stream is slower).
            assert!(
                s.readahead_async >= windows / 4,
                "about every other window read ahead: {s:?}"
            );
            assert!(
                s.faults_missing <= windows * 3 / 4 + 12,
                "the stream's faults read about half the windows: {s:?}"
            );
        } else {
            assert_eq!(s.readahead_async, 0, "off: {s:?}");
            assert!(s.faults_missing >= windows, "one fault per window: {s:?}");
        }
    }
}

#[test]
fn eviction_batches_take_the_reclaim_locks_once_per_batch() {
    for batched in [true, false] {
        let pager = Pager::builder()
            .budget(8 * MIB)
            .batched_removal(batched)
            .background_reclaim(false)
            .build()
            .unwrap();
        let r = pager.map_anonymous(64 * MIB, &MapOptions::new()).unwrap();
        for w in (0..r.len() / 8).step_by(512) {
            r.words()[w].store(w as u64, Relaxed);
        }
        for w in (0..r.len() / 8).step_by(512) {
            assert_eq!(r.words()[w].load(Relaxed), w as u64);
        }
        let s = pager.stats();
        eprintln!(
            "batched {batched}: {} lock acquisitions, {} batches, {} evictions",
            s.reclaim_lock_acquisitions, s.evict_batches, s.evictions
        );
        assert!(s.evictions >= 1000);
        if batched {
            // Isolation + slot allocation: at most two per batch.
            assert!(s.reclaim_lock_acquisitions <= 2 * s.evict_batches, "{s:?}");
        } else {
            assert!(s.reclaim_lock_acquisitions >= s.evictions, "{s:?}");
        }
    }
}

/// `PagerBuilder::batch_bytes`: one eviction batch is so many bytes in
/// regions of any folio size (the UMap drop-in's watermarks are a share of
/// its buffer, whatever a region's page size), where `batch` counts folios.
#[test]
fn an_eviction_batch_in_bytes_holds_for_every_folio_size() {
    for folio in [PAGE, 64 << 10] {
        let pager = Pager::builder()
            .budget(4 * MIB)
            .batch_bytes(MIB)
            .background_reclaim(false)
            .build()
            .unwrap();
        let r = pager
            .map_anonymous(32 * MIB, &MapOptions::new().folio(folio))
            .unwrap();
        for w in (0..r.len() / 8).step_by(512) {
            r.words()[w].store(w as u64, Relaxed);
        }
        let s = pager.stats();
        eprintln!(
            "folio {folio}: {} evictions in {} batches",
            s.evictions, s.evict_batches
        );
        assert!(s.evictions * folio >= 24 * MIB, "{s:?}");
        assert!(s.resident_peak_bytes <= 4 * MIB, "budget held: {s:?}");
        // Whole batches of 1 MiB: as many folios as cover it, none more.
        assert!(s.evictions <= s.evict_batches * (MIB / folio), "{s:?}");
        assert!(s.evictions * 2 >= s.evict_batches * (MIB / folio), "{s:?}");
    }
    // 64 KiB folios under a folio-counted batch of 256 (16 MiB) do not fit
    // a 4 MiB budget; a batch in bytes does.
    let by_folios = Pager::builder().budget(4 * MIB).batch(256).build().unwrap();
    assert!(by_folios
        .map_anonymous(8 * MIB, &MapOptions::new().folio(64 << 10))
        .is_err());
    for bytes in [100, 8 * MIB] {
        assert_eq!(
            Pager::builder()
                .budget(4 * MIB)
                .batch_bytes(bytes)
                .build()
                .unwrap_err()
                .to_string(),
            format!(
                "the eviction batch must be 4 KiB to the budget (4194304 bytes), got {bytes} bytes"
            )
        );
    }
}

#[test]
fn store_read_error_poisons_one_folio_and_the_engine_recovers() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 8);
    let pager = small_pager(16 * MIB);
    let store = Arc::new(TestStore::new(&path, false));
    let r = pager.map_store(store.clone(), &MapOptions::new()).unwrap();
    let bad = 5 * (64 << 10) as u64;
    store.fail_read_at.store(bad + 100, SeqCst);
    let sink = std::fs::File::create(dir.path().join("sink")).unwrap();
    // A system call touching the failing folio gets EFAULT (a plain access
    // would get SIGBUS: see the child-process test).
    let read_bad = || {
        syscall_on(&r, bad, 4096, false, || {
            upager_sys::io::pwrite_from(&sink, r.as_ptr() as u64 + bad, 4096, 0)
        })
    };
    let err = read_bad().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
    // Other folios are served.
    assert_eq!(r.words()[0].load(Relaxed), word(0, 8));
    assert_eq!(
        r.words()[(bad as usize + (64 << 10)) / 8].load(Relaxed),
        word(bad + (64 << 10), 8)
    );
    let s = pager.stats();
    assert_eq!((s.read_errors, s.faults_failed), (1, 1));
    // The store recovers; once the reclaimer clears the poison (after its
    // hold) the folio reads again. Until then the call gets EFAULT from the
    // kernel, without a fault reaching the engine.
    store.fail_read_at.store(u64::MAX, SeqCst);
    wait_until("the poisoned folio to read again", 10, || {
        match read_bad() {
            Ok(n) => {
                assert_eq!(n, 4096);
                true
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
                false
            }
        }
    });
    assert_eq!(r.words()[bad as usize / 8].load(Relaxed), word(bad, 8));
}

/// A pager of 16 MiB over a 4 MiB pattern file (seed 8) behind a
/// [`TestStore`] whose reads of folio `bad_folio` fail, and a sink file
/// for reads by system call.
struct Flaky {
    _dir: tempfile::TempDir,
    pager: Pager,
    store: Arc<TestStore>,
    r: upager::Region,
    bad: u64,
    sink: std::fs::File,
}

impl Flaky {
    fn new(bad_folio: u64) -> Flaky {
        let dir = ram_dir();
        let path = pattern_file(dir.path(), "data", 4 * MIB, 8);
        let pager = small_pager(16 * MIB);
        let store = Arc::new(TestStore::new(&path, false));
        let r = pager.map_store(store.clone(), &MapOptions::new()).unwrap();
        let bad = bad_folio * r.folio_size();
        store.fail_read_at.store(bad + 100, SeqCst);
        let sink = std::fs::File::create(dir.path().join("sink")).unwrap();
        Flaky {
            _dir: dir,
            pager,
            store,
            r,
            bad,
            sink,
        }
    }

    /// Reads the 4 KiB at `off` by a system call (EFAULT where an access
    /// would get SIGBUS) and checks the first word.
    fn read(&self, off: u64) -> std::io::Result<u64> {
        let n = syscall_on(&self.r, off, 4096, false, || {
            upager_sys::io::pwrite_from(&self.sink, self.r.as_ptr() as u64 + off, 4096, 0)
        })?;
        assert_eq!(
            self.r.words()[(off / 8) as usize].load(Relaxed),
            word(off, 8)
        );
        Ok(n)
    }

    /// The budget charges exactly what is resident: a failed fill gave
    /// back what it had charged (checked once the pager is idle).
    fn assert_budget_is_residency(&self) {
        let len = self.r.len() as u64;
        let pages = self
            .r
            .mincore(0, len)
            .unwrap()
            .iter()
            .filter(|&&m| m != 0)
            .count() as u64;
        let s = self.pager.stats();
        assert_eq!(s.resident_bytes, pages * 4096, "{s:?}");
    }
}

/// A bad folio ahead of a sequential stream fails only itself: the
/// faults whose readahead windows ran over it read their own folios (the
/// window cut to the faulting folio, as the kernel reads a page whose
/// readahead failed), and only an access to the bad folio gets the error.
#[test]
fn a_bad_folio_ahead_fails_only_itself() {
    let f = Flaky::new(40);
    let folio = f.r.folio_size();
    // A stream up to the bad folio: every window that reached it failed,
    // and each fault read its own folio.
    for k in 0..40 {
        assert_eq!(
            f.read(k * folio).unwrap(),
            4096,
            "folio {k} before the bad one"
        );
    }
    let s = f.pager.stats();
    assert!(s.read_errors >= 1, "a window ran over the bad folio: {s:?}");
    assert_eq!(s.faults_failed, 0, "{s:?}");
    let err = f.read(f.bad).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
    assert_eq!(f.pager.stats().faults_failed, 1);
    f.assert_budget_is_residency();
    // Past it, the stream goes on.
    assert_eq!(f.read(f.bad + folio).unwrap(), 4096);
}

/// A prefetch whose read fails leaves its folios as they were, not
/// poisoned: no access asked for them, and once the store serves again the
/// next access reads the folio at once.
#[test]
fn a_failed_prefetch_leaves_its_folio_for_an_access_to_read() {
    let f = Flaky::new(9);
    let (r, bad, folio) = (&f.r, f.bad, f.r.folio_size());
    // One folio (filled as a fault's fill is), then a window over it.
    r.prefetch(bad, folio).unwrap();
    assert!(r.wait_prefetch(Duration::from_secs(30)));
    r.prefetch(bad - 4 * folio, 8 * folio).unwrap();
    assert!(r.wait_prefetch(Duration::from_secs(30)));
    let s = f.pager.stats();
    assert!(s.read_errors >= 2, "{s:?}");
    assert_eq!(s.faults_failed, 0, "nothing poisoned: {s:?}");
    assert_eq!(
        r.mincore(bad, folio).unwrap()[0],
        0,
        "the bad folio is not resident"
    );
    f.assert_budget_is_residency();
    f.store.fail_read_at.store(u64::MAX, SeqCst);
    assert_eq!(f.read(bad).unwrap(), 4096);
}

#[test]
fn writeback_error_keeps_data_dirty_and_flush_reports_it() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 9);
    let pager = small_pager(16 * MIB);
    let store = Arc::new(TestStore::new(&path, true));
    let r = pager
        .map_store(store.clone(), &MapOptions::new().writable(true))
        .unwrap();
    for w in (0..r.len() / 8).step_by(1000) {
        r.words()[w].store(w as u64, Relaxed);
    }
    store.fail_writes.store(true, SeqCst);
    let e = r.flush().unwrap_err();
    assert!(
        e.to_string()
            .starts_with("writing dirty data back to the store failed: No space left on device"),
        "{e}"
    );
    assert!(pager.stats().writeback_errors > 0);
    for w in (0..r.len() / 8).step_by(1000) {
        assert_eq!(r.words()[w].load(Relaxed), w as u64, "data kept in memory");
    }
    store.fail_writes.store(false, SeqCst);
    r.flush().unwrap();
    let file = std::fs::read(&path).unwrap();
    for w in 0..file.len() / 8 {
        let got = u64::from_le_bytes(file[w * 8..w * 8 + 8].try_into().unwrap());
        let want = if w % 1000 == 0 {
            w as u64
        } else {
            word(w as u64 * 8, 9)
        };
        assert_eq!(got, want, "word {w}");
    }
}

#[test]
fn a_hot_set_stays_resident_while_a_scan_streams_past() {
    let dir = ram_dir();
    let budget = 32 * MIB;
    let hot_path = pattern_file(dir.path(), "hot", 8 * MIB, 10);
    let scan_path = pattern_file(dir.path(), "scan", 256 * MIB, 11);
    let pager = small_pager(budget);
    let hot = pager.map_file(&hot_path, &MapOptions::new()).unwrap();
    let scan = pager.map_file(&scan_path, &MapOptions::new()).unwrap();
    let hot_words = hot.len() / 8;
    let mut hot_faults_last_pass = 0;
    for pass in 0..3 {
        let before = pager.stats().faults_missing;
        let mut scan_faults = 0;
        for (i, w) in (0..scan.len() / 8).step_by(512).enumerate() {
            scan.words()[w].load(Relaxed);
            if i % 64 == 0 {
                // Touch the whole hot set (one word per page) between scan chunks.
                let f0 = pager.stats().faults_missing;
                for h in (0..hot_words).step_by(512) {
                    hot.words()[h].load(Relaxed);
                }
                scan_faults += 0;
                if pass == 2 {
                    hot_faults_last_pass += pager.stats().faults_missing - f0;
                }
            }
        }
        let _ = (before, scan_faults);
    }
    let s = pager.stats();
    let resident_hot = resident_pages(hot.as_ptr() as u64, hot.len() as u64) * 4096;
    eprintln!("hot faults in last pass {hot_faults_last_pass}, hot resident {resident_hot}, {s:?}");
    assert!(s.evictions > 1000, "the scan must cause eviction");
    assert!(s.refaults_activated > 0);
    assert!(
        hot_faults_last_pass <= 8,
        "hot set refaulted {hot_faults_last_pass} times in the last pass"
    );
    assert_eq!(
        resident_hot,
        8 * MIB,
        "the hot set should be fully resident"
    );
}

#[test]
fn system_calls_on_region_memory_are_served() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 8 * MIB, 12);
    let pager = small_pager(4 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true))
        .unwrap();
    // write(2) from region memory: the kernel reads missing pages (in
    // in-thread mode, after `fault_in`: see `syscall_on`). By the MiB: the
    // region is twice the budget.
    let out_path = dir.path().join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    for off in (0..r.len() as u64).step_by(MIB as usize) {
        let n = syscall_on(&r, off, MIB, false, || {
            upager_sys::io::pwrite_from(&out, r.as_ptr() as u64 + off, MIB, off)
        })
        .unwrap();
        assert_eq!(n, MIB);
    }
    assert!(std::fs::read(&out_path).unwrap() == std::fs::read(&path).unwrap());
    // read(2) into region memory: the kernel writes pages (missing, or
    // present and write-protected).
    let src_path = pattern_file(dir.path(), "src", MIB, 13);
    let src = std::fs::File::open(&src_path).unwrap();
    let at = 3 * MIB as usize;
    assert_eq!(
        syscall_on(&r, at as u64, MIB, true, || {
            upager_sys::io::pread_into(&src, &r.bytes()[at..at + MIB as usize], 0)
        })
        .unwrap(),
        MIB as usize
    );
    r.flush().unwrap();
    let f = std::fs::read(&path).unwrap();
    assert!(f[at..at + MIB as usize] == std::fs::read(&src_path).unwrap()[..]);
    assert!(pager.stats().faults_wp + pager.stats().faults_missing > 0);
}

#[test]
fn anonymous_regions_zero_fill_swap_and_release() {
    let swap_dir = ram_dir();
    let pager = Pager::builder()
        .budget(8 * MIB)
        .swap_dir(swap_dir.path())
        .build()
        .unwrap();
    let r = pager
        .map_anonymous(96 * MIB + 5, &MapOptions::new().folio(32 << 10))
        .unwrap();
    assert_eq!(r.len(), 96 * MIB as usize + 5);
    assert_eq!(
        std::fs::read_dir(swap_dir.path()).unwrap().count(),
        0,
        "swap file must be unlinked"
    );
    let words = r.len() / 8;
    for w in (0..words).step_by(1024) {
        r.words()[w].store(w as u64 + 1, Relaxed);
    }
    for w in (0..words).step_by(512) {
        let want = if w % 1024 == 0 { w as u64 + 1 } else { 0 };
        assert_eq!(r.words()[w].load(Relaxed), want, "word {w}");
    }
    r.write_at(r.len() - 5, b"tail!");
    let mut t = [0u8; 5];
    r.read_at(r.len() - 5, &mut t);
    assert_eq!(&t, b"tail!");
    let s = pager.stats();
    assert!(
        s.evictions > 0 && s.writebacks > 0 && s.resident_peak_bytes <= 8 * MIB,
        "{s:?}"
    );
    r.unmap().unwrap();
    assert_eq!(pager.stats().resident_bytes, 0);
}

#[test]
fn errors_are_clear_and_leave_nothing_behind() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", MIB, 14);
    let pager = small_pager(8 * MIB);
    let e = |r: Result<upager::Region, MapError>| r.unwrap_err().to_string();
    assert_eq!(
        e(pager.map_anonymous(0, &MapOptions::new())),
        "region size is 0: give a length of at least one byte"
    );
    assert_eq!(
        e(pager.map_file(&path, &MapOptions::new().folio(3 << 12))),
        "folio size 12288 is not a power of two between 4 KiB and 2 MiB"
    );
    assert_eq!(
        e(pager.map_file(&path, &MapOptions::new().folio(4 << 20))),
        "folio size 4194304 is not a power of two between 4 KiB and 2 MiB"
    );
    assert_eq!(
        e(pager.map_file(&path, &MapOptions::new().folio(64 << 10).offset(4096))),
        "offset 4096 is not a multiple of the folio size 65536: map from the folio boundary below it and index from there"
    );
    let missing = dir.path().join("nope");
    assert_eq!(
        e(pager.map_file(&missing, &MapOptions::new())),
        format!(
            "{}: no such file (create it first, or map anonymous memory)",
            missing.display()
        )
    );
    assert!(
        e(pager.map_file(&path, &MapOptions::new().len(2 * MIB))).starts_with(
            "range offset 0 + length 2097152 goes beyond the end of the store (1048576 bytes)"
        )
    );
    // With the default batch, any budget of a few folios works (the batch
    // shrinks to half the budget); a batch the user chose is kept
    // and checked.
    let tiny = small_pager(MIB);
    let t = tiny.map_file(&path, &MapOptions::new()).unwrap();
    assert_eq!(t.words()[9].load(Relaxed), word(72, 14));
    drop(t);
    let chosen = Pager::builder().budget(MIB).batch(64).build().unwrap();
    assert_eq!(
        e(chosen.map_file(&path, &MapOptions::new().folio(64 << 10))),
        "budget 1048576 bytes cannot hold one eviction batch of this region (64 folio(s) of 65536 bytes = 4194304 bytes): raise the budget to at least 4194304 bytes, or map with a smaller folio or batch"
    );
    let empty = dir.path().join("empty");
    std::fs::File::create(&empty).unwrap();
    assert_eq!(
        e(pager.map_file(&empty, &MapOptions::new())),
        "region size is 0: give a length of at least one byte"
    );
    let ro_dir = dir.path().join("ro");
    std::fs::create_dir(&ro_dir).unwrap();
    let ro = pattern_file(&ro_dir, "ro", MIB, 1);
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o444);
    std::fs::set_permissions(&ro, perm).unwrap();
    // Root ignores file modes; a read-only bind of the file system is what a
    // root user would hit. Check the variant when it applies.
    if let Err(err) = pager.map_file(&ro, &MapOptions::new().writable(true)) {
        assert!(
            matches!(
                err,
                MapError::ReadOnlyFile { .. } | MapError::PermissionDenied { .. }
            ),
            "{err}"
        );
    }
    assert!(matches!(
        Pager::builder().budget(100).build(),
        Err(PagerError::BudgetTooSmall(100))
    ));
    assert!(matches!(
        Pager::builder().handler_threads(0).build(),
        Err(PagerError::HandlerThreads(0))
    ));
    assert!(matches!(
        Pager::builder().batch(2000).build(),
        Err(PagerError::Batch(2000))
    ));
    assert_eq!(
        Pager::builder()
            .budget(MIB)
            .dirty_limit(2 * MIB)
            .build()
            .unwrap_err()
            .to_string(),
        "the dirty limit must be at least 4 KiB and at most the budget (1048576 bytes), got 2097152 bytes"
    );
    // Nothing was left mapped or accounted, and the pager still works.
    assert_eq!(pager.stats().resident_bytes, 0);
    let r = pager.map_file(&path, &MapOptions::new()).unwrap();
    assert_eq!(r.words()[1].load(Relaxed), word(8, 14));
}

/// The counter names and their order are ABI: the C API numbers counters
/// by position (`upager_stat_name(i)`, `upager_stats`) and Python exposes
/// `STAT_NAMES`. This list is written out, not derived, so renaming,
/// removing or reordering a counter fails here; a new counter goes at the
/// end, here and in the same lists of crates/capi/tests/c/stat_names.c and
/// python/tests/test_upager.py.
const STAT_NAMES: [&str; 65] = [
    "faults_missing",
    "faults_wp",
    "faults_deferred",
    "faults_stale",
    "faults_failed",
    "fills",
    "fills_readahead",
    "bytes_read",
    "bytes_written",
    "evictions",
    "evict_batches",
    "evict_direct",
    "evict_background",
    "evict_pageout",
    "reclaim_scanned",
    "writebacks",
    "writeback_errors",
    "read_errors",
    "tlb_flush_batches",
    "wp_unprotects",
    "direct_reclaim_stalls",
    "refaults",
    "refaults_activated",
    "deactivations",
    "flushes",
    "resident_bytes",
    "resident_peak_bytes",
    "budget_bytes",
    "discards",
    "reclaim_lock_acquisitions",
    "evicted_markers",
    "dirty_bytes",
    "dirty_throttled",
    "writes_refused",
    "faults_in_thread",
    "faults_handed_off",
    "pinned_bytes",
    "writeback_submits",
    "thp_fills",
    "thp_fill_fallback",
    "thp_evictions",
    "overhead_bytes",
    "thp_recycled",
    "thp_fill_raced",
    "writes_lost",
    "kernel_call_errors",
    "writebacks_aged",
    "faults_slow",
    "twins_made",
    "diff_writebacks",
    "writer_switches",
    "readahead_async",
    "replay_reads",
    "replay_hits",
    "replay_wasted",
    "ztier_stores",
    "ztier_loads",
    "ztier_rejects",
    "ztier_writebacks",
    "ztier_folios",
    "ztier_bytes",
    "ztier_pool_bytes",
    "ztier_saved_bytes",
    "ztier_compress_ns",
    "ztier_decompress_ns",
];

#[test]
fn counters_have_stable_names_in_a_stable_order() {
    assert_eq!(
        Stats::NAMES,
        STAT_NAMES,
        "counter names or order changed: they are shared with C and Python"
    );
    let pager = small_pager(8 * MIB);
    let s = pager.stats();
    let names: Vec<&str> = s.iter().map(|(n, _)| n).collect();
    assert_eq!(names, STAT_NAMES, "Stats::iter follows Stats::NAMES");
    assert_eq!(s.get("budget_bytes"), Some(8 * MIB));
    assert_eq!(s.get("no_such_counter"), None);
}

#[test]
fn fault_timing_sums_the_phases_of_every_fill() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 21);
    let pager = Pager::builder()
        .budget(16 * MIB)
        .readahead(0)
        .fault_timing(true)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(4096))
        .unwrap();
    for w in (0..r.len() / 8).step_by(512) {
        assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 21));
    }
    let p = pager.fault_phases().unwrap();
    assert_eq!(p.fills, pager.stats().faults_missing);
    assert_eq!(p.fills, 1024);
    for (name, us) in p.per_fill_us() {
        assert!(us > 0.0, "{name}: {p}");
    }
    assert!(p.to_string().starts_with("1024 fills, "), "{p}");
    assert!(small_pager(8 * MIB).fault_phases().is_none());
}

/// The dirty gauge (what the dirty limit counts) follows every way a file
/// folio stops being dirty: flush, pageout, discard, eviction, unmap; and
/// anonymous memory is not counted.
#[test]
fn the_dirty_gauge_follows_every_transition() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 25);
    let pager = small_pager(16 * MIB);
    let f = 64u64 << 10;
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(f))
        .unwrap();
    let dirty = || pager.stats().dirty_bytes;
    let write = |folios: std::ops::Range<u64>| {
        for k in folios {
            r.words()[(k * f / 8) as usize].store(k, Relaxed);
        }
    };
    write(0..16);
    assert_eq!(dirty(), 16 * f);
    r.flush().unwrap();
    assert_eq!(dirty(), 0, "flush");
    write(0..16);
    r.pageout(0, 8 * f).unwrap();
    assert_eq!(dirty(), 8 * f, "pageout of half");
    r.discard(8 * f, 4 * f).unwrap();
    assert_eq!(dirty(), 4 * f, "discard of a quarter");
    // The rest leaves through the eviction batch (pageout runs it).
    r.pageout(0, 64 * f).unwrap();
    assert_eq!(dirty(), 0, "eviction");
    write(0..4);
    r.unmap().map_err(|(e, _)| e).unwrap();
    assert_eq!(dirty(), 0, "unmap");
    let a = pager.map_anonymous(4 * MIB, &MapOptions::new()).unwrap();
    a.words()[0].store(1, Relaxed);
    assert_eq!(dirty(), 0, "anonymous memory is not counted");
}

#[test]
fn eight_threads_fault_the_same_folio_at_once() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 16 * MIB, 64);
    let pager = small_pager(4 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().folio(64 << 10))
        .unwrap();
    let start = std::sync::Barrier::new(8);
    // Round after round, all eight threads read the same not-yet-resident
    // 64 KiB folio at the same moment (each from its own word).
    for round in 0..64usize {
        let folio = round * 3 % 256;
        std::thread::scope(|s| {
            for t in 0..8usize {
                let (r, start) = (&r, &start);
                s.spawn(move || {
                    let w = folio * 8192 + t * 1024;
                    start.wait();
                    assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 64));
                });
            }
        });
    }
    let s = pager.stats();
    // One fill per folio, however many threads faulted on it.
    assert!(s.fills <= 64 + s.evictions, "{s:?}");
    assert!(s.resident_peak_bytes <= 4 * MIB, "{s:?}");
}

/// Reserves `len` bytes of address space (PROT_NONE), aligned to 2 MiB.
fn reserve(len: u64) -> u64 {
    // SAFETY: a fresh PROT_NONE mapping the test owns.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            (len + (2 << 20)) as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    (p as u64).next_multiple_of(2 << 20)
}

/// Whether `[addr, addr+len)` is mapped at all (mincore fails with ENOMEM
/// on unmapped memory).
fn mapped(addr: u64, len: u64) -> bool {
    upager_sys::mem::mincore(addr, len).is_ok()
}

#[test]
fn regions_sit_side_by_side_at_fixed_addresses_in_one_reservation() {
    let dir = ram_dir();
    let a_path = pattern_file(dir.path(), "a", 4 * MIB, 71);
    let b_path = pattern_file(dir.path(), "b", 4 * MIB + 100, 72);
    let pager = small_pager(4 * MIB);
    let base = reserve(16 * MIB);
    // SAFETY: the reservation above belongs to this test and nothing uses it.
    let range = |off: u64, len: u64| unsafe { upager::FixedRange::new(base + off, len) };
    let a = pager
        .map_file(
            &a_path,
            &MapOptions::new()
                .writable(true)
                .folio(2 << 20)
                .at(range(0, 4 * MIB)),
        )
        .unwrap();
    // B's 4 MiB + 100 bytes round up to 4 MiB + 64 KiB (its folio): it
    // needs that much.
    let b_opts = MapOptions::new().folio(64 << 10);
    let e = pager
        .map_file(&b_path, &b_opts.clone().at(range(4 * MIB, 4 * MIB)))
        .unwrap_err();
    assert!(
        matches!(e, upager::MapError::FixedTooSmall { need, .. } if need == 4 * MIB + (64 << 10)),
        "{e}"
    );
    let e = pager
        .map_file(&b_path, &b_opts.clone().at(range(4 * MIB + 4096, 8 * MIB)))
        .unwrap_err();
    assert!(matches!(e, upager::MapError::FixedUnaligned { .. }), "{e}");
    assert_eq!(upager::ErrorCode::errno(&e), libc::EINVAL);
    let b = pager
        .map_file(&b_path, &b_opts.at(range(4 * MIB, 8 * MIB)))
        .unwrap();
    assert_eq!(a.as_ptr() as u64, base);
    assert_eq!(b.as_ptr() as u64, base + 4 * MIB);
    // Both page through a budget smaller than the two together.
    for round in 0..2 {
        for w in (0..a.len() / 8).step_by(997) {
            assert_eq!(
                a.words()[w].load(Relaxed),
                word(w as u64 * 8, 71),
                "round {round}"
            );
            assert_eq!(
                b.words()[w].load(Relaxed),
                word(w as u64 * 8, 72),
                "round {round}"
            );
        }
    }
    a.words()[3].store(42, Relaxed);
    a.flush().unwrap();
    assert_eq!(std::fs::read(&a_path).unwrap()[24], 42);
    // Unmapping A leaves its range unmapped (as munmap does), B works on,
    // and the rest of the reservation is still the caller's.
    a.unmap().map_err(|(e, _)| e).unwrap();
    assert!(!mapped(base, 4 * MIB));
    assert_eq!(b.words()[1].load(Relaxed), word(8, 72));
    assert!(mapped(base + 12 * MIB, 4 * MIB));
    assert!(pager.stats().resident_peak_bytes <= 4 * MIB);
}

#[test]
fn a_region_unmapped_keeping_its_range_leaves_it_reserved_for_one_mapped_over_it() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "a", 8 * MIB, 74);
    let pager = small_pager(4 * MIB);
    let old = pager
        .map_file(&path, &MapOptions::new().writable(true))
        .unwrap();
    let base = old.as_ptr() as u64;
    old.words()[5].store(55, Relaxed);
    let range = old
        .unmap_keeping_range()
        .map_err(|(e, _)| e)
        .unwrap()
        .expect("not a fork child");
    // Written back, and the range is still mapped (inaccessible), so no
    // other mapping can take it before the one mapped over it.
    assert_eq!(std::fs::read(&path).unwrap()[40], 55);
    assert_eq!((range.addr(), range.len()), (base, 8 * MIB));
    assert!(mapped(base, 8 * MIB));
    for _ in 0..64 {
        let p = reserve(2 * MIB);
        assert!(
            p + 2 * MIB <= base || p >= base + 8 * MIB,
            "a mapping landed in the range"
        );
    }
    let new = pager.map_file(&path, &MapOptions::new().at(range)).unwrap();
    assert_eq!(new.as_ptr() as u64, base);
    assert_eq!(new.words()[5].load(Relaxed), 55);
    assert_eq!(new.words()[6].load(Relaxed), word(48, 74));
    new.unmap().map_err(|(e, _)| e).unwrap();
    assert!(!mapped(base, 8 * MIB));
}

#[test]
fn pinned_folios_stay_resident_until_unpinned() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 32 * MIB, 73);
    let pager = small_pager(4 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true))
        .unwrap();
    let resident = |off: u64, len: u64| {
        r.residency(off, len).unwrap().iter().all(|(_, s)| {
            matches!(
                s,
                upager::Residency::ResidentClean | upager::Residency::ResidentDirty
            )
        })
    };
    // Half the budget at most: 2 MiB + 64 KiB is refused, nothing pinned.
    let e = r.pin(MIB, 2 * MIB + (64 << 10), false).unwrap_err();
    assert!(matches!(e, upager::AdviseError::PinLimit { .. }), "{e}");
    assert_eq!(upager::ErrorCode::errno(&e), libc::ENOMEM);
    assert_eq!(pager.stats().pinned_bytes, 0);
    // 1 MiB read-pinned, 64 KiB write-pinned (dirty), pinned twice.
    r.pin(MIB, MIB, false).unwrap();
    r.pin(8 * MIB, 64 << 10, true).unwrap();
    r.pin(8 * MIB, 64 << 10, false).unwrap();
    assert_eq!(pager.stats().pinned_bytes, MIB + (64 << 10));
    // A system call on the pinned range works in either fault mode, however
    // much else passes through the budget.
    let out = std::fs::File::create(dir.path().join("out")).unwrap();
    for round in 0..3 {
        for w in (0..r.len() / 8).step_by(4096) {
            assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 73));
        }
        assert!(
            resident(MIB, MIB) && resident(8 * MIB, 64 << 10),
            "round {round}"
        );
        let n = upager_sys::io::pwrite_from(&out, r.as_ptr() as u64 + MIB, MIB, 0).unwrap();
        assert_eq!(n, MIB);
    }
    // pageout and discard leave pinned folios alone; flush writes them back.
    r.pageout(0, 16 * MIB).unwrap();
    r.discard(MIB, MIB).unwrap();
    assert!(resident(MIB, MIB) && resident(8 * MIB, 64 << 10));
    r.words()[(8 * MIB / 8) as usize].store(5, Relaxed);
    r.flush().unwrap();
    assert_eq!(std::fs::read(&path).unwrap()[8 * MIB as usize], 5);
    assert!(resident(8 * MIB, 64 << 10));
    // Unpin: not pinned is an error and changes nothing; counted pins.
    let e = r.unpin(0, 2 * MIB).unwrap_err();
    assert!(
        matches!(e, upager::AdviseError::NotPinned { offset: 0 }),
        "{e}"
    );
    r.unpin(MIB, MIB).unwrap();
    r.unpin(8 * MIB, 64 << 10).unwrap();
    assert_eq!(pager.stats().pinned_bytes, 64 << 10);
    r.pageout(0, 16 * MIB).unwrap();
    assert!(!resident(MIB, 64 << 10), "unpinned folios can go");
    assert!(resident(8 * MIB, 64 << 10), "one pin left");
    assert!(pager.stats().resident_peak_bytes <= 4 * MIB);
    // Unmap drops every pin.
    r.unmap().map_err(|(e, _)| e).unwrap();
    assert_eq!(pager.stats().pinned_bytes, 0);
}

/// Handler mode with the fault queue split over 4 userfaultfds
/// (`uffd_shards`): each region's range is registered in contiguous shards
/// on different ones (one VMA each), and threads faulting all over several
/// regions — file regions with 4 KiB and 64 KiB folios, an anonymous one —
/// under eviction read the right data and get their writes back: no fill
/// crosses a registration, and no wake goes to a queue the faulting thread
/// does not sleep on (it would hang; the threads have 60 s). In-thread mode
/// has one userfaultfd whatever is asked.
#[test]
fn faults_over_userfaultfd_shards_all_resolve() {
    let dir = ram_dir();
    let uffds = || {
        open_fds("self")
            .iter()
            .filter(|(_, t)| t.contains("userfaultfd"))
            .count()
    };
    let before = uffds();
    let pager = Pager::builder()
        .budget(8 * MIB)
        .handler_threads(4)
        .uffd_shards(4)
        .build()
        .unwrap();
    let want = if in_thread() { 1 } else { 4 };
    assert_eq!(pager.uffd_shards(), want);
    assert_eq!(uffds() - before, want, "userfaultfds opened");
    let a_path = pattern_file(dir.path(), "a", 16 * MIB, 31);
    let b_path = pattern_file(dir.path(), "b", 12 * MIB, 32);
    let a = Arc::new(
        pager
            .map_file(&a_path, &MapOptions::new().folio(4096))
            .unwrap(),
    );
    let b = Arc::new(pager.map_file(&b_path, &MapOptions::new()).unwrap());
    let c = Arc::new(pager.map_anonymous(8 * MIB, &MapOptions::new()).unwrap());
    // 16 MiB in 4 shards of 4 MiB: 4 mappings in /proc/self/maps (each
    // registration is a VMA of its own); 12 MiB of 64 KiB folios: shards of
    // 4 MiB (3 MiB rounded up to 2 MiB multiples), so 3.
    let vmas = |r: &upager::Region| {
        let (lo, hi) = (r.as_ptr() as u64, r.as_ptr() as u64 + r.len() as u64);
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| {
                let (s, rest) = l.split_once('-').unwrap();
                let e = rest.split_once(' ').unwrap().0;
                let (s, e) = (
                    u64::from_str_radix(s, 16).unwrap(),
                    u64::from_str_radix(e, 16).unwrap(),
                );
                s >= lo && e <= hi
            })
            .count()
    };
    if !in_thread() {
        assert_eq!((vmas(&a), vmas(&b)), (4, 3), "one mapping per shard");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..4u64 {
        let (a, b, c, tx) = (a.clone(), b.clone(), c.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut x = t + 7;
            let cw = c.len() / 8;
            for i in 0..40_000u64 {
                let n = upager_testdata::xorshift64(&mut x);
                match i % 3 {
                    0 => {
                        let w = (n % (a.len() / 8) as u64) as usize;
                        assert_eq!(a.words()[w].load(Relaxed), word(w as u64 * 8, 31));
                    }
                    1 => {
                        let w = (n % (b.len() / 8) as u64) as usize;
                        assert_eq!(b.words()[w].load(Relaxed), word(w as u64 * 8, 32));
                    }
                    _ => {
                        // Words of this thread's own (w % 4 == t).
                        let w = (n % (cw / 4) as u64) as usize * 4 + t as usize;
                        let v = c.words()[w].load(Relaxed);
                        assert!(v == 0 || v == word(w as u64 * 8, t), "word {w}: {v:#x}");
                        c.words()[w].store(word(w as u64 * 8, t), Relaxed);
                    }
                }
            }
            tx.send(t).unwrap();
        });
    }
    drop(tx);
    for _ in 0..4 {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("a faulting thread hung or failed");
    }
    let s = pager.stats();
    assert!(s.evictions > 0 && s.resident_peak_bytes <= 8 * MIB, "{s:?}");
    for w in (0..c.len() / 8).step_by(4 * 97) {
        let v = c.words()[w].load(Relaxed);
        assert!(v == 0 || v == word(w as u64 * 8, 0), "word {w}: {v:#x}");
    }
    for r in [a, b, c] {
        Arc::try_unwrap(r).unwrap().unmap().unwrap();
    }
}

#[test]
fn uffd_shards_outside_one_to_the_handler_threads_are_refused() {
    for n in [0, 3] {
        let e = Pager::builder()
            .handler_threads(2)
            .uffd_shards(n)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, PagerError::UffdShards { shards, threads: 2 } if shards == n),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("1 to the number of handler threads"),
            "{e}"
        );
    }
}

/// A flush whose write-protect span crosses a shard boundary protects both
/// shards' parts (each on its own userfaultfd): writes after the flush to
/// folios on either side fault once each, become dirty again and reach the
/// file at the next flush (no lost write).
#[test]
fn writes_after_a_flush_across_shards_are_tracked_and_written_back() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 8 * MIB, 35);
    let pager = Pager::builder()
        .budget(32 * MIB)
        .handler_threads(2)
        .uffd_shards(2)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(4096).writable(true))
        .unwrap();
    // 48 dirty folios around the boundary at 4 MiB (folio 1024), then one
    // flush: one write-protect span across it.
    for f in 1000..1048 {
        r.words()[f * 512].store(1, Relaxed);
    }
    r.flush().unwrap();
    let before = pager.stats().faults_wp;
    let (lo, hi) = (1001 * 512 + 8, 1040 * 512 + 8); // shard 0 and shard 1
    r.words()[lo].store(0xA, Relaxed);
    r.words()[hi].store(0xB, Relaxed);
    let s = pager.stats();
    if !in_thread() {
        assert_eq!(pager.uffd_shards(), 2);
    }
    assert_eq!(
        s.faults_wp - before,
        2,
        "a folio was left writable by the flush: {s:?}"
    );
    r.flush().unwrap();
    let data = std::fs::read(&path).unwrap();
    assert_eq!(upager_testdata::word_at(&data, lo * 8), 0xA);
    assert_eq!(upager_testdata::word_at(&data, hi * 8), 0xB);
    r.unmap().unwrap();
}

/// Two regions of one file (close-to-open consistency): what one writes and flushes,
/// the other sees once it drops its clean copy with `invalidate` (and not
/// before: close-to-open consistency). Its own dirty folios are kept.
#[test]
fn invalidate_drops_clean_folios_so_the_next_access_reads_the_store() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 2 * MIB, 4);
    let pager = Pager::new(16 * MIB).unwrap();
    let opts = MapOptions::new().writable(true).folio(16 << 10);
    let a = pager.map_file(&path, &opts).unwrap();
    let b = pager.map_file(&path, &opts).unwrap();
    // b reads words 0 and 5000 (clean copies), writes word 9000 (dirty).
    assert_eq!(b.words()[0].load(Relaxed), word(0, 4));
    assert_eq!(b.words()[5000].load(Relaxed), word(5000 * 8, 4));
    b.words()[9000].store(99, Relaxed);
    a.words()[0].store(7, Relaxed);
    a.words()[5000].store(8, Relaxed);
    a.flush().unwrap();
    assert_eq!(b.words()[0].load(Relaxed), word(0, 4), "b's copy is older");
    // Any range touching the folios: an unaligned one.
    let dropped = b.invalidate(3, 5001 * 8 - 3).unwrap();
    assert!(dropped >= 2, "dropped {dropped}");
    assert_eq!(b.words()[0].load(Relaxed), 7);
    assert_eq!(b.words()[5000].load(Relaxed), 8);
    b.invalidate(0, b.len() as u64).unwrap();
    assert_eq!(b.words()[9000].load(Relaxed), 99, "dirty folios are kept");
    assert!(b.invalidate(0, 0).is_err(), "an empty range is refused");
    assert!(
        b.invalidate(b.len() as u64, 1).is_err(),
        "beyond the region"
    );
}

/// Making a pager leaves nothing pending on the calling thread: its next
/// blocking socket read with a timeout is not cut short with EINTR (the
/// io_uring probe once ran here, and the ring's teardown interrupted the
/// thread's first Redis GETs: a reconnect to every node).
#[test]
fn a_new_pager_does_not_interrupt_the_callers_next_socket_read() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(30));
            s.write_all(b"x").unwrap();
        }
    });
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _pager = small_pager(4 * MIB);
    let mut b = [0u8; 1];
    // read(), not read_exact(): std retries EINTR there, unseen.
    for i in 0..5 {
        match c.read(&mut b) {
            Ok(1) => {}
            r => panic!("read {i} after Pager::new: {r:?}"),
        }
    }
    server.join().unwrap();
}
