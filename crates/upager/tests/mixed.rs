//! Mixed folio sizes in one region: a writable file region of
//! small folios fills a 2 MiB-aligned run that is read in sequence as one
//! huge page (`thp_fills`), keeps its own folios for random faults and for
//! a partial run at the end of the file, evicts a huge run whole, and loses
//! no write made to a huge run (a write splits it: the first write to a
//! folio of it is a write-protect fault like any other). `huge_runs(false)`
//! turns it off. Runs in both fault modes (scripts/test.sh runs the suite
//! with UPAGER_FAULT_MODE=in-thread).

#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::*;
use upager::{MapOptions, Pager, Region, Residency};

const MIB: u64 = 1 << 20;
const HUGE: u64 = 2 * MIB;
const PAGE: u64 = 4096;

/// Whether 2 MiB run `k` of `r` is one PMD-mapped huge page now.
fn huge(r: &Region, k: u64) -> bool {
    huge_at(r.as_ptr() as u64 + k * HUGE)
}

/// Reads the first word of every page of `r` in order, checking it.
fn scan(r: &Region, seed: u64, skip: &[(usize, u64)]) {
    for i in (0..r.len() / 8).step_by((PAGE / 8) as usize) {
        let want = skip
            .iter()
            .find(|&&(w, _)| w == i)
            .map_or(word(i as u64 * 8, seed), |&(_, v)| v);
        assert_eq!(r.words()[i].load(Relaxed), want, "word {i}");
    }
}

fn mixed_region(folio: u64, on: bool) {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    // A partial run at the end: 20 KiB past the last whole run.
    let len = 64 * MIB + 20 * 1024;
    let path = pattern_file(dir.path(), "data", len, 23);
    let pager = Pager::builder()
        .budget(32 * MIB)
        .huge_runs(on)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(folio).writable(true))
        .unwrap();
    if on {
        assert_eq!(
            r.as_ptr() as u64 % HUGE,
            0,
            "a mixed region is 2 MiB-aligned"
        );
    }
    // Sequential passes, until one fill moved a huge page in (the
    // reclaimer stages them off the fault path, a moment after the map).
    let mut passes = 0;
    wait_until("a huge run fill", 20, || {
        scan(&r, 23, &[]);
        passes += 1;
        !on || passes >= 2 && pager.stats().thp_fills > 0
    });
    let s = pager.stats();
    if !on {
        assert_eq!(s.thp_fills, 0, "huge_runs(false) filled huge pages: {s:?}");
        assert_eq!(s.thp_evictions, 0, "{s:?}");
    } else {
        assert!(s.thp_fills > 0, "{s:?}");
        // Passes over 2x the budget evicted huge runs whole.
        assert!(s.thp_evictions > 0, "{s:?}");
    }
    assert!(s.resident_peak_bytes <= 32 * MIB, "{s:?}");
    // The prefetch thread may still be filling the run after the last
    // (async readahead): wait until nothing is busy.
    wait_until("the last readahead to finish", 10, || {
        r.residency(0, r.len() as u64)
            .unwrap()
            .iter()
            .all(|(_, s)| *s != Residency::Busy)
    });
    // A resident huge run now, if any: the last runs of the last pass.
    let nruns = len / HUGE;
    let run = (0..nruns).rev().find(|&k| huge(&r, k));
    assert_eq!(run.is_some(), on, "a PMD-mapped run exists iff huge_runs");
    assert_eq!(
        r.huge_bytes().unwrap() > 0,
        on,
        "huge_bytes counts huge runs"
    );
    // A write into a huge run: a write-protect fault; it splits the PMD;
    // it is kept through flush and eviction.
    let mut written = Vec::new();
    if let Some(k) = run {
        let w = (k * HUGE / 8) as usize + 3 * 512 + 5;
        let wp = pager.stats().faults_wp;
        let res = r.residency(k * HUGE, HUGE).unwrap();
        r.words()[w].store(0xFEED_0023, Relaxed);
        assert_eq!(
            pager.stats().faults_wp,
            wp + 1,
            "a write to clean huge run {k} ({res:?}) is a write-protect fault: {:?}",
            pager.stats()
        );
        let dirty: u64 = r
            .residency(k * HUGE, HUGE)
            .unwrap()
            .iter()
            .filter(|(_, s)| *s == Residency::ResidentDirty)
            .map(|(b, _)| b.end - b.start)
            .sum();
        assert_eq!(dirty, folio, "one folio of the run dirty");
        assert_eq!(r.huge_bytes().unwrap() % HUGE, 0);
        written.push((w, 0xFEED_0023));
        r.flush().unwrap();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(upager_testdata::word_at(&data, w * 8), 0xFEED_0023);
    }
    // Random faults keep the folio size: one fill each, no huge page.
    let before = pager.stats();
    r.pageout(0, r.len() as u64 / folio * folio).unwrap();
    let mut x = 0x2323u64;
    for _ in 0..200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = ((x >> 11) % (r.len() as u64 / 8)) as usize;
        let want = written
            .iter()
            .find(|&&(w, _)| w == i)
            .map_or(word(i as u64 * 8, 23), |&(_, v)| v);
        assert_eq!(r.words()[i].load(Relaxed), want, "word {i}");
    }
    let after = pager.stats();
    assert_eq!(
        after.thp_fills, before.thp_fills,
        "random faults filled huge pages"
    );
    // The partial run at the end is read right (base folios).
    let tail = (nruns * HUGE / 8) as usize;
    for i in tail..(len / 8) as usize {
        assert_eq!(
            r.words()[i].load(Relaxed),
            word(i as u64 * 8, 23),
            "tail word {i}"
        );
    }
    // Once more in sequence, the write included.
    scan(&r, 23, &written);
    r.unmap().unwrap();
    assert_eq!(pager.stats().resident_bytes, 0, "{:?}", pager.stats());
}

#[test]
fn sequential_runs_of_4k_folios_fill_huge_and_random_faults_stay_small() {
    mixed_region(4096, true);
}

#[test]
fn sequential_runs_of_64k_folios_fill_huge() {
    mixed_region(64 << 10, true);
}

#[test]
fn huge_runs_off_fills_the_folio_size_only() {
    mixed_region(4096, false);
}

#[test]
fn small_regions_and_regions_with_huge_runs_off_have_none() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 64 * MIB, 24);
    let small = pattern_file(dir.path(), "small", 6 * MIB, 25);
    let pager = Pager::builder()
        .budget(32 * MIB)
        .huge_runs(true)
        .build()
        .unwrap();
    let sm = pager
        .map_file(&small, &MapOptions::new().folio(4096).writable(true))
        .unwrap();
    let off = pager
        .map_file(
            &path,
            &MapOptions::new()
                .folio(4096)
                .writable(true)
                .huge_runs(false),
        )
        .unwrap();
    // Let the reclaimer stage pages (it would for a region with runs).
    std::thread::sleep(std::time::Duration::from_millis(50));
    scan(&sm, 25, &[]);
    scan(&off, 24, &[]);
    assert_eq!(pager.stats().thp_fills, 0, "{:?}", pager.stats());
}

/// The VMAs of /proc/self/maps inside `r`: (start, end, permissions).
fn vmas(r: &Region) -> Vec<(u64, u64, String)> {
    let (lo, hi) = (r.as_ptr() as u64, r.as_ptr() as u64 + r.len() as u64);
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (s, e) = f.next()?.split_once('-')?;
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            (s < hi && e > lo).then(|| (s, e, f.next().unwrap_or("").to_string()))
        })
        .collect()
}

#[test]
fn read_only_regions_fill_huge_runs_and_stay_read_only() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 64 * MIB, 27);
    let pager = Pager::builder()
        .budget(32 * MIB)
        .huge_runs(true)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(4096))
        .unwrap();
    let mut passes = 0;
    wait_until("a huge run fill in a read-only region", 20, || {
        scan(&r, 27, &[]);
        passes += 1;
        passes >= 2 && pager.stats().thp_fills > 0
    });
    let s = pager.stats();
    assert!(s.thp_evictions > 0, "{s:?}");
    assert!(
        s.thp_recycled > 0,
        "huge runs of a read-only region recycled: {s:?}"
    );
    assert_eq!(s.kernel_call_errors, 0, "{s:?}");
    assert!(r.huge_bytes().unwrap() > 0, "{s:?}");
    // The prefetch thread may still be moving the run after the last in
    // (async readahead), writable for that moment: wait until nothing is
    // busy.
    wait_until("the last readahead to finish", 10, || {
        r.residency(0, r.len() as u64)
            .unwrap()
            .iter()
            .all(|(_, s)| *s != Residency::Busy)
    });
    // Every byte of the region is read-only again, in one VMA.
    let v = vmas(&r);
    assert!(
        v.iter().all(|(_, _, p)| p.starts_with("r-")),
        "a writable VMA left in a read-only region: {v:?}"
    );
    // (One VMA per userfaultfd shard: VMAs of two userfaultfds never merge.)
    assert!(
        v.len() <= pager.uffd_shards(),
        "the VMAs split for the moves merged again: {v:?}"
    );
    r.unmap().unwrap();
    assert_eq!(pager.stats().resident_bytes, 0);
}

/// Writers storing into a region while a scanner's sequential faults fill
/// huge runs around them: every store reaches the file (the digest of a
/// huge read fill catches a store that raced its write-protect).
#[test]
fn stores_racing_huge_run_fills_are_kept() {
    stores_racing_huge_fills(|r| {
        for i in (0..r.len() / 8).step_by((PAGE / 8) as usize) {
            let _ = r.words()[i].load(Relaxed);
        }
    });
}

/// The same with the huge runs filled by prefetches of the whole region
/// (ahead.rs: a prefetch fills a whole run as one huge page, the same
/// fill as a stream's window).
#[test]
fn stores_racing_huge_run_prefetches_are_kept() {
    stores_racing_huge_fills(|r| {
        r.prefetch(0, r.len() as u64).unwrap();
        assert!(r.wait_prefetch(std::time::Duration::from_secs(60)));
    });
}

/// A writer's 40,000 stores to random pages of a writable region with
/// huge runs, while `pass` (at least 3 times, until the writer is done)
/// fills runs around them: no store is lost, the budget is held.
fn stores_racing_huge_fills(pass: impl Fn(&Region) + Sync) {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 64 * MIB, 26);
    let pager = Pager::builder()
        .budget(24 * MIB)
        .huge_runs(true)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(16 << 10).writable(true))
        .unwrap();
    let nwords = r.len() / 8;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (stores, passes) = std::thread::scope(|s| {
        let scanner = s.spawn(|| {
            let mut passes = 0u32;
            while passes < 3 || (!stop.load(Relaxed) && passes < 50) {
                pass(&r);
                passes += 1;
            }
            passes
        });
        let writer = s.spawn(|| {
            // Each store to a word of its own (word 1 of every page, a
            // page picked at random), value: the store's number.
            let mut model = std::collections::HashMap::new();
            let mut x = 0x26u64;
            for n in 1..=40_000u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let page = ((x >> 17) % (nwords as u64 / 512)) as usize;
                let w = page * 512 + 1;
                r.words()[w].store(n, Relaxed);
                model.insert(w, n);
            }
            model
        });
        let model = writer.join().unwrap();
        stop.store(true, Relaxed);
        (model, scanner.join().unwrap())
    });
    r.flush().unwrap();
    let data = std::fs::read(&path).unwrap();
    let mut lost = 0;
    for (&w, &v) in &stores {
        if upager_testdata::word_at(&data, w * 8) != v {
            lost += 1;
        }
    }
    let s = pager.stats();
    eprintln!(
        "{passes} passes: {} huge runs filled, {} raced by a store",
        s.thp_fills, s.thp_fill_raced
    );
    assert_eq!(
        lost,
        0,
        "{lost} of {} stores lost ({passes} passes): {s:?}",
        stores.len()
    );
    assert!(s.resident_peak_bytes <= 24 * MIB, "{s:?}");
    r.unmap().unwrap();
}

/// Async readahead with huge runs: a stream's fault fills its run while
/// the prefetch thread fills the next one, two huge fills at once. Every
/// word of every pass reads right, nothing is written back (a read-only
/// pass of a writable region leaves no folio dirty), and the file is as it
/// was. (Found: a run read as zeros and was written back so, 1 in 5
/// passes of 2 GiB in-thread.)
#[test]
fn async_readahead_of_huge_runs_reads_every_word_right_and_writes_nothing() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let len = 256 * MIB;
    let path = pattern_file(dir.path(), "data", len, 41);
    let passes: usize = std::env::var("UPAGER_TEST_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let pager = Pager::builder()
        .budget(48 * MIB)
        .huge_runs(true)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(PAGE).writable(true))
        .unwrap();
    let words = r.words();
    for pass in 0..passes {
        let mut bad = Vec::new();
        // Read every word, as a sum over the array would.
        for (i, w) in words.iter().enumerate() {
            if w.load(Relaxed) != word(i as u64 * 8, 41) && bad.len() < 4 {
                bad.push(i);
            }
        }
        if let Some(&i) = bad.first() {
            let off = i as u64 * 8;
            panic!(
                "pass {pass}: word {i} (offset {off:#x}) reads {:#x}, want {:#x}; bad words from {bad:?}\n{}\n{:?}",
                words[i].load(Relaxed),
                word(off, 41),
                r.folio_trace(off, 2),
                pager.stats()
            );
        }
    }
    let s = pager.stats();
    assert_eq!(s.writebacks, 0, "a read-only pass wrote back: {s:?}");
    assert_eq!(s.thp_fill_raced, 0, "{s:?}");
    assert!(s.readahead_async > 0, "{s:?}");
    drop(r);
    drop(pager);
    let data = std::fs::read(&path).unwrap();
    for (k, c) in data.chunks(8).enumerate() {
        let v = u64::from_le_bytes(c.try_into().unwrap());
        assert_eq!(v, word(k as u64 * 8, 41), "file word {k} changed");
    }
}

/// Whether `[offset, offset + len)` of `r` is resident, every folio of it.
fn resident(r: &Region, offset: u64, len: u64) -> bool {
    r.residency(offset, len)
        .unwrap()
        .iter()
        .all(|(_, s)| matches!(s, Residency::ResidentClean | Residency::ResidentDirty))
}

/// A fetch or prefetch that names whole 2 MiB runs fills each as one huge
/// page, as a stream's readahead window does (ahead.rs: one pipeline for
/// every read ahead; before it, a prefetch filled runs as base pages); a
/// run it names in part stays base folios. Every word reads right.
#[test]
fn fetches_and_prefetches_of_whole_runs_fill_huge_pages() {
    if !thp_available() {
        return;
    }
    let dir = ram_dir();
    let len = 16 * MIB;
    let path = pattern_file(dir.path(), "data", len, 52);
    let pager = Pager::builder()
        .budget(64 * MIB)
        .huge_runs(true)
        .build()
        .unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(PAGE))
        .unwrap();
    let pages = |from: u64, to: u64| (from..to).step_by(PAGE as usize).collect::<Vec<u64>>();
    // Runs 0 and 1 whole, the first half of run 2.
    let mut offsets = pages(0, 2 * HUGE);
    offsets.extend(pages(2 * HUGE, 2 * HUGE + MIB));
    // The reclaimer stages huge pages a moment after the map; a run
    // filled before that goes in as base pages (`thp_fill_fallback`), and
    // is paged out for another try.
    wait_until("a fetch of whole runs filling huge pages", 20, || {
        r.pageout(0, len).unwrap();
        assert_eq!(r.fetch(&offsets).unwrap(), 2 * HUGE / PAGE + MIB / PAGE);
        huge(&r, 0) && huge(&r, 1)
    });
    assert!(resident(&r, 0, 2 * HUGE + MIB));
    assert!(!huge(&r, 2), "a run named in part went in huge");
    let rest = r.residency(2 * HUGE + MIB, MIB).unwrap();
    assert!(
        rest.iter()
            .all(|(_, s)| matches!(s, Residency::Evicted | Residency::NeverTouched)),
        "the fetch read past what it named: {rest:?}"
    );
    // A prefetch (the prefetch thread) of runs 4 and 5.
    wait_until("a prefetch of whole runs filling huge pages", 20, || {
        r.pageout(4 * HUGE, 2 * HUGE).unwrap();
        r.prefetch(4 * HUGE, 2 * HUGE).unwrap();
        wait_until("the prefetch", 10, || resident(&r, 4 * HUGE, 2 * HUGE));
        huge(&r, 4) && huge(&r, 5)
    });
    let s = pager.stats();
    assert!(s.thp_fills >= 4, "{s:?}");
    assert_eq!(s.kernel_call_errors, 0, "{s:?}");
    scan(&r, 52, &[]);
    assert!(s.resident_peak_bytes <= 64 * MIB, "{s:?}");
}
