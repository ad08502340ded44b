#!/usr/bin/env bash
# Sets up and runs upager's main job: `upager demo` (options pass through,
# e.g. --size 4G --budget 512M --folio 256K --threads 2).
set -euo pipefail
cd "$(dirname "$0")/.."
UPAGER_SETUP_PYTHON=0 UPAGER_SETUP_WEED=0 bash scripts/setup.sh
cargo build --release -q -p upager-cli
# cargo builds into $CARGO_TARGET_DIR when it is set (relative to here, the
# repository's root, as for cargo), else ./target.
exec "${CARGO_TARGET_DIR:-target}/release/upager" demo "$@"
