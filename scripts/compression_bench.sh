#!/usr/bin/env bash
# The gradient compressions side by side on the default run, in one go: for each seed,
# `dualpipe train --data-parallel 2 --seed S --gradient-compression C` for C in none, bf16,
# int8 and 1bit with every other flag at its default (1bit therefore runs 1-bit Adam with its
# default warm-up and variance refreshes), then one table: the validation loss after the last
# step, its gap to `none` of the same seed, and the gradient bytes each run sent (all workers,
# the whole run, warm-up included) against the uncompressed figure, and on the steps of its
# own format only (1bit: not its int8 warm-up and variance refreshes); then the training and validation
# curves and, for the compressed runs, the error-feedback residual's norm every 25 steps.
# Usage: scripts/compression_bench.sh [SEEDS] [-- TRAIN_FLAGS...]
#   SEEDS: comma-separated, default 0,1,2. TRAIN_FLAGS go to every run (e.g. --steps 100).
#   COMPRESSIONS (env): default "none bf16 int8 1bit"; KEEP (env): a directory to keep the
#   runs' JSON in (a run whose JSON is already there is not run again, so an interrupted
#   benchmark continues where it stopped); JOBS (env): runs at a time (default 2). The runs
#   start compression by compression, seed by seed; a run that fails stops the benchmark
#   (exit 1) after the others finish.
set -euo pipefail
seeds=${1:-0,1,2}
shift || true
[ "${1:-}" = -- ] && shift
bin=${DUALPIPE_BIN:-target/release/dualpipe}
[ -x "$bin" ] || { echo "build it first: cargo build --release -p dualpipe-cli" >&2; exit 2; }
compressions=${COMPRESSIONS:-none bf16 int8 1bit}
case " $compressions " in *" none "*) ;; *) echo "COMPRESSIONS must include none (the baseline)" >&2; exit 2;; esac
if [ -n "${KEEP:-}" ]; then
    out=$KEEP
    mkdir -p "$out"
else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
echo "load before: $(uptime)"
echo "flags: train --data-parallel 2 --seed S --gradient-compression C $*"
jobs_at_once=${JOBS:-2}
run_one() {
    local c=$1 seed=$2 json="$out/$2.$1.json"
    if [ -n "${KEEP:-}" ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))" \
        "$json" 2>/dev/null; then
        echo "seed $seed $c: kept from $json" >&2
        return 0
    fi
    if "$bin" train --data-parallel 2 --seed "$seed" --gradient-compression "$c" \
        --format json --quiet "${@:3}" > "$json.part" 2> "$json.err"; then
        mv "$json.part" "$json"
        echo "seed $seed $c done ($(uptime | sed 's/.*load/load/'))" >&2
    else
        echo "seed $seed $c FAILED: $(tail -2 "$json.err")" >&2
        return 1
    fi
}
# The runs, JOBS (default 2) at a time; every one must finish.
pids=()
failed=0
for c in $compressions; do
    for seed in ${seeds//,/ }; do
        run_one "$c" "$seed" "$@" &
        pids+=($!)
        if [ ${#pids[@]} -ge "$jobs_at_once" ]; then
            wait "${pids[0]}" || failed=1
            pids=("${pids[@]:1}")
        fi
    done
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ $failed -eq 0 ] || { echo "some runs failed (see above)" >&2; exit 1; }
python3 - "$out" "$seeds" $compressions <<'PY'
import json, sys
out, seeds, comps = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
runs = {(s, c): json.load(open(f"{out}/{s}.{c}.json")) for s in seeds for c in comps}
print()
print("| compression | " + " | ".join(f"seed {s}: validation (vs none)" for s in seeds)
      + " | grad bytes sent (all seeds) | uncompressed | fewer (whole run) | fewer (its own steps) | warm-up |")
print("|---|" + "---:|" * (len(seeds) + 5))
for c in comps:
    cells, sent, unc = [], 0, 0
    for s in seeds:
        r, base = runs[(s, c)], runs[(s, "none")]["eval_loss"]
        gap = 100 * (r["eval_loss"] / base - 1)
        cells.append(f"{r['eval_loss']:.4f}" + ("" if c == "none" else f" ({gap:+.2f}%)"))
        sent += r["grad_bytes_sent"]
        unc += r["grad_bytes_uncompressed"]
    first = runs[(seeds[0], c)]
    warm, adam = first.get("compression_warmup"), first.get("one_bit_adam_from")
    refresh = first.get("variance_refresh")
    every = (f"variance refreshed on steps {refresh}, {2 * refresh}, {4 * refresh}, ..."
             if first.get("variance_refresh_doubling") else f"variance refresh every {refresh}")
    words = "" if warm is None else f"{warm} steps" + (f" (1-bit Adam, {every})" if adam else "")
    # The steps of the run's own format (replica 0's bytes), apart from warm-up/refreshes.
    own = [f for f in first.get("grad_bytes_by_format", []) if f["compression"] == c]
    own = (f"{100 * (1 - own[0]['bytes_sent'] / own[0]['bytes_uncompressed']):.2f}% "
           f"({own[0]['steps']} steps)") if own else "="
    print(f"| {c} | " + " | ".join(cells)
          + f" | {sent:,} | {unc:,} | {100 * (1 - sent / unc):.2f}% | {own} | {words} |")
print()
print("training loss (mean of 10 steps) every 25 steps:")
for (s, c), r in runs.items():
    l = r["losses"]
    pts = " ".join(f"{i + 1}:{sum(l[i - 9:i + 1]) / 10:.3f}" for i in range(24, len(l), 25))
    print(f"  seed {s} {c:>5}: {pts}")
print()
print("validation loss after each evaluation:")
for (s, c), r in runs.items():
    curve = " ".join(f"{e['step']}:{e['loss']:.4f}" for e in r["evaluations"])
    print(f"  seed {s} {c:>5}: {curve}")
print()
print("error-feedback residual norm (replica 0) every 25 steps:")
for (s, c), r in runs.items():
    norms = r.get("feedback_norms", [])
    if norms:
        pts = " ".join(f"{i + 1}:{norms[i]:.3g}" for i in range(24, len(norms), 25))
        print(f"  seed {s} {c:>5}: {pts}")
print()
print("seconds per run: " + ", ".join(f"{s}/{c} {r['total_seconds']:.0f}" for (s, c), r in runs.items()))
PY
echo "load after: $(uptime)"
