"""Expert-parallel load balancing: a drop-in replacement for DeepSeek's ``eplb.rebalance_experts``.

Swap the import and keep the call::

    from dualpipe_rs.eplb import rebalance_experts      # was: from eplb import rebalance_experts
    phy2log, log2phy, logcnt = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)

The results are index for index those of the reference (and of ``dualpipe eplb``), computed in
Rust with the GIL released.

``previous=`` (the ``phy2log`` of the plan now in service) switches to the migration-aware
planner: duplicate-free packing, a local-search improvement pass, and as few moved replicas as
reach the balance of a fresh plan. ``policy="improved"`` runs that planner without a previous
placement.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _native
from ._convert import as_count, as_float64_matrix, int64_array, is_torch_tensor, like_input

__all__ = ["rebalance_experts"]


def rebalance_experts(
    weight: Any,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    policy: str = "auto",
    previous: Optional[Any] = None,
) -> Tuple[Any, Any, Any]:
    """Plans how many replicas each logical expert gets and which GPU holds each replica.

    Parameters:
        weight: ``[layers, num_logical_experts]`` load statistics: a list of lists, a numpy
            array (any integer or float dtype) or a torch tensor (any device; read on the CPU).
            Loads are rounded to float32 first, as the reference does.
        num_replicas: physical experts per layer; a multiple of ``num_gpus``.
        num_groups: expert groups; must divide the number of logical experts.
        num_nodes: server nodes (the fast intra-node network, e.g. NVLink, lies within one).
        num_gpus: GPUs; a multiple of ``num_nodes``.
        policy: ``"auto"`` (the reference's choice: hierarchical when the groups divide over
            the nodes, global otherwise), ``"hierarchical"``, ``"global"``, or ``"improved"``
            (the migration-aware planner; not index-compatible with the reference).
        previous: the ``phy2log`` ``[layers, num_replicas]`` of the placement in service
            (list, numpy array or torch tensor). Given, the migration-aware planner re-plans
            from it, moving few replicas; ``policy`` must then be ``"auto"`` or ``"improved"``.

    Returns:
        ``(phy2log, log2phy, logcnt)``, int64, as torch tensors (on the CPU) when ``weight``
        is a torch tensor and as numpy arrays otherwise:

        - ``phy2log`` ``[layers, num_replicas]``: the logical expert of each physical slot;
        - ``log2phy`` ``[layers, num_logical_experts, max_replicas]``: the physical slots of
          each expert, padded with -1;
        - ``logcnt`` ``[layers, num_logical_experts]``: the number of replicas of each expert.

        With the migration-aware planner, ``log2phy`` lists each expert's slots in increasing
        order.

    Raises:
        ValueError: a bad shape, load or count, with the same message as ``dualpipe eplb``.
    """
    torch_input = is_torch_tensor(weight)
    w = as_float64_matrix(weight, "weight")
    layers, experts = w.shape
    replicas = as_count(num_replicas, "num_replicas")
    counts = (
        replicas,
        as_count(num_groups, "num_groups"),
        as_count(num_nodes, "num_nodes"),
        as_count(num_gpus, "num_gpus"),
    )
    policy = str(policy)
    if previous is not None or policy.lower() == "improved":
        if policy.lower() not in ("auto", "improved"):
            raise ValueError(
                f"previous= re-plans with the migration-aware planner, not the {policy} policy; "
                "leave policy at 'auto' (or 'improved') or drop previous="
            )
        prev = None if previous is None else _previous_bytes(previous, layers, replicas)
        (phy2log, log2phy, logcnt, width), _moved = _native.eplb_rebalance_improved(
            w.tobytes(), layers, experts, *counts, previous=prev
        )
    else:
        phy2log, log2phy, logcnt, width = _native.eplb_rebalance(
            w.tobytes(), layers, experts, *counts, policy=policy
        )
    return (
        like_input(int64_array(phy2log, (layers, replicas)), torch_input),
        like_input(int64_array(log2phy, (layers, experts, width)), torch_input),
        like_input(int64_array(logcnt, (layers, experts)), torch_input),
    )


def _previous_bytes(previous: Any, layers: int, replicas: int) -> bytes:
    """``previous`` (a phy2log) as the bytes of a C-contiguous int64 ``[layers, replicas]``."""
    if is_torch_tensor(previous):
        previous = previous.detach().cpu().numpy()
    prev = np.asarray(previous)
    if prev.dtype.kind not in "iu" and not (
        prev.dtype.kind == "f" and prev.size and np.all(np.mod(prev, 1) == 0)
    ):
        raise ValueError(
            f"previous must hold integer expert indices (a phy2log); got dtype {prev.dtype}"
        )
    if prev.shape != (layers, replicas):
        raise ValueError(
            f"previous must be the phy2log of the last plan, [layers, num_replicas] = "
            f"[{layers}, {replicas}]; got shape {list(prev.shape)}"
        )
    return np.ascontiguousarray(prev, dtype=np.int64).tobytes()
