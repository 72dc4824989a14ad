"""scripts/dualpipe_reference_bench.py: the reference's whole training step sums each stage's
gradients with its copy's before AdamW, as a DualPipe training step must.

Checked on gloo with four processes and stand-in stages (no checkout of DeepSeek's DualPipe
needed): rank r holds stages r and 3 - r, every gradient starts as a value naming its stage and
its rank, and after `sum_copies` both copies of every stage hold the sum of the two.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os

import pytest

from conftest import REPO_ROOT

if not os.environ.get("DUALPIPE_REQUIRE_TORCH"):  # CI: torch is installed, so these tests must run
    pytest.importorskip("torch", reason="torch is not installed (pip install torch --index-url https://download.pytorch.org/whl/cpu)")

SCRIPT = REPO_ROOT / "scripts" / "dualpipe_reference_bench.py"
spec = importlib.util.spec_from_file_location("dualpipe_reference_bench", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

RANKS = 4


def stage_module(torch, stage):
    """A stand-in stage whose shape depends on the stage, so that an all-reduce pairing the
    wrong stages mixes values of different tensors."""
    return torch.nn.Sequential(torch.nn.Linear(2 + stage, 3, bias=False), torch.nn.Linear(3, 1 + stage, bias=False))


def worker(rank, port, queue):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    ids = bench.stage_ids(rank, RANKS)
    local = torch.nn.Sequential(*(stage_module(torch, s) for s in ids))
    for stage, module in zip(ids, local):
        for k, p in enumerate(module.parameters()):
            p.grad = torch.full_like(p, 1000.0 * stage + 100.0 * k + rank)
    bench.sum_copies(torch, dist, local, rank, RANKS, bench.pair_groups(dist, RANKS))
    queue.put((rank, [(stage, k, p.grad.unique().tolist()) for stage, module in zip(ids, local)
                      for k, p in enumerate(module.parameters())]))
    dist.destroy_process_group()


def test_each_stage_holds_the_sum_of_its_two_copies():
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = bench.free_port()
    # Daemons: a worker stuck in gloo fails the test at the queue timeout instead of holding pytest open.
    procs = [ctx.Process(target=worker, args=(r, port, queue), daemon=True) for r in range(RANKS)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in range(RANKS))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert bench.stage_ids(0, RANKS) == (0, 3) and bench.stage_ids(2, RANKS) == (2, 1)
    for rank, grads in results.items():
        assert len(grads) == 4
        for stage, k, values in grads:
            # Stage s lives on ranks s and RANKS - 1 - s: their rank numbers sum to RANKS - 1.
            assert values == [2 * (1000.0 * stage + 100.0 * k) + RANKS - 1], (rank, stage, k)
