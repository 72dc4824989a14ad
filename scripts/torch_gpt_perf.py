#!/usr/bin/env python3
"""Tokens per second of our GPT pipeline step against PyTorch's, side by side in one run.

Same model and shapes on both sides (issue 13, item 9): the GPT of docs/models.md with d 128,
4 heads, seq 64, 8 blocks, 8 micro-batches of 16 sequences, f32; a step is the forward and
backward of every micro-batch (no optimizer), gradients zeroed first.

- ours, DualPipeV on 4 ranks: `crates/dualpipe-nn/benches/gpt_step.rs` (4 rank threads, 8
  single-block stages in the V placement, one single-threaded GEMM per rank);
- PyTorch, DualPipeV on 4 ranks: torch.distributed.pipelining's ScheduleDualPipeV over gloo,
  4 processes with torch.set_num_threads(1), the same V placement (rank r holds stages r and
  7 - r);
- ours, one rank: the whole model on one thread (the sequential single-thread oracle);
- PyTorch eager: the whole model in one process, torch.set_num_threads(1).

Every round runs the four one after the other, so all see the same machine load; the table
shows medians over every measured step of every round, and a second table the CPU seconds per
step (all threads of the side's processes), which the load moves much less than the wall clock. Activation memory per rank: ours is
the most bytes of saved tensors a rank's stages held at once (measured after every op), set
against the simulator's peak-activation count times the bytes one micro-batch leaves saved at
a single-block stage; PyTorch's side shows each process's VmHWM (RSS high-water mark, which
includes the torch runtime) and its growth over the model's setup.

    python3 scripts/torch_gpt_perf.py [--rounds 3] [--steps 8] [--json FILE] [--bench-bin FILE]

Needs torch (`pip install torch`) and cargo; the first run builds the bench (release).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
D, HEADS, SEQ, LAYERS, MBS, ROWS, RANKS = 128, 4, 64, 8, 8, 16, 4
TOKENS_PER_STEP = MBS * ROWS * SEQ


def rss_fields():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


# --------------------------------------------------------------------------------------------
# The model in PyTorch (docs/models.md), cut into stages.


def build_modules():
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.RMSNorm(D, eps=1e-5)
            self.qkv = nn.Linear(D, 3 * D, bias=False)
            self.proj = nn.Linear(D, D, bias=False)
            self.norm2 = nn.RMSNorm(D, eps=1e-5)
            self.fc1 = nn.Linear(D, 4 * D, bias=False)
            self.fc2 = nn.Linear(4 * D, D, bias=False)

        def forward(self, h):
            rows, t, _ = h.shape
            q, k, v = self.qkv(self.norm1(h)).split(D, dim=-1)
            q, k, v = (x.view(rows, t, HEADS, D // HEADS).transpose(1, 2) for x in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(o.transpose(1, 2).reshape(rows, t, D))
            return h + self.fc2(F.gelu(self.fc1(self.norm2(h)), approximate="none"))

    class Stage(nn.Module):
        """Blocks `layers`, with the embeddings when `first` and the final norm and head when `last`."""

        def __init__(self, layers, first, last):
            super().__init__()
            self.tok_emb = nn.Embedding(256, D) if first else None
            self.pos_emb = nn.Embedding(SEQ, D) if first else None
            self.blocks = nn.ModuleList(Block() for _ in layers)
            self.norm_f = nn.RMSNorm(D, eps=1e-5) if last else None
            self.lm_head = nn.Linear(D, 256, bias=False) if last else None

        def forward(self, x):
            if self.tok_emb is not None:
                x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1]))
            for b in self.blocks:
                x = b(x)
            if self.lm_head is not None:
                x = self.lm_head(self.norm_f(x))
            return x

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, 256), target.reshape(-1))

    return Stage, loss_fn


def batch(step):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, 256, (MBS * ROWS, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def worker_eager(args):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    Stage, loss_fn = build_modules()
    base = rss_fields()["VmRSS"]
    model = Stage(range(LAYERS), True, True)
    times, cpu = [], []
    for step in range(args.steps + args.warmup):
        x, y = batch(step)
        start, start_cpu = time.perf_counter(), time.process_time()
        model.zero_grad(set_to_none=False)
        for xm, ym in zip(x.chunk(MBS), y.chunk(MBS)):
            (loss_fn(model(xm), ym) / MBS).backward()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    rss = rss_fields()
    print(json.dumps({"step_seconds": times, "cpu_seconds": cpu, "vm_hwm_bytes": rss["VmHWM"],
                      "rss_before_model_bytes": base}))


def worker_pipe(rank, args, out_path, port):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleDualPipeV

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(0)
    Stage, loss_fn = build_modules()
    base = rss_fields()["VmRSS"]
    n_stages = 2 * RANKS
    stages = []
    for s in (rank, n_stages - 1 - rank):  # the V placement
        module = Stage(range(s, s + 1), s == 0, s == n_stages - 1)
        stages.append(PipelineStage(module, s, n_stages, torch.device("cpu")))
    schedule = ScheduleDualPipeV(stages, n_microbatches=MBS, loss_fn=loss_fn)
    times, cpu = [], []
    for step in range(args.steps + args.warmup):
        x, y = batch(step)
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        for st in stages:
            st.submod.zero_grad(set_to_none=False)
        if rank == 0:  # holds stage 0 (input) and stage 7 (loss)
            schedule.step(x, target=y, losses=[])
        else:
            schedule.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        used = torch.tensor([time.process_time() - start_cpu], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        dist.all_reduce(used, op=dist.ReduceOp.SUM)
        if step >= args.warmup:
            times.append(elapsed.item())
            cpu.append(used.item())
    rss = rss_fields()
    mem = [None] * RANKS
    dist.all_gather_object(mem, {"vm_hwm_bytes": rss["VmHWM"], "rss_before_model_bytes": base})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"step_seconds": times, "cpu_seconds": cpu, "per_rank": mem}, f)
    dist.destroy_process_group()


def run_pipe(args):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pipe.json")
        mp.spawn(worker_pipe, args=(args, out, port), nprocs=RANKS, join=True)
        with open(out) as f:
            return json.load(f)


# --------------------------------------------------------------------------------------------


def ours(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ours.json")
        env = dict(os.environ, GPT_STEP_JSON=out, GPT_STEP_STEPS=str(args.steps))
        cmd = [args.bench_bin] if args.bench_bin else ["cargo", "bench", "--quiet", "-p", "dualpipe-nn",
                                                        "--bench", "gpt_step"]
        subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def torch_eager(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "eager", "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def torch_pipe(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "pipe", "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def mib(b):
    return f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="measured steps per side and round")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (PyTorch sides)")
    ap.add_argument("--worker", choices=["eager", "pipe"], help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write every measurement into this file")
    ap.add_argument("--bench-bin", help="run this build of the gpt_step bench for our side instead of "
                    "`cargo bench` (a build of an earlier commit, for a before/after comparison)")
    args = ap.parse_args()
    if args.worker == "eager":
        worker_eager(args)
        return 0
    if args.worker == "pipe":
        print(json.dumps(run_pipe(args)))
        return 0

    import torch

    if not args.bench_bin:
        print("building the bench (cargo bench --no-run, release) ...", file=sys.stderr)
        subprocess.run(["cargo", "bench", "--quiet", "-p", "dualpipe-nn", "--bench", "gpt_step", "--no-run"],
                       cwd=REPO, check=True)
    rec = {"ours_pipe": [], "torch_pipe": [], "ours_seq": [], "torch_eager": [], "load": []}
    cpu = {"ours_pipe": [], "torch_pipe": [], "ours_seq": [], "torch_eager": []}
    last = {}
    for r in range(args.rounds):
        rec["load"].append(os.getloadavg())
        print(f"round {r + 1}/{args.rounds}: load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
        o = ours(args)
        rec["ours_pipe"] += o["dualpipev"]["step_seconds"]
        rec["ours_seq"] += o["sequential"]["step_seconds"]
        # A build from before the bench measured CPU time has no such member.
        cpu["ours_pipe"] += o["dualpipev"].get("cpu_seconds", [None])
        cpu["ours_seq"] += o["sequential"].get("cpu_seconds", [None])
        tp = torch_pipe(args)
        rec["torch_pipe"] += tp["step_seconds"]
        cpu["torch_pipe"] += tp["cpu_seconds"]
        te = torch_eager(args)
        rec["torch_eager"] += te["step_seconds"]
        cpu["torch_eager"] += te["cpu_seconds"]
        rec["load"].append(os.getloadavg())
        last = {"ours": o, "torch_pipe": tp, "torch_eager": te}

    def tps(key):
        return TOKENS_PER_STEP / statistics.median(rec[key])

    loads = [l[0] for l in rec["load"]]
    print(f"PyTorch {torch.__version__}; d {D}, {HEADS} heads, seq {SEQ}, {LAYERS} blocks, {MBS} micro-batches "
          f"of {ROWS} sequences ({TOKENS_PER_STEP} tokens per step), f32; {args.rounds} rounds x {args.steps} steps; "
          f"{os.cpu_count()} CPUs, 1-minute load average {min(loads):.2f} to {max(loads):.2f} while measuring")
    print()
    print("| setup | ours tokens/s | PyTorch tokens/s | ours / PyTorch | ours ms/step | PyTorch ms/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, a, b in [("DualPipeV, 4 ranks (ours: 4 threads; PyTorch: ScheduleDualPipeV, gloo, 4 processes x 1 thread)", "ours_pipe", "torch_pipe"),
                       ("one rank, whole model (ours: sequential, 1 thread; PyTorch: eager, 1 thread)", "ours_seq", "torch_eager")]:
        print(f"| {name} | {tps(a):.0f} | {tps(b):.0f} | {tps(a) / tps(b):.2f}x | "
              f"{1e3 * statistics.median(rec[a]):.1f} | {1e3 * statistics.median(rec[b]):.1f} |")
    print()
    print("CPU seconds per step (all threads of all the side's processes; the load moves the wall clock, much less this):")
    print()
    print("| setup | ours CPU s/step | PyTorch CPU s/step | PyTorch / ours |")
    print("|---|---:|---:|---:|")
    for name, a, b in [("DualPipeV, 4 ranks", "ours_pipe", "torch_pipe"), ("one rank, whole model", "ours_seq", "torch_eager")]:
        if None in cpu[a] or None in cpu[b]:
            continue
        ca, cb = statistics.median(cpu[a]), statistics.median(cpu[b])
        print(f"| {name} | {ca:.3f} | {cb:.3f} | {cb / ca:.2f}x |")
    print()
    o = last["ours"]["dualpipev"]
    print("| rank | ours: peak saved activations (MiB) | simulator: peak count x one micro-batch at a one-block stage (MiB) | measured / predicted | PyTorch process VmHWM (MiB) | PyTorch VmHWM - RSS before the model (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in range(RANKS):
        got, want = o["peak_saved_bytes_per_rank"][r], o["predicted_bytes_per_rank"][r]
        tpr = last["torch_pipe"]["per_rank"][r]
        print(f"| {r} | {mib(got)} | {o['sim_peak_activations_per_rank'][r]} x {mib(o['micro_batch_stage_bytes'])} = {mib(want)} | "
              f"{got / want:.2f} | {mib(tpr['vm_hwm_bytes'])} | {mib(tpr['vm_hwm_bytes'] - tpr['rss_before_model_bytes'])} |")
    print()
    print(f"ours, whole process (4 ranks then the sequential run): VmHWM {mib(last['ours']['vm_hwm_bytes'])} MiB; "
          f"PyTorch eager process: VmHWM {mib(last['torch_eager']['vm_hwm_bytes'])} MiB "
          f"({mib(last['torch_eager']['vm_hwm_bytes'] - last['torch_eager']['rss_before_model_bytes'])} MiB over its RSS before the model)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": rec, "cpu_seconds": cpu, "last": last}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
