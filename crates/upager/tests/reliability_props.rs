//! Hostile input: property tests over the public API's arguments
//! (budgets, batches, thread counts, readahead, folio sizes, offsets,
//! lengths, ranges) — every call works or returns a clear error and leaves
//! the pager usable — and a reference model (a `Vec<u8>` per region) of
//! operation sequences: map, write, read, flush, pageout, discard, unmap and
//! map again, under a budget small enough that eviction runs all the time.
//! Arguments that crash the process are probed in child processes.
//!
//! Case counts: `UPAGER_PROP_CASES` (default: a CI-sized number per test).

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use upager::{AdviseError, MapError, MapOptions, Pager, PagerError, RangeError, Region};

const MIB: u64 = 1 << 20;

fn cases(default: u32) -> Config {
    let n = std::env::var("UPAGER_PROP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases: n,
        // Failures are printed with their minimal input; do not write
        // regression files into the source tree from CI.
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

/// A pattern file shared by the cases (created once per process). Statics
/// are never dropped, so the file is unlinked at once and reached through
/// its open descriptor (/proc/self/fd/N): nothing is left behind in
/// /dev/shm when the test binary exits.
fn data_file() -> &'static Path {
    use std::os::fd::AsRawFd;
    use std::sync::OnceLock;
    static PATH: OnceLock<(std::fs::File, PathBuf)> = OnceLock::new();
    let (_, path) = PATH.get_or_init(|| {
        let d = ram_dir();
        // 3 MiB + 1000 bytes: a short last folio at every folio size.
        let p = pattern_file(d.path(), "data", 3 * MIB + 1000, 61);
        let f = std::fs::File::open(&p).unwrap();
        let path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        (f, path)
    });
    path
}

fn file_len() -> u64 {
    std::fs::metadata(data_file()).unwrap().len()
}

/// Folio sizes worth trying: every power of two from 1 byte to 32 MiB, 0,
/// odd values, huge values.
fn folio() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (12u32..=21).prop_map(|s| 1u64 << s),
        1 => (0u32..64).prop_map(|s| 1u64 << s),
        1 => any::<u64>(),
        1 => Just(0u64),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..8 * MIB,
        1 => (0u32..64).prop_map(|s| 1u64 << s),
        1 => (0u32..64).prop_map(|s| (1u64 << s) - 1),
        1 => any::<u64>(),
    ]
}

/// A pager must still work after whatever happened: map the pattern file,
/// read both ends, unmap; map anonymous memory, write and read it back.
fn assert_usable(pager: &Pager) {
    let r = pager
        .map_file(data_file(), &MapOptions::new().folio(4096))
        .expect("pager still maps files");
    let last = r.len() / 8 - 1;
    assert_eq!(r.words()[0].load(Relaxed), word(0, 61));
    assert_eq!(r.words()[last].load(Relaxed), word(last as u64 * 8, 61));
    r.unmap().unwrap();
    let a = pager
        .map_anonymous(MIB, &MapOptions::new().folio(4096))
        .expect("pager still maps anonymous memory");
    a.words()[100].store(5, Relaxed);
    assert_eq!(a.words()[100].load(Relaxed), 5);
    a.unmap().unwrap();
}

/// One pager for the argument tests (its budget fits every folio size's batch).
fn shared_pager() -> &'static Pager {
    use std::sync::OnceLock;
    static P: OnceLock<Pager> = OnceLock::new();
    P.get_or_init(|| Pager::builder().budget(64 * MIB).batch(8).build().unwrap())
}

proptest! {
    #![proptest_config(cases(64))]

    /// Builder arguments: Ok, or the documented error for the bad one.
    #[test]
    fn builder_arguments_work_or_are_refused_clearly(
        budget in prop_oneof![0u64..64 * MIB, Just(u64::MAX), (0u32..64).prop_map(|s| 1u64 << s)],
        batch in proptest::option::of(prop_oneof![0usize..1100, Just(usize::MAX)]),
        threads in prop_oneof![0usize..70, Just(usize::MAX)],
        readahead in prop_oneof![0u64..8 * MIB, Just(0u64)],
        background in any::<bool>(),
        batched in any::<bool>(),
    ) {
        let mut b = Pager::builder()
            .budget(budget)
            .handler_threads(threads)
            .readahead(readahead)
            .background_reclaim(background)
            .batched_removal(batched);
        if let Some(n) = batch {
            b = b.batch(n);
        }
        match b.build() {
            Ok(p) => {
                prop_assert!(budget >= 4096 && (1..=64).contains(&threads));
                prop_assert!(batch.is_none_or(|n| (1..=1024).contains(&n)));
                prop_assert_eq!(p.budget(), budget);
                // A region whose batch does not fit the budget is refused.
                match p.map_file(data_file(), &MapOptions::new().folio(4096)) {
                    Ok(r) => {
                        let last = r.len() / 8 - 1;
                        prop_assert_eq!(r.words()[last].load(Relaxed), word(last as u64 * 8, 61));
                        for w in (0..r.len() / 8).step_by(4096) {
                            prop_assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 61));
                        }
                        prop_assert!(p.stats().resident_peak_bytes <= budget);
                    }
                    Err(e) => {
                        prop_assert!(matches!(e, MapError::BudgetBelowBatch { .. }), "{}", e);
                        prop_assert!(e.to_string().contains("raise the budget"));
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.is_empty());
                match e {
                    PagerError::BudgetTooSmall(b) => prop_assert!(b < 4096 && b == budget),
                    PagerError::HandlerThreads(n) => prop_assert!(n == threads && !(1..=64).contains(&n)),
                    PagerError::Batch(n) => prop_assert!(Some(n) == batch && !(1..=1024).contains(&n)),
                    other => prop_assert!(false, "unexpected error {other}"),
                }
            }
        }
    }

    /// map_file / map_anonymous arguments.
    #[test]
    fn map_arguments_work_or_are_refused_clearly(
        folio in folio(),
        offset in prop_oneof![3 => (0u64..64).prop_map(|k| k * 65536), 1 => size()],
        len in proptest::option::of(size()),
        writable in any::<bool>(),
        anon_len in prop_oneof![1u64..4 * MIB, (0u32..35).prop_map(|s| 1u64 << s), Just(0u64)],
    ) {
        let pager = shared_pager();
        let flen = file_len();
        let mut o = MapOptions::new().folio(folio).offset(offset).writable(writable);
        if let Some(l) = len {
            o = o.len(l);
        }
        let good_folio = folio.is_power_of_two() && (4096..=2 * MIB).contains(&folio);
        match pager.map_file(data_file(), &o) {
            Ok(r) => {
                prop_assert!(good_folio && offset % folio == 0);
                let want_len = len.unwrap_or(flen - offset);
                prop_assert_eq!(r.len() as u64, want_len);
                prop_assert!(offset + want_len <= flen);
                // First and last whole word read the file's bytes.
                let mut b = [0u8; 8];
                if r.len() >= 8 {
                    r.read_at(0, &mut b);
                    prop_assert_eq!(&b[..], &std::fs::read(data_file()).unwrap()[offset as usize..][..8]);
                }
                let mut last = [0u8; 1];
                r.read_at(r.len() - 1, &mut last);
                prop_assert_eq!(last[0], std::fs::read(data_file()).unwrap()[(offset + want_len - 1) as usize]);
                r.unmap().unwrap();
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.is_empty());
                let ok_variant = match &e {
                    MapError::FolioSize(f) => *f == folio && !good_folio,
                    MapError::OffsetNotAligned { .. } => good_folio && offset % folio != 0,
                    MapError::ZeroSize => len == Some(0) || (len.is_none() && offset >= flen),
                    MapError::BeyondEnd { .. } => len.is_none_or(|l| offset.checked_add(l).is_none_or(|e| e > flen)),
                    _ => false,
                };
                prop_assert!(ok_variant, "folio {} offset {} len {:?}: unexpected {:?}", folio, offset, len, e);
            }
        }
        match pager.map_anonymous(anon_len, &MapOptions::new().folio(folio)) {
            Ok(a) => {
                prop_assert!(good_folio && anon_len > 0);
                prop_assert_eq!(a.len() as u64, anon_len);
                let last = a.len() - 1;
                prop_assert_eq!(a.bytes()[0].load(Relaxed), 0);
                a.bytes()[last].store(9, Relaxed);
                prop_assert_eq!(a.bytes()[last].load(Relaxed), 9);
                a.unmap().unwrap();
            }
            Err(e) => {
                prop_assert!(
                    matches!(e, MapError::FolioSize(_) if !good_folio)
                        || matches!(e, MapError::ZeroSize if anon_len == 0),
                    "anonymous {} folio {}: {:?}", anon_len, folio, e
                );
            }
        }
        prop_assert_eq!(pager.stats().resident_bytes, 0, "nothing left resident");
        assert_usable(pager);
    }

    /// Range arguments of the region methods: Ok or RangeError, never a
    /// crash; the accessors panic with a clear message when out of range.
    #[test]
    fn range_arguments_work_or_are_refused_clearly(
        folio_shift in 12u32..=16,
        offset in size(),
        len in size(),
        anon in any::<bool>(),
    ) {
        let pager = shared_pager();
        let folio = 1u64 << folio_shift;
        let r = if anon {
            pager.map_anonymous(2 * MIB + 12345, &MapOptions::new().folio(folio)).unwrap()
        } else {
            pager.map_file(data_file(), &MapOptions::new().folio(folio)).unwrap()
        };
        let rl = r.len() as u64;
        let inside = len > 0 && offset.checked_add(len).is_some_and(|e| e <= rl);
        let check = |res: Result<(), RangeError>| -> Result<(), TestCaseError> {
            match res {
                Ok(()) => prop_assert!(inside),
                Err(RangeError::Empty) => prop_assert_eq!(len, 0),
                Err(RangeError::OutOfRegion { .. }) => prop_assert!(!inside),
                Err(e @ RangeError::Unaligned { .. }) => prop_assert!(e.to_string().contains("not a multiple")),
                Err(e) => prop_assert!(false, "{:?}", e),
            }
            Ok(())
        };
        let adv = |res: Result<(), AdviseError>| -> Result<(), RangeError> {
            match res {
                Ok(()) => Ok(()),
                Err(AdviseError::Range(e)) => Err(e),
                Err(e) => panic!("unexpected {e}"),
            }
        };
        check(r.residency(offset, len).map(|_| ()))?;
        check(r.mincore(offset, len).map(|_| ()))?;
        check(r.pagemap(offset, len).map(|_| ()))?;
        check(r.prefetch(offset, len))?;
        check(adv(r.pageout(offset, len).map(|_| ())))?;
        if anon {
            check(adv(r.discard(offset, len)))?;
        }
        prop_assert!(r.wait_prefetch(Duration::from_secs(10)));
        // Accessors: out of range panics with a message, and nothing else.
        let n = (len % (4 * MIB)) as usize;
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut buf = vec![0u8; n];
            r.read_at(offset as usize, &mut buf);
        }));
        let fits = (offset as usize).checked_add(n).is_some_and(|e| e <= r.len()) && offset <= usize::MAX as u64;
        prop_assert_eq!(read.is_ok(), fits);
        if let Err(p) = read {
            let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            prop_assert!(msg.contains("beyond the region"), "{}", msg);
        }
        r.unmap().unwrap();
        prop_assert_eq!(pager.stats().resident_bytes, 0);
    }
}

// ---------------------------------------------------------------------------
// Reference model of operation sequences.

#[derive(Debug, Clone)]
enum Op {
    /// Write `len` bytes of `seed`-derived data at `at` (fractions of the region).
    Write {
        region: usize,
        at: u16,
        len: u16,
        seed: u8,
    },
    Read {
        region: usize,
        at: u16,
        len: u16,
    },
    Flush {
        region: usize,
    },
    /// Pageout of whole folios `[a, a+n)` (clamped to the region).
    Pageout {
        region: usize,
        a: u16,
        n: u16,
    },
    /// Discard (anonymous region only: reads zero after).
    Discard {
        a: u16,
        n: u16,
    },
    /// Unmap (flushing) and map again with another folio size.
    Remap {
        region: usize,
        folio_shift: u32,
    },
}

fn model_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, any::<u16>(), 1..20000u16, any::<u8>()).prop_map(|(region, at, len, seed)| Op::Write { region, at, len, seed }),
        4 => (0..2usize, any::<u16>(), 1..20000u16).prop_map(|(region, at, len)| Op::Read { region, at, len }),
        1 => (0..2usize).prop_map(|region| Op::Flush { region }),
        1 => (0..2usize, any::<u16>(), 1..64u16).prop_map(|(region, a, n)| Op::Pageout { region, a, n }),
        1 => (any::<u16>(), 1..64u16).prop_map(|(a, n)| Op::Discard { a, n }),
        1 => (0..2usize, 12u32..=17).prop_map(|(region, folio_shift)| Op::Remap { region, folio_shift }),
    ]
}

fn bytes_of(seed: u8, at: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (seed as usize * 131 + (at + k) * 7) as u8)
        .collect()
}

const FILE_LEN: usize = 3 * MIB as usize + 1000;
const ANON_LEN: usize = 2 * MIB as usize + 123;

proptest! {
    #![proptest_config(cases(32))]

    /// A file region and an anonymous region, 1 MiB budget (eviction all
    /// the time), against a Vec<u8> each; the file is compared with the
    /// model after every flush and at the end.
    #[test]
    fn operation_sequences_follow_a_reference_model(
        ops in proptest::collection::vec(model_op(), 1..60),
        folio_shift in 12u32..=17,
        handlers in 1usize..4,
    ) {
        let dir = ram_dir();
        let path = dir.path().join("f");
        let init: Vec<u8> = (0..FILE_LEN).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, &init).unwrap();
        let pager = Pager::builder().budget(MIB).batch(8).handler_threads(handlers).swap_dir(dir.path()).build().unwrap();
        let map = |k: usize, shift: u32| -> Region {
            let o = MapOptions::new().folio(1 << shift);
            if k == 0 { pager.map_file(&path, &o.writable(true)).unwrap() } else { pager.map_anonymous(ANON_LEN as u64, &o).unwrap() }
        };
        let mut regions = vec![Some(map(0, folio_shift)), Some(map(1, folio_shift))];
        let mut model = [init.clone(), vec![0u8; ANON_LEN]];
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Write { region, at, len, seed } => {
                    let r = regions[region].as_ref().unwrap();
                    let at = at as usize * (r.len() - 1) / u16::MAX as usize;
                    let len = (len as usize).min(r.len() - at);
                    let data = bytes_of(seed, at, len);
                    r.write_at(at, &data);
                    model[region][at..at + len].copy_from_slice(&data);
                }
                Op::Read { region, at, len } => {
                    let r = regions[region].as_ref().unwrap();
                    let at = at as usize * (r.len() - 1) / u16::MAX as usize;
                    let len = (len as usize).min(r.len() - at);
                    let mut buf = vec![0u8; len];
                    r.read_at(at, &mut buf);
                    prop_assert!(buf == model[region][at..at + len], "step {}: read {}+{} of region {} differs", step, at, len, region);
                }
                Op::Flush { region } => {
                    regions[region].as_ref().unwrap().flush().unwrap();
                    if region == 0 {
                        prop_assert!(std::fs::read(&path).unwrap() == model[0], "step {}: file differs after flush", step);
                    }
                }
                Op::Pageout { region, a, n } => {
                    let r = regions[region].as_ref().unwrap();
                    let f = r.folio_size() as usize;
                    let nf = r.len().div_ceil(f);
                    let a = a as usize % nf;
                    let end = (a + n as usize).min(nf);
                    let len = (end * f).min(r.len()) - a * f;
                    r.pageout((a * f) as u64, len as u64).unwrap();
                }
                Op::Discard { a, n } => {
                    let r = regions[1].as_ref().unwrap();
                    let f = r.folio_size() as usize;
                    let nf = r.len().div_ceil(f);
                    let a = a as usize % nf;
                    let end = (a + n as usize).min(nf);
                    let len = (end * f).min(r.len()) - a * f;
                    r.discard((a * f) as u64, len as u64).unwrap();
                    model[1][a * f..a * f + len].fill(0);
                }
                Op::Remap { region, folio_shift } => {
                    let r = regions[region].take().unwrap();
                    if region == 0 {
                        r.unmap().unwrap();
                        prop_assert!(std::fs::read(&path).unwrap() == model[0], "step {}: file differs after unmap", step);
                    } else {
                        // Anonymous memory does not outlive its region.
                        r.unmap().unwrap();
                        model[1].fill(0);
                    }
                    regions[region] = Some(map(region, folio_shift));
                }
            }
            prop_assert!(pager.stats().resident_bytes <= MIB);
        }
        for (k, r) in regions.iter().enumerate() {
            let r = r.as_ref().unwrap();
            let mut all = vec![0u8; r.len()];
            r.read_at(0, &mut all);
            prop_assert!(all == model[k], "region {} differs at the end", k);
        }
        let s = pager.stats();
        prop_assert!(s.resident_peak_bytes <= MIB, "{:?}", s);
        for r in regions.into_iter().flatten() {
            r.unmap().unwrap();
        }
        prop_assert!(std::fs::read(&path).unwrap() == model[0]);
        prop_assert_eq!(pager.stats().resident_bytes, 0);
    }
}

// ---------------------------------------------------------------------------
// Arguments that crash the process: probed in a child, so a crash fails the
// test instead of killing the test binary.

/// Entry point of the child processes (does nothing in a normal run).
#[test]
fn child_main() {
    let Ok(scenario) = std::env::var("UPAGER_CHILD") else {
        return;
    };
    match scenario.as_str() {
        "huge_readahead" => {
            for ra in [1u64 << 40, u64::MAX] {
                let built = Pager::builder()
                    .budget(16 * MIB)
                    .readahead(ra)
                    .handler_threads(2)
                    .build();
                match built {
                    Ok(p) => {
                        // Its threads allocate their fill buffers as they
                        // start: wait until all four (two handlers, the
                        // prefetcher, the reclaimer) are past that, asleep
                        // waiting for work, then use the pager.
                        wait_until("the pager's threads to wait for work", 10, || {
                            let t = threads_named("upager-");
                            t.len() >= 4 && t.iter().all(|&t| thread_sleeping(t))
                        });
                        assert_usable(&p);
                        println!("readahead {ra}: accepted and usable");
                    }
                    Err(e) => println!("readahead {ra}: refused: {e}"),
                }
            }
            println!("DONE");
        }
        "huge_anonymous" => {
            let p = Pager::builder().budget(16 * MIB).build().unwrap();
            for (len, folio) in [
                (1u64 << 46, 4096u64),
                (1 << 62, 4096),
                (u64::MAX - 4095, 2 * MIB),
            ] {
                match p.map_anonymous(len, &MapOptions::new().folio(folio)) {
                    Ok(r) => {
                        r.bytes()[r.len() - 1].store(1, Relaxed);
                        println!("anonymous {len} folio {folio}: mapped");
                    }
                    Err(e) => println!("anonymous {len} folio {folio}: refused: {e}"),
                }
            }
            assert_usable(&p);
            println!("DONE");
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn probe(scenario: &str) {
    let out = run_child(scenario, &[], Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("DONE"),
        "{scenario}: the process died ({:?}, signal {:?}): {}",
        out.status,
        out.status.signal(),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

#[test]
fn a_huge_readahead_is_refused_or_clamped_not_a_crash() {
    probe("huge_readahead");
}

#[test]
fn a_huge_anonymous_region_is_refused_not_a_crash() {
    probe("huge_anonymous");
}
