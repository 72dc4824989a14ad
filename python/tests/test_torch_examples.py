"""The torch examples of docs/python.md run: python/examples/train_dualpipev.py trains (its loss
falls), python/examples/torch_dualpipev.py sets ours beside torch's ScheduleDualPipeV,
python/examples/torch_strategy_train.py trains a small transformer under torchrun, and
python/examples/torch_hf_train.py a transformers DeepSeek-V3 with expert parallelism and EPLB."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

if not os.environ.get("DUALPIPE_REQUIRE_TORCH"):
    pytest.importorskip("torch", reason="torch is not installed (pip install torch --index-url https://download.pytorch.org/whl/cpu)")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, *args):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    p = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_train_dualpipev_example_trains(tmp_path):
    out = _run(tmp_path, EXAMPLES / "train_dualpipev.py")
    assert out.startswith("Schedule(kind='dualpipev', ranks=2, micro_batches=6, virtual_stages=2")
    assert "OVERLAP_F_B" in out
    losses = [float(v) for v in re.findall(r"^step \d+: loss (\S+)$", out, re.M)]
    assert len(losses) == 8
    assert losses[-1] < 0.9 * losses[0], losses


def test_side_by_side_example_runs(tmp_path):
    out = _run(tmp_path, EXAMPLES / "torch_dualpipev.py", "--steps", "3", "--warmup", "1")
    assert "execute the same actions" in out
    rows = re.findall(r"^\s+\d+ \| +(\S+) \| +(\S+) \|", out, re.M)
    assert len(rows) == 3
    for ours, theirs in rows:  # the same program on the same runtime: the same losses
        assert float(ours) == pytest.approx(float(theirs), rel=1e-5)
    assert "median step over 2 steps" in out
    assert "torch's says: ValueError: DualPipeV requires at least as many microbatches as stages" in out


def test_strategy_example_trains_under_torchrun(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(EXAMPLES / "torch_strategy_train.py"), "--steps", "11", "--rows", "16", "--save", str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert out.startswith("2 processes: 2 pipeline ranks x 1 replicas, dualpipe, 8 micro-batches, stages of [4, 4] layers")
    losses = [float(v) for v in re.findall(r"^step +\d+  loss (\S+)", out, re.M)]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0], losses
    assert (tmp_path / "ckpt" / "manifest.json").exists() and (tmp_path / "ckpt" / "model" / "blocks.0.safetensors").exists()


def test_hf_deepseek_example_trains_with_expert_parallelism_and_eplb(tmp_path):
    """python/examples/torch_hf_train.py: a tiny DeepSeek-V3 from transformers, DualPipe 2 x 2,
    experts sharded over the replicas and re-placed by EPLB after step 2."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
         str(EXAMPLES / "torch_hf_train.py"), "--model", "deepseek_v3", "--steps", "4"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert out.startswith("DeepseekV3ForCausalLM: dualpipe, 2 pipeline ranks x 2 replicas")
    losses = [float(v) for v in re.findall(r"^step \d+: loss (\S+)$", out, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    moves = re.findall(r"^  EPLB: balance per MoE layer ((?:\S+ )+)-> ((?:\S+ ?)+), (\d+) experts moved$", out, re.M)
    assert len(moves) == 2, out
    for before, after, _ in moves:
        assert max(map(float, after.split())) <= max(map(float, before.split()))
