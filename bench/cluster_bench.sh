#!/usr/bin/env bash
# The measurements of bench/cluster.md, in one run on one machine: the guard benchmark and the
# end-to-end benchmark against one server and against Redis Clusters of 1, 2 and 3 primaries
# (loopback, no replicas, persistence off), both designs; then 1, 2 and 3 consumer replicas
# (processes) on a 12-partition topic against the 3-primary cluster.
#
#   bench/cluster_bench.sh --bootstrap HOST:PORT [--broker-pid PID] [--rounds N]
#       [--guard-messages N] [--e2e-messages N] [--replica-messages N] [--primaries "1 2 3"]
#       [--no-single] [--only guard|e2e|replicas]
#
# A Kafka broker must be running (scripts/services.sh start DIR --only kafka gives one; its
# services.env names WXG_TEST_KAFKA_BOOTSTRAP and WXG_SERVICES_KAFKA_PID). The Redis servers
# are started and stopped here, by PID. WXG_BUILD_DIR as for cluster_replicas.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${WXG_BUILD_DIR:-$here/../build}
bench=$build/cmd/wxguard-bench/wxguard-bench

bootstrap="" broker_pid="" rounds=2 guard_messages=40000 e2e_messages=100000
replica_messages=200000 only="" primaries="1 2 3" single=1
while [[ $# -gt 0 ]]; do
  case $1 in
  --bootstrap) bootstrap=$2; shift ;;
  --broker-pid) broker_pid=$2; shift ;;
  --rounds) rounds=$2; shift ;;
  --guard-messages) guard_messages=$2; shift ;;
  --e2e-messages) e2e_messages=$2; shift ;;
  --replica-messages) replica_messages=$2; shift ;;
  --only) only=$2; shift ;;
  --primaries) primaries=$2; shift ;;
  --no-single) single=0 ;;
  *)
    echo "cluster_bench.sh: unknown option $1" >&2
    exit 2
    ;;
  esac
  shift
done
[[ -n $bootstrap ]] || {
  echo "usage: cluster_bench.sh --bootstrap HOST:PORT [...]" >&2
  exit 2
}
broker=()
[[ -n $broker_pid ]] && broker=(--broker-pid "$broker_pid")

work=$(mktemp -d "${TMPDIR:-/tmp}/wxg-cluster-bench.XXXXXX")
cleanup() {
  local d
  for d in "$work"/c* "$work/single"; do
    if [[ -d $d ]]; then
      "$here/cluster.sh" stop "$d"
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

want() { [[ -z $only || $only == "$1" ]]; }

echo "# cluster benchmarks, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $(redis-server --version | awk '{ print $3 }')"
echo

if [[ $single == 1 ]] && { want guard || want e2e; }; then
  # One plain server, for the reference rows.
  port=$("$here/cluster.sh" single "$work/single")
  if want guard; then
    echo "## guard, one server (not a cluster)"
    "$bench" guard --port "$port" --design native,lua --threads 4 --messages "$guard_messages" \
      --rounds "$rounds" --markers 0 --rb-requests 0 | grep '^|' || echo "(failed)"
    echo
  fi
  if want e2e; then
    for design in native lua; do
      echo "## e2e, one server (not a cluster), $design"
      "$bench" e2e --bootstrap "$bootstrap" --redis-port "$port" --workers 4 --partitions 12 \
        --messages "$e2e_messages" --light-rate 0 "${broker[@]}" --set "guard.design=$design" \
        2>"$work/e2e-single-$design.err" | grep '^|' || echo "(failed: $(tail -1 "$work/e2e-single-$design.err"))"
      grep 'per primary' "$work/e2e-single-$design.err" || true
      echo
    done
  fi
  "$here/cluster.sh" stop "$work/single"
fi
if want guard || want e2e; then
  for n in $primaries; do
    seeds=$("$here/cluster.sh" start "$work/c$n" "$n")
    if want guard; then
      echo "## guard --cluster, $n primaries"
      "$bench" guard --cluster "$seeds" --design native,lua --threads 4 \
        --messages "$guard_messages" --rounds "$rounds" | grep '^|' || echo "(failed)"
      echo
    fi
    if want e2e; then
      for design in native lua; do
        echo "## e2e --cluster, $n primaries, $design"
        "$bench" e2e --bootstrap "$bootstrap" --cluster "$seeds" --workers 4 --partitions 12 \
          --messages "$e2e_messages" --light-rate 0 "${broker[@]}" \
          --set "guard.design=$design" 2>"$work/e2e-$n-$design.err" | grep '^|' ||
          echo "(failed: $(tail -1 "$work/e2e-$n-$design.err"))"
        grep 'per primary' "$work/e2e-$n-$design.err" || true
        echo
      done
    fi
    "$here/cluster.sh" stop "$work/c$n"
    rm -rf "$work/c$n"
  done
fi

if want replicas; then
  seeds=$("$here/cluster.sh" start "$work/c3" 3)
  for design in native lua; do
    echo "## consumer replicas on a 12-partition topic, 3 primaries, $design"
    header=--header
    for r in 1 2 3; do
      "$here/cluster_replicas.sh" --bootstrap "$bootstrap" --seeds "$seeds" --replicas "$r" \
        --messages "$replica_messages" --design "$design" "${broker[@]}" $header ||
        echo "| $r | $design | failed |"
      header=""
    done
    echo
  done
fi
