//! A hostile network between upager and S3 (issue 50, part 2): a loopback
//! proxy (common/proxy.rs) in front of a real SeaweedFS injects, per kind
//! and many times, a connection reset mid-body, a truncated body, a wrong
//! Content-Length (short and long), a stall before the answer and in the
//! middle of a body, a slow drip, a 200 whose body is another version of
//! the object, and connection refused (no listener on the port):
//! - during reads of an object (the Store API's `read_at`, and a mapped
//!   region's pass and random reads in a child process, where an access
//!   that cannot be served ends in SIGBUS with the reason logged);
//! - during write-back of a writable dataset (`s3://BUCKET/NAME/`);
//! - during a dataset's upload (`dataset::load`).
//!
//! Each case checks: every value read is right or the access fails with
//! an error naming the store; a write-back that failed leaves its data
//! dirty, flush() reports it, and once the network heals flush() succeeds
//! and the dataset equals the model (0 lost words); no call waits past the
//! documented bound (S3Options::timeout per request, the retries within
//! retry_for, and the guard over a call: store.rs's module doc); an upload
//! that failed leaves no dataset visible. Each prints a `HOSTILE` line per
//! kind (injections, errors reported, words lost, longest call): the
//! figures of docs/reliability.md, "A hostile network".
//!
//! Ports: 22440.. (this binary's server); the proxies take free ports.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use proxy::{chosen, Fault, Proxy, Req, Rng};
use upager::{MapOptions, Pager, Store};
use upager_s3::dataset;
use upager_s3::{S3Dataset, S3Options, S3Store, S3Url};

const BASE: u16 = 22440;
const BUCKET: &str = "hostile";
/// The object the reads read, and another version of it.
const OBJ: &str = "obj.bin";
const OTHER: &str = "other.bin";
const OBJ_LEN: u64 = 4 * MIB;
const SEED: u64 = 0x0405_711e;
const OTHER_SEED: u64 = 0xbad;
const PART: u64 = 64 << 10;

fn server() -> Option<&'static Server> {
    let s = Server::shared_bucket(BASE, BUCKET)?;
    static PUT: std::sync::Once = std::sync::Once::new();
    PUT.call_once(|| {
        let o = s.objects(BUCKET);
        o.put(OBJ, pattern(OBJ_LEN, SEED)).unwrap();
        o.put(OTHER, pattern(OBJ_LEN, OTHER_SEED)).unwrap();
    });
    Some(s)
}

/// The other version's bytes and ETag (as the server sends it).
fn other_version(s: &Server) -> Fault {
    let data = pattern(OBJ_LEN, OTHER_SEED);
    let st = S3Store::open_with(&s.url(BUCKET, OTHER), &S3Options::default(), &s.env()).unwrap();
    Fault::OtherVersion {
        data: Arc::new(data),
        etag: st.etag().to_string(),
    }
}

fn via(p: &Proxy, key: &str) -> S3Url {
    format!("s3://{BUCKET}/{key}?endpoint={}", p.endpoint)
        .parse()
        .unwrap()
}

/// The settings of the tests: short timeouts so that a stall costs
/// little; 3 retries within 2 s.
fn opts(timeout: Duration) -> S3Options {
    S3Options::default()
        .part(PART)
        .in_flight(16)
        .timeout(timeout)
        .connect_timeout(Duration::from_millis(500))
        .retry(3, Duration::from_secs(2))
}

/// The documented bound on one read_at call (store.rs: "a guard over the
/// whole call (retry_for + timeout + 5 s)").
fn read_bound(o: &S3Options) -> Duration {
    o.retry_for + o.timeout + Duration::from_secs(5)
}

/// The documented bound on one request batch of a dataset (dataset.rs's
/// guard: 4 timeouts + retry_for).
fn dataset_bound(o: &S3Options) -> Duration {
    o.timeout * 4 + o.retry_for
}

/// One row of the table.
#[derive(Debug, Default, Clone)]
struct Row {
    kind: String,
    op: &'static str,
    injections: u64,
    calls: u64,
    errors: u64,
    lost: u64,
    max_stall: Duration,
    note: String,
}

impl Row {
    fn print(&self) {
        eprintln!(
            "HOSTILE | {} | {} | {} | {} calls, {} errors reported | {} | {} ms | {}",
            self.kind,
            self.op,
            self.injections,
            self.calls,
            self.errors,
            self.lost,
            self.max_stall.as_millis(),
            self.note
        );
    }
}

/// Runs `f` for each of `kinds` in a thread of its own (a case spends
/// most of its time waiting out timeouts and stalls); the rows in the
/// order of `kinds`.
fn par<K: Copy + Send + Sync>(kinds: &[K], f: impl Fn(K) -> Row + Sync) -> Vec<Row> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = kinds
            .iter()
            .map(|&k| {
                let f = &f;
                sc.spawn(move || f(k))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The faults a GET can get, by kind; `n` picks the byte where a body is
/// cut.
fn get_fault(kind: &str, n: u64, other: &Fault) -> Fault {
    let at = 1000 + (n.wrapping_mul(7919) % 60_000) as usize;
    match kind {
        "reset mid-body" => Fault::ResetBody(at),
        "truncated body" => Fault::Truncate(at),
        "content-length short" => Fault::ShortLength(1 + at % 4096),
        "content-length long" => Fault::LongLength(1 + at % 4096),
        "stall" => Fault::Stall(Duration::from_millis(1500)),
        "stall mid-body" => Fault::StallBody(at, Duration::from_millis(1500)),
        // Every other drip within the request timeout, the rest far past
        // it (64 KiB at 1 KiB per 40 ms: 2.6 s).
        "drip" if n.is_multiple_of(2) => Fault::Drip {
            chunk: 8 << 10,
            every: Duration::from_millis(10),
        },
        "drip" => Fault::Drip {
            chunk: 1 << 10,
            every: Duration::from_millis(40),
        },
        "other version" => other.clone(),
        _ => panic!("no GET fault {kind}"),
    }
}

const GET_KINDS: [&str; 8] = [
    "reset mid-body",
    "truncated body",
    "content-length short",
    "content-length long",
    "stall",
    "stall mid-body",
    "drip",
    "other version",
];

fn slow(kind: &str) -> bool {
    kind.starts_with("stall") || kind == "drip"
}

/// Words of `buf` (read at `offset` of the object) that are not the
/// pattern's.
fn wrong_words(buf: &[u8], offset: u64) -> u64 {
    buf.chunks_exact(8)
        .enumerate()
        .filter(|(i, c)| {
            u64::from_le_bytes((*c).try_into().unwrap()) != word(offset / 8 + *i as u64, SEED)
        })
        .count() as u64
}

/// `read_at` through the proxy, `calls` times at random places of the
/// object (512 KiB: 8 GETs in flight), with about one GET in `every` given
/// the fault of `kind`; or, for "refused", each call made while the port
/// has no listener for a while (one call in 6 for longer than the retries
/// last).
fn read_case(s: &Server, kind: &str, calls: u64, every: u64) -> Row {
    let p = Proxy::start(&s.endpoint);
    let timeout = if slow(kind) {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(1)
    };
    let o = opts(timeout);
    let st = S3Store::open_with(&via(&p, OBJ), &o, &s.env()).unwrap();
    let other = other_version(s);
    let k = kind.to_string();
    if kind != "refused" {
        p.set_rule(move |r: &Req<'_>| {
            if r.method == "GET" && chosen(r.n, 11, every) {
                get_fault(&k, r.n, &other)
            } else {
                Fault::Pass
            }
        });
    }
    let mut row = Row {
        kind: kind.into(),
        op: "read_at",
        ..Row::default()
    };
    let mut rng = Rng(0x1234_5678 ^ calls);
    let mut buf = vec![0u8; 512 << 10];
    let url_text = format!("s3://{BUCKET}/{OBJ}");
    for i in 0..calls {
        let off = rng.below((OBJ_LEN - buf.len() as u64) / 8) * 8;
        let down = (kind == "refused").then(|| {
            let d = if i % 6 == 5 {
                Duration::from_millis(1500)
            } else {
                Duration::from_millis(20 + rng.below(120))
            };
            p.listen(false);
            p.count_refused();
            d
        });
        let healer = down.map(|d| {
            let t = Instant::now();
            (t, d)
        });
        let t = Instant::now();
        let r = std::thread::scope(|sc| {
            if let Some((t0, d)) = healer {
                let p = &p;
                sc.spawn(move || {
                    std::thread::sleep(d.saturating_sub(t0.elapsed()));
                    p.listen(true);
                });
            }
            st.read_at(&mut buf, off)
        });
        let took = t.elapsed();
        row.max_stall = row.max_stall.max(took);
        row.calls += 1;
        match r {
            Ok(n) => {
                assert_eq!(n, buf.len());
                row.lost += wrong_words(&buf, off);
            }
            Err(e) => {
                row.errors += 1;
                let msg = e.to_string();
                assert!(
                    msg.contains(&url_text) && msg.contains(&p.endpoint),
                    "the error names the store: {msg}"
                );
                if row.note.is_empty() {
                    row.note = msg;
                }
            }
        }
    }
    row.injections = if kind == "refused" {
        p.stats.injected("refused")
    } else {
        p.stats.injected(kind)
    };
    let c = st.counters();
    if kind == "other version" {
        assert!(c.etag_mismatches > 0, "{c:?}");
    }
    assert_eq!(row.lost, 0, "{kind}: wrong words served: {row:?}");
    assert!(
        row.max_stall <= read_bound(&o),
        "{kind}: a read waited {:?}, past the bound {:?}",
        row.max_stall,
        read_bound(&o)
    );
    row.print();
    row
}

/// Reads through a proxy that cuts, truncates, lies in Content-Length or
/// sends another version: each `read_at` returns the object's bytes, or
/// an error naming the object and the endpoint; never a wrong word.
#[test]
fn reads_under_cut_bodies_wrong_lengths_and_another_version() {
    let Some(s) = server() else { return };
    let kinds: Vec<&str> = GET_KINDS.iter().copied().filter(|k| !slow(k)).collect();
    let rows = par(&kinds, |kind| read_case(s, kind, 40, 4));
    for r in &rows {
        assert!(r.injections >= 24, "{r:?}");
    }
    // The kinds the client retries (a body error resumes the range) end
    // right; the ones it cannot tell from an answer are errors.
    let by = |k: &str| rows.iter().find(|r| r.kind == k).unwrap();
    assert!(by("other version").errors > 0, "{:?}", by("other version"));
}

/// Reads through a proxy that stalls before or in the middle of an
/// answer, or drips it: each `read_at` is right or an error, within the
/// documented bound.
#[test]
fn reads_under_stalls_and_drips() {
    let Some(s) = server() else { return };
    let kinds: Vec<&str> = GET_KINDS.iter().copied().filter(|k| slow(k)).collect();
    for r in par(&kinds, |kind| read_case(s, kind, 10, 3)) {
        assert!(r.injections >= 20, "{r:?}");
    }
}

/// Reads while the port has no listener (connection refused): a short
/// outage is retried away, one longer than the retries is an error naming
/// the store; the next read succeeds.
#[test]
fn reads_under_connection_refused() {
    let Some(s) = server() else { return };
    let r = read_case(s, "refused", 30, 1);
    assert!(r.injections >= 24, "{r:?}");
    assert!(r.errors >= 1 && r.errors < r.calls, "{r:?}");
}

// ---------------------------------------------------------------------
// A mapped region, in a child process: SIGBUS is the clean failure.

/// Child process: maps the object through the proxy of
/// UPAGER_HOSTILE_ENDPOINT (faults set by the parent), reads every word
/// and then random words, each checked; prints its longest access and
/// exits 0, or dies of SIGBUS at an access that could not be served.
#[test]
fn child_region_reader() {
    let Ok(endpoint) = std::env::var("UPAGER_HOSTILE_ENDPOINT") else {
        return;
    };
    upager::log_to_stderr();
    let timeout: u64 = std::env::var("UPAGER_HOSTILE_TIMEOUT_MS")
        .unwrap()
        .parse()
        .unwrap();
    let url: S3Url = format!("s3://{BUCKET}/{OBJ}?endpoint={endpoint}")
        .parse()
        .unwrap();
    let o = opts(Duration::from_millis(timeout));
    let pager = Pager::new(MIB).unwrap();
    let r = upager_s3::map(&pager, &url, &MapOptions::new().folio(PART), &o).unwrap();
    let w = r.words();
    let mut worst = Duration::ZERO;
    let mut wrong = 0u64;
    let mut check = |i: usize| {
        let t = Instant::now();
        let v = w[i].load(Relaxed);
        worst = worst.max(t.elapsed());
        if v != word(i as u64, SEED) {
            wrong += 1;
        }
    };
    for i in (0..w.len()).step_by(64) {
        check(i);
    }
    let mut rng = Rng(99);
    for _ in 0..400 {
        check(rng.below(w.len() as u64) as usize);
    }
    println!("CHILD wrong={wrong} worst_ms={}", worst.as_millis());
    std::io::stdout().flush().unwrap();
}

/// Runs [`child_region_reader`] against proxy `p`; its exit status,
/// stdout, stderr and wall time. Bounded: killed after 60 s.
fn run_child(
    s: &Server,
    p: &Proxy,
    timeout: Duration,
) -> (std::process::ExitStatus, String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_region_reader",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("UPAGER_HOSTILE_ENDPOINT", &p.endpoint)
    .env("UPAGER_HOSTILE_TIMEOUT_MS", timeout.as_millis().to_string())
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in s.env_vars() {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let outs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let limit = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > limit {
            let _ = child.kill();
            panic!("the child did not end within 60 s: a hang");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, outs.join().unwrap(), errs.join().unwrap())
}

/// A mapped object read whole and at random through each kind of fault,
/// one child process per kind (in parallel): every word read is right,
/// and an access that cannot be served ends in SIGBUS with the reason
/// (naming the object) logged: never a wrong word, never a hang.
#[test]
fn region_reads_are_right_or_end_in_sigbus() {
    let Some(s) = server() else { return };
    let other = other_version(s);
    let kinds: Vec<&str> = GET_KINDS.iter().copied().chain(["refused"]).collect();
    let rows = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for kind in kinds {
            let (other, rows) = (other.clone(), &rows);
            sc.spawn(move || {
                let p = Proxy::start(&s.endpoint);
                let timeout = if slow(kind) {
                    Duration::from_millis(300)
                } else {
                    Duration::from_secs(1)
                };
                // About 500 GETs in all (a pass of 64 folios and random
                // ones under a 1 MiB budget): one in 3 gets the fault,
                // one in 16 for the slow kinds.
                let every = if slow(kind) { 16 } else { 3 };
                let k = kind.to_string();
                if kind != "refused" {
                    p.set_rule(move |r: &Req<'_>| {
                        if r.method == "GET" && r.n > 0 && chosen(r.n, 5, every) {
                            get_fault(&k, r.n, &other)
                        } else {
                            Fault::Pass
                        }
                    });
                }
                let stop = AtomicBool::new(false);
                let (status, out, err) = std::thread::scope(|sc2| {
                    if kind == "refused" {
                        // Outages of 20-140 ms every 150 ms, one of 1.5 s
                        // in eight (longer than the retries last).
                        let (p, stop) = (&p, &stop);
                        sc2.spawn(move || {
                            let mut rng = Rng(7);
                            std::thread::sleep(Duration::from_millis(300));
                            let mut i = 0;
                            while !stop.load(Relaxed) {
                                let d = if i % 8 == 7 {
                                    1500
                                } else {
                                    20 + rng.below(120)
                                };
                                p.listen(false);
                                p.count_refused();
                                std::thread::sleep(Duration::from_millis(d));
                                p.listen(true);
                                std::thread::sleep(Duration::from_millis(150));
                                i += 1;
                            }
                        });
                    }
                    let r = run_child(s, &p, timeout);
                    stop.store(true, Relaxed);
                    r
                });
                let injections = if kind == "refused" {
                    p.stats.injected("refused")
                } else {
                    p.stats.injected(kind)
                };
                let mut row = Row {
                    kind: kind.into(),
                    op: "region read (child)",
                    injections,
                    calls: p.stats.requests("GET"),
                    ..Row::default()
                };
                if status.success() {
                    let line = out
                        .lines()
                        .find_map(|l| Some(&l[l.find("CHILD ")?..]))
                        .unwrap_or_else(|| panic!("{kind}: no summary: {out}\n{err}"));
                    let field = |name: &str| -> u64 {
                        line.split(' ')
                            .find_map(|f| f.strip_prefix(name)?.parse().ok())
                            .unwrap()
                    };
                    row.lost = field("wrong=");
                    row.max_stall = Duration::from_millis(field("worst_ms="));
                    row.note = "exit 0".into();
                } else {
                    assert_eq!(
                        status.signal(),
                        Some(libc::SIGBUS),
                        "{kind}: {status:?}\n{out}\n{err}"
                    );
                    assert!(
                        err.contains("gets SIGBUS")
                            && err.contains(&format!("s3://{BUCKET}/{OBJ}")),
                        "{kind}: the reason is logged, naming the object: {err}"
                    );
                    row.errors = 1;
                    let reason = err
                        .lines()
                        .find(|l| l.contains("gets SIGBUS"))
                        .unwrap_or("")
                        .to_string();
                    row.note = format!("SIGBUS: {reason}");
                }
                row.print();
                rows.lock().unwrap().push(row);
            });
        }
    });
    for r in rows.into_inner().unwrap() {
        assert_eq!(r.lost, 0, "{r:?}");
        assert!(r.injections >= 1, "{r:?}");
        assert!(
            r.max_stall <= read_bound(&opts(Duration::from_secs(1))),
            "{r:?}"
        );
    }
}

// ---------------------------------------------------------------------
// Write-back of a writable dataset.

const WB_LEN: u64 = 2 * MIB;
const WB_GROUP: u64 = 128 << 10;

/// The faults of a write-back's requests, by kind (GETs of the groups
/// read back, and PUTs).
fn wb_fault(kind: &str, r: &Req<'_>, other: &Fault) -> Fault {
    match (kind, r.method) {
        ("503", _) => Fault::Status(if r.n.is_multiple_of(2) { 503 } else { 500 }),
        ("reset request", _) => Fault::ResetRequest,
        ("answer lost", "PUT") => Fault::ResetAfterApplied,
        ("stall", _) => Fault::Stall(Duration::from_millis(1500)),
        ("drip", _) => Fault::Drip {
            chunk: 2 << 10,
            every: Duration::from_millis(if r.n.is_multiple_of(2) { 5 } else { 300 }),
        },
        (k, "GET") if GET_KINDS.contains(&k) => get_fault(k, r.n, other),
        _ => Fault::Pass,
    }
}

/// A writable dataset mapped through the proxy, written and flushed
/// `rounds` times with about one request in `every` of the flush given
/// the fault of `kind`; after each faulty flush the network heals and a
/// flush must succeed; the dataset (read without the proxy) must equal
/// the model.
fn writeback_case(s: &Server, kind: &str, rounds: u64, every: u64) -> Row {
    let env = s.env();
    let name = format!("wb-{}/", kind.replace(' ', "-"));
    let direct = s.url(BUCKET, &name);
    let plain = S3Options::default();
    let _ = dataset::delete(&direct, &plain, &env);
    dataset::create(&direct, WB_LEN, WB_GROUP, &plain, &env).unwrap();
    let p = Proxy::start(&s.endpoint);
    // 1 s for every kind: a conditional PUT timed out after the server
    // stored it would be the "answer lost" case.
    let o = opts(Duration::from_secs(1));
    let st = S3Dataset::open_with(&via(&p, &name), true, &o, &env).unwrap();
    let pager = Pager::new(16 * MIB).unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().writable(true).folio(PART),
        )
        .unwrap();
    let w = r.words();
    let mut model = vec![0u64; w.len()];
    // Every folio read once (no faults): each group's version is known.
    for (i, x) in w.iter().enumerate().step_by((PART / 8) as usize) {
        assert_eq!(x.load(Relaxed), 0, "word {i}");
    }
    let other = other_version(s);
    let mut row = Row {
        kind: kind.into(),
        op: "write-back + flush",
        ..Row::default()
    };
    let mut rng = Rng(0xfeed ^ rounds);
    let url_text = format!("s3://{BUCKET}/{name}");
    let mut first_heal_error = None;
    for round in 0..rounds {
        // A few words in scattered folios (a folio is half a group: each
        // write-back reads its group back, then PUTs it).
        for _ in 0..6 {
            let i = rng.below(w.len() as u64) as usize;
            let v = rng.next() | 1;
            w[i].store(v, Relaxed);
            model[i] = v;
        }
        let k = kind.to_string();
        let other = other.clone();
        let seed = round;
        if kind == "refused" {
            p.listen(false);
            p.count_refused();
        } else {
            p.set_rule(move |r: &Req<'_>| {
                if chosen(r.n, seed, every) {
                    wb_fault(&k, r, &other)
                } else {
                    Fault::Pass
                }
            });
        }
        let t = Instant::now();
        let res = std::thread::scope(|sc| {
            if kind == "refused" {
                let p = &p;
                // Short outages are retried away; every fourth is longer
                // than the retries last.
                let d = if round % 4 == 3 {
                    1500
                } else {
                    30 + rng.below(100)
                };
                sc.spawn(move || {
                    std::thread::sleep(Duration::from_millis(d));
                    p.listen(true);
                });
            }
            // Writes while the flush runs (to folios it may be writing
            // back): they must survive, whatever the flush does.
            let seed = rng.next();
            let racing = sc.spawn(move || {
                let mut g = Rng(seed | 1);
                (0..6)
                    .map(|_| {
                        std::thread::sleep(Duration::from_millis(2));
                        let i = g.below(w.len() as u64) as usize;
                        let v = g.next() | 1;
                        w[i].store(v, Relaxed);
                        (i, v)
                    })
                    .collect::<Vec<_>>()
            });
            let res = r.flush();
            for (i, v) in racing.join().unwrap() {
                model[i] = v;
            }
            res
        });
        row.max_stall = row.max_stall.max(t.elapsed());
        row.calls += 1;
        if let Err(e) = res {
            row.errors += 1;
            let msg = e.to_string();
            assert!(
                msg.contains(&url_text),
                "the error names the dataset: {msg}"
            );
            if row.note.is_empty() {
                row.note = msg;
            }
        }
        // Healed: the data still dirty goes back now.
        p.heal();
        let t = Instant::now();
        let healed = r.flush();
        row.max_stall = row.max_stall.max(t.elapsed());
        if let Err(e) = healed {
            first_heal_error.get_or_insert_with(|| format!("round {round}: {e}"));
        }
    }
    row.injections = if kind == "refused" {
        p.stats.injected("refused")
    } else {
        p.stats.injected_total()
    };
    // What a reader sees, without the proxy.
    let check = S3Dataset::open_with(&direct, false, &plain, &env).unwrap();
    let mut buf = vec![0u8; WB_LEN as usize];
    check.read_at(&mut buf, 0).unwrap();
    row.lost = buf
        .chunks_exact(8)
        .zip(&model)
        .filter(|(c, m)| u64::from_le_bytes((*c).try_into().unwrap()) != **m)
        .count() as u64;
    if let Some(e) = &first_heal_error {
        row.note = format!("healed flush failed: {e}");
    }
    row.print();
    drop(r);
    drop(st);
    let _ = dataset::delete(&direct, &plain, &env);
    assert!(
        first_heal_error.is_none(),
        "{kind}: once the network healed, flush still failed: {}",
        first_heal_error.unwrap()
    );
    assert_eq!(row.lost, 0, "{kind}: words lost: {row:?}");
    assert!(
        row.max_stall <= dataset_bound(&o) * 2 + Duration::from_secs(5),
        "{kind}: a flush waited {:?}",
        row.max_stall
    );
    row
}

/// Write-back through resets before an answer, 503/500s, cut, truncated
/// and wrong-length bodies of the groups read back, and another version
/// of a group: a flush that could not write reports it naming the
/// dataset, the data stays dirty, the flush after healing succeeds, and
/// nothing is lost.
#[test]
fn write_back_under_errors_cut_bodies_and_another_version() {
    let Some(s) = server() else { return };
    let kinds = [
        "503",
        "reset request",
        "reset mid-body",
        "truncated body",
        "content-length short",
        "content-length long",
        "other version",
    ];
    for r in par(&kinds, |kind| writeback_case(s, kind, 12, 3)) {
        assert!(r.injections >= 12, "{r:?}");
    }
}

/// Write-back through stalls, drips and refused connections.
#[test]
fn write_back_under_stalls_drips_and_refused_connections() {
    let Some(s) = server() else { return };
    let kinds = [("stall", 6), ("drip", 6), ("refused", 12)];
    for r in par(&kinds, |(kind, rounds)| writeback_case(s, kind, rounds, 4)) {
        assert!(r.injections >= 6, "{r:?}");
    }
}

/// A conditional PUT (If-Match, or If-None-Match: * for a new group)
/// whose answer is lost after the server stored it: the write-back fails
/// (flush reports it and the data stays dirty), and the group is
/// "unsure": the next write-back asks the server (a HEAD) and, the
/// group's checksums being those of the bytes the lost PUT sent, takes
/// its new ETag as this store's. The flush after healing succeeds.
/// (Before the fix the store kept the old ETag, took its own stored write
/// for another writer's change, and no flush ever succeeded again.)
#[test]
fn write_back_whose_answer_is_lost_heals() {
    let Some(s) = server() else { return };
    let r = writeback_case(s, "answer lost", 8, 3);
    assert!(r.injections >= 4, "{r:?}");
}

// ---------------------------------------------------------------------
// Upload.

/// The faults of an upload's requests, by kind.
fn upload_fault(kind: &str, r: &Req<'_>) -> Fault {
    match (kind, r.method) {
        ("503", _) => Fault::Status(503),
        ("reset request", _) => Fault::ResetRequest,
        ("answer lost", "PUT") => Fault::ResetAfterApplied,
        ("stall", _) => Fault::Stall(Duration::from_millis(1500)),
        ("drip", _) => Fault::Drip {
            chunk: 64,
            every: Duration::from_millis(if r.n.is_multiple_of(2) { 2 } else { 200 }),
        },
        ("truncated body", "GET") => Fault::Truncate(20),
        ("reset mid-body", "GET") => Fault::ResetBody(20),
        _ => Fault::Pass,
    }
}

/// `dataset::load` of a 1 MiB file through the proxy, `rounds` times,
/// about one request in `every` given the fault: each load succeeds and
/// the dataset equals the file, or fails naming the dataset and leaves
/// no dataset visible (a reader's open finds none); counted as `lost`:
/// the words of a visible dataset that differ from the file.
fn upload_case(s: &Server, kind: &str, rounds: u64, every: u64) -> Row {
    let env = s.env();
    let plain = S3Options::default();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("up.bin");
    let len = MIB;
    let data = pattern(len, 0x5eed);
    std::fs::write(&file, &data).unwrap();
    let p = Proxy::start(&s.endpoint);
    let o = opts(Duration::from_secs(1));
    let mut row = Row {
        kind: kind.into(),
        op: "dataset upload",
        ..Row::default()
    };
    let mut torn = Vec::new();
    for round in 0..rounds {
        let name = format!("up-{}-{round}/", kind.replace(' ', "-"));
        let direct = s.url(BUCKET, &name);
        let _ = dataset::delete(&direct, &plain, &env);
        let k = kind.to_string();
        if kind == "refused" {
            p.listen(false);
            p.count_refused();
        } else {
            p.set_rule(move |r: &Req<'_>| {
                if chosen(r.n, round, every) {
                    upload_fault(&k, r)
                } else {
                    Fault::Pass
                }
            });
        }
        let t = Instant::now();
        let res = std::thread::scope(|sc| {
            if kind == "refused" {
                let p = &p;
                let d = if round % 4 == 3 {
                    1500
                } else {
                    30 + round * 20
                };
                sc.spawn(move || {
                    std::thread::sleep(Duration::from_millis(d));
                    p.listen(true);
                });
            }
            dataset::load(
                &via(&p, &name),
                &file,
                64 << 10,
                &o,
                &env,
                &AtomicBool::new(false),
                &mut |_, _| {},
            )
        });
        row.max_stall = row.max_stall.max(t.elapsed());
        row.calls += 1;
        p.heal();
        if let Err(e) = &res {
            row.errors += 1;
            let msg = e.to_string();
            assert!(msg.contains(&format!("s3://{BUCKET}/{name}")), "{msg}");
            if row.note.is_empty() {
                row.note = msg;
            }
        }
        // What a reader sees.
        match S3Dataset::open_with(&direct, false, &plain, &env) {
            Ok(d) => {
                let mut buf = vec![0u8; len as usize];
                let n = d.read_at(&mut buf, 0).unwrap();
                let wrong = buf[..n]
                    .chunks_exact(8)
                    .zip(data.chunks_exact(8))
                    .filter(|(a, b)| a != b)
                    .count() as u64
                    + (len - n as u64) / 8;
                if wrong > 0 {
                    torn.push(format!(
                        "round {round}: load said {:?}; a reader sees a dataset with {wrong} wrong words",
                        res.as_ref().map(|_| ()).map_err(|e| e.to_string())
                    ));
                }
                row.lost += wrong;
            }
            Err(e) => assert!(res.is_err(), "a load that succeeded left no dataset: {e}"),
        }
        let _ = dataset::delete(&direct, &plain, &env);
    }
    row.injections = if kind == "refused" {
        p.stats.injected("refused")
    } else {
        p.stats.injected_total()
    };
    if let Some(t) = torn.first() {
        row.note = t.clone();
    }
    row.print();
    assert!(torn.is_empty(), "{kind}: torn datasets visible: {torn:#?}");
    assert!(
        row.max_stall <= dataset_bound(&o) * 3,
        "{kind}: an upload call waited {:?}",
        row.max_stall
    );
    row
}

/// Uploads through 503s, resets, stalls, drips, cut answers to GETs and
/// refused connections: each either completes whole or leaves nothing a
/// reader can open.
#[test]
fn uploads_complete_or_leave_nothing() {
    let Some(s) = server() else { return };
    let kinds = [
        ("503", 8, 4),
        ("reset request", 8, 4),
        ("reset mid-body", 8, 2),
        ("truncated body", 8, 2),
        ("stall", 4, 6),
        ("drip", 4, 6),
        ("refused", 8, 1),
    ];
    for r in par(&kinds, |(kind, rounds, every)| {
        upload_case(s, kind, rounds, every)
    }) {
        assert!(r.injections >= 4, "{r:?}");
    }
}

/// An upload whose PUT answers are lost after the server stored them
/// (the claim, a group, the manifest). When the manifest's answer is
/// lost, `load` reads the manifest back: this upload's (its upload id)
/// means every group is there and the load succeeded; none, the groups
/// are removed; unknown, the manifest is removed before the groups. (Before
/// the fix a failed load removed the groups and kept the stored manifest:
/// readers saw a dataset of zeros.)
#[test]
fn uploads_whose_answers_are_lost_complete_or_leave_nothing() {
    let Some(s) = server() else { return };
    let r = upload_case(s, "answer lost", 10, 5);
    assert!(r.injections >= 4, "{r:?}");
}

// ---------------------------------------------------------------------
// Bytes checked end to end (issue 50, part 3).

/// A dataset's group whose bytes are flipped on the way (one bit of a GET
/// answer's body, under the right ETag, length and metadata): a read that
/// meets it once is asked again and served right; a read that meets it on
/// every try fails with an error naming the object, and no byte of it is
/// served; a write-back's read-modify-write of the group refuses to build
/// on it (the group on the server keeps its bytes), and writes once the
/// network heals. A format-1 dataset (before checksums) is read unchecked.
#[test]
fn a_flipped_bit_in_a_group_is_refused_not_served() {
    let Some(s) = server() else { return };
    let env = s.env();
    let plain = S3Options::default();
    let name = "flip/";
    let direct = s.url(BUCKET, name);
    let _ = dataset::delete(&direct, &plain, &env);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flip.bin");
    let len = MIB;
    let group = 256 << 10;
    let data = pattern(len, 0xf11b);
    std::fs::write(&file, &data).unwrap();
    let m = dataset::load(
        &direct,
        &file,
        group,
        &plain,
        &env,
        &AtomicBool::new(false),
        &mut |_, _| {},
    )
    .unwrap();
    assert!(m.checked);
    let p = Proxy::start(&s.endpoint);
    let o = opts(Duration::from_secs(1));
    let st = S3Dataset::open_with(&via(&p, name), true, &o, &env).unwrap();
    assert!(st.checksums_checked());
    let key = format!("{name}g/0000000001");
    let flips = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let rule = |times: u64| {
        let (key, flips) = (key.clone(), Arc::clone(&flips));
        move |r: &Req<'_>| {
            if r.method == "GET" && r.target.contains(&key) && flips.load(Relaxed) < times {
                flips.fetch_add(1, Relaxed);
                Fault::FlipBit(r.n.wrapping_mul(0x9E37_79B9) % (64 << 13))
            } else {
                Fault::Pass
            }
        }
    };
    // 64 KiB in group 1, one flip: asked again, served right.
    p.set_rule(rule(1));
    let mut buf = vec![0u8; 64 << 10];
    let at = group + (64 << 10);
    st.read_at(&mut buf, at).unwrap();
    assert_eq!(buf, data[at as usize..at as usize + buf.len()]);
    assert_eq!(st.counters().checksum_errors, 1);
    // Flipped on every try: refused, naming the object; nothing served.
    flips.store(0, Relaxed);
    p.set_rule(rule(u64::MAX));
    let mut buf = vec![0xAAu8; 64 << 10];
    let e = st.read_at(&mut buf, at).unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{msg}");
    assert!(msg.contains(&key) && msg.contains("checksum"), "{msg}");
    assert!(
        buf.iter().all(|&b| b == 0xAA),
        "bytes of a refused read served"
    );
    assert_eq!(st.counters().checksum_errors, 3);
    // A write-back that reads the group back (a folio of a quarter of the
    // group) refuses the flipped base: flush reports it naming the object;
    // healed, the flush writes, and the group keeps every other byte.
    p.heal();
    let pager = Pager::new(16 * MIB).unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().writable(true).folio(PART),
        )
        .unwrap();
    let words = r.words();
    let wi = ((group + 4096) / 8) as usize;
    assert_eq!(
        words[wi].load(Relaxed),
        u64::from_le_bytes(data[wi * 8..wi * 8 + 8].try_into().unwrap())
    );
    let v = 0x0123_4567_89ab_cdefu64;
    words[wi].store(v, Relaxed);
    flips.store(0, Relaxed);
    p.set_rule(rule(u64::MAX));
    let e = r.flush().expect_err("a write-back built on flipped bytes");
    assert!(e.to_string().contains(&key), "{e}");
    p.heal();
    r.flush().unwrap();
    drop(r);
    let off = wi as u64 * 8;
    let w = v.to_le_bytes();
    let check = S3Dataset::open_with(&direct, false, &plain, &env).unwrap();
    let mut all = vec![0u8; len as usize];
    check.read_at(&mut all, 0).unwrap();
    let mut want = data.clone();
    want[off as usize..off as usize + 8].copy_from_slice(&w);
    assert!(all == want, "the dataset after the healed write-back");
    eprintln!(
        "HOSTILE | bit flip | S3 dataset read_at + write-back | {} | {} checksum errors | 0 | - | {msg}",
        p.stats.injected("bit flip"),
        st.counters().checksum_errors
    );
    drop((st, check));
    let _ = dataset::delete(&direct, &plain, &env);
}

/// A write-back PUT whose body has a bit flipped on the way to the
/// server: the server refuses it (SigV4 signs the body's SHA-256,
/// `x-amz-content-sha256`, which the server checks against the bytes it
/// received), so the flush reports the error naming the dataset and the
/// data stays dirty; healed, the flush writes it, and the group on the
/// server is the bytes sent (its checksums check on the reader's side too).
#[test]
fn a_put_damaged_on_the_way_is_refused_by_the_server_and_written_again() {
    let Some(s) = server() else { return };
    let env = s.env();
    let plain = S3Options::default();
    let name = "flip-put/";
    let direct = s.url(BUCKET, name);
    let _ = dataset::delete(&direct, &plain, &env);
    dataset::create(&direct, WB_LEN, WB_GROUP, &plain, &env).unwrap();
    let p = Proxy::start(&s.endpoint);
    let o = opts(Duration::from_secs(1));
    let st = S3Dataset::open_with(&via(&p, name), true, &o, &env).unwrap();
    let pager = Pager::new(16 * MIB).unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().writable(true).folio(PART),
        )
        .unwrap();
    let w = r.words();
    let mut model = vec![0u64; w.len()];
    let mut rng = Rng(0xf1);
    let mut refused = 0;
    let mut note = None;
    for round in 0..4u64 {
        for _ in 0..4 {
            let i = rng.below(w.len() as u64) as usize;
            let v = rng.next() | 1;
            w[i].store(v, Relaxed);
            model[i] = v;
        }
        p.set_rule(move |r: &Req<'_>| {
            if r.method == "PUT" {
                Fault::FlipRequestBit(r.n.wrapping_mul(0x9E37_79B9) ^ round)
            } else {
                Fault::Pass
            }
        });
        if let Err(e) = r.flush() {
            refused += 1;
            let msg = e.to_string();
            assert!(msg.contains(&format!("s3://{BUCKET}/{name}")), "{msg}");
            note.get_or_insert(msg);
        }
        p.heal();
        r.flush().unwrap();
    }
    let check = S3Dataset::open_with(&direct, false, &plain, &env).unwrap();
    let mut buf = vec![0u8; WB_LEN as usize];
    check.read_at(&mut buf, 0).unwrap();
    let lost = buf
        .chunks_exact(8)
        .zip(&model)
        .filter(|(c, m)| u64::from_le_bytes((*c).try_into().unwrap()) != **m)
        .count();
    eprintln!(
        "HOSTILE | request bit flip | S3 dataset write-back + flush | {} | 4 calls, {refused} errors reported | {lost} | - | {}",
        p.stats.injected("request bit flip"),
        note.unwrap_or_default()
    );
    assert_eq!(refused, 4, "every flush whose PUTs were damaged failed");
    assert_eq!(lost, 0);
    drop((r, st, check));
    let _ = dataset::delete(&direct, &plain, &env);
}
