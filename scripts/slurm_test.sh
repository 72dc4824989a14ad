#!/usr/bin/env bash
# dualpipe under a real Slurm (docs/slurm.md): starts a 4-node cluster on this machine
# (scripts/slurm_cluster.sh), runs every check against the real daemons, and stops the cluster
# when it ends, a check failed or not (trap). Every job is bounded: one that hangs fails its
# check at its timeout and is cancelled.
#
#   scripts/slurm_test.sh                  # builds the MPI binary (MPICH) when DUALPIPE_BIN is unset
#   DUALPIPE_BIN=path DUALPIPE_PYTHON=venv/bin/python scripts/slurm_test.sh
#   DUALPIPE_OPENMPI_BIN=target/mpi/dualpipe-openmpi scripts/slurm_test.sh   # + pmix with Open MPI
#   SLURM_TEST_ONLY="launch requeue" scripts/slurm_test.sh   # some of: launch pmix mpirun
#                                           # resume requeue preempt warning lost bad torch
#
# Checks:
#   launch   srun --mpi=pmi2 on 2 nodes x 2 tasks and 4 nodes x 1 task (4 ranks, dualpipe, the
#            GPT in f64) and on 4 nodes x 2 tasks (4 ranks x 2 replicas): the per-step losses
#            equal the local threaded run's bit for bit;
#   pmix     srun --mpi=pmix -N 2 -n 4 and -N 4 -n 4 with the Open MPI build (DUALPIPE_OPENMPI_BIN, kept by
#            scripts/mpi_test.sh): bit-identical; with MPICH (no PMIx client) a clean refusal;
#   mpirun   MPICH's mpiexec inside an allocation (salloc -N 2 -n 4 and -N 4 -n 4): bit-identical too;
#   resume   deploy/slurm/dualpipe.sbatch's one command line: the first run starts fresh and says
#            so, the same job submitted again continues its checkpoint;
#   requeue  scontrol requeue of a running job: the ranks checkpoint on SIGTERM, exit, and the
#            requeued job resumes; every step's loss equals an uninterrupted run's, bit for bit;
#   preempt  a job of the `urgent` partition (PriorityTier 2) preempts a `batch` job
#            (PreemptMode=REQUEUE): the same, and the urgent job ran in between;
#   warning  Slurm's warning before the time limit (--signal=B:TERM@N, sent here at once with
#            scancel --batch --signal=TERM): the script passes it on, the ranks checkpoint,
#            the job requeues itself and resumes bit for bit;
#   lost     a node's slurmd and its ranks killed mid-run (deploy/slurm/elastic.sbatch, 2 ranks
#            x 2 replicas on 4 nodes): the survivors stop within seconds naming the lost rank,
#            the run resumes from the last checkpoint on the nodes left as 2 ranks x 1 replica;
#            its losses are within 1e-10 of a local run of that shape resumed from the same
#            checkpoint; the time from the kill to the first resumed step and the steps lost
#            are printed;
#   bad      3 tasks for --ranks 4, and an allocation too small for the shape (sbatch and the
#            elastic launcher): one clear line each and a non-zero exit, within seconds;
#   torch    DualPipeStrategy: one torchrun per node through srun (2 nodes x 2 processes, c10d
#            rendezvous on the first node): the losses equal one process's (1e-10).
# Ends with "N passed, N failed"; exits non-zero if any check failed.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD

ONLY=${SLURM_TEST_ONLY:-launch pmix mpirun resume requeue preempt warning lost bad torch}
NODES=4
export DUALPIPE_SLURM_DIR=${DUALPIPE_SLURM_DIR:-/tmp/dualpipe-slurm-test}
# Job files on a path every node sees (all nodes are this machine).
TMP=$(mktemp -d /tmp/dualpipe-slurm-test.XXXXXX)
PASSED=0
FAILED=0
pass() { echo "ok   $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $1"; FAILED=$((FAILED + 1)); }
want() { [[ " $ONLY " == *" $1 "* ]]; }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }

cleanup() {
    if [ -n "${SLURM_CONF:-}" ]; then
        scancel --quiet --user "$(id -un)" 2>/dev/null || true
    fi
    "$ROOT/scripts/slurm_cluster.sh" stop >/dev/null 2>&1 || true
    [ -n "${SLURM_TEST_KEEP:-}" ] && echo "slurm_test: kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the binary (MPICH), the cluster ---
BIN=${DUALPIPE_BIN:-}
if [ -z "$BIN" ]; then
    if ! command -v mpicc.mpich >/dev/null 2>&1 || ! grep -q libclang <<<"$(ldconfig -p)"; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich libmpich-dev libclang-dev clang >/dev/null
    fi
    MPICC=mpicc.mpich cargo build -p dualpipe-cli --features mpi --quiet || { echo "FAIL build"; exit 1; }
    BIN=target/debug/dualpipe
fi
cp "$BIN" "$TMP/dualpipe"
BIN=$TMP/dualpipe
grep -q 'libmpich' <<<"$(ldd "$BIN")" || { echo "FAIL $BIN does not link MPICH (build it with MPICC=mpicc.mpich --features mpi)"; exit 1; }
export DUALPIPE=$BIN
if [ -n "${DUALPIPE_OPENMPI_BIN:-}" ]; then
    [ -x "$DUALPIPE_OPENMPI_BIN" ] || { echo "FAIL DUALPIPE_OPENMPI_BIN=$DUALPIPE_OPENMPI_BIN is not an executable file (scripts/mpi_test.sh builds it as target/mpi/dualpipe-openmpi)"; exit 1; }
    cp "$DUALPIPE_OPENMPI_BIN" "$TMP/dualpipe-openmpi"
    DUALPIPE_OPENMPI_BIN=$TMP/dualpipe-openmpi
    grep -q 'libmpi\.so\.40' <<<"$(ldd "$DUALPIPE_OPENMPI_BIN")" || { echo "FAIL $DUALPIPE_OPENMPI_BIN does not link Open MPI"; exit 1; }
fi

scripts/slurm_cluster.sh start "$NODES" || { echo "FAIL the cluster did not start"; exit 1; }
# shellcheck disable=SC1090
source "$(scripts/slurm_cluster.sh env)"
cd "$TMP"

# Waits until job $1 has left the queue (at most $2 seconds); cancels it and fails otherwise.
await_job() {
    local job=$1 limit=$2 start=$SECONDS
    while squeue -h -j "$job" 2>/dev/null | grep -q .; do
        if [ $((SECONDS - start)) -ge "$limit" ]; then
            scancel "$job" 2>/dev/null
            echo "     job $job still queued or running after ${limit}s: cancelled"
            return 1
        fi
        sleep 0.3
    done
}

# Waits until the file $1 holds a line matching $2 (at most $3 seconds).
await_line() {
    local start=$SECONDS
    until grep -q "$2" "$1" 2>/dev/null; do
        [ $((SECONDS - start)) -lt "$3" ] || return 1
        sleep 0.1
    done
}

# Losses of a run log (JSONL, the last line of each step wins) against a JSON summary's.
# compare_log LOG FULL.json TOL
compare_log() {
    python3 - "$@" <<'EOF'
import json, sys
log, full, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
steps = {}
for line in open(log):
    rec = json.loads(line)
    steps[rec["step"]] = rec["loss"]
want = json.load(open(full))["losses"]
got = [steps.get(i + 1) for i in range(len(want))]
if None in got:
    print(f"     steps missing from the log: {[i + 1 for i, g in enumerate(got) if g is None]}")
    sys.exit(1)
worst = max(abs(a - b) / max(abs(a), 1e-300) for a, b in zip(want, got))
same = all(a.hex() == b.hex() for a, b in zip(want, got))
print(f"     {len(got)} steps, worst relative difference {worst:.1e}" + (" (bit-identical)" if same else ""))
sys.exit(0 if (same if tol == 0 else worst <= tol) else 1)
EOF
}

# Losses of two JSON summaries: equal bit for bit.
same_losses() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p))["losses"] for p in sys.argv[1:3])
print(f"     losses {b}" + (" (bit-identical)" if a == b else f" differ from {a}"))
sys.exit(0 if a == b and len(a) > 0 else 1)
EOF
}

GPT=(--model gpt --schedule dualpipe --micro-batches 8 --micro-batch-size 2 --d-model 16 --heads 2
     --seq-len 8 --layers-per-stage 1 --dtype f64 --seed 7 --steps 3 --eval-every 0 --format json --quiet)

echo "== the cluster"
sinfo | sed 's/^/     /'

# --- launch: srun --mpi=pmi2 on 2 and 4 nodes, mpiexec inside an allocation ---
# launch_case NAME LAUNCHER... -- TRAIN-ARGS...: the launched run's losses against the local
# run's, bit for bit ($RUN_BIN: another binary to launch).
launch_case() {
    local name=$1 launcher=() targs=() bin=${RUN_BIN:-$BIN}
    shift
    while [ "$1" != -- ]; do launcher+=("$1"); shift; done
    shift
    targs=("$@")
    "$BIN" train "${targs[@]}" >"$TMP/local.json" 2>"$TMP/local.err"
    timeout 120 "${launcher[@]}" "$bin" train --transport mpi "${targs[@]}" >"$TMP/launched.json" 2>"$TMP/launched.err"
    local rc=$?
    if [ $rc -ne 0 ]; then
        fail "$name: exited $rc: $(tail -3 "$TMP/launched.err")"
    elif same_losses "$TMP/local.json" "$TMP/launched.json"; then
        pass "$name: the local threaded run's losses, bit for bit"
    else
        fail "$name: losses differ from the local run"
    fi
}
SRUN=(srun --kill-on-bad-exit=1)
if want launch; then
    echo "== srun --mpi=pmi2"
    launch_case "srun --mpi=pmi2 -N 2 -n 4 (2 nodes x 2 ranks)" "${SRUN[@]}" --mpi=pmi2 -N 2 -n 4 -- --ranks 4 "${GPT[@]}"
    launch_case "srun --mpi=pmi2 -N 4 -n 4 (4 nodes x 1 rank)" "${SRUN[@]}" --mpi=pmi2 -N 4 -n 4 -- --ranks 4 "${GPT[@]}"
    launch_case "srun --mpi=pmi2 -N 4 -n 8 (4 ranks x 2 replicas)" "${SRUN[@]}" --mpi=pmi2 -N 4 -n 8 -- --ranks 4 \
        --data-parallel 2 "${GPT[@]}"
    timeout 60 srun --mpi=pmi2 -N 2 -n 2 -l "$BIN" train --transport mpi --ranks 2 --model mlp --steps 1 \
        --format json >/dev/null 2>"$TMP/who.err"
    if grep -q "rank 1 of 2 (launcher" "$TMP/who.err"; then
        pass "each task knows its rank: $(grep -m1 -o "rank 1 of 2 (launcher[^)]*)" "$TMP/who.err")"
    else
        fail "srun -N 2 -n 2: no rank named its launcher:"
        sed 's/^/     /' "$TMP/who.err" | head -5
    fi
fi

if want pmix; then
    echo "== srun --mpi=pmix"
    "$BIN" train --ranks 4 "${GPT[@]}" >"$TMP/local.json" 2>/dev/null
    # Debian's MPICH has no PMIx client: under --mpi=pmix each process starts as an MPI world of
    # its own, which dualpipe refuses at once. An Open MPI build (DUALPIPE_OPENMPI_BIN, as
    # scripts/mpi_test.sh builds it) speaks PMIx and must train.
    if [ -n "${DUALPIPE_OPENMPI_BIN:-}" ]; then
        RUN_BIN=$DUALPIPE_OPENMPI_BIN launch_case "srun --mpi=pmix -N 2 -n 4 (Open MPI)" "${SRUN[@]}" --mpi=pmix \
            -N 2 -n 4 -- --ranks 4 "${GPT[@]}"
        RUN_BIN=$DUALPIPE_OPENMPI_BIN launch_case "srun --mpi=pmix -N 4 -n 4 (Open MPI)" "${SRUN[@]}" --mpi=pmix \
            -N 4 -n 4 -- --ranks 4 "${GPT[@]}"
    fi
    timeout 60 srun --mpi=pmix -N 2 -n 4 --kill-on-bad-exit=1 "$BIN" train --transport mpi --ranks 4 "${GPT[@]}" \
        >"$TMP/pmix.json" 2>"$TMP/pmix.err"
    rc=$?
    if [ $rc -eq 0 ] && same_losses "$TMP/local.json" "$TMP/pmix.json"; then
        pass "srun --mpi=pmix -N 2 -n 4 (MPICH): the local run's losses, bit for bit"
    elif [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "the launcher (Slurm) says rank [0-3] of 4 but MPI says rank 0 of 1" "$TMP/pmix.err"; then
        pass "srun --mpi=pmix with MPICH (no PMIx client) is refused at once (exit $rc): $(grep -m1 -o "the launcher (Slurm) says rank [0-3] of 4 but MPI says rank 0 of 1" "$TMP/pmix.err")"
    else
        fail "srun --mpi=pmix exited $rc:"
        sed 's/^/     /' "$TMP/pmix.err" | head -8
    fi
fi

if want mpirun; then
    echo "== mpirun inside an allocation"
    launch_case "salloc -N 2 -n 4 mpiexec -n 4" salloc --quiet -N 2 -n 4 mpiexec.mpich -n 4 -- --ranks 4 "${GPT[@]}"
    launch_case "salloc -N 4 -n 4 mpiexec -n 4" salloc --quiet -N 4 -n 4 mpiexec.mpich -n 4 -- --ranks 4 "${GPT[@]}"
fi

# --- requeue, preemption, the warning: deploy/slurm/dualpipe.sbatch ---
# A run long enough to be stopped mid-way: 4 ranks on 2 nodes, checkpoints every 10 steps.
LONG=(--ranks 4 --model gpt --schedule dualpipe --micro-batches 8 --micro-batch-size 2 --d-model 16
      --heads 2 --seq-len 8 --layers-per-stage 1 --dtype f64 --seed 11 --steps 1500 --eval-every 0
      --checkpoint-every 10 --format json)
FULL=""
full_run() {
    [ -n "$FULL" ] && return
    FULL=$TMP/full.json
    "$BIN" train "${LONG[@]}" --checkpoint-dir "$TMP/full-ckpt" --quiet >"$FULL" 2>"$TMP/full.err" || fail "the uninterrupted local run: $(tail -2 "$TMP/full.err")"
}

# submit NAME SBATCH-ARGS... : a dualpipe.sbatch job of LONG with its own checkpoint dir and log
submit() {
    local name=$1
    shift
    mkdir -p "$TMP/$name"
    DUALPIPE_CKPT=$TMP/$name/ckpt sbatch --parsable -N 2 -n 4 -o "$TMP/$name/job.out" "$@" \
        "$ROOT/deploy/slurm/dualpipe.sbatch" "${LONG[@]}" --log "$TMP/$name/run.jsonl"
}

# Releases job $1 from Slurm's 2-minute hold of a requeued job (BeginTime) once it is pending.
release() {
    local start=$SECONDS
    while [ $((SECONDS - start)) -lt 30 ]; do
        if [ "$(squeue -h -j "$1" -o %r 2>/dev/null)" = BeginTime ]; then
            scontrol update jobid="$1" StartTime=now
            return 0
        fi
        sleep 0.2
    done
    return 1
}

# Checks a job that was stopped once and resumed: its log, the interruption, the resume.
check_resumed() { # NAME WHAT
    local name=$1 what=$2 dir=$TMP/$1
    local stopped resumed
    stopped=$(grep -m1 -o "interrupted by SIGTERM after step [0-9]* of 1500; the last checkpoint is [^ ]*" "$dir/job.out")
    resumed=$(grep -m1 -o "resuming from [^ ]* (step [0-9]* done)" "$dir/job.out")
    if [ -z "$stopped" ] || [ -z "$resumed" ]; then
        fail "$what: no interruption or no resume in the job's log:"
        grep -v '^{' "$dir/job.out" | tail -15 | sed 's/^/     /'
        return
    fi
    echo "     $stopped"
    echo "     $resumed"
    if compare_log "$dir/run.jsonl" "$FULL" 0; then
        pass "$what: checkpointed on SIGTERM, requeued, resumed with the uninterrupted run's losses, bit for bit"
    else
        fail "$what: the losses differ from the uninterrupted run's"
    fi
}

if want resume; then
    echo "== one command line for the first run and every requeue (--resume-if-present)"
    mkdir -p "$TMP/resume"
    SHORT=("${LONG[@]/1500/20}")
    for k in 1 2; do
        [ $k -eq 2 ] && SHORT=("${LONG[@]/1500/30}")
        job=$(DUALPIPE_CKPT=$TMP/resume/ckpt sbatch --parsable -N 2 -n 4 -o "$TMP/resume/job.out" \
            "$ROOT/deploy/slurm/dualpipe.sbatch" "${SHORT[@]}" --quiet)
        await_job "$job" 120
    done
    fresh=$(grep -m1 -o -- "--resume-if-present: no checkpoint in [^ ]* yet; a fresh run, starting at step 1" "$TMP/resume/job.out")
    if [ -n "$fresh" ] && grep -q '"first_step": 21' "$TMP/resume/job.out"; then
        pass "the same sbatch line: the first job says \"$fresh\", the second continues at step 21"
    else
        fail "--resume-if-present under sbatch:"
        tail -15 "$TMP/resume/job.out" | sed 's/^/     /'
    fi
fi

# stop_midway NAME SBATCH-ARGS...: submits a dualpipe.sbatch job of LONG and waits until it
# has a checkpoint (true), or fails the check (false); the job's id in $job.
stop_midway() {
    local name=$1
    shift
    full_run
    job=$(submit "$name" "$@")
    if await_line "$TMP/$name/ckpt/latest" step 60; then
        sleep 0.5
        return 0
    fi
    fail "$name: no checkpoint within 60 s"
    tail -5 "$TMP/$name/job.out" | sed 's/^/     /'
    return 1
}

if want requeue; then
    echo "== scontrol requeue"
    if stop_midway requeue; then
        scontrol requeue "$job"
        release "$job"
        await_job "$job" 180 && check_resumed requeue "scontrol requeue $job"
    fi
fi

if want preempt; then
    echo "== preemption by a job of a higher priority tier"
    if stop_midway preempt -p batch; then
        urgent=$(sbatch --parsable -p urgent -N 4 --exclusive -o "$TMP/preempt/urgent.out" \
            --wrap "echo urgent ran on \$SLURM_JOB_NODELIST; sleep 1")
        release "$job"
        await_job "$urgent" 60
        await_job "$job" 180
        echo "     $(cat "$TMP/preempt/urgent.out")"
        check_resumed preempt "job $job preempted by job $urgent (partition urgent)"
    fi
fi

if want warning; then
    echo "== the warning before the time limit (--signal=B:TERM@N)"
    if stop_midway warning; then
        scancel --batch --signal=TERM "$job"
        release "$job"
        await_job "$job" 180
        grep -m1 "SIGTERM before the time limit" "$TMP/warning/job.out" | sed 's/^/     /'
        check_resumed warning "the batch script's SIGTERM (B:TERM)"
    fi
fi

# --- a lost node ---
if want lost; then
    echo "== a lost node: its slurmd and ranks killed mid-run"
    mkdir -p "$TMP/lost/logs"
    ELASTIC=(--model gpt --schedule dualpipe --micro-batches 8 --micro-batch-size 2 --d-model 16 --heads 2
             --seq-len 8 --layers-per-stage 2 --dtype f64 --seed 5 --steps 300 --eval-every 0
             --checkpoint-every 10 --keep-checkpoints 0 --format json --recv-timeout 10)
    job=$(DUALPIPE_RANKS=2 DUALPIPE_CKPT=$TMP/lost/ckpt DUALPIPE_LOG_DIR=$TMP/lost/logs \
        sbatch --parsable -N 4 --ntasks-per-node 1 -o "$TMP/lost/job.out" \
        "$ROOT/deploy/slurm/elastic.sbatch" "${ELASTIC[@]}")
    if await_line "$TMP/lost/ckpt/latest" step 60; then
        victim=$(squeue -h -j "$job" -o %N | xargs scontrol show hostnames | sed -n 3p)
        # The ranks' pids (each says its own): the survivors are timed from the kill to their end.
        mapfile -t pids < <(grep -o "rank [0-9]* of 4 (launcher [^)]*), pid [0-9]*" "$TMP/lost/job.out" | awk '{print $NF}')
        killed_at=$(now)
        "$ROOT/scripts/slurm_cluster.sh" kill-node "$victim" | sed 's/^/     /'
        start=$SECONDS
        while [ $((SECONDS - start)) -lt 30 ]; do
            running=0
            for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
            [ "$running" -eq 0 ] && { stopped_at=$(now); break; }
            sleep 0.01
        done
        await_line "$TMP/lost/job.out" "launch 1 exited" 30 \
            && ended_at=$(grep -m1 -o "launch 1 exited [0-9]* at [0-9.]*" "$TMP/lost/job.out" | awk '{print $NF}')
        if await_line "$TMP/lost/logs/attempt-2.jsonl" step 60; then
            resumed_at=$(now)
        fi
        await_job "$job" 120
        echo "     $(grep -m1 -oE "rank [0-9]+ of 4: lost rank [0-9]+ \(its process, pid [0-9]+[^)]*\)" "$TMP/lost/job.out")"
        grep -E "^elastic.sbatch: launch|srun: error: .*(Killed|Node failure)" "$TMP/lost/job.out" | head -6 | sed 's/^/     /'
        named=$(grep -cE "rank [0-9]+ of 4: lost rank [0-9]+" "$TMP/lost/job.out")
        resumed=$(grep -m1 -o "resuming from [^ ]* (step [0-9]* done)" "$TMP/lost/job.out")
        from=$(grep -o "step-[0-9]*" <<<"$resumed" | head -1)
        if [ -n "${stopped_at:-}" ] && [ -n "${resumed_at:-}" ] && [ -n "$from" ] && [ "$named" -ge 1 ]; then
            last=$(tail -1 "$TMP/lost/logs/attempt-1.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['step'])")
            at=$((10#${from#step-}))
            echo "     the ${#pids[@]} ranks had all ended $(secs "$killed_at" "$stopped_at") s after the kill ($named survivors named the lost rank);" \
                "srun was ended $(secs "$killed_at" "${ended_at:-$resumed_at}") s after it; the first resumed step ended $(secs "$killed_at" "$resumed_at") s after it;" \
                "steps lost: $((last - at)) (step $last done, resumed from $from)"
            # The new shape's uninterrupted run from the same checkpoint: 2 ranks x 1 replica.
            "$BIN" train --ranks 2 --data-parallel 1 "${ELASTIC[@]}" --quiet --resume-from "$TMP/lost/ckpt/$from" \
                --checkpoint-dir "$TMP/lost/reference-ckpt" \
                >"$TMP/lost/reference.json" 2>"$TMP/lost/reference.err"
            if python3 - "$TMP/lost/logs/attempt-2.jsonl" "$TMP/lost/reference.json" "$at" <<'EOF'
import json, sys
got = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
ref = json.load(open(sys.argv[2]))
at = int(sys.argv[3])
want = dict(zip(range(at + 1, at + 1 + len(ref["losses"])), ref["losses"]))
assert ref["first_step"] == at + 1 and sorted(got) == sorted(want), (ref["first_step"], sorted(got)[:3])
worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
print(f"     steps {at + 1}-{max(want)} on 2 ranks x 1 replica: worst relative difference from the local run of that shape resumed from step {at}: {worst:.1e}")
sys.exit(0 if worst <= 1e-10 else 1)
EOF
            then
                pass "lost $victim: the run resumed on the nodes left (2 ranks x 1 replica) from $from, within 1e-10 of that shape's run from the checkpoint"
            else
                fail "lost node: the resumed losses differ from the new shape's run from $from"
                tail -3 "$TMP/lost/reference.err" | sed 's/^/     /'
            fi
        else
            fail "lost node: stopped ${stopped_at:-never}, resumed ${resumed_at:-never}, from ${from:-nothing}, named by $named:"
            tail -20 "$TMP/lost/job.out" | sed 's/^/     /'
        fi
        "$ROOT/scripts/slurm_cluster.sh" start-node "$victim" >/dev/null || fail "$victim did not come back"
    else
        fail "lost node: no checkpoint within 60 s"
        tail -5 "$TMP/lost/job.out" | sed 's/^/     /'
    fi
fi

# --- bad input ---
if want bad; then
    echo "== bad input: one line, a non-zero exit, before any rank waits"
    start=$(now)
    timeout 60 srun --mpi=pmi2 -N 2 -n 3 --kill-on-bad-exit=1 "$BIN" train --transport mpi --ranks 4 "${GPT[@]}" \
        >"$TMP/bad.out" 2>&1
    rc=$?
    end=$(now)
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "started 3 processes but the run asks for --ranks 4" "$TMP/bad.out")" -eq 1 ]; then
        pass "srun -n 3 for --ranks 4: one line in $(secs "$start" "$end") s (exit $rc): $(grep -m1 "started 3" "$TMP/bad.out")"
    else
        fail "srun -n 3 for --ranks 4: exit $rc:"
        sed 's/^/     /' "$TMP/bad.out" | head -8
    fi
    mkdir -p "$TMP/bad"
    job=$(sbatch --parsable -N 2 -n 2 -o "$TMP/bad/small.out" "$ROOT/deploy/slurm/dualpipe.sbatch" --ranks 4 "${GPT[@]}")
    await_job "$job" 60
    state=$(scontrol show job "$job" 2>/dev/null | grep -o "ExitCode=[0-9:]*" | head -1)
    if [ "$(grep -c . "$TMP/bad/small.out")" -eq 1 ] && grep -q "^error: --ranks 4 x --data-parallel 1 is 4 processes, but job $job has 2 tasks" "$TMP/bad/small.out"; then
        pass "an allocation of 2 tasks for --ranks 4 (dualpipe.sbatch): one line, $state: $(cat "$TMP/bad/small.out")"
    else
        fail "an allocation too small for the shape ($state):"
        sed 's/^/     /' "$TMP/bad/small.out" | head -8
    fi
    job=$(DUALPIPE_RANKS=4 DUALPIPE_CKPT=$TMP/bad/ckpt sbatch --parsable -N 2 --ntasks-per-node 1 \
        -o "$TMP/bad/elastic.out" "$ROOT/deploy/slurm/elastic.sbatch" "${GPT[@]}")
    await_job "$job" 60
    if grep -q "^error: 2 reachable nodes (node1 node2) of 1 tasks hold fewer than the 4 ranks of one pipeline" "$TMP/bad/elastic.out" \
        && [ "$(grep -c '^error' "$TMP/bad/elastic.out")" -eq 1 ]; then
        pass "the node list node[1-2] of 1 task each for 4 ranks (elastic.sbatch): $(grep '^error' "$TMP/bad/elastic.out")"
    else
        fail "a node list too small for the ranks:"
        sed 's/^/     /' "$TMP/bad/elastic.out" | head -8
    fi
fi

# --- the PyTorch strategy ---
if want torch; then
    echo "== DualPipeStrategy: one torchrun per node through srun"
    PY=${DUALPIPE_PYTHON:-$ROOT/python/target/ci-venv/bin/python}
    if ! "$PY" -c "import torch, dualpipe_rs.torch" 2>"$TMP/torch-import.err"; then
        fail "torch: $PY cannot import torch and dualpipe_rs.torch (scripts/python_ci.sh builds that venv): $(tail -1 "$TMP/torch-import.err")"
    else
        mkdir -p "$TMP/torch"
        "$PY" "$ROOT/deploy/slurm/torch_strategy.py" --reference --out "$TMP/torch/reference.json" >/dev/null
        job=$(DUALPIPE_PYTHON=$PY DUALPIPE_RDZV_PORT=$((29500 + RANDOM % 1000)) sbatch --parsable -N 2 \
            -o "$TMP/torch/job.out" "$ROOT/deploy/slurm/torchrun.sbatch" \
            "$ROOT/deploy/slurm/torch_strategy.py" --out "$TMP/torch/losses.json")
        await_job "$job" 300
        if [ -f "$TMP/torch/losses.json" ] && python3 - "$TMP/torch/reference.json" "$TMP/torch/losses.json" <<'EOF'
import json, sys
ref, got = (json.load(open(p)) for p in sys.argv[1:3])
worst = max(abs(a - b) / abs(a) for a, b in zip(ref["losses"], got["losses"]))
print(f"     {got['processes']} processes ({got['pipeline_ranks']} pipeline ranks x {got['replicas']} replicas, "
      f"{got['schedule']}) on nodes {got['nodes_by_rank']}: losses {got['losses']}")
print(f"     one process: {ref['losses']}; worst relative difference {worst:.1e}")
sys.exit(0 if len(ref["losses"]) == len(got["losses"]) and worst <= 1e-10 else 1)
EOF
        then
            pass "DualPipeStrategy on 2 nodes x 2 processes (c10d rendezvous on the first node): one process's losses"
        else
            fail "DualPipeStrategy under srun + torchrun:"
            tail -15 "$TMP/torch/job.out" | sed 's/^/     /'
        fi
    fi
fi

echo "slurm_test: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
