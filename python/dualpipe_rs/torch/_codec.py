"""The gradient codecs in torch ops (so they run on CUDA too), byte for byte the Rust layouts.

``bf16``: each value as bfloat16. ``int8``: per chunk of ``chunk`` values an f32 scale
(``max |x| / 127``) then one int8 per value (rounded to nearest). ``1bit``: per chunk an f32
scale (``mean |x|``) then one sign bit per value (1 for ``x >= 0``, least significant bit
first). ``None``: the values' own bytes.
"""

from __future__ import annotations

from typing import Optional

import torch

COMPRESSIONS = (None, "bf16", "int8", "1bit")
_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def check_compression(compression: object) -> Optional[str]:
    """``compression`` if it is one we know, else a ``ValueError`` listing them."""
    if compression is not None and not isinstance(compression, str):
        raise TypeError(f"compression must be None or one of 'bf16', 'int8', '1bit', not {type(compression).__name__}")
    if compression not in COMPRESSIONS:
        raise ValueError(
            f"unknown compression '{compression}': use None (exact), 'bf16', 'int8' or '1bit'"
        )
    return compression


def _chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    n = x.numel()
    rows = -(-n // chunk)
    pad = rows * chunk - n
    return torch.nn.functional.pad(x, (0, pad)).view(rows, chunk), n, pad


def encode(x: torch.Tensor, compression: Optional[str], chunk: int) -> torch.Tensor:
    """The bytes (a uint8 tensor) of the flat tensor ``x``."""
    if compression is None:
        return x.contiguous().view(torch.uint8).clone()
    if compression == "bf16":
        return x.to(torch.bfloat16).view(torch.uint8).clone()
    rows, n, pad = _chunks(x, chunk)
    if compression == "int8":
        scale = (rows.abs().amax(dim=1) / 127.0).to(torch.float32)
        s = scale.to(x.dtype).unsqueeze(1)
        q = torch.where(s > 0, torch.round(rows / torch.where(s > 0, s, torch.ones_like(s))), torch.zeros_like(rows))
        q = q.clamp(-127, 127).to(torch.int8).view(-1)[:n]
        return torch.cat([scale.view(torch.uint8), q.view(torch.uint8)])
    # 1bit: the padding must not count in the last chunk's mean
    counts = torch.full((rows.shape[0],), chunk, dtype=x.dtype, device=x.device)
    counts[-1] = chunk - pad
    scale = (rows.abs().sum(dim=1) / counts).to(torch.float32)
    signs = (x >= 0).to(torch.uint8)
    nbits = -(-n // 8) * 8
    signs = torch.nn.functional.pad(signs, (0, nbits - n)).view(-1, 8)
    packed = (signs * _BITS.to(x.device)).sum(dim=1, dtype=torch.uint8)
    return torch.cat([scale.view(torch.uint8), packed])


def decode(b: torch.Tensor, compression: Optional[str], n: int, dtype: torch.dtype, chunk: int) -> torch.Tensor:
    """The ``n`` values of ``dtype`` that :func:`encode` wrote into ``b``."""
    if compression is None:
        return b.view(dtype).clone()
    if compression == "bf16":
        return b.view(torch.bfloat16).to(dtype)
    rows = -(-n // chunk)
    scale = b[: 4 * rows].view(torch.float32).to(dtype)
    per_value = scale.repeat_interleave(chunk)[:n]
    body = b[4 * rows :]
    if compression == "int8":
        return body.view(torch.int8).to(dtype) * per_value
    bits = ((body.unsqueeze(1) & _BITS.to(b.device)) != 0).view(-1)[:n]
    return torch.where(bits, per_value, -per_value)


def encoded_bytes(n: int, compression: Optional[str], itemsize: int, chunk: int) -> int:
    """The size of :func:`encode`'s output for ``n`` values of ``itemsize`` bytes."""
    if compression is None:
        return n * itemsize
    if compression == "bf16":
        return 2 * n
    rows = -(-n // chunk)
    return 4 * rows + (n if compression == "int8" else -(-n // 8))
