#!/usr/bin/env bash
# CI for the Python bindings (python/): formatting and lints of the extension crate, then build and
# install the dualpipe-rs package into a fresh virtual environment and run its pytest suite.
# Needs cargo and python3 (3.9+) with venv and pip; fetches maturin, numpy and pytest from PyPI,
# and PyTorch's CPU build from its own index (https://download.pytorch.org/whl/cpu) for the torch
# tests (dualpipe_rs.torch on gloo, the GPT parity, EPLB on torch tensors), which then must run
# (DUALPIPE_REQUIRE_TORCH=1). PyPI's Linux torch is the CUDA build: a 514 MiB wheel plus the CUDA
# libraries, 5.3 GB installed, 292 s to fetch and install on the development machine, whose
# network cannot reach the CPU index; there, after a failed try (about 9 s), PyPI's is installed,
# with a note. DUALPIPE_TORCH_INDEX=URL picks another index.
# Run from anywhere; .ci/run calls it after `cargo test --workspace` (which builds the CLI that the
# parity tests compare with).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="python/target/ci-venv"  # ignored by git, apart from the developer venv python/.venv

echo "== python: cargo fmt --check, clippy (python/ is its own cargo workspace)"
cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings

echo "== python: build and install dualpipe-rs into a fresh venv"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "maturin>=1.5,<2" numpy pytest
PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/pip" install --quiet --no-build-isolation ./python

echo "== python: install torch (CPU build) for the torch tests"
TORCH_INDEX="${DUALPIPE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
torch_start=$SECONDS
if ! "$VENV/bin/pip" install --quiet --progress-bar off torch --index-url "$TORCH_INDEX"; then
    echo "note: $TORCH_INDEX cannot be reached; installing PyPI's torch instead (the CUDA build on Linux, about 5 GB)"
    "$VENV/bin/pip" install --quiet --progress-bar off torch
fi
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'installed in', $SECONDS - $torch_start, 's')"
# DualPipeStrategy's checkpoints (safetensors), metrics (prometheus_client) and Hugging Face models (transformers)
"$VENV/bin/pip" install --quiet safetensors prometheus_client transformers

echo "== python: pytest python/tests"
cargo build --quiet -p dualpipe-cli
DUALPIPE_BIN="$PWD/target/debug/dualpipe" DUALPIPE_REQUIRE_TORCH=1 "$VENV/bin/pytest" -q -rs -p no:cacheprovider python/tests
