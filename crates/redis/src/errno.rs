//! The errno of each error (`upager::ErrorCode`), for the C API's negative
//! return values and Python's `OSError`s: the same numbers the engine's own
//! errors use for the same kind of failure.

use upager::ErrorCode;

use crate::{MapUrlError, OpenError, StoreError, UploadError, UrlError};

fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl ErrorCode for UrlError {
    fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

impl ErrorCode for OpenError {
    fn errno(&self) -> i32 {
        match self {
            OpenError::Unreachable { .. } => libc::ECONNREFUSED,
            OpenError::Reset { .. } => libc::ECONNRESET,
            OpenError::NotRedis { .. } | OpenError::Tls { .. } => libc::EPROTO,
            OpenError::Auth { .. } | OpenError::NoAuth { .. } => libc::EACCES,
            OpenError::TlsFile { .. } => libc::EINVAL,
            OpenError::NoName { .. } | OpenError::Chunk(_) => libc::EINVAL,
            OpenError::NotFound { .. } => libc::ENOENT,
            OpenError::Exists { .. } | OpenError::Busy { .. } => libc::EEXIST,
            OpenError::Incomplete { .. } => libc::ENOENT,
            OpenError::Redis { source, .. } => io_errno(source),
            _ => libc::EIO,
        }
    }
}

impl ErrorCode for MapUrlError {
    fn errno(&self) -> i32 {
        match self {
            MapUrlError::Open(e) => e.errno(),
            MapUrlError::Map(e) => e.errno(),
            _ => libc::EINVAL,
        }
    }
}

impl ErrorCode for UploadError {
    fn errno(&self) -> i32 {
        match self {
            UploadError::Read { source, .. } => io_errno(source),
            UploadError::NotRegular { kind, .. } => {
                if *kind == "directory" {
                    libc::EISDIR
                } else {
                    libc::EINVAL
                }
            }
            UploadError::Stopped { cause, .. } => cause.io().map_or(libc::EINTR, io_errno),
            UploadError::Create(e) => e.errno(),
        }
    }
}

impl ErrorCode for StoreError {
    fn errno(&self) -> i32 {
        match self {
            StoreError::Delete { source, .. } => io_errno(source),
            StoreError::NoName { .. } => libc::EINVAL,
            StoreError::NotFound { .. } => libc::ENOENT,
            StoreError::Open(e) => e.errno(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_failure_has_the_errno_a_c_caller_expects() {
        let url: Result<crate::StoreUrl, _> = "http://x".parse();
        assert_eq!(url.unwrap_err().errno(), libc::EINVAL);
        let nf = OpenError::NotFound {
            name: "d".into(),
            addrs: "127.0.0.1:1".into(),
        };
        assert_eq!(nf.errno(), libc::ENOENT);
        assert_eq!(MapUrlError::Open(nf).errno(), libc::ENOENT);
        assert_eq!(
            MapUrlError::Folio {
                folio: 4096,
                chunk: 65536
            }
            .errno(),
            libc::EINVAL
        );
        assert_eq!(OpenError::Chunk(3).errno(), libc::EINVAL);
    }
}
