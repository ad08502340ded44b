//! Times unmap of a fully resident anonymous region. Usage: unmaptime SIZE FOLIO
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use upager::{MapOptions, Pager};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let size = upager::parse_size(&a[1]).unwrap();
    let folio = upager::parse_size(&a[2]).unwrap();
    let pager = Pager::builder().budget(size + (64 << 20)).build().unwrap();
    for _ in 0..3 {
        let r = pager
            .map_anonymous(size, &MapOptions::new().folio(folio))
            .unwrap();
        for w in (0..r.len() / 8).step_by(512) {
            r.words()[w].store(1, Relaxed);
        }
        let t = Instant::now();
        r.unmap().unwrap();
        println!(
            "folio {folio}: unmap {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}
