#!/usr/bin/env bash
# Runs the engine's tests (crates/upager: its unit tests and tests/*.rs)
# once more, each test binary behind a command prefix, from the workspace's
# test build:
#
#   scripts/engine-tests.sh env UPAGER_FAULT_MODE=in-thread
#   scripts/engine-tests.sh target/release/upager-confine --deny process_madvise -- env X=1
#
# Why not `cargo test -p upager`: cargo resolves features per command, and
# the engine alone asks for fewer features of its dependencies (libc, syn)
# than the workspace does, so `-p upager` after `cargo test --workspace`
# compiles the engine and most of its dependencies a second time (~3 min
# of a cold CI run). The binaries here are the workspace's, built already.
#
# Each binary runs in crates/upager (as cargo test runs it); the exit status
# is non-zero if any binary failed. Doctests are not rerun.
set -euo pipefail
# A prefix that starts with a path is run from crates/upager: make it absolute.
if [ $# -gt 0 ] && [[ $1 == */* ]] && [ -e "$1" ]; then set -- "$(realpath "$1")" "${@:2}"; fi
cd "$(dirname "$0")/.."
# The build first, on its own: its exit status is lost in a process
# substitution, and a failed build must fail this script, not run the
# binaries that happened to build.
artifacts=$(mktemp)
trap 'rm -f "$artifacts"' EXIT
if ! cargo test --workspace --no-run --quiet --message-format=json >"$artifacts"; then
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-message" and m["message"].get("rendered"):
        sys.stderr.write(m["message"]["rendered"])
' "$artifacts" || true
  echo "engine-tests: FAILED: cargo test --workspace --no-run" >&2
  exit 1
fi
list=$(
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["manifest_path"].endswith("crates/upager/Cargo.toml")
            and m["target"]["kind"] in (["lib"], ["test"])):
        print(m["executable"])
' "$artifacts"
)
[ -n "$list" ] || { echo "engine-tests: no test binaries of crates/upager found" >&2; exit 1; }
mapfile -t bins <<<"$list"
status=0
for bin in "${bins[@]}"; do
  echo "-- $(basename "$bin")"
  (cd crates/upager && "$@" "$bin" --quiet) || { echo "engine-tests: FAILED: $(basename "$bin")" >&2; status=1; }
done
exit $status
