#!/usr/bin/env python3
"""Time DeepSeek's reference DualPipe on CPU, for comparison with `dualpipe train`.

Runs the reference implementation (a checkout of deepseek-ai/DualPipe, which is never part of
this repository) with PyTorch's gloo backend: one process per rank, one thread each. Every
stage is the reference example's block: Linear(h, 4h, no bias) -> GELU -> Linear(4h, h, no
bias), with the weight gradient deferred to the zero-bubble W pass, and an MSE loss.

Usage:
    pip install torch
    python3 scripts/dualpipe_reference_bench.py --dualpipe /path/to/DualPipe \
        --ranks 4 --micro-batches 8 --micro-batch-size 128 --hidden 128 512

Prints one line per hidden size with the median milliseconds per step, or JSON with --json,
two ways: the pipeline (`DualPipe.step()`: forward, backward and communication) and the whole
training step, which adds what training needs after it and the reference leaves to its user:
each stage's gradient summed with its copy's (a rank holds stages r and ranks-1-r, so every
stage lives on two ranks; one all-reduce per pair of ranks) and PyTorch's AdamW (fused where
this PyTorch has it). The same shapes with our runtime:

    dualpipe train --model mlp --ranks 4 --micro-batches 8 --micro-batch-size 128 --hidden 128 \
        --layers-per-stage 1 --steps 20 --format json

The reference is written for CUDA; this script points its device checks and receive buffers at
the CPU before it runs (no file of the checkout is changed).
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage_ids(rank, ranks):
    """The stages rank `rank` holds, in the order of its two local modules: stage `rank` of
    direction 0, then stage `ranks - 1 - rank` of direction 1."""
    return (rank, ranks - 1 - rank)


def pair_groups(dist, ranks):
    """One process group per pair of ranks (r, ranks - 1 - r), the two that hold the same two
    stages; every rank creates all of them, in the same order."""
    return [dist.new_group([r, ranks - 1 - r]) for r in range(ranks // 2)]


def sum_copies(torch, dist, local, rank, ranks, groups):
    """Adds each stage's gradients to those of its copy on the paired rank, so that both
    copies take the same update: one all-reduce of the rank's gradients, ordered by stage."""
    ids = stage_ids(rank, ranks)
    grads = [p.grad for i in sorted(range(2), key=lambda i: ids[i]) for p in local[i].parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=groups[min(ids)])
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def adamw(torch, params):
    """PyTorch's AdamW, its fused CPU kernel where this version has one."""
    try:
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=1e-3)


def make_stage_class(torch, weight_grad_store):
    """The benchmark's pipeline stage, with the weight gradient deferrable to W."""
    fn = torch.nn.functional

    class SplitLinear(torch.autograd.Function):
        """y = x W^T; the backward returns dL/dx at once and queues dL/dW when W is deferred."""

        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight)
            return fn.linear(x, weight)

        @staticmethod
        def backward(ctx, grad_y):
            x, weight = ctx.saved_tensors

            def accumulate():
                g = grad_y.reshape(-1, grad_y.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
                if weight.grad is None:
                    weight.grad = g
                else:
                    weight.grad += g

            if weight_grad_store.enabled:
                weight_grad_store.put(accumulate)
            else:
                accumulate()
            return grad_y @ weight, None

    class Block(torch.nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.up = torch.nn.Parameter(torch.empty(4 * hidden, hidden))
            self.down = torch.nn.Parameter(torch.empty(hidden, 4 * hidden))
            torch.nn.init.kaiming_uniform_(self.up, a=5 ** 0.5)
            torch.nn.init.kaiming_uniform_(self.down, a=5 ** 0.5)

        def forward(self, x):
            return SplitLinear.apply(fn.gelu(SplitLinear.apply(x, self.up)), self.down)

        @classmethod
        def overlapped_forward_backward(
            cls, module0, inputs0, criterion0, labels0, module1, loss1, outputs1, output_grads1
        ):
            # CPU has nothing to overlap: the forward of one chunk, then the backward of the other.
            from dualpipe.utils import run_backward

            out0 = module0(*inputs0)
            out0 = [out0] if isinstance(out0, torch.Tensor) else out0
            loss0 = criterion0(*out0, *labels0) if criterion0 is not None else None
            if loss1 is not None:
                loss1.backward()
                loss1.detach_()
            else:
                run_backward(outputs1, output_grads1)
            return out0, loss0

    return Block


def worker(rank, args, port, hidden, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    sys.path.insert(0, args.dualpipe)
    import dualpipe
    import dualpipe.comm as comm
    from dualpipe.utils import WeightGradStore

    # Point the CUDA-only parts of the reference at the CPU.
    torch.cuda.current_device = lambda: "cpu"
    comm.build_from_tensor_shapes = lambda: [
        torch.empty(s, dtype=comm.TENSOR_DTYPE, requires_grad=True) for s in comm.TENSOR_SHAPES
    ]

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)

    ranks, mbs, rows = args.ranks, args.micro_batches, args.micro_batch_size
    Block = make_stage_class(torch, WeightGradStore)
    # Rank r holds stage r of direction 0 and stage ranks-1-r of direction 1.
    model = [Block(hidden) for _ in range(ranks)]
    local = torch.nn.Sequential(Block(hidden), Block(hidden))
    local[0].load_state_dict(model[rank].state_dict())
    local[1].load_state_dict(model[ranks - 1 - rank].state_dict())
    pipe = dualpipe.DualPipe(local)
    dualpipe.set_p2p_tensor_shapes([(rows, hidden)])
    dualpipe.set_p2p_tensor_dtype(torch.float32)

    x = torch.randn(mbs * rows, hidden)
    target = torch.randn(mbs * rows, hidden)
    first, last = rank == 0, rank == ranks - 1
    inputs, labels = None, None
    if first:
        inputs, labels = x.chunk(2)[0], target.chunk(2)[1]
    elif last:
        inputs, labels = x.chunk(2)[1], target.chunk(2)[0]

    def criterion(out, label):
        return torch.nn.functional.mse_loss(out, label)

    groups = pair_groups(dist, ranks)
    optimizer = adamw(torch, local.parameters())
    times, whole = [], []
    for step in range(args.warmup + args.steps):
        for p in pipe.parameters():
            p.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        pipe.step(inputs, num_chunks=mbs, criterion=criterion, labels=(labels,))
        dist.barrier()
        t1 = time.perf_counter()
        sum_copies(torch, dist, local, rank, ranks, groups)
        optimizer.step()
        dist.barrier()
        if step >= args.warmup:
            times.append(t1 - t0)
            whole.append(time.perf_counter() - t0)
    if rank == 0:
        queue.put((times, whole))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dualpipe", required=True, help="path to a checkout of deepseek-ai/DualPipe")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=128, help="rows per micro-batch")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if not os.path.isdir(os.path.join(args.dualpipe, "dualpipe")):
        sys.exit(f"error: {args.dualpipe} has no dualpipe/ package: pass a checkout of deepseek-ai/DualPipe (--dualpipe)")
    if args.ranks % 2 or args.micro_batches % 2 or args.micro_batches < 2 * args.ranks:
        sys.exit("error: DualPipe needs an even --ranks and an even --micro-batches of at least 2 x ranks")
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("error: PyTorch is missing: pip install torch")

    results = []
    for hidden in args.hidden:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(worker, args=(args, free_port(), hidden, queue), nprocs=args.ranks, start_method="spawn")
        times, whole = queue.get()
        results.append({
            "hidden": hidden,
            "ms_per_step_median": 1e3 * statistics.median(times),
            "ms_per_step_min": 1e3 * min(times),
            "whole_ms_per_step_median": 1e3 * statistics.median(whole),
            "whole_ms_per_step_min": 1e3 * min(whole),
            "steps": len(times),
        })
    config = {"ranks": args.ranks, "micro_batches": args.micro_batches, "micro_batch_size": args.micro_batch_size}
    if args.json:
        print(json.dumps({"implementation": "deepseek-ai/DualPipe (PyTorch, gloo, CPU)", **config, "results": results}, indent=2))
    else:
        print(f"reference DualPipe on CPU (gloo, {args.ranks} processes x 1 thread), "
              f"{args.micro_batches} micro-batches x {args.micro_batch_size} rows")
        for r in results:
            print(f"  hidden {r['hidden']:>5}: pipeline {r['ms_per_step_median']:8.1f} ms/step (median of {r['steps']}, "
                  f"min {r['ms_per_step_min']:.1f}); whole step {r['whole_ms_per_step_median']:8.1f} ms "
                  f"(min {r['whole_ms_per_step_min']:.1f})")


if __name__ == "__main__":
    main()
