#!/usr/bin/env python3
"""Structural check of docker-compose.yml where docker-compose itself is not installed.

It parses the file as YAML and checks what `docker-compose config` would reject most often:
the top-level keys, that every service names an image or a build, that ports, environment and
healthchecks have the right shapes, and that named volumes used by services are declared.
Exit status 0 when the file passes, 1 with one line per problem otherwise.
"""
import sys

import yaml

TOP_LEVEL = {"version", "services", "volumes", "networks", "configs", "secrets", "name"}


def check(doc):
    problems = []
    if not isinstance(doc, dict):
        return ["the file is not a mapping"]
    for key in doc:
        if key not in TOP_LEVEL and not str(key).startswith("x-"):
            problems.append(f"unknown top-level key {key!r}")
    services = doc.get("services")
    if not isinstance(services, dict) or not services:
        return problems + ["no services"]
    declared = set((doc.get("volumes") or {}).keys())
    for name, svc in services.items():
        if not isinstance(svc, dict):
            problems.append(f"service {name}: not a mapping")
            continue
        if "image" not in svc and "build" not in svc:
            problems.append(f"service {name}: neither image nor build")
        for port in svc.get("ports", []):
            if not isinstance(port, (str, int, dict)):
                problems.append(f"service {name}: bad port entry {port!r}")
        env = svc.get("environment", {})
        if not isinstance(env, (dict, list)):
            problems.append(f"service {name}: environment must be a mapping or a list")
        hc = svc.get("healthcheck")
        if hc is not None and (not isinstance(hc, dict) or "test" not in hc):
            problems.append(f"service {name}: healthcheck without test")
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0] if isinstance(vol, str) else None
            if src and not src.startswith((".", "/", "~")) and src not in declared:
                problems.append(f"service {name}: volume {src!r} is not declared")
    return problems


def main():
    if len(sys.argv) != 2:
        print("usage: check_compose.py FILE", file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        try:
            doc = yaml.safe_load(f)
        except yaml.YAMLError as e:
            print(f"{sys.argv[1]}: {e}")
            return 1
    problems = check(doc)
    for p in problems:
        print(f"{sys.argv[1]}: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
