#!/usr/bin/env python3
"""Train an nn.Sequential with our DualPipeV on torch's pipeline runtime, next to torch's own.

Two gloo processes on loopback (``--ranks``), each holding two stages of the V placement (rank r:
stages r and 2 x ranks - 1 - r). The same model (same initial weights) is trained twice, step by
step in turn: once by ``dualpipe_rs.torch.schedule("dualpipev", ...)`` (our generator's program on
torch's ``_PipelineScheduleRuntime``), once by torch's ``ScheduleDualPipeV``. Before training,
``dualpipe_rs.torch.profile`` measures one stage and ``predict`` simulates every kind's step.
Prints each step's loss and time for both, the medians, and the load average. Last, a
micro-batch count below the stage count, which ours runs and torch's refuses.

    python python/examples/torch_dualpipev.py [--ranks 2] [--steps 12] [--micro-batches 8]

Needs torch (``pip install torch --index-url https://download.pytorch.org/whl/cpu``).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WIDTH, BLOCKS, ROWS = 256, 8, 32  # ROWS per micro-batch


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(BLOCKS)])


def make_batch(micro_batches: int):
    """The training set, one batch of ``micro_batches x ROWS`` rows, fitted by every step:
    y = sin(x @ A), A and x fixed."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(WIDTH, WIDTH, generator=g) / WIDTH**0.5
    x = torch.randn(micro_batches * ROWS, WIDTH, generator=g)
    return x, torch.sin(x @ a)


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target)


def v_stages(model, rank, ranks):
    """This rank's two stages of the V placement, each a PipelineStage over its blocks."""
    from torch.distributed.pipelining import PipelineStage

    n = 2 * ranks
    per = BLOCKS // n
    return [PipelineStage(model[s * per:(s + 1) * per], s, n, torch.device("cpu")) for s in (rank, n - 1 - rank)]


def timed_step(sched, stages, opt, x, y):
    """One training step (zero grads, step, Adam update); returns (seconds, mean loss or None)."""
    dist.barrier()
    start = time.perf_counter()
    opt.zero_grad()
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses = [] if last else None
    sched.step(*((x,) if first else ()), target=y if last else None, losses=losses)
    opt.step()
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank ends
    loss = torch.tensor([statistics.fmean(float(v.detach()) for v in losses) if last else 0.0])
    dist.all_reduce(loss)  # only the rank with the last stage contributes
    return took.item(), loss.item()


def worker(rank, ranks, port, args):
    import dualpipe_rs.torch as dpt
    from torch.distributed.pipelining import ScheduleDualPipeV

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    mbs = args.micro_batches
    say = print if rank == 0 else (lambda *a, **k: None)

    # Simulation before the run: profile one stage (a 1/(2 x ranks) share), predict each kind.
    model = make_model()
    x, y = make_batch(1)
    per = BLOCKS // (2 * ranks)
    prof = dpt.profile(model[:per], x, repeats=5)
    say(f"profile of one stage ({per} blocks, one micro-batch of {ROWS} rows): "
        f"F {prof.f * 1e3:.2f} ms, B {prof.b * 1e3:.2f} ms, I {prof.i * 1e3:.2f} ms, "
        f"W {prof.w * 1e3:.2f} ms, FB {prof.fb * 1e3:.2f} ms")
    predicted = dpt.predict(prof, ranks, mbs, model_share=per / BLOCKS)
    say("predicted step (simulator, from the profile): " + ", ".join(
        f"{k} {r['makespan'] * 1e3:.1f} ms (bubble {r['bubble_ratio']:.2f})" for k, r in predicted.items()))

    ours_model, torch_model = make_model(), make_model()
    ours_stages, torch_stages = v_stages(ours_model, rank, ranks), v_stages(torch_model, rank, ranks)
    ours = dpt.schedule("dualpipev", ours_stages, mbs, loss_fn=loss_fn)
    theirs = ScheduleDualPipeV(torch_stages, n_microbatches=mbs, loss_fn=loss_fn)
    same = dpt.torch_actions(ours) == dpt.torch_actions(theirs)
    say(f"dualpipev, {ranks} ranks, {mbs} micro-batches: our program and torch's ScheduleDualPipeV "
        f"{'execute the same actions' if same else 'execute different action orders'} on rank 0")
    opts = [torch.optim.Adam(m.parameters(), lr=args.lr) for m in (ours_model, torch_model)]
    times = {"ours": [], "torch": []}
    say(f"{'step':>4} | {'loss (ours)':>11} | {'loss (torch)':>12} | {'ms (ours)':>9} | {'ms (torch)':>10}")
    x, y = make_batch(mbs)
    for step in range(args.steps):
        t_ours, l_ours = timed_step(ours, ours_stages, opts[0], x, y)
        t_theirs, l_theirs = timed_step(theirs, torch_stages, opts[1], x, y)
        if step >= args.warmup:
            times["ours"].append(t_ours)
            times["torch"].append(t_theirs)
        say(f"{step:>4} | {l_ours:>11.6f} | {l_theirs:>12.6f} | {t_ours * 1e3:>9.1f} | {t_theirs * 1e3:>10.1f}")
    mo, mt = statistics.median(times["ours"]), statistics.median(times["torch"])
    say(f"median step over {len(times['ours'])} steps after {args.warmup} warm-up: ours {mo * 1e3:.1f} ms, "
        f"torch's ScheduleDualPipeV {mt * 1e3:.1f} ms (ours / torch {mo / mt:.2f}); "
        f"predicted {predicted['dualpipev']['makespan'] * 1e3:.1f} ms; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    few = 2 * ranks - 1
    small_model = make_model()
    small_stages = v_stages(small_model, rank, ranks)
    small = dpt.schedule("dualpipev", small_stages, few, loss_fn=loss_fn)
    x, y = make_batch(few)
    t_small, l_small = timed_step(small, small_stages, torch.optim.Adam(small_model.parameters(), lr=args.lr), x, y)
    say(f"{few} micro-batches: ours runs (loss {l_small:.6f}, {t_small * 1e3:.1f} ms); torch's says: ", end="")
    try:
        ScheduleDualPipeV(v_stages(make_model(), rank, ranks), n_microbatches=few, loss_fn=loss_fn)
        say("accepted")
    except ValueError as e:
        say(f"ValueError: {e}")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    if BLOCKS % (2 * args.ranks):
        ap.error(f"--ranks {args.ranks}: {BLOCKS} blocks do not split into {2 * args.ranks} stages; use 1, 2 or 4")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f} before the run")
    mp.spawn(worker, args=(args.ranks, port, args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
