//! [`S3Dataset`]: a read-write dataset on an S3-compatible store, as an
//! [`upager::Store`], and what makes, lists and removes
//! one ([`create`], [`load`], [`list`], [`delete`]).
//!
//! A dataset is named by a prefix, `s3://BUCKET/NAME/` (the trailing `/`
//! tells it from an object). Its objects:
//!
//! ```text
//! NAME/manifest     "upager-dataset 2\nlen N\ngroup G\nupload ID\nxxh3 H\n":
//!                   written last, with If-None-Match: * (a dataset is visible
//!                   only once complete, and a second creator fails with
//!                   412); ID names the upload (0: made by `create`), H is
//!                   the xxh3-64 of the text before its line (a damaged
//!                   manifest is refused). Format 1 (no upload, no xxh3
//!                   line) is still read: its groups are not checked
//! NAME/g/0000000007 group 7: bytes [7G, 8G) of the dataset (the last one
//!                   shorter; G = 256 KiB unless chosen at creation); a group
//!                   that was never written reads as zeros. Its user metadata
//!                   x-amz-meta-upager-xxh3 = "B:" and the xxh3-64 of each
//!                   B-byte block in 16 hex digits (B = max(64 KiB, G / 64)),
//!                   written with every PUT of the group
//! NAME/upload       the claim of a running (or interrupted) upload, made with
//!                   If-None-Match: * before the first group, removed after the
//!                   manifest: two uploads of one name cannot mix their groups
//! ```
//!
//! Contract of the store:
//!
//! ```text
//! open        GET the manifest (no manifest: NoDataset, or Incomplete when an
//!             upload's claim or groups are there)
//! read_at     split at group ends and in parts of `part` bytes; ONE ranged GET
//!             per part, all in flight together; a group that does not exist
//!             reads as zeros
//! write_batch writes grouped by group; a group the batch covers whole is one PUT,
//!             another is read whole (GET), patched, and PUT (read-modify-write);
//!             every GET of one batch in flight together, then every PUT (a
//!             writable map's default folio is the group, `write_unit`: its
//!             write-backs cover whole groups, crate::default_folio)
//! versions    the store keeps each group's ETag as it last read or wrote it;
//!             a GET sends If-Match, a PUT If-Match (or If-None-Match: * for a
//!             group known not to exist): a group another writer changed is
//!             never mixed with this store's view nor overwritten: the read or
//!             write-back fails with a message (SIGBUS / the folio stays dirty
//!             and flush reports it)
//! sync        nothing: an acknowledged PUT is durable
//! checksums   every GET of a group of a format-2 dataset (and of swap space)
//!             covers whole checksum blocks and is checked against the
//!             metadata of the same answer; a mismatch (or no checksum, or
//!             a body not of the length asked for) is asked again once,
//!             then refused naming the object: the bytes are never served
//!             (store_checksum_errors counts such answers)
//! unsure PUT  a PUT whose outcome is unknown (reset, timeout, an error
//!             after the client's retries) or that got 412 leaves the group
//!             "unsure": the next request on it (or at once, after a 412)
//!             reads the group's ETag and checksums and takes the group as
//!             this store's when its checksums are those of the bytes the
//!             PUT sent (it was stored), or when its ETag is the one before
//!             (it was not); anything else is another writer's change
//! ```
//!
//! Lock order: one stripe lock per group (of [`STRIPES`], by group index),
//! taken in ascending stripe order by the calling thread for the whole call,
//! reads and writes alike: this process's own GET of a group never races
//! its own PUT of it (which would look like another writer's change).
//!
//! Counters ([`DatasetCounters`], `store_` prefix): `store_gets`,
//! `store_puts`, `store_bytes_received`, `store_bytes_sent`,
//! `store_rmw_groups` (groups read back for a partial write),
//! `store_conflicts` (412s: another writer's change refused),
//! `store_get_errors`, `store_put_errors`, `store_checksum_errors`
//! (GET answers whose bytes did not match their checksums).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    UpdateVersion,
};

use crate::config;
use crate::store::{self, OpenError, S3Options};
use crate::url::S3Url;

/// Default group: 256 KiB, 4 folios of [`crate::DEFAULT_FOLIO`] (64 KiB)
/// when read-only; a writable map's folio is the group
/// ([`crate::default_folio`]). Larger groups mean fewer objects and
/// requests for an upload and a pass; smaller ones less to read and write
/// per scattered write. Measured with bench/s3_dataset_bench.py (512 MiB,
/// 2,000 random float64 writes + flush under a 64 MiB budget, SeaweedFS on
/// loopback, medians of 3; docs/benchmarks.md): 256 KiB groups 3.73 s,
/// 64 KiB 2.63 s, 1 MiB 3.92 s; a load 1.8x and a pass 1.9x faster with
/// 256 KiB groups than with 64 KiB ones.
pub const DEFAULT_GROUP: u64 = 4 * crate::DEFAULT_FOLIO;

/// Smallest and largest group.
pub const GROUP_RANGE: Range<u64> = (64 << 10)..((64 << 20) + 1);

/// Stripe locks of a store (see the module doc).
const STRIPES: usize = 64;

const MANIFEST: &str = "manifest";
const CLAIM: &str = "upload";
/// The manifest's first line: format 2 (checksums), and format 1 (none).
const FORMAT: &str = "upager-dataset 2";
const FORMAT_1: &str = "upager-dataset 1";
/// A group's checksums: its user metadata `x-amz-meta-upager-xxh3`.
const SUMS_KEY: &str = "upager-xxh3";
/// Most checksum blocks of a group (64 x 16 hex digits: 1 KiB of metadata,
/// within S3's 2 KiB of user metadata).
const MAX_BLOCKS: u64 = 64;

/// The checksum block of a group of `group` bytes: 64 KiB (a read-only
/// map's folio), or more for groups past 4 MiB.
fn sum_block(group: u64) -> u64 {
    (group / MAX_BLOCKS).max(crate::DEFAULT_FOLIO)
}

fn xxh3(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// The checksums of a group's bytes `data`, in blocks of `block`, as its
/// metadata holds them.
fn sums_of(data: &[u8], block: u64) -> String {
    use std::fmt::Write as _;
    let mut s = format!("{block}:");
    for c in data.chunks(block as usize) {
        let _ = write!(s, "{:016x}", xxh3(c));
    }
    s
}

/// Checks `body`, the bytes from `at` (a multiple of `block`) of a group
/// of `glen` bytes, against the group's checksums `sums` (its metadata);
/// the error says which block differs.
fn verify_sums(
    sums: Option<&str>,
    block: u64,
    glen: u64,
    at: u64,
    body: &[u8],
) -> Result<(), String> {
    let Some(s) = sums else {
        return Err(format!(
            "it carries no checksum (x-amz-meta-{SUMS_KEY}): not written by this version of upager, or its metadata was lost"
        ));
    };
    let hex = match s.split_once(':') {
        Some((b, hex)) if b.parse::<u64>().ok() == Some(block) => hex,
        _ => {
            return Err(format!(
                "its checksum metadata is not of {block}-byte blocks: '{}'",
                s.chars().take(40).collect::<String>()
            ))
        }
    };
    if hex.len() as u64 != 16 * glen.div_ceil(block) || !at.is_multiple_of(block) {
        return Err(format!(
            "its checksum metadata holds {} digits, not 16 for each of its {} blocks",
            hex.len(),
            glen.div_ceil(block)
        ));
    }
    for (i, c) in body.chunks(block as usize).enumerate() {
        let k = (at / block) as usize + i;
        let want = hex
            .get(16 * k..16 * k + 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        let got = xxh3(c);
        if want != Some(got) {
            let from = k as u64 * block;
            return Err(format!(
                "checksum mismatch: bytes {from}-{} of the object have xxh3 {got:016x}, its metadata says {}",
                from + c.len() as u64,
                hex.get(16 * k..16 * k + 16).unwrap_or("?")
            ));
        }
    }
    Ok(())
}

/// Put options with a group's checksums as its metadata.
fn with_sums(mode: PutMode, sums: &str) -> PutOptions {
    PutOptions {
        mode,
        attributes: [(
            object_store::Attribute::Metadata(SUMS_KEY.into()),
            object_store::AttributeValue::from(sums.to_string()),
        )]
        .into_iter()
        .collect(),
        ..PutOptions::default()
    }
}

/// A GET answer's checksums (its metadata).
fn sums_in(attrs: &object_store::Attributes) -> Option<String> {
    attrs
        .get(&object_store::Attribute::Metadata(SUMS_KEY.into()))
        .map(|v| v.to_string())
}

/// Whether `url` names a dataset (its key ends in `/`).
pub fn is_dataset(url: &S3Url) -> bool {
    url.key.len() > 1 && url.key.ends_with('/')
}

/// A dataset's size and group, as its manifest holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    /// Bytes.
    pub len: u64,
    /// Bytes per group object.
    pub group: u64,
    /// Whether its groups carry checksums every read checks (format 2;
    /// false: a format-1 dataset, read unchecked).
    pub checked: bool,
    /// The upload that made it (0: `create`, or format 1).
    pub upload: u64,
}

impl Manifest {
    /// A new dataset's (format 2).
    fn new(len: u64, group: u64, upload: u64) -> Manifest {
        Manifest {
            len,
            group,
            checked: true,
            upload,
        }
    }

    fn encode(&self) -> String {
        if !self.checked {
            return format!("{FORMAT_1}\nlen {}\ngroup {}\n", self.len, self.group);
        }
        let body = format!(
            "{FORMAT}\nlen {}\ngroup {}\nupload {}\n",
            self.len, self.group, self.upload
        );
        format!("{body}xxh3 {:016x}\n", xxh3(body.as_bytes()))
    }

    /// For the fuzz targets (fuzz/, docs/fuzzing.md) only: the manifest
    /// object's text for `self`.
    #[doc(hidden)]
    pub fn encode_for_fuzz(&self) -> String {
        self.encode()
    }

    /// For the fuzz targets only: a manifest object's text parsed (the
    /// error is the detail of [`DatasetError::Manifest`]).
    #[doc(hidden)]
    pub fn parse_for_fuzz(s: &str) -> Result<Manifest, String> {
        Manifest::parse(s)
    }

    fn parse(s: &str) -> Result<Manifest, String> {
        let checked = match s.lines().next() {
            Some(FORMAT) => true,
            Some(FORMAT_1) => false,
            _ => return Err(format!("does not start with '{FORMAT}' (or '{FORMAT_1}')")),
        };
        let mut text = s;
        if checked {
            // The last line: the xxh3 of the text before it.
            let at = s
                .rfind("\nxxh3 ")
                .ok_or("has no 'xxh3 H' line (its checksum)")?;
            let want = s[at + 6..].trim_end_matches('\n');
            let got = format!("{:016x}", xxh3(&s.as_bytes()[..at + 1]));
            if want != got {
                return Err(format!(
                    "its checksum does not match its text (xxh3 {got}, its line says '{}'): damaged",
                    want.chars().take(20).collect::<String>()
                ));
            }
            text = &s[..at + 1];
        }
        let (mut len, mut group, mut upload) = (None, None, 0);
        for l in text.lines().skip(1) {
            match l.split_once(' ') {
                Some(("len", v)) => len = v.trim().parse::<u64>().ok(),
                Some(("group", v)) => group = v.trim().parse::<u64>().ok(),
                Some(("upload", v)) if checked => upload = v.trim().parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
        match (len, group) {
            (Some(len), Some(group)) if group.is_power_of_two() && GROUP_RANGE.contains(&group) => {
                Ok(Manifest {
                    len,
                    group,
                    checked,
                    upload,
                })
            }
            _ => Err("needs 'len N' and 'group G' (a power of two, 64 KiB-64 MiB)".into()),
        }
    }
}

/// Something a dataset call could not do. URLs are quoted redacted.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum DatasetError {
    /// {0}
    Open(#[from] OpenError),
    /// {url}: not a dataset: a dataset is named by a prefix ending in '/' (s3://BUCKET/NAME/)
    NotDataset {
        /// The URL.
        url: String,
    },
    /// {url}: no such dataset (no {key}): make one with `upager load FILE {url}`
    NoDataset {
        /// The URL.
        url: String,
        /// The manifest's key.
        key: String,
    },
    /// {url}: anonymous memory swaps to a bucket or a prefix (s3://BUCKET/ or s3://BUCKET/PREFIX/), not to an object
    SwapUrl {
        /// The URL.
        url: String,
    },
    /// {url}: the dataset is incomplete (an upload is running or was interrupted): wait for it, or remove it with `upager delete {url}`
    Incomplete {
        /// The URL.
        url: String,
    },
    /// {url}: a dataset of that name exists: remove it first (`upager delete {url}`)
    Exists {
        /// The URL.
        url: String,
    },
    /// {url}: another upload of this dataset holds it (or one was interrupted): wait for it, or remove it with `upager delete {url}`
    Busy {
        /// The URL.
        url: String,
    },
    /// {url}: the manifest {key} is not upager's: {detail}
    Manifest {
        /// The URL.
        url: String,
        /// Its key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// {url}: group size {group} is not a power of two from 64 KiB to 64 MiB
    Group {
        /// The URL.
        url: String,
        /// The size asked for.
        group: u64,
    },
    /// cannot read {path}: {source} (the partial upload was removed)
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// {0}
    Source(#[from] upager::OpenRegularError),
    /// {url}: the upload was cancelled (what it wrote was removed)
    Cancelled {
        /// The URL.
        url: String,
    },
    /// {url}: {what} failed: {detail}
    Request {
        /// The URL.
        url: String,
        /// The request.
        what: String,
        /// Why.
        detail: String,
    },
    /// {url}: no answer within {secs} s ({what})
    Timeout {
        /// The URL.
        url: String,
        /// The request.
        what: String,
        /// The bound.
        secs: u64,
    },
}

impl upager::ErrorCode for DatasetError {
    fn errno(&self) -> i32 {
        match self {
            DatasetError::Open(e) => e.errno(),
            DatasetError::NoDataset { .. } => libc::ENOENT,
            DatasetError::Exists { .. } => libc::EEXIST,
            DatasetError::Busy { .. } | DatasetError::Incomplete { .. } => libc::EBUSY,
            DatasetError::NotDataset { .. }
            | DatasetError::SwapUrl { .. }
            | DatasetError::Source(upager::OpenRegularError::NotRegular { .. })
            | DatasetError::Group { .. } => libc::EINVAL,
            DatasetError::Cancelled { .. } => libc::ECANCELED,
            DatasetError::Timeout { .. } => libc::ETIMEDOUT,
            _ => libc::EIO,
        }
    }
}

/// Wire counters of one dataset store (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatasetCounters {
    /// GETs answered.
    pub gets: u64,
    /// PUTs acknowledged.
    pub puts: u64,
    /// Body bytes received.
    pub bytes_received: u64,
    /// Body bytes sent.
    pub bytes_sent: u64,
    /// Groups read back whole for a write that did not cover them.
    pub rmw_groups: u64,
    /// Requests refused because another writer changed a group.
    pub conflicts: u64,
    /// GETs that failed.
    pub get_errors: u64,
    /// PUTs that failed.
    pub put_errors: u64,
    /// GET answers whose bytes did not match their checksums (or carried
    /// none, or were not the length asked for), each asked again once,
    /// then refused.
    pub checksum_errors: u64,
}

impl DatasetCounters {
    /// The counters with their stable names.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("store_gets", self.gets),
            ("store_puts", self.puts),
            ("store_bytes_received", self.bytes_received),
            ("store_bytes_sent", self.bytes_sent),
            ("store_rmw_groups", self.rmw_groups),
            ("store_conflicts", self.conflicts),
            ("store_get_errors", self.get_errors),
            ("store_put_errors", self.put_errors),
            ("store_checksum_errors", self.checksum_errors),
        ]
        .into_iter()
    }
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    puts: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    rmw: AtomicU64,
    conflicts: AtomicU64,
    get_errors: AtomicU64,
    put_errors: AtomicU64,
    checksum_errors: AtomicU64,
}

/// What the store knows of a group's version.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Version {
    /// Not seen yet.
    Unknown,
    /// Known not to exist (reads as zeros).
    Absent,
    /// Its ETag.
    Tag(String),
    /// A PUT of it got no answer (or a 412): stored or not, the server
    /// knows. `prev` is the version the PUT was conditional on, `sums` the
    /// checksums of the bytes it sent.
    Unsure {
        /// The version before the PUT.
        prev: Box<Version>,
        /// The checksums of the bytes sent.
        sums: String,
    },
}

impl Version {
    /// Whether an answer with ETag `tag` and checksums `sums` is a version
    /// this store may take the group at: the one it knows, or for an
    /// unsure group the one before the PUT or the PUT's own.
    fn accepts(&self, tag: Option<&String>, sums: Option<&str>) -> bool {
        match self {
            Version::Unknown => true,
            Version::Absent => false,
            Version::Tag(want) => tag.is_none_or(|t| t == want),
            Version::Unsure { prev, sums: sent } => {
                sums == Some(sent.as_str())
                    || matches!(&**prev, Version::Tag(p) if Some(p) == tag)
                    || matches!(&**prev, Version::Unknown)
            }
        }
    }

    /// Whether a group at this version may be found missing (zeros).
    fn may_be_absent(&self) -> bool {
        match self {
            Version::Unknown | Version::Absent => true,
            Version::Tag(_) => false,
            Version::Unsure { prev, .. } => prev.may_be_absent(),
        }
    }
}

/// A client, its runtime and a dataset's prefix: what every call needs.
struct Conn {
    client: Arc<dyn ObjectStore>,
    url: S3Url,
    /// The key prefix, with its trailing '/'.
    prefix: String,
    /// The endpoint, for messages.
    endpoint: String,
    guard: std::time::Duration,
    /// The runtime the client's connections run on (both shared with the
    /// process's other opens of the bucket: client.rs).
    rt: Arc<crate::client::Rt>,
}

impl Conn {
    fn new(url: &S3Url, opts: &S3Options, env: &dyn config::Env) -> Result<Conn, DatasetError> {
        if !is_dataset(url) {
            return Err(DatasetError::NotDataset {
                url: url.to_string(),
            });
        }
        let res = config::resolve(url, env).map_err(OpenError::from)?;
        let (client, rt) = crate::client::connect(url, &res, opts, opts.threads)?;
        Ok(Conn {
            client,
            url: url.clone(),
            prefix: url.key.clone(),
            endpoint: store::endpoint_of(url, &res),
            guard: opts.timeout * 4 + opts.retry_for,
            rt,
        })
    }

    fn key(&self, name: &str) -> ObjPath {
        ObjPath::from(format!("{}{name}", self.prefix))
    }

    fn group_key(&self, g: u64) -> ObjPath {
        ObjPath::from(format!("{}g/{g:010}", self.prefix))
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// Runs `fut` bounded by the guard; a timeout or client error becomes
    /// a [`DatasetError`] naming `what`.
    fn run<T: Send>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = object_store::Result<T>> + Send,
    ) -> Result<T, DatasetError> {
        match store::run(self.rt(), self.guard, fut) {
            None => Err(DatasetError::Timeout {
                url: self.url.to_string(),
                what: what.to_string(),
                secs: self.guard.as_secs(),
            }),
            Some(Err(e)) => Err(match store::no_bucket(&self.url, &self.endpoint, &e) {
                Some(no) => no.into(),
                None => DatasetError::Request {
                    url: self.url.to_string(),
                    what: what.to_string(),
                    detail: store::error_chain(&e),
                },
            }),
            Some(Ok(v)) => Ok(v),
        }
    }

    /// The text of the small object `key`, or None if there is none.
    fn text(&self, key: &ObjPath) -> Result<Option<String>, DatasetError> {
        let got = self.run("GET", async {
            match self.client.get(key).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        Ok(got.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// The manifest, or None if there is none.
    fn manifest(&self) -> Result<Option<(Manifest, String)>, DatasetError> {
        let key = self.key(MANIFEST);
        let got = self.run("GET of the manifest", async {
            match self.client.get(&key).await {
                Ok(r) => {
                    let tag = r.meta.e_tag.clone().unwrap_or_default();
                    r.bytes().await.map(|b| Some((b, tag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        let Some((bytes, tag)) = got else {
            return Ok(None);
        };
        let m = std::str::from_utf8(&bytes)
            .map_err(|e| e.to_string())
            .and_then(Manifest::parse)
            .map_err(|detail| DatasetError::Manifest {
                url: self.url.to_string(),
                key: key.to_string(),
                detail,
            })?;
        Ok(Some((m, tag)))
    }

    /// Every key under the prefix.
    fn keys(&self) -> Result<Vec<ObjPath>, DatasetError> {
        let p = ObjPath::from(self.prefix.as_str());
        self.run("listing", async {
            let v: Vec<_> = self.client.list(Some(&p)).try_collect().await?;
            Ok(v.into_iter().map(|m| m.location).collect())
        })
    }

    /// Deletes `keys`, many in flight; a key already gone is no error.
    fn delete_keys(&self, keys: Vec<ObjPath>) -> Result<(), DatasetError> {
        let n = keys.len();
        self.run(&format!("DELETE of {n} objects"), async {
            stream::iter(keys)
                .map(|k| async move {
                    match self.client.delete(&k).await {
                        Err(object_store::Error::NotFound { .. }) => Ok(()),
                        r => r,
                    }
                })
                .buffer_unordered(16)
                .try_collect::<Vec<()>>()
                .await
                .map(drop)
        })
    }
}

/// One dataset as a store. See the module doc for the contract.
pub struct S3Dataset {
    conn: Conn,
    manifest: Manifest,
    writable: bool,
    part: u64,
    in_flight: usize,
    versions: Mutex<HashMap<u64, Version>>,
    stripes: Vec<Mutex<()>>,
    counters: Counters,
    changed_logged: AtomicBool,
    /// Whether every GET of a group is checked against its checksums (a
    /// format-2 dataset, swap space; off only for measurement).
    checked: AtomicBool,
    /// The checksum block.
    block: u64,
    /// Swap space of anonymous regions ([`S3Dataset::swap`]): one writer
    /// by construction (a unique name), so no versions and no manifest;
    /// its objects are removed when the store is dropped.
    swap: bool,
}

impl Drop for S3Dataset {
    fn drop(&mut self) {
        if self.swap {
            let removed = self.conn.keys().and_then(|k| self.conn.delete_keys(k));
            if let Err(e) = removed {
                log::warn!(
                    "could not remove the swap space {}: {e} (remove it with `upager delete {}`)",
                    self.conn.url,
                    self.conn.url
                );
            }
        }
    }
}

impl fmt::Debug for S3Dataset {
    /// The dataset; never a credential.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Dataset")
            .field("url", &self.conn.url.to_string())
            .field("endpoint", &self.conn.endpoint)
            .field("manifest", &self.manifest)
            .field("writable", &self.writable)
            .finish_non_exhaustive()
    }
}

/// Why one request of a store call failed.
enum ReqError {
    /// Another writer changed (or deleted) the group.
    Changed,
    Timeout,
    Client(object_store::Error),
    /// The answer's bytes do not match the group's checksums (or are not
    /// the length asked for).
    Corrupt(String),
}

impl S3Dataset {
    /// Opens the dataset `url` names (`s3://BUCKET/NAME/`), writable or
    /// not: one GET of its manifest. Settings from the process's
    /// environment and AWS profile, as [`crate::S3Store::open`].
    pub fn open(
        url: &S3Url,
        writable: bool,
        opts: &S3Options,
    ) -> Result<Arc<S3Dataset>, DatasetError> {
        Self::open_with(url, writable, opts, &config::ProcessEnv)
    }

    /// [`S3Dataset::open`] with the settings from `env`.
    pub fn open_with(
        url: &S3Url,
        writable: bool,
        opts: &S3Options,
        env: &dyn config::Env,
    ) -> Result<Arc<S3Dataset>, DatasetError> {
        let conn = Conn::new(url, opts, env)?;
        let manifest = match conn.manifest()? {
            Some((m, _)) => m,
            None => return Err(missing(&conn)?),
        };
        Ok(Self::with(conn, manifest, writable, false, opts))
    }

    fn with(
        conn: Conn,
        manifest: Manifest,
        writable: bool,
        swap: bool,
        opts: &S3Options,
    ) -> Arc<S3Dataset> {
        Arc::new(S3Dataset {
            conn,
            manifest,
            writable,
            part: opts.part,
            in_flight: opts.in_flight,
            versions: Mutex::new(HashMap::new()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            counters: Counters::default(),
            changed_logged: AtomicBool::new(false),
            checked: AtomicBool::new(manifest.checked || swap),
            block: sum_block(manifest.group),
            swap,
        })
    }

    /// Swap space for anonymous regions (far memory) under the prefix
    /// `url` names (`s3://BUCKET/PREFIX/`): a dataset of a unique name
    /// `PREFIX/swap-PID-TIME-N/` with no length limit and no manifest, in
    /// groups of `folio` (a region's slot is one object: a write-back is a
    /// PUT, never a read-modify-write), punched slots deleted, every
    /// object removed when the store is dropped. Settings from `env`.
    pub fn swap(
        url: &S3Url,
        folio: u64,
        opts: &S3Options,
        env: &dyn config::Env,
    ) -> Result<Arc<S3Dataset>, DatasetError> {
        check_group(url, folio)?;
        if !(url.key.is_empty() || is_dataset(url)) {
            return Err(DatasetError::SwapUrl {
                url: url.to_string(),
            });
        }
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let prefix = if is_dataset(url) {
            url.key.clone()
        } else {
            String::new()
        };
        let name = format!(
            "{prefix}swap-{}-{nanos:x}-{}/",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        );
        let url = url.with_key(&name);
        let conn = Conn::new(&url, opts, env)?;
        // The bucket must be there: one listing says (a missing one is a
        // clear error now, not a SIGBUS at the first eviction).
        conn.keys()?;
        let manifest = Manifest::new(u64::MAX, folio, 0);
        Ok(Self::with(conn, manifest, true, true, opts))
    }

    /// Size and group.
    pub fn manifest(&self) -> Manifest {
        self.manifest
    }

    /// The URL.
    pub fn url(&self) -> &S3Url {
        &self.conn.url
    }

    /// The counters so far.
    pub fn counters(&self) -> DatasetCounters {
        let c = &self.counters;
        DatasetCounters {
            gets: c.gets.load(Relaxed),
            puts: c.puts.load(Relaxed),
            bytes_received: c.received.load(Relaxed),
            bytes_sent: c.sent.load(Relaxed),
            rmw_groups: c.rmw.load(Relaxed),
            conflicts: c.conflicts.load(Relaxed),
            get_errors: c.get_errors.load(Relaxed),
            put_errors: c.put_errors.load(Relaxed),
            checksum_errors: c.checksum_errors.load(Relaxed),
        }
    }

    /// Whether reads check the groups' checksums (a format-2 dataset and
    /// swap space do; a format-1 dataset's groups carry none).
    pub fn checksums_checked(&self) -> bool {
        self.checked.load(Relaxed)
    }

    /// For measurement only (its cost: bench/results/2026-12-07-checksums):
    /// turns the check of reads off, or back on where the groups carry
    /// checksums. Writes carry checksums either way.
    #[doc(hidden)]
    pub fn set_checksums_checked_for_bench(&self, on: bool) {
        self.checked
            .store(on && (self.manifest.checked || self.swap), Relaxed);
    }

    fn group_len(&self, g: u64) -> u64 {
        let gs = self.manifest.group;
        gs.min(self.manifest.len - g * gs)
    }

    /// Locks the stripes of `groups` in ascending order (the lock order).
    fn lock(&self, groups: impl Iterator<Item = u64>) -> Vec<std::sync::MutexGuard<'_, ()>> {
        let mut s: Vec<usize> = groups.map(|g| g as usize % STRIPES).collect();
        s.sort_unstable();
        s.dedup();
        s.into_iter()
            .map(|i| self.stripes[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// What this store knows of group `g`'s version. Only a writable
    /// dataset keeps versions: a read-only one writes nothing back (and the
    /// table costs ~100 bytes per group seen), swap space has one writer.
    fn version(&self, g: u64) -> Version {
        if !self.writable || self.swap {
            return Version::Unknown;
        }
        let v = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        v.get(&g).cloned().unwrap_or(Version::Unknown)
    }

    fn set_version(&self, g: u64, ver: Version) {
        if !self.writable || self.swap {
            return;
        }
        let mut v = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        v.insert(g, ver);
    }

    /// GET of `range` inside group `g` at version `ver`: the bytes, and
    /// the group's version as read (Absent: it does not exist, zeros).
    /// Checked against the group's checksums (when the store checks): an
    /// answer that does not match is asked again once, then refused.
    async fn get(
        &self,
        g: u64,
        range: Range<u64>,
        ver: &Version,
    ) -> Result<(Option<bytes::Bytes>, Version), ReqError> {
        match self.get_once(g, range.clone(), ver).await {
            Err(ReqError::Corrupt(detail)) => {
                self.counters.checksum_errors.fetch_add(1, Relaxed);
                log::warn!(
                    "{}: group {g} (object {}): {detail}: asked again",
                    self.conn.url,
                    self.conn.group_key(g)
                );
                let again = self.get_once(g, range, ver).await;
                if let Err(ReqError::Corrupt(_)) = &again {
                    self.counters.checksum_errors.fetch_add(1, Relaxed);
                }
                again
            }
            r => r,
        }
    }

    async fn get_once(
        &self,
        g: u64,
        range: Range<u64>,
        ver: &Version,
    ) -> Result<(Option<bytes::Bytes>, Version), ReqError> {
        // A checked GET covers whole checksum blocks.
        let checked = self.checked.load(Relaxed);
        let glen = self.group_len(g);
        let b = self.block;
        let fetch = if checked {
            range.start / b * b..(range.end.div_ceil(b) * b).min(glen)
        } else {
            range.clone()
        };
        let opts = GetOptions {
            if_match: match ver {
                Version::Tag(t) => Some(t.clone()),
                _ => None,
            },
            range: Some(GetRange::Bounded(fetch.clone())),
            ..GetOptions::default()
        };
        let c = &self.counters;
        let r = match self
            .conn
            .client
            .get_opts(&self.conn.group_key(g), opts)
            .await
        {
            Ok(r) => r,
            // Never written: zeros, unless this store saw it (deleted since).
            Err(object_store::Error::NotFound { .. }) if ver.may_be_absent() => {
                return Ok((None, Version::Absent));
            }
            Err(
                object_store::Error::NotFound { .. } | object_store::Error::Precondition { .. },
            ) => {
                c.conflicts.fetch_add(1, Relaxed);
                return Err(ReqError::Changed);
            }
            Err(e) => {
                c.get_errors.fetch_add(1, Relaxed);
                return Err(ReqError::Client(e));
            }
        };
        let tag = r.meta.e_tag.clone();
        let sums = sums_in(&r.attributes);
        if !ver.accepts(tag.as_ref(), sums.as_deref()) {
            // Another writer's version (or a group made since it was seen
            // absent).
            c.conflicts.fetch_add(1, Relaxed);
            return Err(ReqError::Changed);
        }
        let body = r.bytes().await.map_err(|e| {
            c.get_errors.fetch_add(1, Relaxed);
            ReqError::Client(e)
        })?;
        c.gets.fetch_add(1, Relaxed);
        c.received.fetch_add(body.len() as u64, Relaxed);
        let body = if checked {
            let want = fetch.end - fetch.start;
            if body.len() as u64 != want {
                return Err(ReqError::Corrupt(format!(
                    "the GET of bytes {}-{} returned {} of its {want} bytes",
                    fetch.start,
                    fetch.end,
                    body.len()
                )));
            }
            verify_sums(sums.as_deref(), b, glen, fetch.start, &body).map_err(ReqError::Corrupt)?;
            body.slice((range.start - fetch.start) as usize..(range.end - fetch.start) as usize)
        } else {
            body
        };
        let seen = tag.map_or(Version::Unknown, Version::Tag);
        Ok((Some(body), seen))
    }

    /// What an unsure group's version is now (a HEAD: its ETag and
    /// checksums), and whether it is the bytes of this store's PUT.
    async fn probe(&self, g: u64, ver: &Version) -> Result<(Version, bool), ReqError> {
        let opts = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match self
            .conn
            .client
            .get_opts(&self.conn.group_key(g), opts)
            .await
        {
            Ok(r) => {
                let sums = sums_in(&r.attributes);
                let tag = r.meta.e_tag.clone();
                if !ver.accepts(tag.as_ref(), sums.as_deref()) {
                    self.counters.conflicts.fetch_add(1, Relaxed);
                    return Err(ReqError::Changed);
                }
                let ours = matches!(ver, Version::Unsure { sums: sent, .. } if sums.as_deref() == Some(sent.as_str()));
                Ok((tag.map_or(Version::Unknown, Version::Tag), ours))
            }
            Err(object_store::Error::NotFound { .. }) if ver.may_be_absent() => {
                Ok((Version::Absent, false))
            }
            Err(object_store::Error::NotFound { .. }) => {
                self.counters.conflicts.fetch_add(1, Relaxed);
                Err(ReqError::Changed)
            }
            Err(e) => Err(ReqError::Client(e)),
        }
    }

    /// The error the engine gets (and logs) for a failed request on
    /// group `g`.
    fn io_error(&self, e: ReqError, g: u64, what: &str) -> io::Error {
        let gs = self.manifest.group;
        let span = format!("bytes {}-{}", g * gs, g * gs + self.group_len(g));
        match e {
            ReqError::Changed => {
                let msg = format!(
                    "{}: group {g} ({span}) was changed by another writer since this process read or wrote it: the {what} was refused rather than mix or overwrite that writer's data (one writer per dataset at a time; map the dataset again to see the new data)",
                    self.conn.url
                );
                if !self.changed_logged.swap(true, Relaxed) {
                    log::error!("{msg}");
                }
                io::Error::other(msg)
            }
            ReqError::Timeout => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{}: no answer from {} within {} s for the {what} of group {g} ({span})",
                    self.conn.url,
                    self.conn.endpoint,
                    self.conn.guard.as_secs()
                ),
            ),
            ReqError::Client(e) => io::Error::other(format!(
                "{}: the {what} of group {g} ({span}) at {} failed after the client's retries: {}",
                self.conn.url,
                self.conn.endpoint,
                store::error_chain(&e)
            )),
            ReqError::Corrupt(detail) => {
                let msg = format!(
                    "{}: the {what} of group {g} ({span}) was refused after two tries: the object {} at {}: {detail}; its bytes were not served",
                    self.conn.url,
                    self.conn.group_key(g),
                    self.conn.endpoint
                );
                log::error!("{msg}");
                io::Error::new(io::ErrorKind::InvalidData, msg)
            }
        }
    }

    /// Reads `[offset, offset + buf.len())` (inside the dataset).
    fn read_range(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let gs = self.manifest.group;
        let first = offset / gs;
        let last = (offset + buf.len() as u64 - 1) / gs;
        let _locks = self.lock(first..=last);
        // The pieces: (group, range in the group, buffer).
        let mut pieces = Vec::new();
        let mut rest = buf;
        let mut at = offset;
        while !rest.is_empty() {
            let g = at / gs;
            let in_g = at - g * gs;
            let n = (gs - in_g).min(self.part).min(rest.len() as u64) as usize;
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
            pieces.push((g, in_g..in_g + n as u64, head, self.version(g)));
            rest = tail;
            at += n as u64;
        }
        let futs: Vec<_> = pieces
            .iter()
            .map(|(g, r, _, v)| self.get(*g, r.clone(), v))
            .collect();
        let all = async {
            stream::iter(futs)
                .buffered(self.in_flight)
                .collect::<Vec<_>>()
                .await
        };
        let Some(results) = store::run(self.conn.rt(), self.conn.guard, all) else {
            return Err(self.io_error(ReqError::Timeout, first, "read"));
        };
        for ((g, _, dst, ver), res) in pieces.into_iter().zip(results) {
            let (body, seen) = res.map_err(|e| self.io_error(e, g, "read"))?;
            match body {
                Some(b) if b.len() == dst.len() => dst.copy_from_slice(&b),
                Some(b) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "{}: a GET of group {g} returned {} of {} bytes",
                            self.conn.url,
                            b.len(),
                            dst.len()
                        ),
                    ))
                }
                None => dst.fill(0),
            }
            if matches!(ver, Version::Unknown | Version::Unsure { .. }) {
                // The first piece read of a group sets its version; another
                // piece of it read at another version is a change.
                match self.version(g) {
                    Version::Unknown | Version::Unsure { .. } => self.set_version(g, seen),
                    cur if cur != seen => return Err(self.io_error(ReqError::Changed, g, "read")),
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// A group's new bytes for a write-back: its base (`None`: the group does
/// not exist, or the batch covers it whole: zeros), `glen` bytes, with
/// `writes` (offset in the group, bytes) laid over it. A base that is not
/// `glen` bytes (a short or long GET body) is refused, as a read refuses
/// one: laid over zeros, the write-back would overwrite the group's other
/// bytes with zeros (found by fuzz/fuzz_targets/s3_group.rs).
fn patch_group<'a>(
    base: Option<&[u8]>,
    glen: usize,
    writes: impl IntoIterator<Item = (usize, &'a [u8])>,
) -> Result<Vec<u8>, String> {
    let mut data = match base {
        Some(b) if b.len() == glen => b.to_vec(),
        Some(b) => {
            return Err(format!(
                "the GET of the group for a write-back returned {} of its {glen} bytes",
                b.len()
            ))
        }
        None => vec![0u8; glen],
    };
    for (at, src) in writes {
        data[at..at + src.len()].copy_from_slice(src);
    }
    Ok(data)
}

/// For the fuzz targets (fuzz/, docs/fuzzing.md) only: [`patch_group`].
#[doc(hidden)]
pub fn patch_group_for_fuzz(
    base: Option<&[u8]>,
    glen: usize,
    writes: &[(usize, &[u8])],
) -> Result<Vec<u8>, String> {
    patch_group(base, glen, writes.iter().copied())
}

/// The error for a prefix with no manifest: an incomplete dataset, or none.
fn missing(conn: &Conn) -> Result<DatasetError, DatasetError> {
    let url = conn.url.to_string();
    Ok(if conn.keys()?.is_empty() {
        DatasetError::NoDataset {
            url,
            key: conn.key(MANIFEST).to_string(),
        }
    } else {
        DatasetError::Incomplete { url }
    })
}

impl upager::Store for S3Dataset {
    fn store_counters(&self) -> Vec<(&'static str, u64)> {
        self.counters().iter().collect()
    }
    fn len(&self) -> u64 {
        self.manifest.len
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let len = self.manifest.len;
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        self.read_range(&mut buf[..n], offset)?;
        Ok(n)
    }

    fn write_from(&self, src: upager::Src<'_>, offset: u64) -> io::Result<()> {
        let w = [upager::Write { src, offset }];
        self.write_batch(&w).results.pop().expect("one result")
    }

    fn write_batch(&self, batch: &[upager::Write<'_>]) -> upager::Written {
        let gs = self.manifest.group;
        let len = self.manifest.len;
        if !self.writable {
            let results = batch
                .iter()
                .map(|w| {
                    Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "{}: opened read-only: the write at byte {} was refused",
                            self.conn.url, w.offset
                        ),
                    ))
                })
                .collect();
            return upager::Written::new(results, 0);
        }
        // Writes by group: (index of the write, its slice of the group).
        // A write that crosses a group end is split.
        let mut by_group: BTreeMap<u64, Vec<(usize, Range<u64>, usize)>> = BTreeMap::new();
        let mut early: Vec<Option<io::Error>> = (0..batch.len()).map(|_| None).collect();
        for (i, w) in batch.iter().enumerate() {
            let end = w.offset + w.src.len() as u64;
            if end > len {
                early[i] = Some(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: a write at byte {} passes the dataset's end ({len})",
                        self.conn.url, w.offset
                    ),
                ));
                continue;
            }
            let mut at = w.offset;
            while at < end {
                let g = at / gs;
                let n = (gs * (g + 1)).min(end) - at;
                by_group.entry(g).or_default().push((
                    i,
                    at - g * gs..at - g * gs + n,
                    (at - w.offset) as usize,
                ));
                at += n;
            }
        }
        let _locks = self.lock(by_group.keys().copied());
        // Step 1: every group's base, all GETs in flight together: a group
        // the batch covers whole needs only its version (known, or a HEAD).
        let plans: Vec<(u64, bool, Version)> = by_group
            .iter()
            .map(|(&g, ws)| {
                let covered: u64 = ws.iter().map(|(_, r, _)| r.end - r.start).sum();
                (g, covered == self.group_len(g), self.version(g))
            })
            .collect();
        let bases = plans.iter().map(|(g, whole, ver)| async move {
            let glen = self.group_len(*g);
            if *whole {
                // Swap space has one writer: no HEAD, an unconditional PUT.
                if let Version::Unsure { .. } = ver {
                    // Whether the last PUT was stored: the group's version now.
                    return self.probe(*g, ver).await.map(|(v, _)| (None, v));
                }
                if self.swap || *ver != Version::Unknown {
                    return Ok((None, ver.clone()));
                }
                return match self.conn.client.head(&self.conn.group_key(*g)).await {
                    Ok(m) => Ok((None, m.e_tag.map_or(Version::Unknown, Version::Tag))),
                    Err(object_store::Error::NotFound { .. }) => Ok((None, Version::Absent)),
                    Err(e) => Err(ReqError::Client(e)),
                };
            }
            self.counters.rmw.fetch_add(1, Relaxed);
            self.get(*g, 0..glen, ver).await
        });
        // Collected first: a closure inside the stream's type trips the
        // Send check (as in store.rs).
        let bases: Vec<_> = bases.collect();
        let all = async {
            stream::iter(bases)
                .buffered(self.in_flight)
                .collect::<Vec<_>>()
                .await
        };
        let bases = store::run(self.conn.rt(), self.conn.guard, all);
        // Step 2 (this thread): each group's new bytes, from one copy of
        // each write.
        let srcs: Vec<Vec<u8>> = batch
            .iter()
            .map(|w| {
                let mut b = vec![0u8; w.src.len()];
                w.src.copy_to(&mut b);
                b
            })
            .collect();
        let mut group_err: HashMap<u64, io::Error> = HashMap::new();
        let mut puts = Vec::new();
        match bases {
            None => {
                for (g, _, _) in &plans {
                    group_err.insert(*g, self.io_error(ReqError::Timeout, *g, "write-back"));
                }
            }
            Some(bases) => {
                for ((g, _, _), base) in plans.iter().zip(bases) {
                    match base {
                        Err(e) => {
                            group_err.insert(*g, self.io_error(e, *g, "write-back"));
                        }
                        Ok((body, seen)) => {
                            let glen = self.group_len(*g) as usize;
                            let writes = by_group[g].iter().map(|(i, r, from)| {
                                let n = (r.end - r.start) as usize;
                                (r.start as usize, &srcs[*i][*from..*from + n])
                            });
                            match patch_group(body.as_deref(), glen, writes) {
                                Ok(data) => puts.push((*g, data, seen)),
                                Err(detail) => {
                                    group_err.insert(
                                        *g,
                                        io::Error::new(
                                            io::ErrorKind::UnexpectedEof,
                                            format!("{}: group {g}: {detail}", self.conn.url),
                                        ),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        // Step 3: every PUT in flight together, each conditional on the
        // version its base was.
        let sent: u64 = puts.iter().map(|(_, d, _)| d.len() as u64).sum();
        // Each PUT's version before it and the checksums of its bytes: what
        // an unsure group is resolved by.
        let mut before: HashMap<u64, (Version, String)> = HashMap::new();
        let puts: Vec<_> = puts
            .into_iter()
            .map(|(g, data, seen)| {
                let sums = sums_of(&data, self.block);
                before.insert(g, (seen.clone(), sums.clone()));
                (g, data, seen, sums)
            })
            .collect();
        let futs = puts.into_iter().map(|(g, data, seen, sums)| async move {
            let mode = match &seen {
                Version::Tag(t) => PutMode::Update(UpdateVersion {
                    e_tag: Some(t.clone()),
                    version: None,
                }),
                Version::Absent => PutMode::Create,
                // A base is never unsure (step 1 resolves it).
                Version::Unknown | Version::Unsure { .. } => PutMode::Overwrite,
            };
            let r = self
                .conn
                .client
                .put_opts(
                    &self.conn.group_key(g),
                    PutPayload::from(data),
                    with_sums(mode, &sums),
                )
                .await;
            (g, r)
        });
        let futs: Vec<_> = futs.collect();
        let all = async {
            stream::iter(futs)
                .buffer_unordered(self.in_flight)
                .collect::<Vec<_>>()
                .await
        };
        // A PUT whose outcome is unknown leaves its group unsure.
        let unsure = |g: u64| {
            if let Some((prev, sums)) = before.get(&g) {
                self.set_version(
                    g,
                    Version::Unsure {
                        prev: Box::new(prev.clone()),
                        sums: sums.clone(),
                    },
                );
            }
        };
        let mut refused = Vec::new();
        match store::run(self.conn.rt(), self.conn.guard, all) {
            None => {
                for g in before.keys() {
                    unsure(*g);
                }
                for g in by_group.keys() {
                    group_err
                        .entry(*g)
                        .or_insert_with(|| self.io_error(ReqError::Timeout, *g, "write-back"));
                }
            }
            Some(done) => {
                let c = &self.counters;
                c.sent.fetch_add(sent, Relaxed);
                for (g, r) in done {
                    match r {
                        Ok(p) => {
                            c.puts.fetch_add(1, Relaxed);
                            self.set_version(g, p.e_tag.map_or(Version::Unknown, Version::Tag));
                        }
                        Err(
                            object_store::Error::Precondition { .. }
                            | object_store::Error::AlreadyExists { .. },
                        ) => {
                            // Another writer's change, or this store's own
                            // PUT stored by an earlier try: asked below.
                            unsure(g);
                            refused.push(g);
                        }
                        Err(e) => {
                            c.put_errors.fetch_add(1, Relaxed);
                            unsure(g);
                            group_err
                                .insert(g, self.io_error(ReqError::Client(e), g, "write-back"));
                        }
                    }
                }
            }
        }
        // A 412: the group as it is now (one HEAD each, in flight together);
        // its checksums those of the bytes sent: this PUT was stored.
        if !refused.is_empty() {
            let vers: Vec<Version> = refused.iter().map(|g| self.version(*g)).collect();
            let probes: Vec<_> = refused
                .iter()
                .zip(&vers)
                .map(|(g, v)| self.probe(*g, v))
                .collect();
            let all = async {
                stream::iter(probes)
                    .buffered(self.in_flight)
                    .collect::<Vec<_>>()
                    .await
            };
            let found = match store::run(self.conn.rt(), self.conn.guard, all) {
                Some(f) => f,
                None => refused.iter().map(|_| Err(ReqError::Timeout)).collect(),
            };
            for (g, f) in refused.into_iter().zip(found) {
                let e = match f {
                    Ok((v, true)) => {
                        self.counters.puts.fetch_add(1, Relaxed);
                        self.set_version(g, v);
                        continue;
                    }
                    // Not this store's bytes, yet the version before: the
                    // next write-back asks again.
                    Ok((_, false)) => {
                        self.counters.conflicts.fetch_add(1, Relaxed);
                        ReqError::Changed
                    }
                    Err(e) => e,
                };
                group_err.insert(g, self.io_error(e, g, "write-back"));
            }
        }
        // One result per write: its first group's error, if any.
        let mut results: Vec<io::Result<()>> = early
            .into_iter()
            .map(|e| match e {
                Some(e) => Err(e),
                None => Ok(()),
            })
            .collect();
        for (g, ws) in &by_group {
            if let Some(e) = group_err.get(g) {
                for (i, _, _) in ws {
                    if results[*i].is_ok() {
                        results[*i] = Err(io::Error::new(e.kind(), e.to_string()));
                    }
                }
            }
        }
        let submissions = by_group.len() as u64;
        upager::Written::new(results, submissions)
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.swap {
            return Ok(()); // a dataset's groups are its data
        }
        let gs = self.manifest.group;
        let keys: Vec<ObjPath> = (offset.div_ceil(gs)..(offset + len) / gs)
            .map(|g| self.conn.group_key(g))
            .collect();
        let _locks = self.lock(offset.div_ceil(gs)..(offset + len) / gs);
        self.conn
            .delete_keys(keys)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn round_trips(&self) -> bool {
        true
    }

    /// A group: a write-back of less reads the group back first.
    fn write_unit(&self) -> u64 {
        self.manifest.group
    }

    fn describe(&self) -> String {
        if self.swap {
            return format!("S3 swap space {} at {}", self.conn.url, self.conn.endpoint);
        }
        format!(
            "S3 dataset {} at {} ({} bytes in groups of {})",
            self.conn.url, self.conn.endpoint, self.manifest.len, self.manifest.group
        )
    }
}

fn check_group(url: &S3Url, group: u64) -> Result<(), DatasetError> {
    if group.is_power_of_two() && GROUP_RANGE.contains(&group) {
        Ok(())
    } else {
        Err(DatasetError::Group {
            url: url.to_string(),
            group,
        })
    }
}

/// Makes an empty dataset of `len` bytes (it reads as zeros): one PUT of
/// its manifest with If-None-Match: * ([`DatasetError::Exists`] if there
/// is one; [`DatasetError::Incomplete`] if objects of an unfinished upload
/// or delete are under the prefix: `delete` removes them). Settings from
/// `env` ([`config::ProcessEnv`]: the process's environment and profile).
pub fn create(
    url: &S3Url,
    len: u64,
    group: u64,
    opts: &S3Options,
    env: &dyn config::Env,
) -> Result<(), DatasetError> {
    check_group(url, group)?;
    let conn = Conn::new(url, opts, env)?;
    // Objects under the prefix but no manifest: an upload or a delete that
    // did not finish; its groups would show through the new dataset.
    let keys = conn.keys()?;
    if !keys.is_empty() && !keys.contains(&conn.key(MANIFEST)) {
        return Err(DatasetError::Incomplete {
            url: url.to_string(),
        });
    }
    put_manifest(&conn, Manifest::new(len, group, 0))
}

fn put_manifest(conn: &Conn, m: Manifest) -> Result<(), DatasetError> {
    let key = conn.key(MANIFEST);
    let put = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    let payload = PutPayload::from(m.encode().into_bytes());
    match store::run(
        conn.rt(),
        conn.guard,
        conn.client.put_opts(&key, payload, put),
    ) {
        Some(Err(object_store::Error::AlreadyExists { .. })) => Err(DatasetError::Exists {
            url: conn.url.to_string(),
        }),
        None => Err(DatasetError::Timeout {
            url: conn.url.to_string(),
            what: "PUT of the manifest".into(),
            secs: conn.guard.as_secs(),
        }),
        Some(Err(e)) => Err(DatasetError::Request {
            url: conn.url.to_string(),
            what: "PUT of the manifest".into(),
            detail: store::error_chain(&e),
        }),
        Some(Ok(_)) => Ok(()),
    }
}

/// Uploads the file at `path` as the dataset `url`, in groups of `group`
/// bytes (groups of zeros are not stored), many PUTs in flight, then its
/// manifest. The name is claimed first ([`DatasetError::Busy`] if another
/// upload holds it, [`DatasetError::Exists`] if a dataset is there); on an
/// error, or when `cancel` is set, what was written is removed; objects
/// an interrupted delete left under the prefix are removed first.
/// `progress` gets (bytes done, bytes in all) after each step. Settings
/// from `env` ([`config::ProcessEnv`] for the process's).
pub fn load(
    url: &S3Url,
    path: &Path,
    group: u64,
    opts: &S3Options,
    env: &dyn config::Env,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Manifest, DatasetError> {
    check_group(url, group)?;
    let (mut file, len) = upager::open_regular_file(path)?;
    let conn = Conn::new(url, opts, env)?;
    let claim = conn.key(CLAIM);
    let put = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    // The upload's id, in its claim and its manifest: a claim or manifest
    // whose PUT got no answer is known for this upload's by it.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let upload = (nanos ^ (u64::from(std::process::id()) << 40)) | 1;
    let claim_text = format!(
        "upload {upload} of {len} bytes from pid {}\n",
        std::process::id()
    );
    let payload = PutPayload::from(claim_text.clone().into_bytes());
    let put = store::run(
        conn.rt(),
        conn.guard,
        conn.client.put_opts(&claim, payload, put),
    );
    // No answer, or 412 after a try the client repeated: the claim may be
    // this upload's all the same.
    let ours = match &put {
        Some(Ok(_)) => true,
        _ => conn.text(&claim).ok().flatten().as_deref() == Some(claim_text.as_str()),
    };
    match put {
        _ if ours => {}
        Some(Ok(_)) => {}
        Some(Err(object_store::Error::AlreadyExists { .. })) => {
            return Err(if conn.manifest()?.is_some() {
                DatasetError::Exists {
                    url: url.to_string(),
                }
            } else {
                DatasetError::Busy {
                    url: url.to_string(),
                }
            })
        }
        Some(Err(e)) => {
            return Err(DatasetError::Request {
                url: url.to_string(),
                what: "PUT of the upload claim".into(),
                detail: store::error_chain(&e),
            })
        }
        None => {
            return Err(DatasetError::Timeout {
                url: url.to_string(),
                what: "PUT of the upload claim".into(),
                secs: conn.guard.as_secs(),
            })
        }
    }
    if conn.manifest()?.is_some() {
        let _ = conn.delete_keys(vec![claim]);
        return Err(DatasetError::Exists {
            url: url.to_string(),
        });
    }
    // A new upload starts clean: groups of zeros are not stored, so a
    // group left by an interrupted delete would show through.
    let stale: Vec<ObjPath> = conn.keys()?.into_iter().filter(|k| *k != claim).collect();
    conn.delete_keys(stale)?;
    let m = Manifest::new(len, group, upload);
    let block = sum_block(group);
    let mut manifest_sent = false;
    let res = (|| {
        use std::io::Read;
        let groups = len.div_ceil(group);
        let step = opts.in_flight.max(1) as u64;
        let mut g = 0;
        while g < groups {
            if cancel.load(Relaxed) {
                return Err(DatasetError::Cancelled {
                    url: url.to_string(),
                });
            }
            let mut batch = Vec::new();
            for k in g..(g + step).min(groups) {
                let n = group.min(len - k * group) as usize;
                let mut buf = vec![0u8; n];
                file.read_exact(&mut buf)
                    .map_err(|source| DatasetError::Read {
                        path: path.to_path_buf(),
                        source,
                    })?;
                if buf.iter().any(|&b| b != 0) {
                    let sums = sums_of(&buf, block);
                    batch.push((conn.group_key(k), buf, sums));
                }
            }
            conn.run("PUT of a group", async {
                stream::iter(batch)
                    .map(|(k, b, sums)| {
                        let c = &conn.client;
                        async move {
                            c.put_opts(
                                &k,
                                PutPayload::from(b),
                                with_sums(PutMode::Overwrite, &sums),
                            )
                            .await
                            .map(drop)
                        }
                    })
                    .buffer_unordered(opts.in_flight.max(1))
                    .try_collect::<Vec<()>>()
                    .await
                    .map(drop)
            })?;
            g = (g + step).min(groups);
            progress((g * group).min(len), len);
        }
        manifest_sent = true;
        put_manifest(&conn, m)
    })();
    match res {
        Ok(()) => {
            let _ = conn.delete_keys(vec![claim]);
            Ok(m)
        }
        Err(e) => {
            // The manifest's PUT may have been stored though it failed (its
            // answer lost): every group is there then, so the upload is
            // complete. If it may be there but cannot be told, it is
            // removed first, and the groups only once it is gone: a reader
            // never opens a dataset whose groups were removed.
            let mut remove_groups = true;
            if manifest_sent && !matches!(e, DatasetError::Exists { .. }) {
                match conn.manifest() {
                    Ok(Some((stored, _))) if stored == m => {
                        log::warn!("{url}: the manifest's PUT failed ({e}), but it was stored: the upload is complete");
                        let _ = conn.delete_keys(vec![claim]);
                        return Ok(m);
                    }
                    Ok(None) => {}
                    // Another's (cannot be, with the claim held): untouched.
                    Ok(Some(_)) => remove_groups = false,
                    Err(_) => {
                        remove_groups = conn.delete_keys(vec![conn.key(MANIFEST)]).is_ok();
                    }
                }
            }
            // Remove the groups, then the claim.
            if remove_groups {
                if let Ok(mut keys) = conn.keys() {
                    keys.retain(|k| *k != claim && *k != conn.key(MANIFEST));
                    let _ = conn.delete_keys(keys);
                }
            }
            let _ = conn.delete_keys(vec![claim]);
            Err(e)
        }
    }
}

/// Removes the dataset `url`: its manifest first (it disappears at once),
/// then its groups and any upload claim. An incomplete dataset is removed
/// the same way; no dataset at all is [`DatasetError::NoDataset`].
pub fn delete(url: &S3Url, opts: &S3Options, env: &dyn config::Env) -> Result<u64, DatasetError> {
    let conn = Conn::new(url, opts, env)?;
    let manifest = conn.key(MANIFEST);
    let mut keys = conn.keys()?;
    if keys.is_empty() {
        return Err(DatasetError::NoDataset {
            url: url.to_string(),
            key: manifest.to_string(),
        });
    }
    if keys.contains(&manifest) {
        conn.delete_keys(vec![manifest.clone()])?;
        keys.retain(|k| *k != manifest);
    }
    let n = keys.len() as u64;
    conn.delete_keys(keys)?;
    Ok(n)
}

/// A dataset found by [`list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetInfo {
    /// Its URL's key (the prefix, ending in '/').
    pub name: String,
    /// Its size, None while incomplete.
    pub len: Option<u64>,
}

/// The datasets of the bucket of `url` under its key (a prefix; "" for
/// all), complete or not.
pub fn list(
    url: &S3Url,
    opts: &S3Options,
    env: &dyn config::Env,
) -> Result<Vec<DatasetInfo>, DatasetError> {
    let probe = url.with_key(&format!("{}x/", url.key));
    let conn = Conn::new(&probe, opts, env)?;
    let prefix = (!url.key.is_empty()).then(|| ObjPath::from(url.key.as_str()));
    let metas: Vec<object_store::ObjectMeta> = conn.run("listing", async {
        conn.client.list(prefix.as_ref()).try_collect().await
    })?;
    let mut found: BTreeMap<String, bool> = BTreeMap::new();
    for m in &metas {
        let k = m.location.to_string();
        if let Some(name) = k.strip_suffix(&format!("/{MANIFEST}")) {
            found.insert(format!("{name}/"), true);
        } else if let Some(name) = k.strip_suffix(&format!("/{CLAIM}")) {
            found.entry(format!("{name}/")).or_insert(false);
        } else if let Some((name, _)) = k.rsplit_once("/g/") {
            // Groups with neither: a delete that did not finish.
            found.entry(format!("{name}/")).or_insert(false);
        }
    }
    let mut out = Vec::new();
    for (name, complete) in found {
        let len = if complete {
            let c = Conn::new(&url.with_key(&name), opts, env)?;
            c.manifest()?.map(|(m, _)| m.len)
        } else {
            None
        };
        out.push(DatasetInfo { name, len });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_and_a_foreign_one_is_refused() {
        let m = Manifest::new(12345, 1 << 20, 77);
        assert_eq!(Manifest::parse(&m.encode()), Ok(m));
        assert!(Manifest::parse("{\"len\": 3}").is_err());
        let sealed = |body: String| format!("{body}xxh3 {:016x}\n", xxh3(body.as_bytes()));
        assert!(Manifest::parse(&sealed(format!("{FORMAT}\nlen 3\ngroup 1000\n"))).is_err());
        assert!(Manifest::parse(&sealed(format!("{FORMAT}\nlen 3\n"))).is_err());
        assert!(Manifest::parse(&sealed(format!("{FORMAT}\nlen 3\ngroup 65536\n"))).is_ok());
    }

    #[test]
    fn a_damaged_manifest_is_refused_and_a_format_1_one_is_read_unchecked() {
        let text = Manifest::new(1 << 30, 1 << 18, 5).encode();
        // One bit flipped anywhere: refused (the length is not misread).
        for i in 0..text.len() {
            let mut b = text.clone().into_bytes();
            b[i] ^= 1;
            let Ok(t) = String::from_utf8(b) else {
                continue;
            };
            assert!(Manifest::parse(&t).is_err(), "byte {i}: {t:?}");
        }
        // No checksum line: refused.
        let cut = &text[..text.rfind("xxh3").unwrap()];
        assert!(Manifest::parse(cut).unwrap_err().contains("xxh3"));
        // Format 1 (before checksums): read, its groups not checked.
        let old = Manifest::parse(&format!("{FORMAT_1}\nlen 3\ngroup 65536\n")).unwrap();
        assert!(!old.checked);
        assert_eq!(Manifest::parse(&old.encode()), Ok(old));
    }

    #[test]
    fn group_checksums_find_a_flipped_bit_and_name_its_block() {
        let glen = 200_000u64; // 3 blocks of 64 KiB and a short one
        let block = sum_block(256 << 10);
        assert_eq!(block, 64 << 10);
        let data: Vec<u8> = (0..glen).map(|i| (i * 7 % 251) as u8).collect();
        let sums = sums_of(&data, block);
        assert_eq!(sums.len(), "65536:".len() + 16 * 4);
        assert_eq!(verify_sums(Some(&sums), block, glen, 0, &data), Ok(()));
        // A block-aligned range, the last block short.
        let tail = &data[(2 * block) as usize..];
        assert_eq!(
            verify_sums(Some(&sums), block, glen, 2 * block, tail),
            Ok(())
        );
        let mut bad = data.clone();
        bad[150_000] ^= 0x10;
        let e = verify_sums(Some(&sums), block, glen, 0, &bad).unwrap_err();
        assert!(e.contains("bytes 131072-196608"), "{e}");
        assert!(verify_sums(None, block, glen, 0, &data)
            .unwrap_err()
            .contains("no checksum"));
        assert!(verify_sums(Some("4096:00"), block, glen, 0, &data).is_err());
        // The largest group: 64 blocks of 1 MiB, 1 KiB of metadata.
        assert_eq!(sum_block(64 << 20), 1 << 20);
        assert!(sums_of(&vec![0u8; 64 << 20], 1 << 20).len() < 1100);
    }

    #[test]
    fn an_unsure_group_is_taken_at_its_old_version_or_at_the_bytes_sent() {
        let t = |s: &str| Some(s.to_string());
        let u = Version::Unsure {
            prev: Box::new(Version::Tag("old".into())),
            sums: "65536:ab".into(),
        };
        assert!(u.accepts(t("old").as_ref(), None), "not stored");
        assert!(u.accepts(t("new").as_ref(), Some("65536:ab")), "stored");
        assert!(
            !u.accepts(t("new").as_ref(), Some("65536:cd")),
            "another writer's"
        );
        assert!(!u.accepts(t("new").as_ref(), None));
        assert!(!u.may_be_absent());
        let created = Version::Unsure {
            prev: Box::new(Version::Absent),
            sums: "x".into(),
        };
        assert!(created.may_be_absent());
        assert!(!created.accepts(t("e").as_ref(), Some("y")));
    }

    #[test]
    fn a_write_back_refuses_a_group_body_of_the_wrong_length() {
        let w: &[u8] = b"new";
        // Exact body: patched; no group: zeros patched.
        assert_eq!(
            patch_group(Some(b"abcdef"), 6, [(1, w)]),
            Ok(b"anewef".to_vec())
        );
        assert_eq!(patch_group(None, 4, [(1, w)]), Ok(b"\0new".to_vec()));
        // A short or long body is refused, never zero-filled or cut (the
        // group's other bytes would be overwritten).
        for body in [&b"abc"[..], b"", b"abcdefg"] {
            let e = patch_group(Some(body), 6, [(1, w)]).unwrap_err();
            assert!(e.contains(&format!("{} of its 6 bytes", body.len())), "{e}");
        }
    }

    #[test]
    fn a_dataset_is_a_prefix() {
        let d: S3Url = "s3://bkt/models/w/".parse().unwrap();
        assert!(is_dataset(&d));
        let o: S3Url = "s3://bkt/models/w".parse().unwrap();
        assert!(!is_dataset(&o));
        let b: S3Url = "s3://bkt/".parse().unwrap();
        assert!(!is_dataset(&b));
    }
}
