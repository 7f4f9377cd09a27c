#!/usr/bin/env bash
# The wxguard-ingest program itself: --help and --version exit 0, --print-config shows the
# ingest keys with secrets as ***, an unknown key is a usage error (exit 2), metrics.listen (the
# consumer's) is warned about, and a running receiver (Kafka unreachable) answers /healthz 200,
# /readyz 503 and /metrics 200 on its operations port and 404 to all three on the callback port,
# then stops cleanly (exit 0) on SIGTERM. No broker is needed.
# usage: wxguard_ingest.sh <wxguard-ingest>
set -u
bin=$1
failures=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wxg-cli-ingest.XXXXXX") || exit 1
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# GET <port> <path>: prints the status code (bash's /dev/tcp, no client needed).
# The body of GET $2 on port $1 (HTTP/1.1 with Connection: close; headers included).
http_body() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
  timeout 5 cat <&3
  exec 3<&-
}

http_status() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
  IFS= read -r -t 5 line <&3
  exec 3<&-
  line=${line#HTTP/1.1 }
  printf '%s\n' "${line%% *}"
}

"$bin" --help >"$tmp/out" 2>&1 || fail "--help exit status $?"
grep -q '/v1/callback/' "$tmp/out" || fail "--help does not name the endpoints"
"$bin" --version >"$tmp/out" 2>&1 || fail "--version exit status $?"
grep -q '^wxguard-ingest ' "$tmp/out" || fail "--version: $(cat "$tmp/out")"

env -u WXG_INGEST_OA_TOKEN "$bin" --set kafka.bootstrap.servers=127.0.0.1:1 \
  --set ingest.oa.token=tok-not-shown --set ingest.hmac.secret=sec-not-shown \
  --print-config >"$tmp/out" 2>&1 || fail "--print-config exit status $?"
grep -q '^ingest.oa.token = \*\*\*$' "$tmp/out" || fail "ingest.oa.token not redacted"
grep -q '^ingest.hmac.secret = \*\*\*$' "$tmp/out" || fail "ingest.hmac.secret not redacted"
grep -q 'not-shown' "$tmp/out" && fail "a secret was printed"
grep -q '^ingest.concurrency = 64$' "$tmp/out" || fail "ingest.concurrency default missing"
grep -q '^ingest.ops.listen = 127.0.0.1:9465$' "$tmp/out" || fail "ingest.ops.listen default missing"
grep -q '^ingest.ops.on.callback.port = false$' "$tmp/out" ||
  fail "ingest.ops.on.callback.port default missing"
grep -q '^metrics.listen' "$tmp/out" && fail "metrics.listen is the consumer's, not an ingest key"

"$bin" --set kafka.bootstrap.servers=127.0.0.1:1 --set ingest.nope=1 >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "unknown key: exit status $rc, expected 2"
grep -q 'ingest.nope' "$tmp/out" || fail "unknown key not named: $(cat "$tmp/out")"

# A running receiver whose Kafka is a closed port. It writes its operations port before the
# listening line. Its metrics.listen, as a configuration from before ingest.ops.listen would
# have it, is named in a warning; its secrets come the ways that draw a start-up warning: a
# configuration file others can read, and --set.
printf 'ingest.oa.token = tok-not-shown\n' >"$tmp/open.conf"
chmod 0644 "$tmp/open.conf"
env -u WXG_INGEST_OA_TOKEN "$bin" --config "$tmp/open.conf" \
  --set kafka.bootstrap.servers=127.0.0.1:1 --set ingest.listen=127.0.0.1:0 \
  --set ingest.ops.listen=127.0.0.1:0 --set metrics.listen=127.0.0.1:9 \
  --set ingest.hmac.secret=sec-not-shown \
  --set kafka.log_level=0 >"$tmp/run.out" 2>"$tmp/run.err" &
pid=$!
port=
for _ in $(seq 1 100); do
  port=$(sed -n 's/^wxguard-ingest listening on port \([0-9]*\)$/\1/p' "$tmp/run.out")
  [ -n "$port" ] && break
  sleep 0.1
done
ops=$(sed -n 's/^wxguard-ingest operations on port \([0-9]*\)$/\1/p' "$tmp/run.out")
if [ -z "$port" ] || [ -z "$ops" ]; then
  fail "the receiver did not report its ports: $(cat "$tmp/run.out" "$tmp/run.err")"
else
  [ "$(http_status "$ops" /healthz)" = 200 ] || fail "/healthz is not 200 on the operations port"
  [ "$(http_status "$ops" /readyz)" = 503 ] || fail "/readyz is not 503 without Kafka"
  [ "$(http_status "$ops" /metrics)" = 200 ] || fail "/metrics is not 200 on the operations port"
  version=$("$bin" --version | awk '{print $2}')
  http_body "$ops" /metrics | grep -q "^wxg_build_info{program=\"wxguard-ingest\",version=\"$version\"} 1" ||
    fail "no wxg_build_info for version $version in /metrics"
  for p in /healthz /readyz /metrics; do
    [ "$(http_status "$port" $p)" = 404 ] || fail "$p is not 404 on the callback port"
  done
  grep -q 'event=config_warning.*metrics.listen is not used by this program' "$tmp/run.err" ||
    fail "metrics.listen not warned about: $(cat "$tmp/run.err")"
  grep -q "event=ingest_started.* port=$port .*ops_port=$ops " "$tmp/run.err" ||
    fail "ingest_started does not name both ports: $(grep ingest_started "$tmp/run.err")"
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  pid=
  [ $rc -eq 0 ] || fail "exit status $rc after SIGTERM, expected 0"
  grep -q 'event=stopped' "$tmp/run.err" || fail "no stopped event in the log"
  grep 'config_warning' "$tmp/run.err" | grep -q 'ingest.hmac.secret is a secret given with --set' ||
    fail "no warning for a secret given with --set: $(cat "$tmp/run.err")"
  grep 'config_warning' "$tmp/run.err" | grep -F "$tmp/open.conf" |
    grep -q 'readable by group or others.*ingest.oa.token' ||
    fail "no warning for a secret in a file others can read: $(cat "$tmp/run.err")"
  grep -q 'not-shown' "$tmp/run.err" && fail "a secret was logged"
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "wxguard-ingest command line: all checks passed"
