#!/usr/bin/env python3
"""Do MPICH's sockets stay inside the NetworkPolicy's ports? Run it and look.

    mpi_ports.py K8S_DIR DUALPIPE_BIN [--without-env]

Starts `mpiexec.mpich -n R DUALPIPE_BIN train --transport mpi` on this machine with the
environment the MPIJob's launcher sets (deploy/k8s/mpijob.yaml), reads every listening TCP socket
of mpiexec, Hydra's proxy and each rank from /proc, and checks each port lies in the range the
NetworkPolicy opens between the pods (deploy/k8s/networkpolicy.yaml). With --without-env the same
run leaves the MPIJob's variables out and expects ports outside the range: the control that
shows the variables are what pins them. Exit 0 when the expectation holds, 1 otherwise.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

RANKS = 4
TIMEOUT_S = 90


def manifest_env_and_range(k8s):
    job = next(d for d in yaml.safe_load_all(open(k8s / "mpijob.yaml")) if d and d["kind"] == "MPIJob")
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in launcher.get("env", [])}
    policy = next(d for d in yaml.safe_load_all(open(k8s / "networkpolicy.yaml"))
                  if d and d["metadata"]["name"] == "dualpipe-worker")
    port = next(p for rule in policy["spec"]["ingress"] for p in rule["ports"] if "endPort" in p)
    return env, (port["port"], port["endPort"])


def children(root):
    """root and all its descendants, by /proc's parent links."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def listening_ports():
    """inode -> port of every listening TCP socket (IPv4 and IPv6) in this network namespace."""
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return ports


def sockets_of(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            match = re.fullmatch(r"socket:\[(\d+)\]", target)
            if match:
                inodes.add(match.group(1))
    except OSError:
        pass
    return inodes


def comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--without-env"):
        print(__doc__, file=sys.stderr)
        return 2
    k8s, binary, without_env = Path(argv[1]), argv[2], len(argv) == 4
    manifest_env, (low, high) = manifest_env_and_range(k8s)
    env = dict(os.environ)
    for name in manifest_env:
        env.pop(name, None)
    if not without_env:
        env.update(manifest_env)
    command = ["mpiexec.mpich", "-n", str(RANKS), binary, "train", "--transport", "mpi",
               "--ranks", str(RANKS), "--micro-batches", "8", "--micro-batch-size", "4",
               "--layers-per-stage", "1", "--steps", "1000000", "--quiet", "--format", "json"]
    shown = " ".join(f"{k}={v}" for k, v in manifest_env.items()) if not without_env else "(no port variables)"
    print(f"     {shown} {' '.join(command)}")
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    seen = {}  # pid -> (name, set of ports)
    deadline = time.monotonic() + TIMEOUT_S
    stable = 0
    try:
        while time.monotonic() < deadline and job.poll() is None:
            listening = listening_ports()
            for pid in children(job.pid):
                ports = {listening[i] for i in sockets_of(pid) if i in listening}
                if ports:
                    name, known = seen.setdefault(pid, (comm(pid), set()))
                    known |= ports
            ranks = [p for p, (name, _) in seen.items() if name == "dualpipe"]
            stable = stable + 1 if len(ranks) >= RANKS else 0
            if stable >= 10:  # every rank is listening; a few more looks for late sockets
                break
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
        try:
            _, err = job.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            _, err = job.communicate()
    by_name = {}
    for name, ports in seen.values():
        by_name.setdefault(name, []).append(sorted(ports))
    for name, lists in sorted(by_name.items()):
        print(f"     {name} ({len(lists)} process{'es' if len(lists) > 1 else ''}) listens on {lists}")
    ports = sorted({p for _, ps in seen.values() for p in ps})
    ranks = sum(1 for name, _ in seen.values() if name == "dualpipe")
    if ranks < RANKS:
        print(f"FAIL saw listening sockets of {ranks} of {RANKS} ranks before the run ended; "
              f"mpiexec said: {err.decode(errors='replace')[-400:]}")
        return 1
    outside = [p for p in ports if not low <= p <= high]
    if without_env:
        if outside:
            print(f"ok   without the MPIJob's variables MPICH listens outside {low}-{high} (on {outside}): "
                  "the variables are what keep it inside the policy")
            return 0
        print(f"FAIL without the MPIJob's variables every port was inside {low}-{high}: the control proves nothing")
        return 1
    if outside:
        print(f"FAIL ports {outside} lie outside the NetworkPolicy's {low}-{high}")
        return 1
    print(f"ok   mpiexec, Hydra's proxy and all {RANKS} ranks listen only on {ports}, inside the "
          f"NetworkPolicy's {low}-{high}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
