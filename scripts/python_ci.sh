#!/usr/bin/env bash
# CI for the Python bindings (python/): formatting and lints of the extension crate, then build and
# install the dualpipe-rs package into a fresh virtual environment and run its pytest suite.
# Needs cargo and python3 (3.9+) with venv and pip; fetches maturin, numpy and pytest from PyPI.
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

echo "== python: pytest python/tests"
cargo build --quiet -p dualpipe-cli
DUALPIPE_BIN="$PWD/target/debug/dualpipe" "$VENV/bin/pytest" -q -p no:cacheprovider python/tests
