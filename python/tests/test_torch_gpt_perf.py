"""scripts/torch_gpt_perf.py: the workaround for PyTorch 2.11's stage warm-up on gloo.

At the V's turn of DualPipeV one rank holds both neighbouring stages, and 2.11's warm-up sends
a dummy tensor from that rank to itself, which gloo refuses. `skip_self_warmup` drops exactly
those messages and leaves stages of versions without the warm-up alone; checked here on stand-in
stages and messages (no process group needed).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("torch_gpt_perf", REPO_ROOT / "scripts" / "torch_gpt_perf.py")
perf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(perf)


def message(peer):
    return SimpleNamespace(group_peer=peer, peer=peer)


def test_the_warmup_keeps_only_messages_to_other_ranks():
    # Rank 3 holds stages 3 and 4: stage 3 receives from rank 2 and sends to itself.
    stage = SimpleNamespace(_get_init_p2p_neighbors_ops=lambda: [message(2), message(3), message(3), message(2)])
    perf.skip_self_warmup(stage, 3)
    assert [m.peer for m in stage._get_init_p2p_neighbors_ops()] == [2, 2]
    # A rank whose neighbours are all elsewhere keeps every message.
    other = SimpleNamespace(_get_init_p2p_neighbors_ops=lambda: [message(0), message(2)])
    perf.skip_self_warmup(other, 1)
    assert [m.peer for m in other._get_init_p2p_neighbors_ops()] == [0, 2]


def test_stages_without_the_warmup_are_left_alone():
    stage = SimpleNamespace(submod=None)
    perf.skip_self_warmup(stage, 0)
    assert vars(stage) == {"submod": None}


def test_the_table_gives_each_rounds_ratio_beside_the_medians():
    # Two rounds: ours 1 s then 2 s per step, PyTorch 3 s then 3 s; its pipeline missed round 2.
    m = {
        "tokens_per_step": 1000,
        "steps": {"ours_pipe": [1.0, 1.0, 2.0, 2.0], "torch_pipe": [3.0, 3.0],
                  "ours_seq": [1.0, 1.0, 2.0, 2.0], "torch_eager": [3.0, 3.0, 3.0, 3.0]},
        "steps_by_round": {"ours_pipe": [[1.0, 1.0], [2.0, 2.0]], "torch_pipe": [[3.0, 3.0], []],
                           "ours_seq": [[1.0, 1.0], [2.0, 2.0]], "torch_eager": [[3.0, 3.0], [3.0, 3.0]]},
        "cpu_seconds": {k: [None] for k in ("ours_pipe", "torch_pipe", "ours_seq", "torch_eager")},
    }
    pipe, seq = perf.summary(m)
    assert seq["round_ratios"] == [3.0, 1.5]
    assert seq["ratio"] == 3.0 / 1.5  # the medians over every step: 1.5 s against 3 s
    assert pipe["round_ratios"] == [3.0]
    # A record from before the rounds were kept gives no per-round ratios, not an error.
    del m["steps_by_round"]
    assert [r["round_ratios"] for r in perf.summary(m)] == [[], []]
