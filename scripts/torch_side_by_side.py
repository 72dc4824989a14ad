#!/usr/bin/env python3
"""DualPipe on torch, side by side in one run: DeepSeek's ``dualpipe.py`` against our
``DualPipeStrategy``, and torch's ``ScheduleDualPipeV`` against our ``dualpipev``.

    python scripts/torch_side_by_side.py [--ranks 4] [--hidden 256] [--rows 32] [--micro-batches 16] [--steps 6]

Run it plainly: it starts itself under torchrun (``--ranks`` gloo processes on this machine).
Needs dualpipe-rs (``pip install ./python``), torch and DeepSeek's package (``pip install
dualpipe``, PyPI); DeepSeek's code asks for
CUDA, so this script points its two device checks at the CPU (nothing else of it changes).

The model is their example's: stages of two linear layers (Linear, GELU, Linear), f64, an MSE
loss; DualPipe cuts it into ``--ranks`` stages (two copies on every rank), DualPipeV into
``2 x --ranks`` stages of half the size. Every contender runs the same micro-batches of the same
batches from the same initial weights. Checked first: per-micro-batch losses and every
stage's gradients (DualPipe: the two copies summed) equal between DeepSeek's and ours, and
between torch's and ours, within 1e-10. Then timed: the median over ``--steps`` steps (after one
warm-up) of the slowest rank's wall time for one step's forward and backward of every
micro-batch (the pipeline; for us also the copies' sum, which DeepSeek leaves to its user),
each step started together behind a barrier; and the same plus what completes the step's
gradients: DualPipe's copies summed (DeepSeek leaves it to its user: done here over the same
point-to-point exchange ours uses) and, for us, the losses gathered on every rank (torch's
DualPipeV has one copy and returns its losses on the last stage only). Rank 0 prints the table,
with where our time goes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

MODEL_SEED = 0


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rows", type=int, default=32, help="rows per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    return ap.parse_args()


def main() -> None:
    args = parse()
    if "RANK" not in os.environ:  # start ourselves under torchrun
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.ranks),
               os.path.abspath(__file__)] + sys.argv[1:]
        sys.exit(subprocess.call(cmd, env=env))
    run(args)


def run(args) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import dualpipe as ds  # DeepSeek's
    import dualpipe.comm as ds_comm
    import dualpipe_rs.torch as dpt

    torch.set_num_threads(1)
    # DeepSeek's code asserts its modules sit on the current CUDA device and allocates its receive
    # buffers on "cuda": point both at the CPU for this gloo run.
    torch.cuda.current_device = lambda: "cpu"
    ds_comm.build_from_tensor_shapes = lambda: [
        torch.empty(s, dtype=ds_comm.TENSOR_DTYPE, device="cpu", requires_grad=True) for s in ds_comm.TENSOR_SHAPES
    ]

    dist.init_process_group("gloo")
    rank, N = dist.get_rank(), dist.get_world_size()
    H, R, M = args.hidden, args.rows, args.micro_batches
    dtype = torch.float64

    class TwoLinear(nn.Module):
        """Their example's stage: two linear layers."""

        def __init__(self, hidden: int):
            super().__init__()
            self.linear1 = nn.Linear(hidden, hidden)
            self.linear2 = nn.Linear(hidden, hidden)

        def forward(self, x):
            return self.linear2(nn.functional.gelu(self.linear1(x)))

    def blocks(n: int) -> nn.Sequential:
        torch.manual_seed(MODEL_SEED)
        return nn.Sequential(*[TwoLinear(H) for _ in range(n)]).to(dtype)

    def batch(step: int):
        g = torch.Generator().manual_seed(1000 + step)
        return torch.randn(M * R, H, generator=g, dtype=dtype), torch.randn(M * R, H, generator=g, dtype=dtype)

    def mse(out, y):
        return nn.functional.mse_loss(out, y)

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def gather_grads(named):
        """{stage: {name: grad}} of every rank, on rank 0, summing copies of the same stage."""
        objs = [None] * N
        dist.all_gather_object(objs, named)
        total = {}
        for part in objs:
            for k, g in part.items():
                total[k] = total[k] + g if k in total else g
        return total

    def gather_losses(losses):
        objs = [None] * N
        dist.all_gather_object(objs, losses)
        out = {}
        for part in objs:
            out.update(part)
        return out

    results = {}

    # -- DeepSeek's DualPipe: rank r holds stages r and N-1-r, each of 2 blocks -----------------
    per = 2
    full = blocks(N * per)
    stage = lambda s: nn.Sequential(*full[s * per : (s + 1) * per])  # noqa: E731
    ds_model = ds.DualPipe((stage(rank), stage(N - 1 - rank)))
    ds_comm.set_p2p_tensor_shapes([(R, H)])
    ds_comm.set_p2p_tensor_dtype(dtype)

    def ds_step(step: int):
        x, y = batch(step)
        half = M // 2 * R
        for p in ds_model.parameters():
            p.grad = None
        # their loss is summed over micro-batches; ours is the mean: divide by M for the same gradients
        crit = lambda out, lab: mse(out, lab) / M  # noqa: E731
        if rank == 0:
            loss, _ = ds_model.step(x[:half], num_chunks=M, criterion=crit, labels=(y[half:],))
        elif rank == N - 1:
            loss, _ = ds_model.step(x[half:], num_chunks=M, criterion=crit, labels=(y[:half],))
        else:
            loss, _ = ds_model.step(num_chunks=M)
        return loss

    from dualpipe_rs.torch._dp import exchange_copies

    def ds_sum_copies():
        """What DeepSeek leaves to its user: each stage's two copies get the sum of their gradients
        (here over the same point-to-point exchange our strategy uses)."""
        partner = N - 1 - rank
        mine = [p for m in ds_model.module for p in m.parameters()]
        flat = torch.cat([p.grad.reshape(-1) for p in mine])
        other = exchange_copies(flat, partner, rank, 1 << 26, 60.0)
        half = flat.numel() // 2  # both copies hold stages of the same size
        total = torch.cat([flat[:half] + other[half:], other[:half] + flat[half:]])
        at = 0
        for p in mine:
            p.grad = total[at : at + p.numel()].view_as(p).clone()
            at += p.numel()

    ds_times, ds_pipe = [], []
    for step in range(args.steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        loss = ds_step(step)
        t_pipe = slowest(time.perf_counter() - t0)
        ds_sum_copies()
        t = slowest(time.perf_counter() - t0)
        if step > 0:
            ds_pipe.append(t_pipe)
        if step == 0:
            # rank 0's losses are direction 1's (the second half), the last rank's direction 0's
            mine = {}
            if loss is not None:
                first = M // 2 if rank == 0 else 0
                mine = {first + i: float(v) * M for i, v in enumerate(loss.detach().reshape(-1))}
            ds_losses = gather_losses(mine)
            named = {}
            for copy, s in ((0, rank),):  # the copies hold their sum now: one of each stage
                for k, p in ds_model.module[copy].named_parameters():
                    named[f"{s * per + int(k.split('.')[0])}.{k.split('.', 1)[1]}"] = p.grad.detach().clone()
            ds_grads = gather_grads(named)
        else:
            ds_times.append(t)
    results["DeepSeek dualpipe.py (DualPipe)"] = ds_times
    pipeline_only = {"DeepSeek dualpipe.py (DualPipe)": ds_pipe}

    # -- ours, DualPipe -------------------------------------------------------------------------
    def ours(kind, n_blocks, partition=None, eager_sends=True):
        s = dpt.DualPipeStrategy(blocks(n_blocks), torch.optim.SGD, mse, schedule=kind, micro_batches=M,
                                 optimizer_kwargs={"lr": 0.0}, partition=partition, eager_sends=eager_sends)
        times, parts, pipes = [], [], []
        grads = losses = None
        for step in range(args.steps + 1):
            x, y = batch(step)
            dist.barrier()
            t0 = time.perf_counter()
            s._forward_backward(x, y)
            t = time.perf_counter() - t0
            st = s._pending
            res = st["res"]
            t_pipe = slowest(st["pipeline_seconds"])
            t = slowest(t)
            if step == 0:
                losses = dict(enumerate(st["losses"]))
                named = {}
                for (d, _), m in s.stages.items():
                    if d == 0:
                        for k, p in m.named_user_parameters():
                            named[k] = p.grad.detach().clone()
                grads = gather_grads(named)
            else:
                times.append(t)
                pipes.append(t_pipe)
                parts.append((res.compute_seconds, res.wait_seconds, res.fb_seconds, st["pipeline_seconds"]))
            s.update_weights()  # lr 0: the weights stay, so every step times the same work
        return s, times, grads, losses, parts, pipes

    s, times, our_grads, our_losses, parts, pipes = ours("dualpipe", N * per, partition=[per] * N)
    results["ours DualPipeStrategy(schedule='dualpipe')"] = times
    pipeline_only["ours DualPipeStrategy(schedule='dualpipe')"] = pipes
    our_parts = parts

    # the same without sending early: what the FB pair's overlap of the message with the backward gains
    _, times_late, late_grads, _, _, pipes_late = ours("dualpipe", N * per, partition=[per] * N, eager_sends=False)
    results["ours, eager_sends=False"] = times_late
    pipeline_only["ours, eager_sends=False"] = pipes_late

    def max_diff(a, b):
        return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-300)) for k in b)

    # -- torch's ScheduleDualPipeV and ours on 2N stages of one block ------------------------------
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    fullv = blocks(2 * N)
    ids = [rank, 2 * N - 1 - rank]
    stages = [PipelineStage(fullv[i], i, 2 * N, torch.device("cpu")) for i in ids]
    sched = ScheduleDualPipeV(stages, M, loss_fn=mse)
    tv_times = []
    for step in range(args.steps + 1):
        x, y = batch(step)
        for st_ in stages:
            st_.submod.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        losses = []
        if rank == 0:
            sched.step(x, target=y, losses=losses)
        else:
            sched.step(target=y, losses=losses)
        t = slowest(time.perf_counter() - t0)
        if step == 0:
            tv_losses = gather_losses({i: float(v) for i, v in enumerate(losses)})
            named = {}
            for i in ids:
                for k, p in fullv[i].named_parameters():
                    named[f"{i}.{k}"] = p.grad.detach().clone()  # torch scales by 1 / M (scale_grads)
            tv_grads = gather_grads(named)
        else:
            tv_times.append(t)
    results["torch ScheduleDualPipeV"] = tv_times
    sv, v_times, v_grads, v_losses, _, v_pipes = ours("dualpipev", 2 * N)
    pipeline_only["torch ScheduleDualPipeV"] = tv_times
    pipeline_only["ours DualPipeStrategy(schedule='dualpipev')"] = v_pipes
    results["ours DualPipeStrategy(schedule='dualpipev')"] = v_times

    if rank == 0:
        ds_loss_diff = max(abs(ds_losses[k] - our_losses[k]) / abs(our_losses[k]) for k in our_losses)
        tv_loss_diff = max(abs(tv_losses[k] - v_losses[k]) / abs(v_losses[k]) for k in v_losses)
        print(f"machine: {N} gloo processes, f64, hidden {H}, {R} rows per micro-batch, {M} micro-batches, "
              f"{args.steps} timed steps")
        print(f"DeepSeek vs ours (dualpipe): max relative difference of losses {ds_loss_diff:.1e}, "
              f"of gradients {max_diff(ds_grads, our_grads):.1e}")
        print(f"torch vs ours (dualpipev):   max relative difference of losses {tv_loss_diff:.1e}, "
              f"of gradients {max_diff(tv_grads, v_grads):.1e}")
        assert ds_loss_diff < 1e-10 and max_diff(ds_grads, our_grads) < 1e-10, "DeepSeek's and ours disagree"
        assert tv_loss_diff < 1e-10 and max_diff(tv_grads, v_grads) < 1e-10, "torch's and ours disagree"
        print()
        print("| contender | pipeline: median (s) | ratio | + copies' sum and losses: median (s) | ratio |")
        print("|---|---:|---:|---:|---:|")
        pairs = [("DeepSeek dualpipe.py (DualPipe)", "ours DualPipeStrategy(schedule='dualpipe')", "ours, eager_sends=False"),
                 ("torch ScheduleDualPipeV", "ours DualPipeStrategy(schedule='dualpipev')")]
        for ref, *us in pairs:
            r1, r2 = statistics.median(pipeline_only[ref]), statistics.median(results[ref])
            for name in (ref, *us):
                m1, m2 = statistics.median(pipeline_only[name]), statistics.median(results[name])
                q1 = "1.00 (reference)" if name == ref else f"{m1 / r1:.2f} x"
                q2 = "1.00 (reference)" if name == ref else f"{m2 / r2:.2f} x"
                print(f"| {name} | {m1:.4f} | {q1} | {m2:.4f} | {q2} |")
        mid = sorted(our_parts, key=lambda p: p[3])[len(our_parts) // 2]  # the median step
        comp, wait, fb, pipe = mid
        print()
        print(f"where our dualpipe time goes (rank 0, its median step): pipeline {pipe:.4f} s = compute {comp:.4f} s "
              f"+ waiting for messages {wait:.4f} s + the executor's own work {max(pipe - comp - wait, 0):.4f} s; "
              f"{len(fb)} FB pairs, median {statistics.median(fb) if fb else 0:.5f} s each; after the pipeline, the "
              f"copies' sum and the losses' all-reduce")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
