//! Sequential scan of FILE with 2 MiB folios: how many fills moved a
//! staged huge page in (thp_fills) and how many copied (thp_fill_fallback).
//! Usage: thpscan FILE [budget_mib=256] [threads=1] [rw=1] [write=0]
//! (write=1: the scan stores one word per 4 KiB page instead of loading it)
//! (huge pages need a writable region: rw=0 shows the fallback)
use std::sync::atomic::Ordering::Relaxed;
use upager::{MapOptions, Pager};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let budget: u64 = a.get(2).map_or(256, |s| s.parse().unwrap()) << 20;
    let threads: usize = a.get(3).map_or(1, |s| s.parse().unwrap());
    let pager = Pager::builder().budget(budget).build().unwrap();
    let rw = a.get(4).is_none_or(|s| s == "1");
    let write = a.get(5).is_some_and(|s| s == "1");
    let r = pager
        .map_file(&a[1], &MapOptions::new().folio(2 << 20).writable(rw))
        .unwrap();
    let t = std::time::Instant::now();
    let words = r.len() / 8;
    std::thread::scope(|s| {
        for k in 0..threads {
            let r = &r;
            s.spawn(move || {
                let (lo, hi) = (words * k / threads, words * (k + 1) / threads);
                let mut x = 0u64;
                for i in (lo..hi).step_by(512) {
                    if write {
                        r.words()[i].store(i as u64, Relaxed);
                    } else {
                        x = x.wrapping_add(r.words()[i].load(Relaxed));
                    }
                }
                std::hint::black_box(x);
            });
        }
    });
    let s = pager.stats();
    println!(
        "{:.3} s: fills {} thp_fills {} thp_fill_fallback {} evictions {} recycled {}",
        t.elapsed().as_secs_f64(),
        s.fills,
        s.thp_fills,
        s.thp_fill_fallback,
        s.evictions,
        s.thp_recycled
    );
}
