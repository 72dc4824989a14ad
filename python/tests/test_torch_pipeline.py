"""`dualpipe_rs.torch`: our schedules on torch.distributed.pipelining's runtime.

For every kind torch can execute, 2 and 4 gloo processes on loopback (torch_pipeline_worker.py)
run one step of an f64 ``nn.Sequential`` through ``dualpipe_rs.torch.schedule``: the gradients
and losses equal those of the whole model in one process, and the compute actions torch executes
equal ours op for op. Skipped, with the reason, where torch is not installed.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("DUALPIPE_REQUIRE_TORCH"):  # CI: torch is installed, so these tests must run
    import torch
else:
    torch = pytest.importorskip(
        "torch", reason="torch is not installed (pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    )
if not torch.distributed.is_available() and not os.environ.get("DUALPIPE_REQUIRE_TORCH"):  # pragma: no cover
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import dualpipe_rs  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch_pipeline_worker as worker  # noqa: E402

# (world size, kind, micro-batches, stages per rank): every kind on 2 and on 4 ranks; odd counts,
# three virtual stages, and DualPipeV below its stage count (which torch's ScheduleDualPipeV refuses).
CASES = [
    (2, "gpipe", 4, 1),
    (2, "1f1b", 4, 1),
    (2, "zb1p", 4, 1),
    (2, "interleaved", 4, 2),
    (2, "interleaved", 5, 3),
    (2, "dualpipev", 3, 2),
    (2, "dualpipev", 6, 2),
    (4, "gpipe", 5, 1),
    (4, "1f1b", 5, 1),
    (4, "zb1p", 6, 1),
    (4, "interleaved", 8, 2),
    (4, "dualpipev", 5, 2),
    (4, "dualpipev", 10, 2),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs every case, one spawn per world size; returns the output directory."""
    out = tmp_path_factory.mktemp("torch-pipeline")
    for world in sorted({c[0] for c in CASES}):
        cmd = [sys.executable, str(HERE / "torch_pipeline_worker.py"), "--world", str(world), "--out", str(out)]
        for w, kind, mbs, local in CASES:
            if w == world:
                cmd += ["--case", f"{kind}:{mbs}:{local}"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
    return out


def reference(micro_batches):
    """Gradients and per-micro-batch losses of the whole model in one process (mean over micro-batches)."""
    model = worker.build_model()
    x, y = worker.batch(micro_batches)
    losses = []
    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        loss = worker.loss_fn(model(xm), ym)
        (loss / micro_batches).backward()
        losses.append(float(loss.detach()))
    grads = {}
    for b, block in enumerate(model):
        for name, p in block.named_parameters():
            grads[f"{b}.{name}"] = p.grad.clone()
    return grads, losses


def load(out, world, kind, mbs, local):
    files = sorted(glob.glob(str(out / f"{kind}-{world}x{mbs}-v{local}-rank*.pt")))
    assert len(files) == world, files
    return [torch.load(f) for f in files]


@pytest.mark.parametrize("world,kind,mbs,local", CASES, ids=[f"{k}-{w}ranks-{m}mb-v{v}" for w, k, m, v in CASES])
def test_gradients_equal_one_process(runs, world, kind, mbs, local):
    per_rank = load(runs, world, kind, mbs, local)
    want, want_losses = reference(mbs)
    got = {}
    for r in per_rank:
        assert not set(got) & set(r["grads"]), "a parameter is held by two ranks"
        got.update(r["grads"])
    assert sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-13, msg=f"{kind}: {name}")
    losses = [r["losses"] for r in per_rank if r["losses"] is not None]
    assert len(losses) == 1
    assert losses[0] == pytest.approx(want_losses, rel=1e-12)


@pytest.mark.parametrize("world,kind,mbs,local", CASES, ids=[f"{k}-{w}ranks-{m}mb-v{v}" for w, k, m, v in CASES])
def test_torch_runs_our_actions_op_for_op(runs, world, kind, mbs, local):
    vs = local if kind == "interleaved" else None
    ours = dualpipe_rs.schedule(kind, world, mbs, virtual_stages=vs).actions
    for rank, r in enumerate(load(runs, world, kind, mbs, local)):
        assert r["ours"] == ours[rank]
        assert r["torch"] == ours[rank], f"rank {rank}"
        comms = [a for a in r["torch_with_comms"] if "SEND" in a or "RECV" in a]
        assert comms, "torch added no communication"
        if kind == "dualpipev" and mbs >= 2 * world:
            # torch's own ScheduleDualPipeV, at the counts it accepts, runs the same program.
            assert r["torch_own"] == ours[rank], f"rank {rank}"
    if kind == "dualpipev":
        assert any("OVERLAP_F_B" in a for row in ours for a in row)


def test_bad_calls_fail_in_our_words(runs):
    errors = json.loads((runs / "errors-2.json").read_text())
    assert errors["dualpipe"].startswith("ValueError: dualpipe cannot run on torch's pipeline runtime")
    assert "use 'dualpipev'" in errors["dualpipe"]
    assert errors["unknown_kind"] == "ValueError: unknown schedule 'zigzag': use one of gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev"
    assert "dualpipev places 2 stages on each rank, got 1 on rank 0" in errors["one_stage_dualpipev"]
    assert "1f1b places 1 stage on each rank, got 2" in errors["two_stages_1f1b"]
    assert errors["zero_microbatches"].startswith("ValueError: dualpipev needs at least 1 micro-batch, got 0")
    assert "--micro-batches" not in errors["zero_microbatches"] and "n_microbatches=1" in errors["zero_microbatches"]
    assert errors["float_microbatches"] == "TypeError: n_microbatches must be an int, not float"
    assert errors["wrong_stages"] == (
        "ValueError: rank 0 holds stages [0, 3], but interleaved on 2 ranks places stages [0, 2] on it: "
        "build this rank's PipelineStage objects for stages [0, 2]"
    )
    assert errors["not_stages"].startswith("TypeError: stages[0] is a Sequential, not a torch.distributed.pipelining PipelineStage")
    assert "interleaved needs at least 2 stages per rank" in errors["one_stage_interleaved"]
    # The count our dualpipev ran above (3 micro-batches on 2 ranks) is one torch's own refuses.
    assert "at least as many microbatches as stages" in errors["torch_dualpipev_below_stages"]


def test_profile_measures_every_op_and_predicts_every_kind():
    import dualpipe_rs.torch as dpt

    model = worker.build_model()
    x, y = worker.batch(1)
    p = dpt.profile(model, x, loss_fn=worker.loss_fn, target=y, repeats=3, warmup=1)
    for op in ("f", "b", "i", "w", "fb"):
        assert getattr(p, op) > 0, op
        assert len(p.samples[op]) == 3
    # Every backward really ran: one run (no warm-up) is three backward passes (B, I + W, and
    # FB's), so each parameter holds three times the gradient of one.
    once = worker.build_model()
    worker.loss_fn(once(x), y).backward()
    model.zero_grad()
    dpt.profile(model, x, loss_fn=worker.loss_fn, target=y, repeats=1, warmup=0)
    for (name, got), want in zip(model.named_parameters(), once.parameters()):
        torch.testing.assert_close(got.grad, 3 * want.grad, rtol=1e-12, atol=1e-15, msg=name)
    # A middle stage (no loss): the backward starts from an output gradient.
    mid = dpt.profile(model[:4], x, repeats=1, warmup=0)
    assert min(mid.f, mid.b, mid.i, mid.w, mid.fb) > 0
    pred = dpt.predict(p, ranks=4, micro_batches=8)
    assert sorted(pred) == sorted(dpt.TORCH_KINDS)
    for kind, report in pred.items():
        per_rank = 2 if kind in ("dualpipev", "interleaved") else 1
        cost = p.cost(1 / (4 * per_rank), split=kind in ("zb1p", "dualpipev"))
        direct = dualpipe_rs.simulate(kind, 4, 8, 2 if kind == "interleaved" else None, **cost)
        assert report["makespan"] == direct["makespan"], kind
        assert report["makespan"] > 0
    split = p.cost(split=True)
    assert split["b"] == pytest.approx(p.i + p.w) and split["w"] == p.w
    assert max(p.f, split["b"]) <= split["fb"] <= p.f + split["b"]
    whole = p.cost()
    assert whole["b"] == p.b and whole["w"] == min(p.w, p.b) and whole["f"] == p.f
    assert whole["fb"] == min(max(p.fb, p.f, p.b), p.f + p.b)
    assert p.cost(0.5)["f"] == p.f * 0.5
    # A module holding half the model: every stage is twice its share.
    half = dpt.predict(p, ranks=4, micro_batches=8, kinds=["1f1b"], model_share=0.5)
    assert half["1f1b"]["makespan"] == pytest.approx(2 * pred["1f1b"]["makespan"])
    with pytest.raises(ValueError, match="model_share must be in"):
        dpt.predict(p, 4, 8, model_share=0)
    with pytest.raises(ValueError, match="loss_fn and target go together"):
        dpt.profile(model, x, loss_fn=worker.loss_fn)
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        dpt.profile(model, x, repeats=0)

