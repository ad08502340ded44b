//! The kernel's side of each seed experiment: the workloads that run inside
//! the worker process (`upager-bench-worker`), which the parent has put into
//! the run's memory cgroup before it starts working.
//!
//! Each workload times only its measured part ([`Meter`]) and reports the CPU
//! time (`getrusage`, all threads) and page faults of that part. Data files
//! have a known pattern ([`xor_word`]) and every word read is checked, so
//! an engine that returns wrong data fails loudly instead of looking fast.

use std::collections::BTreeMap;
use std::fs::File;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use memmap2::{Advice, MmapMut};
use upager_testdata::{word_at, xor_word, xorshift64, GOLDEN};

use crate::host::ncpu;
use crate::latency::{Histogram, MULTI_FAULT_SAMPLE_EVERY};
use crate::meter::{wio, Meter, WorkerResult, WorkloadError};
use crate::raw;
use crate::thp::mthp_fault_stats;
use crate::tlb_reach;

const PAGE: usize = 4096;

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

/// Runs `threads` workers and measures them together: each runs `setup(t)`
/// (unmeasured: mapping its memory, pinning), then all start at once and
/// the [`Meter`] runs until every `work(t, state, histogram)` has returned;
/// their `(ops, bad)` are summed, and the latencies they recorded in their
/// thread's [`Histogram`] merged into the result's `latency`. A setup that
/// fails still reaches the start line, so the others are never left waiting.
fn measured_threads<S, Setup, Work>(
    threads: usize,
    setup: Setup,
    work: Work,
) -> Result<WorkerResult, WorkloadError>
where
    Setup: Fn(usize) -> Result<S, WorkloadError> + Sync,
    Work: Fn(usize, S, &mut Histogram) -> Result<(u64, u64), WorkloadError> + Sync,
{
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, setup, work) = (&barrier, &setup, &work);
                s.spawn(move || {
                    let state = setup(t);
                    barrier.wait();
                    let mut hist = Box::new(Histogram::new());
                    work(t, state?, &mut hist).map(|r| (r, hist))
                })
            })
            .collect();
        let meter = Meter::start();
        barrier.wait();
        let (mut ops, mut bad) = (0, 0);
        let mut all = Histogram::new();
        for h in hs {
            let ((o, b), hist) = h
                .join()
                .map_err(|_| WorkloadError::Invalid("a thread panicked".into()))??;
            ops += o;
            bad += b;
            all.merge(&hist);
        }
        let mut r = meter?.stop(ops, bad)?;
        r.latency = all.summary();
        Ok(r)
    })
}

pub(crate) fn mmap_read(
    file: &PathBuf,
    threads: usize,
    seed: u64,
    advice: MapAdvice,
) -> Result<WorkerResult, WorkloadError> {
    let map = open_map(file, advice)?;
    let threads = threads.max(1);
    let pages = map.len() / PAGE;
    let mut r = measured_threads(
        threads,
        |_| Ok(()),
        |t, (), _| {
            let (a, b) = (pages * t / threads, pages * (t + 1) / threads);
            let mut bad = 0u64;
            for p in a..b {
                let off = p * PAGE;
                if word_at(&map, off) != xor_word(off as u64, seed) {
                    bad += 1;
                }
            }
            Ok(((b - a) as u64, bad))
        },
    )?;
    r.extra.insert("bytes".into(), map.len() as f64);
    Ok(r)
}

pub(crate) fn random_read(
    file: &PathBuf,
    threads: usize,
    reads: u64,
    seed: u64,
    advice: MapAdvice,
) -> Result<WorkerResult, WorkloadError> {
    let map = open_map(file, advice)?;
    let threads = threads.max(1);
    let pages = (map.len() / PAGE) as u64;
    measured_threads(
        threads,
        |_| Ok(()),
        |t, (), hist| {
            let mut rng = GOLDEN ^ ((t as u64 + 1) << 32) ^ seed;
            let mut bad = 0u64;
            for _ in 0..reads {
                let r = xorshift64(&mut rng);
                let off = ((r % pages) as usize) * PAGE + ((r >> 40) as usize % (PAGE / 8)) * 8;
                // Every read is timed (most are misses: 1/8 of the file fits).
                let t0 = Instant::now();
                let w = black_box(word_at(&map, off));
                hist.record(t0.elapsed().as_nanos() as u64);
                if w != xor_word(off as u64, seed) {
                    bad += 1;
                }
            }
            Ok((reads, bad))
        },
    )
}

pub(crate) fn multi_fault(
    threads: usize,
    seconds: f64,
    area: usize,
) -> Result<WorkerResult, WorkloadError> {
    let threads = threads.max(1);
    let area = area.max(PAGE) / PAGE * PAGE;
    let n = ncpu();
    let mut r = measured_threads(
        threads,
        |t| {
            let _ = raw::pin_to_cpu(t % n);
            let m = MmapMut::map_anon(area).map_err(wio("mmap"))?;
            m.advise(Advice::NoHugePage)
                .map_err(wio("madvise(NOHUGEPAGE)"))?;
            Ok(m)
        },
        |_, mut m, hist| {
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let mut faults = 0u64;
            while Instant::now() < end {
                for (i, o) in (0..area).step_by(PAGE).enumerate() {
                    // Every access faults; one in MULTI_FAULT_SAMPLE_EVERY is
                    // timed, so the clock reads cost the throughput < 1%.
                    if i % MULTI_FAULT_SAMPLE_EVERY == 0 {
                        let t0 = Instant::now();
                        m[o] = 1;
                        black_box(&mut m);
                        hist.record(t0.elapsed().as_nanos() as u64);
                    } else {
                        m[o] = 1;
                    }
                }
                black_box(&mut m);
                faults += (area / PAGE) as u64;
                raw::discard(&m, 0, area).map_err(wio("madvise(DONTNEED)"))?;
            }
            Ok((faults, 0))
        },
    )?;
    r.extra.insert("threads".into(), threads as f64);
    Ok(r)
}

pub(crate) fn unmap(bytes: usize, folio_kb: u64) -> Result<WorkerResult, WorkloadError> {
    let bytes = bytes.max(PAGE) / PAGE * PAGE;
    let mut m = MmapMut::map_anon(bytes).map_err(wio("mmap"))?;
    m.advise(if folio_kb > 4 {
        Advice::HugePage
    } else {
        Advice::NoHugePage
    })
    .map_err(wio("madvise(HUGEPAGE/NOHUGEPAGE)"))?;
    let stats0 = mthp_fault_stats(folio_kb);
    let t = Instant::now();
    for o in (0..bytes).step_by(PAGE) {
        m[o] = 1;
    }
    black_box(&mut m);
    let populate_s = t.elapsed().as_secs_f64();
    let stats1 = mthp_fault_stats(folio_kb);
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

/// The TLB reach scenario, the kernel's side: `bytes` of anonymous
/// `MADV_HUGEPAGE` memory (transparent huge pages), every page written, then
/// `reads` random 8-byte reads (`tlb_reach`).
pub(crate) fn tlb_reach(bytes: usize, reads: u64) -> Result<WorkerResult, WorkloadError> {
    let bytes = bytes.max(tlb_reach::HUGE) / tlb_reach::HUGE * tlb_reach::HUGE;
    let mut m = upager_sys::mem::AlignedBuf::huge(bytes)
        .ok_or_else(|| WorkloadError::Invalid(format!("no {bytes} bytes of address space")))?;
    for o in (0..bytes).step_by(PAGE) {
        m[o] = 1;
    }
    let addr = m.addr();
    tlb_reach::measure(m.atomic_words(), reads, addr, bytes)
}

pub(crate) fn usemem(
    threads: usize,
    per_thread: usize,
    passes: u32,
) -> Result<WorkerResult, WorkloadError> {
    let threads = threads.max(1);
    let per_thread = per_thread.max(PAGE) / PAGE * PAGE;
    let passes = passes.max(1);
    let mut r = measured_threads(
        threads,
        |_| MmapMut::map_anon(per_thread).map_err(wio("mmap")),
        |t, mut m, _| {
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
        },
    )?;
    r.extra
        .insert("bytes".into(), (per_thread * threads) as f64);
    Ok(r)
}

pub(crate) fn mixed(
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
            if x.load(Relaxed) != xor_word((lo + i) as u64 * 8, seed) {
                bad += 1;
            }
        }
        bad
    });
    let (reads_s, bad_reads) = phase(&|t| {
        let mut rng = 0x1234_5678u64 + t as u64;
        let mut bad = 0;
        for _ in 0..reads {
            let k = (xorshift64(&mut rng) % words as u64) as usize;
            if w[k].load(Relaxed) != xor_word(k as u64 * 8, seed) {
                bad += 1;
            }
        }
        bad
    });
    let (writes_s, _) = phase(&|t| {
        let mut rng = 0x9abc_def0u64 + t as u64;
        for _ in 0..writes {
            let k = (xorshift64(&mut rng) % words as u64) as usize;
            w[k].store(!xor_word(k as u64 * 8, seed), Relaxed);
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

pub(crate) fn madvise_loop(iterations: u64) -> Result<WorkerResult, WorkloadError> {
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
