//! TLB shootdowns of 2 MiB fills, counted from outside the
//! engine like tests/tlb.rs: `tlb:tlb_flush` "remote ipi send" events of
//! this process's threads while a spinner keeps the address space live on
//! the other CPU. A read fill of a file-backed writable region makes two
//! flushing calls: the move (the kernel clears the staged page's PMD with a
//! flush) and the write-protect of the clean folio. Its view is
//! `MADV_HUGEPAGE`, so the missing read fault leaves no page table and
//! none is dropped (a third flush per fill before: 783 page-table drops in
//! a 1,024-fill scan, 2026-11-25).
//!
//! The only test in this binary, so the thread set traced is ours alone.

#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::*;
use upager::{MapOptions, Pager};

const MIB: u64 = 1 << 20;

#[test]
fn a_huge_read_fill_costs_at_most_two_shootdowns() {
    if upager_sys::io::online_cpus() < 2 {
        skip_or_fail("fewer than two online CPUs: no remote shootdown to count");
        return;
    }
    if masked("uffd_move") || masked("pagemap_scan") {
        eprintln!(
            "skipped: huge pages do not move into views with uffd_move or pagemap_scan masked"
        );
        return;
    }
    let enabled =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if enabled.is_empty() || enabled.contains("[never]") {
        skip_or_fail("transparent huge pages are off");
        return;
    }
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 128 * MIB, 7);
    // 32 MiB: two staged pages (an eighth of the budget each 16 MiB).
    let pager = Pager::builder().budget(32 * MIB).build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(2 * MIB).writable(true))
        .unwrap();
    let spinner = Spinner::start();
    let Some(trace) = TlbTrace::start(&my_tids()) else {
        return; // reported by TlbTrace::start (a failure under CI)
    };
    let mut bad = 0u64;
    for w in (0..r.len() / 8).step_by(512) {
        bad += u64::from(r.words()[w].load(Relaxed) != word(w as u64 * 8, 7));
    }
    let ipis = trace.stop();
    drop(spinner);
    let s = pager.stats();
    eprintln!(
        "{ipis} IPI sends: {} huge fills, {} copied, {} evictions in {} batches, {} recycled",
        s.thp_fills, s.thp_fill_fallback, s.evictions, s.evict_batches, s.thp_recycled
    );
    assert_eq!(bad, 0, "words read back wrong");
    assert!(
        s.thp_fills >= 16,
        "most fills should move a huge page: {} of 64",
        s.thp_fills
    );
    // Per huge fill: move + write-protect. A copied fill flushes nothing,
    // but the next huge fill of that folio drops its page table (one);
    // each eviction batch of clean folios: one. Twelve of slack for the
    // staging pool and the region's setup.
    // A huge page recycled by eviction (moved out into a staging slot):
    // one more.
    let bound = 2 * s.thp_fills + s.thp_fill_fallback + s.evict_batches + s.thp_recycled + 12;
    assert!(
        ipis <= bound,
        "{ipis} shootdowns for {} huge fills (bound {bound}: a page table dropped before each move?)",
        s.thp_fills
    );
    // The count is not blind: every move flushes (fewer when the kernel
    // skips a CPU that is not running this address space, on a loaded
    // machine: see tests/tlb.rs).
    assert!(
        ipis * 16 >= s.thp_fills,
        "{ipis} shootdowns for {} huge fills: is the tracepoint counting?",
        s.thp_fills
    );
}
