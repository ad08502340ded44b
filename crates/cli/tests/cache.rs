//! `upager cache stat|list|clear` through the built binary, over a disk
//! tier filled by the engine: what it holds, each entry, and a clear that
//! removes the entries and nothing else in the directory.
#![allow(clippy::tests_outside_test_module)]

use std::io;
use std::process::Command;
use std::sync::Arc;

use upager::{CacheConfig, CachedStore, Src, Store};

/// An object of `len` bytes of 7s, named `key` for the tier.
#[derive(Debug)]
struct Sevens(u64, String);

impl Store for Sevens {
    fn len(&self) -> u64 {
        self.0
    }
    fn writable(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.0.saturating_sub(offset)) as usize;
        buf[..n].fill(7);
        Ok(n)
    }
    fn write_from(&self, _: Src<'_>, _: u64) -> io::Result<()> {
        Err(io::ErrorKind::PermissionDenied.into())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn cache_key(&self) -> Option<String> {
        Some(self.1.clone())
    }
}

fn cache(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_upager"))
        .arg("cache")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .env_remove("UPAGER_CACHE_SIZE")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn cache_shows_lists_and_clears_the_tier() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tier");
    let (ok, text) = cache(&["list"], &dir);
    assert!(ok && text.contains("no entries"), "{text}");

    let cfg = CacheConfig::new(Some(dir.clone()), Some(64 << 20));
    for (key, len) in [
        ("s3 http://h s3://b/one size 1048576 etag a", 1u64 << 20),
        ("two", 3 << 16),
    ] {
        let st = Arc::new(Sevens(len, key.into()));
        let c = CachedStore::open(st, key, &cfg).unwrap();
        let mut buf = vec![0u8; len as usize];
        assert_eq!(c.read_at(&mut buf, 0).unwrap(), len as usize);
        c.settle();
    }
    // Something else in the directory is not the tier's.
    std::fs::create_dir(dir.join("mine")).unwrap();

    let (ok, text) = cache(&["stat"], &dir);
    assert!(ok, "{text}");
    assert!(text.contains("in 2 entries"), "{text}");
    assert!(
        text.contains("1.2 MiB") || text.contains("1.19 MiB"),
        "{text}"
    );
    let (ok, text) = cache(&["list"], &dir);
    assert!(
        ok && text.contains("s3://b/one") && text.contains("two"),
        "{text}"
    );
    assert!(
        text.contains("1 MiB of      1 MiB") || text.contains("of      1 MiB"),
        "{text}"
    );

    let (ok, text) = cache(&["clear"], &dir);
    assert!(ok && text.contains("freed"), "{text}");
    let (ok, text) = cache(&["list"], &dir);
    assert!(ok && text.contains("no entries"), "{text}");
    assert!(
        dir.join("mine").is_dir(),
        "clear removes only the tier's entries"
    );
}
