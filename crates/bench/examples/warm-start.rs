//! Warm starts: a cold gather from a local file, on demand
//! against replayed from a trace the previous run recorded
//! (`MapOptions::warm`), and a replay of a trace recorded on other inputs.
//!
//! ```text
//! cargo run --release -p upager-bench --example warm-start -- \
//!     [--file-mib 2048] [--budget-mib 256] [--rows 200000] [--rounds 3] \
//!     [--work-ns 0] [--dir DIR] [--source URL] [--data compressible]
//!     [--added-latency-ms 0] [--workload gather|model] [--out FILE.json]
//! ```
//!
//! What it measures and why: a program that gathers a fixed set of rows
//! (8-byte float64 elements of a file-backed array, as numpy fancy
//! indexing does) pays one fault per miss on every run; readahead cannot
//! help (no sequential runs). With a trace, the prefetch thread reads the
//! rows' folios in the recorded order ahead of the program. Each run
//! starts cold: the file's pages are dropped from the page cache
//! (`posix_fadvise(DONTNEED)`) so every read reaches the device. The data
//! lives on ext4 on zram (set up here as root unless `--dir` names a
//! directory), RAM-speed storage: the gain measured is fault round trips
//! saved and reads batched, not device latency hidden, so a slower store
//! gains more. Engines run interleaved, `--rounds` times; the table gives
//! medians. Bytes read against bytes used: folios read by the run against
//! distinct folios the gather touches.
//!
//! `--workload model` (default `gather`): the file is a model's weights
//! instead, as a safetensors file lays them out: an embedding table (the
//! first eighth, rows of 4 KiB) then 48 layers of equal size in the order
//! of their names sorted as strings (layers.0, layers.1, layers.10, ...,
//! layers.19, layers.2, ...: safetensors writes tensors sorted by name).
//! A "run" looks up `--rows / 100` embedding rows (2,000 by default) and
//! then reads every layer whole in numeric order (one word per 64 bytes):
//! not file order, so readahead sees a sequential run per layer but a jump
//! between layers. The trace of other inputs looks up other embedding
//! rows (a different prompt), with the same layers.
//!
//! Each run's line gives its CPU time (all threads, from
//! `getrusage`) beside its wall time, and the faults that waited on
//! a folio another thread was filling (`faults_deferred`): a replay that
//! leaves a CPU idle while the program waits on it shows there (JSON:
//! `cpu_secs`, `faults_deferred`).
//!
//! `--data incompressible` fills the array with words that do not
//! compress (splitmix64 of the offset) instead of `offset ^ seed`: zram
//! then stores pages as they are (a read is a copy, not a decompression),
//! and so does a store that compresses what it keeps (SeaweedFS gzips
//! compressible chunks of an object, and then decompresses a whole chunk
//! for every ranged GET: ~20-30 ms each here, against ~2 ms for
//! incompressible data).
//!
//! `--source URL` puts the array on a remote store instead, where every
//! miss is a round trip: `redis-cluster://HOST:PORT/NAME` (uploaded in
//! chunks of 64 KiB, the folio; scripts/redis-cluster.sh) or
//! `s3://BUCKET/KEY` (credentials and endpoint from the `AWS_*` variables,
//! as `scripts/seaweedfs.sh env` prints them; folio 64 KiB, the S3
//! store's default). The dataset or object is uploaded first and deleted
//! at the end; its trace is kept beside it by the store. A run is cold
//! there as a new program finds it: nothing of the data in its memory
//! (the server keeps its own caches, as a real one does).
//!
//! `--added-latency-ms N` (remote sources): the client talks to the
//! server through proxies that hold every request N ms
//! (`upager_bench::remote`: what a network between program and store adds
//! to each round trip). Without it the server is on the same two vCPUs as
//! the program, and a GET costs the server's CPU more than it waits, so
//! many GETs in flight gain little: the store here is CPU-bound, a remote
//! one is latency-bound. (No `tc netem` on these machines: its module is
//! not built.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use upager::{MapOptions, Pager, Region, WarmStart};
use upager_bench::Remote;
use upager_redis::RedisOptions;
use upager_s3::S3Options;

const PAGE: u64 = 4096;
const SEED: u64 = 77;

struct Args {
    file_mib: u64,
    budget_mib: u64,
    rows: usize,
    rounds: usize,
    work_ns: u64,
    dir: Option<PathBuf>,
    source: Option<String>,
    incompressible: bool,
    added_latency_ms: u64,
    model: bool,
    out: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        file_mib: 2048,
        budget_mib: 256,
        rows: 200_000,
        rounds: 3,
        work_ns: 0,
        dir: None,
        source: None,
        incompressible: false,
        added_latency_ms: 0,
        model: false,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{k}: {e}"));
        match k.as_str() {
            "--file-mib" => a.file_mib = num(v()?)?,
            "--budget-mib" => a.budget_mib = num(v()?)?,
            "--rows" => a.rows = num(v()?)? as usize,
            "--rounds" => a.rounds = num(v()?)? as usize,
            "--work-ns" => a.work_ns = num(v()?)?,
            "--dir" => a.dir = Some(PathBuf::from(v()?)),
            "--source" => a.source = Some(v()?),
            "--added-latency-ms" => a.added_latency_ms = num(v()?)?,
            "--data" => {
                a.incompressible = match v()?.as_str() {
                    "compressible" => false,
                    "incompressible" => true,
                    d => return Err(format!("--data {d}: give compressible or incompressible")),
                }
            }
            "--workload" => {
                a.model = match v()?.as_str() {
                    "gather" => false,
                    "model" => true,
                    w => return Err(format!("--workload {w}: give gather or model")),
                }
            }
            "--out" => a.out = Some(PathBuf::from(v()?)),
            "-h" | "--help" => {
                println!("see the doc comment of crates/bench/examples/warm-start.rs");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    Ok(a)
}

/// `n` row indices (elements of 8 bytes) of an array of `elems`, from
/// `salt`: a fixed random gather.
fn gather(n: usize, elems: u64, salt: u64) -> Vec<u64> {
    let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % elems
        })
        .collect()
}

/// Words the program reads: `words` words from word `start`, every
/// `stride`-th.
#[derive(Clone, Copy)]
struct Span {
    start: u64,
    words: u64,
    stride: u64,
}

/// A gather of single words.
fn gather_spans(rows: &[u64]) -> Vec<Span> {
    rows.iter()
        .map(|&r| Span {
            start: r,
            words: 1,
            stride: 1,
        })
        .collect()
}

/// Layers of the model workload (see the module doc).
const LAYERS: u64 = 48;
/// Words per embedding row (4 KiB).
const ROW_WORDS: u64 = 512;

/// The model workload's reads (module doc): `lookups` embedding rows
/// chosen by `salt`, then every layer in numeric order, one word per 64
/// bytes.
fn model_spans(elems: u64, lookups: usize, salt: u64) -> Vec<Span> {
    let emb_rows = elems / 8 / ROW_WORDS;
    let layer_words = (elems - emb_rows * ROW_WORDS) / LAYERS / ROW_WORDS * ROW_WORDS;
    let mut file_order: Vec<u64> = (0..LAYERS).collect();
    file_order.sort_by_key(|i| format!("layers.{i}"));
    let mut v: Vec<Span> = gather(lookups, emb_rows, salt)
        .into_iter()
        .map(|row| Span {
            start: row * ROW_WORDS,
            words: ROW_WORDS,
            stride: 8,
        })
        .collect();
    for layer in 0..LAYERS {
        let pos = file_order
            .iter()
            .position(|&l| l == layer)
            .expect("a layer") as u64;
        v.push(Span {
            start: emb_rows * ROW_WORDS + pos * layer_words,
            words: layer_words,
            stride: 8,
        });
    }
    v
}

/// Each word index `spans` read, in order.
fn span_words(spans: &[Span]) -> impl Iterator<Item = u64> + '_ {
    spans
        .iter()
        .flat_map(|s| (s.start..s.start + s.words).step_by(s.stride as usize))
}

/// Where the array lives, and its warm-start trace beside it.
enum Source {
    File(PathBuf),
    Remote(Remote),
}

/// Folio of the remote sources: the S3 store's default, and the chunk a
/// Redis dataset is uploaded in here (its folio: `Store::unit`).
const REMOTE_FOLIO: u64 = upager_s3::DEFAULT_FOLIO;

impl Source {
    fn parse(url: Option<&str>, file: &Path) -> Result<Source, Box<dyn std::error::Error>> {
        Ok(match url {
            None => Source::File(file.to_path_buf()),
            Some(u) => Source::Remote(Remote::parse(u)?),
        })
    }

    fn folio(&self) -> u64 {
        match self {
            Source::File(_) => PAGE,
            Source::Remote(_) => REMOTE_FOLIO,
        }
    }

    /// Puts the file's bytes where the source says (a file is there).
    fn upload(&self, file: &Path) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Source::File(_) => Ok(()),
            Source::Remote(r) => r.upload(file, REMOTE_FOLIO),
        }
    }

    fn delete(&self) {
        match self {
            Source::File(f) => {
                let _ = std::fs::remove_file(upager::trace_path(f));
            }
            Source::Remote(r) => r.delete(),
        }
    }

    /// The trace kept beside the data now.
    fn trace(&self) -> Vec<u8> {
        match self {
            Source::File(f) => std::fs::read(upager::trace_path(f)).unwrap(),
            Source::Remote(r) => r
                .store()
                .unwrap()
                .load_trace()
                .unwrap()
                .expect("a trace was recorded"),
        }
    }

    /// Puts `trace` beside the data (it was recorded on the same data, so
    /// its identity matches).
    fn set_trace(&self, trace: &[u8]) {
        match self {
            Source::File(f) => std::fs::write(upager::trace_path(f), trace).unwrap(),
            Source::Remote(r) => r.store().unwrap().save_trace(trace).unwrap(),
        }
    }

    /// Maps the array cold: a file's pages dropped from the page cache
    /// first; a store opened anew.
    fn map(&self, pager: &Pager, how: WarmStart) -> Region {
        let opts = MapOptions::new().warm(how);
        match self {
            Source::File(f) => {
                upager_bench::evict_file(f).unwrap();
                pager.map_file(f, &opts).unwrap()
            }
            Source::Remote(Remote::Redis(url)) => {
                upager_redis::map(pager, url, &opts, &RedisOptions::default()).unwrap()
            }
            Source::Remote(Remote::S3(url)) => {
                upager_s3::map(pager, url, &opts, &S3Options::default()).unwrap()
            }
        }
    }
}

struct Run {
    secs: f64,
    faults: u64,
    read_bytes: u64,
    replay_reads: u64,
    replay_wasted: u64,
    peak: u64,
    /// CPU time of the whole process (all threads) over the run.
    cpu_secs: f64,
    /// Faults that waited on a folio another thread was filling.
    deferred: u64,
}

/// The word at byte `off` of the array.
fn word(off: u64, incompressible: bool) -> u64 {
    if incompressible {
        upager_testdata::mix(off ^ SEED)
    } else {
        upager_testdata::xor_word(off, SEED)
    }
}

fn run(src: &Source, budget: u64, how: WarmStart, spans: &[Span], a: &Args) -> Run {
    let pager = Pager::new(budget).unwrap();
    let cpu0 = cpu_secs();
    let t = Instant::now();
    let r = src.map(&pager, how);
    let words = r.words();
    let mut sum = 0u64;
    for row in span_words(spans) {
        sum = sum.wrapping_add(words[row as usize].load(std::sync::atomic::Ordering::Relaxed));
        if a.work_ns > 0 {
            let w = Instant::now();
            while w.elapsed() < Duration::from_nanos(a.work_ns) {
                std::hint::spin_loop();
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let want: u64 = span_words(spans).fold(0u64, |s, row| {
        s.wrapping_add(word(row * 8, a.incompressible))
    });
    assert_eq!(sum, want, "the gather read the file's words");
    drop(r);
    let s = pager.stats();
    Run {
        secs,
        faults: s.faults_missing,
        read_bytes: s.bytes_read,
        replay_reads: s.replay_reads,
        replay_wasted: s.replay_wasted,
        peak: s.resident_peak_bytes,
        cpu_secs: cpu_secs() - cpu0,
        deferred: s.faults_deferred,
    }
}

fn cpu_secs() -> f64 {
    upager_bench::process_cpu_secs().expect("getrusage")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let len = a.file_mib << 20;
    let budget = a.budget_mib << 20;
    let _zram;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            let z = upager_bench::ZramExt4::setup_or_hot_add(0, len + len / 4)?;
            let d = z.mount_point().to_path_buf();
            _zram = z;
            d
        }
    };
    let path = dir.join("warm-start.dat");
    let inc = a.incompressible;
    upager_testdata::write_file(&path, len, |off| word(off, inc))?.sync_all()?;
    let mut src = Source::parse(a.source.as_deref(), &path)?;
    // Uploaded straight to the server; the runs go through the proxy.
    src.upload(&path)?;
    let _announced = match &mut src {
        Source::Remote(r) => r.add_latency(Duration::from_millis(a.added_latency_ms))?,
        Source::File(_) if a.added_latency_ms > 0 => {
            return Err(
                "--added-latency-ms needs a remote source (s3:// or redis-cluster://)".into(),
            )
        }
        Source::File(_) => None,
    };
    let elems = len / 8;
    let (rows, other) = if a.model {
        (
            model_spans(elems, a.rows / 100, 1),
            model_spans(elems, a.rows / 100, 2),
        )
    } else {
        (
            gather_spans(&gather(a.rows, elems, 1)),
            gather_spans(&gather(a.rows, elems, 2)),
        )
    };
    let folio = src.folio();
    let used = {
        // Every folio a span covers is read (a word per 64 bytes at most).
        let mut f: Vec<u64> = rows
            .iter()
            .flat_map(|s| s.start * 8 / folio..=(s.start + s.words - 1) * 8 / folio)
            .collect();
        f.sort_unstable();
        f.dedup();
        f.len() as u64 * folio
    };
    // A trace of `rows`, and one of `other` kept aside.
    run(&src, budget, WarmStart::Record, &other, &a);
    let other_trace = src.trace();
    run(&src, budget, WarmStart::Record, &rows, &a);
    let rows_trace = src.trace();
    println!(
        "warm-start {}: {} MiB {} ({}, +{} ms per request), {} MiB budget, {} rows ({} MiB of folios used), trace {} KiB",
        if a.model { "model" } else { "gather" },
        a.file_mib,
        a.source.as_deref().unwrap_or("file"),
        if inc { "incompressible" } else { "compressible" },
        a.added_latency_ms,
        a.budget_mib,
        a.rows,
        used >> 20,
        rows_trace.len() >> 10
    );
    let engines: [(&str, WarmStart, Option<&[u8]>); 3] = [
        ("on demand", WarmStart::Off, None),
        ("replayed", WarmStart::Auto, Some(&rows_trace)),
        ("trace of other rows", WarmStart::Auto, Some(&other_trace)),
    ];
    let mut results: Vec<Vec<Run>> = (0..engines.len()).map(|_| Vec::new()).collect();
    for round in 0..a.rounds {
        for (k, (name, how, tr)) in engines.iter().enumerate() {
            if let Some(tr) = tr {
                src.set_trace(tr);
            }
            let r = run(&src, budget, *how, &rows, &a);
            println!(
                "  round {round} {name:<20} {:>7.3} s (cpu {:.2} s)  {:>7} faults ({} waited)  {:>6} MiB read  replay {:>7} ({} wasted)  peak {} MiB",
                r.secs,
                r.cpu_secs,
                r.faults,
                r.deferred,
                r.read_bytes >> 20,
                r.replay_reads,
                r.replay_wasted,
                r.peak >> 20
            );
            assert!(r.peak <= budget, "budget held");
            results[k].push(r);
        }
    }
    let base = median(results[0].iter().map(|r| r.secs).collect());
    println!("\n| engine | time (s) | vs on demand | faults | MiB read / MiB used |");
    println!("|---|---|---|---|---|");
    let mut json = Vec::new();
    for ((name, _, _), rs) in engines.iter().zip(&results) {
        let secs = median(rs.iter().map(|r| r.secs).collect());
        let faults = median(rs.iter().map(|r| r.faults as f64).collect());
        let read = median(rs.iter().map(|r| r.read_bytes as f64).collect());
        println!(
            "| {name} | {secs:.3} | {:.2}x faster | {faults:.0} | {:.0} / {} |",
            base / secs,
            read / f64::from(1 << 20),
            used >> 20
        );
        json.push(format!(
            "{{\"engine\":\"{name}\",\"secs\":[{}],\"faults\":[{}],\"read_bytes\":[{}],\"replay_reads\":[{}],\"replay_wasted\":[{}],\"cpu_secs\":[{}],\"faults_deferred\":[{}]}}",
            rs.iter().map(|r| format!("{:.4}", r.secs)).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.faults.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.read_bytes.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.replay_reads.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.replay_wasted.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| format!("{:.3}", r.cpu_secs)).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.deferred.to_string()).collect::<Vec<_>>().join(","),
        ));
    }
    if let Some(out) = &a.out {
        if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)?;
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        std::fs::write(
            out,
            format!(
                "{{\"bench\":\"warm-start\",\"workload\":\"{}\",\"unix_time\":{},\"host\":\"{}\",\"source\":\"{}\",\"data\":\"{}\",\"added_latency_ms\":{},\"file_mib\":{},\"budget_mib\":{},\"rows\":{},\"work_ns\":{},\"used_bytes\":{used},\"engines\":[{}]}}\n",
                if a.model { "model" } else { "gather" },
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                host.trim(),
                a.source.as_deref().unwrap_or("file"),
                if inc { "incompressible" } else { "compressible" },
                a.added_latency_ms,
                a.file_mib,
                a.budget_mib,
                a.rows,
                a.work_ns,
                json.join(",")
            ),
        )?;
    }
    src.delete();
    let _ = std::fs::remove_file(&path);
    Ok(())
}
