"""Checkpoints of a ``DualPipeStrategy``: per-layer safetensors named by the user's own keys.

A checkpoint directory holds ``model/<layer>.safetensors`` (each tensor under the user's
``state_dict`` key, e.g. ``blocks.3.attn.qkv.weight``), ``optimizer/<layer>.safetensors`` (each
state tensor as ``<key>/<state name>``: AdamW's ``step``, ``exp_avg``, ``exp_avg_sq``),
``feedback/replica<d>/dir<d>-stage<s>.safetensors`` (the compressed exchange's error feedback),
and ``manifest.json`` (the step, the grid, the optimizer's hyper-parameters, a SHA-256 per
file), written last. Nothing is named by rank, so any grid shape loads it; the directory is
written beside the target and renamed into place once complete, and an existing one is never
overwritten. Error feedback is restored only on the same grid and compression (its shards
follow the grid); another shape starts it from zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

FORMAT = "dualpipe-torch-checkpoint/1"


def _barrier(s: Any) -> None:
    if s.world.size > 1:
        from ._p2p import wait_for

        wait_for(dist.barrier(async_op=True), f"rank {s.world.rank}: the checkpoint's barrier", s.timeout)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _writer_stages(s: Any) -> List[Any]:
    """The stage copies this rank writes: replica 0's direction-0 copies (one of each stage)."""
    if s.world.replica != 0:
        return []
    return [m for (d, _), m in sorted(s.stages.items()) if d == 0]


def _hyper(group: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for k, v in group.items():
        if k == "params":
            continue
        if isinstance(v, torch.Tensor):
            v = v.tolist()
        if isinstance(v, (int, float, bool, str, type(None), list, tuple)):
            out[k] = v
    return out


def save(s: Any, path: str) -> None:
    """Writes the checkpoint of step ``s.steps`` to the new directory ``path`` (every rank calls it)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a directory path, not {type(path).__name__}")
    path = os.fspath(path)
    if os.path.exists(path):
        raise ValueError(f"checkpoint directory {path} already exists: choose a new one (nothing is overwritten)")
    tmp = f"{path}.partial-{s.steps}"
    if s.world.rank == 0:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(os.path.join(tmp, "model"))
        os.makedirs(os.path.join(tmp, "optimizer"))
    _barrier(s)
    for m in _writer_stages(s):
        by_layer: Dict[str, Dict[str, torch.Tensor]] = {}
        for prefix, key, t in m.user_state():
            by_layer.setdefault(prefix, {})[key] = t.detach().cpu().contiguous()
        params = dict(m.named_user_parameters())
        for prefix, tensors in by_layer.items():
            save_file(tensors, os.path.join(tmp, "model", f"{prefix}.safetensors"))
            state = {}
            for key in tensors:
                p = params.get(key)
                for name, v in (s.optimizer.state.get(p, {}) if p is not None else {}).items():
                    v = v if isinstance(v, torch.Tensor) else torch.tensor(v)
                    state[f"{key}/{name}"] = v.detach().cpu().contiguous()
            save_file(state, os.path.join(tmp, "optimizer", f"{prefix}.safetensors"))
    ef = s.exchange.state()
    if ef:
        d = os.path.join(tmp, "feedback", f"replica{s.world.replica}")
        os.makedirs(d, exist_ok=True)
        buckets = sorted(s.stages)
        by_stage: Dict[str, Dict[str, torch.Tensor]] = {}
        for k, t in ef.items():
            side, b = k.split(".")
            dd, st = buckets[int(b)]
            by_stage.setdefault(f"dir{dd}-stage{st}", {})[side] = t.detach().cpu().contiguous()
        for name, tensors in by_stage.items():
            save_file(tensors, os.path.join(d, f"{name}.safetensors"))
    _barrier(s)
    if s.world.rank == 0:
        files = {}
        for root, _, names in os.walk(tmp):
            for n in sorted(names):
                full = os.path.join(root, n)
                files[os.path.relpath(full, tmp)] = _sha256(full)
        manifest = {
            "format": FORMAT, "step": s.steps, "schedule": s.kind, "pipeline_stages": s.world.pipeline_ranks,
            "replicas": s.world.replicas, "micro_batches": s.micro_batches, "compression": s.compression,
            "compression_warmup": s.warmup, "optimizer": type(s.optimizer).__name__,
            "param_groups": [_hyper(g) for g in s.optimizer.param_groups], "partition": s.partition,
            "files": dict(sorted(files.items())),
        }
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        os.rename(tmp, path)
    _barrier(s)


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of checkpoint ``path``; a ``ValueError`` when it is not one."""
    mpath = os.path.join(os.fspath(path), "manifest.json")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path} is not a checkpoint (no manifest.json): give a directory written by save()") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{mpath} cannot be read as a checkpoint manifest: {e}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{mpath} is not a {FORMAT} manifest (format {manifest.get('format')!r})")
    return manifest


def _load_checked(path: str, rel: str, manifest: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    want = manifest["files"].get(rel)
    full = os.path.join(path, rel)
    if want is None or not os.path.exists(full):
        raise ValueError(f"checkpoint {path} has no {rel}: it was written for another model")
    if _sha256(full) != want:
        raise ValueError(f"{full} does not match its SHA-256 in the manifest: the checkpoint is damaged")
    return load_file(full)


def load(s: Any, path: str) -> None:
    """Restores a checkpoint on this grid (any shape); every rank calls it."""
    path = os.fspath(path)
    manifest = read_manifest(path)
    if manifest["optimizer"] != type(s.optimizer).__name__:
        raise ValueError(
            f"checkpoint {path} holds {manifest['optimizer']} state, but this strategy's optimizer is "
            f"{type(s.optimizer).__name__}: build the strategy with the same optimizer"
        )
    cache: Dict[str, Dict[str, torch.Tensor]] = {}
    opt_cache: Dict[str, Dict[str, torch.Tensor]] = {}
    for m in s.stages.values():
        params = dict(m.named_user_parameters())
        for prefix, key, t in m.user_state():
            if prefix not in cache:
                cache[prefix] = _load_checked(path, f"model/{prefix}.safetensors", manifest)
                opt_cache[prefix] = _load_checked(path, f"optimizer/{prefix}.safetensors", manifest)
            saved = cache[prefix].get(key)
            if saved is None or saved.shape != t.shape:
                raise ValueError(f"checkpoint {path} has no tensor {key} of shape {tuple(t.shape)}: another model")
            with torch.no_grad():
                t.copy_(saved.to(t.device, t.dtype))
            p = params.get(key)
            if p is None:
                continue
            state = {n.split("/", 1)[1]: v.to(p.device) for n, v in opt_cache[prefix].items() if n.startswith(key + "/")}
            if state:
                if "step" in state and state["step"].device != torch.device("cpu"):
                    state["step"] = state["step"].cpu()
                s.optimizer.state[p] = state
            else:
                s.optimizer.state.pop(p, None)
    for group, saved in zip(s.optimizer.param_groups, manifest["param_groups"]):
        for k, v in saved.items():
            if k in group and not isinstance(group[k], torch.Tensor):
                group[k] = tuple(v) if isinstance(group[k], tuple) else v
    s.steps = manifest["step"]
    same_grid = (manifest["schedule"], manifest["pipeline_stages"], manifest["replicas"], manifest["compression"]) == (
        s.kind, s.world.pipeline_ranks, s.world.replicas, s.compression)
    ef: Dict[str, torch.Tensor] = {}
    if same_grid:
        for b, (d, st) in enumerate(sorted(s.stages)):
            rel = f"feedback/replica{s.world.replica}/dir{d}-stage{st}.safetensors"
            if rel in manifest["files"]:
                for side, t in _load_checked(path, rel, manifest).items():
                    ef[f"{side}.{b}"] = t.to(s.device)
    s.exchange.load_state(ef)
    _barrier(s)
