#!/usr/bin/env python3
"""The GPT of docs/models.md in PyTorch (f64) against `dualpipe eval` and one `dualpipe train` SGD step.

Builds the documented architecture with PyTorch's own layers (nn.functional.rms_norm,
scaled_dot_product_attention with a causal mask, erf GELU, cross_entropy), draws random weights
with a torch generator, writes them as safetensors with the documented names and metadata, and
checks, in f64:

1. `dualpipe eval --weights W --data F --seq-len N --dtype f64 --format json`: the loss equals
   PyTorch's mean next-token cross-entropy over the file's non-overlapping windows of N+1 bytes
   (for the model's seq_len and a shorter one) to --tol;
2. for every schedule of --schedules, one SGD step
   `dualpipe train --model gpt --init-from W --data F --shuffle false --optimizer sgd --momentum 0
   --steps 1 --save W2 --dtype f64 ...`: every tensor of W2 equals PyTorch's `W - lr * grad` to
   --tol, where the step's loss is the mean over the step's micro-batches of each micro-batch's
   mean token cross-entropy and row r of global micro-batch m (step 1) is training window
   (m * B + r) mod windows (docs/models.md, "Data").

Prints a table and exits 1 on any mismatch (2 on a usage problem). Needs torch and numpy
(`python -m pip install torch numpy`) and a built CLI:

    cargo build --release -p dualpipe-cli
    python3 scripts/torch_gpt_parity.py [--binary target/release/dualpipe]

Torch is not part of the default test command; python/tests/test_torch_parity.py runs this
script when torch is importable and skips otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 256


# ---------------------------------------------------------------------------------------------
# safetensors, written and read by hand (the format is an 8-byte little-endian header length, a
# JSON header, then the raw little-endian tensor bytes), so no extra package is needed.

_DTYPES = {torch.float64: ("F64", "<f8"), torch.float32: ("F32", "<f4")}
_NP = {"F64": "<f8", "F32": "<f4"}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        code, np_dtype = _DTYPES[t.dtype]
        data = t.numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    body = raw[8 + n :]
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        arr = np.frombuffer(body[a:b], dtype=_NP[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.astype("<f8"))
    return out, metadata


# ---------------------------------------------------------------------------------------------
# The model (docs/models.md, "The GPT architecture").


def tensor_shapes(d, layers, seq_len):
    shapes = {"tok_emb.weight": (VOCAB, d), "pos_emb.weight": (seq_len, d)}
    for l in range(layers):
        p = f"blocks.{l}."
        shapes[p + "norm1.weight"] = (d,)
        shapes[p + "attn.qkv.weight"] = (3 * d, d)
        shapes[p + "attn.proj.weight"] = (d, d)
        shapes[p + "norm2.weight"] = (d,)
        shapes[p + "mlp.fc1.weight"] = (4 * d, d)
        shapes[p + "mlp.fc2.weight"] = (d, 4 * d)
    shapes["norm_f.weight"] = (d,)
    shapes["lm_head.weight"] = (VOCAB, d)
    return shapes


def random_weights(d, layers, seq_len, seed):
    """Random f64 weights: norms near 1, linears uniform in ±1/√in, embeddings of scale 0.3."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in tensor_shapes(d, layers, seq_len).items():
        if len(shape) == 1:
            t = 1.0 + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith("_emb.weight"):
            t = 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            bound = 1.0 / math.sqrt(shape[1])
            t = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound
        w[name] = t
    return w


def logits(w, ids, d, heads, layers):
    """ids [rows, T] -> logits [rows, T, 256]."""
    rows, T = ids.shape
    hd = d // heads
    h = F.embedding(ids, w["tok_emb.weight"]) + w["pos_emb.weight"][:T]
    for l in range(layers):
        p = f"blocks.{l}."
        x = F.rms_norm(h, (d,), w[p + "norm1.weight"], eps=1e-5)
        qkv = F.linear(x, w[p + "attn.qkv.weight"])
        q, k, v = qkv.split(d, dim=-1)  # rows q, then k, then v; each head-major
        q, k, v = (t.view(rows, T, heads, hd).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(rows, T, d)
        h = h + F.linear(o, w[p + "attn.proj.weight"])
        x = F.rms_norm(h, (d,), w[p + "norm2.weight"], eps=1e-5)
        h = h + F.linear(F.gelu(F.linear(x, w[p + "mlp.fc1.weight"]), approximate="none"), w[p + "mlp.fc2.weight"])
    h = F.rms_norm(h, (d,), w["norm_f.weight"], eps=1e-5)
    return F.linear(h, w["lm_head.weight"])


def windows(data, seq_len):
    n = len(data) // (seq_len + 1)
    arr = torch.tensor(list(data[: n * (seq_len + 1)]), dtype=torch.long).view(n, seq_len + 1)
    return arr


def mean_loss(w, wins, arch):
    lg = logits(w, wins[:, :-1], *arch)
    return F.cross_entropy(lg.reshape(-1, VOCAB), wins[:, 1:].reshape(-1))


# ---------------------------------------------------------------------------------------------


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def rel_err(a, b):
    return abs(a - b) / max(1.0, abs(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "target", "release", "dualpipe"))
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--validation-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tol", type=float, default=1e-9)
    ap.add_argument(
        "--schedules",
        nargs="+",
        default=["dualpipe:4", "dualpipev:2", "1f1b:4", "zb1p:2", "gpipe:1"],
        help="KIND:RANKS pairs for the SGD step (empty to skip)",
    )
    ap.add_argument("--skip-train", action="store_true", help="only the eval checks")
    args = ap.parse_args()
    if not os.path.isfile(args.binary):
        print(f"error: no CLI at {args.binary}; run `cargo build --release -p dualpipe-cli` or pass --binary", file=sys.stderr)
        return 2
    torch.set_default_dtype(torch.float64)
    d, heads, layers, T = args.d_model, args.heads, args.layers, args.seq_len
    arch = (d, heads, layers)
    w = random_weights(d, layers, T, args.seed)
    meta = {"model": "gpt", "d_model": str(d), "heads": str(heads), "layers": str(layers), "seq_len": str(T), "vocab": str(VOCAB)}

    # Any bytes will do; a seeded mixture of text and arbitrary bytes covers the whole vocabulary.
    g = torch.Generator().manual_seed(args.seed + 1)
    text = (b"To be, or not to be, that is the question:\n" * 40) + bytes(torch.randint(0, 256, (2000,), generator=g).tolist())
    rows = []  # (check, ours, torch, error, ok)

    with tempfile.TemporaryDirectory() as tmp:
        wpath = os.path.join(tmp, "w.safetensors")
        dpath = os.path.join(tmp, "data.bin")
        write_safetensors(wpath, w, meta)
        with open(dpath, "wb") as f:
            f.write(text)

        with torch.no_grad():
            for n in (T, T // 2):
                ours = json.loads(run([args.binary, "eval", "--weights", wpath, "--data", dpath, "--seq-len", str(n), "--dtype", "f64", "--format", "json"]))
                want = mean_loss(w, windows(text, n), arch).item()
                e = rel_err(ours["loss"], want)
                rows.append((f"eval loss, seq-len {n}", f"{ours['loss']:.15f}", f"{want:.15f}", e, e <= args.tol))

        if args.skip_train:
            schedules = []
        else:
            schedules = args.schedules
        val_len = math.floor(len(text) * args.validation_fraction)
        train_bytes = text[: len(text) - val_len]
        wins = windows(train_bytes, T)
        M, B = args.micro_batches, args.micro_batch_size
        # Step 1 (1-based): row r of global micro-batch m is window ((1-1)·M + m)·B + r mod windows.
        idx = [[(m * B + r) % len(wins) for r in range(B)] for m in range(M)]
        params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        loss = sum(mean_loss(params, wins[torch.tensor(i)], arch) for i in idx) / M
        loss.backward()
        expected = {k: (w[k] - args.lr * params[k].grad).detach() for k in w}
        update_scale = max((args.lr * params[k].grad).abs().max().item() for k in w)

        for spec in schedules:
            kind, ranks = spec.split(":")
            ranks = int(ranks)
            stages = ranks * 2 if kind in ("dualpipev", "interleaved") else ranks
            if layers % stages:
                print(f"error: {layers} layers do not split over the {stages} stages of {spec}", file=sys.stderr)
                return 2
            w2path = os.path.join(tmp, f"w2-{kind}-{ranks}.safetensors")
            cmd = [args.binary, "train", "--model", "gpt", "--init-from", wpath, "--data", dpath,
                   "--shuffle", "false", "--optimizer", "sgd", "--momentum", "0", "--lr-warmup", "0", "--steps", "1",
                   "--lr", repr(args.lr), "--dtype", "f64", "--schedule", kind, "--ranks", str(ranks),
                   "--micro-batches", str(M), "--micro-batch-size", str(B),
                   "--layers-per-stage", str(layers // stages),
                   "--validation-fraction", repr(args.validation_fraction),
                   "--save", w2path, "--format", "json", "--quiet"]
            summary = json.loads(run(cmd))
            got, meta2 = read_safetensors(w2path)
            if meta2 != meta:
                rows.append((f"{spec}: metadata", json.dumps(meta2), json.dumps(meta), float("inf"), False))
            if sorted(got) != sorted(expected):
                rows.append((f"{spec}: tensor names", str(sorted(set(got) ^ set(expected))), "", float("inf"), False))
                continue
            worst_name, worst = None, -1.0
            for k in expected:
                if got[k].shape != expected[k].shape:
                    worst_name, worst = k, float("inf")
                    break
                e = (got[k] - expected[k]).abs().max().item()
                if e > worst:
                    worst_name, worst = k, e
            rows.append((f"{spec}: every tensor after 1 SGD step (worst: {worst_name})",
                         f"max |Δ| {worst:.2e}", f"update max {update_scale:.2e}", worst, worst <= args.tol))
            step_loss = _first_loss(summary)
            if step_loss is not None:
                e = rel_err(step_loss, loss.item())
                rows.append((f"{spec}: step-1 training loss", f"{step_loss:.15f}", f"{loss.item():.15f}", e, e <= args.tol))

    width = max(len(r[0]) for r in rows)
    print(f"GPT parity with PyTorch {torch.__version__} (f64; d {d}, {heads} heads, {layers} layers, seq {T}; "
          f"{M} micro-batches of {B}; lr {args.lr}; tolerance {args.tol:g})")
    print(f"| {'check':<{width}} | {'dualpipe':>22} | {'pytorch':>22} | {'error':>9} | ok  |")
    print(f"|{'-' * (width + 2)}|{'-' * 24}|{'-' * 24}|{'-' * 11}|-----|")
    for name, ours, want, e, ok in rows:
        print(f"| {name:<{width}} | {ours:>22} | {want:>22} | {e:9.2e} | {'yes' if ok else 'NO':<3} |")
    bad = [r for r in rows if not r[4]]
    print("all checks agree" if not bad else f"{len(bad)} check(s) disagree")
    return 1 if bad else 0


def _first_loss(summary):
    """The step-1 loss from a `train --format json` summary (the first per-step loss), if shown."""
    for key in ("losses", "step_losses"):
        v = summary.get(key)
        if isinstance(v, list) and v:
            first = v[0]
            return first["loss"] if isinstance(first, dict) else float(first)
    for key in ("final_loss", "loss"):
        v = summary.get(key)
        if isinstance(v, (int, float)):
            return float(v)
    return None


if __name__ == "__main__":
    sys.exit(main())
