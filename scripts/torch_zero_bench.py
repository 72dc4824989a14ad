"""Step time, bytes per step, optimizer-state bytes and quality of ``DualPipeStrategy`` at
``zero=0|1|2``, with and without compression, on gloo (CPU processes).

    python scripts/torch_zero_bench.py [--nproc 4] [--width 512] [--steps 12] [--quality-steps 150]
    python scripts/torch_zero_bench.py --memory --nproc 8     # the memory table only

Launches torchrun (pipeline 2 x nproc/2 replicas, f32, a ``4 x Linear(width, width) + Tanh``
model) once; every rank writes its figures, and this script prints two markdown tables:

1. per schedule (1F1B, DualPipe), compression (none, int8, 1bit) and ZeRO level: the median
   step time over ``--steps`` steps after 3 warm-up steps (the slowest rank's), what a rank
   sends per step (to the other replicas: reduce-scatter and gather; to DualPipe's other copy),
   and the largest rank's optimizer-state bytes;
2. quality: a teacher network's regression (each step's batch is new, its loss taken before
   the update, so the loss is on unseen data), 1F1B, the mean loss of the last 20 steps of
   ``--quality-steps`` steps, seeds 0-2, at every compression and ZeRO level (1-bit Adam after
   ``--onebit-warmup`` uncompressed steps; ``--quality-only``: this table alone).

``--memory``: instead, per rank after 2 steps, parameter, gradient and optimizer-state bytes
(measured by ``stats()``) of a 4-block 16-wide model, DualPipe and DualPipeV, f32 and bf16,
``zero`` 0/1/2, pipeline 2 x nproc/2 replicas: the largest rank's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def memory_worker(out: str) -> None:
    import torch
    from torch import nn

    import dualpipe_rs.torch as dpt

    torch.set_num_threads(1)
    rows = []
    for kind in ("dualpipe", "dualpipev"):
        for dtype in (torch.float32, torch.bfloat16):
            for zero in (0, 1, 2):
                torch.manual_seed(0)
                m = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)]).to(dtype)
                s = dpt.DualPipeStrategy(m, torch.optim.AdamW, nn.MSELoss, schedule=kind, pipeline_stages=2,
                                         micro_batches=4, zero=zero)
                for _ in range(2):
                    s.step(torch.randn(8, 16, dtype=dtype), torch.randn(8, 16, dtype=dtype))
                st = s.stats()
                rows.append({"kind": kind, "dtype": str(dtype)[6:], "zero": zero,
                             **{k: st[k] for k in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes")}})
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"memory": rows, "replicas": s.world.replicas}, f)


def memory_table(out: str, nproc: int) -> None:
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(nproc)]
    D = ranks[0]["replicas"]
    for i, row in enumerate(ranks[0]["memory"]):
        figs = [max(r["memory"][i][k] for r in ranks) for k in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes")]
        print(f"| {row['kind']} | {row['dtype']} | {D} | {row['zero']} | " + " | ".join(f"{v:,}" for v in figs) + " |")


def worker(out: str, width: int, steps: int, quality_steps: int, onebit_warmup: int) -> None:
    import torch
    from torch import nn

    import dualpipe_rs.torch as dpt

    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    D = world // 2
    micro = 4
    rows = 8 * micro

    def model(seed: int, w: int):
        torch.manual_seed(seed)
        return nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.Tanh()) for _ in range(4)])

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)

    results = {"timing": [], "quality": []}
    for kind in ("1f1b", "dualpipe") if steps else ():
        for comp in (None, "int8", "1bit"):
            for zero in (0, 1, 2):
                s = dpt.DualPipeStrategy(model(0, width), adamw, nn.MSELoss, schedule=kind, pipeline_stages=2,
                                         micro_batches=micro, compression=comp, compression_warmup=1, zero=zero)
                g = torch.Generator().manual_seed(1 + s.world.replica)
                x, y = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
                times, sent = [], []
                for i in range(3 + steps):
                    s.step(x, y)
                    st = s.stats()
                    if i >= 3:
                        times.append(st["step_seconds"])
                        sent.append((st["gradient_bytes_sent"] + st["parameter_bytes_sent"], st["copy_bytes_sent"]))
                results["timing"].append({
                    "kind": kind, "comp": comp, "zero": zero, "step_seconds": statistics.median(times),
                    "replica_bytes": statistics.median(a for a, _ in sent), "copy_bytes": statistics.median(b for _, b in sent),
                    "optimizer_state_bytes": st["optimizer_state_bytes"], "gradient_bytes": st["gradient_bytes"],
                    "parameter_bytes": st["parameter_bytes"],
                })
    teacher_w = 64
    for seed in (0, 1, 2):
        teacher = model(100 + seed, teacher_w)
        for comp in (None, "int8", "1bit"):
            for zero in (0, 1, 2):
                s = dpt.DualPipeStrategy(model(seed, teacher_w), adamw, nn.MSELoss, schedule="1f1b",
                                         pipeline_stages=2, micro_batches=micro, compression=comp, zero=zero,
                                         compression_warmup=onebit_warmup if comp == "1bit" else 0)
                g = torch.Generator().manual_seed(1000 + seed)
                losses = []
                for _ in range(quality_steps):
                    xs = torch.randn(rows * D, teacher_w, generator=g)
                    with torch.no_grad():
                        ys = teacher(xs)
                    mine = slice(s.world.replica * rows, (s.world.replica + 1) * rows)
                    losses.append(s.step(xs[mine], ys[mine]))
                results["quality"].append({"seed": seed, "comp": comp, "zero": zero,
                                           "loss": statistics.mean(losses[-20:]), "first": losses[0]})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def table(out: str, nproc: int) -> None:
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(nproc)]
    if not ranks[0]["timing"]:
        return quality_table(ranks)
    print("| schedule | compression | zero | step (ms) | to other replicas (B/step) | to the other copy (B/step) | optimizer state, largest rank (B) | gradients (B) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, row in enumerate(ranks[0]["timing"]):
        t = max(r["timing"][i]["step_seconds"] for r in ranks)
        rb = max(r["timing"][i]["replica_bytes"] for r in ranks)
        cb = max(r["timing"][i]["copy_bytes"] for r in ranks)
        ob = max(r["timing"][i]["optimizer_state_bytes"] for r in ranks)
        gb = max(r["timing"][i]["gradient_bytes"] for r in ranks)
        print(f"| {row['kind']} | {row['comp'] or 'none'} | {row['zero']} | {1e3 * t:.1f} | {rb:,.0f} | {cb:,.0f} | {ob:,} | {gb:,} |")
    print()
    quality_table(ranks)


def quality_table(ranks) -> None:
    q = ranks[0]["quality"]
    base = {r["seed"]: r["loss"] for r in q if r["comp"] is None and r["zero"] == 0}
    print("| compression | zero | loss, seed 0 | seed 1 | seed 2 | worst vs none, zero=0 |")
    print("|---|---|---|---|---|---|")
    for comp in (None, "int8", "1bit"):
        for zero in (0, 1, 2):
            rows = {r["seed"]: r["loss"] for r in q if r["comp"] == comp and r["zero"] == zero}
            worst = max(rows[s] / base[s] - 1 for s in rows)
            print(f"| {comp or 'none'} | {zero} | {rows[0]:.5f} | {rows[1]:.5f} | {rows[2]:.5f} | {100 * worst:+.2f} % |")
    print(f"\n(first step's loss, seed 0: {q[0]['first']:.5f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quality-steps", type=int, default=150)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--onebit-warmup", type=int, default=10, help="uncompressed steps before 1-bit Adam (quality)")
    ap.add_argument("--quality-only", action="store_true")
    ap.add_argument("--worker", metavar="OUT")
    a = ap.parse_args()
    if a.worker:
        memory_worker(a.worker) if a.memory else worker(a.worker, a.width, 0 if a.quality_only else a.steps,
                                                        a.quality_steps, a.onebit_warmup)
        return
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(a.nproc), "--standalone",
               os.path.abspath(__file__), "--worker", out, "--width", str(a.width), "--steps", str(a.steps),
               "--quality-steps", str(a.quality_steps), "--onebit-warmup", str(a.onebit_warmup)]
        cmd += (["--memory"] if a.memory else []) + (["--quality-only"] if a.quality_only else [])
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        memory_table(out, a.nproc) if a.memory else table(out, a.nproc)


if __name__ == "__main__":
    main()
