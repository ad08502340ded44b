//! What a workload measures about itself: [`Meter`] (wall time, CPU time of
//! all threads, page faults, bytes read from block devices) around the
//! measured part, reported as a [`WorkerResult`]; and [`median`].
//!
//! Shared by the kernel's workloads and upager's, which must measure alike.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::latency::LatencySummary;
use crate::raw;

/// Errors of running a workload.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum WorkloadError {
    /// {what}: {source}
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// {0}
    Invalid(String),
}

/// Map an I/O error to [`WorkloadError::Io`] saying what was done.
pub(crate) fn wio(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkloadError {
    let what = what.into();
    move |source| WorkloadError::Io { what, source }
}

/// What a workload reports (measured part only).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct WorkerResult {
    /// Wall time of the measured part.
    pub elapsed_s: f64,
    /// User CPU time (all threads).
    pub user_s: f64,
    /// System CPU time (all threads).
    pub sys_s: f64,
    /// Minor page faults.
    pub minflt: u64,
    /// Major page faults.
    pub majflt: u64,
    /// Operations done (pages read, reads, faults, page touches).
    pub ops: u64,
    /// Words read that did not match the pattern (must be 0).
    pub bad_words: u64,
    /// Workload-specific values.
    pub extra: BTreeMap<String, f64>,
    /// Latency of the accesses the workload timed (random-read,
    /// multi-fault), if it timed any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencySummary>,
    /// What the workload wants the report to say (e.g. the Python package
    /// it ran).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Started before the measured part, stopped after it.
pub(crate) struct Meter {
    t0: Instant,
    u0: raw::Usage,
    io0: Option<u64>,
}

/// `read_bytes` of /proc/self/io: bytes this process (all threads) caused to
/// be read from block devices, counted at I/O submission (readahead included).
fn read_bytes_self() -> Option<u64> {
    std::fs::read_to_string("/proc/self/io").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("read_bytes:"))
            .and_then(|v| v.trim().parse().ok())
    })
}

impl Meter {
    pub(crate) fn start() -> Result<Self, WorkloadError> {
        Ok(Meter {
            u0: raw::rusage_self().map_err(wio("getrusage"))?,
            io0: read_bytes_self(),
            t0: Instant::now(),
        })
    }
    pub(crate) fn stop(self, ops: u64, bad_words: u64) -> Result<WorkerResult, WorkloadError> {
        let elapsed_s = self.t0.elapsed().as_secs_f64();
        let u = raw::rusage_self().map_err(wio("getrusage"))?;
        let mut extra = BTreeMap::new();
        if let (Some(a), Some(b)) = (self.io0, read_bytes_self()) {
            extra.insert("read_bytes".to_string(), b.saturating_sub(a) as f64);
        }
        Ok(WorkerResult {
            elapsed_s,
            user_s: u.user_s - self.u0.user_s,
            sys_s: u.sys_s - self.u0.sys_s,
            minflt: u.minflt - self.u0.minflt,
            majflt: u.majflt - self.u0.majflt,
            ops,
            bad_words,
            extra,
            latency: None,
            notes: Vec::new(),
        })
    }
}

/// Median (mean of the middle two for an even count); NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
        assert!(median(&[]).is_nan());
    }
}
