"""Expert-parallel load balancing: a drop-in replacement for DeepSeek's ``eplb.rebalance_experts``.

Swap the import and keep the call::

    from dualpipe_rs.eplb import rebalance_experts      # was: from eplb import rebalance_experts
    phy2log, log2phy, logcnt = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)

The results are index for index those of the reference (and of ``dualpipe eplb``), computed in
Rust with the GIL released.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

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
            the nodes, global otherwise), ``"hierarchical"`` or ``"global"``.

    Returns:
        ``(phy2log, log2phy, logcnt)``, int64, as torch tensors (on the CPU) when ``weight``
        is a torch tensor and as numpy arrays otherwise:

        - ``phy2log`` ``[layers, num_replicas]``: the logical expert of each physical slot;
        - ``log2phy`` ``[layers, num_logical_experts, max_replicas]``: the physical slots of
          each expert, padded with -1;
        - ``logcnt`` ``[layers, num_logical_experts]``: the number of replicas of each expert.

    Raises:
        ValueError: a bad shape, load or count, with the same message as ``dualpipe eplb``.
    """
    torch_input = is_torch_tensor(weight)
    w = as_float64_matrix(weight, "weight")
    layers, experts = w.shape
    replicas = as_count(num_replicas, "num_replicas")
    phy2log, log2phy, logcnt, width = _native.eplb_rebalance(
        w.tobytes(),
        layers,
        experts,
        replicas,
        as_count(num_groups, "num_groups"),
        as_count(num_nodes, "num_nodes"),
        as_count(num_gpus, "num_gpus"),
        policy=str(policy),
    )
    return (
        like_input(int64_array(phy2log, (layers, replicas)), torch_input),
        like_input(int64_array(log2phy, (layers, experts, width)), torch_input),
        like_input(int64_array(logcnt, (layers, experts)), torch_input),
    )
