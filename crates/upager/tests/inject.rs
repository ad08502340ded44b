//! Kernel calls that fail or stop short, injected with
//! `upager_sys::inject` (feature `fail-inject`, on for these tests only):
//! a refused `UFFDIO_WRITEPROTECT`, a short `process_madvise`, a
//! `UFFDIO_COPY` that stops after one page. Each test checks that no store
//! is lost, that a flush that returns Ok left everything in the file, and
//! that the engine recovers once the kernel behaves.
//!
//! The knobs are process-wide: the tests here take turns (`LOCK`), and no
//! other test binary enables them.

#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use common::*;
use upager::{MapOptions, Pager, Region, Residency};
use upager_sys::inject::{self, Call};

const MIB: u64 = 1 << 20;

/// One test at a time (the knobs are global).
static LOCK: Mutex<()> = Mutex::new(());

/// Takes the lock; every knob is off when the guard goes, also after a
/// failed assertion.
struct Turn(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Turn {
    fn take() -> Turn {
        Turn(LOCK.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        for c in [Call::WriteProtect, Call::ProcessMadvise, Call::Copy] {
            inject::set(c, 0);
        }
    }
}

fn pager(budget: u64) -> Pager {
    Pager::builder()
        .budget(budget)
        .build()
        .expect("pager (needs /dev/userfaultfd: run as root)")
}

fn file_words(path: &std::path::Path) -> Vec<u64> {
    std::fs::read(path)
        .unwrap()
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn store_words(r: &Region, expect: &mut [u64], step: usize, v: impl Fn(usize) -> u64) {
    for w in (0..expect.len()).step_by(step) {
        r.words()[w].store(v(w), Relaxed);
        expect[w] = v(w);
    }
}

/// A refused write-protect before write-back: the folios may still be
/// writable, so they are neither written back nor called clean, and the
/// flush says so (Err), the file untouched; with the kernel behaving again
/// the next flush writes everything.
#[test]
fn a_refused_write_protect_fails_the_flush_and_keeps_every_store() {
    let _t = Turn::take();
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 7);
    let pager = pager(16 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(16 << 10))
        .unwrap();
    let original = file_words(&path);
    let mut expect = original.clone();
    store_words(&r, &mut expect, 97, |w| 0xA000_0000_0000_0000 | w as u64);
    let errors0 = pager.stats().kernel_call_errors;
    inject::set(Call::WriteProtect, 1);
    let h0 = inject::hits(Call::WriteProtect);
    let e = r
        .flush()
        .expect_err("a flush whose write-protect was refused");
    let msg = e.to_string();
    assert!(
        msg.contains("write-protect"),
        "the error names the refused step: {msg}"
    );
    assert!(inject::hits(Call::WriteProtect) > h0);
    assert!(pager.stats().kernel_call_errors > errors0);
    assert_eq!(
        file_words(&path),
        original,
        "nothing written while writable"
    );
    // Stores after the refusal land too.
    store_words(&r, &mut expect, 89, |w| 0xB000_0000_0000_0000 | w as u64);
    inject::set(Call::WriteProtect, 0);
    r.flush().unwrap();
    assert_eq!(file_words(&path), expect);
    for (w, &x) in expect.iter().enumerate().step_by(13) {
        assert_eq!(r.words()[w].load(Relaxed), x, "word {w} in memory");
    }
    r.unmap().unwrap();
}

/// Eviction whose `process_madvise` advises only half its ranges (every
/// other call, then every call for an explicit pageout): the retry or the
/// folios that stay resident (clean, written back) lose nothing, and the
/// budget holds once the kernel behaves.
#[test]
fn a_short_process_madvise_keeps_the_folios_and_loses_nothing() {
    let _t = Turn::take();
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 32 * MIB, 8);
    let budget = 4 * MIB;
    let pager = pager(budget);
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(16 << 10))
        .unwrap();
    let mut expect = file_words(&path);
    let h0 = inject::hits(Call::ProcessMadvise);
    inject::set(Call::ProcessMadvise, 2);
    // 32 MiB through a 4 MiB budget: evictions all the way.
    store_words(&r, &mut expect, 61, |w| 0xC000_0000_0000_0000 | w as u64);
    for (w, &x) in expect.iter().enumerate().step_by(29) {
        assert_eq!(r.words()[w].load(Relaxed), x, "word {w}");
    }
    assert!(inject::hits(Call::ProcessMadvise) > h0, "injected");
    assert!(pager.stats().evictions > 0);
    // Every call short: a pageout cannot unmap; the folios stay, readable
    // without a fault. (Only the resident ones are read: a fault on another
    // would need room that no eviction can make while every unmap fails,
    // and fails by design — SIGBUS — instead of hanging.)
    r.flush().unwrap();
    let resident: Vec<std::ops::Range<u64>> = r
        .residency(0, r.len() as u64)
        .unwrap()
        .into_iter()
        .filter(|(_, st)| matches!(st, Residency::ResidentClean | Residency::ResidentDirty))
        .map(|(range, _)| range)
        .collect();
    assert!(!resident.is_empty());
    inject::set(Call::ProcessMadvise, 1);
    for range in &resident {
        let _ = r.pageout(range.start, range.end - range.start);
    }
    for range in &resident {
        for w in (range.start / 8..range.end / 8).step_by(31) {
            let w = w as usize;
            assert_eq!(
                r.words()[w].load(Relaxed),
                expect[w],
                "word {w} after a refused pageout"
            );
        }
        assert!(
            r.residency(range.start, range.end - range.start)
                .unwrap()
                .iter()
                .all(|(_, st)| matches!(st, Residency::ResidentClean | Residency::ResidentDirty)),
            "a folio the kernel did not unmap stays resident"
        );
    }
    inject::set(Call::ProcessMadvise, 0);
    store_words(&r, &mut expect, 53, |w| 0xD000_0000_0000_0000 | w as u64);
    r.flush().unwrap();
    assert_eq!(file_words(&path), expect);
    let s = pager.stats();
    assert!(
        s.resident_bytes <= budget,
        "resident {} over budget {budget}",
        s.resident_bytes
    );
    let mapped = resident_pages(r.as_ptr() as u64, r.len() as u64) * 4096;
    assert!(
        mapped <= budget + 4 * MIB,
        "{mapped} bytes mapped, budget {budget}"
    );
    r.unmap().unwrap();
}

/// Fills whose `UFFDIO_COPY` stops after one page (every other copy of a
/// 64 KiB folio): the engine installs the rest. Two threads store into the
/// same folios meanwhile (a store can land in the installed part of a
/// write fill before the rest is in); every store is in memory and, after
/// a flush, in the file — in both fault modes.
#[test]
fn copies_that_stop_after_one_page_lose_no_store() {
    let _t = Turn::take();
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 16 * MIB, 9);
    let pager = pager(4 * MIB);
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true).folio(64 << 10))
        .unwrap();
    let mut expect = file_words(&path);
    let words = expect.len();
    let h0 = inject::hits(Call::Copy);
    inject::set(Call::Copy, 2);
    for round in 0..3u64 {
        let v = |w: usize| (round + 1) << 56 | w as u64;
        std::thread::scope(|s| {
            for t in 0..2 {
                let r = &r;
                s.spawn(move || {
                    // Interleaved words of every folio, one thread each.
                    for w in (t..words).step_by(2 * 37) {
                        r.words()[w].store(v(w), Relaxed);
                    }
                });
            }
        });
        for t in 0..2 {
            for w in (t..words).step_by(2 * 37) {
                expect[w] = v(w);
            }
        }
        for (w, &x) in expect.iter().enumerate() {
            assert_eq!(r.words()[w].load(Relaxed), x, "round {round}, word {w}");
        }
        r.flush().unwrap();
        assert_eq!(file_words(&path), expect, "round {round}: file");
    }
    assert!(inject::hits(Call::Copy) > h0, "injected");
    inject::set(Call::Copy, 0);
    assert_eq!(pager.stats().writes_lost, 0);
    r.unmap().unwrap();
}
