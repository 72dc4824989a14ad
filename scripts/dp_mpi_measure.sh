#!/usr/bin/env bash
# Under MPI, the uncompressed gradient exchange on MPI's own all-reduce (MPI_Iallreduce, the
# default) vs our point-to-point exchange (--no-mpi-allreduce), on the default model:
# `mpiexec -n 8 dualpipe train --transport mpi --ranks 4 --data-parallel 2 --micro-batches 8`.
# The runs alternate (allreduce, point-to-point, allreduce, ...) so load changes hit both alike;
# the load average is printed before and after.
# Usage: scripts/dp_mpi_measure.sh [STEPS] [PAIRS] [SCHEDULE]   (defaults 20, 3, dualpipe)
# DUALPIPE_BIN: a binary built with --features mpi (default target/debug/dualpipe, which this
# workspace's dev profile optimises); MPIEXEC: the launcher (default mpiexec).
set -euo pipefail
steps=${1:-20}
pairs=${2:-3}
schedule=${3:-dualpipe}
bin=${DUALPIPE_BIN:-target/debug/dualpipe}
launch=(${MPIEXEC:-mpiexec})
[ -x "$bin" ] || { echo "build it first: cargo build -p dualpipe-cli --features mpi" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load before: $(uptime)"
for i in $(seq 1 "$pairs"); do
  for mode in mpi-allreduce point-to-point; do
    flag=(); [ "$mode" = point-to-point ] && flag=(--no-mpi-allreduce)
    "${launch[@]}" -n 8 "$bin" train --transport mpi --schedule "$schedule" --ranks 4 \
      --data-parallel 2 --micro-batches 8 --steps "$steps" --eval-every 0 --format json --quiet \
      "${flag[@]}" > "$out/$mode.$i.json"
    python3 - "$out/$mode.$i.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['grad_exchange']:>14}: step {1e3 * s['step_seconds_median']:7.1f} ms (median), "
      f"pipeline {1e3 * s['pipeline_seconds_median']:7.1f} ms, "
      f"communication_overhead {100 * s['communication_overhead']:5.2f}%, "
      f"grad_bytes_sent {s['grad_bytes_sent']}, final loss {s['losses'][-1]:.6f}")
PY
  done
done
echo "load after: $(uptime)"
