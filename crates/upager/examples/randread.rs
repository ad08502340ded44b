//! Random 8-byte reads over a file region 8× the budget: fault-path cost.
//! Usage: randread FILE [folio=4K] [threads=2] [reads_per_thread=100000] [handlers=2]
//! With `UPAGER_FAULT_TIMING=1`, also where the engine spends each fill
//! (`PagerBuilder::fault_timing`).
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use upager::{MapOptions, Pager};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let folio = a.get(2).map_or(4096, |s| upager::parse_size(s).unwrap());
    let threads: usize = a.get(3).map_or(2, |s| s.parse().unwrap());
    let reads: u64 = a.get(4).map_or(100_000, |s| s.parse().unwrap());
    let handlers: usize = a.get(5).map_or(2, |s| s.parse().unwrap());
    let len = std::fs::metadata(&a[1]).unwrap().len();
    let pager = Pager::builder()
        .budget(len / 8)
        .readahead(0)
        .handler_threads(handlers)
        .fault_timing(std::env::var_os("UPAGER_FAULT_TIMING").is_some())
        .build()
        .unwrap();
    let r = pager
        .map_file(&a[1], &MapOptions::new().folio(folio))
        .unwrap();
    let words = (r.len() / 8) as u64;
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..threads {
            let r = &r;
            s.spawn(move || {
                let mut x = upager_testdata::GOLDEN ^ k as u64;
                let mut acc = 0u64;
                for _ in 0..reads {
                    let i = upager_testdata::xorshift64(&mut x) % words;
                    acc = acc.wrapping_add(r.words()[i as usize].load(Relaxed));
                }
                std::hint::black_box(acc);
            });
        }
    });
    let el = t.elapsed().as_secs_f64();
    let s = pager.stats();
    println!(
        "folio {folio} threads {threads} handlers {handlers}: {:.0} reads/s, {} faults, {} deferred, {} stalls, {:.1} us/fault",
        (threads as u64 * reads) as f64 / el,
        s.faults_missing,
        s.faults_deferred,
        s.direct_reclaim_stalls,
        el * 1e6 * threads as f64 / s.faults_missing as f64
    );
    if let Some(p) = pager.fault_phases() {
        println!("  {p}");
    }
}
