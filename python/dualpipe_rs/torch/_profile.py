"""`profile(...)`: a stage's F, B, I, W and FB times on a sample micro-batch; `predict(...)`: each
kind's simulated step from them."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

from .. import _native
from ._runtime import TORCH_KINDS


@dataclass(frozen=True)
class StageProfile:
    """Median seconds of one micro-batch through one module, measured as torch's runtime runs it.

    ``f``: the forward (and the loss, for a last stage); ``b``: the full backward (input and
    weight gradients together); ``i``: the input-gradient half of the split backward; ``w``: the
    weight-gradient half; ``fb``: an ``OVERLAP_F_B`` pair (one micro-batch's forward then
    another's full backward, which torch runs one after the other). ``samples`` holds every
    measured time in seconds, per op.
    """

    f: float
    b: float
    i: float
    w: float
    fb: float
    samples: Dict[str, List[float]] = field(default_factory=dict, repr=False)

    def cost(self, scale: float = 1.0, split: bool = False) -> Dict[str, float]:
        """The keywords of :func:`dualpipe_rs.simulate` (``f``, ``b``, ``w``, ``fb``), times ``scale``.

        The simulator's ``B`` is a full backward and its ``I`` is ``B - W``. For a schedule that
        splits the backward (``split=True``: zb1p, dualpipev) ``b`` is the measured ``i + w``, so
        its ``I`` and ``W`` cost what torch's split halves cost (more than ``b`` on small layers,
        where the split's bookkeeping dominates); otherwise ``b`` is the measured full backward
        and ``w`` (unused without ``W`` ops) is capped at it. ``fb`` is the measured pair, kept
        within ``[max(f, b), f + b]``, the range the simulator accepts.
        """
        if not scale > 0:
            raise ValueError(f"scale must be a positive number, got {scale}")
        b, w = (self.i + self.w, self.w) if split else (self.b, min(self.w, self.b))
        fb = min(max(self.fb, self.f, b), self.f + b)
        return {"f": self.f * scale, "b": b * scale, "w": w * scale, "fb": fb * scale}


def _as_args(sample: Any) -> Tuple[Any, ...]:
    return tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)


def _fresh_inputs(args: Sequence[Any]) -> List[Any]:
    """The sample's tensors as new leaves; floating ones require grad, as a received activation does."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a.detach().clone()
            if a.is_floating_point():
                a.requires_grad_(True)
        out.append(a)
    return out


class _Forward:
    """One forward of the sample, ready for the backward torch's runtime would run from it."""

    def __init__(self, module, args, loss_fn, target):
        self.inputs = _fresh_inputs(args)
        out = module(*self.inputs)
        if loss_fn is not None:
            out = loss_fn(out, target)
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        self.outputs = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
        if not self.outputs:
            raise ValueError(
                "the module's output does not require grad: profile a module with parameters "
                "(and, for a last stage, give loss_fn and target)"
            )
        # A last stage's backward starts from its loss, the others' from an output gradient.
        self.grads = None if loss_fn is not None else [torch.ones_like(t) for t in self.outputs]

    def backward(self):
        """The full backward (input and weight gradients), as the runtime's ``B``."""
        if self.grads is None:
            stage_backward(self.outputs[0], None, self.inputs)
        else:
            stage_backward(tuple(self.outputs), tuple(self.grads), self.inputs)

    def backward_input(self, module):
        """The input-gradient half (``I``); returns what the weight half (``W``) needs."""
        return stage_backward_input(self.outputs, self.grads, self.inputs, module.parameters())[1]


def _clock(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def profile(
    module: torch.nn.Module,
    sample: Any,
    *,
    loss_fn: Optional[Callable[..., Any]] = None,
    target: Any = None,
    repeats: int = 5,
    warmup: int = 1,
) -> StageProfile:
    """Measures ``module``'s F, B, I, W and FB times on ``sample`` (one micro-batch; a tensor or a
    tuple of the module's positional arguments), the median of ``repeats`` runs after ``warmup``.

    For a last stage pass ``loss_fn`` and ``target``: the forward then includes the loss and the
    backward starts from it; otherwise the backward starts from an all-ones output gradient. The
    backward halves are torch.distributed.pipelining's own (``stage_backward_input`` and
    ``stage_backward_weight``), as its runtime runs ``I`` and ``W``. Every run does three backward
    passes (``B``, ``I`` + ``W``, and the one in ``FB``), whose parameter gradients accumulate into
    ``module``'s ``.grad``: zero them afterwards if the module is then trained.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if (loss_fn is None) != (target is None):
        raise ValueError("loss_fn and target go together: give both for a last stage, neither otherwise")
    args = _as_args(sample)
    samples: Dict[str, List[float]] = {k: [] for k in ("f", "b", "i", "w", "fb")}
    for run in range(warmup + repeats):
        box: Dict[str, Any] = {}

        def forward():
            box["fwd"] = _Forward(module, args, loss_fn, target)

        t_f = _clock(forward)
        t_b = _clock(box["fwd"].backward)

        split = _Forward(module, args, loss_fn, target)

        def backward_input():
            box["groups"] = split.backward_input(module)

        t_i = _clock(backward_input)
        t_w = _clock(lambda: stage_backward_weight(module.parameters(), box["groups"]))

        pending = _Forward(module, args, loss_fn, target)

        def overlap():
            _Forward(module, args, loss_fn, target)
            pending.backward()

        t_fb = _clock(overlap)
        if run >= warmup:
            for k, v in zip(("f", "b", "i", "w", "fb"), (t_f, t_b, t_i, t_w, t_fb)):
                samples[k].append(v)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return StageProfile(samples=samples, **med)


def _stages_per_rank(kind: str, virtual_stages: int) -> int:
    return {"dualpipev": 2, "interleaved": virtual_stages}.get(kind, 1)


def predict(
    measured: StageProfile,
    ranks: int,
    micro_batches: int,
    *,
    kinds: Optional[Iterable[str]] = None,
    model_share: float = 1.0,
    virtual_stages: int = 2,
    **comm: Any,
) -> Dict[str, Dict[str, Any]]:
    """Each schedule kind's simulated step for a model of which ``measured`` profiled ``model_share``.

    ``measured`` is a :func:`profile` of a module holding ``model_share`` of the model's layers
    (1.0: the whole model). A kind that cuts the model into ``ranks x stages_per_rank`` stages
    (dualpipev 2 per rank, interleaved ``virtual_stages``, the others 1) is simulated with every
    time scaled to one stage's share, assuming the layers cost alike (``split`` of
    :meth:`StageProfile.cost` is set for the kinds with ``I`` and ``W`` ops). ``comm`` goes to
    :func:`dualpipe_rs.simulate` (``latency``, ``bandwidth``, ``message_bytes``, ...). Returns
    ``{kind: report}``, the report of :func:`dualpipe_rs.simulate` (``makespan`` in seconds,
    ``bubble_ratio``, ``peak_activations_per_rank``, ...); ``kinds`` defaults to
    :data:`TORCH_KINDS`.
    """
    if not (isinstance(model_share, (int, float)) and 0 < model_share <= 1):
        raise ValueError(f"model_share must be in (0, 1] (the share of the model profiled), got {model_share!r}")
    out = {}
    for kind in TORCH_KINDS if kinds is None else kinds:
        per_rank = _stages_per_rank(kind, virtual_stages)
        scale = 1.0 / (ranks * per_rank * model_share) if ranks > 0 else 1.0
        vs = virtual_stages if kind == "interleaved" else None
        plan = _native.schedule(kind, ranks, micro_batches, virtual_stages=vs)
        split = any(op["op"] in ("I", "W") for row in plan.compute_programs() for op in row)
        out[kind] = plan.simulate(**measured.cost(scale, split=split), **comm)
    return out
