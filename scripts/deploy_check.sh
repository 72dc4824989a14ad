#!/usr/bin/env bash
# Offline validation of deploy/: the Kubernetes manifests, the MPIJob, the Grafana dashboard and
# the container's runtime, each also shown to refuse a deliberately broken copy.
#
#   scripts/deploy_check.sh [DUALPIPE_MPI_BIN]
#
# DUALPIPE_MPI_BIN: a dualpipe built with --features mpi against MPICH (deploy/build.sh's
# target/deploy/bin/dualpipe). With it, two checks more: the runtime image's packages ship every
# library it links, and under the MPIJob's environment MPICH listens only on the NetworkPolicy's
# ports (a real 4-process run). Needs python3 with venv and pip; installs into a venv under
# target/ kubernetes-validate (built-in kinds, against the Kubernetes schemas it ships) and
# check-jsonschema (the MPIJob, against deploy/schema/mpijob-v2beta1.json), and Debian's
# prometheus (promtool, and a server that shows the scrape config's relabelling) if missing.
# Ends with "deploy_check: N passed, N failed"; exits non-zero if any check failed.
set -u
cd "$(dirname "$0")/.."

K8S_VERSION=1.37.0 # one of the versions kubernetes-validate 1.37.0 ships schemas for
VENV=target/deploy-check-venv
BIN=${1:-}

if [ ! -x "$VENV/bin/check-jsonschema" ] || [ ! -x "$VENV/bin/kubernetes-validate" ]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" || exit 1
    "$VENV/bin/pip" install --quiet "kubernetes-validate==1.37.0" "check-jsonschema==0.39.0" || exit 1
fi
if ! command -v promtool >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null || exit 1
fi
PY=$VENV/bin/python
KV=("$VENV/bin/kubernetes-validate" --strict -k "$K8S_VERSION")
CJ=$VENV/bin/check-jsonschema
SCHEMA=deploy/schema/mpijob-v2beta1.json
K8S=deploy/k8s

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASSED=0
FAILED=0
pass() { echo "ok   $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $1"; FAILED=$((FAILED + 1)); }
# run NAME CMD...: the command must succeed; its output is shown indented.
run() {
    local name=$1
    shift
    if "$@" >"$TMP/out" 2>&1; then
        sed 's/^/     /' "$TMP/out"
        pass "$name"
    else
        sed 's/^/     /' "$TMP/out"
        fail "$name"
    fi
}
# refuse NAME FILE FROM TO CMD...: a copy of FILE with FROM replaced by TO (in $TMP/broken, same
# name) must make CMD (which names $TMP/broken/...) fail.
refuse() {
    local name=$1 file=$2 from=$3 to=$4
    shift 4
    rm -rf "$TMP/broken"
    mkdir -p "$TMP/broken"
    cp -r "$K8S" "$TMP/broken/k8s"
    cp -r deploy/prometheus "$TMP/broken/prometheus"
    cp deploy/grafana/dualpipe.json deploy/runtime.sh deploy/Dockerfile "$TMP/broken/"
    local copy="$TMP/broken/$file"
    FROM=$from TO=$to "$PY" -c '
import os, sys
p = sys.argv[1]; s = open(p).read(); f, t = os.environ["FROM"], os.environ["TO"]
if s.count(f) != 1: sys.exit(f"{f!r} occurs {s.count(f)} times in {p}, not once")
open(p, "w").write(s.replace(f, t))' "$copy" || { fail "refuse $name: the broken copy was not made"; return; }
    if "$@" >"$TMP/out" 2>&1; then
        fail "refuse $name: accepted"
        sed 's/^/     /' "$TMP/out" | head -5
    else
        pass "refuse $name: $(grep -v -E '^(ok |\s*FAILED:\s*$)' "$TMP/out" | grep -m1 -i -E "fail|error|invalid|not |is " | cut -c1-150)"
    fi
}

echo "== built-in kinds: kubernetes-validate --strict, Kubernetes $K8S_VERSION"
run "PersistentVolumeClaim, Service, NetworkPolicy pass" "${KV[@]}" "$K8S/pvc.yaml" "$K8S/service.yaml" "$K8S/networkpolicy.yaml"
"$PY" deploy/check/manifests.py templates "$K8S/mpijob.yaml" "$TMP/templates" >/dev/null
run "the MPIJob's pod templates pass as v1 PodTemplates" "${KV[@]}" "$TMP"/templates/*.yaml

echo "== the MPIJob: check-jsonschema against $SCHEMA"
run "the schema is a valid JSON Schema" "$CJ" --check-metaschema "$SCHEMA"
run "mpijob.yaml passes the schema" "$CJ" --schemafile "$SCHEMA" "$K8S/mpijob.yaml"

echo "== the cluster scheduler's MPIJobs for a placement (deploy/cluster, from \`dualpipe cluster manifests\`)"
for f in deploy/cluster/mpijob-*.yaml; do
    name=$(basename "$f" .yaml)
    "$PY" deploy/check/manifests.py templates "$f" "$TMP/cluster-$name" >/dev/null
    run "$name: its pod templates pass as v1 PodTemplates" "${KV[@]}" "$TMP/cluster-$name"/*.yaml
    run "$name: passes the MPIJob schema" "$CJ" --schemafile "$SCHEMA" "$f"
done
rm -rf "$TMP/broken-cluster" && mkdir -p "$TMP/broken-cluster"
sed 's/nodeSelectorTerms:/nodeSelectorTerm:/' deploy/cluster/mpijob-dualpipe-llm-a.yaml >"$TMP/broken-cluster/mpijob.yaml"
"$PY" deploy/check/manifests.py templates "$TMP/broken-cluster/mpijob.yaml" "$TMP/broken-cluster/t" >/dev/null
if ! grep -q nodeSelectorTerm: "$TMP/broken-cluster/mpijob.yaml"; then
    fail "refuse a misspelt node affinity field: the broken copy was not made"
elif "${KV[@]}" "$TMP/broken-cluster/t"/*.yaml >"$TMP/out" 2>&1; then
    fail "refuse a misspelt node affinity field: accepted"
else
    pass "refuse a misspelt node affinity field in a generated worker template"
fi

echo "== the manifests agree with each other and with the image"
run "consistency" "$PY" deploy/check/manifests.py consistency "$K8S" deploy/runtime.sh

echo "== the Dockerfile runs only what CI runs"
run "its RUN steps are deploy/build.sh and deploy/runtime.sh install" \
    "$PY" deploy/check/manifests.py dockerfile deploy/Dockerfile Cargo.toml

echo "== the Prometheus scrape config: rank r on 9100 + r"
run "a real Prometheus relabels the MPIJob's pods to their ranks' ports" \
    "$PY" deploy/check/scrape_relabel.py deploy/prometheus/scrape.yaml

echo "== the Grafana dashboard"
run "dualpipe.json parses and names only the issue's metrics" \
    "$PY" deploy/check/manifests.py grafana deploy/grafana/dualpipe.json "$TMP/rules.yaml"
run "its queries are valid PromQL (promtool check rules)" promtool check rules "$TMP/rules.yaml"

echo "== broken copies are refused"
B=$TMP/broken
refuse "a misspelt NetworkPolicy field" k8s/networkpolicy.yaml "  policyTypes:
    - Ingress
    - Egress
  ingress:
    # The pipeline" "  policyType:
    - Ingress
    - Egress
  ingress:
    # The pipeline" "${KV[@]}" "$B/k8s/networkpolicy.yaml"
refuse "a Service port that is not a number" k8s/service.yaml "port: 9100" "port: metrics-port" \
    "${KV[@]}" "$B/k8s/service.yaml"
refuse "a misspelt PersistentVolumeClaim field" k8s/pvc.yaml "  accessModes:" "  accessMode:" \
    "${KV[@]}" "$B/k8s/pvc.yaml"
refuse "a misspelt container field in a pod template" k8s/mpijob.yaml "              readinessProbe:" \
    "              readinesProbe:" \
    sh -c "'$PY' deploy/check/manifests.py templates '$B/k8s/mpijob.yaml' '$B/templates' >/dev/null && ${KV[*]} $B/templates/*.yaml"
refuse "an unknown MPI implementation" k8s/mpijob.yaml "mpiImplementation: MPICH" "mpiImplementation: LAM" \
    "$CJ" --schemafile "$SCHEMA" "$B/k8s/mpijob.yaml"
refuse "a misspelt MPIJob field" k8s/mpijob.yaml "slotsPerWorker: 1" "slotPerWorker: 1" \
    "$CJ" --schemafile "$SCHEMA" "$B/k8s/mpijob.yaml"
refuse "two launchers" k8s/mpijob.yaml "    Launcher:
      replicas: 1" "    Launcher:
      replicas: 2" "$CJ" --schemafile "$SCHEMA" "$B/k8s/mpijob.yaml"
refuse "3 workers for --ranks 4" k8s/mpijob.yaml "      replicas: 4" "      replicas: 3" \
    "$PY" deploy/check/manifests.py consistency "$B/k8s" "$B/runtime.sh"
refuse "a UCX port range outside the policy" k8s/mpijob.yaml '"29500-29510"' '"30000-30010"' \
    "$PY" deploy/check/manifests.py consistency "$B/k8s" "$B/runtime.sh"
refuse "a metrics port the annotation does not name" k8s/mpijob.yaml "0.0.0.0:9100" "0.0.0.0:9200" \
    "$PY" deploy/check/manifests.py consistency "$B/k8s" "$B/runtime.sh"
refuse "a checkpoint directory off the volume" k8s/mpijob.yaml "- /checkpoints/dualpipe
" "- /var/dualpipe
" "$PY" deploy/check/manifests.py consistency "$B/k8s" "$B/runtime.sh"
refuse "a scrape config that misses the ranks' ports" prometheus/scrape.yaml "replacement: '910\$1'" \
    "replacement: '9100\$1'" "$PY" deploy/check/scrape_relabel.py "$B/prometheus/scrape.yaml"
refuse "a policy that opens only rank 0's metrics port" k8s/networkpolicy.yaml "          port: 9100
          endPort: 9199" "          port: 9100" \
    "$PY" deploy/check/manifests.py consistency "$B/k8s" "$B/runtime.sh"
refuse "a policy that opens the metrics ports to every pod of the monitoring namespace" \
    k8s/networkpolicy.yaml "          podSelector:
            matchLabels:
              app.kubernetes.io/name: prometheus
" "" \
    "$PY" deploy/check/manifests.py consistency "$B/k8s" "$B/runtime.sh"
refuse "a Dockerfile build step CI does not run" Dockerfile "RUN deploy/build.sh /opt/dualpipe" \
    "RUN cargo build --release -p dualpipe-cli --features mpi" \
    "$PY" deploy/check/manifests.py dockerfile "$B/Dockerfile" Cargo.toml
refuse "a dashboard naming a metric dualpipe does not serve" dualpipe.json \
    "max(dualpipe_validation_loss{" "max(dualpipe_eval_loss{" \
    "$PY" deploy/check/manifests.py grafana "$B/dualpipe.json" "$B/rules.yaml"
refuse "a dashboard that is not JSON" dualpipe.json '"uid": "dualpipe-training",' '"uid": "dualpipe-training",,' \
    "$PY" deploy/check/manifests.py grafana "$B/dualpipe.json" "$B/rules.yaml"
refuse "a dashboard query that is not PromQL" dualpipe.json "histogram_quantile(0.95, " "histogram_quantile(0.95,, " \
    sh -c "'$PY' deploy/check/manifests.py grafana '$B/dualpipe.json' '$B/rules.yaml' >/dev/null; promtool check rules '$B/rules.yaml'"

if [ -n "$BIN" ]; then
    echo "== the runtime image and MPICH's ports, with $BIN"
    run "the runtime packages ship every library dualpipe links" bash deploy/runtime.sh check "$BIN"
    libclang=$(ldconfig -p | grep -m1 -o '/[^ ]*libclang-[0-9.]*\.so\.[0-9]*$' || true)
    if [ -n "$libclang" ]; then
        if bash deploy/runtime.sh check "$libclang" >"$TMP/out" 2>&1; then
            fail "refuse a library the runtime does not ship ($libclang): accepted"
        else
            pass "refuse a library the runtime does not ship: $(grep -m1 'runtime.sh check' "$TMP/out")"
        fi
    else
        fail "refuse a library the runtime does not ship: no libclang found to try"
    fi
    run "under the MPIJob's environment MPICH listens inside the policy's ports" \
        "$PY" deploy/check/mpi_ports.py "$K8S" "$BIN"
    run "without it MPICH listens outside them (the control)" \
        "$PY" deploy/check/mpi_ports.py "$K8S" "$BIN" --without-env
fi

echo "deploy_check: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
