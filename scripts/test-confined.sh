#!/usr/bin/env bash
# upager under the seccomp filters of container runtimes (issue 28, item 2).
#
# Runs `upager demo --size 128M --budget 16M` (fewer random accesses than
# the demo's default, so each run stays well under a minute) under the
# upager-confine launcher, which installs a seccomp filter refusing chosen
# syscalls and execs the demo (see crates/confine and docs/containers.md):
#
#  (a) Docker's default profile plus a fix, both fault modes:
#      a1  the profile scripts/seccomp-profile.py writes (userfaultfd and
#          process_madvise allowed; io_uring stays refused -> pwrite);
#      a2  `docker run --device /dev/userfaultfd` (the profile unchanged:
#          userfaultfd(2), process_madvise and io_uring refused, the device
#          usable) -> needs the process_madvise fallback;
#      a3  the a1 profile in a container without CAP_SYS_PTRACE (Docker's
#          default capabilities) and without the device: the kernel allows
#          only a user-mode-only userfaultfd (--uffd-user-mode-only refuses
#          the others with EPERM, as the kernel would), which the engine
#          must pick by itself (UPAGER_USERFAULTFD=auto, the default).
#  (b) a filter refusing io_uring_* and process_madvise (EPERM), both fault
#      modes: the demo must pass through the fallbacks (madvise per run,
#      pwrite) and must not report failed eviction batches.
#  (c) a filter refusing userfaultfd(2) and the device's ioctl: the demo
#      must exit non-zero (not by a signal, not by the timeout) with a
#      message that contains "seccomp"; Docker's and Podman's errnos.
#  (d) a real runtime's default profile: UPAGER_SECCOMP_BASE=PATH, by
#      default Podman's, /usr/share/containers/seccomp.json (Debian's
#      golang-github-containers-common, which scripts/setup.sh installs;
#      Docker's is moby/profiles seccomp/default.json). The profile the
#      engine's error message sends container users to make,
#      scripts/seccomp-profile.py's, is written from it; then the WHOLE
#      profile is loaded by scripts/run-under-profile.py (libseccomp's
#      Python binding for /usr/bin/python3, Debian's python3-seccomp) as
#      runc would, so the demo also meets every syscall the profile does
#      not allow. Without the profile or the binding, d is skipped with the
#      reason; under CI=true that is a failure:
#      d1  the profile from scripts/seccomp-profile.py, device usable;
#      d2  the same without CAP_SYS_PTRACE (setpriv) and without the
#          device: user-mode-only userfaultfd, found by the engine;
#      d3  the base profile unchanged, no device: refused, naming seccomp.
#
# Usage: scripts/test-confined.sh            (all cases)
#        scripts/test-confined.sh a1 b c    (some; a = a1 a2 a3, d = d1 d2 d3)
# Binaries: $CARGO_TARGET_DIR/release/{upager,upager-confine} (target/ by
# default), built with `cargo build --release` if missing. Exit status 0
# when every case passed; each failure is named with the tail of its log.
set -u
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
UPAGER=$TARGET/release/upager
CONFINE=$TARGET/release/upager-confine
if [[ ! -x $UPAGER || ! -x $CONFINE ]]; then
    cargo build --release -p upager-cli -p upager-confine || exit 1
fi

DEMO=(demo --size 128M --budget 16M --reads 20000 --writes 10000)
LIMIT=60 # seconds per run
LOGS=$(mktemp -d /tmp/upager-confined.XXXXXX)
IO_URING=io_uring_setup,io_uring_enter,io_uring_register
failed=()
passed=0
skipped=()
# Wrappers around the launcher (PRE) and between it and upager (MID), for (d).
PRE=()
MID=()

# run NAME EXPECT [ENV=VALUE...] -- CONFINE-OPTIONS... -- DEMO-OPTIONS...
#   EXPECT=pass: exit 0, every byte verified, no failed eviction batch.
#   EXPECT=refuse: exit 1-125 (an error, not a signal or the timeout) and
#   a message containing "seccomp".
run() {
    local name=$1 expect=$2
    shift 2
    local envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    local opts=()
    while [[ $1 != -- ]]; do opts+=("$1"); shift; done
    shift
    local log=$LOGS/$name.log why=""
    local start=$SECONDS
    # In a subshell whose stderr is the log: bash's own "Bus error" report
    # of a run killed by a signal lands there too.
    (env "${envs[@]}" timeout --kill-after=5 $LIMIT \
        "${PRE[@]}" "$CONFINE" "${opts[@]}" -- "${MID[@]}" "$UPAGER" "${DEMO[@]}" "$@") >"$log" 2>&1
    local rc=$?
    case $expect in
    pass)
        if ((rc != 0)); then
            why="exit status $rc"
        elif ! grep -q 'verified every byte' "$log"; then
            why="no 'verified every byte' line"
        elif grep -qi 'eviction batch failed' "$log"; then
            why="eviction batches failed (no fallback for the refused call)"
        fi
        ;;
    refuse)
        if ((rc == 0)); then
            why="exit status 0, expected a refusal"
        elif ((rc == 124 || rc == 137)); then
            why="timed out after ${LIMIT}s"
        elif ((rc > 125)); then
            why="killed by signal $((rc - 128)), expected an error exit"
        elif ! grep -v '^run-under-profile.py:' "$log" | grep -q 'seccomp'; then
            # (run-under-profile.py's own notes mention libseccomp.)
            why="exit status $rc, but the message does not name seccomp"
        fi
        ;;
    esac
    local took=$((SECONDS - start))
    if [[ -z $why ]]; then
        passed=$((passed + 1))
        local shoot
        shoot=$(grep -o '[0-9.]* per 1000 evicted 4 KiB pages' "$log" || true)
        echo "PASS $name (${took}s)${shoot:+: $shoot}"
    else
        failed+=("$name")
        echo "FAIL $name (${took}s): $why"
        echo "     ${envs[*]:+env ${envs[*]} }${PRE[*]:+${PRE[*]} }$CONFINE ${opts[*]} -- ${MID[*]:+${MID[*]} }$UPAGER ${DEMO[*]} $*"
        tail -n 6 "$log" | sed 's/^/     | /'
    fi
}

SELECT=("$@")
sel() { # sel CASE: selected on the command line (all when none given)
    ((${#SELECT[@]} == 0)) && return 0
    local c
    for c in "${SELECT[@]}"; do
        [[ $c == "$1" || ($c == [abcd] && $1 == "$c"*) ]] && return 0
    done
    return 1
}

for mode in handlers in-thread; do
    fm=(--fault-mode "$mode")
    sel a1 && run "a1-docker+profile-$mode" pass -- \
        --profile docker --allow userfaultfd,process_madvise -- "${fm[@]}"
    sel a2 && run "a2-docker+device-$mode" pass -- \
        --profile docker -- "${fm[@]}"
    sel a3 && run "a3-docker+profile-no-ptrace-$mode" pass -- \
        --profile docker --allow userfaultfd,process_madvise --no-uffd-device \
        --uffd-user-mode-only -- "${fm[@]}"
    sel b && run "b-no-io_uring-no-process_madvise-$mode" pass -- \
        --deny "process_madvise,$IO_URING:EPERM" -- "${fm[@]}"
done
# (c) The demo never gets to its fault mode; one run per runtime's errnos.
sel c && run "c-no-userfaultfd-docker" refuse -- \
    --profile docker --no-uffd-device -- --fault-mode handlers
sel c && run "c-no-userfaultfd-podman" refuse -- \
    --profile podman --no-uffd-device -- --fault-mode in-thread
sel c && run "c-deny-userfaultfd" refuse -- \
    --deny userfaultfd,ioctl=USERFAULTFD_IOC_NEW -- --fault-mode handlers

if sel d1 || sel d2 || sel d3; then
    why=""
    UPAGER_SECCOMP_BASE=${UPAGER_SECCOMP_BASE:-/usr/share/containers/seccomp.json}
    if [[ ! -f $UPAGER_SECCOMP_BASE ]]; then
        why="no base profile $UPAGER_SECCOMP_BASE (apt-get install golang-github-containers-common, or set UPAGER_SECCOMP_BASE)"
    elif ! /usr/bin/python3 -c 'import seccomp' 2>/dev/null; then
        why="no libseccomp binding for /usr/bin/python3 (apt-get install python3-seccomp)"
    fi
    if [[ -n $why && ${CI:-} == true ]]; then
        # Under CI=true a case that cannot run fails (scripts/test.sh).
        failed+=(d)
        echo "FAIL d: cannot run under CI=true: $why"
    elif [[ -n $why ]]; then
        skipped+=(d)
        echo "SKIP d: $why"
    elif ! python3 scripts/seccomp-profile.py -q "$UPAGER_SECCOMP_BASE" \
        -o "$LOGS/upager-seccomp.json" 2>"$LOGS/seccomp-profile.log"; then
        # The helper the engine's error message names must take a real
        # runtime's default profile.
        failed+=(d-seccomp-profile)
        echo "FAIL d-seccomp-profile: scripts/seccomp-profile.py refused $UPAGER_SECCOMP_BASE"
        tail -n 6 "$LOGS/seccomp-profile.log" | sed 's/^/     | /'
    else
        echo "d: base profile $UPAGER_SECCOMP_BASE"
        LOAD=(/usr/bin/python3 scripts/run-under-profile.py)
        for mode in handlers in-thread; do
            MID=("${LOAD[@]}" "$LOGS/upager-seccomp.json" --)
            sel d1 && run "d1-full-profile+device-$mode" pass -- -- --fault-mode "$mode"
            PRE=(setpriv --bounding-set -sys_ptrace --)
            sel d2 && run "d2-full-profile-no-ptrace-$mode" pass -- \
                --no-uffd-device -- --fault-mode "$mode"
            PRE=()
        done
        MID=("${LOAD[@]}" "$UPAGER_SECCOMP_BASE" --)
        sel d3 && run "d3-base-profile" refuse -- --no-uffd-device -- --fault-mode handlers
        MID=()
    fi
fi

echo "test-confined: $passed passed, ${#failed[@]} failed${failed:+: ${failed[*]}}${skipped:+, skipped: ${skipped[*]}} (logs in $LOGS)"
((${#failed[@]} == 0))
