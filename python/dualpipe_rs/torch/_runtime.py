"""`schedule(...)`: our generated program loaded into torch's pipeline runtime for this rank."""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .. import _native

try:
    from torch.distributed.pipelining import schedules as _schedules
    from torch.distributed.pipelining.stage import _PipelineStageBase

    _Runtime = _schedules._PipelineScheduleRuntime
    _schedules._ComputationType.OVERLAP_F_B  # noqa: B018 - DualPipeV's overlapped pairs
except (ImportError, AttributeError) as e:  # pragma: no cover - depends on the torch build
    raise ImportError(
        "dualpipe_rs.torch needs torch.distributed.pipelining with its _PipelineScheduleRuntime and "
        f"OVERLAP_F_B actions (tested with torch 2.15, built with distributed support); this is torch "
        f"{torch.__version__}: upgrade with `pip install -U torch`"
    ) from e

#: The schedule kinds of ours that torch's runtime executes (one pipeline per step).
#: ``dualpipe`` is not among them: it runs two pipelines in opposite directions over two copies
#: of every stage, which torch's single-pipeline runtime cannot express (use ``dualpipev``).
TORCH_KINDS = ("gpipe", "1f1b", "zb1p", "interleaved", "dualpipev")

# Stages per rank each kind needs; None: any number from 2 (interleaved's virtual stages).
_LOCAL_STAGES = {"gpipe": 1, "1f1b": 1, "zb1p": 1, "interleaved": None, "dualpipev": 2}


def _as_stage_list(stages: Any) -> List[Any]:
    if isinstance(stages, _PipelineStageBase):
        return [stages]
    try:
        out = list(stages)
    except TypeError:
        raise TypeError(
            "stages must be this rank's PipelineStage objects (one, or a list of them), "
            f"not {type(stages).__name__}"
        ) from None
    if not out:
        raise ValueError("stages is empty: pass this rank's PipelineStage objects (one or more)")
    for i, s in enumerate(out):
        if not isinstance(s, _PipelineStageBase):
            raise TypeError(
                f"stages[{i}] is a {type(s).__name__}, not a torch.distributed.pipelining "
                "PipelineStage: wrap each module as PipelineStage(module, stage_index, num_stages, device)"
            )
    return out


def _check_kind(kind: Any) -> str:
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a schedule kind name (str), not {type(kind).__name__}")
    if kind == "dualpipe":
        raise ValueError(
            "dualpipe cannot run on torch's pipeline runtime: it drives two pipelines in opposite "
            "directions over two copies of every stage, and torch's runtime runs one; use "
            "'dualpipev' (the same schedule folded onto one copy of the model)"
        )
    if kind not in TORCH_KINDS:
        _native.schedule(kind, 2, 2)  # an unknown kind: raises our ValueError listing the kinds
        raise ValueError(f"kind '{kind}' cannot run on torch's runtime; choose one of {', '.join(TORCH_KINDS)}")
    return kind


# The binding names the settings by its own keyword arguments; this call names two of them
# otherwise.
_ARGUMENT_TERMS = (
    (r"\bmicro_batches=", "n_microbatches="),
    (r"\branks=", "a world size of "),
    (r"\bvirtual_stages=", "stages per rank: "),
)


def _in_python_terms(message: str) -> str:
    for argument, term in _ARGUMENT_TERMS:
        message = re.sub(argument, term, message)
    return message


def _plan(kind: str, stages: List[Any], n_microbatches: Any) -> Any:
    """Builds and validates our schedule for the stages' group, checking this rank's stages."""
    if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int):
        raise TypeError(f"n_microbatches must be an int, not {type(n_microbatches).__name__}")
    ranks = stages[0].group_size
    rank = stages[0].group_rank
    num_stages = stages[0].num_stages
    for i, s in enumerate(stages[1:], 1):
        if (s.group_size, s.group_rank, s.num_stages) != (ranks, rank, num_stages):
            raise ValueError(
                f"stages[{i}] belongs to another pipeline (rank {s.group_rank} of {s.group_size}, "
                f"{s.num_stages} stages) than stages[0] (rank {rank} of {ranks}, {num_stages} stages): "
                "pass only this rank's stages of one pipeline"
            )
    local = len(stages)
    want_local = _LOCAL_STAGES[kind]
    if want_local is None and local < 2:
        raise ValueError(
            f"interleaved needs at least 2 stages per rank (its virtual stages), got {local}: "
            "build this rank's PipelineStage for every stage it holds, or use '1f1b'"
        )
    if want_local is not None and local != want_local:
        raise ValueError(
            f"{kind} places {want_local} stage{'s' if want_local > 1 else ''} on each rank, got {local} "
            f"on rank {rank}: pass exactly {want_local} PipelineStage object{'s' if want_local > 1 else ''}"
            + (" (stages r and 2 x ranks - 1 - r)" if kind == "dualpipev" else "")
        )
    if num_stages != ranks * local:
        raise ValueError(
            f"{kind} on {ranks} ranks with {local} stage(s) each has {ranks * local} stages, but the "
            f"PipelineStage objects say num_stages={num_stages}: cut the model into {ranks * local} stages"
        )
    try:
        plan = _native.schedule(kind, ranks, n_microbatches, virtual_stages=local if kind == "interleaved" else None)
    except ValueError as e:
        raise ValueError(_in_python_terms(str(e))) from None
    want = [s for s, r in enumerate(plan.placement[0]) if r == rank]
    have = sorted(s.stage_index for s in stages)
    if have != want:
        raise ValueError(
            f"rank {rank} holds stages {have}, but {kind} on {ranks} ranks places stages {want} on it: "
            f"build this rank's PipelineStage objects for stages {want}"
        )
    return plan


def schedule(
    kind: str,
    stages: Any,
    n_microbatches: int,
    loss_fn: Optional[Callable[..., Any]] = None,
    **torch_kwargs: Any,
) -> Any:
    """A torch pipeline schedule for this rank, running our ``kind`` program.

    ``stages`` is this rank's ``PipelineStage`` object or list of them (one for ``gpipe``,
    ``1f1b`` and ``zb1p``; two, stages ``r`` and ``2 x ranks - 1 - r``, for ``dualpipev``; two or
    more, stages ``r``, ``r + ranks``, ..., for ``interleaved``). The ranks are the stages' process
    group. ``loss_fn`` and ``torch_kwargs`` (``scale_grads``, ``args_chunk_spec``, ...) go to
    torch's ``_PipelineScheduleRuntime``.

    We generate and validate the schedule first (completeness, dependencies, matched messages,
    no deadlock) and check the stages against its placement; a bad argument raises ``ValueError``
    saying what to change. The result is a ``_PipelineScheduleRuntime`` with our compute order
    loaded (torch adds its sends and receives); ``result.step(...)`` runs it as any torch
    schedule, and ``result.dualpipe_schedule`` is our :class:`dualpipe_rs.Schedule`.
    """
    kind = _check_kind(kind)
    stage_list = _as_stage_list(stages)
    plan = _plan(kind, stage_list, n_microbatches)
    runtime = _Runtime(stage_list, n_microbatches, loss_fn=loss_fn, **torch_kwargs)
    with tempfile.TemporaryDirectory(prefix="dualpipe-torch-") as tmp:
        path = os.path.join(tmp, f"{kind}.csv")
        with open(path, "w", newline="") as f:
            f.write(plan.to_torch_csv())
        runtime._load_csv(path, format="compute_only")
    runtime.dualpipe_schedule = plan
    return runtime


def torch_actions(runtime: Any, rank: Optional[int] = None, with_comms: bool = False) -> List[str]:
    """The actions torch's runtime executes on ``rank`` (this rank by default), as strings.

    Read from the program torch runs (``pipeline_order_with_comms``, after its own lowering).
    ``with_comms=False`` keeps the compute actions only, in order (``"0F3"``,
    ``"(0F7;7B3)OVERLAP_F_B"``), comparable with :attr:`dualpipe_rs.Schedule.actions`;
    ``with_comms=True`` keeps everything, sends and receives included.
    """
    r = runtime.rank if rank is None else rank
    program: Sequence[Any] = runtime.pipeline_order_with_comms[r]
    return [str(a) for a in program if a is not None and (with_comms or a.is_compute_op)]
