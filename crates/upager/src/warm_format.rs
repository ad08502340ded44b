//! The warm-start trace file: the order a region's folios were first
//! needed, kept beside its file as `<file>.upager-trace` (or in a store
//! that keeps traces, [`Home`]): delta-encoded indices (zigzag varints), a
//! time mark (ms since the map) every [`MARK_EVERY`] entries, and a header
//! tying it to the data — the region's folio, offset and length, and the
//! file's size, mtime and inode as they are when it is written
//! ([`Identity`]), and last the xxh3-64 of every byte before it (format 2,
//! `UPGTRC02`: a trace damaged on disk, or in a store, is refused, never
//! replayed in a wrong order). Written to a temporary file and renamed (a
//! reader never sees half a trace). [`decode`] refuses damage (a checksum
//! that does not match, a count the bytes cannot hold, an index past the
//! region, trailing bytes) before it reserves anything; a format-1 trace
//! (`UPGTRC01`, no checksum) is refused as not a trace, and recorded anew.
//! [`trace_info`] says what a trace holds (`upager trace FILE`).
//!
//! Lock order: none (no state).
//!
//! Uses: `store` (a store's trace and its version).

use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use crate::store::Store;

/// Most entries a trace holds (the first folios needed; 16 Mi folios of
/// 4 KiB is 64 GiB of data).
pub(crate) const MAX_ENTRIES: usize = 1 << 24;
/// A time mark every this many entries.
pub(crate) const MARK_EVERY: usize = 256;
/// The trace file's first bytes (format version 2: a checksum at its end).
const MAGIC: &[u8; 8] = b"UPGTRC02";
/// Format 1's (no checksum): refused.
const MAGIC_1: &[u8; 8] = b"UPGTRC01";
/// The checksum's bytes, at the end.
const SUM_LEN: usize = 8;
/// Appended to the data file's name for its trace.
pub const TRACE_SUFFIX: &str = ".upager-trace";

/// A store's [`Store::trace_version`] from a text that names the data's
/// version (a Redis dataset's owner, an object's ETag): FNV-1a, stable
/// across processes and builds (not `RandomState`).
pub fn trace_version_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where a region's trace is kept: beside its file, or in its store (a
/// store that keeps traces: `Store::trace_version`).
pub(crate) enum Home {
    File(PathBuf),
    Store(std::sync::Arc<dyn Store>),
}

impl Home {
    pub(crate) fn describe(&self) -> String {
        match self {
            Home::File(f) => trace_path(f).display().to_string(),
            Home::Store(s) => format!("the trace of {}", s.describe()),
        }
    }
    pub(crate) fn load(&self) -> io::Result<Option<Vec<u8>>> {
        match self {
            Home::File(f) => {
                let mut buf = Vec::new();
                match std::fs::File::open(trace_path(f)) {
                    Ok(mut t) => t.read_to_end(&mut buf).map(|_| Some(buf)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Home::Store(s) => s.load_trace(),
        }
    }
    pub(crate) fn save(&self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Home::File(f) => write_trace(&trace_path(f), bytes),
            Home::Store(s) => s.save_trace(bytes),
        }
    }
}

/// The data a trace belongs to: a region of a file as the file was when
/// the trace was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    folio: u64,
    offset: u64,
    len: u64,
    file_len: u64,
    mtime_ns: u64,
    ino: u64,
}

impl Identity {
    /// The identity of the region `(folio, offset, len)` of the data in
    /// `home` now: a file's size, mtime and inode, a store's length and
    /// version.
    pub(crate) fn of(home: &Home, folio: u64, offset: u64, len: u64) -> io::Result<Identity> {
        use std::os::unix::fs::MetadataExt;
        let (file_len, mtime_ns, ino) = match home {
            Home::File(path) => {
                let m = std::fs::metadata(path)?;
                let mtime = (m.mtime() as u64)
                    .wrapping_mul(1_000_000_000)
                    .wrapping_add(m.mtime_nsec() as u64);
                (m.len(), mtime, m.ino())
            }
            Home::Store(s) => {
                let v = s.trace_version().ok_or(io::ErrorKind::Unsupported)?;
                (s.len(), v, 0)
            }
        };
        Ok(Identity {
            folio,
            offset,
            len,
            file_len,
            mtime_ns,
            ino,
        })
    }
    pub(crate) fn words(&self) -> [u64; 6] {
        [
            self.folio,
            self.offset,
            self.len,
            self.file_len,
            self.mtime_ns,
            self.ino,
        ]
    }
}

/// A decoded trace: folio indices in the order first needed, and time marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trace {
    pub order: Vec<usize>,
    pub marks_ms: Vec<u64>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Encodes `t` for the data `id` (the trace file's bytes).
pub(crate) fn encode(id: &Identity, t: &Trace) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + t.order.len() * 2);
    out.extend_from_slice(MAGIC);
    for w in id.words() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    put_varint(&mut out, t.order.len() as u64);
    let mut prev = 0i64;
    for &idx in &t.order {
        let d = idx as i64 - prev;
        put_varint(&mut out, ((d << 1) ^ (d >> 63)) as u64); // zigzag
        prev = idx as i64;
    }
    put_varint(&mut out, t.marks_ms.len() as u64);
    let mut prev = 0u64;
    for &m in &t.marks_ms {
        put_varint(&mut out, m.saturating_sub(prev));
        prev = m.max(prev);
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Decodes a trace file's bytes: its identity and trace (None: not a
/// trace, or a damaged one).
pub(crate) fn decode(buf: &[u8]) -> Option<(Identity, Trace)> {
    let head = buf.get(..8 + 48)?;
    if &head[..8] != MAGIC {
        return None;
    }
    // The checksum first: nothing of a damaged trace is read.
    let (buf, sum) = buf.split_at(buf.len().checked_sub(SUM_LEN)?);
    if buf.len() < 56 || xxhash_rust::xxh3::xxh3_64(buf).to_le_bytes() != sum {
        return None;
    }
    let w = |k: usize| u64::from_le_bytes(head[8 + 8 * k..16 + 8 * k].try_into().unwrap());
    let id = Identity {
        folio: w(0),
        offset: w(1),
        len: w(2),
        file_len: w(3),
        mtime_ns: w(4),
        ino: w(5),
    };
    let mut at = 56;
    let n = get_varint(buf, &mut at)? as usize;
    // Each entry takes a byte at least: a count the bytes left cannot hold
    // is damage, refused before its table is reserved (a 57-byte file
    // had reserved 128 MiB; found by fuzz/fuzz_targets/trace.rs).
    if n > MAX_ENTRIES || n > buf.len() - at {
        return None;
    }
    let nfolios = id.len.div_ceil(id.folio.max(1));
    let mut order = Vec::with_capacity(n);
    let mut prev = 0i64;
    for _ in 0..n {
        let z = get_varint(buf, &mut at)?;
        let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
        prev = prev.checked_add(d)?;
        if prev < 0 || prev as u64 >= nfolios {
            return None;
        }
        order.push(prev as usize);
    }
    let m = get_varint(buf, &mut at)? as usize;
    if m > n / MARK_EVERY + 1 || m > buf.len() - at {
        return None;
    }
    let mut marks_ms = Vec::with_capacity(m);
    let mut t = 0u64;
    for _ in 0..m {
        t = t.saturating_add(get_varint(buf, &mut at)?);
        marks_ms.push(t);
    }
    (at == buf.len()).then_some((id, Trace { order, marks_ms }))
}

/// For the fuzz targets (fuzz/, docs/fuzzing.md) only: [`decode`] of a
/// trace file's bytes, as (the six header words: folio, offset, len,
/// file_len, mtime_ns, ino; the folio indices; the time marks).
#[doc(hidden)]
pub fn decode_trace_for_fuzz(buf: &[u8]) -> Option<([u64; 6], Vec<usize>, Vec<u64>)> {
    decode(buf).map(|(id, t)| (id.words(), t.order, t.marks_ms))
}

/// For the fuzz targets only: `body` followed by its checksum, as
/// [`encode`] ends a trace, so that a fuzzer's bytes reach the decoder
/// past the checksum.
#[doc(hidden)]
pub fn seal_trace_for_fuzz(body: &[u8]) -> Vec<u8> {
    let mut v = body.to_vec();
    v.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
    v
}

/// For the fuzz targets only: [`encode`] of what
/// [`decode_trace_for_fuzz`] returns.
#[doc(hidden)]
pub fn encode_trace_for_fuzz(words: [u64; 6], order: Vec<usize>, marks_ms: Vec<u64>) -> Vec<u8> {
    let [folio, offset, len, file_len, mtime_ns, ino] = words;
    let id = Identity {
        folio,
        offset,
        len,
        file_len,
        mtime_ns,
        ino,
    };
    encode(&id, &Trace { order, marks_ms })
}

/// The trace file of the data file `path`.
pub fn trace_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(TRACE_SUFFIX);
    PathBuf::from(p)
}

/// What a trace file holds ([`trace_info`]), for a person asking why a map
/// did or did not replay (`upager trace FILE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceInfo {
    /// Folios recorded.
    pub folios: usize,
    /// The recorded region: folio size, offset in the file, length.
    pub folio: u64,
    /// See [`TraceInfo::folio`].
    pub offset: u64,
    /// See [`TraceInfo::folio`].
    pub len: u64,
    /// From the first entry's time mark to the last one's (ms).
    pub span_ms: u64,
    /// Size of the trace file.
    pub bytes: u64,
    /// Whether the file is as it was when the trace was written (so a map
    /// of that region replays it), or what changed.
    pub matches: Result<(), String>,
}

/// The trace beside the data file `file` ([`trace_path`]): None if there is
/// none; an `InvalidData` error if it is not a trace.
pub fn trace_info(file: &Path) -> io::Result<Option<TraceInfo>> {
    let home = Home::File(file.to_path_buf());
    let Some(bytes) = home.load()? else {
        return Ok(None);
    };
    let (id, t) = decode(&bytes).ok_or_else(|| {
        let why = if bytes.starts_with(MAGIC_1) {
            "a trace of format 1 (before checksums), which this version does not read: the next map records a new one"
        } else if bytes.starts_with(MAGIC) {
            "damaged: its checksum does not match, or its entries do not decode"
        } else {
            "not a trace (damaged?)"
        };
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {why}", trace_path(file).display()),
        )
    })?;
    let now = Identity::of(&home, id.folio, id.offset, id.len)?;
    let matches = if now == id {
        Ok(())
    } else if now.ino != id.ino {
        Err("the file was replaced (another inode)".to_string())
    } else if now.file_len != id.file_len {
        Err(format!(
            "the file's size changed ({} bytes, was {})",
            now.file_len, id.file_len
        ))
    } else {
        Err("the file was modified since (mtime)".to_string())
    };
    Ok(Some(TraceInfo {
        folios: t.order.len(),
        folio: id.folio,
        offset: id.offset,
        len: id.len,
        span_ms: t.marks_ms.last().copied().unwrap_or(0),
        bytes: bytes.len() as u64,
        matches,
    }))
}

/// Writes `bytes` to `path` by a temporary file in the same directory and
/// a rename: a reader sees the old trace or the new one, whole.
fn write_trace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            folio: 4096,
            offset: 0,
            len: 1 << 30,
            file_len: 1 << 30,
            mtime_ns: 7,
            ino: 9,
        }
    }

    #[test]
    fn a_trace_decodes_to_what_was_encoded_and_damage_is_refused() {
        let t = Trace {
            order: vec![5, 6, 7, 1000, 3, 262_143, 0],
            marks_ms: vec![0],
        };
        let bytes = encode(&id(), &t);
        assert_eq!(decode(&bytes), Some((id(), t.clone())));
        // Deltas are small: 7 entries in a few bytes each.
        assert!(
            bytes.len() < 56 + 2 + 7 * 3 + 2 + SUM_LEN,
            "{} bytes",
            bytes.len()
        );
        for cut in [0, 8, 55, 57, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        // Cut or lengthened under a checksum that matches: the entries
        // themselves are checked too.
        let body = &bytes[..bytes.len() - SUM_LEN];
        for cut in [56, 57, body.len() - 1] {
            assert_eq!(decode(&sealed(body[..cut].to_vec())), None, "cut at {cut}");
        }
        let mut longer = body.to_vec();
        longer.push(0);
        assert_eq!(decode(&sealed(longer)), None, "trailing bytes");
        let mut wrong = bytes.clone();
        wrong[0] = b'X';
        assert_eq!(decode(&wrong), None, "magic");
        // An index beyond the region is damage, not a folio to read.
        let beyond = Trace {
            order: vec![1 << 20],
            marks_ms: vec![0],
        };
        assert_eq!(
            decode(&encode(&Identity { len: 4096, ..id() }, &beyond)),
            None
        );
    }

    #[test]
    fn a_flipped_bit_anywhere_is_refused_and_a_format_1_trace_is_not_misread() {
        let t = Trace {
            order: (0..1000).rev().collect(),
            marks_ms: vec![0, 3, 9, 12],
        };
        let bytes = encode(&id(), &t);
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode(&b), None, "bit {bit}");
        }
        // Format 1: the same bytes without the checksum, under UPGTRC01.
        let mut old = bytes[..bytes.len() - SUM_LEN].to_vec();
        old[..8].copy_from_slice(MAGIC_1);
        assert_eq!(decode(&old), None);
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d.bin");
        std::fs::write(&data, b"x").unwrap();
        std::fs::write(trace_path(&data), &old).unwrap();
        let e = trace_info(&data).unwrap_err();
        assert!(e.to_string().contains("format 1"), "{e}");
    }

    /// A trace's bytes with a correct checksum (for damage past it).
    fn sealed(mut b: Vec<u8>) -> Vec<u8> {
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    #[test]
    fn a_count_of_entries_the_bytes_cannot_hold_is_refused_unreserved() {
        // The header and a count of MAX_ENTRIES, and nothing after: the
        // decoder refused it only after reserving the count's table.
        let mut bytes = encode(
            &id(),
            &Trace {
                order: vec![],
                marks_ms: vec![],
            },
        );
        bytes.truncate(56);
        put_varint(&mut bytes, MAX_ENTRIES as u64);
        assert_eq!(decode(&sealed(bytes)), None);
        // One byte per entry is the least: exactly that many decode.
        let t = Trace {
            order: (0..300).collect(),
            marks_ms: vec![0, 1],
        };
        let bytes = encode(&id(), &t);
        assert_eq!(decode(&bytes), Some((id(), t)));
    }
}
