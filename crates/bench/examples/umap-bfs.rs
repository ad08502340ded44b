//! UMap's bfs through the drop-in: cold on demand against
//! replayed from the trace an earlier run recorded (`UPAGER_WARM`), beside
//! the kernel's mmap in a memory cgroup of the same budget (bfs `-s`).
//!
//! ```text
//! cargo run --release -p upager-bench --example umap-bfs -- \
//!     --umap-src DIR [--scale 20] [--budget-mib 64] [--rounds 5] \
//!     [--threads 2] [--dir DIR] [--source URL [--added-latency-ms N]] \
//!     [--out FILE.json]
//! ```
//!
//! What it measures and why: UMap users run graph analytics over files
//! larger than the memory they may use, and the same graph is traversed
//! again and again. bfs (LLNL/umap `examples/bfs`, built unchanged from
//! `--umap-src`, a checkout of github.com/LLNL/umap) maps a CSR graph with
//! `umap()` on an `O_DIRECT` descriptor and runs a level-synchronous BFS
//! with OpenMP threads (static schedule). The graph is an R-MAT graph of
//! 2^scale vertices and 32 x 2^scale directed edges (Graph500's edge
//! factor 16, both directions), made by UMap's own generator and
//! ingester: 264 MiB at scale 20. Each run starts cold (the file's pages
//! dropped with `posix_fadvise(DONTNEED)`; the data lives on ext4 on zram,
//! set up here as root unless `--dir` names a directory). The trace is
//! recorded once (`UPAGER_WARM=record`, itself timed as "record") and
//! replayed by every `UPAGER_WARM=on` run; engines run interleaved,
//! `--rounds` times; the table gives medians and ratios.
//!
//! Each run's wall time is the process's (map, traversal, unmap); bfs's
//! own "BFS took" (the traversal) is reported beside it. upager's counters
//! come from the drop-in's INFO line at `uunmap` (`UMAP_LOG_LEVEL=INFO`):
//! bytes read (against the graph's size: the rereads a budget forces),
//! faults, replay reads, hits and waste, peak resident. The kernel's peak
//! is the cgroup's. Every run's level counts must equal the first's (the
//! traversal's result, checked).
//!
//! `--source URL` keeps the graph on a remote store instead, where every
//! miss is a round trip: a Redis Cluster dataset
//! (`redis-cluster://HOST:PORT/NAME`, uploaded in chunks of 64 KiB) or an
//! S3 object (`s3://BUCKET/KEY`, credentials and endpoint from the `AWS_*`
//! variables). bfs still runs unchanged: it opens the graph's file, now a
//! placeholder of the graph's size (zeros: the data is only on the store),
//! and the drop-in pages it from the store (`UPAGER_UMAP_STORE`), with
//! `UMAP_PAGESIZE` unset as users leave it: the store's default page
//! (64 KiB: the Redis dataset's chunk, the S3 store's default), the budget
//! `--budget-mib` as for a file. The trace is kept by the store. The
//! kernel's mmap cannot map a store: no baseline then.
//! `--added-latency-ms N` routes every request through proxies that hold
//! it N ms (`upager_bench::remote`): a network's round trip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use upager_bench::report::Machine;
use upager_bench::{Cgroup, Remote};

struct Args {
    umap_src: PathBuf,
    scale: u32,
    budget_mib: u64,
    rounds: usize,
    threads: u32,
    dir: Option<PathBuf>,
    out: Option<PathBuf>,
    source: Option<String>,
    added_latency_ms: u64,
}

/// Pages of a graph on a remote store: the chunk its dataset is uploaded
/// in (and the S3 store's default folio).
const REMOTE_PAGE: u64 = upager_s3::DEFAULT_FOLIO;

fn parse() -> Result<Args, String> {
    let mut a = Args {
        umap_src: PathBuf::new(),
        scale: 20,
        budget_mib: 64,
        rounds: 5,
        threads: 2,
        dir: None,
        out: None,
        source: None,
        added_latency_ms: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{k}: {e}"));
        match k.as_str() {
            "--umap-src" => a.umap_src = PathBuf::from(v()?),
            "--scale" => a.scale = num(v()?)? as u32,
            "--budget-mib" => a.budget_mib = num(v()?)?,
            "--rounds" => a.rounds = num(v()?)?.max(1) as usize,
            "--threads" => a.threads = num(v()?)?.max(1) as u32,
            "--dir" => a.dir = Some(PathBuf::from(v()?)),
            "--out" => a.out = Some(PathBuf::from(v()?)),
            "--source" => a.source = Some(v()?),
            "--added-latency-ms" => a.added_latency_ms = num(v()?)?,
            "-h" | "--help" => {
                println!("usage: umap-bfs --umap-src DIR [--scale 20] [--budget-mib 64] [--rounds 5] [--threads 2] [--dir DIR] [--source URL [--added-latency-ms N]] [--out FILE.json]");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {k} (try --help)")),
        }
    }
    if a.umap_src.as_os_str().is_empty() {
        return Err("--umap-src DIR is needed: a checkout of https://github.com/LLNL/umap (its examples/bfs is built here)".into());
    }
    if a.added_latency_ms > 0 && a.source.is_none() {
        return Err("--added-latency-ms needs --source (s3:// or redis-cluster://)".into());
    }
    if a.source.as_deref().is_some_and(|u| u.contains('@')) {
        return Err("--source: a URL with credentials is not supported here (give S3's in the AWS_* variables)".into());
    }
    if !(10..=26).contains(&a.scale) {
        return Err(format!("--scale {}: give 10..26", a.scale));
    }
    Ok(a)
}

/// Runs `cmd`; its stdout, or an error with its stderr.
fn run(cmd: &mut Command) -> Result<String, Box<dyn std::error::Error>> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs this tree's C library under `work/prefix` and builds UMap's
/// generator, ingester and bfs against it: (generate, ingest, bfs).
fn build(src: &Path, work: &Path) -> Result<[PathBuf; 3], Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let prefix = work.join("prefix");
    run(Command::new("make")
        .arg("-s")
        .arg("install-c")
        .arg(format!("PREFIX={}", prefix.display()))
        .current_dir(&root))?;
    let bfs_src = src.join("examples/bfs");
    if !bfs_src.join("main.cpp").exists() {
        return Err(format!(
            "{} has no examples/bfs/main.cpp: give a checkout of LLNL/umap",
            src.display()
        )
        .into());
    }
    let out = |n: &str| work.join(n);
    let cxx = |source: &str, exe: &Path, umap: bool| {
        let mut c = Command::new("g++");
        c.args(["-O3", "-fopenmp", "-std=c++17", "-w"])
            .arg(format!("-I{}", bfs_src.display()))
            .arg(bfs_src.join(source))
            .arg("-o")
            .arg(exe);
        if umap {
            c.arg(format!("-I{}/include", prefix.display()))
                .arg(format!("-L{}/lib", prefix.display()))
                .arg("-lumap")
                .arg(format!("-Wl,-rpath,{}/lib", prefix.display()));
        }
        run(&mut c)
    };
    let exes = [
        out("generate_edge_list"),
        out("ingest_edge_list"),
        out("bfs"),
    ];
    cxx(
        "rmat_graph_generator/generate_edge_list.cpp",
        &exes[0],
        false,
    )?;
    cxx("rmat_graph_generator/ingest_edge_list.cpp", &exes[1], true)?;
    cxx("main.cpp", &exes[2], true)?;
    Ok(exes)
}

/// Drops the file's pages from the page cache (written back first).
fn drop_cache(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::File::open(path)?.sync_all()?;
    Ok(upager_bench::evict_file(path)?)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Engine {
    OnDemand,
    Record,
    Replayed,
    Kernel,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::OnDemand => "upager on demand",
            Engine::Record => "upager recording",
            Engine::Replayed => "upager replayed",
            Engine::Kernel => "kernel mmap, cgroup",
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Run {
    wall: f64,
    bfs: f64,
    counters: Vec<(String, u64)>,
    peak: u64,
    levels: String,
}

impl Run {
    fn counter(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }
}

fn bfs_once(
    a: &Args,
    bfs: &Path,
    graph: &Path,
    remote: Option<&Remote>,
    e: Engine,
) -> Result<Run, Box<dyn std::error::Error>> {
    drop_cache(graph)?;
    let n = 1u64 << a.scale;
    let m = n * 32;
    let budget = a.budget_mib << 20;
    let mut cmd = Command::new(bfs);
    cmd.arg("-n")
        .arg(n.to_string())
        .arg("-m")
        .arg(m.to_string())
        .arg("-g")
        .arg(graph)
        .env("OMP_NUM_THREADS", a.threads.to_string())
        // UMAP_PAGESIZE unset, as a user leaves it: 4 KiB pages from a
        // file, the store's default page from a store (64 KiB).
        .env_remove("UMAP_PAGESIZE")
        .env("UMAP_BUFSIZE", (budget / 4096).to_string())
        .env("UMAP_LOG_LEVEL", "INFO")
        .env(
            "UPAGER_WARM",
            match e {
                Engine::Record => "record",
                Engine::Replayed => "on",
                _ => "off",
            },
        );
    if let Some(r) = remote {
        cmd.env(
            "UPAGER_UMAP_STORE",
            format!("{}={}", graph.display(), r.url()),
        );
        if let Remote::S3(u) = r {
            if let Some(ep) = &u.endpoint {
                cmd.env("AWS_ENDPOINT_URL", ep);
            }
        }
    }
    let cg = if e == Engine::Kernel {
        let cg = Cgroup::create("bfs", budget)?;
        // The shell moves itself into the cgroup, then becomes bfs.
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\" -s",
                cg.path().display()
            ))
            .arg(bfs)
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))));
        cmd = sh;
        Some(cg)
    } else {
        None
    };
    let t = Instant::now();
    let out = cmd.output()?;
    let wall = t.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("bfs ({}) failed ({}): {stderr}", e.name(), out.status).into());
    }
    let mut r = Run {
        wall,
        ..Run::default()
    };
    let mut in_levels = false;
    for l in stdout.lines() {
        if let Some(v) = l.strip_prefix("BFS took (s)") {
            r.bfs = v.trim().parse()?;
        } else if l.starts_with("Level\t") {
            in_levels = true;
        } else if in_levels && l.split('\t').count() == 2 {
            r.levels.push_str(l);
            r.levels.push(';');
        } else {
            in_levels = false;
        }
    }
    if let Some(line) = stderr.lines().rev().find(|l| l.contains("pager counters:")) {
        let tail = line.split("pager counters:").nth(1).unwrap_or("");
        for kv in tail.split(',') {
            let mut it = kv.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                r.counters.push((k.to_string(), v.parse()?));
            }
        }
        r.peak = r.counter("resident_peak_bytes");
    } else if e != Engine::Kernel {
        return Err(format!("bfs ({}): no counters line on stderr: {stderr}", e.name()).into());
    }
    if let Some(cg) = cg {
        r.peak = cg.max_usage_bytes()?;
    }
    Ok(r)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let work = std::env::temp_dir().join(format!("upager-umap-bfs-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    eprintln!(
        "building UMap's bfs against this tree's drop-in in {}",
        work.display()
    );
    let [generate, ingest, bfs] = build(&a.umap_src, &work)?;

    let n = 1u64 << a.scale;
    let graph_bytes = (n + 1 + n * 32) * 8;
    let _zram;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            let z = upager_bench::ZramExt4::setup_or_hot_add(
                0,
                graph_bytes + graph_bytes / 4 + (64 << 20),
            )?;
            let d = z.mount_point().to_path_buf();
            _zram = z;
            d
        }
    };
    // The edge lists and the CSR are made in RAM (as UMap's README
    // advises), then the CSR is copied to the data directory.
    let shm = PathBuf::from(format!("/dev/shm/upager-umap-bfs-{}", std::process::id()));
    std::fs::create_dir_all(&shm)?;
    let t = Instant::now();
    eprintln!("generating an R-MAT graph of scale {} ...", a.scale);
    run(Command::new(&generate)
        .arg("-o")
        .arg(shm.join("edges"))
        .arg("-v")
        .arg(a.scale.to_string())
        .arg("-e")
        .arg((n * 16).to_string()))?;
    let lists: Vec<PathBuf> = std::fs::read_dir(&shm)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    run(Command::new(&ingest)
        .arg("-g")
        .arg(shm.join("csr"))
        .args(&lists))?;
    let graph = dir.join("bfs-csr");
    std::fs::copy(shm.join("csr"), &graph)?;
    std::fs::remove_dir_all(&shm)?;
    let size = std::fs::metadata(&graph)?.len();
    eprintln!(
        "graph: {} MiB in {} ({:.0} s to make)",
        size >> 20,
        dir.display(),
        t.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_file(upager::trace_path(&graph));
    // On a store: the graph (bfs's size, a multiple of the page) uploaded,
    // the file left a placeholder of its size.
    let mut remote = match &a.source {
        None => None,
        Some(u) => {
            let r = Remote::parse(u)?;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&graph)?
                .set_len(size.next_multiple_of(REMOTE_PAGE))?;
            let t = Instant::now();
            r.upload(&graph, REMOTE_PAGE)?;
            let f = std::fs::OpenOptions::new().write(true).open(&graph)?;
            let len = f.metadata()?.len();
            f.set_len(0)?;
            f.set_len(len)?;
            eprintln!(
                "graph uploaded to {} in {:.0} s; {} is a placeholder of its size",
                r.url(),
                t.elapsed().as_secs_f64(),
                graph.display()
            );
            Some(r)
        }
    };
    let _announced = match &mut remote {
        Some(r) => r.add_latency(std::time::Duration::from_millis(a.added_latency_ms))?,
        None => None,
    };
    let remote = remote.as_ref();

    let mut runs: Vec<(Engine, Run)> = Vec::new();
    let mut record = |e: Engine, r: Run| -> Result<(), String> {
        if let Some((_, first)) = runs.first() {
            if first.levels != r.levels {
                return Err(format!(
                    "{} found other levels than the first run: {} against {}",
                    e.name(),
                    r.levels,
                    first.levels
                ));
            }
        }
        eprintln!(
            "{:<20} wall {:.3} s, bfs {:.3} s, read {} MiB, faults {}, replay reads {} (hits {}, wasted {}), peak {} MiB",
            e.name(),
            r.wall,
            r.bfs,
            r.counter("bytes_read") >> 20,
            r.counter("faults_missing"),
            r.counter("replay_reads"),
            r.counter("replay_hits"),
            r.counter("replay_wasted"),
            r.peak >> 20
        );
        runs.push((e, r));
        Ok(())
    };
    record(
        Engine::Record,
        bfs_once(&a, &bfs, &graph, remote, Engine::Record)?,
    )?;
    let traced = match remote {
        None => upager::trace_path(&graph).exists(),
        Some(r) => r.store()?.load_trace()?.is_some(),
    };
    if !traced {
        return Err("the recording run left no trace beside the graph".into());
    }
    // On tmpfs the kernel's mmap maps the file's own pages (nothing read,
    // nothing charged to the cgroup): no baseline there.
    let fstype = run(Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "--target"])
        .arg(&dir))
    .unwrap_or_default();
    let kernel = if remote.is_some() {
        eprintln!("the graph is on a store: no kernel baseline (mmap cannot map it)");
        false
    } else if fstype.lines().any(|l| l.trim() == "tmpfs") {
        eprintln!("{} is tmpfs: the kernel's mmap is left out (it maps the file's pages, reading nothing)", dir.display());
        false
    } else if Cgroup::create("probe", a.budget_mib << 20).is_err() {
        eprintln!("no memory cgroup (not root?): the kernel's mmap is left out");
        false
    } else {
        true
    };
    for _ in 0..a.rounds {
        record(
            Engine::OnDemand,
            bfs_once(&a, &bfs, &graph, remote, Engine::OnDemand)?,
        )?;
        record(
            Engine::Replayed,
            bfs_once(&a, &bfs, &graph, remote, Engine::Replayed)?,
        )?;
        if kernel {
            record(
                Engine::Kernel,
                bfs_once(&a, &bfs, &graph, remote, Engine::Kernel)?,
            )?;
        }
    }

    let med = |e: Engine, f: &dyn Fn(&Run) -> f64| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|(x, _)| *x == e)
            .map(|(_, r)| f(r))
            .collect();
        (!v.is_empty()).then(|| median(v))
    };
    let base = med(Engine::OnDemand, &|r| r.wall).unwrap_or(f64::NAN);
    println!(
        "\nUMap bfs, scale {} ({} MiB graph) from {} (+{} ms per request), {} threads, budget {} MiB, medians of {} interleaved rounds",
        a.scale,
        size >> 20,
        remote.map_or("a file".to_string(), |r| r.url()),
        a.added_latency_ms,
        a.threads,
        a.budget_mib,
        a.rounds
    );
    println!("| engine | wall s | bfs s | on demand / this | read MiB | faults | replay reads | hits | wasted | peak MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut table = Vec::new();
    for e in [
        Engine::OnDemand,
        Engine::Replayed,
        Engine::Record,
        Engine::Kernel,
    ] {
        let Some(wall) = med(e, &|r| r.wall) else {
            continue;
        };
        let bfs_s = med(e, &|r| r.bfs).unwrap_or(0.0);
        let c = |n: &'static str| med(e, &move |r| r.counter(n) as f64).unwrap_or(0.0);
        let peak = med(e, &|r| r.peak as f64).unwrap_or(0.0);
        println!(
            "| {} | {:.3} | {:.3} | {:.2}x | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            e.name(),
            wall,
            bfs_s,
            base / wall,
            c("bytes_read") / 1048576.0,
            c("faults_missing"),
            c("replay_reads"),
            c("replay_hits"),
            c("replay_wasted"),
            peak / 1048576.0
        );
        table.push(serde_json::json!({
            "engine": e.name(), "wall_s": wall, "bfs_s": bfs_s, "speedup_vs_on_demand": base / wall,
            "bytes_read": c("bytes_read"), "faults_missing": c("faults_missing"),
            "replay_reads": c("replay_reads"), "replay_hits": c("replay_hits"),
            "replay_wasted": c("replay_wasted"), "peak_bytes": peak,
        }));
    }
    if let Some(out) = &a.out {
        let all: Vec<serde_json::Value> = runs
            .iter()
            .map(|(e, r)| {
                serde_json::json!({
                    "engine": e.name(), "wall_s": r.wall, "bfs_s": r.bfs, "peak_bytes": r.peak,
                    "counters": r.counters.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "benchmark": "umap-bfs",
            "unix_time": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            "machine": Machine::this(),
            "scale": a.scale, "graph_bytes": size, "threads": a.threads,
            "budget_bytes": a.budget_mib << 20, "rounds": a.rounds,
            "data": dir.display().to_string(),
            "source": remote.map_or("file".to_string(), |r| r.url()),
            "added_latency_ms": a.added_latency_ms,
            "medians": table, "runs": all,
        });
        if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(out, serde_json::to_string_pretty(&doc)?)?;
        eprintln!("wrote {}", out.display());
    }
    std::fs::remove_file(&graph)?;
    let _ = std::fs::remove_file(upager::trace_path(&graph));
    if let Some(r) = remote {
        r.delete();
    }
    std::fs::remove_dir_all(&work)?;
    Ok(())
}
