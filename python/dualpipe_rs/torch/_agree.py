"""Every rank raises the same error: what one rank finds wrong (a file it cannot write, a tensor it
holds that is not a finite number) reaches every other, so no rank waits on one that gave up.

Used by the checkpoints (``_checkpoint``): each phase ends with :func:`agree` where it used to end
with a barrier, so a failure costs no timeout and every rank says the same thing.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ._p2p import wait_for

_TEXT_BYTES = 16384  # one message: a path (at most 4096 bytes) and our words around it
_KINDS = {k.__name__: k for k in (ValueError, TypeError, FloatingPointError, OSError, RuntimeError)}


def _encode(text: str) -> torch.Tensor:
    data = text.encode("utf-8", errors="surrogateescape")[: _TEXT_BYTES - 4]
    buf = torch.zeros(_TEXT_BYTES, dtype=torch.uint8)
    buf[:4] = torch.tensor(list(len(data).to_bytes(4, "little")), dtype=torch.uint8)
    if data:
        buf[4 : 4 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf


def _decode(buf: torch.Tensor) -> str:
    raw = bytes(buf.cpu().tolist())
    n = int.from_bytes(raw[:4], "little")
    return raw[4 : 4 + n].decode("utf-8", errors="surrogateescape")


def share_text(s: Any, text: Optional[str], src: int, what: str) -> str:
    """Rank ``src``'s ``text`` on every rank (the others pass ``None``)."""
    w = s.world
    if w.size == 1:
        return text or ""
    buf = (_encode(text or "") if w.rank == src else torch.zeros(_TEXT_BYTES, dtype=torch.uint8)).to(s.device)
    wait_for(dist.broadcast(buf, src=src, async_op=True), f"rank {w.rank}: {what} from rank {src}", s.timeout)
    return _decode(buf)


def agree(s: Any, problem: Optional[BaseException], what: str) -> Optional[BaseException]:
    """Every rank calls it with its own problem (``None`` when all went well); every rank gets the
    problem of the lowest rank that had one, as an exception of the same kind (``ValueError``,
    ``FloatingPointError``, ``OSError``, ... ; another kind arrives as ``RuntimeError`` naming it),
    or ``None``. One ``all_reduce`` of a flag per rank, and a broadcast only when one failed."""
    w = s.world
    if w.size == 1:
        return problem
    flags = torch.zeros(w.size, dtype=torch.int32, device=s.device)
    if problem is not None:
        flags[w.rank] = 1
    wait_for(dist.all_reduce(flags, async_op=True), f"rank {w.rank}: {what}", s.timeout)
    failed = flags.cpu().nonzero().flatten().tolist()
    if not failed:
        return None
    src = failed[0]
    text = None
    if w.rank == src:
        assert problem is not None
        text = f"{type(problem).__name__}\n{problem}"
    kind, _, message = share_text(s, text, src, what).partition("\n")
    if w.rank == src:
        return problem
    cls = _KINDS.get(kind)
    return cls(message) if cls is not None else RuntimeError(f"rank {src}: {kind}: {message}")
