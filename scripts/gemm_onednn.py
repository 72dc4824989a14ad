#!/usr/bin/env python3
"""Our bf16 GEMMs beside PyTorch's (oneDNN) on the GPT's GEMM shapes, in one run, one thread.

Issue 30 asks for the step's largest GEMMs as a share of the peak a microbenchmark measures on
the same machine. This sets a kernel library beside that share: every round runs
`examples/gemm_peak --json` (the one-thread peaks, and our GEMMs: bf16 on operands rounded from
f32 as they are packed, and "bf16 in" on operands that are bf16 already), then `torch.mm` on the
same shapes and layouts with torch.set_num_threads(1): on bf16 tensors, and under
`torch.autocast("cpu", dtype=torch.bfloat16)` on f32 tensors (the conversions included, as in
our "bf16" column). Each side is timed in the thread's CPU time, best of repetitions over about
0.4 s, and each rate is the best over the rounds (a shared machine's tile rate moves from second
to second; interleaving gives both sides the same chances). Shares are of the best peak that
gemm_peak measured in any round (the AMX tiles' where the processor has them, else
`vdpbf16ps`).

    python3 scripts/gemm_onednn.py [--rounds 3] [--only d512] [--gemm-peak FILE] [--json FILE]

Needs torch and cargo; without --gemm-peak the example is built first (release).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_gpt_perf  # noqa: E402  (the machine's description, shared with the GPT pairs)


def layout(name: str) -> tuple[bool, bool]:
    """Whether A and B are stored transposed, as our training code reads them (gemm_peak's
    `half_transposed`): the forward reads the weight [n, k] transposed, the weight gradient
    reads dy [k, m] transposed, the input gradient reads both as they are."""
    if " fwd " in name:
        return (False, True)
    if " wgrad " in name:
        return (True, False)
    return (False, False)


def parse_gemm_peak(text: str) -> tuple[float, list[dict]]:
    """The bf16 peak (GFLOP/s: the tiles' where there are tiles) and the GEMM records of
    `gemm_peak --json`'s output."""
    peak, gemms = None, []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if "peak" in rec:
            p = rec["peak"]
            peak = p.get("amx_bf16_gflops") or p.get("bf16_gflops") or p["f32_gflops"]
        elif "gemm" in rec:
            gemms.append(rec)
    if peak is None:
        raise ValueError("gemm_peak --json printed no peak line")
    return peak, gemms


def torch_rates(torch, gemm: dict, budget: float = 0.4) -> dict:
    """GFLOP/s of torch.mm on the GEMM's shape: on bf16 tensors, and under bf16 autocast on
    f32 tensors."""
    m, k, n = gemm["m"], gemm["k"], gemm["n"]
    ta, tb = layout(gemm["gemm"])
    g = torch.Generator().manual_seed(0)
    a = torch.rand(k, m, generator=g).t() if ta else torch.rand(m, k, generator=g)
    b = torch.rand(n, k, generator=g).t() if tb else torch.rand(k, n, generator=g)
    a16, b16 = a.bfloat16(), b.bfloat16()

    def autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.mm(a, b)

    flops = 2.0 * m * k * n
    return {
        "bf16_operands": flops / best_seconds(lambda: torch.mm(a16, b16), budget) / 1e9,
        "autocast": flops / best_seconds(autocast, budget) / 1e9,
    }


def best_seconds(f, budget: float) -> float:
    """The fastest of repetitions of `f` over about `budget` seconds, in thread CPU time."""
    f()
    start, best, reps = time.perf_counter(), float("inf"), 0
    while reps < 3 or time.perf_counter() - start < budget:
        t = time.thread_time()
        f()
        best = min(best, time.thread_time() - t)
        reps += 1
    return best


def merge(rounds: list[tuple[float, list[dict], dict]]) -> tuple[float, list[dict]]:
    """Each side's best rate per GEMM over the rounds, and the best peak: `rounds` holds, per
    round, gemm_peak's peak and records and torch's rates by GEMM name."""
    peak = max(r[0] for r in rounds)
    rows: dict[str, dict] = {}
    for _, gemms, torch_by_name in rounds:
        for g in gemms:
            row = rows.setdefault(g["gemm"], {"gemm": g["gemm"], "m": g["m"], "k": g["k"], "n": g["n"]})
            t = torch_by_name.get(g["gemm"], {})
            for key, value in (
                ("ours_bf16", g["bf16_gflops"]),
                ("ours_bf16_operands", g.get("bf16_operands_gflops")),
                ("torch_autocast", t.get("autocast")),
                ("torch_bf16_operands", t.get("bf16_operands")),
            ):
                if value is not None:
                    row[key] = max(row.get(key, 0.0), value)
    return peak, list(rows.values())


def table(peak: float, rows: list[dict]) -> str:
    """The markdown table: each rate and its share of `peak`, and ours over PyTorch's."""

    def cell(row, key):
        v = row.get(key)
        return "-" if v is None else f"{v:.0f} ({100 * v / peak:.1f}%)"

    def ratio(row, ours, theirs):
        if row.get(ours) is None or not row.get(theirs):
            return "-"
        return f"{row[ours] / row[theirs]:.2f}x"

    out = [
        f"bf16 GEMMs, one thread, GFLOP/s (share of the peak {peak:.0f})",
        "",
        "| GEMM | m x k x n | ours, f32 operands | PyTorch autocast, f32 operands | ours / PyTorch "
        "| ours, bf16 operands | PyTorch, bf16 operands | ours / PyTorch |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['gemm']} | {r['m']}x{r['k']}x{r['n']} | {cell(r, 'ours_bf16')} | {cell(r, 'torch_autocast')} "
            f"| {ratio(r, 'ours_bf16', 'torch_autocast')} | {cell(r, 'ours_bf16_operands')} "
            f"| {cell(r, 'torch_bf16_operands')} | {ratio(r, 'ours_bf16_operands', 'torch_bf16_operands')} |"
        )
    shares = {
        key: [r[key] / peak for r in rows if r.get(key) is not None]
        for key in ("ours_bf16", "torch_autocast", "ours_bf16_operands", "torch_bf16_operands")
    }
    means = ", ".join(f"{k} {100 * sum(v) / len(v):.1f}%" for k, v in shares.items() if v)
    out += ["", f"mean share of the peak: {means}"]
    return "\n".join(out)


def describe_machine(torch) -> str:
    """The processor's model, its CPUs and the AVX-512 / bf16 / AMX flags it has (torch_gpt_perf.py's
    reading of /proc/cpuinfo), and torch's version."""
    m = torch_gpt_perf.machine()
    has = " ".join(f for f, on in m["flags"].items() if on) or "none of the flags looked for"
    return f"{m['model_name']}, {m['cpus']} CPUs ({has}); torch {torch.__version__}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both sides, interleaved (default 3)")
    ap.add_argument("--only", default="d512", help="the GEMMs whose name contains this (default d512)")
    ap.add_argument("--gemm-peak", type=Path, help="a built examples/gemm_peak (default: build it)")
    ap.add_argument("--json", type=Path, help="also write the merged rates here")
    args = ap.parse_args()
    if args.rounds < 1:
        print("gemm_onednn.py: --rounds must be at least 1", file=sys.stderr)
        return 2
    exe = args.gemm_peak
    if exe is not None and not exe.is_file():
        print(f"gemm_onednn.py: --gemm-peak {exe}: no such file; build it with "
              "`cargo build --release -p dualpipe-nn --example gemm_peak`", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("gemm_onednn.py: needs torch (pip install torch)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    if exe is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "dualpipe-nn", "--example", "gemm_peak"],
                       cwd=REPO, check=True)
        exe = REPO / "target" / "release" / "examples" / "gemm_peak"
    print(f"# machine: {describe_machine(torch)}", flush=True)
    rounds = []
    for i in range(args.rounds):
        out = subprocess.run([str(exe), "--json", "--only", args.only], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"gemm_onednn.py: {exe} failed (exit {out.returncode}): {out.stderr.strip()}", file=sys.stderr)
            return 1
        peak, gemms = parse_gemm_peak(out.stdout)
        if not gemms:
            print(f"gemm_onednn.py: --only {args.only!r} matches none of gemm_peak's GEMMs", file=sys.stderr)
            return 2
        theirs = {g["gemm"]: torch_rates(torch, g) for g in gemms}
        print(f"# round {i + 1}: peak {peak:.0f} GFLOP/s", flush=True)
        rounds.append((peak, gemms, theirs))
    peak, rows = merge(rounds)
    print(table(peak, rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": describe_machine(torch), "peak_gflops": peak, "gemms": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
