#!/usr/bin/env python3
"""Our DualPipe runtime against DeepSeek's reference DualPipe on CPU, same shapes, same moment.

Runs `dualpipe train` (release build) and scripts/dualpipe_reference_bench.py one after the
other for every hidden size, so both see the same machine load, and prints a Markdown table.

    cargo build --release -p dualpipe-cli
    pip install torch
    python3 scripts/runtime_reference_compare.py --dualpipe /path/to/DualPipe
    pip install dualpipe   # or DeepSeek's package from PyPI: --dualpipe defaults to where it is installed
    python3 scripts/runtime_reference_compare.py --hidden 128 512 1024 [--json FILE]

The machine's load moves both, so every width is measured in --rounds rounds (reference, ours
DualPipe, ours 1F1B, one after the other) and the table shows the medians over rounds.

Shapes: 4 ranks, 8 micro-batches of 128 rows, one block (h -> 4h -> h) per stage. Each side is
timed two ways. "Pipeline": the reference's `DualPipe.step()`, and the same part of ours. "Whole
step": the training step; ours is data (a teacher network's forward draws the batch), pipeline,
the gradient sum of each stage's two copies and AdamW; the reference's is its `step()`, the same
gradient sum (an all-reduce per pair of ranks) and PyTorch's AdamW, on a batch drawn once. The
first lines name the machine (CPU model, CPUs) and the load average at the start and the end.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def ours(binary, hidden, args, schedule="dualpipe"):
    cmd = [binary, "train", "--model", "mlp", "--schedule", schedule, "--ranks", str(args.ranks),
           "--micro-batches", str(args.micro_batches), "--micro-batch-size", str(args.micro_batch_size),
           "--hidden", str(hidden), "--layers-per-stage", "1", "--steps", str(args.steps),
           "--format", "json", "--quiet"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def reference(hidden, args):
    cmd = [sys.executable, os.path.join(HERE, "dualpipe_reference_bench.py"), "--dualpipe", args.dualpipe,
           "--ranks", str(args.ranks), "--micro-batches", str(args.micro_batches),
           "--micro-batch-size", str(args.micro_batch_size), "--hidden", str(hidden),
           "--steps", str(args.steps), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["results"][0]


def installed_dualpipe():
    """The folder holding an installed `dualpipe` package (PyPI `dualpipe`), if any."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("dualpipe")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.dirname(spec.origin))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dualpipe", default=installed_dualpipe(),
                        help="path to a checkout of deepseek-ai/DualPipe (default: the installed `dualpipe` package's folder)")
    parser.add_argument("--binary", default=os.path.join(HERE, "..", "target", "release", "dualpipe"))
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per width")
    parser.add_argument("--json", help="also write every measurement into this file")
    args = parser.parse_args()
    if not args.dualpipe:
        parser.error("no DeepSeek DualPipe: pass --dualpipe PATH (a checkout) or `pip install dualpipe`")

    load_start = os.getloadavg()
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; load average (1, 5, 15 min) "
          f"{' / '.join(f'{x:.2f}' for x in load_start)} at the start; {args.ranks} ranks, {args.micro_batches} "
          f"micro-batches of {args.micro_batch_size} rows, {args.steps} steps per contender, {args.rounds} rounds")
    print()
    record = []

    print("| hidden | reference ms/step (pipeline) | reference ms/step (whole step) | ours ms/step (pipeline) | ours ms/step (whole step) | speed-up (pipeline) | speed-up (whole step) | ours 1F1B pipeline ms | DualPipe / 1F1B measured | simulated from measured op times |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for hidden in args.hidden:
        rows = []
        for _ in range(args.rounds):
            ref = reference(hidden, args)
            dp = ours(args.binary, hidden, args)
            ob = ours(args.binary, hidden, args, schedule="1f1b")
            rows.append({
                "ref": ref["ms_per_step_median"],
                "ref_step": ref["whole_ms_per_step_median"],
                "pipe": 1e3 * dp["pipeline_seconds_median"],
                "step": 1e3 * dp["step_seconds_median"],
                "pipe_1f1b": 1e3 * ob["pipeline_seconds_median"],
                "sim": dp["simulated_pipeline_seconds"] / ob["simulated_pipeline_seconds"],
            })
        m = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        record.append({"hidden": hidden, "rounds": rows, "median": m, "speedup_pipeline": m["ref"] / m["pipe"],
                       "speedup_whole_step": m["ref_step"] / m["step"], "load": os.getloadavg()})
        speedups = ", ".join(f"{r['ref'] / r['pipe']:.2f}x" for r in rows)
        whole = ", ".join(f"{r['ref_step'] / r['step']:.2f}x" for r in rows)
        print(f"| {hidden} | {m['ref']:.1f} | {m['ref_step']:.1f} | {m['pipe']:.1f} | {m['step']:.1f} "
              f"| {m['ref'] / m['pipe']:.2f}x | {m['ref_step'] / m['step']:.2f}x | {m['pipe_1f1b']:.1f} "
              f"| {m['pipe'] / m['pipe_1f1b']:.2f} | {m['sim']:.2f} |", flush=True)
        print(f"<!-- hidden {hidden}: speed-up per round, pipeline: {speedups}; whole step: {whole} -->", flush=True)
    load_end = os.getloadavg()
    print()
    print(f"load average (1, 5, 15 min) {' / '.join(f'{x:.2f}' for x in load_end)} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": cpu_model(), "cpus": os.cpu_count(), "load_start": load_start, "load_end": load_end,
                       "ranks": args.ranks, "micro_batches": args.micro_batches,
                       "micro_batch_size": args.micro_batch_size, "steps": args.steps, "widths": record}, f, indent=1)


if __name__ == "__main__":
    main()
