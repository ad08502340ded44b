//! Write faults on fresh anonymous memory, page by page, then discard and
//! repeat (the `multi-fault` benchmark's loop, for profiling one engine).
//! Usage: multifault [threads=2] [seconds=3]
//! The fault mode comes from `UPAGER_FAULT_MODE`; `UPAGER_FAULT_TIMING=1`
//! also prints where the engine spends each fill.
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use upager::{MapOptions, Pager};

const AREA: u64 = 2 << 20;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let threads: usize = a.get(1).map_or(2, |s| s.parse().unwrap());
    let secs: f64 = a.get(2).map_or(3.0, |s| s.parse().unwrap());
    let pager = Pager::builder()
        .budget(256 << 20)
        .fault_timing(std::env::var_os("UPAGER_FAULT_TIMING").is_some())
        .build()
        .unwrap();
    let r = pager
        .map_anonymous(AREA * threads as u64, &MapOptions::new().folio(4096))
        .unwrap();
    let t0 = Instant::now();
    let faults: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let r = &r;
                s.spawn(move || {
                    let (base, end) = (t * AREA, Instant::now() + Duration::from_secs_f64(secs));
                    let mut n = 0;
                    while Instant::now() < end {
                        for o in (base..base + AREA).step_by(4096) {
                            r.bytes()[o as usize].store(1, Relaxed);
                        }
                        n += AREA / 4096;
                        r.discard(base, AREA).unwrap();
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let el = t0.elapsed().as_secs_f64();
    println!(
        "{} threads, mode {}: {:.0} faults/s; {:?}",
        threads,
        pager.fault_mode(),
        faults as f64 / el,
        pager.stats()
    );
    if let Some(p) = pager.fault_phases() {
        println!("  {p}");
    }
}
