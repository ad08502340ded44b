//! The disk tier: what a remote store's regions fetched stays in a cache
//! directory on local disk, so an evicted folio, a second pass or a second
//! run reads it from there instead of the network ([`CachedStore`]).
//!
//! Which stores: those that say who their bytes are
//! ([`Store::cache_key`]: an S3 object by endpoint, bucket, key, size and
//! ETag), mapped read-only. Every read of such a region goes through the
//! tier (faults, readahead, prefetch, warm-start replay, gathers: they all
//! read through [`Store::read_at`] and [`Store::read_batch`]), so every
//! path reads from the nearest tier that holds the bytes.
//!
//! Layout: one entry per key, `DIR/<xxh3 of the key>/` holding `key` (the
//! key's text, compared at open: a hash collision is refused, never
//! served), `data` (a sparse file as long as the object, chunk `c` at
//! `c * CHUNK`) and `index` (a header, then one 64-bit word per chunk: 0
//! while absent, else the xxh3 of the chunk's bytes with the low bit set).
//! An entry is made in a temporary directory and published by `rename`.
//!
//! Contract (publish after write, check before serve):
//!
//! ```text
//!   insert (the tier's writer thread)   write the chunks' bytes to data
//!                                        → then their index words
//!   serve (any reader)                  index word present → read the bytes
//!                                        → hash them → equal: serve;
//!                                          else a miss (cache_corrupt), fetched again
//!   evict                               zero the index words → then punch the bytes
//! ```
//!
//! So a process killed between a chunk's bytes and its word leaves an
//! absent chunk, a torn or flipped chunk on disk hashes wrong and is
//! fetched again, and a chunk punched under a reader reads as zeros that
//! hash wrong (or are right: a chunk of zeros). No lock is shared between
//! processes; a word is written by one `pwrite` of 8 aligned bytes.
//!
//! Inserts do not wait on the disk: a miss's bytes are copied to a queue
//! (at most [`QUEUE_BYTES`], 8 MiB; a miss waits up to [`QUEUE_WAIT`] for
//! room, then its chunks go uncached and are counted) that the writer
//! thread of the store writes with `O_DIRECT` where the file system takes
//! it (the `direct` module's descriptors), so the page cache keeps no
//! second copy outside the budget. Reads find queued chunks in the queue.
//! The store's drop waits for the queue.
//!
//! Size: the directory's bytes (the data files' allocated blocks and the
//! index files) stay at or below its size. The writer checks before each
//! insert against its count (a scan of the directory at open and every
//! eighth of the size inserted), and frees down to 7/8 of the size:
//! whole entries least recently opened first (the `key` file's mtime,
//! touched at every open), then chunks of its own entry from a hand that
//! goes round it. Processes that insert at once each count only their own
//! inserts between scans, so the directory may pass its size by up to one
//! eighth of it per such process until the next scan. An entry removed
//! while another process reads it stays on disk, uncounted, until that
//! process closes it (its inserts go to the removed files).
//!
//! Lock order: `Entry::queued_chunks` (with its condition variable
//! `room`), released before `CachedStore::writer` (the queue's sender) is
//! taken; both leaves. The writer thread takes only the first.
//!
//! Counters ([`Store::store_counters`], beside the inner store's):
//! `cache_hits`, `cache_misses` (chunk reads served from disk / fetched),
//! `cache_hit_bytes`, `cache_bytes` (the directory's bytes at the last
//! count), `cache_evictions` (chunks evicted, whole entries' included),
//! `cache_inserts`, `cache_drops` (inserts dropped: queue full, disk
//! error), `cache_corrupt` (chunks that hashed wrong), `cache_read_ns`.
//!
//! Uses: `config`, `direct`, `store`.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use upager_sys::mem::Mapping;

use crate::direct::{reopen_direct, Fds};
use crate::private_dir::PrivateDirError;
use crate::store::{ReadReq, Src, Store};

/// Bytes of one chunk: the unit the tier stores, hashes and evicts. A miss
/// is fetched in whole chunks (a read of 4 KiB fetches its 64 KiB, which
/// an object store serves for about the cost of the 4 KiB).
pub const CHUNK: u64 = 64 << 10;

/// Bytes of misses queued for the writer at most; more are not cached.
pub const QUEUE_BYTES: u64 = 8 << 20;

/// Threads that read a batch's runs from disk at once (each waits on the
/// disk: a virtio or NVMe disk serves several reads in flight).
pub const DISK_READERS: usize = 8;

/// Longest a miss waits for room in the writer's queue before its chunks
/// go uncached.
pub const QUEUE_WAIT: Duration = Duration::from_millis(100);

/// The writer's page-aligned staging buffer (O_DIRECT needs aligned
/// memory): a job is written this much at a time.
const STAGE_BYTES: u64 = 1 << 20;

/// Most bytes the cache takes by default: 20 GiB, or half the free space
/// of its file system when that is less.
pub const DEFAULT_MAX: u64 = 20 << 30;

const MAGIC: &[u8; 8] = b"UPGCACH1";
const HEADER: u64 = 64;

/// Where the disk tier lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The directory (created 0700 if missing).
    pub dir: PathBuf,
    /// Its size in bytes; None: [`default_size`] at first use; 0: off.
    pub size: Option<u64>,
}

impl CacheConfig {
    /// The default directory: `$XDG_CACHE_HOME/upager/tier`, else
    /// `$HOME/.cache/upager/tier`, else `/tmp/upager-cache-UID`. A
    /// variable naming a directory that does not exist is passed over
    /// (a home the tier would otherwise create, as root would for
    /// `HOME=/nonexistent`).
    pub fn default_dir() -> PathBuf {
        let existing = |v: &str| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
        };
        if let Some(x) = existing("XDG_CACHE_HOME") {
            return x.join("upager").join("tier");
        }
        if let Some(h) = existing("HOME") {
            return h.join(".cache").join("upager").join("tier");
        }
        let uid = crate::private_dir::my_uid().unwrap_or(0);
        std::env::temp_dir().join(format!("upager-cache-{uid}"))
    }

    /// The directory a pager built with no `cache_dir` uses:
    /// `UPAGER_CACHE_DIR`, else [`CacheConfig::default_dir`].
    pub fn env_dir() -> PathBuf {
        std::env::var_os(crate::config::CACHE_DIR_ENV)
            .filter(|d| !d.is_empty())
            .map_or_else(CacheConfig::default_dir, PathBuf::from)
    }

    /// The tier in `dir` (None: [`CacheConfig::default_dir`]) of `size`
    /// bytes (None: [`default_size`]; 0: off).
    pub fn new(dir: Option<PathBuf>, size: Option<u64>) -> CacheConfig {
        CacheConfig {
            dir: dir.unwrap_or_else(CacheConfig::default_dir),
            size,
        }
    }

    /// Whether the tier is on (a size other than 0).
    pub fn enabled(&self) -> bool {
        self.size != Some(0)
    }

    /// The size in bytes: the one set, or [`default_size`] of the
    /// directory.
    pub fn size_bytes(&self) -> u64 {
        self.size.unwrap_or_else(|| default_size(&self.dir))
    }
}

/// The default size of a cache in `dir`: [`DEFAULT_MAX`], or half the free
/// space of its file system (counting what the cache holds already) when
/// that is less, so the cache leaves the disk room.
pub fn default_size(dir: &Path) -> u64 {
    let probe = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or_else(|| Path::new("/"));
    let free = upager_sys::io::free_space(probe).unwrap_or(0);
    let held = scan(dir).map(|s| s.bytes).unwrap_or(0);
    DEFAULT_MAX.min((free + held) / 2)
}

/// Why a store's disk tier could not be opened (the region then reads the
/// store directly; the reason is logged once).
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// could not use the cache directory {dir}: {source} (set UPAGER_CACHE_DIR to a directory of yours, or UPAGER_CACHE_SIZE=0 to read without a disk tier)
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// the cache directory {0} belongs to another user or is open to others: refused (make it yours with mode 0700, or set UPAGER_CACHE_DIR)
    NotPrivate(PathBuf),
    /// the cache entry {0} holds another key with the same hash: this store is read without the disk tier
    Collision(PathBuf),
}

/// One entry of a cache directory ([`entries`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The entry's directory.
    pub path: PathBuf,
    /// What it holds (the store's key: e.g. `s3 ENDPOINT BUCKET/KEY size N etag E`).
    pub key: String,
    /// Bytes on disk.
    pub bytes: u64,
    /// The data's length.
    pub len: u64,
    /// Last opened.
    pub used: SystemTime,
}

/// What a cache directory holds ([`scan`]).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DirInfo {
    /// Bytes on disk, all entries.
    pub bytes: u64,
    /// Its entries, least recently used first.
    pub entries: Vec<EntryInfo>,
}

/// Counts what the cache directory `dir` holds (none if it does not
/// exist). Entries in the making (temporary directories) are counted too.
pub fn scan(dir: &Path) -> io::Result<DirInfo> {
    let mut info = DirInfo::default();
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(info),
        Err(e) => return Err(e),
    };
    for ent in rd.flatten() {
        let path = ent.path();
        if !is_entry(&ent) {
            continue;
        }
        let bytes = entry_bytes(&path);
        info.bytes += bytes;
        let key_path = path.join("key");
        let (Ok(key), Ok(meta)) = (fs::read_to_string(&key_path), fs::metadata(&key_path)) else {
            continue;
        };
        let len = fs::metadata(path.join("data")).map_or(0, |m| m.len());
        info.entries.push(EntryInfo {
            path,
            key,
            bytes,
            len,
            used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        });
    }
    info.entries.sort_by_key(|e| e.used);
    Ok(info)
}

/// Removes every entry of the cache directory `dir` (a process reading one
/// goes on with its open files, which are freed when it closes them).
/// Returns the bytes freed.
pub fn clear(dir: &Path) -> io::Result<u64> {
    let info = scan(dir)?;
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for ent in rd.flatten() {
        if is_entry(&ent) {
            remove_entry(&ent.path())?;
        }
    }
    Ok(info.bytes)
}

/// Removes the entries of the cache directory `dir` whose key `which`
/// picks (e.g. the objects a program deleted); returns the bytes freed.
pub fn remove(dir: &Path, which: impl Fn(&str) -> bool) -> io::Result<u64> {
    let mut freed = 0;
    for e in scan(dir)?.entries {
        if which(&e.key) {
            remove_entry(&e.path)?;
            freed += e.bytes;
        }
    }
    Ok(freed)
}

/// Whether `ent` is an entry of a cache directory (named by a key's hash,
/// or one being made or removed), so that a directory named by mistake
/// loses nothing else.
fn is_entry(ent: &fs::DirEntry) -> bool {
    let name = ent.file_name();
    let name = name.to_string_lossy();
    let hashed = name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit());
    (hashed || name.starts_with(".new-") || name.starts_with(".gone-"))
        && ent.file_type().is_ok_and(|t| t.is_dir())
}

fn entry_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    ["data", "index", "key"]
        .iter()
        .filter_map(|f| fs::metadata(path.join(f)).ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Removes an entry: renamed aside first, so no opener finds it half gone.
fn remove_entry(path: &Path) -> io::Result<()> {
    let aside = path.with_file_name(format!(
        ".gone-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Relaxed)
    ));
    match fs::rename(path, &aside) {
        Ok(()) => fs::remove_dir_all(&aside),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

static UNIQUE: AtomicUsize = AtomicUsize::new(0);

/// The tier's counters.
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    hit_bytes: AtomicU64,
    bytes: AtomicU64,
    evictions: AtomicU64,
    inserts: AtomicU64,
    drops: AtomicU64,
    corrupt: AtomicU64,
    read_ns: AtomicU64,
}

/// An open entry: its files, and which chunks this process knows present.
#[derive(Debug)]
struct Entry {
    dir: PathBuf,
    root: PathBuf,
    size: u64,
    len: u64,
    data: Fds,
    index: File,
    /// Per chunk: 0 (absent, as far as this process knows) or the index
    /// word.
    words: Vec<AtomicU64>,
    counters: Counters,
    /// The writer's count of the directory's bytes.
    used: AtomicU64,
    /// Bytes inserted since the last scan.
    since_scan: AtomicU64,
    /// The next chunk of this entry to evict.
    hand: AtomicUsize,
    /// Bytes queued for the writer.
    queued: AtomicU64,
    /// The queued chunks, which reads are served from until they are on
    /// disk (a window's fault and its readahead read one chunk at once).
    queued_chunks: Mutex<HashMap<usize, Arc<[u8]>>>,
    /// Signalled when the writer takes bytes off the queue.
    room: Condvar,
}

/// Where a chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// On disk (its index word is known).
    Disk,
    /// In the writer's queue.
    Queued,
    /// Nowhere here.
    Absent,
}

/// A job for the writer: chunks from `first` on, in order (each whole but
/// the data's last).
struct Job {
    first: usize,
    chunks: Vec<Arc<[u8]>>,
}

impl Job {
    fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len() as u64).sum()
    }
}

/// A read-only store behind the disk tier. See the module docs.
#[derive(Debug)]
pub struct CachedStore {
    inner: Arc<dyn Store>,
    entry: Arc<Entry>,
    writer: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn hash_word(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes) | 1
}

impl CachedStore {
    /// `inner` behind the disk tier `cfg` names, keyed by `key` (the
    /// store's [`Store::cache_key`]).
    pub fn open(
        inner: Arc<dyn Store>,
        key: &str,
        cfg: &CacheConfig,
    ) -> Result<CachedStore, CacheError> {
        let root = &cfg.dir;
        let dir_err = |source| CacheError::Dir {
            dir: root.clone(),
            source,
        };
        match crate::private_dir::make_private_dir(root, true) {
            Ok(()) => {}
            Err(PrivateDirError::Io(e)) => return Err(dir_err(e)),
            Err(PrivateDirError::NotPrivate { .. }) => {
                return Err(CacheError::NotPrivate(root.clone()))
            }
        }
        let size = cfg.size_bytes();
        let len = inner.len();
        let name = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key.as_bytes()));
        let dir = root.join(name);
        let entry = match open_entry(&dir, key, len) {
            Ok(Some(e)) => e,
            Ok(None) => {
                make_entry(root, &dir, key, len).map_err(dir_err)?;
                open_entry(&dir, key, len)
                    .map_err(dir_err)?
                    .ok_or_else(|| CacheError::Collision(dir.clone()))?
            }
            Err(e) => return Err(dir_err(e)),
        };
        let (data, index) = entry;
        let chunks = len.div_ceil(CHUNK) as usize;
        let mut raw = vec![0u8; chunks * 8];
        let got = crate::direct::read_full(&index, &mut raw, HEADER).map_err(dir_err)?;
        raw[got..].fill(0);
        let words = raw
            .chunks_exact(8)
            .map(|w| AtomicU64::new(u64::from_le_bytes(w.try_into().expect("8 bytes"))))
            .collect();
        let used = scan(root).map_or(0, |s| s.bytes);
        let direct = reopen_direct(&data, true);
        let entry = Arc::new(Entry {
            root: root.clone(),
            dir,
            size,
            len,
            data: Fds::new(data, direct),
            index,
            words,
            counters: Counters::default(),
            used: AtomicU64::new(used),
            since_scan: AtomicU64::new(0),
            hand: AtomicUsize::new(0),
            queued: AtomicU64::new(0),
            queued_chunks: Mutex::default(),
            room: Condvar::new(),
        });
        entry.counters.bytes.store(used, Relaxed);
        if used > size {
            entry.make_room(0);
        }
        Ok(CachedStore {
            inner,
            entry,
            writer: Mutex::new(None),
            thread: Mutex::new(None),
        })
    }

    /// The store behind the tier.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The entry's directory.
    pub fn entry_dir(&self) -> &Path {
        &self.entry.dir
    }

    /// Waits until every insert queued so far is on disk (or dropped).
    pub fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.entry.queued.load(Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Queues the whole chunks from `first` in `bytes` for the writer.
    fn insert(&self, first: usize, bytes: &[u8]) {
        let e = &self.entry;
        let n = bytes.len() as u64;
        if n == 0 {
            return;
        }
        if !e.reserve_queue(n) {
            e.counters.drops.fetch_add(1, Relaxed);
            return;
        }
        let job = Job {
            first,
            chunks: bytes.chunks(CHUNK as usize).map(Arc::from).collect(),
        };
        {
            let mut q = e.lock_queued();
            for (k, c) in job.chunks.iter().enumerate() {
                q.insert(first + k, Arc::clone(c));
            }
        }
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            let (tx, rx) = sync_channel::<Job>(64);
            let entry = Arc::clone(e);
            let spawned = std::thread::Builder::new()
                .name("upager-cache".into())
                .spawn(move || {
                    let mut stage: Option<Mapping> = None;
                    for job in rx {
                        if entry.write_job(&job, &mut stage).is_err() {
                            entry.counters.drops.fetch_add(1, Relaxed);
                        }
                        entry.unqueue(&job);
                    }
                });
            match spawned {
                Ok(h) => {
                    *w = Some(tx);
                    *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
                }
                Err(_) => {
                    e.counters.drops.fetch_add(1, Relaxed);
                    e.unqueue(&job);
                    return;
                }
            }
        }
        if let Some(Err(std::sync::mpsc::SendError(job))) = w.as_ref().map(|tx| tx.send(job)) {
            e.counters.drops.fetch_add(1, Relaxed);
            e.unqueue(&job);
        }
    }

    /// Reads `[off, off + buf.len())` (within the data) into `buf`, each
    /// run of chunks from where it is: the disk for chunks present and
    /// whole, the inner store for the rest (one batch).
    fn read_runs(&self, reads: &mut [ReadReq<'_>]) -> Vec<io::Result<usize>> {
        let t0 = Instant::now();
        let e = &self.entry;
        let mut out: Vec<io::Result<usize>> = Vec::with_capacity(reads.len());
        // Ranges to fetch: (read index, from, to) in the data.
        let mut misses: Vec<(usize, u64, u64)> = Vec::new();
        // Runs on disk: (read index, first chunk, end chunk, from, where to).
        let mut disk: Vec<(usize, usize, usize, u64, &mut [u8])> = Vec::new();
        for (i, r) in reads.iter_mut().enumerate() {
            let off = r.offset;
            if off >= e.len {
                out.push(Ok(0));
                continue;
            }
            let n = (r.buf.len() as u64).min(e.len - off);
            out.push(Ok(n as usize));
            e.refresh((off / CHUNK) as usize, (off + n).div_ceil(CHUNK) as usize);
            let mut rest: &mut [u8] = &mut r.buf[..n as usize];
            let mut at = off;
            while at < off + n {
                let c = (at / CHUNK) as usize;
                let state = e.state(c);
                // The run of chunks in the same state.
                let mut end_c = c + 1;
                while (end_c as u64) * CHUNK < off + n && e.state(end_c) == state {
                    end_c += 1;
                }
                let end = (end_c as u64 * CHUNK).min(off + n);
                let (dst, after) = std::mem::take(&mut rest).split_at_mut((end - at) as usize);
                rest = after;
                match state {
                    Held::Disk => disk.push((i, c, end_c, at, dst)),
                    Held::Queued => {
                        let bad = e.serve_queued(c, end_c, at, dst);
                        add_misses(&mut misses, i, at, end, bad);
                    }
                    Held::Absent => add_misses(&mut misses, i, at, end, c..end_c),
                }
                at = end;
            }
        }
        // The disk's runs, several at once when a batch has many (a gather's
        // scattered chunks: each read waits on the disk, not the CPU).
        let served = e.serve_all(disk);
        for (i, at, end, bad) in served {
            add_misses(&mut misses, i, at, end, bad);
        }
        if !misses.is_empty() {
            misses.sort_unstable_by_key(|&(i, a, _)| (i, a));
            self.fetch(reads, &misses, &mut out);
        }
        e.counters
            .read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        out
    }

    /// Fetches the ranges `misses` (read, from, to; in order) from the
    /// inner store in one batch: whole chunks straight into their reads'
    /// buffers, a range's partial first and last chunk whole into a chunk
    /// of scratch each (then copied); then queues the chunks for the disk.
    fn fetch(
        &self,
        reads: &mut [ReadReq<'_>],
        misses: &[(usize, u64, u64)],
        out: &mut [io::Result<usize>],
    ) {
        let e = &self.entry;
        let cut: Vec<(usize, Piece)> = misses
            .iter()
            .flat_map(|&(i, a, b)| pieces(a, b, e.len).into_iter().map(move |p| (i, p)))
            .collect();
        let mut scratch: Vec<Vec<u8>> = cut
            .iter()
            .filter(|(_, p)| !p.whole(e.len))
            .map(|(_, p)| vec![0u8; p.chunk_bytes(e.len) as usize])
            .collect();
        let mut spare = scratch.iter_mut();
        let mut reqs: Vec<ReadReq<'_>> = Vec::with_capacity(cut.len());
        // Per request: its read, its piece, and (scratch) where its part goes.
        let mut dsts: Vec<(usize, &Piece, Option<&mut [u8]>)> = Vec::with_capacity(cut.len());
        let mut next = cut.iter().peekable();
        for (i, r) in reads.iter_mut().enumerate() {
            let mut rest: &mut [u8] = &mut *r.buf;
            let mut cur = r.offset;
            while let Some((_, p)) = next.next_if(|(j, _)| *j == i) {
                let skipped = std::mem::take(&mut rest)
                    .split_at_mut((p.a - cur) as usize)
                    .1;
                let (here, after) = skipped.split_at_mut((p.b - p.a) as usize);
                rest = after;
                cur = p.b;
                if p.whole(e.len) {
                    reqs.push(ReadReq {
                        buf: here,
                        offset: p.a,
                    });
                    dsts.push((i, p, None));
                } else {
                    let buf = spare.next().expect("a scratch chunk per partial piece");
                    reqs.push(ReadReq {
                        buf: buf.as_mut_slice(),
                        offset: p.c0 as u64 * CHUNK,
                    });
                    dsts.push((i, p, Some(here)));
                }
            }
        }
        let got = self.inner.read_batch(&mut reqs);
        for ((req, (i, p, dst)), res) in reqs.iter().zip(dsts).zip(got) {
            let want = req.buf.len();
            match res {
                Ok(n) if n >= want => {
                    if let Some(dst) = dst {
                        let from = (p.a - p.c0 as u64 * CHUNK) as usize;
                        let n = dst.len();
                        dst.copy_from_slice(&req.buf[from..from + n]);
                    }
                    e.counters.misses.fetch_add((p.c1 - p.c0) as u64, Relaxed);
                    self.insert(p.c0, req.buf);
                }
                Ok(_) => {
                    out[i] = Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "{}: a read at byte {} came back short",
                            self.inner.describe(),
                            req.offset
                        ),
                    ))
                }
                Err(err) => out[i] = Err(err),
            }
        }
    }
}

/// Adds to `misses` the part of `[at, end)` (of read `i`) in each chunk of
/// `bad`, merged with the range before it where they touch.
fn add_misses(
    misses: &mut Vec<(usize, u64, u64)>,
    i: usize,
    at: u64,
    end: u64,
    bad: impl IntoIterator<Item = usize>,
) {
    for k in bad {
        let a = (k as u64 * CHUNK).max(at);
        let b = ((k as u64 + 1) * CHUNK).min(end);
        match misses.last_mut() {
            Some((j, _, last_b)) if *j == i && *last_b == a => *last_b = b,
            _ => misses.push((i, a, b)),
        }
    }
}

/// A part `[a, b)` of a range of the data, in chunks `[c0, c1)`: whole
/// chunks (the middle of a range, and its end where it ends the data), or
/// part of one chunk (a range's unaligned start or end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    c0: usize,
    c1: usize,
    a: u64,
    b: u64,
}

impl Piece {
    /// Whether the piece is its chunks' bytes exactly.
    fn whole(&self, len: u64) -> bool {
        self.a == self.c0 as u64 * CHUNK && self.b == (self.c1 as u64 * CHUNK).min(len)
    }
    /// The bytes of its chunks.
    fn chunk_bytes(&self, len: u64) -> u64 {
        (self.c1 as u64 * CHUNK).min(len) - self.c0 as u64 * CHUNK
    }
}

/// Cuts `[a, b)` of data of `len` bytes into at most three pieces: a
/// partial first chunk, the whole chunks, a partial last chunk.
fn pieces(a: u64, b: u64, len: u64) -> Vec<Piece> {
    let one = |at: u64, to: u64| Piece {
        c0: (at / CHUNK) as usize,
        c1: (at / CHUNK) as usize + 1,
        a: at,
        b: to,
    };
    let mut v = Vec::with_capacity(3);
    let mut at = a;
    if !at.is_multiple_of(CHUNK) && at < b {
        let to = b.min(at.next_multiple_of(CHUNK));
        v.push(one(at, to));
        at = to;
    }
    let whole_end = if b == len { b } else { b - b % CHUNK };
    if whole_end > at {
        v.push(Piece {
            c0: (at / CHUNK) as usize,
            c1: whole_end.div_ceil(CHUNK) as usize,
            a: at,
            b: whole_end,
        });
        at = whole_end;
    }
    if at < b {
        v.push(one(at, b));
    }
    v
}

impl Drop for CachedStore {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has written the rest.
        drop(self.writer.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(h) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
        self.entry
            .data
            .report(|| format!("the disk tier's file {}", self.entry.dir.display()));
    }
}

/// Opens the entry `dir` of `key` (None: there is none; an entry of
/// another layout is replaced; another key's is a collision: None too,
/// after which the caller's make fails on the existing directory).
fn open_entry(dir: &Path, key: &str, len: u64) -> io::Result<Option<(File, File)>> {
    let held = match fs::read_to_string(dir.join("key")) {
        Ok(k) => k,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if held != key {
        return Ok(None);
    }
    let rw = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(name))
    };
    let (data, index) = match (rw("data"), rw("index")) {
        (Ok(d), Ok(i)) => (d, i),
        _ => {
            remove_entry(dir)?;
            return Ok(None);
        }
    };
    let mut head = [0u8; HEADER as usize];
    let ok = crate::direct::read_full(&index, &mut head, 0).is_ok_and(|n| n == head.len())
        && &head[..8] == MAGIC
        && u64::from_le_bytes(head[8..16].try_into().expect("8")) == CHUNK
        && u64::from_le_bytes(head[16..24].try_into().expect("8")) == len
        && data.metadata().is_ok_and(|m| m.len() == len);
    if !ok {
        remove_entry(dir)?;
        return Ok(None);
    }
    // Touch: the entry was used now (least recently used goes first).
    let _ = File::options()
        .write(true)
        .open(dir.join("key"))
        .and_then(|f| f.set_modified(SystemTime::now()));
    Ok(Some((data, index)))
}

/// Makes the entry `dir` for `key`: built in a temporary directory, then
/// renamed into place (another process that made it first wins; its
/// entry is as good).
fn make_entry(root: &Path, dir: &Path, key: &str, len: u64) -> io::Result<()> {
    let tmp = root.join(format!(
        ".new-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Relaxed)
    ));
    fs::DirBuilder::new().mode(0o700).create(&tmp)?;
    let made = (|| {
        let create = |name: &str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(tmp.join(name))
        };
        create("data")?.set_len(len)?;
        let index = create("index")?;
        let mut head = [0u8; HEADER as usize];
        head[..8].copy_from_slice(MAGIC);
        head[8..16].copy_from_slice(&CHUNK.to_le_bytes());
        head[16..24].copy_from_slice(&len.to_le_bytes());
        index.write_all_at(&head, 0)?;
        index.set_len(HEADER + len.div_ceil(CHUNK) * 8)?;
        // The key last: an entry with a key is whole.
        let k = create("key.tmp")?;
        k.write_all_at(key.as_bytes(), 0)?;
        fs::rename(tmp.join("key.tmp"), tmp.join("key"))
    })();
    let res = made.and_then(|()| match fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        // Made by another process meanwhile (or another key's: the
        // caller's open then finds the collision).
        Err(e) if dir.exists() => {
            let _ = e;
            Ok(())
        }
        Err(e) => Err(e),
    });
    if tmp.exists() {
        let _ = fs::remove_dir_all(&tmp);
    }
    res
}

impl Entry {
    /// Learns from the index which of the chunks `[c, end_c)` that this
    /// process knows absent another process has inserted since (one read
    /// of their words, only if one is absent here).
    fn refresh(&self, c: usize, end_c: usize) {
        let end_c = end_c.min(self.words.len());
        if c >= end_c || self.words[c..end_c].iter().all(|w| w.load(Relaxed) != 0) {
            return;
        }
        let mut raw = vec![0u8; (end_c - c) * 8];
        if self
            .index
            .read_exact_at(&mut raw, HEADER + c as u64 * 8)
            .is_err()
        {
            return;
        }
        for (w, b) in self.words[c..end_c].iter().zip(raw.chunks_exact(8)) {
            let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            if v != 0 {
                w.store(v, Relaxed);
            }
        }
    }

    /// Whether chunk `c` is present, as this process knows.
    fn present(&self, c: usize) -> bool {
        self.words.get(c).is_some_and(|w| w.load(Relaxed) != 0)
    }

    /// Serves the runs `disk` (read index, first chunk, end chunk, from,
    /// where to) from disk, up to [`DISK_READERS`] at once; returns each
    /// run's read index, range and the chunks that hashed wrong.
    #[allow(clippy::type_complexity)]
    fn serve_all(
        &self,
        disk: Vec<(usize, usize, usize, u64, &mut [u8])>,
    ) -> Vec<(usize, u64, u64, Vec<usize>)> {
        let one = |(i, c, end_c, at, dst): (usize, usize, usize, u64, &mut [u8])| {
            let end = at + dst.len() as u64;
            (i, at, end, self.serve(c, end_c, at, dst))
        };
        let workers = DISK_READERS.min(disk.len() / 2);
        if workers <= 1 {
            return disk.into_iter().map(one).collect();
        }
        let tasks = Mutex::new(disk.into_iter());
        let next = || tasks.lock().unwrap_or_else(|p| p.into_inner()).next();
        std::thread::scope(|s| {
            let hands: Vec<_> = (1..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        while let Some(t) = next() {
                            done.push(one(t));
                        }
                        done
                    })
                })
                .collect();
            let mut done = Vec::new();
            while let Some(t) = next() {
                done.push(one(t));
            }
            for h in hands {
                // A panic in a reader is a bug: propagate it.
                done.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            done
        })
    }

    /// Takes a job's chunks out of the queue (after their words are set,
    /// or after the job failed).
    fn unqueue(&self, job: &Job) {
        let mut q = self.lock_queued();
        for (k, c) in job.chunks.iter().enumerate() {
            if q.get(&(job.first + k))
                .is_some_and(|held| Arc::ptr_eq(held, c))
            {
                q.remove(&(job.first + k));
            }
        }
        self.queued.fetch_sub(job.bytes(), Relaxed);
        drop(q);
        self.room.notify_all();
    }

    /// Reserves `n` bytes of the queue, waiting up to [`QUEUE_WAIT`] for
    /// the writer to make room (a dropped insert costs a fetch later);
    /// false: no room (or more than the queue or the cache holds).
    fn reserve_queue(&self, n: u64) -> bool {
        if n > QUEUE_BYTES || n > self.size {
            return false;
        }
        let deadline = Instant::now() + QUEUE_WAIT;
        let mut q = self.lock_queued();
        loop {
            let cur = self.queued.load(Relaxed);
            if cur + n <= QUEUE_BYTES {
                self.queued.store(cur + n, Relaxed);
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self
                .room
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Where chunk `c` is, as this process knows.
    fn state(&self, c: usize) -> Held {
        if self.present(c) {
            Held::Disk
        } else if self.queued.load(Relaxed) > 0 && self.lock_queued().contains_key(&c) {
            Held::Queued
        } else {
            Held::Absent
        }
    }

    fn lock_queued(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Arc<[u8]>>> {
        self.queued_chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves the part of the queued chunks `[c, end_c)` from data offset
    /// `at` into `dst` from the writer's queue; returns the chunks it no
    /// longer holds (written meanwhile: fetched again, rarely).
    fn serve_queued(&self, c: usize, end_c: usize, at: u64, dst: &mut [u8]) -> Vec<usize> {
        let q = self.lock_queued();
        let mut bad = Vec::new();
        for k in c..end_c {
            let k0 = k as u64 * CHUNK;
            let a = k0.max(at);
            let b = (k0 + CHUNK).min(at + dst.len() as u64);
            match q.get(&k) {
                Some(bytes) if bytes.len() as u64 >= b - k0 => {
                    dst[(a - at) as usize..(b - at) as usize]
                        .copy_from_slice(&bytes[(a - k0) as usize..(b - k0) as usize]);
                    self.counters.hits.fetch_add(1, Relaxed);
                    self.counters.hit_bytes.fetch_add(b - a, Relaxed);
                }
                _ => bad.push(k),
            }
        }
        bad
    }

    /// Reads the chunks `[c, end_c)` from disk and serves the part of them
    /// from data offset `at` into `dst`; returns the chunks that hashed
    /// wrong (all of them if the read failed), whose part of `dst` is left
    /// for the caller to fetch. Whole chunks are read straight into
    /// `dst`, a partial first or last one into a chunk of scratch.
    fn serve(&self, c: usize, end_c: usize, at: u64, dst: &mut [u8]) -> Vec<usize> {
        debug_assert!(c as u64 * CHUNK <= at && at + dst.len() as u64 <= (end_c as u64 * CHUNK));
        let mut bad = Vec::new();
        for p in pieces(at, at + dst.len() as u64, self.len) {
            let here = &mut dst[(p.a - at) as usize..(p.b - at) as usize];
            let wrong = if p.whole(self.len) {
                self.read_checked(p.c0, here)
            } else {
                let mut chunk = vec![0u8; p.chunk_bytes(self.len) as usize];
                let wrong = self.read_checked(p.c0, &mut chunk);
                if wrong.is_empty() {
                    let from = (p.a - p.c0 as u64 * CHUNK) as usize;
                    let n = here.len();
                    here.copy_from_slice(&chunk[from..from + n]);
                }
                wrong
            };
            let good = (p.c1 - p.c0 - wrong.len()) as u64;
            self.counters.hits.fetch_add(good, Relaxed);
            let served = (p.b - p.a).saturating_sub(wrong.len() as u64 * CHUNK);
            self.counters.hit_bytes.fetch_add(served, Relaxed);
            bad.extend(wrong);
        }
        bad
    }

    /// Reads whole chunks from chunk `c` on into `buf` and checks each
    /// against its index word; returns those that hash wrong (absent from
    /// now on), or all if the read failed.
    fn read_checked(&self, c: usize, buf: &mut [u8]) -> Vec<usize> {
        let start = c as u64 * CHUNK;
        let read = self.data.read(buf, start).is_ok_and(|n| n == buf.len());
        self.data
            .report(|| format!("the disk tier's file {}", self.dir.display()));
        let chunks = buf.len().div_ceil(CHUNK as usize);
        if !read {
            return (c..c + chunks).collect();
        }
        let mut bad = Vec::new();
        for (k, piece) in buf.chunks(CHUNK as usize).enumerate() {
            let w = &self.words[c + k];
            if hash_word(piece) != w.load(Relaxed) {
                w.store(0, Relaxed);
                self.counters.corrupt.fetch_add(1, Relaxed);
                bad.push(c + k);
            }
        }
        bad
    }

    /// Writes a job's chunks: bytes first, then their index words.
    fn write_job(&self, job: &Job, stage: &mut Option<Mapping>) -> io::Result<()> {
        let n = job.bytes();
        if self.used.load(Relaxed) + n > self.size || self.since_scan.load(Relaxed) > self.size / 8
        {
            self.make_room(n);
        }
        if self.used.load(Relaxed) + n > self.size {
            return Err(io::ErrorKind::StorageFull.into());
        }
        let stage = match stage {
            Some(m) => m,
            None => stage.insert(Mapping::anonymous(
                STAGE_BYTES as usize,
                upager_sys::PAGE_SIZE,
                true,
            )?),
        };
        // Through the stage, STAGE_BYTES at a time: whole pages through
        // O_DIRECT, a last partial page (the end of the data) buffered.
        let per = (STAGE_BYTES / CHUNK) as usize;
        for (p, group) in job.chunks.chunks(per).enumerate() {
            let at = (job.first + p * per) as u64 * CHUNK;
            let mut len = 0usize;
            for c in group {
                stage.write_at(len, c);
                len += c.len();
            }
            let direct = len - len % upager_sys::PAGE_SIZE;
            if direct > 0 {
                self.data.write(
                    Src {
                        map: stage,
                        off: 0,
                        len: direct,
                    },
                    at,
                )?;
            }
            if direct < len {
                let mut tail = vec![0u8; len - direct];
                stage.read_at(direct, &mut tail);
                self.data.buffered.write_all_at(&tail, at + direct as u64)?;
            }
        }
        let hashes: Vec<u64> = job.chunks.iter().map(|c| hash_word(c)).collect();
        let words: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        self.index
            .write_all_at(&words, HEADER + job.first as u64 * 8)?;
        for (k, h) in hashes.into_iter().enumerate() {
            self.words[job.first + k].store(h, Relaxed);
        }
        self.used.fetch_add(n, Relaxed);
        self.since_scan.fetch_add(n, Relaxed);
        self.counters.inserts.fetch_add(1, Relaxed);
        self.counters.bytes.store(self.used.load(Relaxed), Relaxed);
        Ok(())
    }

    /// Frees room for `need` more bytes: counts the directory, then, while
    /// it is above 7/8 of the size less `need`, removes other entries least
    /// recently used first, then evicts chunks of this one.
    fn make_room(&self, need: u64) {
        let target = (self.size - self.size / 8).saturating_sub(need);
        let info = scan(&self.root).unwrap_or_default();
        let mut used = info.bytes;
        self.since_scan.store(0, Relaxed);
        for ent in &info.entries {
            if used <= target {
                break;
            }
            if ent.path == self.dir {
                continue;
            }
            if remove_entry(&ent.path).is_ok() {
                used = used.saturating_sub(ent.bytes);
                self.counters
                    .evictions
                    .fetch_add(ent.bytes.div_ceil(CHUNK), Relaxed);
            }
        }
        // Then this entry's own chunks, from the hand on.
        let chunks = self.words.len();
        let mut looked = 0;
        while used > target && looked < chunks {
            let c = self.hand.fetch_add(1, Relaxed) % chunks;
            looked += 1;
            if self.words[c].swap(0, Relaxed) == 0 {
                continue;
            }
            let off = c as u64 * CHUNK;
            let len = CHUNK.min(self.len - off);
            // The word first, then the bytes: no reader is served a
            // punched chunk as present.
            let zero = 0u64.to_le_bytes();
            if self
                .index
                .write_all_at(&zero, HEADER + c as u64 * 8)
                .is_ok()
                && upager_sys::io::punch_hole(&self.data.buffered, off, len).is_ok()
            {
                used = used.saturating_sub(len);
                self.counters.evictions.fetch_add(1, Relaxed);
            }
        }
        self.used.store(used, Relaxed);
        self.counters.bytes.store(used, Relaxed);
    }
}

impl Store for CachedStore {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn writable(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut one = [ReadReq { buf, offset }];
        self.read_runs(&mut one).pop().expect("one read")
    }
    fn read_batch(&self, reads: &mut [ReadReq<'_>]) -> Vec<io::Result<usize>> {
        self.read_runs(reads)
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        self.inner.write_from(src, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn store_counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.entry.counters;
        let mut v = self.inner.store_counters();
        v.extend([
            ("cache_hits", c.hits.load(Relaxed)),
            ("cache_misses", c.misses.load(Relaxed)),
            ("cache_hit_bytes", c.hit_bytes.load(Relaxed)),
            ("cache_bytes", c.bytes.load(Relaxed)),
            ("cache_evictions", c.evictions.load(Relaxed)),
            ("cache_inserts", c.inserts.load(Relaxed)),
            ("cache_drops", c.drops.load(Relaxed)),
            ("cache_corrupt", c.corrupt.load(Relaxed)),
            ("cache_read_ns", c.read_ns.load(Relaxed)),
        ]);
        v
    }
    fn round_trips(&self) -> bool {
        self.inner.round_trips()
    }
    fn unit(&self) -> u64 {
        self.inner.unit()
    }
    fn write_unit(&self) -> u64 {
        self.inner.write_unit()
    }
    fn trace_version(&self) -> Option<u64> {
        self.inner.trace_version()
    }
    fn load_trace(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.load_trace()
    }
    fn save_trace(&self, trace: &[u8]) -> io::Result<()> {
        self.inner.save_trace(trace)
    }
    fn cache_key(&self) -> Option<String> {
        None
    }
    fn pool_key(&self) -> Option<String> {
        self.inner.pool_key()
    }
}

#[cfg(test)]
mod tests {
    use super::{pieces, Piece, CHUNK};

    /// A range is cut into a partial first chunk, whole chunks and a
    /// partial last chunk; every byte in one piece, in order; a range
    /// that ends the data ends in whole chunks.
    #[test]
    fn pieces_cover_the_range_once_in_whole_chunks_where_they_can() {
        let len = 10 * CHUNK + 100;
        let p = |c0, c1, a, b| Piece { c0, c1, a, b };
        assert_eq!(pieces(0, 2 * CHUNK, len), [p(0, 2, 0, 2 * CHUNK)]);
        assert_eq!(
            pieces(4096, 3 * CHUNK + 8192, len),
            [
                p(0, 1, 4096, CHUNK),
                p(1, 3, CHUNK, 3 * CHUNK),
                p(3, 4, 3 * CHUNK, 3 * CHUNK + 8192)
            ]
        );
        assert_eq!(pieces(4096, 8192, len), [p(0, 1, 4096, 8192)]);
        assert_eq!(pieces(9 * CHUNK, len, len), [p(9, 11, 9 * CHUNK, len)]);
        assert!(pieces(9 * CHUNK, len, len)[0].whole(len));
        assert!(!pieces(4096, 8192, len)[0].whole(len));
        for &(a, b) in &[(0, len), (4096, len), (CHUNK - 4096, CHUNK + 4096), (5, 6)] {
            let v = pieces(a, b, len);
            assert_eq!(v.first().unwrap().a, a);
            assert_eq!(v.last().unwrap().b, b);
            assert!(v.windows(2).all(|w| w[0].b == w[1].a));
        }
    }
}
