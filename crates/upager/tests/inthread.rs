//! The rules of in-thread fault resolution (`FaultMode::InThread`), on
//! pagers that choose the mode explicitly: a fault taken inside engine code
//! (a store's read touching region memory) ends, faults that need reclaim
//! are handed to a resolver thread and the budget holds, and the mode is
//! chosen by one name. The rest of the suite runs in both modes (CI runs it
//! again with `UPAGER_FAULT_MODE=in-thread`); the signal-level rules (a
//! foreign SIGBUS reaches the program's handler, a failed read ends in
//! SIGBUS) are in tests/child.rs.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use common::*;
use upager::{FaultMode, MapOptions, Pager, Region, Src, Store};

const MIB: u64 = 1 << 20;

fn in_thread_pager(budget: u64) -> Pager {
    Pager::builder()
        .budget(budget)
        .fault_mode(FaultMode::InThread)
        .build()
        .unwrap()
}

/// A store whose reads copy from another region's memory: its `read_at`
/// runs on a resolver thread (it is not signal-safe) and faults there.
#[derive(Debug)]
struct FromRegion(Arc<Region>);

impl Store for FromRegion {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn writable(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = buf.len().min(self.0.len().saturating_sub(offset as usize));
        self.0.read_at(offset as usize, &mut buf[..n]);
        Ok(n)
    }
    fn write_from(&self, _src: Src<'_>, _offset: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_fault_taken_inside_a_store_read_ends() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 8 * MIB, 61);
    // One resolver thread, which cannot hand its own fault to another; a
    // budget far below the data and no background reclaimer, so B's faults
    // need reclaim (which a signal handler hands off).
    let pager = Pager::builder()
        .budget(2 * MIB)
        .background_reclaim(false)
        .handler_threads(1)
        .fault_mode(FaultMode::InThread)
        .build()
        .unwrap();
    let b = Arc::new(pager.map_file(&path, &MapOptions::new()).unwrap());
    // A's folios are read from B's memory, which is not resident yet: each
    // fill of A faults on B inside the store's read, on the resolver thread.
    let a = Arc::new(
        pager
            .map_store(Arc::new(FromRegion(Arc::clone(&b))), &MapOptions::new())
            .unwrap(),
    );
    let a2 = Arc::clone(&a);
    let reader = std::thread::spawn(move || {
        for w in (0..a2.len() / 8).step_by(509) {
            assert_eq!(
                a2.words()[w].load(Relaxed),
                word(w as u64 * 8, 61),
                "word {w}"
            );
        }
    });
    wait_until("the reads of A to end", 30, || reader.is_finished());
    reader.join().unwrap();
    let s = pager.stats();
    assert_eq!(pager.fault_mode(), FaultMode::InThread);
    assert!(s.faults_in_thread > 0 && s.faults_handed_off > 0, "{s:?}");
    assert!(s.resident_peak_bytes <= 2 * MIB, "{s:?}");
}

#[test]
fn faults_that_need_reclaim_are_handed_off_and_the_budget_holds() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 32 * MIB, 62);
    // No background reclaimer: every fault past the budget needs direct
    // reclaim, which a signal handler may not do.
    let pager = Pager::builder()
        .budget(4 * MIB)
        .background_reclaim(false)
        .fault_mode(FaultMode::InThread)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(4096))
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let r = &r;
            s.spawn(move || {
                for p in (t as usize..r.len() / 4096).step_by(2) {
                    let w = p * 512;
                    assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 62));
                    if p % 3 == 0 {
                        r.words()[w + 1].store(!word((w as u64 + 1) * 8, 62), Relaxed);
                    }
                }
            });
        }
    });
    let s = pager.stats();
    assert!(
        s.faults_handed_off > 0 && s.direct_reclaim_stalls > 0,
        "{s:?}"
    );
    assert!(s.resident_peak_bytes <= 4 * MIB, "{s:?}");
    r.flush().unwrap();
    let data = std::fs::read(&path).unwrap();
    for p in 0..(32 * MIB / 4096) as usize {
        let at = p * 4096 + 8;
        let v = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
        let want = word(at as u64, 62);
        assert_eq!(v, if p % 3 == 0 { !want } else { want }, "page {p}");
    }
}

#[test]
fn the_fault_mode_is_the_one_chosen() {
    assert_eq!(in_thread_pager(4 * MIB).fault_mode(), FaultMode::InThread);
    let p = Pager::builder()
        .fault_mode(FaultMode::Handlers)
        .build()
        .unwrap();
    assert_eq!(p.fault_mode(), FaultMode::Handlers);
    // Both kinds of pager in one process, each resolving its own faults.
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 63);
    let q = in_thread_pager(MIB);
    let (a, b) = (
        p.map_file(&path, &MapOptions::new()).unwrap(),
        q.map_file(&path, &MapOptions::new()).unwrap(),
    );
    for w in (0..a.len() / 8).step_by(4099) {
        assert_eq!(a.words()[w].load(Relaxed), b.words()[w].load(Relaxed));
    }
    assert_eq!(p.stats().faults_in_thread, 0);
    assert!(q.stats().faults_in_thread >= q.stats().faults_missing);
}

/// A lost write found by the soak: an in-thread write fill used to install its
/// folio writable and only then try the LRU lock; when the try failed, the
/// fill was undone with MADV_DONTNEED, throwing away a store another thread
/// had made to the page meanwhile. Here every second try fails (the test
/// knob spins ~200 us first, as a contended lock would), two threads store
/// into the same fresh folios, and every store must be in the file after
/// the flush. Failed 1 of 1 runs before the fix (words lost in the first
/// rounds); the fill now queues before it installs anything.
#[test]
fn concurrent_stores_to_fresh_folios_survive_a_failed_lru_try() {
    let dir = ram_dir();
    let len = 8 * MIB;
    let path = dir.path().join("f");
    std::fs::write(&path, vec![0u8; len as usize]).unwrap();
    let pager = Pager::builder()
        .budget(2 * MIB)
        .fault_mode(FaultMode::InThread)
        .debug_lru_try_fail_every(2)
        .build()
        .unwrap();
    let folio = 16 << 10;
    let words_per_folio = (folio / 8) as usize;
    let nwords = (len / 8) as usize;
    for round in 1..=6u64 {
        let region = Arc::new(
            pager
                .map_file(&path, &MapOptions::new().writable(true).folio(folio))
                .unwrap(),
        );
        // Thread t stores to word t (and every other word of the same
        // parity) of each folio, both threads sweeping the folios in the
        // same order: the two first touches of a folio race.
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let region = Arc::clone(&region);
                std::thread::spawn(move || {
                    let w = region.words();
                    for f in 0..nwords / words_per_folio {
                        for k in (t as usize..words_per_folio).step_by(64) {
                            let i = f * words_per_folio + k;
                            w[i].store(round << 32 | i as u64, Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        region.flush().unwrap();
        let file = std::fs::read(&path).unwrap();
        let mut lost = Vec::new();
        for f in 0..nwords / words_per_folio {
            for t in 0..2usize {
                for k in (t..words_per_folio).step_by(64) {
                    let i = f * words_per_folio + k;
                    let got = u64::from_ne_bytes(file[i * 8..i * 8 + 8].try_into().unwrap());
                    if got != round << 32 | i as u64 {
                        lost.push((i, got));
                    }
                }
            }
        }
        if let Some(&(i, got)) = lost.first() {
            panic!(
                "round {round}: {} stores lost, first word {i} holds {got:#x}; stats {:?}\n{}",
                lost.len(),
                pager.stats(),
                region.folio_trace(i as u64 * 8, 0)
            );
        }
        match Arc::try_unwrap(region) {
            Ok(r) => r.unmap().map_err(|(e, _)| e).unwrap(),
            Err(_) => panic!("region still shared"),
        }
    }
    assert!(
        pager.stats().faults_handed_off > 0,
        "the knob forced hand-offs"
    );
}
