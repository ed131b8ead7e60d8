#!/usr/bin/env bash
# Checks of the Helm chart and its alerts (part of `make test`):
#   helm lint; helm template with the default and the production-like values;
#   every rendered manifest validated against the Kubernetes API schemas
#   (kubernetes-validate --strict; CRD kinds are reported, not validated);
#   the rendered config loads in orderpipe; dev/chart-checks.py: hook Jobs read
#   only hooks of lower weight or existingSecret, every role is rendered, KEDA
#   triggers use the pods' SASL/TLS, and a paused group holds its replicas
#   (KEDA's formula rules in dev/keda-formula, the queries in promtool) (and
#   each check fails on a bad manifest);
#   dev/chart-hooks-run.py: the rendered hook Jobs run in Helm's order with the
#   orderpipe binary against the dev stack (install, upgrade, and a release
#   failed by an incompatible schema), and so do the cdc and router
#   Deployments (probes, a captured row, the admin token); the console role
#   (no way to sign in and two replicas refused, a lost token or flag caught);
#   values.schema.json refuses typos naming them, NOTES.txt names what is rendered,
#   every pod runs as a ServiceAccount without a token, the NetworkPolicies admit
#   only networkPolicy.adminFrom/consoleFrom/metricsFrom (dev/chart-checks.py accounts, netpol);
#   promtool check + unit tests of the
#   alert rules (each alert fires on a bad series and stays quiet on a good one).
# Installs what it needs when missing: Helm (go install, from the Go module
# proxy), kubernetes-validate (PyPI), promtool (Debian's prometheus package).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.stack/bin"
HELM_VERSION=v3.22.0
KUBE_VERSION=1.30.0
CHART="$ROOT/helm/orderpipe"
BIN="${ORDERPIPE_BIN:-$ROOT/target/debug/orderpipe}"
mkdir -p "$TOOLS"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

if [ ! -x "$TOOLS/helm" ]; then
  echo "== installing helm $HELM_VERSION with go install"
  GOBIN="$TOOLS" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
command -v kubernetes-validate >/dev/null || { echo "== installing kubernetes-validate"; python3 -m pip install -q kubernetes-validate==1.37.0; }
command -v promtool >/dev/null || { echo "== installing prometheus (promtool)"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }
HELM="$TOOLS/helm"

for values in "" "$CHART/ci/production-values.yaml"; do
  name="${values:+production}"; name="${name:-default}"
  flags=(); [ -n "$values" ] && flags=(-f "$values")
  echo "== helm lint / template ($name values)"
  "$HELM" lint --strict "$CHART" "${flags[@]}"
  "$HELM" template orderpipe "$CHART" --kube-version "$KUBE_VERSION" "${flags[@]}" > "$OUT/$name.yaml"
  echo "== kubernetes-validate ($name values)"
  kubernetes-validate --strict -k "$KUBE_VERSION" --quiet "$OUT/$name.yaml"
  echo "== hook inputs, roles, KEDA auth ($name values)"
  vflags=(--values "$CHART/values.yaml"); [ -n "$values" ] && vflags+=(--values "$values")
  python3 "$ROOT/dev/chart-checks.py" hooks "$OUT/$name.yaml" "${vflags[@]}"
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/$name.yaml" "${vflags[@]}"
  python3 "$ROOT/dev/chart-checks.py" args "$OUT/$name.yaml" --bin "$BIN"
  # The production values turn SASL and KEDA on: there the triggers must authenticate.
  python3 "$ROOT/dev/chart-checks.py" keda "$OUT/$name.yaml" ${values:+--require-auth}
  python3 - "$OUT/$name.yaml" "$OUT/$name" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
config = next(d for d in docs if d["kind"] == "ConfigMap" and "orderpipe.json" in d.get("data", {}))
open(sys.argv[2] + ".json", "w").write(config["data"]["orderpipe.json"])
rules = [d for d in docs if d["kind"] == "PrometheusRule"]
if rules:
    yaml.safe_dump(rules[0]["spec"], open(sys.argv[2] + "-rules.yaml", "w"), sort_keys=False)
for d in docs:
    if d["kind"] in ("Deployment", "Job", "CronJob"):
        spec = d["spec"]["template"]["spec"] if d["kind"] != "CronJob" else d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            assert sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False, d["metadata"]["name"]
            assert spec["securityContext"].get("runAsNonRoot"), d["metadata"]["name"]
            assert spec.get("automountServiceAccountToken") is False and spec.get("serviceAccountName"), d["metadata"]["name"]
            assert "limits" in c.get("resources", {}), d["metadata"]["name"]
            for e in c.get("env", []):
                assert "value" not in e or not any(k in e["name"] for k in ("PASSWORD", "DATABASE__URL", "TOKEN", "CDC__SOURCE", "HASH_KEY")), "inline secret"
print(f"{len(docs)} manifests: non-root, read-only, no privilege escalation, limits set, secrets by reference, no service account token")
PY
  echo "== the rendered config loads"
  ORDERPIPE_DATABASE__URL=mysql://check:check@db/orderpipe "$BIN" --config "$OUT/$name.json" config > /dev/null
done

echo "== a bad consumers[].ordering is refused, naming the accepted values"
if "$HELM" template orderpipe "$CHART" --kube-version "$KUBE_VERSION" --set 'consumers[0].group=g.order.consumer' \
    --set 'consumers[0].handlers={inventory}' --set 'consumers[0].ordering=fifo' > "$OUT/bad.txt" 2>&1; then
  echo "the chart accepted consumers[0].ordering=fifo" >&2; exit 1
fi
grep -q 'accepted values: key, none' "$OUT/bad.txt" || { cat "$OUT/bad.txt" >&2; exit 1; }
grep -q -- '--ordering' "$OUT/default.yaml" || { echo "consumers[].ordering is not passed to consume" >&2; exit 1; }

echo "== a bad reconcile.window is refused, naming the accepted forms; each consumers[] group gets a reconcile CronJob"
expect_refused_reconcile() {
  if "$HELM" template orderpipe "$CHART" --kube-version "$KUBE_VERSION" --set "reconcile.window=$1" > "$OUT/bad.txt" 2>&1; then
    echo "the chart accepted reconcile.window=$1" >&2; exit 1
  fi
  grep -q 'reconcile.window is .*accepted forms: <n>s, <n>m, <n>h, <n>d' "$OUT/bad.txt" || { cat "$OUT/bad.txt" >&2; exit 1; }
}
expect_refused_reconcile "1 hour"
expect_refused_reconcile "60"
python3 - "$OUT/default.yaml" "$CHART/values.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
values = yaml.safe_load(open(sys.argv[2]))
jobs = {d["metadata"]["annotations"]["orderpipe.io/consumer-group"]: d for d in docs
        if d["kind"] == "CronJob" and "-reconcile-" in d["metadata"]["name"]}
groups = [c["group"] for c in values["consumers"]]
assert sorted(jobs) == sorted(groups), f"reconcile CronJobs for {sorted(jobs)}, consumers {sorted(groups)}"
for group, job in jobs.items():
    args = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["reconcile", "--group", group], args
PY

echo "== the chart checks fail on what they guard against"
expect_fail() {  # expect_fail WHAT PATTERN COMMAND...: COMMAND must fail, printing PATTERN
  local what="$1" pattern="$2"; shift 2
  if "$@" > "$OUT/neg.txt" 2>&1; then echo "not refused: $what" >&2; exit 1; fi
  grep -q -- "$pattern" "$OUT/neg.txt" || { echo "$what: refused without naming '$pattern':" >&2; cat "$OUT/neg.txt" >&2; exit 1; }
}
cat > "$OUT/hook-reads-plain-configmap.yaml" <<'YAML'
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {orderpipe.json: "{}"}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: app-migrate
  annotations: {helm.sh/hook: "pre-install,pre-upgrade", helm.sh/hook-weight: "-10"}
spec:
  template:
    spec:
      restartPolicy: OnFailure
      containers: [{name: m, image: x, envFrom: [{secretRef: {name: user-secret}}]}]
      volumes: [{name: config, configMap: {name: app-config}}]
YAML
expect_fail "a hook Job mounting a ConfigMap that is not a hook" "reads ConfigMap app-config, which is not a hook" \
  python3 "$ROOT/dev/chart-checks.py" hooks "$OUT/hook-reads-plain-configmap.yaml" --user-secret user-secret
sed 's/^metadata: {name: app-config}$/metadata: {name: app-config, annotations: {helm.sh\/hook: "pre-install,pre-upgrade", helm.sh\/hook-weight: "-10"}}/' \
  "$OUT/hook-reads-plain-configmap.yaml" > "$OUT/hook-same-weight.yaml"
expect_fail "a hook ConfigMap of the same weight as its Job" "must be strictly lower" \
  python3 "$ROOT/dev/chart-checks.py" hooks "$OUT/hook-same-weight.yaml" --user-secret user-secret
expect_fail "a hook Job reading a Secret nobody provides" "reads Secret user-secret, which the chart does not render" \
  python3 "$ROOT/dev/chart-checks.py" hooks "$OUT/hook-same-weight.yaml"
sed '/authenticationRef:/,+1d' "$OUT/production.yaml" > "$OUT/keda-no-auth.yaml"
expect_fail "KEDA triggers without the pods' SASL credentials" "names no rendered TriggerAuthentication" \
  python3 "$ROOT/dev/chart-checks.py" keda "$OUT/keda-no-auth.yaml"
sed '/^        sasl: scram_sha512$/d' "$OUT/production.yaml" > "$OUT/keda-no-sasl.yaml"
expect_fail "a KEDA trigger without the pods' SASL mechanism" "sasl is 'none', the pods use SASL_SSL SCRAM-SHA-512" \
  python3 "$ROOT/dev/chart-checks.py" keda "$OUT/keda-no-sasl.yaml"
echo "== a paused group keeps its replicas under KEDA (production values: a Prometheus)"
python3 "$ROOT/dev/chart-checks.py" keda-pause "$OUT/production.yaml"
sed '/^  advanced:$/,/metricType: AverageValue/d' "$OUT/production.yaml" > "$OUT/keda-no-formula.yaml"
expect_fail "KEDA scaling on the lag alone" "scales a paused group on the lag its pause builds up" \
  python3 "$ROOT/dev/chart-checks.py" keda-pause "$OUT/keda-no-formula.yaml"
sed 's/members \* 1000 : lag"/members : lag"/' "$OUT/production.yaml" > "$OUT/keda-members.yaml"
expect_fail "a formula that holds one replica per member-threshold" "1 replicas, not 3" \
  python3 "$ROOT/dev/chart-checks.py" keda-pause "$OUT/keda-members.yaml"
sed 's/group_paused{group=\\"inventory/group_paused{group=\\"other/' "$OUT/production.yaml" > "$OUT/keda-other-group.yaml"
expect_fail "a paused query of another group" "do not read their group's paused flag" \
  python3 "$ROOT/dev/chart-checks.py" keda-pause "$OUT/keda-other-group.yaml"
render() { "$HELM" template orderpipe "$CHART" --kube-version "$KUBE_VERSION" "$@"; }
expect_fail "SASL without secretKeys.saslPassword" "secretKeys.saslPassword is empty" \
  render --set 'config.kafka.options.security\.protocol=SASL_SSL' --set 'config.kafka.options.sasl\.mechanism=PLAIN' \
    --set 'config.kafka.options.sasl\.username=u'
expect_fail "KEDA with a SASL mechanism its trigger cannot use" "configured for PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" \
  render -f "$CHART/ci/production-values.yaml" --set 'config.kafka.options.sasl\.mechanism=GSSAPI'
expect_fail "two subscriptions of one name" 'subscriptions\[\].name "crm" is declared twice' \
  render --set 'subscriptions[0].name=crm' --set 'subscriptions[1].name=crm'
sed 's/- --subscription$/- --subscriptions/' "$OUT/production.yaml" > "$OUT/bad-flag.yaml"
expect_fail "a container flag the binary does not have" "is refused" \
  python3 "$ROOT/dev/chart-checks.py" args "$OUT/bad-flag.yaml" --bin "$BIN"
expect_fail "a bad schemaRegistration.level" "accepted values: backward, forward, full" \
  render --set schemaRegistration.level=none
render --set 'subscriptions[0].name=crm' --set 'subscriptions[0].events={order.*}' --set 'subscriptions[0].group=crm.order.consumer' \
  --set 'subscriptions[0].url=http://crm/hooks' --set 'subscriptions[0].method=GET' > "$OUT/bad-sub.yaml"
python3 -c 'import sys, yaml; d = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"); open(sys.argv[2], "w").write(d["data"]["orderpipe.json"])' \
  "$OUT/bad-sub.yaml" "$OUT/bad-sub.json"
expect_fail "a subscription with method GET" "http.subscriptions\[crm\].method" \
  env ORDERPIPE_DATABASE__URL=mysql://check:check@db/orderpipe "$BIN" --config "$OUT/bad-sub.json" config

echo "== retry schedules and group names: bad values fail the render, naming the field"
sub=(--set 'subscriptions[0].name=crm' --set 'subscriptions[0].events={order.*}' --set 'subscriptions[0].url=http://crm/hooks')
con=(--set 'consumers[0].group=inventory-service.order.consumer' --set 'consumers[0].handlers={inventory}')
expect_fail "a consumer without a group" 'consumers\[\].group is required' render --set 'consumers[0].handlers={inventory}'
expect_fail "a consumer group outside the house pattern" 'consumers\[inventory_svc\].group: consumer group "inventory_svc" does not follow the house pattern {service}.{event}.consumer' \
  render --set 'consumers[0].group=inventory_svc'
render --set 'consumers[0].group=inventory_svc' --set naming.enforce=false | grep -q -- '- inventory_svc' \
  || { echo "naming.enforce=false did not render consumers[0].group=inventory_svc" >&2; exit 1; }
expect_fail "a subscription on the default group http.<name>" 'subscriptions\[crm\].group (unset: the default http.crm): consumer group "http.crm" does not follow' \
  render "${sub[@]}"
expect_fail "a subscription group outside the house pattern" 'subscriptions\[crm\].group: consumer group "crm-delivery" does not follow' \
  render "${sub[@]}" --set 'subscriptions[0].group=crm-delivery'
expect_fail "a bad delay in consumers[].retry" 'consumers\[inventory-service.order.consumer\].retry.delays\[1\]: 30 seconds is not a delay; accepted forms: <n>ms, <n>s, <n>m or <n>h' \
  render "${con[@]}" --set 'consumers[0].retry.delays={5s,30 seconds}'
expect_fail "a bad delay in subscriptions[].retry" 'subscriptions\[crm\].retry.delays\[0\]: 10 is not a delay; accepted forms' \
  render "${sub[@]}" --set 'subscriptions[0].group=crm.order.consumer' --set 'subscriptions[0].retry.delays={10}'
expect_fail "delays beside a profile in consumers[].retry" 'consumers\[inventory-service.order.consumer\].retry.delays and consumers\[inventory-service.order.consumer\].retry.profile: both set' \
  render "${con[@]}" --set 'consumers[0].retry.delays={5s}' --set 'consumers[0].retry.profile=10s-1m-5m'
expect_fail "a jitter above 1" 'consumers\[inventory-service.order.consumer\].retry.jitter: 1.5 is not a number from 0 to 1' \
  render "${con[@]}" --set-json 'consumers[0].retry.jitter=1.5'
expect_fail "an unknown retry key" 'consumers\[inventory-service.order.consumer\].retry.delay: not a retry setting' \
  render "${con[@]}" --set 'consumers[0].retry.delay={5s}'
# A good consumers[].retry renders into the group's layer, and orderpipe loads it.
render "${con[@]}" --set 'consumers[0].retry.delays={5s,30s,5m}' --set-json 'consumers[0].retry.jitter=0.1' > "$OUT/retry.yaml"
python3 -c 'import json, sys, yaml; d = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"); c = json.loads(d["data"]["orderpipe.json"]); assert c["retry"]["groups"]["inventory-service.order.consumer"] == {"delays": ["5s", "30s", "5m"], "jitter": 0.1}, c["retry"]; open(sys.argv[2], "w").write(d["data"]["orderpipe.json"])' \
  "$OUT/retry.yaml" "$OUT/retry.json"
ORDERPIPE_DATABASE__URL=mysql://check:check@db/orderpipe "$BIN" --config "$OUT/retry.json" config > /dev/null
# What only the binary checks (a fixed profile reshaped) fails when the rendered config loads, naming the field.
render "${con[@]}" --set 'consumers[0].retry.profile=seed003' --set 'consumers[0].retry.attempts=5' > "$OUT/retry-bad.yaml"
python3 -c 'import sys, yaml; d = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"); open(sys.argv[2], "w").write(d["data"]["orderpipe.json"])' \
  "$OUT/retry-bad.yaml" "$OUT/retry-bad.json"
expect_fail "attempts reshaping the fixed profile seed003" 'retry.groups."inventory-service.order.consumer".attempts: profile seed003 is a fixed list' \
  env ORDERPIPE_DATABASE__URL=mysql://check:check@db/orderpipe "$BIN" --config "$OUT/retry-bad.json" config
# The chart's profile names and group pattern are the binary's (retry::policy::PROFILES, consumer::naming::GROUP_PATTERN).
chart_profiles="$(render "${con[@]}" --set 'consumers[0].retry.profile=nope' 2>&1 | sed -n 's/.*is not a profile; accepted: //p' || true)"
bin_profiles="$(ORDERPIPE_RETRY__PROFILE=nope "$BIN" config 2>&1 | sed -n 's/.*is not a profile; accepted: //p' || true)"
[ -n "$chart_profiles" ] && [ "$chart_profiles" = "$bin_profiles" ] \
  || { echo "the chart's retry profiles ($chart_profiles) are not the binary's ($bin_profiles)" >&2; exit 1; }
chart_pattern="$(sed -n '/define "orderpipe.groupPattern"/{n;p;}' "$CHART/templates/_helpers.tpl")"
grep -qF "pub const GROUP_PATTERN: &str = r\"$chart_pattern\";" "$ROOT/src/consumer/naming.rs" \
  || { echo "the chart's group pattern ($chart_pattern) is not src/consumer/naming.rs's GROUP_PATTERN" >&2; exit 1; }

echo "== cdc and router roles: bad values fail the render, naming the field; the checks catch a lost setting"
cdc=(--set cdc.enabled=true --set 'config.cdc.tables={shop.table_user}')
expect_fail "two cdc replicas (one binlog reader per source)" 'cdc.replicas is 2; accepted: 1 (one binlog reader per source' \
  render "${cdc[@]}" --set cdc.replicas=2
expect_fail "cdc without tables" 'cdc.enabled: config.cdc.tables is empty' render --set cdc.enabled=true
expect_fail "cdc with tables and a cdc_sources row" 'config.cdc.source_name and config.cdc.tables both say' \
  render "${cdc[@]}" --set config.cdc.source_name=shop
render --set cdc.enabled=true --set config.cdc.source_name=shop | grep -q 'source_name' \
  || { echo "cdc with config.cdc.source_name alone does not render it" >&2; exit 1; }
expect_fail "the binlog source's credentials inline" 'config.cdc.source is a secret' \
  render "${cdc[@]}" --set config.cdc.source=mysql://repl:pw@db:3306
expect_fail "the admin token inline" 'config.admin.token is a secret' render --set config.admin.token=0123456789abcdef
expect_fail "the admin API on httpPort" 'router.admin.port is 8080; accepted: a port from 1 to 65535 other than httpPort' \
  render --set router.enabled=true --set router.admin.enabled=true --set router.admin.port=8080
# No secretKeys.adminToken: no ORDERPIPE_ADMIN__TOKEN at all (an empty token is refused at load); the API is read-only.
render "${cdc[@]}" --set router.enabled=true --set router.admin.enabled=true > "$OUT/router-no-token.yaml"
python3 "$ROOT/dev/chart-checks.py" roles "$OUT/router-no-token.yaml" --values "$CHART/values.yaml" \
  --values <(printf 'cdc: {enabled: true}\nrouter: {enabled: true, admin: {enabled: true}}\n')
if grep -q 'ORDERPIPE_ADMIN__TOKEN\|ORDERPIPE_CDC__SOURCE\|ORDERPIPE_CDC__HASH_KEY' "$OUT/router-no-token.yaml"; then
  echo "an empty secretKeys.adminToken/cdcSource/cdcHashKey rendered its variable" >&2; exit 1
fi
prod=(--values "$CHART/values.yaml" --values "$CHART/ci/production-values.yaml")
sed '/- name: ORDERPIPE_ADMIN__TOKEN$/,+4d' "$OUT/production.yaml" > "$OUT/router-lost-token.yaml"
expect_fail "a router without the admin token of secretKeys.adminToken" "router: ORDERPIPE_ADMIN__TOKEN is None" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/router-lost-token.yaml" "${prod[@]}"
sed '/- --admin-addr$/,+1d' "$OUT/production.yaml" > "$OUT/router-lost-admin.yaml"
expect_fail "a router without --admin-addr" "router: --admin-addr is None" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/router-lost-admin.yaml" "${prod[@]}"
sed '/^  strategy: {type: Recreate}$/d' "$OUT/production.yaml" > "$OUT/cdc-rolling.yaml"
expect_fail "a cdc Deployment rolled (two binlog readers during an upgrade)" "cdc: replicas 1, strategy None" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/cdc-rolling.yaml" "${prod[@]}"

echo "== console role: no way to sign in or two replicas fail the render; the checks catch a lost token or flag"
expect_fail "a console without a way to sign in" 'console.enabled: no way to sign in' render --set console.enabled=true
expect_fail "a console token inline" 'config.console.operator_token is a secret' \
  render --set config.console.operator_token=operator-token-0123456789
expect_fail "two console replicas (sessions and the CSRF key live in the pod)" 'console.replicas is 2; accepted: 1' \
  render --set console.enabled=true --set console.proxyUserHeader=X-Forwarded-User --set console.replicas=2
render --set console.enabled=true --set console.readOnly=true --set console.proxyUserHeader=X-Forwarded-User > "$OUT/console-proxy.yaml"
python3 "$ROOT/dev/chart-checks.py" roles "$OUT/console-proxy.yaml" --values "$CHART/values.yaml" \
  --values <(printf 'console: {enabled: true, readOnly: true, proxyUserHeader: X-Forwarded-User}\n')
sed '/- name: ORDERPIPE_CONSOLE__OPERATOR_TOKEN$/,+4d' "$OUT/production.yaml" > "$OUT/console-lost-token.yaml"
expect_fail "a console without the token of secretKeys.consoleOperatorToken" "console: ORDERPIPE_CONSOLE__OPERATOR_TOKEN is None" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/console-lost-token.yaml" "${prod[@]}"
sed '/- --read-only$/d' "$OUT/console-proxy.yaml" > "$OUT/console-lost-read-only.yaml"
expect_fail "a read-only console rendered without --read-only" "console: args" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/console-lost-read-only.yaml" --values "$CHART/values.yaml" \
  --values <(printf 'console: {enabled: true, readOnly: true, proxyUserHeader: X-Forwarded-User}\n')

echo "== dlqPurge and dlqScheduledReplay: bad values fail the render, naming the field; the checks catch a lost flag"
expect_fail "a dlqPurge.olderThan that is not an age" 'dlqPurge.olderThan is "7days"; accepted forms: <n>s, <n>m, <n>h, <n>d' \
  render --set dlqPurge.olderThan=7days
expect_fail "held records in dlqPurge.statuses" 'dlqPurge.statuses has "held"; accepted values: pending, replayed, ignored' \
  render --set 'dlqPurge.statuses={replayed,held}'
expect_fail "a class orderpipe does not write" 'dlqScheduledReplay.classes has "handler_retriable"; accepted values: unavailable,' \
  render --set dlqScheduledReplay.enabled=true --set 'dlqScheduledReplay.classes={handler_retriable}'
expect_fail "a dlqScheduledReplay.olderThan that is not an age" 'dlqScheduledReplay.olderThan is "ten minutes"' \
  render --set dlqScheduledReplay.enabled=true --set 'dlqScheduledReplay.olderThan=ten minutes'
# The chart's class list is the binary's (dlq::ERROR_CLASSES): both name the same accepted values.
chart_classes="$(render --set dlqScheduledReplay.enabled=true --set 'dlqScheduledReplay.classes={nope}' 2>&1 | sed -n 's/.*accepted values: //p' || true)"
bin_classes="$("$BIN" dlq list --class nope 2>&1 | sed -n 's/.*accepted values: //p' || true)"
[ -n "$chart_classes" ] && [ "$chart_classes" = "$bin_classes" ] \
  || { echo "the chart's error classes ($chart_classes) are not the binary's ($bin_classes)" >&2; exit 1; }
grep -v -- '- --yes$' "$OUT/production.yaml" > "$OUT/replay-no-yes.yaml"
expect_fail "a scheduled replay without --yes (it would refuse to run without a terminal)" "dlqScheduledReplay" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/replay-no-yes.yaml" --values "$CHART/values.yaml" --values "$CHART/ci/production-values.yaml"
sed 's/- replayed$/- pending/' "$OUT/default.yaml" > "$OUT/purge-pending.yaml"
expect_fail "a purge of statuses the values do not name" "dlqPurge" \
  python3 "$ROOT/dev/chart-checks.py" roles "$OUT/purge-pending.yaml" --values "$CHART/values.yaml"

# ---- adoption basics (issue 25): values.schema.json, NOTES.txt, ServiceAccount, NetworkPolicy ----
echo "== values.schema.json: a misspelled or mistyped value fails the render, naming it"
schema_err='values don.t meet the specifications of the schema'
expect_fail "a misspelled top-level value (replicaCount)" "additional properties 'replicaCount' not allowed" render --set replicaCount=3
expect_fail "a misspelled top-level value (consumer)" "additional properties 'consumer' not allowed" \
  render --set 'consumer[0].group=inventory-service.order.consumer'
expect_fail "a misspelled key of a consumers[] item (handler)" "at '/consumers/0': additional properties 'handler' not allowed" \
  render --set 'consumers[0].group=inventory-service.order.consumer' --set 'consumers[0].handler={inventory}'
expect_fail "a misspelled key of a section (relay.replcas)" "at '/relay': additional properties 'replcas' not allowed" render --set relay.replcas=3
expect_fail "a misspelled config section (config.kafak)" "at '/config': additional properties 'kafak' not allowed" \
  render --set config.kafak.bootstrap_servers=k:9092
expect_fail "a string for httpPort" "at '/httpPort': got string, want integer" render --set httpPort=eighty
expect_fail "a string for a boolean (router.enabled)" "at '/router/enabled': got string, want boolean" render --set-string router.enabled=yes
expect_fail "an image.pullPolicy Kubernetes does not have" "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'" \
  render --set image.pullPolicy=Sometimes
expect_fail "helm lint with a misspelled value" "additional properties 'replicaCount' not allowed" \
  "$HELM" lint --strict "$CHART" --set replicaCount=3
grep -q "$schema_err" "$OUT/neg.txt" || { echo "helm lint's refusal is not the schema's" >&2; exit 1; }
# The schema knows every section orderpipe's config has and every key of an HTTP subscription (the binary
# names its own when it refuses an unknown one): a setting added to the binary but not to the schema fails here.
printf 'zzz = 1\n' > "$OUT/unknown-top.toml"
printf '[[http.subscriptions]]\nname = "a"\nevents = ["x"]\nurl = "http://a"\nzzz = 1\n' > "$OUT/unknown-sub.toml"
for f in unknown-top unknown-sub; do
  ORDERPIPE_DATABASE__URL=mysql://check:check@db/orderpipe "$BIN" --config "$OUT/$f.toml" config > /dev/null 2> "$OUT/$f.txt" || true
done
python3 - "$CHART/values.schema.json" "$OUT/unknown-top.txt" "$OUT/unknown-sub.txt" <<'PY'
import json, re, sys
schema = json.load(open(sys.argv[1]))
def expected(path):
    text = open(path).read()
    m = re.search(r"expected `one of (.*?)`` for key", text)
    assert m, f"the binary did not list the accepted keys: {text}"
    return set(re.findall(r"`([a-z_]+)", m.group(1)))
config = set(schema["properties"]["config"]["properties"])
binary = expected(sys.argv[2])
assert config == binary, f"values.schema.json config sections {sorted(config)} != the binary's {sorted(binary)}"
item = set(schema["properties"]["subscriptions"]["items"]["properties"])
chart = {"replicas", "resources", "group", "ordering"}
binary_sub = expected(sys.argv[3])
assert item == binary_sub | chart, \
    f"values.schema.json subscriptions[] keys: missing {sorted(binary_sub | chart - item)}, extra {sorted(item - binary_sub - chart)}"
print(f"schema: {len(config)} config sections and {len(binary_sub)} subscription keys, as the binary has them")
PY

echo "== NOTES.txt renders what was installed and how to check it (helm template does not render NOTES: a copy renders it)"
rm -rf "$OUT/notes-chart" && cp -r "$CHART" "$OUT/notes-chart" && cp "$CHART/templates/NOTES.txt" "$OUT/notes-chart/notes-src.txt"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: {{ tpl (.Files.Get "notes-src.txt") . | toJson }}\n' \
  > "$OUT/notes-chart/templates/zz-notes.yaml"
notes_check() {  # notes_check VALUES-NAME MANIFEST [helm flags]: the NOTES name exactly the rendered Deployments and hook Jobs
  local name="$1" manifest="$2"; shift 2
  "$HELM" template orderpipe "$OUT/notes-chart" --kube-version "$KUBE_VERSION" --show-only templates/zz-notes.yaml "$@" \
    | python3 -c 'import sys, yaml; sys.stdout.write(yaml.safe_load(sys.stdin)["data"]["notes"])' > "$OUT/notes-$name.txt"
  python3 - "$OUT/notes-$name.txt" "$manifest" <<'PY'
import re, sys, yaml
notes = open(sys.argv[1]).read()
docs = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
hooks = {d["metadata"]["name"] for d in docs if d["kind"] == "Job"}
named = set(re.findall(r"^  (orderpipe-orderpipe-[a-z0-9-]+) ", notes, re.M))
problems = [f"Deployment {n} is not in the NOTES" for n in sorted(deployments - named)]
problems += [f"the NOTES name {n}, which is not rendered" for n in sorted(named - deployments - hooks)]
problems += [f"hook Job {n} is not in the NOTES" for n in sorted(hooks - named)]
for needed in ("kubectl -n default get pods,jobs", "/health/ready", "orderpipe lag", "orderpipe dlq stats", "orderpipe-orderpipe-metrics"):
    if needed not in notes:
        problems.append(f"the NOTES do not show {needed!r}")
if problems:
    sys.exit("\n".join(problems))
print(f"NOTES: {len(deployments)} Deployments, {len(hooks)} hook Jobs named, and how to check them ({len(notes.splitlines())} lines)")
PY
}
"$HELM" lint --strict "$CHART" > /dev/null  # lint renders NOTES.txt too
notes_check default "$OUT/default.yaml"
notes_check production "$OUT/production.yaml" -f "$CHART/ci/production-values.yaml"
grep -q "orderpipe-orderpipe-cdc\|router-admin\|-console " "$OUT/notes-default.txt" \
  && { echo "the default NOTES mention cdc, the router or the console, which are off" >&2; exit 1; }
expect_fail "NOTES that miss the roles of the values" "Deployment orderpipe-orderpipe-cdc is not in the NOTES" \
  notes_check mismatch "$OUT/production.yaml"

echo "== ServiceAccount: every pod runs as the release's account (hooks as its hook copy) and mounts no token"
for name in default production; do
  python3 "$ROOT/dev/chart-checks.py" accounts "$OUT/$name.yaml"
done
sed '/^      automountServiceAccountToken: false$/d' "$OUT/production.yaml" > "$OUT/token-mounted.yaml"
expect_fail "a pod that mounts its service account token" "automountServiceAccountToken is None, not false" \
  python3 "$ROOT/dev/chart-checks.py" accounts "$OUT/token-mounted.yaml"
sed 's/^automountServiceAccountToken: false$/automountServiceAccountToken: true/' "$OUT/default.yaml" > "$OUT/account-token.yaml"
expect_fail "a ServiceAccount that mounts tokens" "ServiceAccount orderpipe-orderpipe: automountServiceAccountToken is not false" \
  python3 "$ROOT/dev/chart-checks.py" accounts "$OUT/account-token.yaml"
# Helm creates hooks first: a hook Job on the release's own account would wait for it on a first install.
sed 's/^      serviceAccountName: orderpipe-orderpipe-hooks$/      serviceAccountName: orderpipe-orderpipe/' "$OUT/default.yaml" > "$OUT/hook-plain-account.yaml"
expect_fail "a hook Job on the non-hook ServiceAccount" "reads ServiceAccount orderpipe-orderpipe, which is not a hook" \
  python3 "$ROOT/dev/chart-checks.py" hooks "$OUT/hook-plain-account.yaml" --values "$CHART/values.yaml"
python3 -c 'import sys, yaml; docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]; [d["metadata"].pop("annotations", None) for d in docs if d["kind"] == "ServiceAccount"]; yaml.safe_dump_all(docs, open(sys.argv[2], "w"))' \
  "$OUT/default.yaml" "$OUT/hook-account-late.yaml"
expect_fail "hook Jobs whose ServiceAccount is created after them" "ServiceAccount orderpipe-orderpipe-hooks does not exist (yet)" \
  python3 "$ROOT/dev/chart-hooks-run.py" "$OUT/hook-account-late.yaml" --bin "$BIN" --workdir "$OUT" --event pre-install
render --set serviceAccount.create=false --set serviceAccount.name=platform-runner > "$OUT/own-account.yaml"
python3 "$ROOT/dev/chart-checks.py" accounts "$OUT/own-account.yaml" | grep -q "run as \['platform-runner'\] without a token; 0 ServiceAccounts" \
  || { echo "serviceAccount.create=false, name=platform-runner: the pods do not all run as platform-runner" >&2; exit 1; }
render --set-json 'serviceAccount.annotations={"eks.amazonaws.com/role-arn":"arn:aws:iam::1:role/orderpipe"}' \
  --show-only templates/serviceaccount.yaml | grep -c 'eks.amazonaws.com/role-arn: arn:aws:iam::1:role/orderpipe' | grep -qx 2 \
  || { echo "serviceAccount.annotations are not on both ServiceAccounts" >&2; exit 1; }

echo "== NetworkPolicy: only the listed peers reach the router's admin API and the console (production-like values)"
prodv=(--values "$CHART/values.yaml" --values "$CHART/ci/production-values.yaml")
python3 "$ROOT/dev/chart-checks.py" netpol "$OUT/default.yaml" --values "$CHART/values.yaml"
python3 "$ROOT/dev/chart-checks.py" netpol "$OUT/production.yaml" "${prodv[@]}"
sed 's/^    - from:$/    - peers:/' "$OUT/production.yaml" > "$OUT/netpol-open.yaml"
expect_fail "an ingress rule without from (it admits every source)" "ingress\[0\] has no \`from\`: it admits every source" \
  python3 "$ROOT/dev/chart-checks.py" netpol "$OUT/netpol-open.yaml" "${prodv[@]}"
sed 's/kubernetes.io\/metadata.name: ingress-nginx/kubernetes.io\/metadata.name: default/' "$OUT/production.yaml" > "$OUT/netpol-peers.yaml"
expect_fail "a console policy admitting other peers than consoleFrom" "the console pods' http port admits" \
  python3 "$ROOT/dev/chart-checks.py" netpol "$OUT/netpol-peers.yaml" "${prodv[@]}"
python3 -c 'import sys, yaml; docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and not (d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-router"))]; yaml.safe_dump_all(docs, open(sys.argv[2], "w"))' \
  "$OUT/production.yaml" "$OUT/netpol-lost.yaml"
expect_fail "the router's admin port without a policy" "no NetworkPolicy selects the router pods" \
  python3 "$ROOT/dev/chart-checks.py" netpol "$OUT/netpol-lost.yaml" "${prodv[@]}"
# Empty lists admit nobody (no rule at all, never a rule without `from`); egress rules, when given, are rendered.
render -f "$CHART/ci/production-values.yaml" --set-json 'networkPolicy.adminFrom=[]' --set-json 'networkPolicy.metricsFrom=[]' \
  --set-json 'networkPolicy.egress=[{"to":[{"ipBlock":{"cidr":"10.0.0.0/8"}}]}]' > "$OUT/netpol-closed.yaml"
render -f "$CHART/ci/production-values.yaml" --set-json 'networkPolicy.adminFrom=[]' --set-json 'networkPolicy.metricsFrom=[]' \
  --set-json 'networkPolicy.egress=[{"to":[{"ipBlock":{"cidr":"10.0.0.0/8"}}]}]' --show-only templates/networkpolicy.yaml > "$OUT/netpol-closed-only.yaml"
kubernetes-validate --strict -k "$KUBE_VERSION" --quiet "$OUT/netpol-closed-only.yaml"
python3 "$ROOT/dev/chart-checks.py" netpol "$OUT/netpol-closed.yaml" "${prodv[@]}" \
  --values <(printf 'networkPolicy: {adminFrom: [], metricsFrom: []}\n')
python3 -c 'import sys, yaml; p = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-router")); assert p["spec"]["ingress"] == [] and p["spec"]["policyTypes"] == ["Ingress", "Egress"] and p["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"] == "10.0.0.0/8", p["spec"]' \
  "$OUT/netpol-closed.yaml"
# ---- end of adoption basics ----

echo "== the hooks run in Helm's order against the dev stack: install, upgrade, an incompatible schema fails"
if "$ROOT/dev/stack.sh" status > /dev/null 2>&1; then
  run="chart$(date +%s)$$"; db="chart_hooks_$run"
  hook_values() {  # hook_values PREFIX [CDC]: the chart pointed at the dev stack, topics under PREFIX, config.cdc CDC
    printf 'existingSecret: orderpipe-dev\nconfig:\n  kafka: {bootstrap_servers: "127.0.0.1:9092"}\n'
    printf '  registry: {url: "http://127.0.0.1:8081/apis/ccompat/v7"}\n  topics:\n'
    for t in order_events:order.events.v1 inventory_events:inventory.events.v1 dead_letter:order.events.v1.dlq; do
      printf '    %s: {name: %s%s, partitions: 3, replication_factor: 1, min_insync_replicas: 1, retention_ms: 2592000000}\n' \
        "${t%%:*}" "$1" "${t#*:}"
    done
    # The chart's change topics default to replication 3 / min ISR 2 too: 1/1 on the single dev broker.
    printf '  cdc: {replication_factor: 1, min_insync_replicas: 1%s}\n' "${2:+, $2}"
  }
  mariadb -h127.0.0.1 -uorderpipe -porderpipe -e "CREATE DATABASE $db"
  trap 'mariadb -h127.0.0.1 -uorderpipe -porderpipe -e "DROP DATABASE IF EXISTS $db" || true; rm -rf "$OUT"' EXIT
  hooks=(python3 "$ROOT/dev/chart-hooks-run.py" --bin "$BIN" --workdir "$OUT"
         --secret "orderpipe-dev/database-url=mysql://orderpipe:orderpipe@127.0.0.1:3306/$db")
  hook_values "$run.ok." > "$OUT/hooks-ok.yaml"
  render -f "$OUT/hooks-ok.yaml" > "$OUT/hooks-ok-rendered.yaml"
  "${hooks[@]}" "$OUT/hooks-ok-rendered.yaml" --event pre-install
  # Consumers only check their topics: the hook must have declared every group's retry topic.
  "$ROOT/dev/stack.sh" kafka-topics --list 2>/dev/null | grep "^$run\.ok\." > "$OUT/hook-topics.txt" || true
  for group in inventory-service.order.consumer payment-service.order.consumer; do
    grep -qx "$run.ok.order.events.v1.retry.$group" "$OUT/hook-topics.txt" \
      || { echo "the topics hook did not create the retry topic of $group:" >&2; cat "$OUT/hook-topics.txt" >&2; exit 1; }
  done
  echo "  topics after install: $(tr '\n' ' ' < "$OUT/hook-topics.txt")"
  "${hooks[@]}" "$OUT/hooks-ok-rendered.yaml" --event pre-upgrade
  # An upgrade declaring more partitions fails the release unless topicReconcile.allowRepartition.
  render -f "$OUT/hooks-ok.yaml" --set config.topics.order_events.partitions=4 > "$OUT/hooks-grow.yaml"
  expect_fail "growing a keyed topic without topicReconcile.allowRepartition" \
    "hook Job orderpipe-orderpipe-topics (weight -5) failed" "${hooks[@]}" "$OUT/hooks-grow.yaml" --event pre-upgrade
  grep -A8 "topics ensure" "$OUT/neg.txt" | cut -c1-220
  render -f "$OUT/hooks-ok.yaml" --set config.topics.order_events.partitions=4 --set topicReconcile.allowRepartition=true \
    > "$OUT/hooks-grow.yaml"
  "${hooks[@]}" "$OUT/hooks-grow.yaml" --event pre-upgrade | grep -- "--allow-repartition -> exit 0"
  # A registered envelope the built-in one cannot read (BACKWARD): the schema hook must fail the release.
  hook_values "$run.bad." > "$OUT/hooks-bad.yaml"
  curl -fsS -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    --data '{"schema": "{\"type\": \"record\", \"name\": \"Envelope\", \"fields\": [{\"name\": \"legacy_id\", \"type\": \"long\"}]}"}' \
    "http://127.0.0.1:8081/apis/ccompat/v7/subjects/$run.bad.order.events.v1-value/versions" > /dev/null
  render -f "$OUT/hooks-bad.yaml" > "$OUT/hooks-bad-rendered.yaml"
  expect_fail "an incompatible schema at install" "hook Job orderpipe-orderpipe-schema (weight -3) failed" \
    "${hooks[@]}" "$OUT/hooks-bad-rendered.yaml" --event pre-install
  cat "$OUT/neg.txt"
  grep -q "schema register" "$OUT/neg.txt" && { echo "schema register ran after a failed check" >&2; exit 1; }

  echo "== the cdc and router Deployments run as rendered against the dev stack: probes, a captured change, the admin token"
  free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  mariadb -h127.0.0.1 -uorderpipe -porderpipe "$db" -e "CREATE TABLE roles_t (id INT PRIMARY KEY, v INT)"
  { hook_values "$run.roles." "$(printf 'name: %s, server_id: %d, tables: [%s.roles_t], topic_prefix: %s.cdc, offsets_topic: %s.cdc.offsets, partitions: 1' \
      "$run" "$((5000 + RANDOM % 4000))" "$db" "$run" "$run")"
    printf 'httpPort: %s\ncdc: {enabled: true}\nrouter: {enabled: true, admin: {enabled: true, port: %s}}\n' "$(free_port)" "$(free_port)"
    printf 'secretKeys: {cdcSource: cdc-source, adminToken: admin-token}\n'
  } > "$OUT/roles.yaml"
  render -f "$OUT/roles.yaml" > "$OUT/roles-rendered.yaml"
  cdc_run=("${hooks[@]}" --secret "orderpipe-dev/cdc-source=mysql://orderpipe:orderpipe@127.0.0.1:3306" --deployment orderpipe-orderpipe-cdc)
  # The source's credentials reach the pod from secretKeys.cdcSource: a row inserted then is captured.
  "${cdc_run[@]}" "$OUT/roles-rendered.yaml" --event none --wait-output "cdc $run: reading" \
    --sql "mysql://orderpipe:orderpipe@127.0.0.1:3306/$db INSERT INTO roles_t VALUES (1, 1)" \
    --check "http GET /metrics 200 contains change=\"insert\""
  # The probe is /health/ready (above it answered 200): a source that does not answer keeps the pod live, not ready.
  expect_fail "cdc ready with a source nobody listens on" "readinessProbe /health/ready never answered 200" \
    "${hooks[@]}" --secret "orderpipe-dev/cdc-source=mysql://orderpipe:orderpipe@127.0.0.1:1" --deployment orderpipe-orderpipe-cdc \
    "$OUT/roles-rendered.yaml" --event none --timeout 5
  # The token reaches the router from secretKeys.adminToken: a change without it is refused, with it accepted.
  "${hooks[@]}" "$OUT/roles-rendered.yaml" --event none --secret "orderpipe-dev/admin-token=chart-test-admin-token-$run" \
    --deployment orderpipe-orderpipe-router --wait-output "router reconciled" --check "admin GET /bindings 200" \
    --check "admin POST /refresh 401" --check "admin POST /refresh 200 bearer ORDERPIPE_ADMIN__TOKEN"

  echo "== every role's Deployment starts and becomes ready in a kubelet's environment (service links of every Service)"
  # The default and the production-like values, the latter pointed at the dev stack (no SASL/TLS, no
  # external hosts); each Deployment runs as rendered with the variables a kubelet injects for the
  # release's Services, once as the pod says (enableServiceLinks: false) and once with the links on.
  hook_values "$run.kube." > "$OUT/kubelet-default.yaml"
  printf 'httpPort: %s\nrouter: {admin: {port: %s}}\n' "$(free_port)" "$(free_port)" >> "$OUT/kubelet-default.yaml"
  python3 - "$CHART/ci/production-values.yaml" "$OUT/kubelet-default.yaml" "$OUT/kubelet-production.yaml" "$db" <<'PY'
import sys, yaml
prod, dev, db = yaml.safe_load(open(sys.argv[1])), yaml.safe_load(open(sys.argv[2])), sys.argv[4]
prod["existingSecret"] = dev["existingSecret"]
prod["secretKeys"] = {k: v for k, v in prod["secretKeys"].items() if k in ("databaseUrl", "adminToken", "consoleOperatorToken", "cdcHashKey")}
prod["config"]["kafka"] = dev["config"]["kafka"]
prod["config"]["registry"] = dev["config"]["registry"]
prod["config"]["topics"] = dev["config"]["topics"]
run = dev["config"]["topics"]["order_events"]["name"].split(".")[0]
prod["config"]["cdc"].update(name=f"{run}-prod", server_id=9100 + hash(run) % 800, tables=[f"{db}.roles_t"],
                             topic_prefix=f"{run}.prod.cdc", offsets_topic=f"{run}.prod.cdc.offsets",
                             partitions=1, replication_factor=1, min_insync_replicas=1)
prod["httpPort"], prod["router"]["admin"]["port"] = dev["httpPort"], dev["router"]["admin"]["port"]
prod["subscriptions"] = [dict(s, url="http://127.0.0.1:9/hooks") for s in prod["subscriptions"]]
yaml.safe_dump(prod, open(sys.argv[3], "w"))
PY
  for values in default production; do
    render -f "$OUT/kubelet-$values.yaml" > "$OUT/kubelet-$values-rendered.yaml"
    # Its hooks first (migrations, topics of every group, schemas), as at an install.
    "${hooks[@]}" "$OUT/kubelet-$values-rendered.yaml" --event pre-install > "$OUT/kubelet.txt" \
      || { cat "$OUT/kubelet.txt" >&2; exit 1; }
    deployments=$(python3 -c 'import sys, yaml; print(" ".join(d["metadata"]["name"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"))' \
      "$OUT/kubelet-$values-rendered.yaml")
    for links in pod on; do
      args=(); for d in $deployments; do args+=(--deployment "$d"); done
      "${hooks[@]}" "$OUT/kubelet-$values-rendered.yaml" --event none --service-links "$links" "${args[@]}" \
        --secret "orderpipe-dev/cdc-source-url=mysql://orderpipe:orderpipe@127.0.0.1:3306" \
        --secret "orderpipe-dev/admin-api-token=chart-test-admin-token-$run" \
        --secret "orderpipe-dev/cdc-hash-key=chart-test-hash-key-$run" \
        --secret "orderpipe-dev/console-operator-token=chart-test-console-token-$run" > "$OUT/kubelet.txt" \
        || { echo "$values values, service links $links:" >&2; cat "$OUT/kubelet.txt" >&2; exit 1; }
      grep -E "^  kubelet|Deployments started" "$OUT/kubelet.txt"
    done
  done
else
  echo "SKIPPED: the dev stack is not running (make test starts it before this script)"
fi

echo "== relay transactional ids: a prefix per release, so two releases never fence each other"
for release in alpha beta; do
  "$HELM" template "$release" "$CHART" --kube-version "$KUBE_VERSION" > "$OUT/$release.yaml"
  grep -q "\"transactional_id_prefix\": \"$release-orderpipe-relay\"" "$OUT/$release.yaml" \
    || { echo "release $release: producer.transactional_id_prefix is not $release-orderpipe-relay" >&2; exit 1; }
done

echo "== promtool: alert rules"
cp "$OUT/production-rules.yaml" "$OUT/rules.yaml"
cp "$ROOT/tests/alerts/alerts_test.yaml" "$OUT/"
promtool check rules "$OUT/rules.yaml"
(cd "$OUT" && promtool test rules alerts_test.yaml)
# Every alert needs a firing case and a silent case: an alert added without
# its tests fails here, not in production.
alerts=$(python3 - "$OUT/rules.yaml" "$OUT/alerts_test.yaml" <<'PY'
import sys, yaml
rules = [r["alert"] for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"] if "alert" in r]
cases = [c for t in yaml.safe_load(open(sys.argv[2]))["tests"] for c in t.get("alert_rule_test", [])]
missing = [f"{a} ({what})" for a in rules for what, ok in
           (("firing", lambda c: c["exp_alerts"]), ("silent", lambda c: not c["exp_alerts"]))
           if not any(c["alertname"] == a and ok(c) for c in cases)]
if missing:
    sys.exit("alerts without a test case: " + ", ".join(missing))
print(len(rules))
PY
)
echo "chart checks: 2 values files rendered and validated, $alerts alerts tested firing and silent"
