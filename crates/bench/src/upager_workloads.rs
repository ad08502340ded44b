//! upager's side of every scenario, as code that runs inside the worker
//! process: the same workloads as the kernel's, through a [`upager::Pager`]
//! in one configuration ([`UpagerConfig`]; the ablations are real code paths
//! of the engine: `batch(1)`, `Lookup::Locked`, 4 KiB folios,
//! `batched_removal(false)`), and the residency classifications of seed 004.
//!
//! The worker is NOT put into a memory cgroup: upager enforces its own
//! budget, which is the cgroup limit the kernel gets in the same scenario.
//! Data files are the same files on the same zram ext4; upager reads them
//! with O_DIRECT (no page cache). Evicted pages come from the engine's
//! `evictions` counter (folios × folio size / 4 KiB).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use std::sync::Arc;

use upager::{FaultMode, Lookup, MapOptions, Pager, Region, Residency};
use upager_redis::{OpenError, RedisOptions, RedisStore, StoreUrl};
use upager_testdata::{xor_word, xorshift64, GOLDEN};

use crate::host::{ncpu, NAME_PREFIX};
use crate::latency::{Histogram, MULTI_FAULT_SAMPLE_EVERY};
use crate::meter::{median, wio, Meter, WorkerResult, WorkloadError};
use crate::raw;
use crate::tlb_reach;

const PAGE: usize = 4096;

/// One upager configuration (the knobs the ablations turn).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct UpagerConfig {
    /// Folio size, KiB (unmap-folio overrides it per variant).
    pub folio_kb: u64,
    /// Folios per eviction batch (`None` = the engine's default, 4 MiB).
    pub batch: Option<usize>,
    /// Locked region lookup on the fault path (seed-001 ablation).
    pub locked_lookup: bool,
    /// Batched removal under one lock (seed-003 ablation when false).
    pub batched_removal: bool,
    /// Largest readahead, bytes (`None` = default 2 MiB).
    pub readahead: Option<u64>,
    /// Fault handler threads (`None` = default).
    pub handler_threads: Option<usize>,
    /// Userfaultfds the fault queue is split over (`None` = the engine's
    /// default, one per handler thread).
    pub uffd_shards: Option<usize>,
    /// Map data files read-write (nothing is written): 2 MiB folios become
    /// huge pages only in writable regions.
    pub writable: bool,
    /// Directory of anonymous regions' swap files (`None` = temp dir).
    pub swap_dir: Option<PathBuf>,
    /// How faults are resolved. Always set on the builder, so
    /// `UPAGER_FAULT_MODE` in the environment cannot change what an engine's
    /// name says. In JSON by its name (`handlers`, `in-thread`).
    #[serde(with = "fault_mode_name")]
    pub fault_mode: FaultMode,
    /// A Redis Cluster (`redis-cluster://HOST:PORT`) the data lives on
    /// instead of the file: the data file is uploaded once as a
    /// dataset named after it (chunks of the folio size) and mapped by
    /// name; anonymous regions swap to the cluster. `None`: the file and
    /// the local swap file.
    pub store: Option<String>,
    /// With `store`: one pipeline per node per batch (true) or one round
    /// trip per folio (false, the ablation).
    pub store_pipelined: bool,
    /// Mixed folio sizes (`None` = the engine's default, on).
    pub huge_runs: Option<bool>,
    /// `PagerBuilder::readahead_async` (None: the engine's default).
    pub readahead_async: Option<bool>,
}

/// [`FaultMode`] in JSON as its name (`"in-thread"`).
pub mod fault_mode_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use upager::FaultMode;

    /// Serialize as `FaultMode::name`.
    pub fn serialize<S: Serializer>(m: &FaultMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(m.name())
    }

    /// Parse with `FaultMode`'s `FromStr`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FaultMode, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl Default for UpagerConfig {
    fn default() -> Self {
        UpagerConfig {
            folio_kb: upager::DEFAULT_FOLIO / 1024,
            batch: None,
            locked_lookup: false,
            batched_removal: true,
            readahead: None,
            handler_threads: None,
            uffd_shards: None,
            writable: false,
            swap_dir: None,
            fault_mode: FaultMode::Handlers,
            store: None,
            store_pipelined: true,
            huge_runs: None,
            readahead_async: None,
        }
    }
}

/// How the residency scenario classifies the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResidencyMethod {
    /// `Region::residency(0, len)`: runs from the folio state words.
    UpagerRuns,
    /// `Region::pagemap(0, len)`: one /proc/pid/pagemap-shaped word per page.
    UpagerPagemap,
    /// One pread of /proc/self/pagemap over the region.
    ProcPagemap,
    /// PAGEMAP_SCAN ioctl over the region (runs of present/swapped pages).
    PagemapScan,
}

/// A scenario's workload for upager.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
pub enum UpagerJob {
    /// Seed 000: threads read one word per 4 KiB page of their own part of a
    /// mapped file, sequentially, checking the pattern.
    MmapRead {
        /// The pattern file.
        file: PathBuf,
        /// Reader threads.
        threads: usize,
        /// Pattern seed.
        seed: u64,
    },
    /// Uniform random one-word reads of random 4 KiB pages, checked.
    RandomRead {
        /// The pattern file.
        file: PathBuf,
        /// Threads.
        threads: usize,
        /// Reads per thread.
        reads_per_thread: u64,
        /// Pattern seed.
        seed: u64,
    },
    /// Seed 001: thread t write-faults its own `area_bytes` of one anonymous
    /// region (4 KiB folios, one fault per page like the kernel), then
    /// `discard`s it; repeat for `seconds`.
    MultiFault {
        /// Threads (pinned round-robin).
        threads: usize,
        /// Duration.
        seconds: f64,
        /// Area per thread.
        area_bytes: u64,
    },
    /// Seed 002: populate an anonymous region of `bytes` (one write per
    /// page), then time `Region::unmap`.
    Unmap {
        /// Region size.
        bytes: u64,
    },
    /// The TLB reach scenario: an anonymous region of `bytes` (budget: all of
    /// it and 256 MiB), every page written, then `reads` random 8-byte
    /// reads timed (no faults: everything resident).
    TlbReach {
        /// Region size.
        bytes: u64,
        /// Random reads.
        reads: u64,
    },
    /// Seed 003 (usemem): threads write one word per page of their own part
    /// of an anonymous region larger than the budget, then read it back.
    Usemem {
        /// Threads.
        threads: usize,
        /// Bytes per thread.
        bytes_per_thread: u64,
        /// Passes (the first writes).
        passes: u32,
    },
    /// The compressed tier's benchmark (anon_fill.rs): an anonymous
    /// region of `bytes` with the default options written word by word,
    /// read back and checked.
    AnonFill {
        /// Region size.
        bytes: u64,
        /// The data.
        kind: crate::anon_fill::FillKind,
    },
    /// Can a pager with this configuration be built and resolve a fault?
    /// (Asked before a run, so a fault mode the engine refuses is left out
    /// with a clear note instead of failing every run.) Maps 1 MiB of
    /// anonymous memory, writes and reads back one word per page.
    Probe,
    /// Seed 004: a file-backed region over a sparse file on /dev/shm, laid
    /// out per 4 MiB: 1 MiB resident, 1 MiB evicted (read, then paged out),
    /// 2 MiB never touched; time one classification of the whole region.
    Residency {
        /// Region size.
        bytes: u64,
        /// The classification to time.
        method: ResidencyMethod,
        /// Timed repetitions (the median is reported).
        repeats: u32,
    },
}

fn invalid(e: impl std::fmt::Display) -> WorkloadError {
    WorkloadError::Invalid(e.to_string())
}

fn pager(budget: u64, c: &UpagerConfig) -> Result<Pager, WorkloadError> {
    let mut b = Pager::builder()
        .budget(budget)
        .batched_removal(c.batched_removal)
        .fault_mode(c.fault_mode);
    if let Some(n) = c.batch {
        b = b.batch(n);
    }
    if c.locked_lookup {
        b = b.lookup(Lookup::Locked);
    }
    if let Some(r) = c.readahead {
        b = b.readahead(r);
    }
    if let Some(h) = c.handler_threads {
        b = b.handler_threads(h);
    }
    if let Some(n) = c.uffd_shards {
        b = b.uffd_shards(n);
    }
    if let Some(d) = &c.swap_dir {
        b = b.swap_dir(d);
    }
    if let Some(on) = c.huge_runs {
        b = b.huge_runs(on);
    }
    if let Some(on) = c.readahead_async {
        b = b.readahead_async(on);
    }
    b.build().map_err(invalid)
}

fn opts(c: &UpagerConfig) -> MapOptions {
    MapOptions::new()
        .folio(c.folio_kb * 1024)
        .writable(c.writable)
}

/// Run one upager job in this process (the worker).
pub fn run_job(
    budget: u64,
    c: &UpagerConfig,
    job: &UpagerJob,
) -> Result<WorkerResult, WorkloadError> {
    match job {
        UpagerJob::Unmap { bytes } => unmap(c, *bytes),
        UpagerJob::TlbReach { bytes, reads } => tlb_reach(c, *bytes, *reads),
        UpagerJob::Residency {
            bytes,
            method,
            repeats,
        } => residency(c, *bytes, *method, *repeats),
        _ => {
            let p = pager(budget, c)?;
            let mut r = match job {
                UpagerJob::MmapRead {
                    file,
                    threads,
                    seed,
                } => mmap_read(&p, c, file, *threads, *seed)?,
                UpagerJob::RandomRead {
                    file,
                    threads,
                    reads_per_thread,
                    seed,
                } => random_read(&p, c, file, *threads, *reads_per_thread, *seed)?,
                UpagerJob::MultiFault {
                    threads,
                    seconds,
                    area_bytes,
                } => multi_fault(&p, *threads, *seconds, *area_bytes)?,
                UpagerJob::Usemem {
                    threads,
                    bytes_per_thread,
                    passes,
                } => usemem(&p, c, *threads, *bytes_per_thread, *passes)?,
                UpagerJob::Probe => probe(&p)?,
                UpagerJob::AnonFill { bytes, kind } => crate::anon_fill::upager(&p, *bytes, *kind)?,
                UpagerJob::Unmap { .. }
                | UpagerJob::TlbReach { .. }
                | UpagerJob::Residency { .. } => unreachable!(),
            };
            // multi-fault and the probe map 4 KiB folios whatever the config.
            let folio_kb = match job {
                UpagerJob::MultiFault { .. } | UpagerJob::Probe => PAGE as u64 / 1024,
                _ => c.folio_kb,
            };
            add_stats(&mut r, &p, folio_kb);
            Ok(r)
        }
    }
}

/// Engine counters into `extra` as `upager.<name>`, plus `evicted_pages`.
fn add_stats(r: &mut WorkerResult, p: &Pager, folio_kb: u64) {
    let s = p.stats();
    for (k, v) in s.iter() {
        r.extra.insert(format!("upager.{k}"), v as f64);
    }
    r.extra.insert(
        "evicted_pages".into(),
        (s.evictions * folio_kb * 1024 / PAGE as u64) as f64,
    );
    r.extra.insert("folio_kb".into(), folio_kb as f64);
    r.extra.insert(
        "upager.fault_mode_in_thread".into(),
        f64::from(u8::from(p.fault_mode() == FaultMode::InThread)),
    );
}

fn probe(p: &Pager) -> Result<WorkerResult, WorkloadError> {
    let len = 1u64 << 20;
    let region = p
        .map_anonymous(len, &MapOptions::new().folio(PAGE as u64))
        .map_err(invalid)?;
    let meter = Meter::start()?;
    let words = region.words();
    let mut bad = 0;
    for (i, o) in (0..len as usize).step_by(PAGE).enumerate() {
        words[o / 8].store(i as u64 + 1, Relaxed);
    }
    for (i, o) in (0..len as usize).step_by(PAGE).enumerate() {
        bad += u64::from(words[o / 8].load(Relaxed) != i as u64 + 1);
    }
    let r = meter.stop(len / PAGE as u64, bad)?;
    region.unmap().map_err(|(e, _)| invalid(e))?;
    Ok(r)
}

/// Threads started behind a barrier; the meter starts when they are
/// released. Each thread gets its own [`Histogram`] for the latencies it
/// times; they are merged into the returned one.
fn timed<T: Send>(
    threads: usize,
    f: impl Fn(usize, &Barrier, &mut Histogram) -> Result<T, WorkloadError> + Sync,
) -> Result<(Meter, Vec<T>, Histogram), WorkloadError> {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (f, b) = (&f, &barrier);
                s.spawn(move || {
                    let mut hist = Box::new(Histogram::new());
                    f(t, b, &mut hist).map(|r| (r, hist))
                })
            })
            .collect();
        let meter = Meter::start()?;
        barrier.wait();
        let mut out = Vec::with_capacity(threads);
        let mut all = Histogram::new();
        for h in hs {
            let (r, hist) = h.join().map_err(|_| invalid("a thread panicked"))??;
            out.push(r);
            all.merge(&hist);
        }
        Ok((meter, out, all))
    })
}

/// A run's Redis store (`UpagerConfig::store`), kept to read its wire
/// counters after the workload.
type Remote = Option<Arc<RedisStore>>;

fn redis_opts(c: &UpagerConfig) -> RedisOptions {
    RedisOptions {
        pipelined: c.store_pipelined,
        ..RedisOptions::default()
    }
}

fn store_url(seed: &str) -> Result<StoreUrl, WorkloadError> {
    seed.parse().map_err(invalid)
}

/// The data file as a region: the file itself, or its copy on the
/// configured Redis Cluster (uploaded before the run when the cluster does
/// not hold it yet: named after the file, its size, mtime and the chunk,
/// so a remade file or another folio size gets a dataset of its own).
fn map_data(p: &Pager, c: &UpagerConfig, file: &Path) -> Result<(Region, Remote), WorkloadError> {
    let Some(seed) = &c.store else {
        return Ok((p.map_file(file, &opts(c)).map_err(invalid)?, None));
    };
    let meta = std::fs::metadata(file).map_err(invalid)?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let chunk = c.folio_kb * 1024;
    let stem = file
        .file_name()
        .map_or("data".into(), |n| n.to_string_lossy().into_owned());
    let url = store_url(seed)?.with_name(&format!("bench-{stem}-{}-{mtime}-{chunk}", meta.len()));
    let ro = redis_opts(c);
    let st = match RedisStore::open(&url, c.writable, &ro) {
        Ok(st) => st,
        Err(OpenError::NotFound { .. }) => {
            upager_redis::upload(file, &url, chunk, &RedisOptions::default(), &mut |_, _| {})
                .map_err(invalid)?;
            RedisStore::open(&url, c.writable, &ro).map_err(invalid)?
        }
        Err(e) => return Err(invalid(e)),
    };
    let region = p
        .map_store(st.clone() as Arc<dyn upager::Store>, &opts(c))
        .map_err(invalid)?;
    Ok((region, Some(st)))
}

/// Anonymous memory: swapped to the local swap file, or to the configured
/// Redis Cluster.
fn map_anon(p: &Pager, c: &UpagerConfig, len: u64) -> Result<(Region, Remote), WorkloadError> {
    let Some(seed) = &c.store else {
        return Ok((p.map_anonymous(len, &opts(c)).map_err(invalid)?, None));
    };
    let st =
        RedisStore::swap(&store_url(seed)?, c.folio_kb * 1024, &redis_opts(c)).map_err(invalid)?;
    let region = p
        .map_anonymous_on(st.clone() as Arc<dyn upager::Store>, len, &opts(c))
        .map_err(invalid)?;
    Ok((region, Some(st)))
}

/// The store's wire counters into `extra` as `redis.<name>`, with
/// `redis.commands_per_round_trip` and `redis.wait_us_per_batch` (a
/// write round's SETs and WAIT, per WAIT).
fn add_store_counters(r: &mut WorkerResult, remote: &Remote) {
    let Some(st) = remote else { return };
    let c = st.counters();
    for (k, v) in [
        ("round_trips", c.round_trips),
        ("commands", c.commands),
        ("bytes_sent", c.bytes_sent),
        ("bytes_received", c.bytes_received),
        ("replication_waits", c.replication_waits),
        ("replication_wait_ns", c.replication_wait_ns),
        ("retries", c.retries),
    ] {
        r.extra.insert(format!("redis.{k}"), v as f64);
    }
    r.extra.insert(
        "redis.commands_per_round_trip".into(),
        c.commands as f64 / c.round_trips.max(1) as f64,
    );
    if c.replication_waits > 0 {
        r.extra.insert(
            "redis.wait_us_per_batch".into(),
            c.replication_wait_ns as f64 / c.replication_waits as f64 / 1e3,
        );
    }
}

fn mmap_read(
    p: &Pager,
    c: &UpagerConfig,
    file: &Path,
    threads: usize,
    seed: u64,
) -> Result<WorkerResult, WorkloadError> {
    let (region, remote) = map_data(p, c, file)?;
    let threads = threads.max(1);
    let pages = region.len() / PAGE;
    let words = region.words();
    let (meter, res, _) = timed(threads, |t, b, _| {
        let (lo, hi) = (pages * t / threads, pages * (t + 1) / threads);
        b.wait();
        let mut bad = 0u64;
        for pg in lo..hi {
            let off = pg * PAGE;
            if words[off / 8].load(Relaxed) != xor_word(off as u64, seed) {
                bad += 1;
            }
        }
        Ok(((hi - lo) as u64, bad))
    })?;
    let (ops, bad) = res.iter().fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
    let mut r = meter.stop(ops, bad)?;
    r.extra.insert("bytes".into(), region.len() as f64);
    r.extra.insert(
        "gb_per_s".into(),
        region.len() as f64 / r.elapsed_s.max(1e-9) / 1e9,
    );
    add_store_counters(&mut r, &remote);
    Ok(r)
}

fn random_read(
    p: &Pager,
    c: &UpagerConfig,
    file: &Path,
    threads: usize,
    reads: u64,
    seed: u64,
) -> Result<WorkerResult, WorkloadError> {
    let (region, remote) = map_data(p, c, file)?;
    let threads = threads.max(1);
    let pages = (region.len() / PAGE) as u64;
    let words = region.words();
    let (meter, res, hist) = timed(threads, |t, b, hist| {
        // The same sequence as the kernel workload, timed the same way.
        let mut rng = GOLDEN ^ ((t as u64 + 1) << 32) ^ seed;
        b.wait();
        let mut bad = 0u64;
        for _ in 0..reads {
            let r = xorshift64(&mut rng);
            let off = ((r % pages) as usize) * PAGE + ((r >> 40) as usize % (PAGE / 8)) * 8;
            let t0 = Instant::now();
            let w = black_box(words[off / 8].load(Relaxed));
            hist.record(t0.elapsed().as_nanos() as u64);
            if w != xor_word(off as u64, seed) {
                bad += 1;
            }
        }
        Ok((reads, bad))
    })?;
    let (ops, bad) = res.iter().fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
    let mut r = meter.stop(ops, bad)?;
    r.latency = hist.summary();
    add_store_counters(&mut r, &remote);
    Ok(r)
}

fn multi_fault(
    p: &Pager,
    threads: usize,
    seconds: f64,
    area: u64,
) -> Result<WorkerResult, WorkloadError> {
    let threads = threads.max(1);
    let area = area.max(PAGE as u64) / PAGE as u64 * PAGE as u64;
    let region = p
        .map_anonymous(area * threads as u64, &MapOptions::new().folio(4096))
        .map_err(invalid)?;
    let bytes = region.bytes();
    let n = ncpu();
    let (meter, res, hist) = timed(threads, |t, b, hist| {
        let _ = raw::pin_to_cpu(t % n);
        let base = t as u64 * area;
        b.wait();
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let mut faults = 0u64;
        while Instant::now() < end {
            // Timed like the kernel workload: one page in
            // MULTI_FAULT_SAMPLE_EVERY.
            for (i, o) in (base..base + area).step_by(PAGE).enumerate() {
                if i % MULTI_FAULT_SAMPLE_EVERY == 0 {
                    let t0 = Instant::now();
                    bytes[o as usize].store(1, Relaxed);
                    hist.record(t0.elapsed().as_nanos() as u64);
                } else {
                    bytes[o as usize].store(1, Relaxed);
                }
            }
            faults += area / PAGE as u64;
            region.discard(base, area).map_err(invalid)?;
        }
        Ok(faults)
    })?;
    let mut r = meter.stop(res.iter().sum(), 0)?;
    r.latency = hist.summary();
    r.extra.insert("threads".into(), threads as f64);
    Ok(r)
}

fn usemem(
    p: &Pager,
    c: &UpagerConfig,
    threads: usize,
    per: u64,
    passes: u32,
) -> Result<WorkerResult, WorkloadError> {
    let threads = threads.max(1);
    let per = per.max(PAGE as u64) / PAGE as u64 * PAGE as u64;
    let passes = passes.max(1);
    let (region, remote) = map_anon(p, c, per * threads as u64)?;
    let words = region.words();
    let (meter, res, _) = timed(threads, |t, b, _| {
        let base = t as u64 * per;
        b.wait();
        let (mut ops, mut bad) = (0u64, 0u64);
        for pass in 0..passes {
            for o in (0..per).step_by(PAGE) {
                let v = ((t as u64) << 48) ^ o;
                let w = &words[((base + o) / 8) as usize];
                if pass == 0 {
                    w.store(v, Relaxed);
                } else if w.load(Relaxed) != v {
                    bad += 1;
                }
            }
            ops += per / PAGE as u64;
        }
        Ok((ops, bad))
    })?;
    let (ops, bad) = res.iter().fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
    let mut r = meter.stop(ops, bad)?;
    r.extra
        .insert("bytes".into(), (per * threads as u64) as f64);
    add_store_counters(&mut r, &remote);
    Ok(r)
}

fn unmap(c: &UpagerConfig, bytes: u64) -> Result<WorkerResult, WorkloadError> {
    let folio = c.folio_kb * 1024;
    let bytes = bytes.max(folio) / folio * folio;
    let p = pager(bytes + (64 << 20), c)?;
    let region = p.map_anonymous(bytes, &opts(c)).map_err(invalid)?;
    let t = Instant::now();
    let b = region.bytes();
    for o in (0..bytes as usize).step_by(PAGE) {
        b[o].store(1, Relaxed);
    }
    let populate_s = t.elapsed().as_secs_f64();
    let resident = p.stats().resident_bytes;
    let meter = Meter::start()?;
    region.unmap().map_err(|(e, _)| invalid(e))?;
    let mut r = meter.stop(bytes / PAGE as u64, 0)?;
    r.extra.insert("populate_s".into(), populate_s);
    r.extra.insert("folio_kb".into(), c.folio_kb as f64);
    r.extra.insert("resident_before".into(), resident as f64);
    add_stats(&mut r, &p, c.folio_kb);
    Ok(r)
}

/// The TLB reach scenario through upager: the region fully resident
/// (budget: the region and 256 MiB), then the reads of `tlb_reach`.
fn tlb_reach(c: &UpagerConfig, bytes: u64, reads: u64) -> Result<WorkerResult, WorkloadError> {
    let folio = c.folio_kb * 1024;
    let bytes = bytes.max(folio) / folio * folio;
    let p = pager(bytes + (256 << 20), c)?;
    let region = p.map_anonymous(bytes, &opts(c)).map_err(invalid)?;
    let words = region.words();
    for w in (0..words.len()).step_by(PAGE / 8) {
        words[w].store(1, Relaxed);
    }
    let mut r = tlb_reach::measure(words, reads, region.as_ptr() as u64, bytes as usize)?;
    add_stats(&mut r, &p, c.folio_kb);
    Ok(r)
}

/// A sparse file on /dev/shm (or the temp dir), unlinked on drop.
struct Sparse(PathBuf);
impl Drop for Sparse {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Layout of the residency region per 4 MiB group.
const GROUP: u64 = 4 << 20;
const CHUNK: u64 = 1 << 20;

fn residency(
    c: &UpagerConfig,
    bytes: u64,
    method: ResidencyMethod,
    repeats: u32,
) -> Result<WorkerResult, WorkloadError> {
    let bytes = bytes.max(GROUP) / GROUP * GROUP;
    let groups = bytes / GROUP;
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let sparse = Sparse(dir.join(format!("{}residency-{}", NAME_PREFIX, std::process::id())));
    std::fs::File::create(&sparse.0)
        .and_then(|f| f.set_len(bytes))
        .map_err(wio(format!("creating {}", sparse.0.display())))?;
    // Budget: the resident quarter plus room for the reclaimer's watermarks,
    // so nothing resident is evicted; no readahead, so never-touched stays so.
    let cfg = UpagerConfig {
        readahead: Some(0),
        ..c.clone()
    };
    let p = pager(groups * CHUNK + (32 << 20), &cfg)?;
    let region = p.map_file(&sparse.0, &opts(&cfg)).map_err(invalid)?;
    let folio = region.folio_size() as usize;
    let b = region.bytes();
    let touch = |off: u64| {
        for o in (off..off + CHUNK).step_by(folio) {
            black_box(b[o as usize].load(Relaxed));
        }
    };
    let t = Instant::now();
    // Evicted quarter: read all of it (fits in the budget), page it all out.
    let threads = ncpu().max(1) as u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let touch = &touch;
            s.spawn(move || {
                for g in (t..groups).step_by(threads as usize) {
                    touch(g * GROUP + CHUNK);
                }
            });
        }
    });
    region.pageout(0, bytes).map_err(invalid)?;
    std::thread::scope(|s| {
        for t in 0..threads {
            let touch = &touch;
            s.spawn(move || {
                for g in (t..groups).step_by(threads as usize) {
                    touch(g * GROUP);
                }
            });
        }
    });
    let setup_s = t.elapsed().as_secs_f64();
    // Check the layout before timing anything. A fill publishes its folio's
    // state just after the UFFDIO_COPY woke the faulting thread, so the last
    // folios touched may still read BUSY for a moment.
    let mut by_state: BTreeMap<&'static str, u64> = BTreeMap::new();
    let settle = Instant::now() + Duration::from_secs(2);
    let mut runs = region.residency(0, bytes).map_err(invalid)?;
    while runs.iter().any(|(_, s)| *s == Residency::Busy) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(1));
        runs = region.residency(0, bytes).map_err(invalid)?;
    }
    for (r, s) in &runs {
        let k = match s {
            Residency::ResidentClean | Residency::ResidentDirty => "resident",
            Residency::Evicted => "evicted",
            Residency::NeverTouched => "never",
            _ => "busy",
        };
        *by_state.entry(k).or_default() += r.end - r.start;
    }
    let want = [
        ("resident", bytes / 4),
        ("evicted", bytes / 4),
        ("never", bytes / 2),
    ];
    for (k, v) in want {
        if by_state.get(k).copied().unwrap_or(0) != v {
            return Err(invalid(format!(
                "residency layout is not ¼ resident, ¼ evicted, ½ never touched: {by_state:?} ({} runs)",
                runs.len()
            )));
        }
    }
    let pagemap_file =
        std::fs::File::open("/proc/self/pagemap").map_err(wio("/proc/self/pagemap"))?;
    let base = region.as_ptr() as u64;
    let mut times = Vec::new();
    let mut answer = BTreeMap::new();
    let meter = Meter::start()?;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        match method {
            ResidencyMethod::UpagerRuns => {
                let r = region.residency(0, bytes).map_err(invalid)?;
                answer.insert("runs", r.len() as f64);
                black_box(r);
            }
            ResidencyMethod::UpagerPagemap => {
                let v = region.pagemap(0, bytes).map_err(invalid)?;
                count_pagemap(&v, &mut answer);
                black_box(v);
            }
            ResidencyMethod::ProcPagemap => {
                let mut v = Vec::new();
                upager_sys::pagemap::read_pagemap(&pagemap_file, base, bytes, &mut v)
                    .map_err(wio("reading /proc/self/pagemap"))?;
                count_pagemap(&v, &mut answer);
                black_box(v);
            }
            ResidencyMethod::PagemapScan => {
                use upager_sys::pagemap::{category, pagemap_scan};
                let mut out = Vec::with_capacity(4096);
                let (mut cur, end) = (base, base + bytes);
                let (mut n, mut present) = (0u64, 0u64);
                while cur < end {
                    cur = pagemap_scan(
                        &pagemap_file,
                        cur,
                        end,
                        0,
                        category::PRESENT | category::SWAPPED,
                        &mut out,
                    )
                    .map_err(wio("PAGEMAP_SCAN"))?;
                    n += out.len() as u64;
                    present += out
                        .iter()
                        .filter(|r| r.categories & category::PRESENT != 0)
                        .map(|r| (r.end - r.start) / PAGE as u64)
                        .sum::<u64>();
                    if out.is_empty() {
                        break;
                    }
                }
                answer.insert("runs", n as f64);
                answer.insert("present_pages", present as f64);
            }
        }
        times.push(t.elapsed().as_secs_f64());
    }
    let mut r = meter.stop(bytes / PAGE as u64 * u64::from(repeats.max(1)), 0)?;
    r.elapsed_s = median(&times);
    r.user_s /= f64::from(repeats.max(1));
    r.sys_s /= f64::from(repeats.max(1));
    r.ops = bytes / PAGE as u64;
    r.extra.insert("setup_s".into(), setup_s);
    r.extra.insert(
        "min_s".into(),
        times.iter().copied().fold(f64::INFINITY, f64::min),
    );
    for (k, v) in answer {
        r.extra.insert(k.into(), v);
    }
    for (k, v) in by_state {
        r.extra.insert(format!("layout_{k}_bytes"), v as f64);
    }
    add_stats(&mut r, &p, cfg.folio_kb);
    drop(region);
    drop(sparse);
    Ok(r)
}

/// Counts present and swapped pages of pagemap words into `answer`: the same
/// tally for upager's pagemap-shaped answer and the kernel's.
fn count_pagemap<M: Extend<(&'static str, f64)>>(words: &[u64], answer: &mut M) {
    use upager_sys::pagemap::{PM_PRESENT, PM_SWAPPED};
    let present = words.iter().filter(|&&w| w & PM_PRESENT != 0).count();
    let swapped = words.iter().filter(|&&w| w & PM_SWAPPED != 0).count();
    answer.extend([
        ("present_pages", present as f64),
        ("swapped_pages", swapped as f64),
    ]);
}
