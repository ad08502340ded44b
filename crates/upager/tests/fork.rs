//! Fork: a forked child uses every file region it
//! inherited, at the same addresses, on an engine of its own, and its
//! writes reach the file at flush:
//! - writes of parent and child to disjoint folios both land; the child
//!   sees the parent's writes made before the fork (flushed by the
//!   `prepare` handler); an anonymous region is not inherited (a clear
//!   panic from its handle);
//! - forks while other threads fault (and evict) all the time;
//! - a fork from a thread that is not the main one;
//! - a child that forks again (a grandchild);
//! - parent and child writing different words of the same folios: both
//!   land (the fork makes them two writers of the file: twins and diffs);
//! - a child that drops the inherited handles and exits: no parent
//!   destructor runs there (it would wait for threads that do not exist).
//!
//! Each scenario runs in a child process of the test (run_child), which
//! forks; every wait has a timeout, and a child that overstays is killed.

#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upager::{MapOptions, Pager, Region};

const MIB: u64 = 1 << 20;
const FOLIO: u64 = 64 << 10;
const SEED: u64 = 21;

/// Entry point of the scenario processes (does nothing in a normal run).
#[test]
fn child_main() {
    let Ok(scenario) = std::env::var("UPAGER_CHILD") else {
        return;
    };
    match scenario.as_str() {
        "writes" => writes(),
        "inflight" => inflight(),
        "thread" => from_thread(),
        "grandchild" => grandchild(),
        "halves" => halves(),
        other => panic!("unknown scenario {other}"),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Forks; the child runs `body` and `_exit`s with 0 if it returned true
/// (1 if false, 2 if it panicked), never returning here.
fn fork_and(body: impl FnOnce() -> bool) -> libc::pid_t {
    // SAFETY: the test process forks; the child runs `body` (the fork
    // handlers rebuilt its engine before fork() returned) and ends with
    // _exit, so it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(_) => 2,
        };
        // SAFETY: ends the forked child at once, running no destructor or
        // atexit handler of the parent's.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits (at most `secs`) for `pid` to exit; kills and reaps it if it
/// does not. Returns its exit code (or 128 + signal).
fn reap(pid: libc::pid_t, secs: u64) -> i32 {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits (without blocking) for our own child `pid`;
        // `status` is a live int.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
        assert_eq!(r, 0, "waitpid: {}", std::io::Error::last_os_error());
        if start.elapsed() > Duration::from_secs(secs) {
            // SAFETY: kills and reaps our own child, which overstayed.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("child {pid} still running after {secs} s: killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A pattern file of `len` bytes and a pager whose budget is a quarter of
/// it (so reading it all evicts).
fn setup(dir: &Path, len: u64) -> (std::path::PathBuf, Pager, Region) {
    let path = pattern_file(dir, "data.bin", len, SEED);
    let pager = Pager::new((len / 4).max(2 * MIB)).unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().folio(FOLIO).writable(true))
        .unwrap();
    (path, pager, r)
}

/// The word a writer `who` stores at word `w` of folio `f`.
fn mark(who: u64, f: u64, w: u64) -> u64 {
    (who << 56) | (f << 20) | w
}

/// Writes folio `f` of `r` whole with `who`'s words.
fn write_folio(r: &Region, who: u64, f: u64) {
    let words = r.words();
    for w in 0..FOLIO / 8 {
        words[(f * FOLIO / 8 + w) as usize].store(mark(who, f, w), Relaxed);
    }
}

/// A folio [`check`] does not check (another process may be writing it).
const ANY: u64 = u64::MAX;

/// Checks every word of the region: folio `f` holds `who(f)`'s words if
/// it is Some (any words if it is `Some(ANY)`), the pattern otherwise.
/// Returns the first mismatch.
fn check(words: &[AtomicU64], who: impl Fn(u64) -> Option<u64>) -> Result<(), String> {
    for (i, v) in words.iter().enumerate() {
        let (f, w) = (i as u64 * 8 / FOLIO, i as u64 % (FOLIO / 8));
        let want = match who(f) {
            Some(ANY) => continue,
            Some(x) => mark(x, f, w),
            None => word(i as u64 * 8, SEED),
        };
        let got = v.load(Relaxed);
        if got != want {
            return Err(format!("word {i} (folio {f}): {got:#x}, want {want:#x}"));
        }
    }
    Ok(())
}

/// The file's words, checked as [`check`] does.
fn check_file(path: &Path, who: impl Fn(u64) -> Option<u64>) -> Result<(), String> {
    let data = std::fs::read(path).unwrap();
    let words: Vec<AtomicU64> = data
        .chunks(8)
        .map(|c| AtomicU64::new(u64::from_le_bytes(c.try_into().unwrap())))
        .collect();
    check(&words, who)
}

/// Parent (1) writes folios 0 mod 4 before the fork and 1 mod 4 after it;
/// the child (2) checks it sees the pre-fork writes and the pattern
/// elsewhere, writes folios 2 mod 4, flushes, drops the inherited handles
/// and exits. Both writes are in the file after the parent's flush.
fn writes() {
    let dir = ram_dir();
    let len = 8 * MIB;
    let (path, pager, r) = setup(dir.path(), len);
    let scratch = pager.map_anonymous(MIB, &MapOptions::new()).unwrap();
    scratch.words()[0].store(7, Relaxed);
    let nf = len / FOLIO;
    for f in (0..nf).filter(|f| f % 4 == 0) {
        write_folio(&r, 1, f);
    }
    let addr = r.as_ptr() as usize;
    let child = fork_and(|| {
        // The same address, the parent's writes from before the fork, the
        // pattern elsewhere (but in the folios the parent writes now: those
        // reach the file when the parent evicts them, as with MAP_SHARED).
        assert_eq!(r.as_ptr() as usize, addr);
        let seen = |f: u64| match f % 4 {
            0 => Some(1),
            1 => Some(ANY),
            _ => None,
        };
        if let Err(e) = check(r.words(), seen) {
            eprintln!("child read: {e}");
            return false;
        }
        for f in (0..nf).filter(|f| f % 4 == 2) {
            write_folio(&r, 2, f);
        }
        r.flush().unwrap();
        let st = r.pager_stats();
        assert!(
            st.budget_bytes == pager.budget() && st.flushes >= 1,
            "{st:?}"
        );
        // The anonymous region is not inherited: its handle says so.
        let why =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scratch.residency(0, 4096)))
                .unwrap_err();
        let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(why.contains("anonymous regions are not inherited"), "{why}");
        // Dropping the inherited handles runs no destructor of the parent's
        // (which would wait for its threads).
        // SAFETY: this child's copies of the handles, dropped once here:
        // the child ends with _exit right after, never dropping them again.
        unsafe {
            drop(std::ptr::read(&r));
            drop(std::ptr::read(&scratch));
            drop(std::ptr::read(&pager));
        }
        true
    });
    for f in (0..nf).filter(|f| f % 4 == 1) {
        write_folio(&r, 1, f);
    }
    assert_eq!(reap(child, 60), 0, "the child failed (see its stderr)");
    r.flush().unwrap();
    assert_eq!(scratch.words()[0].load(Relaxed), 7);
    let who = |f: u64| match f % 4 {
        0 | 1 => Some(1),
        2 => Some(2),
        _ => None,
    };
    check(r.words(), who).unwrap_or_else(|e| panic!("parent: {e}"));
    check_file(&path, who).unwrap_or_else(|e| panic!("file: {e}"));
    say("WRITES OK");
}

/// Two threads read random words of a region 4x the budget (faulting and
/// evicting all the time) and a third writes random words (their own
/// values again: folios get dirty, are written back, and the `prepare`
/// flush races the writes) while the main thread forks 6 children; each
/// child reads the whole region right. The readers never see a wrong word.
fn inflight() {
    let dir = ram_dir();
    let len = 16 * MIB;
    let (_path, _pager, r) = setup(dir.path(), len);
    let r = Arc::new(r);
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let (r, stop, reads) = (Arc::clone(&r), Arc::clone(&stop), Arc::clone(&reads));
            std::thread::spawn(move || {
                let words = r.words();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                while !stop.load(Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = (x % words.len() as u64) as usize;
                    if t == 2 {
                        words[i].store(word(i as u64 * 8, SEED), Relaxed);
                        continue;
                    }
                    let v = words[i].load(Relaxed);
                    assert_eq!(v, word(i as u64 * 8, SEED), "reader {t} word {i}");
                    reads.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    wait_until("the readers to run", 30, || reads.load(Relaxed) > 1000);
    for round in 0..6 {
        let r2 = Arc::clone(&r);
        let child = fork_and(move || match check(r2.words(), |_| None) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("child {round}: {e}");
                false
            }
        });
        assert_eq!(reap(child, 60), 0, "child {round} failed");
    }
    stop.store(true, Relaxed);
    for t in readers {
        t.join().unwrap();
    }
    let st = r.pager_stats();
    assert!(st.evictions > 0 && st.writebacks > 0, "{st:?}");
    say("INFLIGHT OK");
}

/// A thread that is not the main one forks; the child writes a folio.
fn from_thread() {
    let dir = ram_dir();
    let (path, _pager, r) = setup(dir.path(), 4 * MIB);
    let r = Arc::new(r);
    let r2 = Arc::clone(&r);
    let code = std::thread::spawn(move || {
        let r3 = Arc::clone(&r2);
        let child = fork_and(move || {
            if let Err(e) = check(r3.words(), |_| None) {
                eprintln!("child: {e}");
                return false;
            }
            write_folio(&r3, 2, 3);
            r3.flush().is_ok()
        });
        reap(child, 60)
    })
    .join()
    .unwrap();
    assert_eq!(code, 0, "the child failed");
    // Cold in the parent too: the folio was never read here.
    r.invalidate(0, r.len() as u64).unwrap();
    check(r.words(), |f| (f == 3).then_some(2)).unwrap_or_else(|e| panic!("parent: {e}"));
    check_file(&path, |f| (f == 3).then_some(2)).unwrap_or_else(|e| panic!("file: {e}"));
    say("THREAD OK");
}

/// The child (2) forks a grandchild (3); each writes its own folio and
/// flushes; the parent (1) writes one too. All three land.
fn grandchild() {
    let dir = ram_dir();
    let (path, pager, r) = setup(dir.path(), 4 * MIB);
    write_folio(&r, 1, 0);
    let child = fork_and(|| {
        write_folio(&r, 2, 1);
        let grand = fork_and(|| {
            // Sees the parent's and the child's writes from before its fork.
            if let Err(e) = check(r.words(), |f| match f {
                0 => Some(1),
                1 => Some(2),
                _ => None,
            }) {
                eprintln!("grandchild: {e}");
                return false;
            }
            write_folio(&r, 3, 2);
            r.flush().is_ok()
        });
        let code = reap(grand, 60);
        if code != 0 {
            eprintln!("grandchild exit {code}");
            return false;
        }
        r.flush().unwrap();
        // SAFETY: as in `writes`: this child's copies, dropped once.
        unsafe {
            drop(std::ptr::read(&r));
            drop(std::ptr::read(&pager));
        }
        true
    });
    assert_eq!(reap(child, 120), 0, "the child failed");
    r.flush().unwrap();
    let who = |f: u64| match f {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        _ => None,
    };
    check_file(&path, who).unwrap_or_else(|e| panic!("file: {e}"));
    say("GRANDCHILD OK");
}

/// Parent and child write different words of the same folios (the
/// parent's even words, the child's odd ones; every folio resident and
/// clean in the parent at the fork, and some dirty), and flush in both
/// orders (round 0: the child first; round 1: the parent first, the child
/// waiting for a sign): every word of both is in the file, and both keep
/// twins (the fork made them two writers of the file). Without twins on
/// either side, the whole-folio write-back of the one that flushes last
/// puts back the other's words as it last read them.
fn halves() {
    let dir = ram_dir();
    let len = 2 * MIB;
    let (path, pager, r) = setup(dir.path(), len);
    let words = (len / 8) as usize;
    let val = |round: u64, who: u64, w: usize| (round << 60) | (who << 56) | w as u64;
    let mut sum = 0u64;
    for w in (0..words).step_by(512) {
        sum = sum.wrapping_add(r.words()[w].load(Relaxed));
    }
    for round in 0..2u64 {
        let sign = dir.path().join(format!("parent-flushed-{round}"));
        // Resident at the fork; the first quarter dirty.
        for w in (0..words / 4).step_by(2) {
            r.words()[w].store(val(round, 1, w), Relaxed);
        }
        let child = fork_and(|| {
            for w in (1..words).step_by(2) {
                r.words()[w].store(val(round, 2, w), Relaxed);
            }
            if round == 1 {
                let start = Instant::now();
                while !sign.exists() {
                    assert!(start.elapsed() < Duration::from_secs(60), "no sign");
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            r.flush().unwrap();
            let st = r.pager_stats();
            assert!(st.twins_made > 0, "the child keeps twins: {st:?}");
            true
        });
        for w in (0..words).step_by(2) {
            r.words()[w].store(val(round, 1, w), Relaxed);
        }
        if round == 0 {
            assert_eq!(reap(child, 60), 0, "the child failed (see its stderr)");
            r.flush().unwrap();
        } else {
            r.flush().unwrap();
            std::fs::write(&sign, b"").unwrap();
            assert_eq!(reap(child, 60), 0, "the child failed (see its stderr)");
        }
        assert!(pager.stats().twins_made > 0, "the parent keeps twins");
        let data = std::fs::read(&path).unwrap();
        for (w, c) in data.chunks(8).enumerate() {
            let got = u64::from_le_bytes(c.try_into().unwrap());
            let want = val(round, if w % 2 == 0 { 1 } else { 2 }, w);
            assert_eq!(got, want, "round {round}: word {w} of the file (sum {sum})");
        }
        // The child's words reach the parent's copy once it drops it.
        r.invalidate(0, len).unwrap();
    }
    say("HALVES OK");
}

fn run(scenario: &str, ok: &str) {
    for mode in ["handlers", "in-thread"] {
        let out = run_child_env(
            scenario,
            &[],
            &[("UPAGER_FAULT_MODE", mode)],
            Duration::from_secs(180),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(ok),
            "{scenario} ({mode}): {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn parent_and_child_writes_to_disjoint_folios_both_land() {
    run("writes", "WRITES OK");
}

#[test]
fn forks_while_other_threads_fault_give_children_the_right_data() {
    run("inflight", "INFLIGHT OK");
}

#[test]
fn a_fork_from_another_thread_works() {
    run("thread", "THREAD OK");
}

#[test]
fn parent_and_child_writing_different_words_of_the_same_folios_both_land() {
    run("halves", "HALVES OK");
}

#[test]
fn a_child_that_forks_again_and_its_child_write_and_all_land() {
    run("grandchild", "GRANDCHILD OK");
}
