"""The strategy's Prometheus endpoint stays up and bounded under idle and slow clients (the
probe's class of a thread-per-connection server that falls over), and binds loopback by default."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

pc = pytest.importorskip("prometheus_client")

from dualpipe_rs.torch import _metrics  # noqa: E402


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_idle_connections_cannot_exhaust_the_metrics_server():
    registry = pc.CollectorRegistry()
    pc.Gauge("probe_gauge", "a gauge", registry=registry).set(3)
    httpd = _metrics.serve(0, registry)
    host, port = httpd.server_address
    assert host == "127.0.0.1"
    before = threading.active_count()
    idle = []
    try:
        for _ in range(4 * _metrics.MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHo")  # a request line that never ends
            idle.append(s)
        time.sleep(0.5)
        # at most one thread per admitted connection, whatever the number of clients
        assert threading.active_count() - before <= _metrics.MAX_CONNECTIONS
    finally:
        for s in idle:
            s.close()
    # once they are gone (or time out), a scrape is answered at once
    t0 = time.monotonic()
    deadline = t0 + _metrics.READ_TIMEOUT + 5
    while True:
        try:
            text = _get(port)
            break
        except OSError:
            assert time.monotonic() < deadline, "the metrics server did not come back"
            time.sleep(0.1)
    assert "probe_gauge 3.0" in text
    httpd.shutdown()
