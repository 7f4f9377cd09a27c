#!/usr/bin/env bash
# The main job, end to end on this machine:
#
#   scripts/demo.sh
#
#   HTTP POST -> wxguard-ingest -> Kafka -> two wxguard-consumer replicas
#     -> autoreply (replies on an outbound topic), pgsql (rows), billing (charges), record (ledger)
#
# installs what is missing (scripts/setup.sh), builds wxguard, starts redis-server, a real
# single-node Kafka broker and a throw-away PostgreSQL cluster on free loopback ports
# (scripts/services.sh), creates the topics, starts wxguard-ingest and two wxguard-consumer
# replicas, and POSTs a stream of WeChat callbacks in the reference formats (wkteam, GeWe,
# generic; three bot accounts) to ingest over HTTP, with duplicates: some within the stream (a
# gateway retrying), a batch of them some seconds late, and more after one replica was
# restarted. A smaller stream goes straight to Kafka (a gateway that writes to Kafka itself),
# with two records that do not decode at all. It waits until every offset is committed and
# prints what happened, then checks that every unique message took effect exactly once (one
# ledger effect, one row, one charge; one reply per message a rule answers): the exit status is
# non-zero when it did not. Everything it started is stopped on exit, also on failure or Ctrl-C
# (by PID); the ledger and the logs stay in the printed directory.
#
# Environment: WXG_DEMO_MESSAGES (callbacks over HTTP, default 2000), WXG_TEST_TIMEOUT_SCALE
# (slow machines).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
messages=${WXG_DEMO_MESSAGES:-2000}
[[ $messages =~ ^[1-9][0-9]*$ ]] || messages=2000
scale=${WXG_TEST_TIMEOUT_SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || scale=1
direct=$((messages / 10 + 1))
price=2

say() { printf 'demo: %s\n' "$*" >&2; }
value() { sed -n "s/.*\\b$1=\\([0-9]*\\).*/\\1/p" <<<"$2"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/wxguard-demo.XXXXXX")
services=$work/services
pids=()
started=$(date +%s)

stop_pid() {
  local pid=$1
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $((100 * scale))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do stop_pid "$pid"; done
  if [[ -f $services/services.env ]]; then
    "$here/services.sh" stop "$services" >/dev/null 2>&1 || true
  fi
  [[ $rc -eq 0 ]] || say "stopped everything it started (exit status $rc); logs are in $work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "checking dependencies (scripts/setup.sh)"
"$here/setup.sh" >&2

if [[ ! -f build/build.ninja ]]; then
  say "building"
  cmake -S . -B build -G Ninja >/dev/null
fi
cmake --build build --target wxguard-consumer wxguard-ingest wxguard-bench >/dev/null

say "starting Redis, Kafka and PostgreSQL"
"$here/services.sh" start "$services" >&2
# shellcheck disable=SC1091
. "$services/services.env"
bootstrap=$WXG_TEST_KAFKA_BOOTSTRAP
pg=$WXG_TEST_PG_DSN
bench=build/cmd/wxguard-bench/wxguard-bench
consumer=build/cmd/wxguard-consumer/wxguard-consumer
ingest=build/cmd/wxguard-ingest/wxguard-ingest
topic=wxguard.callbacks
dlq=wxguard.dlq
outbound=wechat.outbound
group=wxguard-demo
ledger=$work/effects.jsonl

"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --create 6 >/dev/null
"$bench" feed --bootstrap "$bootstrap" --topic "$dlq" --create 1 >/dev/null
"$bench" feed --bootstrap "$bootstrap" --topic "$outbound" --create 3 >/dev/null

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
plugins = autoreply,pgsql,billing,record
plugin.autoreply.topic = $outbound
plugin.autoreply.rule.10 = keyword:你好 -> 你好！有什么可以帮您？
plugin.autoreply.rule.20 = chat=group contains:价格 -> 价格请看群公告
plugin.pgsql.dsn = $pg
plugin.billing.dsn = $pg
plugin.billing.price.default = $price
plugin.record.path = $ledger
CONF

say "starting wxguard-ingest"
"$ingest" --set "kafka.bootstrap.servers=$bootstrap" --set "ingest.topic=$topic" \
  --set ingest.listen=127.0.0.1:0 --set ingest.ops.listen=127.0.0.1:0 \
  --set kafka.broker.address.family=v4 >"$work/ingest.log" 2>&1 &
pids+=($!)
port=
for _ in $(seq 1 $((300 * scale))); do
  port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$work/ingest.log")
  # /readyz is on the operations port, written just before the listening line.
  ops=$(sed -n 's/.*operations on port \([0-9]*\).*/\1/p' "$work/ingest.log")
  if [[ -n $port && -n $ops ]] && curl -fsS "http://127.0.0.1:$ops/readyz" >/dev/null 2>&1; then break; fi
  kill -0 "${pids[0]}" 2>/dev/null || { say "wxguard-ingest did not start, see $work/ingest.log"; exit 1; }
  port=
  sleep 0.1
done
[[ -n $port ]] || { say "wxguard-ingest not ready, see $work/ingest.log"; exit 1; }

replica_pid=()
start_replica() {
  "$consumer" --config "$work/consumer.conf" >>"$work/replica-$1.log" 2>&1 &
  replica_pid[$1]=$!
  pids+=($!)
}

say "starting two consumer replicas"
start_replica 0
start_replica 1

post() { "$bench" post --port "$port" --messages "$messages" --dup 0.25 --seed 7 "$@"; }

say "POSTing $messages callbacks to http://127.0.0.1:$port/v1/callback/{wkteam,gewe,generic} (25% duplicates)"
out=$(post)
posted=$(value posted "$out")
accepted=$(value accepted "$out")
unique_http=$(value unique "$out")
replies_expected=$(($(value hello "$out") + $(value price_group "$out")))

say "producing $direct callbacks straight to Kafka, and 2 undecodable records"
out=$("$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 \
  --messages "$direct" --dup 0.25 --poison 2 --seed 8)
produced=$(($(value produced "$out") - 2))
unique_direct=$(value unique "$out")

sleep 3
late=$((messages / 5))
say "re-POSTing $late of them, seconds late"
out=$(post --replay "$late")
posted=$((posted + $(value posted "$out")))
accepted=$((accepted + $(value accepted "$out")))

say "restarting one replica (SIGTERM: drain, commit, exit 0)"
kill -TERM "${replica_pid[0]}"
wait "${replica_pid[0]}" || { say "replica 0 did not stop cleanly"; exit 1; }
start_replica 0
again=$((messages / 10))
say "re-POSTing $again more after the restart"
out=$(post --replay "$again")
posted=$((posted + $(value posted "$out")))
accepted=$((accepted + $(value accepted "$out")))

say "waiting until every offset is committed"
"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 --wait-group "$group" \
  --timeout $((180 * scale)) >/dev/null

# Stop the replicas cleanly: each writes its final counters before it exits.
for i in 0 1; do
  kill -TERM "${replica_pid[$i]}"
  wait "${replica_pid[$i]}" || { say "replica $i did not stop cleanly"; exit 1; }
done
# Sum a counter over every replica run: the stats line each run logs just before it stops.
counter() {
  awk -v k="$1" '/event=stats/ { for (i = 1; i <= NF; i++) if ($i ~ "^" k "=") { split($i, a, "="); last = a[2] } }
                 /event=stopped/ { sum += last; last = 0 } END { print sum + 0 }' "$work"/replica-*.log
}

unique=$((unique_http + unique_direct))
stored=$("$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions 6 --count | sed -n 's/records=//p')
received=$(counter received)
duplicates=$(counter duplicates)
effects=$(grep -c '"key"' "$ledger" || true)
distinct=$(grep -o '"key":"[^"]*"' "$ledger" | sort -u | wc -l)
dead=$("$bench" feed --bootstrap "$bootstrap" --topic "$dlq" --partitions 1 --count | sed -n 's/records=//p')
replies=$("$bench" feed --bootstrap "$bootstrap" --topic "$outbound" --partitions 3 --count | sed -n 's/records=//p')
sql() { psql "$pg" -XAtq -c "$1"; }
rows=$(sql "SELECT count(*) FROM wxg_messages")
row_keys=$(sql "SELECT count(DISTINCT idem_key) FROM wxg_messages")
charges=$(sql "SELECT count(*) FROM wxg_charges")
charged=$(sql "SELECT coalesce(sum(amount), 0) FROM wxg_charges")
balances=$(sql "SELECT string_agg(account || ' ' || balance, ', ' ORDER BY account) FROM wxg_balances")
elapsed=$(($(date +%s) - started))

cat <<SUMMARY

wxguard demo summary: HTTP -> wxguard-ingest -> Kafka -> 2 consumer replicas -> PostgreSQL
  callbacks POSTed over HTTP    $posted  (to wxguard-ingest; with duplicates: within the stream, $late re-sent seconds late, $again after a replica restart)
  accepted by ingest (200)      $accepted
  written straight to Kafka     $produced  (+ 2 undecodable records)
  records in Kafka              $stored
  received by the consumers     $received  (2 replicas, one restarted mid-run)
  unique messages               $unique
  duplicates suppressed         $duplicates  (the idempotency guard answered DUPLICATE)
  effects                       $effects  (distinct messages with an effect: $distinct)
    rows in PostgreSQL          $rows  (table wxg_messages, one per idempotency key)
    charges                     $charges  (table wxg_charges, $charged in total at $price each; balances: $balances)
    replies on $outbound  $replies  (messages an autoreply rule answers: $replies_expected)
  dead-lettered                 $dead  (records that could not be decoded, in $dlq)
  effect ledger                 $ledger
  logs                          $work/ingest.log, $work/replica-0.log, $work/replica-1.log
  took                          ${elapsed}s

SUMMARY
fail=0
check() { if [[ $2 -ne $3 ]]; then say "FAILED: $1: $2, expected $3"; fail=1; fi; }
check "callbacks accepted by ingest" "$accepted" "$posted"
check "effects in the ledger" "$effects" "$unique"
check "distinct messages with an effect" "$distinct" "$unique"
check "rows in PostgreSQL" "$rows" "$unique"
check "distinct keys in PostgreSQL" "$row_keys" "$unique"
check "charges" "$charges" "$unique"
check "amount charged" "$charged" $((unique * price))
check "replies" "$replies" "$replies_expected"
check "dead-lettered records" "$dead" 2
if [[ $fail -ne 0 ]]; then
  say "expected exactly one effect per unique message; logs are in $work"
  exit 1
fi
say "every unique message took effect exactly once"
