//! upager-redis: pages on a Redis Cluster.
//!
//! Two uses of one store ([`RedisStore`], an [`upager::Store`]):
//! - **A shared dataset**: [`upload`] a file once, then any machine
//!   [`map`]s it by name (read-only, or writable: writes go back to the
//!   cluster on eviction and flush).
//! - **Far memory**: [`map_anonymous`] swaps an anonymous region to the
//!   cluster instead of a local swap file.
//!
//! ```no_run
//! use upager::{MapOptions, Pager};
//! use upager_redis::{RedisOptions, StoreUrl};
//! let url: StoreUrl = "redis-cluster://127.0.0.1:7000/weights".parse()?;
//! let ropts = RedisOptions::default();
//! upager_redis::upload("weights.bin".as_ref(), &url, 64 << 10, &ropts, &mut |_, _| {})?;
//! let pager = Pager::new(256 << 20)?;
//! let w = upager_redis::map(&pager, &url, &MapOptions::new(), &ropts)?;
//! let far = upager_redis::map_anonymous(&pager, &url, 8 << 30, &MapOptions::new(), &ropts)?;
//! far.write_at(0, &w.bytes()[0].load(std::sync::atomic::Ordering::Relaxed).to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why Redis Cluster: an engine many sites run already, sharded by key
//! over many nodes, replicated, with automatic failover; the sync client of
//! the official `redis` crate talks to it (no async runtime). The design
//! decisions (one key per chunk, hash tags for locality, pipelines per
//! node, `WAIT` per batch, bounded retries) are in the [`store`] module's
//! contract and in docs/design.md, "Stores, and Redis Cluster".
//!
//! A local cluster for trying it: `scripts/redis-cluster.sh start`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod dataset;
mod errno;
mod reply;
pub mod store;
pub mod url;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use dataset::{delete, list, DatasetInfo};
pub use store::{OpenError, RedisCounters, RedisOptions, RedisStore, StoreError};
pub use url::{StoreUrl, UrlError};

/// Default chunk of a dataset (one key each), and so the folio of the
/// regions that map it: a fault is a round trip to the cluster, so the
/// unit stays at 64 KiB where a local file's default folio is 4 KiB.
pub const DEFAULT_CHUNK: u64 = 64 << 10;

/// Chunks sent per batch by [`upload`] (16 MiB at 64 KiB chunks; a guess
/// that keeps a batch's pipelines and memory modest).
const UPLOAD_BATCH: usize = 256;

impl From<upager::OpenRegularError> for UploadError {
    fn from(e: upager::OpenRegularError) -> UploadError {
        match e {
            upager::OpenRegularError::Io { path, source } => UploadError::Read { path, source },
            upager::OpenRegularError::NotRegular { path, kind } => {
                UploadError::NotRegular { path, kind }
            }
        }
    }
}

/// A file could not be uploaded.
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
    /// {path} is a {kind}, not a regular file: upload a regular file (nothing was uploaded)
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is (directory, FIFO, ...).
        kind: &'static str,
    },
    /// {0}
    Create(#[from] OpenError),
    /// upload to {url} stopped after {done} of {total} bytes: {cause}; {left}
    Stopped {
        /// The dataset URL.
        url: String,
        /// Bytes uploaded.
        done: u64,
        /// Bytes of the file.
        total: u64,
        /// Why it stopped.
        cause: StopCause,
        /// What is left on the cluster.
        left: String,
    },
}

/// Why an upload stopped half-way.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum StopCause {
    /// interrupted (the cancel flag was set: SIGINT, SIGTERM or SIGHUP in the CLI)
    Interrupted,
    /// cannot read {path}: {source}
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// {0}
    Write(std::io::Error),
}

impl StopCause {
    /// The I/O error under it, if any.
    pub fn io(&self) -> Option<&std::io::Error> {
        match self {
            StopCause::Interrupted => None,
            StopCause::Read { source, .. } => Some(source),
            StopCause::Write(e) => Some(e),
        }
    }
}

/// A region could not be mapped from a store URL.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum MapUrlError {
    /// {0}
    Open(#[from] OpenError),
    /// folio size {folio} is not a multiple of dataset chunk size {chunk}: use a folio of {chunk} bytes or a multiple
    Folio {
        /// The region's folio size.
        folio: u64,
        /// The dataset's chunk size.
        chunk: u64,
    },
    /// {0}
    Map(#[from] upager::MapError),
}

/// Uploads the file at `path` as a new dataset named by `url` in chunks of
/// `chunk` bytes; `progress(done, total)` is called after each batch.
/// Chunks of zeros are not stored (a missing key reads as zeros). Every
/// batch is acknowledged by the replicas `opts` asks for. Returns the bytes
/// uploaded (the file's size). The dataset becomes visible only once
/// complete; an upload that fails is removed (see the [`dataset`] module).
pub fn upload(
    path: &Path,
    url: &StoreUrl,
    chunk: u64,
    opts: &RedisOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, UploadError> {
    upload_cancellable(path, url, chunk, opts, progress, &AtomicBool::new(false))
}

/// [`upload`], stopped at the next batch once `cancel` is set: what was
/// uploaded is then removed, and the error is [`UploadError::Stopped`] with
/// [`StopCause::Interrupted`]. A directory, FIFO, device or socket is
/// refused before anything is written.
pub fn upload_cancellable(
    path: &Path,
    url: &StoreUrl,
    chunk: u64,
    opts: &RedisOptions,
    progress: &mut dyn FnMut(u64, u64),
    cancel: &AtomicBool,
) -> Result<u64, UploadError> {
    let (mut file, total) = upager::open_regular_file(path)?;
    let up = dataset::Upload::begin(url, total, chunk, opts)?;
    let mut done = 0u64;
    let mut written = 0u64; // one past the highest chunk written
    let mut buf = vec![0u8; chunk as usize * UPLOAD_BATCH];
    progress(0, total);
    let res = (|| {
        while done < total {
            if cancel.load(Ordering::SeqCst) {
                return Err(StopCause::Interrupted);
            }
            let want = (buf.len() as u64).min(total - done) as usize;
            file.read_exact(&mut buf[..want])
                .map_err(|source| StopCause::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
            let first = done / chunk;
            let items: Vec<(u64, &[u8])> = buf[..want]
                .chunks(chunk as usize)
                .enumerate()
                .filter(|(_, c)| c.iter().any(|&b| b != 0))
                .map(|(k, c)| (first + k as u64, c))
                .collect();
            if let Some(&(i, _)) = items.last() {
                written = i + 1;
            }
            up.store.put_chunks(&items).map_err(StopCause::Write)?;
            up.beat().map_err(StopCause::Write)?;
            done += want as u64;
            progress(done, total);
        }
        if cancel.load(Ordering::SeqCst) {
            return Err(StopCause::Interrupted);
        }
        up.finish().map_err(StopCause::Write)
    })();
    match res {
        Ok(()) => Ok(total),
        Err(cause) => {
            let left = match up.abandon(written) {
                Ok(()) => "nothing of it is left on the cluster".to_string(),
                Err(e) => format!(
                    "its keys are left as an incomplete dataset that no one can open ({e}): \
                     `upager delete {url}` removes it, `upager load` again replaces it"
                ),
            };
            Err(UploadError::Stopped {
                url: url.to_string(),
                done,
                total,
                cause,
                left,
            })
        }
    }
}

/// Opens the dataset `url` names and maps it (writable if `opts` says so).
/// The folio is the dataset's chunk unless `opts` sets one, which must then
/// be a multiple of the chunk (a fault is a round trip to the cluster: the
/// chunk is the unit it was stored in, [`RedisStore`]'s `Store::unit`).
pub fn map(
    pager: &upager::Pager,
    url: &StoreUrl,
    opts: &upager::MapOptions,
    ropts: &RedisOptions,
) -> Result<upager::Region, MapUrlError> {
    let st = RedisStore::open(url, opts.is_writable(), ropts)?;
    pager
        .map_store(st as Arc<dyn upager::Store>, opts)
        .map_err(|e| match e {
            upager::MapError::FolioBelowUnit { folio, unit, .. } => {
                MapUrlError::Folio { folio, chunk: unit }
            }
            e => MapUrlError::Map(e),
        })
}

/// Maps `len` bytes of anonymous memory that swaps to the cluster at `url`
/// (far memory): its own swap space, chunks of the folio size, deleted
/// when the region is gone. The URL's name, if any, is not used.
pub fn map_anonymous(
    pager: &upager::Pager,
    url: &StoreUrl,
    len: u64,
    opts: &upager::MapOptions,
    ropts: &RedisOptions,
) -> Result<upager::Region, MapUrlError> {
    let folio = opts.folio_set().unwrap_or(upager::DEFAULT_ANON_FOLIO);
    let st = RedisStore::swap(url, folio, ropts)?;
    let opts = opts.clone().folio(folio);
    Ok(pager.map_anonymous_on(st as Arc<dyn upager::Store>, len, &opts)?)
}

#[cfg(test)]
mod tests {
    /// The crate's modules, lowest layer first: each may use only the ones
    /// before it (the facade, this file, uses them all).
    const LAYERS: &[&str] = &["reply", "url", "store", "dataset", "errno"];

    /// The names `src` uses as `crate::NAME`, comments left out (a name
    /// re-exported by this file, `crate::OpenError`, is among them too).
    fn crate_paths(src: &str) -> impl Iterator<Item = &str> {
        src.lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .flat_map(|code| code.split("crate::").skip(1))
            .filter_map(|path| {
                path.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .next()
            })
    }

    /// A module uses only modules listed before it in [`LAYERS`], so the
    /// store and the dataset layer cannot import each other again.
    #[test]
    fn modules_depend_one_way() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        for (pos, m) in LAYERS.iter().enumerate() {
            let src = std::fs::read_to_string(format!("{dir}/{m}.rs")).unwrap();
            let later: Vec<&str> = crate_paths(&src)
                .filter(|used| LAYERS[pos..].contains(used))
                .collect();
            assert!(
                later.is_empty(),
                "{m} uses {later:?}, at or after it in {LAYERS:?}: move the code, not both ways"
            );
        }
    }
}
