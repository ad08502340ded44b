//! The stress workload, shared by the `upager-stress` binary (hours) and the
//! CI test `crates/upager/tests/reliability_stress.rs` (seconds), which
//! includes this file with `#[path]`. It uses only `std`, `upager`,
//! `upager_sys` and `upager_testdata` (its generator, hash and pattern
//! checks), so both can build it.
//!
//! What runs, all at once, against ONE pager:
//!
//! ```text
//!  workers (N)   read / write / verify 64-byte checksummed records in two
//!                file regions and one anonymous region, each several times
//!                the budget; record i belongs to worker i % N, so folios
//!                are shared and faults on one folio race between threads
//!  cross reads   workers also read other workers' records under the
//!                record's seqlock and check the checksum
//!  flusher       flush() of the file regions every few tens of ms
//!  churn         maps a file region, verifies it against what the previous
//!                cycle wrote, writes more, unmaps (or drops) it; maps,
//!                writes, verifies and unmaps anonymous regions
//!  syscaller     write(2) from a third, read-only region whose store fails
//!                reads at random: EFAULT is expected and retried, data that
//!                arrives is checked
//!  sampler       mincore() over every live region (from outside the engine)
//!                and the process RSS, every millisecond
//! ```
//!
//! Faults injected ([`FlakyStore`]) into the two shared file regions: write
//! errors (EIO, ENOSPC), short writes (half the bytes land, then ENOSPC),
//! slow reads and writes; into the syscaller's region: read errors. At the
//! end injection stops, everything is flushed and unmapped, and the files are
//! read back with plain reads: every record must hold exactly the version its
//! owner last wrote (and a good checksum), every never-written record zeros.
//!
//! Record layout (8 words): `[seq, tag, p0..p4, checksum]`. `seq` is a
//! seqlock: odd while the owner writes, `2 * version` when stable.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{fence, AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::{EIO, ENOSPC};
use upager::{FileStore, MapOptions, Pager, Region, Src, Store};
use upager_testdata::{first_mismatch, mix, write_file, Rng};

/// Bytes per record.
pub const RECORD: u64 = 64;
const WORDS: usize = (RECORD / 8) as usize;

/// The eight words of record `idx` of a region with `salt`, at `version`
/// (version 0: never written, all zeros).
pub fn record_words(salt: u64, idx: u64, version: u64) -> [u64; WORDS] {
    if version == 0 {
        return [0; WORDS];
    }
    let mut w = [0u64; WORDS];
    w[0] = 2 * version;
    w[1] = idx | (salt << 48);
    for (k, x) in w[2..7].iter_mut().enumerate() {
        *x = mix(salt ^ (idx << 8) ^ (version << 40) ^ k as u64);
    }
    w[7] = checksum(&w);
    w
}

/// Checksum of words 0..7.
pub fn checksum(w: &[u64]) -> u64 {
    w[..WORDS - 1]
        .iter()
        .fold(0x5157_4E55_u64, |acc, &x| mix(acc ^ x))
}

/// Checks a record read as eight words: returns its version, or why it is bad.
pub fn check_record(salt: u64, idx: u64, w: &[u64]) -> Result<u64, String> {
    if w.iter().all(|&x| x == 0) {
        return Ok(0);
    }
    let version = w[0] / 2;
    if !w[0].is_multiple_of(2) || w != record_words(salt, idx, version) {
        return Err(format!(
            "record {idx} (salt {salt}) is corrupt: {w:016x?}, expected {:016x?}",
            record_words(salt, idx, version)
        ));
    }
    Ok(version)
}

/// Writes record `idx` at `version` into a region (the owner alone writes
/// it; readers use [`read_record_seqlock`]).
pub fn write_record(r: &Region, salt: u64, idx: u64, version: u64) {
    let w = &r.words()[idx as usize * WORDS..][..WORDS];
    let new = record_words(salt, idx, version);
    w[0].store(new[0] - 1, Relaxed); // odd: writing
    fence(Release);
    for k in 1..WORDS {
        w[k].store(new[k], Relaxed);
    }
    w[0].store(new[0], Release);
}

/// Reads record `idx` as its owner (no concurrent writer).
pub fn read_record(r: &Region, idx: u64) -> [u64; WORDS] {
    let w = &r.words()[idx as usize * WORDS..][..WORDS];
    std::array::from_fn(|k| w[k].load(Acquire))
}

/// Reads record `idx` while its owner may write it: None if it kept changing.
pub fn read_record_seqlock(r: &Region, idx: u64) -> Option<[u64; WORDS]> {
    let w = &r.words()[idx as usize * WORDS..][..WORDS];
    for _ in 0..64 {
        let s1 = w[0].load(Acquire);
        if s1 % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let mut out = [0u64; WORDS];
        out[0] = s1;
        for k in 1..WORDS {
            out[k] = w[k].load(Relaxed);
        }
        fence(Acquire);
        if w[0].load(Relaxed) == s1 {
            return Some(out);
        }
    }
    None
}

/// A file store that injects faults on demand: write errors (EIO, ENOSPC),
/// short writes (the first half lands, then ENOSPC), read errors (EIO), and
/// delays. Probabilities are per million calls; all zero = a plain
/// [`FileStore`].
#[derive(Debug)]
pub struct FlakyStore {
    inner: FileStore,
    /// The same file, for the first half of a short write.
    raw: Option<File>,
    /// Write calls failed with EIO, per million.
    pub write_eio_ppm: AtomicU64,
    /// Write calls failed with ENOSPC, per million.
    pub write_enospc_ppm: AtomicU64,
    /// Write calls that write half, then fail with ENOSPC, per million.
    pub short_write_ppm: AtomicU64,
    /// Read calls failed with EIO, per million.
    pub read_eio_ppm: AtomicU64,
    /// Calls delayed by 0.2–2 ms, per million.
    pub delay_ppm: AtomicU64,
    /// Fail every write (until cleared).
    pub fail_all_writes: AtomicBool,
    /// Reads return at most half of what was asked (a store breaking the
    /// `Store::read_at` contract: short only at the end).
    pub short_reads: AtomicBool,
    rng: Mutex<Rng>,
    /// Faults injected so far (errors, short writes, delays).
    pub injected: AtomicU64,
    /// Of `injected`: write errors and short writes.
    pub injected_write_errors: AtomicU64,
    /// Of `injected`: read errors.
    pub injected_read_errors: AtomicU64,
    /// Of `injected`: delays.
    pub injected_delays: AtomicU64,
    /// Write calls that reached the file.
    pub writes_ok: AtomicU64,
}

impl FlakyStore {
    /// Wraps `path` (no O_DIRECT, so any buffer alignment works).
    pub fn open(path: &Path, writable: bool, seed: u64) -> io::Result<FlakyStore> {
        let raw = if writable {
            Some(std::fs::OpenOptions::new().write(true).open(path)?)
        } else {
            None
        };
        Ok(FlakyStore {
            inner: FileStore::open(path, writable, false)?,
            raw,
            write_eio_ppm: AtomicU64::new(0),
            write_enospc_ppm: AtomicU64::new(0),
            short_write_ppm: AtomicU64::new(0),
            read_eio_ppm: AtomicU64::new(0),
            delay_ppm: AtomicU64::new(0),
            fail_all_writes: AtomicBool::new(false),
            short_reads: AtomicBool::new(false),
            rng: Mutex::new(Rng::new(seed)),
            injected: AtomicU64::new(0),
            injected_write_errors: AtomicU64::new(0),
            injected_read_errors: AtomicU64::new(0),
            injected_delays: AtomicU64::new(0),
            writes_ok: AtomicU64::new(0),
        })
    }

    /// Stops injecting faults (the store "recovers").
    pub fn heal(&self) {
        for p in [
            &self.write_eio_ppm,
            &self.write_enospc_ppm,
            &self.short_write_ppm,
            &self.read_eio_ppm,
            &self.delay_ppm,
        ] {
            p.store(0, SeqCst);
        }
        self.fail_all_writes.store(false, SeqCst);
        self.short_reads.store(false, SeqCst);
    }

    fn roll(&self, ppm: &AtomicU64) -> bool {
        let p = ppm.load(Relaxed);
        p > 0 && self.rng.lock().unwrap_or_else(|e| e.into_inner()).chance(p)
    }

    fn maybe_delay(&self) {
        if self.roll(&self.delay_ppm) {
            let us = 200
                + self
                    .rng
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .below(1800);
            std::thread::sleep(Duration::from_micros(us));
            self.injected.fetch_add(1, Relaxed);
            self.injected_delays.fetch_add(1, Relaxed);
        }
    }

    fn write_error(&self, errno: i32) -> io::Error {
        self.injected.fetch_add(1, Relaxed);
        self.injected_write_errors.fetch_add(1, Relaxed);
        io::Error::from_raw_os_error(errno)
    }
}

impl Store for FlakyStore {
    fn describe(&self) -> String {
        format!("test store over {}", self.inner.describe())
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.maybe_delay();
        if self.roll(&self.read_eio_ppm) {
            self.injected.fetch_add(1, Relaxed);
            self.injected_read_errors.fetch_add(1, Relaxed);
            return Err(io::Error::from_raw_os_error(EIO));
        }
        if self.short_reads.load(SeqCst) && buf.len() > 4096 {
            let half = buf.len() / 2;
            self.injected.fetch_add(1, Relaxed);
            return self.inner.read_at(&mut buf[..half], offset);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        self.maybe_delay();
        if self.fail_all_writes.load(SeqCst) || self.roll(&self.write_enospc_ppm) {
            return Err(self.write_error(ENOSPC));
        }
        if self.roll(&self.write_eio_ppm) {
            return Err(self.write_error(EIO));
        }
        if self.roll(&self.short_write_ppm) {
            // Half of the bytes land, then the device is full: a short write
            // reported as the error that stopped it.
            let mut buf = vec![0u8; src.len()];
            src.copy_to(&mut buf);
            let half = src.len() / 2;
            if let Some(f) = &self.raw {
                f.write_all_at(&buf[..half], offset)?;
            }
            return Err(self.write_error(ENOSPC));
        }
        self.inner.write_from(src, offset)?;
        self.writes_ok.fetch_add(1, Relaxed);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// Residency sampled from outside the engine: `mincore` over every live
/// region registered here, and the process RSS.
#[derive(Debug, Default)]
pub struct Sampler {
    ranges: Mutex<Vec<(u64, u64)>>,
    /// Largest number of region bytes the kernel had mapped at once.
    pub max_mapped: AtomicU64,
    /// Largest RSS seen (bytes).
    pub max_rss: AtomicU64,
    /// Samples taken.
    pub samples: AtomicU64,
    /// Samples thrown away because the sampling thread was preempted or
    /// slow while it walked the regions (see [`Sampler::sample`]).
    pub discarded: AtomicU64,
}

impl Sampler {
    /// Starts watching `r` (call before touching it).
    pub fn add(&self, r: &Region) {
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((r.as_ptr() as u64, r.len() as u64));
    }
    /// Stops watching `r` (call before unmapping or dropping it): the
    /// sampler never looks at memory that is gone.
    pub fn remove(&self, r: &Region) {
        let a = r.as_ptr() as u64;
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&(b, _)| b != a);
    }
    /// Takes one sample; returns the mapped bytes seen, or `None` when the
    /// sample was thrown away.
    ///
    /// The regions are walked one after another, so a folio evicted from a
    /// region already counted and filled into one not yet counted is
    /// counted twice. Over a walk of well under a millisecond that is
    /// bounded by what faults can fill meanwhile (far less than a batch);
    /// but a sampler preempted mid-walk (a loaded or niced run: seen at
    /// nice 19 with a load average of 12, max mapped 28.6 MiB against a
    /// budget of 24 + 4) counts whatever was filled while it slept. Such a
    /// sample (an involuntary context switch of this thread during the
    /// walk, or a walk over [`SAMPLE_MAX`]) is thrown away, and counted.
    pub fn sample(&self) -> Option<u64> {
        let switches = nonvoluntary_switches();
        let started = std::time::Instant::now();
        let mapped: u64 = {
            let g = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
            g.iter()
                .map(|&(a, l)| {
                    upager_sys::mem::mincore(a, l)
                        .map(|v| v.iter().filter(|&&b| b & 1 != 0).count() as u64 * 4096)
                        .unwrap_or(0)
                })
                .sum()
        };
        if started.elapsed() > SAMPLE_MAX || nonvoluntary_switches() != switches {
            self.discarded.fetch_add(1, Relaxed);
            return None;
        }
        self.max_mapped.fetch_max(mapped, Relaxed);
        self.max_rss.fetch_max(rss_bytes(), Relaxed);
        self.samples.fetch_add(1, Relaxed);
        Some(mapped)
    }
}

/// Longest walk of the regions whose sample counts (a guess: a walk takes
/// ~0.1-0.3 ms here; in 2 ms two threads fill at most ~1.2 MiB of 4 KiB
/// folios, under one batch).
const SAMPLE_MAX: std::time::Duration = std::time::Duration::from_millis(2);

/// This thread's involuntary context switches so far
/// (`/proc/thread-self/status`); None if unreadable.
fn nonvoluntary_switches() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Resident set size of this process (`/proc/self/statm`), in bytes.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |p| p * 4096)
}

/// Parameters of a run.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long the workers run.
    pub duration: Duration,
    /// Pager budget.
    pub budget: u64,
    /// Each shared region is this many times the budget.
    pub region_mult: u64,
    /// Worker threads.
    pub workers: usize,
    /// Fault-handler threads.
    pub handler_threads: usize,
    /// Directory for the files and the swap files (RAM-backed is best).
    pub dir: PathBuf,
    /// Seed of every random choice.
    pub seed: u64,
    /// Inject faults.
    pub inject: bool,
    /// Print a progress line this often (None: quiet).
    pub progress: Option<Duration>,
}

impl Config {
    /// Small, CI-sized defaults in `dir`.
    pub fn ci(dir: &Path, duration: Duration) -> Config {
        Config {
            duration,
            budget: 24 << 20,
            region_mult: 3,
            workers: 4,
            handler_threads: 2,
            dir: dir.to_path_buf(),
            seed: 0x5EED,
            inject: true,
            progress: None,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Wall time of the worker phase.
    pub elapsed: Duration,
    /// Record writes by workers and churn.
    pub writes: u64,
    /// Reads checked against the owner's version.
    pub reads_verified: u64,
    /// Other workers' records read under the seqlock and checksummed.
    pub cross_reads: u64,
    /// Records checked in the files (plain reads) and the anonymous region at the end.
    pub final_records_checked: u64,
    /// Of those, written at least once (each proves no write was lost).
    pub final_writes_verified: u64,
    /// Faults injected (errors, short writes, delays).
    pub faults_injected: u64,
    /// Of those: failed or short writes.
    pub injected_write_errors: u64,
    /// Of those: failed reads.
    pub injected_read_errors: u64,
    /// Of those: delays.
    pub injected_delays: u64,
    /// flush() calls that succeeded / reported an (injected) error.
    pub flushes_ok: u64,
    /// See `flushes_ok`.
    pub flush_errors: u64,
    /// Regions mapped and unmapped by the churn thread.
    pub churn_cycles: u64,
    /// write(2) calls from the flaky region that got EFAULT (and were retried).
    pub syscall_efaults: u64,
    /// write(2) calls from the flaky region whose data was checked.
    pub syscall_ok: u64,
    /// pageout() calls that succeeded / reported an (injected) write error.
    pub pageouts_ok: u64,
    /// See `pageouts_ok`.
    pub pageout_errors: u64,
    /// prefetch() + residency() checks.
    pub prefetches: u64,
    /// discard() calls in the churn regions (then verified).
    pub discards: u64,
    /// Budget.
    pub budget: u64,
    /// One eviction batch in bytes (the allowed overshoot).
    pub batch_bytes: u64,
    /// Largest region memory the kernel had mapped at once (mincore).
    pub max_mapped: u64,
    /// Largest RSS growth over the start of the run.
    pub max_rss_growth: u64,
    /// RSS at the start (after setup).
    pub rss_base: u64,
    /// Residency samples taken.
    pub samples: u64,
    /// Samples discarded (the sampler was preempted mid-walk).
    pub discarded: u64,
    /// The engine's own counters at the end.
    pub stats: Option<upager::Stats>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(f, "elapsed            {:.1} s", self.elapsed.as_secs_f64())?;
        writeln!(
            f,
            "writes             {} ({} reads verified, {} cross reads)",
            self.writes, self.reads_verified, self.cross_reads
        )?;
        writeln!(
            f,
            "writes verified    {} of {} records checked at the end with plain reads",
            self.final_writes_verified, self.final_records_checked
        )?;
        writeln!(
            f,
            "faults injected    {} ({} write errors/short writes, {} read errors, {} delays)",
            self.faults_injected,
            self.injected_write_errors,
            self.injected_read_errors,
            self.injected_delays
        )?;
        writeln!(
            f,
            "flushes            {} ok, {} reported an injected error; pageouts {} ok, {} write errors; {} prefetch+residency; {} discards",
            self.flushes_ok, self.flush_errors, self.pageouts_ok, self.pageout_errors, self.prefetches, self.discards
        )?;
        writeln!(
            f,
            "churn              {} map/verify/unmap cycles; syscalls from flaky region: {} ok, {} EFAULT",
            self.churn_cycles, self.syscall_ok, self.syscall_efaults
        )?;
        writeln!(
            f,
            "max resident       {:.1} MiB mapped (mincore, {} samples, {} discarded: sampler preempted) vs budget {:.1} MiB + batch {:.1} MiB",
            mib(self.max_mapped),
            self.samples,
            self.discarded,
            mib(self.budget),
            mib(self.batch_bytes)
        )?;
        writeln!(
            f,
            "RSS                {:.1} MiB at start, max growth {:.1} MiB",
            mib(self.rss_base),
            mib(self.max_rss_growth)
        )?;
        if let Some(s) = &self.stats {
            write!(
                f,
                "engine             {} faults, {} evictions in {} batches, {} writebacks, {} writeback errors, {} read errors, {} faults failed, peak {:.1} MiB",
                s.faults_missing + s.faults_wp,
                s.evictions,
                s.evict_batches,
                s.writebacks,
                s.writeback_errors,
                s.read_errors,
                s.faults_failed,
                mib(s.resident_peak_bytes)
            )?;
        }
        Ok(())
    }
}

/// One shared region and what its owners wrote.
struct Shared {
    region: Region,
    salt: u64,
    records: u64,
    store: Option<Arc<FlakyStore>>,
    path: Option<PathBuf>,
    /// versions[t][i / workers] = version of record i (owner t = i % workers).
    versions: Vec<Mutex<Vec<u32>>>,
}

/// Everything the threads share.
struct World {
    cfg: Config,
    pager: Pager,
    shared: Vec<Shared>,
    sampler: Sampler,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
    writes: AtomicU64,
    reads_verified: AtomicU64,
    cross_reads: AtomicU64,
    flushes_ok: AtomicU64,
    flush_errors: AtomicU64,
    churn_cycles: AtomicU64,
    syscall_ok: AtomicU64,
    syscall_efaults: AtomicU64,
    pageouts_ok: AtomicU64,
    pageout_errors: AtomicU64,
    prefetches: AtomicU64,
    discards: AtomicU64,
}

impl World {
    fn fail(&self, msg: String) {
        let mut g = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            eprintln!("upager-stress: FAILURE: {msg}");
            *g = Some(msg);
        }
        self.stop.store(true, SeqCst);
    }
    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
}

/// The word at byte `off` of the syscaller's read-only pattern file.
fn sys_word(off: u64) -> u64 {
    mix((off / 8) ^ 0xABCD)
}

fn zero_file(path: &Path, len: u64) -> io::Result<()> {
    let f = File::create(path)?;
    f.set_len(len)?;
    Ok(())
}

/// Runs the workload; Err(what went wrong) on any violated invariant.
pub fn run(cfg: Config) -> Result<Summary, String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let pager = Pager::builder()
        .budget(cfg.budget)
        .handler_threads(cfg.handler_threads)
        .swap_dir(&cfg.dir)
        .build()
        .map_err(|e| err("pager", &e))?;
    let region_len = cfg.budget * cfg.region_mult;
    let mut shared = Vec::new();
    // Two flaky file regions (64 KiB and 16 KiB folios) and one anonymous
    // region (32 KiB folios).
    for (k, folio) in [(0u64, 64u64 << 10), (1, 16 << 10)] {
        let path = cfg.dir.join(format!("stress-{k}.bin"));
        zero_file(&path, region_len).map_err(|e| err("create file", &e))?;
        let store = Arc::new(
            FlakyStore::open(&path, true, cfg.seed ^ k).map_err(|e| err("open store", &e))?,
        );
        if cfg.inject {
            store.write_eio_ppm.store(2_000, Relaxed);
            store.write_enospc_ppm.store(2_000, Relaxed);
            store.short_write_ppm.store(2_000, Relaxed);
            store.delay_ppm.store(10_000, Relaxed);
        }
        let region = pager
            .map_store(
                Arc::clone(&store) as Arc<dyn Store>,
                &MapOptions::new().writable(true).folio(folio),
            )
            .map_err(|e| err("map file", &e))?;
        shared.push(Shared {
            region,
            salt: k + 1,
            records: region_len / RECORD,
            store: Some(store),
            path: Some(path),
            versions: Vec::new(),
        });
    }
    let anon = pager
        .map_anonymous(region_len, &MapOptions::new().folio(32 << 10))
        .map_err(|e| err("map anonymous", &e))?;
    shared.push(Shared {
        region: anon,
        salt: 3,
        records: region_len / RECORD,
        store: None,
        path: None,
        versions: Vec::new(),
    });
    for s in &mut shared {
        let per = s.records.div_ceil(cfg.workers as u64) as usize;
        s.versions = (0..cfg.workers)
            .map(|_| {
                let mut v = vec![1u32; per];
                std::hint::black_box(&mut v);
                v.fill(0);
                Mutex::new(v)
            })
            .collect();
    }
    // The read-only region of the syscaller: a pattern file whose store
    // fails reads at random.
    let sys_path = cfg.dir.join("stress-sys.bin");
    write_file(&sys_path, 8 << 20, sys_word).map_err(|e| err("write sys file", &e))?;
    let sys_store =
        Arc::new(FlakyStore::open(&sys_path, false, cfg.seed ^ 99).map_err(|e| err("open", &e))?);
    if cfg.inject {
        sys_store.read_eio_ppm.store(50_000, Relaxed);
        sys_store.delay_ppm.store(20_000, Relaxed);
    }
    let sys_region = pager
        .map_store(
            Arc::clone(&sys_store) as Arc<dyn Store>,
            &MapOptions::new().folio(64 << 10),
        )
        .map_err(|e| err("map sys", &e))?;

    let batch_bytes = 4u64 << 20; // the default eviction batch (DEFAULT_BATCH_BYTES)
    let world = Arc::new(World {
        cfg: cfg.clone(),
        pager,
        shared,
        sampler: Sampler::default(),
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
        writes: AtomicU64::new(0),
        reads_verified: AtomicU64::new(0),
        cross_reads: AtomicU64::new(0),
        flushes_ok: AtomicU64::new(0),
        flush_errors: AtomicU64::new(0),
        churn_cycles: AtomicU64::new(0),
        syscall_ok: AtomicU64::new(0),
        syscall_efaults: AtomicU64::new(0),
        pageouts_ok: AtomicU64::new(0),
        pageout_errors: AtomicU64::new(0),
        prefetches: AtomicU64::new(0),
        discards: AtomicU64::new(0),
    });
    for s in &world.shared {
        world.sampler.add(&s.region);
    }
    world.sampler.add(&sys_region);
    let rss_base = rss_bytes();
    let start = Instant::now();

    std::thread::scope(|scope| {
        let w = &world;
        // Sampler.
        scope.spawn(move || {
            while !w.stopped() {
                let mapped = w.sampler.sample();
                if let Some(mapped) = mapped.filter(|&m| m > w.cfg.budget + batch_bytes) {
                    w.fail(format!(
                        "the kernel had {mapped} bytes of region memory mapped: budget {} + batch {batch_bytes}",
                        w.cfg.budget
                    ));
                }
                let s = w.pager.stats();
                if s.resident_bytes > w.cfg.budget {
                    w.fail(format!("resident_bytes {} over budget", s.resident_bytes));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        for t in 0..cfg.workers {
            scope.spawn(move || worker(w, t));
        }
        scope.spawn(move || flusher(w));
        scope.spawn(move || churn(w));
        let sys_region = &sys_region;
        let sys_store = &sys_store;
        scope.spawn(move || syscaller(w, sys_region, sys_store));
        // Timer and progress.
        let mut last = Instant::now();
        while !w.stopped() && start.elapsed() < cfg.duration {
            std::thread::sleep(Duration::from_millis(20));
            if let Some(every) = cfg.progress {
                if last.elapsed() >= every {
                    last = Instant::now();
                    let s = w.pager.stats();
                    eprintln!(
                        "[{:>7.1}s] writes {} verified reads {} cross {} flushes {}/{} churn {} injected {} | resident {:.1}/{:.1} MiB, max mapped {:.1} MiB, rss +{:.1} MiB, evictions {}, wb errors {}",
                        start.elapsed().as_secs_f64(),
                        w.writes.load(Relaxed),
                        w.reads_verified.load(Relaxed),
                        w.cross_reads.load(Relaxed),
                        w.flushes_ok.load(Relaxed),
                        w.flush_errors.load(Relaxed),
                        w.churn_cycles.load(Relaxed),
                        injected(w, sys_store).0,
                        s.resident_bytes as f64 / 1048576.0,
                        s.budget_bytes as f64 / 1048576.0,
                        w.sampler.max_mapped.load(Relaxed) as f64 / 1048576.0,
                        w.sampler.max_rss.load(Relaxed).saturating_sub(rss_base) as f64 / 1048576.0,
                        s.evictions,
                        s.writeback_errors,
                    );
                }
            }
        }
        w.stop.store(true, SeqCst);
    });
    let elapsed = start.elapsed();
    if let Some(f) = world
        .failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        return Err(f);
    }
    let (faults_injected, wr, rd, dl) = injected(&world, &sys_store);
    drop(sys_region);

    // Final check: heal, flush, unmap, read the files back.
    let world = Arc::try_unwrap(world).map_err(|_| "world still shared".to_string())?;
    let mut checked = 0u64;
    let mut verified = 0u64;
    let workers = cfg.workers as u64;
    for s in world.shared {
        if let Some(st) = &s.store {
            st.heal();
        }
        let versions: Vec<Vec<u32>> = s
            .versions
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let want = |i: u64| u64::from(versions[(i % workers) as usize][(i / workers) as usize]);
        match &s.path {
            Some(path) => {
                // The first flush after the store heals may still report a
                // write-back error of an eviction that failed earlier (the
                // error is sticky until one flush reports it, like fsync's);
                // the data itself stayed dirty. The next flush must succeed.
                if s.region.flush().is_err() {
                    s.region
                        .flush()
                        .map_err(|e| err("second final flush", &e))?;
                }
                s.region.unmap().map_err(|(e, _)| err("final unmap", &e))?;
                let data = std::fs::read(path).map_err(|e| err("read back", &e))?;
                for i in 0..s.records {
                    let w: Vec<u64> = data[(i * RECORD) as usize..][..RECORD as usize]
                        .chunks(8)
                        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect();
                    let v = check_record(s.salt, i, &w)?;
                    if v != want(i) {
                        return Err(format!(
                            "{}: record {i} holds version {v}, its owner last wrote {} (a lost write)",
                            path.display(),
                            want(i)
                        ));
                    }
                    checked += 1;
                    verified += u64::from(v > 0);
                }
                let _ = std::fs::remove_file(path);
            }
            None => {
                for i in 0..s.records {
                    let v = check_record(s.salt, i, &read_record(&s.region, i))?;
                    if v != want(i) {
                        return Err(format!(
                            "anonymous record {i} holds version {v}, its owner last wrote {}",
                            want(i)
                        ));
                    }
                    checked += 1;
                    verified += u64::from(v > 0);
                }
                s.region.unmap().map_err(|(e, _)| err("unmap anon", &e))?;
            }
        }
    }
    let _ = std::fs::remove_file(&sys_path);
    let leftovers: Vec<_> = std::fs::read_dir(&cfg.dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    if !leftovers.is_empty() {
        return Err(format!(
            "files left behind in {}: {leftovers:?}",
            cfg.dir.display()
        ));
    }
    let end = world.pager.stats();
    if end.resident_bytes != 0 {
        return Err(format!(
            "{} bytes still resident after unmapping everything",
            end.resident_bytes
        ));
    }
    Ok(Summary {
        elapsed,
        writes: world.writes.load(Relaxed),
        reads_verified: world.reads_verified.load(Relaxed),
        cross_reads: world.cross_reads.load(Relaxed),
        final_records_checked: checked,
        final_writes_verified: verified,
        faults_injected,
        injected_write_errors: wr,
        injected_read_errors: rd,
        injected_delays: dl,
        flushes_ok: world.flushes_ok.load(Relaxed),
        flush_errors: world.flush_errors.load(Relaxed),
        churn_cycles: world.churn_cycles.load(Relaxed),
        syscall_efaults: world.syscall_efaults.load(Relaxed),
        syscall_ok: world.syscall_ok.load(Relaxed),
        pageouts_ok: world.pageouts_ok.load(Relaxed),
        pageout_errors: world.pageout_errors.load(Relaxed),
        prefetches: world.prefetches.load(Relaxed),
        discards: world.discards.load(Relaxed),
        budget: cfg.budget,
        batch_bytes,
        max_mapped: world.sampler.max_mapped.load(Relaxed),
        max_rss_growth: world.sampler.max_rss.load(Relaxed).saturating_sub(rss_base),
        rss_base,
        samples: world.sampler.samples.load(Relaxed),
        discarded: world.sampler.discarded.load(Relaxed),
        stats: Some(end),
    })
}

fn injected(w: &World, sys: &FlakyStore) -> (u64, u64, u64, u64) {
    let stores = w
        .shared
        .iter()
        .filter_map(|s| s.store.as_deref())
        .chain([sys]);
    let mut t = (0, 0, 0, 0);
    for s in stores {
        t.0 += s.injected.load(Relaxed);
        t.1 += s.injected_write_errors.load(Relaxed);
        t.2 += s.injected_read_errors.load(Relaxed);
        t.3 += s.injected_delays.load(Relaxed);
    }
    t
}

fn worker(w: &World, t: usize) {
    let mut rng = Rng::new(w.cfg.seed ^ ((t as u64 + 1) * 0x1000_0001));
    let n = w.cfg.workers as u64;
    let mut writes = 0;
    let mut reads = 0;
    let mut cross = 0;
    while !w.stopped() {
        for _ in 0..256 {
            let s = &w.shared[rng.below(w.shared.len() as u64) as usize];
            let mine = |i: u64| i - i % n + t as u64;
            // A hot quarter gets half the accesses, so reclaim sees reuse.
            let span = if rng.chance(500_000) {
                s.records / 4
            } else {
                s.records
            };
            let mut i = mine(rng.below(span));
            if i >= s.records {
                i -= n;
            }
            let slot = (i / n) as usize;
            let op = rng.below(100);
            if op < 45 {
                let mut v = s.versions[t].lock().unwrap_or_else(|e| e.into_inner());
                v[slot] += 1;
                write_record(&s.region, s.salt, i, u64::from(v[slot]));
                writes += 1;
            } else if op < 80 {
                let want = u64::from(s.versions[t].lock().unwrap_or_else(|e| e.into_inner())[slot]);
                let got = read_record(&s.region, i);
                match check_record(s.salt, i, &got) {
                    Ok(v) if v == want => reads += 1,
                    Ok(v) => {
                        return w.fail(format!(
                            "worker {t}: record {i} (salt {}) reads version {v}, wrote {want}: lost write",
                            s.salt
                        ))
                    }
                    Err(e) => return w.fail(format!("worker {t}: {e}")),
                }
            } else if op < 97 {
                let j = rng.below(s.records);
                if let Some(got) = read_record_seqlock(&s.region, j) {
                    if let Err(e) = check_record(s.salt, j, &got) {
                        return w.fail(format!("worker {t} (cross read): {e}"));
                    }
                    cross += 1;
                }
            } else {
                // A short sequential sweep (readahead, many folios).
                let j = rng.below(s.records.saturating_sub(512).max(1));
                for k in j..(j + 512).min(s.records) {
                    if let Some(got) = read_record_seqlock(&s.region, k) {
                        if let Err(e) = check_record(s.salt, k, &got) {
                            return w.fail(format!("worker {t} (sweep): {e}"));
                        }
                        cross += 1;
                    }
                }
            }
        }
        w.writes.fetch_add(writes, Relaxed);
        w.reads_verified.fetch_add(reads, Relaxed);
        w.cross_reads.fetch_add(cross, Relaxed);
        (writes, reads, cross) = (0, 0, 0);
    }
}

/// Flushes, and pages out / prefetches random ranges of the shared regions
/// (explicit residency control: pageout, prefetch, discard) while the workers run.
fn flusher(w: &World) {
    let mut rng = Rng::new(w.cfg.seed ^ 0xF1);
    while !w.stopped() {
        std::thread::sleep(Duration::from_millis(5 + rng.below(30)));
        let s = &w.shared[rng.below(w.shared.len() as u64) as usize];
        match rng.below(3) {
            0 if s.path.is_some() => {
                match s.region.flush() {
                    Ok(()) => w.flushes_ok.fetch_add(1, Relaxed),
                    Err(_) => w.flush_errors.fetch_add(1, Relaxed),
                };
            }
            1 => {
                let (off, len) = folio_range(&mut rng, &s.region);
                match s.region.pageout(off, len) {
                    Ok(_) => w.pageouts_ok.fetch_add(1, Relaxed),
                    Err(upager::AdviseError::Writeback(_)) => {
                        w.pageout_errors.fetch_add(1, Relaxed)
                    }
                    Err(e) => return w.fail(format!("pageout {off}+{len}: {e}")),
                };
            }
            _ => {
                let (off, len) = folio_range(&mut rng, &s.region);
                if let Err(e) = s.region.prefetch(off, len) {
                    return w.fail(format!("prefetch {off}+{len}: {e}"));
                }
                // Residency answers from the folio states: never more
                // resident than the budget.
                match s.region.residency(0, s.region.len() as u64) {
                    Ok(runs) => {
                        let resident: u64 = runs
                            .iter()
                            .filter(|(_, st)| {
                                matches!(
                                    st,
                                    upager::Residency::ResidentClean
                                        | upager::Residency::ResidentDirty
                                )
                            })
                            .map(|(r, _)| r.end - r.start)
                            .sum();
                        if resident > w.cfg.budget + s.region.folio_size() {
                            return w
                                .fail(format!("residency() reports {resident} bytes resident"));
                        }
                    }
                    Err(e) => return w.fail(format!("residency: {e}")),
                }
                w.prefetches.fetch_add(1, Relaxed);
            }
        };
    }
}

/// A random whole-folio range of `r` (up to 64 folios).
fn folio_range(rng: &mut Rng, r: &Region) -> (u64, u64) {
    let f = r.folio_size();
    let nf = (r.len() as u64).div_ceil(f);
    let a = rng.below(nf);
    let end = (a + 1 + rng.below(64)).min(nf);
    let off = a * f;
    ((off), (end * f).min(r.len() as u64) - off)
}

fn churn(w: &World) {
    let mut rng = Rng::new(w.cfg.seed ^ 0xC4);
    let len = w.cfg.budget;
    let path = w.cfg.dir.join("stress-churn.bin");
    if let Err(e) = zero_file(&path, len) {
        return w.fail(format!("churn file: {e}"));
    }
    let records = len / RECORD;
    let mut versions = vec![0u32; records as usize];
    let salt = 7;
    let mut cycle = 0u64;
    while !w.stopped() {
        cycle += 1;
        let folio = 4096u64 << rng.below(6); // 4 KiB .. 128 KiB
        let r = match w
            .pager
            .map_file(&path, &MapOptions::new().writable(true).folio(folio))
        {
            Ok(r) => r,
            Err(e) => return w.fail(format!("churn map: {e}")),
        };
        w.sampler.add(&r);
        // Everything the previous cycles wrote is there.
        for i in (rng.below(7)..records).step_by(7) {
            match check_record(salt, i, &read_record(&r, i)) {
                Ok(v) if v == u64::from(versions[i as usize]) => {}
                Ok(v) => {
                    return w.fail(format!(
                    "churn cycle {cycle}: record {i} has version {v}, last written {} before unmap",
                    versions[i as usize]
                ))
                }
                Err(e) => return w.fail(format!("churn cycle {cycle}: {e}")),
            }
        }
        for _ in 0..2000 {
            let i = rng.below(records);
            versions[i as usize] += 1;
            write_record(&r, salt, i, u64::from(versions[i as usize]));
        }
        w.writes.fetch_add(2000, Relaxed);
        if rng.chance(300_000) {
            if let Err(e) = r.flush() {
                return w.fail(format!("churn flush: {e}"));
            }
            // Flushed: a discard drops only memory, the file reads back.
            let (off, dlen) = folio_range(&mut rng, &r);
            if let Err(e) = r.discard(off, dlen) {
                return w.fail(format!("churn discard: {e}"));
            }
            w.discards.fetch_add(1, Relaxed);
            for i in off / RECORD..(off + dlen) / RECORD {
                match check_record(salt, i, &read_record(&r, i)) {
                    Ok(v) if v == u64::from(versions[i as usize]) => {}
                    other => {
                        return w.fail(format!(
                            "churn cycle {cycle}: record {i} after flush + discard: {other:?}, want version {}",
                            versions[i as usize]
                        ))
                    }
                }
            }
        }
        w.sampler.remove(&r);
        if rng.chance(500_000) {
            if let Err((e, _)) = r.unmap() {
                return w.fail(format!("churn unmap: {e}"));
            }
        } else {
            drop(r); // flushes too
        }
        // An anonymous region: written, verified, unmapped.
        let alen = (1 + rng.below(3)) * len;
        let a = match w.pager.map_anonymous(alen, &MapOptions::new().folio(folio)) {
            Ok(a) => a,
            Err(e) => return w.fail(format!("churn map anonymous: {e}")),
        };
        w.sampler.add(&a);
        let step = 512 + rng.below(512) as usize;
        for k in (0..a.len() / 8).step_by(step) {
            a.words()[k].store(mix(k as u64 ^ cycle), Relaxed);
        }
        for k in (0..a.len() / 8).step_by(step / 2) {
            let want = if k % step == 0 {
                mix(k as u64 ^ cycle)
            } else {
                0
            };
            let got = a.words()[k].load(Relaxed);
            if got != want {
                return w.fail(format!(
                    "churn anonymous cycle {cycle}: word {k} = {got:#x}, want {want:#x}"
                ));
            }
        }
        let (off, dlen) = folio_range(&mut rng, &a);
        if let Err(e) = a.discard(off, dlen) {
            return w.fail(format!("churn discard anonymous: {e}"));
        }
        w.discards.fetch_add(1, Relaxed);
        for k in (off / 8..(off + dlen) / 8).step_by(97) {
            let got = a.words()[k as usize].load(Relaxed);
            if got != 0 {
                return w.fail(format!(
                    "churn anonymous cycle {cycle}: word {k} = {got:#x} after discard"
                ));
            }
        }
        w.sampler.remove(&a);
        if let Err((e, _)) = a.unmap() {
            return w.fail(format!("churn unmap anonymous: {e}"));
        }
        w.churn_cycles.fetch_add(1, Relaxed);
    }
    let _ = std::fs::remove_file(&path);
}

fn syscaller(w: &World, r: &Region, store: &FlakyStore) {
    let _ = store;
    let mut rng = Rng::new(w.cfg.seed ^ 0x5C);
    let sink_path = w.cfg.dir.join("stress-sink.bin");
    let sink = match File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&sink_path)
    {
        Ok(f) => f,
        Err(e) => return w.fail(format!("sink: {e}")),
    };
    let mut buf = vec![0u8; 256 << 10];
    while !w.stopped() {
        let len = 4096 * (1 + rng.below(64));
        let off = rng.below((r.len() as u64 - len) / 8) * 8;
        match upager_sys::io::pwrite_from(&sink, r.as_ptr() as u64 + off, len, 0) {
            Ok(n) => {
                let n = n as usize;
                if let Err(e) = sink.read_exact_at(&mut buf[..n - n % 8], 0) {
                    return w.fail(format!("sink read: {e}"));
                }
                if let Some(m) = first_mismatch(&buf[..n - n % 8], off, sys_word) {
                    return w.fail(format!(
                        "write(2) from the flaky region: word {} = {:#x}, want {:#x}",
                        m.offset / 8,
                        m.found,
                        m.expected
                    ));
                }
                w.syscall_ok.fetch_add(1, Relaxed);
            }
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                // EFAULT: an injected read error poisoned a folio; it clears
                // after the hold time and the retry reads again.
                w.syscall_efaults.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return w.fail(format!("write(2) from region: {e}")),
        }
    }
    drop(sink);
    let _ = std::fs::remove_file(&sink_path);
}
