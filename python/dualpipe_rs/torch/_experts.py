"""Expert parallelism for the MoE layers of a ``transformers`` model under ``DualPipeStrategy``.

With ``expert_parallel=E`` the data-parallel replicas of each pipeline rank form groups of ``E``
consecutive replicas (an *expert group*); replica ``d`` holds shard ``d % E`` of every MoE
layer's routed experts (``N / E`` of the ``N``, consecutive), the router and the shared experts
stay whole on every replica. A MoE layer's forward (DeepSeek-V3's ``DeepseekV3MoE``):

1. routes with the model's own router (``gate``), unchanged;
2. sorts the (token, expert) assignments by expert (stable, so each token's experts keep their
   order) and sends each to the replica holding its expert: ``all_to_all_single`` within the
   expert group, in torch ops with autograd (gloo on CPU, NCCL on GPU);
3. runs the local experts with the model's own experts module (weights 1), sends the outputs
   back (a second ``all_to_all_single``), weights them with the router's weights and adds them
   per token in expert order, as the model's ``index_add_`` does; adds the shared experts.

Gradients: an expert's gradient arrives from every replica of its group through the all-to-alls'
backward. Expert tensors are left out of the data-parallel exchange; :meth:`ExpertParallel.
exchange_grads` sums each shard's gradient over the replicas holding the same shard (the other
expert groups) and divides by the replica count, the mean the exchange gives every other tensor.
The optimizer is built over the local shards, so its state lives with the expert.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ._p2p import wait_for

_EXPERT_TENSORS = ("gate_up_proj", "down_proj")


class _Group:
    """The expert group of this process: its process group, its size and this replica's shard."""

    def __init__(self, size: int, shard: int, experts: int, timeout: float):
        self.size = size
        self.shard = shard
        self.experts = experts  # routed experts per layer (all shards)
        self.timeout = timeout
        self.group: Any = None  # the forwards' process group, set once it exists
        self.group_b: Any = None  # the backwards': an FB pair runs one of each at once
        self.counts: Dict[int, torch.Tensor] = {}  # layer -> tokens per expert, this step

    def __deepcopy__(self, memo: Any) -> "_Group":
        return self  # DualPipe's second copy of a stage shares the group


def _exchange(x: torch.Tensor, recv: List[int], send: List[int], g: _Group, what: str, backward: bool = False) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    group = g.group_b if backward else g.group
    wait_for(dist.all_to_all_single(out, x.contiguous(), recv, send, group=group, async_op=True),
             f"the expert group's {what}", g.timeout)
    return out


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` whose backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, recv: List[int], send: List[int], g: _Group) -> torch.Tensor:  # noqa: D102
        ctx.recv, ctx.send, ctx.g = recv, send, g
        return _exchange(x, recv, send, g, "tokens")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None]:  # noqa: D102
        return _exchange(grad, ctx.send, ctx.recv, ctx.g, "token gradients", backward=True), None, None, None


def _all_to_all(x: torch.Tensor, recv: List[int], send: List[int], g: _Group) -> torch.Tensor:
    return _AllToAll.apply(x, recv, send, g)


class _ShardedMoE:
    """Mixed into the class of a MoE module whose routed experts are sharded (see the module doc)."""

    _dualpipe_ep: _Group
    _dualpipe_layer: int
    _dualpipe_slot: torch.Tensor  # logical expert -> physical slot (slot // local: its replica)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # noqa: D102 - see the module doc
        g = self._dualpipe_ep
        residuals, shape = hidden_states, hidden_states.shape
        if hidden_states.is_meta:  # the shape check on the meta device: no messages
            return hidden_states + self.shared_experts(residuals)
        _, weights, experts = self.gate(hidden_states)
        x = hidden_states.reshape(-1, shape[-1])
        k = experts.shape[-1]
        flat = experts.reshape(-1)
        slot = self._dualpipe_slot.to(flat.device)[flat]  # the physical slot of each assignment's expert
        order = torch.argsort(slot, stable=True)
        tokens = torch.div(order, k, rounding_mode="floor")
        per_expert = torch.bincount(flat, minlength=g.experts)
        counts = g.counts.setdefault(self._dualpipe_layer, torch.zeros_like(per_expert))
        counts += per_expert
        local = g.experts // g.size
        send_counts = torch.bincount(slot, minlength=g.experts).view(g.size, local).sum(1)
        ones = [1] * g.size
        recv_counts = _exchange(send_counts, ones, ones, g, "token counts")
        send, recv = send_counts.tolist(), recv_counts.tolist()
        got = _all_to_all(x[tokens], recv, send, g)
        ids = _exchange(slot[order] % local, recv, send, g, "expert indices")
        done = self.experts(got, ids.unsqueeze(1), torch.ones(ids.shape[0], 1, dtype=got.dtype, device=got.device))
        back = _all_to_all(done, send, recv, g)
        # added per token in the model's order (by expert), wherever the experts sit
        by_expert = torch.argsort(flat[order], stable=True)
        w = weights.reshape(-1)[order][by_expert].unsqueeze(1).to(back.dtype)
        routed = torch.zeros_like(x).index_add_(0, tokens[by_expert], back[by_expert] * w)
        return routed.view(*shape) + self.shared_experts(residuals)


_CLASSES: Dict[type, type] = {}


def moe_layers(units: List[Tuple[str, nn.Module]]) -> List[Tuple[int, str, nn.Module]]:
    """``(layer index, prefix, MoE module)`` of every unit whose ``mlp`` has sharded-able experts."""
    out = []
    for i, (prefix, unit) in enumerate(units):
        mlp = getattr(unit, "mlp", None)
        experts = getattr(mlp, "experts", None)
        if experts is not None and all(isinstance(getattr(experts, n, None), nn.Parameter) for n in _EXPERT_TENSORS) \
                and hasattr(mlp, "gate") and hasattr(mlp, "shared_experts"):
            out.append((i, prefix, mlp))
    return out


class ExpertParallel:
    """Shards the routed experts of a model's MoE layers over expert groups of ``size`` replicas."""

    def __init__(self, units: List[Tuple[str, nn.Module]], world: Any, size: int, timeout: float):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"expert_parallel must be a positive int (replicas per expert group), got {size!r}")
        layers = moe_layers(units)
        if not layers:
            raise ValueError("expert_parallel is set, but the model has no MoE layer with routed experts to shard")
        if world.replicas % size:
            raise ValueError(
                f"expert_parallel={size} does not divide the {world.replicas} data-parallel replica"
                f"{'s' if world.replicas != 1 else ''}: give a divisor of the replica count (experts are sharded "
                "over the replicas of their pipeline rank)"
            )
        n = layers[0][2].experts.gate_up_proj.shape[0]
        if n % size:
            raise ValueError(f"the MoE layers have {n} routed experts, which do not divide over expert_parallel={size}")
        self.world, self.size, self.timeout = world, size, timeout
        self.shard = world.replica % size
        self.group = _Group(size, self.shard, n, timeout)
        self.layers = layers
        local = n // size
        lo = self.shard * local
        for i, _, mlp in layers:
            ex = mlp.experts
            for name in _EXPERT_TENSORS:
                full = getattr(ex, name)
                setattr(ex, name, nn.Parameter(full.detach()[lo:lo + local].clone(), requires_grad=full.requires_grad))
            ex.num_experts = local
            base = type(mlp)
            cls = _CLASSES.get(base)
            if cls is None:
                cls = type(f"ExpertParallel{base.__name__}", (_ShardedMoE, base), {"__module__": __name__})
                _CLASSES[base] = cls
            mlp.__class__ = cls
            object.__setattr__(mlp, "_dualpipe_ep", self.group)
            object.__setattr__(mlp, "_dualpipe_layer", i)
            object.__setattr__(mlp, "_dualpipe_slot", torch.arange(n))
        self.same_shard: Optional[Any] = None
        self.phy2log = torch.arange(n).repeat(len(layers), 1)  # [MoE layers, slots]: the placement in service
        self.steps = 0

    def join(self) -> None:
        """Creates the process groups (every process, in one order): each pipeline rank's expert
        groups (two: forwards and backwards, each in program order on every member, so an FB
        pair may run one of each at once), and the replicas holding the same shard (for the
        gradients)."""
        w = self.world
        for p in range(w.pipeline_ranks):
            for first in range(0, w.replicas, self.size):
                ranks = [w.global_rank(p, d) for d in range(first, first + self.size)]
                pgs = (dist.new_group(ranks), dist.new_group(ranks))
                if p == w.pipeline_rank and first <= w.replica < first + self.size:
                    self.group.group, self.group.group_b = pgs
            if w.replicas == self.size:
                continue
            for j in range(self.size):
                ranks = [w.global_rank(p, d) for d in range(j, w.replicas, self.size)]
                pg = dist.new_group(ranks)
                if p == w.pipeline_rank and w.replica % self.size == j:
                    self.same_shard = pg

    def exchange_grads(self, stages: Dict[Tuple[int, int], Any]) -> None:
        """Each local expert tensor's gradient: the sum over the replicas holding its shard, over
        the replica count (the mean of the step's loss over every replica)."""
        grads = [p.grad for m in stages.values() for p in expert_params(m) if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.same_shard is not None:
            wait_for(dist.all_reduce(flat, group=self.same_shard, async_op=True),
                     f"rank {self.world.rank}: expert gradients from the replicas holding the same experts", self.timeout)
        flat /= self.world.replicas
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()


def expert_params(module: nn.Module) -> List[nn.Parameter]:
    """The sharded routed experts' tensors in ``module`` (left out of the data-parallel exchange)."""
    return [p for m in module.modules() if isinstance(m, _ShardedMoE) for p in m.experts.parameters()]


def expert_ids(stages: Dict[Tuple[int, int], Any]) -> set:
    """``id`` of every sharded expert tensor of this rank's stages."""
    return {id(p) for m in stages.values() for p in expert_params(m)}
