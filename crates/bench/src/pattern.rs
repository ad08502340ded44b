//! The benchmarks' data files: pattern files (`upager_testdata::xor_word`,
//! every 8-byte word is `offset ^ seed`) made for a run, synced and dropped
//! from the page cache, and checked. The words themselves, the xorshift
//! generator the random workloads share (kernel and upager draw the same
//! offsets) and reading a word come from `upager-testdata`.
//!
//! An engine that returns wrong data fails a run instead of looking fast.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use upager_testdata::xor_word;

use crate::host::{io_err, SetupError};
use crate::raw;

/// Create (or replace) `path` with `len` bytes (rounded up to 8) where the
/// word at each offset is `xor_word(offset, seed)`. Writes 4 MiB chunks and
/// fsyncs. Returns the time taken.
pub fn create_pattern_file(path: &Path, len: u64, seed: u64) -> Result<Duration, SetupError> {
    create_file(path, len.div_ceil(8) * 8, |off| xor_word(off, seed))
}

/// Writes `len` bytes of `word(offset)` words to `path`, syncs it and
/// evicts it from the page cache (left there, it would be charged to this
/// process's cgroup, and a run reading it would hit it without charging
/// its own). Returns the time taken.
fn create_file(path: &Path, len: u64, word: impl Fn(u64) -> u64) -> Result<Duration, SetupError> {
    let t = Instant::now();
    let f = upager_testdata::write_file(path, len, word)
        .map_err(io_err("writing the data file", path))?;
    f.sync_all()
        .map_err(io_err("syncing the data file", path))?;
    raw::evict_file_cache(&f)
        .map_err(io_err("evicting the data file from the page cache", path))?;
    Ok(t.elapsed())
}

/// Create (or replace) `path` with `len / 8` float64 elements (little
/// endian), element i = i (numpy scenario): every slice sum and every random
/// gather then has an exact expected value (integers below 2^53 add
/// exactly), so the Python driver checks what it read. Synced and evicted
/// from the page cache like [`create_pattern_file`].
pub fn create_f64_index_file(path: &Path, len: u64) -> Result<Duration, SetupError> {
    create_file(path, len / 8 * 8, |off| ((off / 8) as f64).to_bits())
}

/// What a scenario's data file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFile {
    /// No data file.
    None,
    /// `upager_testdata::xor_word` pattern words (`offset ^ seed`).
    Pattern,
    /// float64 values, element i = i (numpy): every slice sum and random
    /// gather has an exact expected value.
    F64Index,
}

/// Make `file` with `kind`'s content unless it already exists with the
/// right size (a numpy run restores what it wrote; an engine whose run
/// failed removes the file, so it is made again). Says what it made on
/// stderr.
pub fn ensure_data_file(
    kind: DataFile,
    file_bytes: u64,
    seed: u64,
    file: &Path,
) -> Result<(), SetupError> {
    let want = match kind {
        DataFile::F64Index => file_bytes / 8 * 8,
        DataFile::Pattern | DataFile::None => file_bytes.div_ceil(8) * 8,
    };
    if std::fs::metadata(file).map(|m| m.len()).ok() == Some(want) {
        return Ok(());
    }
    let t = match kind {
        DataFile::F64Index => create_f64_index_file(file, file_bytes)?,
        DataFile::Pattern | DataFile::None => create_pattern_file(file, file_bytes, seed)?,
    };
    eprintln!(
        "upager-bench: made {} ({} MiB) in {:.2} s",
        file.display(),
        file_bytes >> 20,
        t.as_secs_f64()
    );
    Ok(())
}

/// Drop a file's clean, unmapped pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`), so the next run reads it from the
/// device and charges it to its own cgroup. Targeted, unlike
/// [`crate::env::drop_caches`], and needs no privilege.
pub fn evict_file(path: &Path) -> Result<(), SetupError> {
    let f = File::open(path).map_err(io_err("opening the data file", path))?;
    raw::evict_file_cache(&f).map_err(io_err("evicting the data file from the page cache", path))
}

/// Check every word of a pattern file made by [`create_pattern_file`];
/// returns the offset of the first wrong word, if any.
pub fn verify_pattern_file(path: &Path, seed: u64) -> Result<Option<u64>, SetupError> {
    let m = upager_testdata::verify_file(path, |off| xor_word(off, seed))
        .map_err(io_err("reading the data file", path))?;
    Ok(m.map(|m| m.offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_file_roundtrip() {
        let p = std::env::temp_dir().join(crate::host::unique_name("pattern"));
        create_pattern_file(&p, (1 << 20) + 12, 0xfeed).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), (1 << 20) + 16);
        // The files the published figures were measured on: word = offset ^ seed.
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes[8..16], (8u64 ^ 0xfeed).to_le_bytes());
        assert_eq!(
            bytes[(1 << 20) + 8..],
            (((1u64 << 20) + 8) ^ 0xfeed).to_le_bytes()
        );
        assert_eq!(verify_pattern_file(&p, 0xfeed).unwrap(), None);
        assert_eq!(verify_pattern_file(&p, 0xbeef).unwrap(), Some(0));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn f64_index_file() {
        let p = std::env::temp_dir().join(crate::host::unique_name("f64"));
        create_f64_index_file(&p, (1 << 20) + 12).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes.len(), (1 << 20) + 8);
        for i in [0usize, 1, 4095, 131_072] {
            let b: [u8; 8] = bytes[i * 8..i * 8 + 8].try_into().unwrap();
            assert_eq!(f64::from_le_bytes(b), i as f64);
        }
        std::fs::remove_file(&p).unwrap();
    }
}
