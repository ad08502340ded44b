//! The Redis Cluster store: one key per chunk, batches pipelined per node,
//! writes acknowledged by replicas.
//!
//! Contract (what the engine relies on, see `upager::Store`):
//! 1. A read returns the bytes of the last write acknowledged before it
//!    began, zeros where no chunk was ever written (a missing key), or an
//!    error; a key holding a value of the wrong size is an error (EIO, the
//!    fault gets SIGBUS), never silently padded.
//! 2. A write is Ok only once the master has it AND the replicas the
//!    policy asks for have acknowledged it: each node's share of a batch is
//!    one pipeline `SET k1 v1, SET k2 v2, ..., WAIT n timeout` sent as one
//!    packed request on ONE connection (WAIT counts only the calling
//!    connection's writes, so the WAIT must travel with them; a retry
//!    resends the SETs with their WAIT). A failover after a fully
//!    replicated acknowledgement cannot lose the write: the promoted
//!    replica has it.
//!
//!    The replica policy, per master, as a degraded RAID
//!    does: `n` is `replicas`, but no more than the replicas the master has
//!    in sync (its `INFO replication`, read with the topology; a master
//!    promoted by a failover has none until a replica rejoins) and no
//!    fewer than `min_replicas`. A write acknowledged by `n` replicas, `n`
//!    less than `replicas`, is *degraded*: Ok, counted in
//!    `writes_degraded`, logged once per master and episode (a failover of
//!    that master before a replica rejoins would lose it). A WAIT that
//!    answers fewer than `n` (a slow replica, or one that just went away)
//!    is a failure, retried with a fresh topology; fewer than
//!    `min_replicas` (default 0) is an error naming the master, retried
//!    (a replica may rejoin) until `retry_for`. Every WAIT is bounded by
//!    `timeout`; a master without replicas is not waited on at all. While
//!    a master is short of replicas the topology is read again every
//!    second, so a rejoined replica is waited on again. Why this default: a
//!    cluster that answers `cluster_state:ok` is up, and refusing writes
//!    there made the engine refuse the program's writes (SIGBUS) after
//!    every failover that was not followed by a revived node.
//! 3. Failures retry with bounded exponential backoff (20 ms doubling to
//!    500 ms; guesses) until `retry_for` has passed: a MOVED/ASK/CLUSTERDOWN
//!    reply, a refused or dropped connection or a timeout drops the pooled
//!    connections (the next one learns the new topology) and retries only
//!    the chunks that failed. Past the bound the chunk's result is the last
//!    error: the engine then raises SIGBUS for that read fault, or keeps the
//!    folio dirty and reports the error from `flush()`.
//!
//! Key layout: the metadata hash `upager:{NAME}:meta` (fields `len`,
//! `chunk`) and chunk `I` at `upager:{NAME/G}:I` with `G = I / 64`: the
//! hash tag `{NAME/G}` puts 64 consecutive chunks in one slot, so a
//! readahead run goes to one node in one round trip, while successive runs
//! spread over the nodes.
//! Beside the metadata, in its slot: the upload hash `upager:{NAME}:upload`
//! while an upload or a delete holds the name (the `dataset` module's
//! protocol) and the warm-start trace `upager:{NAME}:trace`. The key
//! functions are here, with the layout; the dataset module uses them.
//!
//! Batching: `read_at` of several chunks, `read_batch` and `write_batch`
//! group their chunks by the master that owns their slot and send each
//! group as one packed pipeline (one round trip per node); with
//! `pipelined: false` every chunk is its own round trip (the ablation).
//!
//! Connections: a pool of sync `ClusterConnection`s (the engine calls the
//! store from several threads at once), one taken per operation.
//!
//! Uses: `reply`, `url`. The `dataset` module uses this one, never the
//! other way: the store knows a dataset only by its key layout.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ConnectionLike, Value};
use upager::{ReadReq, Src, Store, Write, Written};

use crate::reply::{bad_reply, texts};
use crate::url::{Password, StoreUrl};

/// Chunks per hash tag: a run of this many consecutive chunks lives on one
/// node (64 × 64 KiB = 4 MiB, the largest readahead window).
pub const GROUP: u64 = 64;

/// Hash slots of Redis Cluster.
const SLOTS: usize = 16384;

/// Idle connections kept for reuse (about the threads that call at once).
const IDLE_CONNS: usize = 8;

/// Options of a Redis store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Send a batch's chunks as one pipeline per node. Default true; false
    /// makes one round trip per chunk (the ablation of the benchmarks).
    pub pipelined: bool,
    /// Replicas asked to acknowledge every write (`WAIT`). Default 1; 0
    /// trusts the master alone (a failover may then lose the last writes).
    /// A master with fewer replicas than this (after a failover) keeps
    /// taking writes unless `min_replicas` forbids it: see the module doc.
    pub replicas: usize,
    /// Fewest replicas that must acknowledge a write for it to succeed.
    /// Default 0: a shard left without replicas keeps taking writes
    /// (degraded, counted in `writes_degraded`, logged once per master).
    /// N > 0: writes to a master with fewer than N replicas in sync fail
    /// (after `retry_for`) with an error naming the master; the engine then
    /// keeps the data dirty in memory and reports it from `flush()`. The
    /// store URL's `?min_replicas=N` sets it too (and wins). `replicas` is
    /// raised to at least this.
    pub min_replicas: usize,
    /// How long an operation keeps retrying across failures (failover,
    /// refused connections) before it fails. Default 10 s.
    pub retry_for: Duration,
    /// Per command (connect, reply, and the `WAIT` timeout). Default 2 s.
    pub timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            pipelined: true,
            replicas: 1,
            min_replicas: 0,
            retry_for: Duration::from_secs(10),
            timeout: Duration::from_secs(2),
        }
    }
}

/// Wire counters of one store (snake_case names, as the engine's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCounters {
    /// Requests sent and answered (one packed pipeline counts once).
    pub round_trips: u64,
    /// Commands sent (GET, SET, WAIT, UNLINK, ...).
    pub commands: u64,
    /// Bytes of commands sent (the RESP encoding).
    pub bytes_sent: u64,
    /// Bytes of chunk values received.
    pub bytes_received: u64,
    /// WAIT commands sent.
    pub replication_waits: u64,
    /// Wall time of the write rounds that ended with a WAIT (the SETs and
    /// their replication, which travel together), in nanoseconds.
    pub replication_wait_ns: u64,
    /// Operations retried after a failure.
    pub retries: u64,
    /// Chunk writes acknowledged by fewer replicas than `replicas` asks
    /// (but at least `min_replicas`): kept by the master and the replicas
    /// it has, after a failover left it without enough (`store_writes_degraded`).
    pub writes_degraded: u64,
}

impl RedisCounters {
    /// The counters with their stable names (`store_` + the field name),
    /// as faces print them.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("store_round_trips", self.round_trips),
            ("store_commands", self.commands),
            ("store_bytes_sent", self.bytes_sent),
            ("store_bytes_received", self.bytes_received),
            ("store_replication_waits", self.replication_waits),
            ("store_replication_wait_ns", self.replication_wait_ns),
            ("store_retries", self.retries),
            ("store_writes_degraded", self.writes_degraded),
        ]
        .into_iter()
    }
}

#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    commands: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    replication_waits: AtomicU64,
    replication_wait_ns: AtomicU64,
    retries: AtomicU64,
    writes_degraded: AtomicU64,
}

/// A Redis Cluster store could not be opened or created.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum OpenError {
    /// cannot reach the Redis Cluster at {addrs}: {source} (is it running? scripts/redis-cluster.sh start)
    Unreachable {
        /// The seed addresses.
        addrs: String,
        /// Why.
        source: redis::RedisError,
    },
    /// the server at {addrs} closed the connection at once: {source} (a TLS-only port? connect over TLS with rediss-cluster://)
    Reset {
        /// The seed addresses.
        addrs: String,
        /// Why.
        source: redis::RedisError,
    },
    /// the server at {addrs} does not answer in the Redis protocol ({source}): is that the port of a Redis Cluster node? (redis-cli -p PORT cluster info checks it)
    NotRedis {
        /// The seed addresses.
        addrs: String,
        /// What the client could not parse.
        source: redis::RedisError,
    },
    /// the Redis Cluster at {addrs} refused the credentials{user}: {source} (check USER:PASSWORD@ in the store URL; a password alone, :PASSWORD@, is the default user's)
    Auth {
        /// The seed addresses.
        addrs: String,
        /// ` of user 'NAME'`, or empty for the default user.
        user: String,
        /// The server's answer (it never holds the password).
        source: redis::RedisError,
    },
    /// the Redis Cluster at {addrs} requires a password: {source} (put it in the store URL: redis-cluster://:PASSWORD@HOST:PORT, or USER:PASSWORD@ for an ACL user)
    NoAuth {
        /// The seed addresses.
        addrs: String,
        /// The server's answer.
        source: redis::RedisError,
    },
    /// cannot read the {what} file {path} given in the store URL: {detail}
    TlsFile {
        /// `CA (?ca=)`, `client certificate (?cert=)` or `client key (?key=)`.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why (an I/O error, or no PEM in it).
        detail: String,
    },
    /// the TLS connection to the Redis Cluster at {addrs} failed: {source} ({hint})
    Tls {
        /// The seed addresses.
        addrs: String,
        /// Why.
        source: redis::RedisError,
        /// What to check.
        hint: &'static str,
    },
    /// the store URL {url} names no dataset: add /NAME (e.g. redis-cluster://127.0.0.1:7000/mydata)
    NoName {
        /// The URL.
        url: String,
    },
    /// no dataset '{name}' on the Redis Cluster at {addrs}: upload one first (upager load FILE redis-cluster://.../{name})
    NotFound {
        /// The dataset.
        name: String,
        /// The seed addresses.
        addrs: String,
    },
    /// dataset '{name}' exists already on the Redis Cluster at {addrs}: pick another name or delete it first
    Exists {
        /// The dataset.
        name: String,
        /// The seed addresses.
        addrs: String,
    },
    /// dataset '{name}' has unreadable metadata ({detail}): was its key upager:{{{name}}}:meta written by upager?
    BadMeta {
        /// The dataset.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// dataset '{name}' on the Redis Cluster at {addrs} is an incomplete upload (interrupted, killed, or still running): `upager delete` removes it, `upager load` again replaces it
    Incomplete {
        /// The dataset.
        name: String,
        /// The seed addresses.
        addrs: String,
    },
    /// dataset '{name}' on the Redis Cluster at {addrs} is being uploaded (last progress {age} s ago): wait for it, or `upager delete` it first (an upload killed outright is replaced by a new load after 60 s)
    Busy {
        /// The dataset.
        name: String,
        /// The seed addresses.
        addrs: String,
        /// Seconds since the upload's last progress.
        age: String,
    },
    /// chunk size {0} is not a power of two from 4 KiB to 2 MiB
    Chunk(u64),
    /// Redis Cluster at {addrs} failed: {source}
    Redis {
        /// The seed addresses.
        addrs: String,
        /// Why.
        source: io::Error,
    },
}

/// A store operation (delete) failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum StoreError {
    /// the store URL {url} names no dataset: add /NAME (upager list shows the names)
    NoName {
        /// The URL.
        url: String,
    },
    /// no dataset '{name}' on the Redis Cluster at {addrs} (complete or not): upager list shows the names
    NotFound {
        /// The dataset.
        name: String,
        /// The seed addresses.
        addrs: String,
    },
    /// {0}
    Open(OpenError),
    /// deleting dataset '{name}' failed: {source} (run it again; keys already deleted stay deleted)
    Delete {
        /// The dataset.
        name: String,
        /// Why.
        source: io::Error,
    },
}

/// A node's address: host, port.
type Node = (String, u16);

/// Masters of the cluster and which owns each slot.
#[derive(Debug)]
struct Topology {
    /// Master addresses.
    masters: Vec<(String, u16)>,
    /// Every node, masters and replicas.
    all: Vec<(String, u16)>,
    /// `owner[slot]`: index into `masters`, or `u16::MAX` if unassigned.
    owner: Vec<u16>,
    /// `replicas[m]`: replicas master `m` has in sync, from its own `INFO
    /// replication` (else those CLUSTER SLOTS lists for it).
    replicas: Vec<usize>,
    /// When it was fetched (a topology with a master short of replicas is
    /// fetched again after [`DEGRADED_REFRESH`], to see a replica rejoin).
    fetched: Instant,
}

/// How long a topology with a master short of replicas is trusted (a
/// guess: a rejoined replica is waited on again within a second).
const DEGRADED_REFRESH: Duration = Duration::from_secs(1);

/// A dataset (or a swap space) on a Redis Cluster, as an `upager::Store`.
pub struct RedisStore {
    url: StoreUrl,
    name: String,
    len: u64,
    chunk: u64,
    writable: bool,
    /// Anonymous swap space: keys deleted on drop.
    swap: bool,
    opts: RedisOptions,
    /// The client, and its seeds: the URL's nodes and every node any
    /// topology listed since (only grows: a node that is down now may be
    /// the one that answers after the next failover).
    client: Mutex<(Arc<ClusterClient>, Vec<Node>)>,
    /// Credentials and TLS material for new clients (never printed).
    access: Access,
    pool: Mutex<Vec<ClusterConnection>>,
    topo: Mutex<Option<Arc<Topology>>>,
    counters: Counters,
    /// One past the highest chunk ever written (what delete must remove).
    high: AtomicU64,
    deleted: AtomicBool,
    /// Masters whose writes are degraded now (logged once per episode).
    degraded: Mutex<Vec<Node>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url.to_string())
            .field("len", &self.len)
            .field("chunk", &self.chunk)
            .field("writable", &self.writable)
            .finish()
    }
}

/// CRC16 (XMODEM) of Redis Cluster's key hashing.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key` (its `{tag}` if it has a non-empty one).
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tag) % SLOTS as u16
}

/// The key of dataset `name`'s warm-start trace (same hash tag as its
/// metadata: the same slot).
pub(crate) fn trace_key(name: &str) -> String {
    format!("upager:{{{name}}}:trace")
}

/// The upload hash of dataset `name` (same hash tag as its metadata: the
/// `RENAME` that publishes it stays in one slot).
pub(crate) fn upload_key(name: &str) -> String {
    format!("upager:{{{name}}}:upload")
}

pub(crate) fn meta_key(name: &str) -> String {
    format!("upager:{{{name}}}:meta")
}

pub(crate) fn chunk_key(name: &str, i: u64) -> String {
    format!("upager:{{{name}/{}}}:{i}", i / GROUP)
}

/// Why connecting to the cluster `url` names failed: refused
/// credentials, a missing password, TLS, something not Redis on the port
/// (an HTTP server: the client fails to parse its reply), or no answer.
fn unreachable(url: &StoreUrl, source: redis::RedisError) -> OpenError {
    let addrs = url.addresses();
    // The cluster client wraps a node's error in its own ("Failed to
    // connect to each cluster node (...: WRONGPASS ...)"): match the text.
    let text = source.to_string();
    let has = |w: &str| text.contains(w);
    if source.kind() == redis::ErrorKind::AuthenticationFailed
        || has("WRONGPASS")
        || has("AuthenticationFailed")
        || has("invalid password")
        || has("invalid username-password")
    {
        let user = url
            .user
            .as_ref()
            .map_or(String::new(), |u| format!(" of user '{u}'"));
        return OpenError::Auth {
            addrs,
            user,
            source,
        };
    }
    if has("NOAUTH") || has("Authentication required") {
        return OpenError::NoAuth { addrs, source };
    }
    if url.tls.is_some()
        && (has("certificate")
            || has("Certificate")
            || has("TLS")
            || has("tls")
            || has("handshake")
            || has("corrupt message")
            || has("InvalidContentType")
            || has("peer"))
    {
        let hint = if has("UnknownIssuer") || has("unknown issuer") || has("BadSignature") {
            "the server's certificate is not signed by a CA this client trusts: give its CA \
             with ?ca=PATH, or ?insecure=1 for a self-signed test setup"
        } else if has("NotValidForName") || has("not valid for name") {
            "the server's certificate does not name the host of the store URL: connect by a \
             name or address its certificate lists (subjectAltName)"
        } else if has("Expired") || has("expired") || has("NotValidYet") {
            "the server's certificate is out of its validity period"
        } else if has("CertificateRequired") || has("certificate required") {
            "the server asks for a client certificate: give one with ?cert=PATH&key=PATH"
        } else {
            "is that port a TLS port of the cluster (redis-server --tls-port)? a plain port \
             does not speak TLS: use redis-cluster:// there"
        };
        return OpenError::Tls {
            addrs,
            source,
            hint,
        };
    }
    if url.tls.is_none() && (has("reset by peer") || has("os error 104")) {
        return OpenError::Reset { addrs, source };
    }
    if source.kind() == redis::ErrorKind::Parse || has("Parse error") {
        OpenError::NotRedis { addrs, source }
    } else {
        OpenError::Unreachable { addrs, source }
    }
}

/// How to reach the nodes: the URL's credentials and its TLS material,
/// read once when the store connects.
#[derive(Clone)]
struct Access {
    user: Option<String>,
    password: Option<Password>,
    /// `Some` over TLS.
    tls: Option<TlsAccess>,
}

/// TLS settings, with the PEM files of the URL read.
#[derive(Clone)]
struct TlsAccess {
    insecure: bool,
    /// The CA and client certificate, if the URL gives them (else the
    /// system's CA store, no client certificate).
    certs: Option<redis::TlsCertificates>,
}

/// Reads one PEM file of a URL's TLS parameters: it must hold at least
/// one PEM block (a file of something else would fail later as an
/// unknown issuer or a bad key, far from its cause).
fn read_pem(path: &std::path::Path, what: &'static str) -> Result<Vec<u8>, OpenError> {
    let bad = |detail: String| OpenError::TlsFile {
        what,
        path: path.to_path_buf(),
        detail,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(bad(
            "it holds no PEM block (-----BEGIN ...): give a PEM file".to_string(),
        ));
    }
    Ok(pem)
}

impl Access {
    fn of(url: &StoreUrl) -> Result<Access, OpenError> {
        let tls = match &url.tls {
            None => None,
            Some(t) => {
                let root_cert =
                    t.ca.as_deref()
                        .map(|p| read_pem(p, "CA (?ca=)"))
                        .transpose()?;
                let client_tls = match (&t.cert, &t.key) {
                    (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                        client_cert: read_pem(c, "client certificate (?cert=)")?,
                        client_key: read_pem(k, "client key (?key=)")?,
                    }),
                    _ => None,
                };
                let certs = (root_cert.is_some() || client_tls.is_some()).then_some(
                    redis::TlsCertificates {
                        client_tls,
                        root_cert,
                    },
                );
                Some(TlsAccess {
                    insecure: t.insecure,
                    certs,
                })
            }
        };
        Ok(Access {
            user: url.user.clone(),
            password: url.password.clone(),
            tls,
        })
    }
}

/// Runs `connect` again (for up to `patience`) while it fails because a signal
/// interrupted it. A signal that reaches a thread blocked on a socket with
/// a timeout makes the call fail with EINTR even under `SA_RESTART`
/// (signal(7)): a Python program's handlers, a profiler's timer. The
/// client is built with no retries of its own; it reports EINTR as such
/// while connecting, and as a node that "failed to respond to connection
/// check" when it interrupts the PING after connecting (redis-rs 1.8,
/// `create_initial_connections`). Connecting and asking for the topology
/// start afresh each time, so repeating them is safe; any other failure
/// (a refusal, a timeout, a TLS or protocol error) is final.
fn again_if_interrupted<T>(
    patience: Duration,
    mut connect: impl FnMut() -> redis::RedisResult<T>,
) -> redis::RedisResult<T> {
    let until = Instant::now() + patience;
    let eintr = io::Error::from_raw_os_error(libc::EINTR).to_string();
    let interrupted = |e: &redis::RedisError| {
        let text = e.to_string();
        e.is_io_error()
            && (text.contains(&eintr) || text.contains("failed to respond to connection check"))
    };
    loop {
        match connect() {
            Err(e) if interrupted(&e) && Instant::now() < until => {
                log::debug!("connecting to the Redis Cluster was interrupted ({e}); again");
            }
            r => return r,
        }
    }
}

fn io_err(e: redis::RedisError) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() {
        io::ErrorKind::ConnectionRefused
    } else if e.is_io_error() {
        io::ErrorKind::BrokenPipe
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("redis: {e}"))
}

/// One chunk operation of a batch.
#[derive(Debug, Clone, Copy)]
enum Op<'a> {
    Get,
    Set(&'a [u8]),
    Del,
}

/// The chunks of one write: (chunk index, bytes).
type Pieces<'b> = Vec<(u64, &'b [u8])>;

/// Outcome of one chunk operation: the value of a GET (None: no key).
type OpResult = io::Result<Option<Vec<u8>>>;

impl RedisStore {
    fn client_for(
        nodes: &[(String, u16)],
        access: &Access,
        opts: &RedisOptions,
    ) -> redis::RedisResult<ClusterClient> {
        let (scheme, fragment) = match &access.tls {
            None => ("redis", ""),
            // The client takes "insecure" from the first seed's URL.
            Some(t) if t.insecure => ("rediss", "/#insecure"),
            Some(_) => ("rediss", ""),
        };
        let seeds: Vec<String> = nodes
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("{scheme}://[{h}]:{p}{fragment}")
                } else {
                    format!("{scheme}://{h}:{p}{fragment}")
                }
            })
            .collect();
        let mut b = ClusterClient::builder(seeds)
            .retries(0)
            .connection_timeout(opts.timeout)
            .response_timeout(opts.timeout + opts.timeout);
        if let Some(p) = &access.password {
            b = b.password(p.expose());
        }
        if let Some(u) = &access.user {
            b = b.username(u);
        }
        if let Some(t) = &access.tls {
            // rustls needs a crypto provider; ring unless the program has
            // installed one (then this fails, and theirs is used).
            let _ = rustls::crypto::ring::default_provider().install_default();
            b = b.tls(if t.insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            });
            if let Some(c) = &t.certs {
                b = b.certs(c.clone());
            }
        }
        b.build()
    }

    /// Connects to the cluster at `url` (no dataset checks).
    fn connect(
        url: &StoreUrl,
        name: String,
        len: u64,
        chunk: u64,
        writable: bool,
        swap: bool,
        opts: &RedisOptions,
    ) -> Result<RedisStore, OpenError> {
        let addrs = url.addresses();
        let access = Access::of(url)?;
        let mut opts = opts.clone();
        if let Some(m) = url.min_replicas {
            opts.min_replicas = m;
        }
        opts.replicas = opts.replicas.max(opts.min_replicas);
        let opts = &opts;
        let client = Self::client_for(&url.nodes, &access, opts)
            .map_err(|source| unreachable(url, source))?;
        let (conn, topo) = again_if_interrupted(opts.timeout, || {
            let mut conn = client.get_connection()?;
            let topo = fetch_topology(&mut conn)?;
            Ok((conn, topo))
        })
        .map_err(|source| unreachable(url, source))?;
        // Seed the client with every node, not only the URL's: a seed that
        // dies (a failed-over master) must not make the cluster unreachable.
        let mut seeds = url.nodes.clone();
        for n in &topo.all {
            if !seeds.contains(n) {
                seeds.push(n.clone());
            }
        }
        let client =
            Self::client_for(&seeds, &access, opts).map_err(|source| OpenError::Unreachable {
                addrs: addrs.clone(),
                source,
            })?;
        Ok(RedisStore {
            url: url.clone(),
            name,
            len,
            chunk,
            writable,
            swap,
            opts: opts.clone(),
            client: Mutex::new((Arc::new(client), seeds)),
            access,
            pool: Mutex::new(vec![conn]),
            topo: Mutex::new(Some(Arc::new(topo))),
            counters: Counters::default(),
            high: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            degraded: Mutex::new(Vec::new()),
        })
    }

    /// Opens the existing dataset the URL names.
    pub fn open(
        url: &StoreUrl,
        writable: bool,
        opts: &RedisOptions,
    ) -> Result<Arc<RedisStore>, OpenError> {
        let name = url.name.clone().ok_or_else(|| OpenError::NoName {
            url: url.to_string(),
        })?;
        let mut st = Self::connect(url, name.clone(), 0, 0, writable, false, opts)?;
        let meta: Vec<Option<String>> = st
            .command(
                redis::cmd("HMGET")
                    .arg(meta_key(&name))
                    .arg("len")
                    .arg("chunk"),
            )
            .and_then(|v| {
                redis::FromRedisValue::from_redis_value(v)
                    .map_err(|e| io::Error::other(e.to_string()))
            })
            .map_err(|source| OpenError::Redis {
                addrs: url.addresses(),
                source,
            })?;
        let (len, chunk) = match parse_meta(&name, &meta) {
            Ok(Some(lc)) => lc,
            Err(e) => return Err(e),
            Ok(None) => {
                let partial = st
                    .command(redis::cmd("EXISTS").arg(upload_key(&name)))
                    .map_err(|source| OpenError::Redis {
                        addrs: url.addresses(),
                        source,
                    })?;
                if partial == Value::Int(1) {
                    return Err(OpenError::Incomplete {
                        name,
                        addrs: url.addresses(),
                    });
                }
                return Err(OpenError::NotFound {
                    name,
                    addrs: url.addresses(),
                });
            }
        };
        st.len = len;
        st.chunk = chunk;
        st.high.store(len.div_ceil(chunk), Relaxed);
        Ok(Arc::new(st))
    }

    /// A writable store of the dataset `url` names (`len` bytes in chunks
    /// of `chunk`), without looking at its metadata: for an upload or a
    /// delete. Returns it and the name.
    pub(crate) fn for_dataset(
        url: &StoreUrl,
        len: u64,
        chunk: u64,
        opts: &RedisOptions,
    ) -> Result<(Arc<RedisStore>, String), OpenError> {
        let name = url.name.clone().ok_or_else(|| OpenError::NoName {
            url: url.to_string(),
        })?;
        check_chunk(chunk)?;
        let st = Self::connect(url, name.clone(), len, chunk, true, false, opts)?;
        st.high.store(len.div_ceil(chunk), Relaxed);
        Ok((Arc::new(st), name))
    }

    /// Removes chunk keys `[first, end)` (pipelined per node, retried).
    pub(crate) fn unlink_chunks(&self, first: u64, end: u64) -> io::Result<()> {
        let ops: Vec<(u64, Op<'_>)> = (first..end).map(|i| (i, Op::Del)).collect();
        for r in self.run(&ops, false) {
            r?;
        }
        Ok(())
    }

    /// The masters now.
    pub(crate) fn masters(&self) -> io::Result<Vec<Node>> {
        let mut conn = self.take_conn()?;
        let t = self.topology(&mut conn)?;
        self.put_conn(conn);
        Ok(t.masters.clone())
    }

    /// One command sent where `route` says, retried until `deadline`.
    pub(crate) fn routed(
        &self,
        cmd: &redis::Cmd,
        route: RoutingInfo,
        deadline: Instant,
    ) -> io::Result<Value> {
        let mut backoff = Duration::from_millis(20);
        loop {
            let r = self.take_conn().and_then(|mut c| {
                let v = c.route_command(cmd, route.clone()).map_err(io_err)?;
                self.put_conn(c);
                Ok(v)
            });
            self.counters.round_trips.fetch_add(1, Relaxed);
            self.counters.commands.fetch_add(1, Relaxed);
            let retry = match &r {
                Ok(Value::ServerError(e)) => retryable_server_error(e.code()),
                Ok(_) => false,
                Err(_) => true,
            };
            if !retry || Instant::now() >= deadline {
                return r.and_then(server_error);
            }
            self.retry_pause(&mut backoff, deadline);
        }
    }

    /// Anonymous swap space on the cluster (far memory): a unique name, no
    /// length limit, its keys deleted when the store is dropped.
    pub fn swap(
        url: &StoreUrl,
        chunk: u64,
        opts: &RedisOptions,
    ) -> Result<Arc<RedisStore>, OpenError> {
        check_chunk(chunk)?;
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let name = format!(
            "swap-{}-{nanos:x}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        );
        let st = Self::connect(url, name, u64::MAX, chunk, true, true, opts)?;
        Ok(Arc::new(st))
    }

    /// The dataset's chunk size: a region's folio must be a multiple.
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// The dataset's name (generated for swap space).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The options it was opened with.
    pub fn options(&self) -> &RedisOptions {
        &self.opts
    }

    /// A snapshot of the wire counters.
    pub fn counters(&self) -> RedisCounters {
        let c = &self.counters;
        RedisCounters {
            round_trips: c.round_trips.load(Relaxed),
            commands: c.commands.load(Relaxed),
            bytes_sent: c.bytes_sent.load(Relaxed),
            bytes_received: c.bytes_received.load(Relaxed),
            replication_waits: c.replication_waits.load(Relaxed),
            replication_wait_ns: c.replication_wait_ns.load(Relaxed),
            retries: c.retries.load(Relaxed),
            writes_degraded: c.writes_degraded.load(Relaxed),
        }
    }

    /// Whether this is anonymous swap space (no dataset: no metadata).
    pub(crate) fn is_swap(&self) -> bool {
        self.swap
    }

    /// The URL of this store's dataset (its cluster, and its name).
    pub(crate) fn dataset_url(&self) -> StoreUrl {
        self.url.with_name(&self.name)
    }

    /// Removes swap space's keys (what [`RedisStore::delete`] does for
    /// swap space).
    pub(crate) fn delete_swap(&self) -> Result<(), StoreError> {
        self.delete_keys().map_err(|source| StoreError::Delete {
            name: self.name.clone(),
            source,
        })
    }

    fn delete_keys(&self) -> io::Result<()> {
        let high = self.high.load(Relaxed);
        const STEP: u64 = 4096;
        let mut first = 0;
        while first < high {
            let ops: Vec<(u64, Op<'_>)> = (first..high.min(first + STEP))
                .map(|i| (i, Op::Del))
                .collect();
            for r in self.run(&ops, false) {
                r?;
            }
            first += STEP;
        }
        self.command(redis::cmd("UNLINK").arg(meta_key(&self.name)))?;
        self.deleted.store(true, Relaxed);
        Ok(())
    }

    /// Bytes chunk `i` holds (the last chunk of a dataset may be short).
    fn chunk_len(&self, i: u64) -> u64 {
        self.chunk.min(self.len - i * self.chunk)
    }

    /// A connection from the pool, or a new one.
    fn take_conn(&self) -> io::Result<ClusterConnection> {
        if let Some(c) = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(c);
        }
        let client = Arc::clone(&self.client.lock().unwrap_or_else(|e| e.into_inner()).0);
        let c = client.get_connection().map_err(io_err)?;
        // A peer that stops reading must not block a write-back for ever
        // (reads have the client's response timeout).
        c.set_write_timeout(Some(self.opts.timeout + self.opts.timeout))
            .map_err(io_err)?;
        Ok(c)
    }

    fn put_conn(&self, c: ClusterConnection) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < IDLE_CONNS {
            pool.push(c);
        }
    }

    /// After a failure: forget the pooled connections and the topology, so
    /// the next attempt learns the cluster anew.
    fn forget(&self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *self.topo.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn topology(&self, conn: &mut ClusterConnection) -> io::Result<Arc<Topology>> {
        if let Some(t) = &*self.topo.lock().unwrap_or_else(|e| e.into_inner()) {
            let short = t.replicas.iter().any(|&n| n < self.opts.replicas);
            if !short || t.fetched.elapsed() < DEGRADED_REFRESH {
                return Ok(Arc::clone(t));
            }
        }
        let t = Arc::new(fetch_topology(conn).map_err(io_err)?);
        self.counters.round_trips.fetch_add(1, Relaxed);
        // New nodes join the seeds of later connections.
        let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
        let fresh: Vec<_> = t
            .all
            .iter()
            .filter(|n| !client.1.contains(n))
            .cloned()
            .collect();
        if !fresh.is_empty() {
            client.1.extend(fresh);
            if let Ok(c) = Self::client_for(&client.1, &self.access, &self.opts) {
                client.0 = Arc::new(c);
            }
        }
        drop(client);
        *self.topo.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&t));
        Ok(t)
    }

    /// One command routed by its key, with the retry policy.
    pub(crate) fn command(&self, cmd: &redis::Cmd) -> io::Result<Value> {
        let deadline = Instant::now() + self.opts.retry_for;
        let mut backoff = Duration::from_millis(20);
        loop {
            let r = self.take_conn().and_then(|mut c| {
                let v = c.req_command(cmd).map_err(io_err)?;
                self.put_conn(c);
                Ok(v)
            });
            self.counters.round_trips.fetch_add(1, Relaxed);
            self.counters.commands.fetch_add(1, Relaxed);
            let retry = match &r {
                Ok(Value::ServerError(e)) => retryable_server_error(e.code()),
                Ok(_) => false,
                Err(_) => true,
            };
            if !retry || Instant::now() >= deadline {
                return r.and_then(server_error);
            }
            self.retry_pause(&mut backoff, deadline);
        }
    }

    fn retry_pause(&self, backoff: &mut Duration, deadline: Instant) {
        self.counters.retries.fetch_add(1, Relaxed);
        self.forget();
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep((*backoff).min(left));
        *backoff = (*backoff * 2).min(Duration::from_millis(500));
    }

    /// Runs chunk operations: grouped per master (pipelined) or one per
    /// round trip, writes followed by a WAIT in the same request when
    /// `wait`; failed ones retried until `retry_for` has passed. One result
    /// per operation, in order.
    fn run(&self, ops: &[(u64, Op<'_>)], wait: bool) -> Vec<OpResult> {
        let mut results: Vec<Option<OpResult>> = (0..ops.len()).map(|_| None).collect();
        let deadline = Instant::now() + self.opts.retry_for;
        let mut backoff = Duration::from_millis(20);
        let keys: Vec<String> = ops.iter().map(|(i, _)| chunk_key(&self.name, *i)).collect();
        loop {
            let pending: Vec<usize> = (0..ops.len()).filter(|&k| results[k].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let last = self.attempt(ops, &keys, &pending, wait, &mut results).err();
            let still: Vec<usize> = pending
                .into_iter()
                .filter(|&k| results[k].is_none())
                .collect();
            if still.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let msg = last.map_or_else(|| "gave up".to_string(), |e| e.to_string());
                for k in still {
                    results[k] = Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "Redis Cluster at {} did not complete the operation on {} within {:?}: {msg}",
                            self.url.addresses(),
                            keys[k],
                            self.opts.retry_for
                        ),
                    )));
                }
                break;
            }
            self.retry_pause(&mut backoff, deadline);
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(None))).collect()
    }

    /// One attempt at the `pending` operations: fills in the results of
    /// those that completed (or failed for good); returns the error that
    /// left others pending.
    fn attempt(
        &self,
        ops: &[(u64, Op<'_>)],
        keys: &[String],
        pending: &[usize],
        wait: bool,
        results: &mut [Option<OpResult>],
    ) -> io::Result<()> {
        let mut conn = self.take_conn()?;
        let topo = self.topology(&mut conn)?;
        // Group by the master that owns each key's slot.
        let groups: Vec<Vec<usize>> = if self.opts.pipelined {
            let mut by_node: HashMap<u16, Vec<usize>> = HashMap::new();
            for &k in pending {
                let owner = topo.owner[slot(keys[k].as_bytes()) as usize];
                by_node.entry(owner).or_default().push(k);
            }
            let mut g: Vec<_> = by_node.into_values().collect();
            g.sort_by_key(|v| v[0]);
            g
        } else {
            pending.iter().map(|&k| vec![k]).collect()
        };
        let mut first_err = None;
        for g in groups {
            let m = topo.owner[slot(keys[g[0]].as_bytes()) as usize];
            match self.round(&mut conn, &topo, m, ops, keys, &g, wait, results) {
                Ok(()) => {}
                Err(e) => {
                    // The connection may be out of step: a new one.
                    first_err.get_or_insert(e);
                    drop(conn);
                    self.forget();
                    conn = self.take_conn()?;
                }
            }
        }
        self.put_conn(conn);
        first_err.map_or(Ok(()), Err)
    }

    /// One packed request for the operations `g` (all on master `m` of
    /// `topo`, `u16::MAX` if unknown), plus a WAIT if it writes and `wait`
    /// (as the replica policy says, see the module doc).
    #[allow(clippy::too_many_arguments)]
    fn round(
        &self,
        conn: &mut ClusterConnection,
        topo: &Topology,
        m: u16,
        ops: &[(u64, Op<'_>)],
        keys: &[String],
        g: &[usize],
        wait: bool,
        results: &mut [Option<OpResult>],
    ) -> io::Result<()> {
        let mut packed = Vec::new();
        let mut writes = false;
        for &k in g {
            let mut c = match ops[k].1 {
                Op::Get => redis::cmd("GET"),
                Op::Set(v) => {
                    writes = true;
                    let mut c = redis::cmd("SET");
                    c.arg(&keys[k]).arg(v);
                    c.write_packed_command(&mut packed);
                    continue;
                }
                Op::Del => redis::cmd("UNLINK"),
            };
            c.arg(&keys[k]);
            c.write_packed_command(&mut packed);
        }
        let node = topo.masters.get(usize::from(m));
        let target = self.wait_target(topo, m);
        let waits = writes && wait && target > 0;
        if waits {
            redis::cmd("WAIT")
                .arg(target)
                .arg(self.opts.timeout.as_millis() as u64)
                .write_packed_command(&mut packed);
        }
        let count = g.len() + usize::from(waits);
        let t0 = Instant::now();
        let c = &self.counters;
        c.round_trips.fetch_add(1, Relaxed);
        c.commands.fetch_add(count as u64, Relaxed);
        c.bytes_sent.fetch_add(packed.len() as u64, Relaxed);
        // Routed by its first command's key: every key of `g` is on that
        // master (or the reply says MOVED and the group is retried).
        let at = |e: io::Error| match node {
            Some((h, p)) => io::Error::new(e.kind(), format!("master {h}:{p}: {e}")),
            None => e,
        };
        let vals = conn
            .req_packed_commands(&packed, 0, count)
            .map_err(|e| at(io_err(e)))?;
        if waits {
            c.replication_waits.fetch_add(1, Relaxed);
            c.replication_wait_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        }
        if vals.len() != count {
            return Err(io::Error::other(format!(
                "redis: {} replies to {count} commands",
                vals.len()
            )));
        }
        if writes && wait && self.opts.replicas > 0 {
            let sets = g
                .iter()
                .filter(|&&k| matches!(ops[k].1, Op::Set(_)))
                .count();
            let acked = if waits {
                match &vals[count - 1] {
                    Value::Int(n) => *n,
                    v => return Err(at(io::Error::other(format!("redis: WAIT replied {v:?}")))),
                }
            } else {
                0 // a master without replicas: nothing to wait for
            };
            // An unknown master (unassigned slot): the SETs' replies say why.
            if let Some(node) = node {
                self.judge_acks(node, acked, target, sets as u64)?;
            }
        }
        let mut err = None;
        for (&k, v) in g.iter().zip(vals) {
            let (i, op) = ops[k];
            let r = match (op, v) {
                (_, Value::ServerError(e)) => {
                    let msg = format!("redis: {} on {}", e.details().unwrap_or(""), keys[k]);
                    let msg = format!("{} {msg}", e.code());
                    if retryable_server_error(e.code()) {
                        err.get_or_insert(io::Error::other(msg));
                        continue;
                    }
                    Err(io::Error::other(msg))
                }
                (Op::Get, Value::Nil) => Ok(None),
                (Op::Get, Value::BulkString(b)) => {
                    c.bytes_received.fetch_add(b.len() as u64, Relaxed);
                    let want = self.chunk_len(i);
                    if b.len() as u64 != want {
                        let msg = format!(
                            "key {} of dataset '{}' holds {} bytes, not the {want} of its chunk: \
                             the key was not written by upager, or by one with another chunk size",
                            keys[k],
                            self.name,
                            b.len()
                        );
                        log::error!("{msg}");
                        Err(io::Error::other(msg))
                    } else {
                        Ok(Some(b))
                    }
                }
                (Op::Set(_), Value::Okay) => Ok(None),
                (Op::Set(_), Value::SimpleString(s)) if s == "OK" => Ok(None),
                (Op::Del, Value::Int(_)) => Ok(None),
                (_, v) => Err(io::Error::other(format!(
                    "redis: unexpected reply {v:?} for {}",
                    keys[k]
                ))),
            };
            results[k] = Some(r);
        }
        err.map_or(Ok(()), Err)
    }

    /// Reads chunks `[first, first + n)` as one batch.
    fn get(&self, idx: &[u64]) -> Vec<OpResult> {
        let ops: Vec<(u64, Op<'_>)> = idx.iter().map(|&i| (i, Op::Get)).collect();
        self.run(&ops, false)
    }

    /// The chunks that cover `[offset, offset + n)`, with `n` clamped to the
    /// dataset.
    fn span(&self, offset: u64, n: usize) -> (u64, u64, usize) {
        let n = (n as u64).min(self.len.saturating_sub(offset)) as usize;
        if n == 0 {
            return (0, 0, 0);
        }
        let first = offset / self.chunk;
        let last = (offset + n as u64 - 1) / self.chunk;
        (first, last + 1, n)
    }

    /// Copies fetched chunks into `buf` (which starts at `offset`).
    fn scatter(
        &self,
        buf: &mut [u8],
        offset: u64,
        first: u64,
        vals: &mut dyn Iterator<Item = OpResult>,
    ) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        for (i, v) in (first..).zip(vals) {
            let cstart = i * self.chunk;
            let from = cstart.max(offset);
            let to = (cstart + self.chunk).min(end);
            let dst = &mut buf[(from - offset) as usize..(to - offset) as usize];
            match v? {
                None => dst.fill(0),
                Some(b) => {
                    let src = &b[(from - cstart) as usize..];
                    let m = src.len().min(dst.len());
                    dst[..m].copy_from_slice(&src[..m]);
                    dst[m..].fill(0);
                }
            }
        }
        Ok(())
    }

    /// Splits each write into its chunks' SETs (or an error for the write).
    fn pieces<'b>(&self, batch: &[Write<'_>], bufs: &'b [Vec<u8>]) -> Vec<io::Result<Pieces<'b>>> {
        batch
            .iter()
            .zip(bufs)
            .map(|(w, data)| {
                if !w.offset.is_multiple_of(self.chunk) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "write at {} is not aligned to the dataset's chunk of {} bytes",
                            w.offset, self.chunk
                        ),
                    ));
                }
                if w.offset >= self.len {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("write at {} is beyond the dataset's end ({})", w.offset, self.len),
                    ));
                }
                let data = &data[..(data.len() as u64).min(self.len - w.offset) as usize];
                let first = w.offset / self.chunk;
                let mut out = Vec::new();
                for (k, piece) in data.chunks(self.chunk as usize).enumerate() {
                    let i = first + k as u64;
                    if piece.len() as u64 != self.chunk_len(i) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!(
                                "write of {} bytes at {} ends inside chunk {i}: folios must be a multiple of the chunk ({})",
                                data.len(),
                                w.offset,
                                self.chunk
                            ),
                        ));
                    }
                    out.push((i, piece));
                }
                Ok(out)
            })
            .collect()
    }

    /// Writes chunk values straight (upload): one batch, WAIT per node.
    pub(crate) fn put_chunks(&self, items: &[(u64, &[u8])]) -> io::Result<()> {
        let ops: Vec<(u64, Op<'_>)> = items.iter().map(|&(i, v)| (i, Op::Set(v))).collect();
        if let Some(&(i, _)) = items.iter().max_by_key(|x| x.0) {
            self.high.fetch_max(i + 1, Relaxed);
        }
        for r in self.run(&ops, true) {
            r?;
        }
        Ok(())
    }

    /// The replicas a write to master `m` waits for: `replicas`, but no
    /// more than the master has listed, and no fewer than `min_replicas`
    /// (an unknown master: `replicas`).
    fn wait_target(&self, topo: &Topology, m: u16) -> usize {
        let Some(&listed) = topo.replicas.get(usize::from(m)) else {
            // An unknown master: ask for all; the SETs' replies say why.
            return self.opts.replicas;
        };
        self.opts.replicas.min(listed).max(self.opts.min_replicas)
    }

    /// Applies the replica policy to a WAIT for `target` replicas that
    /// answered `acked`, from master `node` after `sets` chunk writes: Ok
    /// (full, or degraded: counted and logged once per episode) or the
    /// error that refuses the writes (retried: a replica that is slow, or
    /// went away since the topology was read, is seen anew).
    fn judge_acks(&self, node: &Node, acked: i64, target: usize, sets: u64) -> io::Result<()> {
        let (host, port) = node;
        let o = &self.opts;
        if acked < target as i64 && acked >= o.min_replicas as i64 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "Redis Cluster master {host}:{port}: {acked} of its {target} replica(s) in sync \
                     acknowledged the writes within {:?} (WAIT)",
                    o.timeout
                ),
            ));
        }
        let mut degraded = self.degraded.lock().unwrap_or_else(|e| e.into_inner());
        if acked >= o.replicas as i64 {
            if let Some(i) = degraded.iter().position(|n| n == node) {
                degraded.swap_remove(i);
                log::warn!(
                    "Redis Cluster master {host}:{port} ({}) has {acked} replica(s) in sync again: \
                     its writes are replicated again",
                    self.url.addresses()
                );
            }
            return Ok(());
        }
        if acked >= o.min_replicas as i64 {
            self.counters.writes_degraded.fetch_add(sets, Relaxed);
            if !degraded.contains(node) {
                degraded.push(node.clone());
                log::warn!(
                    "Redis Cluster master {host}:{port} ({}) has {acked} of the {} replica(s) asked \
                     for in sync (a failover left it without): its writes are kept by it alone \
                     until a replica rejoins (degraded, counted in store_writes_degraded); a \
                     failover of it now would lose them. Add ?min_replicas=N to the store URL to \
                     refuse such writes instead",
                    self.url.addresses(),
                    o.replicas
                );
            }
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "Redis Cluster master {host}:{port} has {acked} replica(s) in sync, fewer than the \
                 {} the store requires (min_replicas): its writes are refused until a replica \
                 rejoins (scripts/redis-cluster.sh revive PORT), or lower min_replicas",
                o.min_replicas
            ),
        ))
    }

    /// WAIT on every master (through one connection each).
    fn wait_all(&self) -> io::Result<()> {
        if self.opts.replicas == 0 {
            return Ok(());
        }
        let deadline = Instant::now() + self.opts.retry_for;
        let mut backoff = Duration::from_millis(20);
        loop {
            let r = (|| {
                let mut conn = self.take_conn()?;
                let topo = self.topology(&mut conn)?;
                for (m, node) in topo.masters.iter().enumerate() {
                    let (host, port) = node;
                    let target = self.wait_target(&topo, m as u16);
                    if target == 0 {
                        self.judge_acks(node, 0, 0, 0)?;
                        continue;
                    }
                    let t0 = Instant::now();
                    let v = conn
                        .route_command(
                            redis::cmd("WAIT")
                                .arg(target)
                                .arg(self.opts.timeout.as_millis() as u64),
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                host: host.clone(),
                                port: *port,
                            }),
                        )
                        .map_err(|e| {
                            let e = io_err(e);
                            io::Error::new(e.kind(), format!("master {host}:{port}: {e}"))
                        })?;
                    let c = &self.counters;
                    c.round_trips.fetch_add(1, Relaxed);
                    c.commands.fetch_add(1, Relaxed);
                    c.replication_waits.fetch_add(1, Relaxed);
                    c.replication_wait_ns
                        .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
                    match v {
                        Value::Int(n) => self.judge_acks(node, n, target, 0)?,
                        v => {
                            return Err(io::Error::other(format!(
                                "master {host}:{port} answered WAIT with {v:?}"
                            )))
                        }
                    }
                }
                self.put_conn(conn);
                Ok(())
            })();
            match r {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => self.retry_pause(&mut backoff, deadline),
            }
        }
    }
}

fn retryable_server_error(code: &str) -> bool {
    matches!(
        code,
        "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "MASTERDOWN" | "READONLY"
    )
}

fn server_error(v: Value) -> io::Result<Value> {
    match v {
        Value::ServerError(e) => Err(io::Error::other(format!(
            "redis: {} {}",
            e.code(),
            e.details().unwrap_or("")
        ))),
        v => Ok(v),
    }
}

/// Replicas in sync in an `INFO replication` reply: the `slaveN:` lines
/// with `state=online` (not those still in their first sync).
fn online_replicas(info: &str) -> usize {
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}

/// A dataset's metadata, the fields `len` and `chunk` of its hash as
/// `HMGET` returns them: `(len, chunk)`, None if the hash does not exist,
/// [`OpenError::BadMeta`] if it is not upager's.
fn parse_meta(name: &str, meta: &[Option<String>]) -> Result<Option<(u64, u64)>, OpenError> {
    let bad = |detail: String| OpenError::BadMeta {
        name: name.to_string(),
        detail,
    };
    let (len, chunk) = match meta {
        [None, None] => return Ok(None),
        [Some(l), Some(c)] => (
            l.parse::<u64>()
                .map_err(|_| bad(format!("len '{l}' is not a number")))?,
            c.parse::<u64>()
                .map_err(|_| bad(format!("chunk '{c}' is not a number")))?,
        ),
        _ => return Err(bad("len or chunk is missing".into())),
    };
    check_chunk(chunk).map_err(|_| bad(format!("chunk {chunk} is not a valid chunk size")))?;
    Ok(Some((len, chunk)))
}

/// For the fuzz targets (fuzz/, docs/fuzzing.md) only: [`parse_meta`].
#[doc(hidden)]
pub fn parse_meta_for_fuzz(
    name: &str,
    meta: &[Option<String>],
) -> Result<Option<(u64, u64)>, OpenError> {
    parse_meta(name, meta)
}

fn check_chunk(chunk: u64) -> Result<(), OpenError> {
    if chunk.is_power_of_two() && (4096..=2 << 20).contains(&chunk) {
        Ok(())
    } else {
        Err(OpenError::Chunk(chunk))
    }
}

/// `CLUSTER SLOTS` from any node: the masters and who owns each slot.
fn fetch_topology(conn: &mut ClusterConnection) -> redis::RedisResult<Topology> {
    let v = conn.route_command(
        &redis::cmd("CLUSTER").arg("SLOTS").clone(),
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
    )?;
    let bad =
        || redis::RedisError::from((redis::ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"));
    let mut t = Topology {
        masters: Vec::new(),
        all: Vec::new(),
        owner: vec![u16::MAX; SLOTS],
        replicas: Vec::new(),
        fetched: Instant::now(),
    };
    let Value::Array(ranges) = v else {
        return Err(bad());
    };
    let node = |v: &Value| -> Option<(String, u16)> {
        let Value::Array(n) = v else { return None };
        let host = match n.first()? {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let Value::Int(port) = n.get(1)? else {
            return None;
        };
        Some((host, *port as u16))
    };
    for r in ranges {
        let Value::Array(r) = r else {
            return Err(bad());
        };
        let (Some(Value::Int(a)), Some(Value::Int(b))) = (r.first(), r.get(1)) else {
            return Err(bad());
        };
        let master = r.get(2).and_then(node).ok_or_else(bad)?;
        let idx = match t.masters.iter().position(|m| *m == master) {
            Some(i) => i,
            None => {
                t.masters.push(master.clone());
                t.replicas.push(0);
                t.masters.len() - 1
            }
        };
        let listed = r.iter().skip(3).filter_map(node).count();
        t.replicas[idx] = t.replicas[idx].max(listed);
        for s in (*a as usize)..=(*b as usize).min(SLOTS - 1) {
            t.owner[s] = idx as u16;
        }
        for n in r.iter().skip(2).filter_map(node) {
            if !t.all.contains(&n) {
                t.all.push(n);
            }
        }
    }
    // The replicas each master has connected and in sync now (INFO
    // replication, `state=online`): a replica that died is gone from there
    // at once, while CLUSTER SLOTS lists it until the cluster marks it
    // failed (cluster-node-timeout). A master that does not answer keeps
    // the count CLUSTER SLOTS gave.
    for (m, (host, port)) in t.masters.iter().enumerate() {
        if let Ok(Value::BulkString(text)) = conn.route_command(
            &redis::cmd("INFO").arg("replication").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            }),
        ) {
            t.replicas[m] = online_replicas(&String::from_utf8_lossy(&text));
        }
    }
    // CLUSTER SLOTS may not list a replica yet that CLUSTER NODES knows
    // (gossip): every node is a seed worth having.
    if let Ok(Value::BulkString(text)) = conn.route_command(
        &redis::cmd("CLUSTER").arg("NODES").clone(),
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
    ) {
        for line in String::from_utf8_lossy(&text).lines() {
            // <id> <ip:port@cport[,hostname]> <flags> ...
            let Some(addr) = line.split_whitespace().nth(1) else {
                continue;
            };
            let addr = addr.split(['@', ',']).next().unwrap_or("");
            if let Some((h, p)) = addr.rsplit_once(':') {
                if let (false, Ok(p)) = (h.is_empty(), p.parse::<u16>()) {
                    let n = (h.trim_matches(['[', ']']).to_string(), p);
                    if !t.all.contains(&n) {
                        t.all.push(n);
                    }
                }
            }
        }
    }
    Ok(t)
}

impl Store for RedisStore {
    fn store_counters(&self) -> Vec<(&'static str, u64)> {
        self.counters().iter().collect()
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn round_trips(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let (host, port) = self
            .url
            .nodes
            .first()
            .map_or(("?", 0), |(h, p)| (h.as_str(), *p));
        if self.swap {
            format!("Redis Cluster swap space at {host}:{port}")
        } else {
            format!("Redis Cluster dataset {} at {host}:{port}", self.name)
        }
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn unit(&self) -> u64 {
        self.chunk // a write is whole chunks (`pieces`)
    }
    /// A dataset's version for its warm-start trace: a hash of the token
    /// of the upload (or create) that made it, kept in its metadata — a
    /// new upload of the name is other data. Swap space keeps no trace.
    fn trace_version(&self) -> Option<u64> {
        if self.swap {
            return None;
        }
        let v = self
            .command(redis::cmd("HGET").arg(meta_key(&self.name)).arg("owner"))
            .ok()?;
        let owner = texts(&v).into_iter().next()?;
        Some(upager::trace_version_of(&owner))
    }
    fn load_trace(&self) -> io::Result<Option<Vec<u8>>> {
        match self.command(redis::cmd("GET").arg(trace_key(&self.name)))? {
            Value::BulkString(b) => Ok(Some(b)),
            Value::Nil => Ok(None),
            v => Err(bad_reply("GET of the trace", &v)),
        }
    }
    fn save_trace(&self, trace: &[u8]) -> io::Result<()> {
        match self.command(redis::cmd("SET").arg(trace_key(&self.name)).arg(trace))? {
            Value::Okay | Value::SimpleString(_) => Ok(()),
            v => Err(bad_reply("SET of the trace", &v)),
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let (first, end, n) = self.span(offset, buf.len());
        if n == 0 {
            return Ok(0);
        }
        let idx: Vec<u64> = (first..end).collect();
        let vals = self.get(&idx);
        self.scatter(&mut buf[..n], offset, first, &mut vals.into_iter())?;
        Ok(n)
    }
    fn read_batch(&self, reads: &mut [ReadReq<'_>]) -> Vec<io::Result<usize>> {
        let spans: Vec<_> = reads
            .iter()
            .map(|r| self.span(r.offset, r.buf.len()))
            .collect();
        let idx: Vec<u64> = spans.iter().flat_map(|&(a, b, _)| a..b).collect();
        let mut vals = self.get(&idx).into_iter();
        reads
            .iter_mut()
            .zip(spans)
            .map(|(r, (first, end, n))| {
                let mut mine = vals
                    .by_ref()
                    .take((end - first) as usize)
                    .collect::<Vec<_>>()
                    .into_iter();
                self.scatter(&mut r.buf[..n], r.offset, first, &mut mine)?;
                Ok(n)
            })
            .collect()
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        let mut done = self.write_batch(&[Write { src, offset }]);
        done.results.pop().unwrap_or(Ok(()))
    }
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let bufs: Vec<Vec<u8>> = batch
            .iter()
            .map(|w| {
                let mut b = vec![0u8; w.src.len()];
                w.src.copy_to(&mut b);
                b
            })
            .collect();
        let before = self.counters.round_trips.load(Relaxed);
        let pieces = self.pieces(batch, &bufs);
        let mut ops = Vec::new();
        let mut owner = Vec::new();
        for (w, p) in pieces.iter().enumerate() {
            if let Ok(p) = p {
                for &(i, v) in p {
                    ops.push((i, Op::Set(v)));
                    owner.push(w);
                }
            }
        }
        if let Some(&(i, _)) = ops.iter().max_by_key(|x| x.0) {
            self.high.fetch_max(i + 1, Relaxed);
        }
        let done = self.run(&ops, true);
        let mut results: Vec<io::Result<()>> = pieces.into_iter().map(|p| p.map(|_| ())).collect();
        for (w, r) in owner.into_iter().zip(done) {
            if let (Err(e), Ok(())) = (r, &results[w]) {
                results[w] = Err(e);
            }
        }
        let trips = self.counters.round_trips.load(Relaxed) - before;
        Written::new(results, trips)
    }
    fn sync(&self) -> io::Result<()> {
        // Every write that returned Ok was acknowledged by `replicas`
        // replicas already (its WAIT travelled with it); this checks that
        // every master still has them in sync.
        self.wait_all()
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.swap {
            return Ok(()); // a dataset's chunks are its data
        }
        let first = offset / self.chunk;
        let end = (offset + len).div_ceil(self.chunk);
        let ops: Vec<(u64, Op<'_>)> = (first..end).map(|i| (i, Op::Del)).collect();
        for r in self.run(&ops, false) {
            r?;
        }
        Ok(())
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if self.swap && !self.deleted.load(Relaxed) {
            if let Err(e) = self.delete_keys() {
                log::warn!(
                    "could not delete the keys of swap space '{}' on {}: {e}",
                    self.name,
                    self.url.addresses()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_replicas_in_sync_count() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=7003,state=online,offset=42,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7004,state=wait_bgsave,offset=0,lag=0\r\n\
                    master_failover_state:no-failover\r\n";
        assert_eq!(online_replicas(info), 1);
        assert_eq!(online_replicas("role:master\r\nconnected_slaves:0\r\n"), 0);
    }

    #[test]
    fn slots_match_redis_cluster() {
        // CLUSTER KEYSLOT foo / bar / {user1000}.following
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"{}x"), crc16(b"{}x") % 16384);
    }

    #[test]
    fn consecutive_chunks_share_a_slot_and_runs_spread() {
        let s: Vec<u16> = (0..GROUP * 8)
            .map(|i| slot(chunk_key("d", i).as_bytes()))
            .collect();
        for g in s.chunks(GROUP as usize) {
            assert!(g.iter().all(|&x| x == g[0]));
        }
        let mut firsts: Vec<u16> = s.chunks(GROUP as usize).map(|g| g[0]).collect();
        firsts.dedup();
        assert!(firsts.len() > 4, "runs land on different slots: {firsts:?}");
        assert_eq!(chunk_key("d", 130), "upager:{d/2}:130");
        assert_eq!(meta_key("d"), "upager:{d}:meta");
    }

    #[test]
    fn upload_hash_shares_the_metadata_slot() {
        assert_eq!(
            slot(upload_key("d").as_bytes()),
            slot(meta_key("d").as_bytes())
        );
        assert_eq!(upload_key("d"), "upager:{d}:upload");
    }
}
