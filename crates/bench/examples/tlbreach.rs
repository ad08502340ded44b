//! TLB reach (issue 13): random 8-byte reads over a fully resident 1 GiB
//! region, no faults: what the view's page size costs once everything is in
//! memory. Three engines in interleaved rounds, one process: upager with
//! 4 KiB folios (the view is 4 KiB pages), upager with 2 MiB folios (huge
//! pages moved into the view), and the kernel's own anonymous memory with
//! `MADV_HUGEPAGE` (transparent huge pages). Reports ns per read (median of
//! the rounds) and how much of each region is huge pages (smaps-free:
//! `PAGEMAP_SCAN`), as JSON with `--json FILE`.
//!
//! Usage: tlbreach [--mib 1024] [--reads 20000000] [--rounds 3] [--json FILE]

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use upager::{MapOptions, Pager};

const HUGE: usize = 2 << 20;

fn arg(name: &str, default: u64) -> u64 {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// Random 8-byte reads over `words` (a fixed xorshift sequence): ns per read.
fn reads(words: &[std::sync::atomic::AtomicU64], n: u64) -> f64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut acc = 0u64;
    let t = Instant::now();
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        acc = acc.wrapping_add(words[(x % words.len() as u64) as usize].load(Relaxed));
    }
    std::hint::black_box(acc);
    t.elapsed().as_nanos() as f64 / n as f64
}

/// Share of `[addr, addr + len)` mapped by huge pages.
fn huge_share(addr: u64, len: usize) -> f64 {
    let pagemap = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
    let chunks = len / HUGE;
    let huge = (0..chunks)
        .filter(|&k| {
            upager_sys::pagemap::is_huge(&pagemap, addr + (k * HUGE) as u64, HUGE as u64)
                .unwrap_or(false)
        })
        .count();
    huge as f64 / chunks.max(1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let bytes = (arg("--mib", 1024) as usize) << 20;
    let n = arg("--reads", 20_000_000);
    let rounds = arg("--rounds", 3) as usize;
    let budget = bytes as u64 + (256 << 20);
    // The kernel: anonymous THP memory, every page touched.
    let mut thp = upager_sys::mem::AlignedBuf::huge(bytes).expect("1 GiB of address space");
    for o in (0..bytes).step_by(4096) {
        thp[o] = 1;
    }
    // upager: anonymous regions (writable: 2 MiB folios become huge pages).
    let p4 = Pager::builder().budget(budget).build().expect("pager");
    let r4 = p4
        .map_anonymous(bytes as u64, &MapOptions::new().folio(4096))
        .expect("4 KiB region");
    let p2 = Pager::builder().budget(budget).build().expect("pager");
    let r2 = p2
        .map_anonymous(bytes as u64, &MapOptions::new().folio(HUGE as u64))
        .expect("2 MiB region");
    for r in [&r4, &r2] {
        for w in (0..r.len() / 8).step_by(512) {
            r.words()[w].store(1, Relaxed);
        }
    }
    let thp_addr = thp.addr();
    let kw = thp.atomic_words();
    let shares = [
        huge_share(r4.as_ptr() as u64, bytes),
        huge_share(r2.as_ptr() as u64, bytes),
        huge_share(thp_addr, bytes),
    ];
    let names = ["upager 4K", "upager 2M", "kernel THP"];
    let mut ns = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        ns[0].push(reads(r4.words(), n));
        ns[1].push(reads(r2.words(), n));
        ns[2].push(reads(kw, n));
    }
    let s2 = p2.stats();
    let mut json = String::from("{\"benchmark\":\"tlb-reach\",");
    json += &format!(
        "\"bytes\":{bytes},\"reads\":{n},\"rounds\":{rounds},\"upager_2m_thp_fills\":{},\"upager_2m_thp_fill_fallback\":{},\"engines\":[",
        s2.thp_fills, s2.thp_fill_fallback
    );
    for k in 0..3 {
        let m = median(ns[k].clone());
        println!(
            "{:<11} {:>6.2} ns/read ({:.2}x the kernel THP), {:>5.1}% huge pages, rounds {:?}",
            names[k],
            m,
            m / median(ns[2].clone()),
            shares[k] * 100.0,
            ns[k]
                .iter()
                .map(|v| (v * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
        json += &format!(
            "{}{{\"engine\":\"{}\",\"ns_per_read\":{m:.3},\"huge_share\":{:.4},\"rounds\":{:?}}}",
            if k > 0 { "," } else { "" },
            names[k],
            shares[k],
            ns[k]
        );
    }
    json += "]}\n";
    let a: Vec<String> = std::env::args().collect();
    if let Some(i) = a.iter().position(|x| x == "--json") {
        std::fs::write(&a[i + 1], json).expect("write the JSON");
    }
}
