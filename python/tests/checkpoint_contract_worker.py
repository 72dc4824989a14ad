"""The Python side of test_checkpoint_contract.py: every case of docs/checkpoints.md's contract
against ``DualPipeStrategy``, in the 2 processes torchrun started (gloo, CPU).

    torchrun --nproc_per_node 2 checkpoint_contract_worker.py --out DIR

Each case records, per rank, what happened (``"ok"``, or ``"<ErrorKind>: <message>"``) and how
long the call took, into ``contract-rank<r>.json``; rank 0 also records what the folder held
after it. The test reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn

import dualpipe_rs.torch as dpt
from dualpipe_rs.torch import _checkpoint, _partial

WIDTH, BLOCKS, ROWS = 8, 4, 2


def model(dtype=torch.float64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(BLOCKS)]).to(dtype)


def strategy(dtype=torch.float64, loss_fn=nn.MSELoss, schedule="dualpipe") -> dpt.DualPipeStrategy:
    """DualPipe on 2 ranks (each holds every layer); ``1f1b`` where each rank reads only its own
    layers' files (so a problem in a file one rank reads must reach the other)."""
    return dpt.DualPipeStrategy(model(dtype), torch.optim.AdamW, loss_fn, schedule=schedule, micro_batches=4,
                                optimizer_kwargs={"lr": 0.01}, timeout=30)


def batch(step: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4 * ROWS, WIDTH, generator=g, dtype=dtype), torch.randn(4 * ROWS, WIDTH, generator=g, dtype=dtype)


def attempt(call) -> dict:
    t0 = time.perf_counter()
    try:
        call()
        what = "ok"
    except Exception as e:  # noqa: BLE001 - recorded for the test
        what = f"{type(e).__name__}: {e}"
    return {"result": what, "seconds": time.perf_counter() - t0}


def listing(folder: str) -> list:
    return sorted(os.listdir(folder))


def rewrite_manifest(ck: str, edit) -> None:
    """Edits the manifest of ``ck``; ``keep_checksum`` recomputes its own checksum (a deliberate
    edit that only the other checks can catch)."""
    path = os.path.join(ck, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    if edit(m):
        m["manifest_sha256"] = _checkpoint.manifest_digest(m)
    with open(path, "w") as f:
        json.dump(m, f)


def copy_checkpoint(src: str, dst: str) -> None:
    import shutil

    shutil.copytree(src, dst)


def on_rank0(fn) -> None:
    """Runs ``fn`` on rank 0 while the other ranks wait (files the case starts from)."""
    if dist.get_rank() == 0:
        fn()
    dist.barrier()


def put_nan(ck: str) -> None:
    """A NaN in model/2 with its SHA-256 and the manifest's checksum updated: only the finiteness
    check can refuse it."""
    rel = "model/2.safetensors"
    tensors = load_file(os.path.join(ck, rel))
    tensors["2.0.weight"][0, 0] = float("nan")
    save_file(tensors, os.path.join(ck, rel))

    def edit(m):
        m["files"][rel] = _checkpoint._sha256(os.path.join(ck, rel))
        return True

    rewrite_manifest(ck, edit)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def plant_partials(out: str) -> None:
    """A user's PATH.partial-4, a look-alike hidden folder without our marker, our marker from a
    dead process (stale: removed), and our marker from a live process (kept)."""
    os.makedirs(os.path.join(out, "ck.partial-4"))
    with open(os.path.join(out, "ck.partial-4", "important.txt"), "w") as f:
        f.write("user data, not a checkpoint\n")
    os.makedirs(os.path.join(out, ".ck.partial-4-lookalike"))
    for name, pid in ((".old.partial-2-dead", dead_pid()), (".old.partial-2-live", os.getppid())):
        os.makedirs(os.path.join(out, name))
        with open(os.path.join(out, name, _partial.MARKER), "w") as f:
            json.dump({"kind": _partial.KIND, "format": _checkpoint.FORMAT, "host": socket.gethostname(), "pid": pid,
                       "target": "old"}, f)


def run(out: str) -> dict:
    rec: dict = {}
    p = lambda name: os.path.join(out, name)  # noqa: E731
    # -- finite state: a non-finite loss, a non-finite gradient, non-finite weights ----------------
    s = strategy(loss_fn=lambda o, y: ((o - y) ** 2).mean() * (float("nan") if S.steps >= 2 else 1.0))
    S = s
    for i in range(2):
        s.step(*batch(i))
    rec["nan_loss_step"] = attempt(lambda: s.step(*batch(2)))
    rec["nan_loss_weights_finite"] = all(bool(torch.isfinite(q).all()) for m in s.stages.values() for q in m.parameters())
    rec["nan_loss_steps"] = s.steps
    rec["save_after_refused_step"] = attempt(lambda: s.save(p("after_nan")))
    rec["after_nan_step"] = _checkpoint.read_manifest(p("after_nan"))["step"] if os.path.isdir(p("after_nan")) else None
    g = strategy()
    if dist.get_rank() == 1:
        next(iter(g.stages[(0, 1)].parameters())).register_hook(lambda grad: grad * float("inf"))
    rec["inf_grad_step"] = attempt(lambda: g.step(*batch(0)))
    w = strategy()
    w.step(*batch(0))
    if dist.get_rank() == 1:
        with torch.no_grad():
            list(w.stages[(0, 1)].parameters())[0][0, 0] = float("inf")
    before = listing(out)
    rec["save_non_finite"] = attempt(lambda: w.save(p("nonfinite")))
    dist.barrier()
    rec["save_non_finite_left"] = sorted(set(listing(out)) - set(before))
    # -- a good checkpoint, and its damaged copies ------------------------------------------------
    good = strategy()
    for i in range(3):
        good.step(*batch(i))
    rec["save_good"] = attempt(lambda: good.save(p("good")))
    on_rank0(lambda: (copy_checkpoint(p("good"), p("nan_inside")), put_nan(p("nan_inside"))))
    rec["load_non_finite"] = attempt(lambda: strategy(schedule="1f1b").load(p("nan_inside")))

    def edit_step(m):
        m["step"] = 100000

    def edit_lr(m):
        m["param_groups"][0]["lr"] = 1e6

    on_rank0(lambda: (copy_checkpoint(p("good"), p("step_edit")), rewrite_manifest(p("step_edit"), edit_step),
                      copy_checkpoint(p("good"), p("lr_edit")), rewrite_manifest(p("lr_edit"), edit_lr),
                      copy_checkpoint(p("good"), p("missing")), os.remove(p("missing/optimizer/2.safetensors")),
                      copy_checkpoint(p("good"), p("flipped")), flip(p("flipped/model/1.safetensors"))))
    for case in ("step_edit", "lr_edit", "missing", "flipped"):
        r = strategy(schedule="1f1b")
        rec[f"load_{case}"] = attempt(lambda: r.load(p(case)))
        rec[f"load_{case}_steps"] = r.steps
    # -- dtype: an f64 checkpoint into an f32 model ------------------------------------------------
    rec["load_other_dtype"] = attempt(lambda: strategy(torch.float32, schedule="1f1b").load(p("good")))
    # -- the target: never overwritten, a link included; refused before any rank waits -------------
    on_rank0(lambda: (os.symlink("nowhere", p("dangling")), os.symlink(p("good"), p("link_to_dir")),
                      os.makedirs(p("existing_dir")), open(p("existing_file"), "w").close()))
    for case in ("dangling", "link_to_dir", "existing_dir", "existing_file"):
        before = listing(out)
        rec[f"save_onto_{case}"] = attempt(lambda: good.save(p(case)))
        dist.barrier()
        rec[f"save_onto_{case}_left"] = sorted(set(listing(out)) - set(before))
    # -- partial folders: ours by the marker only ---------------------------------------------------
    on_rank0(lambda: plant_partials(out))
    before = listing(out)
    rec["save_beside_partials"] = attempt(lambda: good.save(p("ck")))
    dist.barrier()
    rec["partials_after"] = {"added": sorted(set(listing(out)) - set(before)),
                             "removed": sorted(set(before) - set(listing(out))),
                             "user_file": open(p("ck.partial-4/important.txt")).read()}
    rec["ck_files"] = sorted(os.listdir(p("ck")))
    rec["resume"] = attempt(lambda: strategy().load(p("ck")))
    return rec


def flip(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        b = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rec = run(args.out)
    with open(os.path.join(args.out, f"contract-rank{dist.get_rank()}.json"), "w") as f:
        json.dump(rec, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
