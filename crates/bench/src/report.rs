//! Results: the JSON a run writes (date, machine, command line, every run's
//! values), the medians and ratios vs the kernel, a text table, and a PNG
//! plot (bench/plot.py, matplotlib).
//!
//! Ratios come only from runs interleaved in one invocation
//! ([`interleaved`]: A B C A B C …) and are ratios of medians, so a slow
//! drift of the machine (this is a shared VM) affects every engine alike.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::host::ncpu;
use crate::measurement::{Measurement, Metric};
pub use crate::meter::median;
use crate::scenario::{Scenario, ScenarioParams};

/// The plotting script, embedded so the crate works from any directory.
pub const PLOT_PY: &str = include_str!("../../../bench/plot.py");

/// Errors of writing or plotting a report.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum ReportError {
    /// writing {path}: {source}
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// encoding the report as JSON: {0}
    Json(#[from] serde_json::Error),
    /// bench/plot.py failed ({status}): {stderr}
    Plot {
        /// Exit status.
        status: String,
        /// What it printed.
        stderr: String,
    },
    /// bench/plot.py did not finish within 120 s
    PlotTimeout,
}

/// The machine a report was measured on.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    /// CPUs available.
    pub nproc: usize,
    /// `uname -r`.
    pub kernel: String,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// MemTotal, bytes.
    pub mem_bytes: u64,
}

impl Machine {
    /// Describe this machine.
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            nproc: ncpu(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default(),
            mem_bytes: meminfo
                .lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
                .map_or(0, |k| k * 1024),
        }
    }
}

/// One run of one engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// Engine name.
    pub engine: String,
    /// Variant label.
    pub variant: String,
    /// Round number (0-based).
    pub round: usize,
    /// The exact parameters.
    pub params: ScenarioParams,
    /// The result, if it succeeded.
    pub measurement: Option<Measurement>,
    /// The error, if it failed.
    pub error: Option<String>,
}

/// Medians of one engine on one variant.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SummaryRow {
    /// Variant label.
    pub variant: String,
    /// Engine name.
    pub engine: String,
    /// Successful runs.
    pub runs: usize,
    /// Failed runs.
    pub failures: usize,
    /// Median of the scenario's metric.
    pub value: f64,
    /// Min and max of the metric over the runs.
    pub range: (f64, f64),
    /// Median elapsed, user, sys seconds.
    pub elapsed_s: f64,
    /// Median user CPU seconds.
    pub user_s: f64,
    /// Median system CPU seconds.
    pub sys_s: f64,
    /// Median tracepoint remote sends.
    pub tlb_sends: Option<f64>,
    /// Median system-wide TLB IRQs per second.
    pub tlb_irq_per_s: Option<f64>,
    /// Median sends per 1000 evicted pages.
    pub sends_per_1000_evicted: Option<f64>,
    /// This engine's value / the kernel's on the same variant (time metrics:
    /// < 1 is faster; rate metrics: > 1 is faster).
    pub vs_kernel: Option<f64>,
    /// Change vs the scenario's baseline variant of the same engine, %.
    pub vs_baseline_pct: Option<f64>,
    /// This engine's value / each kernel engine's (`kernel …`) on the same
    /// variant, e.g. vs `kernel MADV_RANDOM` as well as plain `kernel`.
    #[serde(default)]
    pub vs_kernels: BTreeMap<String, f64>,
    /// Median over the runs of each run's median access latency, ns
    /// (random-read, multi-fault).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_ns: Option<f64>,
    /// Median over the runs of each run's 99th percentile, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_ns: Option<f64>,
    /// Largest latency of any run, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_max_ns: Option<f64>,
    /// Per phase (numpy), medians: `<phase>` → rate, `<phase> s` → seconds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases: BTreeMap<String, f64>,
    /// Per phase, this engine's rate / the baseline engine's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases_vs_kernel: BTreeMap<String, f64>,
}

/// Everything one scenario run produced.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// UTC date and time, ISO 8601.
    pub date: String,
    /// The machine.
    pub machine: Machine,
    /// The command line.
    pub command_line: Vec<String>,
    /// The scenario (its name in JSON).
    pub scenario: Scenario,
    /// Seed experiment.
    pub seed: String,
    /// The scenario's target (what upager should reach against the kernel).
    pub target: String,
    /// Main metric.
    pub metric: Metric,
    /// Parameters as given.
    pub params: ScenarioParams,
    /// Every run, in the order made.
    pub runs: Vec<RunRecord>,
    /// Medians and ratios.
    pub summary: Vec<SummaryRow>,
    /// The scenario's phases in order (numpy: sequential, random reads,
    /// random writes + flush); the keys of each row's `phases`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_names: Vec<String>,
    /// The unit of each phase's rate (`GB/s`, `reads/s`), in that order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_units: Vec<String>,
    /// The engine `vs_kernel` compares with (`kernel`; numpy:
    /// `kernel numpy.memmap`).
    #[serde(default = "default_baseline")]
    pub baseline_engine: String,
    /// What the run left out or changed, and why (e.g. a fault mode the
    /// engine refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn default_baseline() -> String {
    "kernel".into()
}

/// `(round, engine index)` in interleaved order: A B C A B C … for `rounds`.
pub fn interleaved(rounds: usize, engines: usize) -> Vec<(usize, usize)> {
    (0..rounds)
        .flat_map(|r| (0..engines).map(move |e| (r, e)))
        .collect()
}

fn median_opt(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = v.flatten().collect();
    (!v.is_empty()).then(|| median(&v))
}

/// ISO 8601 UTC time of `t` (civil-from-days, no time-zone data needed).
pub fn iso8601(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, sod) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// `bench/results/<today, UTC>-<name>`: where a run's results go unless told
/// otherwise (the results layout of bench/README.md: one dated folder per run,
/// named by what it measures).
pub fn results_dir(name: &str) -> std::path::PathBuf {
    let date = iso8601(SystemTime::now());
    std::path::PathBuf::from(format!("bench/results/{}-{name}", &date[..10]))
}

impl Report {
    /// Build a report (with its summary) from runs.
    pub fn new(scenario: Scenario, params: &ScenarioParams, runs: Vec<RunRecord>) -> Self {
        let sc = scenario.spec();
        let mut r = Report {
            date: iso8601(SystemTime::now()),
            machine: Machine::this(),
            command_line: std::env::args().collect(),
            scenario,
            seed: sc.seed.to_string(),
            target: sc.target.to_string(),
            metric: sc.metric,
            params: params.clone(),
            runs,
            summary: Vec::new(),
            phase_names: sc.phases.iter().map(|p| p.name.to_string()).collect(),
            phase_units: sc.phases.iter().map(|p| p.rate_unit.to_string()).collect(),
            baseline_engine: sc.baseline_engine.to_string(),
            notes: Vec::new(),
        };
        r.summary = r.summarize(sc.baseline_variant);
        r
    }

    fn summarize(&self, baseline_variant: Option<&str>) -> Vec<SummaryRow> {
        let phases = self.scenario.spec().phases;
        // Keep first-seen order of variants and engines.
        let mut keys: Vec<(String, String)> = Vec::new();
        for run in &self.runs {
            let k = (run.variant.clone(), run.engine.clone());
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let mut rows: Vec<SummaryRow> = keys
            .into_iter()
            .map(|(variant, engine)| {
                let ms: Vec<&Measurement> = self
                    .runs
                    .iter()
                    .filter(|r| r.variant == variant && r.engine == engine)
                    .filter_map(|r| r.measurement.as_ref())
                    .collect();
                let failures = self
                    .runs
                    .iter()
                    .filter(|r| {
                        r.variant == variant && r.engine == engine && r.measurement.is_none()
                    })
                    .count();
                let vals: Vec<f64> = ms.iter().map(|m| self.metric.of(m)).collect();
                let med = |f: fn(&Measurement) -> f64| {
                    median(&ms.iter().map(|m| f(m)).collect::<Vec<_>>())
                };
                SummaryRow {
                    variant,
                    engine,
                    runs: ms.len(),
                    failures,
                    value: median(&vals),
                    range: (
                        vals.iter().copied().fold(f64::INFINITY, f64::min),
                        vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    ),
                    elapsed_s: med(|m| m.elapsed_s),
                    user_s: med(|m| m.user_s),
                    sys_s: med(|m| m.sys_s),
                    tlb_sends: median_opt(ms.iter().map(|m| m.tlb_sends.map(|x| x as f64))),
                    tlb_irq_per_s: median_opt(ms.iter().map(|m| m.tlb_irq_per_s)),
                    sends_per_1000_evicted: median_opt(ms.iter().map(|m| m.sends_per_1000_evicted)),
                    vs_kernel: None,
                    vs_baseline_pct: None,
                    vs_kernels: BTreeMap::new(),
                    latency_p50_ns: median_opt(
                        ms.iter().map(|m| m.latency.as_ref().map(|l| l.p50_ns)),
                    ),
                    latency_p99_ns: median_opt(
                        ms.iter().map(|m| m.latency.as_ref().map(|l| l.p99_ns)),
                    ),
                    latency_max_ns: ms
                        .iter()
                        .filter_map(|m| m.latency.as_ref().map(|l| l.max_ns))
                        .reduce(f64::max),
                    phases: phases
                        .iter()
                        .flat_map(|ph| {
                            [
                                (ph.name.to_string(), ph.rate_key),
                                (format!("{} s", ph.name), ph.time_key),
                            ]
                        })
                        .filter_map(|(k, key)| {
                            median_opt(ms.iter().map(|m| m.extra.get(key).copied())).map(|v| (k, v))
                        })
                        .collect(),
                    phases_vs_kernel: BTreeMap::new(),
                }
            })
            .collect();
        let lookup: BTreeMap<(String, String), f64> = rows
            .iter()
            .map(|r| ((r.variant.clone(), r.engine.clone()), r.value))
            .collect();
        let phase_lookup: BTreeMap<(String, String), BTreeMap<String, f64>> = rows
            .iter()
            .map(|r| ((r.variant.clone(), r.engine.clone()), r.phases.clone()))
            .collect();
        for r in &mut rows {
            let base = (r.variant.clone(), self.baseline_engine.clone());
            if let Some(k) = lookup.get(&base) {
                if *k > 0.0 && r.value.is_finite() {
                    r.vs_kernel = Some(r.value / k);
                }
            }
            if let Some(kp) = phase_lookup.get(&base) {
                for ph in phases {
                    if let (Some(v), Some(k)) = (r.phases.get(ph.name), kp.get(ph.name)) {
                        if *k > 0.0 && v.is_finite() {
                            r.phases_vs_kernel.insert(ph.name.to_string(), v / k);
                        }
                    }
                }
            }
            for ((v, e), k) in &lookup {
                if *v == r.variant
                    && e.starts_with("kernel")
                    && *e != r.engine
                    && *k > 0.0
                    && r.value.is_finite()
                {
                    r.vs_kernels.insert(e.clone(), r.value / k);
                }
            }
            if let Some(bv) = baseline_variant {
                if let Some(b) = lookup.get(&(bv.to_string(), r.engine.clone())) {
                    if *b > 0.0 && r.value.is_finite() {
                        r.vs_baseline_pct = Some((r.value / b - 1.0) * 100.0);
                    }
                }
            }
        }
        rows
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Write the JSON to `path`.
    pub fn save_json(&self, path: &Path) -> Result<(), ReportError> {
        std::fs::write(path, self.to_json()?).map_err(|source| ReportError::Io {
            path: path.into(),
            source,
        })
    }

    /// A text table: one row per variant × engine, medians, ratios vs the
    /// kernel (and vs the baseline variant where the scenario has one).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{} — seed {}", self.scenario, self.seed);
        let _ = writeln!(
            s,
            "{} · {} CPUs · Linux {} · {} · median of {} interleaved rounds",
            self.date,
            self.machine.nproc,
            self.machine.kernel,
            self.machine.cpu_model,
            self.params.rounds.max(1)
        );
        let _ = writeln!(s, "target: {}", self.target);
        if self.baseline_engine != "kernel" {
            let _ = writeln!(s, "vs kern: vs {}", self.baseline_engine);
        }
        let latency = self.summary.iter().any(|r| r.latency_p50_ns.is_some());
        let _ = write!(
            s,
            "{:<12} {:<22} {:>13} {:>8} {:>9} {:>8} {:>8} {:>10} {:>10} {:>9}",
            "variant",
            "engine",
            self.metric.label(),
            "vs kern",
            "elapsed s",
            "user s",
            "sys s",
            "tlb sends",
            "IRQ/s",
            "sends/1k"
        );
        if latency {
            let _ = write!(s, " {:>8} {:>8} {:>9}", "p50 µs", "p99 µs", "max µs");
        }
        s.push('\n');
        let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
        let us = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}", v / 1000.0));
        for r in &self.summary {
            let val = if self.metric.higher_is_better() {
                format!("{:.0}", r.value)
            } else if r.value < 0.01 {
                format!("{:.3e}", r.value)
            } else {
                format!("{:.4}", r.value)
            };
            let mut vs = r.vs_kernel.map_or("-".into(), |v| format!("{v:.2}×"));
            if let Some(p) = r.vs_baseline_pct {
                vs = format!("{vs} {p:+.0}%");
            }
            let _ = write!(
                s,
                "{:<12} {:<22} {:>13} {:>8} {:>9.3} {:>8.3} {:>8.3} {:>10} {:>10} {:>9}",
                r.variant,
                r.engine,
                val,
                vs,
                r.elapsed_s,
                r.user_s,
                r.sys_s,
                f(r.tlb_sends, 0),
                f(r.tlb_irq_per_s, 0),
                f(r.sends_per_1000_evicted, 2),
            );
            if latency {
                let _ = write!(
                    s,
                    " {:>8} {:>8} {:>9}",
                    us(r.latency_p50_ns),
                    us(r.latency_p99_ns),
                    us(r.latency_max_ns)
                );
            }
            if r.failures > 0 {
                let _ = write!(s, "  ({} failed)", r.failures);
            }
            s.push('\n');
        }
        let phases = self.scenario.spec().phases;
        if !phases.is_empty() {
            let _ = writeln!(
                s,
                "phases (median; rate, seconds, rate vs {}):",
                self.baseline_engine
            );
            // Rows by variant too where there are several (numpy: one per
            // kind of data).
            let by_variant = self
                .summary
                .iter()
                .any(|r| r.variant != self.summary[0].variant);
            for r in &self.summary {
                if by_variant {
                    let _ = write!(s, "  {:<22} {:<22}", r.variant, r.engine);
                } else {
                    let _ = write!(s, "  {:<22}", r.engine);
                }
                for ph in phases {
                    let rate = r.phases.get(ph.name);
                    let secs = r.phases.get(&format!("{} s", ph.name));
                    let vs = r
                        .phases_vs_kernel
                        .get(ph.name)
                        .map_or(String::new(), |v| format!(" {v:.2}×"));
                    let _ = write!(
                        s,
                        "  {}: {} {} ({} s){vs}",
                        ph.name,
                        rate.map_or("-".into(), |v| fmt_rate(*v)),
                        ph.rate_unit,
                        secs.map_or("-".into(), |v| format!("{v:.2}")),
                    );
                }
                s.push('\n');
            }
        }
        for r in &self.summary {
            for (k, v) in &r.vs_kernels {
                if *k != self.baseline_engine && !r.engine.starts_with("kernel") {
                    let _ = writeln!(s, "  {} {} vs {k}: {v:.2}×", r.variant, r.engine);
                }
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        for run in self.runs.iter().filter(|r| r.error.is_some()) {
            let _ = writeln!(
                s,
                "failed: {} {} round {}: {}",
                run.variant,
                run.engine,
                run.round + 1,
                run.error.as_deref().unwrap_or("")
            );
        }
        s
    }

    /// Runs that failed, as `variant engine round: error` lines.
    pub fn failures(&self) -> Vec<String> {
        self.runs
            .iter()
            .filter_map(|r| {
                r.error
                    .as_ref()
                    .map(|e| format!("{} {} round {}: {e}", r.variant, r.engine, r.round + 1))
            })
            .collect()
    }
}

/// A rate with sensible digits: 2.38 (GB/s), 35,712 (reads/s).
fn fmt_rate(v: f64) -> String {
    if v >= 1000.0 {
        let n = v.round() as u64;
        let mut out = String::new();
        let digits = n.to_string();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Plot a saved report JSON to `png` with `python3 bench/plot.py`. Returns
/// `Ok(false)` (and prints how to install it) when python3 or matplotlib is
/// missing: a missing plot never fails a benchmark run.
pub fn plot(json: &Path, png: &Path) -> Result<bool, ReportError> {
    let script = std::env::temp_dir().join(format!("upager-bench-{}-plot.py", std::process::id()));
    std::fs::write(&script, PLOT_PY).map_err(|source| ReportError::Io {
        path: script.clone(),
        source,
    })?;
    let spawned = Command::new("python3")
        .arg(&script)
        .arg(json)
        .arg(png)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(_) => {
            let _ = std::fs::remove_file(&script);
            eprintln!("upager-bench: no plot: python3 not found (apt-get install python3 python3-matplotlib)");
            return Ok(false);
        }
    };
    let t = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t.elapsed() > Duration::from_secs(120) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(&script);
                return Err(ReportError::PlotTimeout);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(source) => {
                return Err(ReportError::Io {
                    path: script,
                    source,
                })
            }
        }
    };
    let _ = std::fs::remove_file(&script);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    match status.code() {
        Some(0) => Ok(true),
        Some(3) => {
            eprintln!(
                "upager-bench: no plot: matplotlib is missing; install it with `pip install -r bench/requirements.txt` \
                 (or `apt-get install python3-matplotlib`)"
            );
            Ok(false)
        }
        _ => Err(ReportError::Plot {
            status: status.to_string(),
            stderr: err.trim().to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_and_median() {
        assert_eq!(
            interleaved(2, 3),
            [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
        );
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn dates() {
        assert_eq!(iso8601(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            iso8601(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661)),
            "2000-02-29T01:01:01Z"
        );
    }

    fn rec(engine: &str, variant: &str, round: usize, elapsed: f64) -> RunRecord {
        RunRecord {
            engine: engine.into(),
            variant: variant.into(),
            round,
            params: ScenarioParams::default(),
            measurement: Some(Measurement {
                elapsed_s: elapsed,
                ..Default::default()
            }),
            error: None,
        }
    }

    #[test]
    fn summary_ratios() {
        let runs = vec![
            rec("kernel", "folio=4K", 0, 1.0),
            rec("upager", "folio=4K", 0, 2.0),
            rec("kernel", "folio=64K", 0, 0.4),
            rec("upager", "folio=64K", 0, 0.5),
            rec("kernel", "folio=4K", 1, 3.0),
            rec("upager", "folio=4K", 1, 2.0),
            RunRecord {
                measurement: None,
                error: Some("boom".into()),
                ..rec("kernel", "folio=64K", 1, 0.0)
            },
        ];
        let r = Report::new(Scenario::UnmapFolio, &ScenarioParams::default(), runs);
        let row = |v: &str, e: &str| {
            r.summary
                .iter()
                .find(|x| x.variant == v && x.engine == e)
                .unwrap()
                .clone()
        };
        assert_eq!(row("folio=4K", "kernel").value, 2.0);
        assert_eq!(row("folio=4K", "upager").vs_kernel, Some(1.0));
        assert_eq!(row("folio=64K", "kernel").failures, 1);
        assert!((row("folio=64K", "kernel").vs_baseline_pct.unwrap() + 80.0).abs() < 1e-9);
        let t = r.table();
        assert!(
            t.contains("folio=64K") && t.contains("failed: folio=64K kernel round 2: boom"),
            "{t}"
        );
        let back: Report = serde_json::from_str(&r.to_json().unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
