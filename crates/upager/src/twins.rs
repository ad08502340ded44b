//! Several writers of one file: twins and diffs (TreadMarks, Keleher et
//! al., "TreadMarks: Distributed Shared Memory on Standard Workstations and
//! Operating Systems", USENIX Winter 1994).
//!
//! A region writes back whole folios from its own copy. When two writable
//! regions map one file (in one pager, in two pagers or in two processes),
//! region A's write-back of a folio would put back, from A's stale copy,
//! the bytes region B wrote and flushed. So, once a file is mapped writable
//! more than once:
//!
//! ```text
//!   first write to a CLEAN folio (write-protect fault)
//!     1) budget += folio            (the twin is charged like a folio)
//!     2) twin = copy of the folio   (still write-protected: stable)
//!     3) unprotect, DIRTY           (as without twins)
//!   write-back of a DIRTY folio with a twin (gather.rs, step 3)
//!     1) diff = bytes where view != twin   (none: nothing is written)
//!     2) lock [off, off+len) of the file: this process's mutex, then an
//!        OFD write lock (F_OFD_SETLKW; other processes)
//!     3) few runs: pwrite each run; many: pread the range, put the runs
//!        in, pwrite it back
//!     4) unlock; drop the twin, budget -= folio
//! ```
//! A missing write fault on such a file is filled as a read (installed
//! write-protected), so the write that follows takes the path above: the
//! twin is always made from the write-protected view. A write-back that
//! fails keeps its twin (the folio stays DIRTY); a discard drops it; unmap
//! returns what is left to the budget.
//!
//! Bytes written by one region only land exactly; bytes written by several
//! end with one of their values (whichever write-back came last). A byte a
//! region wrote back with the value its twin had is not written (it did not
//! change, as far as the diff can tell).
//!
//! ## Who writes the file ([`FileWriters`], one per file and process)
//!
//! - In the process: a process-wide table keyed by (st_dev, st_ino) lists
//!   every writable region of the file, of every pager.
//! - Across processes: every process mapping the file writable holds a
//!   shared OFD lock on byte [`MARK_WRITER`] (far beyond any file's end);
//!   one whose file is not twinned yet also holds [`MARK_ALONE`]. An
//!   `F_OFD_GETLK` probe for a write lock on `MARK_WRITER`, made through the
//!   process's own description, reports a conflict exactly when another
//!   description (another process, or a pre-fork copy) holds it.
//!
//! Protocol (markers are set BEFORE the probe, so of two processes arriving
//! together at least one sees the other, and the one that saw nobody
//! already holds `MARK_ALONE` when the other looks at it):
//!
//! ```text
//!   map writable:  set MARK_WRITER(shared), MARK_ALONE(shared) if new here
//!                  probe: other writable region here, or MARK_WRITER elsewhere?
//!                  yes -> switch; then wait (≤ ALONE_WAIT) until no other
//!                         description holds MARK_ALONE
//!   switch:        twinning = true (SeqCst); write back every dirty folio of
//!                  the file's regions here (whole: nobody else wrote yet);
//!                  release MARK_ALONE
//!   reclaimer tick (50 ms), file not twinned yet: probe MARK_WRITER; other
//!                  process found -> switch
//! ```
//! A folio made dirty before `twinning` was set has no twin and is written
//! whole by the switch; one made dirty after has a twin. A write-protect
//! fault decides while it holds the folio BUSY, and the switch's write-back
//! waits for BUSY folios, so no folio escapes both. The newcomer waits for
//! the old writers' switch before its `map` returns, so it has written
//! nothing they could overwrite. Twinning, once on, stays on for the file
//! (in this process) while any region of it is mapped: resident copies may
//! be older than the file, and only a diff writes them back safely.
//!
//! What it does not cover: writers that are not upager (numpy.memmap, a
//! plain `write`) or an upager without this module (no markers: not
//! detected, last write-back wins per folio); stores that are not files
//! (`map_store`, Redis); a process that takes longer than [`ALONE_WAIT`] to
//! switch (a reclaimer stuck in a slow write-back: the newcomer goes on
//! after a warning, and that process's pre-switch dirty folios may
//! overwrite what the newcomer writes to the same folios meanwhile).
//!
//! Where the rest lives: the fault hooks (`twin_charge`, `twin_claimed`)
//! in dirty.rs, the diff write-back in gather.rs, the switch's
//! write-back of a region (a closure each member gives [`FileWriters::join`])
//! in pager.rs, the reclaimer's [`FileWriters::poll`] in reclaim.rs.
//!
//! Counters: `twins_made`, `diff_writebacks`, `writer_switches`.
//!
//! Uses: nothing of the engine (below `area`, which holds both types).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use upager_sys::io::{ofd_lock, ofd_probe, LockKind};

/// Held shared by every process that maps the file writable.
pub(crate) const MARK_WRITER: u64 = i64::MAX as u64 - 1;
/// Held shared by a process that writes the file without twins.
pub(crate) const MARK_ALONE: u64 = i64::MAX as u64 - 2;

/// Longest wait of a newcomer for the other writers' switch: their
/// reclaimers look every 50 ms, then write back their dirty folios (a
/// guess that covers a dirty limit's worth of write-back on a slow disk).
pub(crate) const ALONE_WAIT: Duration = Duration::from_secs(10);

/// Diffs of at most this many runs are written run by run (no read);
/// more are merged into the store's bytes and written as one range. A
/// guess: a pread of a 64 KiB folio costs about what 8 small pwrites do.
const MAX_RUN_WRITES: usize = 8;

/// The twins of one region's folios.
#[derive(Default)]
pub(crate) struct Twins {
    map: Mutex<HashMap<usize, Box<[u8]>>>,
    /// Twins held (read without the lock: 0 on the single-writer path).
    count: AtomicUsize,
}

impl Twins {
    /// Whether folio `idx` has a twin (one atomic load when none has).
    pub fn has(&self, idx: usize) -> bool {
        self.count.load(Ordering::Acquire) != 0
            && self
                .map
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&idx)
    }
    /// Keeps `twin` as folio `idx`'s twin.
    pub fn insert(&self, idx: usize, twin: Box<[u8]>) {
        let old = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(idx, twin);
        if old.is_none() {
            self.count.fetch_add(1, Ordering::AcqRel);
        }
    }
    /// Takes folio `idx`'s twin.
    pub fn take(&self, idx: usize) -> Option<Box<[u8]>> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let t = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&idx);
        if t.is_some() {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
        t
    }
    /// Drops every twin; returns how many there were.
    pub fn clear(&self) -> u64 {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.len() as u64;
        m.clear();
        self.count.store(0, Ordering::Release);
        n
    }
}

/// Writes back every dirty folio of one writable region of the file (made
/// by the region's pager, holding it weakly: a no-op once it is gone).
pub(crate) type WriteBackAll = Box<dyn Fn() + Send + Sync>;

/// A writable region of the file, in this process.
struct Member {
    id: u64,
    write_back: WriteBackAll,
}

/// This process's writers of one file (see the module doc).
pub(crate) struct FileWriters {
    pid: u32,
    /// Its own open file description: the markers, the range locks and the
    /// diff I/O (buffered; O_DIRECT reads of the store see its writes, the
    /// kernel writes the page cache back before a direct read).
    fd: File,
    /// Writes to this file keep twins (sticky while the file is mapped).
    twinning: AtomicBool,
    /// The writable regions; also serialises switches.
    members: Mutex<Vec<Member>>,
    /// Diff write-backs of this process, one at a time: OFD locks of one
    /// description do not exclude each other.
    io: Mutex<()>,
    /// When [`FileWriters::poll`] last probed (ms since `EPOCH`): every
    /// pager's reclaimer polls every file it writes, one probe per
    /// [`POLL_EVERY`] is enough.
    polled_ms: AtomicU64,
}

/// Least time between two probes of one file by [`FileWriters::poll`] (the
/// reclaimer's tick).
const POLL_EVERY: Duration = Duration::from_millis(50);

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

type Table = HashMap<(u64, u64), Weak<FileWriters>>;
static WRITERS: Mutex<Option<Table>> = Mutex::new(None);

/// The writers' table held across a fork (fork.rs), so that no other
/// thread holds it when the child is made.
pub(crate) struct TableHeld(#[allow(dead_code)] MutexGuard<'static, Option<Table>>);

/// Takes the writers' table until the guard goes.
pub(crate) fn hold_table() -> TableHeld {
    TableHeld(WRITERS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Retries a blocking call interrupted by a signal.
fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

impl FileWriters {
    /// This process's writers of the file `(dev, ino)`, made (with `open`:
    /// a new read-write description of the file, and its markers) for the
    /// first writable region of it.
    pub fn of(
        dev: u64,
        ino: u64,
        open: impl FnOnce() -> io::Result<File>,
    ) -> io::Result<Arc<FileWriters>> {
        let mut t = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        let t = t.get_or_insert_with(HashMap::new);
        let pid = std::process::id();
        if let Some(w) = t.get(&(dev, ino)).and_then(Weak::upgrade) {
            // A forked child inherits the table: the parent's entry is not
            // the child's (its description is shared with the parent).
            if w.pid == pid {
                return Ok(w);
            }
        }
        t.retain(|_, w| w.strong_count() > 0);
        let fd = open()?;
        retry(|| ofd_lock(&fd, LockKind::Read, MARK_WRITER, 1, true))?;
        retry(|| ofd_lock(&fd, LockKind::Read, MARK_ALONE, 1, true))?;
        let w = Arc::new(FileWriters {
            pid,
            fd,
            twinning: AtomicBool::new(false),
            members: Mutex::new(Vec::new()),
            io: Mutex::new(()),
            polled_ms: AtomicU64::new(0),
        });
        t.insert((dev, ino), Arc::downgrade(&w));
        Ok(w)
    }

    /// In a fork child: this process's writers of the same file, on a new
    /// description of it (opened through `/proc/self/fd`, so also a file
    /// renamed or unlinked since), never the inherited entry, whose
    /// description the parent shares.
    pub fn reopen_in_child(&self) -> io::Result<Arc<FileWriters>> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let meta = self.fd.metadata()?;
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        FileWriters::of(meta.dev(), meta.ino(), || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
        })
    }

    /// Before a fork (the `prepare` handler, after it wrote every dirty
    /// folio back): the child will write the file too, so twins from now
    /// on, and the single-writer marker released, so the child's map need
    /// not wait for this process's reclaimer to notice it.
    pub fn switch_before_fork(&self) {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if !self.twinning() {
            self.switch(&members);
        }
    }

    /// Whether writes to the file keep twins.
    pub fn twinning(&self) -> bool {
        self.twinning.load(Ordering::SeqCst)
    }

    /// Whether another process maps the file writable (a probe of
    /// [`MARK_WRITER`]; an error counts as yes: twins cost memory, a
    /// missed writer costs data).
    fn other_process(&self) -> bool {
        !matches!(
            ofd_probe(&self.fd, LockKind::Write, MARK_WRITER, 1),
            Ok(None)
        )
    }

    /// Adds writable region `id` (`write_back` writes its dirty folios
    /// back); switches the file to twins if it has another writer, here or
    /// elsewhere, and then waits for the other processes' switch (bounded
    /// by [`ALONE_WAIT`]).
    pub fn join(&self, id: u64, write_back: WriteBackAll) {
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        let here = !members.is_empty();
        members.push(Member { id, write_back });
        if !self.twinning() && (here || self.other_process()) {
            self.switch(&members);
        }
        drop(members);
        if self.twinning() {
            self.wait_alone_gone();
        }
    }

    /// Region `id` is gone.
    pub fn leave(&self, id: u64) {
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members.retain(|m| m.id != id);
    }

    /// The reclaimer's look (every tick, while the file is not twinned):
    /// another process arrived? Then switch.
    pub fn poll(&self) {
        let now = now_ms();
        let last = self.polled_ms.load(Ordering::Relaxed);
        if self.twinning()
            || now.saturating_sub(last) < POLL_EVERY.as_millis() as u64 - 5
            || self
                .polled_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            || !self.other_process()
        {
            return;
        }
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if !self.twinning() {
            self.switch(&members);
        }
    }

    /// Turns twins on, writes back every dirty folio of the file's regions
    /// here (made without twins), then releases [`MARK_ALONE`].
    fn switch(&self, members: &[Member]) {
        self.twinning.store(true, Ordering::SeqCst);
        for m in members {
            (m.write_back)();
        }
        if let Err(e) = ofd_lock(&self.fd, LockKind::Unlock, MARK_ALONE, 1, false) {
            log::error!("releasing the single-writer marker failed: {e}");
        }
    }

    /// Waits until no other process writes the file without twins.
    fn wait_alone_gone(&self) {
        let start = Instant::now();
        while !matches!(
            ofd_probe(&self.fd, LockKind::Write, MARK_ALONE, 1),
            Ok(None) | Err(_)
        ) {
            if start.elapsed() > ALONE_WAIT {
                log::warn!(
                    "another process still writes this file without twins after {} s (its upager is stuck in a write-back, or predates twins): its dirty folios may overwrite this region's writes to the same folios",
                    ALONE_WAIT.as_secs()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Writes the bytes of `view` that differ from `twin` to the file at
    /// `off`, under a lock of the range (module doc). Returns the bytes
    /// written.
    pub fn write_diff(&self, view: &[u8], twin: &[u8], off: u64) -> io::Result<u64> {
        let runs = diff_runs(view, twin);
        if runs.is_empty() {
            return Ok(0);
        }
        let len = view.len() as u64;
        let _g = self.io.lock().unwrap_or_else(|e| e.into_inner());
        retry(|| ofd_lock(&self.fd, LockKind::Write, off, len, true))?;
        let res = (|| {
            if runs.len() <= MAX_RUN_WRITES {
                let mut n = 0;
                for &(a, b) in &runs {
                    self.fd.write_all_at(&view[a..b], off + a as u64)?;
                    n += (b - a) as u64;
                }
                return Ok(n);
            }
            let mut buf = vec![0u8; view.len()];
            let mut got = 0;
            while got < buf.len() {
                match self.fd.read_at(&mut buf[got..], off + got as u64) {
                    Ok(0) => break, // beyond the end: zeros, as a fill reads
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            for &(a, b) in &runs {
                buf[a..b].copy_from_slice(&view[a..b]);
            }
            self.fd.write_all_at(&buf, off)?;
            Ok(len)
        })();
        if let Err(e) = ofd_lock(&self.fd, LockKind::Unlock, off, len, false) {
            // Closing the description releases it at the latest.
            log::error!("releasing the write-back lock of bytes {off}+{len} failed: {e}");
        }
        res
    }
}

/// The runs `[a, b)` of bytes where `view` differs from `twin` (compared a
/// word at a time; runs are never merged across an unchanged byte: another
/// writer may own it).
fn diff_runs(view: &[u8], twin: &[u8]) -> Vec<(usize, usize)> {
    debug_assert_eq!(view.len(), twin.len());
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut push = |i: usize| match runs.last_mut() {
        Some((_, e)) if *e == i => *e = i + 1,
        _ => runs.push((i, i + 1)),
    };
    let words = view.len() / 8;
    for w in 0..words {
        let (a, b) = (&view[w * 8..w * 8 + 8], &twin[w * 8..w * 8 + 8]);
        if a != b {
            (w * 8..w * 8 + 8)
                .filter(|&i| view[i] != twin[i])
                .for_each(&mut push);
        }
    }
    (words * 8..view.len())
        .filter(|&i| view[i] != twin[i])
        .for_each(push);
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_runs_never_cover_an_unchanged_byte() {
        let twin = vec![0u8; 40];
        let mut view = twin.clone();
        for i in [0, 1, 2, 9, 17, 18, 39] {
            view[i] = 7;
        }
        assert_eq!(
            diff_runs(&view, &twin),
            vec![(0, 3), (9, 10), (17, 19), (39, 40)]
        );
        assert!(diff_runs(&twin, &twin).is_empty());
    }

    /// Two writers' diffs of one range, one written run by run, one merged
    /// through a read: each one's bytes land, the rest stays.
    #[test]
    fn write_diff_merges_into_the_file() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), vec![1u8; 4096]).unwrap();
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(f.path())
        };
        let w = FileWriters {
            pid: 0,
            fd: open().unwrap(),
            twinning: AtomicBool::new(true),
            members: Mutex::new(Vec::new()),
            io: Mutex::new(()),
            polled_ms: AtomicU64::new(0),
        };
        let twin = vec![1u8; 4096];
        let mut a = twin.clone();
        a[10] = 2;
        assert_eq!(w.write_diff(&a, &twin, 0).unwrap(), 1);
        let mut b = twin.clone();
        for i in 0..40 {
            b[100 + 3 * i] = 3; // 40 runs: read, merge, write
        }
        assert_eq!(w.write_diff(&b, &twin, 0).unwrap(), 4096);
        let got = std::fs::read(f.path()).unwrap();
        assert_eq!(got[10], 2, "the first diff survives the merged write");
        assert_eq!(got[103], 3);
        assert_eq!(got[101], 1);
        assert_eq!(
            w.write_diff(&twin, &twin, 0).unwrap(),
            0,
            "no change, no write"
        );
    }
}
