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
# its unemulated run's op costs and the latency. Prints medians, ratios and the load average.
#
# Usage: scripts/moe_overlap_measure.sh [STEPS]   (default 12; needs target/release/dualpipe)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
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
costs() { # FILE: the run's measured "F B W F&B"
  python3 -c 'import json,sys; o=json.load(open(sys.argv[1]))["op_seconds"]
print(" ".join(str(o[k] or 0) for k in ("f","b","w","fb")))' "$1"
}
cargo build --quiet --release -p dualpipe-sim --example moe_overlap
sim=target/release/examples/moe_overlap

echo "load before: $(uptime)"
for r in "${runs[@]}"; do
  # shellcheck disable=SC2086
  "$bin" "${common[@]}" ${mode[$r]} > "$out/$r.base.json"
done
read -r f _ < <(costs "$out/dualpipe_overlap.base.json")
# One chunk's all-to-all waits (2 per MoE block) as long as DualPipe's measured forward.
latency=$(python3 -c "print(f'{$f / (2 * $blocks):.6f}')")
for r in "${runs[@]}"; do
  # shellcheck disable=SC2086
  "$bin" "${common[@]}" ${mode[$r]} --link-latency "$latency" > "$out/$r.link.json"
done
echo "load after:  $(uptime)"
for r in "${runs[@]}"; do
  # shellcheck disable=SC2046
  "$sim" "${kind[$r]}" "${overlap[$r]}" $ranks $mb $(costs "$out/$r.base.json") $blocks \
    "$latency" > "$out/$r.sim"
done

python3 - "$out" "$latency" "${runs[@]}" <<'PY'
import json, sys
d, latency, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rows = {}
for r in runs:
    base = json.load(open(f"{d}/{r}.base.json"))
    link = json.load(open(f"{d}/{r}.link.json"))
    o = base["op_seconds"]
    rows[r] = dict(base_pipe=base["pipeline_seconds_median"], step=link["step_seconds_median"],
                   pipe=link["pipeline_seconds_median"], sim=float(open(f"{d}/{r}.sim").read()),
                   loss=link["final_loss"], ops=o)
print(f"link latency {latency * 1e3:.3f} ms per message (2 all-to-alls per MoE block each way)")
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
