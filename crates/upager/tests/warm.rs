//! Warm starts (warm.rs): a file region records the order its folios are
//! first needed beside the file, and the next map replays it as prefetch —
//! fewer faults, the same data, the budget held; a stale trace is not
//! trusted, and a program that goes elsewhere stops the replay.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::*;
use upager::{MapOptions, Pager, Region, Stats, WarmStart};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
const SEED: u64 = 31;

/// `n` distinct folio indices of a `folios`-folio file in a scattered
/// order (a fixed gather), from `salt`.
fn gather(n: usize, folios: u64, salt: u64) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(n);
    let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let idx = x % folios;
        if seen.insert(idx) {
            out.push(idx);
        }
    }
    out
}

/// Maps `path` with `how`, reads one word of each folio of `order` in
/// that order (with a little work per folio, as a program has), checks
/// it, unmaps; the pager's counters.
fn run(path: &Path, budget: u64, how: WarmStart, order: &[u64]) -> Stats {
    run_on(Pager::new(budget).unwrap(), path, budget, how, order)
}

/// [`run`] on a pager of the caller's.
fn run_on(pager: Pager, path: &Path, budget: u64, how: WarmStart, order: &[u64]) -> Stats {
    let r = pager.map_file(path, &MapOptions::new().warm(how)).unwrap();
    touch_and_unmap(&pager, r, budget, how, order)
}

/// Reads one word of each folio of `order` in `r` in that order (with a
/// little work per folio, as a program has), checks it, unmaps; the
/// pager's counters.
fn touch_and_unmap(pager: &Pager, r: Region, budget: u64, how: WarmStart, order: &[u64]) -> Stats {
    for &idx in order {
        let w = (idx * PAGE / 8) as usize;
        assert_eq!(
            r.words()[w].load(Relaxed),
            word(idx * PAGE, SEED),
            "folio {idx}"
        );
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(20) {
            std::hint::spin_loop();
        }
    }
    r.unmap().map_err(|(e, _)| e).unwrap();
    let s = pager.stats();
    eprintln!(
        "{how:?}: {} faults, {} replay reads ({} hits, {} wasted), peak {} KiB",
        s.faults_missing,
        s.replay_reads,
        s.replay_hits,
        s.replay_wasted,
        s.resident_peak_bytes >> 10
    );
    assert!(s.resident_peak_bytes <= budget, "budget held: {s:?}");
    s
}

/// A run of a 3,000-folio gather replayed from its trace (`warm`) against
/// the same gather cold: replay read most of it, the faults fell to a
/// quarter or less.
fn assert_replayed(cold: &Stats, warm: &Stats) {
    assert!(
        warm.replay_reads >= 2000,
        "replay read most of the gather: {warm:?}"
    );
    assert!(
        warm.faults_missing * 4 <= cold.faults_missing,
        "faults: {} cold, {} replayed",
        cold.faults_missing,
        warm.faults_missing
    );
}

#[test]
fn a_replayed_trace_prefetches_a_gather_in_recorded_order() {
    let dir = ram_dir();
    let len = 64 * MIB;
    let path = pattern_file(dir.path(), "data", len, SEED);
    let trace = upager::trace_path(&path);
    let order = gather(3000, len / PAGE, 1);
    let budget = 16 * MIB;

    let cold = run(&path, budget, WarmStart::Auto, &order);
    assert!(trace.exists(), "the first map recorded a trace");
    assert_eq!(cold.replay_reads, 0, "{cold:?}");
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(
        size < 3000 * 4 + 128,
        "delta-encoded: {size} bytes for 3000 folios"
    );

    let warm = run(&path, budget, WarmStart::Auto, &order);
    assert_replayed(&cold, &warm);
    // Hits are the trace's progress: folios replayed past the program's
    // last fault count as neither hits nor waste.
    assert!(warm.replay_hits >= warm.replay_reads / 2, "{warm:?}");
    assert!(warm.replay_wasted <= warm.replay_reads / 10, "{warm:?}");
}

/// From a local file, a long sequential run of the trace is left to
/// readahead (the program's faults stream it as on demand); replay reads
/// the scattered folios only. (Default readahead 2 MiB: runs of 512 folios
/// and more are readahead's.)
#[test]
fn a_replay_from_a_file_leaves_long_runs_to_readahead() {
    let dir = ram_dir();
    let len = 64 * MIB;
    let path = pattern_file(dir.path(), "data", len, SEED);
    let scattered = gather(1000, len / PAGE / 2, 3);
    // The scattered folios in the first half, then 8 MiB of the second
    // half in order.
    let run_start = len / PAGE / 2;
    let order: Vec<u64> = scattered
        .iter()
        .copied()
        .chain(run_start..run_start + 8 * MIB / PAGE)
        .collect();
    let budget = 32 * MIB;
    let cold = run(&path, budget, WarmStart::Auto, &order);
    assert_eq!(cold.replay_reads, 0, "{cold:?}");
    let warm = run(&path, budget, WarmStart::Auto, &order);
    // The scattered ones are read by replay (give or take a window's
    // marker, and neighbours a cold fault's window read), the run's 2,048
    // folios are not (measured: 1,006).
    assert!(
        (800..1200).contains(&warm.replay_reads),
        "replay read the scattered folios, not the run: {warm:?}"
    );
    assert!(
        warm.faults_missing < cold.faults_missing,
        "faults: {} cold, {} replayed",
        cold.faults_missing,
        warm.faults_missing
    );
    // Readahead off: nothing would stream the run, so replay reads it too.
    let off = Pager::builder()
        .budget(budget)
        .readahead(0)
        .build()
        .unwrap();
    let all = run_on(off, &path, budget, WarmStart::Auto, &order);
    assert!(
        all.replay_reads >= 2800,
        "readahead off: replay read the run as well: {all:?}"
    );
}

/// A region mapped from an open descriptor (`Pager::map_open_file`: the C
/// API's `upager_map_fd`, UMap's `umap()`) keeps its trace beside the file
/// the descriptor was opened by; a descriptor of a deleted file keeps none.
#[test]
fn an_open_descriptor_keeps_its_trace_beside_its_file() {
    let dir = ram_dir();
    let len = 32 * MIB;
    let path = pattern_file(dir.path(), "data", len, SEED);
    let trace = upager::trace_path(&path);
    let order = gather(1500, len / PAGE, 4);
    let budget = 8 * MIB;
    let by_fd = |how: WarmStart| {
        let pager = Pager::new(budget).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let r = pager
            .map_open_file(file, &MapOptions::new().warm(how))
            .unwrap();
        touch_and_unmap(&pager, r, budget, how, &order)
    };
    let cold = by_fd(WarmStart::Auto);
    assert_eq!(cold.replay_reads, 0, "{cold:?}");
    assert!(trace.exists(), "recorded beside {}", path.display());
    let warm = by_fd(WarmStart::Auto);
    assert!(
        warm.replay_reads >= 1000 && warm.faults_missing * 4 <= cold.faults_missing,
        "replayed: {cold:?} then {warm:?}"
    );
    // The trace is the file's, whichever way it is mapped.
    let by_path = run(&path, budget, WarmStart::Auto, &order);
    assert!(by_path.replay_reads >= 1000, "{by_path:?}");

    // A deleted file has no path to keep a trace by: mapped, no trace.
    std::fs::remove_file(&trace).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let pager = Pager::new(budget).unwrap();
    let r = pager
        .map_open_file(file, &MapOptions::new().warm(WarmStart::Auto))
        .unwrap();
    let s = touch_and_unmap(&pager, r, budget, WarmStart::Auto, &order);
    assert_eq!(s.replay_reads, 0);
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing written for a deleted file"
    );
}

#[test]
fn a_trace_of_other_data_is_not_replayed() {
    let dir = ram_dir();
    let len = 16 * MIB;
    let path = pattern_file(dir.path(), "data", len, SEED);
    let order = gather(500, len / PAGE, 2);
    run(&path, 8 * MIB, WarmStart::Auto, &order);
    let trace = upager::trace_path(&path);
    let recorded = std::fs::read(&trace).unwrap();

    // The file rewritten (same bytes, new mtime): the trace is stale.
    std::thread::sleep(Duration::from_millis(20));
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let s = run(&path, 8 * MIB, WarmStart::Auto, &order);
    assert_eq!(s.replay_reads, 0, "a stale trace is not replayed: {s:?}");
    assert_ne!(std::fs::read(&trace).unwrap(), recorded, "recorded anew");

    // Damaged: ignored, recorded anew.
    std::fs::write(&trace, b"UPGTRC01 not a trace").unwrap();
    let s = run(&path, 8 * MIB, WarmStart::Auto, &order);
    assert_eq!(s.replay_reads, 0, "{s:?}");
    assert!(std::fs::read(&trace).unwrap().len() > 64);

    // Another folio size is another region.
    let pager = Pager::new(8 * MIB).unwrap();
    let r = pager
        .map_file(
            &path,
            &MapOptions::new().folio(64 << 10).warm(WarmStart::Auto),
        )
        .unwrap();
    assert_eq!(r.words()[0].load(Relaxed), word(0, SEED));
    drop(r);
    assert_eq!(pager.stats().replay_reads, 0);

    // Off: neither read nor written.
    std::fs::remove_file(&trace).unwrap();
    run(&path, 8 * MIB, WarmStart::Off, &order);
    assert!(!trace.exists());
}

/// A program on other inputs stops the replay after its first windows,
/// and its own order replaces the trace for the next map.
#[test]
fn a_program_that_goes_elsewhere_stops_the_replay() {
    let dir = ram_dir();
    let len = 64 * MIB;
    let path = pattern_file(dir.path(), "data", len, SEED);
    let budget = 16 * MIB;
    run(&path, budget, WarmStart::Auto, &gather(3000, len / PAGE, 3));
    // Other inputs: another gather of the same file.
    let other = gather(3000, len / PAGE, 4);
    let cold = run(&path, budget, WarmStart::Off, &other);
    let s = run(&path, budget, WarmStart::Auto, &other);
    let window = budget / 4 / PAGE; // most folios in a replay window
    assert!(
        s.replay_reads <= 2 * window,
        "at most the first windows are read: {s:?}"
    );
    assert!(
        s.faults_missing + 2 * window >= cold.faults_missing,
        "the program's own faults are not avoided: {} against {} cold",
        s.faults_missing,
        cold.faults_missing
    );
    // The run that left the trace recorded its own order in its place:
    // the next map on these inputs replays it.
    let again = run(&path, budget, WarmStart::Auto, &other);
    assert_replayed(&cold, &again);
}

/// Replay on a writable region (the no-lost-write invariant): words
/// written under a recorded map and a replayed one, with the budget
/// evicting dirty folios meanwhile, are all in the file after unmap, and
/// the region's own writes leave the trace valid (recorded after the flush).
#[test]
fn a_writable_region_keeps_its_writes_under_replay() {
    let dir = ram_dir();
    let len = 32 * MIB;
    let path = pattern_file(dir.path(), "data", len, SEED);
    let order = gather(2000, len / PAGE, 5);
    for (round, want_replay) in [(1u64, false), (2, true)] {
        let pager = Pager::new(4 * MIB).unwrap();
        let r = pager
            .map_file(
                &path,
                &MapOptions::new().writable(true).warm(WarmStart::Auto),
            )
            .unwrap();
        if want_replay {
            // Replay reads its first window at the map: let it start
            // before the writes, which are its point (under load the
            // 2,000 in-thread faults could all come before the prefetch
            // thread ran at all: replay_reads 0, seen once in the suite).
            let t = Instant::now();
            while pager.stats().replay_reads == 0 {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "round {round}: replay never started: {:?}",
                    pager.stats()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for &idx in &order {
            r.words()[(idx * PAGE / 8) as usize].store(round << 56 | idx, Relaxed);
        }
        r.unmap().map_err(|(e, _)| e).unwrap();
        let s = pager.stats();
        assert_eq!(s.replay_reads > 0, want_replay, "round {round}: {s:?}");
        assert!(s.resident_peak_bytes <= 4 * MIB, "{s:?}");
        let bytes = std::fs::read(&path).unwrap();
        for &idx in &order {
            let o = (idx * PAGE) as usize;
            let got = u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
            assert_eq!(got, round << 56 | idx, "round {round}, folio {idx}");
        }
    }
}
