#!/usr/bin/env bash
# The gradient compressions side by side on the default run, in one go: for each seed,
# `dualpipe train --data-parallel 2 --seed S --gradient-compression C` for C in none, bf16,
# int8 and 1bit with every other flag at its default (1bit therefore runs 1-bit Adam after its
# default warm-up), then one table: the validation loss after the last step, its gap to
# `none` of the same seed, and the gradient bytes each run sent (all workers, the whole run,
# warm-up included) against the uncompressed figure; then the validation curves and, for the
# compressed runs, the error-feedback residual's norm every 25 steps.
# Usage: scripts/compression_bench.sh [SEEDS] [-- TRAIN_FLAGS...]
#   SEEDS: comma-separated, default 0,1,2. TRAIN_FLAGS go to every run (e.g. --steps 100).
#   COMPRESSIONS (env): default "none bf16 int8 1bit"; KEEP (env): a directory to keep the
#   runs' JSON in (a run whose JSON is already there is not run again, so an interrupted
#   benchmark continues where it stopped). The runs go compression by compression, seed by
#   seed.
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
for c in $compressions; do
    for seed in ${seeds//,/ }; do
        json="$out/$seed.$c.json"
        if [ -n "${KEEP:-}" ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))" \
            "$json" 2>/dev/null; then
            echo "seed $seed $c: kept from $json" >&2
            continue
        fi
        "$bin" train --data-parallel 2 --seed "$seed" --gradient-compression "$c" \
            --format json --quiet "$@" > "$json.part"
        mv "$json.part" "$json"
        echo "seed $seed $c done ($(uptime | sed 's/.*load/load/'))" >&2
    done
done
python3 - "$out" "$seeds" $compressions <<'PY'
import json, sys
out, seeds, comps = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
runs = {(s, c): json.load(open(f"{out}/{s}.{c}.json")) for s in seeds for c in comps}
print()
print("| compression | " + " | ".join(f"seed {s}: validation (vs none)" for s in seeds)
      + " | grad bytes sent (all seeds) | uncompressed | fewer | warm-up |")
print("|---|" + "---:|" * (len(seeds) + 4))
for c in comps:
    cells, sent, unc = [], 0, 0
    for s in seeds:
        r, base = runs[(s, c)], runs[(s, "none")]["eval_loss"]
        gap = 100 * (r["eval_loss"] / base - 1)
        cells.append(f"{r['eval_loss']:.4f}" + ("" if c == "none" else f" ({gap:+.2f}%)"))
        sent += r["grad_bytes_sent"]
        unc += r["grad_bytes_uncompressed"]
    warm = runs[(seeds[0], c)].get("compression_warmup")
    adam = runs[(seeds[0], c)].get("one_bit_adam_from")
    words = "" if warm is None else f"{warm} steps" + (" (1-bit Adam)" if adam else "")
    print(f"| {c} | " + " | ".join(cells)
          + f" | {sent:,} | {unc:,} | {100 * (1 - sent / unc):.2f}% | {words} |")
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
