"""The bindings give what the `dualpipe` CLI prints, for the same inputs.

Runs when a built CLI is found: ``DUALPIPE_BIN``, else ``<repo>/target/{release,debug}/dualpipe``
(``cargo build -p dualpipe-cli``); skipped otherwise.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import dualpipe_rs
from conftest import dualpipe_cli
from dualpipe_rs.eplb import rebalance_experts


CLI = dualpipe_cli()
pytestmark = pytest.mark.skipif(CLI is None, reason="no built dualpipe CLI (set DUALPIPE_BIN)")


def _run(*args):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120)


def _cli_has(subcommand, flag):
    if CLI is None:
        return False
    return flag in _run(subcommand, "--help").stdout


needs_cli_eplb = pytest.mark.skipif(
    not _cli_has("eplb", "--loads"), reason="this dualpipe CLI has no `eplb --loads`"
)


CONFIGS = [
    # layers, experts, replicas, groups, nodes, gpus, distribution
    (4, 64, 80, 8, 2, 16, "lognormal"),
    (3, 60, 64, 5, 2, 8, "integers"),  # groups do not divide over nodes: global policy
    (6, 256, 288, 8, 4, 32, "lognormal"),
    (2, 16, 32, 1, 1, 8, "integers"),
]


@needs_cli_eplb
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "L{}E{}P{}G{}N{}R{}-{}".format(*c))
def test_eplb_matches_the_cli(tmp_path, config):
    layers, experts, replicas, groups, nodes, gpus, dist = config
    rng = np.random.default_rng(layers * 1000 + experts)
    if dist == "integers":
        weight = rng.integers(0, 8, size=(layers, experts)).astype(np.float64)
    else:
        weight = rng.lognormal(size=(layers, experts)) * 100.0
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(weight.tolist()))
    proc = _run(
        "eplb", "--loads", loads, "--replicas", replicas, "--groups", groups,
        "--nodes", nodes, "--gpus", gpus, "--policy", "deepseek", "--format", "json",
    )
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    ours = rebalance_experts(weight, replicas, groups, nodes, gpus)
    for name, got in zip(("phy2log", "log2phy", "logcnt"), ours):
        assert got.tolist() == cli[name], name


@needs_cli_eplb
def test_eplb_error_message_matches_the_cli(tmp_path):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(np.ones((2, 16)).tolist()))
    proc = _run("eplb", "--loads", loads, "--replicas", 20, "--groups", 4, "--nodes", 2, "--gpus", 8)
    assert proc.returncode != 0
    with pytest.raises(ValueError) as info:
        rebalance_experts(np.ones((2, 16)), 20, 4, 2, 8)
    assert f"error: {info.value}" in proc.stderr


@pytest.mark.parametrize("kind, ranks, mbs", [("dualpipe", 4, 10), ("dualpipev", 3, 8), ("1f1b", 4, 6)])
def test_schedule_text_forms_match_the_cli(kind, ranks, mbs):
    s = dualpipe_rs.schedule(kind, ranks, mbs)
    common = ("schedule", "--schedule", kind, "--ranks", ranks, "--micro-batches", mbs)
    proc = _run(*common, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(s.to_json())
    proc = _run(*common, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == s.to_torch_csv().strip()


def test_schedule_error_message_matches_the_cli():
    # The same words; each names the settings its own way (flags, keyword arguments).
    proc = _run("schedule", "--schedule", "dualpipe", "--ranks", 3, "--micro-batches", 8)
    assert proc.returncode != 0
    with pytest.raises(ValueError) as info:
        dualpipe_rs.schedule("dualpipe", 3, 8)
    as_flags = str(info.value).replace("ranks=2 or ranks=4", "--ranks 2 or --ranks 4")
    assert "ranks=2 or ranks=4" in str(info.value)
    assert f"error: {as_flags}" in proc.stderr


@pytest.mark.parametrize("kind, ranks, mbs", [("dualpipe", 4, 8), ("dualpipev", 4, 8), ("interleaved", 4, 8)])
def test_simulate_matches_the_cli(kind, ranks, mbs):
    proc = _run(
        "simulate", "--schedule", kind, "--ranks", ranks, "--micro-batches", mbs,
        "--f", 1.5, "--b", 2.5, "--w", 1.0, "--latency", 0.1, "--format", "json",
    )
    assert proc.returncode == 0, proc.stderr
    ours = dualpipe_rs.simulate(kind, ranks, mbs, f=1.5, b=2.5, w=1.0, latency=0.1)
    assert ours == json.loads(proc.stdout)
