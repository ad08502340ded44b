//! The benchmark scenarios (the seed experiments, residency, numpy) as data: the
//! [`Scenario`] enum, parsed once from its name ([`FromStr`]), each with its
//! [`ScenarioSpec`] (seed experiment, what it measures, target, engines,
//! default and tiny parameters), and the [`ScenarioParams`] of one run,
//! swept into variants by [`Scenario::variants`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::host::ncpu;
use crate::measurement::Metric;
pub use crate::pattern::{DataFile, DataKind, ParseDataKindError};
use crate::thp::mthp_sizes_kb;

/// A scenario: one seed experiment, run by every engine that supports it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Seed 000: sequential reads of a file mapping much larger than the budget.
    MmapRead,
    /// Random 4 KiB reads over a file 8× the budget.
    RandomRead,
    /// Seed 001: page faults from 1..2×ncpu threads.
    MultiFault,
    /// Seed 002: unmapping 4 KiB pages vs large folios.
    UnmapFolio,
    /// Seed 003: anonymous memory larger than the budget (usemem).
    Swap,
    /// Random reads over a fully resident region, 4 KiB pages vs
    /// huge pages in the view.
    TlbReach,
    /// Seed 004: classifying resident / evicted / never touched.
    Residency,
    /// A numpy user's float64 array larger than memory,
    /// `numpy.memmap` in a memory cgroup vs `upager.open_array`, on
    /// compressible and incompressible data.
    Numpy,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    pub const ALL: [Scenario; 8] = [
        Scenario::MmapRead,
        Scenario::RandomRead,
        Scenario::MultiFault,
        Scenario::UnmapFolio,
        Scenario::Swap,
        Scenario::TlbReach,
        Scenario::Residency,
        Scenario::Numpy,
    ];

    /// What the scenario is, as data.
    pub fn spec(self) -> &'static ScenarioSpec {
        match self {
            Scenario::MmapRead => &MMAP_READ,
            Scenario::RandomRead => &RANDOM_READ,
            Scenario::MultiFault => &MULTI_FAULT,
            Scenario::UnmapFolio => &UNMAP_FOLIO,
            Scenario::Swap => &SWAP,
            Scenario::TlbReach => &TLB_REACH,
            Scenario::Residency => &RESIDENCY,
            Scenario::Numpy => &NUMPY,
        }
    }

    /// The name used on the command line and in reports (`mmap-read`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Default parameters (a few minutes on 2 vCPUs).
    pub fn defaults(self) -> ScenarioParams {
        (self.spec().defaults)()
    }

    /// Tiny parameters (tests: seconds).
    pub fn tiny(self) -> ScenarioParams {
        (self.spec().tiny)()
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// unknown scenario {0:?}; known: mmap-read, random-read, multi-fault, unmap-folio, swap, tlb-reach, residency, numpy
#[derive(Debug, Clone, PartialEq, Eq, displaydoc::Display, thiserror::Error)]
pub struct ParseScenarioError(pub String);

impl FromStr for Scenario {
    type Err = ParseScenarioError;

    /// The one place a scenario is chosen by its name.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.name() == s)
            .ok_or_else(|| ParseScenarioError(s.to_string()))
    }
}

/// `ScenarioParams::scenario` in JSON: the name, or `""` when unset (the
/// shape reports had when it was a string).
mod scenario_or_empty {
    use super::Scenario;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Scenario>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(sc) => sc.serialize(s),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Scenario>, D::Error> {
        let name = String::deserialize(d)?;
        if name.is_empty() {
            return Ok(None);
        }
        name.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

/// Every knob of every scenario; each scenario reads the ones it needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ScenarioParams {
    /// The scenario (set by [`Scenario::variants`]; `""` in JSON when unset).
    #[serde(with = "scenario_or_empty")]
    pub scenario: Option<Scenario>,
    /// The variant label (e.g. `threads=2`, `folio=64K`; set by [`Scenario::variants`]).
    pub variant: String,
    /// Memory budget: upager's budget and the kernel's cgroup limit.
    pub limit_bytes: u64,
    /// Run the kernel in a memory cgroup with `limit_bytes`.
    pub use_cgroup: bool,
    /// Data file size (file scenarios).
    pub file_bytes: u64,
    /// The data file (made by [`crate::suite::prepare`]).
    pub data_file: Option<PathBuf>,
    /// Pattern seed of the data file.
    pub seed: u64,
    /// Threads (for scenarios with one thread count).
    pub threads: usize,
    /// Thread counts to sweep (multi-fault, swap); empty = just `threads`.
    pub thread_counts: Vec<usize>,
    /// Reads per thread (random-read).
    pub reads_per_thread: u64,
    /// Duration (multi-fault).
    pub seconds: f64,
    /// Area per thread (multi-fault).
    pub area_bytes: u64,
    /// Region size (unmap-folio).
    pub region_bytes: u64,
    /// Folio size of this variant, KiB.
    pub folio_kb: u64,
    /// Folio sizes to sweep, KiB (unmap-folio).
    pub folio_sizes_kb: Vec<u64>,
    /// Anonymous memory per thread (swap).
    pub bytes_per_thread: u64,
    /// Passes over the memory (swap).
    pub passes: u32,
    /// Interleaved rounds; the median is reported.
    pub rounds: usize,
    /// Drop caches before each run (root).
    pub drop_caches: bool,
    /// Count tlb:tlb_flush for the engine's process (root).
    pub trace_tlb: bool,
    /// Time limit per run, seconds.
    pub timeout_s: f64,
    /// Directory for upager's private swap files (swap scenario; set by
    /// [`crate::suite::prepare`] to the RAM device's ext4 when there is one).
    pub swap_dir: Option<PathBuf>,
    /// upager's budget where it differs from `limit_bytes` (numpy: the
    /// Python process runs in the cgroup of `limit_bytes` on both sides and
    /// upager gets this budget inside it); 0 = `limit_bytes`.
    pub budget_bytes: u64,
    /// Random element reads, and as many writes (numpy).
    pub random_ops: u64,
    /// Bytes per slice of the sequential pass (numpy).
    pub slice_bytes: u64,
    /// The kinds of data to run, one variant each (numpy: both by
    /// default); empty = the scenario's one data file (`data_file`).
    pub data_kinds: Vec<DataKind>,
    /// This variant's kind of data (set by [`Scenario::variants`]).
    pub data_kind: Option<DataKind>,
    /// The data file of each of `data_kinds` (made by
    /// [`crate::suite::prepare`]); [`Scenario::variants`] sets each
    /// variant's `data_file` to its kind's.
    pub data_files: BTreeMap<DataKind, PathBuf>,
}

impl Default for ScenarioParams {
    fn default() -> Self {
        ScenarioParams {
            scenario: None,
            variant: String::new(),
            limit_bytes: 256 << 20,
            use_cgroup: true,
            file_bytes: 2 << 30,
            data_file: None,
            seed: 0x5eed_0000_0000_0001,
            threads: ncpu(),
            thread_counts: Vec::new(),
            reads_per_thread: 100_000,
            seconds: 2.0,
            area_bytes: 2 << 20,
            region_bytes: 1 << 30,
            folio_kb: 4,
            folio_sizes_kb: Vec::new(),
            bytes_per_thread: 256 << 20,
            passes: 2,
            rounds: 3,
            drop_caches: true,
            trace_tlb: true,
            timeout_s: 600.0,
            swap_dir: None,
            budget_bytes: 0,
            random_ops: 200_000,
            slice_bytes: 8 << 20,
            data_kinds: Vec::new(),
            data_kind: None,
            data_files: BTreeMap::new(),
        }
    }
}

impl ScenarioParams {
    /// upager's budget: `budget_bytes`, or `limit_bytes` when that is 0.
    pub fn upager_budget(&self) -> u64 {
        if self.budget_bytes > 0 {
            self.budget_bytes
        } else {
            self.limit_bytes
        }
    }
}

fn mmap_read_defaults() -> ScenarioParams {
    ScenarioParams {
        file_bytes: 2 << 30,
        limit_bytes: 256 << 20,
        ..Default::default()
    }
}
fn mmap_read_tiny() -> ScenarioParams {
    // 8 MiB, not 4: a 4 MiB cgroup is close to the worker's own footprint
    // and the kernel's run was OOM-killed once on a loaded machine.
    ScenarioParams {
        file_bytes: 32 << 20,
        limit_bytes: 8 << 20,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn random_read_defaults() -> ScenarioParams {
    ScenarioParams {
        file_bytes: 2 << 30,
        limit_bytes: 256 << 20,
        reads_per_thread: 100_000,
        ..Default::default()
    }
}
fn random_read_tiny() -> ScenarioParams {
    ScenarioParams {
        file_bytes: 64 << 20,
        limit_bytes: 8 << 20, // see mmap_read_tiny
        reads_per_thread: 2000,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn multi_fault_defaults() -> ScenarioParams {
    ScenarioParams {
        thread_counts: (1..=2 * ncpu()).collect(),
        seconds: 3.0,
        use_cgroup: false,
        ..Default::default()
    }
}
fn multi_fault_tiny() -> ScenarioParams {
    ScenarioParams {
        thread_counts: vec![1, 2],
        seconds: 0.2,
        use_cgroup: false,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn unmap_defaults() -> ScenarioParams {
    let mut sizes = vec![4];
    sizes.extend(mthp_sizes_kb().into_iter().filter(|&s| s >= 16));
    ScenarioParams {
        region_bytes: 1 << 30,
        folio_sizes_kb: sizes,
        use_cgroup: false,
        ..Default::default()
    }
}
fn unmap_tiny() -> ScenarioParams {
    let mut sizes = vec![4];
    sizes.extend(mthp_sizes_kb().into_iter().filter(|&s| s == 64));
    ScenarioParams {
        region_bytes: 16 << 20,
        folio_sizes_kb: sizes,
        use_cgroup: false,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}
fn swap_defaults() -> ScenarioParams {
    ScenarioParams {
        thread_counts: vec![1, ncpu(), 2 * ncpu()],
        bytes_per_thread: 0, // 0 = 2 × limit spread over the threads
        limit_bytes: 256 << 20,
        passes: 2,
        ..Default::default()
    }
}
fn swap_tiny() -> ScenarioParams {
    ScenarioParams {
        thread_counts: vec![1, 2],
        bytes_per_thread: 0,
        limit_bytes: 8 << 20,
        passes: 2,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}

fn tlb_reach_defaults() -> ScenarioParams {
    ScenarioParams {
        region_bytes: 1 << 30,
        reads_per_thread: 20_000_000,
        threads: 1,
        use_cgroup: false,
        drop_caches: false,
        trace_tlb: false,
        ..Default::default()
    }
}
fn tlb_reach_tiny() -> ScenarioParams {
    ScenarioParams {
        region_bytes: 16 << 20,
        reads_per_thread: 100_000,
        rounds: 1,
        timeout_s: 60.0,
        ..tlb_reach_defaults()
    }
}

fn residency_defaults() -> ScenarioParams {
    ScenarioParams {
        region_bytes: 16 << 30,
        use_cgroup: false,
        drop_caches: false,
        ..Default::default()
    }
}
fn residency_tiny() -> ScenarioParams {
    ScenarioParams {
        region_bytes: 64 << 20,
        use_cgroup: false,
        drop_caches: false,
        rounds: 1,
        timeout_s: 60.0,
        ..Default::default()
    }
}

fn numpy_defaults() -> ScenarioParams {
    // The sizes of a numpy user's array larger than memory (docs/benchmarks.md).
    ScenarioParams {
        file_bytes: 2 << 30,
        limit_bytes: 256 << 20,
        budget_bytes: 192 << 20,
        random_ops: 200_000,
        slice_bytes: 8 << 20,
        threads: 1,
        data_kinds: DataKind::ALL.to_vec(),
        ..Default::default()
    }
}
fn numpy_tiny() -> ScenarioParams {
    // The Python process with numpy and upager imported is ~30 MiB: a
    // 96 MiB cgroup leaves the kernel ~60 MiB of page cache for a 128 MiB
    // file, and upager a 24 MiB budget inside it.
    ScenarioParams {
        file_bytes: 128 << 20,
        limit_bytes: 96 << 20,
        budget_bytes: 24 << 20,
        random_ops: 5_000,
        slice_bytes: 1 << 20,
        threads: 1,
        rounds: 1,
        timeout_s: 120.0,
        data_kinds: DataKind::ALL.to_vec(),
        ..Default::default()
    }
}

/// One phase of a multi-phase scenario (numpy), reported next to the main
/// metric: its time and its rate, both read from the run's `extra`.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    /// Short name (`sequential`).
    pub name: &'static str,
    /// `extra` key of the phase's seconds.
    pub time_key: &'static str,
    /// `extra` key of its rate (higher is better).
    pub rate_key: &'static str,
    /// Unit of the rate (`GB/s`, `reads/s`).
    pub rate_unit: &'static str,
}

/// A scenario as data.
///
/// The upager engines named by fault mode, `upager handlers` and
/// `upager in-thread`, are the same configuration in the two modes: the
/// one each scenario's target is about (mmap-read and multi-fault: the
/// defaults; random-read and swap: 4 KiB folios). The other upager engines
/// are ablations and run in handlers mode.
#[derive(Debug, Clone)]
pub struct ScenarioSpec {
    /// The scenario.
    pub scenario: Scenario,
    /// Name used on the command line.
    pub name: &'static str,
    /// The seed experiment it reproduces.
    pub seed: &'static str,
    /// What it measures and why.
    pub doc: &'static str,
    /// The engines it compares (names as in `KernelEngine` and
    /// `UpagerEngine::all`).
    pub engines: &'static [&'static str],
    /// The target upager should reach against the kernel.
    pub target: &'static str,
    /// The main metric.
    pub metric: Metric,
    /// The data file it needs on the RAM device, if any.
    pub data: DataFile,
    /// The engine the others are compared with (`vs kernel`): `kernel`, or
    /// `kernel numpy.memmap`.
    pub baseline_engine: &'static str,
    /// Phases reported separately (numpy); empty for the others.
    pub phases: &'static [Phase],
    /// Needs a swap device for the kernel.
    pub needs_swap: bool,
    /// Variant whose value the others are compared to within one engine
    /// (unmap-folio: `folio=4K`).
    pub baseline_variant: Option<&'static str>,
    /// Default parameters (a few minutes on 2 vCPUs).
    pub defaults: fn() -> ScenarioParams,
    /// Tiny parameters (tests: seconds).
    pub tiny: fn() -> ScenarioParams,
}

static MMAP_READ: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::MmapRead,
    name: "mmap-read",
    seed: "000 (Mel Gorman, TLB flush multiple pages per IPI; vm-scalability lru-file-mmap-read)",
    doc: "NR_CPU threads read a MAP_SHARED file mapping sequentially, each its own part, with data much \
          larger than the memory budget, so every page read evicts one. Measures elapsed time, CPU and \
          TLB shootdowns per second and per 1000 evicted pages: eviction under pressure is where one \
          shootdown per page used to cost 25% of the run. `upager 2M`: 2 MiB folios, each filled \
          by moving a staged huge page into the view (mapped read-write, as moving needs, \
          nothing is written).",
    engines: &[
        "kernel",
        "kernel MADV_SEQUENTIAL",
        "upager batch=1",
        "upager handlers",
        "upager in-thread",
        "upager 2M",
    ],
    target: "elapsed ≤ 0.6× the kernel's; ≤ 2 TLB shootdowns per 1000 evicted pages (batch=1 ≈ 1000)",
    metric: Metric::ElapsedS,
    data: DataFile::Pattern,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: false,
    baseline_variant: None,
    defaults: mmap_read_defaults,
    tiny: mmap_read_tiny,
};

static TLB_REACH: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::TlbReach,
    name: "tlb-reach",
    seed: "002 (large folios: one TLB entry per folio)",
    doc: "One thread does random 8-byte reads (a fixed xorshift sequence) over a fully resident \
          anonymous region, no faults: what the page size of the application's view costs once \
          everything is in memory. `kernel`: anonymous MADV_HUGEPAGE memory (transparent huge \
          pages); `upager 4K`: 4 KiB folios (a 4 KiB-page view); `upager 2M`: 2 MiB folios, moved \
          into the view as huge pages. `huge_share` in each run's extra: the part of the region \
          mapped by huge pages (PAGEMAP_SCAN).",
    engines: &["kernel", "upager 4K", "upager 2M"],
    target: "upager 2M matches the kernel's THP (elapsed ≈ 1×)",
    metric: Metric::ElapsedS,
    data: DataFile::None,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: false,
    baseline_variant: None,
    defaults: tlb_reach_defaults,
    tiny: tlb_reach_tiny,
};

static RANDOM_READ: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::RandomRead,
    name: "random-read",
    seed: "CIDR'22 mmap-in-DBMS study / vmcache lookups",
    doc:
        "T threads do uniformly random 4 KiB reads over a file 8× the budget, a fixed number each. \
          Measures reads/s, shootdowns and the latency of each read (p50/p99/max: with 1/8 of the \
          file resident most reads are misses): the case where mmap loses to direct I/O in \
          databases, and where a user-space pager pays one fault round trip per miss. `upager \
          handlers` / `upager in-thread`: 4 KiB folios, the two fault modes; `upager 64K`: the \
          default folio size.",
    engines: &[
        "kernel",
        "kernel MADV_RANDOM",
        "upager batch=1",
        "upager 64K",
        "upager handlers",
        "upager in-thread",
    ],
    target: "reads/s ≥ 0.9× the kernel's",
    metric: Metric::OpsPerS,
    data: DataFile::Pattern,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: false,
    baseline_variant: None,
    defaults: random_read_defaults,
    tiny: random_read_tiny,
};

static MULTI_FAULT: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::MultiFault,
    name: "multi-fault",
    seed: "001 (Kamezawa, speculative page fault; per-VMA locks)",
    doc: "T threads each write-fault their own 2 MiB anonymous area page by page, discard it with \
          MADV_DONTNEED and repeat for D seconds; faults/s for T = 1..2×ncpu, and the latency of a \
          fault (one page in 16 timed). Measures whether the fault path scales with threads or \
          serialises on an address-space lock, and what one fault costs in each fault mode. \
          `upager handlers 1-uffd`: handler mode with one userfaultfd instead of one per \
          handler thread (the fault queue's sharding).",
    engines: &[
        "kernel",
        "upager handlers",
        "upager in-thread",
        "upager handlers 1-uffd",
        "upager locked-lookup",
    ],
    target: "2 threads ≥ 1.6× the faults/s of 1 thread",
    metric: Metric::OpsPerS,
    data: DataFile::None,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: false,
    baseline_variant: Some("threads=1"),
    defaults: multi_fault_defaults,
    tiny: multi_fault_tiny,
};

static UNMAP_FOLIO: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::UnmapFolio,
    name: "unmap-folio",
    seed: "002 (David Hildenbrand, optimize unmap/zap with PTE-mapped THP)",
    doc: "Unmap a fully resident 1 GiB anonymous region made of 4 KiB pages or of large folios \
          (mTHP 16 KiB … 2 MiB where the kernel offers them). Seconds per folio size and % change \
          vs 4 KiB, the seed's table: large folios are processed as one unit.",
    engines: &["kernel", "upager"],
    target: "≥ 50% less time at 64 KiB than at 4 KiB",
    metric: Metric::ElapsedS,
    data: DataFile::None,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: false,
    baseline_variant: Some("folio=4K"),
    defaults: unmap_defaults,
    tiny: unmap_tiny,
};

static SWAP: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::Swap,
    name: "swap",
    seed: "003 (Mel Gorman, batch removal of mappings under a single lock; usemem)",
    doc: "T threads touch anonymous memory larger than the budget (usemem: write each page, read it \
          back), the kernel with a RAM swap device in the cgroup. System time and elapsed per thread \
          count: the cost of removing pages under pressure. `upager handlers` / `upager in-thread`: \
          4 KiB folios with batched removal; `upager unbatched` its ablation; `upager 64K` the \
          default folio size.",
    engines: &[
        "kernel",
        "upager handlers",
        "upager in-thread",
        "upager unbatched",
        "upager 64K",
    ],
    target: "system time below the kernel's; batched removal beats unbatched",
    metric: Metric::SysS,
    data: DataFile::None,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: true,
    baseline_variant: None,
    defaults: swap_defaults,
    tiny: swap_tiny,
};

static RESIDENCY: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::Residency,
    name: "residency",
    seed: "004 (Peter Xu, PTE marker for shmem pageout)",
    doc: "Classify a large file-backed upager region (16 GiB, per 4 MiB: 1 MiB resident, 1 MiB \
          evicted = read then paged out, 2 MiB never touched) into resident / evicted / never \
          touched. `kernel` reads /proc/self/pagemap for the range (one pread), `kernel \
          PAGEMAP_SCAN` walks it with the ioctl; neither can tell evicted from never touched (no PTE \
          either way), which is the seed's point. `upager residency` answers as runs from the folio \
          state words, `upager pagemap` in /proc/pid/pagemap's shape (bit 62 = evicted). Seconds per \
          classification, median of 5 in each run.",
    engines: &["kernel", "kernel PAGEMAP_SCAN", "upager residency", "upager pagemap"],
    target: "upager residency ≥ 10× faster than reading /proc/self/pagemap (≤ 0.1×)",
    metric: Metric::ElapsedS,
    data: DataFile::None,
    baseline_engine: "kernel",
    phases: &[],
    needs_swap: false,
    baseline_variant: None,
    defaults: residency_defaults,
    tiny: residency_tiny,
};

static NUMPY: ScenarioSpec = ScenarioSpec {
    scenario: Scenario::Numpy,
    name: "numpy",
    seed: "a numpy user's float64 array larger than memory",
    doc: "One Python process (bench/numpy_scenario.py) in a memory cgroup of the limit works on a \
          float64 file on ext4 on a RAM block device: numpy.memmap(mode=\"r+\") against \
          upager.open_array(mode=\"r+\", budget=…) with what a user gets by default (`upager \
          defaults`: no folio size, no fault mode), the default folio in each fault mode \
          (`upager handlers`, `upager in-thread`), 4 KiB and 64 KiB folios in each mode, issue \
          23's ablations (4 KiB folios with mixed folio sizes: huge-runs; without async \
          readahead: sync-readahead), the defaults without the batched gather and scatter (every miss of a[idx] and a[idx] = v a fault, as in a loop over elements: upager defaults fault-path) and both opened read-only (engines ending in ` r`: no write \
          phase). Phases: a sequential pass (sum over 8 MiB slices), N random element reads \
          (a[idx].sum()), N random element writes (a[idx] = 1.5) and flush(). Time and rate per \
          phase, each vs numpy.memmap (r+): what a numpy user sees first. Once per kind of data \
          (--data): compressible (element i = i: zram compresses it, so a read from the device \
          decompresses) and incompressible (random float64s in [0, 1): zram stores them as they \
          are, so a read is a copy, as from a fast disk).",
    engines: &[
        "kernel numpy.memmap",
        "upager defaults",
        "upager handlers",
        "upager in-thread",
        "upager handlers 4K",
        "upager in-thread 4K",
        "upager handlers 64K",
        "upager in-thread 64K",
    ],
    target: "sequential pass ≤ 0.8× numpy.memmap's time; random reads ≥ 10× (in-thread); random writes + flush ≥ 1.0×",
    metric: Metric::ElapsedS,
    data: DataFile::F64Index,
    baseline_engine: "kernel numpy.memmap",
    phases: &[
        Phase {
            name: "sequential",
            time_key: "seq_s",
            rate_key: "seq_gb_per_s",
            rate_unit: "GB/s",
        },
        Phase {
            name: "random reads",
            time_key: "reads_s",
            rate_key: "reads_per_s",
            rate_unit: "reads/s",
        },
        Phase {
            name: "random writes + flush",
            time_key: "writes_flush_s",
            rate_key: "writes_per_s",
            rate_unit: "writes/s",
        },
    ],
    needs_swap: false,
    baseline_variant: None,
    defaults: numpy_defaults,
    tiny: numpy_tiny,
};

impl ScenarioSpec {
    /// Whether the scenario needs a data file on the RAM device.
    pub fn needs_file(&self) -> bool {
        self.data != DataFile::None
    }
}

fn size_label(kb: u64) -> String {
    if kb >= 1024 && kb & 1023 == 0 {
        format!("{}M", kb / 1024)
    } else {
        format!("{kb}K")
    }
}

impl Scenario {
    /// The runs a sweep makes: one [`ScenarioParams`] per variant, with
    /// `scenario`, `variant` and the swept field filled in.
    pub fn variants(self, p: &ScenarioParams) -> Vec<ScenarioParams> {
        let base = ScenarioParams {
            scenario: Some(self),
            ..p.clone()
        };
        match self {
            Scenario::MultiFault | Scenario::Swap => {
                let counts = if p.thread_counts.is_empty() {
                    vec![p.threads]
                } else {
                    p.thread_counts.clone()
                };
                counts
                    .into_iter()
                    .map(|t| ScenarioParams {
                        threads: t,
                        variant: format!("threads={t}"),
                        ..base.clone()
                    })
                    .collect()
            }
            Scenario::UnmapFolio => {
                let sizes = if p.folio_sizes_kb.is_empty() {
                    vec![p.folio_kb]
                } else {
                    p.folio_sizes_kb.clone()
                };
                sizes
                    .into_iter()
                    .map(|k| ScenarioParams {
                        folio_kb: k,
                        variant: format!("folio={}", size_label(k)),
                        ..base.clone()
                    })
                    .collect()
            }
            Scenario::Numpy => {
                // One variant per kind of data, each reading its kind's
                // file; without kinds, the one file of `data_file`.
                let kinds = if p.data_kinds.is_empty() {
                    vec![DataKind::Compressible]
                } else {
                    p.data_kinds.clone()
                };
                kinds
                    .into_iter()
                    .map(|kind| ScenarioParams {
                        variant: format!(
                            "{kind},cgroup={},budget={}",
                            size_label(p.limit_bytes >> 10),
                            size_label(p.upager_budget() >> 10)
                        ),
                        data_kind: Some(kind),
                        data_file: if p.data_kinds.is_empty() {
                            p.data_file.clone()
                        } else {
                            p.data_files.get(&kind).cloned()
                        },
                        ..base.clone()
                    })
                    .collect()
            }
            Scenario::TlbReach => vec![ScenarioParams {
                variant: format!("region={}", size_label(p.region_bytes >> 10)),
                ..base
            }],
            Scenario::MmapRead | Scenario::RandomRead | Scenario::Residency => {
                vec![ScenarioParams {
                    variant: format!("threads={}", p.threads),
                    ..base
                }]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_complete() {
        for sc in Scenario::ALL {
            let s = sc.spec();
            assert_eq!(s.scenario, sc);
            assert_eq!(sc.name().parse::<Scenario>().unwrap(), sc);
            assert_eq!(sc.to_string(), s.name);
            assert!(!s.doc.is_empty() && !s.target.is_empty());
            assert!(s.engines.contains(&s.baseline_engine), "{sc}");
            assert!(s.baseline_engine.starts_with("kernel"), "{sc}");
            assert!(!sc.variants(&sc.tiny()).is_empty());
            assert!(!sc.variants(&sc.defaults()).is_empty());
        }
        let e = "nope".parse::<Scenario>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"nope\""), "{msg}");
        for sc in Scenario::ALL {
            assert!(msg.contains(sc.name()), "{msg} lacks {sc}");
        }
    }

    #[test]
    fn variants_sweep() {
        let v = Scenario::MultiFault.variants(&ScenarioParams {
            thread_counts: vec![1, 2, 4],
            ..Default::default()
        });
        assert_eq!(v.iter().map(|p| p.threads).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(v[2].variant, "threads=4");
        assert_eq!(v[2].scenario, Some(Scenario::MultiFault));
        let v = Scenario::UnmapFolio.variants(&ScenarioParams {
            folio_sizes_kb: vec![4, 64, 2048],
            ..Default::default()
        });
        assert_eq!(
            v.iter().map(|p| p.variant.as_str()).collect::<Vec<_>>(),
            ["folio=4K", "folio=64K", "folio=2M"]
        );
    }

    /// numpy: one variant per kind of data, each with its kind's file.
    #[test]
    fn numpy_variants_by_data_kind() {
        let mut p = Scenario::Numpy.defaults();
        assert_eq!(p.data_kinds, DataKind::ALL);
        for k in DataKind::ALL {
            p.data_files.insert(k, format!("/d/{k}").into());
        }
        let v = Scenario::Numpy.variants(&p);
        assert_eq!(
            v.iter().map(|p| p.variant.as_str()).collect::<Vec<_>>(),
            [
                "compressible,cgroup=256M,budget=192M",
                "incompressible,cgroup=256M,budget=192M"
            ]
        );
        assert_eq!(v[1].data_kind, Some(DataKind::Incompressible));
        assert_eq!(v[1].data_file, Some("/d/incompressible".into()));
        // Without kinds: the one data file, compressible.
        let v = Scenario::Numpy.variants(&ScenarioParams {
            data_file: Some("/d/f".into()),
            data_kinds: Vec::new(),
            ..p
        });
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].data_kind, Some(DataKind::Compressible));
        assert_eq!(v[0].data_file, Some("/d/f".into()));
        let json = serde_json::to_value(&v[0]).unwrap();
        assert_eq!(json["data_kind"], "compressible");
    }

    #[test]
    fn params_json_defaults() {
        let p: ScenarioParams = serde_json::from_str(r#"{"threads": 3}"#).unwrap();
        assert_eq!(p.threads, 3);
        assert_eq!(p.limit_bytes, 256 << 20);
        assert_eq!(p.scenario, None);
    }

    /// Reports keep their JSON shape: the scenario by name, `""` unset.
    #[test]
    fn params_json_scenario() {
        let unset = serde_json::to_value(ScenarioParams::default()).unwrap();
        assert_eq!(unset["scenario"], "");
        let set = &Scenario::UnmapFolio.variants(&ScenarioParams::default())[0];
        let v = serde_json::to_value(set).unwrap();
        assert_eq!(v["scenario"], "unmap-folio");
        let back: ScenarioParams = serde_json::from_value(v).unwrap();
        assert_eq!(&back, set);
        let back: ScenarioParams = serde_json::from_value(unset).unwrap();
        assert_eq!(back.scenario, None);
        assert!(serde_json::from_str::<ScenarioParams>(r#"{"scenario": "nope"}"#).is_err());
    }
}
