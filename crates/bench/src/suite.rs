//! Running the suite: [`prepare`] makes a scenario's data file on the
//! environment's RAM device, [`run_scenario`] runs every engine on every
//! variant in interleaved rounds and returns a [`Report`].

use std::path::PathBuf;

use crate::engine::{BenchError, Engine};
use crate::env::{drop_caches, BenchEnv};
use crate::host::is_root;
use crate::pattern::{ensure_data_file, DataFile};
use crate::report::{interleaved, Report, RunRecord};
use crate::scenario::{Scenario, ScenarioParams};

/// Create the data file a file scenario needs on the environment's RAM
/// device (reused if it already has the right size), and set `data_file`;
/// with `data_kinds` (numpy), one file per kind, in `data_files`.
pub fn prepare(
    scenario: Scenario,
    params: &ScenarioParams,
    env: &BenchEnv,
) -> Result<ScenarioParams, BenchError> {
    let sc = scenario.spec();
    let mut p = params.clone();
    if sc.needs_file() && p.data_file.is_none() && p.data_kinds.is_empty() {
        let file = data_file_path(sc.data, &p, env);
        ensure_data_file(sc.data, p.file_bytes, p.seed, &file)?;
        p.data_file = Some(file);
    }
    // numpy: one file per kind of data, each variant reads its kind's.
    for kind in p.data_kinds.clone() {
        if !p.data_files.contains_key(&kind) {
            let file = data_file_path(kind.file(), &p, env);
            ensure_data_file(kind.file(), p.file_bytes, p.seed, &file)?;
            p.data_files.insert(kind, file);
        }
    }
    if sc.needs_swap && p.swap_dir.is_none() && env.store.is_some() {
        p.swap_dir = Some(env.data_dir());
    }
    Ok(p)
}

/// Where [`prepare`] puts a data file of kind `data` in `env`
/// ([`DataFile::file_name`]: by kind, size and seed, so scenarios that
/// share a file reuse it).
pub fn data_file_path(data: DataFile, p: &ScenarioParams, env: &BenchEnv) -> PathBuf {
    env.data_dir().join(data.file_name(p.file_bytes, p.seed))
}

/// Run `scenario` with `params` on every engine that supports it:
/// for each variant, `params.rounds` rounds of A B C … (interleaved, so slow
/// drift of the machine hits every engine alike), caches dropped before each
/// run (root). Per-run failures are recorded in the report, not fatal.
pub fn run_scenario(
    scenario: Scenario,
    params: &ScenarioParams,
    engines: &[Box<dyn Engine>],
) -> Result<Report, BenchError> {
    let sc = scenario.spec();
    let variants = scenario.variants(params);
    if sc.needs_file() && variants.iter().any(|v| v.data_file.is_none()) {
        return Err(BenchError::NoDataFile(scenario));
    }
    let engines: Vec<&dyn Engine> = engines
        .iter()
        .map(|e| e.as_ref())
        .filter(|e| e.supports(scenario))
        .collect();
    let rounds = params.rounds.max(1);
    let mut runs = Vec::new();
    let total = variants.len() * rounds * engines.len();
    let mut n = 0;
    for v in &variants {
        for (round, idx) in interleaved(rounds, engines.len()) {
            let e = engines[idx];
            n += 1;
            if params.drop_caches && is_root() {
                if let Err(err) = drop_caches() {
                    eprintln!("upager-bench: drop_caches: {err}");
                }
            }
            let r = e.run(scenario, v);
            match &r {
                Ok(m) => eprintln!(
                    "[{n}/{total}] {scenario} {} {} round {}: {} = {:.4}",
                    v.variant,
                    e.name(),
                    round + 1,
                    sc.metric.label(),
                    sc.metric.of(m)
                ),
                Err(err) => eprintln!(
                    "[{n}/{total}] {scenario} {} {} round {}: FAILED: {err}",
                    v.variant,
                    e.name(),
                    round + 1
                ),
            }
            runs.push(RunRecord {
                engine: e.name(),
                variant: v.variant.clone(),
                round,
                params: v.clone(),
                measurement: r.as_ref().ok().cloned(),
                error: r.err().map(|e| e.to_string()),
            });
        }
    }
    Ok(Report::new(scenario, params, runs))
}
