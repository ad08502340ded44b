//! `upager demo`: the main job, end to end, with every byte verified.
//!
//! 1. make a dataset of `--size` bytes (a known pattern) in a temp dir;
//! 2. map it read-write through a pager with a `--budget` budget;
//! 3. sequential scan, random 8-byte reads, random 8-byte writes, each from
//!    `--threads` threads, every read checked against the pattern;
//! 4. flush (durable), unmap;
//! 5. read the file back with plain reads and check every byte: written
//!    words hold the new value, all others the pattern;
//! 6. print throughput and the engine's counters; remove the dataset.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use upager::{format_size, FaultMode, MapOptions, Pager, Region, Stats};
use upager_redis::{RedisOptions, RedisStore, StoreUrl};
use upager_testdata::{odd_word, Rng};

use crate::{fault_mode_arg, size_arg};

/// Options of `upager demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Dataset size.
    #[arg(long, default_value = "2G", value_parser = size_arg)]
    pub size: u64,
    /// Memory budget of the pager.
    #[arg(long, default_value = "256M", value_parser = size_arg)]
    pub budget: u64,
    /// Folio size (unit of fill and eviction), 4K to 2M [default: upager's,
    /// 4K: a random fault fills 4 KiB, the scan's readahead fills whole
    /// windows; with --store, the dataset's chunk, 64K].
    #[arg(long, value_parser = size_arg)]
    pub folio: Option<u64>,
    /// Worker threads of the workload.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Random reads per thread [default: 200000; with an s3:// --store,
    /// 5000: each read of an evicted folio is a GET, a round trip of its
    /// own (200000 made the demo take six minutes on a local server)].
    #[arg(long)]
    pub reads: Option<u64>,
    /// Random writes per thread.
    #[arg(long, default_value_t = 100_000)]
    pub writes: u64,
    /// Directory for the dataset: it must exist and have room for the
    /// dataset (default: /dev/shm if it has room, else the system temp
    /// dir). The dataset is removed at the end, also on Ctrl-C or SIGTERM.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also run the same workload through the kernel's mmap, in a memory
    /// cgroup limited to the same budget (root; both datasets then live on
    /// ext4 on zram0 unless --dir is given), and print both side by side.
    #[arg(long)]
    pub compare: bool,
    /// How the pager resolves faults [default: $UPAGER_FAULT_MODE, else
    /// handlers where the process may open /dev/userfaultfd, in-thread
    /// where not (an ordinary user)]. The demo passes no region memory to system calls, so
    /// both modes run it unchanged.
    #[arg(long, value_name = "MODE", value_parser = fault_mode_arg())]
    pub fault_mode: Option<FaultMode>,
    /// Fill sequential 2 MiB runs as huge pages (mixed folio sizes, off by
    /// default; `PagerBuilder::huge_runs`).
    #[arg(long)]
    pub huge_runs: bool,
    /// Page the dataset from a Redis Cluster instead of a local file:
    /// redis-cluster://HOST:PORT[/NAME] (start a local one with
    /// scripts/redis-cluster.sh start). The dataset is uploaded under NAME
    /// (default upager-demo-PID), paged through the pager, read back from
    /// the cluster and checked, then deleted. Or an S3 bucket,
    /// s3://BUCKET[/KEY][?endpoint=URL] (credentials from the environment
    /// or ~/.aws; start a local server with scripts/seaweedfs.sh start):
    /// the dataset is uploaded as KEY (default upager-demo-PID), paged
    /// read-only (scan and random reads, every word checked; no writes),
    /// then deleted.
    #[arg(long, value_name = "URL", conflicts_with = "compare",
          value_parser = crate::datasets::AnyUrlParser)]
    pub store: Option<crate::datasets::AnyUrl>,
}

/// Random reads per thread by default.
const READS: u64 = 200_000;

/// Random reads per thread by default from an S3 object: each read of an
/// evicted folio is a GET, so the phase's few seconds hold fewer reads.
const S3_READS: u64 = 5_000;

impl DemoArgs {
    /// Random reads per thread: `--reads`, else the default for the data's
    /// home.
    fn reads(&self) -> u64 {
        self.reads.unwrap_or(match self.store {
            Some(crate::datasets::AnyUrl::S3(_)) => S3_READS,
            _ => READS,
        })
    }
}

/// A rate of operations per second as the demo prints it: M/s, or K/s
/// below 0.1 M/s (an S3 object's random reads).
fn per_sec(ops: f64) -> String {
    if ops < 1e5 {
        format!("{:.2} K/s", ops / 1e3)
    } else {
        format!("{:.2} M/s", ops / 1e6)
    }
}

/// The seed of the dataset's pattern.
const SEED: u64 = 0x5bd1_e995;

/// The pattern word at byte offset `off`.
fn word(off: u64) -> u64 {
    odd_word(off, SEED)
}

/// The value the write phase stores at `off`.
fn written(off: u64) -> u64 {
    !word(off)
}

/// The random sequence of reader thread `t` (replayable).
fn read_rng(t: u64) -> Rng {
    Rng::from_state(0x1234_5678 + t)
}

/// The random sequence of writer thread `t`, replayed by the verification.
fn write_rng(t: u64) -> Rng {
    Rng::from_state(0x9abc_def0 + t)
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:<14} [{bar:40}] {percent:>3}% {binary_bytes_per_sec:>12} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Runs `f(thread)` on `threads` threads while a progress bar follows
/// `done` up to `total`; returns the time until the last thread finished
/// (measured by the threads: the bar's 100 ms polling made every short
/// phase last 0.1 s).
fn parallel(
    threads: usize,
    total: u64,
    what: &str,
    done: &Arc<AtomicU64>,
    f: impl Fn(usize) + Sync,
) -> Duration {
    let pb = bar(total, what);
    let t0 = Instant::now();
    let ends = std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    f(t);
                    Instant::now()
                })
            })
            .collect();
        while !hs.iter().all(|h| h.is_finished()) {
            pb.set_position(done.load(Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
        hs.into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect::<Vec<_>>()
    });
    pb.finish_and_clear();
    ends.into_iter().max().map_or(Duration::ZERO, |e| e - t0)
}

/// The directory the dataset goes in: `--dir` (which must exist), else
/// /dev/shm if it has room for the dataset and 1 GiB more, else the
/// system temp dir.
fn pick_dir(args: &DemoArgs) -> Result<PathBuf, String> {
    if let Some(d) = &args.dir {
        return match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => Ok(d.clone()),
            Ok(_) => Err(format!(
                "--dir {}: not a directory (give the directory the dataset should go in)",
                d.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "--dir {}: no such directory (create it first, or leave --dir out to use /dev/shm                  or the temp dir; the demo only makes its own upager-demo-PID directory inside)",
                d.display()
            )),
            Err(e) => Err(format!("--dir {}: {e}", d.display())),
        };
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && free_space(shm).is_some_and(|f| f > args.size + (1 << 30)) {
        return Ok(shm.to_path_buf());
    }
    Ok(std::env::temp_dir())
}

fn free_space(p: &Path) -> Option<u64> {
    upager_sys::io::free_space(p).ok()
}

/// Refuses a dataset of `need` bytes in `dir` if its file system has less
/// free (before anything is written: without this a `--size 100T` wrote
/// until the disk was full).
fn check_free_space(dir: &Path, need: u64, what: &str) -> Result<(), String> {
    let free = upager_sys::io::free_space(dir)
        .map_err(|e| format!("cannot tell the free space of {}: {e}", dir.display()))?;
    if free < need {
        return Err(format!(
            "{} has {} free, but {what} needs {}: give --dir DIR on a file system with room,              or a smaller --size",
            dir.display(),
            format_size(free),
            format_size(need)
        ));
    }
    Ok(())
}

/// What the demo has on disk or on a cluster until it ends. Each owner
/// (the dataset directory, the uploaded dataset) registers here when it
/// is made and takes itself out when its `Drop` removes it (a normal end,
/// an error, a panic: the unwinding drops it); on SIGINT, SIGTERM or
/// SIGHUP the watcher thread ([`watch_signals`]) removes what is left and
/// exits with 128 + the signal. A crash (SIGKILL, SIGSEGV) leaves the
/// directory: the next demo in the same place removes it
/// ([`remove_stale`]).
#[derive(Default)]
struct Leftovers {
    dir: Option<PathBuf>,
    remote: Option<(String, Arc<RedisStore>)>,
    /// The demo's object on an S3 store.
    object: Option<upager_s3::S3Url>,
    /// An upload to a store in progress: a signal sets its flag and waits
    /// for it to stop ([`Upload`]), so that it removes what it wrote (a
    /// Redis dataset's keys) or aborts (an S3 multipart upload) before
    /// the demo exits.
    upload: Option<Arc<AtomicBool>>,
    /// `--compare` changed the machine (cgroup, zram): undo it too.
    bench_env: bool,
}

static LEFTOVERS: Mutex<Leftovers> = Mutex::new(Leftovers {
    dir: None,
    remote: None,
    object: None,
    upload: None,
    bench_env: false,
});

/// The demo's upload to a store while it runs: its cancel flag, which the
/// signal thread sets ([`watch_signals`]); gone when the upload returned.
struct Upload(Arc<AtomicBool>);

impl Upload {
    fn start() -> Upload {
        let flag = Arc::new(AtomicBool::new(false));
        leftovers().upload = Some(Arc::clone(&flag));
        Upload(flag)
    }

    /// The upload returned. Stopped by a signal, this thread waits for
    /// ever: the signal thread removes what is left and exits with 128 +
    /// the signal, as on a signal at any other time.
    fn finish(self) {
        let stopped = self.0.load(Ordering::SeqCst);
        drop(self);
        if stopped {
            loop {
                std::thread::park();
            }
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        leftovers().upload = None;
    }
}

fn leftovers() -> std::sync::MutexGuard<'static, Leftovers> {
    LEFTOVERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks SIGINT/SIGTERM/SIGHUP (before the demo starts any thread, so all
/// inherit it) and starts the thread that cleans up when one comes.
fn watch_signals() -> Result<(), String> {
    let sigs = upager_sys::term::TermSignals::block()
        .map_err(|e| format!("cannot block SIGINT/SIGTERM: {e}"))?;
    std::thread::Builder::new()
        .name("demo-signals".into())
        .spawn(move || {
            let Ok(sig) = sigs.wait() else { return };
            // An upload stops at its next batch and cleans up after
            // itself; waited for (bounded) before anything else.
            let upload = leftovers().upload.clone();
            if let Some(flag) = upload {
                eprintln!("\nupager demo: stopping the upload");
                flag.store(true, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_secs(60);
                while leftovers().upload.is_some() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            // Held until exit: the main thread cannot register anything
            // new (or remove it under us) from here on.
            let mut l = leftovers();
            eprintln!(
                "\nupager demo: {}: cleaning up",
                upager_sys::term::signal_name(sig)
            );
            if let Some(d) = l.dir.take() {
                match std::fs::remove_dir_all(&d) {
                    Ok(()) => eprintln!("upager demo: removed {}", d.display()),
                    Err(e) => eprintln!("upager demo: could not remove {}: {e}", d.display()),
                }
            }
            if let Some((url, st)) = l.remote.take() {
                match st.delete() {
                    Ok(()) => eprintln!("upager demo: deleted {url} from the cluster"),
                    Err(e) => eprintln!("upager demo: could not delete {url}: {e}"),
                }
            }
            if let Some(u) = l.object.take() {
                match upager_s3::Objects::open(&u, &upager_s3::S3Options::default())
                    .map_err(upager_s3::UploadError::from)
                    .and_then(|o| o.delete(&u.key))
                {
                    Ok(()) => eprintln!("upager demo: deleted {u}"),
                    Err(e) => eprintln!("upager demo: could not delete {u}: {e}"),
                }
            }
            if l.bench_env {
                upager_bench::env::cleanup_all();
            }
            std::process::exit(128 + sig);
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// Removes `upager-demo-PID` directories in `base` whose process is gone
/// (a demo that crashed, or was killed with SIGKILL).
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("upager-demo-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            eprintln!(
                "upager demo: removed {}, left by an earlier demo (pid {pid}) that did not end cleanly",
                e.path().display()
            );
        }
    }
}

/// The dataset's directory: registered in [`LEFTOVERS`] before it is
/// made, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn create(path: PathBuf) -> Result<TempDir, String> {
        let mut l = leftovers();
        l.dir = Some(path.clone());
        let d = TempDir(path);
        std::fs::create_dir(&d.0).map_err(|e| format!("cannot create {}: {e}", d.0.display()))?;
        Ok(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let mut l = leftovers();
        let _ = std::fs::remove_dir_all(&self.0);
        l.dir = None;
    }
}

/// Runs the demo.
pub fn run(a: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.size < 8 || !a.size.is_multiple_of(8) {
        return Err(format!(
            "--size must be a positive multiple of 8 bytes, got {}",
            a.size
        )
        .into());
    }
    if a.threads == 0 || a.threads > 256 {
        return Err(format!("--threads must be 1 to 256, got {}", a.threads).into());
    }
    // First, before any thread: Ctrl-C (or SIGTERM) removes the dataset.
    watch_signals()?;
    let compare_env = if a.compare && a.dir.is_none() {
        leftovers().bench_env = true;
        Some(crate::bench::compare_env(a.size)?)
    } else {
        None
    };
    let base = match &compare_env {
        Some(env) => env.data_dir(),
        None => {
            let base = pick_dir(a)?;
            remove_stale(&base);
            // --compare makes the kernel's copy of the dataset next to it.
            let (need, what) = if a.compare {
                (2 * a.size, "the dataset and the kernel's copy")
            } else {
                (a.size, "the dataset")
            };
            check_free_space(&base, need, what)?;
            base
        }
    };
    let dir = TempDir::create(base.join(format!("upager-demo-{}", std::process::id())))?;
    let path = dir.0.join("dataset.bin");
    // The pager first: a bad option (or UPAGER_FAULT_MODE) fails before
    // the dataset is made.
    let mut b = Pager::builder().budget(a.budget).huge_runs(a.huge_runs);
    if let Some(m) = a.fault_mode {
        b = b.fault_mode(m);
    }
    let pager = b.build()?;
    let s3_url = match &a.store {
        Some(crate::datasets::AnyUrl::S3(u)) => Some(u.clone()),
        _ => None,
    };
    let redis_url = match &a.store {
        Some(crate::datasets::AnyUrl::Redis(u)) => Some(u.clone()),
        _ => None,
    };
    let folio = a.folio.unwrap_or(if s3_url.is_some() {
        upager_s3::DEFAULT_FOLIO
    } else if redis_url.is_some() {
        upager_redis::DEFAULT_CHUNK
    } else {
        upager::DEFAULT_FOLIO
    });
    println!(
        "upager demo: {} dataset in {}, budget {}, {} folios{}, {} threads, fault mode {}",
        format_size(a.size),
        base.display(),
        format_size(a.budget),
        format_size(folio),
        if a.folio.is_none() { " (default)" } else { "" },
        a.threads,
        pager.fault_mode()
    );
    for line in crate::info_lines(&pager.info()) {
        println!("  {line}");
    }

    // 1. Dataset.
    let t0 = Instant::now();
    make_dataset(&path, a.size)?;
    println!(
        "  made dataset                 {:>8.2} s",
        t0.elapsed().as_secs_f64()
    );

    if let Some(url) = &s3_url {
        return s3_demo(a, url, &pager, &path, folio);
    }

    // 2. Region: the file, or the dataset uploaded to the cluster.
    let opts = MapOptions::new().writable(true).folio(folio);
    let remote = match &redis_url {
        Some(url) => Some(Remote::upload(url, &path, a.size, folio)?),
        None => None,
    };
    // The region's own store, kept for its counters (store_writes_degraded
    // after a failover).
    let mut paged_from: Option<std::sync::Arc<RedisStore>> = None;
    let region = match &remote {
        Some(rm) => {
            let st = RedisStore::open(&rm.url, true, &rm.opts)?;
            paged_from = Some(std::sync::Arc::clone(&st));
            pager.map_store(st as std::sync::Arc<dyn upager::Store>, &opts)?
        }
        None => pager.map_file(&path, &opts)?,
    };
    let words = a.size / 8;

    // 3a-b. Sequential scan, then random reads.
    let (scan, reads, read_phases) = scan_and_read(a, &region, words);
    let mut phases = read_phases.to_vec();

    // 3c. Random writes: thread t writes words with index % threads == t.
    let done = Arc::new(AtomicU64::new(0));
    let total_writes = a.writes * a.threads as u64;
    let nt = a.threads as u64;
    let el = parallel(a.threads, total_writes * 8, "random writes", &done, |t| {
        let mut rng = write_rng(t as u64);
        let w = region.words();
        for i in 0..a.writes {
            let k = write_index(rng.next_u64(), words, nt, t as u64);
            w[k as usize].store(written(k * 8), Relaxed);
            if i % 1024 == 0 {
                done.fetch_add(1024 * 8, Relaxed);
            }
        }
    });
    phases.push(el);
    let writes = total_writes as f64 / el.as_secs_f64();
    print_rate("random writes", el, writes);

    // 4. Flush and unmap.
    let t = Instant::now();
    region.flush()?;
    let el = t.elapsed();
    println!("  flush (fdatasync)            {:>8.2} s", el.as_secs_f64());
    phases.push(el);
    let stats = pager.stats();
    unmap(region)?;

    // 5. Verify every byte with plain reads (of the file, or of the
    // dataset downloaded from the cluster into it).
    let t = Instant::now();
    if let Some(rm) = &remote {
        rm.download(&path, a.size)?;
    }
    let written_words = replay_writes(a, words);
    verify(&path, a.size, &written_words)?;
    println!(
        "  verified every byte          {:>8.2} s  ({} words rewritten, all present)",
        t.elapsed().as_secs_f64(),
        written_words.count()
    );

    // 6. Summary.
    println!();
    println!(
        "throughput: scan {scan:.2} GB/s, random reads {}, random writes {}",
        per_sec(reads),
        per_sec(writes)
    );
    print_stats(&stats, folio);
    if let Some(st) = paged_from {
        println!("store counters (the region's Redis Cluster store):");
        for (name, v) in st.counters().iter() {
            println!("  {name:<28} {v}");
        }
    }
    if let Some(rm) = remote {
        rm.finish()?;
    }
    if a.compare {
        compare(a, &dir.0, &phases, &stats)?;
    }
    Ok(())
}

/// `--compare`: the kernel's mmap on the same workload, side by side.
/// The demo's read phases on `region` (the dataset's `words` words):
/// a sequential scan, thread t reading its own contiguous share, then
/// random reads, every word checked. (scan GB/s, random reads per second,
/// the two phases' times.)
fn scan_and_read(a: &DemoArgs, region: &Region, words: u64) -> (f64, f64, [Duration; 2]) {
    let done = Arc::new(AtomicU64::new(0));
    let per = words.div_ceil(a.threads as u64);
    let scan_el = parallel(a.threads, a.size, "scan", &done, |t| {
        let (lo, hi) = (t as u64 * per, ((t as u64 + 1) * per).min(words));
        let w = region.words();
        for i in lo..hi {
            let v = w[i as usize].load(Relaxed);
            assert_eq!(v, word(i * 8), "scan: wrong data at byte {}", i * 8);
            if i % 65536 == 0 {
                done.fetch_add(65536 * 8, Relaxed);
            }
        }
    });
    let scan = report(
        "sequential scan",
        a.size as f64 / scan_el.as_secs_f64() / 1e9,
        "GB/s",
        scan_el,
    );
    let done = Arc::new(AtomicU64::new(0));
    let reads_per_thread = a.reads();
    let total_reads = reads_per_thread * a.threads as u64;
    let read_el = parallel(a.threads, total_reads * 8, "random reads", &done, |t| {
        let mut rng = read_rng(t as u64);
        let w = region.words();
        for i in 0..reads_per_thread {
            let k = rng.next_u64() % words;
            assert_eq!(
                w[k as usize].load(Relaxed),
                word(k * 8),
                "random read: wrong data at byte {}",
                k * 8
            );
            if i % 1024 == 0 {
                done.fetch_add(1024 * 8, Relaxed);
            }
        }
    });
    let reads = total_reads as f64 / read_el.as_secs_f64();
    print_rate("random reads", read_el, reads);
    (scan, reads, [scan_el, read_el])
}

fn compare(
    a: &DemoArgs,
    dir: &Path,
    up: &[Duration],
    stats: &Stats,
) -> Result<(), Box<dyn std::error::Error>> {
    println!();
    println!(
        "kernel: the same workload through mmap(MAP_SHARED) in a {} memory cgroup ...",
        format_size(a.budget)
    );
    let k = crate::bench::kernel_demo(dir, a.size, a.budget, a.threads, a.reads(), a.writes)?;
    println!(
        "{:<22} {:>10} {:>10} {:>8}",
        "phase (s)", "upager", "kernel", "ratio"
    );
    let names = ["sequential scan", "random reads", "random writes", "flush"];
    let ks = [k.scan_s, k.reads_s, k.writes_s, k.flush_s];
    for ((n, u), kv) in names.iter().zip(up).zip(ks) {
        let u = u.as_secs_f64();
        println!("{n:<22} {u:>10.2} {kv:>10.2} {:>7.2}×", u / kv);
    }
    println!(
        "{:<22} {:>10} {:>10}",
        "peak memory",
        format_size(stats.resident_peak_bytes),
        k.peak_bytes.map_or("-".into(), format_size)
    );
    println!(
        "{:<22} {:>10} {:>10}",
        "TLB shootdowns",
        format!("{} calls", stats.tlb_flush_batches),
        k.tlb_sends.map_or("-".into(), |n| format!("{n} IPIs"))
    );
    for n in k.notes {
        println!("note: {n}");
    }
    Ok(())
}

fn write_index(r: u64, words: u64, nt: u64, t: u64) -> u64 {
    let k = r % words;
    let k = k - k % nt + t;
    if k >= words {
        t
    } else {
        k
    }
}

/// Prints a phase's line with its rate of operations per second.
fn print_rate(what: &str, el: Duration, ops: f64) {
    println!(
        "  {what:<28} {:>8.2} s  {:>12}",
        el.as_secs_f64(),
        per_sec(ops)
    );
}

fn report(what: &str, v: f64, unit: &str, el: Duration) -> f64 {
    println!("  {what:<28} {:>8.2} s  {v:>8.2} {unit}", el.as_secs_f64());
    v
}

fn unmap(region: Region) -> Result<(), Box<dyn std::error::Error>> {
    region
        .unmap()
        .map_err(|(e, _region)| Box::new(e) as Box<dyn std::error::Error>)
}

fn make_dataset(path: &Path, size: u64) -> Result<(), Box<dyn std::error::Error>> {
    let pb = bar(size, "make dataset");
    let f = upager_testdata::write_file_with_progress(path, size, word, |off| pb.set_position(off))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    f.sync_all()?;
    pb.finish_and_clear();
    Ok(())
}

/// A bitmap of word indexes.
struct Bits(Vec<u64>);
impl Bits {
    fn set(&mut self, i: u64) {
        self.0[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn get(&self, i: u64) -> bool {
        self.0[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    fn count(&self) -> u64 {
        self.0.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// Replays every thread's write sequence into a bitmap of written words.
fn replay_writes(a: &DemoArgs, words: u64) -> Bits {
    let mut bits = Bits(vec![0; words.div_ceil(64) as usize]);
    for t in 0..a.threads as u64 {
        let mut rng = write_rng(t);
        for _ in 0..a.writes {
            bits.set(write_index(rng.next_u64(), words, a.threads as u64, t));
        }
    }
    bits
}

/// Reads the dataset back and checks every byte: rewritten words hold
/// [`written`], all others the pattern.
fn verify(path: &Path, size: u64, written_words: &Bits) -> Result<(), Box<dyn std::error::Error>> {
    let len = std::fs::metadata(path)?.len();
    if len != size {
        return Err(format!("verification failed: the dataset is {len} bytes, not {size}").into());
    }
    let pb = bar(size, "verify");
    let expected = |at: u64| {
        if written_words.get(at / 8) {
            written(at)
        } else {
            word(at)
        }
    };
    let bad =
        upager_testdata::verify_file_with_progress(path, expected, |off| pb.set_position(off))?;
    pb.finish_and_clear();
    match bad {
        None => Ok(()),
        Some(m) => Err(format!(
            "verification failed at byte {}: file has {:#x}, expected {:#x}",
            m.offset, m.found, m.expected
        )
        .into()),
    }
}

/// The demo's dataset on a Redis Cluster (`--store`): uploaded from the
/// local file, downloaded back into it for the check, deleted at the end
/// (also when the demo fails half-way).
struct Remote {
    url: StoreUrl,
    opts: RedisOptions,
    store: Option<std::sync::Arc<RedisStore>>,
}

impl Remote {
    /// Uploads `path` as the dataset `url` names (default
    /// `upager-demo-PID`) in chunks of `chunk` bytes.
    fn upload(
        url: &StoreUrl,
        path: &Path,
        size: u64,
        chunk: u64,
    ) -> Result<Remote, Box<dyn std::error::Error>> {
        let name = url
            .name
            .clone()
            .unwrap_or_else(|| format!("upager-demo-{}", std::process::id()));
        let url = url.with_name(&name);
        let opts = RedisOptions::default();
        let t0 = Instant::now();
        let pb = bar(size, "upload");
        let upload = Upload::start();
        let up = upager_redis::upload_cancellable(
            path,
            &url,
            chunk,
            &opts,
            &mut |done, _| pb.set_position(done),
            &upload.0,
        );
        pb.finish_and_clear();
        // Opened once more to delete it at the end, whatever happens:
        // registered before the upload counts as over, so that a signal
        // that came as it completed deletes it too.
        let st = up
            .map_err(Box::<dyn std::error::Error>::from)
            .and_then(|_| {
                let st = RedisStore::open(&url, false, &opts)?;
                leftovers().remote = Some((url.to_string(), Arc::clone(&st)));
                Ok(st)
            });
        upload.finish();
        let store = Some(st?);
        println!(
            "  uploaded to {url:<16} {:>8.2} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(Remote { url, opts, store })
    }

    /// Reads the dataset back from the cluster into `path` (a fresh
    /// connection, not the pager's).
    fn download(&self, path: &Path, size: u64) -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::FileExt;
        use upager::Store;
        let st = RedisStore::open(&self.url, false, &self.opts)?;
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        let pb = bar(size, "download");
        let mut buf = vec![0u8; (4 << 20).max(st.chunk() as usize)];
        let mut off = 0u64;
        while off < size {
            let n = (buf.len() as u64).min(size - off) as usize;
            let got = st
                .read_at(&mut buf[..n], off)
                .map_err(|e| format!("reading {} back at byte {off}: {e}", self.url))?;
            if got < n {
                return Err(
                    format!("{} holds {} bytes, not {size}", self.url, off + got as u64).into(),
                );
            }
            file.write_all_at(&buf[..n], off)?;
            off += n as u64;
            pb.set_position(off);
        }
        pb.finish_and_clear();
        let c = st.counters();
        println!(
            "  read back from the cluster ({} round trips, {} MB)",
            c.round_trips,
            c.bytes_received / 1_000_000
        );
        Ok(())
    }

    /// Deletes the dataset.
    fn finish(mut self) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(st) = self.store.take() {
            let mut l = leftovers();
            l.remote = None;
            st.delete()?;
            println!("deleted {} from the cluster", self.url);
        }
        Ok(())
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(st) = self.store.take() {
            let mut l = leftovers();
            l.remote = None;
            if let Err(e) = st.delete() {
                eprintln!("upager demo: could not delete {}: {e}", self.url);
            }
        }
    }
}

fn print_stats(s: &Stats, folio: u64) {
    println!("engine counters:");
    for (name, v) in s.iter() {
        let shown = if name.ends_with("bytes") {
            format!("{v} ({})", format_size(v))
        } else {
            v.to_string()
        };
        println!("  {name:<28} {shown}");
    }
    let pages = s.evictions * (folio / 4096);
    if s.evictions > 0 {
        println!(
            "  -> {} flush calls for {} evicted folios: {:.2} per 1000 evicted 4 KiB pages (at {} folios)",
            s.tlb_flush_batches,
            s.evictions,
            s.tlb_flush_batches as f64 * 1000.0 / pages as f64,
            format_size(folio)
        );
    }
    println!(
        "  -> peak resident {} of budget {}",
        format_size(s.resident_peak_bytes),
        format_size(s.budget_bytes)
    );
}

/// `--store s3://...`: the dataset uploaded as an object, paged read-only
/// (scan and random reads, each word checked against the pattern), the
/// store's counters printed, the object deleted (also on an error or a
/// signal).
fn s3_demo(
    a: &DemoArgs,
    url: &upager_s3::S3Url,
    pager: &Pager,
    path: &Path,
    folio: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let key = if url.key.is_empty() || url.key.ends_with('/') {
        format!("{}upager-demo-{}", url.key, std::process::id())
    } else {
        url.key.clone()
    };
    let url = url.with_key(&key);
    let s3 = upager_s3::S3Options::default();
    let objects = upager_s3::Objects::open(&url, &s3)?;
    /// Deletes the object when the demo ends, however it ends.
    struct Object<'a>(&'a upager_s3::Objects, &'a upager_s3::S3Url);
    impl Drop for Object<'_> {
        fn drop(&mut self) {
            let mut l = leftovers();
            l.object = None;
            match self.0.delete(&self.1.key) {
                Ok(()) => println!("deleted {}", self.1),
                Err(e) => eprintln!("upager demo: could not delete {}: {e}", self.1),
            }
        }
    }
    leftovers().object = Some(url.clone());
    let _object = Object(&objects, &url);
    let t0 = Instant::now();
    let pb = bar(a.size, "upload");
    let upload = Upload::start();
    let up = objects.upload_with(path, &key, &upload.0, &mut |done, _| pb.set_position(done));
    upload.finish();
    pb.finish_and_clear();
    up?;
    println!(
        "  uploaded to {url:<16} {:>8.2} s",
        t0.elapsed().as_secs_f64()
    );
    let st = upager_s3::S3Store::open(&url, &s3)?;
    let region = pager.map_store(
        Arc::clone(&st) as Arc<dyn upager::Store>,
        &MapOptions::new().folio(folio),
    )?;
    let words = a.size / 8;
    let (scan, reads, _) = scan_and_read(a, &region, words);
    println!("  (an s3:// object is read-only: no write phase; every word read was checked)");
    let stats = pager.stats();
    let counters = region.store_counters();
    unmap(region)?;
    println!();
    println!(
        "throughput: scan {scan:.2} GB/s, random reads {}",
        per_sec(reads)
    );
    print_stats(&stats, folio);
    let get = |n: &str| counters.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
    if let Some(hit) = get("cache_hit_bytes") {
        let net = get("store_bytes_received").unwrap_or(0);
        println!(
            "reads served: {} from the disk tier, {} over the network",
            format_size(hit),
            format_size(net)
        );
    }
    println!("store counters (the region's S3 store, and its disk tier):");
    for (name, v) in counters {
        println!("  {name:<28} {v}");
    }
    drop(st);
    // The object is deleted at the end: its bytes in the disk tier go too.
    let dir = upager::CacheConfig::env_dir();
    let named = format!(" {url}");
    upager::cache_remove(&dir, |k| k.ends_with(&named))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_checks_every_word_of_the_dataset() {
        let dir = TempDir::create(
            std::env::temp_dir().join(format!("upager-demo-test-{}", std::process::id())),
        )
        .unwrap();
        let path = dir.0.join("dataset.bin");
        let size = (4 << 20) + 4096;
        let words = size / 8;
        make_dataset(&path, size).unwrap();
        let none = Bits(vec![0; words.div_ceil(64) as usize]);
        verify(&path, size, &none).unwrap();

        // A rewritten word is right only where the replay says it was written.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[40..48].copy_from_slice(&written(40).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = verify(&path, size, &none).unwrap_err().to_string();
        assert!(e.starts_with("verification failed at byte 40:"), "{e}");
        let mut fifth = Bits(vec![0; words.div_ceil(64) as usize]);
        fifth.set(5);
        verify(&path, size, &fifth).unwrap();

        // One flipped bit in the last byte of the last chunk is found.
        bytes[size as usize - 1] ^= 0x80;
        std::fs::write(&path, &bytes).unwrap();
        let e = verify(&path, size, &fifth).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("verification failed at byte {}:", size - 8)),
            "{e}"
        );

        // A short dataset fails too.
        std::fs::write(&path, &bytes[..size as usize - 8]).unwrap();
        assert!(verify(&path, size, &fifth).is_err());
    }
}
