#!/usr/bin/env python3
"""Times dualpipe_rs.eplb.rebalance_experts against DeepSeek's reference eplb.py, from Python.

Usage:
    python scripts/python_eplb_bench.py PATH/TO/EPLB-CHECKOUT [--repeat-ref 5] [--repeat-ours 200]

PATH/TO/EPLB-CHECKOUT is a directory holding DeepSeek's ``eplb.py`` (a checkout of
deepseek-ai/EPLB; it is never part of this repository). Needs torch (the reference's only
dependency) and the installed ``dualpipe-rs`` package (``pip install ./python``).

The input is DeepSeek-V3-sized: 58 MoE layers x 256 experts, 288 replicas, 8 groups, 4 nodes,
32 GPUs, with log-normal loads from a fixed seed. Both sides get the same torch float32 tensor
and return torch int64 tensors; the script checks they agree index for index, then prints the
median and best wall time of each and the speedup. (The Rust side releases the GIL while it
works and spreads a large input's layers over the cores.)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

LAYERS, EXPERTS, REPLICAS, GROUPS, NODES, GPUS = 58, 256, 288, 8, 4, 32


def load_reference(checkout: Path):
    path = checkout / "eplb.py"
    if not path.is_file():
        sys.exit(f"error: {path} does not exist; pass the directory of a deepseek-ai/EPLB checkout")
    spec = importlib.util.spec_from_file_location("deepseek_eplb_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn, repeat):
    times = []
    out = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path, help="directory of a deepseek-ai/EPLB checkout")
    parser.add_argument("--repeat-ref", type=int, default=5, help="timed reference calls")
    parser.add_argument("--repeat-ours", type=int, default=200, help="timed dualpipe_rs calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        sys.exit("error: torch is not installed (pip install torch); the reference needs it")
    import numpy as np

    from dualpipe_rs.eplb import rebalance_experts as ours

    reference = load_reference(args.reference)
    torch.manual_seed(args.seed)
    weight = torch.distributions.LogNormal(0.0, 1.0).sample((LAYERS, EXPERTS)) * 1000.0
    weight = weight.float()
    call_args = (REPLICAS, GROUPS, NODES, GPUS)

    # Warm up both (first-call costs: imports, allocator, thread pools).
    reference.rebalance_experts(weight, *call_args)
    ours(weight, *call_args)

    ref_out, ref_times = timed(lambda: reference.rebalance_experts(weight, *call_args), args.repeat_ref)
    our_out, our_times = timed(lambda: ours(weight, *call_args), args.repeat_ours)
    weight_np = weight.numpy()
    _, np_times = timed(lambda: ours(weight_np, *call_args), args.repeat_ours)

    for name, r, o in zip(("phy2log", "log2phy", "logcnt"), ref_out, our_out):
        if not isinstance(o, torch.Tensor) or o.dtype != torch.int64:
            sys.exit(f"error: {name} is not a torch int64 tensor")
        if r.shape != o.shape or not torch.equal(r, o):
            sys.exit(f"error: {name} differs from the reference")

    ref_med, our_med, np_med = (statistics.median(t) for t in (ref_times, our_times, np_times))
    print(f"EPLB rebalance_experts, {LAYERS} layers x {EXPERTS} experts, {REPLICAS} replicas, "
          f"{GROUPS} groups, {NODES} nodes, {GPUS} GPUs (log-normal loads, seed {args.seed})")
    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} CPU(s)")
    print()
    print("| call | median | best | calls |")
    print("|---|---|---|---|")
    print(f"| reference eplb.py (torch) | {ref_med * 1e3:.1f} ms | {min(ref_times) * 1e3:.1f} ms | {len(ref_times)} |")
    print(f"| dualpipe_rs, torch tensor in/out | {our_med * 1e3:.2f} ms | {min(our_times) * 1e3:.2f} ms | {len(our_times)} |")
    print(f"| dualpipe_rs, numpy array in/out | {np_med * 1e3:.2f} ms | {min(np_times) * 1e3:.2f} ms | {len(np_times)} |")
    print()
    print(f"speedup (median, torch in/out): {ref_med / our_med:.0f}x; outputs identical: yes")


if __name__ == "__main__":
    main()
