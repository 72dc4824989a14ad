#!/usr/bin/env bash
# Under MPI, two gradient exchanges side by side on the default model:
# `mpiexec -n 8 dualpipe train --transport mpi --ranks 4 --data-parallel 2 --micro-batches 8`.
# By default the uncompressed exchange on MPI's own all-reduce (MPI_Iallreduce, the default) vs
# our point-to-point exchange (--no-mpi-allreduce); with DUALPIPE_BIN_B set, the binary
# DUALPIPE_BIN vs the binary DUALPIPE_BIN_B with the same flags (e.g. a build of an earlier
# commit against this one). The runs alternate (A, B, A, B, ...) so load changes hit both
# alike; the load average is printed before and after.
# Usage: scripts/dp_mpi_measure.sh [STEPS] [PAIRS] [SCHEDULE] [FLAG...]
#   (defaults 20, 3, dualpipe; FLAGs go to every run, e.g. --gradient-compression int8)
# DUALPIPE_BIN: a binary built with --features mpi (default target/debug/dualpipe, which this
# workspace's dev profile optimises); MPIEXEC: the launcher (default mpiexec).
set -euo pipefail
steps=${1:-20}
pairs=${2:-3}
schedule=${3:-dualpipe}
shift $(($# < 3 ? $# : 3))
bin=${DUALPIPE_BIN:-target/debug/dualpipe}
bin_b=${DUALPIPE_BIN_B:-}
launch=(${MPIEXEC:-mpiexec})
for b in "$bin" ${bin_b:+"$bin_b"}; do
  [ -x "$b" ] || { echo "$b: build it first: cargo build -p dualpipe-cli --features mpi" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load before: $(uptime)"
for i in $(seq 1 "$pairs"); do
  for mode in A B; do
    run_bin=$bin flag=()
    if [ -n "$bin_b" ]; then
      [ "$mode" = B ] && run_bin=$bin_b
      label=$(basename "$run_bin")
    else
      [ "$mode" = B ] && flag=(--no-mpi-allreduce)
      label=""
    fi
    "${launch[@]}" -n 8 "$run_bin" train --transport mpi --schedule "$schedule" --ranks 4 \
      --data-parallel 2 --micro-batches 8 --steps "$steps" --eval-every 0 --format json --quiet \
      "${flag[@]}" "$@" > "$out/$mode.$i.json"
    python3 - "$out/$mode.$i.json" "$label" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
label = sys.argv[2] or s['grad_exchange']
print(f"{label:>14}: step {1e3 * s['step_seconds_median']:7.1f} ms (median), "
      f"pipeline {1e3 * s['pipeline_seconds_median']:7.1f} ms, "
      f"communication_overhead {100 * s['communication_overhead']:5.2f}%, "
      f"grad_bytes_sent {s['grad_bytes_sent']}, "
      f"started {s.get('grad_exchange_started', '(not reported)')}, final loss {s['losses'][-1]:.6f}")
PY
  done
done
echo "load after: $(uptime)"
