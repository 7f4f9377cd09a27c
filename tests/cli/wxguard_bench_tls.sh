#!/usr/bin/env bash
# wxguard-bench against a Redis that speaks only TLS and lets in only an ACL user: every
# connection the benchmark makes -- the guard's and its own probes (DBSIZE, INFO, FLUSHDB,
# SCRIPT), the seed design's, the protocol variants' and the --rate markers' -- goes through
# the connection layer with the redis.* keys, so each subcommand prints its table with no
# failures. A benchmark that opened plain connections of its own could not reach this server.
#
# The server is private: started here on a free loopback port (port 0: no plain port at all,
# `user default off`: nothing without AUTH), certificates from tests/support/mkpki.sh, stopped
# by its PID.
# usage: wxguard_bench_tls.sh <wxguard-bench> <mkpki.sh>
set -u
bench=$1
mkpki=$2
scale=${WXG_TEST_TIMEOUT_SCALE:-1}
failures=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wxg-bench-tls.XXXXXX") || exit 1
pid=
cleanup() {
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        # At most 5 s for a clean exit, then no more waiting.
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

mkdir "$tmp/pki" && bash "$mkpki" "$tmp/pki" >"$tmp/mkpki.log" 2>&1 ||
    { echo "FAIL: mkpki.sh: $(cat "$tmp/mkpki.log")" >&2; exit 1; }

# A free loopback port: a few candidates, each tried by starting the server on it; a port
# taken meanwhile makes the server exit, and the next candidate is tried.
port=
for attempt in 1 2 3 4 5 6 7 8; do
    cand=$((20000 + (RANDOM * 7 + attempt * 131) % 40000))
    cat >"$tmp/redis.conf" <<EOF
port 0
bind 127.0.0.1
tls-port $cand
tls-cert-file $tmp/pki/server.crt
tls-key-file $tmp/pki/server.key
tls-ca-cert-file $tmp/pki/ca.crt
tls-auth-clients no
save ""
appendonly no
dir $tmp
user default off
user wxbench on >bench-secret ~* &* +@all
EOF
    redis-server "$tmp/redis.conf" >"$tmp/redis.log" 2>&1 &
    pid=$!
    ready=0
    for _ in $(seq $((100 * scale))); do
        if grep -q "Ready to accept connections" "$tmp/redis.log"; then
            ready=1
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ $ready -eq 1 ]; then
        port=$cand
        break
    fi
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=
done
[ -n "$port" ] || { echo "FAIL: no redis-server started: $(cat "$tmp/redis.log")" >&2; exit 1; }

keys=(--set redis.tls=true --set "redis.tls.ca.file=$tmp/pki/ca.crt"
      --set redis.user=wxbench --set redis.password=bench-secret)
limit=$((120 * scale))

# table_ok <what> <file> <rows wanted>: the markdown table's data rows (those after a
# |---| line) number at least <rows wanted>, and the last column, failures, is 0 in each.
table_ok() {
    awk -v want="$3" '
        /^\|[-:|]+\|$/ { inside = 1; next }
        inside && /^\| / { n++; f = $(NF - 1); gsub(/ /, "", f); if (f != "0") bad++ }
        inside && !/^\|/ { inside = 0 }
        END { exit !(n >= want && bad == 0) }' FS='|' "$2" ||
        fail "$1: not a table of at least $3 rows with 0 failures: $(cat "$2")"
}

# run <what> <rows wanted> <arguments...>
run() {
    what=$1
    rows=$2
    shift 2
    timeout "$limit" "$bench" "$@" "${keys[@]}" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "$what: exit status $rc: $(cat "$tmp/err")"
        return
    fi
    table_ok "$what" "$tmp/out" "$rows"
    if grep -F -q "bench-secret" "$tmp/out" "$tmp/err"; then
        fail "$what: the password appears in the output"
    fi
}

# The guard benchmark: the native, lua and seed designs with their duplicate rows (5 rows).
run "guard" 5 guard --port "$port" --design native,lua,seed --threads 2 --messages 2000 \
    --rounds 1 --markers 0 --rb-requests 0
grep -F -q "| design | threads |" "$tmp/out" || fail "guard: no table header: $(cat "$tmp/out")"
# Memory per marker at a rate: the --rate markers and their probes.
run "guard --rate" 2 guard --port "$port" --rate 1000 --rate-markers 2000
# The protocol variants, each on connections of its own (4 rows).
run "protocol" 4 protocol --port "$port" --messages 2000 --rounds 1

if [ $failures -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "ok"
