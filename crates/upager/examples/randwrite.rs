//! Random 8-byte writes over a file region much larger than the budget,
//! then `flush()`: what write-back costs (the numpy scenario's "random writes + flush"
//! as a numpy user sees it: `a[idx] = 1.5; a.flush()`).
//!
//! Usage: randwrite FILE [folio=4K] [writes=200000] [budget=size/8] [direct=1] [warm=1] [batched=1] [spin_us=0]
//!
//! `warm=1` first reads the whole file sequentially (as the run did
//! before its write phase), so the budget starts full of clean folios.
//! One writing thread, like numpy. Prints writes/s for writes + flush, the
//! write-back counters and each thread's CPU time. The fault mode comes from
//! `UPAGER_FAULT_MODE` (handlers or in-thread). Figures: docs/benchmarks.md,
//! "Random writes + flush".
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use upager::{MapOptions, Pager};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let len = std::fs::metadata(&a[1]).unwrap().len();
    let folio = a.get(2).map_or(4096, |s| upager::parse_size(s).unwrap());
    let writes: u64 = a.get(3).map_or(200_000, |s| s.parse().unwrap());
    let budget = a.get(4).map_or(len / 8, |s| upager::parse_size(s).unwrap());
    let direct = a.get(5).is_none_or(|s| s != "0");
    let warm = a.get(6).is_none_or(|s| s != "0");
    let batched = a.get(7).is_none_or(|s| s != "0");
    let spin = std::time::Duration::from_micros(a.get(8).map_or(0, |s| s.parse().unwrap()));
    let pager = Pager::builder()
        .budget(budget)
        .handler_spin(spin)
        .direct_io(direct)
        .batched_writeback(batched)
        .build()
        .unwrap();
    let r = pager
        .map_file(&a[1], &MapOptions::new().writable(true).folio(folio))
        .unwrap();
    let w = r.words();
    let words = w.len() as u64;
    if warm {
        let mut acc = 0u64;
        for i in (0..w.len()).step_by(512) {
            acc = acc.wrapping_add(w[i].load(Relaxed));
        }
        std::hint::black_box(acc);
    }
    let s0 = pager.stats();
    let t = Instant::now();
    let mut x = upager_testdata::GOLDEN;
    for _ in 0..writes {
        let i = upager_testdata::xorshift64(&mut x) % words;
        w[i as usize].store(0x3ff8_0000_0000_0000, Relaxed); // 1.5f64
    }
    let tw = t.elapsed().as_secs_f64();
    let s1 = pager.stats();
    r.flush().unwrap();
    let tf = t.elapsed().as_secs_f64() - tw;
    let s2 = pager.stats();
    let d = |f: fn(&upager::Stats) -> u64, a: &upager::Stats, b: &upager::Stats| f(b) - f(a);
    println!(
        "folio {} KiB budget {} MiB direct {} batched {}: {:.0} writes/s (writes {:.2} s, flush {:.2} s)",
        folio >> 10,
        budget >> 20,
        direct as u8,
        batched as u8,
        writes as f64 / (tw + tf),
        tw,
        tf
    );
    for (name, a, b) in [("writes", &s0, &s1), ("flush", &s1, &s2)] {
        println!(
            "  {name:6}: writebacks {} submits {} bytes_written {} MiB evict_batches {} evictions {} tlb_flush_batches {} faults_missing {} faults_wp {} handed_off {} dirty_throttled {} direct_stalls {}",
            d(|s| s.writebacks, a, b),
            d(|s| s.writeback_submits, a, b),
            d(|s| s.bytes_written, a, b) >> 20,
            d(|s| s.evict_batches, a, b),
            d(|s| s.evictions, a, b),
            d(|s| s.tlb_flush_batches, a, b),
            d(|s| s.faults_missing, a, b),
            d(|s| s.faults_wp, a, b),
            d(|s| s.faults_handed_off, a, b),
            d(|s| s.dirty_throttled, a, b),
            d(|s| s.direct_reclaim_stalls, a, b),
        );
    }
    // CPU time per thread (user+system), to see which one is saturated.
    let tick = 100.0; // USER_HZ on Linux
    let mut cpu = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let (Some(l), Some(rp)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let f: Vec<&str> = stat[rp + 2..].split(' ').collect();
        let t = (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / tick;
        cpu.push(format!("{} {:.2} s", &stat[l + 1..rp], t));
    }
    println!("  cpu: {}", cpu.join(", "));
    r.unmap().map_err(|(e, _)| e).unwrap();
}
