#!/usr/bin/env bash
# A real Slurm cluster of N nodes on this machine, for the tests and the docs (docs/slurm.md):
# munge, slurmctld and N slurmd daemons (`slurmd -N nodeK`, each node its own port), all
# listening on 127.0.0.1 only; nothing leaves the machine.
#
#   scripts/slurm_cluster.sh start N     # installs slurm-wlm and munge when missing, starts, waits
#                                        # until sinfo shows N idle nodes
#   scripts/slurm_cluster.sh stop        # stops the daemons it started (by their pids)
#   scripts/slurm_cluster.sh status      # sinfo and squeue
#   scripts/slurm_cluster.sh kill-node nodeK   # SIGKILL nodeK's slurmd and every process it started
#   source "$(scripts/slurm_cluster.sh env)"   # SLURM_CONF for sinfo, srun, sbatch, ...
#
# The cluster's files live in $DUALPIPE_SLURM_DIR (default /tmp/dualpipe-slurm): slurm.conf,
# the munge key and socket, the daemons' logs (log/), their state and spool, and pids/ (one
# file per daemon this script started). The configuration is cgroup-free
# (proctrack/linuxproc, task/none), so it runs in containers without a cgroup hierarchy of its
# own. Two partitions share the nodes: `batch` (the default, PriorityTier 1, its jobs requeued
# when preempted) and `urgent` (PriorityTier 2), so a job in `urgent` preempts `batch` jobs
# (PreemptType=preempt/partition_prio, PreemptMode=REQUEUE).
set -euo pipefail

DIR=${DUALPIPE_SLURM_DIR:-/tmp/dualpipe-slurm}
CTLD_PORT=${DUALPIPE_SLURM_PORT:-16817}
CPUS_PER_NODE=${DUALPIPE_SLURM_CPUS:-4}
TIMEOUT=${DUALPIPE_SLURM_WAIT:-60}

die() { echo "slurm_cluster: $*" >&2; exit 2; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    # srun --mpi=pmix needs Slurm's pmix plugin (in slurm-wlm-basic-plugins), which dlopens
    # pmix2/lib/libpmix.so: that link is in libpmix-dev ("can not load PMIx library" without).
    [ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] || missing+=(slurm-wlm-basic-plugins)
    [ -e /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so ] || missing+=(libpmix-dev)
    [ ${#missing[@]} -eq 0 ] && return
    echo "slurm_cluster: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

write_conf() { # N
    local n=$1 host k
    host=$(hostname -s)
    mkdir -p "$DIR"/{log,pids,state,spool,run}
    for k in $(seq 1 "$n"); do mkdir -p "$DIR/tmp/node$k"; done
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm_cluster.sh: $n nodes on this machine ($host), 127.0.0.1 only.
ClusterName=dualpipe
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/run/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# cgroup-free: processes tracked by their parent pids, no task containment.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
# Each node its own temp dir: srun --mpi=pmix makes a per-step dir there, named alike on every node.
TmpFS=$DIR/tmp/%n
ReturnToService=2
JobRequeue=1
# A job gets SIGTERM, then KillWait seconds to write its checkpoint, then SIGKILL.
KillWait=15
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
EOF
    for k in $(seq 1 "$n"); do
        echo "NodeName=node$k NodeHostname=$host NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 100 + k)) CPUs=$CPUS_PER_NODE RealMemory=1000 State=UNKNOWN" >>"$DIR/slurm.conf"
    done
    cat >>"$DIR/slurm.conf" <<EOF
PartitionName=batch Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE OverSubscribe=NO
PartitionName=urgent Nodes=node[1-$n] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF OverSubscribe=NO
EOF
    echo "export SLURM_CONF=$DIR/slurm.conf" >"$DIR/env"
}

# Starts `$@` in the background with its output in log/NAME.out and records its pid.
spawn() { # NAME CMD...
    local name=$1
    shift
    setsid "$@" >"$DIR/log/$name.out" 2>&1 </dev/null &
    echo $! >"$DIR/pids/$name"
}

alive() { [ -f "$DIR/pids/$1" ] && kill -0 "$(cat "$DIR/pids/$1")" 2>/dev/null; }

start() { # N
    local n=${1:-}
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "start needs a node count (1 or more), such as: start 4"
    if compgen -G "$DIR/pids/*" >/dev/null; then
        for f in "$DIR"/pids/*; do
            alive "$(basename "$f")" && die "a cluster started from $DIR is running ($(basename "$f") pid $(cat "$f")); stop it first"
        done
    fi
    install_packages
    rm -rf "$DIR"
    write_conf "$n"
    export SLURM_CONF=$DIR/slurm.conf
    # munge: our own key and socket, so nothing of the machine's munge is touched.
    (umask 077 && dd if=/dev/urandom of="$DIR/run/munge.key" bs=1024 count=1 status=none)
    spawn munged munged --foreground --force --key-file="$DIR/run/munge.key" \
        --socket="$DIR/run/munge.socket" --pid-file="$DIR/run/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/run/munge.seed"
    local t=0
    until [ -S "$DIR/run/munge.socket" ]; do
        sleep 0.2
        t=$((t + 1))
        alive munged && [ $t -lt 50 ] || die "munged did not start: $(tail -3 "$DIR/log/munged.out" "$DIR/log/munged.log" 2>/dev/null)"
    done
    spawn slurmctld slurmctld -D -i -f "$DIR/slurm.conf"
    for k in $(seq 1 "$n"); do
        spawn "slurmd-node$k" env DUALPIPE_SLURM_NODE="$DIR:node$k" slurmd -D -N "node$k" -f "$DIR/slurm.conf"
    done
    wait_idle "$n"
    echo "slurm_cluster: $n nodes idle (SLURM_CONF=$DIR/slurm.conf; source $DIR/env)"
    sinfo
}

wait_idle() { # N
    local n=$1 start=$SECONDS idle=0
    while [ $((SECONDS - start)) -lt "$TIMEOUT" ]; do
        alive slurmctld || die "slurmctld ended: $(tail -3 "$DIR/log/slurmctld.out" "$DIR/log/slurmctld.log" 2>/dev/null)"
        idle=$(sinfo -h -p batch -t idle -o '%D' 2>/dev/null | head -1)
        [ "${idle:-0}" -eq "$n" ] && return 0
        sleep 0.5
    done
    sinfo >&2 || true
    die "only ${idle:-0} of $n nodes idle after ${TIMEOUT}s (logs in $DIR/log)"
}

stop() {
    [ -d "$DIR/pids" ] || { echo "slurm_cluster: nothing started from $DIR"; return 0; }
    local f pid name
    # slurmd first (their jobs' processes end with them), then the controller, then munge.
    for f in "$DIR"/pids/slurmd-* "$DIR/pids/slurmctld" "$DIR/pids/munged"; do
        [ -f "$f" ] || continue
        name=$(basename "$f")
        pid=$(cat "$f")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        fi
        rm -f "$f"
        echo "slurm_cluster: stopped $name (pid $pid)"
    done
    # slurmstepd left behind (they outlive their slurmd) and the tasks of their job steps.
    for pid in $(processes_of_cluster); do kill -KILL "$pid" 2>/dev/null || true; done
}

# Pids of this cluster's slurmstepd (the slurmd's marker inherited) and of its jobs' tasks
# (a node's name from this cluster and our SLURM_CONF).
processes_of_cluster() {
    local p env
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = $$ ] && continue
        env=$(env_of "$p")
        if grep -q "^DUALPIPE_SLURM_NODE=$DIR:" <<<"$env"; then
            echo "$p"
        elif grep -qxF "SLURM_CONF=$DIR/slurm.conf" <<<"$env" && grep -q "^SLURMD_NODENAME=" <<<"$env"; then
            echo "$p"
        fi
    done
}

# Process $1's environment, one variable a line (read whole: `tr | grep -q` under pipefail
# fails when grep stops early and tr gets SIGPIPE).
env_of() { tr '\0' '\n' 2>/dev/null <"/proc/$1/environ"; }

# Whether process $1's environment holds the line $2.
env_has() { grep -qxF "$2" <<<"$(env_of "$1")"; }

kill_node() { # nodeK: SIGKILL its slurmd, its slurmstepd and every process they started, at once
    local node=$1 pid p stepds=() all
    [ -f "$DIR/pids/slurmd-$node" ] || die "no slurmd of $node was started from $DIR"
    pid=$(cat "$DIR/pids/slurmd-$node")
    # The node's slurmstepd carry the marker its slurmd was started with; the tasks are their
    # descendants (found from one `ps` of every pid and parent, so the loss is one instant).
    for p in $(pgrep -x slurmstepd || true); do
        env_has "$p" "DUALPIPE_SLURM_NODE=$DIR:$node" && stepds+=("$p")
    done
    all=$(ps -e -o pid=,ppid= | awk -v roots="$pid ${stepds[*]}" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            do { grew = 0; for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 } } while (grew)
            for (p in keep) printf "%s ", p
        }')
    # shellcheck disable=SC2086 # one word per pid
    kill -KILL $all 2>/dev/null || true
    echo "slurm_cluster: killed $node at $(date +%s.%N): slurmd pid $pid, $(($(wc -w <<<"$all") - 1)) processes of its job steps"
}

start_node() { # nodeK: a killed node's slurmd again, back in service once it registers
    local node=$1 t=0
    grep -q "^NodeName=$node " "$DIR/slurm.conf" 2>/dev/null || die "$node is not a node of $DIR/slurm.conf"
    alive "slurmd-$node" && die "$node's slurmd is running (pid $(cat "$DIR/pids/slurmd-$node"))"
    export SLURM_CONF=$DIR/slurm.conf
    spawn "slurmd-$node" env DUALPIPE_SLURM_NODE="$DIR:$node" slurmd -D -N "$node" -f "$DIR/slurm.conf"
    scontrol update nodename="$node" state=resume 2>/dev/null || true
    # Back once it answers (no `*`) and is up; a job that held it may still be ending there.
    until [[ "$(sinfo -h -n "$node" -o %t | head -1)" =~ ^(idle|mix|alloc|comp)$ ]]; do
        sleep 0.5
        t=$((t + 1))
        [ $t -lt $((TIMEOUT * 2)) ] || die "$node is not idle after ${TIMEOUT}s: $(sinfo -h -n "$node")"
    done
    echo "slurm_cluster: $node back ($(sinfo -h -n "$node" -o %t | head -1))"
}

case ${1:-} in
start) start "${2:-}" ;;
stop) stop ;;
status) export SLURM_CONF=$DIR/slurm.conf; sinfo; squeue ;;
env) echo "$DIR/env" ;;
kill-node) [ -n "${2:-}" ] || die "kill-node needs a node name, such as: kill-node node2"; kill_node "$2" ;;
start-node) [ -n "${2:-}" ] || die "start-node needs a node name, such as: start-node node2"; start_node "$2" ;;
*) die "usage: slurm_cluster.sh start N | stop | status | env | kill-node NODE | start-node NODE" ;;
esac
