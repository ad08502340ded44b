//! The kernel's side of each seed experiment, as code that runs inside the
//! worker process (`upager-bench-worker`), which the parent has put into the
//! run's memory cgroup before it starts working.
//!
//! Each workload times only its measured part and reports the CPU time
//! (`getrusage`, all threads) and page faults of that part. Data files have a
//! known pattern ([`crate::env::pattern_word`]) and every word read is
//! checked, so an engine that returns wrong data fails loudly instead of
//! looking fast.

use std::collections::BTreeMap;
use std::fs::File;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use memmap2::{Advice, MmapMut};

use crate::env::pattern_word;
use crate::raw;

const PAGE: usize = 4096;

/// Errors of running a workload.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum WorkloadError {
    /// {what}: {source}
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// {0}
    Invalid(String),
}

pub(crate) fn wio(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkloadError {
    let what = what.into();
    move |source| WorkloadError::Io { what, source }
}

/// `madvise` advice a file workload gives its mapping before reading: the
/// kernel's read-around differs (normal: up to 128 KiB around each missing
/// page; random: the missing page only; sequential: aggressive readahead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MapAdvice {
    /// No advice (MADV_NORMAL): what a plain mmap user gets.
    #[default]
    Normal,
    /// MADV_RANDOM.
    Random,
    /// MADV_SEQUENTIAL.
    Sequential,
}

/// One kernel workload and its parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "workload", rename_all = "kebab-case")]
pub enum Workload {
    /// Seed 000 (vm-scalability lru-file-mmap-read): `threads` threads read a
    /// `MAP_SHARED`, `PROT_READ` mapping of `file` sequentially, each its own
    /// contiguous part, one 8-byte word per 4 KiB page, checking the pattern.
    MmapRead {
        /// The pattern file.
        file: PathBuf,
        /// Reader threads.
        threads: usize,
        /// The file's pattern seed.
        seed: u64,
        /// Advice for the mapping.
        #[serde(default)]
        advice: MapAdvice,
    },
    /// CIDR'22 / vmcache lookups: `threads` threads each do
    /// `reads_per_thread` uniformly random 4 KiB-page reads (one word) of a
    /// mapped file.
    RandomRead {
        /// The pattern file.
        file: PathBuf,
        /// Reader threads.
        threads: usize,
        /// Reads per thread.
        reads_per_thread: u64,
        /// The file's pattern seed.
        seed: u64,
        /// Advice for the mapping.
        #[serde(default)]
        advice: MapAdvice,
    },
    /// Seed 001: each thread write-faults its own `area_bytes` anonymous area
    /// (one byte per 4 KiB page, MADV_NOHUGEPAGE), discards it with
    /// MADV_DONTNEED, and repeats for `seconds`.
    MultiFault {
        /// Threads (pinned round-robin to CPUs).
        threads: usize,
        /// Duration.
        seconds: f64,
        /// Area per thread.
        area_bytes: usize,
    },
    /// Seed 002: populate `bytes` of anonymous memory with `folio_kb` folios
    /// (4 = MADV_NOHUGEPAGE; larger sizes need the parent to enable that mTHP
    /// size), then time its munmap.
    Unmap {
        /// Region size.
        bytes: usize,
        /// Folio size the parent enabled (KiB).
        folio_kb: u64,
    },
    /// Seed 003 (usemem): `threads` threads each write one word per page of
    /// their own `bytes_per_thread` anonymous area, then read it back
    /// `passes - 1` times, checking it (the data survives swap).
    Usemem {
        /// Threads.
        threads: usize,
        /// Anonymous memory per thread.
        bytes_per_thread: usize,
        /// Passes (the first writes).
        passes: u32,
    },
    /// Helper for testing the TLB counter: a thread pinned to CPU 1 keeps
    /// reading its own anonymous page (the mm stays live there) while CPU 0
    /// faults in and discards one page of another map `iterations` times;
    /// each discard needs a remote TLB flush.
    MadviseLoop {
        /// Discards.
        iterations: u64,
    },
    /// The same experiments through upager (see [`crate::upager_engine`]):
    /// a pager with `budget` and `config` in this process, running `job`.
    /// Not placed in a memory cgroup: upager enforces its own budget.
    Upager {
        /// The pager's budget (the kernel's cgroup limit in the same scenario).
        budget: u64,
        /// Engine configuration (the ablations).
        config: crate::upager_engine::UpagerConfig,
        /// What to run.
        job: crate::upager_engine::UpagerJob,
    },
    /// `upager demo --compare`'s kernel side: a read-write `MAP_SHARED`
    /// mapping of `file`; a sequential scan (every word checked), then
    /// `reads_per_thread` random word reads (checked) and `writes_per_thread`
    /// random word writes per thread, then msync. Phase times in `extra`.
    Mixed {
        /// The pattern file (it is modified).
        file: PathBuf,
        /// Threads.
        threads: usize,
        /// Random reads per thread.
        reads_per_thread: u64,
        /// Random writes per thread.
        writes_per_thread: u64,
        /// The file's pattern seed.
        seed: u64,
    },
}

/// What a workload reports (measured part only).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WorkerResult {
    /// Wall time of the measured part.
    pub elapsed_s: f64,
    /// User CPU time (all threads).
    pub user_s: f64,
    /// System CPU time (all threads).
    pub sys_s: f64,
    /// Minor page faults.
    pub minflt: u64,
    /// Major page faults.
    pub majflt: u64,
    /// Operations done (pages read, reads, faults, page touches).
    pub ops: u64,
    /// Words read that did not match the pattern (must be 0).
    pub bad_words: u64,
    /// Workload-specific values.
    pub extra: BTreeMap<String, f64>,
}

pub(crate) struct Meter {
    t0: Instant,
    u0: raw::Usage,
    io0: Option<u64>,
}

/// `read_bytes` of /proc/self/io: bytes this process (all threads) caused to
/// be read from block devices, counted at I/O submission (readahead included).
fn read_bytes_self() -> Option<u64> {
    std::fs::read_to_string("/proc/self/io").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("read_bytes:"))
            .and_then(|v| v.trim().parse().ok())
    })
}

impl Meter {
    pub(crate) fn start() -> Result<Self, WorkloadError> {
        Ok(Meter {
            u0: raw::rusage_self().map_err(wio("getrusage"))?,
            io0: read_bytes_self(),
            t0: Instant::now(),
        })
    }
    pub(crate) fn stop(self, ops: u64, bad_words: u64) -> Result<WorkerResult, WorkloadError> {
        let elapsed_s = self.t0.elapsed().as_secs_f64();
        let u = raw::rusage_self().map_err(wio("getrusage"))?;
        let mut extra = BTreeMap::new();
        if let (Some(a), Some(b)) = (self.io0, read_bytes_self()) {
            extra.insert("read_bytes".to_string(), b.saturating_sub(a) as f64);
        }
        Ok(WorkerResult {
            elapsed_s,
            user_s: u.user_s - self.u0.user_s,
            sys_s: u.sys_s - self.u0.sys_s,
            minflt: u.minflt - self.u0.minflt,
            majflt: u.majflt - self.u0.majflt,
            ops,
            bad_words,
            extra,
        })
    }
}

pub(crate) fn word_at(map: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&map[off..off + 8]);
    u64::from_le_bytes(w)
}

fn ncpu() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Run a workload in this process.
pub fn run_workload(w: &Workload) -> Result<WorkerResult, WorkloadError> {
    match w {
        Workload::MmapRead {
            file,
            threads,
            seed,
            advice,
        } => mmap_read(file, *threads, *seed, *advice),
        Workload::RandomRead {
            file,
            threads,
            reads_per_thread,
            seed,
            advice,
        } => random_read(file, *threads, *reads_per_thread, *seed, *advice),
        Workload::MultiFault {
            threads,
            seconds,
            area_bytes,
        } => multi_fault(*threads, *seconds, *area_bytes),
        Workload::Unmap { bytes, folio_kb } => unmap(*bytes, *folio_kb),
        Workload::Usemem {
            threads,
            bytes_per_thread,
            passes,
        } => usemem(*threads, *bytes_per_thread, *passes),
        Workload::MadviseLoop { iterations } => madvise_loop(*iterations),
        Workload::Upager {
            budget,
            config,
            job,
        } => crate::upager_engine::run_job(*budget, config, job),
        Workload::Mixed {
            file,
            threads,
            reads_per_thread,
            writes_per_thread,
            seed,
        } => mixed(file, *threads, *reads_per_thread, *writes_per_thread, *seed),
    }
}

fn open_map(file: &PathBuf, advice: MapAdvice) -> Result<memmap2::Mmap, WorkloadError> {
    let f = File::open(file).map_err(wio(format!("opening {}", file.display())))?;
    let m = raw::map_file_readonly(&f).map_err(wio(format!("mapping {}", file.display())))?;
    if m.len() < PAGE {
        return Err(WorkloadError::Invalid(format!(
            "{} is smaller than a page",
            file.display()
        )));
    }
    let a = match advice {
        MapAdvice::Normal => None,
        MapAdvice::Random => Some(Advice::Random),
        MapAdvice::Sequential => Some(Advice::Sequential),
    };
    if let Some(a) = a {
        m.advise(a).map_err(wio("madvise"))?;
    }
    Ok(m)
}

fn mmap_read(
    file: &PathBuf,
    threads: usize,
    seed: u64,
    advice: MapAdvice,
) -> Result<WorkerResult, WorkloadError> {
    let map = open_map(file, advice)?;
    let threads = threads.max(1);
    let pages = map.len() / PAGE;
    let barrier = Barrier::new(threads + 1);
    let mut meter = None;
    let (ops, bad) = std::thread::scope(|s| -> Result<(u64, u64), WorkloadError> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (map, barrier) = (&map, &barrier);
                s.spawn(move || {
                    let (a, b) = (pages * t / threads, pages * (t + 1) / threads);
                    barrier.wait();
                    let mut bad = 0u64;
                    for p in a..b {
                        let off = p * PAGE;
                        if word_at(map, off) != pattern_word(off as u64, seed) {
                            bad += 1;
                        }
                    }
                    ((b - a) as u64, bad)
                })
            })
            .collect();
        meter = Some(Meter::start()?);
        barrier.wait();
        Ok(hs
            .into_iter()
            .map(|h| h.join().unwrap_or((0, u64::MAX)))
            .fold((0, 0), |x, y| (x.0 + y.0, x.1 + y.1)))
    })?;
    let mut r = meter
        .ok_or_else(|| WorkloadError::Invalid("no meter".into()))?
        .stop(ops, bad)?;
    r.extra.insert("bytes".into(), map.len() as f64);
    Ok(r)
}

pub(crate) fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn random_read(
    file: &PathBuf,
    threads: usize,
    reads: u64,
    seed: u64,
    advice: MapAdvice,
) -> Result<WorkerResult, WorkloadError> {
    let map = open_map(file, advice)?;
    let threads = threads.max(1);
    let pages = (map.len() / PAGE) as u64;
    let barrier = Barrier::new(threads + 1);
    let mut meter = None;
    let (ops, bad) = std::thread::scope(|s| -> Result<(u64, u64), WorkloadError> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (map, barrier) = (&map, &barrier);
                s.spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((t as u64 + 1) << 32) ^ seed;
                    barrier.wait();
                    let mut bad = 0u64;
                    for _ in 0..reads {
                        let r = xorshift(&mut rng);
                        let off =
                            ((r % pages) as usize) * PAGE + ((r >> 40) as usize % (PAGE / 8)) * 8;
                        if word_at(map, off) != pattern_word(off as u64, seed) {
                            bad += 1;
                        }
                    }
                    (reads, bad)
                })
            })
            .collect();
        meter = Some(Meter::start()?);
        barrier.wait();
        Ok(hs
            .into_iter()
            .map(|h| h.join().unwrap_or((0, u64::MAX)))
            .fold((0, 0), |x, y| (x.0 + y.0, x.1 + y.1)))
    })?;
    meter
        .ok_or_else(|| WorkloadError::Invalid("no meter".into()))?
        .stop(ops, bad)
}

fn multi_fault(threads: usize, seconds: f64, area: usize) -> Result<WorkerResult, WorkloadError> {
    let threads = threads.max(1);
    let area = area.max(PAGE) / PAGE * PAGE;
    let n = ncpu();
    let barrier = Barrier::new(threads + 1);
    let mut meter = None;
    let faults = std::thread::scope(|s| -> Result<u64, WorkloadError> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<u64, WorkloadError> {
                    let _ = raw::pin_to_cpu(t % n);
                    let mut m = MmapMut::map_anon(area).map_err(wio("mmap"))?;
                    m.advise(Advice::NoHugePage)
                        .map_err(wio("madvise(NOHUGEPAGE)"))?;
                    barrier.wait();
                    let end = Instant::now() + Duration::from_secs_f64(seconds);
                    let mut faults = 0u64;
                    while Instant::now() < end {
                        for o in (0..area).step_by(PAGE) {
                            m[o] = 1;
                        }
                        black_box(&mut m);
                        faults += (area / PAGE) as u64;
                        raw::discard(&m, 0, area).map_err(wio("madvise(DONTNEED)"))?;
                    }
                    Ok(faults)
                })
            })
            .collect();
        meter = Some(Meter::start()?);
        barrier.wait();
        let mut total = 0;
        for h in hs {
            total += h
                .join()
                .map_err(|_| WorkloadError::Invalid("a thread panicked".into()))??;
        }
        Ok(total)
    })?;
    let mut r = meter
        .ok_or_else(|| WorkloadError::Invalid("no meter".into()))?
        .stop(faults, 0)?;
    r.extra.insert("threads".into(), threads as f64);
    Ok(r)
}

fn unmap(bytes: usize, folio_kb: u64) -> Result<WorkerResult, WorkloadError> {
    let bytes = bytes.max(PAGE) / PAGE * PAGE;
    let mut m = MmapMut::map_anon(bytes).map_err(wio("mmap"))?;
    m.advise(if folio_kb > 4 {
        Advice::HugePage
    } else {
        Advice::NoHugePage
    })
    .map_err(wio("madvise(HUGEPAGE/NOHUGEPAGE)"))?;
    let stats0 = crate::env::mthp_fault_stats(folio_kb);
    let t = Instant::now();
    for o in (0..bytes).step_by(PAGE) {
        m[o] = 1;
    }
    black_box(&mut m);
    let populate_s = t.elapsed().as_secs_f64();
    let stats1 = crate::env::mthp_fault_stats(folio_kb);
    let meter = Meter::start()?;
    drop(m); // munmap
    let mut r = meter.stop((bytes / PAGE) as u64, 0)?;
    r.extra.insert("populate_s".into(), populate_s);
    r.extra.insert("folio_kb".into(), folio_kb as f64);
    if let (Some(a), Some(b)) = (stats0, stats1) {
        // System-wide counters: other processes' faults add to them, so this
        // is evidence that the folio size was used, not an exact count.
        r.extra
            .insert("mthp_fault_alloc".into(), b.0.saturating_sub(a.0) as f64);
        r.extra
            .insert("mthp_fault_fallback".into(), b.1.saturating_sub(a.1) as f64);
        let expected = bytes as f64 / (folio_kb as f64 * 1024.0);
        r.extra.insert(
            "mthp_alloc_fraction".into(),
            b.0.saturating_sub(a.0) as f64 / expected,
        );
    }
    Ok(r)
}

fn usemem(threads: usize, per_thread: usize, passes: u32) -> Result<WorkerResult, WorkloadError> {
    let threads = threads.max(1);
    let per_thread = per_thread.max(PAGE) / PAGE * PAGE;
    let passes = passes.max(1);
    let barrier = Barrier::new(threads + 1);
    let mut meter = None;
    let (ops, bad) = std::thread::scope(|s| -> Result<(u64, u64), WorkloadError> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<(u64, u64), WorkloadError> {
                    let mut m = MmapMut::map_anon(per_thread).map_err(wio("mmap"))?;
                    barrier.wait();
                    let (mut ops, mut bad) = (0u64, 0u64);
                    for p in 0..passes {
                        for o in (0..per_thread).step_by(PAGE) {
                            let v = ((t as u64) << 48) ^ o as u64;
                            if p == 0 {
                                m[o..o + 8].copy_from_slice(&v.to_le_bytes());
                            } else if word_at(&m, o) != v {
                                bad += 1;
                            }
                        }
                        black_box(&mut m);
                        ops += (per_thread / PAGE) as u64;
                    }
                    Ok((ops, bad))
                })
            })
            .collect();
        meter = Some(Meter::start()?);
        barrier.wait();
        let mut acc = (0, 0);
        for h in hs {
            let (o, b) = h
                .join()
                .map_err(|_| WorkloadError::Invalid("a thread panicked".into()))??;
            acc = (acc.0 + o, acc.1 + b);
        }
        Ok(acc)
    })?;
    let mut r = meter
        .ok_or_else(|| WorkloadError::Invalid("no meter".into()))?
        .stop(ops, bad)?;
    r.extra
        .insert("bytes".into(), (per_thread * threads) as f64);
    Ok(r)
}

fn mixed(
    file: &PathBuf,
    threads: usize,
    reads: u64,
    writes: u64,
    seed: u64,
) -> Result<WorkerResult, WorkloadError> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .map_err(wio(format!("opening {}", file.display())))?;
    let map = raw::map_file_shared_rw(&f).map_err(wio(format!("mapping {}", file.display())))?;
    let words = map.len() / 8;
    if words == 0 {
        return Err(WorkloadError::Invalid("empty file".into()));
    }
    // The shared mapping as atomic words (the workload's
    // threads share it like upager's `Region::words`).
    let w: &[AtomicU64] = raw::as_atomic_words(&map);
    let threads = threads.max(1);
    let meter = Meter::start()?;
    let mut extra = BTreeMap::new();
    let per = words.div_ceil(threads);
    let phase = |f: &(dyn Fn(usize) -> u64 + Sync)| -> (f64, u64) {
        let t = Instant::now();
        let bad = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|t| s.spawn(move || f(t))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(u64::MAX)).sum()
        });
        (t.elapsed().as_secs_f64(), bad)
    };
    let (scan_s, bad_scan) = phase(&|t| {
        let mut bad = 0;
        let lo = (t * per).min(words);
        for (i, x) in w[lo..((t + 1) * per).min(words)].iter().enumerate() {
            if x.load(Relaxed) != pattern_word((lo + i) as u64 * 8, seed) {
                bad += 1;
            }
        }
        bad
    });
    let (reads_s, bad_reads) = phase(&|t| {
        let mut rng = 0x1234_5678u64 + t as u64;
        let mut bad = 0;
        for _ in 0..reads {
            let k = (xorshift(&mut rng) % words as u64) as usize;
            if w[k].load(Relaxed) != pattern_word(k as u64 * 8, seed) {
                bad += 1;
            }
        }
        bad
    });
    let (writes_s, _) = phase(&|t| {
        let mut rng = 0x9abc_def0u64 + t as u64;
        for _ in 0..writes {
            let k = (xorshift(&mut rng) % words as u64) as usize;
            w[k].store(!pattern_word(k as u64 * 8, seed), Relaxed);
        }
        0
    });
    let t = Instant::now();
    map.flush().map_err(wio("msync"))?;
    let flush_s = t.elapsed().as_secs_f64();
    let mut r = meter.stop(words as u64, bad_scan + bad_reads)?;
    for (k, v) in [
        ("scan_s", scan_s),
        ("reads_s", reads_s),
        ("writes_s", writes_s),
        ("flush_s", flush_s),
        ("bytes", map.len() as f64),
        ("reads", (reads * threads as u64) as f64),
        ("writes", (writes * threads as u64) as f64),
    ] {
        extra.insert(k.to_string(), v);
    }
    r.extra.extend(extra);
    Ok(r)
}

fn madvise_loop(iterations: u64) -> Result<WorkerResult, WorkloadError> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = Barrier::new(2);
    let spin_cpu = if ncpu() > 1 { 1 } else { 0 };
    let m = MmapMut::map_anon(2 * PAGE).map_err(wio("mmap"))?;
    let mut r = std::thread::scope(|s| -> Result<WorkerResult, WorkloadError> {
        let h = s.spawn(|| -> Result<u64, WorkloadError> {
            let _ = raw::pin_to_cpu(spin_cpu);
            // Its own map: the mm is live on this CPU, and nothing it reads is
            // ever discarded.
            let own = MmapMut::map_anon(PAGE).map_err(wio("mmap"))?;
            started.wait();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = n.wrapping_add(black_box(own[n as usize % 64]) as u64 + 1);
            }
            Ok(n)
        });
        let _ = raw::pin_to_cpu(0);
        started.wait();
        std::thread::sleep(Duration::from_millis(20));
        let meter = Meter::start();
        let mut res = Ok(());
        for _ in 0..iterations {
            black_box(m[PAGE]); // read fault: maps the zero page
            if let Err(e) = raw::discard(&m, PAGE, PAGE) {
                res = Err(wio("madvise(DONTNEED)")(e));
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let spins = h
            .join()
            .map_err(|_| WorkloadError::Invalid("spinner panicked".into()))??;
        res?;
        let mut r = meter?.stop(iterations, 0)?;
        r.extra.insert("spins".into(), spins as f64);
        Ok(r)
    })?;
    r.extra.insert("ncpu".into(), ncpu() as f64);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_json_roundtrip() {
        let w = Workload::MultiFault {
            threads: 2,
            seconds: 0.5,
            area_bytes: 2 << 20,
        };
        let s = serde_json::to_string(&w).unwrap();
        assert!(s.contains("\"workload\":\"multi-fault\""), "{s}");
        assert_eq!(serde_json::from_str::<Workload>(&s).unwrap(), w);
    }

    #[test]
    fn in_process_small_runs() {
        let r = run_workload(&Workload::MultiFault {
            threads: 2,
            seconds: 0.1,
            area_bytes: 256 << 10,
        })
        .unwrap();
        assert!(r.ops > 0 && r.minflt > 0, "{r:?}");
        let r = run_workload(&Workload::Usemem {
            threads: 2,
            bytes_per_thread: 4 << 20,
            passes: 2,
        })
        .unwrap();
        assert_eq!((r.ops, r.bad_words), (2048 * 2, 0));
        let r = run_workload(&Workload::Unmap {
            bytes: 8 << 20,
            folio_kb: 4,
        })
        .unwrap();
        assert_eq!(r.ops, 2048);
        let p = std::env::temp_dir().join(format!("upager-bench-wl-{}", std::process::id()));
        crate::env::create_pattern_file(&p, 4 << 20, 3).unwrap();
        let r = run_workload(&Workload::MmapRead {
            file: p.clone(),
            threads: 2,
            seed: 3,
            advice: MapAdvice::Sequential,
        })
        .unwrap();
        assert_eq!((r.ops, r.bad_words), (1024, 0));
        let r = run_workload(&Workload::RandomRead {
            file: p.clone(),
            threads: 2,
            reads_per_thread: 1000,
            seed: 3,
            advice: MapAdvice::Random,
        })
        .unwrap();
        assert_eq!((r.ops, r.bad_words), (2000, 0));
        let r = run_workload(&Workload::MmapRead {
            file: p.clone(),
            threads: 2,
            seed: 4,
            advice: MapAdvice::Normal,
        })
        .unwrap();
        assert_eq!(r.bad_words, 1024, "a wrong seed must show up as bad words");
        std::fs::remove_file(p).unwrap();
    }
}
