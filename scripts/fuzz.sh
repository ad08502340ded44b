#!/usr/bin/env bash
# Coverage-guided fuzzing of upager's parsers of outside bytes (issue 50
# item 1; docs/fuzzing.md): builds every target of fuzz/ once (libFuzzer
# through the libfuzzer-sys crate, on stable Rust: SanitizerCoverage
# instrumentation through -Cpasses/-Cllvm-args, fuzz/rustc-wrapper.sh;
# libFuzzer itself is C++, built by the crate's build script with the
# system's C++ compiler), then runs each for
# SECONDS (default 5), and the Python targets (fuzz/python, atheris) where
# atheris and the upager package are installed. Prints per target:
# executions, coverage (libFuzzer's cov: edges, ft: features), corpus, and
# crashes; the exit status is non-zero if any target failed.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Seeds: fuzz/corpus/TARGET (in the repository, real files' bytes). What a
# run adds goes to $UPAGER_FUZZ_TARGET_DIR/corpus/TARGET, so repeated runs
# go on from there; a crash's input to $UPAGER_FUZZ_TARGET_DIR/artifacts/.
# UPAGER_FUZZ_TARGET_DIR defaults to fuzz/target: the fuzz crate is not in
# the workspace and builds apart from it (other flags; no rebuild of the
# workspace's target/). Under CI=true a Python target that cannot run
# fails instead of being skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
shift || true
root=$PWD
out=${UPAGER_FUZZ_TARGET_DIR:-$root/fuzz/target}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rust_targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^upager-fuzz$')
py_targets=$(cd fuzz/python 2>/dev/null && ls *.py 2>/dev/null | sed 's/\.py$//' || true)
if [ $# -gt 0 ]; then
    want=" $* "
    rust_targets=$(for t in $rust_targets; do [[ $want == *" $t "* ]] && echo "$t"; done || true)
    py_targets=$(for t in $py_targets; do [[ $want == *" $t "* ]] && echo "$t"; done || true)
fi

if [ -n "$rust_targets" ]; then
    if ! command -v c++ >/dev/null && ! command -v g++ >/dev/null; then
        echo "fuzz.sh: libfuzzer-sys builds libFuzzer with a C++ compiler: install g++" >&2
        exit 1
    fi
    # The coverage instrumentation and assertions are added by
    # fuzz/rustc-wrapper.sh to this repository's crates only.
    t0=$SECONDS
    (cd fuzz && CARGO_TARGET_DIR=$out RUSTC_WRAPPER=$root/fuzz/rustc-wrapper.sh \
        cargo build --quiet --release --bins)
    echo "fuzz.sh: built in $(( SECONDS - t0 )) s"
    bin=$out/release
fi

# One target's line: executions, coverage (cov, ft), corpus, and the
# result; a failure (exit `rc`) names the first line of its log matching
# `why` and the input that made it, and fails the run.
report() {
    local t=$1 log=$2 rc=$3 why=$4 execs last cov ft corp result art
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -a -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    if [ "$rc" -eq 0 ]; then
        result="ok, 0 crashes"
    else
        status=1
        why=$(grep -a -m1 -E "$why" "$log" || echo "exit $rc")
        art=$(ls -t "$out/artifacts/$t/" 2>/dev/null | head -1)
        result="FAILED: $why${art:+ (input: $out/artifacts/$t/$art)}; log $log"
    fi
    printf '%-18s %12s %6s %7s %7s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
}

status=0
printf '%-18s %12s %6s %7s %7s %s\n' target executions cov ft corpus result
for t in $rust_targets; do
    mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
    log=$out/$t.log
    rc=0
    # -malloc_limit_mb: no input of at most 4 KiB may make a parser
    # allocate 64 MiB at once (a length field believed).
    "$bin/$t" -max_total_time="$secs" -max_len=4096 -timeout=10 \
        -malloc_limit_mb=64 -rss_limit_mb=1024 -print_final_stats=1 \
        -artifact_prefix="$out/artifacts/$t/" \
        "$out/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
    report "$t" "$log" $rc 'SUMMARY|panicked at|ERROR: libFuzzer'
done

for t in $py_targets; do
    log=$out/$t.log
    if ! python3 -c 'import atheris, upager' 2>/dev/null; then
        msg="skipped: atheris or the upager package is not installed (pip install -r python/requirements-dev.txt; make python)"
        if [ "${CI:-}" = true ]; then status=1; msg="FAILED: $msg"; fi
        printf '%-18s %12s %6s %7s %7s %s\n' "$t" - - - - "$msg"
        continue
    fi
    mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
    rc=0
    python3 "fuzz/python/$t.py" -max_total_time="$secs" -max_len=4096 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" \
        "$out/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
    report "$t" "$log" $rc 'SUMMARY|Uncaught Python exception|ERROR'
done
exit $status

