//! Latency of single accesses, measured inside the worker: a log-bucketed
//! [`Histogram`] per thread (fixed array, nothing allocated per sample),
//! merged at the end into a [`LatencySummary`] (p50, p90, p99, p99.9, max,
//! mean, and the non-empty buckets for plots).
//!
//! Buckets are log-linear, like HdrHistogram with 4 significant bits: values
//! below 16 ns have a bucket each; above, every power of two is split into
//! 16 equal buckets, so a bucket is at most 1/16 (6.25%) of its lower bound
//! wide. A quantile is reported as its bucket's midpoint (within ±3.2% of the
//! true value); the maximum is exact.
//!
//! Used the same way by the kernel's workloads and upager's, so the two
//! sides' distributions compare: time one access with [`Instant`] around it
//! and [`Histogram::record`] the nanoseconds.
//!
//! [`Instant`]: std::time::Instant

/// multi-fault times one page in this many (every access there faults; two
/// clock reads per access would cost the kernel's ~1 µs fault ~5%).
pub const MULTI_FAULT_SAMPLE_EVERY: usize = 16;

/// Linear sub-buckets per power of two (4 significant bits).
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: 16 exact ones below 16 ns, then 16 per power of two up to 2^64.
pub const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// The bucket of `ns`.
fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros(); // ≥ SUB_BITS
    let sub = ((ns >> (e - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (e - SUB_BITS) as usize * SUB + sub
}

/// Lower bound and width of bucket `i`, nanoseconds.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let e = ((i - SUB) / SUB) as u32 + SUB_BITS;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS);
    ((1u64 << e) + sub * width, width)
}

/// Counts of access latencies in log buckets. Fixed size (~7.7 KiB), no
/// allocation: keep one per thread on its stack and [`merge`](Self::merge)
/// them afterwards.
#[derive(Clone)]
pub struct Histogram {
    counts: [u64; BUCKETS],
    samples: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
            samples: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("samples", &self.samples)
            .field("max_ns", &self.max_ns)
            .finish_non_exhaustive()
    }
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Count one latency of `ns` nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket_of(ns)] += 1;
        self.samples += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Add another histogram's counts to this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.samples += other.samples;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Samples counted.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The `q` quantile (0..=1), nanoseconds: the midpoint of the bucket
    /// holding the sample of rank ⌈q·n⌉ (never above the exact maximum).
    /// `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.samples == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.samples as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, w) = bucket_range(i);
                let mid = lo as f64 + (w as f64 - 1.0) / 2.0;
                return Some(mid.min(self.max_ns as f64));
            }
        }
        Some(self.max_ns as f64)
    }

    /// The summary reported in results (`None` when nothing was recorded).
    pub fn summary(&self) -> Option<LatencySummary> {
        let q = |x| self.quantile(x).unwrap_or(f64::NAN);
        (self.samples > 0).then(|| LatencySummary {
            samples: self.samples,
            mean_ns: self.sum_ns as f64 / self.samples as f64,
            p50_ns: q(0.50),
            p90_ns: q(0.90),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            max_ns: self.max_ns as f64,
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| [bucket_range(i).0, c])
                .collect(),
        })
    }
}

/// The latency distribution of one run's timed accesses.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    /// Accesses timed.
    pub samples: u64,
    /// Mean, nanoseconds.
    pub mean_ns: f64,
    /// Median, nanoseconds (bucket midpoint, ±3.2%).
    pub p50_ns: f64,
    /// 90th percentile, nanoseconds.
    pub p90_ns: f64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: f64,
    /// 99.9th percentile, nanoseconds.
    pub p999_ns: f64,
    /// Largest, nanoseconds (exact).
    pub max_ns: f64,
    /// Non-empty buckets: `[lower bound ns, count]`, ascending.
    pub buckets: Vec<[u64; 2]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b < BUCKETS && b >= last, "{v} -> {b}");
            let (lo, w) = bucket_range(b);
            assert!(
                lo <= v && v - lo < w,
                "{v} not in bucket {b} = [{lo}, +{w})"
            );
            if v >= 16 {
                assert!(w * 16 <= lo, "bucket {b} wider than 1/16 of {lo}");
            }
            last = b;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    /// Against the naive reference (sort, take rank ⌈q·n⌉): within the
    /// bucket width, for several shapes of distribution.
    #[test]
    fn quantiles_match_a_sorted_reference() {
        let mut rng = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let shapes: [&dyn Fn(u64) -> u64; 3] = [
            &|r| 50 + r % 100,           // hits: 50..150 ns
            &|r| 1_000 + r % 1_000_000,  // uniform 1 µs..1 ms
            &|r| 1u64 << (5 + (r % 30)), // log-uniform 32 ns..16 s
        ];
        for shape in shapes {
            let mut h = Histogram::new();
            let mut v: Vec<u64> = (0..20_000).map(|_| shape(next())).collect();
            for &x in &v {
                h.record(x);
            }
            v.sort_unstable();
            for q in [0.01, 0.5, 0.9, 0.99, 0.999, 1.0] {
                let rank = ((q * v.len() as f64).ceil() as usize).max(1);
                let want = v[rank - 1] as f64;
                let got = h.quantile(q).unwrap();
                assert!(
                    (got - want).abs() <= want / 32.0 + 1.0,
                    "q={q}: got {got}, want {want}"
                );
            }
            let s = h.summary().unwrap();
            assert_eq!(s.max_ns, *v.last().unwrap() as f64);
            assert_eq!(s.samples, 20_000);
            assert_eq!(s.buckets.iter().map(|b| b[1]).sum::<u64>(), 20_000);
            assert!(s.p50_ns <= s.p99_ns && s.p99_ns <= s.max_ns);
        }
    }

    #[test]
    fn merge_adds_and_empty_is_none() {
        let mut a = Histogram::new();
        assert!(a.summary().is_none() && a.quantile(0.5).is_none());
        let mut b = Histogram::new();
        for x in 1..=100 {
            a.record(x * 1000);
            b.record(x * 1000 + 500_000);
        }
        a.merge(&b);
        assert_eq!(a.samples(), 200);
        assert_eq!(a.summary().unwrap().max_ns, 600_000.0);
        let p50 = a.quantile(0.5).unwrap();
        assert!((p50 - 100_000.0).abs() <= 100_000.0 / 32.0, "{p50}");
    }
}
