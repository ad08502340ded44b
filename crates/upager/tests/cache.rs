//! The disk tier (cache.rs) over a network-like store kept in memory,
//! which counts the bytes it is asked for: a second pass, a second pager
//! and a refault read the disk, not the store; a changed key (a rewritten
//! object) never serves an old byte; the directory stays within its size;
//! a chunk flipped on disk or whose bytes never landed is fetched again,
//! never served. In both fault modes. (Against a real S3 store:
//! crates/s3/tests/seaweed.rs.)

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use upager::{FaultMode, MapOptions, Pager, Src, Store};

const MIB: u64 = 1 << 20;

/// A cache directory inside a temporary one (the tier makes it 0700; the
/// temporary directory itself is open to others' reading, which the
/// tier refuses).
struct TierDir(std::path::PathBuf);

impl TierDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

/// An object of `len` bytes (word i = seed + i) whose reads are counted,
/// named by `key` for the disk tier.
#[derive(Debug)]
struct Remote {
    len: u64,
    seed: u64,
    key: String,
    read_bytes: AtomicU64,
}

impl Remote {
    fn new(len: u64, seed: u64, key: &str) -> Arc<Remote> {
        Arc::new(Remote {
            len,
            seed,
            key: key.into(),
            read_bytes: AtomicU64::new(0),
        })
    }
    fn word(&self, i: u64) -> u64 {
        self.seed.wrapping_add(i)
    }
}

impl Store for Remote {
    fn len(&self) -> u64 {
        self.len
    }
    fn writable(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.len.saturating_sub(offset)) as usize;
        for (k, w) in buf[..n].chunks_mut(8).enumerate() {
            let i = offset / 8 + k as u64;
            w.copy_from_slice(&self.word(i).to_le_bytes()[..w.len()]);
        }
        self.read_bytes.fetch_add(n as u64, Relaxed);
        Ok(n)
    }
    fn write_from(&self, _src: Src<'_>, _offset: u64) -> io::Result<()> {
        Err(io::ErrorKind::PermissionDenied.into())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn round_trips(&self) -> bool {
        true
    }
    fn cache_key(&self) -> Option<String> {
        Some(self.key.clone())
    }
}

fn pager(mode: FaultMode, dir: &Path, size: u64, budget: u64) -> Pager {
    Pager::builder()
        .budget(budget)
        .fault_mode(mode)
        .cache_dir(dir)
        .cache_size(size)
        .build()
        .unwrap()
}

fn counter(c: &[(&'static str, u64)], name: &str) -> u64 {
    c.iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name} in {c:?}"))
        .1
}

/// Sums every word of a pass over `store` mapped by `p`, checking each
/// against the store's own, and returns the region's store counters.
fn pass(p: &Pager, store: &Arc<Remote>, passes: usize) -> Vec<(&'static str, u64)> {
    let r = p.map_store(store.clone(), &MapOptions::new()).unwrap();
    for _ in 0..passes {
        for (i, w) in r.words().iter().enumerate() {
            assert_eq!(w.load(Relaxed), store.word(i as u64), "word {i}");
        }
    }
    r.store_counters()
}

fn both_modes(f: impl Fn(FaultMode)) {
    for mode in [FaultMode::Handlers, FaultMode::InThread] {
        f(mode);
    }
}

/// A pass under a budget a quarter of the data: the second pass and a
/// second pager (a second run) read no byte from the store.
#[test]
fn passes_after_the_first_read_the_disk() {
    both_modes(|mode| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = &TierDir(tmp.path().join("cache"));
        let store = Remote::new(16 * MIB, 7, &format!("obj-a {mode:?}"));
        let c = pass(&pager(mode, dir.path(), 64 * MIB, 4 * MIB), &store, 2);
        let first = store.read_bytes.load(Relaxed);
        // Each byte once, but for a chunk that two threads (a fault and
        // the readahead next to it) both missed at once: not deduplicated.
        assert!(
            (16 * MIB..=16 * MIB + 4 * 65536).contains(&first),
            "{mode:?}: the store gave {first} bytes: {c:?}"
        );
        assert!(counter(&c, "cache_hits") > 0, "{c:?}");
        let c2 = pass(&pager(mode, dir.path(), 64 * MIB, 4 * MIB), &store, 1);
        assert_eq!(
            store.read_bytes.load(Relaxed),
            first,
            "{mode:?}: a second run read the store again: {c2:?}"
        );
        assert!(counter(&c2, "cache_hit_bytes") >= 16 * MIB, "{c2:?}");
        assert_eq!(counter(&c2, "cache_misses"), 0, "{c2:?}");
    });
}

/// A rewritten object has another key: its reads never get the old
/// object's bytes, and go to the store.
#[test]
fn a_changed_object_is_never_served_old_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = &TierDir(tmp.path().join("cache"));
    let old = Remote::new(4 * MIB, 1, "obj etag 1");
    pass(
        &pager(FaultMode::Handlers, dir.path(), 64 * MIB, 64 * MIB),
        &old,
        1,
    );
    let new = Remote::new(4 * MIB, 1 << 40, "obj etag 2");
    let c = pass(
        &pager(FaultMode::Handlers, dir.path(), 64 * MIB, 64 * MIB),
        &new,
        1,
    );
    assert_eq!(new.read_bytes.load(Relaxed), 4 * MIB, "{c:?}");
}

/// Data four times the cache's size: the directory never holds more
/// than its size, the least recently used entry goes first.
#[test]
fn the_directory_stays_within_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = &TierDir(tmp.path().join("cache"));
    let size = 4 * MIB;
    let a = Remote::new(3 * MIB, 1, "a");
    pass(
        &pager(FaultMode::Handlers, dir.path(), size, 64 * MIB),
        &a,
        1,
    );
    let used = upager::cache_scan(dir.path()).unwrap().bytes;
    assert!(used <= size && used >= 3 * MIB, "{used}");
    let b = Remote::new(16 * MIB, 2, "b");
    let p = pager(FaultMode::Handlers, dir.path(), size, 2 * MIB);
    let r = p.map_store(b.clone(), &MapOptions::new()).unwrap();
    for (i, w) in r.words().iter().enumerate() {
        assert_eq!(w.load(Relaxed), b.word(i as u64));
        if i % 65536 == 0 {
            let used = upager::cache_scan(dir.path()).unwrap().bytes;
            assert!(used <= size, "{used} bytes in a cache of {size}");
        }
    }
    let c = r.store_counters();
    drop(r);
    let info = upager::cache_scan(dir.path()).unwrap();
    assert!(
        info.bytes <= size,
        "{} bytes in a cache of {size}",
        info.bytes
    );
    assert!(counter(&c, "cache_evictions") > 0, "{c:?}");
    assert!(
        info.entries.iter().all(|e| e.key != "a"),
        "the older entry went first: {:?}",
        info.entries
    );
}

/// A byte flipped in a cached chunk, and a chunk whose index word landed
/// without its bytes (a writer killed between them would leave the
/// opposite, an absent word; this is worse): both are fetched again, the
/// right bytes served, and `cache_corrupt` counts them.
#[test]
fn a_chunk_that_hashes_wrong_is_fetched_again() {
    both_modes(|mode| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = &TierDir(tmp.path().join("cache"));
        let store = Remote::new(2 * MIB, 99, &format!("flip {mode:?}"));
        pass(&pager(mode, dir.path(), 64 * MIB, 64 * MIB), &store, 1);
        let entry = upager::cache_scan(dir.path())
            .unwrap()
            .entries
            .remove(0)
            .path;
        let data = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(entry.join("data"))
            .unwrap();
        let mut b = [0u8; 1];
        data.read_exact_at(&mut b, 100_000).unwrap();
        data.write_all_at(&[b[0] ^ 0x10], 100_000).unwrap();
        // Chunk 5's bytes never landed: punch them, keep its word.
        data.write_all_at(&[0u8; 65536], 5 * 65536).unwrap();
        let before = store.read_bytes.load(Relaxed);
        let c = pass(&pager(mode, dir.path(), 64 * MIB, 64 * MIB), &store, 1);
        // Two chunks are bad; a fault and a readahead may both find one.
        let refetched = store.read_bytes.load(Relaxed) - before;
        assert!(
            (2..=4).contains(&counter(&c, "cache_corrupt")),
            "{mode:?}: {c:?}"
        );
        assert!(
            (2 * 65536..=4 * 65536).contains(&refetched),
            "{refetched}: {c:?}"
        );
        // And the fetched chunks were cached again, right.
        let before = store.read_bytes.load(Relaxed);
        let c = pass(&pager(mode, dir.path(), 64 * MIB, 64 * MIB), &store, 1);
        assert_eq!(counter(&c, "cache_corrupt"), 0, "{c:?}");
        assert_eq!(store.read_bytes.load(Relaxed), before);
    });
}

/// `cache_size(0)` turns the tier off: no directory, no counters.
#[test]
fn size_zero_turns_the_tier_off() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = &TierDir(tmp.path().join("cache"));
    let cdir = dir.path().join("c");
    let store = Remote::new(MIB, 3, "off");
    let c = pass(&pager(FaultMode::Handlers, &cdir, 0, 64 * MIB), &store, 1);
    assert!(!cdir.exists());
    assert!(c.iter().all(|(n, _)| !n.starts_with("cache_")), "{c:?}");
}

/// A cache directory open to others is refused (the region reads the
/// store), and so is a writable region.
#[test]
fn a_shared_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let store = Remote::new(MIB, 3, "open");
    let c = pass(
        &pager(FaultMode::Handlers, dir.path(), 64 * MIB, 64 * MIB),
        &store,
        1,
    );
    assert!(c.iter().all(|(n, _)| !n.starts_with("cache_")), "{c:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Reads of a batch (prefetch) and unaligned reads get the same bytes
/// from the tier as from the store.
#[test]
fn batches_and_unaligned_reads_match_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = &TierDir(tmp.path().join("cache"));
    let store = Remote::new(MIB + 12288, 5, "batch");
    let cfg = upager::CacheConfig::new(Some(dir.path().to_path_buf()), Some(64 * MIB));
    let key = store.cache_key().unwrap();
    let cached = upager::CachedStore::open(store.clone(), &key, &cfg).unwrap();
    let mut want = vec![0u8; 200_704];
    let mut got = vec![0u8; 200_704];
    for round in 0..2 {
        for &(off, len) in &[
            (4096u64, 8192usize),
            (60_000 & !4095, 200_704),
            (MIB, 12288),
        ] {
            store.read_at(&mut want[..len], off).unwrap();
            let n = cached.read_at(&mut got[..len], off).unwrap();
            assert_eq!(n, len);
            assert!(
                want[..len] == got[..len],
                "round {round}: read at {off}+{len}"
            );
        }
        cached.settle();
    }
    let mut a = vec![0u8; 8192];
    let mut b = vec![0u8; 65536];
    let mut reqs = [
        upager::ReadReq {
            buf: &mut a,
            offset: 3 * 65536 + 4096,
        },
        upager::ReadReq {
            buf: &mut b,
            offset: 9 * 65536,
        },
    ];
    let res = cached.read_batch(&mut reqs);
    assert!(res.iter().all(|r| r.is_ok()));
    let mut w = vec![0u8; 65536];
    store.read_at(&mut w[..8192], 3 * 65536 + 4096).unwrap();
    assert!(a == w[..8192]);
    store.read_at(&mut w, 9 * 65536).unwrap();
    assert!(b == w);
}

/// A store read that fails through the tier is the read's error (the
/// access then ends in SIGBUS, never waits), and nothing of it is cached:
/// the next read asks the store again.
#[test]
fn a_failed_fetch_is_the_reads_error_and_caches_nothing() {
    #[derive(Debug)]
    struct Failing;
    impl Store for Failing {
        fn len(&self) -> u64 {
            MIB
        }
        fn writable(&self) -> bool {
            false
        }
        fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
            Err(io::Error::other("the server is gone"))
        }
        fn write_from(&self, _src: Src<'_>, _offset: u64) -> io::Result<()> {
            Err(io::ErrorKind::PermissionDenied.into())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = upager::CacheConfig::new(Some(tmp.path().join("cache")), Some(64 * MIB));
    let cached = upager::CachedStore::open(Arc::new(Failing), "gone", &cfg).unwrap();
    let mut buf = vec![0u8; 65536];
    for _ in 0..2 {
        let e = cached.read_at(&mut buf, 0).unwrap_err();
        assert!(e.to_string().contains("the server is gone"), "{e}");
        cached.settle();
    }
    let c = cached.store_counters();
    assert_eq!(counter(&c, "cache_inserts"), 0, "{c:?}");
    assert_eq!(counter(&c, "cache_hits"), 0, "{c:?}");
}
