//! upager-redis: pages on a Redis Cluster (issue 14).
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

mod errno;
pub mod store;
pub mod url;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use store::{OpenError, RedisCounters, RedisOptions, RedisStore, StoreError};
pub use url::{StoreUrl, UrlError};

/// Chunks sent per batch by [`upload`] (16 MiB at 64 KiB chunks; a guess
/// that keeps a batch's pipelines and memory modest).
const UPLOAD_BATCH: usize = 256;

/// A file could not be uploaded.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum UploadError {
    /// cannot read {path}: {source}
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// {0}
    Create(#[from] OpenError),
    /// upload to {url} failed after {done} of {total} bytes: {source} (the partial dataset is left; delete it or upload again under another name)
    Write {
        /// The dataset URL.
        url: String,
        /// Bytes uploaded.
        done: u64,
        /// Bytes of the file.
        total: u64,
        /// Why.
        source: std::io::Error,
    },
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
/// batch is acknowledged by `opts.replicas` replicas. Returns the bytes
/// uploaded (the file's size).
pub fn upload(
    path: &Path,
    url: &StoreUrl,
    chunk: u64,
    opts: &RedisOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, UploadError> {
    let read_err = |source| UploadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    let total = file.metadata().map_err(read_err)?.len();
    let st = RedisStore::create(url, total, chunk, opts)?;
    let mut done = 0u64;
    let mut buf = vec![0u8; chunk as usize * UPLOAD_BATCH];
    progress(0, total);
    while done < total {
        let want = (buf.len() as u64).min(total - done) as usize;
        file.read_exact(&mut buf[..want]).map_err(read_err)?;
        let first = done / chunk;
        let items: Vec<(u64, &[u8])> = buf[..want]
            .chunks(chunk as usize)
            .enumerate()
            .filter(|(_, c)| c.iter().any(|&b| b != 0))
            .map(|(k, c)| (first + k as u64, c))
            .collect();
        st.put_chunks(&items).map_err(|source| UploadError::Write {
            url: url.to_string(),
            done,
            total,
            source,
        })?;
        done += want as u64;
        progress(done, total);
    }
    Ok(total)
}

/// Opens the dataset `url` names and maps it (writable if `opts` says so;
/// the folio must be a multiple of the dataset's chunk).
pub fn map(
    pager: &upager::Pager,
    url: &StoreUrl,
    opts: &upager::MapOptions,
    ropts: &RedisOptions,
) -> Result<upager::Region, MapUrlError> {
    let st = RedisStore::open(url, opts.is_writable(), ropts)?;
    let folio = opts.folio_bytes();
    if !folio.is_multiple_of(st.chunk()) {
        return Err(MapUrlError::Folio {
            folio,
            chunk: st.chunk(),
        });
    }
    Ok(pager.map_store(st as Arc<dyn upager::Store>, opts)?)
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
    let st = RedisStore::swap(url, opts.folio_bytes(), ropts)?;
    Ok(pager.map_anonymous_on(st as Arc<dyn upager::Store>, len, opts)?)
}
