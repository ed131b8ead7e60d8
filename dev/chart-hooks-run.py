#!/usr/bin/env python3
"""Runs the hooks of a rendered chart the way Helm would, with a local binary.

  chart-hooks-run.py MANIFEST --bin ORDERPIPE --workdir DIR [--event pre-install]
                     [--secret NAME/KEY=VALUE ...]

Takes the hooks of EVENT from `helm template` output in Helm's order (weight,
then name) and, for each: a ConfigMap or Secret is "created" (its data
written under DIR); a Job runs its init containers, then its containers, as
processes of ORDERPIPE with the container's args and env, and the ConfigMap
and Secret volumes it mounts mapped to DIR. As in a cluster, a Job whose
ConfigMap or Secret does not exist yet cannot start, and a failing step fails
the hook and stops the phase (Helm fails the release). Secrets the user
provides (existingSecret) come from --secret.

Prints one line per step; exit 0 when every hook succeeded, else 1.
"""
import argparse
import os
import subprocess
import sys
import time

import yaml


def annotations(doc):
    return (doc.get("metadata") or {}).get("annotations") or {}


class Cluster:
    """The ConfigMaps and Secrets that exist so far, as directories of files."""

    def __init__(self, workdir, user_secrets):
        self.workdir, self.objects = workdir, {}
        for spec, value in user_secrets.items():
            name, key = spec.split("/", 1)
            self.objects.setdefault(("Secret", name), {})[key] = value

    def create(self, doc):
        data = dict(doc.get("data") or {})
        data.update(doc.get("stringData") or {})
        self.objects[(doc["kind"], doc["metadata"]["name"])] = data

    def get(self, kind, name):
        if (kind, name) not in self.objects:
            raise RuntimeError(f"{kind} {name} does not exist (yet): the pod cannot start")
        return self.objects[(kind, name)]

    def volume_dir(self, job, volume):
        """Writes a ConfigMap or Secret volume's files; returns its directory (None: not backed by one)."""
        if "configMap" in volume:
            kind, name, items = "ConfigMap", volume["configMap"]["name"], volume["configMap"].get("items")
        elif "secret" in volume:
            kind, name, items = "Secret", volume["secret"]["secretName"], volume["secret"].get("items")
        else:
            return None
        data = self.get(kind, name)
        files = {i["path"]: i["key"] for i in items} if items else {k: k for k in data}
        path = os.path.join(self.workdir, job, volume["name"])
        os.makedirs(path, exist_ok=True)
        for file, key in files.items():
            if key not in data:
                raise RuntimeError(f"{kind} {name} has no key {key}")
            with open(os.path.join(path, file), "w") as f:
                f.write(data[key])
        return path


def run_job(cluster, doc, binary):
    job = doc["metadata"]["name"]
    spec = doc["spec"]["template"]["spec"]
    dirs = {v["name"]: cluster.volume_dir(job, v) for v in spec.get("volumes") or []}
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        mounts = [(m["mountPath"].rstrip("/"), dirs.get(m["name"])) for m in c.get("volumeMounts") or []]

        def local(value):
            for mount, path in mounts:
                if path and (value == mount or value.startswith(mount + "/")):
                    return path + value[len(mount):]
            return value

        env = {"PATH": os.environ["PATH"], "HOME": cluster.workdir}
        for e in c.get("env") or []:
            source = e.get("valueFrom") or {}
            if "value" in e:
                env[e["name"]] = local(e["value"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[e["name"]] = cluster.get("Secret", ref["name"]).get(ref["key"])
                if env[e["name"]] is None:
                    raise RuntimeError(f"Secret {ref['name']} has no key {ref['key']}")
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[e["name"]] = cluster.get("ConfigMap", ref["name"])[ref["key"]]
            elif "fieldRef" in source:
                env[e["name"]] = f"{job}-hookrun"
        command = [binary] + [str(a) for a in c.get("args") or []]
        started = time.monotonic()
        done = subprocess.run(command, env=env, cwd=cluster.workdir, capture_output=True, text=True)
        took = time.monotonic() - started
        print(f"  Job {job} {c['name']}: {' '.join(command[1:])} -> exit {done.returncode} ({took:.1f} s)")
        if done.returncode != 0:
            sys.stdout.write("".join(f"    | {line}\n" for line in (done.stdout + done.stderr).splitlines()[-15:]))
            return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest")
    parser.add_argument("--bin", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--event", default="pre-install")
    parser.add_argument("--secret", action="append", default=[], help="NAME/KEY=VALUE of a user-provided Secret")
    args = parser.parse_args()
    docs = [d for d in yaml.safe_load_all(open(args.manifest)) if d]
    hooks = [d for d in docs if args.event in [e.strip() for e in annotations(d).get("helm.sh/hook", "").split(",")]]
    hooks.sort(key=lambda d: (int(annotations(d).get("helm.sh/hook-weight", "0")), d["metadata"]["name"]))
    cluster = Cluster(os.path.abspath(args.workdir), dict(s.split("=", 1) for s in args.secret))
    for d in hooks:
        weight = annotations(d).get("helm.sh/hook-weight", "0")
        if d["kind"] in ("ConfigMap", "Secret"):
            cluster.create(d)
            print(f"  {args.event} {d['kind']} {d['metadata']['name']} (weight {weight}) created")
        elif d["kind"] == "Job":
            try:
                ok = run_job(cluster, d, os.path.abspath(args.bin))
            except RuntimeError as e:
                print(f"  Job {d['metadata']['name']} cannot start: {e}")
                ok = False
            if not ok:
                print(f"{args.event} hook Job {d['metadata']['name']} (weight {weight}) failed: the release fails")
                sys.exit(1)
        else:
            print(f"  {args.event} {d['kind']} {d['metadata']['name']}: not run here", file=sys.stderr)
    print(f"{args.event}: {len(hooks)} hooks succeeded in Helm's order")


if __name__ == "__main__":
    main()
