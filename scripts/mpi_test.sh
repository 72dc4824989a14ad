#!/usr/bin/env bash
# Multi-process training over MPI: `dualpipe train --transport mpi` under mpirun.
#
#   scripts/mpi_test.sh            # builds dualpipe with --features mpi, then runs the checks
#   DUALPIPE_BIN=path scripts/mpi_test.sh   # uses an already built binary
#
# Needs an MPI (MPICH or Open MPI: `mpiexec` on PATH) and, to build, its headers and libclang.
# Checks:
#   1. 4 processes train dualpipe, dualpipev and 1f1b with --dtype f64; their per-step losses
#      equal the local 4-thread run's to 1e-10 relative (they are in fact bit-identical);
#   2. a rank that fails with an error stops every rank within a bound, each naming rank 2,
#      and mpirun exits non-zero; a rank that exits or dies by a signal ends the job non-zero
#      within a bound (no hang, no exit 0);
#   3. a world size that does not match --ranks, or no launcher, is one clear usage error;
#   4. 8 processes train 4 ranks x 2 data-parallel replicas (dualpipe, 1f1b, zb1p, dualpipev,
#      f64): their losses equal the local run's (threads) to 1e-12; 6 processes for that grid
#      are one error naming both numbers.
# Ends with "N passed, N failed"; exits non-zero if any check failed.
set -u
cd "$(dirname "$0")/.."

if ! command -v mpiexec >/dev/null 2>&1; then
    echo "mpi_test: mpiexec not found; install MPICH (apt-get install mpich libmpich-dev libclang-dev) or Open MPI" >&2
    exit 1
fi

if [ -z "${DUALPIPE_BIN:-}" ]; then
    cargo build -p dualpipe-cli --features mpi --quiet || exit 1
    DUALPIPE_BIN=target/debug/dualpipe
fi
BIN=$DUALPIPE_BIN

# Open MPI refuses root and more ranks than cores unless told; MPICH needs nothing.
LAUNCH=(mpiexec)
if mpiexec --version 2>&1 | grep -qi "open mpi\|openrte"; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    LAUNCH+=(--oversubscribe)
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASSED=0
FAILED=0
pass() { echo "ok   $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $1"; FAILED=$((FAILED + 1)); }

TINY=(--model mlp --ranks 4 --micro-batches 8 --micro-batch-size 4 --hidden 16
      --layers-per-stage 1 --dtype f64 --seed 7 --format json --quiet)

# 1. Same losses as the local run.
for schedule in dualpipe dualpipev 1f1b; do
    "$BIN" train --schedule "$schedule" --steps 3 "${TINY[@]}" >"$TMP/local.json" 2>"$TMP/local.err"
    timeout 120 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule "$schedule" --steps 3 "${TINY[@]}" \
        >"$TMP/mpi.json" 2>"$TMP/mpi.err"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "$schedule: mpiexec -n 4 exited $rc: $(tail -3 "$TMP/mpi.err")"
        continue
    fi
    if python3 - "$TMP/local.json" "$TMP/mpi.json" <<'EOF'
import json, sys
local = json.load(open(sys.argv[1]))["losses"]
mpi = json.load(open(sys.argv[2]))["losses"]
assert len(local) == len(mpi) == 3, (local, mpi)
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in zip(local, mpi))
print(f"     losses {mpi}, worst relative difference {worst:.1e}"
      + (" (bit-identical)" if local == mpi else ""))
sys.exit(0 if worst <= 1e-10 else 1)
EOF
    then pass "$schedule: 4 MPI processes give the local run's losses"
    else fail "$schedule: losses differ from the local run"
    fi
done

# 2. Failures: bounded, non-zero, naming the failed rank.
run_failure() { # HOW -> sets rc, secs, output in $TMP/fail.out
    local start end
    start=$(date +%s.%N)
    timeout 60 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule dualpipe \
        "${TINY[@]}" --steps 5 --recv-timeout 20 --inject-failure "2:2:$1" >"$TMP/fail.out" 2>&1
    rc=$?
    end=$(date +%s.%N)
    secs=$(python3 -c "print(f'{$end - $start:.2f}')")
}

# A failure exit: not success, not a usage error, not the timeout's 124.
bad_exit() { [ $rc -ne 0 ] && [ $rc -ne 2 ] && [ $rc -ne 124 ]; }

run_failure error
stopped=$(grep -c "stopped because rank 2 failed: rank 2: injected failure at step 2" "$TMP/fail.out")
if bad_exit && [ "$stopped" -eq 3 ] \
    && grep -q "^error: rank 2: injected failure at step 2" "$TMP/fail.out"; then
    pass "a rank that fails stops all 4 in ${secs}s, each of the 3 others naming rank 2 (exit $rc)"
else
    fail "error injection: exit $rc after ${secs}s, $stopped ranks named rank 2:"
    sed 's/^/     /' "$TMP/fail.out" | head -20
fi

for how in exit abort; do
    run_failure "$how"
    if bad_exit; then
        pass "a rank that dies ($how) ends the job in ${secs}s with exit $rc"
    else
        fail "$how injection: exit $rc after ${secs}s"
        sed 's/^/     /' "$TMP/fail.out" | head -20
    fi
done

# 3. Launcher errors.
timeout 60 "${LAUNCH[@]}" -n 3 "$BIN" train --transport mpi "${TINY[@]}" >"$TMP/size.out" 2>&1
rc=$?
# Rank 0 exits 2 with the message; the launcher then ends the other processes, and some
# launchers (MPICH's hydra under load) report the signal it used on them instead of 2.
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "started 3 processes but the run asks for --ranks 4" "$TMP/size.out")" -eq 1 ]; then
    pass "3 processes for --ranks 4: one usage error (exit $rc)"
else
    fail "world size mismatch: exit $rc:"
    sed 's/^/     /' "$TMP/size.out" | head -10
fi

env -u PMI_RANK -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID -u RANK \
    timeout 60 "$BIN" train --transport mpi "${TINY[@]}" >"$TMP/none.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "no launcher" "$TMP/none.out"; then
    pass "no launcher: one usage error (exit 2)"
else
    fail "no launcher: exit $rc:"
    sed 's/^/     /' "$TMP/none.out" | head -10
fi

# 4. Data parallelism: 4 ranks x 2 replicas = 8 processes; the losses equal the local run of the
#    same flags (threads) to 1e-12 relative, and a world that is not ranks x replicas is one
#    error naming both numbers.
DP=(--model mlp --ranks 4 --micro-batches 8 --micro-batch-size 4 --hidden 16
    --layers-per-stage 1 --dtype f64 --seed 7 --format json --quiet --steps 3 --data-parallel 2)
for schedule in dualpipe 1f1b zb1p dualpipev; do
    "$BIN" train --schedule "$schedule" "${DP[@]}" >"$TMP/dp-local.json" 2>"$TMP/dp-local.err"
    timeout 180 "${LAUNCH[@]}" -n 8 "$BIN" train --transport mpi --schedule "$schedule" "${DP[@]}" \
        >"$TMP/dp-mpi.json" 2>"$TMP/dp-mpi.err"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "$schedule x 2 replicas: mpiexec -n 8 exited $rc: $(tail -3 "$TMP/dp-mpi.err")"
        continue
    fi
    if python3 - "$TMP/dp-local.json" "$TMP/dp-mpi.json" <<'EOF'
import json, sys
local = json.load(open(sys.argv[1]))["losses"]
mpi = json.load(open(sys.argv[2]))["losses"]
assert len(local) == len(mpi) == 3, (local, mpi)
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in zip(local, mpi))
print(f"     local {local}\n     mpi   {mpi}\n     worst relative difference {worst:.1e}"
      + (" (bit-identical)" if local == mpi else ""))
sys.exit(0 if worst <= 1e-12 else 1)
EOF
    then pass "$schedule: 8 MPI processes (4 ranks x 2 replicas) give the local run's losses"
    else fail "$schedule x 2 replicas: losses differ from the local run"
    fi
done
timeout 60 "${LAUNCH[@]}" -n 6 "$BIN" train --transport mpi "${DP[@]}" >"$TMP/dp-size.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] \
    && [ "$(grep -c "6 processes were started for --ranks 4 x --data-parallel 2 = 8" "$TMP/dp-size.out")" -eq 1 ]; then
    pass "6 processes for 4 ranks x 2 replicas: one usage error naming both (exit $rc)"
else
    fail "data-parallel world size mismatch: exit $rc:"
    sed 's/^/     /' "$TMP/dp-size.out" | head -10
fi

echo "mpi_test: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
