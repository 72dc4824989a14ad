"""Run dualpipe's schedules with PyTorch: ``torch.distributed.pipelining``'s runtime, our programs.

>>> import dualpipe_rs.torch as dpt
>>> sched = dpt.schedule("dualpipev", stages, n_microbatches=8, loss_fn=loss_fn)  # doctest: +SKIP
>>> sched.step(x, target=y)                                                        # doctest: +SKIP

- :func:`schedule` builds, validates and loads one of our schedules into torch's
  ``_PipelineScheduleRuntime`` for this rank's ``PipelineStage`` objects;
- :class:`DualPipeStrategy` trains a user's own model under any of our schedules (DualPipe's two
  copies included) with our executor over torch autograd and torch.distributed, launched by
  torchrun, with compressed data parallelism and checkpoints (see docs/python.md);
- :func:`profile` measures a module's F, B, I, W and FB times on a sample micro-batch, and
  :func:`predict` simulates each schedule kind's step from them.

PyTorch is an optional dependency of ``dualpipe_rs``: importing this module without it raises an
``ImportError`` that says how to install it.
"""

from __future__ import annotations

try:
    import torch as _torch
except ImportError as e:  # pragma: no cover - exercised by a subprocess test without torch
    raise ImportError(
        "dualpipe_rs.torch needs PyTorch, which is not installed; install it with "
        "`pip install torch --index-url https://download.pytorch.org/whl/cpu` (the CPU build, "
        "smallest) or `pip install torch` (the default build, with CUDA on Linux)"
    ) from e

from ._runtime import TORCH_KINDS, schedule, torch_actions  # noqa: E402
from ._profile import StageProfile, plan_profile, predict, profile  # noqa: E402
from ._strategy import DualPipeStrategy, PendingLoss  # noqa: E402

del _torch

__all__ = ["DualPipeStrategy", "PendingLoss", "TORCH_KINDS", "StageProfile", "plan_profile", "predict", "profile", "schedule", "torch_actions"]
