"""`DualPipeStrategy` on Hugging Face ``transformers`` causal LMs as they are (``loss_fn=None``).

torchrun runs hf_worker.py once (2 processes, gloo, f64): GPT-2 (tied embeddings), Llama, Qwen2
(tied), Mistral (a sliding window shorter than the sequence) and DeepSeek-V3 (a dense layer, MoE
layers, MLA) under ``dualpipe``, ``dualpipev`` and ``1f1b``. The tests compare each run's losses
and final parameters with the same model trained in one process with its own
``model(input_ids, labels=labels).loss``, and load each 1F1B checkpoint back into the
``transformers`` model. Skipped where torch or transformers is not installed (CI installs both).
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pytest

if os.environ.get("DUALPIPE_REQUIRE_TORCH"):  # CI: torch and transformers are installed, so these tests must run
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import conftest  # noqa: E402
import hf_worker as worker  # noqa: E402

NPROC = 2
CASES = [(f, s) for f in worker.FAMILIES for s in worker.SCHEDULES]


def torchrun(nproc: int, suite: str, out: Path, timeout: float = 300):
    """Runs the worker under torchrun; returns (returncode, output, seconds)."""
    return conftest.torchrun(HERE / "hf_worker.py", nproc, suite, out, timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    rc, log, _ = torchrun(NPROC, "families", out)
    assert rc == 0, log[-6000:]
    return out


def merged(out: Path, name: str):
    """Every rank's losses (the same on all) and the union of their parameters."""
    files = sorted(glob.glob(str(out / f"{name}-rank*.pt")))
    assert len(files) == NPROC, name
    runs = [torch.load(f) for f in files]
    params = {}
    for r in runs:
        params.update(r["params"])
    return runs[0]["losses"], params, runs


_REFERENCE = {}


@pytest.fixture(autouse=True)
def one_thread():
    """The single-process oracles on one thread: on a busy 2-core machine torch's default two
    threads made them 40 to 80 times slower (20 s against 0.5 s for the DeepSeek-V3 one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def one_process(family: str, micro_batches: int):
    """One process: the model's own loss per micro-batch, mean gradients, AdamW; per-step losses
    and the trained model (cached)."""
    if (family, micro_batches) in _REFERENCE:
        return _REFERENCE[(family, micro_batches)]
    model = worker.build(family)
    opt = worker.adamw(model.parameters())
    losses = []
    for x in worker.batches(3, micro_batches * worker.ROWS_PER_MB):
        opt.zero_grad()
        total = 0.0
        for xm in x.chunk(micro_batches):
            loss = model(input_ids=xm, labels=xm).loss
            (loss / micro_batches).backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total / micro_batches)
    _REFERENCE[(family, micro_batches)] = (losses, model)
    return _REFERENCE[(family, micro_batches)]


def reference(family: str):
    """The oracle of the 2-process runs: one replica, 2 x 2 micro-batches."""
    return one_process(family, 2 * NPROC)


@pytest.mark.parametrize("family,schedule", CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_losses_and_weights_equal_one_process(runs, family, schedule):
    losses, params, _ = merged(runs, f"{family}-{schedule}")
    ref_losses, model = reference(family)
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = model.state_dict()
    assert set(params) == {k for k, p in model.named_parameters(remove_duplicate=False)}
    for key, p in params.items():
        assert torch.allclose(p, state[key], rtol=0, atol=1e-10), key


@pytest.mark.parametrize("family", worker.FAMILIES)
def test_checkpoint_loads_into_the_transformers_model(runs, family):
    """The 1F1B run's checkpoint, by the model's own keys, loads whole into a fresh model."""
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted((runs / f"ckpt-{family}-1f1b" / "model").glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    model = worker.build(family)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    _, trained = reference(family)
    for key, t in trained.state_dict().items():
        assert torch.allclose(model.state_dict()[key], t, rtol=0, atol=1e-10), key
    if trained.get_output_embeddings().weight is trained.get_input_embeddings().weight:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied


def test_unknown_architecture_names_the_recipe():
    """A causal LM of a family the adapter does not know: one error with the wrapper recipe."""
    import dualpipe_rs.torch as dpt

    config = transformers.GPTNeoXConfig(vocab_size=32, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=8)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match=r"model_type 'gpt_neox'.*nn\.Sequential.*loss_fn.*docs/python\.md"):
        dpt.DualPipeStrategy(model, worker.adamw, None, schedule="1f1b", pipeline_stages=1, micro_batches=2)


def test_blocks_cut_a_transformers_module_like_any_other():
    """With blocks= a transformers module is cut by its children, as before the adapter."""
    import dualpipe_rs.torch as dpt

    body = worker.build("gpt2").transformer  # GPT2Model: wte, wpe, drop, h, ln_f
    s = dpt.DualPipeStrategy(body, worker.adamw, lambda out, y: out.sum(), blocks="h", schedule="1f1b",
                             pipeline_stages=1, micro_batches=2)
    assert s._hf is None and [p for p, _ in s._layers.units][:4] == ["wte", "wpe", "drop", "h.0"]


def test_loss_fn_none_needs_a_transformers_model():
    import dualpipe_rs.torch as dpt

    with pytest.raises(TypeError, match="loss_fn=None takes a transformers causal LM's own loss"):
        dpt.DualPipeStrategy(torch.nn.Sequential(torch.nn.Linear(2, 2)), worker.adamw, None, schedule="1f1b",
                             pipeline_stages=1, micro_batches=2)


# -- expert parallelism ------------------------------------------------------------------------

EXPERT_TENSORS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@pytest.fixture(scope="module")
def ep_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-ep")
    rc, log, _ = torchrun(4, "experts", out)
    assert rc == 0, log[-6000:]
    return out


def ep_reference():
    """One process, one replica with every replica's micro-batches (8), the unsharded model."""
    return one_process("deepseek_v3", 8)


@pytest.mark.parametrize("schedule", worker.SCHEDULES + ["groups"])
def test_expert_parallel_equals_the_unsharded_model(ep_runs, schedule):
    """DeepSeek-V3, 2 pipeline ranks x 2 replicas, expert_parallel=2: each replica holds 4 of the 8
    routed experts of every MoE layer, re-placed by EPLB after every step (experts and their AdamW
    state moved); losses and weights (the shards put together by the placement) equal the
    unsharded model trained in one process. ``groups``: 1 pipeline rank x 4 replicas in two expert
    groups of 2 (replicas 0 and 2 hold the same shard)."""
    files = sorted(glob.glob(str(ep_runs / f"ep-{schedule}-rank*.pt")))
    runs = [torch.load(f) for f in files]
    assert len(runs) == 4
    ref_losses, model = ep_reference()
    for r in runs:
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = model.state_dict()
    shards = {}
    seen = set()
    for r in runs:
        for key, p in r["params"].items():
            seen.add(key)
            if key.endswith(EXPERT_TENSORS):
                shards.setdefault(key, {}).setdefault(r["replica"] % 2, []).append(p)
                assert p.shape[0] == state[key].shape[0] // 2, key  # half the experts on each replica
            else:
                assert torch.allclose(p, state[key], rtol=0, atol=1e-10), key
    assert seen == {k for k, _ in model.named_parameters(remove_duplicate=False)}
    assert shards
    moe_layers = sorted({int(k.split(".")[2]) for k in shards})
    placement = runs[0].get("placement")  # [MoE layers, slots]: the logical expert in each slot
    for key, by_shard in shards.items():
        for a, b in zip(by_shard[0], by_shard[1]):
            by_slot = torch.cat([a, b])
            whole = by_slot
            if placement is not None:
                whole = torch.empty_like(by_slot)
                whole[placement[moe_layers.index(int(key.split(".")[2]))]] = by_slot
            assert torch.allclose(whole, state[key], rtol=0, atol=1e-10), key
    if schedule == "groups":
        for r in runs:  # a strategy with sharded experts refuses checkpoints, on every rank, in one line
            assert r["save"].startswith("ValueError: checkpoints of sharded experts (expert_parallel > 1) are not "
                                        "supported yet"), r["save"]
    if schedule in ("dualpipe", "dualpipev"):  # their FB pairs ran with the all-to-all overlap
        assert all(r["overlapped_pairs"] > 0 for r in runs)
    if placement is not None:  # EPLB after every step: experts moved, the balance no worse
        for r in runs:
            assert r["eplb"] == runs[0]["eplb"] and torch.equal(r["placement"], placement)
        assert runs[0]["eplb"][-1]["eplb_moved_experts_total"] > 0
        assert not torch.equal(placement, torch.arange(8).repeat(len(moe_layers), 1))
        for st in runs[0]["eplb"]:
            assert all(a <= b for a, b in zip(st["eplb_balance_after"], st["eplb_balance_before"]))


def test_expert_settings_refused_in_one_line():
    """Bad expert-parallel settings are refused before any process waits (one process here)."""
    import dualpipe_rs.torch as dpt

    model = worker.build("deepseek_v3")
    with pytest.raises(ValueError, match=r"expert_parallel=2 does not divide the 1 data-parallel replica: give a divisor"):
        dpt.DualPipeStrategy(model, worker.adamw, None, schedule="1f1b", pipeline_stages=1, micro_batches=2,
                             expert_parallel=2)
    with pytest.raises(ValueError, match="eplb_interval re-places sharded experts: it needs expert_parallel of 2 or more"):
        dpt.DualPipeStrategy(model, worker.adamw, None, schedule="1f1b", pipeline_stages=1, micro_batches=2,
                             eplb_interval=5)
    with pytest.raises(ValueError, match=r"zero=1 with expert_parallel=2: sharding the experts' optimizer state"):
        dpt.DualPipeStrategy(model, worker.adamw, None, schedule="1f1b", pipeline_stages=1, micro_batches=2,
                             expert_parallel=2, zero=1)
    with pytest.raises(ValueError, match="the model has no MoE layer"):
        dpt.DualPipeStrategy(worker.build("llama"), worker.adamw, None, schedule="1f1b", pipeline_stages=1,
                             micro_batches=2, expert_parallel=1 + 1)
