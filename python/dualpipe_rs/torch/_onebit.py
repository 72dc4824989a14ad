"""1-bit Adam (Tang et al., 2021) over torch's own ``AdamW``, as the Rust optimizer does it.

The first ``warmup`` steps are plain AdamW with uncompressed gradients. From then on the second
moment stays as it was after step ``warmup``; each replica folds its gradient into its next first
moment ``m' = beta1 m + (1 - beta1) g``, the replicas exchange (and compress) ``m'`` instead of the
gradient, and the update uses the averaged ``m'`` with the frozen variance:
``p <- p (1 - lr wd) - lr / (1 - beta1^t) * m' / (sqrt(v / (1 - beta2^warmup)) + eps)``.
"""

from __future__ import annotations

import math
from typing import List

import torch


def is_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """Whether 1-bit Adam applies (torch's AdamW; its subclasses may change the update)."""
    return type(optimizer) is torch.optim.AdamW


def frozen(optimizer: torch.optim.Optimizer, warmup: int) -> bool:
    """Whether the next step is in the compression phase (``warmup`` steps taken)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    st = optimizer.state.get(params[0]) if params else None
    return st is not None and "step" in st and int(st["step"]) >= warmup


def fold_momentum(optimizer: torch.optim.Optimizer, params: List[torch.nn.Parameter]) -> None:
    """Replaces each gradient by the next first moment ``beta1 m + (1 - beta1) g``."""
    beta1 = optimizer.param_groups[0]["betas"][0]
    for p in params:
        if p.grad is None:
            continue
        m = optimizer.state[p]["exp_avg"]
        p.grad = m * beta1 + p.grad * (1 - beta1)


@torch.no_grad()
def frozen_step(optimizer: torch.optim.Optimizer, warmup: int) -> None:
    """The compression phase's update; ``p.grad`` holds the averaged first moment."""
    for group in optimizer.param_groups:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if group.get("amsgrad") or group.get("maximize"):
            raise ValueError("1-bit Adam supports AdamW without amsgrad and maximize")
        for p in group["params"]:
            if p.grad is None:
                continue
            st = optimizer.state[p]
            step = st["step"]
            step += 1
            t = int(step)
            st["exp_avg"].copy_(p.grad)
            p.mul_(1 - lr * wd)
            denom = (st["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**warmup)).add_(eps)
            p.addcdiv_(st["exp_avg"], denom, value=-lr / (1 - beta1**t))
