//! A directory of this user's alone, for the files other processes of the
//! same user share with it (page pools, the disk tier): made 0700 if new,
//! and refused if it is another user's or open to others, so no other
//! account can read or plant what upager maps.
//!
//! Uses: none.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// Why a directory is not this user's alone.
#[derive(Debug)]
pub(crate) enum PrivateDirError {
    /// It could not be made or looked at.
    Io(io::Error),
    /// It is not a directory, or another user's, or open to others.
    NotPrivate {
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
}

/// This process's user id (the owner of `/proc/self`).
pub(crate) fn my_uid() -> io::Result<u32> {
    std::fs::metadata("/proc/self").map(|m| m.uid())
}

/// Makes `dir` (mode 0700; its parents too if `parents`) unless it exists,
/// then checks that it is a directory of this user's that no one else may
/// enter (not through a symbolic link).
pub(crate) fn make_private_dir(dir: &Path, parents: bool) -> Result<(), PrivateDirError> {
    let uid = my_uid().map_err(PrivateDirError::Io)?;
    match std::fs::DirBuilder::new()
        .recursive(parents)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(PrivateDirError::Io(e)),
    }
    let m = std::fs::symlink_metadata(dir).map_err(PrivateDirError::Io)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(PrivateDirError::NotPrivate {
            owner: m.uid(),
            mode: m.mode() & 0o7777,
        });
    }
    Ok(())
}
