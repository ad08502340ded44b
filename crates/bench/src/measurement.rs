//! What one engine measured in one run ([`Measurement`]), built from what
//! the worker measured inside and outside itself, and the [`Metric`] a
//! scenario is judged by.

use std::collections::BTreeMap;

use crate::latency::LatencySummary;
use crate::worker::WorkerRun;

/// The main number of a scenario, for tables, ratios and plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Metric {
    /// Wall time, lower is better.
    ElapsedS,
    /// Operations per second, higher is better.
    OpsPerS,
    /// System CPU time, lower is better.
    SysS,
}

impl Metric {
    /// Read the metric from a measurement.
    pub fn of(self, m: &Measurement) -> f64 {
        match self {
            Metric::ElapsedS => m.elapsed_s,
            Metric::OpsPerS => m.ops_per_s,
            Metric::SysS => m.sys_s,
        }
    }
    /// Whether larger values are better.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::OpsPerS)
    }
    /// Column label.
    pub fn label(self) -> &'static str {
        match self {
            Metric::ElapsedS => "elapsed s",
            Metric::OpsPerS => "ops/s",
            Metric::SysS => "sys s",
        }
    }
}

/// One engine's measurement of one run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Measurement {
    /// Wall time of the measured part.
    pub elapsed_s: f64,
    /// User CPU time.
    pub user_s: f64,
    /// System CPU time.
    pub sys_s: f64,
    /// Minor faults.
    pub minflt: u64,
    /// Major faults.
    pub majflt: u64,
    /// Operations (pages read, reads, faults, page touches).
    pub ops: u64,
    /// `ops / elapsed_s`.
    pub ops_per_s: f64,
    /// System-wide `TLB` interrupts (/proc/interrupts) during the run.
    pub tlb_irq: Option<u64>,
    /// `tlb_irq` per second.
    pub tlb_irq_per_s: Option<f64>,
    /// Tracepoint `remote IPI send` events of the engine's process.
    pub tlb_sends: Option<u64>,
    /// Tracepoint events per reason 0..=5.
    pub tlb_by_reason: Option<[u64; 6]>,
    /// `tlb_sends` by origin (`process_madvise`, `munmap`, `reclaim`, …;
    /// see `tracing::origin_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tlb_sends_by_origin: Option<BTreeMap<String, u64>>,
    /// Pages evicted (kernel: cgroup `pgpgout`; upager: its own counter).
    pub evicted_pages: Option<u64>,
    /// `tlb_sends` per 1000 evicted pages.
    pub sends_per_1000_evicted: Option<f64>,
    /// Peak memory charge (cgroup max_usage) or resident peak.
    pub peak_bytes: Option<u64>,
    /// Scenario-specific values.
    pub extra: BTreeMap<String, f64>,
    /// Latency of the accesses the workload timed (random-read: every read;
    /// multi-fault: one fault in 16), the same way for every engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencySummary>,
    /// What was skipped or worth knowing.
    pub notes: Vec<String>,
}

/// Pages the kernel evicted during a worker run, counted per page (the
/// cgroup's `pgpgout` counts folios, and file folios are large on 6.18's
/// ext4): file pages = pages the worker read from block devices (its
/// `read_bytes`, which includes swap-ins) − `pswpin` − growth of the
/// cgroup's page cache; anonymous pages = `pswpout` (system-wide, but only
/// the benchmark swaps here). `None` when neither could be measured.
pub fn evicted_pages(run: &WorkerRun) -> Option<u64> {
    let swapin = run.vmstat.get("pswpin").copied().unwrap_or(0);
    let file = match (
        run.result.extra.get("read_bytes"),
        run.cgroup_stat.get("cache_start"),
        run.cgroup_stat.get("cache_end"),
    ) {
        (Some(&read), Some(&c0), Some(&c1)) => Some(
            ((read as u64) / 4096)
                .saturating_sub(swapin)
                .saturating_sub(c1.saturating_sub(c0) / 4096),
        ),
        _ => None,
    };
    let anon = run.vmstat.get("pswpout").copied();
    match (file, anon) {
        (None, None) => None,
        (f, a) => Some(f.unwrap_or(0) + a.unwrap_or(0)),
    }
}

impl Measurement {
    /// Build a measurement from a worker run.
    pub fn from_worker(run: &WorkerRun) -> Self {
        let r = &run.result;
        let evicted = evicted_pages(run);
        let sends = run.tlb.as_ref().map(|t| t.remote_sends());
        Measurement {
            elapsed_s: r.elapsed_s,
            user_s: r.user_s,
            sys_s: r.sys_s,
            minflt: r.minflt,
            majflt: r.majflt,
            ops: r.ops,
            ops_per_s: if r.elapsed_s > 0.0 {
                r.ops as f64 / r.elapsed_s
            } else {
                0.0
            },
            tlb_irq: run.tlb_irq,
            tlb_irq_per_s: run.tlb_irq.map(|n| {
                if r.elapsed_s > 0.0 {
                    n as f64 / r.elapsed_s
                } else {
                    0.0
                }
            }),
            tlb_sends: sends,
            tlb_by_reason: run.tlb.as_ref().map(|t| t.by_reason),
            tlb_sends_by_origin: run.tlb.as_ref().map(|t| t.sends_by_origin.clone()),
            evicted_pages: evicted,
            sends_per_1000_evicted: match (sends, evicted) {
                (Some(s), Some(e)) if e > 0 => Some(s as f64 * 1000.0 / e as f64),
                _ => None,
            },
            peak_bytes: run.peak_bytes,
            extra: r.extra.clone(),
            latency: r.latency.clone(),
            notes: run.notes.iter().chain(&r.notes).cloned().collect(),
        }
    }
}
