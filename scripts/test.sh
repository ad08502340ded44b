#!/usr/bin/env bash
# Sets up and runs the whole test suite: format and lint checks, Rust unit
# and integration tests (engine, reliability, benchmarks at tiny sizes), the
# C API tests and the Python tests. Needs root (userfaultfd device, tracefs,
# cgroups, zram). Under CI=true a test that cannot run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
status=0
run() { echo "== $*"; "$@" || status=1; }
# What the code claims, enforced: formatting and lints first (the Python
# extension is a crate of its own, outside the workspace).
run cargo fmt --all -- --check
run cargo fmt --manifest-path python/Cargo.toml -- --check
run cargo clippy --workspace --all-targets --quiet -- -D warnings
# The Python package before the Rust tests: the numpy benchmark's test
# (crates/bench/tests/numpy.rs) drives this tree's package through python3.
python_ok=0
if grep -q '^python:' Makefile 2>/dev/null; then
  echo "== make -s python"
  if make -s python; then python_ok=1; else status=1; fi
fi
run cargo test --workspace --quiet
# The engine's suite once more in the other fault mode (the default is
# handlers): the same tests, faults resolved in the faulting thread.
run env UPAGER_FAULT_MODE=in-thread cargo test -p upager --quiet
if grep -q '^test-c:' Makefile 2>/dev/null; then
    run make -s test-c
    # The C API and the UMap drop-in's tests in the in-thread mode too.
    run env UPAGER_FAULT_MODE=in-thread make -s test-c
fi
if grep -q '^test-python:' Makefile 2>/dev/null && [ $python_ok = 1 ]; then
    run make -s test-python
    run env UPAGER_FAULT_MODE=in-thread make -s test-python
fi
if [ $status -ne 0 ]; then echo "test.sh: FAILED"; else echo "test.sh: all suites passed"; fi
exit $status
