//! Choosing fault modes: a mode the engine refuses is left out
//! of a run with a note saying why, and the run goes on with the others;
//! under CI=true (`strict`) it is an error. The refusal is real, not
//! mocked inside the suite: a worker executable that answers every job
//! asking for `in-thread` the way an engine without the mode does
//! ("fault mode in-thread: not built yet") and runs every other job in the
//! real worker.
//!
//! Needs root (/dev/userfaultfd for the handlers probe and run): skipped
//! otherwise, a failure under CI=true.

mod common;

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use crate::common::{assert_all_ran, require_root, serial};
    use upager::FaultMode;
    use upager_bench::{
        probe_fault_mode, run_scenario, select_fault_modes_with, BenchError, KernelEngine,
        Scenario, UpagerEngine, WorkerExe,
    };

    /// A worker that refuses in-thread (the engine's own error text) and
    /// hands everything else to the real worker. Removed on drop.
    struct RefusingWorker(PathBuf);

    impl RefusingWorker {
        fn new() -> Self {
            let real = env!("CARGO_BIN_EXE_upager-bench-worker");
            let path = std::env::temp_dir().join(format!(
                "upager-bench-test-refusing-worker-{}",
                std::process::id()
            ));
            let script = format!(
                "#!/bin/sh\n\
                 case \"$*\" in\n\
                 *'\"fault_mode\":\"in-thread\"'*)\n\
                 \techo \"ready $$\"; read go\n\
                 \techo 'error could not build the pager: fault mode in-thread: not built yet'\n\
                 \texit 1;;\n\
                 esac\n\
                 exec '{real}' \"$@\"\n"
            );
            std::fs::write(&path, script).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            RefusingWorker(path)
        }
        fn exe(&self) -> WorkerExe {
            WorkerExe::Binary(self.0.clone())
        }
    }

    impl Drop for RefusingWorker {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_refused_mode_is_left_out_with_a_note() {
        let _g = serial();
        if !require_root("fault-mode probes (/dev/userfaultfd)") {
            return;
        }
        let w = RefusingWorker::new();
        let exe = w.exe();
        let both = [FaultMode::Handlers, FaultMode::InThread];
        let err = probe_fault_mode(&exe, FaultMode::InThread).unwrap_err();
        assert!(err.contains("not built yet"), "{err}");
        probe_fault_mode(&exe, FaultMode::Handlers).unwrap();

        let (modes, notes) = select_fault_modes_with(&exe, &both, false).unwrap();
        assert_eq!(modes, [FaultMode::Handlers]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("fault mode in-thread is not available")
                && notes[0].contains("not built yet"),
            "{notes:?}"
        );

        // Strict (CI=true): a requested mode that cannot run is an error.
        let e = select_fault_modes_with(&exe, &both, true).unwrap_err();
        assert!(
            matches!(
                e,
                BenchError::FaultMode {
                    mode: "in-thread",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("CI=true"), "{e}");
        // Nothing left to run is an error, strict or not.
        assert!(select_fault_modes_with(&exe, &[FaultMode::InThread], false).is_err());

        // The run goes on with handlers, next to the kernel, and says why.
        let mut engines = UpagerEngine::for_modes(&exe, &modes);
        engines.push(Box::new(KernelEngine::with_worker(exe.clone())));
        let mut p = Scenario::MultiFault.tiny();
        p.thread_counts = vec![1];
        p.seconds = 0.1;
        let mut r = run_scenario(Scenario::MultiFault, &p, &engines).unwrap();
        r.notes.extend(notes);
        assert_all_ran(&r);
        let names: Vec<&str> = r.runs.iter().map(|x| x.engine.as_str()).collect();
        assert!(
            names.contains(&"upager handlers") && names.contains(&"kernel"),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n.contains("in-thread")), "{names:?}");
        let t = r.table();
        assert!(
            t.contains("note: fault mode in-thread is not available"),
            "{t}"
        );
    }

    /// With the real worker both modes are there (the in-thread engine has
    /// landed): nothing is left out, even strictly.
    #[test]
    fn both_modes_run_here() {
        let _g = serial();
        if !require_root("fault-mode probes (/dev/userfaultfd)") {
            return;
        }
        let both = [FaultMode::Handlers, FaultMode::InThread];
        let (modes, notes) = select_fault_modes_with(&crate::common::exe(), &both, true).unwrap();
        assert_eq!(modes, both);
        assert!(notes.is_empty(), "{notes:?}");
    }
}
