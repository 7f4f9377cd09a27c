#!/usr/bin/env bash
# Benchmark: what honest clients of wxguard-ingest see while hostile clients run.
#
#   bench/ingest_hostile.sh [BUILD_DIR]        (default: build)
#
# Starts a Kafka broker with scripts/services.sh in a temporary directory and wxguard-ingest on
# a free loopback port (ingest.concurrency=64, so at most 144 connections, and
# ingest.connection.timeout.ms=$CONN_TIMEOUT), waits until one callback is stored, then runs wrk
# (bench/ingest_generic.lua, distinct generic callbacks) for $DURATION in these rows:
#   unloaded  nothing else talks to the receiver (first and again last: the machine's noise);
#   slow      `wxguard-bench hostile` meanwhile runs $SLOW clients sending headers one byte a
#             second and $SLOW sending a body one byte a second (each cut client connects again
#             at once);
#   idle      $IDLE silent connections, opened again when closed;
#   bad       $BAD requests a second with bad framing or oversized headers;
#   hostile   slow, idle and bad together;
#   +bursts   the same plus $BURST connections at once, each with a callback, every
#             $BURST_EVERY seconds (far beyond the connection limit).
# The loads take turns REPEAT times. Prints a markdown table of every run (latency percentiles,
# requests/s, non-2xx answers, socket errors, p99 relative to the unloaded run just before), a
# table of the median p99 of each load and its ratio to the unloaded median, the hostile
# generator's summary lines and the receiver's refusal and close counters. Everything runs on 127.0.0.1; every load is bounded by $DURATION;
# the broker and the receiver are stopped (by PID) and the directory removed on exit.
#
# Environment: DURATION (default 15s), REPEAT (3), THREADS (2), CONNECTIONS (32), CONN_TIMEOUT
# (10s), SLOW (8), IDLE (32), BAD (20), BURST (1000), BURST_EVERY (5), WXG_CACHE_DIR (Kafka
# jars).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
duration=${DURATION:-15s}
threads=${THREADS:-2}
conns=${CONNECTIONS:-32}
conn_timeout=${CONN_TIMEOUT:-10s}
slow=${SLOW:-8}
idle=${IDLE:-32}
bad=${BAD:-20}
burst=${BURST:-1000}
burst_every=${BURST_EVERY:-5}
repeat=${REPEAT:-3}
ingest=$build/cmd/wxguard-ingest/wxguard-ingest
bench=$build/cmd/wxguard-bench/wxguard-bench

command -v wrk >/dev/null || {
  echo "wrk not found: apt-get install wrk" >&2
  exit 2
}
for b in "$ingest" "$bench"; do
  [[ -x $b ]] || {
    echo "$b not built: cmake --build $build" >&2
    exit 2
  }
done
secs=${duration%s}
[[ $secs =~ ^[0-9]+$ ]] || {
  echo "DURATION must be whole seconds, e.g. 20s" >&2
  exit 2
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/wxg-bench-hostile.XXXXXX")
ingest_pid=
hostile_pid=
cleanup() {
  for p in $hostile_pid $ingest_pid; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  "$repo/scripts/services.sh" stop "$tmp/svc" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$repo/scripts/services.sh" start "$tmp/svc" --only kafka >/dev/null
# shellcheck disable=SC1091
. "$tmp/svc/services.env"

"$ingest" --set "kafka.bootstrap.servers=$WXG_TEST_KAFKA_BOOTSTRAP" \
  --set kafka.broker.address.family=v4 --set ingest.listen=127.0.0.1:0 \
  --set ingest.ops.listen=127.0.0.1:0 \
  --set ingest.topic=bench.hostile --set ingest.concurrency=64 \
  --set "ingest.connection.timeout.ms=$conn_timeout" --set log.level=error \
  >"$tmp/ingest.out" 2>"$tmp/ingest.log" &
ingest_pid=$!

port=
for _ in $(seq 1 100); do
  port=$(sed -n 's/^wxguard-ingest listening on port \([0-9]*\)$/\1/p' "$tmp/ingest.out")
  [[ -n $port ]] && break
  sleep 0.1
done
# /metrics is on the operations port, written before the listening line.
ops=$(sed -n 's/^wxguard-ingest operations on port \([0-9]*\)$/\1/p' "$tmp/ingest.out")
[[ -n $port ]] || {
  echo "wxguard-ingest did not start:" >&2
  cat "$tmp/ingest.log" >&2
  exit 1
}
url=http://127.0.0.1:$port/v1/callback/generic

warm='{"account":"wxid_benchbot00002","msg_id":"1","conversation":"wxid_peer0000","content":"warm-up"}'
ok=
for _ in $(seq 1 60); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST --data-binary "$warm" "$url" || true)
  [[ $code == 200 ]] && ok=1 && break
  sleep 0.5
done
[[ -n $ok ]] || {
  echo "no callback stored during warm-up" >&2
  exit 1
}

# A wrk latency figure (850.00us, 6.61ms, 1.20s, 2.00m) in milliseconds.
to_ms() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /m$/) n *= 60000;
    else if (v ~ /s$/) n *= 1000
    printf "%.2f", n }'
}

base_p99=
rows=()
declare -A p99s
run=0
summaries=()
run_row() {
  local name=$1 out=$tmp/wrk-$1.txt
  shift
  if [[ $# -gt 0 ]]; then
    # The hostile clients start first and outlast wrk by a few seconds.
    "$bench" hostile --port "$port" --seconds $((secs + 4)) "$@" >"$tmp/hostile-$name.txt" &
    hostile_pid=$!
    sleep 2
  fi
  wrk -t"$threads" -c"$conns" -d"$duration" --latency -s "$here/ingest_generic.lua" "$url" >"$out"
  if [[ -n $hostile_pid ]]; then
    wait "$hostile_pid"
    hostile_pid=
    summaries+=("run $run, $name: $(cat "$tmp/hostile-$name.txt")")
  fi
  local reqs rps p50 p90 p99 max non2xx errs ratio p99ms
  reqs=$(awk '/requests in/ {print $1}' "$out")
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  p50=$(awk '$1 == "50%" {print $2}' "$out")
  p90=$(awk '$1 == "90%" {print $2}' "$out")
  p99=$(awk '$1 == "99%" {print $2}' "$out")
  max=$(awk '$1 == "Latency" {print $4}' "$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' "$out")
  errs=$(awk '/Socket errors/ {print $0}' "$out" | sed 's/^ *Socket errors: //')
  p99ms=$(to_ms "$p99")
  [[ $name == unloaded ]] && base_p99=$p99ms
  ratio=$(awk -v a="$p99ms" -v b="$base_p99" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  p99s[$name]="${p99s[$name]:-} $p99ms"
  rows+=("| $run | $name | $duration | $reqs | $rps | $p50 | $p90 | $p99 | $max | ${non2xx:-0} | ${errs:-none} | ${ratio}x |")
}

median() {
  tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END {
    if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2];
    else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# A first wrk run warms the broker and the producer up; it is not recorded.
wrk -t"$threads" -c"$conns" -d5s -s "$here/ingest_generic.lua" "$url" >/dev/null
all=(--slow-headers "$slow" --slow-bodies "$slow" --idle "$idle" --bad-per-second "$bad")
loads=(unloaded slow idle bad hostile +bursts)
# The loads take turns, $repeat times over, so that the machine's own noise (other work on the
# same cores) spreads over all of them instead of landing on one.
for run in $(seq 1 "$repeat"); do
  run_row unloaded
  run_row slow --slow-headers "$slow" --slow-bodies "$slow"
  run_row idle --idle "$idle"
  run_row bad --bad-per-second "$bad"
  run_row hostile "${all[@]}"
  run_row +bursts "${all[@]}" --burst "$burst" --burst-every "$burst_every"
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "settings: ingest.concurrency=64 (144 connections), ingest.connection.timeout.ms=$conn_timeout;" \
  "hostile: $slow slow-header + $slow slow-body clients, $idle idle connections, $bad bad requests/s;" \
  "bursts: $burst connections every ${burst_every}s"
echo "machine: $(nproc) CPU ($cpu), $(uname -sr); Kafka single node on loopback"
echo
echo "wrk: $threads threads, $conns connections (keep-alive), $duration per run"
echo
echo "| run | load | duration | requests | requests/s | p50 | p90 | p99 | max | non-2xx | socket errors | p99 / unloaded |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
base=$(median "${p99s[unloaded]}")
echo "| load | p99 of each run (ms) | median p99 (ms) | median / unloaded median |"
echo "|---|---|---|---|"
for l in "${loads[@]}"; do
  m=$(median "${p99s[$l]}")
  r=$(awk -v a="$m" -v b="$base" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  echo "| $l |${p99s[$l]} | $m | ${r}x |"
done
echo
printf '%s\n' "${summaries[@]}"
echo
echo "command: wrk -t$threads -c$conns -d$duration --latency -s bench/ingest_generic.lua $url"
curl -s "http://127.0.0.1:$ops/metrics" | grep -E '^wxg_httpd_(refused|closed)_total' || true
