"""DualPipeStrategy under Slurm: one torchrun per node (deploy/slurm/torchrun.sbatch), every
process a rank of our DualPipe program over gloo; or, with ``--reference``, the same training in
one process (plain torch, the oracle of python/tests/test_torch_strategy.py).

    srun -N 2 --ntasks-per-node 1 python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id $SLURM_JOB_ID \\
        deploy/slurm/torch_strategy.py --out losses.json
    python deploy/slurm/torch_strategy.py --reference --out reference.json

Trains a small f64 model (8 blocks of Linear + Tanh, MSE, AdamW) for ``--steps`` steps on
seeded batches; rank 0 (or the reference) writes the per-step losses as JSON, with the world's
shape and the node each rank ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
from torch import nn

WIDTH, BLOCKS, ROWS = 8, 8, 2


def build_model() -> nn.Sequential:
    """The same model in every process and in the reference."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(BLOCKS)]).double()


def batches(steps: int, rows: int):
    """Every step's global batch (inputs, targets)."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, WIDTH, generator=g, dtype=torch.float64),
             torch.randn(rows, WIDTH, generator=g, dtype=torch.float64)) for _ in range(steps)]


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def reference(steps: int, micro_batches: int) -> list[float]:
    """Single-process training: each step's mean loss over its micro-batches."""
    model = build_model()
    opt = adamw(model.parameters())
    losses = []
    for x, y in batches(steps, micro_batches * ROWS):
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            loss = nn.functional.mse_loss(model(xm), ym)
            (loss / micro_batches).backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total / micro_batches)
    return losses


def distributed(steps: int, micro_batches: int, schedule: str) -> tuple[list[float], dict]:
    """This process's rank of DualPipeStrategy under torchrun; the losses and the world."""
    import torch.distributed as dist

    import dualpipe_rs.torch as dpt

    s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule=schedule, micro_batches=micro_batches)
    losses = [s.step(x, y) for x, y in batches(steps, micro_batches * ROWS)]
    w = s.world
    hosts = [None] * w.size
    dist.all_gather_object(hosts, os.environ.get("SLURMD_NODENAME", socket.gethostname()))
    world = {"processes": w.size, "pipeline_ranks": w.pipeline_ranks, "replicas": w.replicas,
             "schedule": s.kind, "nodes_by_rank": hosts, "rank": w.rank}
    s.close()
    return losses, world


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=10)
    ap.add_argument("--schedule", default="dualpipe")
    ap.add_argument("--reference", action="store_true", help="train in this one process instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.reference:
        doc = {"losses": reference(args.steps, args.micro_batches), "processes": 1}
    else:
        losses, world = distributed(args.steps, args.micro_batches, args.schedule)
        if world.pop("rank") != 0:
            return
        doc = {"losses": losses, **world}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
