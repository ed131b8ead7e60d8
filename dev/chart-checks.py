#!/usr/bin/env python3
"""Render-time checks of the orderpipe Helm chart, over `helm template` output.

  chart-checks.py hooks MANIFEST [--user-secret NAME ...] [--values FILE ...]
      Every ConfigMap or Secret that a hook Job (or hook Pod) mounts or reads
      (volumes, projected volumes, envFrom, env valueFrom, imagePullSecrets;
      likewise a ServiceAccount or PVC the chart renders) is either a hook
      of the same events with a strictly lower helm.sh/hook-weight, or a
      Secret the user provides (--user-secret, or existingSecret of the
      --values files). Helm creates hooks before ordinary resources, so
      anything else does not exist yet on a first install (the pod waits
      until the install times out) and holds the previous release's data on
      an upgrade.

  chart-checks.py keda MANIFEST [--require-auth]
      When the rendered config turns SASL or TLS on (kafka.options
      security.protocol), every KEDA kafka trigger uses the same settings as
      the pods it scales: sasl and tls in the trigger match the config, and
      its TriggerAuthentication takes the password from the very Secret key
      the pods read, the user name from the config the pods read, and the CA
      from the Secret key the pods mount at ssl.ca.location. --require-auth:
      also fail unless at least one trigger authenticates (values with SASL on).

  chart-checks.py keda-pause MANIFEST
      Each ScaledObject holds its replica count while an operator pauses its
      group, by the outside tools' own rules: KEDA's scalingModifiers formula
      is compiled and run the way KEDA does (dev/keda-formula, expr-lang/expr)
      over the values of its named triggers, and the triggers' PromQL runs in
      promtool's rule unit tests over the series the persisters export (two
      replicas, another group beside it, and no series at all). Running: the
      group's lag; paused: ceil(value / target) is its live members.

  chart-checks.py roles MANIFEST --values values.yaml [--values FILE ...]
      Each consumers[] group and subscriptions[] entry of the values has its
      Deployment (consume --group G / deliver --subscription NAME, declared
      in the config its pods read), the DLQ persister exports broker-side
      lag for every one of those groups (lag.groups), and the schema hook
      runs `schema check` before `schema register`.

  chart-checks.py args MANIFEST --bin ORDERPIPE
      Every container's args parse in the binary (ORDERPIPE ARGS --help): the
      chart passes no subcommand or flag the binary does not have.

  chart-checks.py netpol MANIFEST --values values.yaml [--values FILE ...]
      NetworkPolicies (networkPolicy.enabled): every ingress rule names its
      peers (a rule without `from` admits every source), every port a rule
      opens is a container port of the pods it selects, the router's admin
      port admits exactly networkPolicy.adminFrom and the console's port
      exactly consoleFrom (plus metricsFrom on httpPort), and no policy
      selects another role's pods (the order API stays open to its clients).

  chart-checks.py accounts MANIFEST
      Every pod (Deployments, Jobs, CronJobs) runs as a ServiceAccount and
      mounts no token (automountServiceAccountToken: false on the pod and on
      every ServiceAccount the chart renders).

MANIFEST `-` reads stdin. Exit 0 and one summary line when the chart passes;
exit 1 with one line per problem otherwise.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import yaml

HOOK = "helm.sh/hook"
WEIGHT = "helm.sh/hook-weight"


def load(path):
    text = sys.stdin.read() if path == "-" else open(path).read()
    return [d for d in yaml.safe_load_all(text) if d]


def annotations(doc):
    return (doc.get("metadata") or {}).get("annotations") or {}


def hook_events(doc):
    """The hook events of a manifest (empty set: not a hook)."""
    value = annotations(doc).get(HOOK, "")
    return {e.strip() for e in value.split(",") if e.strip()}


def hook_weight(doc):
    return int(annotations(doc).get(WEIGHT, "0"))


def pod_spec(doc):
    kind = doc["kind"]
    if kind == "Pod":
        return doc["spec"]
    if kind in ("Job", "Deployment", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def pod_inputs(spec):
    """(kind, name, where) of every ConfigMap and Secret a pod spec reads (and
    the ServiceAccount and PVCs it needs, which have the same problem)."""
    found = []
    for v in spec.get("volumes") or []:
        if "configMap" in v:
            found.append(("ConfigMap", v["configMap"]["name"], f"volume {v['name']}"))
        if "secret" in v:
            found.append(("Secret", v["secret"]["secretName"], f"volume {v['name']}"))
        for s in (v.get("projected") or {}).get("sources") or []:
            if "configMap" in s:
                found.append(("ConfigMap", s["configMap"]["name"], f"projected volume {v['name']}"))
            if "secret" in s:
                found.append(("Secret", s["secret"]["name"], f"projected volume {v['name']}"))
        if "persistentVolumeClaim" in v:
            found.append(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], f"volume {v['name']}"))
    if spec.get("serviceAccountName"):
        found.append(("ServiceAccount", spec["serviceAccountName"], "serviceAccountName"))
    for p in spec.get("imagePullSecrets") or []:
        found.append(("Secret", p["name"], "imagePullSecrets"))
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        for e in c.get("envFrom") or []:
            if "configMapRef" in e:
                found.append(("ConfigMap", e["configMapRef"]["name"], f"container {c['name']} envFrom"))
            if "secretRef" in e:
                found.append(("Secret", e["secretRef"]["name"], f"container {c['name']} envFrom"))
        for e in c.get("env") or []:
            ref = e.get("valueFrom") or {}
            if "configMapKeyRef" in ref:
                found.append(("ConfigMap", ref["configMapKeyRef"]["name"], f"container {c['name']} env {e['name']}"))
            if "secretKeyRef" in ref:
                found.append(("Secret", ref["secretKeyRef"]["name"], f"container {c['name']} env {e['name']}"))
    return found


def check_hooks(docs, user_secrets):
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in docs
                if d["kind"] in ("ConfigMap", "Secret", "ServiceAccount", "PersistentVolumeClaim")}
    problems, jobs, inputs = [], 0, set()
    for d in docs:
        events = hook_events(d)
        if d["kind"] not in ("Job", "Pod") or not events:
            continue
        jobs += 1
        job, weight = f"{d['kind']} {d['metadata']['name']}", hook_weight(d)
        for kind, name, where in pod_inputs(pod_spec(d)):
            inputs.add((kind, name))
            source = rendered.get((kind, name))
            if source is None:
                if kind == "Secret" and name in user_secrets or kind in ("ServiceAccount", "PersistentVolumeClaim"):
                    continue  # the user's Secret, or an object of the cluster the chart does not own
                problems.append(f"{job} ({where}) reads {kind} {name}, which the chart does not render "
                                f"and which is not a user-provided Secret ({', '.join(sorted(user_secrets)) or 'none'})")
                continue
            source_events = hook_events(source)
            if not source_events:
                problems.append(f"{job} (hook {','.join(sorted(events))}, weight {weight}, {where}) reads {kind} {name}, "
                                f"which is not a hook: Helm creates it after the hooks, so a first install waits "
                                f"for it and an upgrade reads the previous release's copy")
                continue
            if not events <= source_events:
                problems.append(f"{job} runs on {','.join(sorted(events - source_events))} but {kind} {name} "
                                f"is a hook of {','.join(sorted(source_events))} only")
            if hook_weight(source) >= weight:
                problems.append(f"{job} (weight {weight}) reads {kind} {name} of weight {hook_weight(source)}: "
                                f"it must be strictly lower so it exists before the Job starts")
    if problems:
        return problems
    print(f"hook inputs: {jobs} hook Jobs read {len(inputs)} ConfigMaps/Secrets, each a hook of lower weight "
          f"or a user-provided Secret")
    return []


KEDA_SASL = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}


def env_secret(container, name):
    for e in container.get("env") or []:
        if e["name"] == name:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            return (ref["name"], ref["key"]) if ref else None
    return None


def mounted_secret_file(spec, container, path):
    """(secret name, key) of the Secret file mounted at `path`, if any."""
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        v = volumes.get(m["name"], {})
        if "secret" not in v:
            continue
        for item in v["secret"].get("items") or []:
            if f"{m['mountPath'].rstrip('/')}/{item['path']}" == path:
                return (v["secret"]["secretName"], item["key"])
    return None


def pods_config(spec, container, maps):
    """The config file the container reads (ORDERPIPE_CONFIG), from its ConfigMap volume."""
    path = next((e.get("value") for e in container.get("env") or [] if e["name"] == "ORDERPIPE_CONFIG"), None)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        source = volumes.get(m["name"], {}).get("configMap")
        if not source or not path or not path.startswith(m["mountPath"].rstrip("/") + "/"):
            continue
        file = path[len(m["mountPath"].rstrip("/")) + 1:]
        key = next((i["key"] for i in source.get("items") or [] if i["path"] == file), file)
        data = (maps.get(source["name"], {}).get("data") or {}).get(key)
        return json.loads(data) if data else None
    return None


def check_keda(docs, require_auth):
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    auths = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"}
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap" and not hook_events(d)}
    problems, triggers, protocols, authenticated = [], 0, set(), 0
    for so in (d for d in docs if d["kind"] == "ScaledObject"):
        target = deployments.get(so["spec"]["scaleTargetRef"]["name"])
        if target is None:
            problems.append(f"ScaledObject {so['metadata']['name']} scales a Deployment the chart does not render")
            continue
        spec = pod_spec(target)
        container = spec["containers"][0]
        config = pods_config(spec, container, maps)
        if config is None:
            problems.append(f"Deployment {target['metadata']['name']}: no rendered config file at ORDERPIPE_CONFIG")
            continue
        kafka = config["kafka"]
        options = kafka.get("options") or {}
        protocol = options.get("security.protocol", "PLAINTEXT").upper()
        sasl_on, tls_on = protocol.startswith("SASL_"), protocol.endswith("SSL")
        protocols.add(protocol + (f", CA {options['ssl.ca.location']}" if options.get("ssl.ca.location") else ""))
        for t in so["spec"]["triggers"]:
            if t["type"] != "kafka":
                continue
            triggers += 1
            where = f"ScaledObject {so['metadata']['name']} kafka trigger"
            meta = t.get("metadata") or {}
            args = container.get("args") or []
            flag = lambda name: args[args.index(name) + 1] if name in args else None
            group = flag("--group") or (f"http.{flag('--subscription')}" if "deliver" in args else None)
            if meta.get("consumerGroup") != group:
                problems.append(f"{where}: consumerGroup {meta.get('consumerGroup')!r} is not the group its pods run {group!r}")
            topic = flag("--topic") or config["topics"]["order_events"]["name"]
            if meta.get("topic") != topic:
                problems.append(f"{where}: topic {meta.get('topic')!r} is not the topic its pods read {topic!r}")
            if meta.get("bootstrapServers") != kafka["bootstrap_servers"]:
                problems.append(f"{where}: bootstrapServers {meta.get('bootstrapServers')!r} is not the pods' "
                                f"{kafka['bootstrap_servers']!r}")
            want_tls = "enable" if tls_on else "disable"
            if meta.get("tls", "disable") != want_tls:
                problems.append(f"{where}: tls is {meta.get('tls', 'disable')!r}, the pods use "
                                f"security.protocol {protocol} (tls {want_tls})")
            want_sasl = KEDA_SASL.get(options.get("sasl.mechanism", "").upper(), "?") if sasl_on else "none"
            if meta.get("sasl", "none") != want_sasl:
                problems.append(f"{where}: sasl is {meta.get('sasl', 'none')!r}, the pods use "
                                f"{protocol} {options.get('sasl.mechanism', '')} (sasl {want_sasl})")
            ca_path = options.get("ssl.ca.location")
            if not sasl_on and not ca_path:
                continue
            ref = (t.get("authenticationRef") or {}).get("name")
            auth = auths.get(ref)
            if auth is None:
                problems.append(f"{where}: SASL/TLS is on but authenticationRef {ref!r} names no rendered "
                                f"TriggerAuthentication")
                continue
            authenticated += 1
            secret_refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"].get("secretTargetRef") or []}
            map_refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"].get("configMapTargetRef") or []}
            if sasl_on:
                pods = env_secret(container, "ORDERPIPE_KAFKA__SASL_PASSWORD")
                if pods is None or secret_refs.get("password") != pods:
                    problems.append(f"{where}: TriggerAuthentication {ref} password {secret_refs.get('password')} "
                                    f"is not the Secret key the pods read {pods}")
                user = map_refs.get("username")
                value = (maps.get(user[0], {}).get("data") or {}).get(user[1]) if user else None
                if value is None or value != options.get("sasl.username"):
                    problems.append(f"{where}: TriggerAuthentication {ref} username ({user} = {value!r}) is not "
                                    f"the pods' sasl.username {options.get('sasl.username')!r}")
            if ca_path:
                pods = mounted_secret_file(spec, container, ca_path)
                if pods is None or secret_refs.get("ca") != pods:
                    problems.append(f"{where}: TriggerAuthentication {ref} ca {secret_refs.get('ca')} is not the "
                                    f"Secret key the pods mount at ssl.ca.location {ca_path} ({pods})")
    if require_auth and not authenticated:
        problems.append("--require-auth: no kafka trigger authenticates through a TriggerAuthentication "
                        "(these values should turn KEDA and SASL on)")
    if problems:
        return problems
    print(f"keda: {triggers} kafka triggers use their pods' settings (security.protocol {'; '.join(sorted(protocols)) or '-'})")
    return []


def check_keda_pause(docs):
    """See the module doc (keda-pause)."""
    problems, formulas, queries = [], [], []
    for so in (d for d in docs if d["kind"] == "ScaledObject"):
        where = f"ScaledObject {so['metadata']['name']}"
        modifiers = ((so["spec"].get("advanced") or {}).get("scalingModifiers")) or {}
        triggers = {t.get("name"): t for t in so["spec"]["triggers"]}
        kafka = [t for t in so["spec"]["triggers"] if t["type"] == "kafka"]
        if not modifiers.get("formula") or len(kafka) != 1 or not kafka[0].get("name"):
            problems.append(f"{where}: no scalingModifiers formula over a named kafka trigger: "
                            f"KEDA scales a paused group on the lag its pause builds up")
            continue
        group = kafka[0]["metadata"]["consumerGroup"]
        if modifiers.get("metricType", "AverageValue") != "AverageValue":
            problems.append(f"{where}: metricType {modifiers['metricType']!r}, not AverageValue (replicas = value / target)")
        names = {"lag": kafka[0]["name"]}
        for role, metric in (("paused", "orderpipe_group_paused"), ("members", "orderpipe_group_members")):
            found = [n for n, t in triggers.items() if t["type"] == "prometheus" and metric in t["metadata"].get("query", "")]
            if len(found) != 1:
                problems.append(f"{where}: {len(found)} prometheus triggers read {metric}, want 1")
                continue
            names[role] = found[0]
            queries.append((where, role, group, metric, triggers[found[0]]["metadata"]["query"]))
        if len(names) == 3:
            formulas.append((where, group, float(modifiers["target"]), names, modifiers["formula"],
                             [n for n in triggers if n]))
    # The formula, as KEDA compiles and runs it.
    cases = [(5000, 0, 2), (0, 0, 3), (250_000, 1, 3), (250_000, 1, 0), (10, 1, 7)]
    request = [{"formula": f, "triggers": all_names,
                "cases": [{names["lag"]: lag, names["paused"]: paused, names["members"]: members}
                          for lag, paused, members in cases]}
               for _, _, _, names, f, all_names in formulas]
    if request:
        tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keda-formula")
        run = subprocess.run(["go", "run", "."], cwd=tool, input=json.dumps(request),
                             capture_output=True, text=True)
        if run.returncode != 0:
            return problems + [f"KEDA's formula compiler refused: {run.stderr.strip()}"]
        for (where, _, target, _, formula, _), values in zip(formulas, json.loads(run.stdout)):
            for (lag, paused, members), value in zip(cases, values):
                if paused and math.ceil(value / target) != members:
                    problems.append(f"{where}: paused with {members} members and lag {lag}, {formula!r} = {value}: "
                                    f"{math.ceil(value / target)} replicas, not {members}")
                if not paused and value != lag:
                    problems.append(f"{where}: running with lag {lag}, {formula!r} = {value}, not the lag")
    # The queries, as Prometheus evaluates them.
    groups = sorted({q[2] for q in queries})
    if groups:
        series = []
        for i, g in enumerate(groups):
            for pod in ("persister-a", "persister-b"):
                series.append({"series": f'orderpipe_group_paused{{group="{g}",pod="{pod}"}}', "values": "1"})
                series.append({"series": f'orderpipe_group_members{{group="{g}",pod="{pod}"}}', "values": str(i + 2)})
        series.append({"series": 'orderpipe_group_paused{group="another.group",pod="persister-a"}', "values": "0"})
        series.append({"series": 'orderpipe_group_members{group="another.group",pod="persister-a"}', "values": "40"})
        want = lambda role, g: 1 if role == "paused" else groups.index(g) + 2
        tests = [{"input_series": series, "promql_expr_test": [
                      {"expr": q, "eval_time": "0m", "exp_samples": [{"labels": "{}", "value": want(role, g)}]}
                      for _, role, g, _, q in queries]},
                 {"input_series": [{"series": 'orderpipe_group_paused{group="another.group"}', "values": "1"}],
                  "promql_expr_test": [{"expr": q, "eval_time": "0m", "exp_samples": [{"labels": "{}", "value": 0}]}
                                       for *_, q in queries]}]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "keda-queries-test.yaml")
            with open(path, "w") as f:
                yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}, f)
            run = subprocess.run(["promtool", "test", "rules", path], capture_output=True, text=True)
            if run.returncode != 0:
                problems.append(f"promtool: the triggers' queries do not read their group's paused flag and "
                                f"members: {(run.stdout + run.stderr).strip()}")
    if problems:
        return problems
    print(f"keda-pause: {len(formulas)} ScaledObjects follow their lag while running and hold their members while "
          f"paused (KEDA's formula rules, {len(cases)} cases each; {len(queries)} queries in promtool)")
    return []


def merged_values(files):
    """The chart's values.yaml overlaid with each -f file (maps merge, lists replace), as Helm does."""
    def merge(base, top):
        for k, v in top.items():
            base[k] = merge(base.get(k) or {}, v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        return base
    values = {}
    for f in files:
        values = merge(values, yaml.safe_load(open(f)) or {})
    return values


def check_roles(docs, values):
    """Every consumers[] and subscriptions[] entry has its Deployment running the right
    command; the schema hook checks before it registers."""
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    args_of = lambda d: d["spec"]["template"]["spec"]["containers"][0]["args"]
    problems = []
    for c in values.get("consumers") or []:
        if not any(args_of(d)[:3] == ["consume", "--group", c["group"]] for d in deployments):
            problems.append(f"consumers[] group {c['group']}: no Deployment runs consume --group {c['group']}")
    for s in values.get("subscriptions") or []:
        found = [d for d in deployments if args_of(d)[:3] == ["deliver", "--subscription", s["name"]]]
        if len(found) != 1:
            problems.append(f"subscriptions[] {s['name']}: {len(found)} Deployments run deliver --subscription {s['name']}")
            continue
        spec = found[0]["spec"]["template"]["spec"]
        config = pods_config(spec, spec["containers"][0], {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"})
        names = [x["name"] for x in (config or {}).get("http", {}).get("subscriptions", [])]
        if s["name"] not in names:
            problems.append(f"subscriptions[] {s['name']}: not in the http.subscriptions of the config its pods read ({names})")
    groups = [c["group"] for c in values.get("consumers") or []] + \
        [s.get("group") or f"http.{s['name']}" for s in values.get("subscriptions") or []]
    persisters = [d for d in deployments if args_of(d)[:2] == ["dlq", "persist"]]
    for d in persisters:
        spec = d["spec"]["template"]["spec"]
        config = pods_config(spec, spec["containers"][0], {m["metadata"]["name"]: m for m in docs if m["kind"] == "ConfigMap"})
        missing = [g for g in groups if g not in ((config or {}).get("lag") or {}).get("groups", [])]
        if missing:
            problems.append(f"the DLQ persister exports no broker-side lag for {missing} (config lag.groups): "
                            f"with every member down no lag alert would fire")
    if (values.get("schemaRegistration") or {}).get("enabled"):
        jobs = [d for d in docs if d["kind"] == "Job" and "pre-install" in hook_events(d)]
        steps = [[c["args"][:2] for c in (pod_spec(j).get("initContainers") or []) + pod_spec(j)["containers"]] for j in jobs]
        if [["schema", "check"], ["schema", "register"]] not in steps:
            problems.append(f"schemaRegistration.enabled: no pre-install hook Job runs schema check, then schema register ({steps})")
    problems += check_dlq_cronjobs(docs, values)
    problems += check_cdc_router(docs, values)
    problems += check_console(docs, values)
    if problems:
        return problems
    print(f"roles: {len(values.get('consumers') or [])} consumer groups, {len(values.get('subscriptions') or [])} "
          f"HTTP subscriptions, schema hook {'on' if (values.get('schemaRegistration') or {}).get('enabled') else 'off'}, "
          f"cdc {'on' if (values.get('cdc') or {}).get('enabled') else 'off'}, "
          f"router {'on' if (values.get('router') or {}).get('enabled') else 'off'}, "
          f"console {'on' if (values.get('console') or {}).get('enabled') else 'off'}")
    return []


def secret_env_problems(deployments, d, name, secret, key, role):
    """The variable `name` of `d` is read from existingSecret's `key` when set, absent when not,
    and reaches no other Deployment."""
    container = lambda x: pod_spec(x)["containers"][0]
    problems = []
    got = env_secret(container(d), name)
    present = any(e["name"] == name for e in container(d).get("env") or [])
    if key and got != (secret, key):
        problems.append(f"{role}: {name} is {got}, not existingSecret's key secretKeys ({secret}, {key})")
    if not key and present:
        problems.append(f"{role}: {name} is set while its secretKeys entry is empty (an empty value is refused at load)")
    others = [o["metadata"]["name"] for o in deployments if o is not d
              and any(e["name"] == name for e in container(o).get("env") or [])]
    if others:
        problems.append(f"{role}: {name} also reaches {others} (only this role needs it)")
    return problems


def check_console(docs, values):
    """console: off renders nothing; on, one Deployment of 1 replica running `console --listen
    0.0.0.0:<httpPort>` (plus --read-only with readOnly), the tokens from existingSecret's keys (or
    no variable), the proxy headers as plain values when set, and a Service on its http port."""
    problems = []
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    container = lambda d: pod_spec(d)["containers"][0]
    args_of = lambda d: [str(a) for a in container(d).get("args") or []]
    console = values.get("console") or {}
    secret_keys = values.get("secretKeys") or {}
    found = [d for d in deployments if args_of(d)[:1] == ["console"]]
    services = [s for s in docs if s["kind"] == "Service" and s["metadata"]["name"].endswith("-console")]
    if not console.get("enabled"):
        if found or services:
            problems.append(f"console.enabled is false but {[d['metadata']['name'] for d in found + services]} render")
        return problems
    if len(found) != 1:
        return [f"console.enabled: {len(found)} Deployments run console"]
    d = found[0]
    want = ["console", "--listen", f"0.0.0.0:{values.get('httpPort')}"] + (["--read-only"] if console.get("readOnly") else [])
    if args_of(d) != want:
        problems.append(f"console: args {args_of(d)}, not {want}")
    if d["spec"].get("replicas") != 1:
        problems.append(f"console: replicas {d['spec'].get('replicas')}, not 1 (sessions and the CSRF key live in the pod)")
    for key, name in (("consoleViewerToken", "ORDERPIPE_CONSOLE__VIEWER_TOKEN"), ("consoleOperatorToken", "ORDERPIPE_CONSOLE__OPERATOR_TOKEN")):
        problems += secret_env_problems(deployments, d, name, values.get("existingSecret"), secret_keys.get(key), "console")
    env = {e["name"]: e.get("value") for e in container(d).get("env") or []}
    for key, name in (("proxyUserHeader", "ORDERPIPE_CONSOLE__PROXY_USER_HEADER"), ("proxyRoleHeader", "ORDERPIPE_CONSOLE__PROXY_ROLE_HEADER"),
                      ("prometheusUrl", "ORDERPIPE_CONSOLE__PROMETHEUS_URL")):
        if env.get(name) != (console.get(key) or None):
            problems.append(f"console: {name} is {env.get(name)!r}, console.{key} is {console.get(key)!r}")
    labels = d["spec"]["template"]["metadata"]["labels"]
    good = [s for s in services if all(labels.get(k) == v for k, v in s["spec"]["selector"].items())
            and any(p.get("targetPort") == "http" for p in s["spec"]["ports"])]
    if len(good) != 1:
        problems.append(f"console.enabled: {len(good)} Services select the console pod's http port")
    return problems


def check_cdc_router(docs, values):
    """cdc: one Deployment running `cdc --health-addr`, 1 replica replaced with Recreate, the source
    credentials from secretKeys.cdcSource (or none: database.url). router: `deliver` without
    --subscription with --health-addr, --admin-addr and a Service on it when admin is enabled, and the
    admin token from secretKeys.adminToken (or no variable at all). A disabled role renders nothing."""
    problems = []
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    container = lambda d: pod_spec(d)["containers"][0]
    args_of = lambda d: [str(a) for a in container(d).get("args") or []]
    flag = lambda args, name: args[args.index(name) + 1] if name in args[:-1] else None
    secret_keys = values.get("secretKeys") or {}
    secret = values.get("existingSecret")
    http_port = str(values.get("httpPort"))

    def secret_env(d, name, key, role):
        problems.extend(secret_env_problems(deployments, d, name, secret, key, role))

    cdc = values.get("cdc") or {}
    found = [d for d in deployments if args_of(d)[:1] == ["cdc"]]
    if not cdc.get("enabled"):
        if found:
            problems.append(f"cdc.enabled is false but {[d['metadata']['name'] for d in found]} run cdc")
    elif len(found) != 1:
        problems.append(f"cdc.enabled: {len(found)} Deployments run cdc (one binlog reader per source)")
    else:
        d = found[0]
        args = args_of(d)
        if flag(args, "--health-addr") != f"0.0.0.0:{http_port}":
            problems.append(f"cdc: --health-addr is {flag(args, '--health-addr')}, not 0.0.0.0:{http_port} (its /metrics)")
        if d["spec"].get("replicas") != 1 or (d["spec"].get("strategy") or {}).get("type") != "Recreate":
            problems.append(f"cdc: replicas {d['spec'].get('replicas')}, strategy {d['spec'].get('strategy')}: "
                            f"one binlog reader per source needs 1 replica replaced with Recreate")
        ready = ((container(d).get("readinessProbe") or {}).get("httpGet") or {}).get("path")
        if ready != "/health/ready":
            problems.append(f"cdc: readiness probe {ready}, not /health/ready (binlog stream open, producer initialised)")
        secret_env(d, "ORDERPIPE_CDC__SOURCE", secret_keys.get("cdcSource"), "cdc")
        secret_env(d, "ORDERPIPE_CDC__HASH_KEY", secret_keys.get("cdcHashKey"), "cdc")

    router = values.get("router") or {}
    admin = router.get("admin") or {}
    found = [d for d in deployments if args_of(d)[:1] == ["deliver"] and "--subscription" not in args_of(d)]
    services = [s for s in docs if s["kind"] == "Service" and s["metadata"]["name"].endswith("-router-admin")]
    if not router.get("enabled"):
        if found or services:
            problems.append(f"router.enabled is false but {[d['metadata']['name'] for d in found + services]} render")
    elif len(found) != 1:
        problems.append(f"router.enabled: {len(found)} Deployments run deliver without --subscription")
    else:
        d = found[0]
        args = args_of(d)
        if d["spec"].get("replicas") != router.get("replicas"):
            problems.append(f"router: replicas {d['spec'].get('replicas')}, router.replicas is {router.get('replicas')}")
        if flag(args, "--health-addr") != f"0.0.0.0:{http_port}":
            problems.append(f"router: --health-addr is {flag(args, '--health-addr')}, not 0.0.0.0:{http_port}")
        want_admin = f"0.0.0.0:{admin.get('port')}" if admin.get("enabled") else None
        if flag(args, "--admin-addr") != want_admin:
            problems.append(f"router: --admin-addr is {flag(args, '--admin-addr')}, router.admin wants {want_admin}")
        ports = {p["name"]: p["containerPort"] for p in container(d).get("ports") or []}
        labels = d["spec"]["template"]["metadata"]["labels"]
        if admin.get("enabled"):
            if ports.get("admin") != admin.get("port"):
                problems.append(f"router: container port admin is {ports.get('admin')}, router.admin.port is {admin.get('port')}")
            good = [s for s in services if all(labels.get(k) == v for k, v in s["spec"]["selector"].items())
                    and any(p.get("targetPort") in ("admin", admin.get("port")) for p in s["spec"]["ports"])]
            if len(good) != 1:
                problems.append(f"router.admin.enabled: {len(good)} Services select the router pods' admin port")
        elif services or "admin" in ports:
            problems.append("router.admin.enabled is false but an admin port or Service renders")
        secret_env(d, "ORDERPIPE_ADMIN__TOKEN", secret_keys.get("adminToken") if admin.get("enabled") else "", "router")
    return problems


def check_dlq_cronjobs(docs, values):
    """dlqPurge and dlqScheduledReplay: each enabled one has its CronJob(s) running the
    command with every value passed (the replay once per groups[] entry, or once for all)."""
    args_of = lambda d: [str(a) for a in pod_spec(d)["containers"][0]["args"]]
    cron = [args_of(d) for d in docs if d["kind"] == "CronJob"]
    flag = lambda args, name: [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    problems = []
    purge = values.get("dlqPurge") or {}
    if purge.get("enabled"):
        found = [a for a in cron if a[:2] == ["dlq", "purge"]]
        want = {"--older-than": [str(purge["olderThan"])], "--status": purge.get("statuses") or [],
                "--group": [purge["group"]] if purge.get("group") else []}
        if len(found) != 1 or any(flag(found[0], f) != v for f, v in want.items()):
            problems.append(f"dlqPurge {want}: the CronJobs running dlq purge are {found}")
    replay = values.get("dlqScheduledReplay") or {}
    if replay.get("enabled"):
        found = [a for a in cron if a[:2] == ["dlq", "replay"]]
        groups = replay.get("groups") or [None]
        for group in groups:
            want = {"--class": replay["classes"], "--older-than": [str(replay["olderThan"])],
                    "--group": [group] if group else [], "--output": ["json"]}
            if not any(all(flag(a, f) == v for f, v in want.items()) and "--yes" in a for a in found):
                problems.append(f"dlqScheduledReplay {want} --yes: no CronJob runs it ({found})")
        if len(found) != len(groups):
            problems.append(f"dlqScheduledReplay: {len(found)} CronJobs run dlq replay for {len(groups)} groups entries")
    return problems


def check_args(docs, binary):
    """Every container's command line parses in the binary (run with --help)."""
    import subprocess
    problems, seen = [], set()
    for d in docs:
        spec = pod_spec(d) if d["kind"] in ("Job", "Deployment", "CronJob", "Pod") else None
        for c in (spec.get("initContainers") or []) + spec["containers"] if spec else []:
            args = tuple(str(a) for a in c.get("args") or [])
            if args in seen:
                continue
            seen.add(args)
            done = subprocess.run([binary, *args, "--help"], capture_output=True, text=True)
            if done.returncode != 0:
                problems.append(f"{d['kind']} {d['metadata']['name']} container {c['name']}: orderpipe "
                                f"{' '.join(args)} is refused: {done.stderr.strip().splitlines()[0] if done.stderr.strip() else done.returncode}")
    if problems:
        return problems
    print(f"args: {len(seen)} distinct container command lines parse in {binary}")
    return []


def selects(policy, labels):
    """Whether a NetworkPolicy's podSelector (matchLabels) selects pods of these labels."""
    match = (policy["spec"].get("podSelector") or {}).get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in match.items())


def check_netpol(docs, values):
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pods = [(d["metadata"]["name"], d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"])
            for d in docs if d["kind"] == "Deployment"]
    problems = []
    for p in policies:
        name = p["metadata"]["name"]
        selected = [(n, spec) for n, labels, spec in pods if selects(p, labels)]
        if not selected:
            problems.append(f"NetworkPolicy {name} selects no pod of the release")
        for n, _ in selected:
            role = n.rsplit("-", 1)[-1]
            if role not in ("router", "console"):
                problems.append(f"NetworkPolicy {name} selects {n}: only the router and the console are restricted")
        for i, rule in enumerate(p["spec"].get("ingress") or []):
            if not rule.get("from"):
                problems.append(f"NetworkPolicy {name} ingress[{i}] has no `from`: it admits every source")
            for port in rule.get("ports") or []:
                for n, spec in selected:
                    names = {cp.get("name") for c in spec["containers"] for cp in c.get("ports") or []}
                    numbers = {cp["containerPort"] for c in spec["containers"] for cp in c.get("ports") or []}
                    if port.get("port") not in names | numbers:
                        problems.append(f"NetworkPolicy {name} ingress[{i}] opens port {port.get('port')}, "
                                        f"not a container port of {n} ({sorted(names)})")
    np = values.get("networkPolicy") or {}
    if not np.get("enabled"):
        if policies:
            problems.append(f"networkPolicy.enabled is false, but {len(policies)} NetworkPolicies are rendered")
        elif not problems:
            print("netpol: networkPolicy.enabled is false, no NetworkPolicy rendered")
        return problems

    def admitted(component, port):
        """The peers admitted to PORT of the component's pods, over every policy selecting them."""
        labels = next((l for n, l, _ in pods if l.get("app.kubernetes.io/component") == component), None)
        if labels is None:
            return None
        peers = []
        for p in policies:
            if selects(p, labels):
                for rule in p["spec"].get("ingress") or []:
                    if any(x.get("port") == port for x in rule.get("ports") or []):
                        peers += rule.get("from") or [{"everyone": True}]
        return peers if any(selects(p, labels) for p in policies) else None

    router = values.get("router") or {}
    expected = []
    if router.get("enabled") and (router.get("admin") or {}).get("enabled"):
        expected.append(("router", "admin", "networkPolicy.adminFrom", np.get("adminFrom") or []))
        expected.append(("router", "http", "networkPolicy.metricsFrom", np.get("metricsFrom") or []))
    if (values.get("console") or {}).get("enabled"):
        expected.append(("console", "http", "networkPolicy.consoleFrom + metricsFrom",
                         (np.get("consoleFrom") or []) + (np.get("metricsFrom") or [])))
    for component, port, field, peers in expected:
        got = admitted(component, port)
        if got is None:
            problems.append(f"no NetworkPolicy selects the {component} pods: its {port} port is open to every pod")
        elif got != peers:
            problems.append(f"the {component} pods' {port} port admits {got}, {field} says {peers}")
    if problems:
        return problems
    print(f"netpol: {len(policies)} NetworkPolicies; " + "; ".join(f"{c} {p} from {len(x)} peers" for c, p, _, x in expected))
    return []


def check_accounts(docs):
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    problems, pods = [], 0
    for name, a in accounts.items():
        if a.get("automountServiceAccountToken") is not False:
            problems.append(f"ServiceAccount {name}: automountServiceAccountToken is not false")
    for d in docs:
        spec = pod_spec(d)
        if spec is None:
            continue
        pods += 1
        what = f"{d['kind']} {d['metadata']['name']}"
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{what}: automountServiceAccountToken is {spec.get('automountServiceAccountToken')}, not false")
        if not spec.get("serviceAccountName"):
            problems.append(f"{what}: no serviceAccountName (it would run as the namespace's default account)")
    if problems:
        return problems
    print(f"accounts: {pods} pod specs run as {sorted({pod_spec(d)['serviceAccountName'] for d in docs if pod_spec(d)})} "
          f"without a token; {len(accounts)} ServiceAccounts rendered, none mounting one")
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["hooks", "keda", "keda-pause", "roles", "args", "netpol", "accounts"])
    parser.add_argument("manifest")
    parser.add_argument("--user-secret", action="append", default=[],
                        help="hooks: a Secret the user provides (existingSecret); repeatable")
    parser.add_argument("--values", action="append", default=[],
                        help="hooks, roles: values files in helm's order (the chart's values.yaml first)")
    parser.add_argument("--bin", help="args: the orderpipe binary")
    parser.add_argument("--require-auth", action="store_true",
                        help="keda: fail unless some kafka trigger authenticates (values with SASL on)")
    args = parser.parse_args()
    docs = load(args.manifest)
    if args.check == "hooks":
        secret = merged_values(args.values).get("existingSecret")
        problems = check_hooks(docs, set(args.user_secret) | ({secret} if secret else set()))
    elif args.check == "keda":
        problems = check_keda(docs, args.require_auth)
    elif args.check == "keda-pause":
        problems = check_keda_pause(docs)
    elif args.check == "roles":
        problems = check_roles(docs, merged_values(args.values))
    elif args.check == "netpol":
        problems = check_netpol(docs, merged_values(args.values))
    elif args.check == "accounts":
        problems = check_accounts(docs)
    else:
        problems = check_args(docs, args.bin)
    for p in problems:
        print(f"FAIL {args.check}: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
