#!/usr/bin/env bash
# Step time and communication_overhead of the data-parallel exchange, overlapped (started by
# the executor's hook as each stage's gradients become final) vs --no-overlap (after the
# pipeline), on the default model: train --data-parallel 2 --micro-batches 8, release.
# The runs alternate (overlap, no-overlap, overlap, ...) so load changes hit both alike.
# Usage: scripts/dp_overlap_measure.sh [STEPS] [PAIRS]   (defaults 30 and 2)
set -euo pipefail
steps=${1:-30}
pairs=${2:-2}
bin=${DUALPIPE_BIN:-target/release/dualpipe}
[ -x "$bin" ] || { echo "build it first: cargo build --release -p dualpipe-cli" >&2; exit 2; }
out=$(mktemp -d)
echo "load before: $(uptime)"
for i in $(seq 1 "$pairs"); do
  for mode in overlap no-overlap; do
    flag=(); [ "$mode" = no-overlap ] && flag=(--no-overlap)
    "$bin" train --data-parallel 2 --micro-batches 8 --steps "$steps" --eval-every 0 \
      --format json "${flag[@]}" > "$out/$mode.$i.json"
    python3 - "$mode" "$out/$mode.$i.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]:>10}: step {1e3 * s['step_seconds_median']:8.1f} ms (median), "
      f"pipeline {1e3 * s['pipeline_seconds_median']:8.1f} ms, "
      f"communication_overhead {100 * s['communication_overhead']:5.2f}%, "
      f"grad_bytes_sent {s['grad_bytes_sent']}, final loss {s['losses'][-1]:.6f}")
PY
  done
done
echo "load after: $(uptime)"
rm -rf "$out"
