#!/usr/bin/env bash
# docs/cluster.md's table: static against elastic on seeded synthetic traces (1,000 jobs, 64
# nodes x 8 devices; JOBS and LOAD change the length and offered load), one row per seed and
# policy, plus the time each simulation took.
#
#   scripts/cluster_table.sh [SEEDS...]     (default: 1 2 3 4 5; needs target/release/dualpipe)
#   JOBS=20000 LOAD=1.0 POLICIES="static elastic las" BIN=target/debug/dualpipe scripts/cluster_table.sh 1 2 3
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/dualpipe}
CLUSTER=testdata/cluster/64x8.json
LOAD=${LOAD:-0.9}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SEEDS=${*:-1 2 3 4 5}
echo "| seed | policy | offered load | utilisation | mean JCT (h) | p95 JCT (h) | mean queueing (h) | fragmentation | migrations | resizes | move overhead (max job) | makespan (h) | sim time (s) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for seed in $SEEDS; do
    "$BIN" cluster trace --jobs "${JOBS:-1000}" --seed "$seed" --load "$LOAD" --output "$TMP/t.csv" 2>/dev/null
    for policy in ${POLICIES:-static elastic}; do
        start=$(date +%s.%N)
        "$BIN" cluster simulate --cluster "$CLUSTER" --trace "$TMP/t.csv" --policy "$policy" \
            --format json --output "$TMP/$policy.json"
        end=$(date +%s.%N)
        python3 - "$TMP/$policy.json" "$seed" "$policy" "$start" "$end" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
seed, policy, t0, t1 = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
h = lambda s: f"{s / 3600:.2f}"
print(f"| {seed} | {policy} | {m['offered_load']:.2f} | {100 * m['utilization']:.1f}% | {h(m['mean_jct_s'])} | {h(m['p95_jct_s'])} "
      f"| {h(m['mean_queue_s'])} | {100 * m['fragmentation']:.1f}% | {m['migrations']} | {m['resizes']} "
      f"| {100 * m['migration_overhead']:.2f}% ({100 * m['max_job_overhead']:.1f}%) | {h(m['makespan_s'])} | {t1 - t0:.2f} |")
PY
    done
done
