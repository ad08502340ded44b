//! A hostile network on loopback: an HTTP proxy in front of a server
//! (SeaweedFS here) that passes requests through, or per request does
//! what a bad network or a bad middlebox does ([`Fault`]): resets the
//! connection mid-body, cuts the body short, lies in Content-Length,
//! stalls, drips, answers with another version of the object, flips a
//! bit of a body (as a bad NIC, a bad disk or a buggy middlebox would,
//! under the right ETag and length), or stops listening (connection
//! refused). One request per connection (every
//! answer gains `Connection: close`), so each request is its own
//! connection and its own fault. Requests keep their bytes (SigV4 signs
//! the Host header the client used, which the server checks as received).
//!
//! Counts: requests per method, and faults done per kind ([`Stats`]).
//! Every wait is bounded: a stall holds a connection for its given time,
//! then closes it; a read from either side times out after 30 s.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does with one request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Passes it through.
    Pass,
    /// Answers it itself with this status (503 SlowDown, 500), not
    /// forwarded.
    Status(u16),
    /// Forwards nothing and resets the connection (RST) at once.
    ResetRequest,
    /// Forwards it (the server acts on it), then resets the connection
    /// without a byte of the answer: the answer is lost.
    ResetAfterApplied,
    /// Forwards it, sends the head and this many bytes of the body, then
    /// resets the connection (RST).
    ResetBody(usize),
    /// Forwards it, sends the head (its true Content-Length) and this many
    /// bytes of the body, then closes (FIN): a truncated body.
    Truncate(usize),
    /// Forwards it; the head claims this many bytes fewer than the body,
    /// which is sent whole.
    ShortLength(usize),
    /// Forwards it; the head claims this many bytes more than the body,
    /// which is sent whole, then the connection is closed.
    LongLength(usize),
    /// Forwards nothing, sends nothing for this long, then closes.
    Stall(Duration),
    /// Forwards it, sends the head and this many bytes of the body, then
    /// nothing for the duration, then closes.
    StallBody(usize, Duration),
    /// Forwards it, then sends the answer `chunk` bytes at a time, one
    /// chunk per `every`.
    Drip {
        /// Bytes per write.
        chunk: usize,
        /// Time between writes.
        every: Duration,
    },
    /// Forwards it; a 200/206 answer gets this ETag and its body the bytes
    /// of `data` at the same offsets (Content-Range): a 200 whose body is
    /// another version of the object.
    OtherVersion {
        /// The other version's bytes.
        data: Arc<Vec<u8>>,
        /// The other version's ETag (quoted as a server sends it).
        etag: String,
    },
    /// Forwards it; a 200/206 answer's body has one bit flipped: bit
    /// `bit % 8` of the byte at `bit / 8` (modulo the body's length),
    /// everything else (ETag, length, metadata) as the server sent it.
    FlipBit(u64),
    /// Forwards it with one bit of its body flipped (as [`Fault::FlipBit`],
    /// on the way to the server: a PUT's bytes damaged in transit).
    FlipRequestBit(u64),
}

impl Fault {
    /// The kind's name in the counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Pass => "pass",
            Fault::Status(_) => "status",
            Fault::ResetRequest => "reset request",
            Fault::ResetAfterApplied => "answer lost",
            Fault::ResetBody(_) => "reset mid-body",
            Fault::Truncate(_) => "truncated body",
            Fault::ShortLength(_) => "content-length short",
            Fault::LongLength(_) => "content-length long",
            Fault::Stall(_) => "stall",
            Fault::StallBody(..) => "stall mid-body",
            Fault::Drip { .. } => "drip",
            Fault::OtherVersion { .. } => "other version",
            Fault::FlipBit(_) => "bit flip",
            Fault::FlipRequestBit(_) => "request bit flip",
        }
    }
}

/// One request as a rule sees it.
#[derive(Debug)]
pub struct Req<'a> {
    /// GET, PUT, HEAD, ...
    pub method: &'a str,
    /// The request target (path and query).
    pub target: &'a str,
    /// Its number among the proxy's requests of this method, from 0.
    pub n: u64,
}

/// Which fault a request gets.
pub type Rule = dyn Fn(&Req<'_>) -> Fault + Send + Sync;

/// Counts of a proxy.
#[derive(Default, Debug)]
pub struct Stats {
    /// Requests per method.
    pub requests: Mutex<BTreeMap<String, u64>>,
    /// Faults done per kind (requests passed through are not counted).
    pub injected: Mutex<BTreeMap<&'static str, u64>>,
}

impl Stats {
    fn count_request(&self, method: &str) -> u64 {
        let mut m = self.requests.lock().unwrap();
        let n = m.entry(method.to_string()).or_insert(0);
        *n += 1;
        *n - 1
    }

    /// Faults of `kind` done so far.
    pub fn injected(&self, kind: &str) -> u64 {
        self.injected
            .lock()
            .unwrap()
            .get(kind)
            .copied()
            .unwrap_or(0)
    }

    /// Faults of every kind done so far.
    pub fn injected_total(&self) -> u64 {
        self.injected.lock().unwrap().values().sum()
    }

    /// Requests of `method` so far.
    pub fn requests(&self, method: &str) -> u64 {
        self.requests
            .lock()
            .unwrap()
            .get(method)
            .copied()
            .unwrap_or(0)
    }

    fn add(&self, kind: &'static str) {
        *self.injected.lock().unwrap().entry(kind).or_insert(0) += 1;
    }
}

/// The proxy. Stops accepting when dropped.
pub struct Proxy {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Its counts.
    pub stats: Arc<Stats>,
    rule: Arc<Mutex<Arc<Rule>>>,
    down: Arc<AtomicBool>,
    listening: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// A proxy on a free loopback port in front of `up`
    /// (`http://HOST:PORT`), passing everything through until a rule is
    /// set.
    pub fn start(up: &str) -> Proxy {
        let up = up.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let p = Proxy {
            endpoint: format!("http://{addr}"),
            stats: Arc::new(Stats::default()),
            rule: Arc::new(Mutex::new(Arc::new(|_: &Req<'_>| Fault::Pass))),
            down: Arc::new(AtomicBool::new(false)),
            listening: Arc::new(AtomicBool::new(true)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (stats, rule, down, listening, stop) = (
            Arc::clone(&p.stats),
            Arc::clone(&p.rule),
            Arc::clone(&p.down),
            Arc::clone(&p.listening),
            Arc::clone(&p.stop),
        );
        std::thread::spawn(move || {
            accept_loop(listener, addr, &up, &stats, &rule, &down, &listening, &stop)
        });
        p
    }

    /// Sets the rule for the requests from now on.
    pub fn set_rule(&self, rule: impl Fn(&Req<'_>) -> Fault + Send + Sync + 'static) {
        *self.rule.lock().unwrap() = Arc::new(rule);
    }

    /// Passes everything through again, and listens.
    pub fn heal(&self) {
        self.set_rule(|_| Fault::Pass);
        self.listen(true);
    }

    /// Stops listening (`false`: a connect is refused, the port has no
    /// listener) or listens again; returns once it is so.
    pub fn listen(&self, on: bool) {
        self.down.store(!on, Relaxed);
        let t = std::time::Instant::now();
        while self.listening.load(Relaxed) != on {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the proxy's listener"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Counts one refused window (the port without a listener while a
    /// request was due) as an injection of kind "refused".
    pub fn count_refused(&self) {
        self.stats.add("refused");
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

#[allow(clippy::too_many_arguments)]
fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    up: &str,
    stats: &Arc<Stats>,
    rule: &Arc<Mutex<Arc<Rule>>>,
    down: &AtomicBool,
    listening: &AtomicBool,
    stop: &AtomicBool,
) {
    listener.set_nonblocking(true).unwrap();
    let mut l = Some(listener);
    while !stop.load(Relaxed) {
        if down.load(Relaxed) {
            if l.take().is_some() {
                listening.store(false, Relaxed);
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let Some(lis) = &l else {
            // Listens again on the same port (std sets SO_REUSEADDR).
            match TcpListener::bind(addr) {
                Ok(n) => {
                    n.set_nonblocking(true).unwrap();
                    l = Some(n);
                    listening.store(true, Relaxed);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
            continue;
        };
        match lis.accept() {
            Ok((conn, _)) => {
                let _ = conn.set_nonblocking(false);
                let (up, stats) = (up.to_string(), Arc::clone(stats));
                let rule = Arc::clone(&rule.lock().unwrap());
                std::thread::spawn(move || {
                    let _ = serve(conn, &up, &*rule, &stats);
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// The head of an HTTP message (its lines, through the empty line) and
/// its body's raw bytes: `Content-Length` bytes, chunked bytes through the
/// last chunk, or (an answer with neither) to the end; none for the answer
/// to a HEAD (`has_body` false).
pub fn read_message(
    r: &mut impl BufRead,
    has_body: bool,
    is_request: bool,
) -> io::Result<Option<(Vec<String>, Vec<u8>)>> {
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
    let mut body = Vec::new();
    if !has_body {
        return Ok(Some((head, body)));
    }
    if header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut line = String::new();
            r.read_line(&mut line)?;
            body.extend_from_slice(line.as_bytes());
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if size == 0 {
                // Trailers through the empty line.
                loop {
                    let mut t = String::new();
                    r.read_line(&mut t)?;
                    body.extend_from_slice(t.as_bytes());
                    if t.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
        }
    } else if let Some(len) = header(&head, "content-length").and_then(|v| v.parse().ok()) {
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    } else if !is_request {
        let status = head[0].split(' ').nth(1).unwrap_or("");
        if status != "204" && status != "304" {
            r.read_to_end(&mut body)?;
        }
    }
    Ok(Some((head, body)))
}

/// The value of header `name` in `head`.
pub fn header<'a>(head: &'a [String], name: &str) -> Option<&'a str> {
    head.iter().skip(1).find_map(|h| {
        let (k, v) = h.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// `head` with header `name` set to `value` (replaced, or added).
pub fn with_header(head: &[String], name: &str, value: &str) -> Vec<String> {
    let mut out: Vec<String> = head
        .iter()
        .enumerate()
        .filter(|(i, h)| {
            *i == 0
                || !h
                    .split_once(':')
                    .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        })
        .map(|(_, h)| h.clone())
        .collect();
    out.push(format!("{name}: {value}"));
    out
}

/// `head`'s bytes with `Connection: close`.
pub fn closing(head: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for h in with_header(head, "Connection", "close") {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Closes `conn` with a reset (RST) rather than a FIN: SO_LINGER 0.
pub fn reset(conn: TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor (owned by `conn`, alive here) and
    // a pointer to a linger of the size passed.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(conn);
}

/// The S3 error answer the proxy gives for `status`.
fn error_answer(status: u16) -> Vec<u8> {
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
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
        xml.len()
    )
    .into_bytes()
}

fn serve(conn: TcpStream, up: &str, rule: &Rule, stats: &Stats) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut client = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    let Some((head, body)) = read_message(&mut r, true, true)? else {
        return Ok(());
    };
    let mut parts = head[0].split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let n = stats.count_request(&method);
    let fault = rule(&Req {
        method: &method,
        target: &target,
        n,
    });
    if !matches!(fault, Fault::Pass) {
        stats.add(fault.kind());
    }
    // Faults that forward nothing.
    match fault {
        Fault::Status(status) => return client.write_all(&error_answer(status)),
        Fault::ResetRequest => {
            reset(client);
            return Ok(());
        }
        Fault::Stall(d) => {
            std::thread::sleep(d);
            return Ok(());
        }
        _ => {}
    }
    let mut server = TcpStream::connect(up)?;
    server.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut body = body;
    if let Fault::FlipRequestBit(bit) = fault {
        if !body.is_empty() {
            let at = (bit / 8) as usize % body.len();
            body[at] ^= 1 << (bit % 8);
        }
    }
    let mut req = closing(&head);
    req.extend_from_slice(&body);
    server.write_all(&req)?;
    let mut sr = BufReader::new(server);
    let Some((rhead, mut rbody)) = read_message(&mut sr, method != "HEAD", false)? else {
        return Ok(());
    };
    let status = rhead[0].split(' ').nth(1).unwrap_or("").to_string();
    let ok = status == "200" || status == "206";
    match fault {
        Fault::ResetAfterApplied => {
            reset(client);
            Ok(())
        }
        Fault::ResetBody(after) => {
            client.write_all(&closing(&rhead))?;
            client.write_all(&rbody[..after.min(rbody.len())])?;
            client.flush()?;
            reset(client);
            Ok(())
        }
        Fault::Truncate(keep) => {
            client.write_all(&closing(&rhead))?;
            client.write_all(&rbody[..keep.min(rbody.len())])?;
            client.shutdown(std::net::Shutdown::Write)
        }
        Fault::ShortLength(less) if header(&rhead, "content-length").is_some() => {
            let len = rbody.len().saturating_sub(less);
            client.write_all(&closing(&with_header(
                &rhead,
                "Content-Length",
                &len.to_string(),
            )))?;
            client.write_all(&rbody)?;
            client.shutdown(std::net::Shutdown::Write)
        }
        Fault::LongLength(more) if header(&rhead, "content-length").is_some() => {
            let len = rbody.len() + more;
            client.write_all(&closing(&with_header(
                &rhead,
                "Content-Length",
                &len.to_string(),
            )))?;
            client.write_all(&rbody)?;
            client.shutdown(std::net::Shutdown::Write)
        }
        Fault::StallBody(after, d) => {
            client.write_all(&closing(&rhead))?;
            client.write_all(&rbody[..after.min(rbody.len())])?;
            client.flush()?;
            std::thread::sleep(d);
            Ok(())
        }
        Fault::Drip { chunk, every } => {
            let mut all = closing(&rhead);
            all.extend_from_slice(&rbody);
            for c in all.chunks(chunk.max(1)) {
                client.write_all(c)?;
                client.flush()?;
                std::thread::sleep(every);
            }
            Ok(())
        }
        Fault::OtherVersion { data, etag } if ok => {
            // The offset of the body in the object: Content-Range's start.
            let start = header(&rhead, "content-range")
                .and_then(|v| {
                    v.trim_start_matches("bytes ")
                        .split('-')
                        .next()?
                        .parse()
                        .ok()
                })
                .unwrap_or(0usize);
            for (i, b) in rbody.iter_mut().enumerate() {
                *b = data.get(start + i).copied().unwrap_or(0);
            }
            client.write_all(&closing(&with_header(&rhead, "ETag", &etag)))?;
            client.write_all(&rbody)
        }
        Fault::FlipBit(bit) if ok && !rbody.is_empty() => {
            let at = (bit / 8) as usize % rbody.len();
            rbody[at] ^= 1 << (bit % 8);
            client.write_all(&closing(&rhead))?;
            client.write_all(&rbody)
        }
        _ => {
            client.write_all(&closing(&rhead))?;
            client.write_all(&rbody)
        }
    }
}

/// A small deterministic random generator (xorshift64*), for choosing
/// which requests get a fault and where the test reads.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Whether request `n` is among about one in `every`, by a hash of `n`
/// and `seed` (a rule's choice, the same for the same request number).
pub fn chosen(n: u64, seed: u64, every: u64) -> bool {
    let mut r = Rng(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed ^ 0x5DEE_CE66D);
    r.next();
    r.below(every) == 0
}

/// The largest of the durations seen, shared between threads (ns).
#[derive(Default, Debug)]
pub struct MaxTime(AtomicU64);

impl MaxTime {
    /// Notes `d`.
    pub fn note(&self, d: Duration) {
        self.0.fetch_max(d.as_nanos() as u64, Relaxed);
    }
    /// The largest so far.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Relaxed))
    }
}
