//! Pattern files and buffers: making them, and checking them word by word.
//!
//! A pattern is `Fn(u64) -> u64`: the byte offset of a word (a multiple of
//! 8, counted from the start of the file) to the little-endian word stored
//! there — one of the [`crate::word`] functions with its seed, or a closure
//! that also knows which words a workload rewrote.
//!
//! Files are made and read in [`CHUNK`]s, each filled or checked in one
//! pass over a buffer; the `_with_progress` variants call a closure after
//! each chunk (for a progress bar), the plain ones are the same code with a
//! closure that does nothing. A length that is not a multiple of 8 ends in
//! the first bytes of the next pattern word.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

/// Bytes made or checked per step (and per progress call): 4 MiB.
pub const CHUNK: usize = 4 << 20;

/// The first word of a buffer or file that is not what the pattern says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Byte offset of the word.
    pub offset: u64,
    /// The word found there (little-endian; for a partial last word, the
    /// bytes present, the rest zero).
    pub found: u64,
    /// The word the pattern has there (for a partial last word, only the
    /// bytes present, the rest zero).
    pub expected: u64,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "byte {}: found {:#x}, expected {:#x}",
            self.offset, self.found, self.expected
        )
    }
}

/// Fills `buf` with the pattern, `buf[0]` being byte `base` of the file
/// (`base` a multiple of 8).
pub fn fill(buf: &mut [u8], base: u64, word: impl Fn(u64) -> u64) {
    debug_assert!(base % 8 == 0, "unaligned base {base}");
    let mut words = buf.chunks_exact_mut(8);
    let mut off = base;
    for w in &mut words {
        w.copy_from_slice(&word(off).to_le_bytes());
        off += 8;
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&word(off).to_le_bytes()[..n]);
    }
}

/// The first word of `buf` that differs from the pattern, `buf[0]` being
/// byte `base` of the file (`base` a multiple of 8); `None` if every byte
/// matches.
pub fn first_mismatch(buf: &[u8], base: u64, word: impl Fn(u64) -> u64) -> Option<Mismatch> {
    debug_assert!(base % 8 == 0, "unaligned base {base}");
    let mut words = buf.chunks_exact(8);
    let mut off = base;
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let (found, expected) = (u64::from_le_bytes(b), word(off));
        if found != expected {
            return Some(Mismatch {
                offset: off,
                found,
                expected,
            });
        }
        off += 8;
    }
    let tail = words.remainder();
    if tail.is_empty() {
        return None;
    }
    let n = tail.len();
    let (mut found, mut expected) = ([0u8; 8], word(off).to_le_bytes());
    found[..n].copy_from_slice(tail);
    expected[n..].fill(0);
    (found != expected).then(|| Mismatch {
        offset: off,
        found: u64::from_le_bytes(found),
        expected: u64::from_le_bytes(expected),
    })
}

/// Creates (or truncates) `path` and writes `len` bytes of the pattern.
/// Returns the file, written but not synced: the caller decides whether to
/// `sync_all` or drop it from the page cache.
pub fn write_file(path: &Path, len: u64, word: impl Fn(u64) -> u64) -> io::Result<File> {
    write_file_with_progress(path, len, word, |_| {})
}

/// [`write_file`], calling `progress(bytes written so far)` after each
/// [`CHUNK`].
pub fn write_file_with_progress(
    path: &Path,
    len: u64,
    word: impl Fn(u64) -> u64,
    mut progress: impl FnMut(u64),
) -> io::Result<File> {
    let mut f = File::create(path)?;
    let mut buf = vec![0u8; len.min(CHUNK as u64) as usize];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        fill(&mut buf[..n], off, &word);
        f.write_all(&buf[..n])?;
        off += n as u64;
        progress(off);
    }
    Ok(f)
}

/// Checks every byte of the file at `path` against the pattern; returns the
/// first wrong word, or `None` if the whole file matches.
pub fn verify_file(path: &Path, word: impl Fn(u64) -> u64) -> io::Result<Option<Mismatch>> {
    verify_file_with_progress(path, word, |_| {})
}

/// [`verify_file`], calling `progress(bytes checked so far)` after each
/// [`CHUNK`].
pub fn verify_file_with_progress(
    path: &Path,
    word: impl Fn(u64) -> u64,
    mut progress: impl FnMut(u64),
) -> io::Result<Option<Mismatch>> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    loop {
        let n = read_full(&mut f, &mut buf)?;
        if let Some(m) = first_mismatch(&buf[..n], off, &word) {
            return Ok(Some(m));
        }
        off += n as u64;
        if n > 0 {
            progress(off);
        }
        if n < buf.len() {
            return Ok(None);
        }
    }
}

/// Reads until `buf` is full or the file ends (so every chunk but the last
/// starts on a word); returns the bytes read.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::word::{mul_word, xor_word};

    /// A directory of its own under the system temp dir, removed on drop.
    struct Dir(std::path::PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let d =
                std::env::temp_dir().join(format!("upager-testdata-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn file_holds_the_pattern_across_chunks() {
        let d = Dir::new("chunks");
        let p = d.0.join("f");
        let len = 2 * CHUNK as u64 + 4096 + 24;
        let mut calls = Vec::new();
        write_file_with_progress(&p, len, |o| mul_word(o, 9), |n| calls.push(n)).unwrap();
        assert_eq!(calls, [CHUNK as u64, 2 * CHUNK as u64, len]);
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes.len() as u64, len);
        // The naive reference: word by word.
        for (i, w) in bytes.chunks(8).enumerate() {
            let want = mul_word(8 * i as u64, 9).to_le_bytes();
            assert_eq!(w, want, "word {i}");
        }
        let mut seen = Vec::new();
        let r = verify_file_with_progress(&p, |o| mul_word(o, 9), |n| seen.push(n));
        assert_eq!(r.unwrap(), None);
        assert_eq!(seen, calls);
        assert_eq!(
            verify_file(&p, |o| mul_word(o, 10))
                .unwrap()
                .map(|m| m.offset),
            Some(0)
        );
    }

    #[test]
    fn first_wrong_word_is_reported_in_any_chunk() {
        let d = Dir::new("wrong");
        let p = d.0.join("f");
        let len = CHUNK as u64 + 64;
        for bad in [0, 8, CHUNK as u64 - 8, CHUNK as u64, len - 8] {
            write_file(&p, len, |o| xor_word(o, 3)).unwrap();
            let mut bytes = std::fs::read(&p).unwrap();
            bytes[bad as usize + 5] ^= 0x40;
            std::fs::write(&p, &bytes).unwrap();
            let m = verify_file(&p, |o| xor_word(o, 3)).unwrap().unwrap();
            assert_eq!(m.offset, bad);
            assert_eq!(m.expected, xor_word(bad, 3));
            assert_eq!(m.found, xor_word(bad, 3) ^ (0x40 << 40));
            assert_eq!(first_mismatch(&bytes, 0, |o| xor_word(o, 3)), Some(m));
        }
    }

    #[test]
    fn partial_last_word_is_written_and_checked() {
        let d = Dir::new("partial");
        let p = d.0.join("f");
        write_file(&p, 8 + 3, |o| mul_word(o, 1)).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[8..], &mul_word(8, 1).to_le_bytes()[..3]);
        assert_eq!(verify_file(&p, |o| mul_word(o, 1)).unwrap(), None);
        let mut bad = bytes.clone();
        bad[10] ^= 1;
        let m = first_mismatch(&bad, 0, |o| mul_word(o, 1)).unwrap();
        assert_eq!(m.offset, 8);
        assert_eq!(m.expected, mul_word(8, 1) & 0xff_ffff);
        assert_eq!(m.found, m.expected ^ 0x01_0000);
    }

    #[test]
    fn buffers_start_at_any_word() {
        let mut buf = vec![0u8; 64];
        fill(&mut buf, 4096, |o| xor_word(o, 5));
        assert_eq!(crate::word::word_at(&buf, 8), xor_word(4104, 5));
        assert_eq!(first_mismatch(&buf, 4096, |o| xor_word(o, 5)), None);
        assert_eq!(
            first_mismatch(&buf, 0, |o| xor_word(o, 5)).unwrap().offset,
            0
        );
        assert_eq!(first_mismatch(&[], 0, |_| unreachable!()), None);
    }

    #[test]
    fn empty_file_and_missing_file() {
        let d = Dir::new("empty");
        let p = d.0.join("f");
        write_file(&p, 0, |_| unreachable!()).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        assert_eq!(verify_file(&p, |_| unreachable!()).unwrap(), None);
        let e = verify_file(&d.0.join("missing"), |o| o).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn mismatch_message() {
        let m = Mismatch {
            offset: 16,
            found: 0xab,
            expected: 0xcd,
        };
        assert_eq!(m.to_string(), "byte 16: found 0xab, expected 0xcd");
    }
}
