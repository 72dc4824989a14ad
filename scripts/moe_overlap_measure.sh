#!/usr/bin/env bash
# The expert all-to-all hidden inside DualPipe's FB pair, measured and predicted.
#
# Trains the same MoE GPT (expert parallelism over 2 data-parallel workers, 2 ranks) with an
# emulated link for the expert all-to-alls, three ways, side by side in one run:
#   DualPipe with the FB pair overlapped, DualPipe with --no-moe-overlap, and 1F1B;
# the link's latency is sized from a first run without emulation so that one chunk's
# all-to-all waits cost about a forward's compute. The simulator (crates/dualpipe-sim,
# example moe_overlap) predicts the same three pipeline times from that first run's measured
# F/B/W/F&B and the latency. Prints a table of medians and ratios, with the load average.
#
# Usage: scripts/moe_overlap_measure.sh [STEPS]   (default 8; needs target/release/dualpipe)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
bin=target/release/dualpipe
[ -x "$bin" ] || { echo "error: $bin is missing; run cargo build --release" >&2; exit 2; }
ranks=2
mb=8
blocks=1 # MoE blocks per stage (--layers-per-stage 1, every block MoE)
common=(train --model gpt --experts 8 --top-k 2 --ranks $ranks --micro-batches $mb
  --layers-per-stage $blocks --data-parallel 2 --expert-parallel --eval-every 0
  --steps "$steps" --format json --quiet)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

field() { # FILE EXPR: a Python expression over the run's JSON `j`
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}

echo "load before: $(uptime)"
"$bin" "${common[@]}" --schedule dualpipe > "$out/base.json"
read -r f b w fb < <(field "$out/base.json" \
  '" ".join(str(j["op_seconds"][k]) for k in ("f","b","w","fb"))')
# One chunk's all-to-all waits (2 per MoE block) as long as a forward's compute.
latency=$(python3 -c "print(f'{$f / (2 * $blocks):.6f}')")
echo "measured without emulation: F $f B $b W $w F&B $fb s; link latency set to $latency s"

link=(--link-latency "$latency")
"$bin" "${common[@]}" --schedule dualpipe "${link[@]}" > "$out/overlap.json"
"$bin" "${common[@]}" --schedule dualpipe "${link[@]}" --no-moe-overlap > "$out/sequential.json"
"$bin" "${common[@]}" --schedule 1f1b "${link[@]}" > "$out/1f1b.json"
echo "load after:  $(uptime)"

cargo run --quiet --release -p dualpipe-sim --example moe_overlap -- \
  $ranks $mb "$f" "$b" "$w" "$fb" $blocks "$latency" > "$out/predicted.txt"

python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
runs = {"dualpipe_overlap": "overlap", "dualpipe_no_overlap": "sequential", "1f1b": "1f1b"}
pred = dict(l.split() for l in open(f"{d}/predicted.txt"))
base = json.load(open(f"{d}/base.json"))
other = base["step_seconds_median"] - base["pipeline_seconds_median"]
rows = {}
for name, file in runs.items():
    j = json.load(open(f"{d}/{file}.json"))
    rows[name] = (j["step_seconds_median"], j["pipeline_seconds_median"], float(pred[name]),
                  j["final_loss"])
print(f"{'run':22} {'step s':>8} {'pipeline s':>10} {'sim pipeline s':>14} {'final loss':>10}")
for name, (step, pipe, sim, loss) in rows.items():
    print(f"{name:22} {step:8.4f} {pipe:10.4f} {sim:14.4f} {loss:10.6f}")
print()
print(f"{'ratio':34} {'measured step':>13} {'measured pipe':>13} {'simulated':>9} {'sim step':>8}")
for a, b in [("dualpipe_overlap", "dualpipe_no_overlap"), ("dualpipe_overlap", "1f1b"),
             ("dualpipe_no_overlap", "1f1b")]:
    ms = rows[a][0] / rows[b][0]
    mp = rows[a][1] / rows[b][1]
    sp = rows[a][2] / rows[b][2]
    ss = (rows[a][2] + other) / (rows[b][2] + other)
    print(f"{a + ' / ' + b:34} {ms:13.3f} {mp:13.3f} {sp:9.3f} {ss:8.3f}")
print()
print(f"(sim step = simulated pipeline + the unemulated run's step minus pipeline, {other:.4f} s)")
PY
