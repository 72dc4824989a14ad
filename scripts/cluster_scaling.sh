#!/usr/bin/env bash
# docs/cluster.md's scaling table: seconds (wall and CPU: on a shared machine the CPU time is
# the steadier) and peak memory of `cluster simulate` (release build)
# per policy on traces of growing length, on 64 x 8 devices (testdata/cluster/64x8.json):
#   * load 2: `cluster trace --load 2 --devices 512` (about twice what the cluster carries);
#   * overloaded: a job every 0.5 s, 1-8 devices, 600-5,600 s (about 55 times what it carries).
#
#   scripts/cluster_scaling.sh [JOBS...]      (default: 10000 50000 100000 200000)
#   BIN=target/release/dualpipe POLICIES="static elastic las" FORMS="load2 over" scripts/cluster_scaling.sh
# Needs /usr/bin/time (GNU, for -v). One row per form, jobs and policy.
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/dualpipe}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "| trace | jobs | policy | wall (s) | CPU (s) | peak RSS (MiB) | mean JCT (h) | makespan (h) |"
echo "|---|---:|---|---:|---:|---:|---:|---:|"
for form in ${FORMS:-load2 over}; do
    for n in ${*:-10000 50000 100000 200000}; do
        trace=$TMP/$form-$n.csv
        if [ "$form" = load2 ]; then
            "$BIN" cluster trace --jobs "$n" --seed 1 --load 2 --devices 512 --output "$trace" 2>/dev/null
        else
            awk -v n="$n" 'BEGIN{print "job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile"; for(i=0;i<n;i++) printf "j%d,%g,%d,%d,,,\n", i, i*0.5, 1+(i%8), 600+(i%5000)}' >"$trace"
        fi
        for policy in ${POLICIES:-static elastic las}; do
            /usr/bin/time -v -o "$TMP/time" "$BIN" cluster simulate --cluster testdata/cluster/64x8.json \
                --trace "$trace" --policy "$policy" --format json --quiet --output "$TMP/out.json"
            secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,p,":"); s=0; for(i=1;i<=n;i++) s=s*60+p[i]; printf "%.1f", s}' "$TMP/time")
            cpu=$(awk -F': ' '/(User|System) time \(seconds\)/ {s+=$2} END {printf "%.1f", s}' "$TMP/time")
            rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$TMP/time")
            read -r jct makespan < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print("%.1f %.1f" % (m["mean_jct_s"]/3600, m["makespan_s"]/3600))' "$TMP/out.json")
            echo "| $form | $n | $policy | $secs | $cpu | $rss | $jct | $makespan |"
        done
    done
done
