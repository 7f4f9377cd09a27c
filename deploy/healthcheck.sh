#!/bin/bash
# wxguard-healthcheck PORT PATH: exit 0 when http://127.0.0.1:PORT/PATH answers 200.
# The runtime image carries no HTTP client; bash's /dev/tcp is enough for a local probe.
set -u
port=${1:?port}
path=${2:-/healthz}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
IFS= read -r -t 3 status <&3 || exit 1
exec 3<&-
case $status in
  "HTTP/1."[01]" 200 "*) exit 0 ;;
  *) exit 1 ;;
esac
