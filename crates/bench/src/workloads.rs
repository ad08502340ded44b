//! The workloads a worker process runs ([`Workload`], sent to it as JSON):
//! the kernel's side of each seed experiment (`kernel_workloads`) and the
//! same experiments through upager (`upager_workloads`).

use std::path::PathBuf;

use crate::kernel_workloads as kernel;
pub use crate::kernel_workloads::MapAdvice;
pub use crate::meter::{WorkerResult, WorkloadError};
use crate::pattern::DataKind;
use crate::upager_workloads::{self, UpagerConfig, UpagerJob};

/// Which array the numpy scenario's Python driver opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NumpyBackend {
    /// `numpy.memmap(file, float64, mode="r+")`.
    Memmap,
    /// `upager.open_array(file, float64, mode="r+", budget=…)` (and
    /// `folio=…`, `fault_mode=…` where the engine sets them).
    Upager,
}

/// One workload and its parameters (the kernel's, or upager's in [`Workload::Upager`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "workload", rename_all = "kebab-case")]
pub enum Workload {
    /// Seed 000 (vm-scalability lru-file-mmap-read): `threads` threads read a
    /// `MAP_SHARED`, `PROT_READ` mapping of `file` sequentially, each its own
    /// contiguous part, one 8-byte word per 4 KiB page, checking the pattern.
    MmapRead {
        /// The pattern file.
        file: PathBuf,
        /// Reader threads.
        threads: usize,
        /// The file's pattern seed.
        seed: u64,
        /// Advice for the mapping.
        #[serde(default)]
        advice: MapAdvice,
    },
    /// CIDR'22 / vmcache lookups: `threads` threads each do
    /// `reads_per_thread` uniformly random 4 KiB-page reads (one word) of a
    /// mapped file.
    RandomRead {
        /// The pattern file.
        file: PathBuf,
        /// Reader threads.
        threads: usize,
        /// Reads per thread.
        reads_per_thread: u64,
        /// The file's pattern seed.
        seed: u64,
        /// Advice for the mapping.
        #[serde(default)]
        advice: MapAdvice,
    },
    /// Seed 001: each thread write-faults its own `area_bytes` anonymous area
    /// (one byte per 4 KiB page, MADV_NOHUGEPAGE), discards it with
    /// MADV_DONTNEED, and repeats for `seconds`.
    MultiFault {
        /// Threads (pinned round-robin to CPUs).
        threads: usize,
        /// Duration.
        seconds: f64,
        /// Area per thread.
        area_bytes: usize,
    },
    /// Seed 002: populate `bytes` of anonymous memory with `folio_kb` folios
    /// (4 = MADV_NOHUGEPAGE; larger sizes need the parent to enable that mTHP
    /// size), then time its munmap.
    Unmap {
        /// Region size.
        bytes: usize,
        /// Folio size the parent enabled (KiB).
        folio_kb: u64,
    },
    /// The TLB reach scenario: `bytes` of anonymous memory with transparent
    /// huge pages (`MADV_HUGEPAGE`), every page written, then `reads`
    /// random 8-byte reads timed (no faults).
    TlbReach {
        /// Region size.
        bytes: usize,
        /// Random reads.
        reads: u64,
    },
    /// Seed 003 (usemem): `threads` threads each write one word per page of
    /// their own `bytes_per_thread` anonymous area, then read it back
    /// `passes - 1` times, checking it (the data survives swap).
    Usemem {
        /// Threads.
        threads: usize,
        /// Anonymous memory per thread.
        bytes_per_thread: usize,
        /// Passes (the first writes).
        passes: u32,
    },
    /// The compressed tier's benchmark (anon_fill.rs): an anonymous area
    /// of `bytes` written word by word with `kind` data, then read back
    /// and checked (the worker runs in the cgroup with zram swap).
    AnonFill {
        /// Area size.
        bytes: u64,
        /// The data.
        kind: crate::anon_fill::FillKind,
    },
    /// Helper for testing the TLB counter: a thread pinned to CPU 1 keeps
    /// reading its own anonymous page (the mm stays live there) while CPU 0
    /// faults in and discards one page of another map `iterations` times;
    /// each discard needs a remote TLB flush.
    MadviseLoop {
        /// Discards.
        iterations: u64,
    },
    /// The same experiments through upager (see `upager_workloads`):
    /// a pager with `budget` and `config` in this process, running `job`.
    /// Not placed in a memory cgroup: upager enforces its own budget.
    Upager {
        /// The pager's budget (the kernel's cgroup limit in the same scenario).
        budget: u64,
        /// Engine configuration (the ablations).
        config: UpagerConfig,
        /// What to run.
        job: UpagerJob,
    },
    /// `upager demo --compare`'s kernel side: a read-write `MAP_SHARED`
    /// mapping of `file`; a sequential scan (every word checked), then
    /// `reads_per_thread` random word reads (checked) and `writes_per_thread`
    /// random word writes per thread, then msync. Phase times in `extra`.
    Mixed {
        /// The pattern file (it is modified).
        file: PathBuf,
        /// Threads.
        threads: usize,
        /// Random reads per thread.
        reads_per_thread: u64,
        /// Random writes per thread.
        writes_per_thread: u64,
        /// The file's pattern seed.
        seed: u64,
    },
    /// The numpy scenario's user, run by the Python driver
    /// (bench/numpy_scenario.py, which documents the phases) in the
    /// cgroup: open `file` (float64 of kind `data`) as an array through
    /// `backend`, then a sequential pass summing `slice_bytes` slices,
    /// `random_ops` random element reads (`a[idx].sum()`), `random_ops`
    /// random element writes (`a[idx] = 1.5`) and `flush()`; afterwards
    /// (untimed) every slice sum and every element read is checked, and the
    /// written elements are checked and restored.
    ///
    /// upager's options are passed to `open_array` only where given
    /// (`None`: the package's default, as a user who does not set it gets).
    Numpy {
        /// The float64 file (modified, then restored).
        file: PathBuf,
        /// numpy.memmap or upager.open_array.
        backend: NumpyBackend,
        /// upager's budget, bytes.
        budget: u64,
        /// upager's folio size, KiB; `None`: no `folio` keyword.
        #[serde(default)]
        folio_kb: Option<u64>,
        /// upager's fault mode (`handlers`, `in-thread`, or `auto`: no
        /// `fault_mode` keyword, upager chooses).
        fault_mode: String,
        /// Bytes per slice of the sequential pass.
        slice_bytes: u64,
        /// Random reads, and as many random writes.
        random_ops: u64,
        /// Seed of the random indices, and of the incompressible file's
        /// elements.
        seed: u64,
        /// What the file holds: element i = i (`compressible`), or
        /// `f64_random(i, seed)` (`incompressible`).
        #[serde(default)]
        data: DataKind,
        /// Incompressible data: the exact sum of each slice (made by
        /// `f64_random_slice_sums`), which the driver's slice sums must
        /// match within their rounding. Empty for compressible data (the
        /// driver knows those sums in closed form).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        slice_sums: Vec<f64>,
        /// upager's mixed folio sizes (`huge_runs`); `None`: the package's
        /// default.
        #[serde(default)]
        huge_runs: Option<bool>,
        /// upager's async readahead (`readahead_async`); `None`: the
        /// package's default.
        #[serde(default)]
        readahead_async: Option<bool>,
        /// How the array is opened: "r+" (default; all three phases) or
        /// "r" (read-only: no write phase).
        #[serde(default = "default_numpy_mode")]
        mode: String,
    },
}

impl Workload {
    /// `Workload::Numpy` is run by bench/numpy_scenario.py (Python), which
    /// reads this JSON; see `numpy_engine`.
    fn python_only(&self) -> WorkloadError {
        WorkloadError::Invalid(
            "the numpy workload runs in bench/numpy_scenario.py (Python), not in this worker"
                .into(),
        )
    }
}

/// Run a workload in this process.
pub fn run_workload(w: &Workload) -> Result<WorkerResult, WorkloadError> {
    match w {
        Workload::MmapRead {
            file,
            threads,
            seed,
            advice,
        } => kernel::mmap_read(file, *threads, *seed, *advice),
        Workload::RandomRead {
            file,
            threads,
            reads_per_thread,
            seed,
            advice,
        } => kernel::random_read(file, *threads, *reads_per_thread, *seed, *advice),
        Workload::MultiFault {
            threads,
            seconds,
            area_bytes,
        } => kernel::multi_fault(*threads, *seconds, *area_bytes),
        Workload::Unmap { bytes, folio_kb } => kernel::unmap(*bytes, *folio_kb),
        Workload::TlbReach { bytes, reads } => kernel::tlb_reach(*bytes, *reads),
        Workload::Usemem {
            threads,
            bytes_per_thread,
            passes,
        } => kernel::usemem(*threads, *bytes_per_thread, *passes),
        Workload::MadviseLoop { iterations } => kernel::madvise_loop(*iterations),
        Workload::AnonFill { bytes, kind } => crate::anon_fill::kernel(*bytes, *kind),
        Workload::Upager {
            budget,
            config,
            job,
        } => upager_workloads::run_job(*budget, config, job),
        Workload::Mixed {
            file,
            threads,
            reads_per_thread,
            writes_per_thread,
            seed,
        } => kernel::mixed(file, *threads, *reads_per_thread, *writes_per_thread, *seed),
        Workload::Numpy { .. } => Err(w.python_only()),
    }
}

fn default_numpy_mode() -> String {
    "r+".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_json_roundtrip() {
        let w = Workload::MultiFault {
            threads: 2,
            seconds: 0.5,
            area_bytes: 2 << 20,
        };
        let s = serde_json::to_string(&w).unwrap();
        assert!(s.contains("\"workload\":\"multi-fault\""), "{s}");
        assert_eq!(serde_json::from_str::<Workload>(&s).unwrap(), w);
    }

    #[test]
    fn in_process_small_runs() {
        let r = run_workload(&Workload::MultiFault {
            threads: 2,
            seconds: 0.1,
            area_bytes: 256 << 10,
        })
        .unwrap();
        assert!(r.ops > 0 && r.minflt > 0, "{r:?}");
        let r = run_workload(&Workload::Usemem {
            threads: 2,
            bytes_per_thread: 4 << 20,
            passes: 2,
        })
        .unwrap();
        assert_eq!((r.ops, r.bad_words), (2048 * 2, 0));
        let r = run_workload(&Workload::Unmap {
            bytes: 8 << 20,
            folio_kb: 4,
        })
        .unwrap();
        assert_eq!(r.ops, 2048);
        let p = std::env::temp_dir().join(format!("upager-bench-wl-{}", std::process::id()));
        crate::pattern::create_pattern_file(&p, 4 << 20, 3).unwrap();
        let r = run_workload(&Workload::MmapRead {
            file: p.clone(),
            threads: 2,
            seed: 3,
            advice: MapAdvice::Sequential,
        })
        .unwrap();
        assert_eq!((r.ops, r.bad_words), (1024, 0));
        let r = run_workload(&Workload::RandomRead {
            file: p.clone(),
            threads: 2,
            reads_per_thread: 1000,
            seed: 3,
            advice: MapAdvice::Random,
        })
        .unwrap();
        assert_eq!((r.ops, r.bad_words), (2000, 0));
        let r = run_workload(&Workload::MmapRead {
            file: p.clone(),
            threads: 2,
            seed: 4,
            advice: MapAdvice::Normal,
        })
        .unwrap();
        assert_eq!(r.bad_words, 1024, "a wrong seed must show up as bad words");
        std::fs::remove_file(p).unwrap();
    }
}
