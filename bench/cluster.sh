#!/usr/bin/env bash
# A Redis Cluster of N primaries (no replicas) on loopback, for the cluster benchmarks of
# bench/cluster.md. redis-cli --cluster create wants at least three primaries, so the slots are
# assigned by hand (CLUSTER ADDSLOTSRANGE, an even share each) and the nodes introduced with
# CLUSTER MEET; persistence is off.
#
#   bench/cluster.sh start DIR N    starts N nodes on free ports under DIR, waits until every
#                                   node reports cluster_state:ok, writes DIR/seeds
#                                   (host:port,...) and DIR/pids
#   bench/cluster.sh stop DIR       stops the nodes DIR/pids names (SIGTERM, then SIGKILL after
#                                   10 s), each only if it is still the redis-server started here
#   bench/cluster.sh single DIR     starts one plain redis-server (not a cluster) under DIR,
#                                   prints its port; stop it with `stop DIR`
#   bench/cluster.sh port           prints a loopback port nothing listens on now
#
# Every wait is bounded. Nothing else is touched: the nodes are found by the PIDs recorded.
set -euo pipefail

die() {
  printf 'cluster.sh: %s\n' "$*" >&2
  exit 1
}

free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}

wait_ok() {
  local port=$1 i
  for i in $(seq 1 300); do
    if redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
      return 0
    fi
    sleep 0.1
  done
  die "node $port is not ok after 30 s"
}

# Starts one redis-server under DIR on a free port (cluster mode when $2 is yes), appends
# "pid port" to DIR/pids and prints the port. A port found free may be taken before the server
# binds it: then another one, five times at most.
node_up() {
  local dir=$1 cluster=$2 port pid
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    mkdir -p "$dir/node-$port"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/node-$port" --save '' \
      --appendonly no --cluster-enabled "$cluster" --cluster-config-file nodes.conf \
      --logfile "$dir/node-$port/redis.log" --daemonize no </dev/null >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      redis-cli -p "$port" ping >/dev/null 2>&1 && break
      [[ -d /proc/$pid ]] || break
      sleep 0.1
    done
    if redis-cli -p "$port" ping >/dev/null 2>&1; then
      echo "$pid $port" >>"$dir/pids"
      echo "$port"
      return 0
    fi
    kill "$pid" 2>/dev/null || true
    rm -rf "$dir/node-$port"
  done
  die "cannot start a node (five ports tried)"
}

start() {
  local dir=$1 n=$2 i port first=""
  [[ $n =~ ^[1-9][0-9]?$ ]] || die "N must be 1..99"
  mkdir -p "$dir"
  : >"$dir/pids"
  local ports=()
  for i in $(seq 0 $((n - 1))); do
    port=$(node_up "$dir" yes)
    ports+=("$port")
  done
  for i in $(seq 0 $((n - 1))); do
    local lo=$((i * 16384 / n)) hi=$(((i + 1) * 16384 / n - 1))
    redis-cli -p "${ports[$i]}" cluster addslotsrange "$lo" "$hi" >/dev/null
    if [[ $i -gt 0 ]]; then
      redis-cli -p "${ports[$i]}" cluster meet 127.0.0.1 "${ports[0]}" >/dev/null
    fi
  done
  for port in "${ports[@]}"; do
    wait_ok "$port"
    first+="${first:+,}127.0.0.1:$port"
  done
  echo "$first" >"$dir/seeds"
  echo "$first"
}

stop() {
  local dir=$1 pid port
  [[ -f $dir/pids ]] || return 0
  while read -r pid port; do
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "redis-server.*:$port"; then
      kill "$pid" 2>/dev/null || true
    fi
  done <"$dir/pids"
  while read -r pid port; do
    for _ in $(seq 1 100); do
      [[ -d /proc/$pid ]] || break
      sleep 0.1
    done
    if [[ -d /proc/$pid ]]; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done <"$dir/pids"
  rm -f "$dir/pids"
}

case ${1:-} in
start) start "${2:?DIR}" "${3:?N}" ;;
stop) stop "${2:?DIR}" ;;
single)
  mkdir -p "${2:?DIR}"
  : >"$2/pids"
  node_up "$2" no
  ;;
port) free_port ;;
*) die "usage: cluster.sh start DIR N | single DIR | stop DIR | port" ;;
esac
