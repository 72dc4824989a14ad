"""Train an nn.Sequential with DualPipeV from dualpipe's generator on torch's pipeline runtime.

Two gloo processes on this machine; rank r holds stages r and 3 - r of the 4-stage V.
    python python/examples/train_dualpipev.py
"""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage

import dualpipe_rs.torch as dpt

RANKS, MICRO_BATCHES, STEPS = 2, 6, 8


def train(rank):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(0)  # the same whole model in every process; each keeps its two stages
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(8)])
    n = 2 * RANKS
    stages = [PipelineStage(model[2 * s:2 * s + 2], s, n, torch.device("cpu")) for s in (rank, n - 1 - rank)]
    sched = dpt.schedule("dualpipev", stages, MICRO_BATCHES, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.Adam([p for s in stages for p in s.submod.parameters()], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(MICRO_BATCHES * 16, 64, generator=g)
    y = torch.tanh(x @ torch.randn(64, 64, generator=g) / 8)
    if rank == 0:
        print(sched.dualpipe_schedule)
        print("rank 0 runs:", " ".join(dpt.torch_actions(sched)))
    for step in range(STEPS):
        opt.zero_grad()
        losses = []
        sched.step(x, target=y, losses=losses) if rank == 0 else sched.step()  # rank 0 holds stages 0 and 3
        opt.step()
        if rank == 0:
            print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    mp.spawn(train, nprocs=RANKS)
