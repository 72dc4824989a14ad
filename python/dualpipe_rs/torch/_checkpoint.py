"""Checkpoints of a ``DualPipeStrategy``: per-layer safetensors named by the user's own keys.

A checkpoint directory holds ``model/<layer>.safetensors`` (each tensor under the user's
``state_dict`` key, e.g. ``blocks.3.attn.qkv.weight``), ``optimizer/<layer>.safetensors`` (each
state tensor as ``<key>/<state name>``: AdamW's ``step``, ``exp_avg``, ``exp_avg_sq``),
``feedback/replica<d>/dir<d>-stage<s>.safetensors`` (the compressed exchange's error feedback),
and ``manifest.json`` (the step, the grid, the optimizer's hyper-parameters, a SHA-256 per file,
and ``manifest_sha256`` over its own fields), written last. Nothing is named by rank, so any grid
shape loads it. The rules it keeps with the Rust writer are docs/checkpoints.md's "The contract":
only finite state is saved or loaded; the directory is written into a partial folder of ours
beside the target (``_partial``) and renamed into place once complete; an existing path (a
link included) is never overwritten; damage (a file missing or changed, an edited manifest, a
value that is not finite) is refused naming what; another dtype is refused naming both. Every
failure reaches every rank (``_agree``), so all raise the same error and none waits. Error
feedback is restored only on the same grid, compression and ZeRO level (its shards follow the
grid); another shape starts it from zero. Under ZeRO the optimizer state is written whole, by
parameter name, as without it: each stage's writer gathers its pieces first, and a loading rank
cuts out its own, so any ZeRO level loads any other's checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
from safetensors.torch import load_file, save_file

from . import _partial
from ._agree import agree, share_text

FORMAT = "dualpipe-torch-checkpoint/2"
FORMAT_V1 = "dualpipe-torch-checkpoint/1"  # before manifest_sha256: read, its own fields unchecked
_MANIFEST_BYTES = 64 << 20
_REQUIRED = ("step", "schedule", "pipeline_stages", "replicas", "compression", "optimizer", "param_groups", "files")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_digest(manifest: Dict[str, Any]) -> str:
    """The SHA-256 of the manifest's own fields (all but ``manifest_sha256``), as canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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


def _first_non_finite(tensors: Dict[str, torch.Tensor]) -> Optional[str]:
    """The first name (in name order) whose tensor holds inf or NaN."""
    bad = [n for n, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return min(bad) if bad else None


def _files_of(s: Any) -> Dict[str, Dict[str, torch.Tensor]]:
    """What this rank writes: relative file name -> {tensor name: host tensor}."""
    files: Dict[str, Dict[str, torch.Tensor]] = {}
    # ZeRO: each stage's writer gathers the whole state of its parameters from the pieces' holders
    whole = s.shards.full_states(s.optimizer, s.steps) if s.shards is not None else None
    for m in _writer_stages(s):
        by_layer: Dict[str, Dict[str, torch.Tensor]] = {}
        for prefix, key, t in m.user_state():
            by_layer.setdefault(prefix, {})[key] = t.detach().cpu().contiguous()
        params = dict(m.named_user_parameters())
        for prefix, tensors in by_layer.items():
            files[f"model/{prefix}.safetensors"] = tensors
            state = {}
            for key in tensors:
                p = params.get(key)
                st = (s.optimizer.state.get(p, {}) if whole is None else whole.get(id(p), {})) if p is not None else {}
                for name, v in st.items():
                    v = v if isinstance(v, torch.Tensor) else torch.tensor(v)
                    state[f"{key}/{name}"] = v.detach().cpu().contiguous()
            files[f"optimizer/{prefix}.safetensors"] = state
    ef = s.exchange.state()
    buckets = sorted(s.stages)
    if s.shards is not None:  # compressed ZeRO: the weights' gather keeps feedback too
        ef.update({f"param.{buckets.index(key)}": t for key, t in s.shards.feedback().items()})
    for k, t in ef.items():
        side, b = k.split(".")
        dd, st = buckets[int(b)]
        rel = f"feedback/replica{s.world.replica}/dir{dd}-stage{st}.safetensors"
        files.setdefault(rel, {})[side] = t.detach().cpu().contiguous()
    return files


def _non_finite_problem(s: Any, files: Dict[str, Dict[str, torch.Tensor]]) -> Optional[FloatingPointError]:
    named = {}
    for rel, tensors in files.items():
        for n, t in tensors.items():
            named[f"{rel[:-len('.safetensors')]}:{n}" if rel.startswith("feedback/") else n] = t
    bad = _first_non_finite(named)
    if bad is None:
        return None
    lr = s.optimizer.param_groups[0].get("lr") if s.optimizer.param_groups else None
    return FloatingPointError(
        f"after step {s.steps} the tensor {bad} holds a value that is not a finite number (inf or NaN): "
        f"training diverged, and this state is not saved; lower the learning rate (now lr={lr})"
    )


def _target(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a directory path, not {type(path).__name__}")
    p = os.fspath(path)
    if isinstance(p, bytes):
        raise TypeError("path must be a str or os.PathLike of str, not bytes")
    return p.rstrip(os.sep) or p


def save(s: Any, path: str) -> None:
    """Writes the checkpoint of step ``s.steps`` to the new directory ``path`` (every rank calls it)."""
    target = _target(path)
    if os.path.lexists(target):  # every rank, before any waits: a dangling link counts
        kind = "a symbolic link" if os.path.islink(target) else "a directory" if os.path.isdir(target) else "a file"
        raise ValueError(
            f"checkpoint directory {target} already exists ({kind}): choose a new one (nothing is overwritten)"
        )
    files = _files_of(s)
    problem: Optional[BaseException] = _non_finite_problem(s, files)
    tmp: Optional[str] = None
    removed: List[str] = []
    if problem is None and s.world.rank == 0:
        try:
            tmp = _partial.create(target, s.steps, FORMAT)
            removed = _partial.remove_stale(_partial.parent_of(target))
        except OSError as e:
            problem = e
    try:
        problem = agree(s, problem, "the checkpoint's start")
        if problem is not None:
            raise problem
        tmp = share_text(s, tmp, 0, "the checkpoint's partial folder")
        try:
            for rel, tensors in files.items():
                os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
                save_file(tensors, os.path.join(tmp, rel))
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait for a timeout
            problem = e
        problem = agree(s, problem, "the checkpoint's files")
        if problem is not None:
            raise problem
        if s.world.rank == 0:
            try:
                _write_manifest(s, tmp)
                _partial.publish(tmp, target)
            except Exception as e:  # noqa: BLE001 - as above
                problem = e
        problem = agree(s, problem, "the checkpoint's rename")
        if problem is not None:
            raise problem
    except BaseException:
        if s.world.rank == 0 and tmp is not None:
            _partial.discard(tmp)
        raise
    for r in removed:
        warnings.warn(f"removed {r}: a partial checkpoint left by a save whose process has ended", stacklevel=3)


def _write_manifest(s: Any, tmp: str) -> None:
    files = {}
    for root, _, names in os.walk(tmp):
        for n in sorted(names):
            full = os.path.join(root, n)
            rel = os.path.relpath(full, tmp)
            if rel != _partial.MARKER:
                files[rel] = _sha256(full)
    manifest = {
        "format": FORMAT, "step": s.steps, "schedule": s.kind, "pipeline_stages": s.world.pipeline_ranks,
        "replicas": s.world.replicas, "micro_batches": s.micro_batches, "compression": s.compression,
        "compression_warmup": s.warmup, "zero": s.zero, "optimizer": type(s.optimizer).__name__,
        "param_groups": [_hyper(g) for g in s.optimizer.param_groups], "partition": s.partition,
        "files": dict(sorted(files.items())),
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    with open(os.path.join(tmp, "manifest.json"), "x") as f:
        json.dump(manifest, f, indent=1)


def _read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (no link followed, no FIFO waited on), at most ``limit``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} has {st.st_size} bytes, more than a manifest's {limit}")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of checkpoint ``path``, its own checksum verified; a ``ValueError`` when it is
    not one or it is damaged."""
    mpath = os.path.join(os.fspath(path), "manifest.json")
    try:
        manifest = json.loads(_read_regular(mpath, _MANIFEST_BYTES))
    except FileNotFoundError:
        raise ValueError(f"{path} is not a checkpoint (no manifest.json): give a directory written by save()") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{mpath} cannot be read as a checkpoint manifest: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in (FORMAT, FORMAT_V1):
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(f"{mpath} is not a {FORMAT} manifest (format {got!r})")
    if manifest["format"] == FORMAT and manifest.get("manifest_sha256") != manifest_digest(manifest):
        raise ValueError(
            f"{mpath} does not match its own checksum (manifest_sha256): the manifest was edited or "
            "damaged, so the checkpoint is damaged"
        )
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing or not isinstance(manifest["files"], dict):
        raise ValueError(f"{mpath} lacks {', '.join(missing) or 'a files table'}: the checkpoint is damaged")
    return manifest


def _load_checked(path: str, rel: str, manifest: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """One file of the checkpoint, its checksum verified and every value finite."""
    want = manifest["files"].get(rel)
    full = os.path.join(path, rel)
    if want is None:
        raise ValueError(f"checkpoint {path} has no {rel}: it was written for another model")
    try:
        st = os.stat(full, follow_symlinks=False)
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path}: {rel} is listed in the manifest but missing: the checkpoint is damaged") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"checkpoint {path}: {rel} is not a regular file: the checkpoint is damaged")
    if _sha256(full) != want:
        raise ValueError(f"{full} does not match its SHA-256 in the manifest: the checkpoint is damaged")
    tensors = load_file(full)
    bad = _first_non_finite(tensors)
    if bad is not None:
        raise ValueError(
            f"checkpoint {path} is damaged: the tensor {bad} ({rel}) holds a value that is not a finite "
            "number (inf or NaN): the run had diverged"
        )
    return tensors


class _Restore:
    """What :func:`load` will change, read and checked before anything changes."""

    def __init__(self) -> None:
        self.copies: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.states: List[Tuple[Any, Optional[Dict[str, torch.Tensor]]]] = []
        self.feedback: Dict[str, torch.Tensor] = {}
        self.manifest: Dict[str, Any] = {}


def _read(s: Any, path: str) -> _Restore:
    manifest = read_manifest(path)
    if manifest["optimizer"] != type(s.optimizer).__name__:
        raise ValueError(
            f"checkpoint {path} holds {manifest['optimizer']} state, but this strategy's optimizer is "
            f"{type(s.optimizer).__name__}: build the strategy with the same optimizer"
        )
    out = _Restore()
    out.manifest = manifest
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
            if saved.dtype != t.dtype:
                raise ValueError(
                    f"checkpoint {path} holds {key} as {saved.dtype}, but this model's {key} is {t.dtype}: "
                    f"build the model in {saved.dtype} (e.g. model.to({saved.dtype})) before the strategy to "
                    "load it (a cast would leave the optimizer state in the other dtype)"
                )
            out.copies.append((t, saved))
            p = params.get(key)
            if p is None:
                continue
            state = {n.split("/", 1)[1]: v.to(p.device) for n, v in opt_cache[prefix].items() if n.startswith(key + "/")}
            if "step" in state and state["step"].device != torch.device("cpu"):
                state["step"] = state["step"].cpu()
            out.states.append((p, state or None))
    same_grid = (manifest["schedule"], manifest["pipeline_stages"], manifest["replicas"], manifest["compression"],
                 manifest.get("zero", 0)) == (s.kind, s.world.pipeline_ranks, s.world.replicas, s.compression, s.zero)
    if same_grid:
        for b, (d, st) in enumerate(sorted(s.stages)):
            rel = f"feedback/replica{s.world.replica}/dir{d}-stage{st}.safetensors"
            if rel in manifest["files"]:
                for side, t in _load_checked(path, rel, manifest).items():
                    out.feedback[f"{side}.{b}"] = t.to(s.device)
    return out


def load(s: Any, path: str) -> None:
    """Restores a checkpoint on this grid (any shape); every rank calls it. Everything is read and
    checked first, on every rank; a problem any rank finds is raised on every rank and nothing of
    the strategy changes."""
    path = os.fspath(path)
    problem: Optional[BaseException] = None
    try:
        restore = _read(s, path)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait for a timeout
        problem = e
    problem = agree(s, problem, "the checkpoint's load")
    if problem is not None:
        raise problem
    with torch.no_grad():
        for t, saved in restore.copies:
            t.copy_(saved.to(t.device))
    if s.shards is not None:  # ZeRO: each rank keeps its pieces of the whole tensors read
        s.shards.load_states(s.optimizer, restore.states)
    for p, state in restore.states if s.shards is None else []:
        if state:
            s.optimizer.state[p] = state
        else:
            s.optimizer.state.pop(p, None)
    for group, saved in zip(s.optimizer.param_groups, restore.manifest["param_groups"]):
        for k, v in saved.items():
            if k in group and not isinstance(group[k], torch.Tensor):
                group[k] = tuple(v) if isinstance(group[k], tuple) else v
    s.steps = restore.manifest["step"]
    keys = sorted(s.stages)
    s.exchange.load_state({k: t for k, t in restore.feedback.items() if not k.startswith("param.")})
    if s.shards is not None:
        s.shards.reset_pieces({keys[int(k.split(".")[1])]: t for k, t in restore.feedback.items() if k.startswith("param.")})
