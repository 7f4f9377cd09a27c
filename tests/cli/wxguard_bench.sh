#!/bin/sh
# wxguard-bench reads the guard's and the consumer's settings through the configuration keys and
# their one mapping (cmd/wxguard-bench/bench_conf.c, lib/conf_map.c), as wxguard-consumer does:
# a bad value of a key, from --set or from the subcommand's own options, is refused before any
# server is reached, with the key named and exit status 2; so are the names of --design. No
# server is needed.
# usage: wxguard_bench.sh <wxguard-bench>
set -u
bench=$1
failures=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wxg-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# refused <what the error must name> <arguments...>
refused() {
    want=$1
    shift
    "$bench" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || fail "$*: exit status $rc, expected 2: $(cat "$tmp/err")"
    if ! grep -F -q "configuration: " "$tmp/err" || ! grep -F -q "$want" "$tmp/err"; then
        fail "$*: no configuration error naming '$want' in: $(cat "$tmp/err")"
    fi
}

refused "guard.done.retention" guard --port 1 --set guard.done.retention=soon
refused "guard.lease.ms" guard --port 1 --set guard.lease.ms=1
refused "nosuch.key" guard --port 1 --set nosuch.key=1
refused "redis.db" guard --port 1 --set redis.db=70000

# The design names are read before any server is reached: every one of them is accepted (the
# run goes on to connect, and port 1 refuses), and an unknown one is refused by its name.
"$bench" guard --port 1 --design native,lua,naive,seed,seed-rt >"$tmp/out" 2>"$tmp/err"
if grep -F -q "unknown design" "$tmp/err" || ! grep -F -q "cannot connect" "$tmp/err"; then
    fail "--design native,lua,naive,seed,seed-rt: not accepted: $(cat "$tmp/err")"
fi
"$bench" guard --port 1 --design seed,seed-rtt >"$tmp/out" 2>"$tmp/err"
if ! grep -F -q "unknown design 'seed-rtt'" "$tmp/err"; then
    fail "--design seed,seed-rtt: not refused by name: $(cat "$tmp/err")"
fi

if [ $failures -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "ok"
