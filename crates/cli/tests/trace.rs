//! `upager trace FILE` (warm starts) through the built binary:
//! no trace, a trace that a map would replay, a stale one, and one that is
//! not a trace.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;

fn trace(file: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_upager"))
        .arg("trace")
        .arg(file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn trace_says_what_a_map_would_replay() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, vec![7u8; 4 << 20]).unwrap();
    let (ok, text) = trace(&file);
    assert!(ok && text.contains("no trace"), "{text}");

    let pager = upager::Pager::new(8 << 20).unwrap();
    let r = pager
        .map_file(
            &file,
            &upager::MapOptions::new().warm(upager::WarmStart::Auto),
        )
        .unwrap();
    for page in [9usize, 3, 700, 12] {
        assert_eq!(r.words()[page * 512].load(Relaxed), 0x0707_0707_0707_0707);
    }
    drop(r);
    let (ok, text) = trace(&file);
    assert!(ok, "{text}");
    assert!(text.contains("4 folios of 4 KiB"), "{text}");
    assert!(text.contains("matches the file"), "{text}");

    std::fs::write(&file, vec![7u8; 8 << 20]).unwrap();
    let (ok, text) = trace(&file);
    assert!(
        ok && text.contains("stale: the file's size changed"),
        "{text}"
    );

    std::fs::write(upager::trace_path(&file), b"not a trace").unwrap();
    let (ok, text) = trace(&file);
    assert!(!ok && text.contains("is not a trace"), "{text}");
}
