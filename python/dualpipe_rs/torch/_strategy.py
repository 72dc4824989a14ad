"""`DualPipeStrategy`: a user's torch model trained under our schedules, launched by torchrun."""

from __future__ import annotations

import inspect
import math
import re
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from .. import _native
from . import _experts, _hf, _onebit, _rebalance
from ._codec import check_compression
from ._dp import GradExchange, exchange_copies
from ._executor import Executor
from ._p2p import P2P, incoming, pair_groups, wait_for
from ._split import StageModule, copy_stage, layers_of, partition_sizes, stage_units, unit_sizes
from ._world import World, backend_for, cuda_device, init, world_from_env
from ._zero import Shards, check_zero, memory

KINDS = ("dualpipe", "dualpipev", "1f1b", "zb1p", "gpipe", "interleaved")
_COPY_TAG = 1 << 26


def _stages_per_rank(kind: str, virtual_stages: int) -> int:
    return {"dualpipev": 2, "interleaved": virtual_stages}.get(kind, 1)


def _check_kind(schedule: Any) -> str:
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a schedule kind name (str), not {type(schedule).__name__}")
    if schedule not in KINDS:
        raise ValueError(f"unknown schedule '{schedule}': use one of {', '.join(KINDS)}")
    return schedule


def _make_optimizer(optimizer: Any, params: List[nn.Parameter], kwargs: Dict[str, Any]) -> torch.optim.Optimizer:
    if inspect.isclass(optimizer) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer(params, **kwargs)
    if kwargs:
        raise TypeError("optimizer_kwargs go with an optimizer class (e.g. torch.optim.AdamW), not a factory")
    if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"the optimizer factory returned a {type(opt).__name__}, not a torch.optim.Optimizer")
        return opt
    raise TypeError(
        "optimizer must be an optimizer class (with optimizer_kwargs) or a factory params -> Optimizer, "
        f"not {type(optimizer).__name__}: each rank builds it over its own stages' parameters"
    )


def _make_loss(loss_fn: Any) -> Callable:
    if inspect.isclass(loss_fn):
        if not issubclass(loss_fn, nn.Module):
            raise TypeError(f"loss_fn class {loss_fn.__name__} is not an nn.Module loss (e.g. nn.CrossEntropyLoss)")
        return loss_fn()
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a callable (out, labels) -> scalar or a loss class, not {type(loss_fn).__name__}")
    return loss_fn


class PendingLoss:
    """What :meth:`DualPipeStrategy.compute_loss` returns: the step's loss, known once
    :meth:`DualPipeStrategy.backward` has run the pipeline (``float(loss)``, ``loss.item()``)."""

    def __init__(self) -> None:
        self.value: Optional[float] = None

    def item(self) -> float:
        """The mean loss over the step's micro-batches and replicas."""
        if self.value is None:
            raise RuntimeError("the loss is known after backward(loss): a pipeline computes it with the backward")
        return self.value

    __float__ = item


class DualPipeStrategy:
    """Trains ``model`` with one of our pipeline schedules over the processes torchrun started.

    ``model``: an ``nn.Sequential`` (its children are the blocks), or any module with
    ``blocks='<attribute>'`` (or the pair ``(model, '<attribute>')``) naming its ``nn.ModuleList`` of blocks (its other children run in
    registration order, those before on the first stage, those after on the last). Every process
    builds the same model (same seed) and keeps its own stages. ``partition``: ``None`` (even), a
    list of blocks per stage, or ``"plan"`` (each block measured with :func:`profile` on
    ``sample``, cut where the slowest stage is fastest). ``optimizer``: a class plus
    ``optimizer_kwargs``, or a factory ``params -> Optimizer``. ``loss_fn``: a callable
    ``(out, labels) -> scalar`` or a loss class. ``compression``: ``None``, ``"bf16"``,
    ``"int8"`` or ``"1bit"`` for the data-parallel exchange (``"1bit"`` with ``torch.optim.AdamW``
    is 1-bit Adam after ``compression_warmup`` steps). ``pipeline_stages``: pipeline ranks per
    replica (default: the whole world); the world is ``pipeline_stages x replicas`` processes,
    rank = ``replica x pipeline_stages + pipeline rank``. CUDA models run on ``cuda:LOCAL_RANK``
    over NCCL, CPU ones over gloo. ``schedule``: ``dualpipe`` (two copies of every stage, their
    gradients summed), ``dualpipev``, ``1f1b``, ``zb1p``, ``gpipe``, ``interleaved``;
    ``micro_batches`` per replica and step (default ``2 x pipeline_stages``).

    Also: ``virtual_stages`` (interleaved), ``compression_warmup`` (uncompressed steps first;
    1 for ``"1bit"``), ``sample`` (for ``partition="plan"``), ``timeout`` (seconds a rank waits
    for another before it stops, naming it), ``metrics_port`` (Prometheus on ``port + rank``),
    ``use_hooks`` (call a layer's ``overlapped_forward_backward`` for FB pairs), ``eager_sends``
    (send each result the moment it exists, so in an FB pair the forward's activations travel
    during the backward; ``False`` sends at the op's place in the lowered program), ``zero``
    (``0``: every replica keeps the whole optimizer state; ``1``: it is sharded over the replicas
    and DualPipe's two copies of a stage, each rank updating its piece and the weights gathered;
    ``2``: the gradients too are kept only for the piece; see ``_zero``),
    ``expert_parallel`` (``E``: each MoE layer's routed experts sharded over groups of ``E``
    replicas, tokens sent to their experts with all-to-all; see ``_experts``), ``eplb_interval``
    (with ``expert_parallel``: every that many steps our EPLB re-places the experts, which move
    with their optimizer state; see ``_rebalance``).

    A ``transformers`` causal LM (GPT-2, Llama, Qwen2, Mistral, DeepSeek-V3) goes in as it is, with
    ``loss_fn=None`` for its own loss (see ``_hf``).
    """

    def __init__(self, model: Any, optimizer: Any, loss_fn: Any, compression: Optional[str] = None,
                 pipeline_stages: Optional[int] = None, schedule: str = "dualpipe",
                 micro_batches: Optional[int] = None, partition: Any = None, *, blocks: Optional[str] = None,
                 optimizer_kwargs: Optional[Dict[str, Any]] = None, virtual_stages: int = 2,
                 compression_warmup: Optional[int] = None, sample: Any = None, timeout: float = 60.0,
                 metrics_port: Optional[int] = None, use_hooks: bool = True, eager_sends: bool = True,
                 zero: int = 0, expert_parallel: Optional[int] = None,
                 eplb_interval: Optional[int] = None):
        # Everything checkable alone is checked before any process waits on another.
        self.kind = _check_kind(schedule)
        self.zero = check_zero(zero)
        if self.zero and expert_parallel not in (None, 1):
            raise ValueError(
                f"zero={self.zero} with expert_parallel={expert_parallel}: sharding the experts' optimizer state over "
                "their expert group is not supported yet; use zero=0 with expert_parallel, or expert_parallel=None"
            )
        self.compression = check_compression(compression)
        self.world: World = world_from_env(pipeline_stages)
        P = self.world.pipeline_ranks
        if micro_batches is None:
            micro_batches = 2 * P
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
            raise TypeError(f"micro_batches must be an int, not {type(micro_batches).__name__}")
        if isinstance(virtual_stages, bool) or not isinstance(virtual_stages, int) or virtual_stages < 1:
            raise ValueError(f"virtual_stages must be a positive int, got {virtual_stages!r}")
        try:
            self.plan = _native.schedule(self.kind, P, micro_batches,
                                         virtual_stages=virtual_stages if self.kind == "interleaved" else None)
        except ValueError as e:
            # The binding names the settings by its own keyword arguments; ours call two of them
            # otherwise.
            msg = re.sub(r"\branks=", "pipeline_stages=", str(e))
            raise ValueError(re.sub(r"\bkind=", "schedule=", msg)) from None
        self.micro_batches = micro_batches
        # a transformers model as it is (with blocks= it is cut like any other module)
        self._hf = _hf.adapt(model, loss_fn) if loss_fn is None or (blocks is None and _hf.is_transformers_model(model)) \
            else None
        self.loss_fn = self._hf.loss_fn if self._hf is not None else _make_loss(loss_fn)
        if compression_warmup is None:
            compression_warmup = 1 if self.compression == "1bit" else 0
        if isinstance(compression_warmup, bool) or not isinstance(compression_warmup, int) or compression_warmup < 0:
            raise ValueError(f"compression_warmup must be a non-negative int, got {compression_warmup!r}")
        self.warmup = compression_warmup
        self.timeout = float(timeout)
        self.num_stages = len(self.plan.placement[0])
        layers = self._hf.layers if self._hf is not None else layers_of(model, blocks)
        if isinstance(partition, str):
            if partition != "plan":
                raise ValueError(f"unknown partition '{partition}': use None (even), 'plan' or a list of blocks per stage")
            from ._plan import planned_partition

            sizes = planned_partition(layers, self.num_stages, sample)
        else:
            sizes = unit_sizes(layers, partition_sizes(layers, self.num_stages, partition))
        self.partition = sizes
        params = [p for _, m in layers.units for p in m.parameters()]
        device = params[0].device if params else torch.device("cpu")
        if device.type == "cuda":
            device = cuda_device(self.world.local_rank, torch.cuda.device_count())
            torch.cuda.set_device(device)
        self.device = device
        self.backend = backend_for(device)
        self._layers = layers
        self._ep = _experts.ExpertParallel(layers.units, self.world, expert_parallel, self.timeout) \
            if expert_parallel not in (None, 1) else None
        self._eplb = _rebalance.rebalancer(self._ep, eplb_interval)
        self._optimizer_args = (optimizer, dict(optimizer_kwargs or {}))
        self._build(sizes)
        # Joining the job: from here on processes wait on each other.
        init(self.world, device, self.timeout)
        w = self.world
        if self._ep is not None:
            self._ep.join()
        if partition == "plan" and w.size > 1:
            agreed = torch.tensor(sizes, dtype=torch.int64)
            wait_for(dist.broadcast(agreed, src=0, async_op=True), f"rank {w.rank}: rank 0's planned partition", self.timeout)
            if agreed.tolist() != sizes:
                self._build(agreed.tolist())
        me = w.pipeline_rank
        programs = self.plan.programs
        groups = pair_groups(programs, w.global_rank, w.replicas, w.replica, self.timeout) if w.size > 1 else {}
        self._ties = _hf.TiedGrads(self._hf.ties, _hf.tie_holders(self._hf, self.plan.placement, self.partition), w,
                                   self.timeout) if self._hf is not None and self._hf.ties else None
        self.p2p = P2P([w.global_rank(p) for p in range(P)], me, device, self.timeout, incoming(programs, me),
                       len(self.plan.placement[0]), micro_batches // len(self.plan.placement), groups)
        self.executor = Executor(self.plan.programs[me], self.stages, self.plan.placement, micro_batches, me,
                                 self.p2p, self.loss_fn, use_hooks=use_hooks, eager_sends=eager_sends,
                                 overlap=self._ep is not None)
        self.exchange = GradExchange([w.global_rank(me, d) for d in range(w.replicas)], w.replica, self.compression,
                                     self.warmup, timeout=self.timeout)
        self._shapes_seen: set = set()
        self.steps = 0
        self.copy_bytes_sent = 0
        self._stats: Dict[str, Any] = {}
        self._pending: Dict[str, Any] = {}
        self.metrics = None
        if metrics_port is not None:
            from ._metrics import Metrics

            self.metrics = Metrics(metrics_port + w.rank, w.rank)

    def _build(self, sizes: List[int]) -> None:
        """This rank's stage modules (DualPipe's second copy where a rank holds both) and optimizer."""
        self.partition = list(sizes)
        units = stage_units(self._layers, sizes)
        me = self.world.pipeline_rank
        self.stages: Dict[Tuple[int, int], StageModule] = {}
        built: Dict[int, StageModule] = {}
        for d, row in enumerate(self.plan.placement):
            for s, r in enumerate(row):
                if r != me:
                    continue
                m = copy_stage(built[s]) if s in built else StageModule(units[s]).to(self.device)
                built[s] = m
                self.stages[(d, s)] = m
        local_params = [p for m in self.stages.values() for p in m.parameters() if p.requires_grad]
        self.shards: Optional[Shards] = None
        if self.zero:
            self.shards = Shards(self.stages, self.plan.placement, self.world, self.zero, self.compression, self.timeout)
            local_params = self.shards.params()
        optimizer, kwargs = self._optimizer_args
        self.optimizer = _make_optimizer(optimizer, local_params, kwargs)
        self.onebit_adam = self.compression == "1bit" and _onebit.is_adamw(self.optimizer)

    # -- the step ------------------------------------------------------------------------------

    def _split(self, what: str, t: Any) -> List[Any]:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a tensor (the replica's batch, micro-batches along dim 0), not {type(t).__name__}")
        if t.dim() == 0 or t.shape[0] % self.micro_batches:
            n = t.shape[0] if t.dim() else 0
            raise ValueError(
                f"{what} has {n} rows, which do not divide into micro_batches={self.micro_batches}: "
                f"give a batch of a multiple of {self.micro_batches} rows"
            )
        return list(t.to(self.device).chunk(self.micro_batches))

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> float:
        """One training step on this replica's batch: every micro-batch through the schedule,
        DualPipe's copies summed, the data-parallel exchange, the optimizer step. Returns the
        mean loss over all replicas' micro-batches (the same on every rank). A loss or gradient
        that is not a finite number raises ``FloatingPointError`` on every rank before the state
        changes (the optimizer step is not taken)."""
        loss = self._forward_backward(inputs, labels)
        self.update_weights()
        return loss

    def _forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> float:
        xs = self._split("inputs", inputs)
        ys = self._split("labels", labels)
        if len(xs[0]) != len(ys[0]):
            raise ValueError(f"inputs has {inputs.shape[0]} rows but labels {labels.shape[0]}: give one label row per input row")
        key = (tuple(xs[0].shape), xs[0].dtype)
        headers = key not in self._shapes_seen
        if headers:
            self._check_loss_is_scalar(xs[0], ys[0])
        self._shapes_seen.add(key)
        t0 = time.perf_counter()
        copy0, param0 = self.copy_bytes_sent, self.shards.bytes_sent if self.shards is not None else 0
        for m in self.stages.values():
            m.zero_grad(set_to_none=True)
        if self.shards is not None:  # the pieces' gradients (ZeRO-1: views of the last step's .grad)
            self.optimizer.zero_grad(set_to_none=True)
        res = self.executor.run(xs, ys, headers)
        t1 = time.perf_counter()
        self._sum_copies()
        if self._ties is not None:
            self._ties.sum_grads(self.stages)
        # Checked before anything of the state changes (1-bit Adam's fold, the error feedback, the
        # optimizer), with the losses' own all-reduce: every rank learns whether any rank holds a
        # gradient that is not finite.
        losses, bad_ranks = self._gather_losses(res.losses, self._non_finite())
        self._refuse_non_finite(losses, bad_ranks)
        fold = self.onebit_adam and _onebit.frozen(self.optimizer, self.warmup)
        if fold and self.shards is None:
            _onebit.fold_momentum(self.optimizer, [p for g in self.optimizer.param_groups for p in g["params"]])
        b0 = self.exchange.bytes_sent
        x0 = time.perf_counter()
        if self.shards is not None:  # ZeRO: each owner averages its piece, then folds it (1-bit Adam)
            self.copy_bytes_sent += self.shards.reduce(self.steps, self.exchange)
            if fold:
                _onebit.fold_momentum(self.optimizer, self.shards.params())
        experts = _experts.expert_ids(self.stages) if self._ep is not None else set()
        for bucket, (key_, m) in enumerate(sorted(self.stages.items()) if self.shards is None else []):
            ps = [p for p in m.parameters() if p.requires_grad and id(p) not in experts]
            if not ps:
                continue
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
            out = self.exchange.exchange(self.steps, bucket, flat)
            at = 0
            for p in ps:
                p.grad = out[at : at + p.numel()].view_as(p).clone()
                at += p.numel()
        if self._ep is not None:
            self._ep.exchange_grads(self.stages)
        x1 = time.perf_counter()
        self._pending = {
            "t0": t0, "pipeline_seconds": t1 - t0, "exchange_seconds": x1 - x0, "res": res,
            "gradient_bytes_sent": self.exchange.bytes_sent - b0, "losses": losses,
            "copy_bytes0": copy0, "param_bytes0": param0,
        }
        return sum(losses) / len(losses)

    def _local_grads(self) -> List[Tuple[str, torch.Tensor]]:
        """This rank's gradients by the user's keys (both of DualPipe's copies)."""
        return [(k, p.grad) for m in self.stages.values() for k, p in m.named_user_parameters() if p.grad is not None]

    def _non_finite(self) -> torch.Tensor:
        """1 where one of this rank's gradients holds inf or NaN, else 0 (on the device: no wait)."""
        checks = [torch.isfinite(g).all() for _, g in self._local_grads()]
        if not checks:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return (~torch.stack(checks).all()).to(torch.float64)

    def _refuse_non_finite(self, losses: List[float], bad_ranks: List[int]) -> None:
        """Raises ``FloatingPointError`` on every rank when a loss or a gradient of this step is not a
        finite number: the optimizer step is not taken, so the weights, the optimizer state and the
        error feedback stay those after the last good step."""
        step, M = self.steps + 1, self.micro_batches
        after = (f"training diverged; the optimizer step was not taken, so the state is the one after step "
                 f"{self.steps} (lower the learning rate, or check the data and loss_fn)")
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                replica, mb = divmod(i, M)
                where = f"micro-batch {mb} of replica {replica}" if self.world.replicas > 1 else f"micro-batch {mb}"
                raise FloatingPointError(f"step {step}: the loss of {where} is {loss!r}, not a finite number: {after}")
        if bad_ranks:
            here = ""
            if self.world.rank in bad_ranks:
                first = next((k for k, g in self._local_grads() if not bool(torch.isfinite(g).all())), None)
                here = f" (here: the gradient of {first})" if first else ""
            ranks = ", ".join(map(str, bad_ranks))
            raise FloatingPointError(
                f"step {step}: a gradient on rank {ranks}{here} holds a value that is not a finite number "
                f"(inf or NaN): {after}"
            )

    def _check_loss_is_scalar(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Run the whole model and ``loss_fn`` on shapes alone (the ``meta`` device: no memory, no
        arithmetic) for one micro-batch, so a loss that is not a scalar is refused on every rank
        before any rank waits on another. A model with an op that has no meta kernel skips this
        check; the last stage then refuses the loss during the pipeline."""
        from torch.func import functional_call

        try:
            out: Any = x.to("meta")
            for _, unit in self._layers.units:
                tensors = {n: torch.empty_like(t, device="meta") for n, t in unit.named_parameters()}
                tensors.update({n: torch.empty_like(t, device="meta") for n, t in unit.named_buffers()})
                out = functional_call(unit, tensors, (out,))
            loss = self.loss_fn(out, y.to("meta"))
        except Exception:  # noqa: BLE001 - an op without a meta kernel: leave it to the pipeline
            return
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(
                f"loss_fn returned {shape}, not a scalar tensor: reduce it (e.g. reduction='mean') so each "
                "micro-batch has one loss"
            )

    def _sum_copies(self) -> None:
        """DualPipe: each stage's two copies get the sum of both copies' gradients (ZeRO sums
        only the half each copy owns, in ``Shards.reduce``)."""
        if self.kind != "dualpipe" or self.shards is not None:
            return
        me, P = self.world.pipeline_rank, self.world.pipeline_ranks
        partner = P - 1 - me
        if partner == me:
            a, b = self.stages[(0, me)], self.stages[(1, me)]
            for pa, pb in zip(a.parameters(), b.parameters()):
                if pa.grad is not None:
                    total = pa.grad + pb.grad
                    pa.grad, pb.grad = total, total.clone()
            return
        mine = [self.stages[(0, me)], self.stages[(1, partner)]]
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
                          for m in mine for p in m.parameters() if p.requires_grad])
        other = exchange_copies(flat, self.world.global_rank(partner), self.world.rank, _COPY_TAG, self.timeout)
        self.copy_bytes_sent += flat.numel() * flat.element_size()
        # other = the partner's [(0, partner), (1, me)]; sum in direction order on both ranks
        n0 = sum(p.numel() for p in mine[0].parameters() if p.requires_grad)
        n_partner = other.numel() - n0  # the partner's (1, me) is as large as my (0, me)
        mine0, mine1 = flat[:n0], flat[n0:]
        their0, their1 = other[:n_partner], other[n_partner:]
        stage_me = mine0 + their1  # (0, me) + (1, me)
        stage_partner = their0 + mine1  # (0, partner) + (1, partner)
        for m, total in ((mine[0], stage_me), (mine[1], stage_partner)):
            at = 0
            for p in m.parameters():
                if p.requires_grad:
                    p.grad = total[at : at + p.numel()].view_as(p).clone()
                    at += p.numel()

    def _gather_losses(self, mine: Dict[int, float], non_finite: torch.Tensor) -> Tuple[List[float], List[int]]:
        """Every replica's micro-batch losses, and the ranks whose gradients are not finite (one
        all-reduce for both)."""
        w = self.world
        M = self.micro_batches
        n = M * w.replicas
        v = torch.zeros(n + w.size, dtype=torch.float64)
        for g, loss in mine.items():
            v[w.replica * M + g] = loss
        v = v.to(self.device)
        v[n + w.rank] = non_finite
        if w.size > 1:
            wait_for(dist.all_reduce(v, async_op=True), f"rank {w.rank}: the step's losses from every rank", self.timeout)
        v = v.cpu()
        bad = [r for r in range(w.size) if v[n + r] != 0]
        return v[:n].tolist(), bad

    def update_weights(self) -> None:
        """The optimizer step on this rank's stages (after :meth:`backward`)."""
        if not self._pending:
            raise RuntimeError("update_weights() comes after backward(loss) (or use step())")
        u0 = time.perf_counter()
        if self.onebit_adam and _onebit.frozen(self.optimizer, self.warmup):
            _onebit.frozen_step(self.optimizer, self.warmup)
        else:
            self.optimizer.step()
        if self.shards is not None:
            self.shards.gather(self.steps, self.exchange)
        p = self._pending
        end = time.perf_counter()
        res = p["res"]
        step_seconds = end - p["t0"]
        self._stats = {
            "step": self.steps,
            "step_seconds": step_seconds,
            "pipeline_seconds": p["pipeline_seconds"],
            "compute_seconds": res.compute_seconds,
            "bubble_ratio": res.wait_seconds / max(p["pipeline_seconds"], 1e-12),
            "message_wait_seconds": res.wait_seconds,
            "communication_overhead_ratio": p["exchange_seconds"] / max(step_seconds, 1e-12),
            "exchange_seconds": p["exchange_seconds"],
            "optimizer_seconds": end - u0,
            "gradient_bytes_sent": p["gradient_bytes_sent"],
            "gradient_bytes_sent_total": self.exchange.bytes_sent,
            "activation_bytes_sent": res.bytes_sent,
            "losses": p["losses"],
            "loss": sum(p["losses"]) / len(p["losses"]),
            "fb_seconds": list(res.fb_seconds),
            "ops": list(res.ops),
            "peak_activations": res.peak_activations,
            "peak_activation_bytes": res.peak_activation_bytes,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None,
            "zero": self.zero,
            "copy_bytes_sent": self.copy_bytes_sent - p["copy_bytes0"],
            "parameter_bytes_sent": self.shards.bytes_sent - p["param_bytes0"] if self.shards is not None else 0,
            **memory(self),
        }
        if self._eplb is not None:
            self._stats.update(self._eplb.after_step(self.optimizer, self.stages))
        self.steps += 1
        self._pending = {}
        self._mark_updated()
        if self.metrics is not None:
            self.metrics.observe(self._stats, self.plan.simulate()["bubble_ratio"])

    def stats(self) -> Dict[str, Any]:
        """The last step's measurements on this rank: ``step_seconds``; ``bubble_ratio`` (the
        share of the pipeline phase spent waiting for a message); ``communication_overhead_ratio``
        (the data-parallel exchange's share of the step); ``gradient_bytes_sent`` (this step) and
        ``gradient_bytes_sent_total``; ``activation_bytes_sent``; ``losses`` (every micro-batch of
        every replica); ``peak_activations`` (chunks alive at once, measured) beside
        ``peak_activations_simulated`` (the simulator's figure for this schedule and rank);
        ``peak_activation_bytes`` (bytes autograd saved for those chunks) and, on CUDA,
        ``peak_memory_bytes``; ``ops`` (this rank's measured timeline); ``parameter_bytes``,
        ``gradient_bytes`` and ``optimizer_state_bytes`` (this rank's, measured on its tensors after
        the step); ``copy_bytes_sent`` (DualPipe: gradients sent to the stage's other copy) and,
        under ZeRO, ``parameter_bytes_sent`` (the gathered weights). With ``eplb_interval``, from
        the first re-plan on: ``eplb_step``, ``eplb_balance_before`` and ``eplb_balance_after``
        (per MoE layer, the busiest replica's tokens over the mean, under the old and the new
        placement), ``eplb_moved_experts`` (slots that changed expert; ``_total`` so far) and
        ``eplb_tokens_per_expert``."""
        out = dict(self._stats)
        if out:
            sim = self.plan.simulate()
            out["peak_activations_simulated"] = sim["peak_activations_per_rank"][self.world.pipeline_rank]
            out["bubble_ratio_simulated"] = sim["bubble_ratio"]
        return out

    # -- the design documents' loop, over step() -------------------------------------------------

    @contextmanager
    def context(self) -> Iterator["DualPipeStrategy"]:
        """One step in the design documents' form::

            with s.context():
                out = s.forward(inputs)        # records the batch: nothing runs yet
                loss = s.compute_loss(out, labels)  # records the labels
                s.backward(loss)               # runs the whole pipeline: every micro-batch's
                                               # forward and backward in the schedule's order,
                                               # the copies summed, the data-parallel exchange
                s.update_weights()             # the optimizer step

        A pipeline cannot run a forward alone (stages wait on each other's backward), so
        ``forward`` and ``compute_loss`` only record; the work happens in ``backward``.
        """
        self._ctx: Dict[str, Any] = {}
        try:
            yield self
        finally:
            ctx, self._ctx = self._ctx, {}
            if ctx.get("backward") and not ctx.get("updated") and self._pending:
                raise RuntimeError("the step's context ended without update_weights(): call it after backward(loss)")

    def forward(self, inputs: torch.Tensor) -> Any:
        """Records this step's inputs (inside :meth:`context`); returns a handle for compute_loss."""
        if not hasattr(self, "_ctx"):
            raise RuntimeError("forward() runs inside `with strategy.context():` (or use step(inputs, labels))")
        self._ctx["inputs"] = inputs
        return self._ctx

    def compute_loss(self, out: Any, labels: torch.Tensor) -> PendingLoss:
        """Records the labels; the loss is computed on the last stage during :meth:`backward`."""
        if out is not getattr(self, "_ctx", None):
            raise RuntimeError("compute_loss(out, labels) takes what forward() returned in this context")
        self._ctx["labels"] = labels
        self._ctx["loss"] = PendingLoss()
        return self._ctx["loss"]

    def backward(self, loss: PendingLoss) -> None:
        """Runs the pipeline (forward and backward of every micro-batch) and the exchange."""
        ctx = getattr(self, "_ctx", {})
        if loss is not ctx.get("loss"):
            raise RuntimeError("backward(loss) takes what compute_loss() returned in this context")
        loss.value = self._forward_backward(ctx["inputs"], ctx["labels"])
        ctx["backward"] = True

    def _mark_updated(self) -> None:
        if getattr(self, "_ctx", None) is not None:
            self._ctx["updated"] = True

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """Writes a checkpoint to the new directory ``path`` (see ``_checkpoint``); every rank calls
        it. Refuses, on every rank and writing nothing, a ``path`` that exists (a link included:
        ``ValueError``) and state holding inf or NaN (``FloatingPointError`` naming the tensor)."""
        from ._checkpoint import save

        self._no_expert_checkpoints()
        save(self, path)

    def load(self, path: str) -> None:
        """Restores a checkpoint written by :meth:`save` on any grid shape; every rank calls it.
        A damaged checkpoint (a file missing or changed, an edited manifest, a value that is not
        finite), another model or another dtype raises the same ``ValueError`` on every rank, and
        nothing changes."""
        from ._checkpoint import load

        self._no_expert_checkpoints()
        load(self, path)

    def _no_expert_checkpoints(self) -> None:
        if self._ep is not None:
            raise ValueError(
                "checkpoints of sharded experts (expert_parallel > 1) are not supported yet: each replica holds "
                "other experts, and the writer keeps replica 0's; train without expert_parallel to checkpoint"
            )

    def close(self) -> None:
        """Stops the metrics endpoint (if any) and leaves the process group (if we joined it)."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if dist.is_initialized():
            dist.destroy_process_group()
