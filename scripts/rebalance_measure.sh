#!/usr/bin/env bash
# One rank 2x slower: the throughput of the even split (before re-partitioning), of the run
# that re-partitions itself (--rebalance-stages), of the partition it moved to (after), and of
# the best static plan of `dualpipe plan` for a topology where that rank's device has speed
# 0.5. Every run is the default GPT (d_model 64, 8 blocks, f32, 16 micro-batches of 8) on 4
# rank threads, side by side in one go; the figure is the median step time.
#
#   B=target/release/dualpipe scripts/rebalance_measure.sh [STEPS] [SCHEDULES]
set -euo pipefail
B=${B:-target/release/dualpipe}
STEPS=${1:-40}
SCHEDULES=${2:-"1f1b dualpipe"}
SLOW=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
loud=(--steps "$STEPS" --eval-every 0 --format json)
common=("${loud[@]}" --quiet)

"$B" train --profile "$dir/profile.json" --quiet
cat > "$dir/topo.json" <<EOF
{"links": {"intra_node": {"latency": 1e-6, "bandwidth": 1e10},
           "inter_node": {"latency": 1e-5, "bandwidth": 1e9},
           "inter_datacenter": {"latency": 0.1, "bandwidth": 1e8}},
 "datacenters": [{"name": "dc", "nodes": [{"name": "n", "devices": [
   {"name": "gpu0", "speed": 1, "memory": 1e10}, {"name": "gpu1", "speed": 0.5, "memory": 1e10},
   {"name": "gpu2", "speed": 1, "memory": 1e10}, {"name": "gpu3", "speed": 1, "memory": 1e10}]}]}]}
EOF

median() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f" % (d["step_seconds_median"]*1e3))' "$1"; }
corewait() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f%%" % (d["core_wait_ratio"]*100))' "$1"; }
throughput() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f" % (d["micro_batches"]*d["micro_batch_size"]*d["seq_len"]/d["step_seconds_median"]))' "$1"; }

printf '| schedule | run | partition | step median (ms) | tokens/s | core wait |\n|---|---|---|---:|---:|---:|\n'
for s in $SCHEDULES; do
  "$B" train --schedule "$s" "${common[@]}" > "$dir/plain.json"
  "$B" train --schedule "$s" --slow-rank $SLOW:2 "${common[@]}" > "$dir/even.json"
  "$B" train --schedule "$s" --slow-rank $SLOW:2 --rebalance-stages "${loud[@]}" \
      > "$dir/re.json" 2> "$dir/re.err"
  moved=$(grep -o 'blocks [0-9,]* -> [0-9,]*' "$dir/re.err" | tail -1 | sed 's/.*-> //')
  moved=${moved:-2,2,2,2}
  "$B" train --schedule "$s" --slow-rank $SLOW:2 --partition "$moved" "${common[@]}" > "$dir/after.json"
  "$B" plan --topology "$dir/topo.json" --profile "$dir/profile.json" --schedules "$s" \
      --micro-batches 16 --format json --output "$dir/plan.json"
  # The plan may put the slow device on another rank: slow that rank.
  read -r planned prank < <(python3 -c '
import json,sys; p=json.load(open(sys.argv[1]))["plans"][0]
part=",".join(str(x["end_layer"]-x["first_layer"]) for x in p["stages"])
rank=[r["rank"] for r in p["placement"] if r["device"].endswith("gpu1")][0]
print(part, rank)' "$dir/plan.json")
  "$B" train --plan "$dir/plan.json" --slow-rank "$prank:2" "${common[@]}" > "$dir/plan_run.json"
  echo "| $s | no slow rank | 2,2,2,2 | $(median "$dir/plain.json") | $(throughput "$dir/plain.json") | $(corewait "$dir/plain.json") |"
  echo "| $s | rank $SLOW 2x slower, even (before) | 2,2,2,2 | $(median "$dir/even.json") | $(throughput "$dir/even.json") | $(corewait "$dir/even.json") |"
  echo "| $s | --rebalance-stages (whole run) | 2,2,2,2 -> $moved | $(median "$dir/re.json") | $(throughput "$dir/re.json") | $(corewait "$dir/re.json") |"
  echo "| $s | after re-partitioning | $moved | $(median "$dir/after.json") | $(throughput "$dir/after.json") | $(corewait "$dir/after.json") |"
  echo "| $s | best static plan (slow device on rank $prank) | $planned | $(median "$dir/plan_run.json") | $(throughput "$dir/plan_run.json") | $(corewait "$dir/plan_run.json") |"
  grep 'rebalanced' "$dir/re.err" | sed 's/^/  /' >&2 || true
done
