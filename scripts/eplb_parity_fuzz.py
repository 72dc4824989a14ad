#!/usr/bin/env python3
"""Compare `dualpipe eplb` with DeepSeek's reference eplb.py on random configurations.

Draws random topologies (nodes, GPUs, groups, experts, replicas) and loads (small integers with
many ties, all zeros, log-normal floats), runs the reference in-process and our CLI on the same
.npy file, and reports every case where phy2log, log2phy or logcnt differ.

Usage:
    pip install torch numpy
    python scripts/eplb_parity_fuzz.py --reference /path/to/EPLB-checkout \
        [--dualpipe target/release/dualpipe] [--seed 1] [--cases 400] [--large]
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, type=Path,
                   help="directory of a deepseek-ai/EPLB checkout (holds eplb.py)")
    p.add_argument("--dualpipe", type=Path, default=Path("target/release/dualpipe"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, default=400)
    p.add_argument("--large", action="store_true",
                   help="16 to 128 GPUs per node and larger groups (exercises many packs)")
    args = p.parse_args()
    if not (args.reference / "eplb.py").is_file():
        sys.exit(f"error: {args.reference}/eplb.py not found; pass the EPLB checkout directory")
    if not args.dualpipe.is_file():
        sys.exit(f"error: {args.dualpipe} not found; run cargo build --release -p dualpipe-cli")
    import numpy as np
    import torch
    sys.path.insert(0, str(args.reference))
    import eplb  # noqa: E402  (the reference)

    rnd = random.Random(args.seed)
    rng = np.random.default_rng(args.seed)
    checked = mismatched = 0
    with tempfile.TemporaryDirectory(prefix="eplb-fuzz-") as tmp:
        npy = Path(tmp) / "loads.npy"
        for _ in range(args.cases):
            if args.large:
                nodes, gpn = rnd.choice([1, 1, 2, 4]), rnd.choice([16, 32, 64, 128])
                group_size = rnd.choice([8, 16, 32, 64])
            else:
                nodes, gpn = rnd.choice([1, 1, 2, 2, 4, 8]), rnd.choice([1, 2, 4, 8])
                group_size = rnd.choice([1, 2, 4, 8, 16, 32])
            gpus = nodes * gpn
            groups = rnd.choice([1, 2, 3, 4, 5, 8, 16])
            experts = groups * group_size
            replicas = (-(-experts // gpus) + rnd.choice([0, 0, 1, 2, 5])) * gpus
            layers = rnd.choice([1, 2, 3])
            kind = rnd.choice(["int_small", "int_tiny", "float", "zero"])
            if kind == "int_small":
                w = rng.integers(0, 50, size=(layers, experts))
            elif kind == "int_tiny":
                w = rng.integers(0, 3, size=(layers, experts))
            elif kind == "zero":
                w = np.zeros((layers, experts), dtype=np.int64)
            else:
                w = rng.lognormal(0, 2, size=(layers, experts))
            ref = eplb.rebalance_experts(torch.tensor(w), replicas, groups, nodes, gpus)
            np.save(npy, w)
            cmd = [str(args.dualpipe), "eplb", "--loads", str(npy), "--replicas", str(replicas),
                   "--groups", str(groups), "--nodes", str(nodes), "--gpus", str(gpus),
                   "--policy", "deepseek", "--format", "json"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            shape = f"{kind} L{layers} E{experts} P{replicas} G{groups} N{nodes} R{gpus}"
            checked += 1
            if done.returncode != 0:
                mismatched += 1
                print(f"error on {shape}: {done.stderr.strip()}")
                continue
            plan = json.loads(done.stdout)
            if not (plan["phy2log"] == ref[0].tolist() and plan["log2phy"] == ref[1].tolist()
                    and plan["logcnt"] == ref[2].tolist()):
                mismatched += 1
                print(f"differs: {shape}")
    print(f"{checked} cases, {mismatched} differ")
    sys.exit(1 if mismatched else 0)


if __name__ == "__main__":
    main()
