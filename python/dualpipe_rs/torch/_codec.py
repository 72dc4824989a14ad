"""The gradient codecs in torch ops (so they run on CUDA too), byte for byte the Rust layouts
(``dualpipe-dp``'s ``codec``), rounding to nearest.

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


def _rows(x: torch.Tensor, chunk: int):
    """``x`` padded with zeros to whole chunks, one chunk per row; with ``n`` and the last chunk's length."""
    n = x.numel()
    rows = max(1, -(-n // chunk))
    pad = rows * chunk - n
    return torch.nn.functional.pad(x, (0, pad)).view(rows, chunk), n, chunk - pad


def _row_body_bytes(compression: str, values: int) -> int:
    return values if compression == "int8" else -(-values // 8)


def encode(x: torch.Tensor, compression: Optional[str], chunk: int) -> torch.Tensor:
    """The bytes (a uint8 tensor) of the flat tensor ``x``: per chunk its f32 scale, then its
    values (int8) or sign bits (1bit), chunk after chunk."""
    if compression is None:
        return x.contiguous().view(torch.uint8).clone()
    if compression == "bf16":
        return x.to(torch.bfloat16).view(torch.uint8).clone()
    if x.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=x.device)
    rows, n, last = _rows(x, chunk)
    if compression == "int8":
        scale = (rows.abs().amax(dim=1) / 127.0).to(torch.float32)
        s = scale.to(x.dtype).unsqueeze(1)
        safe = torch.where(s > 0, s, torch.ones_like(s))
        q = torch.where(s > 0, torch.round(rows / safe), torch.zeros_like(rows))
        body = q.clamp(-127, 127).to(torch.int8).view(torch.uint8)
    else:
        counts = torch.full((rows.shape[0],), chunk, dtype=x.dtype, device=x.device)
        counts[-1] = last  # the padding does not count in the last chunk's mean
        scale = (rows.abs().sum(dim=1) / counts).to(torch.float32)
        width = _row_body_bytes("1bit", chunk)
        valid = torch.arange(rows.numel(), device=x.device).view_as(rows) < n  # padding writes 0 bits
        signs = torch.nn.functional.pad(((rows >= 0) & valid).to(torch.uint8), (0, 8 * width - chunk))
        body = (signs.view(rows.shape[0], width, 8) * _BITS.to(x.device)).sum(dim=2, dtype=torch.uint8)
    table = torch.cat([scale.view(torch.uint8).view(-1, 4), body], dim=1).view(-1)
    return table[: encoded_bytes(n, compression, 0, chunk)].clone()


def decode(b: torch.Tensor, compression: Optional[str], n: int, dtype: torch.dtype, chunk: int) -> torch.Tensor:
    """The ``n`` values of ``dtype`` that :func:`encode` wrote into ``b``."""
    if compression is None:
        return b.view(dtype).clone()
    if compression == "bf16":
        return b.view(torch.bfloat16).to(dtype)
    if n == 0:
        return torch.empty(0, dtype=dtype, device=b.device)
    rows = -(-n // chunk)
    width = 4 + _row_body_bytes(compression, chunk)
    table = torch.nn.functional.pad(b, (0, rows * width - b.numel())).view(rows, width)
    scale = table[:, :4].contiguous().view(torch.float32).to(dtype)  # [rows, 1]
    body = table[:, 4:]
    if compression == "int8":
        return (body.view(torch.int8).to(dtype) * scale).view(-1)[:n]
    bits = ((body.unsqueeze(2) & _BITS.to(b.device)) != 0).view(rows, -1)[:, :chunk]
    return torch.where(bits, scale, -scale).view(-1)[:n]


def encoded_bytes(n: int, compression: Optional[str], itemsize: int, chunk: int) -> int:
    """The size of :func:`encode`'s output for ``n`` values of ``itemsize`` bytes."""
    if compression is None:
        return n * itemsize
    if compression == "bf16":
        return 2 * n
    if n == 0:
        return 0
    rows = -(-n // chunk)
    last = n - (rows - 1) * chunk
    return 4 * rows + (rows - 1) * _row_body_bytes(compression, chunk) + _row_body_bytes(compression, last)
