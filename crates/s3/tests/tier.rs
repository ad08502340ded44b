//! The disk tier (crates/upager/src/cache.rs) and page pools over a real
//! SeaweedFS (scripts/seaweedfs.sh): a second run reads an object from
//! the tier, a rewritten one from the server; two pooled regions of one
//! object share one copy. A server of this binary's own (ports 22380..):
//! on the shared one of seaweed.rs, their uploads beside that binary's
//! fifteen tests in parallel had the server answer 4 MiB PUTs with 500s
//! and timeouts.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use common::*;
use upager::{MapOptions, Pager, Store};
use upager_s3::{S3Options, S3Store};

const SHARED: u16 = 22380;

fn shared(bucket: &str) -> Option<&'static Server> {
    Server::shared_bucket(SHARED, bucket)
}

/// The disk tier: a second pager (a second run) reads an object from the
/// cache directory, not the server; the object rewritten (another ETag)
/// is read from the server again and no old byte is served; the
/// counters say where the reads were served from.
#[test]
fn a_second_run_reads_the_disk_tier_and_a_rewritten_object_the_server() {
    let Some(s) = shared("tier") else { return };
    let o = s.objects("tier");
    let len = 8 * MIB;
    o.put("obj", pattern(len, 3)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let run = |seed: u64| {
        let st =
            S3Store::open_with(&s.url("tier", "obj"), &S3Options::default(), &s.env()).unwrap();
        let pager = Pager::builder()
            .budget(2 * MIB)
            .cache_dir(&dir)
            .cache_size(64 * MIB)
            .build()
            .unwrap();
        let r = pager
            .map_store(Arc::clone(&st) as Arc<dyn Store>, &MapOptions::new())
            .unwrap();
        for (i, w) in r.words().iter().enumerate() {
            assert_eq!(w.load(Relaxed), word(i as u64, seed), "word {i}");
        }
        let c = r.store_counters();
        let get = |n: &str| c.iter().find(|(k, _)| *k == n).map(|(_, v)| *v).unwrap();
        (
            st.counters().bytes_received,
            get("cache_hit_bytes"),
            get("cache_misses"),
        )
    };
    let (net1, hit1, miss1) = run(3);
    assert!(
        net1 >= len && miss1 == len / upager::CACHE_CHUNK,
        "{net1} {hit1} {miss1}"
    );
    let (net2, hit2, miss2) = run(3);
    assert_eq!((net2, miss2), (0, 0), "a second run read the server");
    assert!(hit2 >= len, "{hit2}");
    o.put("obj", pattern(len, 4)).unwrap();
    let (net3, _, miss3) = run(4);
    assert!(
        net3 >= len && miss3 == len / upager::CACHE_CHUNK,
        "{net3} {miss3}"
    );
    let listed = upager::cache_scan(&dir).unwrap().entries;
    assert_eq!(listed.len(), 2, "one entry per ETag: {listed:?}");
    assert!(listed
        .iter()
        .all(|e| e.key.contains("tier/obj") && e.key.contains("etag")));
}

/// Page pools (UPAGER_POOL) for S3 objects: two regions of one object in
/// pooled pagers share the pool (one copy, its key the ETag's), so the
/// second reads no byte from the server; the region's counters say so.
#[test]
fn two_pooled_regions_of_an_object_share_one_copy() {
    let Some(s) = shared("pooled") else { return };
    let o = s.objects("pooled");
    let len = 4 * MIB;
    o.put("obj", pattern(len, 19)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let run = || {
        let st =
            S3Store::open_with(&s.url("pooled", "obj"), &S3Options::default(), &s.env()).unwrap();
        let pager = Pager::builder()
            .budget(16 * MIB)
            .pool(true)
            .cache_dir(tmp.path().join("cache"))
            .cache_size(0)
            .build()
            .unwrap();
        let r = pager
            .map_store(Arc::clone(&st) as Arc<dyn Store>, &MapOptions::new())
            .unwrap();
        (st, pager, r)
    };
    let (st1, _p1, r1) = run();
    let (st2, _p2, r2) = run();
    let pool = r1.pool_info().expect("the object's region is in a pool");
    assert!(pool.key.contains("etag"), "{}", pool.key);
    for (i, w) in r1.words().iter().enumerate() {
        assert_eq!(w.load(Relaxed), word(i as u64, 19), "word {i}");
    }
    assert!(st1.counters().bytes_received >= len);
    for (i, w) in r2.words().iter().enumerate() {
        assert_eq!(w.load(Relaxed), word(i as u64, 19), "word {i}");
    }
    assert_eq!(
        st2.counters().bytes_received,
        0,
        "the second region read the server: {:?}",
        st2.counters()
    );
}
