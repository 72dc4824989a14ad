#!/usr/bin/env python3
"""Time DeepSeek's reference EPLB (eplb.py, PyTorch) against `dualpipe eplb` on the same inputs.

For each shape the script draws loads from a seeded generator, writes them as .npy, runs the
reference in-process and our CLI as a subprocess (JSON output to a temp file), checks that both
plans are identical, and prints the times and the speed-up. With --criterion it also reads the
library-only times of `cargo bench -p dualpipe-eplb --bench eplb` (same shapes, its own loads).

Usage:
    pip install torch numpy
    python scripts/eplb_reference_bench.py --reference /path/to/EPLB-checkout \
        [--dualpipe target/release/dualpipe] [--seed 0] [--repeat 5] [--criterion]

The reference checkout is the directory holding eplb.py (github.com/deepseek-ai/EPLB); it is
not part of this repository.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# name, layers, experts, replicas, groups, nodes, gpus, criterion benchmark id
CASES = [
    ("a: hierarchical 58x256, P288, N4, R32", 58, 256, 288, 8, 4, 32,
     "hierarchical_58x256_p288_n4_r32"),
    ("b: global 58x256, P320, R64", 58, 256, 320, 8, 1, 64, "global_58x256_p320_r64"),
    ("c: hierarchical 61x1024, P1152, N8, R128", 61, 1024, 1152, 16, 8, 128,
     "hierarchical_61x1024_p1152_n8_r128"),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, type=Path,
                   help="directory of a deepseek-ai/EPLB checkout (holds eplb.py)")
    p.add_argument("--dualpipe", type=Path, default=Path("target/release/dualpipe"),
                   help="our binary (build it with cargo build --release -p dualpipe-cli)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5, help="runs of our CLI per case (median)")
    p.add_argument("--repeat-reference", type=int, default=1,
                   help="runs of the reference per case (median; it is slow)")
    p.add_argument("--criterion", action="store_true",
                   help="also show library times from target/criterion (run cargo bench first)")
    p.add_argument("--criterion-dir", type=Path, default=Path("target/criterion"))
    return p.parse_args()


def main():
    args = parse_args()
    if not (args.reference / "eplb.py").is_file():
        sys.exit(f"error: {args.reference}/eplb.py not found; pass the EPLB checkout directory")
    if not args.dualpipe.is_file():
        sys.exit(f"error: {args.dualpipe} not found; run cargo build --release -p dualpipe-cli")
    try:
        import numpy as np
        import torch
    except ImportError as e:
        sys.exit(f"error: {e}; install with: pip install torch numpy")
    sys.path.insert(0, str(args.reference))
    import eplb  # noqa: E402  (the reference)

    rng = np.random.default_rng(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="eplb-bench-") as tmp:
        tmp = Path(tmp)
        for name, layers, experts, replicas, groups, nodes, gpus, crit in CASES:
            loads = rng.lognormal(mean=0.0, sigma=1.5, size=(layers, experts)) * 100.0
            ties = rng.integers(0, 50, size=(layers, experts)).astype(np.int64)
            ref_times, identical = [], True
            for kind, w in (("float", loads), ("int", ties)):
                t0 = time.perf_counter()
                ref = eplb.rebalance_experts(torch.tensor(w), replicas, groups, nodes, gpus)
                dt = time.perf_counter() - t0
                if kind == "float":
                    ref_times.append(dt)
                    for _ in range(args.repeat_reference - 1):
                        t0 = time.perf_counter()
                        eplb.rebalance_experts(torch.tensor(w), replicas, groups, nodes, gpus)
                        ref_times.append(time.perf_counter() - t0)
                npy = tmp / f"{crit}-{kind}.npy"
                np.save(npy, w)
                # JSON to stdout (a pipe): --output would add the file system's fsync time.
                cmd = [str(args.dualpipe), "eplb", "--loads", str(npy), "--replicas",
                       str(replicas), "--groups", str(groups), "--nodes", str(nodes),
                       "--gpus", str(gpus), "--policy", "deepseek", "--format", "json"]
                ours_times = []
                for _ in range(args.repeat if kind == "float" else 1):
                    t0 = time.perf_counter()
                    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE)
                    ours_times.append(time.perf_counter() - t0)
                plan = json.loads(done.stdout)
                same = (plan["phy2log"] == ref[0].tolist()
                        and plan["log2phy"] == ref[1].tolist()
                        and plan["logcnt"] == ref[2].tolist())
                identical &= same
                if not same:
                    print(f"warning: {name} ({kind} loads): plans differ", file=sys.stderr)
                if kind == "float":
                    cli = statistics.median(ours_times)
            lib = None
            if args.criterion:
                est = args.criterion_dir / "rebalance_experts" / crit / "new" / "estimates.json"
                if est.is_file():
                    lib = json.loads(est.read_text())["median"]["point_estimate"] / 1e9
            rows.append((name, statistics.median(ref_times), cli, lib, identical))

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, seed {args.seed}")
    header = "| case | reference eplb.py | dualpipe eplb (CLI, end to end) | speed-up |"
    sep = "|---|---:|---:|---:|"
    if args.criterion:
        header += " library (criterion) | speed-up |"
        sep += "---:|---:|"
    header += " identical plans |"
    sep += "---|"
    print(header)
    print(sep)
    for name, ref, cli, lib, same in rows:
        line = f"| {name} | {ref * 1e3:.1f} ms | {cli * 1e3:.2f} ms | {ref / cli:.0f}x |"
        if args.criterion:
            line += (f" {lib * 1e3:.3f} ms | {ref / lib:.0f}x |" if lib else " n/a | n/a |")
        line += f" {'yes' if same else 'NO'} |"
        print(line)


if __name__ == "__main__":
    main()
