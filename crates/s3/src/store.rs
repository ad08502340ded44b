//! [`S3Store`]: one existing object of an S3-compatible store, read-only,
//! as an [`upager::Store`].
//!
//! Contract:
//!
//! ```text
//! open        1) resolve credentials, region, endpoint (config.rs)
//!             2) HEAD the object: its size and ETag, fixed for the store's life
//!                (404: then list the bucket once, to say "no such bucket" or
//!                "no such object"; 401/403: the credentials' source named)
//! read_at     the range [offset, offset+len) clipped at the object's end, cut
//!             on the part grid (offsets that are multiples of `part`, 8 MiB):
//!             ONE ranged GET per part, all parts in flight together (at most
//!             `in_flight`); a fault's run inside one part is one GET
//! read_batch  reads in order merged up to `part` bytes, adjacent ones and
//!             ones at most `gap` bytes apart (the gap read and dropped, in
//!             waves of at most 16 MiB of gaps), a read across the part grid
//!             cut on it, then as read_at: every GET in flight together (at
//!             most `in_flight`), one result per read
//! the grid    a server keeps an object in chunks (SeaweedFS: 4 MiB) and
//!             decompresses a compressed one whole for each GET that touches
//!             it: a long read cut on the grid touches each chunk once (where
//!             chunks divide `part`), as a pass's aligned windows do. A
//!             gather's merged GETs are not cut on it: one GET per batch's
//!             span in flight with the next keeps both server CPUs busy, which
//!             counted for more than the chunks touched (docs/benchmarks.md,
//!             "Aligned windows")
//! every GET   If-Match: the ETag of open; 412 (or another ETag in the answer)
//!             = the object was replaced: an error (the access gets SIGBUS,
//!             the reason logged by the engine), never bytes of two versions
//! writes      refused: the store is read-only (writable() is false)
//! trace       the warm-start trace (upager's MapOptions::warm) is the object
//!             KEY.upager-trace beside it, one GET when mapped, one PUT when
//!             unmapped; tied to the ETag (trace_version), so a trace of a
//!             replaced object is ignored; a refused PUT (read-only
//!             credentials) is logged and the next map starts cold
//! ```
//!
//! Threads: the store runs on one tokio runtime with `threads` workers
//! (default 1), with its client shared by the process's opens of the same
//! bucket with the same settings (client.rs): they run the HTTP connections (socket reads, HTTP and TLS
//! decoding); the engine's thread that calls `read_at` drives its own GETs
//! with `block_on` and copies each body into the folio buffer itself, so
//! the copy is spread over the calling threads. One worker keeps up with
//! one vCPU's worth of loopback HTTP; more only help with TLS at high
//! bandwidth (`S3Options::threads`). A call made from inside another tokio
//! runtime (block_on would panic there) runs on a scoped helper thread.
//!
//! Timeouts: connect `connect_timeout` (2 s), each request `timeout` (30 s),
//! retries of the client (5xx, 503 SlowDown, connection errors: backoff
//! 50 ms doubling, at most `retries`, for at most `retry_for` = 10 s), and
//! a guard over the whole call (`retry_for + timeout + 5 s`): no wait is
//! unbounded, so a dead server ends an access in SIGBUS, never a hang.
//!
//! Ordering: none needed between GETs (the object does not change, and
//! If-Match guarantees it); counters are Relaxed statistics.
//!
//! Counters ([`S3Counters`], snake_case, `store_` prefix as the Redis
//! store's): `store_gets`, `store_bytes_received`, `store_get_errors`,
//! `store_etag_mismatches`, `store_gets_in_flight_peak`, `store_get_ns`,
//! `store_gap_bytes`.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use crate::client::{self, Rt};
use crate::config::{self, Resolved};
use crate::url::S3Url;

pub(crate) use crate::options::{error_chain, run};
pub use crate::options::{OpenError, S3Options, GAP_DEFAULT};

/// Wire counters of one store (snake_case names, `store_` prefix).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Counters {
    /// Ranged GETs answered (the body read whole).
    pub gets: u64,
    /// Body bytes received.
    pub bytes_received: u64,
    /// GETs that failed (after the client's retries).
    pub get_errors: u64,
    /// GETs refused because the object was replaced (412 on If-Match, or
    /// another ETag in the answer).
    pub etag_mismatches: u64,
    /// Most GETs in flight at once.
    pub gets_in_flight_peak: u64,
    /// Wall time of the GETs, summed (ns): divided by `gets`, the mean
    /// latency of a GET.
    pub get_ns: u64,
    /// Bytes GETs read between two folios of a batch and dropped
    /// ([`S3Options::gap`]; counted in `bytes_received` too).
    pub gap_bytes: u64,
}

impl S3Counters {
    /// The counters with their stable names.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("store_gets", self.gets),
            ("store_bytes_received", self.bytes_received),
            ("store_get_errors", self.get_errors),
            ("store_etag_mismatches", self.etag_mismatches),
            ("store_gets_in_flight_peak", self.gets_in_flight_peak),
            ("store_get_ns", self.get_ns),
            ("store_gap_bytes", self.gap_bytes),
        ]
        .into_iter()
    }
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
    in_flight: AtomicU64,
    peak: AtomicU64,
    ns: AtomicU64,
    gap_bytes: AtomicU64,
}

/// Most bytes of gaps one wave of a `read_batch` reads through (and
/// drops): its scratch buffer, reused by the next wave (16 MiB: beside a
/// fetch's 8 MiB batch, within what a 256 MiB cgroup over a 192 MiB
/// budget leaves).
const GAP_SCRATCH_BYTES: usize = 16 << 20;

/// The GETs of the read of `buf` at `offset`: cut where the object's
/// offsets reach a multiple of `part` (the part grid; see the module doc),
/// each its range and its buffer.
fn grid_parts(offset: u64, buf: &mut [u8], part: u64) -> Vec<(Range<u64>, Vec<&mut [u8]>)> {
    let mut out = Vec::with_capacity(buf.len().div_ceil(part as usize) + 1);
    let (mut start, mut rest) = (offset, buf);
    while !rest.is_empty() {
        let n = ((part - start % part) as usize).min(rest.len());
        let (b, tail) = rest.split_at_mut(n);
        out.push((start..start + n as u64, vec![b]));
        start += n as u64;
        rest = tail;
    }
    out
}

/// How one read of a `read_batch` is served (`S3Store::plan_wave`): its
/// bytes (clipped at the object's end; 0: none), and whether it goes into
/// the previous read's GET, after `gap` bytes read and dropped.
struct Step {
    n: u64,
    join: bool,
    gap: usize,
}

/// Why one GET failed (becomes the `io::Error` the engine logs).
#[derive(Debug)]
enum GetError {
    Replaced,
    Short { want: u64, got: u64 },
    Timeout,
    Client(object_store::Error),
}

/// One object, read-only. See the module doc for the contract.
pub struct S3Store {
    client: Arc<dyn ObjectStore>,
    path: ObjPath,
    url: S3Url,
    endpoint: String,
    len: u64,
    etag: String,
    opts: S3Options,
    counters: Counters,
    replaced_logged: AtomicBool,
    /// The runtime the client's connections run on (both shared with the
    /// process's other opens of the bucket: client.rs).
    rt: Arc<Rt>,
}

impl fmt::Debug for S3Store {
    /// The object and its version; never a credential.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Store")
            .field("url", &self.url.to_string())
            .field("endpoint", &self.endpoint)
            .field("len", &self.len)
            .field("etag", &self.etag)
            .finish_non_exhaustive()
    }
}

/// The object beside `key` that keeps its warm-start trace (as a file's
/// trace is kept beside the file: [`upager::TRACE_SUFFIX`]).
pub fn trace_key(key: &str) -> String {
    format!("{key}{}", upager::TRACE_SUFFIX)
}

/// The endpoint of `url`'s requests, for messages.
pub(crate) fn endpoint_of(url: &S3Url, res: &Resolved) -> String {
    res.endpoint
        .clone()
        .unwrap_or_else(|| format!("AWS S3 ({}, bucket {})", res.region, url.bucket))
}

/// [`OpenError::NoBucket`] if the server answered `e` with S3's
/// `NoSuchBucket` (a listing, a GET or a PUT in a bucket that does not
/// exist; SeaweedFS makes a bucket at its first PUT, S3 does not).
pub(crate) fn no_bucket(url: &S3Url, endpoint: &str, e: &object_store::Error) -> Option<OpenError> {
    error_chain(e)
        .contains("NoSuchBucket")
        .then(|| OpenError::NoBucket {
            url: url.to_string(),
            bucket: url.bucket.clone(),
            endpoint: endpoint.to_string(),
        })
}

/// An open error from a client error on `url`.
pub(crate) fn classify(
    url: &S3Url,
    res: &Resolved,
    endpoint: &str,
    e: object_store::Error,
) -> OpenError {
    let u = url.to_string();
    let detail = error_chain(&e);
    match e {
        object_store::Error::Unauthenticated { .. }
        | object_store::Error::PermissionDenied { .. } => OpenError::Denied {
            url: u,
            endpoint: endpoint.to_string(),
            creds: creds_source(res),
            detail,
        },
        _ if detail.contains("InvalidAccessKeyId")
            || detail.contains("SignatureDoesNotMatch")
            || detail.contains("AccessDenied") =>
        {
            OpenError::Denied {
                url: u,
                endpoint: endpoint.to_string(),
                creds: creds_source(res),
                detail,
            }
        }
        _ if detail.contains("onnect") || detail.contains("dns") || detail.contains("refused") => {
            OpenError::Unreachable {
                url: u,
                endpoint: endpoint.to_string(),
                detail,
            }
        }
        source => OpenError::Other { url: u, source },
    }
}

fn creds_source(res: &Resolved) -> String {
    match &res.credentials {
        Some(c) => format!("access key {} from {}", c.key_id, c.source),
        None if res.unsigned => "unsigned requests".to_string(),
        None => "the AWS default chain".to_string(),
    }
}

impl S3Store {
    /// Opens the object `url` names, read-only: resolves the settings from
    /// the URL, the environment and the AWS profile, and reads the object's
    /// size and ETag (one HEAD).
    pub fn open(url: &S3Url, opts: &S3Options) -> Result<Arc<S3Store>, OpenError> {
        Self::open_with(url, opts, &config::ProcessEnv)
    }

    /// [`S3Store::open`] with the settings from `env` instead of the
    /// process's.
    pub fn open_with(
        url: &S3Url,
        opts: &S3Options,
        env: &dyn config::Env,
    ) -> Result<Arc<S3Store>, OpenError> {
        if url.key.is_empty() || url.key.ends_with('/') {
            return Err(OpenError::NoKey {
                url: url.to_string(),
            });
        }
        let res = config::resolve(url, env)?;
        let (client, rt) = client::connect(url, &res, opts, opts.threads)?;
        let endpoint = endpoint_of(url, &res);
        let path = ObjPath::from(url.key.as_str());
        let head =
            run(&rt, opts.guard(), client.head(&path)).ok_or_else(|| OpenError::Timeout {
                url: url.to_string(),
                endpoint: endpoint.clone(),
                secs: opts.guard().as_secs(),
            })?;
        let meta = match head {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => {
                // The bucket, or only the key? One listing tells.
                let listed = run(&rt, opts.guard(), async {
                    client.list(None).take(1).try_collect::<Vec<_>>().await
                });
                return Err(match listed {
                    Some(Err(object_store::Error::NotFound { .. })) => OpenError::NoBucket {
                        url: url.to_string(),
                        bucket: url.bucket.clone(),
                        endpoint,
                    },
                    Some(Err(e)) if let Some(no) = no_bucket(url, &endpoint, &e) => no,
                    _ => OpenError::NoObject {
                        url: url.to_string(),
                        bucket: url.bucket.clone(),
                        key: url.key.clone(),
                    },
                });
            }
            Err(e) => return Err(classify(url, &res, &endpoint, e)),
        };
        let Some(etag) = meta.e_tag.clone() else {
            return Err(OpenError::NoEtag {
                url: url.to_string(),
            });
        };
        Ok(Arc::new(S3Store {
            client,
            path,
            url: url.clone(),
            endpoint,
            len: meta.size,
            etag,
            opts: opts.clone(),
            counters: Counters::default(),
            replaced_logged: AtomicBool::new(false),
            rt,
        }))
    }

    /// The object's ETag when it was opened (every GET requires it).
    pub fn etag(&self) -> &str {
        &self.etag
    }

    /// The URL.
    pub fn url(&self) -> &S3Url {
        &self.url
    }

    /// The counters so far.
    pub fn counters(&self) -> S3Counters {
        let c = &self.counters;
        S3Counters {
            gets: c.gets.load(Relaxed),
            bytes_received: c.bytes.load(Relaxed),
            get_errors: c.errors.load(Relaxed),
            etag_mismatches: c.mismatches.load(Relaxed),
            gets_in_flight_peak: c.peak.load(Relaxed),
            get_ns: c.ns.load(Relaxed),
            gap_bytes: c.gap_bytes.load(Relaxed),
        }
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// One ranged GET of `range` (non-empty, inside the object) into
    /// `bufs`, which together are exactly as long, streamed body chunk by
    /// body chunk.
    async fn get_into(&self, range: Range<u64>, bufs: Vec<&mut [u8]>) -> Result<(), GetError> {
        debug_assert_eq!(
            bufs.iter().map(|b| b.len() as u64).sum::<u64>(),
            range.end - range.start
        );
        let c = &self.counters;
        let now = c.in_flight.fetch_add(1, Relaxed) + 1;
        c.peak.fetch_max(now, Relaxed);
        let t0 = Instant::now();
        let res = self.get_body(range, bufs).await;
        c.in_flight.fetch_sub(1, Relaxed);
        c.ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        match &res {
            Ok(n) => {
                c.gets.fetch_add(1, Relaxed);
                c.bytes.fetch_add(*n, Relaxed);
            }
            Err(GetError::Replaced) => {
                c.errors.fetch_add(1, Relaxed);
                c.mismatches.fetch_add(1, Relaxed);
            }
            Err(_) => {
                c.errors.fetch_add(1, Relaxed);
            }
        }
        res.map(|_| ())
    }

    async fn get_body(&self, range: Range<u64>, mut bufs: Vec<&mut [u8]>) -> Result<u64, GetError> {
        let want = range.end - range.start;
        let opts = GetOptions {
            if_match: Some(self.etag.clone()),
            range: Some(GetRange::Bounded(range)),
            ..GetOptions::default()
        };
        let r = match self.client.get_opts(&self.path, opts).await {
            Ok(r) => r,
            Err(object_store::Error::Precondition { .. }) => return Err(GetError::Replaced),
            // An object deleted since it was opened is replaced too.
            Err(object_store::Error::NotFound { .. }) => return Err(GetError::Replaced),
            Err(e) => return Err(GetError::Client(e)),
        };
        // A server that ignores If-Match still names the version it sent.
        if r.meta.e_tag.as_deref().is_some_and(|t| t != self.etag) {
            return Err(GetError::Replaced);
        }
        let mut body = r.into_stream();
        let (mut at, mut got) = (0usize, 0u64);
        while let Some(chunk) = body.next().await {
            let mut chunk = chunk.map_err(GetError::Client)?;
            while !chunk.is_empty() {
                let Some(buf) = bufs.get_mut(at) else {
                    return Err(GetError::Short {
                        want,
                        got: got + chunk.len() as u64,
                    });
                };
                let n = buf.len().min(chunk.len());
                buf[..n].copy_from_slice(&chunk[..n]);
                let rest = std::mem::take(buf);
                *buf = &mut rest[n..];
                chunk = chunk.slice(n..);
                got += n as u64;
                if buf.is_empty() {
                    at += 1;
                }
            }
        }
        if got != want {
            return Err(GetError::Short { want, got });
        }
        Ok(got)
    }

    /// The `io::Error` the engine gets (and logs as the reason of a
    /// SIGBUS) for a failed GET at `offset`.
    fn io_error(&self, e: GetError, offset: u64) -> io::Error {
        match e {
            GetError::Replaced => {
                let msg = format!(
                    "{}: the object was replaced or deleted since it was opened (it no longer has ETag {}): the read at byte {offset} was refused rather than mix two versions; map the object again to read the new one",
                    self.url, self.etag
                );
                if !self.replaced_logged.swap(true, Relaxed) {
                    log::error!("{msg}");
                }
                io::Error::other(msg)
            }
            GetError::Short { want, got } => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: a GET at byte {offset} returned {got} of {want} bytes (connection cut?)",
                    self.url
                ),
            ),
            GetError::Timeout => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{}: no answer from {} within {} s for the read at byte {offset}",
                    self.url,
                    self.endpoint,
                    self.opts.guard().as_secs()
                ),
            ),
            GetError::Client(e) => {
                let kind = match &e {
                    object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. } => {
                        io::ErrorKind::PermissionDenied
                    }
                    _ => io::ErrorKind::Other,
                };
                io::Error::new(
                    kind,
                    format!(
                        "{}: the GET at byte {offset} from {} failed after the client's retries: {}",
                        self.url,
                        self.endpoint,
                        error_chain(&e)
                    ),
                )
            }
        }
    }

    /// The outcome of a request for the warm-start trace `key`.
    fn trace_result<T>(
        &self,
        key: &str,
        what: &str,
        r: Option<object_store::Result<T>>,
    ) -> io::Result<T> {
        let url = self.url.with_key(key);
        match r {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(io::Error::other(format!(
                "{what} of {url} from {} failed: {}",
                self.endpoint,
                error_chain(&e)
            ))),
            None => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{what} of {url}: no answer from {} within {} s",
                    self.endpoint,
                    self.opts.guard().as_secs()
                ),
            )),
        }
    }

    /// The next wave of a batch of reads (a prefix of `reads`): how each
    /// is served, and the gap bytes it reads through. A read goes into the
    /// previous read's GET while the GET stays within `part` bytes and
    /// the read starts at or after the GET's end, at most `gap` bytes
    /// after it; the wave ends before a gap its scratch
    /// ([`GAP_SCRATCH_BYTES`]) cannot take.
    fn plan_wave(&self, reads: &[upager::ReadReq<'_>]) -> (Vec<Step>, usize) {
        let mut steps = Vec::with_capacity(reads.len());
        let mut gaps = 0usize;
        let mut get: Option<Range<u64>> = None;
        for r in reads {
            let n = if r.offset >= self.len {
                0
            } else {
                (r.buf.len() as u64).min(self.len - r.offset)
            };
            let mut step = Step {
                n,
                join: false,
                gap: 0,
            };
            if n > 0 {
                match &mut get {
                    Some(g)
                        if r.offset >= g.end
                            && r.offset - g.end <= self.opts.gap
                            && r.offset + n - g.start <= self.opts.part =>
                    {
                        let gap = (r.offset - g.end) as usize;
                        if gaps + gap > GAP_SCRATCH_BYTES {
                            break;
                        }
                        gaps += gap;
                        step.join = true;
                        step.gap = gap;
                        g.end = r.offset + n;
                    }
                    _ => get = Some(r.offset..r.offset + n),
                }
            }
            steps.push(step);
        }
        (steps, gaps)
    }

    /// Serves one wave of reads as `plan_wave` planned it, the gaps read
    /// into `scratch`: every GET in flight together (at most
    /// `in_flight`), one result per read.
    fn read_wave(
        &self,
        wave: &mut [upager::ReadReq<'_>],
        steps: &[Step],
        mut scratch: &mut [u8],
    ) -> Vec<io::Result<usize>> {
        let mut gets: Vec<(Range<u64>, Vec<&mut [u8]>)> = Vec::new();
        // For each read, the GETs that serve it (None: nothing to read).
        let mut which = Vec::with_capacity(wave.len());
        for (r, st) in wave.iter_mut().zip(steps) {
            if st.n == 0 {
                which.push(None);
                continue;
            }
            let buf = &mut r.buf[..st.n as usize];
            match gets.last_mut() {
                Some((range, bufs)) if st.join => {
                    if st.gap > 0 {
                        let (gap, tail) = std::mem::take(&mut scratch).split_at_mut(st.gap);
                        bufs.push(gap);
                        scratch = tail;
                        self.counters.gap_bytes.fetch_add(st.gap as u64, Relaxed);
                    }
                    range.end = r.offset + st.n;
                    bufs.push(buf);
                    which.push(Some(gets.len() - 1..gets.len()));
                }
                _ => {
                    // A read longer than a part (a network store's readahead
                    // window) is cut in parts as read_at cuts it: their GETs
                    // in flight together, not one long GET.
                    let first = gets.len();
                    gets.extend(grid_parts(r.offset, buf, self.opts.part));
                    which.push(Some(first..gets.len()));
                }
            }
        }
        let results = self.run_gets(gets);
        which
            .into_iter()
            .zip(steps)
            .map(|(w, st)| match w {
                None => Ok(0),
                Some(g) => match results[g].iter().find_map(|r| r.as_ref().err()) {
                    None => Ok(st.n as usize),
                    Some(e) => Err(io::Error::new(e.kind(), e.to_string())),
                },
            })
            .collect()
    }

    /// Runs `gets` with at most `in_flight` in flight; the first error, by
    /// order of the GETs, with its offset.
    fn run_gets(&self, gets: Vec<(Range<u64>, Vec<&mut [u8]>)>) -> Vec<Result<(), io::Error>> {
        let offsets: Vec<u64> = gets.iter().map(|g| g.0.start).collect();
        // The futures made first: a closure inside the stream's type trips
        // the Send check over its borrowed buffers.
        let futs: Vec<_> = gets
            .into_iter()
            .map(|(range, bufs)| self.get_into(range, bufs))
            .collect();
        let all = async {
            stream::iter(futs)
                .buffered(self.opts.in_flight)
                .collect::<Vec<_>>()
                .await
        };
        match run(self.rt(), self.opts.guard(), all) {
            Some(v) => v
                .into_iter()
                .zip(&offsets)
                .map(|(r, &off)| r.map_err(|e| self.io_error(e, off)))
                .collect(),
            None => {
                self.counters.errors.fetch_add(1, Relaxed);
                offsets
                    .iter()
                    .map(|&off| Err(self.io_error(GetError::Timeout, off)))
                    .collect()
            }
        }
    }
}

impl upager::Store for S3Store {
    fn store_counters(&self) -> Vec<(&'static str, u64)> {
        self.counters().iter().collect()
    }
    fn len(&self) -> u64 {
        self.len
    }

    fn writable(&self) -> bool {
        false
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if offset >= self.len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(self.len - offset) as usize;
        let gets = grid_parts(offset, &mut buf[..n], self.opts.part);
        for r in self.run_gets(gets) {
            r?;
        }
        Ok(n)
    }

    fn read_batch(&self, reads: &mut [upager::ReadReq<'_>]) -> Vec<io::Result<usize>> {
        // In waves whose gaps (bytes read through and dropped) fit the
        // scratch buffer, which the waves reuse.
        let mut out = Vec::with_capacity(reads.len());
        let mut scratch = Vec::new();
        let mut rest = reads;
        while !rest.is_empty() {
            let (steps, gaps) = self.plan_wave(rest);
            let (wave, tail) = std::mem::take(&mut rest).split_at_mut(steps.len());
            scratch.resize(gaps, 0);
            out.extend(self.read_wave(wave, &steps, &mut scratch[..gaps]));
            rest = tail;
        }
        out
    }

    fn write_from(&self, _src: upager::Src<'_>, offset: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: read-only object: the write at byte {offset} was refused",
                self.url
            ),
        ))
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn trace_version(&self) -> Option<u64> {
        Some(upager::trace_version_of(&self.etag))
    }

    /// The object by ETag, size, endpoint and URL (the ETag first: a page
    /// pool compares the first 384 bytes of a key): a rewritten object
    /// (another ETag) gets an entry of its own in the disk tier.
    fn cache_key(&self) -> Option<String> {
        Some(format!(
            "s3 etag {} size {} {} {}",
            self.etag, self.len, self.endpoint, self.url
        ))
    }

    /// The same bytes as [`Store::cache_key`] names: processes mapping one
    /// object share a page pool of it where pools are on (`UPAGER_POOL`).
    fn pool_key(&self) -> Option<String> {
        self.cache_key()
    }

    fn load_trace(&self) -> io::Result<Option<Vec<u8>>> {
        let key = trace_key(&self.url.key);
        let got = run(self.rt(), self.opts.guard(), async {
            match self.client.get(&ObjPath::from(key.as_str())).await {
                Ok(r) => r.bytes().await.map(|b| Some(b.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        self.trace_result(&key, "GET", got)
    }

    fn save_trace(&self, trace: &[u8]) -> io::Result<()> {
        let key = trace_key(&self.url.key);
        let payload = object_store::PutPayload::from(trace.to_vec());
        let put = run(self.rt(), self.opts.guard(), async {
            self.client
                .put(&ObjPath::from(key.as_str()), payload)
                .await
                .map(drop)
        });
        self.trace_result(&key, "PUT", put)
    }

    fn round_trips(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!(
            "S3 object {} at {} (ETag {})",
            self.url, self.endpoint, self.etag
        )
    }
}

#[cfg(test)]
mod tests {
    use super::grid_parts;

    /// A read is cut on the part grid: an aligned read of parts is one GET
    /// each, an unaligned one gets a short GET at each end, every byte
    /// in exactly one GET, in order.
    #[test]
    fn a_read_is_cut_on_the_part_grid() {
        let mib = 1u64 << 20;
        let ranges = |off: u64, len: u64| {
            let mut buf = vec![0u8; len as usize];
            let parts = grid_parts(off, &mut buf, 8 * mib);
            for (r, b) in &parts {
                assert_eq!(
                    r.end - r.start,
                    b.iter().map(|x| x.len() as u64).sum::<u64>()
                );
            }
            parts.into_iter().map(|(r, _)| r).collect::<Vec<_>>()
        };
        assert_eq!(
            ranges(16 * mib, 16 * mib),
            [16 * mib..24 * mib, 24 * mib..32 * mib]
        );
        let off = 3 * mib + 3 * mib / 8;
        assert_eq!(
            ranges(off, 8 * mib),
            [off..8 * mib, 8 * mib..off + 8 * mib],
            "a window from 3.375 MiB: two GETs, none across 8 MiB"
        );
        let one = ranges(mib, 4096);
        assert_eq!((one.len(), &one[0]), (1, &(mib..mib + 4096)));
        assert!(ranges(5, 0).is_empty());
    }
}
