//! TLB reach: random 8-byte reads over a fully resident region,
//! no faults — what the page size of the mapping costs once everything is in
//! memory. The one implementation of the reads and of the huge-page share,
//! used by the kernel's workload (anonymous `MADV_HUGEPAGE` memory) and by
//! upager's (4 KiB or 2 MiB folios).

use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::meter::{Meter, WorkerResult, WorkloadError};

/// The huge page size (one PMD).
pub(crate) const HUGE: usize = 2 << 20;

/// `n` random 8-byte reads of `words` (a fixed xorshift sequence, the same
/// for every engine), timed by a [`Meter`]; `extra` gets `ns_per_read` and
/// `huge_share` (of `[addr, addr + len)`, measured before the reads).
pub(crate) fn measure(
    words: &[AtomicU64],
    n: u64,
    addr: u64,
    len: usize,
) -> Result<WorkerResult, WorkloadError> {
    let share = huge_share(addr, len);
    let meter = Meter::start()?;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut acc = 0u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        acc = acc.wrapping_add(words[(x % words.len() as u64) as usize].load(Relaxed));
    }
    black_box(acc);
    let mut r = meter.stop(n, 0)?;
    r.extra
        .insert("ns_per_read".into(), r.elapsed_s * 1e9 / n.max(1) as f64);
    r.extra.insert("huge_share".into(), share);
    Ok(r)
}

/// Share of `[addr, addr + len)` mapped by huge pages (`PAGEMAP_SCAN`, per
/// 2 MiB; 0 if the pagemap cannot be read).
pub(crate) fn huge_share(addr: u64, len: usize) -> f64 {
    let Ok(pagemap) = std::fs::File::open("/proc/self/pagemap") else {
        return 0.0;
    };
    let chunks = len / HUGE;
    let huge = (0..chunks)
        .filter(|&k| {
            upager_sys::pagemap::is_huge(&pagemap, addr + (k * HUGE) as u64, HUGE as u64)
                .unwrap_or(false)
        })
        .count();
    huge as f64 / chunks.max(1) as f64
}
