"""Runs ``DualPipeStrategy`` cases in the processes torchrun started; used by test_torch_strategy.py.

    torchrun --nproc_per_node 4 torch_strategy_worker.py --out DIR --suite parity

Each case trains a small model (f64 unless said) for a few steps and writes, per rank,
``<case>-rank<r>.pt``: the per-step losses, the first step's gradients (after the copies' sum
and the data-parallel exchange) and the final parameters, by the user's ``state_dict`` keys.
The test compares them with single-process training of the same model on the same batches.
Suites: ``parity`` (every schedule), ``grid`` (data parallelism, compression, checkpoints,
partitions), ``errors`` (bad input, recorded by every rank), ``kill`` (rank 1 dies mid-job).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

import dualpipe_rs.torch as dpt

WIDTH, BLOCKS, ROWS = 8, 8, 2


def build_model(width: int = WIDTH, blocks: int = BLOCKS, dtype=torch.float64) -> nn.Sequential:
    """The same model in every process and in the single-process oracle."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(blocks)]).to(dtype)


def batches(steps: int, rows: int, width: int = WIDTH, dtype=torch.float64):
    """Every step's global batch (inputs, targets)."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, width, generator=g, dtype=dtype), torch.randn(rows, width, generator=g, dtype=dtype))
            for _ in range(steps)]


def replica_rows(x: torch.Tensor, s: "dpt.DualPipeStrategy") -> torch.Tensor:
    """This replica's share of a global batch: consecutive blocks of rows."""
    return x.chunk(s.world.replicas)[s.world.replica]


def train(s, data, grads_at: int = 0):
    """Runs every step (the first through the context API); returns losses and first-step grads."""
    losses, grads = [], {}
    for i, (x, y) in enumerate(data):
        x, y = replica_rows(x, s), replica_rows(y, s)
        if i == grads_at:
            with s.context():
                out = s.forward(x)
                loss = s.compute_loss(out, y)
                s.backward(loss)
                for (d, _), m in sorted(s.stages.items()):
                    for key, p in m.named_user_parameters():
                        grads[f"{d}:{key}"] = p.grad.detach().clone()
                s.update_weights()
            losses.append(loss.item())
        else:
            losses.append(s.step(x, y))
    return losses, grads


def params_of(s):
    return {f"{d}:{k}": p.detach().clone() for (d, _), m in sorted(s.stages.items()) for k, p in m.named_user_parameters()}


def save(out, name, s, **extra):
    data = {"stats": {k: v for k, v in s.stats().items() if k != "ops"}, "params": params_of(s), "partition": s.partition}
    data.update(extra)
    torch.save(data, os.path.join(out, f"{name}-rank{s.world.rank}.pt"))


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def suite_parity(out, world):
    kinds = ["dualpipe", "dualpipev", "1f1b", "zb1p", "gpipe", "interleaved"]
    for kind in kinds:
        M = 2 * world if kind != "dualpipe" else 2 * world + 2
        s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule=kind, micro_batches=M)
        losses, grads = train(s, batches(3, M * ROWS))
        save(out, f"{kind}-{world}", s, losses=losses, grads=grads, micro_batches=M)
    # Prometheus metrics: each rank serves its own on port + rank
    port = int(os.environ.get("DUALPIPE_TEST_METRICS_PORT", "0"))
    if port and world == 2:
        import urllib.request

        s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="1f1b", micro_batches=4, metrics_port=port)
        train(s, batches(2, 4 * ROWS))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port + s.world.rank}/metrics", timeout=10).read().decode()
        with open(os.path.join(out, f"metrics-rank{s.world.rank}.txt"), "w") as f:
            f.write(text)
        s.metrics.close()
    # DeepSeek's overlapped forward-backward hook on the stage's single layer
    s = dpt.DualPipeStrategy(hooked_model(world), adamw, nn.MSELoss, schedule="dualpipe", micro_batches=2 * world)
    losses, grads = train(s, batches(2, 2 * world * ROWS))
    save(out, f"hooked-{world}", s, losses=losses, grads=grads, micro_batches=2 * world, hook_calls=HookedBlock.calls)


class HookedBlock(nn.Module):
    """A block defining DeepSeek's ``overlapped_forward_backward`` (counted; forward then backward)."""

    calls = 0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.tanh(self.lin(x))

    @classmethod
    def overlapped_forward_backward(cls, module0, inputs0, criterion0, labels0, module1, loss1, outputs1, output_grads1):
        cls.calls += 1
        out0 = module0(*inputs0)
        loss0 = criterion0(out0, *labels0) if criterion0 is not None else None
        if loss1 is not None:
            loss1.backward()
        else:
            torch.autograd.backward(outputs1, output_grads1)
        return out0, loss0


def hooked_model(blocks: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[HookedBlock() for _ in range(blocks)]).double()


def suite_grid(out, world):
    # pipeline 2 x data-parallel 2, exact, against one replica with twice the micro-batches
    for kind in ("dualpipe", "1f1b"):
        s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule=kind, pipeline_stages=2, micro_batches=4)
        losses, grads = train(s, batches(3, 2 * 4 * ROWS))
        save(out, f"dp-{kind}", s, losses=losses, grads=grads, micro_batches=4)
    # DualPipe's copies summed across ranks when the stages differ in size
    s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="dualpipe", pipeline_stages=2, micro_batches=4,
                             partition=[3, 5])
    losses, grads = train(s, batches(3, 2 * 4 * ROWS))
    save(out, "dp-dualpipe-uneven", s, losses=losses, grads=grads, micro_batches=4)
    # compression: f32, wider, bytes counted against the uncompressed exchange
    for comp in (None, "bf16", "int8", "1bit"):
        s = dpt.DualPipeStrategy(build_model(64, 4, torch.float32), adamw, nn.MSELoss, schedule="1f1b",
                                 pipeline_stages=2, micro_batches=4, compression=comp, compression_warmup=1)
        data = batches(4, 2 * 4 * ROWS, 64, torch.float32)
        per_step = []
        losses = []
        for x, y in data:
            losses.append(s.step(replica_rows(x, s), replica_rows(y, s)))
            per_step.append(s.stats()["gradient_bytes_sent"])
        save(out, f"comp-{comp}", s, losses=losses, bytes=per_step, onebit_adam=s.onebit_adam)
    # checkpoints: 3 steps, save, 2 more; a fresh strategy loads and repeats the 2 (bit-identical)
    ckpt = os.path.join(out, "ckpt")
    data = batches(5, 2 * 4 * ROWS)
    for comp in (None, "1bit"):
        s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="dualpipe", pipeline_stages=2,
                                 micro_batches=4, compression=comp)
        train(s, data[:3])
        s.save(f"{ckpt}-{comp}")
        after, _ = train(s, data[3:])
        save(out, f"ckpt-{comp}-straight", s, losses=after)
        r = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="dualpipe", pipeline_stages=2,
                                 micro_batches=4, compression=comp)
        r.load(f"{ckpt}-{comp}")
        again, _ = train(r, data[3:])
        save(out, f"ckpt-{comp}-resumed", r, losses=again)
    # resume on another shape: 4 pipeline ranks x 1 replica, zb1p, then dualpipev
    for kind, stages in (("zb1p", 4), ("dualpipev", 2)):
        r = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule=kind, pipeline_stages=stages,
                                 micro_batches=8 // (4 // stages))
        r.load(f"{ckpt}-None")
        again, _ = train(r, [(x, y) for x, y in data[3:]])
        save(out, f"ckpt-reshaped-{kind}", r, losses=again)
    # an explicit and a planned partition
    s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="1f1b", micro_batches=4, partition=[1, 2, 3, 2])
    losses, _ = train(s, batches(2, 4 * ROWS))
    save(out, "partition-explicit", s, losses=losses)
    s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="1f1b", micro_batches=4, partition="plan",
                             sample=torch.randn(ROWS, WIDTH, dtype=torch.float64))
    losses, _ = train(s, batches(2, 4 * ROWS))
    save(out, "partition-plan", s, losses=losses)


def suite_errors(out, world):
    """Bad input: each raises in our words on every rank, before any process waits."""
    import json

    model = build_model()
    cases = {
        "stages": lambda: dpt.DualPipeStrategy(build_model(blocks=1), adamw, nn.MSELoss, schedule="1f1b"),
        "world": lambda: dpt.DualPipeStrategy(model, adamw, nn.MSELoss, pipeline_stages=3),
        "schedule": lambda: dpt.DualPipeStrategy(model, adamw, nn.MSELoss, schedule="zigzag"),
        "compression": lambda: dpt.DualPipeStrategy(model, adamw, nn.MSELoss, compression="2bit"),
        "micro_batches": lambda: dpt.DualPipeStrategy(model, adamw, nn.MSELoss, micro_batches=3),
        "optimizer": lambda: dpt.DualPipeStrategy(model, "adam", nn.MSELoss),
        "loss_fn": lambda: dpt.DualPipeStrategy(model, adamw, 3),
        "partition": lambda: dpt.DualPipeStrategy(model, adamw, nn.MSELoss, schedule="1f1b", partition=[4, 4, 1, 1]),
        "not_sequential": lambda: dpt.DualPipeStrategy(nn.Linear(2, 2), adamw, nn.MSELoss),
        "blocks_name": lambda: dpt.DualPipeStrategy(nn.Module(), adamw, nn.MSELoss, blocks="layers"),
    }
    errors = {}
    for name, make in cases.items():
        t0 = time.perf_counter()
        try:
            make()
            errors[name] = "no error"
        except (ValueError, TypeError) as e:
            errors[name] = f"{type(e).__name__}: {e}"
        errors[name + "_seconds"] = time.perf_counter() - t0
    # step-time errors (the strategy is built; the checks run before the pipeline)
    s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="1f1b", micro_batches=4)
    for name, call in {
        "batch": lambda: s.step(torch.zeros(7, WIDTH, dtype=torch.float64), torch.zeros(7, WIDTH, dtype=torch.float64)),
        "labels": lambda: s.step(torch.zeros(8, WIDTH, dtype=torch.float64), [1, 2]),
    }.items():
        try:
            call()
            errors[name] = "no error"
        except (ValueError, TypeError) as e:
            errors[name] = f"{type(e).__name__}: {e}"
    s2 = dpt.DualPipeStrategy(build_model(), adamw, lambda out, y: (out - y) ** 2, schedule="1f1b", micro_batches=4)
    try:
        s2.step(torch.zeros(8, WIDTH, dtype=torch.float64), torch.zeros(8, WIDTH, dtype=torch.float64))
        errors["scalar"] = "no error"
    except (ValueError, TypeError) as e:
        errors["scalar"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # the other ranks see the last rank's failure as a failed peer
        errors["scalar"] = f"peer: {type(e).__name__}"
    with open(os.path.join(out, f"errors-rank{int(os.environ['RANK'])}.json"), "w") as f:
        json.dump(errors, f)
    os._exit(0)  # a rank whose peer failed mid-step cannot leave the process group cleanly


def suite_kill(out, world):
    s = dpt.DualPipeStrategy(build_model(), adamw, nn.MSELoss, schedule="dualpipe", micro_batches=2 * world, timeout=60)
    for i, (x, y) in enumerate(batches(50, 2 * world * ROWS)):
        if i == 2 and s.world.rank == 1:
            os._exit(17)  # killed
        s.step(x, y)


def run_suite(suites: dict) -> None:
    """Runs the ``suite_<name>`` function of ``suites`` that ``--suite`` names, writing to ``--out``."""
    names = sorted(k[len("suite_"):] for k in suites if k.startswith("suite_"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--suite", required=True, choices=names)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    suites[f"suite_{args.suite}"](args.out, world)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main() -> None:
    run_suite(globals())


if __name__ == "__main__":
    sys.exit(main())
