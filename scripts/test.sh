#!/usr/bin/env bash
# Sets up and runs the whole test suite: Rust unit and integration tests
# (engine, reliability, benchmarks at tiny sizes), the C API tests and the
# Python tests. Needs root (userfaultfd device, tracefs, cgroups, zram).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
status=0
run() { echo "== $*"; "$@" || status=1; }
run cargo test --workspace --quiet
if grep -q '^test-c:' Makefile 2>/dev/null; then run make -s test-c; fi
if grep -q '^test-python:' Makefile 2>/dev/null; then run make -s python && run make -s test-python; fi
if [ $status -ne 0 ]; then echo "test.sh: FAILED"; else echo "test.sh: all suites passed"; fi
exit $status
