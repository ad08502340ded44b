//! The numpy scenario at its tiny size, end to end: a float64
//! file on ext4 on a RAM block device, the Python driver
//! (bench/numpy_scenario.py) in a memory cgroup, numpy.memmap against
//! upager.open_array with the defaults, with the default folio in each
//! fault mode and with 4 KiB and 64 KiB folios in both; every engine on
//! compressible data (element i = i), a few on incompressible data (random
//! float64s, which zram is checked to store uncompressed). Asserted, not
//! timed:
//! - every engine ran every phase and read exact sums (the driver checks
//!   each slice sum and the gather's sum; a wrong one fails the run);
//! - every phase has a rate and a ratio vs numpy.memmap, in the summary and
//!   the table;
//! - the kernel stayed within its cgroup, upager within its budget, and
//!   upager evicted (the file is 5× the budget);
//! - the fault mode an engine is named after is the one that ran;
//! - the data files are as they were after the runs (the driver restores
//!   what it wrote), and a file with a wrong element fails the run and is
//!   made again before the next one;
//! - zram compresses the compressible file and stores the incompressible
//!   one at full size.
//!
//! Needs root (cgroup, zram, userfaultfd) and a Python that imports numpy
//! and this tree's upager package (`make python`; scripts/test.sh installs
//! it before the Rust tests, or set UPAGER_BENCH_PYTHON): skipped otherwise,
//! a failure under CI=true.

mod common;

#[cfg(test)]
mod tests {
    use crate::common::{
        assert_all_ran, assert_fault_modes_honoured, exe, require_root, serial, skip_or_fail,
    };
    use upager::FaultMode;
    use upager_bench::numpy_engine::check_python;
    use upager_bench::{
        prepare, run_scenario, BenchEnv, DataKind, Engine, EnvConfig, NumpyEngine, Report,
        Scenario, ScenarioParams, UpagerEngine,
    };

    /// zram's `mm_stat` of the environment's device: bytes stored before
    /// compression and after.
    fn zram_sizes(env: &BenchEnv) -> (u64, u64) {
        let dev = env.store.as_ref().unwrap().device();
        let name = dev.trim_start_matches("/dev/");
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/mm_stat")).unwrap();
        let v: Vec<u64> = stat
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        (v[0], v[1])
    }

    /// The environment and the tiny parameters with a data file of each
    /// kind, made one after the other to see what zram made of each: the
    /// compressible one shrinks, the incompressible one does not.
    fn setup() -> Option<(BenchEnv, ScenarioParams)> {
        if !require_root("the numpy scenario (cgroup, zram, /dev/userfaultfd)") {
            return None;
        }
        match check_python() {
            Ok(which) => eprintln!("python: {which}"),
            Err(e) => {
                skip_or_fail(&e);
                return None;
            }
        }
        let env = match BenchEnv::setup(&EnvConfig {
            zram_index: Some(0),
            zram_bytes: 512 << 20,
            swap: None,
            swap_bytes: 0,
        }) {
            Ok(env) => env,
            Err(e @ upager_bench::SetupError::DeviceBusy { .. }) => {
                skip_or_fail(&format!("no free RAM block device: {e}"));
                return None;
            }
            Err(e) => panic!("setup: {e}"),
        };
        let mut p = Scenario::Numpy.tiny();
        p.drop_caches = false;
        p.data_kinds.clear();
        let mut sizes = vec![zram_sizes(&env)];
        for k in DataKind::ALL {
            p.data_kinds.push(k);
            p = prepare(Scenario::Numpy, &p, &env).unwrap();
            sizes.push(zram_sizes(&env));
        }
        let ratio = |i: usize| {
            let ((o0, c0), (o1, c1)) = (sizes[i], sizes[i + 1]);
            (c1 - c0) as f64 / (o1 - o0) as f64
        };
        eprintln!(
            "zram stores compressible data at {:.2}, incompressible at {:.3} of its size",
            ratio(0),
            ratio(1)
        );
        assert!(ratio(0) < 0.5, "compressible data not compressed");
        assert!(ratio(1) > 0.99, "incompressible data compressed");
        Some((env, p))
    }

    /// Every element of each kind's file is as it was made.
    fn assert_files_intact(p: &ScenarioParams) {
        for (kind, file) in &p.data_files {
            let bytes = std::fs::read(file).unwrap();
            assert_eq!(bytes.len() as u64, p.file_bytes);
            let wrong = bytes
                .chunks_exact(8)
                .enumerate()
                .filter(|(i, b)| {
                    f64::from_le_bytes((*b).try_into().unwrap()) != kind.element(*i as u64, p.seed)
                })
                .count();
            assert_eq!(wrong, 0, "{kind}: elements not restored after the runs");
        }
    }

    /// The run's parameters with only `kind`'s variant.
    fn only(p: &ScenarioParams, kind: DataKind) -> ScenarioParams {
        ScenarioParams {
            data_kinds: vec![kind],
            ..p.clone()
        }
    }

    #[test]
    fn numpy_scenario_every_engine_every_phase() {
        let _g = serial();
        let Some((env, p)) = setup() else { return };
        let engines = UpagerEngine::for_modes(&exe(), &[FaultMode::Handlers, FaultMode::InThread]);
        let r = run_scenario(Scenario::Numpy, &only(&p, DataKind::Compressible), &engines).unwrap();
        let spec = Scenario::Numpy.spec();
        for e in spec.engines {
            assert!(r.runs.iter().any(|x| x.engine == *e), "{e} did not run");
        }
        assert_phases_and_bounds(&r, &p);
        assert_files_intact(&p);
        drop(env);
    }

    /// Incompressible data, with the baseline, the defaults, a fault mode
    /// and a read-only engine: the same checks, the rows labelled by kind.
    #[test]
    fn numpy_scenario_incompressible_data() {
        let _g = serial();
        let Some((env, p)) = setup() else { return };
        let engines: Vec<Box<dyn Engine>> = UpagerEngine::for_modes(&exe(), &[FaultMode::InThread])
            .into_iter()
            .filter(|e| {
                [
                    "kernel numpy.memmap",
                    "upager defaults",
                    "upager in-thread 4K",
                    "upager in-thread 4K r",
                ]
                .contains(&e.name().as_str())
            })
            .collect();
        assert_eq!(engines.len(), 4);
        let r = run_scenario(
            Scenario::Numpy,
            &only(&p, DataKind::Incompressible),
            &engines,
        )
        .unwrap();
        assert_phases_and_bounds(&r, &p);
        for run in &r.runs {
            assert_eq!(run.params.data_kind, Some(DataKind::Incompressible));
            assert!(
                run.variant.starts_with("incompressible,"),
                "{}",
                run.variant
            );
        }
        assert!(
            r.table().contains("incompressible,cgroup="),
            "{}",
            r.table()
        );
        assert_files_intact(&p);
        drop(env);
    }

    /// What every numpy run must show: each phase's rate and ratio, the
    /// cgroup and budget kept, upager evicting and flushing, the fault mode
    /// an engine is named after.
    fn assert_phases_and_bounds(r: &Report, p: &ScenarioParams) {
        assert_all_ran(r);
        assert_fault_modes_honoured(r);
        let spec = Scenario::Numpy.spec();
        assert_eq!(r.baseline_engine, "kernel numpy.memmap");
        // Engines ending in " r" open the array read-only: no write phase.
        let read_only = |engine: &str| engine.ends_with(" r");
        for row in &r.summary {
            let phases = spec
                .phases
                .iter()
                .filter(|ph| !read_only(&row.engine) || !ph.name.contains("writes"));
            for ph in phases {
                let rate = row.phases.get(ph.name).copied().unwrap_or(0.0);
                assert!(rate > 0.0, "{}: no rate for {}", row.engine, ph.name);
                assert!(row.phases.contains_key(&format!("{} s", ph.name)));
                assert!(
                    row.phases_vs_kernel.contains_key(ph.name),
                    "{}: no ratio for {}",
                    row.engine,
                    ph.name
                );
            }
            if row.engine == spec.baseline_engine {
                assert_eq!(row.vs_kernel, Some(1.0));
            }
        }
        for run in r.runs.iter() {
            let m = run.measurement.as_ref().unwrap();
            let x = |k: &str| m.extra.get(k).copied().unwrap_or(f64::NAN);
            assert_eq!(x("random_ops"), p.random_ops as f64, "{}", run.engine);
            assert_eq!(x("bytes"), p.file_bytes as f64, "{}", run.engine);
            let peak = m.peak_bytes.expect("the cgroup's peak charge");
            assert!(peak <= p.limit_bytes, "{}: cgroup peak {peak}", run.engine);
            if run.engine.starts_with("upager") {
                let budget = p.upager_budget() as f64;
                assert!(x("upager.resident_peak_bytes") <= budget, "{}", run.engine);
                assert!(
                    x("upager.evictions") > 0.0,
                    "{}: nothing evicted",
                    run.engine
                );
                if !read_only(&run.engine) {
                    assert!(x("upager.flushes") >= 1.0, "{}: no flush", run.engine);
                }
            }
        }
        let t = r.table();
        assert!(
            t.contains("random writes + flush") && t.contains("vs kernel numpy.memmap"),
            "{t}"
        );
        // The read-only engines ran, and measured no write phase.
        for row in r.summary.iter().filter(|row| read_only(&row.engine)) {
            assert!(
                !row.phases.contains_key("random writes + flush"),
                "{}",
                row.engine
            );
        }
        // The JSON keeps the phases (floats need not round-trip bit-exactly).
        let back: Report = serde_json::from_str(&r.to_json().unwrap()).unwrap();
        assert_eq!(back.baseline_engine, r.baseline_engine);
        for (a, b) in back.summary.iter().zip(&r.summary) {
            assert_eq!(
                a.phases.keys().collect::<Vec<_>>(),
                b.phases.keys().collect::<Vec<_>>()
            );
        }
    }

    /// The driver's checks can fail, on either kind of data: with one
    /// element changed, the sequential pass's sum for that slice is wrong,
    /// so the run fails with wrong data, and the engine removes the file so
    /// that the next run starts from a file made anew.
    #[test]
    fn numpy_scenario_detects_a_wrong_element() {
        let _g = serial();
        let Some((env, p)) = setup() else { return };
        let engines: Vec<Box<dyn Engine>> = vec![Box::new(NumpyEngine::memmap())];
        for kind in DataKind::ALL {
            let file = p.data_files[&kind].clone();
            {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
                f.write_all_at(&7.25f64.to_le_bytes(), 8 * 12_345).unwrap();
                f.sync_all().unwrap();
            }
            let r = run_scenario(Scenario::Numpy, &only(&p, kind), &engines).unwrap();
            let err = r.runs[0].error.as_deref().unwrap_or("");
            assert!(err.contains("wrong words"), "{kind}: {:?}", r.runs[0]);
            assert!(!file.exists(), "a failed run removes the data file");
            let r = run_scenario(Scenario::Numpy, &only(&p, kind), &engines).unwrap();
            assert_all_ran(&r);
        }
        assert_files_intact(&p);
        drop(env);
    }
}
