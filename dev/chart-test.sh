#!/usr/bin/env bash
# Checks of the Helm chart and its alerts (part of `make test`):
#   helm lint; helm template with the default and the production-like values;
#   every rendered manifest validated against the Kubernetes API schemas
#   (kubernetes-validate --strict; CRD kinds are reported, not validated);
#   the rendered config loads in orderpipe; promtool check + unit tests of the
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
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            assert sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False, d["metadata"]["name"]
            assert spec["securityContext"].get("runAsNonRoot"), d["metadata"]["name"]
            assert "limits" in c.get("resources", {}), d["metadata"]["name"]
            for e in c.get("env", []):
                assert "value" not in e or "PASSWORD" not in e["name"] and "DATABASE__URL" not in e["name"], "inline secret"
print(f"{len(docs)} manifests: non-root, read-only, no privilege escalation, limits set, secrets by reference")
PY
  echo "== the rendered config loads"
  ORDERPIPE_DATABASE__URL=mysql://check:check@db/orderpipe "$BIN" --config "$OUT/$name.json" config > /dev/null
done

echo "== a bad consumers[].ordering is refused, naming the accepted values"
if "$HELM" template orderpipe "$CHART" --kube-version "$KUBE_VERSION" --set 'consumers[0].group=g' \
    --set 'consumers[0].handlers={inventory}' --set 'consumers[0].ordering=fifo' > "$OUT/bad.txt" 2>&1; then
  echo "the chart accepted consumers[0].ordering=fifo" >&2; exit 1
fi
grep -q 'accepted values: key, none' "$OUT/bad.txt" || { cat "$OUT/bad.txt" >&2; exit 1; }
grep -q -- '--ordering' "$OUT/default.yaml" || { echo "consumers[].ordering is not passed to consume" >&2; exit 1; }

echo "== promtool: alert rules"
cp "$OUT/production-rules.yaml" "$OUT/rules.yaml"
cp "$ROOT/tests/alerts/alerts_test.yaml" "$OUT/"
promtool check rules "$OUT/rules.yaml"
(cd "$OUT" && promtool test rules alerts_test.yaml)
echo "chart checks: 2 values files rendered and validated, 5 alerts tested firing and silent"
