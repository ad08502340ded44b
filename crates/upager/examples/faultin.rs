//! Fault-in throughput: touch one word per page of a file region with no
//! eviction (budget above the file). Usage: faultin FILE [folio] [readahead] [threads]
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use upager::{MapOptions, Pager};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let folio = a
        .get(2)
        .map_or(64 << 10, |s| upager::parse_size(s).unwrap());
    let ra = a.get(3).map_or(2 << 20, |s| upager::parse_size(s).unwrap());
    let threads: usize = a.get(4).map_or(1, |s| s.parse().unwrap());
    let len = std::fs::metadata(&a[1]).unwrap().len();
    let pager = Pager::builder()
        .budget(len + (64 << 20))
        .readahead(ra)
        .build()
        .unwrap();
    let r = pager
        .map_file(&a[1], &MapOptions::new().folio(folio))
        .unwrap();
    let t = Instant::now();
    let per = r.len() / threads;
    std::thread::scope(|s| {
        for k in 0..threads {
            let r = &r;
            s.spawn(move || {
                let mut x = 0u64;
                for w in (k * per / 8..(k + 1) * per / 8).step_by(512) {
                    x = x.wrapping_add(r.words()[w].load(Relaxed));
                }
                std::hint::black_box(x);
            });
        }
    });
    let el = t.elapsed().as_secs_f64();
    let s = pager.stats();
    println!(
        "folio {folio} ra {ra} threads {threads}: {:.2} GB/s, {} faults, {} fills",
        len as f64 / el / 1e9,
        s.faults_missing,
        s.fills
    );
}
