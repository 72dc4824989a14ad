#!/usr/bin/env bash
# The expert all-to-all hidden inside DualPipe's FB pair, measured and predicted.
#
# Trains the same MoE GPT (8 experts, top-2, expert parallelism over 2 data-parallel
# workers, 2 ranks, 8 micro-batches, one MoE block per stage; the same global batch) three
# ways: DualPipe with the FB pair overlapped, DualPipe with --no-moe-overlap, and 1F1B, over
# an emulated link for the expert all-to-alls whose latency is sized from a first DualPipe
# run without emulation so that one chunk's all-to-all waits cost about one forward's
# compute. Each emulated run reports its op durations (`op_seconds`) and the waits inside
# its all-to-alls (`expert_waits`); the simulator (crates/dualpipe-sim, example
# moe_overlap) predicts the run's pipeline time from its compute-only op costs (an op's
# duration less its measured all-to-all waits; an overlapped pair's compute is its two
# chunks' token holds) and the link's latency, and once more with the overlapped pair's
# measured hand-over added (`ExpertComm::handover`). The modes run interleaved (A B C A B C
# ...) for ROUNDS rounds; each figure is the median over the rounds (a run's own figures:
# median step and pipeline time, mean op durations and waits). Prints the figures, the
# ratios, their spread over the rounds and the load average. RAYON_NUM_THREADS=1: each rank
# thread runs its own matrix products (the rank threads already outnumber the cores).
#
# Usage: scripts/moe_overlap_measure.sh [STEPS] [ROUNDS]   (default 20 and 5; needs
# target/release/dualpipe)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
rounds=${2:-5}
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
cargo build --quiet --release -p dualpipe-sim --example moe_overlap
sim=target/release/examples/moe_overlap

echo "load before: $(uptime)"
# The latency: one chunk's all-to-all waits (2 per MoE block) as long as DualPipe's
# forward, measured in a first unemulated run.
# shellcheck disable=SC2086
"$bin" "${common[@]}" ${mode[dualpipe_overlap]} > "$out/sizing.json"
latency=$(python3 -c "import json; f = json.load(open('$out/sizing.json'))['op_seconds']['f']
print(f'{f / (2 * $blocks):.6f}')")
for round in $(seq 1 "$rounds"); do
  for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    "$bin" "${common[@]}" ${mode[$r]} --link-latency "$latency" > "$out/$r.$round.json"
  done
done
echo "load after:  $(uptime)"

# Compute-only costs per run: "F B W F&B HANDOVER" (seconds). n all-to-alls per chunk; a
# lone op's mean all-to-all wait times n comes off its duration; a sequential pair loses
# both chunks' waits; an overlapped pair's compute is its two token holds, its hand-over n
# times the mean hand-over.
python3 - "$out" $((2 * blocks)) "${runs[@]}" <<'PY'
import json, sys
d, n, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for path in sorted(__import__("glob").glob(f"{d}/*.*.json")):
    j = json.load(open(path))
    o, w = j["op_seconds"], j["expert_waits"]
    wf, wb = n * w["forward"]["seconds"], n * w["backward"]["seconds"]
    f = (o["f"] or 0) - wf
    b = (o["b"] or 0) - wb
    if w["token_held"]["count"]:
        fb, handover = 2 * w["token_held"]["seconds"], n * w["token_regain"]["seconds"]
    else:
        fb, handover = max((o["fb"] or 0) - wf - wb, 0), 0.0
    open(path[:-5] + ".costs", "w").write(f"{f} {b} {o['w'] or 0} {fb} {handover}\n")
PY
for round in $(seq 1 "$rounds"); do
  for r in "${runs[@]}"; do
    read -r f b w fb handover < "$out/$r.$round.costs"
    "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb "$f" "$b" "$w" "$fb" $blocks "$latency" \
      "$handover" > "$out/$r.$round.sim"
    "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb "$f" "$b" "$w" "$fb" $blocks "$latency" \
      0 > "$out/$r.$round.sim0"
  done
done

python3 - "$out" "$latency" "$rounds" "${runs[@]}" <<'PY'
import json, statistics as st, sys
d, latency, rounds, runs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = {}
for r in runs:
    js = [json.load(open(f"{d}/{r}.{k}.json")) for k in range(1, rounds + 1)]
    costs = [list(map(float, open(f"{d}/{r}.{k}.costs").read().split())) for k in range(1, rounds + 1)]
    sims = [float(open(f"{d}/{r}.{k}.sim").read()) for k in range(1, rounds + 1)]
    sims0 = [float(open(f"{d}/{r}.{k}.sim0").read()) for k in range(1, rounds + 1)]
    losses = {j["final_loss"] for j in js}
    assert len(losses) == 1, f"{r}: the runs ended on different losses {losses}"
    waits = {k: st.median(j["expert_waits"][k]["seconds"] for j in js)
             for k in ("forward", "backward", "pair_forward", "pair_backward", "token_regain")}
    rows[r] = dict(pipe=[j["pipeline_seconds_median"] for j in js],
                   step=[j["step_seconds_median"] for j in js], sim=sims, sim0=sims0,
                   costs=[st.median(c[i] for c in costs) for i in range(5)], waits=waits,
                   loss=losses.pop())
print(f"link latency {latency * 1e3:.3f} ms per message (2 all-to-alls per MoE block each way); "
      f"medians of {rounds} rounds")
ms = lambda v: f"{v * 1e3:.2f}"
print(f"{'run':20} {'compute only, ms: F':>19} {'B':>5} {'W':>5} {'F&B':>6} {'hand':>5} "
      f"{'wait/a2a ms: F':>14} {'B':>5} {'pair F':>6} {'pair B':>6} {'regain':>6}")
for r, x in rows.items():
    c, w = x["costs"], x["waits"]
    print(f"{r:20} {ms(c[0]):>19} {ms(c[1]):>5} {ms(c[2]):>5} {ms(c[3]):>6} {ms(c[4]):>5} "
          f"{ms(w['forward']):>14} {ms(w['backward']):>5} {ms(w['pair_forward']):>6} "
          f"{ms(w['pair_backward']):>6} {ms(w['token_regain']):>6}")
print()
print(f"{'run':20} {'step':>7} {'pipe':>7} {'sim':>7} {'sim, no hand-over':>17} {'final loss':>10}")
for r, x in rows.items():
    print(f"{r:20} {st.median(x['step']):7.4f} {st.median(x['pipe']):7.4f} "
          f"{st.median(x['sim']):7.4f} {st.median(x['sim0']):17.4f} {x['loss']:10.6f}")
print()
print(f"{'ratio (median of rounds)':40} {'pipe':>6} {'range':>11} {'sim':>6} {'sim/pipe':>8} "
      f"{'sim0':>6} {'sim0/pipe':>9}")
for a, b in [("dualpipe_overlap", "dualpipe_no_overlap"), ("dualpipe_overlap", "1f1b"),
             ("dualpipe_no_overlap", "1f1b")]:
    per = lambda k: [x / y for x, y in zip(rows[a][k], rows[b][k])]
    pipe, sim, sim0 = per("pipe"), per("sim"), per("sim0")
    p, s, s0 = st.median(pipe), st.median(sim), st.median(sim0)
    print(f"{a + ' / ' + b:40} {p:6.3f} {min(pipe):5.3f}-{max(pipe):5.3f} {s:6.3f} "
          f"{s / p:8.3f} {s0:6.3f} {s0 / p:9.3f}")
PY
