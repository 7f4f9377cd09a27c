#!/usr/bin/env bash
# Consumer replicas against a Redis Cluster (bench/cluster.md): R wxguard-consumer processes
# (noop plugin) in one group on a fresh topic of P partitions; once every replica holds
# partitions, N callbacks (a share of them duplicates) are produced, and the run ends when the
# replicas have finished every message (their /metrics: processed + duplicate claims). Prints
# one markdown row: messages/s from the start of producing to the last message finished, and
# CPU per message of the replicas (each and summed), of each primary and their sum, of the
# Kafka broker and of the producer (which runs on the same machine while the replicas work).
#
#   bench/cluster_replicas.sh --bootstrap HOST:PORT --seeds NODES --replicas R
#       [--messages N] [--partitions P] [--dup RATIO] [--design native|lua] [--workers W]
#       [--convs C] [--broker-pid PID] [--header]
#
# The stream (wxguard-bench feed: wkteam, GeWe and generic callbacks) spreads over C
# conversations, 5,000 by default: messages of one conversation run in order, one at a time, so
# a stream of few conversations leaves workers idle and batches small.
#
# WXG_BUILD_DIR (default: build/ beside this folder) has wxguard-consumer and wxguard-bench.
# Every wait is bounded; the replicas are stopped by their PIDs (SIGTERM, then SIGKILL).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${WXG_BUILD_DIR:-$here/../build}
consumer=$build/cmd/wxguard-consumer/wxguard-consumer
bench=$build/cmd/wxguard-bench/wxguard-bench

bootstrap="" seeds="" replicas=1 messages=200000 partitions=12 dup=0.3 design=native
workers=4 broker_pid="" header=0 convs=5000
while [[ $# -gt 0 ]]; do
  case $1 in
  --bootstrap) bootstrap=$2; shift ;;
  --seeds) seeds=$2; shift ;;
  --replicas) replicas=$2; shift ;;
  --messages) messages=$2; shift ;;
  --partitions) partitions=$2; shift ;;
  --dup) dup=$2; shift ;;
  --design) design=$2; shift ;;
  --workers) workers=$2; shift ;;
  --convs) convs=$2; shift ;;
  --broker-pid) broker_pid=$2; shift ;;
  --header) header=1 ;;
  *)
    echo "cluster_replicas.sh: unknown option $1" >&2
    exit 2
    ;;
  esac
  shift
done
[[ -n $bootstrap && -n $seeds ]] || {
  echo "usage: cluster_replicas.sh --bootstrap HOST:PORT --seeds NODES --replicas R [...]" >&2
  exit 2
}

if [[ $header == 1 ]]; then
  echo "| replicas | design | messages | msg/s | replica CPU µs/msg (sum) | per replica | Redis CPU µs/msg (sum) | per primary | broker CPU µs/msg | producer CPU µs/msg |"
  echo "|---:|---|---:|---:|---:|---|---:|---|---:|---:|"
fi

tck=$(getconf CLK_TCK)
# CPU seconds of a process (user + system), from /proc.
proc_cpu() {
  awk -v t="$tck" '{ print ($14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || echo 0
}
# used_cpu_sys + used_cpu_user of a Redis node.
redis_cpu() {
  redis-cli -h "${1%:*}" -p "${1##*:}" info cpu |
    awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f\n", s }'
}
# A series of the /metrics on port ("" when absent or not answering yet).
metric_of() {
  { curl -s --max-time 2 "http://127.0.0.1:$1/metrics" || true; } |
    awk -v s="$2" 'index($0, s " ") == 1 { print $2 }'
}
# The sum of a series over the replicas' /metrics (missing: 0).
metric_sum() {
  local series=$1 sum=0 v p
  for p in "${ports[@]}"; do
    v=$(metric_of "$p" "$series")
    sum=$(awk -v a="$sum" -v b="${v:-0}" 'BEGIN { printf "%.0f", a + b }')
  done
  echo "$sum"
}

# The primaries, from CLUSTER NODES of the first seed.
first=${seeds%%,*}
primaries=()
while read -r node; do
  primaries+=("$node")
done < <(redis-cli -h "${first%:*}" -p "${first##*:}" cluster nodes |
  awk '$3 ~ /master/ && $3 !~ /fail/ { split($2, a, "@"); print a[1] }' | sort)
[[ ${#primaries[@]} -gt 0 ]] || {
  echo "cluster_replicas.sh: no primary found through $first" >&2
  exit 1
}

tag=wxgr-$$-$RANDOM
dir=$(mktemp -d "${TMPDIR:-/tmp}/$tag.XXXXXX")
topic=$tag group=$tag-g dlq=$tag-dlq
"$bench" feed --bootstrap "$bootstrap" --topic "$topic" --create "$partitions" >/dev/null
"$bench" feed --bootstrap "$bootstrap" --topic "$dlq" --create 1 >/dev/null
cat >"$dir/consumer.conf" <<EOF
kafka.bootstrap.servers = $bootstrap
kafka.broker.address.family = v4
kafka.group.id = $group
kafka.auto.offset.reset = earliest
consumer.topics = $topic
dlq.topic = $dlq
redis.cluster.nodes = $seeds
redis.key.prefix = $tag:
guard.design = $design
plugins = noop
consumer.workers = $workers
log.level = warn
EOF

pids=() ports=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 300); do
      [[ -d /proc/$p ]] || break
      sleep 0.1
    done
    if [[ -d /proc/$p ]]; then
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$dir"
}
trap cleanup EXIT

for i in $(seq 1 "$replicas"); do
  port=$("$here/cluster.sh" port)
  "$consumer" --config "$dir/consumer.conf" --set "metrics.listen=127.0.0.1:$port" \
    >"$dir/replica-$i.log" 2>&1 &
  pids+=("$!")
  ports+=("$port")
done
# Every replica holds partitions (so no rebalance falls in the run).
for _ in $(seq 1 600); do
  ok=1
  total=0
  for p in "${ports[@]}"; do
    a=$(metric_of "$p" wxg_assigned_partitions)
    [[ ${a:-0} -gt 0 ]] || ok=0
    total=$((total + ${a:-0}))
  done
  [[ $ok == 1 && $total == "$partitions" ]] && break
  sleep 0.1
done
[[ $ok == 1 && $total == "$partitions" ]] || {
  echo "cluster_replicas.sh: the replicas did not all get partitions:" >&2
  tail -n 5 "$dir"/replica-*.log >&2
  exit 1
}

# CPU seconds so far of each replica, each primary and the broker, into <name>_replicas,
# <name>_primaries and <name>_broker.
# shellcheck disable=SC2034 # written through namerefs
sample() {
  local -n rep=$1_replicas pri=$1_primaries bro=$1_broker
  local p n
  rep=() pri=() bro=0
  for p in "${pids[@]}"; do rep+=("$(proc_cpu "$p")"); done
  for n in "${primaries[@]}"; do pri+=("$(redis_cpu "$n")"); done
  if [[ -n $broker_pid ]]; then
    bro=$(proc_cpu "$broker_pid")
  fi
}
# shellcheck disable=SC2034 # filled by sample through namerefs
declare -a s0_replicas s0_primaries s1_replicas s1_primaries
s0_broker=0 s1_broker=0
sample s0
t0=$(date +%s.%N)
TIMEFORMAT='%U %S'
feed_cpu=$({ time "$bench" feed --bootstrap "$bootstrap" --topic "$topic" --partitions \
  "$partitions" --messages "$messages" --dup "$dup" --seed 7 --convs "$convs" >/dev/null; } 2>&1 | tail -1 |
  awk '{ print $1 + $2 }')
finished=0
for _ in $(seq 1 6000); do
  finished=$(($(metric_sum wxg_messages_processed_total) + $(metric_sum 'wxg_guard_claims_total{outcome="duplicate"}')))
  [[ $finished -ge $messages ]] && break
  sleep 0.1
done
t1=$(date +%s.%N)
[[ $finished -ge $messages ]] || {
  echo "cluster_replicas.sh: only $finished of $messages finished" >&2
  exit 1
}

sample s1

per_replica="" replica_sum=0
for i in "${!pids[@]}"; do
  us=$(awk -v a="${s0_replicas[$i]}" -v b="${s1_replicas[$i]}" -v n="$messages" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
  per_replica+="${per_replica:+ / }$us"
  replica_sum=$(awk -v s="$replica_sum" -v u="$us" 'BEGIN { printf "%.2f", s + u }')
done
per_primary="" redis_sum=0
for i in "${!primaries[@]}"; do
  us=$(awk -v a="${s0_primaries[$i]}" -v b="${s1_primaries[$i]}" -v n="$messages" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
  per_primary+="${per_primary:+ / }$us"
  redis_sum=$(awk -v s="$redis_sum" -v u="$us" 'BEGIN { printf "%.2f", s + u }')
done
broker="-"
[[ -n $broker_pid ]] && broker=$(awk -v a="$s0_broker" -v b="$s1_broker" -v n="$messages" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
rate=$(awk -v a="$t0" -v b="$t1" -v n="$messages" 'BEGIN { printf "%.0f", n / (b - a) }')
producer=$(awk -v c="$feed_cpu" -v n="$messages" 'BEGIN { printf "%.2f", c * 1e6 / n }')
echo "| $replicas | $design | $messages | $rate | $replica_sum | $per_replica | $redis_sum | $per_primary | $broker | $producer |"
