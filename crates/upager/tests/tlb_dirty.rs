//! TLB shootdowns of eviction batches that carry dirty data,
//! counted from outside the engine (`tlb:tlb_flush`, reason "remote ipi
//! send", this process's threads) while a second thread keeps the address
//! space live on the other CPU.
//!
//! The batch contract (`gather`): one flush to unmap a batch, plus one per
//! span of dirty victims to write-protect them before write-back (dirty
//! victims of a region less than 16 MiB apart share a span). So:
//! - dirty data written in order: 2 flushes per batch;
//! - dirty data scattered over a region: 1 + spans per batch, every one of
//!   them a call the engine counts (`tlb_flush_batches`, `wp_unprotects`).
//!
//! The only test in this binary, so the thread set traced is ours alone.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::*;
use upager::{MapOptions, Pager, Stats};

const MIB: u64 = 1 << 20;

/// Writes one word per 64 KiB folio of a sparse file of `len` bytes
/// through a 16 MiB budget (`stride` folios apart, wrapping, so every folio
/// is written once) with a spinner on the other CPU; returns (IPI sends,
/// engine counters).
fn run(len: u64, stride: usize, batch: Option<usize>) -> Option<(u64, Stats)> {
    let dir = ram_dir();
    let path = dir.path().join("sparse");
    std::fs::File::create(&path).unwrap().set_len(len).unwrap();
    let mut b = Pager::builder().budget(16 * MIB);
    if let Some(n) = batch {
        // Small batches of far-apart victims; no dirty limit, so the
        // batches are evictions (cleaning batches are 4 MiB).
        b = b.batch(n).dirty_limit(16 * MIB);
    }
    let pager = b.build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(64 << 10))
        .unwrap();
    let spinner = Spinner::start();
    // None: no tracefs, reported by TlbTrace::start (a failure under CI).
    let trace = TlbTrace::start(&my_tids())?;
    let folios = r.len() / (64 << 10);
    let words_per_folio = (64 << 10) / 8;
    for k in 0..folios {
        let f = (k * stride) % folios;
        r.words()[f * words_per_folio].store(f as u64 + 1, Relaxed);
    }
    r.flush().unwrap();
    let ipis = trace.stop();
    drop(spinner);
    let s = pager.stats();
    eprintln!(
        "{} MiB, stride {stride}: {ipis} IPI sends, {} evict batches, {} evictions, {} flush calls, \
         {} unprotects, {} writebacks",
        len >> 20,
        s.evict_batches, s.evictions, s.tlb_flush_batches, s.wp_unprotects, s.writebacks
    );
    Some((ipis, s))
}

#[test]
fn dirty_batches_cost_two_shootdowns_in_order_and_one_per_span_scattered() {
    if upager_sys::io::online_cpus() < 2 {
        skip_or_fail("this test needs two online CPUs to see remote shootdowns");
        return;
    }
    if !unmap_is_batched() {
        // One madvise per range: tests/tlb.rs checks that cost
        // is counted; the per-batch bounds here do not apply.
        eprintln!("skipped: process_madvise refused or masked");
        return;
    }
    // In order: each batch's dirty victims are one span. (Before write
    // faults stopped reading ahead, this wrote 2,048 folios with 2,042
    // shootdowns: every read-ahead folio was write-protected, so each
    // write paid an unprotect flush; now 52.)
    let Some((ipis, s)) = run(128 * MIB, 1, None) else {
        return;
    };
    assert!(s.evict_batches >= 20 && s.writebacks >= 1500, "{s:?}");
    assert!(
        ipis <= 2 * (s.evict_batches + s.flushes) + 8,
        "{ipis} shootdowns for {} batches of in-order dirty data",
        s.evict_batches
    );
    // Scattered: batches of 8 folios written 331 folios (21 MiB) apart over
    // 512 MiB, so an eviction batch's dirty victims can be more than 16 MiB
    // apart, a span each: at most 1 + 8 flushes per batch. (The background
    // cleaner writes dirty folios back in 4 MiB batches, sorted, so most of
    // them are one span; measured 1,552 flush calls for 996 batches.) Every
    // shootdown is a call the engine counts.
    let (ipis, s) = run(512 * MIB, 331, Some(8)).expect("tracefs went away");
    assert!(s.evict_batches >= 100, "{s:?}");
    assert!(
        s.tlb_flush_batches <= 9 * (s.evict_batches + s.flushes + s.dirty_throttled) + 64,
        "more than 1 + 8 flush calls per batch: {s:?}"
    );
    assert!(
        ipis <= s.tlb_flush_batches + s.wp_unprotects + 8,
        "{ipis} shootdowns, {} counted calls",
        s.tlb_flush_batches + s.wp_unprotects
    );
}
