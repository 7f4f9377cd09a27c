#!/usr/bin/env bash
# The guard on Redis and on Valkey in one sitting (bench/servers.md): ROUNDS rounds, each
# running `wxguard-bench guard` (native and Lua designs, 4 threads, 30 % duplicates, the memory
# phase) against a fresh private redis-server, then a fresh private valkey-server, alternating
# so that the machine's drift falls on both alike. Each server is pinned to CPU 1 and the
# benchmark to CPU 0 when the machine has two (taskset), persistence off.
#
#   bench/servers.sh [ROUNDS] [MESSAGES]     defaults: 3 rounds, 40000 messages per row
#
# Prints each run's tables, then one summary line per run (server, design, messages/s, Redis
# CPU µs/msg, bytes per marker). Stops only the servers it started, by PID.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=${WXG_BENCH:-$here/../build/cmd/wxguard-bench/wxguard-bench}
rounds=${1:-3}
messages=${2:-40000}
[[ -x $bench ]] || { echo "servers.sh: $bench not built" >&2; exit 1; }
tmp=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
pin_server=() pin_bench=()
if (($(nproc) >= 2)) && command -v taskset >/dev/null; then
  pin_server=(taskset -c 1) pin_bench=(taskset -c 0)
fi

run_one() {
  local server=$1 cli=$2 port out
  port=$("$here/cluster.sh" port)
  mkdir -p "$tmp/$server"
  "${pin_server[@]}" "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$tmp/$server" --daemonize no >"$tmp/$server/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    "$cli" -p "$port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  out=$tmp/run-$server-$round.md
  "${pin_bench[@]}" "$bench" guard --port "$port" --design native,lua --threads 4 \
    --messages "$messages" --dup 0.3 --markers 300000 --rb-requests 0 | tee "$out"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  # server, design, messages/s, Redis CPU µs/msg; then bytes per marker per design
  awk -v s="$server" -v r="$round" -F'|' '
    /^\| (native|lua) \(/ { gsub(/ /, "", $2); split($2, d, "("); thr[d[1]] = $4; cpu[d[1]] = $9 }
    /^\| wxguard compact marker/ { m = $2; sub(/.*\(/, "", m); sub(/\).*/, "", m); mem[m] = $4 }
    END { for (k in thr) printf "summary round=%s server=%s design=%s msgs_per_s=%s redis_cpu_us=%s bytes_per_marker=%s\n", r, s, k, thr[k], cpu[k], mem[k] }' \
    "$out" | tr -s ' ' | tee -a "$tmp/summary"
}

for round in $(seq 1 "$rounds"); do
  run_one redis-server redis-cli
  run_one valkey-server valkey-cli
done
echo
cat "$tmp/summary"
