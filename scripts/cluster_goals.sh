#!/usr/bin/env bash
# docs/cluster.md's goal tables (issue 59): elastic against static and against fifo on the same
# trace and cluster, with the rigid clairvoyant bound. One row per (run, policy), then one row
# per run with elastic's figures against each baseline and the goals they meet: all five of an
# overloaded pair (offered load at least 1), or the light goal (90% of the baseline's queueing
# removed) where the baseline queues; none where a light baseline does not queue.
#
# Seeded synthetic traces (JOBS jobs, default 20,000; LOAD, default 1.0) on 64 nodes x 8:
#   scripts/cluster_goals.sh [SEEDS...]           (default 1 2 3)
# A converted public trace (scripts/public_trace.py) on clusters of N nodes x 8 devices:
#   TRACE=helios.csv scripts/cluster_goals.sh 64 80 96
# BIN picks the build (default target/release/dualpipe, else target/debug/dualpipe).
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/dualpipe}
[ -x "$BIN" ] || BIN=target/debug/dualpipe
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -n "${TRACE:-}" ]; then
    RUNS=${*:-64}
else
    RUNS=${*:-1 2 3}
fi
for run in $RUNS; do
    if [ -n "${TRACE:-}" ]; then
        sed "s/\"count\": 64/\"count\": $run/" testdata/cluster/64x8.json >"$TMP/cluster.json"
        trace=$TRACE
        label="$((run * 8)) devices"
    else
        cp testdata/cluster/64x8.json "$TMP/cluster.json"
        trace=$TMP/t-$run.csv
        "$BIN" cluster trace --jobs "${JOBS:-20000}" --seed "$run" --load "${LOAD:-1.0}" \
            --output "$trace" 2>/dev/null
        label="seed $run"
    fi
    for policy in static fifo elastic; do
        "$BIN" cluster simulate --cluster "$TMP/cluster.json" --trace "$trace" --policy "$policy" \
            --format json --output "$TMP/$run-$policy.json" --quiet
    done
    echo "$run|$label" >>"$TMP/runs"
done
python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
runs = [l.strip().split("|", 1) for l in open(f"{tmp}/runs")]
h = lambda s: f"{s / 3600:.2f}"
print("| run | policy | offered load | mean JCT (h) | p95 JCT (h) | mean queueing (h) | middle half (h) | fragmentation | while waiting | max job paused | makespan (h) | bound (h) | bound share |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
ms = {}
for run, label in runs:
    for p in ["static", "fifo", "elastic"]:
        m = ms[run, p] = json.load(open(f"{tmp}/{run}-{p}.json"))
        print(f"| {label} | {p} | {m['offered_load']:.2f} | {h(m['mean_jct_s'])} | {h(m['p95_jct_s'])} "
              f"| {h(m['mean_queue_s'])} | {h(m['middle_mean_queue_s'])} | {100 * m['fragmentation']:.1f}% "
              f"| {100 * m['waiting_fragmentation']:.1f}% | {100 * m['max_job_overhead']:.1f}% "
              f"| {h(m['makespan_s'])} | {h(m['makespan_bound_s'])} | {100 * m['bound_share']:.1f}% |")
print()
print("| run | against | mean JCT | p95 JCT | queueing removed | fragmentation <= 9% | max job paused <= 5% | bound share >= 85% | goals met |")
print("|---|---|---|---|---|---|---|---|---|")
for run, label in runs:
    e = ms[run, "elastic"]
    for base in ["static", "fifo"]:
        b = ms[run, base]
        jct = e["mean_jct_s"] / b["mean_jct_s"] - 1
        p95 = e["p95_jct_s"] / b["p95_jct_s"] - 1
        removed = 1 - e["mean_queue_s"] / b["mean_queue_s"] if b["mean_queue_s"] > 0 else float("nan")
        if e["offered_load"] < 1 and b["mean_queue_s"] == 0:
            goals, names = [], []
        elif e["offered_load"] >= 1:
            goals = [jct <= -0.27, p95 <= 0, e["fragmentation"] <= 0.09,
                     e["max_job_overhead"] <= 0.05 + 1e-9, e["bound_share"] >= 0.85]
            names = ["JCT -27%", "p95", "frag", "paused", "bound"]
        else:
            goals = [removed >= 0.9]
            names = ["queueing -90%"]
        met = ", ".join(n for n, g in zip(names, goals) if g) or "none"
        missed = ", ".join(n for n, g in zip(names, goals) if not g)
        print(f"| {label} | {base} | {100 * jct:+.1f}% | {100 * p95:+.1f}% | {100 * removed:.1f}% "
              f"| {100 * e['fragmentation']:.1f}% | {100 * e['max_job_overhead']:.1f}% "
              f"| {100 * e['bound_share']:.1f}% | "
              + (f"{sum(goals)}/{len(goals)}" + (f" (missed: {missed})" if missed else "")
                 if goals else f"none apply (light, {base} does not queue)") + " |")
PY
