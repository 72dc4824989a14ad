"""Optional Prometheus metrics of a ``DualPipeStrategy`` rank (``prometheus_client``).

Named as the Rust side names them: ``dualpipe_pipeline_bubble_ratio`` (last step, measured:
waits for a message over the pipeline phase), ``dualpipe_pipeline_bubble_ratio_simulated``,
``dualpipe_communication_overhead_ratio`` (the data-parallel exchange's share of the step),
``dualpipe_steps_total``, ``dualpipe_step_duration_seconds`` (a histogram),
``dualpipe_bytes_sent_total{kind="activation"|"gradient"}``, ``dualpipe_loss``, each labelled
with the ``rank``. Served at ``http://<host>:<port>/metrics``.
"""

from __future__ import annotations

from typing import Any, Dict


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
        self.server = pc.start_http_server(port, registry=r)

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
