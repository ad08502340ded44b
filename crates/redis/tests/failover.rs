//! A master killed while a writer runs (the cluster fails over), and a
//! cluster that goes away altogether. Each test
//! starts its own cluster on its own ports.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upager::{MapOptions, Pager};
use upager_redis::RedisOptions;

const CHUNK: u64 = 64 << 10;

/// kill -9 of a master while a writer runs and flushes: the cluster fails
/// over, the writer's flushes succeed again once the killed node is back as
/// a replica, and every word written (and every word flushed before the
/// kill) reads back, from the region and straight from Redis.
#[test]
fn a_master_killed_mid_write_loses_no_acknowledged_word() {
    let Some(c) = Cluster::start(21130) else {
        return;
    };
    let (len, budget) = (16 * MIB, 4 * MIB);
    let ropts = RedisOptions {
        retry_for: Duration::from_secs(30),
        ..RedisOptions::default()
    };
    let (st, _pager, r) = writable_dataset(&c, "fo", len, CHUNK, budget, &ropts);
    let words = (len / 8) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let flushed = Arc::new(AtomicU64::new(0)); // last round whose flush returned Ok
    let flush_errors = Arc::new(AtomicU64::new(0));
    let writer = {
        let (r, stop, rounds, flushed, flush_errors) = (
            Arc::clone(&r),
            Arc::clone(&stop),
            Arc::clone(&rounds),
            Arc::clone(&flushed),
            Arc::clone(&flush_errors),
        );
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(SeqCst) || round < 3 {
                round += 1;
                // One word in 16 of every page, all pages: every folio dirty.
                for w in (0..words).step_by(16) {
                    r.words()[w].store((round << 32) | w as u64, Relaxed);
                }
                rounds.store(round, SeqCst);
                match r.flush() {
                    Ok(()) => flushed.store(round, SeqCst),
                    Err(e) => {
                        eprintln!("flush of round {round}: {e}");
                        flush_errors.fetch_add(1, SeqCst);
                    }
                }
                if round > 200 {
                    break;
                }
            }
            round
        })
    };
    // Let it run a round, then kill the master of chunk 0's slot... any
    // master but the URL's seed: the first non-seed master.
    let deadline = Instant::now() + Duration::from_secs(60);
    while flushed.load(SeqCst) < 1 {
        assert!(Instant::now() < deadline, "no flush before the kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = *c.masters().iter().find(|&&p| p != c.base).unwrap();
    let flushed_before = flushed.load(SeqCst);
    let killed_at = Instant::now();
    let out = c.run(&["kill", &victim.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Failover: a replica takes over the victim's slots.
    let mut failover = None;
    while Instant::now() < killed_at + Duration::from_secs(30) {
        let st = c.run(&["status"]);
        let s = String::from_utf8_lossy(&st.stdout);
        if s.contains("cluster_state:ok")
            && s.lines().filter(|l| l.contains(" master")).count() == 3
        {
            failover = Some(killed_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let failover = failover.expect("the cluster failed over within 30 s");
    // Right after the failover, straight from Redis: no word is older than
    // the last round flushed before the kill (acknowledged writes survived
    // the master's death; later rounds may be there in part).
    let mut raw = c.client();
    for (w, v) in raw_words(&mut raw, "fo", len, CHUNK)
        .into_iter()
        .enumerate()
    {
        if w % 16 == 0 {
            assert_eq!(
                v & 0xFFFF_FFFF,
                w as u64,
                "word {w} right after the failover"
            );
            assert!(
                v >> 32 >= flushed_before,
                "word {w} is from round {} though round {flushed_before} was flushed before the kill",
                v >> 32
            );
        } else {
            assert_eq!(v, 0, "word {w}");
        }
    }
    drop(raw);
    // The killed node comes back as a replica (WAIT 1 needs one again).
    let out = c.run(&["revive", &victim.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revived = killed_at.elapsed();
    let round_at_revive = rounds.load(SeqCst);
    // Two more rounds flushed after the revival.
    let deadline = Instant::now() + Duration::from_secs(90);
    while flushed.load(SeqCst) < round_at_revive + 2 {
        assert!(
            Instant::now() < deadline,
            "flushes resume after the failover"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, SeqCst);
    let last = writer.join().unwrap();
    r.flush().unwrap();
    eprintln!(
        "failover: killed master {victim} after {flushed_before} flushed rounds; cluster ok again \
         after {failover:?}, node revived after {revived:?}; {last} rounds, {} failed flushes; {:?}",
        flush_errors.load(SeqCst),
        st.counters()
    );
    assert!(
        st.counters().retries > 0,
        "the store retried across the failover"
    );
    for w in 0..words {
        let want = if w % 16 == 0 {
            (last << 32) | w as u64
        } else {
            0
        };
        assert_eq!(r.words()[w].load(Relaxed), want, "word {w} in the region");
    }
    let mut raw = c.client();
    for (w, v) in raw_words(&mut raw, "fo", len, CHUNK)
        .into_iter()
        .enumerate()
    {
        let want = if w % 16 == 0 {
            (last << 32) | w as u64
        } else {
            0
        };
        assert_eq!(v, want, "word {w} in Redis");
    }
}

/// A master killed with SIGKILL and NOT revived while a
/// writer writes and flushes. The cluster fails over (the promoted replica
/// has no replica of its own), and the store keeps serving under the
/// default replica policy: flushes succeed again once the cluster is ok,
/// the writes to the promoted master are counted as degraded, and every
/// word of the last flushed round reads back from the region and straight
/// from Redis. Then a store that requires a replica (`?min_replicas=1`)
/// refuses writes to that shard with an error naming the master, and a
/// flush reports it (the data stays dirty in memory).
#[test]
fn a_master_killed_and_not_revived_keeps_taking_writes() {
    let Some(c) = Cluster::start(21300) else {
        return;
    };
    let (len, budget) = (16 * MIB, 4 * MIB);
    let ropts = RedisOptions {
        retry_for: Duration::from_secs(30),
        ..RedisOptions::default()
    };
    let (st, _pager, r) = writable_dataset(&c, "nr", len, CHUNK, budget, &ropts);
    let words = (len / 8) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let flushed = Arc::new(AtomicU64::new(0));
    let flush_errors = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    // Milliseconds since t0 of the last Ok flush.
    let flushed_at = Arc::new(AtomicU64::new(0));
    let writer = {
        let (r, stop, rounds, flushed, flush_errors, flushed_at) = (
            Arc::clone(&r),
            Arc::clone(&stop),
            Arc::clone(&rounds),
            Arc::clone(&flushed),
            Arc::clone(&flush_errors),
            Arc::clone(&flushed_at),
        );
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(SeqCst) && round < 500 {
                round += 1;
                for w in (0..words).step_by(16) {
                    r.words()[w].store((round << 32) | w as u64, Relaxed);
                }
                rounds.store(round, SeqCst);
                match r.flush() {
                    Ok(()) => {
                        flushed.store(round, SeqCst);
                        flushed_at.store(t0.elapsed().as_millis() as u64, SeqCst);
                    }
                    Err(e) => {
                        eprintln!("flush of round {round}: {}", upager::error_chain(&e));
                        flush_errors.fetch_add(1, SeqCst);
                    }
                }
            }
            round
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while flushed.load(SeqCst) < 2 {
        assert!(Instant::now() < deadline, "no flush before the kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = *c.masters().iter().find(|&&p| p != c.base).unwrap();
    let killed_at = Instant::now();
    let killed_ms = t0.elapsed().as_millis() as u64;
    let out = c.run(&["kill", &victim.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut failover = None;
    while killed_at.elapsed() < Duration::from_secs(30) {
        let s = c.run(&["status"]);
        let s = String::from_utf8_lossy(&s.stdout);
        if s.contains("cluster_state:ok")
            && s.lines().filter(|l| l.contains(" master")).count() == 3
        {
            failover = Some(killed_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let failover = failover.expect("the cluster failed over within 30 s");
    // Not revived: three rounds begun after the failover are flushed.
    let round_at_ok = rounds.load(SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while flushed.load(SeqCst) < round_at_ok + 3 {
        assert!(
            Instant::now() < deadline,
            "flushes did not resume within 60 s of the failover with the master left dead \
             (flushed round {}, {} failed flushes)",
            flushed.load(SeqCst),
            flush_errors.load(SeqCst)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // First Ok flush after the kill: how long the writer saw no progress.
    let mut resumed_ms = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let at = flushed_at.load(SeqCst);
        if at > killed_ms {
            resumed_ms = Some(at - killed_ms);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, SeqCst);
    let last = writer.join().unwrap();
    r.flush().unwrap();
    let status = String::from_utf8_lossy(&c.run(&["status"]).stdout).into_owned();
    assert!(
        status.contains(&format!("127.0.0.1:{victim} down")),
        "the killed master stayed down: {status}"
    );
    let counters = st.counters();
    let mut verified = 0u64;
    for w in 0..words {
        let want = if w % 16 == 0 {
            (last << 32) | w as u64
        } else {
            0
        };
        assert_eq!(r.words()[w].load(Relaxed), want, "word {w} in the region");
    }
    let mut raw = c.client();
    for (w, v) in raw_words(&mut raw, "nr", len, CHUNK)
        .into_iter()
        .enumerate()
    {
        let want = if w % 16 == 0 {
            (last << 32) | w as u64
        } else {
            0
        };
        assert_eq!(v, want, "word {w} in Redis");
        verified += u64::from(w % 16 == 0);
    }
    eprintln!(
        "failover without revive: master {victim} killed, cluster ok again after {failover:?}, \
         first flush Ok {resumed_ms:?} ms after the kill; {last} rounds, {} failed flushes, \
         {} chunk writes degraded, {verified} flushed words verified in Redis (and all {words} \
         words in the region); {counters:?}",
        flush_errors.load(SeqCst),
        counters.writes_degraded
    );
    assert!(
        counters.writes_degraded > 0,
        "writes to the promoted master are counted as degraded: {counters:?}"
    );
    assert!(
        counters.retries > 0,
        "the store retried across the failover"
    );
    assert!(counters
        .iter()
        .any(|(n, v)| n == "store_writes_degraded" && v == counters.writes_degraded));

    // The same shard under ?min_replicas=1: its writes are refused, with a
    // message naming the master and the policy; flush reports it.
    let strict = RedisOptions {
        retry_for: Duration::from_millis(1500),
        timeout: Duration::from_millis(300),
        ..RedisOptions::default()
    };
    let url: upager_redis::StoreUrl = format!("{}?min_replicas=1", c.named("nr")).parse().unwrap();
    let pager = Pager::new(32 * MIB).unwrap();
    let w = upager_redis::map(&pager, &url, &MapOptions::new().writable(true), &strict).unwrap();
    for p in 0..(len / CHUNK) as usize {
        w.words()[p * (CHUNK / 8) as usize + 1].store(0xABCD, Relaxed);
    }
    let e = upager::error_chain(&w.flush().unwrap_err());
    eprintln!("flush under min_replicas=1 with a master short of replicas: {e}");
    assert!(e.contains("min_replicas"), "{e}");
    assert!(e.contains("127.0.0.1:"), "{e}");
    assert_eq!(
        w.words()[1].load(Relaxed),
        0xABCD,
        "the dirty data stays in memory"
    );
}

/// Child process: maps dataset NAME at the cluster on UPAGER_CHILD_PORT,
/// reads folio 0, says READY, waits for a line, checks folio 0 (resident)
/// still reads, then touches a folio never read (SIGBUS expected).
#[test]
fn child_main() {
    let Ok(port) = std::env::var("UPAGER_REDIS_CHILD_PORT") else {
        return;
    };
    let url = format!("redis-cluster://127.0.0.1:{port}/gone")
        .parse()
        .unwrap();
    let ropts = RedisOptions {
        retry_for: Duration::from_millis(1500),
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    let pager = Pager::builder()
        .budget(8 * MIB)
        .readahead(0)
        .build()
        .unwrap();
    let r = upager_redis::map(&pager, &url, &MapOptions::new(), &ropts).unwrap();
    let first = r.words()[0].load(Relaxed);
    // Straight to fd 1: println! may go to the test harness's capture.
    let say = |s: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{s}").unwrap();
        out.flush().unwrap();
    };
    say(format!("READY {first}"));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(r.words()[0].load(Relaxed), first);
    say("RESIDENT OK".into());
    let v = r.words()[(8 * MIB / 8) as usize].load(Relaxed);
    say(format!("not reached: {v}"));
}

/// The whole cluster stopped mid-run: a read fault of a page not resident
/// ends in SIGBUS for that access (in a child process), resident data still
/// reads; in this process, flush reports the error and the dirty data
/// stays in memory.
#[test]
fn a_store_that_goes_away_raises_sigbus_for_the_access_and_keeps_dirty_data() {
    let Some(c) = Cluster::start(21140) else {
        return;
    };
    let url = c.named("gone");
    let len = 16 * MIB;
    let path = tempfile::NamedTempFile::new().unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i / 4096) as u8 | 1).collect();
    std::fs::write(path.path(), &data).unwrap();
    upager_redis::upload(
        path.path(),
        &url,
        CHUNK,
        &RedisOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();

    // In this process: a writable mapping with dirty folios.
    let ropts = RedisOptions {
        retry_for: Duration::from_millis(1500),
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    let pager = Pager::new(32 * MIB).unwrap();
    let w = upager_redis::map(&pager, &url, &MapOptions::new().writable(true), &ropts).unwrap();
    for p in 0..64usize {
        w.words()[p * 512].store(0xD1D1_0000 + p as u64, Relaxed);
    }

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("UPAGER_REDIS_CHILD_PORT", c.base.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The child's lines, through a channel: every wait below is bounded.
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let limit = Instant::now() + Duration::from_secs(60);
    loop {
        let left = limit.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            // libtest prints "test child_main ... " before the test's first line.
            Ok(l) if l.contains("READY") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("no READY from the child within 60 s: {e:?}");
            }
        }
    }
    let t = Instant::now();
    let stopped = c.run(&["stop"]);
    assert!(stopped.status.success());
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    let limit = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > limit {
            let _ = child.kill();
            panic!("the child did not end within 60 s of the cluster's stop");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(1)) {
        rest.push_str(&l);
        rest.push('\n');
    }
    let took = t.elapsed();
    assert!(rest.contains("RESIDENT OK"), "{rest}");
    assert!(!rest.contains("not reached"), "{rest}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}");
    eprintln!("store gone: child got SIGBUS {took:?} after the cluster stopped");

    let t = Instant::now();
    let e = w.flush().unwrap_err();
    eprintln!("flush with the cluster gone, after {:?}: {e}", t.elapsed());
    assert!(
        upager::error_chain(&e).contains("127.0.0.1"),
        "{}",
        upager::error_chain(&e)
    );
    for p in 0..64usize {
        assert_eq!(
            w.words()[p * 512].load(Relaxed),
            0xD1D1_0000 + p as u64,
            "dirty word kept"
        );
        assert_eq!(
            w.words()[p * 512 + 1].load(Relaxed) as u8,
            (p as u8) | 1,
            "clean data kept"
        );
    }
    drop(w);
}
