#!/usr/bin/env bash
# Prometheus, for real: `dualpipe train --metrics-addr 127.0.0.1:0` scraped every second by a
# real Prometheus server (Debian's `prometheus` package), whose HTTP API must show
# `dualpipe_steps_total` rising and the bubble and overhead ratios within [0, 1]; and
# `promtool check metrics` on a scrape. Everything listens on 127.0.0.1 only and stops by
# itself (bounded waits). Usage: scripts/prometheus_test.sh [DUALPIPE_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/dualpipe}
if [ ! -x "$BIN" ]; then
    cargo build --release -p dualpipe-cli
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi

work=$(mktemp -d)
train_pid=""
prom_pid=""
# Stops what this script started (by its own pids) and keeps the script's exit status.
cleanup() {
    local rc=$?
    for pid in $prom_pid $train_pid; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

# A run long enough to outlast the checks (it is stopped when they are done).
"$BIN" train --steps 200000 --metrics-addr 127.0.0.1:0 --log "$work/run.jsonl" --quiet \
    >"$work/train.out" 2>"$work/train.err" &
train_pid=$!
url=""
for _ in $(seq 1 600); do
    url=$(sed -n '/^metrics: /{s///p;q}' "$work/train.err")
    [ -n "$url" ] && break
    kill -0 "$train_pid" 2>/dev/null || { cat "$work/train.err"; echo "train exited early"; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "train never printed its metrics address"; exit 1; }
echo "train serves $url"
target=${url#http://}
target=${target%/metrics}

python3 - "$url" "$work" <<'PY'
import sys, urllib.request
url, work = sys.argv[1], sys.argv[2]
for name, accept in [("scrape.txt", None),
                     ("scrape.om.txt", "application/openmetrics-text; version=1.0.0")]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read().decode()
        print(f"{name}: {r.headers['Content-Type']}, {len(body.splitlines())} lines")
    open(f"{work}/{name}", "w").write(body)
PY
echo "== promtool check metrics (Prometheus text format)"
promtool check metrics <"$work/scrape.txt"
grep -E '^dualpipe_(steps_total|pipeline_bubble_ratio|communication_overhead_ratio) ' "$work/scrape.txt"

prom_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dualpipe
    static_configs:
      - targets: ["$target"]
YML
promtool check config "$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
    --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
echo "prometheus on 127.0.0.1:$prom_port scraping $target every second"

python3 - "$prom_port" <<'PY'
import json, sys, time, urllib.parse, urllib.request
api = f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?query="

def query(expr):
    try:
        with urllib.request.urlopen(api + urllib.parse.quote(expr), timeout=5) as r:
            doc = json.load(r)
    except OSError:
        return None
    result = doc.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else None

deadline = time.time() + 120
first = None
while time.time() < deadline:
    steps = query('dualpipe_steps_total{job="dualpipe"}')
    if steps is not None:
        if first is None:
            first = steps
            print(f"prometheus: dualpipe_steps_total = {steps:.0f}")
        elif steps > first:
            print(f"prometheus: dualpipe_steps_total rose to {steps:.0f}")
            break
    time.sleep(0.5)
else:
    sys.exit(f"dualpipe_steps_total did not rise within 120 s (first {first})")
for name in ["dualpipe_pipeline_bubble_ratio", "dualpipe_pipeline_bubble_ratio_simulated",
             "dualpipe_core_wait_ratio", "dualpipe_communication_overhead_ratio"]:
    v = query(name + '{job="dualpipe"}')
    print(f"prometheus: {name} = {v}")
    if v is None or not 0.0 <= v <= 1.0:
        sys.exit(f"{name} = {v}, not within [0, 1]")
up = query('up{job="dualpipe"}')
print(f"prometheus: up = {up}")
if up != 1.0:
    sys.exit("the target is not up")
rate = query('rate(dualpipe_steps_total{job="dualpipe"}[10s])')
print(f"prometheus: rate(dualpipe_steps_total[10s]) = {rate}")
PY
echo "prometheus test: passed"
