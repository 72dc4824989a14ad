#!/usr/bin/env python3
"""Does deploy/prometheus/scrape.yaml scrape rank r of the MPIJob on port 9100 + r? Ask Prometheus.

    scrape_relabel.py SCRAPE.yaml

Debian's Prometheus has no Kubernetes discovery, but relabelling does not care where targets come
from: this runs a real `prometheus` whose job has SCRAPE.yaml's relabel rules over static targets
that carry the labels Kubernetes' pod discovery would give the MPIJob's pods (worker 0, 7 and 12,
a pod not annotated for scraping, the ssh port of a worker), then reads the targets Prometheus
made from its HTTP API. Exit 0 when exactly the expected scrape URLs come out.
"""

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

POD_IP = "127.0.0.1"  # scrapes fail fast (connection refused); only the target URLs matter


def pod(index, scrape="true", port_name="metrics", port="9100"):
    return {
        "targets": [f"{POD_IP}:{port}"],
        "labels": {
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
            "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
            "__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_label_training_kubeflow_org_replica_index": str(index),
            "__meta_kubernetes_pod_ip": POD_IP,
            "__meta_kubernetes_pod_name": f"dualpipe-worker-{index}",
        },
    }


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    config = yaml.safe_load(Path(argv[1]).read_text(encoding="utf-8"))
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "dualpipe")
    targets = [pod(0), pod(7), pod(12), pod(3, scrape="false"), pod(5, port_name="ssh", port="22")]
    expected = {f"http://{POD_IP}:{9100 + i}/metrics" for i in (0, 7, 12)}
    test = {
        "global": {"scrape_interval": "1h"},
        "scrape_configs": [{"job_name": "dualpipe", "static_configs": targets,
                            "relabel_configs": job["relabel_configs"]}],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prometheus.yml"
        path.write_text(yaml.safe_dump(test), encoding="utf-8")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            got, deadline = None, time.monotonic() + 60
            while time.monotonic() < deadline and server.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=2) as r:
                        data = json.load(r)["data"]
                    got = {t["scrapeUrl"] for t in data["activeTargets"]}
                    if got or data.get("droppedTargets"):
                        break
                except OSError:
                    pass
                time.sleep(0.2)
        finally:
            server.terminate()
            try:
                _, err = server.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                _, err = server.communicate()
    if got is None:
        print(f"FAIL Prometheus gave no targets: {err.decode(errors='replace')[-500:]}")
        return 1
    if got != expected:
        print(f"FAIL the relabelled scrape URLs are {sorted(got)}, expected {sorted(expected)}")
        return 1
    urls = sorted(got, key=lambda url: int(url.rsplit(":", 1)[1].split("/")[0]))
    print(f"ok   Prometheus scrapes workers 0, 7, 12 at {urls} and drops the pod not annotated and "
          "the ssh port")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
