"""Optional Prometheus metrics of a ``DualPipeStrategy`` rank (``prometheus_client``).

Named as the Rust side names them: ``dualpipe_pipeline_bubble_ratio`` (last step, measured:
waits for a message over the pipeline phase), ``dualpipe_pipeline_bubble_ratio_simulated``,
``dualpipe_communication_overhead_ratio`` (the data-parallel exchange's share of the step),
``dualpipe_steps_total``, ``dualpipe_step_duration_seconds`` (a histogram),
``dualpipe_bytes_sent_total{kind="activation"|"gradient"}``, ``dualpipe_loss``, each labelled
with the ``rank``. Served at ``http://<host>:<port>/metrics`` by a bounded server: at most
``MAX_CONNECTIONS`` at once (one more is closed at once, never queued on a thread), each given
``READ_TIMEOUT`` seconds, on loopback unless ``DUALPIPE_METRICS_HOST`` names another address
(``0.0.0.0`` for a Prometheus on another machine: anyone who reaches the port then reads the
metrics; they carry no secrets and change nothing).
"""

from __future__ import annotations

import os
import socketserver
import threading
from typing import Any, Dict, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

MAX_CONNECTIONS = 16
READ_TIMEOUT = 5.0


class _BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per connection, but at most ``MAX_CONNECTIONS`` of them; beyond that a new
    connection is closed at once, so idle or slow clients cannot exhaust threads or memory."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any):
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _QuietHandler(WSGIRequestHandler):
    """A request handler that gives each connection ``READ_TIMEOUT`` seconds and logs nothing."""

    timeout = READ_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def serve(port: int, registry: Any, host: Optional[str] = None) -> Any:
    """Serves ``registry`` on ``host:port`` (``DUALPIPE_METRICS_HOST``, default 127.0.0.1) from a
    daemon thread; returns the server (``server_address`` holds the port taken)."""
    import prometheus_client as pc

    host = host or os.environ.get("DUALPIPE_METRICS_HOST", "127.0.0.1")
    httpd = make_server(host, port, pc.make_wsgi_app(registry), server_class=_BoundedServer,
                        handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name=f"metrics:{port}", daemon=True).start()
    return httpd


class Metrics:
    """The gauges and counters of one rank, served on ``port``."""

    def __init__(self, port: int, rank: int):
        try:
            import prometheus_client as pc
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "metrics_port needs prometheus_client: pip install prometheus_client"
            ) from e
        self.registry = pc.CollectorRegistry()
        r = self.registry
        labels = ["rank"]
        self.rank = str(rank)
        self.bubble = pc.Gauge("dualpipe_pipeline_bubble_ratio", "Share of the last step's pipeline phase spent waiting for a message", labels, registry=r)
        self.bubble_sim = pc.Gauge("dualpipe_pipeline_bubble_ratio_simulated", "The simulator's bubble ratio for the schedule", labels, registry=r)
        self.overhead = pc.Gauge("dualpipe_communication_overhead_ratio", "Share of the last step spent in the data-parallel exchange", labels, registry=r)
        self.loss = pc.Gauge("dualpipe_loss", "Mean loss of the last step", labels, registry=r)
        self.steps = pc.Counter("dualpipe_steps", "Training steps taken", labels, registry=r)
        self.duration = pc.Histogram("dualpipe_step_duration_seconds", "Step wall time", labels, registry=r)
        self.bytes = pc.Counter("dualpipe_bytes_sent", "Bytes this rank sent", labels + ["kind"], registry=r)
        self.server = serve(port, r)

    def close(self) -> None:
        """Stops serving and frees the port."""
        self.server.shutdown()
        self.server.server_close()

    def observe(self, stats: Dict[str, Any], simulated_bubble: float) -> None:
        """Records one step's :meth:`DualPipeStrategy.stats`."""
        r = self.rank
        self.bubble.labels(r).set(stats["bubble_ratio"])
        self.bubble_sim.labels(r).set(simulated_bubble)
        self.overhead.labels(r).set(stats["communication_overhead_ratio"])
        self.loss.labels(r).set(stats["loss"])
        self.steps.labels(r).inc()
        self.duration.labels(r).observe(stats["step_seconds"])
        self.bytes.labels(r, "activation").inc(stats["activation_bytes_sent"])
        self.bytes.labels(r, "gradient").inc(stats["gradient_bytes_sent"])
