#!/bin/sh
# The full benchmark run behind docs/benchmarks.md: every scenario of
# `upager bench` (and residency) at default sizes, kernel and upager engines
# interleaved, 3 rounds each; results to
# bench/results/<date>-suite/<scenario>.json and .png, then the Markdown
# tables. Needs root (a memory cgroup, v2 or v1; zram, swap, tracefs,
# /dev/userfaultfd), and for the numpy scenario a python3 (or
# $UPAGER_BENCH_PYTHON) with numpy and this tree's upager package
# (`make python`). About 30 minutes on a 2-vCPU guest.
set -eu
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p upager-cli
out=bench/results/$(date -u +%F)-suite
"$target/release/upager" bench all --out "$out" "$@"
python3 bench/md_table.py "$out"/*.json
