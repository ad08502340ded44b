//! Several writers of one file: two regions of one pager,
//! two pagers, two processes, and a writer that arrives after the first has
//! dirty folios. Each writes its own bytes, interleaved with the other's
//! inside the same folios; after every flush order the file holds exactly
//! every write. Twins are charged to the budget (peak ≤ budget).

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::*;
use upager::{MapOptions, Pager, Region};

const MIB: u64 = 1 << 20;
const FOLIO: u64 = 64 << 10;

/// The nonzero value writer `who` writes at byte `i` (files start as zeros,
/// so every write changes its byte).
fn val(i: u64, who: u64) -> u8 {
    ((i.wrapping_mul(31).wrapping_add(who * 101)) % 255 + 1) as u8
}

/// Whether writer `who` of `n` owns byte `i`: bytes are dealt round-robin
/// in runs of `run` bytes, so every folio holds every writer's bytes.
fn owns(i: u64, who: u64, n: u64, run: u64) -> bool {
    (i / run) % n == who
}

fn pager(budget: u64) -> Pager {
    pager_in(budget, upager::FaultMode::Handlers)
}

fn pager_in(budget: u64, mode: upager::FaultMode) -> Pager {
    Pager::builder()
        .budget(budget)
        .fault_mode(mode)
        .build()
        .expect("pager (needs /dev/userfaultfd: run as root)")
}

fn map_rw(p: &Pager, path: &Path) -> Region {
    p.map_file(path, &MapOptions::new().folio(FOLIO).writable(true))
        .unwrap()
}

fn zero_file(dir: &Path, len: u64) -> PathBuf {
    let path = dir.join("shared.bin");
    std::fs::write(&path, vec![0u8; len as usize]).unwrap();
    path
}

/// Writer `who` of `n` writes its bytes in `[lo, hi)`.
fn write_share(r: &Region, who: u64, n: u64, run: u64, lo: u64, hi: u64) {
    let b = r.bytes();
    for i in lo..hi {
        if owns(i, who, n, run) {
            b[i as usize].store(val(i, who), Relaxed);
        }
    }
}

/// Checks `path`: byte `i` is the value of its owner if the owner wrote
/// `[0, upto[owner])`, else 0. Returns the number of wrong bytes.
fn wrong_bytes(path: &Path, n: u64, run: u64, upto: &[u64]) -> usize {
    let data = std::fs::read(path).unwrap();
    let mut wrong = 0;
    for (i, &got) in data.iter().enumerate() {
        let i = i as u64;
        let who = (i / run) % n;
        let want = if i < upto[who as usize] {
            val(i, who)
        } else {
            0
        };
        if got != want {
            if wrong < 5 {
                eprintln!("byte {i}: {got}, want {want} (writer {who})");
            }
            wrong += 1;
        }
    }
    wrong
}

/// Two regions: one pager or two. Writes interleaved at byte granularity
/// (runs of 3 bytes: never aligned to a word), flushed in both orders and
/// in the middle of writing.
fn two_writers(two_pagers: bool, mode: upager::FaultMode) {
    let dir = ram_dir();
    let len = 2 * MIB + 1000; // a short last folio
    let path = zero_file(dir.path(), len);
    let pa = pager_in(64 * MIB, mode);
    let pb = two_pagers.then(|| pager_in(64 * MIB, mode));
    let a = map_rw(&pa, &path);
    let b = map_rw(pb.as_ref().unwrap_or(&pa), &path);
    let half = len / 2;
    // a writes its first half, b all of its bytes, b flushes, then a.
    write_share(&a, 0, 2, 3, 0, half);
    write_share(&b, 1, 2, 3, 0, len);
    b.flush().unwrap();
    a.flush().unwrap();
    assert_eq!(wrong_bytes(&path, 2, 3, &[half, len]), 0);
    // a writes the rest after b's flush (its resident copy is older than
    // the file there), flushes first this time.
    write_share(&a, 0, 2, 3, half, len);
    a.flush().unwrap();
    b.flush().unwrap();
    assert_eq!(wrong_bytes(&path, 2, 3, &[len, len]), 0);
    let s = pa.stats();
    assert!(s.twins_made > 0 && s.diff_writebacks > 0, "{s:?}");
    assert!(s.resident_peak_bytes <= 64 * MIB);
    if let Some(pb) = &pb {
        assert!(pb.stats().diff_writebacks > 0);
    }
}

#[test]
fn two_regions_of_one_pager_write_disjoint_bytes_of_the_same_folios() {
    two_writers(false, upager::FaultMode::Handlers);
}

#[test]
fn two_pagers_write_disjoint_bytes_of_the_same_folios() {
    two_writers(true, upager::FaultMode::Handlers);
}

/// In-thread faults: a write that needs a twin is handed to a resolver
/// thread (the copy allocates, which a SIGBUS handler may not).
#[test]
fn two_in_thread_pagers_write_disjoint_bytes_of_the_same_folios() {
    two_writers(true, upager::FaultMode::InThread);
}

/// A file mapped writable once keeps the single-writer path: no twin.
#[test]
fn a_single_writer_makes_no_twins() {
    let dir = ram_dir();
    let path = zero_file(dir.path(), MIB);
    let p = pager(16 * MIB);
    let a = map_rw(&p, &path);
    let ro = p.map_file(&path, &MapOptions::new().folio(FOLIO)).unwrap();
    write_share(&a, 0, 1, 1, 0, MIB);
    assert_eq!(ro.bytes()[5].load(Relaxed), 0, "reader saw the old file");
    a.flush().unwrap();
    let s = p.stats();
    assert_eq!(
        (s.twins_made, s.diff_writebacks, s.writer_switches),
        (0, 0, 0)
    );
    assert_eq!(wrong_bytes(&path, 1, 1, &[MIB]), 0);
}

/// The second region arrives while the first has dirty folios (made
/// without twins): they are written back as it maps, and from then on both
/// keep twins.
#[test]
fn a_writer_arriving_after_the_first_has_dirty_folios() {
    let dir = ram_dir();
    let len = MIB;
    let path = zero_file(dir.path(), len);
    let p = pager(16 * MIB);
    let a = map_rw(&p, &path);
    write_share(&a, 0, 2, 5, 0, len / 2);
    assert_eq!(p.stats().twins_made, 0);
    let b = map_rw(&p, &path);
    assert!(p.stats().writer_switches >= 1);
    // a's dirty folios reached the file when b mapped: b sees them.
    assert_eq!(b.bytes()[0].load(Relaxed), val(0, 0));
    write_share(&b, 1, 2, 5, 0, len);
    write_share(&a, 0, 2, 5, len / 2, len);
    b.flush().unwrap();
    a.flush().unwrap();
    assert_eq!(wrong_bytes(&path, 2, 5, &[len, len]), 0);
}

/// Two writers of a file 4× their pager's budget: twins are charged, so
/// resident folios plus twins stay within the budget while eviction writes
/// diffs back, and the file is exact.
#[test]
fn twins_are_charged_to_the_budget() {
    let dir = ram_dir();
    let budget = 4 * MIB;
    let len = 16 * MIB;
    let path = zero_file(dir.path(), len);
    let p = pager(budget);
    let a = map_rw(&p, &path);
    let b = map_rw(&p, &path);
    // Interleaved by folio quarter: both regions dirty every folio.
    let step = FOLIO / 4;
    let mut lo = 0;
    while lo < len {
        let hi = (lo + step).min(len);
        write_share(&a, 0, 2, 7, lo, hi);
        write_share(&b, 1, 2, 7, lo, hi);
        lo = hi;
    }
    a.flush().unwrap();
    b.flush().unwrap();
    let s = p.stats();
    assert!(s.evictions > 0, "the file must not fit: {s:?}");
    assert!(s.twins_made > 0 && s.diff_writebacks > 0, "{s:?}");
    assert!(
        s.resident_peak_bytes <= budget,
        "peak {} > budget {budget}",
        s.resident_peak_bytes
    );
    drop((a, b));
    assert_eq!(p.stats().resident_bytes, 0, "twins returned their charge");
    assert_eq!(wrong_bytes(&path, 2, 7, &[len, len]), 0);
}

/// Entry point of the child processes (does nothing in a normal run).
/// `UPAGER_CHILD=writer`: maps `WRITERS_PATH` writable, waits for the file
/// `WRITERS_GO` (if set), writes share `WRITERS_WHO` of `WRITERS_N`
/// (runs of `WRITERS_RUN` bytes) in `[WRITERS_LO, WRITERS_HI)`, waits for
/// `WRITERS_END` (if set; after printing "dirty"), flushes, prints
/// "written", exits.
#[test]
fn child_main() {
    if std::env::var("UPAGER_CHILD").as_deref() != Ok("writer") {
        return;
    }
    let env = |k: &str| std::env::var(k).unwrap();
    let num = |k: &str| env(k).parse::<u64>().unwrap();
    let wait_for = |k: &str| {
        if let Ok(f) = std::env::var(k) {
            wait_until(&format!("file {f}"), 30, || Path::new(&f).exists());
        }
    };
    let p = pager(num("WRITERS_BUDGET"));
    let r = map_rw(&p, Path::new(&env("WRITERS_PATH")));
    println!("mapped");
    wait_for("WRITERS_GO");
    let (lo, hi) = (num("WRITERS_LO"), num("WRITERS_HI"));
    write_share(
        &r,
        num("WRITERS_WHO"),
        num("WRITERS_N"),
        num("WRITERS_RUN"),
        lo,
        hi,
    );
    println!("dirty");
    wait_for("WRITERS_END");
    r.flush().unwrap();
    println!("written twins={}", p.stats().twins_made);
    drop(r);
}

fn spawn_writer(
    path: &Path,
    who: u64,
    n: u64,
    run: u64,
    lo: u64,
    hi: u64,
    extra: &[(&str, String)],
) -> ChildProc {
    let mut envs: Vec<(&str, String)> = vec![
        ("WRITERS_PATH", path.display().to_string()),
        ("WRITERS_WHO", who.to_string()),
        ("WRITERS_N", n.to_string()),
        ("WRITERS_RUN", run.to_string()),
        ("WRITERS_LO", lo.to_string()),
        ("WRITERS_HI", hi.to_string()),
        ("WRITERS_BUDGET", (16 * MIB).to_string()),
    ];
    envs.extend(extra.iter().cloned());
    let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ChildProc::spawn("writer", &e)
}

/// Two processes write interleaved bytes of the same folios; the parent
/// writes before and after the child's flush and flushes last.
#[test]
fn two_processes_write_disjoint_bytes_of_the_same_folios() {
    let dir = ram_dir();
    let len = MIB + 333;
    let path = zero_file(dir.path(), len);
    let go = dir.path().join("go");
    let p = pager(16 * MIB);
    let a = map_rw(&p, &path);
    let mut child = spawn_writer(
        &path,
        1,
        2,
        3,
        0,
        len,
        &[("WRITERS_GO", go.display().to_string())],
    );
    child.wait_line("mapped", Duration::from_secs(30));
    write_share(&a, 0, 2, 3, 0, len / 2);
    std::fs::write(&go, b"").unwrap();
    let line = child.wait_line("written", Duration::from_secs(60));
    assert!(!line.contains("twins=0"), "the child kept no twin: {line}");
    write_share(&a, 0, 2, 3, len / 2, len);
    a.flush().unwrap();
    assert!(child.wait(Duration::from_secs(30)).success());
    assert_eq!(wrong_bytes(&path, 2, 3, &[len, len]), 0);
    assert!(p.stats().twins_made > 0);
}

/// The parent dirties folios alone (no twins), then a child maps the file:
/// the parent's reclaimer sees the child's marker, writes its dirty folios
/// back and keeps twins from then on; the child's map waits for that.
#[test]
fn a_process_arriving_after_the_first_has_dirty_folios() {
    let dir = ram_dir();
    let len = MIB;
    let path = zero_file(dir.path(), len);
    let p = pager(16 * MIB);
    let a = map_rw(&p, &path);
    write_share(&a, 0, 2, 5, 0, len / 2);
    // The second half resident too (clean): older than the file once the
    // child has flushed.
    let sum: u64 = a.bytes()[len as usize / 2..]
        .iter()
        .map(|b| u64::from(b.load(Relaxed)))
        .sum();
    assert_eq!(sum, 0);
    assert_eq!(p.stats().twins_made, 0);
    let mut child = spawn_writer(&path, 1, 2, 5, 0, len, &[]);
    child.wait_line("written", Duration::from_secs(60));
    assert!(p.stats().writer_switches >= 1, "{:?}", p.stats());
    write_share(&a, 0, 2, 5, len / 2, len);
    a.flush().unwrap();
    assert!(child.wait(Duration::from_secs(30)).success());
    assert_eq!(wrong_bytes(&path, 2, 5, &[len, len]), 0);
}

/// Several processes, each writing its own block of rows whose boundaries
/// are not folio-aligned (docs/numpy.md, "fork and multiprocessing"), all mapped at once,
/// all dirty before any flushes: the file is exact after they exit.
#[test]
fn processes_writing_unaligned_blocks_lose_nothing() {
    let dir = ram_dir();
    let n = 4u64;
    let len = 4 * MIB + 12_345;
    let path = zero_file(dir.path(), len);
    let go = dir.path().join("go");
    let end = dir.path().join("end");
    let block = len / n + 777; // rows of 7 bytes, unaligned blocks
    let mut kids: Vec<ChildProc> = (0..n)
        .map(|w| {
            let (lo, hi) = ((w * block).min(len), ((w + 1) * block).min(len));
            let lo = if w == 0 { 0 } else { lo };
            let hi = if w == n - 1 { len } else { hi };
            spawn_writer(
                &path,
                0,
                1,
                1,
                lo,
                hi,
                &[
                    ("WRITERS_GO", go.display().to_string()),
                    ("WRITERS_END", end.display().to_string()),
                ],
            )
        })
        .collect();
    for k in &mut kids {
        k.wait_line("mapped", Duration::from_secs(30));
    }
    std::fs::write(&go, b"").unwrap();
    for k in &mut kids {
        k.wait_line("dirty", Duration::from_secs(60));
    }
    std::fs::write(&end, b"").unwrap();
    for k in &mut kids {
        assert!(k.wait(Duration::from_secs(60)).success());
    }
    assert_eq!(wrong_bytes(&path, 1, 1, &[len]), 0);
}
