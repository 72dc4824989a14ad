"""Runs ``DualPipeStrategy`` with ``zero=0|1|2`` in the processes torchrun started; used by
test_torch_zero.py.

    torchrun --nproc_per_node 4 torch_zero_worker.py --out DIR --suite exact

Each case writes, per rank, ``<case>-rank<r>.pt``: the per-step losses, the final weights by
the user's keys, the last step's ``stats()`` and what the memory formula needs (the sizes of
this rank's stage copies, the copies per stage, the replicas). Suites: ``exact`` (every ZeRO
level on dualpipe, dualpipev and 1f1b, 2 replicas, f64; checkpoints moved between levels,
replica counts and schedules; compression), ``memory`` (optimizer-state bytes at the grid
torchrun gives, f32 and bf16), ``errors`` (a bad ``zero``).
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

import dualpipe_rs.torch as dpt
from torch_strategy_worker import ROWS, adamw, batches, build_model, replica_rows, run_suite


def params_of(s):
    return {f"{d}:{k}": p.detach().clone() for (d, _), m in sorted(s.stages.items()) for k, p in m.named_user_parameters()}


def train(s, data):
    return [s.step(replica_rows(x, s), replica_rows(y, s)) for x, y in data]


def save(out, name, s, **extra):
    st = {k: v for k, v in s.stats().items() if k != "ops"}
    sizes = {(d, st_): [p.numel() for p in m.parameters() if p.requires_grad] for (d, st_), m in s.stages.items()}
    data = {"stats": st, "params": params_of(s), "sizes": sizes, "copies": len(s.plan.placement),
            "replicas": s.world.replicas, "replica": s.world.replica, "zero": s.zero}
    data.update(extra)
    torch.save(data, os.path.join(out, f"{name}-rank{s.world.rank}.pt"))


def strategy(kind, zero, stages=2, micro=4, **kw):
    return dpt.DualPipeStrategy(kw.pop("model", None) or build_model(), adamw, nn.MSELoss, schedule=kind,
                                pipeline_stages=stages, micro_batches=micro, zero=zero, **kw)


def suite_exact(out, world):
    data = batches(5, 2 * 4 * ROWS)
    # every level, three schedules, pipeline 2 x 2 replicas
    for kind in ("dualpipe", "dualpipev", "1f1b"):
        for zero in (0, 1, 2):
            s = strategy(kind, zero)
            save(out, f"exact-{kind}-{zero}", s, losses=train(s, data))
    # uneven pieces: stages of 3 blocks of 5 x 5 + 5 (90 values: halves of 45, shards of 23 and 22)
    for zero in (0, 2):
        s = strategy("dualpipe", zero, model=build_model(5, 6))
        save(out, f"exact-uneven-{zero}", s, losses=train(s, batches(3, 2 * 4 * ROWS, 5)))
    # interleaved (two stages per rank), and SGD with momentum from a factory (another state)
    for zero in (0, 2):
        s = strategy("interleaved", zero)
        save(out, f"exact-interleaved-{zero}", s, losses=train(s, data))
        s = dpt.DualPipeStrategy(build_model(), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), nn.MSELoss,
                                 schedule="1f1b", pipeline_stages=2, micro_batches=4, zero=zero)
        train(s, data[:3])
        s.save(os.path.join(out, f"ckpt-sgd-{zero}"))
        save(out, f"exact-sgd-{zero}", s, losses=train(s, data[3:]))
    # the custom-model example's transformer (embedding, positions, attention, norms), f64
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from torch_strategy_train import TinyGPT, batch

    for zero in (0, 1):
        torch.manual_seed(0)
        gpt = TinyGPT(16, 16, 2, 4, 8).double()
        loss_fn = lambda o, y: nn.functional.cross_entropy(o.reshape(-1, 16), y.reshape(-1))  # noqa: E731
        s = dpt.DualPipeStrategy((gpt, "blocks"), adamw, loss_fn, schedule="dualpipe", pipeline_stages=2,
                                 micro_batches=4, zero=zero)
        save(out, f"exact-gpt-{zero}", s, losses=[s.step(*batch(i, 8, 8, 16, s.world.replica)) for i in range(3)])
    # checkpoints: zero=1 DualPipe 2 x 2 saves after 3 steps; 2 more steps straight on, and resumed
    # at another level, replica count and schedule
    ckpt = os.path.join(out, "ckpt-z1")
    s = strategy("dualpipe", 1)
    train(s, data[:3])
    s.save(ckpt)
    save(out, "ckpt-straight", s, losses=train(s, data[3:]))
    for name, kind, zero, stages in (("same", "dualpipe", 1, 2), ("z0", "dualpipe", 0, 2),
                                     ("z2-dualpipev", "dualpipev", 2, 2), ("z2-zb1p-1replica", "zb1p", 2, 4),
                                     ("z1-1f1b-4replicas", "1f1b", 1, 1)):
        r = strategy(kind, zero, stages=stages, micro=8 // (4 // stages) if stages > 1 else 2)
        r.load(ckpt)
        save(out, f"ckpt-{name}", r, losses=train(r, data[3:]))
    # and a zero=0 checkpoint resumed at zero=2
    s = strategy("1f1b", 0)
    train(s, data[:3])
    s.save(os.path.join(out, "ckpt-z0"))
    save(out, "ckpt0-straight", s, losses=train(s, data[3:]))
    r = strategy("dualpipe", 2)
    r.load(os.path.join(out, "ckpt-z0"))
    save(out, "ckpt0-z2", r, losses=train(r, data[3:]))
    # compression: f32, 64 wide, bytes and quality at every level; 1-bit with ZeRO resumes bit-identical
    wide = batches(6, 2 * 4 * ROWS, 64, torch.float32)
    for kind in ("1f1b", "dualpipe"):
        for comp in (None, "int8", "1bit"):
            for zero in (0, 1, 2):
                s = strategy(kind, zero, model=build_model(64, 4, torch.float32), compression=comp, compression_warmup=1)
                losses, sent = [], []
                for x, y in wide:
                    losses.append(s.step(replica_rows(x, s), replica_rows(y, s)))
                    st = s.stats()
                    sent.append((st["gradient_bytes_sent"], st["copy_bytes_sent"], st["parameter_bytes_sent"]))
                save(out, f"comp-{kind}-{comp}-{zero}", s, losses=losses, sent=sent)
    s = strategy("dualpipe", 1, model=build_model(64, 4, torch.float32), compression="1bit")
    for x, y in wide[:3]:
        s.step(replica_rows(x, s), replica_rows(y, s))
    s.save(os.path.join(out, "ckpt-1bit"))
    save(out, "ckpt-1bit-straight", s, losses=[s.step(replica_rows(x, s), replica_rows(y, s)) for x, y in wide[3:]])
    r = strategy("dualpipe", 1, model=build_model(64, 4, torch.float32), compression="1bit")
    r.load(os.path.join(out, "ckpt-1bit"))
    save(out, "ckpt-1bit-resumed", r, losses=[r.step(replica_rows(x, r), replica_rows(y, r)) for x, y in wide[3:]])


def suite_memory(out, world):
    """Memory after two steps at every level, f32 and bf16, on the grids
    ``pipeline 2 x world/2`` (dualpipe, dualpipev) and, at 4 processes, ``pipeline 1 x 4``."""
    grids = [("dualpipe", 2), ("dualpipev", 2)] + ([("dualpipev", 1)] if world == 4 else [])
    for kind, stages in grids:
        for dtype in (torch.float32, torch.bfloat16):
            for zero in (0, 1, 2):
                micro = 4 if stages == 2 else 2
                # 5 wide, 6 blocks: stages of 90 or 60 values, split unevenly (and across tensors)
                s = strategy(kind, zero, stages=stages, micro=micro, model=build_model(5, 6, dtype))
                rows = micro * ROWS * (world // stages)
                train(s, batches(2, rows, 5, dtype))
                save(out, f"mem{world}-{kind}-{stages}-{str(dtype)[6:]}-{zero}", s)


def suite_errors(out, world):
    import json

    errors = {}
    for bad in (3, -1, "1", True, None):
        try:
            strategy("1f1b", bad)
            errors[repr(bad)] = "no error"
        except (ValueError, TypeError) as e:
            errors[repr(bad)] = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, f"errors-rank{int(os.environ['RANK'])}.json"), "w") as f:
        json.dump(errors, f)


if __name__ == "__main__":
    sys.exit(run_suite(globals()))
