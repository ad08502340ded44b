//! The S3 store's retries, against a real SeaweedFS
//! behind a loopback proxy that answers some GETs itself with the errors an
//! overloaded S3 gives (503 SlowDown, 500 InternalError) and passes the
//! rest through: transient errors are retried with backoff and the data
//! comes back whole; a store that keeps failing ends the read in an error
//! within the retry bound, having tried a bounded number of times. Ports:
//! 22340.. (this binary's server).

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upager::{MapOptions, Pager, Store};
use upager_s3::{S3Options, S3Store};

const BASE: u16 = 22340;

/// A rule's answer for a GET that is never answered.
const HANG: u16 = 0;

/// Which GETs the proxy answers itself: given the GET's number (from 0),
/// the status to answer with ([`HANG`]: none, ever), or None to pass it
/// through.
type Rule = dyn Fn(u64) -> Option<u16> + Send + Sync;

/// A one-request-per-connection HTTP proxy on loopback in front of `up`.
/// Requests keep their bytes (SigV4 signs the Host header the client used,
/// which the server checks as received); responses gain `Connection:
/// close`. GETs (the store's ranged reads) go through `rule`.
struct Flaky {
    endpoint: String,
    gets: Arc<AtomicU64>,
    injected: Arc<AtomicU64>,
}

impl Flaky {
    fn start(up: &str, rule: Arc<Rule>) -> Flaky {
        let up = up.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let gets = Arc::new(AtomicU64::new(0));
        let injected = Arc::new(AtomicU64::new(0));
        let (g, inj) = (Arc::clone(&gets), Arc::clone(&injected));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (up, rule, g, inj) = (up.clone(), Arc::clone(&rule), g.clone(), inj.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &up, &*rule, &g, &inj);
                });
            }
        });
        Flaky {
            endpoint,
            gets,
            injected,
        }
    }
}

/// The head of an HTTP message (through the empty line) and, if it `has_body`
/// (not the answer to a HEAD), its body of `Content-Length` bytes.
fn read_message(
    r: &mut impl BufRead,
    has_body: bool,
) -> std::io::Result<Option<(Vec<String>, Vec<u8>)>> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let len = if !has_body {
        0
    } else {
        head.iter()
            .find_map(|h| {
                let (k, v) = h.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0)
    };
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Some((head, body)))
}

/// `head` without its Connection header, with `Connection: close`.
fn closing(head: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for h in head.iter().filter(|h| {
        !h.split_once(':')
            .is_some_and(|(k, _)| k.eq_ignore_ascii_case("connection"))
    }) {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

fn serve(
    conn: TcpStream,
    up: &str,
    rule: &Rule,
    gets: &AtomicU64,
    injected: &AtomicU64,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut client = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    let Some((head, body)) = read_message(&mut r, true)? else {
        return Ok(());
    };
    if head[0].starts_with("GET ") {
        let n = gets.fetch_add(1, Relaxed);
        if let Some(status) = rule(n) {
            injected.fetch_add(1, Relaxed);
            if status == HANG {
                // Holds the connection and never answers.
                std::thread::sleep(Duration::from_secs(60));
                return Ok(());
            }
            let (reason, code, text) = match status {
                503 => ("Slow Down", "SlowDown", "Please reduce your request rate."),
                _ => (
                    "Internal Server Error",
                    "InternalError",
                    "We encountered an internal error. Please try again.",
                ),
            };
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{text}</Message></Error>"
            );
            write!(
                client,
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                xml.len()
            )?;
            return Ok(());
        }
    }
    let mut server = TcpStream::connect(up)?;
    server.set_read_timeout(Some(Duration::from_secs(30)))?;
    server.write_all(&closing(&head))?;
    server.write_all(&body)?;
    let mut sr = BufReader::new(server);
    let Some((rhead, rbody)) = read_message(&mut sr, !head[0].starts_with("HEAD "))? else {
        return Ok(());
    };
    client.write_all(&closing(&rhead))?;
    client.write_all(&rbody)?;
    Ok(())
}

fn shared(bucket: &str) -> Option<&'static Server> {
    Server::shared_bucket(BASE, bucket)
}

fn url_via(p: &Flaky, bucket: &str, key: &str) -> upager_s3::S3Url {
    format!("s3://{bucket}/{key}?endpoint={}", p.endpoint)
        .parse()
        .unwrap()
}

#[test]
fn slowdowns_and_server_errors_are_retried_and_the_data_is_whole() {
    let Some(s) = shared("retry") else { return };
    let len = 4 * MIB;
    let seed = 0x77;
    s.objects("retry").put("w.bin", pattern(len, seed)).unwrap();
    // The first three GETs in a row (one read retried three times), then
    // every fifth: 503 SlowDown on even ones, 500 on odd.
    let rule: Arc<Rule> =
        Arc::new(|n| (n < 3 || n % 5 == 4).then_some(if n % 2 == 0 { 503 } else { 500 }));
    let p = Flaky::start(&s.endpoint, rule);
    let st = S3Store::open_with(
        &url_via(&p, "retry", "w.bin"),
        &S3Options::default().part(256 << 10),
        &s.env(),
    )
    .unwrap();
    let pager = Pager::new(MIB).unwrap();
    let r = pager
        .map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().folio(upager_s3::DEFAULT_FOLIO),
        )
        .unwrap();
    let w = r.words();
    for i in 0..len / 8 {
        assert_eq!(w[i as usize].load(Relaxed), word(i, seed), "word {i}");
    }
    drop(r);
    let c = st.counters();
    let injected = p.injected.load(Relaxed);
    eprintln!(
        "{} GETs through the proxy, {injected} answered with 503/500; {c:?}",
        p.gets.load(Relaxed)
    );
    assert!(injected >= 4, "errors were injected: {injected}");
    assert_eq!(c.get_errors, 0, "every error was retried away: {c:?}");
    assert!(pager.stats().resident_peak_bytes <= MIB);
}

#[test]
fn a_store_that_keeps_failing_ends_the_read_in_an_error_within_its_bound() {
    let Some(s) = shared("down") else { return };
    s.objects("down").put("w.bin", pattern(MIB, 3)).unwrap();
    let failing = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&failing);
    let rule: Arc<Rule> = Arc::new(move |_| f.load(Relaxed).then_some(500));
    let p = Flaky::start(&s.endpoint, rule);
    let retries = 3;
    let o = S3Options::default().retry(retries, Duration::from_secs(3));
    let st = S3Store::open_with(&url_via(&p, "down", "w.bin"), &o, &s.env()).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    assert_eq!(st.read_at(&mut buf, 0).unwrap(), buf.len());
    failing.store(true, Relaxed);
    let before = p.gets.load(Relaxed);
    let t = Instant::now();
    let e = st.read_at(&mut buf, 65536).unwrap_err();
    let took = t.elapsed();
    let tries = p.gets.load(Relaxed) - before;
    eprintln!("{e} after {took:?} and {tries} GETs");
    assert!(
        (2..=retries as u64 + 1).contains(&tries),
        "retried, a bounded number of times: {tries} GETs"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(st.counters().get_errors >= 1, "{:?}", st.counters());
    let msg = e.to_string();
    assert!(msg.contains("500") || msg.contains("Internal"), "{msg}");
    // The server comes back: the next read succeeds.
    failing.store(false, Relaxed);
    assert_eq!(st.read_at(&mut buf, 65536).unwrap(), buf.len());
    assert_eq!(&buf[..8], &word(8192, 3).to_le_bytes());
}

#[test]
fn a_server_that_never_answers_is_an_error_after_the_timeout() {
    let Some(s) = shared("hang") else { return };
    s.objects("hang").put("w.bin", pattern(MIB, 4)).unwrap();
    let hanging = Arc::new(AtomicBool::new(false));
    let h = Arc::clone(&hanging);
    let rule: Arc<Rule> = Arc::new(move |_| h.load(Relaxed).then_some(HANG));
    let p = Flaky::start(&s.endpoint, rule);
    let o = S3Options::default()
        .timeout(Duration::from_secs(1))
        .retry(1, Duration::from_secs(2));
    let st = S3Store::open_with(&url_via(&p, "hang", "w.bin"), &o, &s.env()).unwrap();
    hanging.store(true, Relaxed);
    let mut buf = vec![0u8; 64 << 10];
    let t = Instant::now();
    let e = st.read_at(&mut buf, 0).unwrap_err();
    let took = t.elapsed();
    eprintln!("{e} after {took:?}");
    // One try and one retry of 1 s each, the backoff between, and slack.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(st.counters().get_errors >= 1, "{:?}", st.counters());
}
