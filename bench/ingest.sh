#!/usr/bin/env bash
# Benchmark of wxguard-ingest with wrk against a real single-node Kafka broker.
#
#   bench/ingest.sh [BUILD_DIR]        (default: build)
#
# Starts a broker with scripts/services.sh in a temporary directory, starts wxguard-ingest on a
# free loopback port, waits until /readyz says ready and one callback is stored, then runs wrk
# (Debian package "wrk") for each scenario with bench/ingest.lua POSTing distinct wkteam
# callbacks. Prints one markdown table row per scenario and the wrk command; the broker and
# the receiver are stopped (by PID) and the temporary directory removed on exit.
#
# Environment: DURATION (default 20s), SCENARIOS (threads:connections pairs, default "2:32 2:8"),
# INGEST_SETS (extra space-separated key=value settings for wxguard-ingest, e.g.
# "kafka.linger.ms=1"), WXG_CACHE_DIR (Kafka jars, see scripts/services.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
duration=${DURATION:-20s}
scenarios=${SCENARIOS:-"2:32 2:8"}
extra=()
for kv in ${INGEST_SETS:-}; do
  extra+=(--set "$kv")
done
ingest=$build/cmd/wxguard-ingest/wxguard-ingest

command -v wrk >/dev/null || {
  echo "wrk not found: apt-get install wrk" >&2
  exit 2
}
[[ -x $ingest ]] || {
  echo "$ingest not built: cmake --build $build" >&2
  exit 2
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/wxg-bench-ingest.XXXXXX")
ingest_pid=
cleanup() {
  if [[ -n $ingest_pid ]]; then
    kill -TERM "$ingest_pid" 2>/dev/null || true
    wait "$ingest_pid" 2>/dev/null || true
  fi
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
  --set ingest.topic=bench.callbacks --set ingest.concurrency=64 --set log.level=warn \
  "${extra[@]}" >"$tmp/ingest.out" 2>"$tmp/ingest.log" &
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
url=http://127.0.0.1:$port/v1/callback/wkteam

# Ready, and the topic exists (the broker creates it on the first record).
warm='{"wcId":"wxid_benchbot00001","messageType":"60001","data":{"fromUser":"wxid_benchuser9999","toUser":"wxid_benchbot00001","msgId":1,"newMsgId":7100000000000000001,"timestamp":1705043418,"content":"warm-up","self":false}}'
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

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "settings: defaults${INGEST_SETS:+ + $INGEST_SETS}"
echo "machine: $(nproc) CPU ($cpu), $(uname -sr); Kafka single node on loopback; librdkafka $(
  "$ingest" --version | sed 's/.*librdkafka \([^)]*\).*/\1/'
)"
echo
echo "| threads | connections | duration | requests | requests/s | p50 | p90 | p99 | max | non-2xx | errors |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for sc in $scenarios; do
  t=${sc%%:*}
  c=${sc##*:}
  out=$tmp/wrk-$t-$c.txt
  wrk -t"$t" -c"$c" -d"$duration" --latency -s "$here/ingest.lua" "$url" >"$out"
  reqs=$(awk '/requests in/ {print $1}' "$out")
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  p50=$(awk '$1 == "50%" {print $2}' "$out")
  p90=$(awk '$1 == "90%" {print $2}' "$out")
  p99=$(awk '$1 == "99%" {print $2}' "$out")
  max=$(awk '$1 == "Latency" {print $4}' "$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' "$out")
  errs=$(awk '/Socket errors/ {print $0}' "$out" | sed 's/^ *Socket errors: //')
  echo "| $t | $c | $duration | $reqs | $rps | $p50 | $p90 | $p99 | $max | ${non2xx:-0} | ${errs:-none} |"
done
echo
echo "command: wrk -t<threads> -c<connections> -d$duration --latency -s bench/ingest.lua $url"
stored=$(curl -s "http://127.0.0.1:$ops/metrics" |
  awk '/^wxg_ingest_requests_total\{endpoint="wkteam",status="200"\}/ {print $2}')
echo "callbacks stored (wxg_ingest_requests_total 200, warm-up included): ${stored:-?}"
