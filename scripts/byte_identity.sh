#!/usr/bin/env bash
# Byte-identity check for refactors: runs a fixed set of commands whose outputs must not change
# (schedule JSON / CSV, EPLB plans as JSON, `train --dtype f64` losses) with one binary and writes
# each output into a folder; with two folders, compares them.
#
#   scripts/byte_identity.sh record BIN DIR    # e.g. a build of the commit before the change
#   scripts/byte_identity.sh compare DIR_A DIR_B
set -euo pipefail
cd "$(dirname "$0")/.."

record() {
    local bin=$1 out=$2
    mkdir -p "$out"
    local kinds="gpipe 1f1b interleaved zb1p dualpipe dualpipev"
    for kind in $kinds; do
        for shape in "4 8" "8 20" "2 7"; do
            set -- $shape
            for format in json csv; do
                "$bin" schedule --schedule "$kind" --ranks "$1" --micro-batches "$2" --format "$format" \
                    >"$out/schedule-$kind-$1x$2.$format" 2>&1 || echo "exit $?" >>"$out/schedule-$kind-$1x$2.$format"
            done
        done
    done
    for case in testdata/golden/eplb/case1-00[0-9]*.json; do
        local name
        name=$(basename "$case" .json)
        python3 - "$case" "$out/$name.loads.json" <<'PY'
import json, sys
case = json.load(open(sys.argv[1]))
json.dump(case["weight"], open(sys.argv[2], "w"))
PY
        local args
        args=$(python3 -c "import json,sys; c=json.load(open('$case')); print(c['num_replicas'], c['num_groups'], c['num_nodes'], c['num_gpus'])")
        set -- $args
        for policy in deepseek improved; do
            "$bin" eplb --loads "$out/$name.loads.json" --replicas "$1" --groups "$2" --nodes "$3" --gpus "$4" \
                --policy "$policy" --format json >"$out/eplb-$name-$policy.json" 2>&1 || echo "exit $?" >>"$out/eplb-$name-$policy.json"
        done
        rm -f "$out/$name.loads.json"
    done
    # The MLP's run: name the model where the binary has a choice (the GPT is its default).
    local model=()
    if grep -q -- "--model" <<<"$("$bin" train --help 2>/dev/null)"; then model=(--model mlp); fi
    for kind in dualpipe 1f1b dualpipev zb1p; do
        local ranks=4
        [ "$kind" = dualpipev ] && ranks=2
        "$bin" train "${model[@]}" --schedule "$kind" --ranks "$ranks" --dtype f64 --steps 5 --hidden 32 \
            --micro-batch-size 16 --quiet --format json 2>/dev/null |
            python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['losses']))" \
                >"$out/train-$kind-f64-losses.json"
    done
    echo "recorded $(ls "$out" | wc -l) outputs in $out"
}

compare() {
    local a=$1 b=$2 bad=0 n=0
    for f in "$a"/*; do
        n=$((n + 1))
        if ! cmp -s "$f" "$b/$(basename "$f")"; then
            echo "differs: $(basename "$f")"
            bad=$((bad + 1))
        fi
    done
    echo "$n outputs compared, $bad differ"
    [ "$bad" -eq 0 ]
}

case "${1:-}" in
    record) record "$2" "$3" ;;
    compare) compare "$2" "$3" ;;
    *) echo "usage: $0 record BIN DIR | compare DIR_A DIR_B" >&2; exit 2 ;;
esac
