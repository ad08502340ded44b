//! The compressed tier's benchmark workload: an anonymous region several
//! times the budget written sequentially, word by word, then read back and
//! checked, on data of a [`FillKind`]. What it measures: the cost of
//! swapping out and in under pressure when the data compresses (the
//! compressed tier keeps it in memory) and when it does not (the tier must
//! cost nothing). The kernel runs it on plain anonymous memory in a memory
//! cgroup of the budget with zram swap; upager in a region of the same
//! budget with the tier on or off (`UPAGER_ZTIER`).

use std::hint::black_box;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use upager::{MapOptions, Pager};

use crate::meter::{wio, Meter, WorkerResult, WorkloadError};
use memmap2::MmapMut;

/// The data written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FillKind {
    /// Element i = i as a float64 (numpy's `arange`): compresses.
    Index,
    /// Sparse state: one nonzero word per 4 KiB page, zeros around it.
    Sparse,
    /// Random words (splitmix64): does not compress.
    Random,
}

impl FillKind {
    /// Every kind, in report order.
    pub const ALL: [FillKind; 3] = [FillKind::Index, FillKind::Sparse, FillKind::Random];

    /// Name in reports (`index`, `sparse`, `random`).
    pub fn name(self) -> &'static str {
        match self {
            FillKind::Index => "index",
            FillKind::Sparse => "sparse",
            FillKind::Random => "random",
        }
    }

    /// Word `i`.
    pub fn word(self, i: u64) -> u64 {
        match self {
            FillKind::Index => (i as f64).to_bits(),
            FillKind::Sparse if i % 512 == 0 => i / 512 + 1,
            FillKind::Sparse => 0,
            FillKind::Random => {
                let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            }
        }
    }
}

/// Memory as 64-bit words.
trait Words {
    fn set(&mut self, i: u64, v: u64);
    fn get(&self, i: u64) -> u64;
}

impl Words for MmapMut {
    fn set(&mut self, i: u64, v: u64) {
        let o = i as usize * 8;
        self[o..o + 8].copy_from_slice(&v.to_le_bytes());
    }
    fn get(&self, i: u64) -> u64 {
        let o = i as usize * 8;
        u64::from_le_bytes(self[o..o + 8].try_into().expect("8 bytes"))
    }
}

impl Words for &[std::sync::atomic::AtomicU64] {
    fn set(&mut self, i: u64, v: u64) {
        self[i as usize].store(v, Relaxed);
    }
    fn get(&self, i: u64) -> u64 {
        self[i as usize].load(Relaxed)
    }
}

/// Writes every word, then reads every word back and checks it: the
/// phase times go to `extra` (`write_s`, `read_s`).
fn fill_and_check(
    n: u64,
    kind: FillKind,
    mut m: impl Words,
) -> Result<WorkerResult, WorkloadError> {
    let meter = Meter::start()?;
    let t = Instant::now();
    for i in 0..n {
        m.set(i, kind.word(i));
    }
    let write_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut bad = 0u64;
    for i in 0..n {
        if m.get(i) != kind.word(i) {
            bad += 1;
        }
    }
    let read_s = t.elapsed().as_secs_f64();
    let mut r = meter.stop(n * 8 / 4096, black_box(bad))?;
    r.extra.insert("write_s".into(), write_s);
    r.extra.insert("read_s".into(), read_s);
    r.extra.insert("bytes".into(), (n * 8) as f64);
    Ok(r)
}

/// The kernel's side: private anonymous memory (the worker runs in the
/// memory cgroup; swap is whatever the host has: zram for this benchmark).
pub(crate) fn kernel(bytes: u64, kind: FillKind) -> Result<WorkerResult, WorkloadError> {
    let m = MmapMut::map_anon(bytes as usize).map_err(wio("mmap"))?;
    fill_and_check(bytes / 8, kind, m)
}

/// upager's side: an anonymous region of `bytes` with the default options
/// (the tier as `UPAGER_ZTIER` says).
pub(crate) fn upager(p: &Pager, bytes: u64, kind: FillKind) -> Result<WorkerResult, WorkloadError> {
    let region = p
        .map_anonymous(bytes, &MapOptions::new())
        .map_err(|e| WorkloadError::Invalid(e.to_string()))?;
    let words = region.words();
    let mut r = fill_and_check(bytes / 8, kind, words)?;
    r.extra.insert(
        "ztier".into(),
        f64::from(u8::from(
            p.stats().ztier_stores + p.stats().ztier_rejects > 0,
        )),
    );
    Ok(r)
}
