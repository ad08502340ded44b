//! The S3 store against a real SeaweedFS (master, three volume servers
//! with replication 001, filer with the S3 gateway; scripts/seaweedfs.sh):
//! reads equal the object under a budget, GETs in flight together, an
//! ETag change refused (SIGBUS in a child process, reason logged), clear
//! errors, and a server killed mid-scan ending the access in SIGBUS within
//! its bound. Ports: 22300.. (shared server), 22320.. (the killed one).

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upager::{ErrorCode, MapOptions, Pager, ReadReq, Store};
use upager_s3::{OpenError, S3Options, S3Store};

const SHARED: u16 = 22300;

fn shared(bucket: &str) -> Option<&'static Server> {
    Server::shared_bucket(SHARED, bucket)
}

#[test]
fn an_object_reads_back_whole_under_a_budget_smaller_than_it() {
    let Some(s) = shared("reads") else { return };
    let len = 24 * MIB;
    let seed = 0x51;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("obj");
    std::fs::write(&file, pattern(len, seed)).unwrap();
    // Multipart: 3 parts of 8 MiB.
    let etag = s.objects("reads").upload(&file, "big/w.bin").unwrap();
    // Parts of 512 KiB: a full readahead window (2 MiB) is 4 GETs.
    let st = S3Store::open_with(
        &s.url("reads", "big/w.bin"),
        &S3Options::default().part(512 << 10),
        &s.env(),
    )
    .unwrap();
    assert_eq!(st.len(), len);
    assert_eq!(st.etag(), etag);
    assert!(!st.writable());
    let budget = 4 * MIB;
    // No disk tier: this test counts the GETs (a tier would serve an
    // object of the same ETag from an earlier run).
    let pager = Pager::builder()
        .budget(budget)
        .cache_size(0)
        .build()
        .unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().folio(upager_s3::DEFAULT_FOLIO),
        )
        .unwrap();
    let t = Instant::now();
    let w = r.words();
    for i in 0..len / 8 {
        assert_eq!(w[i as usize].load(Relaxed), word(i, seed), "word {i}");
    }
    let scan = t.elapsed();
    let mut x = 0x1234_5678u64;
    for _ in 0..5000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = x % (len / 8);
        assert_eq!(w[i as usize].load(Relaxed), word(i, seed), "word {i}");
    }
    let stats = pager.stats();
    let c = st.counters();
    eprintln!(
        "scan of {} MiB in {scan:?} ({:.0} MiB/s); peak resident {} of {budget}; {c:?}",
        len >> 20,
        (len >> 20) as f64 / scan.as_secs_f64(),
        stats.resident_peak_bytes,
    );
    assert!(stats.evictions > 0);
    assert!(stats.resident_peak_bytes <= budget + 4 * MIB);
    assert!(c.bytes_received >= len, "{c:?}");
    assert_eq!(c.get_errors, 0);
    // Readahead windows travel as several GETs at once.
    assert!(c.gets_in_flight_peak >= 2, "{c:?}");
}

/// An upload says how far it got, a cancelled one publishes nothing (its
/// multipart upload aborted), and a source that is not a regular file is
/// refused before anything is sent, for an object and a dataset alike
/// (before: /dev/zero was uploaded without end as an object, and as an
/// empty dataset).
#[test]
fn uploads_report_progress_stop_when_cancelled_and_take_regular_files_only() {
    use std::sync::atomic::AtomicBool;
    use upager_s3::UploadError;
    // (The first test's bucket: a bucket is a SeaweedFS collection that
    // takes volumes of its own, and the shared server's 96 volume slots,
    // three servers of 32, hold the other tests' eight; with a ninth
    // bucket a part's PUT waited past the client's 30 s in the suite.)
    let Some(s) = shared("reads") else { return };
    let o = s.objects("reads");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, pattern(40 * MIB, 3)).unwrap();
    let mut seen = Vec::new();
    let no = AtomicBool::new(false);
    o.upload_with(&file, "up/whole", &no, &mut |d, t| seen.push((d, t)))
        .unwrap();
    // Five parts of 8 MiB: a batch of four, then the last.
    assert_eq!(
        seen,
        [(0, 40 * MIB), (32 * MIB, 40 * MIB), (40 * MIB, 40 * MIB)]
    );
    let keys = |o: &upager_s3::Objects| -> Vec<String> {
        o.list("up/").unwrap().into_iter().map(|(k, _)| k).collect()
    };
    assert_eq!(keys(&o), ["up/whole"]);

    let cancel = AtomicBool::new(false);
    let e = o
        .upload_with(&file, "up/cancelled", &cancel, &mut |d, _| {
            if d > 0 {
                cancel.store(true, Relaxed);
            }
        })
        .unwrap_err();
    assert!(matches!(e, UploadError::Cancelled { .. }), "{e}");
    assert!(e.to_string().contains("nothing was published"), "{e}");
    assert_eq!(
        keys(&o),
        ["up/whole"],
        "a cancelled upload published nothing"
    );

    let env = s.env();
    for (path, kind) in [("/dev/zero", "character device"), ("/tmp", "directory")] {
        let e = o
            .upload(std::path::Path::new(path), "up/special")
            .unwrap_err();
        assert!(
            matches!(e, UploadError::Source(upager::OpenRegularError::NotRegular { kind: k, .. }) if k == kind),
            "{path}: {e}"
        );
        let url = s.url("reads", "special/");
        let e = load_dataset(&url, std::path::Path::new(path), 256 << 10, &env, false).unwrap_err();
        assert!(
            matches!(e, upager_s3::DatasetError::Source(upager::OpenRegularError::NotRegular { kind: k, .. }) if k == kind),
            "{path}: {e}"
        );
        assert_eq!(e.errno(), libc::EINVAL);
    }
    assert_eq!(keys(&o), ["up/whole"]);
    let all: Vec<String> = o.list("").unwrap().into_iter().map(|(k, _)| k).collect();
    assert!(!all.iter().any(|k| k.starts_with("special/")), "{all:?}");
}

/// One `read_batch` of 64 KiB reads at `offs`: the buffers and how many
/// bytes each read got (every read must succeed).
fn read_batch_64k(st: &S3Store, offs: &[u64]) -> (Vec<Vec<u8>>, Vec<usize>) {
    let mut bufs: Vec<Vec<u8>> = vec![vec![0; 65536]; offs.len()];
    let mut reqs: Vec<ReadReq<'_>> = bufs
        .iter_mut()
        .zip(offs)
        .map(|(b, &offset)| ReadReq {
            buf: b.as_mut_slice(),
            offset,
        })
        .collect();
    let got = st
        .read_batch(&mut reqs)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    (bufs, got)
}

#[test]
fn read_at_and_read_batch_split_long_reads_and_read_batch_merges_adjacent_ones() {
    let Some(s) = shared("parts") else { return };
    let len = 3 * MIB + 100; // not a multiple of a page
    let data = pattern(len + 4, 7)[..len as usize].to_vec();
    s.objects("parts").put("p.bin", data.clone()).unwrap();
    let opts = S3Options::default().part(MIB).in_flight(8);
    let st = S3Store::open_with(&s.url("parts", "p.bin"), &opts, &s.env()).unwrap();
    // One read of 4 MiB: 4 GETs (the last of 100 bytes), clipped at the end.
    let mut buf = vec![0u8; 4 * MIB as usize];
    assert_eq!(st.read_at(&mut buf, 0).unwrap(), len as usize);
    assert_eq!(&buf[..len as usize], &data[..]);
    assert_eq!(st.counters().gets, 4);
    assert!(
        st.counters().gets_in_flight_peak >= 2,
        "{:?}",
        st.counters()
    );
    assert_eq!(st.read_at(&mut buf[..4096], len).unwrap(), 0);
    // A batch: two adjacent reads (one GET), one apart, one past the end,
    // one clipped.
    let offs = [0u64, 65536, MIB, len + 8192, len - 100];
    let before = st.counters().gets;
    let (bufs, got) = read_batch_64k(&st, &offs);
    assert_eq!(got, [65536, 65536, 65536, 0, 100]);
    assert_eq!(st.counters().gets - before, 3, "adjacent reads merged");
    for (b, off) in bufs.iter().zip(offs) {
        let n = (len.saturating_sub(off)).min(65536) as usize;
        if n == 0 {
            continue;
        }
        assert_eq!(&b[..n], &data[off as usize..off as usize + n]);
    }
    // A batch read longer than a part (a readahead window of the prefetch
    // thread) is cut in parts as read_at cuts it, their GETs in flight
    // together; a short read after it is its own GET.
    let mut long = vec![0u8; (2 * MIB + 8192) as usize];
    let mut short = vec![0u8; 4096];
    let before = st.counters();
    let got: Vec<usize> = st
        .read_batch(&mut [
            ReadReq {
                buf: &mut long,
                offset: 4096,
            },
            ReadReq {
                buf: &mut short,
                offset: 2 * MIB + 12288,
            },
        ])
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got, [long.len(), 4096]);
    assert_eq!(&long[..], &data[4096..4096 + long.len()]);
    assert_eq!(&short[..], &data[(2 * MIB + 12288) as usize..][..4096]);
    let after = st.counters();
    assert_eq!(after.gets - before.gets, 4, "3 parts and the short read");
    assert!(after.gets_in_flight_peak >= 2, "{after:?}");
}

/// A batch's reads at most `gap` apart go in one GET that reads the gap
/// and drops it (counted in `store_gap_bytes`); a wider gap, a read that
/// goes back, or a GET that would pass `part` starts another GET; with a
/// gap of 0 only adjacent reads share one. Every read gets its own bytes.
#[test]
fn read_batch_reads_through_small_gaps() {
    let Some(s) = shared("gaps") else { return };
    let len = 4 * MIB;
    let data = pattern(len, 9);
    s.objects("gaps").put("g.bin", data.clone()).unwrap();
    const K: u64 = 1024;
    // With a gap of 128K and parts of 256K: 0 and 128K, a 64K gap (one
    // GET); 1M, 832K on (another); 1M+192K, a gap of 128K, the limit (the
    // same GET, 256K long: part's size); 512K goes back (another); 3M
    // (another) and 3M+192K (the same); 3M+320K, 64K on, would make that
    // GET 384K long (another).
    let offs = [
        0,
        128 * K,
        MIB,
        MIB + 192 * K,
        512 * K,
        3 * MIB,
        3 * MIB + 64 * K + 128 * K,
        3 * MIB + 320 * K,
    ];
    let read = |gap: u64| {
        let opts = S3Options::default().part(256 * K).gap(gap);
        let st = S3Store::open_with(&s.url("gaps", "g.bin"), &opts, &s.env()).unwrap();
        let (bufs, got) = read_batch_64k(&st, &offs);
        assert_eq!(got, vec![65536; offs.len()]);
        for (b, off) in bufs.iter().zip(offs) {
            assert_eq!(
                &b[..],
                &data[off as usize..off as usize + 65536],
                "at {off}"
            );
        }
        st.counters()
    };
    let c = read(128 * K);
    assert_eq!(c.gets, 5, "{c:?}");
    assert_eq!(c.gap_bytes, 64 * K + 128 * K + 128 * K, "{c:?}");
    assert_eq!(c.bytes_received, 8 * 64 * K + c.gap_bytes);
    let c = read(0);
    assert_eq!(c.gets, 8, "no two reads adjacent: {c:?}");
    assert_eq!(c.gap_bytes, 0);
}

#[test]
fn missing_object_bucket_bad_credentials_and_no_server_are_clear_errors() {
    let Some(s) = shared("errs") else { return };
    s.objects("errs").put("there", vec![1; 4096]).unwrap();
    let o = S3Options::default().retry(1, Duration::from_secs(2));
    let open = |url, env: &TestEnv| S3Store::open_with(&url, &o, env).unwrap_err();

    let e = open(s.url("errs", "not-there"), &s.env());
    assert!(matches!(e, OpenError::NoObject { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("no such object 'not-there' in bucket 'errs'"),
        "{e}"
    );
    assert_eq!(e.errno(), libc::ENOENT);

    let e = open(s.url("no-such-bucket", "k"), &s.env());
    assert!(matches!(e, OpenError::NoBucket { .. }), "{e}");
    assert!(
        e.to_string().contains("no such bucket 'no-such-bucket'"),
        "{e}"
    );
    // The same for a dataset's open and listing and a bucket's listing
    // (before: the server's XML answer, "Generic S3 error ... NoSuchBucket").
    use upager_s3::dataset::{self, DatasetError};
    let ds = s.url("no-such-bucket", "ds/");
    let no_bucket = |e: &DatasetError| {
        matches!(e, DatasetError::Open(OpenError::NoBucket { .. })) && e.errno() == libc::ENOENT
    };
    let e = upager_s3::S3Dataset::open_with(&ds, false, &o, &s.env()).unwrap_err();
    assert!(no_bucket(&e), "{e}");
    let e = dataset::list(&ds, &o, &s.env()).unwrap_err();
    assert!(no_bucket(&e), "{e}");
    let objects =
        upager_s3::Objects::open_with(&s.url("no-such-bucket", ""), &o, &s.env()).unwrap();
    let e = objects.list("").unwrap_err();
    assert!(
        matches!(e, upager_s3::UploadError::Open(OpenError::NoBucket { .. })),
        "{e}"
    );

    let bad = TestEnv::new(&[
        ("AWS_ACCESS_KEY_ID", KEY),
        ("AWS_SECRET_ACCESS_KEY", "wrong-secret-1234"),
    ]);
    let e = open(s.url("errs", "there"), &bad);
    let msg = e.to_string();
    assert!(matches!(e, OpenError::Denied { .. }), "{msg}");
    assert!(msg.contains("refused the credentials"), "{msg}");
    assert!(msg.contains(KEY), "names the key id: {msg}");
    assert!(
        !msg.contains("wrong-secret-1234"),
        "never the secret: {msg}"
    );
    assert_eq!(e.errno(), libc::EACCES);

    let unknown = TestEnv::new(&[
        ("AWS_ACCESS_KEY_ID", "AKIDNOBODY"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
    ]);
    let e = open(s.url("errs", "there"), &unknown);
    assert!(matches!(e, OpenError::Denied { .. }), "{e}");

    let e = open(s.url("errs", "there"), &TestEnv::new(&[]));
    assert!(
        e.to_string()
            .contains("no credentials for http://127.0.0.1"),
        "{e}"
    );
    assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");

    // Anonymous reads are allowed on the test server: ?unsigned=1.
    let url = format!("s3://errs/there?endpoint={}&unsigned=1", s.endpoint);
    let st = S3Store::open_with(&url.parse().unwrap(), &o, &TestEnv::new(&[])).unwrap();
    assert_eq!(st.len(), 4096);

    let t = Instant::now();
    let url = "s3://errs/there?endpoint=http://127.0.0.1:1"
        .parse()
        .unwrap();
    let e = open(url, &s.env());
    assert!(matches!(e, OpenError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("scripts/seaweedfs.sh start"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());

    let pager = Pager::new(MIB).unwrap();
    let e = upager_s3::map(
        &pager,
        &s.url("errs", "there"),
        &MapOptions::new().writable(true),
        &o,
    )
    .unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    assert_eq!(e.errno(), libc::EROFS);
}

#[test]
fn a_replaced_object_is_refused_not_mixed() {
    let Some(s) = shared("versions") else { return };
    let o = s.objects("versions");
    o.put("v", pattern(MIB, 1)).unwrap();
    let st = S3Store::open_with(&s.url("versions", "v"), &S3Options::default(), &s.env()).unwrap();
    let mut buf = vec![0u8; 65536];
    st.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, pattern(65536, 1));
    o.put("v", pattern(MIB, 2)).unwrap();
    let e = st.read_at(&mut buf, 65536).unwrap_err().to_string();
    assert!(
        e.contains("was replaced or deleted since it was opened"),
        "{e}"
    );
    assert!(e.contains("map the object again"), "{e}");
    assert_eq!(st.counters().etag_mismatches, 1);
    o.delete("v").unwrap();
    assert!(st.read_at(&mut buf, 0).is_err(), "a deleted object too");
}

#[test]
fn an_object_keeps_its_warm_start_trace_beside_it() {
    let Some(s) = shared("warm") else { return };
    let o = s.objects("warm");
    let len = 16 * MIB;
    let folio = upager_s3::DEFAULT_FOLIO;
    o.put("w.bin", pattern(len, 7)).unwrap();
    let folios = len / folio;
    let order: Vec<u64> = (0..folios).map(|k| (k * 97) % folios).take(150).collect();
    let gather = |how: upager::WarmStart, seed: u64| {
        let st =
            S3Store::open_with(&s.url("warm", "w.bin"), &S3Options::default(), &s.env()).unwrap();
        let pager = Pager::new(8 * MIB).unwrap();
        let r = pager
            .map_store(st, &MapOptions::new().folio(folio).warm(how))
            .unwrap();
        for &f in &order {
            let i = f * folio / 8;
            assert_eq!(
                r.words()[i as usize].load(Relaxed),
                word(i, seed),
                "folio {f}"
            );
            // Work per folio, as a program has: replay's GETs go out while
            // the program works.
            std::thread::sleep(Duration::from_micros(500));
        }
        drop(r);
        pager.stats()
    };
    let trace_kept = || {
        o.list("")
            .unwrap()
            .iter()
            .any(|(k, _)| *k == upager_s3::store::trace_key("w.bin"))
    };
    let cold = gather(upager::WarmStart::Auto, 7);
    assert_eq!(cold.replay_reads, 0);
    assert!(trace_kept(), "the trace is kept beside the object");
    let warm = gather(upager::WarmStart::Auto, 7);
    eprintln!(
        "faults: {} cold, {} replayed ({} folios read by replay, {} hits)",
        cold.faults_missing, warm.faults_missing, warm.replay_reads, warm.replay_hits
    );
    assert!(warm.replay_reads >= 120, "{warm:?}");
    assert!(
        warm.faults_missing * 2 <= cold.faults_missing,
        "faults: {} cold, {} replayed",
        cold.faults_missing,
        warm.faults_missing
    );
    // Other data under the name (a new ETag): the old trace is not
    // replayed, and a new one replaces it.
    o.put("w.bin", pattern(len, 8)).unwrap();
    let again = gather(upager::WarmStart::Auto, 8);
    assert_eq!(
        again.replay_reads, 0,
        "a trace of the object replaced: {again:?}"
    );
    assert!(gather(upager::WarmStart::Auto, 8).replay_reads >= 120);
    o.delete("w.bin").unwrap();
    assert!(!trace_kept(), "delete removes the trace too");
}

/// Child process (see the tests below): maps the object of
/// UPAGER_S3_CHILD_URL (credentials from its environment), reads folio 0,
/// says READY, waits for a line, checks folio 0 (resident) still reads,
/// then reads the object from 1 MiB on (SIGBUS expected somewhere).
#[test]
fn child_main() {
    let Ok(url) = std::env::var("UPAGER_S3_CHILD_URL") else {
        return;
    };
    upager::log_to_stderr();
    let s3 = S3Options::default()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .retry(3, Duration::from_millis(1500));
    let pager = Pager::builder().budget(8 * MIB).build().unwrap();
    let r = upager_s3::map(&pager, &url.parse().unwrap(), &MapOptions::new(), &s3).unwrap();
    let first = r.words()[0].load(Relaxed);
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
    let mut sum = 0u64;
    for i in (MIB / 8..r.len() as u64 / 8).step_by(512) {
        sum = sum.wrapping_add(r.words()[i as usize].load(Relaxed));
    }
    say(format!("not reached: {sum}"));
}

/// Runs [`child_main`] on `url`; once it is READY, `act()`; then lets it
/// go on and returns its exit status, its stdout and stderr, and the time
/// from `act` to its end. Every wait is bounded (60 s).
fn child_run(
    s: &Server,
    url: &upager_s3::S3Url,
    act: impl FnOnce(),
) -> (std::process::ExitStatus, String, String, Duration) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("UPAGER_S3_CHILD_URL", url.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in s.env_vars() {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut err = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let limit = Instant::now() + Duration::from_secs(60);
    loop {
        match lines.recv_timeout(limit.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains("READY") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("no READY from the child within 60 s: {e:?}");
            }
        }
    }
    let t = Instant::now();
    act();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
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
    let took = t.elapsed();
    let mut rest = String::new();
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(1)) {
        rest.push_str(&l);
        rest.push('\n');
    }
    (status, rest, errs.join().unwrap(), took)
}

#[test]
fn an_object_replaced_under_a_mapping_ends_the_access_in_sigbus_with_the_reason_logged() {
    let Some(s) = shared("replaced") else { return };
    let o = s.objects("replaced");
    o.put("obj", pattern(4 * MIB, 3)).unwrap();
    let (status, out, err, took) = child_run(s, &s.url("replaced", "obj"), || {
        o.put("obj", pattern(4 * MIB, 4)).unwrap();
    });
    eprintln!("replaced: child ended {took:?} after the replacement: {status:?}");
    assert!(out.contains("RESIDENT OK"), "{out}\n{err}");
    assert!(!out.contains("not reached"), "{out}\n{err}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{err}");
    assert!(err.contains("gets SIGBUS"), "{err}");
    assert!(
        err.contains("was replaced or deleted since it was opened"),
        "{err}"
    );
}

/// A volume server killed: replicated objects still read. Then the S3
/// gateway (the filer) killed mid-scan: the access ends in SIGBUS with a
/// logged reason within the store's bounds, not a hang.
#[test]
fn a_server_killed_mid_scan_ends_the_access_in_sigbus_not_a_hang() {
    let Some(s) = Server::start(22320) else {
        return;
    };
    s.bucket("kill");
    let len = 16 * MIB;
    s.objects("kill").put("obj", pattern(len, 5)).unwrap();
    let url = s.url("kill", "obj");

    // One volume server gone (replication 001: another has every object).
    let out = s.run(&["kill", "volume1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = S3Store::open_with(&url, &S3Options::default(), &s.env()).unwrap();
    let mut buf = vec![0u8; len as usize];
    let t = Instant::now();
    assert_eq!(st.read_at(&mut buf, 0).unwrap(), len as usize);
    assert!(buf == pattern(len, 5), "read with a volume server killed");
    eprintln!("read 16 MiB with volume1 killed in {:?}", t.elapsed());
    drop(st);

    let (status, out, err, took) = child_run(&s, &url, || {
        let out = s.run(&["kill", "filer"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    eprintln!("server killed: child ended {took:?} after the kill: {status:?}");
    assert!(out.contains("RESIDENT OK"), "{out}\n{err}");
    assert!(!out.contains("not reached"), "{out}\n{err}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{err}");
    assert!(err.contains("gets SIGBUS"), "{err}");
    assert!(err.contains("failed after the client's retries"), "{err}");
    // Bounded: retry_for 1.5 s + timeout 2 s + the guard's slack.
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// `dataset::load` without progress; `cancelled`: with the cancel flag set.
fn load_dataset(
    url: &upager_s3::S3Url,
    file: &std::path::Path,
    group: u64,
    env: &TestEnv,
    cancelled: bool,
) -> Result<upager_s3::dataset::Manifest, upager_s3::DatasetError> {
    let cancel = std::sync::atomic::AtomicBool::new(cancelled);
    let opts = S3Options::default();
    upager_s3::dataset::load(url, file, group, &opts, env, &cancel, &mut |_, _| {})
}

/// The first `len` bytes of `st` (all of them there), as little-endian
/// words.
fn store_words(st: &dyn Store, len: u64) -> Vec<u64> {
    let mut buf = vec![0u8; len as usize];
    assert_eq!(st.read_at(&mut buf, 0).unwrap(), len as usize);
    buf.chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

/// A dataset (`s3://BUCKET/NAME/`) loaded from a file, mapped writable
/// under a budget smaller than it: every byte reads back, scattered writes
/// go back as read-modify-writes of their groups and whole-group PUTs, and
/// a fresh open sees them all; list, the refusals of a second load or
/// create, and delete.
#[test]
fn a_dataset_loads_maps_writable_and_keeps_every_write() {
    use upager_s3::dataset::{self, DatasetError};
    let Some(s) = shared("datasets") else { return };
    let env = s.env();
    let opts = S3Options::default();
    let url = s.url("datasets", "rw/d1/");
    let len = 6 * MIB + 64 * 1024;
    let seed = 0x77;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d1");
    let mut data = pattern(len, seed);
    // A MiB of zeros: its group is not stored, and reads back as zeros.
    data[2 * MIB as usize..3 * MIB as usize].fill(0);
    std::fs::write(&file, &data).unwrap();
    let group = MIB;
    let mut steps = Vec::new();
    let m = dataset::load(
        &url,
        &file,
        group,
        &opts,
        &env,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |done, all| steps.push((done, all)),
    )
    .unwrap();
    assert_eq!((m.len, m.group), (len, group));
    assert_eq!(steps.last(), Some(&(len, len)), "progress ends at the size");
    let keys = s.objects("datasets").list("rw/d1").unwrap();
    assert_eq!(
        keys.len(),
        1 + 6,
        "manifest + 7 groups less the zero one: {keys:?}"
    );
    // A second load, or a create, of the name is refused; nothing changes.
    let e = load_dataset(&url, &file, group, &env, false).unwrap_err();
    assert!(matches!(e, DatasetError::Exists { .. }), "{e}");
    assert_eq!(e.errno(), libc::EEXIST);
    let e = dataset::create(&url, MIB, group, &opts, &env).unwrap_err();
    assert!(matches!(e, DatasetError::Exists { .. }), "{e}");
    assert_eq!(s.objects("datasets").list("rw/d1").unwrap().len(), 7);

    let budget = MIB;
    let pager = Pager::new(budget).unwrap();
    let st = upager_s3::S3Dataset::open_with(&url, true, &opts, &env).unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new()
                .writable(true)
                .folio(upager_s3::DEFAULT_FOLIO),
        )
        .unwrap();
    let w = r.words();
    let expect = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    for i in (0..w.len()).step_by(97) {
        assert_eq!(w[i].load(Relaxed), expect(i), "word {i}");
    }
    // Scattered writes (a word per 40 KiB: read-modify-write of groups) and
    // one whole group written (a PUT without a read).
    let mut written = std::collections::HashMap::new();
    for i in (3..w.len()).step_by(5 * 1024 + 7) {
        w[i].store(!expect(i), Relaxed);
        written.insert(i, !expect(i));
    }
    let g4 = (4 * MIB / 8) as usize;
    for (i, x) in w.iter().enumerate().skip(g4).take((MIB / 8) as usize) {
        x.store(i as u64 ^ 0xabcd, Relaxed);
        written.insert(i, i as u64 ^ 0xabcd);
    }
    r.flush().unwrap();
    let c = st.counters();
    assert!(c.puts >= 7, "{c:?}");
    assert!(c.rmw_groups >= 1, "{c:?}");
    assert_eq!(
        (c.conflicts, c.put_errors, c.get_errors),
        (0, 0, 0),
        "{c:?}"
    );
    assert!(pager.stats().resident_peak_bytes <= budget);
    drop(r);
    drop(st);
    // A fresh open sees every write, and the rest as loaded.
    let st = upager_s3::S3Dataset::open_with(&url, false, &opts, &env).unwrap();
    for (i, got) in store_words(&*st, len).into_iter().enumerate() {
        let want = written.get(&i).copied().unwrap_or_else(|| expect(i));
        assert_eq!(got, want, "word {i} after a fresh open");
    }
    // list, delete, and the dataset is gone.
    let all = dataset::list(&s.url("datasets", "rw/"), &opts, &env).unwrap();
    assert!(
        all.iter().any(|d| d.name == "rw/d1/" && d.len == Some(len)),
        "{all:?}"
    );
    // 7 groups now: the scattered writes made the zero group too.
    assert_eq!(dataset::delete(&url, &opts, &env).unwrap(), 7);
    assert!(s.objects("datasets").list("rw/d1").unwrap().is_empty());
    let e = upager_s3::S3Dataset::open_with(&url, false, &opts, &env).unwrap_err();
    assert!(matches!(e, DatasetError::NoDataset { .. }), "{e}");
    assert_eq!(e.errno(), libc::ENOENT);
}

/// A writable dataset's region takes its group as its default folio
/// (`upager_s3::default_folio`): scattered writes, evicted under a budget
/// smaller than them and flushed, go back as whole-group PUTs, none read
/// back first; a read-only map, and a dataset of groups over 1 MiB, keep
/// 64 KiB folios.
#[test]
fn a_writable_dataset_is_mapped_in_folios_of_its_group_and_never_reads_one_back() {
    use upager_s3::dataset;
    let Some(s) = shared("datasets") else { return };
    let env = s.env();
    let opts = S3Options::default();
    let url = s.url("datasets", "rw/groupfolio/");
    let big = s.url("datasets", "rw/groupfolio4m/");
    let _ = dataset::delete(&url, &opts, &env);
    let _ = dataset::delete(&big, &opts, &env);
    let len = 4 * MIB;
    dataset::create(&url, len, dataset::DEFAULT_GROUP, &opts, &env).unwrap();
    dataset::create(&big, 8 * MIB, 4 * MIB, &opts, &env).unwrap();
    let open = |u: &upager_s3::S3Url, w: bool| -> Arc<dyn Store> {
        upager_s3::S3Dataset::open_with(u, w, &opts, &env).unwrap()
    };
    assert_eq!(
        upager_s3::default_folio(&*open(&url, true)),
        dataset::DEFAULT_GROUP
    );
    assert_eq!(
        upager_s3::default_folio(&*open(&url, false)),
        upager_s3::DEFAULT_FOLIO
    );
    assert_eq!(
        upager_s3::default_folio(&*open(&big, true)),
        upager_s3::DEFAULT_FOLIO
    );

    let st = upager_s3::S3Dataset::open_with(&url, true, &opts, &env).unwrap();
    let folio = upager_s3::default_folio(&*st);
    let budget = MIB; // four groups: the writes below evict each other
    let pager = Pager::new(budget).unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().writable(true).folio(folio),
        )
        .unwrap();
    assert_eq!(r.folio_size(), folio);
    let w = r.words();
    // One word in each group, at a different place in each.
    let groups = (len / dataset::DEFAULT_GROUP) as usize;
    let per = (dataset::DEFAULT_GROUP / 8) as usize;
    let at = |g: usize| g * per + (g * 4099) % per;
    for g in 0..groups {
        w[at(g)].store(0x5eed_0000 + g as u64, Relaxed);
    }
    r.flush().unwrap();
    let c = st.counters();
    assert_eq!(c.rmw_groups, 0, "no group read back: {c:?}");
    assert!(c.puts >= groups as u64, "{c:?}");
    assert_eq!((c.conflicts, c.put_errors), (0, 0), "{c:?}");
    assert!(pager.stats().resident_peak_bytes <= budget);
    drop(r);
    drop(st);
    let st = open(&url, false);
    for (i, got) in store_words(&*st, len).into_iter().enumerate() {
        let g = i / per;
        let want = if i == at(g) {
            0x5eed_0000 + g as u64
        } else {
            0
        };
        assert_eq!(got, want, "word {i}");
    }
    dataset::delete(&url, &opts, &env).unwrap();
    dataset::delete(&big, &opts, &env).unwrap();
}

/// Two writers of one dataset: the second to write back a group the first
/// changed is refused with a message (its writes stay dirty, flush says
/// why) and the first writer's data is kept; an interrupted upload is
/// invisible, listed as incomplete, refused to a second upload, and
/// removed by delete.
#[test]
fn two_writers_of_a_dataset_do_not_lose_each_others_writes() {
    use upager_s3::dataset::{self, DatasetError};
    let Some(s) = shared("datasets") else { return };
    let env = s.env();
    let opts = S3Options::default();
    let url = s.url("datasets", "rw/two/");
    let _ = dataset::delete(&url, &opts, &env);
    dataset::create(&url, 2 * MIB, 64 << 10, &opts, &env).unwrap();
    let map = |p: &Pager| {
        let st = upager_s3::S3Dataset::open_with(&url, true, &opts, &env).unwrap();
        let r = p
            .map_store(
                Arc::clone(&st) as Arc<dyn Store>,
                &MapOptions::new().writable(true).folio(4096),
            )
            .unwrap();
        (st, r)
    };
    let (pa, pb) = (Pager::new(4 * MIB).unwrap(), Pager::new(4 * MIB).unwrap());
    let (sa, a) = map(&pa);
    let (_sb, b) = map(&pb);
    // A created dataset reads as zeros; A writes group 0 first.
    assert_eq!(a.words()[10].load(Relaxed), 0);
    a.words()[0].store(0xa1, Relaxed);
    a.flush().unwrap();
    // B reads group 0 as A left it, and writes another page of it.
    assert_eq!(b.words()[0].load(Relaxed), 0xa1);
    b.words()[1024].store(0xb1, Relaxed);
    b.flush().unwrap();
    // A writes its resident page of group 0 again: its version of the
    // group is stale, the PUT is refused. (A fill of another page of the
    // group would be refused too: SIGBUS, the same message logged.)
    a.words()[1].store(0xa2, Relaxed);
    let e = a.flush().unwrap_err().to_string();
    assert!(e.contains("changed by another writer"), "{e}");
    assert!(sa.counters().conflicts >= 1);
    let fresh = upager_s3::S3Dataset::open_with(&url, false, &opts, &env).unwrap();
    let mut buf = vec![0u8; 3 * 4096];
    fresh.read_at(&mut buf, 0).unwrap();
    let word = |off: usize| u64::from_le_bytes(buf[off..off + 8].try_into().unwrap());
    assert_eq!(
        (word(0), word(8), word(8192)),
        (0xa1, 0, 0xb1),
        "B's write kept, A's refused"
    );
    drop((a, b));
    dataset::delete(&url, &opts, &env).unwrap();

    // An upload cancelled before its first group leaves nothing.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, pattern(2 * MIB, 3)).unwrap();
    let url = s.url("datasets", "rw/cut/");
    let e = load_dataset(&url, &file, MIB, &env, true).unwrap_err();
    assert!(matches!(e, DatasetError::Cancelled { .. }), "{e}");
    assert!(s.objects("datasets").list("rw/cut").unwrap().is_empty());
    // A killed upload leaves its claim and groups: invisible, incomplete.
    let o = s.objects("datasets");
    o.put("rw/cut/upload", b"upload from a killed process".to_vec())
        .unwrap();
    o.put("rw/cut/g/0000000000", pattern(MIB, 3)).unwrap();
    let e = upager_s3::S3Dataset::open_with(&url, false, &opts, &env).unwrap_err();
    assert!(matches!(e, DatasetError::Incomplete { .. }), "{e}");
    let e = load_dataset(&url, &file, MIB, &env, false).unwrap_err();
    assert!(matches!(e, DatasetError::Busy { .. }), "{e}");
    let all = dataset::list(&s.url("datasets", "rw/"), &opts, &env).unwrap();
    assert!(
        all.iter().any(|d| d.name == "rw/cut/" && d.len.is_none()),
        "{all:?}"
    );
    assert_eq!(dataset::delete(&url, &opts, &env).unwrap(), 2);
    load_dataset(&url, &file, MIB, &env, false).unwrap();
    dataset::delete(&url, &opts, &env).unwrap();

    // A delete that stopped half-way leaves a group and nothing else:
    // listed as incomplete, create refused; a load starts clean (its
    // zero group is not stored, and the old one does not show through).
    o.put("rw/cut/g/0000000001", pattern(MIB, 9)).unwrap();
    let all = dataset::list(&s.url("datasets", "rw/"), &opts, &env).unwrap();
    assert!(
        all.iter().any(|d| d.name == "rw/cut/" && d.len.is_none()),
        "{all:?}"
    );
    let e = dataset::create(&url, MIB, MIB, &opts, &env).unwrap_err();
    assert!(matches!(e, DatasetError::Incomplete { .. }), "{e}");
    std::fs::write(&file, vec![0u8; 2 * MIB as usize]).unwrap();
    load_dataset(&url, &file, MIB, &env, false).unwrap();
    let st = upager_s3::S3Dataset::open_with(&url, false, &opts, &env).unwrap();
    let mut buf = vec![1u8; MIB as usize];
    st.read_at(&mut buf, MIB).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "the old group showed through");
    dataset::delete(&url, &opts, &env).unwrap();
}
