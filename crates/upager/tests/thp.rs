//! 2 MiB folios as huge pages in the view: a fill moves a
//! staged transparent huge page in whole; the view keeps it PMD-mapped
//! through the first write, write-back (write-protect of the PMD) and
//! eviction and re-fault; nothing is lost; without a staged page a fill
//! copies base pages and says so (`thp_fill_fallback`). Runs in both fault
//! modes (scripts/test.sh runs the suite with UPAGER_FAULT_MODE=in-thread).

#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::*;
use upager::{MapOptions, Pager, Region};

const MIB: u64 = 1 << 20;
const HUGE: u64 = 2 * MIB;

/// Whether folio `k` of `r` is one PMD-mapped huge page now (PAGEMAP_SCAN).
fn huge(r: &Region, k: u64) -> bool {
    huge_at(r.as_ptr() as u64 + k * HUGE)
}

/// AnonHugePages (KiB) of the mappings inside `r`, from /proc/self/smaps.
fn anon_huge_kib(r: &Region) -> u64 {
    let (lo, hi) = (r.as_ptr() as u64, r.as_ptr() as u64 + r.len() as u64);
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = head.split_once('-') {
            if let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
                inside = s >= lo && e <= hi;
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    kib
}

/// Reads folio `k` (its first word) until a fill moved a huge page in: the
/// reclaimer stages them off the fault path, a moment after the map.
fn first_huge_fill(pager: &Pager, r: &Region, seed: u64) -> u64 {
    let words_per_folio = (HUGE / 8) as usize;
    let nfolios = r.len() as u64 / HUGE;
    let mut k = 0;
    wait_until("a fill that moves a staged huge page in", 10, || {
        let before = pager.stats().thp_fills;
        let w = r.words()[k as usize * words_per_folio].load(Relaxed);
        if seed != u64::MAX {
            assert_eq!(w, word(k * HUGE, seed), "folio {k}");
        }
        k += 1;
        assert!(
            k < nfolios,
            "no huge fill in {nfolios} folios: {:?}",
            pager.stats()
        );
        pager.stats().thp_fills > before
    });
    k - 1
}

#[test]
fn huge_folios_stay_huge_through_fill_write_flush_and_refault() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 64 * MIB, 41);
    let pager = Pager::builder().budget(32 * MIB).build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(HUGE).writable(true))
        .unwrap();
    // Fill: one PMD.
    let k = first_huge_fill(&pager, &r, 41);
    assert!(huge(&r, k), "folio {k} was moved in but is not PMD-mapped");
    assert!(
        anon_huge_kib(&r) >= 2048,
        "smaps shows no AnonHugePages in the region"
    );
    // First write: a write-protect fault on the PMD; unprotected, not split.
    let w = (k * HUGE / 8) as usize + 7;
    r.words()[w].store(0xDEAD_BEEF, Relaxed);
    assert!(huge(&r, k), "the first write split folio {k}");
    assert_eq!(pager.stats().faults_wp, 1, "{:?}", pager.stats());
    // Flush: write-protect (the PMD), write back, still huge.
    r.flush().unwrap();
    assert!(huge(&r, k), "flush split folio {k}");
    // Evict it and fault it in again: a huge page again.
    r.pageout(k * HUGE, HUGE).unwrap();
    let evicted = pager.stats().thp_evictions;
    assert!(evicted >= 1, "{:?}", pager.stats());
    assert_eq!(
        r.words()[w].load(Relaxed),
        0xDEAD_BEEF,
        "the write was lost"
    );
    wait_until("a huge re-fault", 10, || {
        if !huge(&r, k) {
            r.pageout(k * HUGE, HUGE).unwrap();
            let _ = r.words()[w].load(Relaxed);
        }
        huge(&r, k)
    });
    // A scan 2x the budget: data right, evictions of huge folios, budget.
    for i in (0..r.len() / 8).step_by(4096) {
        let want = if i == w {
            0xDEAD_BEEF
        } else {
            word(i as u64 * 8, 41)
        };
        assert_eq!(r.words()[i].load(Relaxed), want, "word {i}");
    }
    let s = pager.stats();
    // How many of the scan's fills found a staged page depends on how fast
    // the reclaimer stages them against the faults (in-thread faults are
    // quick): some did, the others copied.
    assert!(s.thp_fills >= 2 && s.thp_evictions > evicted, "{s:?}");
    assert_eq!(s.thp_fills + s.thp_fill_fallback, s.fills, "{s:?}");
    assert!(s.resident_peak_bytes <= 32 * MIB, "{s:?}");
    r.unmap().unwrap();
    let s = pager.stats();
    assert_eq!(
        s.resident_bytes, 0,
        "staged pages given back with the last 2 MiB region: {s:?}"
    );
    let data = std::fs::read(&path).unwrap();
    assert_eq!(upager_testdata::word_at(&data, w * 8), 0xDEAD_BEEF);
    assert_eq!(
        upager_testdata::word_at(&data, w * 8 + 8),
        word(w as u64 * 8 + 8, 41)
    );
}

#[test]
fn without_staged_huge_pages_fills_copy_and_count_the_fallback() {
    // Under 16 MiB of budget no huge page is staged: every 2 MiB fill copies.
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 32 * MIB, 42);
    let pager = Pager::builder().budget(8 * MIB).build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(HUGE).writable(true))
        .unwrap();
    for i in (0..r.len() / 8).step_by(512) {
        assert_eq!(
            r.words()[i].load(Relaxed),
            word(i as u64 * 8, 42),
            "word {i}"
        );
    }
    r.words()[3].store(7, Relaxed);
    r.flush().unwrap();
    let s = pager.stats();
    assert_eq!(s.thp_fills, 0, "{s:?}");
    // Counted as a fallback where moves could happen (not masked).
    if !masked("uffd_move") && !masked("pagemap_scan") {
        assert!(s.thp_fill_fallback >= 16, "{s:?}");
    }
    assert!(s.resident_peak_bytes <= 8 * MIB, "{s:?}");
    r.unmap().unwrap();
    assert_eq!(
        upager_testdata::word_at(&std::fs::read(&path).unwrap(), 24),
        7
    );
}

#[test]
fn anonymous_huge_folios_swap_whole_and_come_back_huge() {
    if !thp_available() {
        return;
    }
    let pager = Pager::builder().budget(32 * MIB).build().unwrap();
    let r = pager
        .map_anonymous(96 * MIB, &MapOptions::new().folio(HUGE))
        .unwrap();
    let _ = first_huge_fill(&pager, &r, u64::MAX);
    // Write every page (3x the budget: folios go to swap and back).
    for i in (0..r.len() / 8).step_by(512) {
        r.words()[i].store(word(i as u64 * 8, 43), Relaxed);
    }
    for i in (0..r.len() / 8).step_by(512) {
        assert_eq!(
            r.words()[i].load(Relaxed),
            word(i as u64 * 8, 43),
            "word {i}"
        );
    }
    let s = pager.stats();
    assert!(
        s.thp_evictions > 0 && s.refaults > 0 && s.thp_fills > 0,
        "{s:?}"
    );
    // Written back to swap, then moved out into a staging slot (thp.rs).
    assert!(s.thp_recycled > 0, "{s:?}");
    assert!(s.resident_peak_bytes <= 32 * MIB, "{s:?}");
    // Swapped out whole and back as a huge page (once one is staged).
    let k = 5;
    let w = (k * HUGE / 8) as usize + 512 * 3; // a word the loop wrote
    wait_until("a swapped-out folio back as a huge page", 10, || {
        r.pageout(k * HUGE, HUGE).unwrap();
        assert_eq!(
            r.words()[w].load(Relaxed),
            word(w as u64 * 8, 43),
            "{:?}",
            pager.stats()
        );
        huge(&r, k)
    });
}

/// Eviction recycles huge pages (moves them out into a staging slot, thp.rs)
/// and later fills read over them: no folio may show another's data (the
/// last folio of the file is partly beyond its end), and written data
/// comes back.
#[test]
fn recycled_huge_pages_carry_no_old_data() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let len = 63 * MIB + 4096;
    let path = pattern_file(dir.path(), "data", len, 43);
    let pager = Pager::builder().budget(32 * MIB).build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(HUGE).writable(true))
        .unwrap();
    let words = r.len() / 8;
    assert_eq!(r.len() as u64, len, "the region is the file's length");
    // One written word per folio, then two scans 2x the budget each.
    for f in 0..len.div_ceil(HUGE) {
        let w = ((f * HUGE) / 8) as usize + 3;
        if w < words {
            r.words()[w].store(0xF00D_0000 + f, Relaxed);
        }
    }
    for _ in 0..2 {
        for i in (0..words).step_by(509) {
            let f = i as u64 * 8 / HUGE;
            let want = if i == (f * HUGE / 8) as usize + 3 {
                0xF00D_0000 + f
            } else {
                word(i as u64 * 8, 43)
            };
            assert_eq!(r.words()[i].load(Relaxed), want, "word {i}");
        }
        // The last word of the file (its last folio is partly beyond it).
        assert_eq!(
            r.words()[words - 1].load(Relaxed),
            word((words as u64 - 1) * 8, 43)
        );
    }
    let s = pager.stats();
    assert!(s.thp_recycled > 0, "no huge page was recycled: {s:?}");
    assert!(s.resident_peak_bytes <= 32 * MIB, "{s:?}");
    r.unmap().unwrap();
}

/// A write that reaches a huge folio between its move into the view and
/// its write-protect (the kernel installs a moved PMD writable) is kept:
/// the fill compares a digest of the staged page with the view and
/// publishes a changed folio DIRTY. Readers fault folios in while writers,
/// released with them, write one word each after a varying delay that
/// spans the fill; every folio is then paged out and every word must have
/// reached the file. Without the digest check a write landing in the
/// window is lost (the folio is published CLEAN and dropped).
#[test]
fn a_write_racing_a_huge_read_fill_is_kept() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 32 * MIB, 43);
    let pager = Pager::builder().budget(16 * MIB).build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(HUGE).writable(true))
        .unwrap();
    let per = (HUGE / 8) as usize;
    let nfolios = r.len() / HUGE as usize;
    let rounds = 24u64;
    let value = |round: u64, k: usize| 0x5A5A_0000_0000_0000 | round << 32 | k as u64;
    for round in 0..rounds {
        for k in 0..nfolios {
            let barrier = std::sync::Barrier::new(2);
            // A delay from 0 to ~1 ms, different for every attempt.
            let spins = ((round * 131 + k as u64 * 977) % 64) * 2_000;
            std::thread::scope(|s| {
                s.spawn(|| {
                    barrier.wait();
                    std::hint::black_box(r.words()[k * per].load(Relaxed));
                });
                s.spawn(|| {
                    barrier.wait();
                    for _ in 0..spins {
                        std::hint::spin_loop();
                    }
                    r.words()[k * per + 1 + (round as usize % 7)].store(value(round, k), Relaxed);
                });
            });
        }
        r.pageout(0, r.len() as u64).unwrap();
        for k in 0..nfolios {
            let got = r.words()[k * per + 1 + (round as usize % 7)].load(Relaxed);
            assert_eq!(
                got,
                value(round, k),
                "round {round}, folio {k}: the write was lost"
            );
        }
    }
    let s = pager.stats();
    eprintln!(
        "{} huge fills, {} of them raced by a write, {} fallbacks",
        s.thp_fills, s.thp_fill_raced, s.thp_fill_fallback
    );
    r.flush().unwrap();
    drop(r);
    let data = std::fs::read(&path).unwrap();
    for k in 0..nfolios {
        for round in rounds.saturating_sub(7)..rounds {
            let at = (k * per + 1 + (round as usize % 7)) * 8;
            assert_eq!(
                upager_testdata::word_at(&data, at),
                value(round, k),
                "file, folio {k}"
            );
        }
    }
}
