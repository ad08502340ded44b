//! Page pools (pool.rs, poolfault.rs): read-only file regions that share
//! one copy of the file's pages between processes, under one budget.
//! Real processes (this test binary run again as a child), real faults.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use upager::{MapOptions, Pager, Region};

/// The child side: maps `UPAGER_POOL_FILE` pooled, checks every word,
/// prints its counters, then waits for a line on stdin (or its end).
#[test]
fn pool_child_main() {
    let Ok(path) = std::env::var("UPAGER_POOL_FILE") else {
        return;
    };
    let budget: u64 = std::env::var("UPAGER_POOL_BUDGET")
        .unwrap()
        .parse()
        .unwrap();
    let pager = Pager::builder().budget(budget).pool(true).build().unwrap();
    let r = pager.map_file(&path, &MapOptions::new()).unwrap();
    let seed: u64 = std::env::var("UPAGER_POOL_SEED").unwrap().parse().unwrap();
    check_words(&r, seed);
    let pool = r.pool_info().expect("the child's region is pooled");
    println!(
        "faults_missing={} procs={} fills={}",
        pager.stats().get("faults_missing").unwrap(),
        pool.procs,
        counter(&r, "pool_fills"),
    );
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn counter(r: &Region, name: &str) -> u64 {
    r.store_counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .1
}

/// Every word of the region equals the pattern file's.
fn check_words(r: &Region, seed: u64) {
    let words = r.words();
    for (i, w) in words.iter().enumerate() {
        let v = w.load(Relaxed);
        assert_eq!(v, common::word(i as u64 * 8, seed), "word {i}");
    }
}

fn pooled(budget: u64) -> Pager {
    Pager::builder().budget(budget).pool(true).build().unwrap()
}

/// One process, a file 8x the budget: every word right, the pool's pages
/// never above its budget, evicted in batches, streams filled by windows.
#[test]
fn a_pooled_region_reads_its_file_within_the_budget() {
    let dir = common::ram_dir();
    let path = common::pattern_file(dir.path(), "data", 8 << 20, 11);
    let pager = pooled(1 << 20);
    let r = pager.map_file(&path, &MapOptions::new()).unwrap();
    let info = r.pool_info().expect("pooled");
    assert_eq!((info.budget, info.procs), (1 << 20, 1));
    check_words(&r, 11);
    check_words(&r, 11);
    let resident = r.pool_info().unwrap().resident;
    assert!(resident <= 1 << 20, "{resident} bytes in the pool");
    let allocated = std::fs::metadata(&info.data_path).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512
    });
    assert!(allocated.unwrap() <= 1 << 20);
    let (fills, evictions, batches) = (
        counter(&r, "pool_fills"),
        counter(&r, "pool_evictions"),
        counter(&r, "pool_evict_batches"),
    );
    assert!(
        fills >= 2 * 2048 - 256,
        "two passes over 2048 folios: {fills} fills"
    );
    assert!(
        evictions >= fills - 256 && batches * 4 <= evictions,
        "{evictions} in {batches}"
    );
    // Streams: one fault per readahead window (2 MiB), not per folio.
    let faults = pager.stats().get("faults_missing").unwrap();
    assert!(faults * 16 <= fills, "{faults} faults for {fills} fills");
    r.unmap().map_err(|(e, _)| e).unwrap();
    drop(pager);
    assert!(
        !info.data_path.exists(),
        "the last process out removes the pool"
    );
}

/// A second process maps the data the first brought in: the kernel maps
/// every page (no fault reaches its pager, nothing is read again), both
/// are counted in the pool, and the pool outlives the first to leave.
#[test]
fn a_second_process_maps_the_pages_the_first_brought_in() {
    let dir = common::ram_dir();
    let path = common::pattern_file(dir.path(), "data", 4 << 20, 12);
    let pager = pooled(16 << 20);
    let r = pager.map_file(&path, &MapOptions::new()).unwrap();
    check_words(&r, 12);
    // Every folio once (a handler publishes a window just after its copy
    // woke the reader).
    common::wait_until("the last window is published", 10, || {
        counter(&r, "pool_fills") == 1024
    });
    let (mut child, line) = spawn_child(&path, 64 << 20, 12);
    assert_eq!(line.trim(), "faults_missing=0 procs=2 fills=1024", "{line}");
    assert_eq!(r.pool_info().unwrap().procs, 2);
    assert_eq!(
        r.pool_info().unwrap().budget,
        16 << 20,
        "the first process's"
    );
    let data = r.pool_info().unwrap().data_path;
    r.unmap().map_err(|(e, _)| e).unwrap();
    drop(pager);
    assert!(data.exists(), "the child still holds the pool");
    drop(child.stdin.take());
    let status = wait_within(&mut child, Duration::from_secs(30));
    assert!(status.success());
    assert!(!data.exists(), "the last process out removed it");
}

/// A process killed while attached leaves the pool usable: the next
/// process maps it and reads every word; once no process is left, the
/// next one starts the pool afresh.
#[test]
fn a_killed_process_leaves_the_pool_whole() {
    let dir = common::ram_dir();
    let path = common::pattern_file(dir.path(), "data", 4 << 20, 13);
    let (mut child, line) = spawn_child(&path, 2 << 20, 13);
    assert!(line.starts_with("faults_missing="), "{line}");
    child.kill().unwrap();
    wait_within(&mut child, Duration::from_secs(30));
    let pager = pooled(64 << 20);
    let r = pager.map_file(&path, &MapOptions::new()).unwrap();
    let info = r.pool_info().unwrap();
    assert_eq!(info.procs, 1);
    assert_eq!(
        info.budget,
        64 << 20,
        "started afresh: this process's budget"
    );
    assert_eq!(info.resident, 0, "the dead process's pages were dropped");
    check_words(&r, 13);
}

/// A stream's async readahead stays a window ahead of the reader: reading
/// the first 2 MiB of a 32 MiB file brings in at most two more windows,
/// not the whole file.
#[test]
fn readahead_stays_a_window_ahead() {
    let dir = common::ram_dir();
    let path = common::pattern_file(dir.path(), "data", 32 << 20, 17);
    let pager = pooled(64 << 20);
    let r = pager.map_file(&path, &MapOptions::new()).unwrap();
    let words = r.words();
    for w in words.iter().take((2 << 20) / 8) {
        w.load(Relaxed);
    }
    std::thread::sleep(Duration::from_millis(100));
    let resident = r.pool_info().unwrap().resident;
    assert!(resident <= 6 << 20, "{} MiB in the pool", resident >> 20);
}

/// A file changed since its pool was made (size or times) gets a pool of
/// its own: no process is served the old bytes.
#[test]
fn a_changed_file_gets_a_new_pool() {
    let dir = common::ram_dir();
    let path = common::pattern_file(dir.path(), "data", 1 << 20, 14);
    let pager = pooled(16 << 20);
    let a = pager.map_file(&path, &MapOptions::new()).unwrap();
    check_words(&a, 14);
    std::thread::sleep(Duration::from_millis(10));
    let other = common::pattern_file(dir.path(), "other", 1 << 20, 15);
    std::fs::rename(&other, &path).unwrap();
    let b = pager.map_file(&path, &MapOptions::new()).unwrap();
    check_words(&b, 15);
    check_words(&a, 14);
    assert_ne!(
        a.pool_info().unwrap().data_path,
        b.pool_info().unwrap().data_path
    );
}

/// Regions that cannot be pooled stay private: writable ones, and with
/// the pool off.
#[test]
fn writable_regions_and_pool_off_stay_private() {
    let dir = common::ram_dir();
    let path = common::pattern_file(dir.path(), "data", 1 << 20, 16);
    let pager = pooled(16 << 20);
    let w = pager
        .map_file(&path, &MapOptions::new().writable(true))
        .unwrap();
    assert!(w.pool_info().is_none());
    let off = pager
        .map_file(&path, &MapOptions::new().pool(false))
        .unwrap();
    assert!(off.pool_info().is_none());
    check_words(&off, 16);
}

/// The child's line of counters (the test harness prints its own first).
/// Starts this binary's `pool_child_main` on `path` (pooled, `budget`,
/// pattern `seed`) and returns it with its line of counters, read once it
/// has checked every word; it then waits for its stdin to close. A thread
/// reads the child's stdout to its end (closing the pipe early would fail
/// the child's next write).
fn spawn_child(path: &std::path::Path, budget: u64, seed: u64) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pool_child_main",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UPAGER_POOL_FILE", path)
        .env("UPAGER_POOL_BUDGET", budget.to_string())
        .env("UPAGER_POOL_SEED", seed.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            // After the harness's "test pool_child_main ... ", on its line.
            if let Some(at) = line.find("faults_missing=") {
                let _ = tx.send(line[at..].to_string());
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the child printed its counters in time");
    (child, line)
}

fn wait_within(child: &mut std::process::Child, timeout: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            panic!("the child did not end in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
