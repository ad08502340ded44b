//! `upager-bench-worker <workload> [--json '{…}' | --key value …] [--wait-go]`:
//! runs one kernel workload of the benchmark suite in this process and prints
//! `result <json>`. Started by `upager_bench::worker::run_worker`, which puts
//! it into a memory cgroup before sending `go`; also usable by hand, e.g.
//! `upager-bench-worker multi-fault --threads 2 --seconds 1 --area-bytes 2097152`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    upager_bench::worker::worker_main(&args)
}
