#!/usr/bin/env bash
# Every configuration file under deploy/ passes its program's own --check: the properties files
# of deploy/config/ and the ones the Kubernetes ConfigMap carries (each with the warnings the
# program prints). --check contacts no server.
# Usage: check_configs.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
# The programs read WXG_* variables as configuration: the test runner's own (the timeout scale,
# the fixture's addresses) are left out, so that the files alone are checked.
unset_wxg=()
while IFS='=' read -r name _; do
  [[ $name == WXG_* ]] && unset_wxg+=(-u "$name")
done < <(env)
check() {
  local prog=$1 file=$2 what=$3
  if ! env "${unset_wxg[@]}" "$build/cmd/$prog/$prog" --config "$file" --check >"$tmp/out" 2>&1; then
    echo "FAIL: $what does not pass $prog --check: $(cat "$tmp/out")" >&2
    status=1
  elif grep -q 'warning:' "$tmp/out"; then
    echo "FAIL: $what draws warnings from $prog --check: $(cat "$tmp/out")" >&2
    status=1
  fi
}
for p in consumer ingest; do
  check "wxguard-$p" "$src/deploy/config/$p.properties" "deploy/config/$p.properties"
done
python3 - "$src/deploy/k8s/configmap.yaml" "$tmp" <<'PY' || status=1
import os, sys, yaml
with open(sys.argv[1], encoding="utf-8") as f:
    cm = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "ConfigMap")
for key in ("consumer.properties", "ingest.properties"):
    with open(os.path.join(sys.argv[2], "cm-" + key), "w", encoding="utf-8") as out:
        out.write(cm["data"][key])
PY
for p in consumer ingest; do
  check "wxguard-$p" "$tmp/cm-$p.properties" "the ConfigMap's $p.properties"
done
[ $status -eq 0 ] && echo "deploy configurations: every one passes --check"
exit $status
