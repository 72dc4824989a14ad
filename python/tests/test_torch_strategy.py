"""`dualpipe_rs.torch.DualPipeStrategy` under torchrun on gloo (2 and 4 processes, f64).

torchrun runs torch_strategy_worker.py once per suite; the workers save what they computed and
these tests compare it with single-process training of the same model on the same batches:
every schedule's per-step losses and first-step gradients within 1e-10, pipeline 2 x
data-parallel 2 equal to one replica with twice the micro-batches, the compressed exchanges'
bytes, bit-identical resume, resume on another grid, partitions, bad input, a killed rank.
Skipped, with the reason, where torch is not installed.
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

if os.environ.get("DUALPIPE_REQUIRE_TORCH"):  # CI: torch is installed, so these tests must run
    import torch
else:
    torch = pytest.importorskip(
        "torch", reason="torch is not installed (pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    )

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import conftest  # noqa: E402
import torch_strategy_worker as worker  # noqa: E402

KINDS = ["dualpipe", "dualpipev", "1f1b", "zb1p", "gpipe", "interleaved"]


def torchrun(nproc: int, suite: str, out: Path, timeout: float = 300, worker: str = "torch_strategy_worker.py"):
    """Runs the worker under torchrun; returns (returncode, output, seconds)."""
    return conftest.torchrun(HERE / worker, nproc, suite, out, timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The parity suite on 2 and 4 processes and the grid suite on 4."""
    out = tmp_path_factory.mktemp("strategy")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        os.environ["DUALPIPE_TEST_METRICS_PORT"] = str(sock.getsockname()[1])
    for nproc, suite in ((2, "parity"), (4, "parity"), (4, "grid")):
        rc, log, _ = torchrun(nproc, suite, out)
        assert rc == 0, log[-6000:]
    return out


def load(out: Path, name: str):
    files = sorted(glob.glob(str(out / f"{name}-rank*.pt")), key=lambda f: int(f.rsplit("rank", 1)[1][:-3]))
    assert files, name
    return [torch.load(f) for f in files]


def reference(model, data, micro_batches, steps=None):
    """Single-process AdamW training: per-step mean losses, first-step gradients, final params."""
    opt = worker.adamw(model.parameters())
    losses, grads = [], None
    for x, y in data[:steps]:
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            loss = torch.nn.functional.mse_loss(model(xm), ym)
            (loss / micro_batches).backward()
            total += float(loss.detach())
        if grads is None:
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        losses.append(total / micro_batches)
    return losses, grads, {k: p.detach().clone() for k, p in model.named_parameters()}


def merged(per_rank, field):
    out = {}
    for r in per_rank:
        out.update(r[field])
    return out


def close(a, b, msg=""):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=msg)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_every_schedule_equals_one_process(runs, kind, world):
    per_rank = load(runs, f"{kind}-{world}")
    M = per_rank[0]["micro_batches"]
    want_losses, want_grads, want_params = reference(worker.build_model(), worker.batches(3, M * worker.ROWS), M)
    for r in per_rank:
        assert r["losses"] == pytest.approx(want_losses, rel=1e-10, abs=0)
    grads, params = merged(per_rank, "grads"), merged(per_rank, "params")
    dirs = (0, 1) if kind == "dualpipe" else (0,)
    assert sorted(grads) == sorted(f"{d}:{k}" for d in dirs for k in want_grads)
    for name, g in grads.items():
        key = name.split(":", 1)[1]
        close(g, want_grads[key], name)  # DualPipe: each copy holds the sum of both copies' gradients
        close(params[name], want_params[key], name)
    if kind == "dualpipe":
        for key in want_params:
            assert torch.equal(params[f"0:{key}"], params[f"1:{key}"]), key
    for rank, r in enumerate(per_rank):  # the measured peak of live chunks is the simulator's, rank by rank
        st = r["stats"]
        assert st["peak_activations"] == st["peak_activations_simulated"], (kind, rank, st)
        assert st["peak_activation_bytes"] > 0 and 0 <= st["bubble_ratio"] < 1 and st["step_seconds"] > 0


@pytest.mark.parametrize("world", [2, 4])
def test_overlapped_forward_backward_hook_is_called(runs, world):
    per_rank = load(runs, f"hooked-{world}")
    M = per_rank[0]["micro_batches"]
    want_losses, want_grads, _ = reference(worker.hooked_model(world), worker.batches(2, M * worker.ROWS), M)
    assert per_rank[0]["losses"] == pytest.approx(want_losses, rel=1e-10, abs=0)
    for name, g in merged(per_rank, "grads").items():
        close(g, want_grads[name.split(":", 1)[1]], name)
    assert all(r["hook_calls"] > 0 for r in per_rank)  # every rank runs FB pairs in DualPipe


@pytest.mark.parametrize("kind", ["dualpipe", "1f1b", "dualpipe-uneven"])
def test_pipeline_2_by_data_parallel_2_equals_one_replica_with_twice_the_micro_batches(runs, kind):
    per_rank = load(runs, f"dp-{kind}")
    want_losses, want_grads, want_params = reference(worker.build_model(), worker.batches(3, 8 * worker.ROWS), 8)
    for r in per_rank:
        assert r["losses"] == pytest.approx(want_losses, rel=1e-10, abs=0)
        assert len(r["stats"]["losses"]) == 8
    for replica in (0, 1):
        part = per_rank[2 * replica : 2 * replica + 2]
        for name, g in merged(part, "grads").items():
            close(g, want_grads[name.split(":", 1)[1]], name)
        for name, p in merged(part, "params").items():
            close(p, want_params[name.split(":", 1)[1]], name)
    # the replicas end bit-identical
    assert all(torch.equal(a, b) for a, b in zip(merged(per_rank[:2], "params").values(), merged(per_rank[2:], "params").values()))


def test_compressed_exchange_bytes(runs):
    exact = load(runs, "comp-None")
    for comp, most in (("bf16", 0.51), ("int8", 0.26), ("1bit", 0.04)):
        per_rank = load(runs, f"comp-{comp}")
        for r, e in zip(per_rank, exact):
            assert r["bytes"][0] == e["bytes"][0]  # the warm-up step goes uncompressed
            for b, be in zip(r["bytes"][1:], e["bytes"][1:]):
                assert b <= most * be, (comp, b, be)
            assert all(math.isfinite(v) for v in r["losses"])
        # the replicas stay bit-identical: every replica decodes the same bytes
        for a, b in zip(per_rank[:2], per_rank[2:]):
            assert all(torch.equal(x, y) for x, y in zip(a["params"].values(), b["params"].values()))
    assert load(runs, "comp-1bit")[0]["onebit_adam"]
    int8 = load(runs, "comp-int8")[0]["bytes"][1] / exact[0]["bytes"][1]
    onebit = load(runs, "comp-1bit")[0]["bytes"][1] / exact[0]["bytes"][1]
    assert 1 - int8 >= 0.74 and 1 - onebit >= 0.96, (int8, onebit)


@pytest.mark.parametrize("comp", [None, "1bit"])
def test_resume_is_bit_identical(runs, comp):
    straight, resumed = load(runs, f"ckpt-{comp}-straight"), load(runs, f"ckpt-{comp}-resumed")
    for a, b in zip(straight, resumed):
        assert a["losses"] == b["losses"]
        assert a["params"].keys() == b["params"].keys()
        assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    manifest = json.loads((runs / f"ckpt-{comp}" / "manifest.json").read_text())
    assert manifest["step"] == 3 and manifest["pipeline_stages"] == 2 and manifest["replicas"] == 2
    files = sorted(manifest["files"])
    # one file per layer, named by the user's keys; never by rank
    assert [f for f in files if f.startswith("model/")] == [f"model/{i}.safetensors" for i in sorted(map(str, range(8)))]
    assert not any("rank" in f for f in files)
    from safetensors.torch import load_file

    assert sorted(load_file(str(runs / f"ckpt-{comp}" / "model" / "3.safetensors"))) == ["3.0.bias", "3.0.weight"]
    if comp == "1bit":
        assert any(f.startswith("feedback/replica1/") for f in files)


@pytest.mark.parametrize("kind", ["zb1p", "dualpipev"])
def test_resume_on_another_grid(runs, kind):
    straight = load(runs, "ckpt-None-straight")[0]["losses"]
    for r in load(runs, f"ckpt-reshaped-{kind}"):
        assert r["losses"] == pytest.approx(straight, rel=1e-10, abs=0)


def test_explicit_and_planned_partitions(runs):
    want, _, _ = reference(worker.build_model(), worker.batches(2, 4 * worker.ROWS), 4)
    explicit = load(runs, "partition-explicit")
    assert explicit[0]["partition"] == [1, 2, 3, 2]
    assert explicit[0]["losses"] == pytest.approx(want, rel=1e-10, abs=0)
    planned = load(runs, "partition-plan")
    assert sum(planned[0]["partition"]) == 8 and min(planned[0]["partition"]) >= 1
    assert all(r["partition"] == planned[0]["partition"] for r in planned)
    assert planned[0]["losses"] == pytest.approx(want, rel=1e-10, abs=0)


def test_bad_input_fails_in_our_words(tmp_path):
    rc, log, _ = torchrun(2, "errors", tmp_path, timeout=120)
    assert rc == 0, log[-4000:]
    for rank in (0, 1):
        e = json.loads((tmp_path / f"errors-rank{rank}.json").read_text())
        assert e["stages"].startswith("ValueError: the model has 1 block, which cannot be split into 2 pipeline stages")
        assert e["world"].startswith("ValueError: WORLD_SIZE=2 is not pipeline_stages=3 times a number of data-parallel replicas")
        assert e["schedule"] == "ValueError: unknown schedule 'zigzag': use one of dualpipe, dualpipev, 1f1b, zb1p, gpipe, interleaved"
        assert e["compression"] == "ValueError: unknown compression '2bit': use None (exact), 'bf16', 'int8' or '1bit'"
        assert e["micro_batches"].startswith("ValueError: dualpipe needs an even number of micro-batches")
        assert "micro_batches=2" in e["micro_batches"] and "--micro-batches" not in e["micro_batches"]
        assert e["optimizer"].startswith("TypeError: optimizer must be an optimizer class")
        assert e["loss_fn"].startswith("TypeError: loss_fn must be a callable")
        assert e["partition"].startswith("ValueError: partition lists 4 stages, but the schedule has 2")
        assert e["not_sequential"].startswith("TypeError: model is a Linear, not an nn.Sequential")
        assert e["blocks_name"].startswith("ValueError: model (Module) has no child module named blocks='layers'")
        assert e["batch"] == "ValueError: inputs has 7 rows, which do not divide into micro_batches=4: give a batch of a multiple of 4 rows"
        assert e["labels"].startswith("TypeError: labels must be a tensor")
        # every construction check ran alone, without waiting on the other process
        assert max(v for k, v in e.items() if k.endswith("_seconds")) < 5
        # a loss that is not a scalar is found on shapes alone, on every rank, before the pipeline runs
        assert e["scalar"].startswith("ValueError: loss_fn returned (2, 8), not a scalar tensor"), e["scalar"]


def test_a_killed_rank_ends_the_job(tmp_path):
    rc, log, seconds = torchrun(2, "kill", tmp_path, timeout=120)
    assert rc != 0
    assert seconds < 60, seconds
    assert "exitcode  : 17" in log and "rank      : 1" in log, log[-3000:]  # torchrun names the dead rank


def test_a_killed_rank_is_named_by_the_survivor(tmp_path):
    """Without torchrun's teardown: the surviving rank stops within seconds, naming the dead one."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    t0 = time.monotonic()
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "torch_strategy_worker.py"), "--out", str(tmp_path),
                                       "--suite", "kill"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    seconds = time.monotonic() - t0
    assert procs[1].returncode == 17
    assert procs[0].returncode != 0
    assert seconds < 60, seconds
    assert "RankFailed: rank 0:" in outs[0] and "rank 1" in outs[0].split("RankFailed: rank 0:")[-1], outs[0][-3000:]


def test_prometheus_metrics_per_rank(runs):
    for rank in (0, 1):
        text = (runs / f"metrics-rank{rank}.txt").read_text()
        for name in ("dualpipe_pipeline_bubble_ratio", "dualpipe_pipeline_bubble_ratio_simulated",
                     "dualpipe_communication_overhead_ratio", "dualpipe_steps_total", "dualpipe_loss"):
            assert f'{name}{{rank="{rank}"}}' in text, name
        assert f'dualpipe_steps_total{{rank="{rank}"}} 2.0' in text
        assert f'dualpipe_step_duration_seconds_count{{rank="{rank}"}} 2.0' in text
        assert f'dualpipe_bytes_sent_total{{kind="activation",rank="{rank}"}}' in text


def test_codec_layouts_match_the_rust_ones():
    from dualpipe_rs.torch._codec import decode, encode, encoded_bytes

    v = torch.tensor([1.0, -3.0, 0.0, 4.0, -2.0, -0.5])
    b = encode(v, "1bit", 4)
    assert b.numel() == 10 == encoded_bytes(6, "1bit", 4, 4)
    # per chunk: its f32 scale (mean |x|), then its sign bits, least significant first (the Rust test's bytes)
    assert b[:4].view(torch.float32).item() == 2.0 and b[5:9].clone().view(torch.float32).item() == 1.25
    assert b[4].item() == 0b1101 and b[9].item() == 0b00
    assert decode(b, "1bit", 6, torch.float32, 4).tolist() == [2.0, -2.0, 2.0, 2.0, -1.25, -1.25]
    q = encode(torch.tensor([127.0, -63.5, 0.0], dtype=torch.float64), "int8", 4)
    assert q[:4].view(torch.float32).item() == 1.0 and q[4:].view(torch.int8).tolist() == [127, -64, 0]
    x = torch.randn(5000, dtype=torch.float64)
    for comp in (None, "bf16", "int8", "1bit"):
        assert encode(x, comp, 2048).numel() == encoded_bytes(5000, comp, 8, 2048)
    assert torch.equal(decode(encode(x, None, 2048), None, 5000, torch.float64, 2048), x)


def test_a_message_of_another_step_or_bucket_is_refused():
    from dualpipe_rs.torch._dp import GradExchange, StaleMessage

    ex = GradExchange([0, 1], 0, "int8", warmup=0)
    body = torch.arange(5, dtype=torch.uint8)
    ok = torch.cat([ex._stamp(7, 2, 0, "cpu"), body])
    assert torch.equal(ex._check(ok, 7, 2, 0, 1), body)
    for stale in ((6, 2, 0), (8, 2, 0), (7, 1, 0), (7, 2, 1)):
        msg = torch.cat([ex._stamp(*stale, "cpu"), body])
        with pytest.raises(StaleMessage, match=r"stamped step %d, bucket %d, phase %d where step 7, bucket 2, phase 0 was awaited: refused" % stale):
            ex._check(msg, 7, 2, 0, 1)


def test_more_processes_than_gpus_is_refused_with_what_to_launch():
    from dualpipe_rs.torch._world import cuda_device

    assert cuda_device(1, 2) == torch.device("cuda", 1)
    with pytest.raises(ValueError) as e:
        cuda_device(1, 1)
    assert str(e.value).startswith("LOCAL_RANK=1, but this node has 1 CUDA device: NCCL runs one process per GPU")
    assert "torchrun --nproc_per_node 1" in str(e.value)
    with pytest.raises(ValueError, match="has 0 CUDA devices.*at most 0 processes"):
        cuda_device(0, 0)
