#!/usr/bin/env bash
# docs/cluster.md's tables: static against elastic, one row per policy and trace, plus the time
# each simulation took.
#
# Seeded synthetic traces (1,000 jobs, 64 nodes x 8 devices; JOBS and LOAD change the length and
# offered load), one trace per seed:
#   scripts/cluster_table.sh [SEEDS...]     (default: 1 2 3 4 5; needs target/release/dualpipe)
#   JOBS=20000 LOAD=1.0 POLICIES="static elastic las" BIN=target/debug/dualpipe scripts/cluster_table.sh 1 2 3
# A converted public trace (scripts/public_trace.py) on clusters of N nodes x 8 devices:
#   TRACE=helios.csv scripts/cluster_table.sh 64 96 128
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/dualpipe}
LOAD=${LOAD:-0.9}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -n "${TRACE:-}" ]; then
    RUNS=${*:-64}
    FIRST="devices"
else
    RUNS=${*:-1 2 3 4 5}
    FIRST="seed"
fi
echo "| $FIRST | policy | offered load | utilisation | in arrivals | mean JCT (h) | p95 JCT (h) | mean queueing (h) | fragmentation | migrations | resizes | move overhead (max job) | makespan (h) | sim time (s) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for run in $RUNS; do
    if [ -n "${TRACE:-}" ]; then
        # testdata/cluster/64x8.json with `count` nodes.
        sed "s/\"count\": 64/\"count\": $run/" testdata/cluster/64x8.json >"$TMP/cluster.json"
        trace=$TRACE
        label=$((run * 8))
    else
        cp testdata/cluster/64x8.json "$TMP/cluster.json"
        trace=$TMP/t.csv
        "$BIN" cluster trace --jobs "${JOBS:-1000}" --seed "$run" --load "$LOAD" --output "$trace" 2>/dev/null
        label=$run
    fi
    for policy in ${POLICIES:-static elastic}; do
        start=$(date +%s.%N)
        "$BIN" cluster simulate --cluster "$TMP/cluster.json" --trace "$trace" --policy "$policy" \
            --format json --output "$TMP/$policy.json"
        end=$(date +%s.%N)
        python3 - "$TMP/$policy.json" "$label" "$policy" "$start" "$end" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
label, policy, t0, t1 = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
h = lambda s: f"{s / 3600:.2f}"
print(f"| {label} | {policy} | {m['offered_load']:.2f} | {100 * m['utilization']:.1f}% | {100 * m['window_utilization']:.1f}% "
      f"| {h(m['mean_jct_s'])} | {h(m['p95_jct_s'])} "
      f"| {h(m['mean_queue_s'])} | {100 * m['fragmentation']:.1f}% | {m['migrations']} | {m['resizes']} "
      f"| {100 * m['migration_overhead']:.2f}% ({100 * m['max_job_overhead']:.1f}%) | {h(m['makespan_s'])} | {t1 - t0:.2f} |")
PY
    done
done
