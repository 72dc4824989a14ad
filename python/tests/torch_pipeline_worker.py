"""Runs our schedules on torch's pipeline runtime in `--world` gloo processes on loopback.

Used by test_torch_pipeline.py (run as a script, so torch.distributed never touches the pytest
process): every process builds the same f64 model (an ``nn.Sequential`` of Linear+Tanh blocks),
keeps its stages of each case's schedule, runs one ``step`` through
``dualpipe_rs.torch.schedule`` and saves its parameter gradients, the actions torch executes and
our schedule's actions into ``--out``; rank 0 also records the error messages of bad calls.

    python torch_pipeline_worker.py --world 2 --out DIR --case 1f1b:4 --case interleaved:4:3
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

BLOCKS, WIDTH, ROWS_PER_MB = 24, 8, 3


def build_model() -> nn.Sequential:
    """The whole model, the same in every process (and in the single-process oracle)."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(BLOCKS)]).double()


def batch(micro_batches: int):
    """The step's inputs and targets: ``micro_batches x ROWS_PER_MB`` rows."""
    g = torch.Generator().manual_seed(7)
    rows = micro_batches * ROWS_PER_MB
    x = torch.randn(rows, WIDTH, generator=g, dtype=torch.float64)
    y = torch.randn(rows, WIDTH, generator=g, dtype=torch.float64)
    return x, y


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target)


def stage_blocks(stage: int, num_stages: int) -> range:
    per = BLOCKS // num_stages
    return range(stage * per, (stage + 1) * per)


def local_stage_ids(kind: str, rank: int, ranks: int, local: int):
    if kind == "dualpipev":
        return [rank, 2 * ranks - 1 - rank]
    return [rank + v * ranks for v in range(local)]


def make_stages(model, kind, rank, ranks, local, ids=None):
    from torch.distributed.pipelining import PipelineStage

    num_stages = ranks * local
    stages = []
    for s in ids if ids is not None else local_stage_ids(kind, rank, ranks, local):
        blocks = stage_blocks(s, num_stages)
        module = nn.Sequential(*[model[b] for b in blocks])
        stages.append(PipelineStage(module, s, num_stages, torch.device("cpu")))
    return stages


def run_case(rank, ranks, kind, micro_batches, local, out_dir):
    import dualpipe_rs.torch as dpt

    model = build_model()
    stages = make_stages(model, kind, rank, ranks, local)
    sched = dpt.schedule(kind, stages, micro_batches, loss_fn=loss_fn)
    ours = sched.dualpipe_schedule.actions[rank]
    theirs = dpt.torch_actions(sched)
    x, y = batch(micro_batches)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    losses = [] if holds_last else None
    args = (x,) if holds_first else ()
    sched.step(*args, target=y if holds_last else None, losses=losses)
    grads = {}
    for s in stages:
        for b, block in zip(stage_blocks(s.stage_index, ranks * local), s.submod):
            for name, p in block.named_parameters():
                grads[f"{b}.{name}"] = p.grad.clone()
    torch_own = None
    if kind == "dualpipev" and micro_batches >= ranks * local:  # where torch's own accepts the count
        from torch.distributed.pipelining import ScheduleDualPipeV

        torch_own = dpt.torch_actions(ScheduleDualPipeV(stages, n_microbatches=micro_batches, loss_fn=loss_fn))
    torch.save(
        {
            "torch_own": torch_own,
            "grads": grads,
            "ours": ours,
            "torch": theirs,
            "torch_with_comms": dpt.torch_actions(sched, with_comms=True),
            "losses": [float(v.detach()) for v in losses] if losses is not None else None,
        },
        os.path.join(out_dir, f"{kind}-{ranks}x{micro_batches}-v{local}-rank{rank}.pt"),
    )
    dist.barrier()


def bad_calls(rank, ranks):
    """Error messages of calls that must fail before torch sees them (no communication)."""
    import dualpipe_rs.torch as dpt

    model = build_model()
    out = {}

    def record(name, fn):
        try:
            fn()
            out[name] = None
        except (ValueError, TypeError) as e:
            out[name] = f"{type(e).__name__}: {e}"

    dv = make_stages(model, "dualpipev", rank, ranks, 2)
    one = make_stages(model, "1f1b", rank, ranks, 1)
    record("dualpipe", lambda: dpt.schedule("dualpipe", dv, 4, loss_fn=loss_fn))
    record("unknown_kind", lambda: dpt.schedule("zigzag", dv, 4, loss_fn=loss_fn))
    record("one_stage_dualpipev", lambda: dpt.schedule("dualpipev", one, 4, loss_fn=loss_fn))
    record("two_stages_1f1b", lambda: dpt.schedule("1f1b", dv, 4, loss_fn=loss_fn))
    record("zero_microbatches", lambda: dpt.schedule("dualpipev", dv, 0, loss_fn=loss_fn))
    record("float_microbatches", lambda: dpt.schedule("dualpipev", dv, 4.0, loss_fn=loss_fn))
    wrong = make_stages(model, "interleaved", rank, ranks, 2, ids=[rank, 2 * ranks - 1 - rank])
    record("wrong_stages", lambda: dpt.schedule("interleaved", wrong, 4, loss_fn=loss_fn))
    record("not_stages", lambda: dpt.schedule("1f1b", [model], 4, loss_fn=loss_fn))
    record("one_stage_interleaved", lambda: dpt.schedule("interleaved", one, 4, loss_fn=loss_fn))
    try:
        from torch.distributed.pipelining import ScheduleDualPipeV

        ScheduleDualPipeV(dv, n_microbatches=2 * ranks - 1, loss_fn=loss_fn)
        out["torch_dualpipev_below_stages"] = None
    except ValueError as e:
        out["torch_dualpipev_below_stages"] = str(e)
    return out


def worker(rank, ranks, port, cases, out_dir):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        for kind, mbs, local in cases:
            run_case(rank, ranks, kind, mbs, local, out_dir)
        if rank == 0:
            with open(os.path.join(out_dir, f"errors-{ranks}.json"), "w") as f:
                json.dump(bad_calls(rank, ranks), f)
    finally:
        dist.destroy_process_group()


def parse_case(text):
    kind, mbs, *local = text.split(":")
    default_local = {"dualpipev": 2, "interleaved": 2}.get(kind, 1)
    return kind, int(mbs), int(local[0]) if local else default_local


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", action="append", required=True, help="kind:micro_batches[:stages_per_rank]")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cases = [parse_case(c) for c in args.case]
    mp.spawn(worker, args=(args.world, port, cases, args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
