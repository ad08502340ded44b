#!/usr/bin/env bash
# RUSTC_WRAPPER of the fuzz build (scripts/fuzz.sh): libFuzzer's coverage
# instrumentation (SanitizerCoverage, through -Cpasses and -Cllvm-args,
# which stable rustc accepts) and overflow and debug assertions for the
# crates of this repository (upager's crates and the fuzz targets) only,
# not for build scripts (which could not link without libFuzzer's
# callbacks; RUSTFLAGS would reach them unless every build passed
# --target). The dependencies build as usual: the parsers are upager's,
# and coverage counts their code alone.
rustc=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
src=
build_script=0
for a in "$@"; do
    case "$a" in
    *.rs) [ -z "$src" ] && src=$a ;;
    build_script_build) build_script=1 ;;
    esac
done
case "$src" in /*) ;; *) src=$PWD/$src ;; esac
if [ $build_script = 0 ] && [[ $src == "$root"/crates/* || $src == "$root"/fuzz/fuzz_targets/* ]]; then
    exec "$rustc" "$@" --cfg fuzzing -Cpasses=sancov-module \
        -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares \
        -Cdebug-assertions=on -Coverflow-checks=on
fi
exec "$rustc" "$@"
