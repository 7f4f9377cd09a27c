#!/usr/bin/env python3
"""Checks the deployment files in deploy/ and docker-compose.yml.

Usage: check_manifests.py <repository root>

Every YAML file must parse. Beyond that it checks what a reviewer would: Kubernetes objects carry
their required fields (probes on /healthz and /readyz, resources, a PodDisruptionBudget whose
selector matches a Deployment, config and secret references that exist, a termination grace
period longer than the consumer's drain budget), the compose services' health checks, start
order and stop grace, the systemd unit's hardening, the Dockerfile's stages, and that the Grafana
dashboard and the Prometheus rules use only metric names listed in docs/metrics.md. Ingest's
probes, health checks and scrapes go to its operations port (ingest.ops.listen), never to the
callback port, where those paths are 404, and its Kubernetes Service does not publish that port.

Exit status 0 when everything passes; 1 with one line per problem otherwise.
"""
import json
import os
import re
import subprocess
import sys

import yaml

problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def duration_ms(text, bare_is_ms=True):
    """A wxguard duration ("30s", "500ms", "5m", "1h", "7d", or bare ms) in milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    if unit is None and not bare_is_ms:
        raise ValueError(f"duration without unit: {text!r}")
    return n * {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000, None: 1}[unit]


def properties(text):
    """key = value lines, '#' and '!' comments."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def load_yaml_docs(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        problem(path, f"does not parse: {e}")
        return []


def metric_names_from_doc(root):
    with open(os.path.join(root, "docs/metrics.md"), encoding="utf-8") as f:
        return set(re.findall(r"`(wxg_[a-z0-9_]+)`", f.read()))


def metric_names_in_expr(expr):
    names = set()
    for name in re.findall(r"\bwxg_[a-z0-9_]+", expr):
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        names.add(name)
    return names


def check_metrics_usage(where, exprs, known):
    for expr in exprs:
        for name in sorted(metric_names_in_expr(expr)):
            if name not in known:
                problem(where, f"metric {name} is not listed in docs/metrics.md")


def grafana_exprs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from grafana_exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from grafana_exprs(v)


INGEST_OPS_DEFAULT = "127.0.0.1:9465"  # lib/conf.c


def port_of(addr):
    """The port of a wxguard host:port ("[v6]:port" too), or None."""
    m = re.fullmatch(r"\s*(?:\[[^\]]*\]|[^:\s]*):(\d+)\s*", str(addr or ""))
    return int(m.group(1)) if m else None


def ingest_ports(props, env=None):
    """(callback port, operations port, ops also on the callback port) of an ingest
    configuration: its properties, then WXG_* variables, which win."""
    env = env or {}
    listen = env.get("WXG_INGEST_LISTEN", props.get("ingest.listen", "127.0.0.1:8080"))
    ops = env.get("WXG_INGEST_OPS_LISTEN", props.get("ingest.ops.listen", INGEST_OPS_DEFAULT))
    both = env.get("WXG_INGEST_OPS_ON_CALLBACK_PORT",
                   props.get("ingest.ops.on.callback.port", "false"))
    return port_of(listen), port_of(ops), str(both).strip().lower() in ("true", "1", "yes", "on")


def ingest_secret_problem(props, env):
    """Why an ingest configuration would refuse to start (a non-loopback ingest.listen without a
    gateway secret, ingest.hmac.required left on), or None. `env` maps the WXG_* variables the
    program gets to their values (None: set from a Secret, value unknown)."""
    listen = env.get("WXG_INGEST_LISTEN", props.get("ingest.listen", "127.0.0.1:8080")) or ""
    host = re.sub(r":\d+\s*$", "", str(listen)).strip("[] ")
    if host in ("localhost", "::1") or host.startswith("127."):
        return None
    required = env.get("WXG_INGEST_HMAC_REQUIRED", props.get("ingest.hmac.required", "true"))
    if str(required).strip().lower() in ("false", "0", "no", "off"):
        return None
    for key in ("ingest.hmac.secret", "ingest.hmac.gateways"):
        var = "WXG_" + key.upper().replace(".", "_")
        for name in (var, var + "__FILE"):
            if name in env and (env[name] is None or str(env[name]).strip()):
                return None
        if props.get(key, "").strip():
            return None
    return (f"ingest.listen {listen} is not loopback and no gateway secret reaches ingest "
            "(WXG_INGEST_HMAC_SECRET or ingest.hmac.gateways): it would refuse to start")


def check_produce_timeout(where, props):
    """docs/ingest.md: an Official Account callback is given up after 5 s, so a request must be
    answered (503: retried) before that."""
    t = duration_ms(props.get("ingest.produce.timeout.ms", "4s"))
    if t >= 5000:
        problem(where, f"ingest.produce.timeout.ms is {t} ms: WeChat gives up after 5 s")


# Environment variables of secrets each program reads (lib/conf.c: the keys' programs); a secret
# handed to a program that does not use it only widens who can read it.
PROGRAM_SECRETS = {
    "consumer": ("WXG_REDIS_", "WXG_PLUGIN__", "WXG_LOG_ID_SALT", "WXG_KAFKA_"),
    "ingest": ("WXG_INGEST_", "WXG_LOG_ID_SALT", "WXG_KAFKA_"),
}


def check_pod_secrets(where, program, pod, readme, secrets_shipped):
    """Secrets reach a pod as files of Secret objects the manifests do not ship (a placeholder
    would start the pods with wrong credentials, and they would crash-loop): every WXG_*__FILE
    names a mounted file, every Secret is named in deploy/README.md (which says how to create
    it), and a program gets only secrets it reads."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for c in pod.get("containers") or []:
        if c.get("envFrom"):
            problem(where, "envFrom hands a whole Secret or ConfigMap to the program: name each "
                           "secret as a file (WXG_<KEY>__FILE)")
        mounts = {m.get("mountPath", "").rstrip("/"): m.get("name")
                  for m in c.get("volumeMounts") or []}
        for e in c.get("env") or []:
            name, value = e.get("name", ""), str(e.get("value") or "")
            if "secretKeyRef" in (e.get("valueFrom") or {}):
                problem(where, f"{name} comes from a Secret as a variable, not as a file")
            if not name.endswith("__FILE"):
                continue
            if not any(name.startswith(p) for p in PROGRAM_SECRETS.get(program, ())):
                problem(where, f"{name}: a secret the {program} does not read")
            mount = next((m for m in mounts if value.startswith(m + "/")), None)
            if mount is None:
                problem(where, f"{name} names {value}, which no volume mounts")
                continue
            vol = volumes.get(mounts[mount]) or {}
            sec = vol.get("secret")
            if sec is None:
                problem(where, f"{name} is read from volume {mounts[mount]}, not a Secret")
                continue
            sname = sec.get("secretName")
            if sname in secrets_shipped:
                problem(where, f"Secret {sname} is shipped with the manifests: a placeholder")
            if f"`{sname}`" not in readme:
                problem(where, f"Secret {sname} is not named in deploy/README.md")
            mode = sec.get("defaultMode")
            if mode is None or mode & 0o007:
                problem(where, f"Secret volume {mounts[mount]} is readable by others "
                               f"(defaultMode {mode})")


def check_topics_job(where, job, props_by_program):
    """The Job that creates the topics uses the ConfigMap's bootstrap address and creates
    every topic the programs name."""
    cs = (job.get("spec", {}).get("template", {}).get("spec", {}).get("containers")) or []
    env = {e.get("name"): str(e.get("value") or "") for c in cs for e in c.get("env") or []}
    cprops = props_by_program.get("consumer", {})
    iprops = props_by_program.get("ingest", {})
    boot = cprops.get("kafka.bootstrap.servers")
    if env.get("BOOTSTRAP") != boot:
        problem(where, f"BOOTSTRAP {env.get('BOOTSTRAP')} is not the ConfigMap's {boot}")
    made = {t.split(":")[0] for t in env.get("TOPICS", "").split()}
    wanted = set((cprops.get("consumer.topics") or "").replace(",", " ").split())
    wanted |= {cprops.get("dlq.topic"), iprops.get("ingest.topic")} - {None}
    for t in sorted(wanted - made):
        problem(where, f"topic {t} is not created")


def check_ingest_k8s(where, dep, services, props):
    """Ingest's probes and scrape annotation use the operations port; no Service publishes it."""
    cb_port, ops_port, both = ingest_ports(props)
    if ops_port is None:
        problem(where, "ingest.ops.listen is empty: the probes and the scrape have no port")
        return
    if "metrics.listen" in props:
        problem(where, "ingest.properties sets metrics.listen (the consumer's); "
                       "ingest's is ingest.ops.listen")
    tmpl = dep["spec"]["template"]
    for c in tmpl.get("spec", {}).get("containers") or []:
        env = {e.get("name"): e.get("value") for e in c.get("env") or []}
        why = ingest_secret_problem(props, env)
        if why:
            problem(where, why)
        named = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        if ops_port not in named.values():
            problem(where, f"no containerPort {ops_port} (ingest.ops.listen)")
        for probe in ("livenessProbe", "readinessProbe"):
            port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
            port = named.get(port, port)
            if port != ops_port and not (both and port == cb_port):
                problem(where, f"{probe} probes port {port}, not the operations port {ops_port}")
    ann = (tmpl.get("metadata") or {}).get("annotations") or {}
    if ann.get("prometheus.io/scrape") == "true" and str(ann.get("prometheus.io/port")) != str(
            ops_port):
        problem(where, f"prometheus.io/port is {ann.get('prometheus.io/port')}, "
                       f"not the operations port {ops_port}")
    labels = (tmpl.get("metadata") or {}).get("labels") or {}
    named = {p.get("name"): p.get("containerPort")
             for c in tmpl.get("spec", {}).get("containers") or [] for p in c.get("ports", [])}
    for fname, svc in services:
        sel = (svc.get("spec") or {}).get("selector") or {}
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            continue
        for sp in (svc.get("spec") or {}).get("ports") or []:
            target = sp.get("targetPort", sp.get("port"))
            if named.get(target, target) == ops_port:
                problem(f"{fname} Service/{svc['metadata']['name']}",
                        f"publishes the operations port {ops_port} beside the callback port")


def project_version(root):
    """The version in include/wxguard/common.h, its one place."""
    with open(os.path.join(root, "include/wxguard/common.h"), encoding="utf-8") as f:
        parts = dict(re.findall(r"^#define WXG_VERSION_(MAJOR|MINOR|PATCH) (\d+)$", f.read(), re.M))
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"


def check_image(where, image, version):
    """A wxguard image is named after its program and tagged with the version the build
    stamps (deploy/README.md: how to build and push it)."""
    name, _, tag = (image or "").partition(":")
    if name.rsplit("/", 1)[-1] in ("wxguard-consumer", "wxguard-ingest") and tag != version:
        problem(where, f"image {image} is not tagged {version}, the version the build produces")


def check_k8s(root, drain_ms):
    kdir = os.path.join(root, "deploy/k8s")
    objs = []
    for name in sorted(os.listdir(kdir)):
        if name.endswith((".yaml", ".yml")):
            for doc in load_yaml_docs(os.path.join(kdir, name)):
                objs.append((name, doc))
    by_kind = {}
    for name, doc in objs:
        if doc.get("kind") == "Kustomization":
            for res in doc.get("resources", []):
                if not os.path.exists(os.path.join(kdir, res)):
                    problem(name, f"kustomization lists missing {res}")
            continue
        for field in ("apiVersion", "kind", "metadata"):
            if field not in doc:
                problem(name, f"object without {field}")
        if not (doc.get("metadata") or {}).get("name"):
            problem(name, f"{doc.get('kind')} without metadata.name")
        by_kind.setdefault(doc.get("kind"), []).append((name, doc))

    configmaps = {d["metadata"]["name"]: d for _, d in by_kind.get("ConfigMap", [])}
    with open(os.path.join(root, "deploy/README.md"), encoding="utf-8") as f:
        readme = f.read()
    secrets = {d["metadata"]["name"] for _, d in by_kind.get("Secret", [])}
    deployments = by_kind.get("Deployment", [])
    if not deployments:
        problem("deploy/k8s", "no Deployment")
    for fname, dep in deployments:
        where = f"{fname} Deployment/{dep['metadata']['name']}"
        spec = dep.get("spec", {})
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        tmpl = spec.get("template", {})
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            problem(where, "selector.matchLabels does not match the pod template labels")
        pod = tmpl.get("spec", {})
        grace = pod.get("terminationGracePeriodSeconds")
        if not isinstance(grace, int):
            problem(where, "no terminationGracePeriodSeconds")
        aff = ((pod.get("affinity") or {}).get("podAntiAffinity")) or {}
        if not aff:
            problem(where, "no podAntiAffinity: replicas may share a node")
        if not (pod.get("securityContext") or {}).get("runAsNonRoot"):
            problem(where, "pod securityContext.runAsNonRoot is not true")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        containers = pod.get("containers") or []
        if not containers:
            problem(where, "no containers")
        for c in containers:
            cw = f"{where} container {c.get('name')}"
            check_image(cw, c.get("image"), project_version(root))
            ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                p = (c.get(probe) or {}).get("httpGet")
                if not p:
                    problem(cw, f"no {probe} (httpGet)")
                    continue
                if p.get("path") != path:
                    problem(cw, f"{probe} should probe {path}, not {p.get('path')}")
                port = p.get("port")
                if isinstance(port, str) and port not in ports:
                    problem(cw, f"{probe} port {port!r} is not a named container port")
            res = c.get("resources") or {}
            for part in ("requests", "limits"):
                for k in ("cpu", "memory"):
                    if k not in (res.get(part) or {}):
                        problem(cw, f"resources.{part}.{k} missing")
            sc = c.get("securityContext") or {}
            if sc.get("allowPrivilegeEscalation") is not False:
                problem(cw, "allowPrivilegeEscalation is not false")
            for ef in c.get("envFrom", []):
                ref = (ef.get("secretRef") or {}).get("name")
                if ref and ref not in secrets:
                    problem(cw, f"envFrom secret {ref} is not defined")
            for vm in c.get("volumeMounts", []):
                if vm.get("name") not in volumes:
                    problem(cw, f"volumeMount {vm.get('name')} has no volume")
        for v in volumes.values():
            cm = v.get("configMap")
            if cm:
                data = (configmaps.get(cm.get("name")) or {}).get("data")
                if data is None:
                    problem(where, f"configMap {cm.get('name')} is not defined")
                    continue
                for item in cm.get("items", []):
                    if item.get("key") not in data:
                        problem(where, f"configMap key {item.get('key')} is missing")
        program = "ingest" if "ingest" in dep["metadata"]["name"] else "consumer"
        check_pod_secrets(where, program, pod, readme, secrets)
        if "ingest" in dep["metadata"]["name"]:
            text = None
            for cm in configmaps.values():
                text = (cm.get("data") or {}).get("ingest.properties") or text
            check_ingest_k8s(where, dep, by_kind.get("Service", []), properties(text or ""))
            check_produce_timeout(where, properties(text or ""))
        # The consumer's grace period against its drain budget (from its ConfigMap).
        if "consumer" in dep["metadata"]["name"]:
            cm_drain = None
            for cm in configmaps.values():
                text = (cm.get("data") or {}).get("consumer.properties")
                if text:
                    cm_drain = duration_ms(
                        properties(text).get("consumer.drain.timeout.ms", "30s"))
            budget = max(d for d in (drain_ms, cm_drain) if d is not None)
            if isinstance(grace, int) and grace * 1000 <= budget + 5000:
                problem(where, f"terminationGracePeriodSeconds {grace} is not longer than the "
                               f"drain budget {budget / 1000:g} s plus the final commit")
    props_by_program = {}
    for cm in configmaps.values():
        for program in ("consumer", "ingest"):
            text = (cm.get("data") or {}).get(f"{program}.properties")
            if text:
                props_by_program[program] = properties(text)
    jobs = [(f, j) for f, j in by_kind.get("Job", []) if "topics" in j["metadata"]["name"]]
    if not jobs:
        problem("deploy/k8s", "no Job creates the topics")
    for fname, job in jobs:
        check_topics_job(f"{fname} Job/{job['metadata']['name']}", job, props_by_program)
    pdbs = by_kind.get("PodDisruptionBudget", [])
    if not pdbs:
        problem("deploy/k8s", "no PodDisruptionBudget")
    for fname, pdb in pdbs:
        sel = ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        matched = [
            d for _, d in deployments
            if sel and all(
                ((d["spec"]["template"].get("metadata") or {}).get("labels") or {}).get(k) == v
                for k, v in sel.items())
        ]
        if not matched:
            problem(f"{fname} PodDisruptionBudget/{pdb['metadata']['name']}",
                    "selector matches no Deployment's pods")
        spec = pdb.get("spec") or {}
        if "minAvailable" not in spec and "maxUnavailable" not in spec:
            problem(fname, "PodDisruptionBudget without minAvailable or maxUnavailable")
    consumers = [d for _, d in deployments if "consumer" in d["metadata"]["name"]]
    if consumers:
        names = {d["metadata"]["name"] for d in consumers}
        covered = any(
            m["metadata"]["name"] in names for _, p in pdbs for m in [
                d for _, d in deployments
                if all(((d["spec"]["template"].get("metadata") or {}).get("labels") or {}).get(k)
                       == v for k, v in ((p.get("spec") or {}).get("selector") or {}).get(
                           "matchLabels", {}).items())
            ])
        if not covered:
            problem("deploy/k8s", "the consumer Deployment has no PodDisruptionBudget")


def check_compose(root, drain_ms):
    docs = load_yaml_docs(os.path.join(root, "docker-compose.yml"))
    if not docs:
        return
    services = docs[0].get("services") or {}
    for want in ("kafka", "redis", "postgres", "ingest", "prometheus", "grafana"):
        if want not in services:
            problem("docker-compose.yml", f"no {want} service")
    consumers = [n for n in services if n.startswith("consumer")]
    if len(consumers) < 3:
        problem("docker-compose.yml", f"{len(consumers)} consumer replicas, want 3")
    for name, svc in services.items():
        where = f"docker-compose.yml service {name}"
        one_shot = str(svc.get("restart", "")) == "no"
        if not one_shot and "healthcheck" not in svc:
            problem(where, "no healthcheck")
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            if name.startswith("consumer") or name == "ingest":
                problem(where, "depends_on without conditions")
            deps = {d: {} for d in deps}
        for dep, cond in deps.items():
            if dep not in services:
                problem(where, f"depends on unknown service {dep}")
                continue
            c = (cond or {}).get("condition")
            if c == "service_healthy" and "healthcheck" not in services[dep]:
                problem(where, f"waits for {dep} to be healthy, but it has no healthcheck")
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0] if isinstance(vol, str) else None
            if src and src.startswith("./") and not os.path.exists(os.path.join(root, src)):
                problem(where, f"mounts missing {src}")
    redis_cmd = " ".join(map(str, (services.get("redis") or {}).get("command") or []))
    if "noeviction" not in redis_cmd or "--appendonly yes" not in redis_cmd:
        problem("docker-compose.yml service redis", "wants --maxmemory-policy noeviction and AOF")
    for name in consumers:
        svc = services[name]
        grace = svc.get("stop_grace_period")
        if grace is None or duration_ms(grace) <= drain_ms:
            problem(f"docker-compose.yml service {name}",
                    f"stop_grace_period {grace} is not longer than the drain budget")
        for dep in ("kafka", "redis"):
            if ((svc.get("depends_on") or {}).get(dep) or {}).get("condition") != "service_healthy":
                problem(f"docker-compose.yml service {name}", f"does not wait for {dep} healthy")
    # Ingest's health check goes to its operations port (the callback port answers 404).
    ingest = services.get("ingest") or {}
    with open(os.path.join(root, "deploy/config/ingest.properties"), encoding="utf-8") as f:
        iprops = properties(f.read())
    check_produce_timeout("deploy/config/ingest.properties", iprops)
    env = ingest.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env if "=" in e)
    cb_port, ops_port, both = ingest_ports(iprops, env)
    why = ingest_secret_problem(iprops, env)
    if why:
        problem("docker-compose.yml service ingest", why)
    test = [str(t) for t in ((ingest.get("healthcheck") or {}).get("test") or [])]
    if "wxguard-healthcheck" in test:
        hc_port = port_of(":" + test[test.index("wxguard-healthcheck") + 1])
        if hc_port != ops_port and not (both and hc_port == cb_port):
            problem("docker-compose.yml service ingest",
                    f"healthcheck probes port {hc_port}, not the operations port {ops_port}")
    # Prometheus scrapes what compose runs; ingest on its operations port.
    prom = load_yaml_docs(os.path.join(root, "deploy/prometheus/prometheus.yml"))
    for doc in prom:
        for job in doc.get("scrape_configs", []):
            for sc in job.get("static_configs", []):
                for t in sc.get("targets", []):
                    host = t.split(":")[0]
                    if host != "localhost" and host not in services:
                        problem("deploy/prometheus/prometheus.yml",
                                f"target {t} is not a compose service")
                    if host == "ingest" and port_of(t) != ops_port:
                        problem("deploy/prometheus/prometheus.yml",
                                f"target {t} is not ingest's operations port {ops_port}")
        for rf in doc.get("rule_files", []):
            if os.path.basename(rf) != "alerts.yml":
                problem("deploy/prometheus/prometheus.yml", f"unexpected rule file {rf}")


def check_alerts(root, known):
    docs = load_yaml_docs(os.path.join(root, "deploy/prometheus/alerts.yml"))
    exprs, names = [], set()
    for doc in docs:
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if "alert" not in rule or "expr" not in rule:
                    problem("deploy/prometheus/alerts.yml", f"rule without alert/expr: {rule}")
                    continue
                names.add(rule["alert"])
                exprs.append(rule["expr"])
    check_metrics_usage("deploy/prometheus/alerts.yml", exprs, known)
    used = set().union(*(metric_names_in_expr(e) for e in exprs)) if exprs else set()
    for topic, metric in (("lag", "wxg_consumer_lag"), ("stall", "wxg_stalled"),
                          ("DLQ rate", "wxg_dlq_writes_total"),
                          ("lease-lost rate", "wxg_lease_lost_total"),
                          ("commit failures", "wxg_commit_failures_total")):
        if metric not in used:
            problem("deploy/prometheus/alerts.yml", f"no alert on {topic} ({metric})")


def check_grafana(root, known):
    path = os.path.join(root, "deploy/grafana/dashboards/wxguard.json")
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        problem(path, f"does not parse: {e}")
        return
    exprs = list(grafana_exprs(dash))
    if not exprs:
        problem(path, "no queries")
    check_metrics_usage("deploy/grafana/dashboards/wxguard.json", exprs, known)
    uids = set()
    for doc in load_yaml_docs(os.path.join(root, "deploy/grafana/provisioning/datasources/"
                                                 "prometheus.yml")):
        uids |= {d.get("uid") for d in doc.get("datasources", [])}
    for p in dash.get("panels", []):
        ds = (p.get("datasource") or {}).get("uid")
        if p.get("type") != "row" and ds not in uids:
            problem(path, f"panel {p.get('title')!r} uses datasource {ds}, not provisioned")


def check_systemd(root, drain_ms):
    """The units (templates, written with the installed paths by `cmake --install`) run the
    installed programs, hardened, each with a stop timeout longer than its program's drain."""
    units = {"wxguard-consumer@.service.in": ("wxguard-consumer", drain_ms),
             "wxguard-ingest.service.in": ("wxguard-ingest", 4000 + 5000)}
    for name, (prog, stop_ms) in units.items():
        path = os.path.join(root, "deploy/systemd", name)
        if not os.path.exists(path):
            problem(path, "missing")
            continue
        with open(path, encoding="utf-8") as f:
            lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        kv = {}
        for l in lines:
            k, sep, v = l.partition("=")
            if sep:
                kv.setdefault(k, []).append(v)
        want = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
                "ProtectHome": "yes", "CapabilityBoundingSet": ""}
        for k, v in want.items():
            if v not in kv.get(k, []):
                problem(path, f"{k}={v} missing")
        if "yes" not in kv.get("DynamicUser", []) and not kv.get("User"):
            problem(path, "no dedicated user")
        start = kv.get("ExecStart", [""])[0]
        if not start.startswith(f"@WXG_BINDIR@/{prog} "):
            problem(path, f"ExecStart does not run the installed {prog}: {start}")
        if not kv.get("Documentation", [""])[0].startswith("file://@WXG_DOCDIR@/"):
            problem(path, "Documentation= does not name an installed document")
        stop = kv.get("TimeoutStopSec", [None])[0]
        if stop is None or duration_ms(stop if not stop.isdigit() else stop + "s") <= stop_ms:
            problem(path, f"TimeoutStopSec {stop} is not longer than the drain budget")


def check_dockerfile(root):
    path = os.path.join(root, "deploy/Dockerfile")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not re.search(r"^FROM debian:bookworm AS build$", text, re.M):
        problem(path, "no build stage on debian:bookworm")
    if not re.search(r"^FROM debian:bookworm-slim AS runtime$", text, re.M):
        problem(path, "no runtime stage on debian:bookworm-slim")
    runtime = text.split("AS runtime", 1)[-1]
    if re.search(r"\b[a-z0-9.+-]+-dev\b", runtime):
        problem(path, "the runtime stages install -dev packages")
    users = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problem(path, "the runtime does not run as an unprivileged user")
    if "HEALTHCHECK" not in runtime:
        problem(path, "no HEALTHCHECK")
    # The ingest stage exposes its operations port and checks its health there.
    stage = re.search(r"^FROM runtime AS ingest$(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    if not stage:
        problem(path, "no ingest stage")
    else:
        body = stage.group(1)
        envs = dict(re.findall(r"^ENV\s+(WXG_[A-Z0-9_]+)=(\S+)", body, re.M))
        _, ops_port, _ = ingest_ports({}, envs)
        exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.*)$", body, re.M)
                   for p in line.split()}
        if ops_port not in exposed:
            problem(path, f"the ingest stage does not EXPOSE its operations port {ops_port}")
        hc = re.search(r'"wxguard-healthcheck",\s*"(\d+)"', body)
        if not hc or int(hc.group(1)) != ops_port:
            problem(path, f"the ingest stage's HEALTHCHECK is not on its operations port {ops_port}")
    for prog in ("wxguard-consumer", "wxguard-ingest", "wxguardctl"):
        if not re.search(rf'^ENTRYPOINT \["{prog}"\]', text, re.M):
            problem(path, f"no entrypoint for {prog}")


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = sys.argv[1]
    # Every YAML file parses.
    yamls = [os.path.join(root, "docker-compose.yml")]
    for d, _, files in os.walk(os.path.join(root, "deploy")):
        yamls += [os.path.join(d, f) for f in files if f.endswith((".yml", ".yaml"))]
    for y in sorted(yamls):
        load_yaml_docs(y)
    with open(os.path.join(root, "deploy/config/consumer.properties"), encoding="utf-8") as f:
        drain_ms = duration_ms(properties(f.read()).get("consumer.drain.timeout.ms", "30s"))
    known = metric_names_from_doc(root)
    check_k8s(root, drain_ms)
    check_compose(root, drain_ms)
    check_alerts(root, known)
    check_grafana(root, known)
    check_systemd(root, drain_ms)
    check_dockerfile(root)
    gen = os.path.join(root, "deploy/k8s/monitoring/generate.py")
    if subprocess.run([sys.executable, gen, root, "--check"]).returncode != 0:
        problem("deploy/k8s/monitoring/prometheusrule.yaml",
                "stale: it differs from what generate.py makes of deploy/prometheus/alerts.yml")
    for p in problems:
        print(p)
    print(f"check_manifests: {len(yamls)} YAML files, {len(problems)} problem(s)",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
