//! upager-stores: a store URL of any kind, for the faces that take one
//! (the CLI, Python, C).
//!
//! [`AnyUrl`] is a Redis Cluster dataset (`redis-cluster://`,
//! `rediss-cluster://`, [`upager_redis::StoreUrl`]) or an object of an
//! S3-compatible store (`s3://`, [`upager_s3::S3Url`]), told apart by the
//! scheme. [`map`] maps either with its store's defaults; [`open`] opens
//! either read-only as an [`upager::Store`] (to read a file format's
//! header before mapping the data after it). Each face keeps what is its
//! own (argument parsing, messages in its language); what a URL means and
//! how it is opened lives here once.
//!
//! Messages quote URLs redacted, as both stores' own errors do.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use upager::ErrorCode;
use upager_redis::{RedisOptions, RedisStore, StoreUrl};
use upager_s3::{S3Options, S3Store, S3Url};

/// A store URL of either kind.
#[derive(Debug, Clone)]
pub enum AnyUrl {
    /// `redis-cluster://` or `rediss-cluster://`: a dataset on a Redis Cluster.
    Redis(StoreUrl),
    /// `s3://BUCKET/KEY`: an object of an S3-compatible store (read-only),
    /// or `s3://BUCKET/NAME/`: a read-write dataset there.
    S3(S3Url),
}

/// A URL that names no store upager can use.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum UrlError {
    /// {0}
    Redis(#[from] upager_redis::UrlError),
    /// {0}
    S3(#[from] upager_s3::UrlError),
}

/// A region could not be mapped from a store URL.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum MapError {
    /// {0}
    Redis(#[from] upager_redis::MapUrlError),
    /// {0}
    S3(#[from] upager_s3::MapUrlError),
}

/// A store could not be opened from a URL.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum OpenError {
    /// {0}
    Redis(#[from] upager_redis::OpenError),
    /// {0}
    S3(#[from] upager_s3::OpenError),
    /// {0}
    S3Dataset(#[from] upager_s3::DatasetError),
}

impl AnyUrl {
    /// Whether `s` is an s3:// URL (the rest are Redis Cluster URLs or
    /// errors).
    pub fn is_s3(s: &str) -> bool {
        s.starts_with(upager_s3::url::SCHEME)
    }
}

impl FromStr for AnyUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<AnyUrl, UrlError> {
        if AnyUrl::is_s3(s) {
            Ok(AnyUrl::S3(s.parse()?))
        } else {
            Ok(AnyUrl::Redis(s.parse()?))
        }
    }
}

impl fmt::Display for AnyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyUrl::Redis(u) => u.fmt(f),
            AnyUrl::S3(u) => u.fmt(f),
        }
    }
}

/// Maps the dataset or object `url` names, with its store's default
/// options: a dataset (Redis, or S3 `s3://BUCKET/NAME/`) as `opts` asks
/// (read-only or writable), an object read-only (a writable `opts` is
/// refused: [`upager_s3::OpenError::Writable`]).
pub fn map(
    pager: &upager::Pager,
    url: &AnyUrl,
    opts: &upager::MapOptions,
) -> Result<upager::Region, MapError> {
    Ok(match url {
        AnyUrl::Redis(u) => upager_redis::map(pager, u, opts, &RedisOptions::default())?,
        AnyUrl::S3(u) => upager_s3::map(pager, u, opts, &S3Options::default())?,
    })
}

/// Maps `len` bytes of anonymous memory that swaps to the store `url`
/// names (far memory), with its store's default options: a Redis Cluster
/// ([`upager_redis::map_anonymous`]) or an S3 bucket or prefix
/// ([`upager_s3::map_anonymous`]).
pub fn map_anonymous(
    pager: &upager::Pager,
    url: &AnyUrl,
    len: u64,
    opts: &upager::MapOptions,
) -> Result<upager::Region, MapError> {
    Ok(match url {
        AnyUrl::Redis(u) => {
            upager_redis::map_anonymous(pager, u, len, opts, &RedisOptions::default())?
        }
        AnyUrl::S3(u) => upager_s3::map_anonymous(pager, u, len, opts, &S3Options::default())?,
    })
}

/// The folio a region of `store` (opened from `url`) gets when its map
/// sets none, as [`map`] maps it: a Redis dataset's chunk (its unit), an
/// S3 object's or dataset's [`upager_s3::default_folio`] (64 KiB: a GET
/// costs a round trip, 4 KiB ones would be thousands; a writable
/// dataset's group of up to 1 MiB).
pub fn default_folio(url: &AnyUrl, store: &dyn upager::Store) -> u64 {
    match url {
        AnyUrl::Redis(_) => store.unit(),
        AnyUrl::S3(_) => upager_s3::default_folio(store),
    }
}

/// Opens the dataset or object `url` names read-only, with its store's
/// default options.
pub fn open(url: &AnyUrl) -> Result<Arc<dyn upager::Store>, OpenError> {
    open_for(url, false)
}

/// Opens the dataset or object `url` names with its store's default
/// options, read-write when `writable`: a dataset (Redis, or S3
/// `s3://BUCKET/NAME/`) either way, an object read-only (a writable open
/// is refused: [`upager_s3::OpenError::Writable`]).
pub fn open_for(url: &AnyUrl, writable: bool) -> Result<Arc<dyn upager::Store>, OpenError> {
    Ok(match url {
        AnyUrl::Redis(u) => {
            RedisStore::open(u, writable, &RedisOptions::default())? as Arc<dyn upager::Store>
        }
        AnyUrl::S3(u) if upager_s3::dataset::is_dataset(u) => {
            upager_s3::S3Dataset::open(u, writable, &S3Options::default())?
                as Arc<dyn upager::Store>
        }
        AnyUrl::S3(u) if writable => {
            return Err(upager_s3::OpenError::Writable { url: u.to_string() }.into())
        }
        AnyUrl::S3(u) => S3Store::open(u, &S3Options::default())? as Arc<dyn upager::Store>,
    })
}

impl ErrorCode for UrlError {
    fn errno(&self) -> i32 {
        match self {
            UrlError::Redis(e) => e.errno(),
            UrlError::S3(e) => e.errno(),
        }
    }
}

impl ErrorCode for MapError {
    fn errno(&self) -> i32 {
        match self {
            MapError::Redis(e) => e.errno(),
            MapError::S3(e) => e.errno(),
        }
    }
}

impl ErrorCode for OpenError {
    fn errno(&self) -> i32 {
        match self {
            OpenError::Redis(e) => e.errno(),
            OpenError::S3(e) => e.errno(),
            OpenError::S3Dataset(e) => e.errno(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_picks_the_store() {
        let s3: AnyUrl = "s3://bucket/a/b.npy".parse().unwrap();
        assert!(matches!(&s3, AnyUrl::S3(u) if u.bucket == "bucket" && u.key == "a/b.npy"));
        let r: AnyUrl = "redis-cluster://127.0.0.1:7000/data".parse().unwrap();
        assert!(matches!(&r, AnyUrl::Redis(u) if u.name.as_deref() == Some("data")));
        assert_eq!(r.to_string(), "redis-cluster://127.0.0.1:7000/data");
        let e = "ftp://x/y".parse::<AnyUrl>().unwrap_err();
        assert!(matches!(e, UrlError::Redis(_)), "{e}");
        assert_eq!(e.errno(), upager::errno::EINVAL);
        let e = "s3://".parse::<AnyUrl>().unwrap_err();
        assert!(matches!(e, UrlError::S3(_)), "{e}");
    }

    #[test]
    fn a_password_is_not_printed() {
        let u: AnyUrl = "redis-cluster://:hunter2@127.0.0.1:7000/d".parse().unwrap();
        assert!(!u.to_string().contains("hunter2"), "{u}");
        let e = "redis-cluster://:hunter2@/d".parse::<AnyUrl>().unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
