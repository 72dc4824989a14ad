"""The checkpoint contract of docs/checkpoints.md ("The contract: what every checkpoint writer
keeps"), rule by rule, against both writers: the PyTorch strategy (``DualPipeStrategy`` in 2
processes under torchrun, gloo; checkpoint_contract_worker.py runs every case once) and the Rust
trainer (the built ``dualpipe`` binary: ``train --checkpoint-dir`` / ``--resume-from`` and
``checkpoint inspect`` as subprocesses).

Each rule is one test, parametrized by side. The Python side is skipped only where torch is not
installed (never in CI: DUALPIPE_REQUIRE_TORCH=1); the Rust side only where no binary is built
(``DUALPIPE_BIN``, else ``<repo>/target/{release,debug}/dualpipe``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from conftest import dualpipe_cli

HERE = Path(__file__).resolve().parent
CLI = dualpipe_cli()
SIDES = ["python", "rust"]

# -- the Python side: one torchrun job runs every case --------------------------------------------


def _need_torch():
    if os.environ.get("DUALPIPE_REQUIRE_TORCH"):
        import torch  # noqa: F401 - CI: must be installed
        import safetensors  # noqa: F401
    else:
        pytest.importorskip("torch", reason="torch is not installed")
        pytest.importorskip("safetensors", reason="safetensors is not installed")


@pytest.fixture(scope="module")
def py(tmp_path_factory):
    """Every rank's record of every case (checkpoint_contract_worker.py), and the folder."""
    _need_torch()
    out = tmp_path_factory.mktemp("contract-py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "--monitor_interval", "0.2", str(HERE / "checkpoint_contract_worker.py"), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(out))
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    ranks = [json.loads((out / f"contract-rank{r}.json").read_text()) for r in (0, 1)]
    return ranks, out, p.stderr


def same_on_every_rank(ranks, case: str) -> str:
    """The case's result, which every rank must report alike."""
    results = [r[case]["result"] for r in ranks]
    assert results[0] == results[1], (case, results)
    return results[0]


# -- the Rust side: the binary ---------------------------------------------------------------------


def _need_cli():
    if CLI is None:
        pytest.skip("no built dualpipe CLI (set DUALPIPE_BIN, or cargo build -p dualpipe-cli)")


def dualpipe(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def mlp(*extra) -> list:
    """A tiny MLP run (2 ranks, 1F1B, 4 micro-batches of 2 rows), JSON summary, quiet."""
    return ["train", "--format", "json", "--quiet", "--model", "mlp", "--hidden", "8", "--micro-batch-size", "2",
            "--ranks", "2", "--micro-batches", "4", "--schedule", "1f1b", *map(str, extra)]


def gpt(*extra) -> list:
    """A tiny GPT run (d 16, 2 heads, seq 8, 2 ranks)."""
    return ["train", "--format", "json", "--quiet", "--d-model", "16", "--heads", "2", "--seq-len", "8",
            "--micro-batch-size", "2", "--ranks", "2", "--micro-batches", "4", "--layers-per-stage", "1",
            "--eval-every", "0", *map(str, extra)]


@pytest.fixture(scope="module")
def rust_ck(tmp_path_factory):
    """A good Rust checkpoint directory: 4 steps of the MLP in f64, one every 2 (step-000002, -4)."""
    _need_cli()
    d = tmp_path_factory.mktemp("contract-rs")
    p = dualpipe(*mlp("--dtype", "f64", "--steps", 4, "--checkpoint-dir", d / "ck", "--checkpoint-every", 2))
    assert p.returncode == 0, p.stderr
    return d / "ck"


def rust_copy(rust_ck: Path, tmp_path: Path, step: int = 4) -> Path:
    import shutil

    dst = tmp_path / f"step-{step:06d}"
    shutil.copytree(rust_ck / f"step-{step:06d}", dst)
    return dst


def rust_relist(ck: Path, name: str, data: bytes) -> None:
    """Rewrites ``ck/name`` and its size and CRC-32 in the manifest (only the other checks can
    refuse it then)."""
    (ck / name).write_bytes(data)
    m = json.loads((ck / "manifest.json").read_text())
    for f in m["files"]:
        if f["name"] == name:
            f["bytes"], f["crc32"] = len(data), f"{zlib.crc32(data):08x}"
    (ck / "manifest.json").write_text(json.dumps(m))


def rust_damage(ck: Path) -> str:
    """What `checkpoint inspect` says of the one checkpoint ``ck`` (exit 0 either way), and that
    ``--resume-from`` refuses it (exit 2)."""
    p = dualpipe("checkpoint", "inspect", ck)
    assert p.returncode == 0, p.stderr
    r = dualpipe(*mlp("--dtype", "f64", "--steps", 6, "--resume-from", ck))
    assert r.returncode == 2 and "damaged" in r.stderr, r.stderr
    return p.stdout + r.stderr


# -- rule 1: only finite state is saved ------------------------------------------------------------


def python_rule1_non_finite_state_is_never_saved(request, tmp_path):
    ranks, out, _ = request.getfixturevalue("py")
    # a NaN loss: step() raises on every rank, the optimizer step not taken
    msg = same_on_every_rank(ranks, "nan_loss_step")
    assert msg.startswith("FloatingPointError: step 3: the loss of micro-batch") and "not a finite number" in msg, msg
    assert all(r["nan_loss_weights_finite"] and r["nan_loss_steps"] == 2 for r in ranks)
    assert same_on_every_rank(ranks, "save_after_refused_step") == "ok"
    assert ranks[0]["after_nan_step"] == 2
    # a gradient that is not finite (rank 1's hook) with a finite loss: the same, naming the rank
    msgs = [r["inf_grad_step"]["result"] for r in ranks]
    assert all(m.startswith("FloatingPointError: step 1: a gradient on rank") and "1" in m for m in msgs), msgs
    assert "(here: the gradient of 2.0.weight)" in msgs[1], msgs[1]
    # weights that are not finite (rank 1 only): save() refuses on every rank, naming the tensor
    msg = same_on_every_rank(ranks, "save_non_finite")
    assert msg.startswith("FloatingPointError: after step 1 the tensor 2.0.weight holds a value that is not a finite"), msg
    assert "this state is not saved" in msg
    assert ranks[0]["save_non_finite_left"] == [], "a refused save left something behind"


def rust_rule1_non_finite_state_is_never_saved(request, tmp_path):
    # a loss that is not finite stops the run at that step
    sgd = ("--optimizer", "sgd", "--lr", "1e30", "--lr-warmup", 0, "--checkpoint-every", 1)
    p = dualpipe(*mlp("--dtype", "f64", "--steps", 10, "--checkpoint-dir", tmp_path / "mlp", *sgd))
    assert p.returncode == 1 and "training diverged at step" in p.stderr, p.stderr
    # weights that are not finite while the loss still is: the checkpoint refused, naming the tensor
    ck = tmp_path / "gpt"
    p = dualpipe(*gpt("--steps", 2, "--checkpoint-dir", ck, *sgd))
    assert p.returncode == 1, p.stderr
    assert "after step 2 the tensor blocks." in p.stderr and "holds a value that is not a finite number" in p.stderr
    assert "this state is not saved" in p.stderr, p.stderr
    for d in (tmp_path / "mlp", ck):
        listed = dualpipe("checkpoint", "inspect", d)
        assert listed.returncode == 0 and "DAMAGED" not in listed.stdout, listed.stdout
    assert sorted(os.listdir(ck)) == [".lock", "latest", "step-000001"]


# -- rule 2: a checkpoint holding a value that is not finite is damaged ------------------------------


def python_rule2_a_non_finite_checkpoint_is_damaged(request, tmp_path):
    ranks, _, _ = request.getfixturevalue("py")
    # a NaN in model/2 (read by rank 1 alone, its checksums updated): every rank refuses
    msg = same_on_every_rank(ranks, "load_non_finite")
    assert msg.startswith("ValueError: checkpoint") and "is damaged: the tensor 2.0." in msg, msg
    assert "not a finite number" in msg


def rust_rule2_a_non_finite_checkpoint_is_damaged(request, tmp_path):
    ck = rust_copy(request.getfixturevalue("rust_ck"), tmp_path)
    data = bytearray((ck / "block-0000.safetensors").read_bytes())
    n = int.from_bytes(data[:8], "little")
    data[8 + n : 16 + n] = b"\xff" * 8  # NaN in f64
    rust_relist(ck, "block-0000.safetensors", bytes(data))
    said = rust_damage(ck)
    assert "DAMAGED" in said and "not a finite number" in said, said


# -- rule 3: the target is never overwritten, a link included; refused at once ----------------------


def python_rule3_nothing_existing_is_overwritten(request, tmp_path):
    ranks, _, _ = request.getfixturevalue("py")
    for case in ("dangling", "link_to_dir", "existing_dir", "existing_file"):
        msg = same_on_every_rank(ranks, f"save_onto_{case}")
        assert msg.startswith("ValueError: checkpoint directory") and "already exists" in msg, msg
        assert "nothing is overwritten" in msg
        # refused before any rank waits on another, and nothing left behind
        assert all(r[f"save_onto_{case}"]["seconds"] < 5 for r in ranks), case
        assert ranks[0][f"save_onto_{case}_left"] == [], case
    assert "a symbolic link" in ranks[0]["save_onto_dangling"]["result"]


def rust_rule3_nothing_existing_is_overwritten(request, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    p = dualpipe(*mlp("--steps", 1, "--checkpoint-dir", afile))
    assert p.returncode == 2 and "is a file" in p.stderr, p.stderr
    assert afile.read_text() == "mine\n"
    dangling = tmp_path / "dangling"
    os.symlink("nowhere", dangling)
    p = dualpipe(*mlp("--steps", 1, "--checkpoint-dir", dangling))
    assert p.returncode == 2, p.stderr
    assert os.readlink(dangling) == "nowhere" and not (tmp_path / "nowhere").exists()
    # a user's folder named like a checkpoint the run publishes is never replaced
    ck = tmp_path / "ck"
    (ck / "step-000002").mkdir(parents=True)
    (ck / "step-000002" / "notes.txt").write_text("my notes\n")
    p = dualpipe(*mlp("--steps", 2, "--checkpoint-dir", ck, "--checkpoint-every", 2))
    assert (ck / "step-000002" / "notes.txt").read_text() == "my notes\n", p.stderr


# -- rule 4: partial folders: ours by a marker, created exclusively, leftovers removed only if ours ---


def python_rule4_partial_folders_are_ours_by_a_marker(request, tmp_path):
    ranks, out, stderr = request.getfixturevalue("py")
    assert same_on_every_rank(ranks, "save_beside_partials") == "ok"
    seen = ranks[0]["partials_after"]
    assert seen["added"] == ["ck"], seen  # the partial folder is gone once renamed
    assert seen["removed"] == [".old.partial-2-dead"], seen  # our marker, its process ended
    assert seen["user_file"] == "user data, not a checkpoint\n"  # PATH.partial-4 of the user
    assert (out / ".ck.partial-4-lookalike").is_dir() and (out / ".old.partial-2-live").is_dir()
    assert "removed" in stderr and ".old.partial-2-dead" in stderr  # and it says so
    assert ".dualpipe-partial.json" not in ranks[0]["ck_files"]  # a complete one never looks partial


def rust_rule4_partial_folders_are_ours_by_a_marker(request, tmp_path):
    ck = tmp_path / "ck"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name in ("user.partial-4", ".step-000002.tmp-notes", f".step-000002.tmp-{dead.pid}-5",
                 f".step-000002.tmp-{os.getpid()}-5"):
        (ck / name).mkdir(parents=True)
    (ck / "user.partial-4" / "important.txt").write_text("user data\n")
    p = dualpipe(*mlp("--steps", 2, "--checkpoint-dir", ck, "--checkpoint-every", 2))
    assert p.returncode == 0, p.stderr
    left = sorted(os.listdir(ck))
    assert f".step-000002.tmp-{dead.pid}-5" not in left, left  # a dead run's: removed
    assert {"user.partial-4", ".step-000002.tmp-notes", f".step-000002.tmp-{os.getpid()}-5"} <= set(left), left
    assert (ck / "user.partial-4" / "important.txt").read_text() == "user data\n"


# -- rule 5: every file checksummed, and the manifest's own fields covered --------------------------


def python_rule5_an_edited_manifest_or_file_is_damage(request, tmp_path):
    ranks, _, _ = request.getfixturevalue("py")
    for case in ("step_edit", "lr_edit"):
        msg = same_on_every_rank(ranks, f"load_{case}")
        assert "does not match its own checksum" in msg and "damaged" in msg, msg
        assert all(r[f"load_{case}_steps"] == 0 for r in ranks)  # nothing was taken
    msg = same_on_every_rank(ranks, "load_flipped")
    assert "does not match its SHA-256 in the manifest: the checkpoint is damaged" in msg, msg


def rust_rule5_an_edited_manifest_or_file_is_damage(request, tmp_path):
    rust_ck = request.getfixturevalue("rust_ck")
    ck = rust_copy(rust_ck, tmp_path / "step")
    m = json.loads((ck / "manifest.json").read_text())
    m["step"] = 100000
    (ck / "manifest.json").write_text(json.dumps(m))
    said = rust_damage(ck)
    assert "DAMAGED" in said and "state.json is of step 4, the manifest of step 100000" in said, said
    ck = rust_copy(rust_ck, tmp_path / "lr")
    state = json.loads((ck / "state.json").read_text())
    state["config"]["lr"] = 1e6
    (ck / "state.json").write_text(json.dumps(state))
    said = rust_damage(ck)
    assert "DAMAGED" in said and "state.json has" in said, said


# -- rule 6: a file the manifest lists but that is missing is damage, named --------------------------


def python_rule6_a_listed_file_missing_is_damage(request, tmp_path):
    ranks, _, _ = request.getfixturevalue("py")
    msg = same_on_every_rank(ranks, "load_missing")
    assert "optimizer/2.safetensors is listed in the manifest but missing: the checkpoint is damaged" in msg, msg


def rust_rule6_a_listed_file_missing_is_damage(request, tmp_path):
    ck = rust_copy(request.getfixturevalue("rust_ck"), tmp_path)
    (ck / "block-0001.safetensors").unlink()
    said = rust_damage(ck)
    assert "DAMAGED" in said and "block-0001.safetensors" in said, said


# -- rule 7: another element type is never half applied -------------------------------------------


def python_rule7_another_dtype_is_refused_or_converted_whole(request, tmp_path):
    ranks, _, _ = request.getfixturevalue("py")
    msg = same_on_every_rank(ranks, "load_other_dtype")
    assert msg.startswith("ValueError: checkpoint") and "torch.float64" in msg and "torch.float32" in msg, msg


def rust_rule7_another_dtype_is_refused_or_converted_whole(request, tmp_path):
    rust_ck = request.getfixturevalue("rust_ck")  # f64
    step = rust_ck / "step-000004"
    # Out of f64 (the exact mode) is a changed setting: refused whole, naming both dtypes ...
    p = dualpipe(*mlp("--dtype", "f32", "--steps", 6, "--resume-from", step))
    assert p.returncode == 2, p.stderr
    assert "--dtype f32" in p.stderr and "f64" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    # ... and, when asked for, converted whole: every tensor read into f32, training goes on.
    p = dualpipe(*mlp("--dtype", "f32", "--steps", 6, "--resume-from", step, "--allow-changed-settings"))
    assert p.returncode == 0, p.stderr
    losses = json.loads(p.stdout)["losses"]
    assert len(losses) == 2 and all(abs(x) < 1e3 for x in losses), losses


# -- every rule on both sides ------------------------------------------------------------------------

RULES = [
    "rule1_non_finite_state_is_never_saved",
    "rule2_a_non_finite_checkpoint_is_damaged",
    "rule3_nothing_existing_is_overwritten",
    "rule4_partial_folders_are_ours_by_a_marker",
    "rule5_an_edited_manifest_or_file_is_damage",
    "rule6_a_listed_file_missing_is_damage",
    "rule7_another_dtype_is_refused_or_converted_whole",
]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("rule", RULES)
def test_contract(rule, side, request, tmp_path):
    """One rule of docs/checkpoints.md's contract, on one side (``python_<rule>`` / ``rust_<rule>``)."""
    if side == "python":
        _need_torch()
    else:
        _need_cli()
    globals()[f"{side}_{rule}"](request, tmp_path)


# -- and a good checkpoint still round-trips ------------------------------------------------------


def test_a_good_checkpoint_loads(py):
    ranks, _, _ = py
    assert same_on_every_rank(ranks, "save_good") == "ok"
    assert same_on_every_rank(ranks, "resume") == "ok"
