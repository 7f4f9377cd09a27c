#!/usr/bin/env bash
# Renders the Kubernetes files as `kubectl apply -k` would (kustomize v5, built by
# scripts/setup.sh): the base, and an overlay with the optional monitoring component. The base
# holds exactly the objects deploy/README.md describes and nothing of the Prometheus Operator
# (it must apply on a cluster without it); the overlay adds the PodMonitor and the
# PrometheusRule, whose rules are deploy/prometheus/alerts.yml's.
# Usage: test_kustomize.sh SOURCE_DIR [CACHE_DIR]
set -u
src=$(cd "$1" && pwd)
cache=${2:-${WXG_CACHE_DIR:-$src/.cache}}
kustomize=$cache/bin/kustomize
[ -x "$kustomize" ] || {
  echo "FAIL: $kustomize not found: run scripts/setup.sh" >&2
  exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
fail() {
  echo "FAIL: $*" >&2
  status=1
}

"$kustomize" build "$src/deploy/k8s" >"$tmp/base.yaml" 2>"$tmp/base.err" ||
  fail "the base does not build: $(cat "$tmp/base.err")"
mkdir -p "$tmp/overlay"
# kustomize takes only relative paths to other kustomizations.
rel=$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
  "$src/deploy/k8s" "$tmp/overlay")
cat >"$tmp/overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel
components:
  - $rel/monitoring
YAML
"$kustomize" build "$tmp/overlay" >"$tmp/overlay.yaml" 2>"$tmp/overlay.err" ||
  fail "the overlay with the monitoring component does not build: $(cat "$tmp/overlay.err")"

python3 - "$tmp/base.yaml" "$tmp/overlay.yaml" "$src/deploy/prometheus/alerts.yml" <<'PY' || status=1
import sys
import yaml

def objs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]

def kinds(docs):
    return sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)

base, overlay = objs(sys.argv[1]), objs(sys.argv[2])
want = sorted(["ConfigMap/wxguard-config", "Job/wxguard-topics",
               "Deployment/wxguard-consumer", "Deployment/wxguard-ingest",
               "PodDisruptionBudget/wxguard-consumer", "PodDisruptionBudget/wxguard-ingest",
               "Service/wxguard-ingest"])
bad = 0
if kinds(base) != want:
    print(f"FAIL: the base renders {kinds(base)}, expected {want}", file=sys.stderr)
    bad = 1
if any(d["apiVersion"].startswith("monitoring.coreos.com/") for d in base):
    print("FAIL: the base needs the Prometheus Operator", file=sys.stderr)
    bad = 1
extra = sorted(set(kinds(overlay)) - set(kinds(base)))
if extra != ["PodMonitor/wxguard", "PrometheusRule/wxguard"]:
    print(f"FAIL: the monitoring component adds {extra}", file=sys.stderr)
    bad = 1
with open(sys.argv[3], encoding="utf-8") as f:
    alerts = yaml.safe_load(f)
rule = next((d for d in overlay if d["kind"] == "PrometheusRule"), None)
if rule is not None and rule["spec"]["groups"] != alerts["groups"]:
    print("FAIL: the PrometheusRule's groups are not deploy/prometheus/alerts.yml's",
          file=sys.stderr)
    bad = 1
sys.exit(bad)
PY
[ $status -eq 0 ] && echo "kustomize: base and monitoring overlay render"
exit $status
