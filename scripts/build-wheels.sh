#!/usr/bin/env bash
# Builds the Python package's wheels for other Linux machines: one per
# CPython 3.9-3.13 found (python3.X on PATH, or under ~/.pyenv/versions),
# tagged manylinux_2_34 (glibc 2.34 or later: Debian 12+, Ubuntu 22.04+,
# RHEL 9+, ...; the library uses glibc 2.30-2.34 symbols). maturin checks
# the library against that policy (the auditwheel rules: glibc symbol
# versions, allowed shared libraries) and refuses to tag a wheel that
# breaks it. Stripped, with both license files
# and the README (python/pyproject.toml). Output: $CARGO_TARGET_DIR/wheels/dist
# (default ./target/wheels/dist).
#
#   bash scripts/build-wheels.sh            # or: make wheels
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-$PWD/target}/wheels/dist"
interpreters=()
for v in 3.9 3.10 3.11 3.12 3.13; do
    p=""
    # A pyenv shim on PATH may not run (its version not selected): try each
    # candidate.
    for c in $(command -v "python$v" || true) \
             $(ls -d "$HOME"/.pyenv/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r); do
        if "$c" -c 'import sys' 2>/dev/null; then p=$c; break; fi
    done
    if [ -n "$p" ]; then interpreters+=("$p"); else echo "build-wheels: no python$v here, skipped"; fi
done
if [ ${#interpreters[@]} -eq 0 ]; then
    echo "build-wheels: no CPython 3.9-3.13 found" >&2; exit 1
fi
mkdir -p "$out"
rm -f "$out"/upager-*.whl
python3 -m maturin build --release -m python/Cargo.toml --compatibility manylinux_2_34 \
    -o "$out" -i "${interpreters[@]}"
ls -l "$out"
