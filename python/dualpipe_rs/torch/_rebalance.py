"""EPLB in the training loop: every ``interval`` steps the sharded experts are re-placed over their
expert group with our migration-aware planner, and experts move with their optimizer state.

Each MoE layer counts its tokens per (logical) expert in the forward (``_experts``). After every
``interval``-th optimizer step the counts of the interval are summed over every process (one
all-reduce of ``[MoE layers, experts]``) and ``dualpipe_rs.eplb.rebalance_experts(...,
previous=phy2log)`` plans a placement of the experts on the ``E`` replicas of a group, one slot
per expert (no redundant replicas), moving as few as reach a fresh plan's balance. Every replica
then gathers its group's shards of each moved layer (weights and each optimizer state tensor of
the same shape, e.g. AdamW's ``exp_avg`` and ``exp_avg_sq``), keeps its new slots' rows and points
its router's experts at their new slots. The routing, the experts' values and the order in which
each token's expert outputs are added are unchanged, so the losses continue as without a move.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist

from ._experts import _EXPERT_TENSORS, ExpertParallel, _ShardedMoE
from ._p2p import wait_for


def balance(counts: torch.Tensor, phy2log: torch.Tensor, ranks: int) -> List[float]:
    """Per layer: the busiest replica's tokens over the mean per replica, under ``phy2log``."""
    out = []
    for row, place in zip(counts, phy2log):
        per_rank = row[place].view(ranks, -1).sum(1)
        mean = float(per_rank.mean())
        out.append(float(per_rank.max()) / mean if mean > 0 else 1.0)
    return out


class Rebalancer:
    """Runs EPLB every ``interval`` steps for an :class:`ExpertParallel`."""

    def __init__(self, ep: ExpertParallel, interval: int):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"eplb_interval must be a positive int (steps between re-plans), got {interval!r}")
        self.ep = ep
        self.interval = interval
        self.steps = 0
        self.moved_total = 0
        self.last: Dict[str, Any] = {}

    def _counts(self) -> torch.Tensor:
        rows = {layer: r for r, (layer, _, _) in enumerate(self.ep.layers)}
        counts = torch.zeros(len(rows), self.ep.group.experts, dtype=torch.float64)
        for layer, c in self.ep.group.counts.items():
            counts[rows[layer]] += c.to(torch.float64).cpu()
        self.ep.group.counts.clear()
        if self.ep.world.size > 1:
            wait_for(dist.all_reduce(counts, async_op=True), "the experts' token counts from every rank", self.ep.timeout)
        return counts

    def after_step(self, optimizer: Any, stages: Dict[Tuple[int, int], Any]) -> Dict[str, Any]:
        """Called after each optimizer step; re-plans and moves every ``interval`` steps. Returns
        what ``stats()`` reports."""
        from ..eplb import rebalance_experts

        self.steps += 1
        if self.steps % self.interval:
            return dict(self.last)
        counts = self._counts()
        old = self.ep.phy2log
        E, n = self.ep.size, self.ep.group.experts
        new = rebalance_experts(counts, num_replicas=n, num_groups=1, num_nodes=1, num_gpus=E, previous=old)[0]
        moved = int((new != old).sum())
        if moved:
            self._move(optimizer, stages, old, new)
            self.ep.phy2log = new.clone()
        self.moved_total += moved
        self.last = {
            "eplb_step": self.steps,
            "eplb_tokens_per_expert": counts.tolist(),
            "eplb_balance_before": balance(counts, old, E),
            "eplb_balance_after": balance(counts, new, E),
            "eplb_moved_experts": moved,
            "eplb_moved_experts_total": self.moved_total,
        }
        return dict(self.last)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        """The group's shards of ``t`` in slot order: ``[experts, ...]``."""
        parts = [torch.empty_like(t) for _ in range(self.ep.size)]
        wait_for(dist.all_gather(parts, t.contiguous(), group=self.ep.group.group, async_op=True),
                 "the expert group's shards for a move", self.ep.timeout)
        return torch.cat(parts)

    def _move(self, optimizer: Any, stages: Dict[Tuple[int, int], Any], old: torch.Tensor, new: torch.Tensor) -> None:
        rows = {layer: r for r, (layer, _, _) in enumerate(self.ep.layers)}
        local = self.ep.group.experts // self.ep.size
        mine = slice(self.ep.shard * local, (self.ep.shard + 1) * local)
        for key in sorted(stages):  # the same modules in the same order on every replica of the group
            for m in stages[key].modules():
                if not isinstance(m, _ShardedMoE):
                    continue
                r = rows[m._dualpipe_layer]
                if torch.equal(old[r], new[r]):
                    continue
                old_slot = torch.empty_like(old[r])
                old_slot[old[r]] = torch.arange(old.shape[1])
                take = old_slot[new[r][mine]]  # rows of the gathered tensors for my new slots
                for name in _EXPERT_TENSORS:
                    p = getattr(m.experts, name)
                    with torch.no_grad():
                        p.copy_(self._gather(p.detach())[take])
                        for v in optimizer.state.get(p, {}).values():
                            if isinstance(v, torch.Tensor) and v.shape == p.shape:
                                v.copy_(self._gather(v)[take])
                slot = torch.empty_like(new[r])
                slot[new[r]] = torch.arange(new.shape[1])
                object.__setattr__(m, "_dualpipe_slot", slot)


def rebalancer(ep: Any, interval: Any) -> Any:
    """The strategy's :class:`Rebalancer` (``None`` without ``eplb_interval``)."""
    if interval is None:
        return None
    if ep is None:
        raise ValueError("eplb_interval re-places sharded experts: it needs expert_parallel of 2 or more")
    return Rebalancer(ep, interval)
