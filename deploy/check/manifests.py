#!/usr/bin/env python3
"""Offline checks of deploy/ that no schema can make (scripts/deploy_check.sh runs them).

    manifests.py templates MPIJOB.yaml OUTDIR   # the MPIJob's pod templates as v1 PodTemplates,
                                                # for kubernetes-validate's own Pod schemas
    manifests.py consistency K8S_DIR RUNTIME_SH # the manifests agree with each other and the image
    manifests.py grafana DASHBOARD.json RULES   # the dashboard parses, names only the metrics of
                                                # issue 16, uses each; its queries go to RULES as
                                                # recording rules for `promtool check rules`
    manifests.py dockerfile DOCKERFILE CARGO_TOML  # its RUN steps are only the scripts CI runs

Each failure is one line "what: where"; the exit code is 1 if any check failed.
"""

import json
import re
import sys
from pathlib import Path

import yaml

# The metrics `dualpipe train --metrics-addr` serves (issue 16, item 1), with their types.
METRICS = {
    "dualpipe_pipeline_bubble_ratio": "gauge",
    "dualpipe_pipeline_bubble_ratio_simulated": "gauge",
    "dualpipe_communication_overhead_ratio": "gauge",
    "dualpipe_step_duration_seconds": "histogram",
    "dualpipe_steps_total": "counter",
    "dualpipe_tokens_total": "counter",
    "dualpipe_loss": "gauge",
    "dualpipe_validation_loss": "gauge",
    "dualpipe_rank_busy_seconds_total": "counter",
    "dualpipe_rank_wait_seconds_total": "counter",
    "dualpipe_bytes_sent_total": "counter",
}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL {message}")


def ok(message):
    print(f"ok   {message}")


def load_documents(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load_one(path, kind):
    docs = [d for d in load_documents(path) if d.get("kind") == kind]
    if len(docs) != 1:
        raise SystemExit(f"{path}: expected one {kind}, found {len(docs)}")
    return docs[0]


# -- templates ---------------------------------------------------------------------------------


def cmd_templates(mpijob_path, outdir):
    job = load_one(mpijob_path, "MPIJob")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for role, spec in job["spec"]["mpiReplicaSpecs"].items():
        doc = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}"},
            "template": spec["template"],
        }
        path = out / f"mpijob-{role.lower()}.podtemplate.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        print(path)


# -- consistency -------------------------------------------------------------------------------


def flag_value(args, flag):
    """The value after `flag` in an argument list, or None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def parse_range(text, sep):
    low, high = text.split(sep)
    return int(low), int(high)


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def policy_ports(rule):
    """(protocol, low, high) of a NetworkPolicy rule's ports."""
    return [(p.get("protocol", "TCP"), p["port"], p.get("endPort", p["port"])) for p in rule.get("ports", [])]


def allows(rules, peer_labels, protocol, low, high, namespace_peer=None):
    """Whether some rule admits TCP [low, high] from/to pods labelled peer_labels (or, with
    namespace_peer, the pods labelled peer_labels in that namespace)."""
    for rule in rules:
        peers = rule.get("from", rule.get("to", []))
        for peer in peers:
            if namespace_peer is not None:
                if "namespaceSelector" not in peer or not selects(peer["namespaceSelector"], namespace_peer):
                    continue
                if peer_labels is not None and not selects(peer.get("podSelector", {}), peer_labels):
                    continue
            elif "namespaceSelector" in peer or not selects(peer.get("podSelector", {}), peer_labels):
                continue
            for proto, plow, phigh in policy_ports(rule):
                if proto == protocol and plow <= low and high <= phigh:
                    return True
    return False


def cmd_consistency(k8s_dir, runtime_sh):
    k8s = Path(k8s_dir)
    job = load_one(k8s / "mpijob.yaml", "MPIJob")
    service = load_one(k8s / "service.yaml", "Service")
    pvc = load_one(k8s / "pvc.yaml", "PersistentVolumeClaim")
    policies = {p["metadata"]["name"]: p for p in load_documents(k8s / "networkpolicy.yaml")}
    runtime = Path(runtime_sh).read_text(encoding="utf-8")
    user = re.search(r"^USER_NAME=(\S+)$", runtime, re.M).group(1)
    uid = int(re.search(r"^USER_ID=(\d+)$", runtime, re.M).group(1))
    sshd_config = re.search(r"(/etc/ssh/sshd_config\.\w+)", runtime).group(1)

    spec = job["spec"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]
    lc = launcher["spec"]["containers"][0]
    wc = worker["spec"]["containers"][0]
    argv = lc.get("command", []) + lc.get("args", [])
    env = {e["name"]: e.get("value") for e in lc.get("env", [])}
    wlabels = worker["metadata"]["labels"]
    llabels = launcher["metadata"]["labels"]

    # Ranks: workers x slots = mpiexec -n = --ranks.
    processes = spec["mpiReplicaSpecs"]["Worker"]["replicas"] * spec.get("slotsPerWorker", 1)
    n = flag_value(argv, "-n") or flag_value(argv, "-np")
    ranks = flag_value(argv, "--ranks")
    if argv[:1] not in (["mpiexec"], ["mpirun"]):
        fail(f"the launcher runs {argv[:1]}, not mpiexec/mpirun: mpijob.yaml Launcher command")
    if not re.search(r"\bdualpipe train\b.*--transport mpi\b", " ".join(argv)):
        fail("the launcher does not run `dualpipe train --transport mpi`: mpijob.yaml Launcher args")
    if n is None or ranks is None or not int(n) == int(ranks) == processes:
        fail(f"Worker replicas x slotsPerWorker = {processes}, mpiexec -n {n}, --ranks {ranks}: "
             "mpijob.yaml (they must be equal)")
    else:
        ok(f"{processes} workers x {spec.get('slotsPerWorker', 1)} slot = mpiexec -n {n} = --ranks {ranks}")

    # Image and user.
    before = len(failures)
    if lc["image"] != wc["image"]:
        fail(f"launcher image {lc['image']} and worker image {wc['image']} differ: mpijob.yaml")
    for role, t in (("Launcher", launcher), ("Worker", worker)):
        if t["spec"].get("securityContext", {}).get("runAsUser") != uid:
            fail(f"{role} runAsUser is not the image user's uid {uid} (deploy/runtime.sh): mpijob.yaml")
    if spec.get("sshAuthMountPath") != f"/home/{user}/.ssh":
        fail(f"sshAuthMountPath {spec.get('sshAuthMountPath')} is not /home/{user}/.ssh (deploy/runtime.sh)")
    wargv = wc.get("command", []) + wc.get("args", [])
    if wargv[:1] != ["/usr/sbin/sshd"] or flag_value(wargv, "-f") != sshd_config:
        fail(f"the worker does not run sshd -f {sshd_config} (written by deploy/runtime.sh): mpijob.yaml")
    if len(failures) == before:
        ok(f"one image, user {user} ({uid}), ssh keys in its home, sshd with {sshd_config}")

    # Ports: MPI's ranges inside the policy's; ssh; metrics.
    before = len(failures)
    wpol = next(p for p in policies.values() if selects(p["spec"]["podSelector"], wlabels))
    lpol = next(p for p in policies.values() if selects(p["spec"]["podSelector"], llabels))
    win, wout = wpol["spec"]["ingress"], wpol["spec"]["egress"]
    lin, lout = lpol["spec"]["ingress"], lpol["spec"]["egress"]
    ucx = parse_range(env["UCX_TCP_PORT_RANGE"], "-")
    hydra = parse_range(env["MPIEXEC_PORT_RANGE"], ":")
    if not (allows(win, wlabels, "TCP", *ucx) and allows(wout, wlabels, "TCP", *ucx)):
        fail(f"UCX_TCP_PORT_RANGE {ucx} is not open worker to worker: networkpolicy.yaml")
    if not (allows(lin, wlabels, "TCP", *hydra) and allows(wout, llabels, "TCP", *hydra)):
        fail(f"MPIEXEC_PORT_RANGE {hydra} is not open worker to launcher: networkpolicy.yaml")
    ssh = next(p["containerPort"] for p in wc["ports"] if p["name"] == "ssh")
    if not re.search(rf"^Port {ssh}$", runtime, re.M):
        fail(f"the worker's ssh port {ssh} is not sshd's Port in deploy/runtime.sh")
    if not (allows(lout, wlabels, "TCP", ssh, ssh) and allows(win, llabels, "TCP", ssh, ssh)):
        fail(f"ssh ({ssh}) is not open launcher to worker: networkpolicy.yaml")
    metrics_addr = flag_value(argv, "--metrics-addr")
    metrics = int(metrics_addr.rsplit(":", 1)[1])
    annotations = worker["metadata"].get("annotations", {})
    container_metrics = next(p["containerPort"] for p in wc["ports"] if p["name"] == "metrics")
    service_port = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
    seen = {
        "--metrics-addr": metrics,
        "prometheus.io/port": int(annotations.get("prometheus.io/port", -1)),
        "worker containerPort metrics": container_metrics,
        "service port metrics": service_port["port"],
        "service prometheus.io/port": int(service["metadata"].get("annotations", {}).get("prometheus.io/port", -1)),
    }
    if len(set(seen.values())) != 1 or service_port.get("targetPort") != "metrics":
        fail(f"the metrics port differs: {seen}, service targetPort {service_port.get('targetPort')}")
    if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/path") != "/metrics":
        fail("worker pods lack prometheus.io/scrape \"true\" and prometheus.io/path /metrics: mpijob.yaml")
    last = metrics + processes - 1  # rank r serves on the base port + r
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    if not allows(win, prometheus, "TCP", metrics, last, namespace_peer={"kubernetes.io/metadata.name": "monitoring"}):
        fail(f"the ranks' metrics ports {metrics}-{last} are not open to the Prometheus pods of the monitoring namespace: networkpolicy.yaml")
    # The server binds 0.0.0.0 in the pod (Prometheus scrapes the pod IP): the policy alone keeps
    # other clients out, so no rule may open a metrics port to every pod of a namespace.
    for rule in win:
        if not any(plow <= metrics and last >= plow and metrics <= phigh for _, plow, phigh in policy_ports(rule)):
            continue
        for peer in rule.get("from", [{}]):
            if not peer.get("podSelector", {}).get("matchLabels") or "ipBlock" in peer:
                fail(f"a rule opens the metrics ports {metrics}-{last} to more than the Prometheus pods ({peer}): networkpolicy.yaml")
    scrape = yaml.safe_load((k8s.parent / "prometheus" / "scrape.yaml").read_text(encoding="utf-8"))
    rules = next(j for j in scrape["scrape_configs"] if j["job_name"] == "dualpipe")["relabel_configs"]
    replacements = {r["regex"]: r["replacement"] for r in rules if r.get("target_label") == "__tmp_rank_port"}
    if metrics % 100 != 0 or replacements != {r"(\d)": f"{metrics // 10}$1", r"(\d\d)": f"{metrics // 100}$1"}:
        fail(f"deploy/prometheus/scrape.yaml's rank ports {replacements} are not base {metrics} + replica index")
    selector = service["spec"].get("selector") or {}
    if not selector or not selects({"matchLabels": selector}, wlabels):
        fail("the Service does not select the worker pods: service.yaml")
    if service["spec"].get("clusterIP") != "None":
        fail("the Service is not headless (clusterIP: None): service.yaml")
    for role, pol in (("worker", wpol), ("launcher", lpol)):
        for rule in pol["spec"]["egress"]:
            if any(p == 53 for _, p, _ in policy_ports(rule)):
                break
        else:
            fail(f"the {role} policy has no DNS egress (53): networkpolicy.yaml")
    if len(failures) == before:
        ok(f"ports agree: UCX {ucx[0]}-{ucx[1]} and Hydra {hydra[0]}-{hydra[1]} inside the policy, "
           f"ssh {ssh}, metrics base {metrics} (flag, annotations, container, headless Service) and "
           f"{metrics}-{last} for the ranks (policy, scrape config), DNS")

    # Checkpoints: the claim exists, is mounted on the workers, and the flag writes into it.
    before = len(failures)
    volumes = {v["name"]: v for v in worker["spec"].get("volumes", [])}
    claim = [v for v in volumes.values() if "persistentVolumeClaim" in v]
    if len(claim) != 1 or claim[0]["persistentVolumeClaim"]["claimName"] != pvc["metadata"]["name"]:
        fail(f"the workers do not mount the claim {pvc['metadata']['name']}: mpijob.yaml")
    else:
        mount = next((m for m in wc.get("volumeMounts", []) if m["name"] == claim[0]["name"]), None)
        checkpoint_dir = flag_value(argv, "--checkpoint-dir") or ""
        if mount is None or not (checkpoint_dir + "/").startswith(mount["mountPath"].rstrip("/") + "/"):
            fail(f"--checkpoint-dir {checkpoint_dir!r} is not inside the claim's mount: mpijob.yaml")
    if "ReadWriteMany" not in pvc["spec"]["accessModes"] and processes > 1:
        fail("several worker pods mount the checkpoint claim, which is not ReadWriteMany: pvc.yaml")
    if len(failures) == before:
        ok(f"checkpoints: --checkpoint-dir {flag_value(argv, '--checkpoint-dir')} on claim {pvc['metadata']['name']} "
           f"({', '.join(pvc['spec']['accessModes'])})")


# -- grafana -----------------------------------------------------------------------------------


def dashboard_panels(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows


def cmd_grafana(path, rules_path):
    try:
        with open(path, encoding="utf-8") as f:
            dashboard = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"the dashboard does not parse as JSON: {path}: {e}")
        return
    for key in ("title", "uid", "schemaVersion", "panels"):
        if key not in dashboard:
            fail(f"the dashboard has no {key!r}: {path}")
    ids, exprs, used = set(), [], set()
    for panel in dashboard_panels(dashboard):
        where = f"{path} panel {panel.get('id')} {panel.get('title')!r}"
        if panel.get("id") in ids:
            fail(f"duplicate panel id: {where}")
        ids.add(panel.get("id"))
        if panel.get("type") == "row":
            continue
        for key in ("title", "type", "gridPos", "targets"):
            if key not in panel:
                fail(f"panel without {key!r}: {where}")
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            if not expr:
                fail(f"a target without a PromQL expr: {where}")
                continue
            exprs.append((where, expr))
            for name in set(re.findall(r"\bdualpipe_[a-z0-9_]+", expr)):
                base = name
                for suffix in HISTOGRAM_SERIES:
                    stem = name[: -len(suffix)]
                    if name.endswith(suffix) and METRICS.get(stem) == "histogram":
                        base = stem
                if base not in METRICS:
                    fail(f"{name} is not a metric dualpipe serves (issue 16): {where}")
                elif METRICS[base] == "histogram" and base == name:
                    fail(f"{name} is a histogram: query its _bucket/_sum/_count series: {where}")
                else:
                    used.add(base)
                    if METRICS[base] == "counter" and not re.search(rf"(rate|increase)\(\s*{name}\b", expr) \
                            and "stat" != panel.get("type"):
                        fail(f"counter {name} plotted without rate()/increase(): {where}")
    for name in sorted(set(METRICS) - used):
        fail(f"no panel shows {name}: {path}")
    if not failures:
        ok(f"dashboard {dashboard.get('title')!r}: {len(ids)} panels, {len(exprs)} queries, "
           f"all {len(METRICS)} metrics of issue 16 and no other")
    # Grafana's interval variables are not PromQL: give promtool a fixed window instead.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": re.sub(r"\$__(rate_)?interval|\$__range", "5m", expr)}
        for i, (_, expr) in enumerate(exprs)]}]}
    Path(rules_path).write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")


# -- dockerfile --------------------------------------------------------------------------------

# The only RUN steps the image may have: the scripts CI runs itself (.ci/run: deploy/build.sh,
# and deploy/runtime.sh's package list through `check`).
ALLOWED_RUNS = {
    "build": ["deploy/build.sh --deps", "deploy/build.sh /opt/dualpipe"],
    "runtime": ["/usr/local/share/dualpipe/runtime.sh install"],
}


def cmd_dockerfile(path, cargo_toml):
    text = Path(path).read_text(encoding="utf-8")
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    stages, stage = {}, None
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "FROM":
            match = re.fullmatch(r"(\S+) AS (\w+)", rest)
            if not match:
                fail(f"FROM without a stage name: {path}: {line}")
                continue
            stage = match.group(2)
            stages[stage] = {"image": match.group(1), "runs": [], "copies": []}
        elif word == "RUN" and stage:
            stages[stage]["runs"].append(rest)
        elif word == "COPY" and stage:
            stages[stage]["copies"].append(rest)
    before = len(failures)
    if set(stages) != set(ALLOWED_RUNS):
        fail(f"stages {sorted(stages)}, expected {sorted(ALLOWED_RUNS)}: {path}")
        return
    for name, allowed in ALLOWED_RUNS.items():
        if stages[name]["runs"] != allowed:
            fail(f"the {name} stage runs {stages[name]['runs']}, not exactly {allowed} "
                 f"(the steps CI runs): {path}")
    build_image = stages["build"]["image"].replace("${RUST_VERSION}", args.get("RUST_VERSION", "?")) \
        .replace("${DEBIAN_RELEASE}", args.get("DEBIAN_RELEASE", "?"))
    runtime_image = stages["runtime"]["image"].replace("${DEBIAN_RELEASE}", args.get("DEBIAN_RELEASE", "?"))
    rust = re.fullmatch(r"rust:(\d+)\.(\d+)-(\w+)", build_image)
    debian = re.fullmatch(r"debian:(\w+)-slim", runtime_image)
    if not rust or not debian or rust.group(3) != debian.group(1):
        fail(f"the build ({build_image}) and runtime ({runtime_image}) stages are not one Debian release: {path}")
    else:
        need = re.search(r'^rust-version = "(\d+)\.(\d+)"', Path(cargo_toml).read_text(encoding="utf-8"), re.M)
        if need and (int(rust.group(1)), int(rust.group(2))) < (int(need.group(1)), int(need.group(2))):
            fail(f"{build_image} is older than the workspace's rust-version {need.group(1)}.{need.group(2)}")
    if not any(c.startswith("--from=build /opt/dualpipe/bin/dualpipe ") for c in stages["runtime"]["copies"]):
        fail(f"the runtime stage does not copy deploy/build.sh's /opt/dualpipe/bin/dualpipe: {path}")
    if len(failures) == before:
        ok(f"{build_image} -> {runtime_image}; RUN steps: {ALLOWED_RUNS['build'] + ALLOWED_RUNS['runtime']}")


def main(argv):
    commands = {"templates": (cmd_templates, 2), "consistency": (cmd_consistency, 2), "grafana": (cmd_grafana, 2),
                "dockerfile": (cmd_dockerfile, 2)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    command, _ = commands[argv[1]]
    command(*argv[2:])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
