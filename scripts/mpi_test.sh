#!/usr/bin/env bash
# Multi-process training over MPI: `dualpipe train --transport mpi` under mpiexec, once with MPICH
# and once with Open MPI, each with a binary built against it.
#
#   scripts/mpi_test.sh                     # both: builds what it needs, installs Open MPI if missing
#   MPI_TEST_IMPLS=mpich scripts/mpi_test.sh          # one of them (mpich, openmpi)
#   DUALPIPE_BIN=path DUALPIPE_OPENMPI_BIN=path scripts/mpi_test.sh   # already built binaries
#
# The `mpi` crate links the MPI its build finds (MPICC's `-show`), and its build script does not
# rerun when MPICC changes, so the bindings (mpi-sys, mpi) are cleaned and rebuilt for Open MPI
# in the shared target directory (debug, only dualpipe-cli; everything else is reused), then
# cleaned again. Each binary is
# checked to link its own MPI and is started by that MPI's own launcher (mpiexec.mpich,
# mpiexec.openmpi): Debian's alternatives point plain `mpiexec` and `mpicc` at only one of them.
# Open MPI refuses to run as root and more ranks than cores unless told: --allow-run-as-root
# (as root) and --oversubscribe. MPICH needs neither.
# Needs MPICH (apt-get install mpich libmpich-dev libclang-dev); installs openmpi-bin and
# libopenmpi-dev when missing, keeping MPICH the default alternative if it was.
# Checks, for each MPI:
#   0. the binary links that MPI, and dualpipe names the launcher;
#   1. 4 processes train dualpipe, dualpipev and 1f1b with --dtype f64; their per-step losses
#      equal the local 4-thread run's to 1e-10 relative (they are in fact bit-identical);
#   2. a rank that fails with an error stops every rank within a bound, each naming rank 2,
#      and mpiexec exits non-zero; a rank that exits or dies by a signal ends the job non-zero
#      within a bound (no hang, no exit 0);
#   3. a world size that does not match --ranks, or no launcher, is one clear usage error;
#   4. 8 processes train 4 ranks x 2 data-parallel replicas (dualpipe, 1f1b, zb1p, dualpipev,
#      dualpipe --no-overlap, f64, on MPI's own all-reduce; dualpipe and 1f1b with bf16,
#      dualpipe with int8, 1bit (the gradient compressed, --compression-warmup 0), 1-bit Adam
#      (--compression-warmup 1: the copies summed first, the direction-0 holder alone exchanges
#      them) and int8 --no-overlap on our point-to-point exchange): their
#      losses equal the local run's (threads) to 1e-12 (compressed DualPipe bit for bit, its two
#      copies of a stage summed inside the exchange), ours sends the local run's gradient bytes,
#      and the JSON names the exchange that ran and where it started (inside the pipeline with
#      overlap); 6 processes for that grid are one error naming both numbers;
#   4b. a mixture of experts on 2 ranks x 2 replicas (4 processes): dualpipe and dualpipev with
#      expert parallelism, 2 redundant experts and EPLB every 2 steps (experts move between
#      processes), dualpipe so with 1-bit Adam after 2 warm-up steps, 1f1b with the replicas'
#      counts only; losses and validations equal the local
#      run's to 1e-10 (they are bit-identical), the samples, per-step expert load and EPLB's
#      totals are the same; the link emulation and checkpoints of an expert-parallel run are
#      one clear error each under MPI.
#   5. kill and resume: 4 processes train with --checkpoint-dir; once a checkpoint exists, one
#      worker (rank 2) is killed with SIGKILL: the job exits non-zero within 5 s, a survivor
#      naming rank 2 and its pid;
#      the same command with --resume continues from the last complete checkpoint with the
#      uninterrupted run's per-step losses, bit for bit (printed side by side), and the time
#      from the relaunch to its first new step is printed; --resume-from under MPI is
#      bit-identical for dualpipe, dualpipev and 1f1b; a checkpoint written under MPI resumes
#      locally on another grid, and a local one under MPI (within 1e-10); 8 processes with
#      1-bit compression resume bit-identically under MPI and locally (error feedback per worker),
#      and 8 uncompressed ones (MPI's all-reduce) too.
# Ends with "N passed, N failed"; exits non-zero if any check failed.
set -u
cd "$(dirname "$0")/.."

IMPLS=${MPI_TEST_IMPLS:-mpich openmpi}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASSED=0
FAILED=0
PREFIX=""
pass() { echo "ok   $PREFIX$1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $PREFIX$1"; FAILED=$((FAILED + 1)); }

run_checks() { # BIN LAUNCHER... : every check with one binary and one launcher command
    local BIN=$1
    shift
    local LAUNCH=("$@")
    TINY=(--model mlp --ranks 4 --micro-batches 8 --micro-batch-size 4 --hidden 16
          --layers-per-stage 1 --dtype f64 --seed 7 --format json --quiet)
    GPT=(--model gpt --ranks 4 --micro-batches 8 --micro-batch-size 2 --d-model 16 --heads 2
         --seq-len 8 --layers-per-stage 1 --dtype f64 --seed 7 --steps 3 --eval-every 1
         --clip-grad 0.5 --format json --quiet)

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

    # 1b. The GPT: losses, validation (weights gathered from every rank), the clipped gradient's
    # norm (gathered stage by stage) and the saved weights equal the local run's.
    "$BIN" train --schedule dualpipe "${GPT[@]}" --save "$TMP/local.safetensors" >"$TMP/local.json" 2>"$TMP/local.err"
    timeout 120 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule dualpipe "${GPT[@]}" \
        --save "$TMP/mpi.safetensors" >"$TMP/mpi.json" 2>"$TMP/mpi.err"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "gpt: mpiexec -n 4 exited $rc: $(tail -3 "$TMP/mpi.err")"
    elif python3 - "$TMP/local.json" "$TMP/mpi.json" <<'EOF'
import json, sys
local, mpi = (json.load(open(p)) for p in sys.argv[1:3])
assert len(local["losses"]) == len(mpi["losses"]) == 3
pairs = list(zip(local["losses"], mpi["losses"]))
pairs += [(a["loss"], b["loss"]) for a, b in zip(local["evaluations"], mpi["evaluations"])]
assert len(mpi["evaluations"]) == 3, mpi["evaluations"]
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in pairs)
print(f"     gpt losses {mpi['losses']}, validation {mpi['eval_loss']}, worst relative difference {worst:.1e}")
sys.exit(0 if worst <= 1e-10 and local["samples"] == mpi["samples"] else 1)
EOF
    then
        if cmp -s "$TMP/local.safetensors" "$TMP/mpi.safetensors"; then
            pass "gpt: 4 MPI processes give the local run's losses, validation, samples and saved weights"
        else
            fail "gpt: the saved weights differ from the local run's"
        fi
    else fail "gpt: losses or validation differ from the local run"
    fi

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
    #    Uncompressed, MPI's own all-reduce runs (`grad_exchange: "mpi-allreduce"`; DualPipe's
    #    two copies of a stage join one sum of 2 x 2 processes); compressed, ours on
    #    point-to-point, sending the local run's gradient bytes (DualPipe: the holder of a
    #    stage's direction-0 copy sums the two copies inside the exchange, so compressed
    #    DualPipe is bit-identical to the local run). The local run is always ours. With
    #    overlap every stage's exchange starts inside the pipeline (`grad_exchange_started`).
    DP=(--model mlp --ranks 4 --micro-batches 8 --micro-batch-size 4 --hidden 16
        --layers-per-stage 1 --dtype f64 --seed 7 --format json --quiet --steps 3 --data-parallel 2)
    local variant want
    for variant in "dualpipe" "1f1b" "zb1p" "dualpipev" "dualpipe --no-overlap" \
        "dualpipe --gradient-compression bf16" "1f1b --gradient-compression bf16" \
        "dualpipe --gradient-compression int8" "dualpipe --gradient-compression 1bit --compression-warmup 0" \
        "dualpipe --gradient-compression 1bit --compression-warmup 1" \
        "dualpipe --gradient-compression int8 --no-overlap"; do
        # shellcheck disable=SC2086 # $variant: the schedule and the variant's own flags
        "$BIN" train --schedule $variant "${DP[@]}" >"$TMP/dp-local.json" 2>"$TMP/dp-local.err"
        # shellcheck disable=SC2086
        timeout 180 "${LAUNCH[@]}" -n 8 "$BIN" train --transport mpi --schedule $variant "${DP[@]}" \
            >"$TMP/dp-mpi.json" 2>"$TMP/dp-mpi.err"
        rc=$?
        if [ $rc -ne 0 ]; then
            fail "$variant x 2 replicas: mpiexec -n 8 exited $rc: $(tail -3 "$TMP/dp-mpi.err")"
            continue
        fi
        case $variant in
        *compression*) want=point-to-point ;;
        *) want=mpi-allreduce ;;
        esac
        if python3 - "$TMP/dp-local.json" "$TMP/dp-mpi.json" "$want" "$variant" <<'EOF'
import json, sys
local, mpi = (json.load(open(p)) for p in sys.argv[1:3])
variant = sys.argv[4]
how = (local.get("grad_exchange"), mpi.get("grad_exchange"))
started = mpi.get("grad_exchange_started")
# 1-bit Adam (1bit after a warm-up) folds the momentum from the copies' sum after the pipeline.
one_bit_adam = "1bit --compression-warmup 1" in variant
want_started = "after-pipeline" if "--no-overlap" in variant or one_bit_adam else "in-pipeline"
bytes_ = (local["grad_bytes_sent"], mpi["grad_bytes_sent"])
local, mpi = local["losses"], mpi["losses"]
assert len(local) == len(mpi) == 3, (local, mpi)
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in zip(local, mpi))
print(f"     local {local} ({how[0]})\n     mpi   {mpi} ({how[1]}, started {started})\n     worst relative difference {worst:.1e}"
      + (" (bit-identical)" if local == mpi else "")
      + f"; gradient bytes sent local {bytes_[0]}, mpi {bytes_[1]}")
ok = worst <= 1e-12 and how == ("point-to-point", sys.argv[3]) and started == want_started
if sys.argv[3] == "point-to-point":
    ok = ok and bytes_[0] == bytes_[1]
if variant.startswith("dualpipe --gradient-compression"):
    ok = ok and local == mpi
sys.exit(0 if ok else 1)
EOF
        then pass "$variant: 8 MPI processes (4 ranks x 2 replicas, $want) give the local run's losses"
        else fail "$variant x 2 replicas: losses or the exchange's method differ from the local run"
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

    # 4b. A mixture of experts over the grid: 2 ranks x 2 replicas = 4 processes, the experts'
    #     all-to-alls over MPI (expert parallelism, redundant slots, EPLB moving experts between
    #     processes every 2 steps); the losses, validations, samples, per-step expert load and
    #     EPLB's totals equal the local run of the same flags (threads) to 1e-10 relative.
    MOE=(--model gpt --ranks 2 --micro-batches 4 --micro-batch-size 2 --d-model 16 --heads 2
         --seq-len 8 --layers-per-stage 1 --dtype f64 --seed 7 --steps 4 --eval-every 2
         --format json --quiet --experts 4 --top-k 2 --data-parallel 2)
    EPLB="--expert-parallel --redundant-experts 2 --eplb-every 2"
    for variant in "dualpipe $EPLB --clip-grad 0.5" "dualpipev $EPLB --clip-grad 0.5" \
        "1f1b --clip-grad 0.5" \
        "dualpipe $EPLB --optimizer adamw --lr 0.01 --gradient-compression 1bit --compression-warmup 2"; do
        # shellcheck disable=SC2086 # $variant: the schedule and the variant's own flags
        "$BIN" train --schedule $variant "${MOE[@]}" >"$TMP/moe-local.json" 2>"$TMP/moe-local.err"
        # shellcheck disable=SC2086
        timeout 180 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule $variant "${MOE[@]}" \
            >"$TMP/moe-mpi.json" 2>"$TMP/moe-mpi.err"
        rc=$?
        if [ $rc -ne 0 ]; then
            fail "moe $variant x 2 replicas: mpiexec -n 4 exited $rc: $(tail -3 "$TMP/moe-mpi.err")"
            continue
        fi
        if python3 - "$TMP/moe-local.json" "$TMP/moe-mpi.json" <<'EOF'
import json, sys
local, mpi = (json.load(open(p)) for p in sys.argv[1:3])
assert len(local["losses"]) == len(mpi["losses"]) == 4, (local["losses"], mpi["losses"])
pairs = list(zip(local["losses"], mpi["losses"]))
pairs += [(a["loss"], b["loss"]) for a, b in zip(local["evaluations"], mpi["evaluations"])]
assert len(mpi["evaluations"]) == 2, mpi["evaluations"]
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in pairs)
same = {k: local.get(k) == mpi.get(k) for k in ("samples", "expert_load_imbalance", "eplb_rebalances",
                                               "experts_moved", "expert_bytes_moved")}
print(f"     local {local['losses']}\n     mpi   {mpi['losses']}\n     worst relative difference {worst:.1e}"
      + (" (bit-identical)" if local["losses"] == mpi["losses"] else "")
      + f", experts moved {mpi.get('experts_moved')}, the same: {same}")
sys.exit(0 if worst <= 1e-10 and all(same.values()) else 1)
EOF
        then pass "moe $variant: 4 MPI processes (2 ranks x 2 replicas) give the local run's losses and expert figures"
        else fail "moe $variant x 2 replicas: losses or expert figures differ from the local run"
        fi
    done
    # What MoE under MPI does not do is one clear error: the link emulation, and checkpoints
    # of an expert-parallel run.
    local refused
    for refused in "--link-latency 0.001:the expert link emulation" \
        "--checkpoint-dir $TMP/moe-ckpt:checkpoints of an expert-parallel run"; do
        # shellcheck disable=SC2086 # the flag and its value
        timeout 60 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi "${MOE[@]}" --expert-parallel \
            ${refused%%:*} >"$TMP/moe-refused.out" 2>&1
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "^error: ${refused#*:}" "$TMP/moe-refused.out")" -eq 1 ]; then
            pass "moe under MPI with ${refused%%:*}: one clear error (exit $rc)"
        else
            fail "moe under MPI with ${refused%%:*}: exit $rc:"
            sed 's/^/     /' "$TMP/moe-refused.out" | head -10
        fi
    done

    kill_and_resume "$BIN" "${LAUNCH[@]}"
}

# The PID of the process of world rank $1 (read from the launchers' environment variables:
# PMI_RANK for MPICH, OMPI_COMM_WORLD_RANK for Open MPI).
rank_pid() {
    local p
    for p in $(pgrep -f "dualpipe.* train --transport mpi"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null \
            | grep -qxE "(PMI_RANK|OMPI_COMM_WORLD_RANK)=$1"; then
            echo "$p"
            return
        fi
    done
}

# The per-step losses of $2 (a JSON summary) against those of $1 from the same first step, side
# by side; exits non-zero unless they are within $3 relative ("0": bit-identical).
compare_losses() {
    python3 - "$@" <<'EOF'
import json, sys
full, part = (json.load(open(p)) for p in sys.argv[1:3])
tol = float(sys.argv[3])
first = part["first_step"]
ref = full["losses"][first - 1:]
got = part["losses"]
assert len(ref) == len(got) and got, (len(ref), len(got))
print("     step  uninterrupted            resumed                  difference")
for i, (a, b) in enumerate(zip(ref, got)):
    if i < 4 or i >= len(got) - 2:
        print(f"     {first + i:4d}  {a!r:<23}  {b!r:<23}  {abs(a - b):.1e}")
    elif i == 4:
        print(f"     ...   ({len(got) - 6} more steps)")
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in zip(ref, got))
same = ref == got
print(f"     {len(got)} steps from step {first}: "
      + ("bit-identical" if same else f"worst relative difference {worst:.1e}"))
sys.exit(0 if (same if tol == 0 else worst <= tol) else 1)
EOF
}

# 5. Kill a worker mid-run, then resume from the last complete checkpoint.
kill_and_resume() {
    local BIN=$1
    shift
    local LAUNCH=("$@")
    local CK=(--model mlp --ranks 4 --micro-batches 8 --micro-batch-size 4 --hidden 64
              --layers-per-stage 2 --dtype f64 --seed 7 --format json --schedule dualpipe
              --steps 300 --eval-every 0)
    local D=$TMP/kill-ckpt
    rm -rf "$D"
    timeout 300 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi "${CK[@]}" --quiet >"$TMP/full.json" 2>"$TMP/full.err" \
        || { fail "kill and resume: the uninterrupted run failed: $(tail -3 "$TMP/full.err")"; return; }
    # Not --quiet: each process's start line names its rank and pid.
    "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi "${CK[@]}" --checkpoint-dir "$D" \
        --checkpoint-every 20 >"$TMP/killed.json" 2>"$TMP/killed.err" &
    local job=$! waited=0 victim="" start end rc secs t
    while [ ! -f "$D/latest" ] && [ $waited -lt 3000 ]; do sleep 0.01; waited=$((waited + 1)); done
    victim=$(rank_pid 2)
    if [ ! -f "$D/latest" ] || [ -z "$victim" ]; then
        fail "kill and resume: no checkpoint or no rank 2 process to kill (waited ${waited}0 ms)"
        wait "$job"
        return
    fi
    start=$(date +%s.%N)
    kill -KILL "$victim"
    # The launcher must end the job by itself: 20 s bounds this wait, the check asks for 5 s.
    t=0
    while kill -0 "$job" 2>/dev/null && [ $t -lt 2000 ]; do sleep 0.01; t=$((t + 1)); done
    end=$(date +%s.%N)
    kill -0 "$job" 2>/dev/null && kill -KILL "$job"
    wait "$job"
    rc=$?
    secs=$(python3 -c "print(f'{$end - $start:.2f}')")
    local kept
    kept=$(cat "$D/latest")
    # The survivors name the lost rank themselves (dualpipe_runtime's peer watch: a pidfd per
    # peer on the machine): "rank 0 of 4: lost rank 2 (its process, pid 1234 ...". Launchers
    # differ: Open MPI's also names the rank, MPICH's hydra only a PID (not always the killed
    # one's); the check holds both to our line and shows the launcher's beside it.
    local named launcher
    named=$(cat "$TMP/killed.json" "$TMP/killed.err" | grep -m1 -oE "rank [0-9]+ of 4: lost rank 2 \(its process, pid $victim [^)]*\)")
    launcher=$(cat "$TMP/killed.json" "$TMP/killed.err" | grep -m1 -oE "process rank 2 with PID [0-9]+|PID [0-9]+ RUNNING AT [^ ]+")
    [ -n "$named" ] && named="$named; the launcher: ${launcher:-nothing}"
    if [ $rc -ne 0 ] && python3 -c "import sys; sys.exit(0 if $secs <= 5 else 1)" && [ -n "$named" ]; then
        pass "rank 2 killed (SIGKILL) after $kept was saved: the job exits $rc in ${secs}s; $named"
    else
        fail "kill: exit $rc after ${secs}s (victim pid $victim), named: ${named:-nothing}:"
        cat "$TMP/killed.json" "$TMP/killed.err" | sed 's/^/     /' | head -20
    fi
    # The same command with --resume; the first new step timed from the relaunch (the log of
    # the other MPI's run is removed first, or its lines would stop the clock at once).
    rm -f "$TMP/resumed.jsonl"
    start=$(date +%s.%N)
    "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi "${CK[@]}" --checkpoint-dir "$D" --checkpoint-every 20 \
        --resume --log "$TMP/resumed.jsonl" >"$TMP/resumed.json" 2>"$TMP/resumed.err" &
    job=$!
    while [ ! -s "$TMP/resumed.jsonl" ] && kill -0 "$job" 2>/dev/null; do sleep 0.005; done
    end=$(date +%s.%N)
    wait "$job"
    rc=$?
    if [ $rc -ne 0 ]; then
        fail "resume after the kill: exit $rc: $(tail -3 "$TMP/resumed.err")"
        return
    fi
    echo "     $(grep -m1 "resuming from" "$TMP/resumed.err")"
    python3 - "$TMP/resumed.jsonl" "$start" "$end" <<'EOF'
import json, sys
rec = json.loads(open(sys.argv[1]).readline())
total = float(sys.argv[3]) - float(sys.argv[2])
print(f"     recovery: {total:.3f} s from the relaunch to the end of the first new step (step "
      f"{rec['step']}), {total - rec['step_seconds']:.3f} s without that step's own "
      f"{rec['step_seconds']:.3f} s")
EOF
    if compare_losses "$TMP/full.json" "$TMP/resumed.json" 0; then
        pass "resumed after the kill from $kept: the uninterrupted run's losses, bit for bit"
    else
        fail "resumed after the kill: losses differ from the uninterrupted run's"
    fi

    # --resume-from under MPI for three schedules, and MPI <-> local (resharding).
    local SH=(--model gpt --ranks 4 --micro-batches 8 --micro-batch-size 2 --d-model 16 --heads 2
              --seq-len 8 --layers-per-stage 1 --dtype f64 --seed 7 --steps 6 --eval-every 0
              --format json --quiet)
    local schedule
    for schedule in dualpipe dualpipev 1f1b; do
        rm -rf "$TMP/sched-ckpt"
        timeout 120 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule "$schedule" "${SH[@]}" \
            --checkpoint-dir "$TMP/sched-ckpt" --checkpoint-every 3 >"$TMP/sched-full.json" 2>"$TMP/sched.err" \
            || { fail "$schedule: the checkpointing run failed: $(tail -3 "$TMP/sched.err")"; continue; }
        timeout 120 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule "$schedule" "${SH[@]}" \
            --resume-from "$TMP/sched-ckpt/step-000003" >"$TMP/sched-resumed.json" 2>"$TMP/sched.err" \
            || { fail "$schedule: --resume-from under MPI failed: $(tail -3 "$TMP/sched.err")"; continue; }
        if compare_losses "$TMP/sched-full.json" "$TMP/sched-resumed.json" 0 >"$TMP/cmp.out"; then
            pass "$schedule: --resume-from under MPI: $(tail -1 "$TMP/cmp.out" | sed 's/^ *//')"
        else
            fail "$schedule: --resume-from under MPI differs:"
            cat "$TMP/cmp.out"
        fi
    done
    # Written under MPI (1f1b, 4 processes) -> resumed locally (1f1b, 2 ranks, 2 blocks per stage).
    local LOCAL=(--model gpt --schedule 1f1b --ranks 2 --micro-batches 8 --micro-batch-size 2 --d-model 16
                 --heads 2 --seq-len 8 --layers-per-stage 2 --dtype f64 --seed 7 --steps 6 --eval-every 0
                 --format json --quiet)
    if "$BIN" train "${LOCAL[@]}" --resume-from "$TMP/sched-ckpt/step-000003" >"$TMP/to-local.json" 2>"$TMP/to-local.err" \
        && compare_losses "$TMP/sched-full.json" "$TMP/to-local.json" 1e-10 >"$TMP/cmp.out"; then
        pass "an MPI checkpoint resumes locally on another grid: $(tail -1 "$TMP/cmp.out" | sed 's/^ *//')"
    else
        fail "MPI -> local resume:"
        cat "$TMP/cmp.out" "$TMP/to-local.err" 2>/dev/null | head -20
    fi
    # Written locally (1f1b, 2 ranks) -> resumed under MPI (dualpipe, 4 processes).
    rm -rf "$TMP/local-ckpt"
    "$BIN" train "${LOCAL[@]}" --checkpoint-dir "$TMP/local-ckpt" --checkpoint-every 3 >/dev/null 2>&1
    if timeout 120 "${LAUNCH[@]}" -n 4 "$BIN" train --transport mpi --schedule dualpipe "${SH[@]}" \
            --resume-from "$TMP/local-ckpt/step-000003" >"$TMP/to-mpi.json" 2>"$TMP/to-mpi.err" \
        && compare_losses "$TMP/sched-full.json" "$TMP/to-mpi.json" 1e-10 >"$TMP/cmp.out"; then
        pass "a local checkpoint resumes under MPI on another grid: $(tail -1 "$TMP/cmp.out" | sed 's/^ *//')"
    else
        fail "local -> MPI resume:"
        cat "$TMP/cmp.out" "$TMP/to-mpi.err" 2>/dev/null | head -20
    fi
    # 4 ranks x 2 replicas with 1-bit compression: every worker's error feedback is saved in its
    # own file; the resume under MPI and the local one (threads) are bit-identical.
    local DPC=(--model mlp --ranks 4 --micro-batches 8 --micro-batch-size 4 --hidden 16
               --layers-per-stage 1 --dtype f64 --seed 7 --format json --quiet --steps 6
               --data-parallel 2 --gradient-compression 1bit --schedule dualpipe)
    rm -rf "$TMP/dp-ckpt"
    if timeout 180 "${LAUNCH[@]}" -n 8 "$BIN" train --transport mpi "${DPC[@]}" --checkpoint-dir "$TMP/dp-ckpt" \
            --checkpoint-every 3 >"$TMP/dpc-full.json" 2>"$TMP/dpc.err" \
        && timeout 180 "${LAUNCH[@]}" -n 8 "$BIN" train --transport mpi "${DPC[@]}" \
            --resume-from "$TMP/dp-ckpt/step-000003" >"$TMP/dpc-mpi.json" 2>>"$TMP/dpc.err" \
        && "$BIN" train "${DPC[@]}" --resume-from "$TMP/dp-ckpt/step-000003" >"$TMP/dpc-local.json" 2>>"$TMP/dpc.err" \
        && compare_losses "$TMP/dpc-full.json" "$TMP/dpc-mpi.json" 0 >"$TMP/cmp.out" \
        && compare_losses "$TMP/dpc-full.json" "$TMP/dpc-local.json" 0 >>"$TMP/cmp.out"; then
        pass "8 processes with 1-bit compression: $(ls "$TMP/dp-ckpt/step-000003" | grep -c '^feedback-') error-feedback files; resumed under MPI and locally, bit-identical"
    else
        fail "8 processes with 1-bit compression: the resume differs or failed:"
        cat "$TMP/cmp.out" "$TMP/dpc.err" 2>/dev/null | head -20
    fi
    # The same grid uncompressed, on MPI's own all-reduce (no error feedback to save): the
    # resume under MPI and the local one are bit-identical too.
    local DPN=("${DPC[@]/1bit/none}")
    rm -rf "$TMP/dpn-ckpt"
    if timeout 180 "${LAUNCH[@]}" -n 8 "$BIN" train --transport mpi "${DPN[@]}" --checkpoint-dir "$TMP/dpn-ckpt" \
            --checkpoint-every 3 >"$TMP/dpn-full.json" 2>"$TMP/dpn.err" \
        && timeout 180 "${LAUNCH[@]}" -n 8 "$BIN" train --transport mpi "${DPN[@]}" \
            --resume-from "$TMP/dpn-ckpt/step-000003" >"$TMP/dpn-mpi.json" 2>>"$TMP/dpn.err" \
        && "$BIN" train "${DPN[@]}" --resume-from "$TMP/dpn-ckpt/step-000003" >"$TMP/dpn-local.json" 2>>"$TMP/dpn.err" \
        && grep -q '"grad_exchange": *"mpi-allreduce"' "$TMP/dpn-mpi.json" \
        && compare_losses "$TMP/dpn-full.json" "$TMP/dpn-mpi.json" 0 >"$TMP/cmp.out" \
        && compare_losses "$TMP/dpn-full.json" "$TMP/dpn-local.json" 0 >>"$TMP/cmp.out"; then
        pass "8 processes uncompressed on MPI's all-reduce: resumed under MPI and locally, bit-identical"
    else
        fail "8 processes on MPI's all-reduce: the resume differs or failed:"
        cat "$TMP/cmp.out" "$TMP/dpn.err" 2>/dev/null | head -20
    fi
}

have() { command -v "$1" >/dev/null 2>&1; }
links() { grep -q "$2" <<<"$(ldd "$1")"; }

for impl in $IMPLS; do
    case $impl in
    mpich)
        PREFIX="[mpich] "
        if ! have mpiexec.mpich || ! have mpicc.mpich; then
            fail "MPICH not found (mpiexec.mpich, mpicc.mpich): apt-get install mpich libmpich-dev libclang-dev"
            continue
        fi
        bin=${DUALPIPE_BIN:-}
        if [ -z "$bin" ]; then
            MPICC=mpicc.mpich cargo build -p dualpipe-cli --features mpi --quiet || { fail "build"; continue; }
            # Bindings left built for Open MPI (an interrupted earlier run): rebuild them once.
            if ! links target/debug/dualpipe "libmpich\.so"; then
                cargo clean -p mpi-sys -p mpi --quiet 2>/dev/null
                MPICC=mpicc.mpich cargo build -p dualpipe-cli --features mpi --quiet || { fail "build"; continue; }
            fi
            cp target/debug/dualpipe "$TMP/dualpipe-mpich"
            bin=$TMP/dualpipe-mpich
        fi
        launch=(mpiexec.mpich)
        tag=(-prepend-rank)
        lib="libmpich\.so"
        name="MPICH/PMI"
        ;;
    openmpi)
        PREFIX="[openmpi] "
        if ! have mpiexec.openmpi || ! have mpicc.openmpi; then
            default=$(readlink -f /etc/alternatives/mpi 2>/dev/null || true)
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null \
                || { fail "could not install Open MPI (apt-get install openmpi-bin libopenmpi-dev)"; continue; }
            # Open MPI's alternatives outrank MPICH's: give the default back to MPICH.
            if [ "$default" = /usr/bin/mpicc.mpich ]; then
                update-alternatives --quiet --set mpi /usr/bin/mpicc.mpich
                update-alternatives --quiet --set mpirun /usr/bin/mpirun.mpich
                update-alternatives --quiet --set mpi-x86_64-linux-gnu /usr/include/x86_64-linux-gnu/mpich
            fi
        fi
        bin=${DUALPIPE_OPENMPI_BIN:-}
        if [ -z "$bin" ]; then
            start=$(date +%s)
            # Only the MPI bindings differ: rebuild them (and what links them) against Open MPI
            # in the shared target directory, keep that binary (target/mpi/dualpipe-openmpi,
            # which scripts/slurm_test.sh runs under srun --mpi=pmix), and clean them again so
            # the next build probes MPICH, the default, afresh.
            cargo clean -p mpi-sys -p mpi --quiet 2>/dev/null
            built=0
            MPICC=mpicc.openmpi cargo build -p dualpipe-cli --features mpi --quiet && built=1
            [ $built -eq 1 ] && mkdir -p target/mpi && cp target/debug/dualpipe target/mpi/dualpipe-openmpi
            cargo clean -p mpi-sys -p mpi --quiet 2>/dev/null
            [ $built -eq 1 ] || { fail "build"; continue; }
            echo "     built the Open MPI dualpipe in $(($(date +%s) - start))s"
            bin=target/mpi/dualpipe-openmpi
        fi
        launch=(mpiexec.openmpi --oversubscribe)
        [ "$(id -u)" -ne 0 ] || launch+=(--allow-run-as-root)
        tag=(--tag-output)
        lib="libmpi\.so\.40"
        name="Open MPI"
        ;;
    *)
        PREFIX=""
        fail "unknown MPI_TEST_IMPLS entry $impl (mpich, openmpi)"
        continue
        ;;
    esac

    # 0. The binary links this MPI, and dualpipe sees this launcher.
    if links "$bin" "$lib"; then
        pass "$bin links $(ldd "$bin" | grep -o "$lib[.0-9]*" | head -1 | tr -d '\\')"
    else
        fail "$bin does not link $lib (built against another MPI?):"
        ldd "$bin" | grep -i mpi | sed 's/^/     /'
        continue
    fi
    # Whole lines, each tagged with its rank: the two ranks' lines do not interleave.
    timeout 60 "${launch[@]}" "${tag[@]}" -n 2 "$bin" train --transport mpi --ranks 2 --micro-batches 4 --micro-batch-size 4 \
        --layers-per-stage 1 --steps 1 --format json >/dev/null 2>"$TMP/who.err"
    rc=$?
    if [ $rc -eq 0 ] && grep -q "rank 0 of 2 (launcher $name" "$TMP/who.err"; then
        pass "${launch[*]} -n 2: $(grep -m1 -o "rank 0 of 2 (launcher $name[^)]*)" "$TMP/who.err")"
    else
        fail "${launch[*]} -n 2 exited $rc without naming launcher $name:"
        sed 's/^/     /' "$TMP/who.err" | head -10
    fi
    run_checks "$bin" "${launch[@]}"
done
PREFIX=""

echo "mpi_test: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
