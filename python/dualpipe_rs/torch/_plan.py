"""``partition="plan"``: every layer measured on a sample micro-batch, cut by the planner."""

from __future__ import annotations

import json
from typing import Any, List

import torch

from .. import _native
from ._profile import plan_profile
from ._split import Layers


def planned_partition(layers: Layers, stages: int, sample: Any) -> List[int]:
    """Layers per stage: :func:`plan_profile` measures each layer's ``F``, ``I`` and ``W`` on
    ``sample`` (one micro-batch of inputs), and the planner's ``min_max`` partition (the one
    ``dualpipe plan`` uses) cuts them so that the slowest stage is fastest.

    Every process measures on its own, so timings differ a little between ranks; rank 0's
    partition is the one used (broadcast when the process group is up), so all agree.
    """
    if sample is None:
        raise ValueError(
            "partition='plan' measures the layers on a sample: pass sample=<one micro-batch of inputs>"
        )
    if not isinstance(sample, torch.Tensor):
        raise TypeError(f"sample must be a tensor (one micro-batch of inputs), not {type(sample).__name__}")
    modules = [m for _, m in layers.units]
    doc = plan_profile(modules, sample, repeats=3, warmup=1)
    for m in modules:
        m.zero_grad(set_to_none=True)
    return list(_native.plan_partition(json.dumps(doc), stages))
