//! Every scenario at a tiny size with the upager engines next to the kernel,
//! through real worker processes (zram ext4, cgroup for the kernel, swap
//! device, tracepoint), to prove the suite works end to end. No timing is
//! asserted; counts are, where they mean something:
//! - every run succeeds and reads correct data (the workloads check every
//!   word; a wrong word fails the run);
//! - mmap-read with clean pages: upager's default engine sends ≤ 2 TLB
//!   shootdowns per 1000 evicted pages, and batch=1 sends many more;
//! - upager never exceeds its budget (resident peak);
//! - `upager in-thread` resolved its faults in the faulting thread and
//!   `upager handlers` (and every ablation) did not;
//! - random-read and multi-fault report the latency distribution of every
//!   engine, kernel and upager alike, from every timed access;
//! - residency: upager's answer distinguishes evicted from never touched,
//!   /proc/self/pagemap does not.
//!
//! Needs root (userfaultfd, cgroup, zram, tracefs): skipped otherwise, a
//! failure under CI=true. Tests take one lock: they share the RAM device.

mod common;

#[cfg(test)]
mod tests {
    use crate::common::{
        assert_all_ran, assert_fault_modes_honoured, exe, require_root, serial, skip_or_fail,
    };
    use upager_bench::latency::MULTI_FAULT_SAMPLE_EVERY;
    use upager_bench::workloads::MapAdvice;
    use upager_bench::{
        prepare, run_scenario, BenchEnv, Engine, EnvConfig, KernelEngine, Report, Scenario,
        ScenarioParams, SwapKind, UpagerEngine,
    };

    fn engines() -> Vec<Box<dyn Engine>> {
        let mut v: Vec<Box<dyn Engine>> = vec![
            Box::new(KernelEngine::with_worker(exe())),
            Box::new(KernelEngine::with_worker(exe()).with_advice(MapAdvice::Random)),
            Box::new(KernelEngine::with_worker(exe()).with_advice(MapAdvice::Sequential)),
        ];
        v.extend(UpagerEngine::all(&exe()));
        v
    }

    fn skip() -> bool {
        !require_root("upager engines (/dev/userfaultfd, cgroup, zram, tracefs)")
    }

    fn tiny(sc: Scenario) -> ScenarioParams {
        let mut p = sc.tiny();
        p.drop_caches = false;
        p
    }

    /// The RAM device (zram0, or a hot-added zram device when zram0 is
    /// busy) and swap; `None` (skip, or fail under CI) when neither zram0
    /// nor a hot-added device can be had.
    fn env(file: bool, swap: bool) -> Option<BenchEnv> {
        match BenchEnv::setup(&EnvConfig {
            zram_index: Some(0),
            zram_bytes: 192 << 20,
            swap: swap.then_some(SwapKind::ZramHotAdd),
            swap_bytes: 128 << 20,
        }) {
            Ok(env) => Some(env),
            Err(e @ upager_bench::SetupError::DeviceBusy { .. }) => {
                skip_or_fail(&format!("no free RAM block device: {e}"));
                None
            }
            Err(e) => panic!("setup (file={file}): {e}"),
        }
    }

    /// Every engine of the report timed its accesses: `samples` of them,
    /// p50 ≤ p99 ≤ max, all above zero.
    fn assert_latency(r: &Report, samples: impl Fn(&upager_bench::Measurement) -> u64) {
        for run in &r.runs {
            let m = run.measurement.as_ref().unwrap();
            let l = m
                .latency
                .as_ref()
                .unwrap_or_else(|| panic!("{}: no latency", run.engine));
            assert_eq!(l.samples, samples(m), "{}: {l:?}", run.engine);
            assert!(
                0.0 < l.p50_ns && l.p50_ns <= l.p99_ns && l.p99_ns <= l.max_ns,
                "{}: {l:?}",
                run.engine
            );
            assert_eq!(l.buckets.iter().map(|b| b[1]).sum::<u64>(), l.samples);
        }
        for row in &r.summary {
            assert!(
                row.latency_p50_ns.is_some() && row.latency_p99_ns.is_some(),
                "{row:?}"
            );
        }
        let t = r.table();
        assert!(t.contains("p50 µs") && t.contains("p99 µs"), "{t}");
    }

    fn run(name: Scenario, p: &ScenarioParams) -> Report {
        let r = run_scenario(name, p, &engines()).unwrap();
        assert_all_ran(&r);
        for run in &r.runs {
            let m = run.measurement.as_ref().unwrap();
            if run.engine.starts_with("upager") && name != Scenario::Residency {
                let peak = m.peak_bytes.expect("upager reports its resident peak");
                let budget = if name == Scenario::UnmapFolio {
                    p.region_bytes + (64 << 20)
                } else {
                    p.limit_bytes
                };
                assert!(
                    peak <= budget,
                    "{}: peak {peak} > budget {budget}",
                    run.engine
                );
            }
        }
        for e in name.spec().engines {
            assert!(
                r.runs.iter().any(|x| x.engine == *e),
                "engine {e} listed for {name} did not run"
            );
        }
        assert_fault_modes_honoured(&r);
        r
    }

    fn m<'a>(r: &'a Report, engine: &str) -> &'a upager_bench::Measurement {
        r.runs
            .iter()
            .find(|x| x.engine == engine)
            .and_then(|x| x.measurement.as_ref())
            .unwrap()
    }

    #[test]
    fn mmap_read_batches_shootdowns() {
        let _g = serial();
        if skip() {
            return;
        }
        let Some(env) = env(true, false) else { return };
        // Larger than the registry's tiny size, so the few flushes that are
        // not evictions (thread start, region teardown) do not dominate: with
        // a 64 MiB file one run in eight measured 2.02 sends per 1000 evicted
        // pages; with 128 MiB 16 runs measured 1.38-1.56 (~1.5 per 1024-page
        // batch: one process_madvise per batch, plus the munmaps of fill
        // buffers and the exit). Three rounds, the median asserted: one CI
        // run measured 2.68 in its one round where every other upager
        // variant measured 1.2-1.5.
        let p = ScenarioParams {
            file_bytes: 128 << 20,
            limit_bytes: 8 << 20,
            rounds: 3,
            ..tiny(Scenario::MmapRead)
        };
        let p = prepare(Scenario::MmapRead, &p, &env).unwrap();
        let r = run(Scenario::MmapRead, &p);
        let runs = |engine: &str| -> Vec<&upager_bench::Measurement> {
            r.runs
                .iter()
                .filter(|x| x.engine == engine)
                .filter_map(|x| x.measurement.as_ref())
                .collect()
        };
        // Sends of upager's own system calls: direct reclaim or compaction
        // that the kernel ran on one of its threads (other processes' pages,
        // the machine's memory pressure) is not upager's batching.
        let own_per_1k = |m: &upager_bench::Measurement| -> f64 {
            let origin = m.tlb_sends_by_origin.as_ref().expect("sends by origin");
            let kernel: u64 = upager_bench::tracing::KERNEL_WORK
                .iter()
                .filter_map(|o| origin.get(*o))
                .sum();
            let evicted = m.evicted_pages.unwrap();
            assert!(evicted >= 16384, "file 16× the budget must evict: {m:?}");
            (m.tlb_sends.unwrap() - kernel) as f64 * 1000.0 / evicted as f64
        };
        let up = runs("upager handlers");
        assert_eq!(up.len(), 3);
        let mut per1k: Vec<f64> = up.iter().map(|m| own_per_1k(m)).collect();
        per1k.sort_by(f64::total_cmp);
        let by_origin: Vec<_> = up.iter().map(|m| &m.tlb_sends_by_origin).collect();
        assert!(
            per1k[1] <= 2.0,
            "upager: median {:.2} sends per 1000 evicted pages (rounds {per1k:.2?}; by origin {by_origin:?})",
            per1k[1]
        );
        // batch=1 evicts folio by folio: one process_madvise (one flush) each.
        let b1 = runs("upager batch=1");
        for (b, u) in b1.iter().zip(&up) {
            assert!(
                b.tlb_sends.unwrap() > 4 * u.tlb_sends.unwrap().max(1),
                "batch=1 {:?} vs default {:?}",
                b.tlb_sends,
                u.tlb_sends
            );
        }
        drop(env);
    }

    #[test]
    fn random_read() {
        let _g = serial();
        if skip() {
            return;
        }
        let Some(env) = env(true, false) else { return };
        let p = prepare(Scenario::RandomRead, &tiny(Scenario::RandomRead), &env).unwrap();
        let r = run(Scenario::RandomRead, &p);
        let reads = p.reads_per_thread * p.threads as u64;
        for e in ["upager handlers", "upager in-thread"] {
            assert_eq!(m(&r, e).ops, reads, "{e}");
            assert_eq!(m(&r, e).extra["folio_kb"], 4.0, "{e}: 4 KiB folios");
        }
        // Every read is timed, on every engine.
        assert_latency(&r, |_| reads);
        drop(env);
    }

    #[test]
    fn multi_fault() {
        let _g = serial();
        if skip() {
            return;
        }
        let r = run(Scenario::MultiFault, &tiny(Scenario::MultiFault));
        // Faults are counted in whole 2 MiB areas.
        assert_eq!(m(&r, "upager handlers").ops % 512, 0);
        assert_eq!(m(&r, "upager in-thread").ops % 512, 0);
        // One fault in MULTI_FAULT_SAMPLE_EVERY is timed, on every engine.
        assert_latency(&r, |m| m.ops / MULTI_FAULT_SAMPLE_EVERY as u64);
    }

    #[test]
    fn unmap_folio() {
        let _g = serial();
        if skip() {
            return;
        }
        let p = tiny(Scenario::UnmapFolio);
        let r = run(Scenario::UnmapFolio, &p);
        let up = m(&r, "upager");
        assert_eq!(up.ops, p.region_bytes / 4096);
        assert_eq!(
            up.extra["resident_before"] as u64, p.region_bytes,
            "the region was fully resident before unmap"
        );
    }

    #[test]
    fn swap() {
        let _g = serial();
        if skip() {
            return;
        }
        let Some(env) = env(false, true) else { return };
        let p = prepare(Scenario::Swap, &tiny(Scenario::Swap), &env).unwrap();
        assert!(
            p.swap_dir.is_some(),
            "upager's swap files go on the zram ext4"
        );
        let r = run(Scenario::Swap, &p);
        for e in ["upager handlers", "upager in-thread", "upager unbatched"] {
            let x = m(&r, e);
            assert!(
                x.evicted_pages.unwrap() > 0,
                "{e}: 2× the budget must swap: {x:?}"
            );
        }
        let acq = |e: &str| m(&r, e).extra["upager.reclaim_lock_acquisitions"];
        let batches = m(&r, "upager handlers").extra["upager.evict_batches"];
        assert!(acq("upager handlers") <= 2.0 * batches + 2.0);
        assert!(acq("upager unbatched") > acq("upager handlers"));
        drop(env);
    }

    #[test]
    fn residency() {
        let _g = serial();
        if skip() {
            return;
        }
        let p = tiny(Scenario::Residency);
        let r = run(Scenario::Residency, &p);
        let pages = (p.region_bytes / 4096) as f64;
        let up = m(&r, "upager pagemap");
        assert_eq!(up.extra["present_pages"], pages / 4.0);
        assert_eq!(
            up.extra["swapped_pages"],
            pages / 4.0,
            "evicted = in the store"
        );
        let k = m(&r, "kernel");
        assert_eq!(k.extra["present_pages"], pages / 4.0);
        assert_eq!(
            k.extra["swapped_pages"], 0.0,
            "the kernel's pagemap cannot see upager's evicted pages"
        );
        // 3 runs per 4 MiB group (resident, evicted, never touched).
        assert_eq!(
            m(&r, "upager residency").extra["runs"],
            3.0 * (p.region_bytes >> 22) as f64
        );
    }
}
