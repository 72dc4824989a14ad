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
# moe_overlap) predicts the run's pipeline time from the run's own measured costs:
# compute-only op costs (an op's duration less its measured all-to-all waits), each
# all-to-all's measured wait (the link's latency + how late the last peer sent + how late
# the receiving thread woke, each printed), and, for an overlapped pair, each chunk's own
# compute (its token holds), waits and hand-overs (its first wait for the token, its
# all-to-alls' hand-overs, and for the forward chunk its thread's start) measured inside
# the pairs (`ExpertComm::pair_chunks`). `sim, prev` is the previous model: every
# all-to-all waits the latency, the pair's chunks cost what lone ops do, plus the mean
# hand-over; `sim, span` the new one with each overlapped pair lasting its measured span (a
# check of the pair model). The modes
# run interleaved (A B C A B C ...) for ROUNDS rounds; each figure is the median over the
# rounds (a run's own figures: median step and pipeline time, mean op durations and
# waits). Prints the figures, the ratios, their spread over the rounds and the load
# average. RAYON_NUM_THREADS=1: each rank thread runs its own matrix products (the rank
# threads already outnumber the cores).
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

# Per run, the simulator's inputs (seconds), one line each:
# "F B W F&B FWAIT BWAIT HANDOVER PF PFWAIT PFHAND PB PBWAIT PBHAND" (measured) and
# "F B W F&B FWAIT BWAIT HANDOVER" (the previous model). n all-to-alls per chunk; a lone
# op's n mean waits come off its duration; a sequential pair loses both chunks' waits; an
# overlapped pair's compute is its two chunks' token holds, each chunk's waits and
# hand-overs n times their means inside the pairs.
python3 - "$out" $((2 * blocks)) "$latency" <<'PY'
import glob, json, sys
d, n, latency = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for path in sorted(glob.glob(f"{d}/*.*.json")):
    j = json.load(open(path))
    o, w = j["op_seconds"], j["expert_waits"]
    m = lambda k: w[k]["seconds"]
    wf, wb = n * m("forward"), n * m("backward")
    f, b = (o["f"] or 0) - wf, (o["b"] or 0) - wb
    hand = n * m("token_regain")
    if w["token_held"]["count"]:
        fb = m("held_forward") + m("held_backward")
        # The forward chunk runs on a thread of its own: it first waits for that thread to
        # run, then (as the backward chunk) for the token.
        pair = [m("held_forward"), n * m("pair_forward"),
                m("thread_start") + m("start_forward") + n * m("regain_forward"),
                m("held_backward"), n * m("pair_backward"),
                m("start_backward") + n * m("regain_backward")]
        span = m("pair_span")
    else:
        fb, pair = max((o["fb"] or 0) - wf - wb, 0), []
        span = fb
    link = n * latency  # n all-to-alls of one latency each
    with open(path[:-5] + ".costs", "w") as out:
        print(*[f, b, o["w"] or 0, fb, wf, wb, hand] + pair, file=out)
        print(f, b, o["w"] or 0, fb, link, link, hand, file=out)
        print(*[f, b, o["w"] or 0, span, wf, wb, hand] + pair, file=out)
PY
for round in $(seq 1 "$rounds"); do
  for r in "${runs[@]}"; do
    { read -r -a now; read -r -a prev; read -r -a span; } < "$out/$r.$round.costs"
    "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb "${now[@]}" > "$out/$r.$round.sim"
    "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb "${prev[@]}" > "$out/$r.$round.simprev"
    "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb "${span[@]}" > "$out/$r.$round.simspan"
  done
done

python3 - "$out" "$latency" "$rounds" $((2 * blocks)) "${runs[@]}" <<'PY'
import json, statistics as st, sys
d, latency, rounds, n, runs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
rows = {}
for r in runs:
    ks = range(1, rounds + 1)
    js = [json.load(open(f"{d}/{r}.{k}.json")) for k in ks]
    costs = [list(map(float, open(f"{d}/{r}.{k}.costs").readline().split())) for k in ks]
    sims = [float(open(f"{d}/{r}.{k}.sim").read()) for k in ks]
    prevs = [float(open(f"{d}/{r}.{k}.simprev").read()) for k in ks]
    spans = [float(open(f"{d}/{r}.{k}.simspan").read()) for k in ks]
    losses = {j["final_loss"] for j in js}
    assert len(losses) == 1, f"{r}: the runs ended on different losses {losses}"
    med = lambda key: st.median(j["expert_waits"][key]["seconds"] for j in js)
    waits = {k: (med(k), med(k + "_due")) for k in ("forward", "backward", "pair_forward", "pair_backward")}
    pair_op = st.median(j["op_seconds"]["fb"] or 0 for j in js)
    span = st.median(j["expert_waits"]["pair_span"]["seconds"] for j in js)
    rows[r] = dict(pipe=[j["pipeline_seconds_median"] for j in js],
                   step=[j["step_seconds_median"] for j in js], sim=sims, prev=prevs, span=spans,
                   costs=[st.median(c[i] if i < len(c) else 0 for c in costs) for i in range(13)],
                   waits=waits, pair_op=pair_op, pair_span=span, loss=losses.pop())
print(f"link latency {latency * 1e3:.3f} ms per message ({n} all-to-alls per chunk); "
      f"medians of {rounds} rounds")
ms = lambda v: f"{v * 1e3:.2f}"
print("one all-to-all's wait, ms = latency + lag (the last peer sent later) + late (the "
      "receiver woke later)")
print(f"{'run':20} {'kind':>13} {'wait':>6} {'lag':>6} {'late':>6}")
for r, x in rows.items():
    for k, (wait, due) in x["waits"].items():
        if wait:
            print(f"{r:20} {k:>13} {ms(wait):>6} {ms(due - latency):>6} {ms(wait - due):>6}")
print()
print(f"{'run':20} {'compute only, ms: F':>19} {'B':>5} {'W':>5} {'F&B':>6} "
      f"{'pair: F':>7} {'waits':>6} {'hand':>5} {'B':>5} {'waits':>6} {'hand':>5} "
      f"{'pair op':>7} {'span':>5} {'model':>6}")
for r, x in rows.items():
    c = x["costs"]
    model = max(c[3], c[7] + c[8] + c[9], c[10] + c[11] + c[12]) if c[7] else 0
    print(f"{r:20} {ms(c[0]):>19} {ms(c[1]):>5} {ms(c[2]):>5} {ms(c[3]):>6} "
          + " ".join(f"{ms(v):>{wd}}" for v, wd in zip(c[7:13], (7, 6, 5, 5, 6, 5)))
          + f" {ms(x['pair_op']):>7} {ms(x['pair_span']):>5} {ms(model):>6}")
print()
print(f"{'run':20} {'step':>7} {'pipe':>7} {'sim':>7} {'sim, prev':>9} {'sim, span':>9} "
      f"{'final loss':>10}")
for r, x in rows.items():
    print(f"{r:20} {st.median(x['step']):7.4f} {st.median(x['pipe']):7.4f} "
          f"{st.median(x['sim']):7.4f} {st.median(x['prev']):9.4f} {st.median(x['span']):9.4f} "
          f"{x['loss']:10.6f}")
print()
print(f"{'ratio (median of rounds)':40} {'pipe':>6} {'range':>11} {'sim':>6} {'sim/pipe':>8} "
      f"{'prev':>6} {'prev/pipe':>9} {'span':>6} {'span/pipe':>9}")
for a, b in [("dualpipe_overlap", "dualpipe_no_overlap"), ("dualpipe_overlap", "1f1b"),
             ("dualpipe_no_overlap", "1f1b")]:
    per = lambda k: [x / y for x, y in zip(rows[a][k], rows[b][k])]
    pipe, sim, prev, span = per("pipe"), per("sim"), per("prev"), per("span")
    p, s, s0, s1 = st.median(pipe), st.median(sim), st.median(prev), st.median(span)
    print(f"{a + ' / ' + b:40} {p:6.3f} {min(pipe):5.3f}-{max(pipe):5.3f} {s:6.3f} "
          f"{s / p:8.3f} {s0:6.3f} {s0 / p:9.3f} {s1:6.3f} {s1 / p:9.3f}")
PY
