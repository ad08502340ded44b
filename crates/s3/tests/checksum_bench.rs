//! The cost of checking a dataset's groups against their checksums (issue
//! 50, part 3; docs/reliability.md, "Bytes checked end to end"): a
//! sequential pass over an S3 dataset through upager (the sum of every
//! u64, one thread, under a budget smaller than the data), and the store
//! alone (`read_at` of 8 MiB at a time, its GETs in flight together: no
//! paging), each with the check and without, interleaved, medians; and
//! xxh3 alone over the same bytes on one core. Ignored in the suite (it takes a minute or more); run it
//! in release:
//!
//! ```sh
//! cargo test --release -p upager-s3 --test checksum_bench -- --ignored --nocapture
//! ```
//!
//! Settings: UPAGER_CKSUM_BENCH_MIB (data, default 256), _ROUNDS (3),
//! _GROUP (bytes per group, default the dataset default, 256 KiB),
//! _BUDGET_MIB (64). Prints one `CKSUM` line per run and a `CKSUM median`
//! line per side.
//!
//! Ports: 22460.. (this binary's server).

#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use common::*;
use upager::{MapOptions, Pager, Store};
use upager_s3::dataset;
use upager_s3::{S3Dataset, S3Options};

const BASE: u16 = 22460;
const BUCKET: &str = "cksum";

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(format!("UPAGER_CKSUM_BENCH_{name}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds (user + system) this process has used so far: what the
/// check costs the client, steadier than the wall clock on a shared host.
fn cpu_s() -> f64 {
    // SAFETY: rusage is plain integers, for which zeros are valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given, which lives here.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a benchmark: run it in release with --ignored --nocapture"]
fn checksum_cost_of_a_dataset_pass() {
    let Some(s) = Server::shared_bucket(BASE, BUCKET) else {
        return;
    };
    let mib = setting("MIB", 256);
    let rounds = setting("ROUNDS", 3);
    let group = setting("GROUP", dataset::DEFAULT_GROUP);
    let budget = setting("BUDGET_MIB", 64) * MIB;
    let env = s.env();
    let plain = S3Options::default();
    let url = s.url(BUCKET, "pass/");
    let _ = dataset::delete(&url, &plain, &env);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    let data = pattern(mib * MIB, 0xc5);
    std::fs::write(&file, &data).unwrap();
    let want = data.chunks_exact(8).fold(0u64, |a, c| {
        a.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()))
    });

    // xxh3 alone, one core: what the check adds per byte at most.
    let mut hash_s = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let mut x = 0u64;
        for c in data.chunks(64 << 10) {
            x ^= xxhash_rust::xxh3::xxh3_64(c);
        }
        hash_s.push(t.elapsed().as_secs_f64());
        std::hint::black_box(x);
    }
    let hash = median(&mut hash_s);
    eprintln!(
        "CKSUM xxh3 alone | {mib} MiB in 64 KiB blocks | {:.3} s | {:.0} MiB/s",
        hash,
        mib as f64 / hash
    );

    let t = Instant::now();
    let m = dataset::load(
        &url,
        &file,
        group,
        &plain,
        &env,
        &AtomicBool::new(false),
        &mut |_, _| {},
    )
    .unwrap();
    assert!(m.checked);
    eprintln!(
        "CKSUM load (checksums computed and written) | {mib} MiB, groups of {} KiB | {:.2} s",
        group >> 10,
        t.elapsed().as_secs_f64()
    );
    drop(data);

    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut store_times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut cpus: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut store_cpus: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        // Interleaved, the side that goes first alternating.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for checked in order {
            let st = S3Dataset::open_with(&url, false, &plain, &env).unwrap();
            st.set_checksums_checked_for_bench(checked);
            assert_eq!(st.checksums_checked(), checked);
            let pager = Pager::builder().budget(budget).build().unwrap();
            let r = pager
                .map_store(Arc::clone(&st) as Arc<dyn Store>, &MapOptions::new())
                .unwrap();
            let t = Instant::now();
            let cpu0 = cpu_s();
            let mut sum = 0u64;
            for w in r.words() {
                sum = sum.wrapping_add(w.load(Relaxed));
            }
            let el = t.elapsed().as_secs_f64();
            let cpu = cpu_s() - cpu0;
            cpus[usize::from(checked)].push(cpu);
            assert_eq!(sum, want, "the pass read every word right");
            let c = st.counters();
            assert_eq!(c.checksum_errors, 0);
            eprintln!(
                "CKSUM run | round {round} | check {} | {:.3} s | {:.1} MiB/s | cpu {:.3} s | gets {} | received {} MiB",
                if checked { "on " } else { "off" },
                el,
                mib as f64 / el,
                cpu,
                c.gets,
                c.bytes_received >> 20
            );
            times[usize::from(checked)].push(el);
            drop(r);
            // The store alone.
            let st = S3Dataset::open_with(&url, false, &plain, &env).unwrap();
            st.set_checksums_checked_for_bench(checked);
            let mut buf = vec![0u8; 8 << 20];
            let t = Instant::now();
            let cpu0 = cpu_s();
            let mut sum = 0u64;
            let mut at = 0;
            while at < mib * MIB {
                let n = st.read_at(&mut buf, at).unwrap();
                sum = buf[..n].chunks_exact(8).fold(sum, |a, c| {
                    a.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()))
                });
                at += n as u64;
            }
            let el = t.elapsed().as_secs_f64();
            let cpu = cpu_s() - cpu0;
            store_cpus[usize::from(checked)].push(cpu);
            assert_eq!(sum, want);
            eprintln!(
                "CKSUM store run | round {round} | check {} | {:.3} s | {:.1} MiB/s | cpu {:.3} s",
                if checked { "on " } else { "off" },
                el,
                mib as f64 / el,
                cpu
            );
            store_times[usize::from(checked)].push(el);
        }
    }
    let off = median(&mut times[0]);
    let on = median(&mut times[1]);
    let (coff, con) = (median(&mut cpus[0]), median(&mut cpus[1]));
    for (name, t, c) in [("off", off, coff), ("on ", on, con)] {
        eprintln!(
            "CKSUM median | check {name} | {:.3} s | {:.1} MiB/s | cpu {:.3} s",
            t,
            mib as f64 / t,
            c
        );
    }
    eprintln!(
        "CKSUM cost | {:+.1}% time with the check (medians of {rounds})",
        (on / off - 1.0) * 100.0
    );
    let soff = median(&mut store_times[0]);
    let son = median(&mut store_times[1]);
    let (scoff, scon) = (median(&mut store_cpus[0]), median(&mut store_cpus[1]));
    for (name, t, c) in [("off", soff, scoff), ("on ", son, scon)] {
        eprintln!(
            "CKSUM store median | check {name} | {:.3} s | {:.1} MiB/s | cpu {:.3} s",
            t,
            mib as f64 / t,
            c
        );
    }
    eprintln!(
        "CKSUM store cost | {:+.1}% time with the check (medians of {rounds})",
        (son / soff - 1.0) * 100.0
    );
    let _ = dataset::delete(&url, &plain, &env);
}
