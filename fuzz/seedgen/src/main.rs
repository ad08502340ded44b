//! Seeds fuzz/corpus/trace with traces the engine's recorder writes: maps
//! a file with `WarmStart::Record`, touches folios in a scattered order
//! and in a sequential run, unmaps (the trace is written beside the file),
//! and copies `<file>.upager-trace` to `OUT/NAME`. Needs userfaultfd.
//!
//! Usage: seedgen OUT_DIR
use std::sync::atomic::Ordering::Relaxed;
use upager::{MapOptions, Pager, WarmStart};

fn main() {
    let out = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: seedgen OUT_DIR"));
    std::fs::create_dir_all(&out).unwrap();
    let dir = std::env::temp_dir().join(format!("upager-seedgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (name, file bytes, folio, folios touched in order)
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let scattered: Vec<u64> = (0..60)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 256
        })
        .collect();
    let sequential: Vec<u64> = (10..90).collect();
    let mixed: Vec<u64> = (0..40).chain([200, 3, 150, 151, 152, 7]).chain(100..130).collect();
    for (name, len, folio, order) in [
        ("scattered-4k", 1u64 << 20, 4096u64, &scattered),
        ("sequential-4k", 1 << 20, 4096, &sequential),
        ("mixed-64k", 16 << 20, 64 << 10, &mixed),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, vec![7u8; len as usize]).unwrap();
        let pager = Pager::new(64 << 20).unwrap();
        let r = pager
            .map_file(&path, &MapOptions::new().folio(folio).warm(WarmStart::Record))
            .unwrap();
        let folios = len / folio;
        for &i in order.iter() {
            let w = ((i % folios) * folio / 8) as usize;
            assert_eq!(r.words()[w].load(Relaxed), 0x0707_0707_0707_0707);
        }
        r.unmap().map_err(|(e, _)| e).unwrap();
        let trace = upager::trace_path(&path);
        std::fs::copy(&trace, out.join(name)).unwrap();
        println!("{name}: {} bytes", std::fs::metadata(&trace).unwrap().len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
