"""dualpipe_rs.simulate: the metrics dict of `dualpipe simulate --format json`."""

from __future__ import annotations

import pytest

import dualpipe_rs


def test_simulate_a_kind():
    r = dualpipe_rs.simulate("1f1b", ranks=4, micro_batches=8)
    assert (r["schedule"], r["ranks"], r["micro_batches"], r["virtual_stages"]) == ("1f1b", 4, 8, 1)
    # 1F1B with F = 1, B = 2 and free communication: (micro_batches + ranks - 1) x (F + B).
    assert r["makespan"] == pytest.approx((8 + 4 - 1) * 3.0)
    assert len(r["bubble_per_rank"]) == 4
    assert r["bubble_max"] == pytest.approx((4 - 1) * 3.0)
    assert r["bubble_ratio"] == pytest.approx(sum(r["bubble_per_rank"]) / (4 * r["makespan"]))
    assert r["parameter_copies_per_rank"] == [1, 1, 1, 1]
    assert r["cost"]["compute"] == {"f": 1.0, "b": 2.0, "w": 1.0, "fb": 3.0}


def test_cost_keywords_change_the_result():
    base = dualpipe_rs.simulate("dualpipe", 4, 8)
    slower = dualpipe_rs.simulate("dualpipe", 4, 8, f=2.0, b=4.0, w=2.0)
    assert slower["makespan"] == pytest.approx(2 * base["makespan"])
    comm = dualpipe_rs.simulate(
        "dualpipe", 4, 8, latency=0.5, bandwidth=1e9, message_bytes=10**9, blocking_comm=True
    )
    assert comm["makespan"] > base["makespan"]
    assert comm["cost"]["comm"] == {
        "latency": 0.5,
        "bandwidth": 1e9,
        "message_bytes": 10**9,
        "blocking": True,
    }
    fb = dualpipe_rs.simulate("dualpipe", 4, 8, fb=2.5)
    assert fb["cost"]["compute"]["fb"] == 2.5


def test_simulate_a_schedule_object_equals_simulating_its_kind():
    s = dualpipe_rs.schedule("dualpipev", 4, 8)
    assert dualpipe_rs.simulate(s) == dualpipe_rs.simulate("dualpipev", 4, 8)
    assert s.simulate(f=1.0, b=2.0) == dualpipe_rs.simulate("dualpipev", 4, 8)
    # A compute-only schedule read from torch's CSV is lowered before it is simulated.
    from_csv = dualpipe_rs.Schedule.from_torch_csv(s.to_torch_csv(), kind="dualpipev")
    assert dualpipe_rs.simulate(from_csv)["makespan"] == dualpipe_rs.simulate(s)["makespan"]


def test_dualpipe_has_less_bubble_than_1f1b():
    d = dualpipe_rs.simulate("dualpipe", 8, 16)
    o = dualpipe_rs.simulate("1f1b", 8, 16)
    assert d["bubble_ratio"] < o["bubble_ratio"]
    assert d["parameter_copies_per_rank"] == [2] * 8


def test_errors():
    with pytest.raises(ValueError, match="W <= B"):
        dualpipe_rs.simulate("dualpipe", 4, 8, w=5.0)
    with pytest.raises(ValueError, match="latency"):
        dualpipe_rs.simulate("dualpipe", 4, 8, latency=-1.0)
    with pytest.raises(ValueError, match="needs ranks and micro_batches"):
        dualpipe_rs.simulate("dualpipe")
    with pytest.raises(ValueError, match="even number of ranks"):
        dualpipe_rs.simulate("dualpipe", 3, 8)
    with pytest.raises(ValueError, match="unknown schedule"):
        dualpipe_rs.simulate("pipedream", 4, 8)
    with pytest.raises(ValueError, match="come from the Schedule"):
        dualpipe_rs.simulate(dualpipe_rs.schedule("1f1b", 2, 4), ranks=2)
    with pytest.raises(TypeError):
        dualpipe_rs.simulate(42, 4, 8)
