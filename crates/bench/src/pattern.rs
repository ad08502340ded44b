//! Test data every engine can check: pattern files whose every 8-byte word is
//! known ([`pattern_word`]), the xorshift generator the random workloads
//! share (kernel and upager draw the same offsets), and reading a word.
//!
//! An engine that returns wrong data fails a run instead of looking fast.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::host::{io_err, SetupError};
use crate::raw;

/// The 8-byte little-endian word stored at byte `offset` (a multiple of 8)
/// of a pattern file made with `seed`.
pub fn pattern_word(offset: u64, seed: u64) -> u64 {
    offset ^ seed
}

/// One step of xorshift64 (Marsaglia): the workloads' random numbers.
pub(crate) fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// The little-endian word at byte `off` of `map`.
pub(crate) fn word_at(map: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&map[off..off + 8]);
    u64::from_le_bytes(w)
}

/// Create (or replace) `path` with `len` bytes (rounded up to 8) where the
/// word at each offset is [`pattern_word`]. Writes 4 MiB chunks and fsyncs.
/// Returns the time taken.
pub fn create_pattern_file(path: &Path, len: u64, seed: u64) -> Result<Duration, SetupError> {
    let t = Instant::now();
    let len = len.div_ceil(8) * 8;
    let mut f = File::create(path).map_err(io_err("creating the data file", path))?;
    const CHUNK: usize = 4 << 20;
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        for (i, w) in buf[..n].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&pattern_word(off + 8 * i as u64, seed).to_le_bytes());
        }
        f.write_all(&buf[..n])
            .map_err(io_err("writing the data file", path))?;
        off += n as u64;
    }
    f.sync_all()
        .map_err(io_err("syncing the data file", path))?;
    // Not left in the page cache: it would be charged to this process's
    // cgroup, and a run reading it would hit it without charging its own.
    raw::evict_file_cache(&f)
        .map_err(io_err("evicting the data file from the page cache", path))?;
    Ok(t.elapsed())
}

/// Drop a file's clean, unmapped pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`), so the next run reads it from the
/// device and charges it to its own cgroup. Targeted, unlike
/// [`crate::env::drop_caches`], and needs no privilege.
pub fn evict_file(path: &Path) -> Result<(), SetupError> {
    let f = File::open(path).map_err(io_err("opening the data file", path))?;
    raw::evict_file_cache(&f).map_err(io_err("evicting the data file from the page cache", path))
}

/// Check every word of a pattern file; returns the offset of the first wrong
/// word, if any.
pub fn verify_pattern_file(path: &Path, seed: u64) -> Result<Option<u64>, SetupError> {
    let mut f = File::open(path).map_err(io_err("opening the data file", path))?;
    let mut buf = vec![0u8; 4 << 20];
    let mut off = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io_err("reading the data file", path))?;
        if n == 0 {
            return Ok(None);
        }
        for (i, w) in buf[..n - n % 8].chunks_exact(8).enumerate() {
            let o = off + 8 * i as u64;
            if u64::from_le_bytes(w.try_into().unwrap_or_default()) != pattern_word(o, seed) {
                return Ok(Some(o));
            }
        }
        off += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_file_roundtrip() {
        let p = std::env::temp_dir().join(crate::host::unique_name("pattern"));
        create_pattern_file(&p, (1 << 20) + 12, 0xfeed).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), (1 << 20) + 16);
        assert_eq!(verify_pattern_file(&p, 0xfeed).unwrap(), None);
        assert_eq!(verify_pattern_file(&p, 0xbeef).unwrap(), Some(0));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn xorshift_sequence_is_fixed() {
        // Kernel and upager workloads must draw the same offsets: pin the
        // generator's first outputs.
        let mut s = 1u64;
        assert_eq!(
            [xorshift(&mut s), xorshift(&mut s), xorshift(&mut s)],
            [1082269761, 1152992998833853505, 11177516664432764457]
        );
    }
}
