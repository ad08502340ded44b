//! Warm starts (issue 32): a cold gather from a local file, on demand
//! against replayed from a trace the previous run recorded
//! (`MapOptions::warm`), and a replay of a trace recorded on other inputs.
//!
//! ```text
//! cargo run --release -p upager-bench --example warm-start -- \
//!     [--file-mib 2048] [--budget-mib 256] [--rows 200000] [--rounds 3] \
//!     [--work-ns 0] [--dir DIR] [--out FILE.json]
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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use upager::{MapOptions, Pager, WarmStart};

const PAGE: u64 = 4096;
const SEED: u64 = 77;

struct Args {
    file_mib: u64,
    budget_mib: u64,
    rows: usize,
    rounds: usize,
    work_ns: u64,
    dir: Option<PathBuf>,
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

struct Run {
    secs: f64,
    faults: u64,
    read_bytes: u64,
    replay_reads: u64,
    replay_wasted: u64,
    peak: u64,
}

fn run(path: &Path, budget: u64, how: WarmStart, rows: &[u64], work_ns: u64) -> Run {
    upager_bench::evict_file(path).unwrap();
    let pager = Pager::new(budget).unwrap();
    let t = Instant::now();
    let r = pager.map_file(path, &MapOptions::new().warm(how)).unwrap();
    let words = r.words();
    let mut sum = 0u64;
    for &row in rows {
        sum = sum.wrapping_add(words[row as usize].load(std::sync::atomic::Ordering::Relaxed));
        if work_ns > 0 {
            let w = Instant::now();
            while w.elapsed() < Duration::from_nanos(work_ns) {
                std::hint::spin_loop();
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let want: u64 = rows.iter().fold(0u64, |s, &row| {
        s.wrapping_add(upager_testdata::xor_word(row * 8, SEED))
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
    }
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
    upager_bench::create_pattern_file(&path, len, SEED)?;
    let trace = upager::trace_path(&path);
    let elems = len / 8;
    let rows = gather(a.rows, elems, 1);
    let other = gather(a.rows, elems, 2);
    let used = {
        let mut f: Vec<u64> = rows.iter().map(|r| r * 8 / PAGE).collect();
        f.sort_unstable();
        f.dedup();
        f.len() as u64 * PAGE
    };
    // A trace of `rows`, and one of `other` kept aside.
    let _ = std::fs::remove_file(&trace);
    run(&path, budget, WarmStart::Record, &other, a.work_ns);
    let other_trace = dir.join("other.upager-trace");
    std::fs::rename(&trace, &other_trace)?;
    run(&path, budget, WarmStart::Record, &rows, a.work_ns);
    let rows_trace = dir.join("rows.upager-trace");
    std::fs::copy(&trace, &rows_trace)?;
    println!(
        "warm-start: {} MiB file, {} MiB budget, {} rows ({} MiB of folios used), trace {} KiB",
        a.file_mib,
        a.budget_mib,
        a.rows,
        used >> 20,
        std::fs::metadata(&rows_trace)?.len() >> 10
    );
    let engines: [(&str, WarmStart, Option<&Path>); 3] = [
        ("on demand", WarmStart::Off, None),
        ("replayed", WarmStart::Auto, Some(&rows_trace)),
        ("trace of other rows", WarmStart::Auto, Some(&other_trace)),
    ];
    let mut results: Vec<Vec<Run>> = (0..engines.len()).map(|_| Vec::new()).collect();
    for round in 0..a.rounds {
        for (k, (name, how, tr)) in engines.iter().enumerate() {
            if let Some(tr) = tr {
                std::fs::copy(tr, &trace)?;
                // The copy's identity must still match: it was recorded
                // on this file, unchanged since.
            }
            let r = run(&path, budget, *how, &rows, a.work_ns);
            println!(
                "  round {round} {name:<20} {:>7.3} s  {:>7} faults  {:>6} MiB read  replay {:>7} ({} wasted)  peak {} MiB",
                r.secs,
                r.faults,
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
            "{{\"engine\":\"{name}\",\"secs\":[{}],\"faults\":[{}],\"read_bytes\":[{}],\"replay_reads\":[{}],\"replay_wasted\":[{}]}}",
            rs.iter().map(|r| format!("{:.4}", r.secs)).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.faults.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.read_bytes.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.replay_reads.to_string()).collect::<Vec<_>>().join(","),
            rs.iter().map(|r| r.replay_wasted.to_string()).collect::<Vec<_>>().join(","),
        ));
    }
    if let Some(out) = &a.out {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        std::fs::write(
            out,
            format!(
                "{{\"bench\":\"warm-start\",\"unix_time\":{},\"host\":\"{}\",\"file_mib\":{},\"budget_mib\":{},\"rows\":{},\"work_ns\":{},\"used_bytes\":{used},\"engines\":[{}]}}\n",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                host.trim(),
                a.file_mib,
                a.budget_mib,
                a.rows,
                a.work_ns,
                json.join(",")
            ),
        )?;
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&trace);
    Ok(())
}
