//! The settings of an S3 store ([`S3Options`]), the errors of opening one
//! ([`OpenError`]), and how a request runs on a client's runtime from any
//! thread ([`run`], bounded by a guard) and reports its causes
//! ([`error_chain`]): shared by the clients, the stores and the datasets.
//!
//! Uses: `config`.

use std::io;
use std::time::Duration;

use crate::config::ConfigError;

/// How the store talks to the server. Every setter states its default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Options {
    /// Largest ranged GET: a longer read is split into GETs of this size,
    /// in flight together; a batch's reads merged through gaps stop at it.
    /// Default 8 MiB (docs/benchmarks.md, "S3 GETs of 8 MiB": on
    /// SeaweedFS a GET costs mostly per request — a parallel client
    /// reached 650-860 MiB/s with 8 MiB GETs 4 at a time against 480-630
    /// with 2 MiB GETs 8 at a time, and on compressible data, which the
    /// server decompresses for every GET, 2.3x — and a gather's batch,
    /// read through its gaps in 8 MiB GETs instead of 2 MiB, reads 1.1x
    /// as many random folios a second on random data and 1.8-2.0x on
    /// compressible data; AWS advises ranges of 8-16 MiB too). 2 MiB
    /// until 2026-11-29 (512 KiB GETs had half the bandwidth of 2 MiB).
    pub part: u64,
    /// Most GETs in flight per call. Default 16.
    pub in_flight: usize,
    /// Largest gap between two reads of a batch (a prefetch, a gather's
    /// fetch, a warm start's replay) that one GET reads through, dropping
    /// the gap's bytes, rather than send a GET more: where a request costs
    /// more than reading the bytes between (an object store's GET rate
    /// bounds a scattered batch long before its bandwidth does). 0: only
    /// adjacent reads share a GET. Default [`GAP_DEFAULT`].
    pub gap: u64,
    /// Worker threads of the store's runtime. Default 1.
    pub threads: usize,
    /// Time to connect. Default 2 s.
    pub connect_timeout: Duration,
    /// Time for one request, body included. Default 30 s.
    pub timeout: Duration,
    /// Retries of one request (5xx, SlowDown, connection errors). Default 5.
    pub retries: usize,
    /// Time after which a failing request is not retried. Default 10 s.
    pub retry_for: Duration,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            part: 8 << 20,
            in_flight: 16,
            gap: GAP_DEFAULT,
            threads: 1,
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
            retries: 5,
            retry_for: Duration::from_secs(10),
        }
    }
}

impl S3Options {
    /// Sets [`S3Options::part`] (at least 4 KiB).
    pub fn part(mut self, bytes: u64) -> Self {
        self.part = bytes.max(4096);
        self
    }
    /// Sets [`S3Options::in_flight`] (at least 1).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = n.max(1);
        self
    }
    /// Sets [`S3Options::gap`].
    pub fn gap(mut self, bytes: u64) -> Self {
        self.gap = bytes;
        self
    }
    /// Sets [`S3Options::threads`] (at least 1).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }
    /// Sets [`S3Options::timeout`].
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Sets [`S3Options::connect_timeout`].
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }
    /// Sets [`S3Options::retries`] and [`S3Options::retry_for`].
    pub fn retry(mut self, retries: usize, retry_for: Duration) -> Self {
        self.retries = retries;
        self.retry_for = retry_for;
        self
    }
    /// The bound on one whole call: retries, one more request, and slack.
    pub(crate) fn guard(&self) -> Duration {
        self.retry_for + self.timeout + Duration::from_secs(5)
    }
}

/// An object could not be opened.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum OpenError {
    /// {0}
    Config(#[from] ConfigError),
    /// {url}: the object store cannot be mapped writable: an s3:// object is read-only (map it without writable)
    Writable {
        /// The URL.
        url: String,
    },
    /// {url}: the URL names a bucket but no object: add the key, s3://BUCKET/KEY
    NoKey {
        /// The URL.
        url: String,
    },
    /// cannot read the CA file {path} (?ca= or AWS_CA_BUNDLE): {detail}
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        detail: String,
    },
    /// {url}: cannot set up the S3 client: {source}
    Client {
        /// The URL.
        url: String,
        /// Why.
        source: object_store::Error,
    },
    /// {url}: cannot start the store's runtime: {source}
    Runtime {
        /// The URL.
        url: String,
        /// Why.
        source: io::Error,
    },
    /// {url}: no such bucket '{bucket}' at {endpoint} (create it, or check the bucket name and the endpoint)
    NoBucket {
        /// The URL.
        url: String,
        /// The bucket.
        bucket: String,
        /// The endpoint.
        endpoint: String,
    },
    /// {url}: no such object '{key}' in bucket '{bucket}' (check the key; `aws s3 ls s3://{bucket}/` lists them)
    NoObject {
        /// The URL.
        url: String,
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// {url}: the server at {endpoint} refused the credentials ({creds}): {detail} (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile, and the bucket's policy)
    Denied {
        /// The URL.
        url: String,
        /// The endpoint.
        endpoint: String,
        /// Where the credentials came from (never the secret).
        creds: String,
        /// The server's answer.
        detail: String,
    },
    /// {url}: cannot reach {endpoint}: {detail} (is the server running? for a local one: scripts/seaweedfs.sh start)
    Unreachable {
        /// The URL.
        url: String,
        /// The endpoint.
        endpoint: String,
        /// Why.
        detail: String,
    },
    /// {url}: no answer from {endpoint} within {secs} s (the server is overloaded or unreachable; S3Options::timeout sets the bound)
    Timeout {
        /// The URL.
        url: String,
        /// The endpoint.
        endpoint: String,
        /// The bound.
        secs: u64,
    },
    /// {url}: no credentials for AWS S3: none in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or in profile '{profile}' of ~/.aws/credentials, and the AWS credential chain (container, web identity, instance metadata) gave none ({detail}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, add them to the profile (or choose one with AWS_PROFILE or ?profile=), set AWS_ENDPOINT_URL for another S3-compatible server, or add ?unsigned=1 to the URL for a bucket that allows anonymous reads
    NoCredentials {
        /// The URL.
        url: String,
        /// The profile looked in.
        profile: String,
        /// What the chain said.
        detail: String,
    },
    /// {url}: the server gave the object no ETag, so a replaced object could not be told from the one opened: use a server that returns ETags
    NoEtag {
        /// The URL.
        url: String,
    },
    /// {url}: {source}
    Other {
        /// The URL.
        url: String,
        /// Why.
        source: object_store::Error,
    },
}

/// The default [`S3Options::gap`], 512 KiB: about what one GET costs in
/// bytes on SeaweedFS here — its bandwidth over its GET rate, 476 MiB/s
/// over ~1,150 GETs/s (which 16 or 64 in flight do not raise) ≈ 420 KiB.
/// 25,000 random 4 KiB folios of a 2 GiB object as one batch
/// (`s3bench`, `UPAGER_S3_BENCH_GETS`): gap 0 1,174-1,261 folios/s,
/// 64 KiB 2,307, 256 KiB 5,311-5,554, 512 KiB 6,330-6,908, 1 MiB
/// 5,917-6,596 (docs/benchmarks.md, "An array on S3").
pub const GAP_DEFAULT: u64 = 512 << 10;

/// Runs `fut` to completion on `rt` from any thread, bounded by `guard`:
/// `block_on` here, or on a scoped helper thread when this thread is
/// inside another runtime (where `block_on` panics).
pub(crate) fn run<T: Send>(
    rt: &tokio::runtime::Runtime,
    guard: Duration,
    fut: impl std::future::Future<Output = T> + Send,
) -> Option<T> {
    let bounded = async {
        // The timer must be made inside the runtime.
        tokio::time::timeout(guard, fut).await.ok()
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| rt.block_on(bounded))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    } else {
        rt.block_on(bounded)
    }
}

/// The error and its sources, one line (object_store's Display omits the
/// HTTP client's cause).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}
