//! Each kernel workload at a tiny size, through the real worker process (and,
//! as root, the memory cgroup, zram ext4, swap device and tracepoint), to
//! prove the pipeline works. No timing is asserted.

mod common;

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::common::{assert_all_ran, exe, serial};
    use upager_bench::env::{self, is_root};
    use upager_bench::{
        run_scenario, run_worker, BenchEnv, Engine, EnvConfig, KernelEngine, RunOptions, Scenario,
        ScenarioParams, SwapKind, Target, TlbCounter, Workload,
    };

    fn engines() -> Vec<Box<dyn Engine>> {
        vec![Box::new(KernelEngine::with_worker(exe()))]
    }

    fn tiny(sc: Scenario) -> ScenarioParams {
        let mut p = sc.tiny();
        p.drop_caches = false; // machine-wide; not needed to prove the pipeline
        p
    }

    /// mmap-read and random-read share one zram ext4 (as root: zram0, or a
    /// hot-added device when zram0 is busy) or use a file in the temp dir
    /// (not root: no cgroup, no eviction). As root the file is never in the
    /// temp dir: read through an 8 MiB cgroup from a disk file system the
    /// kernel's random-read was OOM-killed.
    #[test]
    fn file_scenarios() {
        let _g = serial();
        let env = if is_root() {
            Some(
                BenchEnv::setup(&EnvConfig {
                    zram_index: Some(0),
                    zram_bytes: 128 << 20,
                    swap: None,
                    swap_bytes: 0,
                })
                .unwrap(),
            )
        } else {
            eprintln!("not root: data file in the temp dir, no cgroup");
            None
        };
        for name in [Scenario::MmapRead, Scenario::RandomRead] {
            let mut p = tiny(name);
            if let Some(env) = &env {
                p = upager_bench::prepare(name, &p, env).unwrap();
            } else {
                let f = std::env::temp_dir()
                    .join(format!("upager-bench-{}-it-{name}", std::process::id()));
                env::create_pattern_file(&f, p.file_bytes, p.seed).unwrap();
                p.data_file = Some(f);
            }
            let r = run_scenario(name, &p, &engines()).unwrap();
            assert_all_ran(&r);
            let m = r.runs[0].measurement.as_ref().unwrap();
            if env.is_some() {
                // File 4-8× the limit: the cgroup must have evicted pages and
                // stayed within its limit.
                assert!(m.evicted_pages.unwrap_or(0) > 0, "{m:?}");
                assert!(m.peak_bytes.unwrap() <= p.limit_bytes, "{m:?}");
                assert!(m.tlb_sends.is_some());
            } else {
                let _ = std::fs::remove_file(p.data_file.unwrap());
            }
        }
    }

    #[test]
    fn multi_fault() {
        let _g = serial();
        let r = run_scenario(
            Scenario::MultiFault,
            &tiny(Scenario::MultiFault),
            &engines(),
        )
        .unwrap();
        assert_all_ran(&r);
        assert_eq!(r.summary.len(), 2);
    }

    #[test]
    fn unmap_folio() {
        let _g = serial();
        let mut p = tiny(Scenario::UnmapFolio);
        if !is_root() {
            eprintln!("not root: only 4 KiB pages (mTHP knobs need root)");
            p.folio_sizes_kb = vec![4];
        }
        let r = run_scenario(Scenario::UnmapFolio, &p, &engines()).unwrap();
        assert_all_ran(&r);
    }

    #[test]
    fn swap() {
        let _g = serial();
        if !is_root() {
            eprintln!("skipped: the swap scenario needs root (swap device + cgroup)");
            return;
        }
        let env = BenchEnv::setup(&EnvConfig {
            zram_index: None,
            zram_bytes: 0,
            swap: Some(SwapKind::ZramHotAdd),
            swap_bytes: 64 << 20,
        })
        .unwrap();
        let r = run_scenario(Scenario::Swap, &tiny(Scenario::Swap), &engines()).unwrap();
        assert_all_ran(&r);
        let m = r.runs[0].measurement.as_ref().unwrap();
        assert!(
            m.evicted_pages.unwrap_or(0) > 0,
            "anonymous memory 2× the limit must have been swapped: {m:?}"
        );
        drop(env);
    }

    /// The tracepoint counter sees the remote flushes of a 2-thread process
    /// that discards pages while its other thread runs on the other CPU; a
    /// second, concurrent counter (its own tracefs instance) sees them too.
    #[test]
    fn tlb_counter_counts_remote_flushes() {
        let _g = serial();
        if !is_root() || !Path::new("/sys/kernel/tracing").exists() {
            eprintln!("skipped: needs root and tracefs");
            return;
        }
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            eprintln!("skipped: needs 2 CPUs for remote flushes");
            return;
        }
        let outer = TlbCounter::start(Target::ThisProcess).unwrap();
        let iterations = 2000;
        let run = run_worker(
            &exe(),
            &Workload::MadviseLoop { iterations },
            &RunOptions {
                cgroup_limit: None,
                trace_tlb: true,
                ..Default::default()
            },
        )
        .unwrap();
        let outer = outer.stop().unwrap();
        let inner = run.tlb.unwrap();
        println!(
            "worker: {inner:?}\nouter: {outer:?}\nirq: {:?}",
            run.tlb_irq
        );
        // Each discard of a page mapped while the spinner holds the mm on the
        // other CPU sends one IPI; allow for the spinner being preempted by
        // other load on a shared machine (never below a quarter).
        assert!(inner.remote_sends() >= iterations / 4, "{inner:?}");
        assert!(inner.remote_sends() <= iterations + 100, "{inner:?}");
        // The outer counter follows children (event-fork) and so includes
        // the worker's events.
        assert!(
            outer.remote_sends() >= inner.remote_sends(),
            "{outer:?} vs {inner:?}"
        );
    }
}
