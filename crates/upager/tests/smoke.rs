//! Smoke test: read, write, flush, anonymous.
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use upager::{MapOptions, Pager};

#[test]
fn read_write_flush_small_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let n = 32 << 20;
    let data: Vec<u8> = (0..n).map(|i| (i as u64 * 7 / 4096) as u8).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let pager = Pager::builder().budget(8 << 20).build().unwrap();
    let r = pager
        .map_file(&path, &MapOptions::new().writable(true))
        .unwrap();
    let mut buf = vec![0u8; n];
    r.read_at(0, &mut buf);
    assert!(buf == data, "read mismatch");
    for i in (0..n).step_by(4096) {
        r.bytes()[i].store(0xAB, Relaxed);
    }
    r.flush().unwrap();
    let s = pager.stats();
    eprintln!("{s:?}");
    let f = std::fs::read(&path).unwrap();
    for i in 0..n {
        let want = if i % 4096 == 0 { 0xAB } else { data[i] };
        assert_eq!(f[i], want, "byte {i}");
    }
    assert!(s.resident_peak_bytes <= 8 << 20);
    let a = pager.map_anonymous(64 << 20, &MapOptions::new()).unwrap();
    for i in (0..(64 << 20) / 8).step_by(512) {
        a.words()[i].store(i as u64, Relaxed);
    }
    for i in (0..(64 << 20) / 8).step_by(512) {
        assert_eq!(a.words()[i].load(Relaxed), i as u64);
    }
    eprintln!("{:?}", pager.stats());
    r.unmap().unwrap();
}
