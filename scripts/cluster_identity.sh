#!/usr/bin/env bash
# Byte-identity of `cluster simulate` for refactors of the simulator: runs every policy (and the
# elastic policy's switches) on seeded synthetic traces of several loads and elastic shares, on
# an overloaded trace (a job every 0.5 s, docs/cluster.md's scaling section; las preempts on it),
# over every cluster file in testdata/cluster, and writes each JSON (metrics) and SVG (every
# device hold) into a folder; with two folders, compares them.
#
#   scripts/cluster_identity.sh record BIN DIR    # e.g. a build of the commit before the change
#   scripts/cluster_identity.sh compare DIR_A DIR_B
set -euo pipefail
cd "$(dirname "$0")/.."

record() {
    local bin=$1 out=$2
    mkdir -p "$out/traces"
    local t=$out/traces
    for cluster in testdata/cluster/*.json; do
        local c devices
        c=$(basename "$cluster" .json)
        devices=$(python3 -c 'import json,sys; print(sum(n.get("count",1)*n["devices"] for n in json.load(open(sys.argv[1]))["nodes"]))' "$cluster")
        local traces=()
        for spec in "1 0.7 0.7 600" "2 0.9 0.7 1000" "3 1.2 0 800" "4 2.0 0.7 1500" "5 1.0 1 500"; do
            set -- $spec
            "$bin" cluster trace --jobs "$4" --seed "$1" --load "$2" --elastic-share "$3" \
                --devices "$devices" --output "$t/$c-syn$1.csv" 2>/dev/null
            traces+=("$t/$c-syn$1.csv")
        done
        awk -v n=1500 -v g="$devices" 'BEGIN{print "job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile"; for(i=0;i<n;i++) { k=1+(i%8); if (k>g) k=g; printf "j%d,%g,%d,%d,,,\n", i, i*0.5, k, 600+(i%5000) } }' >"$t/$c-over.csv"
        traces+=("$t/$c-over.csv")
        for trace in "${traces[@]}"; do
            local name
            name=$(basename "$trace" .csv)
            for policy in static elastic las; do
                "$bin" cluster simulate --cluster "$cluster" --trace "$trace" --policy "$policy" \
                    --format json --output "$out/$name-$policy.json" --svg "$out/$name-$policy.svg" \
                    2>"$out/$name-$policy.err" || echo "exit $?" >>"$out/$name-$policy.err"
            done
            for flags in --no-grow --no-shrink --no-consolidate "--overhead-budget 0.2 --restart-s 5"; do
                local tag=${flags//[ -]/_}
                "$bin" cluster simulate --cluster "$cluster" --trace "$trace" --policy elastic $flags \
                    --format json --output "$out/$name-elastic$tag.json" 2>/dev/null \
                    || echo "exit $?" >>"$out/$name-elastic$tag.json"
            done
        done
    done
}

case ${1:-} in
record) record "$2" "$3" ;;
compare)
    diff -r --exclude=traces "$2" "$3" && echo "identical: $(find "$2" -maxdepth 1 -type f | wc -l) files"
    ;;
*)
    echo "usage: $0 record BIN DIR | compare DIR_A DIR_B" >&2
    exit 2
    ;;
esac
