#!/usr/bin/env bash
# The expert all-to-all hidden inside DualPipe's FB pair, measured and predicted.
#
# Trains the same MoE GPT (8 experts, top-2, expert parallelism over 2 data-parallel
# workers, 2 ranks, 8 micro-batches, one MoE block per stage; the same global batch) three
# ways: DualPipe with the FB pair overlapped, DualPipe with --no-moe-overlap, and 1F1B; each
# first without link emulation (its measured F/B/W/F&B feed the simulator), then with an
# emulated link for the expert all-to-alls whose latency is sized from DualPipe's first run
# so that one chunk's all-to-all waits cost about one forward's compute. The simulator
# (crates/dualpipe-sim, example moe_overlap) predicts each emulated run's pipeline time from
# its unemulated run's op costs and the latency. Every run is repeated ROUNDS times, the six
# runs of a round one after another, and each figure is the median over the rounds (a run's
# own figures: median step and pipeline time, mean op durations). Prints the figures, the
# ratios and the load average. RAYON_NUM_THREADS=1 is set: each rank thread runs its own
# matrix products (the rank threads already outnumber the cores).
#
# Usage: scripts/moe_overlap_measure.sh [STEPS] [ROUNDS]   (default 20 and 3; needs
# target/release/dualpipe)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
rounds=${2:-3}
export RAYON_NUM_THREADS=1
bin=target/release/dualpipe
[ -x "$bin" ] || { echo "error: $bin is missing; run cargo build --release" >&2; exit 2; }
ranks=2
mb=8
blocks=1 # MoE blocks per stage (--layers-per-stage 1, every block MoE)
common=(train --model gpt --experts 8 --top-k 2 --ranks $ranks --micro-batches $mb
  --layers-per-stage $blocks --data-parallel 2 --expert-parallel --eval-every 0
  --steps "$steps" --format json --quiet)
declare -A mode=(
  [dualpipe_overlap]="--schedule dualpipe"
  [dualpipe_no_overlap]="--schedule dualpipe --no-moe-overlap"
  [1f1b]="--schedule 1f1b"
)
declare -A kind=([dualpipe_overlap]=dualpipe [dualpipe_no_overlap]=dualpipe [1f1b]=1f1b)
declare -A overlap=([dualpipe_overlap]=1 [dualpipe_no_overlap]=0 [1f1b]=0)
runs=(dualpipe_overlap dualpipe_no_overlap 1f1b)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
costs() { # RUN: the run's measured "F B W F&B", each the median over the rounds
  python3 -c 'import json,sys,statistics as st
o=[json.load(open(f))["op_seconds"] for f in sys.argv[1:]]
print(" ".join(str(st.median(x[k] or 0 for x in o)) for k in ("f","b","w","fb")))' \
    "$out"/"$1".base.*.json
}
cargo build --quiet --release -p dualpipe-sim --example moe_overlap
sim=target/release/examples/moe_overlap

echo "load before: $(uptime)"
# The latency: one chunk's all-to-all waits (2 per MoE block) as long as DualPipe's
# forward, measured in a first unemulated run.
# shellcheck disable=SC2086
"$bin" "${common[@]}" ${mode[dualpipe_overlap]} > "$out/dualpipe_overlap.base.0.json"
read -r f _ < <(costs dualpipe_overlap)
rm "$out/dualpipe_overlap.base.0.json"
latency=$(python3 -c "print(f'{$f / (2 * $blocks):.6f}')")
for round in $(seq 1 "$rounds"); do
  for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    "$bin" "${common[@]}" ${mode[$r]} > "$out/$r.base.$round.json"
    # shellcheck disable=SC2086
    "$bin" "${common[@]}" ${mode[$r]} --link-latency "$latency" > "$out/$r.link.$round.json"
  done
done
echo "load after:  $(uptime)"
for r in "${runs[@]}"; do
  # shellcheck disable=SC2046
  "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb $(costs "$r") $blocks "$latency" \
    > "$out/$r.sim"
done

python3 - "$out" "$latency" "${runs[@]}" <<'PY'
import glob, json, statistics as st, sys
d, latency, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rows = {}
load = lambda r, what: [json.load(open(f)) for f in sorted(glob.glob(f"{d}/{r}.{what}.*.json"))]
med = lambda js, k: st.median(j[k] for j in js)
for r in runs:
    base, link = load(r, "base"), load(r, "link")
    ops = {k: st.median(j["op_seconds"][k] or 0 for j in base) for k in ("f", "b", "w", "fb")}
    losses = {j["final_loss"] for j in base + link}
    assert len(losses) == 1, f"{r}: the runs ended on different losses {losses}"
    rows[r] = dict(base_pipe=med(base, "pipeline_seconds_median"),
                   step=med(link, "step_seconds_median"),
                   pipe=med(link, "pipeline_seconds_median"),
                   sim=float(open(f"{d}/{r}.sim").read()), loss=losses.pop(), ops=ops)
print(f"link latency {latency * 1e3:.3f} ms per message (2 all-to-alls per MoE block each way); "
      f"medians of {len(load(runs[0], 'link'))} rounds")
print(f"{'run':20} {'F ms':>6} {'B ms':>6} {'W ms':>6} {'F&B ms':>7} {'pipe, no link':>13} "
      f"{'step':>7} {'pipe':>7} {'sim pipe':>8} {'final loss':>10}")
ms = lambda v: f"{(v or 0) * 1e3:.2f}"
for r, x in rows.items():
    o = x["ops"]
    print(f"{r:20} {ms(o['f']):>6} {ms(o['b']):>6} {ms(o['w']):>6} {ms(o['fb']):>7} "
          f"{x['base_pipe']:13.4f} {x['step']:7.4f} {x['pipe']:7.4f} {x['sim']:8.4f} "
          f"{x['loss']:10.6f}")
print()
print(f"{'ratio':36} {'step':>6} {'pipe':>6} {'sim':>6} {'sim/pipe':>8}")
for a, b in [("dualpipe_overlap", "dualpipe_no_overlap"), ("dualpipe_overlap", "1f1b"),
             ("dualpipe_no_overlap", "1f1b")]:
    step = rows[a]["step"] / rows[b]["step"]
    pipe = rows[a]["pipe"] / rows[b]["pipe"]
    sim = rows[a]["sim"] / rows[b]["sim"]
    print(f"{a + ' / ' + b:36} {step:6.3f} {pipe:6.3f} {sim:6.3f} {sim / pipe:8.3f}")
PY
