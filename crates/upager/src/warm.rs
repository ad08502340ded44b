//! Warm starts: the order a file region's folios are first needed, recorded
//! beside the file, and replayed as prefetch the next time it is mapped
//! (REAP, ASPLOS '21, for function snapshots; here for any file region).
//!
//! Record ([`WarmStart::Record`], or [`WarmStart::Auto`] without a usable
//! trace): each folio's first fill — by a fault, its readahead window, a
//! prefetch — appends the folio's index to the region's trace. A set-once
//! bit per folio (`fetch_or`) and slots of a preallocated table, one
//! `fetch_add` for a fill's new folios (consecutive entries: two threads'
//! fills do not interleave folio by folio): lock-free, no allocation (a
//! SIGBUS handler records its fills), bounded ([`MAX_ENTRIES`]). A time mark (ms since the map) every
//! [`MARK_EVERY`] entries. When the region is unmapped, after its flush,
//! the trace is written beside the file as `<file>.upager-trace`:
//! delta-encoded indices (zigzag varints), the marks, and a header tying
//! it to the data — the region's folio, offset and length, and the file's
//! size, mtime and inode as they are then. Written to a temporary file and
//! renamed (a reader never sees half a trace); a failure is logged, never
//! an error of the unmap.
//!
//! Replay ([`WarmStart::Auto`] with a trace whose header matches the file
//! now; a stale one is ignored with a log line and a new one recorded):
//! the prefetch thread reads the folios in recorded order, a window at a
//! time (a sixteenth of the budget at first, doubling each time the
//! program faults on a folio replay had not read yet, up to a quarter, 1-64
//! MiB), through the pipeline every read ahead takes
//! (ahead.rs: many reads in one `Store::read_batch`, each folio's budget
//! charged first, at most one batch of reclaim per batch). Pacing is the
//! kernel's PG_readahead marker: one folio in the middle of each window is
//! left unread, and the program's fault on it asks for the next window —
//! so replay runs at most a window and a half ahead of the program, never
//! further than its budget allows, and stops by itself when the program
//! goes elsewhere (it never reaches the marker). Faults on folios the trace
//! does not hold, or holds more than a window away from where replay is
//! (a program on other inputs that shares some folios with the trace),
//! count as unpredicted and do not move replay on; when they outnumber the
//! predicted ones four to one (after [`DIVERGED_MIN`]), replay stops and
//! says so. A replaying region records the program's own fills aside
//! (not replay's: `Ctx::replaying`), and when replay stopped that record
//! replaces the trace at unmap: the next map replays this run's order.
//! From a store whose reads are not round trips (a local file:
//! `Store::round_trips` false), the trace's sequential runs of at least a
//! readahead window (of 16 folios or more) are left to readahead: replay
//! does not read them,
//! the program's faults stream them as on demand (the faulting thread and
//! the prefetch thread reading side by side), and their places still pace
//! replay. One replay thread reading everything had left the program
//! waiting on it with a CPU idle: 0.81-0.83x of on demand for a model's
//! layers; 1.06-1.08x with the runs left to readahead (docs/benchmarks.md).
//!
//! What "used" means here: userfaultfd does not see a read of an installed
//! page, so a replayed folio counts as a hit (`replay_hits`) once the
//! program's faults have passed its place in the trace, and as wasted
//! (`replay_wasted`) if it is evicted before that. Folios still resident
//! past the program's last fault when the region goes count as neither.
//!
//! Counters: `replay_reads` (folios replay read), `replay_hits`,
//! `replay_wasted`.
//!
//! Lock order: none (atomics; the prefetch thread alone steps a replay).
//!
//! Uses: none (the fill, the prefetch thread and the region's teardown
//! call it).

use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Instant;

use upager_sys::mem::AtomicTable;

use crate::config::WarmStart;
use crate::store::Store;

/// Most entries a trace holds (the first folios needed; 16 Mi folios of
/// 4 KiB is 64 GiB of data).
pub(crate) const MAX_ENTRIES: usize = 1 << 24;
/// Folios recorded as one group of consecutive entries, at most (a
/// readahead window of 4 KiB folios is 512 at the default 2 MiB).
const RECORD_CHUNK: usize = 1024;
/// A time mark every this many entries.
const MARK_EVERY: usize = 256;
/// Unpredicted faults before replay may judge the program diverged.
const DIVERGED_MIN: u64 = 64;
/// The trace file's first bytes (format version 1).
const MAGIC: &[u8; 8] = b"UPGTRC01";
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
    fn describe(&self) -> String {
        match self {
            Home::File(f) => trace_path(f).display().to_string(),
            Home::Store(s) => format!("the trace of {}", s.describe()),
        }
    }
    fn load(&self) -> io::Result<Option<Vec<u8>>> {
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
    fn save(&self, bytes: &[u8]) -> io::Result<()> {
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
    fn of(home: &Home, folio: u64, offset: u64, len: u64) -> io::Result<Identity> {
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
    fn words(&self) -> [u64; 6] {
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
    out
}

/// Decodes a trace file's bytes: its identity and trace (None: not a
/// trace, or a damaged one).
pub(crate) fn decode(buf: &[u8]) -> Option<(Identity, Trace)> {
    let head = buf.get(..8 + 48)?;
    if &head[..8] != MAGIC {
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
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a trace (damaged?)", trace_path(file).display()),
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

/// A region's warm start: where its trace lives and what it does with it.
pub(crate) struct Warm {
    home: Home,
    folio: u64,
    offset: u64,
    len: u64,
    job: Job,
    /// A replaying region's record of the program's own fills (not
    /// replay's): saved instead of the replayed trace if the program left
    /// it (replay stopped), so the next map replays what this run needed.
    standby: Option<Recorder>,
}

/// Recording a trace, or replaying one.
pub(crate) enum Job {
    Record(Recorder),
    Replay(Replayer),
}

impl Warm {
    /// The warm start of a region `(folio, offset, len)` of the data in
    /// `home`, as `how` asks: a replay of the trace kept there if it is
    /// usable, else a recording.
    pub(crate) fn open(
        how: WarmStart,
        home: Home,
        folio: u64,
        offset: u64,
        len: u64,
        nfolios: usize,
        window_bytes: u64,
    ) -> io::Result<Warm> {
        let trace = home.describe();
        let mut job = None;
        if how == WarmStart::Auto {
            let now = Identity::of(&home, folio, offset, len)?;
            match home.load().map(|b| b.map(|b| decode(&b))) {
                Ok(Some(Some((id, t)))) if id == now => {
                    log::debug!(
                        "{trace}: replaying {} folios in recorded order",
                        t.order.len()
                    );
                    let max = (window_bytes / folio).max(4) as usize;
                    job = Some(Job::Replay(Replayer::new(t.order, nfolios, max / 4, max)?));
                }
                Ok(Some(Some(_))) => log::info!(
                    "{trace}: the trace is stale (the data or the region changed since it was \
                     recorded): not replayed; recording a new one"
                ),
                Ok(Some(None)) => {
                    log::info!("{trace}: not a trace (damaged?): recording a new one")
                }
                Ok(None) => {}
                Err(e) => log::info!("{trace}: cannot read the trace ({e}): recording a new one"),
            }
        }
        let (job, standby) = match job {
            Some(j) => (j, Some(Recorder::new(nfolios)?)),
            None => (Job::Record(Recorder::new(nfolios)?), None),
        };
        Ok(Warm {
            home,
            folio,
            offset,
            len,
            job,
            standby,
        })
    }

    /// Folios `idx .. idx + n` were filled (a fault, its readahead, a
    /// prefetch; `by_replay`: a replay's batch). A recording region records
    /// them; a replaying one records the program's own fills aside
    /// (`standby`). Async-signal-safe.
    pub(crate) fn filled(&self, idx: usize, n: usize, by_replay: bool) {
        let rec = match (&self.job, &self.standby) {
            (Job::Record(rec), _) => rec,
            (Job::Replay(_), Some(rec)) if !by_replay => rec,
            _ => return,
        };
        let mut k = idx;
        while k < idx + n {
            let m = (idx + n - k).min(RECORD_CHUNK);
            rec.record_run(k, m);
            k += m;
        }
    }

    /// A replay leaves the trace's sequential runs of at least `min`
    /// folios to readahead ([`Replayer::leave_runs_to_readahead`]).
    pub(crate) fn leave_runs_to_readahead(mut self, min: usize) -> Warm {
        if let Job::Replay(rp) = &mut self.job {
            rp.leave_runs_to_readahead(min);
        }
        self
    }

    /// The replay, if this region replays a trace.
    pub(crate) fn replay(&self) -> Option<&Replayer> {
        match &self.job {
            Job::Replay(rp) => Some(rp),
            Job::Record(_) => None,
        }
    }

    /// Folio `idx` is being evicted: whether it counts as replay wasted.
    pub(crate) fn evicted(&self, idx: usize) -> bool {
        self.replay().is_some_and(|rp| rp.on_evict(idx))
    }

    /// A fault (not a prefetch) filled folio `idx`: whether a replay asks
    /// the prefetch thread for its next window. Async-signal-safe.
    pub(crate) fn wants_next(&self, idx: usize) -> bool {
        self.replay().is_some_and(|rp| rp.on_fault(idx))
    }

    /// Writes the recorded trace beside the file. A replaying region keeps
    /// the trace it replayed, unless the program left it (replay stopped):
    /// then the program's own fills of this run (`standby`) replace it, so
    /// a program now on other inputs does not replay and stop at every
    /// map. (Folios replay read that the program then used before it left
    /// are not in that record: at most replay's first windows.) Logs a
    /// failure.
    pub(crate) fn save(&self) {
        let rec = match (&self.job, &self.standby) {
            (Job::Record(rec), _) => rec,
            (Job::Replay(rp), Some(rec)) if rp.left() => rec,
            _ => return,
        };
        let t = rec.trace();
        if t.order.is_empty() {
            return;
        }
        if matches!(self.job, Job::Replay(_)) {
            log::info!(
                "{}: the program left the replayed trace: recorded anew from this run's faults \
                 ({} folios)",
                self.home.describe(),
                t.order.len()
            );
        }
        let r = Identity::of(&self.home, self.folio, self.offset, self.len)
            .and_then(|id| self.home.save(&encode(&id, &t)));
        let trace = self.home.describe();
        match r {
            Ok(()) => log::debug!("{trace}: {} folios recorded", t.order.len()),
            Err(e) => log::warn!(
                "{trace}: the warm-start trace could not be written ({e}); the next map starts cold"
            ),
        }
    }
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

/// The trace being recorded: lock-free, preallocated, async-signal-safe.
pub(crate) struct Recorder {
    /// One bit per folio: recorded already.
    seen: AtomicTable,
    /// Entry `k`: folio index + 1 (0: a recorder took the slot and has not
    /// written it yet, or never will: skipped).
    order: AtomicTable,
    next: AtomicUsize,
    marks: AtomicTable,
    t0: Instant,
}

impl Recorder {
    fn new(nfolios: usize) -> io::Result<Recorder> {
        let cap = nfolios.min(MAX_ENTRIES);
        Ok(Recorder {
            seen: AtomicTable::zeroed(nfolios.div_ceil(64))?,
            order: AtomicTable::zeroed(cap)?,
            next: AtomicUsize::new(0),
            marks: AtomicTable::zeroed(cap / MARK_EVERY + 1)?,
            t0: Instant::now(),
        })
    }

    #[cfg(test)]
    fn record(&self, idx: usize) {
        self.record_run(idx, 1);
    }

    /// Records the folios of `idx .. idx + n` (at most [`RECORD_CHUNK`],
    /// one fill's) filled for the first time, as consecutive entries: one
    /// `fetch_add` for the lot, so that fills recorded at the same moment
    /// by two threads (a fault's window and the prefetch thread's next
    /// one) do not interleave folio by folio, and a readahead window stays
    /// one sequential run of the trace (replay from a local file leaves
    /// those to readahead: `leave_runs_to_readahead`).
    fn record_run(&self, idx: usize, n: usize) {
        debug_assert!(n <= RECORD_CHUNK);
        let n = n.min(RECORD_CHUNK); // (a SIGBUS handler must not panic)
        let mut new = [0u64; RECORD_CHUNK / 64];
        let mut count = 0;
        for j in 0..n {
            let f = idx + j;
            let bit = 1u64 << (f % 64);
            let Some(word) = self.seen.get(f / 64) else {
                break;
            };
            if word.fetch_or(bit, AcqRel) & bit == 0 {
                new[j / 64] |= 1 << (j % 64);
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let first = self.next.fetch_add(count, Relaxed);
        let fresh = (0..n).filter(|&j| new[j / 64] & (1 << (j % 64)) != 0);
        for (k, j) in (first..).zip(fresh) {
            let Some(slot) = self.order.get(k) else {
                return; // full: the trace keeps the first MAX_ENTRIES
            };
            slot.store((idx + j) as u64 + 1, Release);
            if k.is_multiple_of(MARK_EVERY) {
                if let Some(m) = self.marks.get(k / MARK_EVERY) {
                    m.store(self.t0.elapsed().as_millis() as u64, Relaxed);
                }
            }
        }
    }

    /// The entries recorded so far.
    pub(crate) fn trace(&self) -> Trace {
        let n = self.next.load(Acquire).min(self.order.len());
        let order: Vec<usize> = self.order[..n]
            .iter()
            .map(|w| w.load(Acquire))
            .filter(|&v| v != 0)
            .map(|v| v as usize - 1)
            .collect();
        let marks_ms = self.marks[..order.len().div_ceil(MARK_EVERY).min(self.marks.len())]
            .iter()
            .map(|w| w.load(Relaxed))
            .collect();
        Trace { order, marks_ms }
    }
}

/// A trace being replayed: the prefetch thread reads a window at a time; a
/// fault on the window's marker asks for the next one.
pub(crate) struct Replayer {
    order: Vec<usize>,
    /// Per folio: its first place in `order` + 1 (0: not in the trace).
    place: AtomicTable,
    /// Per place, one bit: replay read that folio.
    replayed: AtomicTable,
    /// Per place, one bit: left to readahead (a long sequential run of a
    /// store whose reads are not round trips: `leave_runs_to_readahead`).
    streamed: Option<AtomicTable>,
    /// Places handed to the prefetch path so far.
    issued: AtomicUsize,
    /// The place + 1 of the folio left unread in the last window: a fault
    /// there or beyond asks for the next window (at first 0: the
    /// program's first predicted fault).
    marker: AtomicUsize,
    /// One past the furthest place the program faulted at.
    reached: AtomicUsize,
    /// Places below this were counted as hits.
    counted: AtomicUsize,
    /// Places per window: starts at a quarter of `max_window` and doubles
    /// each time the program faults on a place replay had not read yet
    /// (it was late), as readahead's window grows.
    window: AtomicUsize,
    max_window: usize,
    predicted: AtomicU64,
    unpredicted: AtomicU64,
    stopped: AtomicBool,
}

/// Streams followed at once ([`long_streams`]).
const STREAMS: usize = 8;
/// Largest step (folios) from one folio of a stream to its next.
const STREAM_GAP: usize = 32;

/// A stream [`long_streams`] follows.
struct Stream {
    /// Its last folio, and that entry's position in the trace.
    last: usize,
    at: usize,
    /// Its entries' positions while it is shorter than `min`; empty once
    /// it is long (they were marked, and so is every entry after).
    short: Vec<u32>,
}

/// Calls `mark` with the position of every entry of `order` that belongs
/// to a stream of at least `min` entries. An entry continues the most
/// recently continued of the [`STREAMS`] latest streams that ended at most
/// [`STREAM_GAP`] folios before it, else starts a new stream (replacing
/// the least recently continued, which ends there). Memory: at most `min`
/// positions per stream followed, whatever the trace's length.
fn long_streams(order: &[usize], min: usize, mut mark: impl FnMut(usize)) {
    let min = min.max(2);
    let mut live: Vec<Stream> = Vec::with_capacity(STREAMS);
    for (p, &idx) in order.iter().enumerate() {
        let cont = live
            .iter_mut()
            .filter(|s| idx > s.last && idx - s.last <= STREAM_GAP)
            .max_by_key(|s| s.at);
        match cont {
            Some(s) => {
                (s.last, s.at) = (idx, p);
                if s.short.is_empty() {
                    mark(p); // long already
                } else {
                    s.short.push(p as u32);
                    if s.short.len() >= min {
                        s.short.drain(..).for_each(|q| mark(q as usize));
                    }
                }
            }
            // A new stream: in a free slot, else in the least recently
            // continued one's (its buffer reused: a scattered trace starts
            // a stream per entry, and allocates nothing for it).
            None => {
                if live.len() < STREAMS {
                    live.push(Stream {
                        last: idx,
                        at: p,
                        short: vec![p as u32],
                    });
                } else if let Some(lru) = live.iter_mut().min_by_key(|s| s.at) {
                    (lru.last, lru.at) = (idx, p);
                    lru.short.clear();
                    lru.short.push(p as u32);
                }
            }
        }
    }
}

impl Replayer {
    fn new(
        order: Vec<usize>,
        nfolios: usize,
        window: usize,
        max_window: usize,
    ) -> io::Result<Replayer> {
        let place = AtomicTable::zeroed(nfolios)?;
        for (p, &idx) in order.iter().enumerate() {
            if let Some(w) = place.get(idx) {
                if w.load(Relaxed) == 0 {
                    w.store(p as u64 + 1, Relaxed);
                }
            }
        }
        Ok(Replayer {
            replayed: AtomicTable::zeroed(order.len().div_ceil(64).max(1))?,
            streamed: None,
            order,
            place,
            issued: AtomicUsize::new(0),
            marker: AtomicUsize::new(0),
            reached: AtomicUsize::new(0),
            counted: AtomicUsize::new(0),
            window: AtomicUsize::new(window.clamp(2, max_window.max(2))),
            max_window: max_window.max(2),
            predicted: AtomicU64::new(0),
            unpredicted: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        })
    }

    /// Leaves every sequential stream of at least `min` folios in the
    /// trace to readahead: replay does not read it (the program's faults
    /// stream it, the faulting thread and the prefetch thread reading
    /// windows side by side), but its places still pace replay. For stores
    /// whose reads are not round trips (a local file): there a fault that
    /// streams costs little more than replay's read of the same bytes,
    /// and one replay thread reading everything left the program waiting
    /// on it with a CPU idle (measured: model from a file, 0.83-0.87x of
    /// on demand; docs/benchmarks.md).
    ///
    /// A stream is what readahead would see: folios in ascending order,
    /// each at most [`STREAM_GAP`] folios past the one before (the folios
    /// between were needed earlier), interleaved in the trace with others
    /// ([`STREAMS`] followed at once: threads of the program each
    /// streaming their part, as an OpenMP loop's static schedule does:
    /// UMap's bfs; measured there, steps of up to 32 folios left to
    /// readahead made replay 1.18x of on demand where 8 gave 0.90x,
    /// docs/benchmarks.md).
    fn leave_runs_to_readahead(&mut self, min: usize) {
        let Ok(bits) = AtomicTable::zeroed(self.order.len().div_ceil(64).max(1)) else {
            return; // no memory for the bits: replay reads everything
        };
        long_streams(&self.order, min, |q| {
            if let Some(w) = bits.get(q / 64) {
                w.fetch_or(1 << (q % 64), Relaxed);
            }
        });
        self.streamed = Some(bits);
    }

    fn is_streamed(&self, place: usize) -> bool {
        self.streamed.as_ref().is_some_and(|b| {
            b.get(place / 64)
                .is_some_and(|w| w.load(Relaxed) & (1 << (place % 64)) != 0)
        })
    }

    /// The program faulted on folio `idx` (not a prefetch): whether to ask
    /// the prefetch thread for the next window. Async-signal-safe.
    pub(crate) fn on_fault(&self, idx: usize) -> bool {
        if self.stopped.load(Relaxed) {
            return false;
        }
        let p = self.place.get(idx).map_or(0, |w| w.load(Relaxed)) as usize;
        // In step: at most a window behind the marker or ahead of what was
        // issued. A fault elsewhere in the trace (a program on other inputs
        // that shares some folios with it) is not progress through it.
        let issued = self.issued.load(Acquire);
        let marker = self.marker.load(Acquire);
        let window = self.window.load(Relaxed);
        if p == 0 || p + window < marker || p > issued + window {
            self.unpredicted.fetch_add(1, Relaxed);
            return false;
        }
        self.predicted.fetch_add(1, Relaxed);
        self.reached.fetch_max(p, Relaxed);
        if p != marker && p > 1 {
            // A place replay should have read by now: it was late.
            self.window
                .store((window * 2).min(self.max_window), Relaxed);
        }
        p >= marker && issued < self.order.len()
    }

    /// Whether the program left the trace: replay stopped for it, or
    /// would at its next window (the program may never ask for one).
    pub(crate) fn left(&self) -> bool {
        self.stopped.load(Relaxed) || self.diverged()
    }

    /// Whether the program went elsewhere: faults off the trace, or out of
    /// step with it, outnumber those in step four to one.
    fn diverged(&self) -> bool {
        let u = self.unpredicted.load(Relaxed);
        u >= DIVERGED_MIN && u > 4 * self.predicted.load(Relaxed)
    }

    /// The next window, for the prefetch thread: runs of consecutive folios
    /// in recorded order (the marker left out), or None when the trace is
    /// done or replay stopped. Moves the marker.
    pub(crate) fn next_window(&self) -> Option<Vec<std::ops::Range<usize>>> {
        if self.stopped.load(Relaxed) {
            return None;
        }
        if self.diverged() {
            self.stopped.store(true, Relaxed);
            log::info!(
                "warm start: the program's faults left the recorded trace ({} unpredicted, {} \
                 predicted): replay stopped",
                self.unpredicted.load(Relaxed),
                self.predicted.load(Relaxed)
            );
            return None;
        }
        let start = self.issued.load(Acquire);
        let end = (start + self.window.load(Relaxed)).min(self.order.len());
        if start >= end {
            return None;
        }
        let marker = start + (end - start) / 2;
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for (p, &idx) in self.order[start..end].iter().enumerate() {
            if start + p == marker && end < self.order.len() {
                continue; // left for the program's fault (the last window has none)
            }
            if self.is_streamed(start + p) {
                continue; // readahead's
            }
            match runs.last_mut() {
                Some(r) if r.end == idx => r.end += 1,
                _ => runs.push(idx..idx + 1),
            }
        }
        self.issued.store(end, Release);
        self.marker.store(marker + 1, Release);
        Some(runs)
    }

    /// Replay read folio `idx`.
    pub(crate) fn read_one(&self, idx: usize) {
        let p = self.place.get(idx).map_or(0, |w| w.load(Relaxed)) as usize;
        if p > 0 {
            if let Some(w) = self.replayed.get((p - 1) / 64) {
                w.fetch_or(1 << ((p - 1) % 64), Relaxed);
            }
        }
    }

    /// Replayed folios the program has passed since the last call (hits).
    pub(crate) fn take_hits(&self) -> u64 {
        let upto = self.reached.load(Relaxed).min(self.order.len());
        let from = self.counted.fetch_max(upto, AcqRel);
        self.count_replayed(from, upto)
    }

    /// Folio `idx` is being evicted: whether replay read it and the
    /// program had not reached its place (wasted: read for nothing, at
    /// least this time). Async-signal-safe.
    pub(crate) fn on_evict(&self, idx: usize) -> bool {
        let p = self.place.get(idx).map_or(0, |w| w.load(Relaxed)) as usize;
        if p == 0 || p <= self.reached.load(Relaxed) {
            return false;
        }
        let bit = 1u64 << ((p - 1) % 64);
        self.replayed
            .get((p - 1) / 64)
            .is_some_and(|w| w.fetch_and(!bit, Relaxed) & bit != 0)
    }

    fn count_replayed(&self, from: usize, to: usize) -> u64 {
        (from..to)
            .filter(|&p| {
                self.replayed
                    .get(p / 64)
                    .is_some_and(|w| w.load(Relaxed) & (1 << (p % 64)) != 0)
            })
            .count() as u64
    }
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
        assert!(bytes.len() < 56 + 2 + 7 * 3 + 2, "{} bytes", bytes.len());
        for cut in [0, 8, 55, 57, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None, "trailing bytes");
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
        assert_eq!(decode(&bytes), None);
        // One byte per entry is the least: exactly that many decode.
        let t = Trace {
            order: (0..300).collect(),
            marks_ms: vec![0, 1],
        };
        let bytes = encode(&id(), &t);
        assert_eq!(decode(&bytes), Some((id(), t)));
    }

    #[test]
    fn a_fill_is_recorded_as_consecutive_entries_of_its_new_folios() {
        let rec = Recorder::new(4000).unwrap();
        rec.record(5);
        rec.record_run(3, 4); // 3, 4, 6 new; 5 seen
        rec.record_run(2000, 1024);
        rec.record_run(2000, 10); // all seen
        let order = rec.trace().order;
        assert_eq!(&order[..4], &[5, 3, 4, 6]);
        assert_eq!(&order[4..], &(2000..3024).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn a_recorder_keeps_first_fills_once_in_order() {
        let rec = Recorder::new(100).unwrap();
        for idx in [3, 4, 3, 99, 0, 4, 50] {
            rec.record(idx);
        }
        assert_eq!(rec.trace().order, vec![3, 4, 99, 0, 50]);
        assert_eq!(rec.trace().marks_ms.len(), 1);
    }

    #[test]
    fn replay_windows_follow_the_trace_leave_a_marker_and_stop_on_divergence() {
        let order: Vec<usize> = vec![10, 11, 12, 13, 40, 41, 2, 3, 90, 91];
        let r = Replayer::new(order, 100, 4, 4).unwrap();
        // First window: places 0..4 with place 2 (folio 12) left unread.
        assert_eq!(r.next_window(), Some(vec![10..12, 13..14]));
        assert!(!r.on_fault(11), "before the marker");
        assert!(r.on_fault(12), "the marker asks for the next window");
        assert_eq!(r.next_window(), Some(vec![40..42, 3..4]));
        // The last window has no marker.
        assert!(r.on_fault(2));
        let last = vec![std::ops::Range { start: 90, end: 92 }];
        assert_eq!(r.next_window(), Some(last));
        assert_eq!(r.next_window(), None);
        for idx in [10, 11, 13, 40, 90] {
            r.read_one(idx);
        }
        assert!(!r.on_evict(40), "reached: not wasted");
        assert!(r.on_evict(90), "evicted before the program got there");
        assert!(!r.on_evict(90), "counted once");
        assert_eq!(
            r.take_hits(),
            4,
            "places 0, 1, 3, 4 are below the furthest fault"
        );
        assert_eq!(r.take_hits(), 0, "counted once");

        let d = Replayer::new((0..1000).collect(), 2000, 8, 8).unwrap();
        assert!(d.next_window().is_some());
        assert!(!d.on_fault(500), "far ahead of the replay: out of step");
        assert_eq!(d.reached.load(Relaxed), 0, "and no progress");
        assert!(d.on_fault(9), "in step, past the marker");
        assert!(!d.left());
        for idx in 1000..1000 + DIVERGED_MIN as usize {
            assert!(!d.on_fault(idx));
        }
        assert!(d.left(), "left before any window said so");
        assert_eq!(d.next_window(), None, "diverged: replay stops");
        assert!(d.left());
    }

    #[test]
    fn long_runs_are_left_to_readahead_and_still_pace_replay() {
        // A run of 6 (places 1..7), scattered folios, a run of 3.
        let order: Vec<usize> = vec![50, 10, 11, 12, 13, 14, 15, 90, 130, 131, 132];
        let mut r = Replayer::new(order, 100, 11, 11).unwrap();
        r.leave_runs_to_readahead(4);
        // One window of everything (no marker in the last): the run of 6
        // is readahead's, the run of 3 is read.
        assert_eq!(r.next_window(), Some(vec![50..51, 90..91, 130..133]));
        let mut r = Replayer::new(vec![1, 2, 3, 4, 99, 77, 55], 100, 4, 4).unwrap();
        r.leave_runs_to_readahead(4);
        // Window 0..4, marker place 2 (folio 3): all streamed, nothing
        // read; a fault in the run still asks for the next window.
        assert_eq!(r.next_window(), Some(vec![]));
        assert!(r.on_fault(3), "the marker, in a streamed run");
        assert_eq!(r.next_window(), Some(vec![99..100, 77..78, 55..56]));
    }

    #[test]
    fn streams_interleaved_by_threads_are_told_apart() {
        let marked = |order: &[usize], min: usize| {
            let mut v = Vec::new();
            long_streams(order, min, |q| v.push(q));
            v.sort_unstable();
            v
        };
        // Two threads streaming their halves (one with a gap of 3: folios
        // needed earlier), their windows interleaved in the trace, and
        // scattered folios between: the stream of 8 entries is long, the
        // one of 4 and the lone folios are not.
        let order = vec![0, 1, 2, 500, 501, 3, 4, 900, 502, 7, 8, 503, 80, 9];
        assert_eq!(marked(&order, 5), vec![0, 1, 2, 5, 6, 9, 10, 13]);
        assert_eq!(
            marked(&order, 4),
            vec![0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 13]
        );
        let mut r = Replayer::new(order, 1000, 14, 14).unwrap();
        r.leave_runs_to_readahead(5);
        assert_eq!(
            r.next_window(),
            Some(vec![500..502, 900..901, 502..504, 80..81])
        );
        // Past STREAMS live streams the oldest is forgotten: a stream that
        // comes back after 8 others is a new one.
        let mut order: Vec<usize> = vec![0];
        order.extend((1..=STREAMS).map(|k| k * 1000));
        order.push(1);
        assert_eq!(marked(&order, 2), Vec::<usize>::new());
        order.insert(STREAMS, 1); // back before the eighth other one
        assert_eq!(marked(&order, 2), vec![0, STREAMS]);
        // Descending and far steps start new streams.
        assert_eq!(marked(&[10, 9, 60, 61], 2), vec![2, 3]);
        // Steps up to STREAM_GAP continue a stream, longer ones do not.
        assert_eq!(marked(&[0, STREAM_GAP, STREAM_GAP * 3], 2), vec![0, 1]);
    }
}
