//! The benchmarks' data files: pattern files (`upager_testdata::xor_word`,
//! every 8-byte word is `offset ^ seed`) made for a run, synced and dropped
//! from the page cache, and checked. The words themselves, the xorshift
//! generator the random workloads share (kernel and upager draw the same
//! offsets) and reading a word come from `upager-testdata`. The numpy
//! scenario's float64 files come in two [`DataKind`]s: element i = i
//! (compressible) and a hash of i in [0, 1) (incompressible).
//!
//! An engine that returns wrong data fails a run instead of looking fast.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use upager_testdata::{mix, xor_word, GOLDEN};

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
/// endian) of `kind` (numpy scenario), element i = `kind.element(i, seed)`:
/// every element, slice sum and random gather has a known value, so the
/// Python driver checks what it read. Synced and evicted from the page
/// cache like [`create_pattern_file`].
pub fn create_f64_file(
    path: &Path,
    len: u64,
    kind: DataKind,
    seed: u64,
) -> Result<Duration, SetupError> {
    create_file(path, len / 8 * 8, |off| {
        kind.element(off / 8, seed).to_bits()
    })
}

/// Element `i` of an incompressible float64 file made with `seed`: the
/// i-th output of splitmix64 seeded with `seed` (`mix(seed + i * GOLDEN)`),
/// its top 53 bits as a float64 in [0, 1) (`>> 11`, times 2^-53, as
/// numpy's `random()` makes a double). 52 random mantissa bits per element:
/// no compressor shrinks a page of them, and every element is checkable.
/// bench/numpy_scenario.py computes the same formula with numpy.
pub fn f64_random(i: u64, seed: u64) -> f64 {
    f64_random_units(i, seed) as f64 / (1u64 << 53) as f64
}

/// [`f64_random`]`(i, seed)` in units of 2^-53: a 53-bit integer.
fn f64_random_units(i: u64, seed: u64) -> u64 {
    mix(seed.wrapping_add(i.wrapping_mul(GOLDEN))) >> 11
}

/// The exact sum of each `slice` elements of an incompressible file of
/// `elements` elements made with `seed` (the last slice may be shorter),
/// rounded once to float64: each element is an integer times 2^-53, so the
/// integers are summed exactly (u128) and scaled at the end. numpy's sum of
/// the same slice differs from it only by its rounding (pairwise summation:
/// below `slice * 2^-47` for values in [0, 1)); the numpy driver checks its
/// slice sums against these within a wider bound, which any wrong element
/// of random data exceeds.
pub fn f64_random_slice_sums(elements: u64, slice: u64, seed: u64) -> Vec<f64> {
    let slice = slice.max(1);
    (0..elements.div_ceil(slice))
        .map(|k| {
            let units: u128 = (k * slice..elements.min((k + 1) * slice))
                .map(|i| u128::from(f64_random_units(i, seed)))
                .sum();
            units as f64 / (1u64 << 53) as f64
        })
        .collect()
}

/// What kind of float64 data the numpy scenario reads: one variant, and
/// one data file, each.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum DataKind {
    /// Element i = i ([`DataFile::F64Index`]): zram compresses its pages
    /// several times over, so a read from the device decompresses.
    #[default]
    Compressible,
    /// Element i = [`f64_random`] ([`DataFile::F64Random`]): zram stores
    /// its pages as they are, so a read from the device is a copy.
    Incompressible,
}

impl DataKind {
    /// Both kinds, in the order a run sweeps them.
    pub const ALL: [DataKind; 2] = [DataKind::Compressible, DataKind::Incompressible];

    /// The name on the command line, in variant labels and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DataKind::Compressible => "compressible",
            DataKind::Incompressible => "incompressible",
        }
    }

    /// Element `i` of a file of this kind made with `seed`.
    pub fn element(self, i: u64, seed: u64) -> f64 {
        match self {
            DataKind::Compressible => i as f64,
            DataKind::Incompressible => f64_random(i, seed),
        }
    }

    /// The data file of this kind.
    pub fn file(self) -> DataFile {
        match self {
            DataKind::Compressible => DataFile::F64Index,
            DataKind::Incompressible => DataFile::F64Random,
        }
    }
}

impl std::fmt::Display for DataKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// unknown data kind {0:?}; known: compressible, incompressible
#[derive(Debug, Clone, PartialEq, Eq, displaydoc::Display, thiserror::Error)]
pub struct ParseDataKindError(pub String);

impl std::str::FromStr for DataKind {
    type Err = ParseDataKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| ParseDataKindError(s.to_string()))
    }
}

/// What a scenario's data file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFile {
    /// No data file.
    None,
    /// `upager_testdata::xor_word` pattern words (`offset ^ seed`).
    Pattern,
    /// float64 values, element i = i (numpy, compressible): every slice sum
    /// and random gather has an exact expected value.
    F64Index,
    /// float64 values in [0, 1), element i = [`f64_random`]`(i, seed)`
    /// (numpy, incompressible).
    F64Random,
}

impl DataFile {
    /// The file's name for `file_bytes` and `seed`: by kind and size (and
    /// seed where the content depends on it), so runs that need the same
    /// content share a file and different kinds can sit side by side.
    pub fn file_name(self, file_bytes: u64, seed: u64) -> String {
        match self {
            DataFile::F64Index => format!("f64-compressible-{file_bytes}"),
            DataFile::F64Random => format!("f64-incompressible-{file_bytes}-{seed:x}"),
            DataFile::Pattern | DataFile::None => format!("data-{file_bytes}-{seed:x}"),
        }
    }
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
        DataFile::F64Index | DataFile::F64Random => file_bytes / 8 * 8,
        DataFile::Pattern | DataFile::None => file_bytes.div_ceil(8) * 8,
    };
    if std::fs::metadata(file).map(|m| m.len()).ok() == Some(want) {
        return Ok(());
    }
    let t = match kind {
        DataFile::F64Index => create_f64_file(file, file_bytes, DataKind::Compressible, seed)?,
        DataFile::F64Random => create_f64_file(file, file_bytes, DataKind::Incompressible, seed)?,
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
        create_f64_file(&p, (1 << 20) + 12, DataKind::Compressible, 7).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes.len(), (1 << 20) + 8);
        for i in [0usize, 1, 4095, 131_072] {
            let b: [u8; 8] = bytes[i * 8..i * 8 + 8].try_into().unwrap();
            assert_eq!(f64::from_le_bytes(b), i as f64);
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn f64_random_file_and_sums() {
        let seed = 0x5eed_0000_0000_0001;
        // Pinned (Python integers: mix(seed) >> 11, as a double); the
        // numpy driver computes the same bits.
        assert_eq!(f64_random(0, seed).to_bits(), 0x3fe3_119d_a9b3_c267);
        assert_eq!(f64_random(12_345, seed).to_bits(), 0x3f4a_c589_18ce_e400);
        let p = std::env::temp_dir().join(crate::host::unique_name("f64r"));
        create_f64_file(&p, (1 << 16) + 12, DataKind::Incompressible, seed).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let n = bytes.len() as u64 / 8;
        assert_eq!(n, (1 << 13) + 1);
        let el = |i: u64| {
            let at = i as usize * 8;
            f64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
        };
        for i in 0..n {
            let v = el(i);
            assert_eq!(v, f64_random(i, seed));
            assert!((0.0..1.0).contains(&v));
        }
        let sums = f64_random_slice_sums(n, 1000, seed);
        assert_eq!(sums.len(), 9);
        let naive: f64 = (8000..n).map(el).sum();
        assert!((sums[8] - naive).abs() < 1e-9, "{} vs {naive}", sums[8]);
        assert!((sums.iter().sum::<f64>() - n as f64 / 2.0).abs() < 3.0 * (n as f64).sqrt());
    }

    #[test]
    fn data_kinds_by_name() {
        for k in DataKind::ALL {
            assert_eq!(k.name().parse::<DataKind>().unwrap(), k);
            assert_eq!(serde_json::to_value(k).unwrap(), k.name());
        }
        assert!("random".parse::<DataKind>().is_err());
        assert_ne!(
            DataKind::Compressible.file().file_name(8, 1),
            DataKind::Incompressible.file().file_name(8, 1)
        );
    }
}
