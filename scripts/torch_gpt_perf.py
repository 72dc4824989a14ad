#!/usr/bin/env python3
"""Tokens per second of our GPT pipeline step against PyTorch's, side by side in one run.

Same model and shapes on both sides: the GPT of docs/models.md, 8 blocks, 8 micro-batches; a
step is the forward and backward of every micro-batch (no optimizer), gradients zeroed first.
The width, heads, sequence length, sequences per micro-batch and precision are flags; `--sizes`
takes presets and `--dtype` a list, so that one run measures every pair of issue 30:

- `d128`: d 128, 4 heads, seq 64, 16 sequences per micro-batch (issue 13's shapes, the default);
- `d512`: d 512, 8 heads, seq 128, 8 sequences per micro-batch;
- `f32`: f32 throughout on both sides; `bf16`: ours with every stage in mixed precision
  (`GptStage::set_half(Some(Half::Bf16))`: f32 master weights, bf16 GEMMs and saved
  activations), PyTorch under `torch.autocast("cpu", dtype=torch.bfloat16)` around every
  stage's forward (f32 parameters, bf16 matmuls; the loss in f32). Our bf16 keeps the
  attention projections in f32 by default (docs/precision.md: in bf16 they cost the default
  task's validation loss 1.2-1.7%); `--half-projections` runs them in bf16 as autocast does
  (`GptStage::set_half_projections(true)`), so that both sides do the same work.

For every size and dtype, four contenders:

- ours, DualPipeV on 4 ranks: `crates/dualpipe-nn/benches/gpt_step.rs` (4 rank threads, 8
  single-block stages in the V placement, one single-threaded GEMM per rank), in its JSON mode
  with the shapes in `GPT_STEP_*`;
- PyTorch, DualPipeV on 4 ranks: torch.distributed.pipelining's ScheduleDualPipeV over gloo,
  4 processes with torch.set_num_threads(1), the same V placement (rank r holds stages r and
  7 - r);
- ours, one rank: the whole model on one thread (the sequential single-thread oracle);
- PyTorch eager: the whole model in one process, torch.set_num_threads(1).

Every round runs the contenders one after the other, so all see the same machine load; the table
shows medians over every measured step of every round, the ratio of each round on its own (each
side's median step of the round: the spread the medians hide), and the CPU seconds per step (all
threads of all the side's processes), which the load moves much less than the wall clock. The header
names the machine (CPU model, its AVX-512 / bf16 / AMX flags), torch's version and the load
average at the start and the end. With --memory, the activation memory per rank too: ours is
the most bytes of saved tensors a rank's stages held at once (measured after every op), set
against the simulator's peak-activation count times the bytes one micro-batch leaves saved at
a single-block stage; PyTorch's side shows each process's VmHWM (RSS high-water mark, which
includes the torch runtime) and its growth over the model's setup.

    python3 scripts/torch_gpt_perf.py [--rounds 3] [--steps 8] [--memory] [--json FILE] [--bench-bin FILE]
    python3 scripts/torch_gpt_perf.py --sizes d128,d512 --dtype f32,bf16 [--rounds 1] [--steps 3]
    python3 scripts/torch_gpt_perf.py --d-model 256 --heads 4 --seq 64 --rows 16 --dtype bf16

Needs torch (`pip install torch`) and cargo; the first run builds the bench (release). A bench
build (--bench-bin) that does not run the shapes or dtype asked for (one from before it read
GPT_STEP_*) gives "not available" in our columns.
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
LAYERS, MBS, RANKS = 8, 8, 4
# The presets of --sizes: d_model, heads, seq, rows (sequences per micro-batch).
SIZES = {"d128": (128, 4, 64, 16), "d512": (512, 8, 128, 8)}
# Set by configure() from the flags (the workers get them on their command line).
D, HEADS, SEQ, ROWS, DTYPE = 128, 4, 64, 16, "f32"


def configure(d_model, heads, seq, rows, dtype):
    global D, HEADS, SEQ, ROWS, DTYPE
    D, HEADS, SEQ, ROWS, DTYPE = d_model, heads, seq, rows, dtype


def tokens_per_step():
    return MBS * ROWS * SEQ


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
            # bf16: autocast (f32 parameters, bf16 matmuls); the backward follows what it recorded.
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=DTYPE == "bf16"):
                if self.tok_emb is not None:
                    x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1]))
                for b in self.blocks:
                    x = b(x)
                if self.lm_head is not None:
                    x = self.lm_head(self.norm_f(x))
            return x

    def loss_fn(logits, target):
        return F.cross_entropy(logits.float().reshape(-1, 256), target.reshape(-1))

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
                      "rss_before_model_bytes": base, "shape": [D, HEADS, SEQ, ROWS, DTYPE]}))


def worker_pipe(rank, args, out_path, port):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleDualPipeV

    # a spawned process: the module's shapes are its defaults until set from the flags again
    configure(args.d_model, args.heads, args.seq, args.rows, args.dtype.split(",")[0])
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # gloo finds its interface from the host name, which a sandbox may not resolve: one host,
    # so the loopback device.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(0)
    Stage, loss_fn = build_modules()
    base = rss_fields()["VmRSS"]
    n_stages = 2 * RANKS
    stages = []
    for s in (rank, n_stages - 1 - rank):  # the V placement
        module = Stage(range(s, s + 1), s == 0, s == n_stages - 1)
        stages.append(PipelineStage(module, s, n_stages, torch.device("cpu")))
        skip_self_warmup(stages[-1], rank)
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
            json.dump({"step_seconds": times, "cpu_seconds": cpu, "per_rank": mem,
                       "shape": [D, HEADS, SEQ, ROWS, DTYPE]}, f)
    dist.destroy_process_group()


def skip_self_warmup(stage, rank):
    """Drops from `stage`'s connection warm-up the messages to and from this very rank.

    PyTorch 2.11's schedules open each stage's links before the first step by sending a dummy
    tensor to the next stage's rank and receiving one from the previous stage's
    (`_get_init_p2p_neighbors_ops`). At the V's turn both neighbours live on the same rank, so
    that rank sends to itself, which gloo cannot ("Pair is not connected ... <--> [none]"),
    while the schedule itself hands tensors between one rank's stages in memory. Versions
    without that warm-up (2.15) are left alone. With it, 2.11's ScheduleDualPipeV runs on gloo
    (docs/performance.md); the warm-up carries no data the step uses.
    """
    warmup = getattr(stage, "_get_init_p2p_neighbors_ops", None)
    if warmup is None:
        return

    def ops():
        return [op for op in warmup() if rank not in (getattr(op, "group_peer", None), getattr(op, "peer", None))]

    stage._get_init_p2p_neighbors_ops = ops


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


def shape_flags():
    return ["--d-model", str(D), "--heads", str(HEADS), "--seq", str(SEQ), "--rows", str(ROWS), "--dtype", DTYPE]


def ours(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ours.json")
        env = dict(os.environ, GPT_STEP_JSON=out, GPT_STEP_STEPS=str(args.steps), GPT_STEP_D_MODEL=str(D),
                   GPT_STEP_HEADS=str(HEADS), GPT_STEP_SEQ=str(SEQ), GPT_STEP_ROWS=str(ROWS), GPT_STEP_DTYPE=DTYPE,
                   GPT_STEP_HALF_PROJECTIONS="1" if args.half_projections else "0")
        cmd = [args.bench_bin] if args.bench_bin else ["cargo", "bench", "--quiet", "-p", "dualpipe-nn",
                                                        "--bench", "gpt_step"]
        subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def checked(out, who):
    """`out`, after checking that the worker ran the shapes and dtype asked for."""
    if out["shape"] != [D, HEADS, SEQ, ROWS, DTYPE]:
        raise RuntimeError(f"{who} ran {out['shape']}, not {[D, HEADS, SEQ, ROWS, DTYPE]}")
    return out


def torch_eager(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "eager", "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + shape_flags()
    return checked(json.loads(run_worker(cmd)), "PyTorch eager")


def run_worker(cmd):
    """A worker's stdout; its stderr's end in the error when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def torch_pipe(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "pipe", "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + shape_flags()
    return checked(json.loads(run_worker(cmd)), "PyTorch pipe")


def mib(b):
    return f"{b / 2**20:.1f}"


def machine():
    """The CPU's model name, its bf16 / AMX / AVX-512 flags, and the number of CPUs."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"]
    return {"model_name": model, "cpus": os.cpu_count(), "flags": {f: f in flags for f in wanted}}


SETUPS = [("DualPipeV, 4 ranks", "ours_pipe", "torch_pipe"), ("one rank, whole model", "ours_seq", "torch_eager")]


def measure(args, label):
    """Every round of one size and dtype (the shapes set by configure())."""
    keys = ["ours_pipe", "torch_pipe", "ours_seq", "torch_eager"]
    by_round = {k: [] for k in keys}  # each round's step seconds, [] where a side did not run
    cpu = {k: [] for k in keys}
    load, last, unavailable = [], {}, None
    for r in range(args.rounds):
        load.append(os.getloadavg())
        print(f"{label}, round {r + 1}/{args.rounds}: load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
        o = ours(args)
        got = (o.get("d_model"), o.get("heads"), o.get("seq_len"), o.get("rows"), o.get("dtype"))
        if "unavailable" not in o and got != (D, HEADS, SEQ, ROWS, DTYPE):
            # a build from before the bench read GPT_STEP_*: it ran its fixed shapes in f32
            o = {"unavailable": f"the bench build ran {got}, not the {(D, HEADS, SEQ, ROWS, DTYPE)} asked for"}
        elif "unavailable" not in o and DTYPE != "f32" and o.get("half_projections", False) != args.half_projections:
            o = {"unavailable": f"the bench build ran half_projections {o.get('half_projections')}, "
                                f"not {args.half_projections} as asked (a build from before it read them)"}
        if "unavailable" in o:
            unavailable = o["unavailable"]
            by_round["ours_pipe"].append([])
            by_round["ours_seq"].append([])
        else:
            by_round["ours_pipe"].append(o["dualpipev"]["step_seconds"])
            by_round["ours_seq"].append(o["sequential"]["step_seconds"])
            # A build from before the bench measured CPU time has no such member.
            cpu["ours_pipe"] += o["dualpipev"].get("cpu_seconds", [None])
            cpu["ours_seq"] += o["sequential"].get("cpu_seconds", [None])
        try:
            tp = torch_pipe(args)
            by_round["torch_pipe"].append(tp["step_seconds"])
            cpu["torch_pipe"] += tp["cpu_seconds"]
        except RuntimeError as e:  # the other contenders are still measured
            tp = None
            by_round["torch_pipe"].append([])
            print(f"PyTorch's pipeline did not run, so its column is empty: {e}", file=sys.stderr)
        te = torch_eager(args)
        by_round["torch_eager"].append(te["step_seconds"])
        cpu["torch_eager"] += te["cpu_seconds"]
        load.append(os.getloadavg())
        last = {"ours": o, "torch_pipe": tp, "torch_eager": te}
    return {"d_model": D, "heads": HEADS, "seq": SEQ, "rows": ROWS, "dtype": DTYPE, "layers": LAYERS,
            "half_projections": args.half_projections and DTYPE != "f32",
            "micro_batches": MBS, "tokens_per_step": tokens_per_step(),
            "steps": {k: [t for r in rounds for t in r] for k, rounds in by_round.items()},
            "steps_by_round": by_round, "cpu_seconds": cpu,
            "load": load, "ours_unavailable": unavailable, "last": last}


def round_ratios(ours_rounds, torch_rounds):
    """Ours / PyTorch in tokens per second, round by round (each side's median step of the round):
    the spread that the medians over every round hide. Rounds where a side did not run are left out."""
    return [statistics.median(t) / statistics.median(o)
            for o, t in zip(ours_rounds, torch_rounds) if o and t]


def summary(m):
    """Per setup: medians of tokens/s, step seconds and CPU seconds of both sides (None when not
    measured), their ratio, and the ratio of each round."""
    out = []
    for name, a, b in SETUPS:
        row = {"setup": name}
        for side, key in (("ours", a), ("torch", b)):
            t, c = m["steps"][key], m["cpu_seconds"][key]
            row[f"{side}_tokens_per_s"] = m["tokens_per_step"] / statistics.median(t) if t else None
            row[f"{side}_step_s"] = statistics.median(t) if t else None
            row[f"{side}_cpu_s"] = statistics.median(c) if c and None not in c else None
        ot, tt = row["ours_tokens_per_s"], row["torch_tokens_per_s"]
        row["ratio"] = ot / tt if ot and tt else None
        rounds = m.get("steps_by_round", {})
        row["round_ratios"] = round_ratios(rounds.get(a, []), rounds.get(b, []))
        oc, tc = row["ours_cpu_s"], row["torch_cpu_s"]
        row["cpu_ratio"] = tc / oc if oc and tc else None
        out.append(row)
    return out


def print_memory(m):
    o = m["last"]["ours"]
    if "unavailable" in o:
        print(f"ours: {o['unavailable']}")
        return
    o = o["dualpipev"]
    print("| rank | ours: peak saved activations (MiB) | simulator: peak count x one micro-batch at a one-block stage (MiB) | measured / predicted | PyTorch process VmHWM (MiB) | PyTorch VmHWM - RSS before the model (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in range(RANKS):
        got, want = o["peak_saved_bytes_per_rank"][r], o["predicted_bytes_per_rank"][r]
        tp = m["last"]["torch_pipe"]
        torch_cols = "n/a | n/a"
        if tp:
            tpr = tp["per_rank"][r]
            torch_cols = f"{mib(tpr['vm_hwm_bytes'])} | {mib(tpr['vm_hwm_bytes'] - tpr['rss_before_model_bytes'])}"
        print(f"| {r} | {mib(got)} | {o['sim_peak_activations_per_rank'][r]} x {mib(o['micro_batch_stage_bytes'])} = {mib(want)} | "
              f"{got / want:.2f} | {torch_cols} |")
    print()
    last = m["last"]
    print(f"ours, whole process (4 ranks then the sequential run): VmHWM {mib(last['ours']['vm_hwm_bytes'])} MiB; "
          f"PyTorch eager process: VmHWM {mib(last['torch_eager']['vm_hwm_bytes'])} MiB "
          f"({mib(last['torch_eager']['vm_hwm_bytes'] - last['torch_eager']['rss_before_model_bytes'])} MiB over its RSS before the model)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="measured steps per side and round")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (PyTorch sides)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rows", type=int, default=16, help="sequences per micro-batch")
    ap.add_argument("--dtype", default="f32", help="f32, bf16, or a comma list of them (each one measured)")
    ap.add_argument("--sizes", help="comma list of presets (" + ", ".join(
        f"{k}: d {v[0]}, {v[1]} heads, seq {v[2]}, {v[3]} sequences per micro-batch" for k, v in SIZES.items())
        + "), each measured; overrides --d-model, --heads, --seq and --rows")
    ap.add_argument("--half-projections", action="store_true",
                    help="bf16: our attention projections in bf16 too, as PyTorch's autocast runs them")
    ap.add_argument("--memory", action="store_true", help="also print the activation memory per rank")
    ap.add_argument("--worker", choices=["eager", "pipe"], help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write every measurement into this file")
    ap.add_argument("--bench-bin", help="run this build of the gpt_step bench for our side instead of "
                    "`cargo bench` (a build of an earlier commit, for a before/after comparison)")
    args = ap.parse_args()
    dtypes = args.dtype.split(",")
    for dt in dtypes:
        if dt not in ("f32", "bf16"):
            ap.error(f"--dtype {dt}: use f32 or bf16")
    if args.worker:
        configure(args.d_model, args.heads, args.seq, args.rows, dtypes[0])
        if args.worker == "eager":
            worker_eager(args)
        else:
            print(json.dumps(run_pipe(args)))
        return 0

    if args.sizes:
        try:
            sizes = [(k, *SIZES[k]) for k in args.sizes.split(",")]
        except KeyError as e:
            ap.error(f"--sizes: unknown preset {e}; known: {', '.join(SIZES)}")
    else:
        sizes = [(f"d{args.d_model}", args.d_model, args.heads, args.seq, args.rows)]

    import torch

    if not args.bench_bin:
        print("building the bench (cargo bench --no-run, release) ...", file=sys.stderr)
        subprocess.run(["cargo", "bench", "--quiet", "-p", "dualpipe-nn", "--bench", "gpt_step", "--no-run"],
                       cwd=REPO, check=True)
    mach = machine()
    load_start = os.getloadavg()
    runs = []
    for name, d, h, t, rows in sizes:
        for dt in dtypes:
            configure(d, h, t, rows, dt)
            m = measure(args, f"{name} {dt}")
            m["size"] = name
            m["summary"] = summary(m)
            runs.append(m)
    load_end = os.getloadavg()

    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in mach["flags"].items())
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    print(f"machine: {mach['model_name']}, {mach['cpus']} CPUs ({flags}); PyTorch {torch.__version__} "
          f"(CPU capability {cap}); load average (1, 5, 15 min) {' / '.join(f'{x:.2f}' for x in load_start)} at the start, "
          f"{' / '.join(f'{x:.2f}' for x in load_end)} at the end")
    print(f"our bf16: attention projections in {'bf16 (--half-projections)' if args.half_projections else 'f32'}")
    print(f"{LAYERS} blocks, {MBS} micro-batches; {args.rounds} rounds x {args.steps} measured steps per contender "
          f"(PyTorch after {args.warmup} warm-up steps, ours after 1); medians")
    print()
    for m in runs:
        print(f"- {m['size']}: d {m['d_model']}, {m['heads']} heads, seq {m['seq']}, {m['rows']} sequences per "
              f"micro-batch ({m['tokens_per_step']} tokens per step); {m['dtype']}: 1-minute load average "
              f"{min(l[0] for l in m['load']):.2f} to {max(l[0] for l in m['load']):.2f}")
    print()
    print("| size | dtype | setup | ours tokens/s | PyTorch tokens/s | ours / PyTorch | per round | ours CPU s/step | PyTorch CPU s/step | PyTorch / ours CPU |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")

    def f(v, fmt):
        return "not available" if v is None else format(v, fmt)

    for m in runs:
        for row in m["summary"]:
            ratio = "not available" if row["ratio"] is None else f"{row['ratio']:.2f}x"
            cratio = "not available" if row["cpu_ratio"] is None else f"{row['cpu_ratio']:.2f}x"
            rr = row["round_ratios"]
            spread = "not available" if not rr else ", ".join(f"{r:.2f}x" for r in rr)
            print(f"| {m['size']} | {m['dtype']} | {row['setup']} | {f(row['ours_tokens_per_s'], '.0f')} | "
                  f"{f(row['torch_tokens_per_s'], '.0f')} | {ratio} | {spread} | {f(row['ours_cpu_s'], '.3f')} | "
                  f"{f(row['torch_cpu_s'], '.3f')} | {cratio} |")
    print()
    print("(DualPipeV: ours 4 rank threads, PyTorch ScheduleDualPipeV over gloo, 4 processes x 1 thread. "
          "One rank: ours sequential on 1 thread, PyTorch eager on 1 thread. CPU s/step: all threads of "
          "all the side's processes.)")
    for m in runs:
        if m["ours_unavailable"]:
            print(f"{m['size']} {m['dtype']}, ours: {m['ours_unavailable']}")
    if args.memory:
        for m in runs:
            print()
            print(f"Activation memory, {m['size']} {m['dtype']} (the last round):")
            print()
            print_memory(m)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": mach, "torch": torch.__version__, "load_start": load_start, "load_end": load_end,
                       "rounds": args.rounds, "steps_per_round": args.steps, "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
