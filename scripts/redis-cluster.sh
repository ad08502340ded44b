#!/usr/bin/env bash
# A local Redis Cluster for upager's Redis store (issue 14): 3 masters and 3
# replicas on loopback ports BASE..BASE+5 (BASE = $UPAGER_REDIS_PORT, default
# 7000; each node also takes its cluster bus port, PORT+10000), data under
# $UPAGER_REDIS_DIR (default /dev/shm/upager-redis-BASE).
#
#   scripts/redis-cluster.sh start        # prints the address to use: 127.0.0.1:7000
#   scripts/redis-cluster.sh status       # nodes and roles
#   scripts/redis-cluster.sh stop         # kills the nodes, removes the directory
#   scripts/redis-cluster.sh kill PORT    # kill -9 one node (failover tests)
#   scripts/redis-cluster.sh revive PORT  # restart a killed node (it rejoins, as a replica)
#
# Settings, and why: cluster-node-timeout 1000 (a dead master is replaced in
# about 2 s), repl-diskless-sync-delay 0 (the default delays a replica's first
# sync by 5 s), no persistence (appendonly no, save ""), bind 127.0.0.1 with
# protected mode on: nothing listens beyond loopback. `start` returns only when
# cluster_state is ok on every node and every replica reports
# master_link_status:up (a replica that has not finished its first sync
# refuses to fail over). Every wait has a timeout ($UPAGER_REDIS_TIMEOUT
# seconds, default 30).
set -euo pipefail

BASE=${UPAGER_REDIS_PORT:-7000}
DIR=${UPAGER_REDIS_DIR:-/dev/shm/upager-redis-$BASE}
TIMEOUT=${UPAGER_REDIS_TIMEOUT:-30}
PORTS=$(seq "$BASE" $((BASE + 5)))
HOST=127.0.0.1

die() { echo "redis-cluster: $*" >&2; exit 1; }

need() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    die "redis-server and redis-cli are missing: run scripts/setup.sh as root (apt-get install redis-server)"
}

cli() { redis-cli -h "$HOST" -p "$1" "${@:2}" 2>/dev/null; }

pid_of() {
  local f="$DIR/$1/redis.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

running() { # how many of the six nodes answer PING
  local n=0 p
  for p in $PORTS; do
    [ "$(cli "$p" ping)" = PONG ] && n=$((n + 1))
  done
  echo "$n"
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.1 s.
wait_for() {
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$(($(date +%s) + secs))
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what (logs in $DIR/*/redis.log)"
    sleep 0.1
  done
}

start_node() {
  local p=$1 d="$DIR/$1"
  mkdir -p "$d"
  [ -f "$d/redis.conf" ] || cat >"$d/redis.conf" <<EOF
port $p
bind $HOST
protected-mode yes
daemonize yes
dir $d
pidfile $d/redis.pid
logfile $d/redis.log
cluster-enabled yes
cluster-config-file $d/nodes.conf
cluster-node-timeout 1000
repl-diskless-sync yes
repl-diskless-sync-delay 0
appendonly no
save ""
EOF
  redis-server "$d/redis.conf" >/dev/null || die "redis-server on port $p did not start (see $d/redis.log)"
}

node_up() { [ "$(cli "$1" ping)" = PONG ]; }

# Something listens on 127.0.0.1:$1 (bash's /dev/tcp, no other tool needed).
busy() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

all_ok() {
  local p
  for p in $PORTS; do
    cli "$p" cluster info | grep -q '^cluster_state:ok' || return 1
    if cli "$p" info replication | grep -q '^role:slave'; then
      cli "$p" info replication | grep -q '^master_link_status:up' || return 1
    fi
  done
  # 3 masters that each have a replica whose link is up.
  [ "$(cli "$BASE" cluster nodes | grep -c master)" -ge 3 ]
}

status() {
  local p role
  for p in $PORTS; do
    if node_up "$p"; then
      role=$(cli "$p" info replication | tr -d '\r' | awk -F: '/^role:/ {print $2} /^master_link_status:/ {print "link " $2}' | paste -sd' ')
      echo "$HOST:$p $role"
    else
      echo "$HOST:$p down"
    fi
  done
  if node_up "$BASE"; then
    cli "$BASE" cluster info | tr -d '\r' | grep '^cluster_state'
  fi
}

case "${1:-}" in
start)
  need
  if [ "$(running)" = 6 ] && all_ok; then
    echo "redis-cluster: already running" >&2
    echo "$HOST:$BASE"
    exit 0
  fi
  if [ -d "$DIR" ]; then
    # Half a cluster (a crash, a killed node): start afresh.
    "$0" stop >/dev/null
  fi
  # Each node also listens on its cluster bus port, PORT + 10000.
  for p in $PORTS; do
    for q in "$p" $((p + 10000)); do
      busy "$q" && die "port $q is in use by another program (a node on port P also needs P+10000): pick other ports with UPAGER_REDIS_PORT"
    done
  done
  mkdir -p "$DIR"
  for p in $PORTS; do start_node "$p"; done
  for p in $PORTS; do wait_for "$TIMEOUT" "redis-server on port $p" node_up "$p"; done
  addrs=()
  for p in $PORTS; do addrs+=("$HOST:$p"); done
  timeout "$TIMEOUT" redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$DIR/create.log" 2>&1 || die "redis-cli --cluster create failed (see $DIR/create.log)"
  wait_for "$TIMEOUT" "cluster_state:ok and every replica's master_link_status:up" all_ok
  echo "$HOST:$BASE"
  ;;
stop)
  for p in $PORTS; do
    if pid=$(pid_of "$p"); then kill -9 "$pid" 2>/dev/null || true; fi
  done
  # Also nodes whose pid file is gone but still answer.
  for p in $PORTS; do
    if node_up "$p"; then cli "$p" shutdown nosave >/dev/null || true; fi
  done
  for p in $PORTS; do wait_for 10 "port $p to close" bash -c "! redis-cli -h $HOST -p $p ping >/dev/null 2>&1"; done
  rm -rf "$DIR"
  ;;
status)
  need
  status
  ;;
kill)
  p=${2:?usage: $0 kill PORT}
  pid=$(pid_of "$p") || die "no node running on port $p"
  kill -9 "$pid"
  wait_for 10 "port $p to close" bash -c "! redis-cli -h $HOST -p $p ping >/dev/null 2>&1"
  ;;
revive)
  p=${2:?usage: $0 revive PORT}
  [ -f "$DIR/$p/redis.conf" ] || die "no node was configured on port $p"
  node_up "$p" && die "the node on port $p is running"
  redis-server "$DIR/$p/redis.conf" >/dev/null || die "redis-server on port $p did not start"
  wait_for "$TIMEOUT" "redis-server on port $p" node_up "$p"
  wait_for "$TIMEOUT" "cluster_state:ok and every replica's master_link_status:up" all_ok
  ;;
*)
  echo "usage: $0 start|stop|status|kill PORT|revive PORT" >&2
  exit 2
  ;;
esac
