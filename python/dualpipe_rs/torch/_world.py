"""The process grid from torchrun: pipeline ranks x data-parallel replicas, device and backend."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """Where this process sits: global ``rank`` = ``replica * pipeline_ranks + pipeline_rank``
    (the layout of the Rust runtime: a replica's pipeline ranks are consecutive)."""

    rank: int
    size: int
    pipeline_ranks: int
    replicas: int
    local_rank: int

    @property
    def pipeline_rank(self) -> int:
        """This process's rank within its replica's pipeline."""
        return self.rank % self.pipeline_ranks

    @property
    def replica(self) -> int:
        """This process's data-parallel replica."""
        return self.rank // self.pipeline_ranks

    def global_rank(self, pipeline_rank: int, replica: Optional[int] = None) -> int:
        """The global rank of ``pipeline_rank`` in ``replica`` (this one by default)."""
        return (self.replica if replica is None else replica) * self.pipeline_ranks + pipeline_rank


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"the environment variable {name}={raw!r} is not an integer (torchrun sets it)") from None


def world_from_env(pipeline_stages: Optional[int]) -> World:
    """The grid from ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (one process when unset)."""
    size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", rank)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={size} do not describe a process: launch with torchrun")
    if pipeline_stages is None:
        pipeline_stages = size
    if isinstance(pipeline_stages, bool) or not isinstance(pipeline_stages, int):
        raise TypeError(f"pipeline_stages must be an int (pipeline ranks per replica), not {type(pipeline_stages).__name__}")
    if pipeline_stages < 1:
        raise ValueError(f"pipeline_stages must be at least 1, got {pipeline_stages}")
    if size % pipeline_stages:
        raise ValueError(
            f"WORLD_SIZE={size} is not pipeline_stages={pipeline_stages} times a number of data-parallel "
            f"replicas: launch {pipeline_stages} x replicas processes (torchrun --nproc_per_node) or set "
            f"pipeline_stages to a divisor of {size}"
        )
    return World(rank, size, pipeline_stages, size // pipeline_stages, local)


def cuda_device(local_rank: int, count: int) -> torch.device:
    """This process's GPU, ``cuda:LOCAL_RANK``; NCCL runs one rank per GPU, so a node with fewer
    GPUs than processes is refused with what to launch instead."""
    if local_rank >= count:
        raise ValueError(
            f"LOCAL_RANK={local_rank}, but this node has {count} CUDA device{'s' if count != 1 else ''}: NCCL runs "
            f"one process per GPU (it refuses two ranks on one device), so launch at most {count} process"
            f"{'es' if count != 1 else ''} per node (torchrun --nproc_per_node {count}), or keep the model on the "
            f"CPU to run over gloo"
        )
    return torch.device("cuda", local_rank)


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def init(world: World, device: torch.device, timeout: float) -> None:
    """Joins the default process group (unless the program already did) with the device's backend."""
    if world.size == 1:
        return
    backend = backend_for(device)
    if dist.is_initialized():
        have = dist.get_backend()
        if backend not in str(have):
            raise ValueError(
                f"the process group uses {have}, but the model is on {device.type}, which needs {backend}: "
                f"init_process_group(backend='{backend}') or leave it to DualPipeStrategy"
            )
        return
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ValueError(f"{name} is not set: launch with torchrun, which sets it")
    dist.init_process_group(backend=backend, rank=world.rank, world_size=world.size, timeout=timedelta(seconds=timeout))
