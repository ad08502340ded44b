//! Residency, pageout, prefetch and discard, including a
//! property test against a reference model.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]
// The model indexes folios by number on purpose.
#![allow(clippy::needless_range_loop)]

mod common;

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use upager::{MapOptions, Pager, RangeError, Region, Residency};

const MIB: u64 = 1 << 20;
const F: u64 = 64 << 10;

/// Per-folio residency, once transient BUSY states (a filler between its
/// COPY and publishing the state) have settled (bounded wait).
fn states(r: &Region) -> Vec<Residency> {
    let mut runs = Vec::new();
    wait_until("busy folios to settle", 5, || {
        runs = r.residency(0, r.len() as u64).unwrap();
        runs.iter().all(|(_, s)| *s != Residency::Busy)
    });
    let mut out = Vec::new();
    for (range, s) in runs {
        for _ in 0..(range.end - range.start).div_ceil(r.folio_size()) {
            out.push(s);
        }
    }
    out
}

#[test]
fn residency_answers_from_state_in_all_three_shapes() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 1);
    let pager = Pager::new(64 * MIB).unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(F))
        .unwrap();
    r.words()[0].load(Relaxed); // folio 0 (+ no readahead at 0)
    r.words()[(10 * F / 8) as usize].store(1, Relaxed); // folio 10 dirty
    r.words()[(20 * F / 8) as usize].load(Relaxed); // folio 20 clean
    assert_eq!(r.pageout(20 * F, F).unwrap(), 1);
    let s = states(&r);
    assert_eq!(s[0], Residency::ResidentClean);
    assert_eq!(s[10], Residency::ResidentDirty);
    assert_eq!(s[20], Residency::Evicted);
    assert_eq!(s[30], Residency::NeverTouched);
    let runs = r.residency(4096, 2 * F).unwrap();
    assert_eq!(
        runs,
        vec![
            (4096..F, Residency::ResidentClean),
            (F..2 * F + 4096, Residency::NeverTouched)
        ]
    );
    let mc = r.mincore(0, 32 * F).unwrap();
    assert_eq!(mc.len(), 32 * 16);
    assert_eq!(
        (mc[0], mc[15], mc[16], mc[10 * 16 + 3], mc[20 * 16]),
        (1, 1, 0, 1, 0)
    );
    let pm = r.pagemap(0, 32 * F).unwrap();
    assert_eq!(pm[0] >> 62, 0b10, "present");
    assert_eq!(
        pm[20 * 16 + 5] >> 62,
        0b01,
        "swapped = contents in the store"
    );
    assert_eq!(pm[30 * 16], 0);
    // Bad ranges are clear errors.
    assert_eq!(r.residency(0, 0).unwrap_err(), RangeError::Empty);
    assert_eq!(
        r.residency(100, 10).unwrap_err().to_string(),
        "range start 100 is not a multiple of 4096 bytes, the alignment this call needs (4096 for residency and mincore, the region's folio size for pageout and discard)"
    );
    assert_eq!(
        r.residency(0, 5 * MIB).unwrap_err().to_string(),
        "range 0+5242880 is outside the region of 4194304 bytes"
    );
    assert!(r.pageout(4096, F).is_err());
    assert!(r.discard(0, F + 1).is_err());
    assert!(r.prefetch(u64::MAX - 1, 2).is_err());
}

#[test]
fn an_access_that_returned_is_resident_once_its_fill_publishes() {
    // The filler installs a folio, publishes its state, then wakes the
    // faulting thread. The kernel may let that thread go before the wake:
    // a thread preempted between queueing its fault and going to sleep
    // finds the page already mapped (userfaultfd_must_wait) and retries at
    // once. So an access that returned can still see its folio BUSY, for
    // as long as the filler takes to publish: the state settles without
    // any further access, and to the right kind.
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 16 * MIB, 5);
    let pager = Pager::builder()
        .budget(64 * MIB)
        .readahead(0)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(F))
        .unwrap();
    let settled = |f: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = r.residency(f * F, F).unwrap();
            if s != vec![(f * F..(f + 1) * F, Residency::Busy)]
                || std::time::Instant::now() > deadline
            {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    };
    for f in 0..(r.len() as u64 / F) {
        let w = (f * F / 8) as usize;
        let want = if f % 2 == 0 {
            r.words()[w].load(Relaxed);
            Residency::ResidentClean
        } else {
            r.words()[w].store(f, Relaxed);
            Residency::ResidentDirty
        };
        assert_eq!(settled(f), vec![(f * F..(f + 1) * F, want)], "folio {f}");
    }
}

#[test]
fn pageout_evicts_in_batches_and_keeps_every_write() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 16 * MIB, 2);
    let pager = Pager::new(64 * MIB).unwrap();
    let r = pager
        .map_file(
            &path,
            // Base folios only: a region with huge runs keeps a staged
            // huge page charged to the budget (2 MiB resident after this
            // pageout).
            &MapOptions::new().writable(true).folio(F).huge_runs(false),
        )
        .unwrap();
    for w in (0..r.len() / 8).step_by(512) {
        r.words()[w].store(w as u64, Relaxed);
    }
    let before = pager.stats();
    assert_eq!(r.pageout(0, r.len() as u64).unwrap(), 256);
    let s = pager.stats();
    assert_eq!(s.evict_pageout - before.evict_pageout, 256);
    assert_eq!(
        s.evict_batches - before.evict_batches,
        4,
        "256 folios of 64 KiB = 4 batches of 4 MiB"
    );
    // One write-protect call and one process_madvise per batch.
    assert_eq!(s.tlb_flush_batches - before.tlb_flush_batches, 8);
    assert_eq!(s.resident_bytes, 0);
    assert_eq!(s.evicted_markers, 256);
    assert!(states(&r).iter().all(|&x| x == Residency::Evicted));
    let file = std::fs::read(&path).unwrap();
    for w in (0..r.len() / 8).step_by(512) {
        assert_eq!(
            u64::from_le_bytes(file[w * 8..w * 8 + 8].try_into().unwrap()),
            w as u64
        );
        assert_eq!(r.words()[w].load(Relaxed), w as u64);
    }
}

#[test]
fn prefetch_fills_in_the_background_and_later_accesses_do_not_fault() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 8 * MIB, 3);
    let pager = Pager::new(64 * MIB).unwrap();
    let store = std::sync::Arc::new(TestStore::new(&path, false));
    let r = pager
        .map_store(store.clone(), &MapOptions::new().folio(F))
        .unwrap();
    // The store's reads wait at a closed gate: prefetch must return while
    // its reads are still held there (it queues the work and returns), not
    // after a timer.
    store.set_gate(true);
    r.prefetch(MIB, 4 * MIB).unwrap();
    assert!(
        r.mincore(MIB, 4 * MIB).unwrap().iter().all(|&b| b == 0),
        "prefetch returned after filling: it must return at once"
    );
    wait_until("prefetch to read the store", 10, || {
        store.reads_blocked.load(SeqCst) > 0
    });
    store.set_gate(false);
    wait_until("prefetch to finish", 10, || {
        !r.mincore(MIB, 4 * MIB).unwrap().contains(&0)
    });
    let faults = pager.stats().faults_missing;
    for w in ((MIB / 8) as usize..(5 * MIB / 8) as usize).step_by(512) {
        assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 3));
    }
    assert_eq!(
        pager.stats().faults_missing,
        faults,
        "prefetched folios must not fault"
    );
    assert_eq!(states(&r)[0], Residency::NeverTouched);
    // The kernel agrees: the pages are mapped.
    assert_eq!(resident_pages(r.as_ptr() as u64 + MIB, 4 * MIB), 1024);
}

/// Unmap marks the region dying and waits for the work in flight on it. A
/// prefetch is in flight for its whole request, so it must stop at the next
/// folio once the region is dying (it used to keep filling until the budget
/// was full: unmap waited for ~1,000 slow reads).
#[test]
fn unmap_stops_a_prefetch_in_flight() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 16 * MIB, 9);
    let pager = Pager::builder()
        .budget(4 * MIB)
        .readahead(0)
        .build()
        .unwrap();
    let store = Arc::new(TestStore::new(&path, false));
    store.read_delay_us.store(1000, SeqCst);
    let r = pager
        .map_store(store.clone(), &MapOptions::new().folio(4096))
        .unwrap();
    // 4,096 folios, 1 ms per read; the budget holds 1,024 of them.
    r.prefetch(0, 16 * MIB).unwrap();
    wait_until("prefetch to start", 10, || store.reads.load(SeqCst) > 10);
    let before = store.reads.load(SeqCst);
    r.unmap().map_err(|(e, _)| e).unwrap();
    let during = store.reads.load(SeqCst) - before;
    // One read in progress when unmap starts, plus whatever the prefetch
    // read while this thread was preempted before setting `dying` (1 ms
    // each): far below the ~1,000 of a prefetch that ignores unmap.
    assert!(
        during < 256,
        "unmap waited for {during} store reads: the prefetch kept filling a dying region"
    );
}

/// Discard claims folios as it goes and releases them at the end of a
/// chunk (up to 1,024). When it meets a BUSY folio whose owner is a fill
/// waiting in direct reclaim for budget, and its own claims hold that
/// budget, neither can move: it must release its claims before waiting (it
/// used to hold them: the fill gave up after 5 s and the access failed).
#[test]
fn discard_lets_go_of_its_claims_before_waiting_on_a_busy_fill() {
    const P: u64 = 4096;
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 2 * MIB, 7);
    let pager = Pager::builder()
        .budget(64 * P)
        .batch(8)
        .readahead(0)
        .handler_threads(3)
        .background_reclaim(false)
        .build()
        .unwrap();
    let store = Arc::new(TestStore::new(&path, true));
    let r = pager
        .map_store(store.clone(), &MapOptions::new().folio(P).writable(true))
        .unwrap();
    let state_of = |f: u64| r.residency(f * P, P).unwrap()[0].1;
    let wpf = (P / 8) as usize;
    // 63 resident folios; with fault A's folio below, the budget is full.
    for f in 0..63 {
        assert_eq!(r.words()[f * wpf].load(Relaxed), word(f as u64 * P, 7));
    }
    // Write-backs fail from now on, so A's folio (dirty once filled) cannot
    // be evicted by B's direct reclaim: B's only way out is discard's claims.
    store.fail_writes.store(true, SeqCst);
    store.set_gate(true);
    std::thread::scope(|s| {
        // Fault A (a write) on folio 100: budget reserved, held at the gate.
        let a = s.spawn(|| r.words()[100 * wpf].store(42, Relaxed));
        wait_until("fault A to block in the store", 10, || {
            store.reads_blocked.load(SeqCst) > 0
        });
        // Discard of folios 0..200 claims the resident ones, reaches 100
        // and waits for it.
        let discard = s.spawn(|| r.discard(0, 200 * P).unwrap());
        wait_until("discard to pass folio 62", 10, || {
            matches!(state_of(62), Residency::Busy | Residency::NeverTouched)
        });
        // Fault B, from a system call (EFAULT rather than SIGBUS if it
        // fails), on folio 150: it needs budget.
        let out = std::fs::File::create(dir.path().join("b-out")).unwrap();
        let b_addr = r.as_ptr() as u64 + 150 * P;
        let r = &r;
        let b = s.spawn(move || {
            syscall_on(r, 150 * P, 8, false, || {
                upager_sys::io::pwrite_from(&out, b_addr, 8, 0)
            })
        });
        wait_until("fault B to claim folio 150", 10, || {
            state_of(150) == Residency::Busy
        });
        let t0 = Instant::now();
        store.set_gate(false);
        a.join().unwrap();
        let b_res = b.join().unwrap();
        let b_took = t0.elapsed();
        discard.join().unwrap();
        assert!(b_res.is_ok(), "fault B failed ({b_res:?}) after {b_took:?}");
        // A fill that finds nothing to evict gives up after 5 s (and
        // fails); B must not have waited for that.
        assert!(b_took < Duration::from_secs(4), "fault B took {b_took:?}");
    });
    assert_eq!(pager.stats().faults_failed, 0);
    store.fail_writes.store(false, SeqCst);
}

/// Flush and pageout collect a batch of claimed folios; when they meet a
/// BUSY folio they process the batch first and only then wait (the same
/// rule as discard above). Shown without a timer: a fill is held at the
/// store's gate while the folios before it must already be written back
/// (flush: CLEAN) or evicted (pageout); once the fill ends, flush still
/// returns only with every write on the file.
#[test]
fn flush_and_pageout_process_their_batch_before_waiting_on_a_busy_fill() {
    const P: u64 = 4096;
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", MIB, 8);
    let pager = Pager::builder()
        .budget(16 * MIB)
        .readahead(0)
        .background_reclaim(false)
        .build()
        .unwrap();
    let store = Arc::new(TestStore::new(&path, true));
    let r = pager
        .map_store(store.clone(), &MapOptions::new().folio(P).writable(true))
        .unwrap();
    let state_of = |f: u64| r.residency(f * P, P).unwrap()[0].1;
    let wpf = (P / 8) as usize;
    for (round, op) in ["flush", "pageout"].into_iter().enumerate() {
        let value = 1000 + round as u64;
        for f in 0..10 {
            r.words()[f * wpf].store(value + f as u64, Relaxed);
        }
        // A fault on folio 20 (not resident) is held at the gate: BUSY.
        let busy = 20 + round as u64;
        store.set_gate(true);
        std::thread::scope(|s| {
            let fault = s.spawn(|| r.words()[busy as usize * wpf].load(Relaxed));
            wait_until("the fill to block in the store", 10, || {
                state_of(busy) == Residency::Busy
            });
            let advice = s.spawn(|| match op {
                "flush" => r.flush().map_err(|e| e.to_string()),
                _ => r.pageout(0, 32 * P).map(|_| ()).map_err(|e| e.to_string()),
            });
            let want = if op == "flush" {
                Residency::ResidentClean
            } else {
                Residency::Evicted
            };
            wait_until(
                &format!("{op} to finish the folios before the busy one"),
                10,
                || (0..10).all(|f| state_of(f) == want),
            );
            assert_eq!(state_of(busy), Residency::Busy, "the fill is still held");
            store.set_gate(false);
            assert_eq!(fault.join().unwrap(), word(busy * P, 8));
            advice.join().unwrap().unwrap();
        });
        let file = std::fs::read(&path).unwrap();
        for f in 0..10usize {
            let at = f * P as usize;
            let got = u64::from_ne_bytes(file[at..at + 8].try_into().unwrap());
            assert_eq!(got, value + f as u64, "{op}: folio {f} not on the file");
        }
    }
}

fn swap_blocks(dir: &std::path::Path) -> u64 {
    // The swap file is unlinked; find it through our descriptors.
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            if t.starts_with(dir) {
                use std::os::unix::fs::MetadataExt;
                return std::fs::metadata(e.path()).unwrap().blocks();
            }
        }
    }
    panic!("no swap file open in {}", dir.display());
}

#[test]
fn discard_zeroes_anonymous_memory_and_frees_swap() {
    let swap = ram_dir();
    let pager = Pager::builder()
        .budget(8 * MIB)
        .swap_dir(swap.path())
        .build()
        .unwrap();
    // The swap file's own blocks are the subject: without the compressed
    // tier, which would keep this data in memory (tests/ztier.rs has the
    // tier's discard).
    let r = pager
        .map_anonymous(32 * MIB, &MapOptions::new().folio(F).compressed_tier(false))
        .unwrap();
    for w in (0..r.len() / 8).step_by(512) {
        r.words()[w].store(w as u64 + 1, Relaxed);
    }
    r.pageout(0, r.len() as u64).unwrap();
    let used = swap_blocks(swap.path());
    assert!(
        used * 512 >= 24 * MIB,
        "swap holds the evicted data: {used} blocks"
    );
    assert!(pager.stats().evicted_markers > 0);
    r.discard(0, 16 * MIB).unwrap();
    let after = swap_blocks(swap.path());
    assert!(
        after * 512 <= used * 512 - 15 * MIB,
        "discard must punch swap: {used} -> {after} blocks"
    );
    for w in (0..r.len() / 8).step_by(512) {
        let want = if (w as u64) < 16 * MIB / 8 {
            0
        } else {
            w as u64 + 1
        };
        assert_eq!(r.words()[w].load(Relaxed), want, "word {w}");
    }
    r.unmap().unwrap();
    assert_eq!(pager.stats().evicted_markers, 0, "unmap clears markers");
}

/// Discard frees swap slots that eviction, running at the same time in
/// the same region, may hand to other folios at once: the discarded slots'
/// holes must be punched before the slots are reused, or the punch wipes
/// the other folio's freshly written data (found by the reference-model
/// test in CI: an anonymous region read zeros at the end).
#[test]
fn discard_racing_eviction_loses_no_other_folio() {
    let swap = ram_dir();
    let pager = Pager::builder()
        .budget(MIB)
        .batch(8)
        .swap_dir(swap.path())
        .build()
        .unwrap();
    const HALF: u64 = 4 * MIB;
    let r = pager
        .map_anonymous(2 * HALF, &MapOptions::new().folio(PF))
        .unwrap();
    let words_per_folio = (PF / 8) as usize;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(4);
    std::thread::scope(|s| {
        // Discarder: dirties the second half (its folios get slots when
        // evicted), then discards it (frees those slots), over and over.
        s.spawn(|| {
            let base = (HALF / 8) as usize;
            while !stop.load(Relaxed) {
                for f in 0..(HALF / PF) as usize {
                    r.words()[base + f * words_per_folio].store(1, Relaxed);
                }
                r.discard(HALF, HALF).unwrap();
            }
        });
        // Writer: discards its own half so every folio needs a new slot on
        // its next eviction, writes every folio, and reads it all back.
        let mut round = 0u64;
        while Instant::now() < deadline {
            round += 1;
            r.discard(0, HALF).unwrap();
            for f in 0..(HALF / PF) as usize {
                r.words()[f * words_per_folio + 1].store(round << 32 | f as u64, Relaxed);
            }
            for f in 0..(HALF / PF) as usize {
                let got = r.words()[f * words_per_folio + 1].load(Relaxed);
                if got != round << 32 | f as u64 {
                    stop.store(true, Relaxed);
                    panic!("round {round}: folio {f} reads {got:#x}: a write was lost");
                }
            }
        }
        stop.store(true, Relaxed);
    });
    assert!(pager.stats().discards > 0);
}

#[test]
fn discard_on_a_file_drops_unflushed_writes_and_rereads_the_file() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 2 * MIB, 4);
    let pager = Pager::new(16 * MIB).unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(F))
        .unwrap();
    r.words()[0].store(111, Relaxed);
    r.flush().unwrap();
    r.words()[0].store(222, Relaxed); // not flushed
    r.words()[(F / 8) as usize].store(333, Relaxed); // not flushed, other folio
    r.discard(0, F).unwrap();
    assert_eq!(states(&r)[0], Residency::NeverTouched);
    assert_eq!(r.words()[0].load(Relaxed), 111, "reads the file again");
    assert_eq!(
        r.words()[(F / 8) as usize].load(Relaxed),
        333,
        "outside the range: kept"
    );
    assert_eq!(pager.stats().discards, 1);
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    Write(usize, u8),
    Read(usize),
    Pageout(usize, usize),
    Prefetch(usize, usize),
    Discard(usize, usize),
    Flush,
}

const NF: usize = 24;
const PF: u64 = 4096;

fn op() -> impl Strategy<Value = Op> {
    let range = (0..NF).prop_flat_map(|a| (Just(a), 1..=NF - a));
    prop_oneof![
        3 => (0..NF, any::<u8>()).prop_map(|(f, v)| Op::Write(f, v)),
        3 => (0..NF).prop_map(Op::Read),
        1 => range.clone().prop_map(|(a, n)| Op::Pageout(a, n)),
        1 => range.clone().prop_map(|(a, n)| Op::Prefetch(a, n)),
        1 => range.prop_map(|(a, n)| Op::Discard(a, n)),
        1 => Just(Op::Flush),
    ]
}

/// What the model knows about one folio.
#[derive(Debug, Clone, Copy, PartialEq)]
enum M {
    Never,
    /// Written or read since the last pageout/discard; `dirty` since flush.
    Used {
        dirty: bool,
    },
    Paged,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn residency_and_data_follow_a_reference_model(anon in any::<bool>(), ops in proptest::collection::vec(op(), 1..40)) {
        let dir = ram_dir();
        // Budget above the region: only pageout evicts, so the model is exact.
        let pager = Pager::builder().budget(8 * MIB).readahead(0).swap_dir(dir.path()).build().unwrap();
        let (r, mut store) = if anon {
            (pager.map_anonymous(NF as u64 * PF, &MapOptions::new().folio(PF)).unwrap(), vec![0u8; NF])
        } else {
            let path = dir.path().join("f");
            std::fs::write(&path, (0..NF).flat_map(|f| vec![f as u8; PF as usize]).collect::<Vec<u8>>()).unwrap();
            (pager.map_file(&path, &MapOptions::new().writable(true).folio(PF)).unwrap(), (0..NF).map(|f| f as u8).collect())
        };
        let mut mem = store.clone();
        let mut m = [M::Never; NF];
        // Anonymous folios never written since a discard hold zeros and
        // need no swap: pageout returns them to never-touched.
        let mut written = [false; NF];
        for o in &ops {
            match *o {
                Op::Write(f, v) => { r.bytes()[f * PF as usize + 7].store(v, Relaxed); mem[f] = v; m[f] = M::Used { dirty: true }; written[f] = true; }
                Op::Read(f) => {
                    let got = r.bytes()[f * PF as usize + 7].load(Relaxed);
                    prop_assert_eq!(got, mem[f], "read of folio {} after {:?}", f, ops);
                    if !matches!(m[f], M::Used { .. }) { m[f] = M::Used { dirty: false }; }
                }
                Op::Pageout(a, n) => {
                    r.pageout(a as u64 * PF, n as u64 * PF).unwrap();
                    for f in a..a + n {
                        match m[f] {
                            M::Used { .. } => {
                                store[f] = mem[f];
                                m[f] = if anon && !written[f] { M::Never } else { M::Paged };
                            }
                            M::Never | M::Paged => {}
                        }
                    }
                }
                Op::Prefetch(a, n) => {
                    r.prefetch(a as u64 * PF, n as u64 * PF).unwrap();
                    // Prefetch is asynchronous: wait (bounded) until it landed,
                    // so the rest of the model stays exact.
                    prop_assert!(r.wait_prefetch(Duration::from_secs(10)), "prefetch did not finish");
                    for f in a..a + n {
                        if matches!(m[f], M::Never | M::Paged) { m[f] = M::Used { dirty: false }; }
                    }
                }
                Op::Discard(a, n) => {
                    r.discard(a as u64 * PF, n as u64 * PF).unwrap();
                    for f in a..a + n {
                        if anon { store[f] = 0; }
                        mem[f] = store[f];
                        m[f] = M::Never;
                        written[f] = false;
                    }
                }
                Op::Flush => {
                    r.flush().unwrap();
                    // Anonymous memory has nothing durable to flush.
                    for f in (0..NF).filter(|_| !anon) {
                        if let M::Used { dirty: true } = m[f] { store[f] = mem[f]; m[f] = M::Used { dirty: false }; }
                    }
                }
            }
            let got = states(&r);
            for f in 0..NF {
                let ok = match (m[f], got[f]) {
                    (M::Never, Residency::NeverTouched) => true,
                    (M::Paged, Residency::Evicted) => true,
                    (M::Used { dirty: true }, Residency::ResidentDirty) => true,
                    // A file folio read is clean; anonymous folios read clean too.
                    (M::Used { dirty: false }, Residency::ResidentClean) => true,

                    _ => false,
                };
                prop_assert!(ok, "folio {} model {:?} upager {:?} after {:?}", f, m[f], got[f], o);
            }
        }
        for f in 0..NF {
            prop_assert_eq!(r.bytes()[f * PF as usize + 7].load(Relaxed), mem[f]);
        }
    }
}
