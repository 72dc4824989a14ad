#!/usr/bin/env bash
# The quality of the compressed gradient exchange on the default run, over several seeds:
# for each seed, `train --data-parallel 2 --micro-batches 8` (the default global batch on two
# replicas) without compression, then with 1-bit Adam after each warm-up in WARMUPS, and the
# validation loss after the last step beside `none`'s, with the bytes sent as a share of the
# uncompressed bytes. Extra arguments go to every run (e.g. --lr 0.001 or --steps 100).
# Usage: scripts/compression_quality.sh [SEEDS] [-- TRAIN_FLAGS...]
#   SEEDS: comma-separated, default 0,2,3; WARMUPS (env): default "60 100 150"
set -euo pipefail
seeds=${1:-0,2,3}
shift || true
[ "${1:-}" = -- ] && shift
bin=${DUALPIPE_BIN:-target/release/dualpipe}
[ -x "$bin" ] || { echo "build it first: cargo build --release -p dualpipe-cli" >&2; exit 2; }
warmups=${WARMUPS:-60 100 150}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load before: $(uptime)"
echo "flags: --data-parallel 2 --micro-batches 8 $*"
for seed in ${seeds//,/ }; do
    runs=(none)
    "$bin" train --data-parallel 2 --micro-batches 8 --seed "$seed" --format json --quiet "$@" \
        > "$out/$seed.none.json"
    for w in $warmups; do
        "$bin" train --data-parallel 2 --micro-batches 8 --seed "$seed" --format json --quiet \
            --gradient-compression 1bit --compression-warmup "$w" "$@" > "$out/$seed.w$w.json"
        runs+=("w$w")
    done
    python3 - "$out" "$seed" "${runs[@]}" <<'PY'
import json, sys
out, seed, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
base = json.load(open(f"{out}/{seed}.none.json"))
for run in runs:
    s = json.load(open(f"{out}/{seed}.{run}.json"))
    name = "none" if run == "none" else f"1-bit Adam, warm-up {run[1:]}"
    gap = 100 * (s["eval_loss"] / base["eval_loss"] - 1)
    share = 100 * s["grad_bytes_sent"] / s["grad_bytes_uncompressed"]
    print(f"seed {seed:>3}  {name:<26} validation {s['eval_loss']:.4f}  "
          f"vs none {gap:+6.2f}%  bytes {share:5.1f}%  ({s['total_seconds']:.0f} s)")
PY
done
echo "load after: $(uptime)"
