#!/usr/bin/env bash
# The data-parallel gradient exchange (crate dualpipe-dp) between MPI processes.
#
#   scripts/dp_mpi_test.sh        # builds the example with --features mpi, runs the checks
#
# Needs an MPI (MPICH or Open MPI: `mpiexec`, or `mpiexec.mpich` / `mpiexec.openmpi`, on PATH) and, to build, its headers and libclang.
# For 2 and 4 processes, every compression (none, bf16, int8 with stochastic rounding, 1bit)
# over the whole world and over a half of it (even / odd ranks on their own communicator): 3
# steps of gradients exchanged over MPI must be bit-identical to the same group on threads;
# and the uncompressed exchange on MPI's own all-reduce over the world must give the threads'
# results (bit-identical for 2 processes, within 1e-6 of the largest value in f32 for 4).
# Ends with "N passed, N failed"; exits non-zero if any check failed.
set -u
cd "$(dirname "$0")/.."

if ! command -v mpiexec >/dev/null 2>&1; then
    echo "dp_mpi_test: mpiexec not found; install MPICH (apt-get install mpich libmpich-dev libclang-dev) or Open MPI" >&2
    exit 1
fi
cargo build -p dualpipe-dp --features mpi --example mpi_exchange --quiet || exit 1
BIN=target/debug/examples/mpi_exchange

# Start the example with the launcher of the MPI it links: Debian's alternatives may point plain
# `mpiexec` at the other one (read ldd's output whole: `ldd | grep -q` fails under SIGPIPE).
LINKS=$(ldd "$BIN")
LAUNCH=(mpiexec)
if grep -q "libmpich\.so" <<<"$LINKS" && command -v mpiexec.mpich >/dev/null 2>&1; then
    LAUNCH=(mpiexec.mpich)
elif grep -q "libmpi\.so" <<<"$LINKS" && command -v mpiexec.openmpi >/dev/null 2>&1; then
    LAUNCH=(mpiexec.openmpi)
fi
if "${LAUNCH[0]}" --version 2>&1 | grep -qi "open mpi\|openrte"; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    LAUNCH+=(--oversubscribe)
fi
echo "dp_mpi_test: ${LAUNCH[*]} (the example links $(grep -o "libmpi[a-z]*\.so[.0-9]*" <<<"$LINKS" | head -1))"

PASSED=0
FAILED=0
for n in 2 4; do
    out=$(timeout 300 "${LAUNCH[@]}" -n "$n" "$BIN" 2>&1)
    rc=$?
    good=$(grep -v "MPI's all-reduce" <<<"$out" | grep -c "bit-identical to threads")
    native=$(grep "MPI's all-reduce" <<<"$out" | grep -cE "bit-identical to threads|relative of threads \(MPI's order\)")
    # Every rank: 4 compressions x 2 groups on point-to-point, and one on MPI's all-reduce.
    want=$((n * 8))
    if [ $rc -eq 0 ] && [ "$good" -eq "$want" ] && [ "$native" -eq "$n" ]; then
        echo "ok   $n processes: $good of $want exchanges bit-identical to threads;" \
            "MPI's all-reduce: $(grep -m1 "rank 0: none over MPI's all-reduce" <<<"$out" | sed 's/^[^:]*: [^:]*: //')"
        PASSED=$((PASSED + 1))
    else
        echo "FAIL $n processes (exit $rc, $good of $want bit-identical, $native of $n on MPI's all-reduce):"
        grep -v "bit-identical" <<<"$out" | head -20
        FAILED=$((FAILED + 1))
    fi
done
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
