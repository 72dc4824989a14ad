#!/usr/bin/env bash
# The release build of the container image: deploy/Dockerfile's build stage runs exactly this
# script, and CI (.ci/run) runs it too, so the image's build steps are the ones CI checks.
#
#   deploy/build.sh [PREFIX]   # default PREFIX: target/deploy
#   deploy/build.sh --deps     # step 1 only (the Dockerfile's cached layer)
#
# 1. installs the Debian build packages that are missing (MPICH with headers, libclang for the
#    `mpi` crate's bindgen);
# 2. builds `dualpipe` in release with the MPI transport (`--features mpi`) against MPICH:
#    MPICC=mpicc.mpich, because Debian's alternatives point plain `mpicc` at Open MPI when both
#    are installed, and the `mpi` crate links whichever MPI its MPICC names;
# 3. checks the binary links MPICH (not Open MPI) and installs it as PREFIX/bin/dualpipe.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-target/deploy}
case "$PREFIX" in -*) [ "$PREFIX" = --deps ] || { echo "usage: deploy/build.sh [PREFIX | --deps]" >&2; exit 2; } ;; esac

BUILD_PACKAGES=(mpich libmpich-dev libclang-dev)

missing=()
for package in "${BUILD_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deploy/build.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$PREFIX" != --deps ] || exit 0

export MPICC=mpicc.mpich
# The `mpi` crate's build script does not watch MPICC: a target directory built against another
# MPI would be reused silently, so a non-default target directory must be MPICH's alone.
cargo build --release --locked -p dualpipe-cli --features mpi

BIN=${CARGO_TARGET_DIR:-target}/release/dualpipe
# ldd's output is read whole first: `ldd | grep -q` under pipefail fails when grep exits at its
# first match and ldd, still writing, dies of SIGPIPE.
LINKS=$(ldd "$BIN")
if ! grep -q "libmpich\.so" <<<"$LINKS"; then
    echo "deploy/build.sh: $BIN does not link MPICH's libmpich (ldd below); was its target directory built against another MPI?" >&2
    echo "$LINKS" >&2
    exit 1
fi
install -D -m 0755 "$BIN" "$PREFIX/bin/dualpipe"
echo "deploy/build.sh: $PREFIX/bin/dualpipe ($(du -h "$PREFIX/bin/dualpipe" | cut -f1), links $(grep -o -m1 "libmpich\.so[.0-9]*" <<<"$LINKS"))"
