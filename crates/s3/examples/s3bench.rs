//! s3bench: what upager gets out of an S3 object, against the limit.
//!
//! `s3bench URL BUDGET [PASSES]` (credentials from the environment):
//! 1. limit: a parallel ranged-GET client alone (the store's own
//!    `read_at` of 64 MiB at a time: GETs of `--part`, `--in-flight` at
//!    once, into one buffer; no paging), for each part size and depth in
//!    UPAGER_S3_BENCH_GRID ("PART:DEPTH,...", default
//!    "2M:1,2M:8,512K:4,512K:16"; UPAGER_S3_BENCH_LIMIT_CALL: bytes per
//!    `read_at`, default 64 MiB, a barrier per call);
//! 2. a sequential pass through upager (sum of every u64, one thread)
//!    under BUDGET, 64 KiB folios, readahead 2 MiB, async readahead on
//!    (its faults, waits for folios being read, and async windows);
//! 3. 100,000 random 8-byte reads through upager (4 KiB and 64 KiB
//!    folios), one thread, against the same reads as single 4 KiB GETs
//!    one at a time (the limit of a reader that waits for each);
//!
//! and prints time, MiB/s, peak resident bytes and bytes fetched
//! (`UPAGER_S3_BENCH_GETS=16,64,16:256K,16:512K:8M` (DEPTH[:GAP[:PART]]): also the request-rate limit,
//! 25,000 random 4 KiB folios as one `read_batch` at each depth and gap,
//! as a gather's fetch sends them; `UPAGER_S3_BENCH_ONLY=limit`: the limits alone, the side
//! bench/s3_array_bench.py compares with). The
//! process is the only reader; run it in a memory cgroup to bound page
//! cache (none here: the store has no page cache, the budget is upager's).
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use upager::{MapOptions, Pager, Store};
use upager_s3::{S3Options, S3Store, S3Url};

fn size(s: &str) -> u64 {
    upager::parse_size(s).expect("size")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url: S3Url = args.get(1).ok_or("usage: s3bench URL BUDGET")?.parse()?;
    let budget = size(args.get(2).map_or("256M", String::as_str));
    let grid =
        std::env::var("UPAGER_S3_BENCH_GRID").unwrap_or_else(|_| "2M:1,2M:8,512K:4,512K:16".into());
    let reads: u64 = std::env::var("UPAGER_S3_BENCH_READS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);

    // 1. The limit.
    for g in grid.split(',') {
        let (p, d) = g.split_once(':').ok_or("grid: PART:DEPTH")?;
        let o = S3Options::default().part(size(p)).in_flight(d.parse()?);
        let st = S3Store::open(&url, &o)?;
        // UPAGER_S3_BENCH_LIMIT_CALL: bytes per read_at (default 64 MiB),
        // each call waiting for all its GETs (a barrier per call).
        let call = std::env::var("UPAGER_S3_BENCH_LIMIT_CALL").map_or(64 << 20, |v| size(&v));
        let mut buf = vec![0u8; call as usize];
        let t = Instant::now();
        let mut off = 0;
        while off < st.len() {
            off += st.read_at(&mut buf, off)? as u64;
        }
        let el = t.elapsed().as_secs_f64();
        println!(
            "limit  part {p:>5} x{d:<3} {:>8.2} s {:>8.1} MiB/s  gets {}",
            el,
            st.len() as f64 / el / 1048576.0,
            st.counters().gets
        );
    }

    // 1b. The request-rate limit (UPAGER_S3_BENCH_GETS="DEPTH[:GAP[:PART]],..."):
    // 25,000 random 4 KiB folios of the object in address order as ONE
    // read_batch at each depth, S3Options::gap (default 0: a GET per
    // folio) and part (default the store's), as a gather's Region::fetch
    // sends them.
    if let Ok(depths) = std::env::var("UPAGER_S3_BENCH_GETS") {
        let mut x = 0x9E37_79B9u64;
        let st0 = S3Store::open(&url, &S3Options::default())?;
        let nfolios = st0.len() / 4096;
        let mut offs: Vec<u64> = (0..25_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % nfolios) * 4096
            })
            .collect();
        offs.sort_unstable();
        offs.dedup();
        for g in depths.split(',') {
            let mut f = g.split(':');
            let d = f.next().unwrap_or("16");
            let gap = f.next().unwrap_or("0");
            let mut o = S3Options::default().in_flight(d.parse()?).gap(size(gap));
            if let Some(p) = f.next() {
                o = o.part(size(p));
            }
            let st = S3Store::open(&url, &o)?;
            let mut bufs = vec![0u8; offs.len() * 4096];
            let mut reqs: Vec<upager::ReadReq<'_>> = bufs
                .chunks_mut(4096)
                .zip(&offs)
                .map(|(buf, &offset)| upager::ReadReq { buf, offset })
                .collect();
            let t = Instant::now();
            let res = st.read_batch(&mut reqs);
            let el = t.elapsed().as_secs_f64();
            let bad = res.iter().filter(|r| r.is_err()).count();
            let c = st.counters();
            println!(
                "gets   {} random 4 KiB folios, depth {d:<3} gap {gap:>5} part {:>5} KiB {:>8.2} s {:>8.0} folios/s  gets {} ({:.0}/s)  received {} MiB  errors {bad}",
                offs.len(),
                o.part >> 10,
                el,
                offs.len() as f64 / el,
                c.gets,
                c.gets as f64 / el,
                c.bytes_received >> 20,
            );
        }
    }

    if std::env::var("UPAGER_S3_BENCH_ONLY").is_ok_and(|v| v == "limit") {
        return Ok(());
    }

    // 2. A pass through upager (part size and readahead from
    // UPAGER_S3_BENCH_PART and UPAGER_S3_BENCH_READAHEAD, defaults the
    // store's and the pager's).
    let part =
        std::env::var("UPAGER_S3_BENCH_PART").map_or(S3Options::default().part, |v| size(&v));
    let ra = std::env::var("UPAGER_S3_BENCH_READAHEAD").map_or(2 << 20, |v| size(&v));
    for threads in [1usize, 2] {
        let o = S3Options::default().threads(threads).part(part);
        let st = S3Store::open(&url, &o)?;
        let pager = Pager::builder().budget(budget).readahead(ra).build()?;
        let r = pager.map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().folio(64 << 10),
        )?;
        let t = Instant::now();
        let mut sum = 0u64;
        for w in r.words() {
            sum = sum.wrapping_add(w.load(Relaxed));
        }
        let el = t.elapsed().as_secs_f64();
        let s = pager.stats();
        println!(
            "upager pass (part {} KiB, readahead {} KiB, runtime threads {threads}) {:>8.2} s {:>8.1} MiB/s  peak {} MiB of {} MiB  fetched {} MiB  gets {} in flight peak {}  faults {} waits {} async windows {} (sum {sum:x})",
            part >> 10,
            ra >> 10,
            el,
            st.len() as f64 / el / 1048576.0,
            s.resident_peak_bytes >> 20,
            budget >> 20,
            st.counters().bytes_received >> 20,
            st.counters().gets,
            st.counters().gets_in_flight_peak,
            s.faults_missing,
            s.faults_deferred,
            s.readahead_async,
        );
    }

    // 3. Random reads.
    let rng = |mut x: u64| {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    };
    for folio in [4u64 << 10, 64 << 10] {
        let st = S3Store::open(&url, &S3Options::default())?;
        let pager = Pager::builder().budget(budget).build()?;
        let r = pager.map_store(
            Arc::clone(&st) as Arc<dyn Store>,
            &MapOptions::new().folio(folio),
        )?;
        let words = r.words();
        let mut next = rng(0x9E37_79B9);
        let t = Instant::now();
        let mut sum = 0u64;
        for _ in 0..reads {
            sum = sum.wrapping_add(words[(next() % words.len() as u64) as usize].load(Relaxed));
        }
        let el = t.elapsed().as_secs_f64();
        let s = pager.stats();
        println!(
            "upager random {reads} reads, {} KiB folios {:>8.2} s {:>8.0} reads/s  peak {} MiB  fetched {} MiB for {} KiB used  (sum {sum:x})",
            folio >> 10,
            el,
            reads as f64 / el,
            s.resident_peak_bytes >> 20,
            st.counters().bytes_received >> 20,
            (reads * 8) >> 10,
        );
    }
    let st = S3Store::open(&url, &S3Options::default())?;
    let mut next = rng(0x9E37_79B9);
    let mut buf = vec![0u8; 4096];
    let n = reads.min(20_000);
    let t = Instant::now();
    for _ in 0..n {
        let off = ((next() % (st.len() / 8)) * 8) & !4095;
        st.read_at(&mut buf, off)?;
    }
    let el = t.elapsed().as_secs_f64();
    println!(
        "limit  random {n} single 4 KiB GETs one at a time {:>8.2} s {:>8.0} reads/s",
        el,
        n as f64 / el
    );
    Ok(())
}
