#!/usr/bin/env bash
# upager as an ordinary user (issue 28): no access to /dev/userfaultfd, no
# privilege, no setup. Run as root on a built tree (scripts/test.sh runs it
# after the other suites): creates the account upager-user if missing
# (UPAGER_TEST_USER names another), then runs as it
#   1. the demo, with the defaults (upager opens a user-mode-only
#      userfaultfd and picks the in-thread mode) and in the handlers mode;
#   2. the Python face: memmap write / flush / verify in both fault modes,
#      Pager.info(), tofile and numpy.save from non-resident pages;
#   3. the C API and UMap drop-in suites (crates/capi/tests/run.sh, built by
#      the user with gcc against the prefix `make test-c` installed);
#   4. the Python suite (python/tests).
# When the user cannot import upager, numpy and pytest from the venv below,
# 2 and 4 fail with the reason (they are not dropped); a tree without a
# wheel skips them, and fails under CI=true.
# Python: an ordinary user cannot use root's interpreter when it lives under
# /root (pyenv), so the user gets a virtual environment of the system's
# python3 (UPAGER_UNPRIV_PYTHON names another) with numpy, pytest,
# safetensors and the wheel `make python` built, in $TARGET/unpriv-venv
# (made once, by root, readable by all).
# The user's checks must see a user-mode-only userfaultfd; if this machine
# gives ordinary users more (vm.unprivileged_userfaultfd = 1), the run says
# so and fails under CI=true. Exit status 0 when every part passed.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
USER_NAME=${UPAGER_TEST_USER:-upager-user}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
UPAGER=$TARGET/release/upager
BASE_PYTHON=${UPAGER_UNPRIV_PYTHON:-/usr/bin/python3}
VENV=$TARGET/unpriv-venv
PYTHON=$VENV/bin/python
failed=()
passed=0

if [ "$(id -u)" -ne 0 ]; then
    echo "test-unprivileged: run as root (it creates and switches to $USER_NAME)" >&2
    exit 1
fi
if [ "$(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null)" = 1 ]; then
    echo "test-unprivileged: vm.unprivileged_userfaultfd is 1: ordinary users get every userfaultfd here" >&2
    [ "${CI:-}" = true ] && exit 1
fi
if ! id -u "$USER_NAME" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME" || exit 1
fi
[ -x "$UPAGER" ] || cargo build --release -p upager-cli || exit 1
# The user reads the tree and the build; every path up to them must be
# searchable by others (a fresh clone under a 0700 home is not).
if ! runuser -u "$USER_NAME" -- test -x "$UPAGER"; then
    echo "test-unprivileged: $USER_NAME cannot run $UPAGER (a directory above it is not searchable by others)" >&2
    exit 1
fi
SCRATCH=$(mktemp -d /dev/shm/upager-unpriv.XXXXXX)
chown "$USER_NAME" "$SCRATCH"
trap 'rm -rf "$SCRATCH"' EXIT

as_user() {
    runuser -u "$USER_NAME" -- env HOME="$SCRATCH" TMPDIR="$SCRATCH" UPAGER_CACHE_DIR="$SCRATCH/cache" \
        UPAGER_TEST_DIR="$SCRATCH" CI="${CI:-}" PATH="$PATH" "$@"
}

# part NAME COMMAND...: runs it as the user with a time limit, logs to a file.
part() {
    local name=$1
    shift
    local log=$SCRATCH/$name.log start=$SECONDS
    if as_user timeout --kill-after=10 900 "$@" >"$log" 2>&1; then
        echo "PASS $name ($((SECONDS - start)) s)"
        passed=$((passed + 1))
    else
        echo "FAIL $name ($((SECONDS - start)) s):"
        tail -n 30 "$log" | sed 's/^/    /'
        failed+=("$name")
    fi
}

demo_check() { # the demo, then: it verified every byte and was user-mode-only
    local out
    out=$("$@" 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    grep -q "verified every byte" <<<"$out" &&
        grep -q "userfaultfd: user-mode-only" <<<"$out"
}
export -f demo_check
part demo-default bash -c 'demo_check "$0" demo --size 512M --budget 64M --reads 50000 --writes 25000 --dir "$TMPDIR" && "$0" demo --help >/dev/null' "$UPAGER"
part demo-handlers bash -c 'demo_check "$0" demo --size 512M --budget 64M --reads 50000 --writes 25000 --dir "$TMPDIR" --fault-mode handlers' "$UPAGER"

# The Python parts run when the user can import what they need; when not,
# they fail with the reason (only a tree without a wheel at all is skipped,
# outside CI, as the C suite is without its prefix).
WHEEL=$(ls "$TARGET"/wheels/upager-*.whl 2>/dev/null | head -n 1)
python_why=""
if [ -z "$WHEEL" ]; then
    python_why="no wheel in $TARGET/wheels (make python)"
else
    # The test requirements from their one list, every time (a kept venv
    # must follow it: pip does nothing when they are met).
    if ! { [ -x "$PYTHON" ] || "$BASE_PYTHON" -m venv "$VENV"; } ||
        ! "$PYTHON" -m pip install -q -r python/requirements-dev.txt; then
        python_why="making $VENV with $BASE_PYTHON and python/requirements-dev.txt failed"
        rm -rf "$VENV"
    # This tree's wheel, every time (it changes with the tree).
    elif ! "$PYTHON" -m pip install -q --force-reinstall --no-deps "$WHEEL"; then
        python_why="installing $WHEEL into $VENV failed"
    else
        chmod -R a+rX "$VENV" 2>/dev/null
        # As the user, who is the one who must be able to import them.
        if ! err=$(as_user "$PYTHON" -c "import numpy, pytest, upager" 2>&1); then
            python_why="$USER_NAME cannot import numpy, pytest and upager with $PYTHON: $(tail -n 3 <<<"$err")"
        fi
    fi
fi
if [ -z "$WHEEL" ]; then
    echo "SKIP python: $python_why"
    [ "${CI:-}" = true ] && failed+=("python-not-installed")
elif [ -n "$python_why" ]; then
    echo "FAIL python (the memmap checks and python/tests not run): $python_why"
    failed+=("python-import")
else
    for mode in default handlers in-thread; do
        part "python-memmap-$mode" "$PYTHON" - "$mode" <<'EOF'
import os, sys
import numpy as np
import upager

mode = sys.argv[1]
kw = {} if mode == "default" else {"fault_mode": mode}
d = os.environ["TMPDIR"]
path = os.path.join(d, "a.f64")
n = (256 << 20) // 8
np.arange(n, dtype=np.float64).tofile(path)
a = upager.memmap(path, np.float64, mode="r+", budget="32MiB", **kw)
p = upager.Pager(budget="32MiB", **kw)
info = p.info()
print("info", info)
assert info["user_mode_only"], info
assert info["syscalls_fault_in"] is False, info
assert a.region.syscalls_fault_in is False
if mode == "default":
    assert info["fault_mode"] == "in-thread", info
idx = np.random.default_rng(1).integers(0, n, 20000)
a[idx] = -idx
a.flush()
assert float(a[:n].sum()) == float(np.arange(n).sum() - 2 * np.unique(idx).sum())
b = np.fromfile(path, dtype=np.float64)
want = np.arange(n, dtype=np.float64)
want[idx] = -idx
assert np.array_equal(b, want)
# Out of region memory with pages not resident: tofile and numpy.save.
a.region.pageout(0)
a.tofile(os.path.join(d, "copy.f64"))
assert np.array_equal(np.fromfile(os.path.join(d, "copy.f64"), dtype=np.float64), want)
np.save(os.path.join(d, "copy.npy"), a)
assert np.array_equal(np.load(os.path.join(d, "copy.npy")), want)
print("verified", mode)
EOF
    done
fi

PREFIX=$TARGET/c-test-prefix
if [ -f "$PREFIX/include/upager.h" ]; then
    part c-suite sh crates/capi/tests/run.sh "$PREFIX"
else
    echo "SKIP c-suite: no $PREFIX (make test-c installs it)"
    [ "${CI:-}" = true ] && failed+=("c-suite-not-installed")
fi

if [ -n "$WHEEL" ] && [ -z "$python_why" ]; then
    # All but the benchmark's test: it needs root (zram, mounts, memory
    # cgroups) by nature, and runs in the main suite as root.
    part python-suite "$PYTHON" -m pytest -q -p no:cacheprovider python/tests \
        -k "not test_the_safetensors_benchmark_runs_tiny"
fi

echo "test-unprivileged: $passed passed, ${#failed[@]} failed${failed:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
