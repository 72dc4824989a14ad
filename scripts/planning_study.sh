#!/usr/bin/env bash
# Regenerates docs/planning.md's studies and pictures from the simulator:
#   scripts/planning_study.sh [BIN] [OUT]
# BIN (for the plans) defaults to target/release/dualpipe, OUT to docs/img; the studies come from
# the maintainer example `plan_study` of dualpipe-plan (not part of the binary). Prints the study
# tables and the heterogeneous plan the closing notes quote.
set -euo pipefail
BIN=${1:-target/release/dualpipe}
OUT=${2:-docs/img}
cargo run --quiet --release -p dualpipe-plan --example plan_study -- "$OUT"
echo
echo "## dualpipe plan on testdata/plan/hetero.json (planned, then even)"
"$BIN" plan --topology testdata/plan/hetero.json --profile testdata/plan/gpt32.json \
    --schedules dualpipe,1f1b --micro-batches 16,32 --top 4
"$BIN" plan --topology testdata/plan/hetero.json --profile testdata/plan/gpt32.json \
    --schedules dualpipe,1f1b --micro-batches 16,32 --top 4 --even
