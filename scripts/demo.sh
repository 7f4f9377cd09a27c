#!/usr/bin/env bash
# The main job, end to end on this machine:
#
#   scripts/demo.sh
#
# installs what is missing (scripts/setup.sh), builds wxguard, starts redis-server and a real
# single-node Kafka broker on free loopback ports (scripts/services.sh), creates the topics,
# starts two wxguard-consumer replicas with the `record` plugin, and feeds a stream of WeChat
# callbacks in the reference formats (wkteam, GeWe, generic) with duplicates: some within the
# stream, a batch of them some seconds late, and more after one replica was restarted; two
# records do not decode at all. It then waits until every offset is committed and prints what
# happened: received, duplicates suppressed, effects (one per unique message) and dead-lettered,
# with the path of the effect ledger. Everything it started is stopped on exit (by PID); the
# ledger and the logs stay in the printed directory.
#
# Environment: WXG_DEMO_MESSAGES (default 2000), WXG_TEST_TIMEOUT_SCALE (slow machines).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
messages=${WXG_DEMO_MESSAGES:-2000}
[[ $messages =~ ^[1-9][0-9]*$ ]] || messages=2000
scale=${WXG_TEST_TIMEOUT_SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || scale=1

say() { printf 'demo: %s\n' "$*" >&2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/wxguard-demo.XXXXXX")
services=$work/services
pids=()

cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 $((100 * scale))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if [[ -f $services/services.env ]]; then
    "$here/services.sh" stop "$services" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "checking dependencies (scripts/setup.sh)"
"$here/setup.sh" >&2

if [[ ! -x build/cmd/wxguard-consumer/wxguard-consumer || ! -x build/cmd/wxguard-bench/wxguard-bench ]]; then
  say "building"
  cmake -S . -B build -G Ninja >/dev/null
fi
cmake --build build --target wxguard-consumer wxguard-bench >/dev/null

say "starting Redis and Kafka"
"$here/services.sh" start "$services" >&2
# shellcheck disable=SC1091
. "$services/services.env"
bootstrap=$WXG_TEST_KAFKA_BOOTSTRAP
bench=build/cmd/wxguard-bench/wxguard-bench
consumer=build/cmd/wxguard-consumer/wxguard-consumer
topic=wxguard.callbacks
dlq=wxguard.dlq
group=wxguard-demo
ledger=$work/effects.jsonl

"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --create 6 >/dev/null
"$bench" feed --bootstrap "$bootstrap" --topic "$dlq" --create 1 >/dev/null

cat >"$work/consumer.conf" <<CONF
kafka.bootstrap.servers = $bootstrap
kafka.group.id = $group
kafka.broker.address.family = v4
kafka.auto.offset.reset = earliest
consumer.topics = $topic
consumer.workers = 4
consumer.commit.interval.ms = 500ms
dlq.topic = $dlq
redis.host = $WXG_TEST_REDIS_HOST
redis.port = $WXG_TEST_REDIS_PORT
plugins = record
plugin.record.path = $ledger
CONF

start_replica() {
  "$consumer" --config "$work/consumer.conf" >>"$work/replica-$1.log" 2>&1 &
  pids[$1]=$!
}

say "starting two consumer replicas"
start_replica 0
start_replica 1

say "feeding $messages callbacks (25% duplicates, 2 undecodable)"
out=$("$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 \
  --messages "$messages" --dup 0.25 --poison 2 --seed 7)
produced=$(sed -n 's/.*produced=\([0-9]*\).*/\1/p' <<<"$out")
unique=$(sed -n 's/.*unique=\([0-9]*\).*/\1/p' <<<"$out")

sleep 3
late=$((messages / 5))
say "re-sending $late of them, seconds late"
"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 \
  --messages "$messages" --dup 0.25 --seed 7 --replay "$late" >/dev/null

say "restarting one replica (SIGTERM: drain, commit, exit 0)"
kill -TERM "${pids[0]}"
wait "${pids[0]}" || { say "replica 0 did not stop cleanly"; exit 1; }
start_replica 0
again=$((messages / 10))
say "re-sending $again more after the restart"
"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 \
  --messages "$messages" --dup 0.25 --seed 7 --replay "$again" >/dev/null

say "waiting until every offset is committed"
"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 --wait-group "$group" \
  --timeout $((180 * scale)) >/dev/null

received=$((produced + late + again))
effects=$(grep -c '"key"' "$ledger" || true)
distinct=$(grep -o '"key":"[^"]*"' "$ledger" | sort -u | wc -l)
dead=$("$bench" feed --bootstrap "$bootstrap" --topic "$dlq" --partitions 1 --count |
  sed -n 's/records=//p')
suppressed=$((received - effects - dead))

cat <<SUMMARY

wxguard demo summary
  callbacks received        $received  (2 replicas, one restarted mid-run)
  unique messages sent      $unique
  duplicates suppressed     $suppressed
  effects                   $effects  (distinct messages with an effect: $distinct)
  dead-lettered             $dead  (records that could not be decoded)
  effect ledger             $ledger
  consumer logs             $work/replica-0.log, $work/replica-1.log

SUMMARY
if [[ $effects -ne $unique || $distinct -ne $unique ]]; then
  say "expected exactly one effect per unique message"
  exit 1
fi
