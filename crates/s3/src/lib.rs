//! upager-s3: objects of S3-compatible stores paged under a budget.
//!
//! [`map`] opens an existing object by URL (`s3://BUCKET/KEY`, [`url`]) and
//! maps it read-only: a fault's run is one ranged GET, a readahead window
//! or a prefetch is many GETs in flight, and every GET carries the ETag
//! the object had when it was opened (`If-Match`), so an object replaced
//! under a running program gives a clear error (the access gets SIGBUS,
//! the reason logged), never a mix of two versions.
//!
//! ```no_run
//! use upager::{MapOptions, Pager};
//! use upager_s3::{S3Options, S3Url};
//! // Credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws.
//! let url: S3Url = "s3://data/weights.bin?endpoint=http://127.0.0.1:8333".parse()?;
//! let pager = Pager::new(256 << 20)?;
//! let w = upager_s3::map(&pager, &url, &MapOptions::new(), &S3Options::default())?;
//! let first = w.bytes()[0].load(std::sync::atomic::Ordering::Relaxed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why this client: Apache Arrow's `object_store` (used by DataFusion,
//! delta-rs, polars) signs requests, retries with backoff and speaks to
//! AWS, MinIO, Ceph RGW and SeaweedFS; built here for S3 only with ring
//! (the crypto the Redis store's TLS uses already), it adds ~130 crates
//! against ~175 for the AWS SDK (aws-sdk-s3 + aws-config, which also
//! builds aws-lc's C code). It does not read the AWS profile files:
//! [`config`] does. It is async: the store uses a small runtime (one per
//! bucket and settings in the process, shared with the client:
//! client.rs) and the engine's threads block on it (the [`store`]
//! module's contract).
//!
//! A prefix URL, `s3://BUCKET/NAME/`, names a read-write dataset instead
//! ([`dataset`]: group objects and a manifest written last, conditional
//! PUTs so two writers never silently lose each other's writes); [`map`]
//! maps it writable when the options ask.
//!
//! A local server for trying it: `scripts/seaweedfs.sh start`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod client;
pub mod config;
pub mod dataset;
mod options;
pub mod store;
pub mod url;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

pub use config::{ConfigError, Secret};
pub use dataset::{DatasetCounters, DatasetError, S3Dataset};
pub use store::{OpenError, S3Counters, S3Options, S3Store, GAP_DEFAULT};
pub use url::{S3Url, UrlError};

/// Default folio of a region of an object when its options set none: a
/// fault is a round trip to the server (~1 ms here against ~10 µs for a
/// file), so it fetches 64 KiB where a local file's default folio is 4 KiB.
pub const DEFAULT_FOLIO: u64 = 64 << 10;

/// Largest group a writable dataset's region takes as its default folio
/// ([`default_folio`]); a dataset of larger groups gets [`DEFAULT_FOLIO`]
/// (a fault of a scattered write would read the whole group).
pub const GROUP_FOLIO_MAX: u64 = 1 << 20;

/// The folio a region of `store` (an S3 object or dataset) gets when its
/// map sets none: [`DEFAULT_FOLIO`], or a writable dataset's group
/// ([`upager::Store::write_unit`]) when it is at most [`GROUP_FOLIO_MAX`]:
/// each write-back then covers whole groups, one PUT each, where a smaller
/// folio's write-back first reads its group back (a GET: read-modify-write).
/// Measured (docs/benchmarks.md, "S3 datasets: a writable map's folio is
/// its group"): 2,000 random writes + flush to 512 MiB under 64 MiB, the
/// default 256 KiB groups, 3.73 s with 256 KiB folios against 4.59 s with
/// 64 KiB ones (1 MiB groups: 3.92 s against 5.13 s). A read-only map
/// keeps 64 KiB (a random read fetches less, a fault alone is quicker).
pub fn default_folio(store: &dyn upager::Store) -> u64 {
    let folio = DEFAULT_FOLIO.max(store.unit());
    let group = store.write_unit();
    if store.writable() && group <= GROUP_FOLIO_MAX {
        folio.max(group)
    } else {
        folio
    }
}

/// A region could not be mapped from an object URL.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum MapUrlError {
    /// {0}
    Open(#[from] OpenError),
    /// {0}
    Dataset(#[from] DatasetError),
    /// {0}
    Map(#[from] upager::MapError),
}

/// Opens the object `url` names and maps it read-only, or the dataset a
/// prefix URL (`s3://BUCKET/NAME/`) names, writable if `opts` asks. The
/// folio is [`default_folio`]'s unless `opts` sets one; an object must not
/// be mapped writable ([`OpenError::Writable`]).
pub fn map(
    pager: &upager::Pager,
    url: &S3Url,
    opts: &upager::MapOptions,
    s3: &S3Options,
) -> Result<upager::Region, MapUrlError> {
    let st: Arc<dyn upager::Store> = if dataset::is_dataset(url) {
        S3Dataset::open(url, opts.is_writable(), s3)?
    } else if opts.is_writable() {
        return Err(OpenError::Writable {
            url: url.to_string(),
        }
        .into());
    } else {
        S3Store::open(url, s3)?
    };
    let opts = match opts.folio_set() {
        Some(_) => opts.clone(),
        None => opts.clone().folio(default_folio(&*st)),
    };
    Ok(pager.map_store(st, &opts)?)
}

/// Maps `len` bytes of anonymous memory that swaps to an S3 store (far
/// memory): objects of a unique dataset under the prefix `url` names
/// (`s3://BUCKET/` or `s3://BUCKET/PREFIX/`), one per evicted folio
/// ([`S3Dataset::swap`]), removed when the region's store goes. The folio
/// is [`DEFAULT_FOLIO`] unless `opts` sets one (64 KiB-64 MiB).
pub fn map_anonymous(
    pager: &upager::Pager,
    url: &S3Url,
    len: u64,
    opts: &upager::MapOptions,
    s3: &S3Options,
) -> Result<upager::Region, MapUrlError> {
    let folio = opts.folio_set().unwrap_or(DEFAULT_FOLIO);
    let st = S3Dataset::swap(url, folio, s3, &config::ProcessEnv)?;
    Ok(pager.map_anonymous_on(st, len, &opts.clone().folio(folio))?)
}

/// An object could not be uploaded or deleted.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum UploadError {
    /// cannot read {path}: {source} (nothing was uploaded)
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// {0}
    Source(#[from] upager::OpenRegularError),
    /// {url}: the upload was cancelled (the multipart upload was aborted: nothing was published)
    Cancelled {
        /// The URL.
        url: String,
    },
    /// {0}
    Open(#[from] OpenError),
    /// {url}: {detail}
    Put {
        /// The URL.
        url: String,
        /// Why (the multipart upload was aborted).
        detail: String,
    },
    /// {url}: no answer within {secs} s
    Timeout {
        /// The URL.
        url: String,
        /// The bound.
        secs: u64,
    },
}

/// Parts of a multipart upload (8 MiB; S3's least part is 5 MiB).
const UPLOAD_PART: usize = 8 << 20;

/// A client of one bucket, for what a read-only store does not do: put,
/// upload and delete objects (the CLI's demo, tests, benchmarks).
pub struct Objects {
    client: Arc<dyn ObjectStore>,
    url: S3Url,
    /// The endpoint, for messages.
    endpoint: String,
    guard: std::time::Duration,
    /// Shared with the process's other opens of the bucket (client.rs).
    rt: Arc<client::Rt>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("bucket", &self.url.bucket)
            .finish_non_exhaustive()
    }
}

impl Objects {
    /// A client of the bucket of `url`, settings from the process's
    /// environment and profile (as [`S3Store::open`]).
    pub fn open(url: &S3Url, s3: &S3Options) -> Result<Objects, OpenError> {
        Self::open_with(url, s3, &config::ProcessEnv)
    }

    /// [`Objects::open`] with the settings from `env`.
    pub fn open_with(
        url: &S3Url,
        s3: &S3Options,
        env: &dyn config::Env,
    ) -> Result<Objects, OpenError> {
        let res = config::resolve(url, env)?;
        let (client, rt) = client::connect(url, &res, s3, 1)?;
        Ok(Objects {
            client,
            url: url.clone(),
            endpoint: store::endpoint_of(url, &res),
            guard: s3.timeout * 4 + s3.retry_for,
            rt,
        })
    }

    fn run<T: Send>(
        &self,
        key: &str,
        fut: impl std::future::Future<Output = object_store::Result<T>> + Send,
    ) -> Result<T, UploadError> {
        match store::run(&self.rt, self.guard, fut) {
            None => Err(UploadError::Timeout {
                url: self.url.with_key(key).to_string(),
                secs: self.guard.as_secs(),
            }),
            Some(Err(e)) => Err(match store::no_bucket(&self.url, &self.endpoint, &e) {
                Some(no) => no.into(),
                None => UploadError::Put {
                    url: self.url.with_key(key).to_string(),
                    detail: store::error_chain(&e),
                },
            }),
            Some(Ok(v)) => Ok(v),
        }
    }

    /// Puts `data` as object `key` in one PUT (replacing any); returns
    /// its ETag.
    pub fn put(&self, key: &str, data: Vec<u8>) -> Result<String, UploadError> {
        let loc = ObjPath::from(key);
        let r = self.run(key, self.client.put(&loc, PutPayload::from(data)))?;
        Ok(r.e_tag.unwrap_or_default())
    }

    /// Uploads the file at `path` as object `key` (replacing any), in
    /// parts of 8 MiB with up to 4 in flight; returns the new object's
    /// ETag. A failed upload is aborted: S3 publishes a multipart object
    /// only once it is completed, so nothing is left half-written. Only a
    /// regular file is uploaded ([`upager::open_regular_file`]).
    pub fn upload(&self, path: &Path, key: &str) -> Result<String, UploadError> {
        self.upload_with(path, key, &AtomicBool::new(false), &mut |_, _| {})
    }

    /// [`Objects::upload`] that says how far it got after each batch of
    /// parts (`progress(bytes done, bytes in all)`) and stops before the
    /// next batch once `cancel` is set: the multipart upload is aborted
    /// ([`UploadError::Cancelled`]).
    pub fn upload_with(
        &self,
        path: &Path,
        key: &str,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<String, UploadError> {
        let read_err = |source| UploadError::Read {
            path: path.to_path_buf(),
            source,
        };
        let (mut file, total) = upager::open_regular_file(path)?;
        let loc = ObjPath::from(key);
        let mut up = self.run(key, self.client.put_multipart(&loc))?;
        let mut buf = vec![0u8; UPLOAD_PART];
        let res = (|| {
            let mut pending = Vec::new();
            let mut done = 0u64;
            progress(0, total);
            loop {
                if cancel.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(UploadError::Cancelled {
                        url: self.url.with_key(key).to_string(),
                    });
                }
                let mut n = 0;
                while n < buf.len() {
                    match file.read(&mut buf[n..]) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(read_err(e)),
                    }
                }
                if n > 0 {
                    pending.push(up.put_part(PutPayload::from(buf[..n].to_vec())));
                    done += n as u64;
                }
                let last = n < buf.len();
                if pending.len() >= 4 || last {
                    let batch = futures::future::try_join_all(std::mem::take(&mut pending));
                    self.run(key, batch)?;
                    progress(done, total.max(done));
                }
                if last {
                    break;
                }
            }
            let done = self.run(key, up.complete())?;
            Ok(done.e_tag.unwrap_or_default())
        })();
        if res.is_err() {
            let _ = self.run(key, up.abort());
        }
        res
    }

    /// Deletes object `key` and its warm-start trace beside it
    /// ([`store::trace_key`]); no error if there is none.
    pub fn delete(&self, key: &str) -> Result<(), UploadError> {
        for k in [key.to_string(), store::trace_key(key)] {
            let loc = ObjPath::from(k.as_str());
            self.run(&k, async {
                match self.client.delete(&loc).await {
                    Err(object_store::Error::NotFound { .. }) => Ok(()),
                    r => r,
                }
            })?;
        }
        Ok(())
    }

    /// The keys under `prefix` (all of the bucket's for "").
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, UploadError> {
        let p = (!prefix.is_empty()).then(|| ObjPath::from(prefix));
        self.run(prefix, async {
            let v: Vec<_> = self.client.list(p.as_ref()).try_collect().await?;
            Ok(v.into_iter()
                .map(|m| (m.location.to_string(), m.size))
                .collect())
        })
    }
}

impl upager::ErrorCode for OpenError {
    fn errno(&self) -> i32 {
        match self {
            OpenError::NoBucket { .. } | OpenError::NoObject { .. } => libc::ENOENT,
            OpenError::Denied { .. } | OpenError::NoCredentials { .. } => libc::EACCES,
            OpenError::Unreachable { .. } => libc::ECONNREFUSED,
            OpenError::Timeout { .. } => libc::ETIMEDOUT,
            OpenError::Writable { .. } => libc::EROFS,
            OpenError::Config(_) | OpenError::NoKey { .. } | OpenError::CaFile { .. } => {
                libc::EINVAL
            }
            _ => libc::EIO,
        }
    }
}

impl upager::ErrorCode for UrlError {
    fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

impl upager::ErrorCode for MapUrlError {
    fn errno(&self) -> i32 {
        match self {
            MapUrlError::Open(e) => e.errno(),
            MapUrlError::Dataset(e) => e.errno(),
            MapUrlError::Map(e) => e.errno(),
        }
    }
}
