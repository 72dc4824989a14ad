"""``DualPipeStrategy(zero=1|2)`` under torchrun on gloo: exactly ``zero=0`` in f64, checkpoints
moved between ZeRO levels, replica counts and schedules, compression's bytes and quality, and
each rank's optimizer-state bytes against the formula.

torchrun runs torch_zero_worker.py (suite ``exact`` on 4 processes, ``memory`` on 2 and 4); the
tests compare what the workers saved. Skipped, with the reason, where torch is not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# torch as the strategy's tests import it: skipped with the reason where it is not installed,
# required under DUALPIPE_REQUIRE_TORCH=1
from test_torch_strategy import load, torch, torchrun  # noqa: E402


def torchrun_zero(nproc, suite, out, timeout=300):
    return torchrun(nproc, suite, out, timeout, worker="torch_zero_worker.py")


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero")
    rc, log, _ = torchrun_zero(4, "exact", out)
    assert rc == 0, log[-6000:]
    return out


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero-memory")
    for nproc in (2, 4):
        rc, log, _ = torchrun_zero(nproc, "memory", out)
        assert rc == 0, log[-6000:]
    return out


@pytest.mark.parametrize("zero", [1, 2])
@pytest.mark.parametrize("kind", ["dualpipe", "dualpipev", "1f1b"])
def test_f64_is_bit_identical_to_zero_0(exact, kind, zero):
    """Pipeline 2 x 2 replicas, 5 steps: the same losses and weights, bit for bit (every value
    is summed in the same order: DualPipe's copies direction 0 first, the replicas in replica
    order, and AdamW is elementwise)."""
    base, sharded = load(exact, f"exact-{kind}-0"), load(exact, f"exact-{kind}-{zero}")
    for a, b in zip(base, sharded):
        assert b["zero"] == zero and a["losses"] == b["losses"]
        assert a["params"].keys() == b["params"].keys()
        for k in a["params"]:
            assert torch.equal(a["params"][k], b["params"][k]), k
        # and each rank keeps less: a quarter of the state for dualpipe (2 copies x 2 replicas), a half otherwise
        share = 4 if kind == "dualpipe" else 2
        assert b["stats"]["optimizer_state_bytes"] < a["stats"]["optimizer_state_bytes"] / share * 1.2


@pytest.mark.parametrize("case", ["uneven", "interleaved", "sgd", "gpt"])
def test_more_stages_per_rank_another_optimizer_and_the_example_model_are_bit_identical(exact, case):
    """DualPipe with pieces of unequal size that cut tensors; interleaved 1F1B (two stages per rank); SGD with momentum built by a factory (its
    ``momentum_buffer`` sharded and, saved after 3 steps, gathered whole by name); the
    custom-model example's transformer (embedding, positions, attention, layer norms) at zero=1."""
    from safetensors.torch import load_file

    for a, b in zip(load(exact, f"exact-{case}-0"), load(exact, f"exact-{case}-{1 if case == 'gpt' else 2}")):
        assert a["losses"] == b["losses"]
        assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    if case == "sgd":
        whole, pieces = (load_file(str(exact / f"ckpt-sgd-{z}" / "optimizer" / "5.safetensors")) for z in (0, 2))
        assert sorted(whole) == sorted(pieces) == ["5.0.bias/momentum_buffer", "5.0.weight/momentum_buffer"]
        assert all(torch.equal(whole[k], pieces[k]) for k in whole)


@pytest.mark.parametrize("name", ["same", "z0", "z2-dualpipev", "z2-zb1p-1replica", "z1-1f1b-4replicas"])
def test_zero_checkpoint_resumes_anywhere(exact, name):
    """A zero=1 DualPipe 2 x 2 checkpoint resumed on the same grid, at zero=0, at zero=2 with
    DualPipeV, on 4-rank ZB1P (1 replica) and on 1-rank 1F1B x 4 replicas."""
    straight = load(exact, "ckpt-straight")[0]["losses"]
    for r in load(exact, f"ckpt-{name}"):
        if name == "same":
            assert r["losses"] == straight
        else:
            assert r["losses"] == pytest.approx(straight, rel=0, abs=1e-10)


def test_zero_0_checkpoint_resumes_at_zero_2(exact):
    straight = load(exact, "ckpt0-straight")[0]["losses"]
    for r in load(exact, "ckpt0-z2"):
        assert r["losses"] == pytest.approx(straight, rel=0, abs=1e-10)


def test_zero_checkpoint_files_are_named_by_the_users_keys(exact):
    from safetensors.torch import load_file

    manifest = json.loads((exact / "ckpt-z1" / "manifest.json").read_text())
    assert manifest["zero"] == 1 and manifest["replicas"] == 2
    assert not any("rank" in f for f in manifest["files"])
    state = load_file(str(exact / "ckpt-z1" / "optimizer" / "3.safetensors"))
    # whole tensors, gathered from the pieces of 2 copies x 2 replicas
    assert sorted(state) == ["3.0.bias/exp_avg", "3.0.bias/exp_avg_sq", "3.0.bias/step",
                             "3.0.weight/exp_avg", "3.0.weight/exp_avg_sq", "3.0.weight/step"]
    assert state["3.0.weight/exp_avg"].shape == (8, 8) and bool((state["3.0.weight/exp_avg_sq"] > 0).all())


def test_onebit_with_zero_resumes_bit_identical(exact):
    assert load(exact, "ckpt-1bit-straight")[0]["losses"] == load(exact, "ckpt-1bit-resumed")[0]["losses"]


@pytest.mark.parametrize("kind", ["1f1b", "dualpipe"])
@pytest.mark.parametrize("comp", ["int8", "1bit"])
def test_compression_keeps_its_bytes_under_zero(exact, kind, comp):
    """What a rank sends to the other replicas per step (reduce-scatter plus the weights' gather)
    is what zero=0 sends (reduce-scatter plus the gradients' gather); DualPipe's copies exchange
    half as much. Replicas stay bit-identical; the losses stay near the uncompressed ones."""
    base = load(exact, f"comp-{kind}-{comp}-0")
    exact_losses = load(exact, f"comp-{kind}-None-0")[0]["losses"]
    for zero in (1, 2):
        runs = load(exact, f"comp-{kind}-{comp}-{zero}")
        for a, b in zip(base, runs):
            for (g0, c0, p0), (g, c, p) in zip(a["sent"][1:], b["sent"][1:]):  # after the warm-up step
                # the same payload; each message adds a 24-byte stamp and at most 2 chunk scales
                # (ZeRO sends 2 messages per stage copy and step for 1F1B, 4 for DualPipe's)
                assert p0 == 0 and g + p <= g0 + 32 * (8 if kind == "dualpipe" else 2), (g0, g, p)
                assert c == c0 / 2
        for a, b in zip(runs[: len(runs) // 2], runs[len(runs) // 2 :]):
            assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
        drift = max(abs(x - y) for x, y in zip(runs[0]["losses"], exact_losses))
        base_drift = max(abs(x - y) for x, y in zip(base[0]["losses"], exact_losses))
        assert drift <= max(base_drift * 1.1, 1e-3), (drift, base_drift)


def _region(n: int, copies: int, replicas: int, c: int, r: int) -> int:
    """The values piece (c, r) of a stage of n values holds: half c, then shard r of it."""
    h = n // copies + (c < n % copies)
    return h // replicas + (r < h % replicas)


def _pieces(numels, lo, hi):
    at, k = 0, 0
    for n in numels:
        k += max(lo, at) < min(hi, at + n)
        at += n
    return k


def _expected(r):
    """Parameters, gradients and optimizer state of one rank by the formula (AdamW: two moments of
    the parameters' dtype per value held, a 4-byte ``step`` per tensor)."""
    st, zero, copies, D, replica = r["stats"], r["zero"], r["copies"], r["replicas"], r["replica"]
    item = next(iter(r["params"].values())).element_size()
    params = grads = state = 0
    for (d, _), numels in r["sizes"].items():
        n = sum(numels)
        params += n * item
        if zero == 0:
            grads += n * item
            state += 2 * item * n + 4 * len(numels)
            continue
        lo = sum(_region(n, copies, D, c, rr) for c in range(copies) for rr in range(D) if c * D + rr < d * D + replica)
        owned = _region(n, copies, D, d, replica)
        grads += (n if zero == 1 else owned) * item
        state += 2 * item * owned + 4 * _pieces(numels, lo, lo + owned)
    return {"parameter_bytes": params, "gradient_bytes": grads, "optimizer_state_bytes": state}, st


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("grid", ["2-dualpipe-2", "2-dualpipev-2", "4-dualpipe-2", "4-dualpipev-2", "4-dualpipev-1"])
def test_memory_per_rank_is_the_formula(mem, grid, dtype):
    """Measured on the tensors after two steps, at 1, 2 and 4 replicas: each rank's bytes equal
    the formula, and the state of every stage exists once over all ranks (zero >= 1) instead of
    once per copy and replica."""
    world, kind, stages = grid.split("-")
    totals = {}
    for zero in (0, 1, 2):
        ranks = load(mem, f"mem{world}-{kind}-{stages}-{dtype}-{zero}")
        for r in ranks:
            want, st = _expected(r)
            assert {k: st[k] for k in want} == want, (zero, r["replica"])
        totals[zero] = sum(r["stats"]["optimizer_state_bytes"] for r in ranks)
    assert totals[1] == totals[2] and (totals[1] < totals[0] or ranks[0]["copies"] * ranks[0]["replicas"] == 1)


def test_a_bad_zero_level_is_one_clear_error(tmp_path):
    rc, log, _ = torchrun_zero(2, "errors", tmp_path, timeout=120)
    assert rc == 0, log[-4000:]
    for rank in (0, 1):
        e = json.loads((tmp_path / f"errors-rank{rank}.json").read_text())
        for bad in ("3", "-1", "'1'", "True", "None"):
            assert e[bad] == (
                "ValueError: zero must be 0 (every replica keeps the whole optimizer state), 1 (optimizer "
                "state sharded over the replicas and DualPipe's copies) or 2 (gradients too), got " + bad
            ), e[bad]
