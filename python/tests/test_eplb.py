"""dualpipe_rs.eplb.rebalance_experts: parity with DeepSeek's eplb.py, types, dtypes, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import golden_files, load_golden
from dualpipe_rs.eplb import rebalance_experts

NAMES = ("phy2log", "log2phy", "logcnt")
GOLDEN = golden_files("eplb")
# The cases whose loads are small integers (many ties): the tie-breaking must match too.
INTEGER_GOLDEN = [
    p for p in GOLDEN if p.values[0] is None or load_golden(p.values[0]).get("weight_is_integer")
]


def _args(case):
    return (case["num_replicas"], case["num_groups"], case["num_nodes"], case["num_gpus"])


def _check_against(case, out):
    for name, got in zip(NAMES, out):
        want = np.asarray(case[name], dtype=np.int64)
        assert isinstance(got, np.ndarray), name
        assert got.dtype == np.int64, name
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("path", GOLDEN)
def test_golden_parity_from_lists(path):
    case = load_golden(path)
    _check_against(case, rebalance_experts(case["weight"], *_args(case)))


@pytest.mark.parametrize("path", GOLDEN)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_golden_parity_from_numpy_floats(path, dtype):
    # The reference rounds loads to float32 first, so float32 input gives the same plan.
    case = load_golden(path)
    weight = np.asarray(case["weight"], dtype=dtype)
    _check_against(case, rebalance_experts(weight, *_args(case)))


@pytest.mark.parametrize("path", INTEGER_GOLDEN)
def test_golden_parity_from_numpy_ints(path):
    case = load_golden(path)
    weight = np.asarray(case["weight"], dtype=np.int64)
    assert (weight == np.asarray(case["weight"])).all()
    _check_against(case, rebalance_experts(weight, *_args(case)))


def _small():
    rng = np.random.default_rng(7)
    return rng.integers(0, 100, size=(3, 16)).astype(np.float64)


def test_results_are_plain_writable_int64_arrays():
    weight = _small()
    phy2log, log2phy, logcnt = rebalance_experts(weight, 24, 4, 2, 8)
    assert phy2log.shape == (3, 24)
    assert logcnt.shape == (3, 16)
    assert log2phy.shape[:2] == (3, 16)
    assert log2phy.shape[2] == logcnt.max()
    for arr in (phy2log, log2phy, logcnt):
        assert arr.dtype == np.int64
        assert arr.flags.writeable
        arr[...] = arr  # writable in place
    assert (logcnt.sum(axis=1) == 24).all()
    # log2phy and phy2log agree: every listed slot holds its expert, the rest is -1 padding.
    for layer in range(3):
        for expert in range(16):
            slots = log2phy[layer, expert]
            assert (slots[logcnt[layer, expert]:] == -1).all()
            assert (phy2log[layer, slots[: logcnt[layer, expert]]] == expert).all()


def test_same_answer_for_every_input_type():
    weight = _small()
    want = rebalance_experts(weight, 24, 4, 2, 8)
    for variant in (
        weight.tolist(),
        [tuple(row) for row in weight.tolist()],
        weight.astype(np.float32),
        weight.astype(np.int32),
        weight.astype(np.uint16),
        np.asfortranarray(weight),
        np.repeat(weight, 2, axis=1)[:, ::2],  # a strided view
        np.hstack([weight, weight])[:, :16],  # a view with a longer row pitch
    ):
        got = rebalance_experts(variant, 24, 4, 2, 8)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_numpy_integer_scalars_are_accepted_as_counts():
    weight = _small()
    want = rebalance_experts(weight, 24, 4, 2, 8)
    got = rebalance_experts(weight, np.int64(24), np.int32(4), np.uint8(2), np.int16(8))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_deterministic_and_thread_safe():
    rng = np.random.default_rng(3)
    weight = rng.lognormal(size=(16, 64))
    want = rebalance_experts(weight, 80, 8, 2, 16)
    results = [None] * 4

    def work(i):
        results[i] = rebalance_experts(weight, 80, 8, 2, 16)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_policy_keyword():
    weight = _small()
    # 4 groups over 3 nodes do not divide: "auto" falls back to the global policy.
    auto = rebalance_experts(weight, 24, 4, 3, 6)
    glob = rebalance_experts(weight, 24, 4, 3, 6, policy="global")
    for a, g in zip(auto, glob):
        np.testing.assert_array_equal(a, g)
    with pytest.raises(ValueError, match="hierarchical"):
        rebalance_experts(weight, 24, 4, 3, 6, policy="hierarchical")
    with pytest.raises(ValueError, match="unknown policy"):
        rebalance_experts(weight, 24, 4, 2, 8, policy="best")


@pytest.mark.parametrize(
    "weight, args, message",
    [
        (np.ones(16), (24, 4, 2, 8), "2-D"),
        (np.ones((2, 3, 16)), (24, 4, 2, 8), "2-D"),
        (np.ones((0, 16)), (24, 4, 2, 8), "empty"),
        (np.ones((3, 0)), (24, 4, 2, 8), "empty"),
        ([[1.0, 2.0], [3.0]], (4, 1, 1, 2), "2-D array"),
        ([["a", "b"]], (4, 1, 1, 2), "real numbers"),
        (np.ones((2, 4), dtype=complex), (4, 1, 1, 2), "real numbers"),
        (np.array([[1.0, float("nan"), 1.0, 1.0]]), (4, 1, 1, 2), "invalid load nan"),
        (np.array([[1.0, -2.0, 1.0, 1.0]]), (4, 1, 1, 2), "invalid load -2"),
        (np.array([[1.0, float("inf"), 1.0, 1.0]]), (4, 1, 1, 2), "finite"),
        (np.ones((3, 16)), (25, 4, 2, 8), "25 replicas do not divide evenly over 8 GPUs"),
        (np.ones((3, 16)), (56, 4, 2, 7), "7 GPUs do not divide evenly over 2 nodes"),
        (np.ones((3, 16)), (24, 5, 1, 8), "16 experts do not divide evenly into 5 groups"),
        (np.ones((3, 16)), (8, 4, 2, 8), "8 replicas cannot hold 16 experts"),
        (np.ones((3, 16)), (24, 4, 2, 0), "is 0"),
        (np.ones((3, 16)), (24, 0, 2, 8), "is 0"),
        (np.ones((3, 16)), (-24, 4, 2, 8), "num_replicas must be a non-negative integer"),
        (np.ones((3, 16)), (24.0, 4, 2, 8), "num_replicas must be a non-negative integer"),
        (np.ones((3, 16)), (24, True, 2, 8), "num_groups must be a non-negative integer"),
    ],
)
def test_bad_input_raises_value_error_with_a_reason(weight, args, message):
    with pytest.raises(ValueError) as info:
        rebalance_experts(weight, *args)
    assert message.lower() in str(info.value).lower()


def test_messages_match_the_rust_crate_word_for_word():
    # The message of the crate (and so of `dualpipe eplb`, which prints it after "error: ").
    with pytest.raises(ValueError) as info:
        rebalance_experts(np.ones((3, 16)), 25, 4, 2, 8)
    assert str(info.value) == (
        "25 replicas do not divide evenly over 8 GPUs; choose a number of replicas that is a "
        "multiple of the number of GPUs"
    )


# --- torch (optional) ---------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("path", GOLDEN[:8])
def test_torch_in_torch_out(path):
    torch = _torch()
    case = load_golden(path)
    weight = torch.tensor(case["weight"], dtype=torch.float32)
    out = rebalance_experts(weight, *_args(case))
    for name, got in zip(NAMES, out):
        assert isinstance(got, torch.Tensor), name
        assert got.dtype == torch.int64, name
        assert got.device.type == "cpu"
        assert got.tolist() == case[name], name


def test_torch_dtypes_and_autograd_tensors():
    torch = _torch()
    weight = _small()
    want = rebalance_experts(weight, 24, 4, 2, 8)
    for t in (
        torch.tensor(weight, dtype=torch.float64),
        torch.tensor(weight, dtype=torch.int64),
        torch.tensor(weight, dtype=torch.bfloat16),  # integers < 256 are exact in bfloat16
        torch.tensor(weight, dtype=torch.float16),
        torch.tensor(weight, dtype=torch.float32, requires_grad=True),
        torch.nn.Parameter(torch.tensor(weight, dtype=torch.float32)),
        torch.tensor(weight).t().contiguous().t(),  # non-contiguous
    ):
        got = rebalance_experts(t, 24, 4, 2, 8)
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor)
            assert g.dtype == torch.int64
            np.testing.assert_array_equal(g.numpy(), w)


def test_torch_counts_and_errors():
    torch = _torch()
    weight = torch.ones(3, 16)
    got = rebalance_experts(weight, torch.tensor(24), 4, 2, 8)
    assert got[0].shape == (3, 24)
    with pytest.raises(ValueError, match="2-D"):
        rebalance_experts(torch.ones(16), 24, 4, 2, 8)


# --- the migration-aware planner (previous=) ----------------------------------------------


def _check_consistent(phy2log, log2phy, logcnt, experts, replicas):
    layers = phy2log.shape[0]
    assert phy2log.shape == (layers, replicas)
    assert logcnt.shape == (layers, experts)
    assert log2phy.shape == (layers, experts, logcnt.max())
    assert (logcnt >= 1).all()
    assert (logcnt.sum(axis=1) == replicas).all()
    for layer in range(layers):
        for expert in range(experts):
            n = logcnt[layer, expert]
            slots = log2phy[layer, expert]
            assert (slots[n:] == -1).all()
            assert list(slots[:n]) == sorted(np.flatnonzero(phy2log[layer] == expert))


def _moved(old, new, gpus):
    slots = old.shape[1] // gpus
    return sum(
        len(set(new[l, g * slots:(g + 1) * slots]) - set(old[l, g * slots:(g + 1) * slots]))
        for l in range(old.shape[0])
        for g in range(gpus)
    )


def test_improved_policy_gives_a_consistent_plan():
    weight = np.random.default_rng(11).lognormal(size=(4, 64)) * 100
    out = rebalance_experts(weight, 80, 8, 2, 16, policy="improved")
    _check_consistent(*out, experts=64, replicas=80)


def test_previous_is_kept_when_the_loads_did_not_change():
    weight = np.random.default_rng(12).lognormal(size=(4, 64)) * 100
    first = rebalance_experts(weight, 80, 8, 2, 16, policy="improved")
    again = rebalance_experts(weight, 80, 8, 2, 16, previous=first[0])
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_previous_moves_fewer_replicas_than_a_fresh_plan():
    rng = np.random.default_rng(13)
    weight = rng.lognormal(size=(6, 64)) * 100
    old = rebalance_experts(weight, 80, 8, 2, 16, policy="improved")[0]
    drifted = weight * rng.lognormal(0.0, 0.3, size=weight.shape)
    kept = rebalance_experts(drifted, 80, 8, 2, 16, previous=old)
    fresh = rebalance_experts(drifted, 80, 8, 2, 16, policy="improved")
    _check_consistent(*kept, experts=64, replicas=80)
    assert _moved(old, kept[0], 16) <= _moved(old, fresh[0], 16)


def test_previous_accepts_lists_and_torch_like_inputs():
    weight = np.random.default_rng(14).lognormal(size=(2, 16)) * 10
    old = rebalance_experts(weight, 24, 4, 2, 8, policy="improved")[0]
    a = rebalance_experts(weight, 24, 4, 2, 8, previous=old)
    b = rebalance_experts(weight.tolist(), 24, 4, 2, 8, previous=old.tolist())
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "previous, policy, message",
    [
        (lambda p: p[:, :10], "auto", "[layers, num_replicas]"),
        (lambda p: p - 100, "auto", "expert indices are >= 0"),
        (lambda p: p + 100, "auto", "invalid previous placement"),
        (lambda p: p.astype(float) + 0.5, "auto", "integer expert indices"),
        (lambda p: p, "global", "migration-aware planner"),
    ],
)
def test_bad_previous_raises_value_error(previous, policy, message):
    weight = np.random.default_rng(15).lognormal(size=(2, 16))
    old = rebalance_experts(weight, 24, 4, 2, 8, policy="improved")[0]
    with pytest.raises(ValueError) as info:
        rebalance_experts(weight, 24, 4, 2, 8, previous=previous(old), policy=policy)
    assert message in str(info.value)
