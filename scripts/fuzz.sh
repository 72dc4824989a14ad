#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) with libFuzzer through cargo-fuzz, each for SECONDS
# (default 20: CI's short bounded run), from the seed corpus in fuzz/seeds plus the growing corpus
# in fuzz/corpus (not committed). A crash stops the script with libFuzzer's report and the input
# saved under fuzz/artifacts/TARGET/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET ...]
#
# cargo-fuzz needs nightly compiler flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cd fuzz && cargo fuzz list)
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    echo "== fuzz $target for ${seconds}s"
    (cd fuzz && cargo fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 2>&1) |
        grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|Done)|ERROR|panicked|crash-" || true
    if ls "fuzz/artifacts/$target"/crash-* >/dev/null 2>&1; then
        echo "fuzz $target: crash, inputs in fuzz/artifacts/$target" >&2
        exit 1
    fi
done
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
