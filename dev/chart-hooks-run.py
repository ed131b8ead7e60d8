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
provides (existingSecret) come from --secret. A ServiceAccount hook is
"created" too: a pod naming a ServiceAccount the chart renders cannot start
before it exists (one the chart does not render is the cluster's).

With --deployment NAME (repeatable), after the hooks: the release's other
ConfigMaps are created, and each named Deployment's container runs as a
process until its liveness and readiness probes (httpGet on 127.0.0.1)
answer 200 and its output shows --wait-output TEXT (if given), then each
--check "PORT METHOD PATH STATUS [bearer ENV] [contains TEXT]" (PORT a
container port's name; ENV a variable of the container, e.g. a token from a
Secret) must answer STATUS (with TEXT in the body) within 20 s; then
SIGTERM, and it must exit 0. --sql "MYSQL-URL STATEMENT" runs once the
Deployments' checks start (to make a change the checks then see).

Every container starts with the environment a kubelet gives a pod
(pkg/kubelet/envvars): the `kubernetes` Service's variables always, and, when
the pod's enableServiceLinks is true or unset (or --service-links on), the
service links of every Service rendered in the release's namespace, each with
a made-up ClusterIP: {SVC}_SERVICE_HOST, {SVC}_SERVICE_PORT[_{PORT_NAME}],
{SVC}_PORT and {SVC}_PORT_{port}_{PROTO}[_PROTO|_PORT|_ADDR], the name upper
cased with '-' as '_'. The container's own env wins over a link of the same
name, as in the kubelet.

Prints one line per step; exit 0 when every hook succeeded, else 1.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml


def annotations(doc):
    return (doc.get("metadata") or {}).get("annotations") or {}


class Cluster:
    """The ConfigMaps and Secrets that exist so far, as directories of files."""

    def __init__(self, workdir, user_secrets):
        self.workdir, self.objects = workdir, {}
        # The release's Services (for the kubelet's service links) and the links mode (--service-links).
        self.services, self.links = [], "pod"
        # The ServiceAccounts the chart renders (the others are the cluster's).
        self.accounts = set()
        for spec, value in user_secrets.items():
            name, key = spec.split("/", 1)
            self.objects.setdefault(("Secret", name), {})[key] = value

    def create(self, doc):
        data = dict(doc.get("data") or {})
        data.update(doc.get("stringData") or {})
        self.objects[(doc["kind"], doc["metadata"]["name"])] = data

    def check_account(self, spec):
        """A pod cannot start before the ServiceAccount it names exists (when the chart renders it)."""
        account = spec.get("serviceAccountName")
        if account in self.accounts:
            self.get("ServiceAccount", account)

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


def env_name(name):
    return name.upper().replace("-", "_")


def service_link_env(service, cluster_ip):
    """The kubelet's variables for one Service (envvars.FromServices), in its order."""
    prefix, ports, env = env_name(service["metadata"]["name"]), service["spec"].get("ports") or [], {}
    if not ports:
        return env
    env[f"{prefix}_SERVICE_HOST"] = cluster_ip
    env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
    for p in ports:
        if p.get("name"):
            env[f"{prefix}_SERVICE_PORT_{env_name(p['name'])}"] = str(p["port"])
    for i, p in enumerate(ports):
        proto = p.get("protocol") or "TCP"
        url = f"{proto.lower()}://{cluster_ip}:{p['port']}"
        if i == 0:
            env[f"{prefix}_PORT"] = url
        port_prefix = f"{prefix}_PORT_{p['port']}_{proto.upper()}"
        env.update({port_prefix: url, f"{port_prefix}_PROTO": proto.lower(), f"{port_prefix}_PORT": str(p["port"]),
                    f"{port_prefix}_ADDR": cluster_ip})
    return env


KUBERNETES_SERVICE = {"metadata": {"name": "kubernetes"}, "spec": {"ports": [{"name": "https", "port": 443}]}}


def kubelet_env(services, pod_spec, links):
    """What the kubelet injects into a pod: the API server's Service, plus the namespace's service links when
    enabled (the pod's enableServiceLinks, true when unset; links="on" forces them)."""
    env = service_link_env(KUBERNETES_SERVICE, "10.96.0.1")
    if links == "on" or pod_spec.get("enableServiceLinks", True):
        for i, service in enumerate(services):
            ip = service["spec"].get("clusterIP")
            if ip in ("None", ""):  # headless: no links
                continue
            env.update(service_link_env(service, ip or f"10.96.1.{10 + i}"))
    return env


def container_env(cluster, job, c, dirs, base=None):
    """The container's environment as a process sees it: the kubelet's variables (base), then the container's
    env with volume paths mapped to DIR and secrets resolved."""
    mounts = [(m["mountPath"].rstrip("/"), dirs.get(m["name"])) for m in c.get("volumeMounts") or []]

    def local(value):
        for mount, path in mounts:
            if path and (value == mount or value.startswith(mount + "/")):
                return path + value[len(mount):]
        return value

    env = {"PATH": os.environ["PATH"], "HOME": cluster.workdir, **(base or {})}
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
    return env


def http_answer(method, url, token=None):
    """(status, body) of one request; (None, "") when nothing answers."""
    request = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError:
        return None, ""


def http_status(method, url, token=None):
    return http_answer(method, url, token)[0]


class Stop(Exception):
    """A Deployment's probe or start-up wait failed (already reported)."""


def run_deployment(cluster, doc, binary, checks, wait_output=None, sql=None, timeout=90):
    """Runs the Deployment's container until its probes answer, runs the checks, stops it with SIGTERM."""
    name = doc["metadata"]["name"]
    spec = doc["spec"]["template"]["spec"]
    cluster.check_account(spec)
    dirs = {v["name"]: cluster.volume_dir(name, v) for v in spec.get("volumes") or []}
    c = spec["containers"][0]
    env = container_env(cluster, name, c, dirs, kubelet_env(cluster.services, spec, cluster.links))
    ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
    command = [binary] + [str(a) for a in c.get("args") or []]
    log = open(os.path.join(cluster.workdir, f"{name}.log"), "w")
    process = subprocess.Popen(command, env=env, cwd=cluster.workdir, stdout=log, stderr=subprocess.STDOUT)
    started = time.monotonic()
    ok = True
    try:
        for probe in ("livenessProbe", "readinessProbe"):
            get = c[probe]["httpGet"]
            port = ports.get(get["port"], get["port"])
            url = f"http://127.0.0.1:{port}{get['path']}"
            while http_status("GET", url) != 200:
                if process.poll() is not None or time.monotonic() - started > timeout:
                    print(f"  Deployment {name}: {' '.join(command[1:])}: {probe} {get['path']} never answered 200 "
                          f"(exit {process.poll()}, {time.monotonic() - started:.1f} s)")
                    raise Stop()
                time.sleep(0.3)
            print(f"  Deployment {name}: {probe} {get['path']} -> 200 after {time.monotonic() - started:.1f} s")
        while wait_output and wait_output not in open(log.name).read():
            if process.poll() is not None or time.monotonic() - started > timeout:
                print(f"  Deployment {name}: its output never showed {wait_output!r} (exit {process.poll()})")
                raise Stop()
            time.sleep(0.3)
        if wait_output:
            print(f"  Deployment {name}: output shows {wait_output!r} after {time.monotonic() - started:.1f} s")
        if sql:
            url, statement = sql.split(" ", 1)
            u = urllib.parse.urlparse(url)
            subprocess.run(["mariadb", f"-h{u.hostname}", f"-P{u.port or 3306}", f"-u{u.username}", f"-p{u.password}",
                            u.path.lstrip("/"), "-e", statement], check=True)
            print(f"  Deployment {name}: ran {statement!r}")
        for check in checks:
            words = check.split()
            port, method, path, status = words[:4]
            rest = words[4:]
            auth = rest[:2] if rest[:1] == ["bearer"] else []
            text = " ".join(rest[3:]) if rest[2:3] == ["contains"] else " ".join(rest[1:]) if rest[:1] == ["contains"] else None
            token = env.get(auth[1]) if len(auth) == 2 else None
            if auth and token is None:
                print(f"  Deployment {name}: check {check!r}: the container has no {auth[-1]} to send")
                ok = False
                continue
            deadline = time.monotonic() + 20
            while True:
                got, body = http_answer(method, f"http://127.0.0.1:{ports.get(port, port)}{path}", token)
                if (str(got) == status and (text is None or text in body)) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            print(f"  Deployment {name}: {method} {path} on port {port}{' with ' + auth[1] if token else ''} -> {got}"
                  f"{f' (body has {text!r}: {text in body})' if text else ''}")
            if str(got) != status or (text is not None and text not in body):
                print(f"    expected {status}{f' with {text!r}' if text else ''}")
                ok = False
    except Stop:
        ok = False
    finally:
        signalled = process.poll() is None
        if signalled:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
    print(f"  Deployment {name}: {'SIGTERM -> ' if signalled else 'stopped by itself: '}exit {process.returncode}")
    if process.returncode != 0:
        ok = False
    if not ok:
        sys.stdout.write("".join(f"    | {line}\n" for line in open(log.name).read().splitlines()[-15:]))
    return ok


def run_job(cluster, doc, binary):
    job = doc["metadata"]["name"]
    spec = doc["spec"]["template"]["spec"]
    cluster.check_account(spec)
    dirs = {v["name"]: cluster.volume_dir(job, v) for v in spec.get("volumes") or []}
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        env = container_env(cluster, job, c, dirs, kubelet_env(cluster.services, spec, cluster.links))
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
    parser.add_argument("--deployment", action="append", default=[], help="after the hooks, run this Deployment")
    parser.add_argument("--check", action="append", default=[],
                        help='with --deployment: "PORT METHOD PATH STATUS [bearer ENV] [contains TEXT]" each must answer')
    parser.add_argument("--wait-output", help="with --deployment: wait for this in the process output before the checks")
    parser.add_argument("--timeout", type=float, default=90, help="with --deployment: seconds for the probes to answer")
    parser.add_argument("--sql", help='with --deployment: "MYSQL-URL STATEMENT" run before the checks')
    parser.add_argument("--service-links", choices=["pod", "on"], default="pod",
                        help="the kubelet's service links: as each pod's enableServiceLinks says, or on for every pod")
    args = parser.parse_args()
    docs = [d for d in yaml.safe_load_all(open(args.manifest)) if d]
    hooks = [d for d in docs if args.event in [e.strip() for e in annotations(d).get("helm.sh/hook", "").split(",")]]
    hooks.sort(key=lambda d: (int(annotations(d).get("helm.sh/hook-weight", "0")), d["metadata"]["name"]))
    cluster = Cluster(os.path.abspath(args.workdir), dict(s.split("=", 1) for s in args.secret))
    cluster.services = [d for d in docs if d["kind"] == "Service"]
    cluster.links = args.service_links
    cluster.accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    linked = kubelet_env(cluster.services, {"enableServiceLinks": True}, "on")
    print(f"  kubelet: {len(cluster.services)} Services, {len(linked)} service-link variables "
          f"({args.service_links}: {'every pod' if args.service_links == 'on' else 'as each pod says'}), "
          f"e.g. {', '.join(sorted(k for k in linked if k.startswith('ORDERPIPE'))[:3])}")
    for d in hooks:
        weight = annotations(d).get("helm.sh/hook-weight", "0")
        if d["kind"] in ("ConfigMap", "Secret", "ServiceAccount"):
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
    if not args.deployment:
        return
    for d in docs:
        if d["kind"] in ("ConfigMap", "Secret", "ServiceAccount") and d not in hooks:
            cluster.create(d)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for name in args.deployment:
        if name not in deployments:
            print(f"Deployment {name} is not rendered ({sorted(deployments)})")
            sys.exit(1)
        if not run_deployment(cluster, deployments[name], os.path.abspath(args.bin), args.check, args.wait_output, args.sql,
                              args.timeout):
            print(f"Deployment {name} failed")
            sys.exit(1)
    print(f"{len(args.deployment)} Deployments started, probed, checked and stopped")


if __name__ == "__main__":
    main()
