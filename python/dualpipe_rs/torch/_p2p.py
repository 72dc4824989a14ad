"""Point-to-point activations and gradients between pipeline ranks over torch.distributed.

Every message has its own tag (kind, direction, stage, micro-batch), so on gloo all of a step's
receives are posted before its first op and each lands in its own buffer whatever order they
arrive in. NCCL matches point-to-point messages by order, not by tag, and serialises a pair's
sends and receives on one stream: there a receive is posted at its ``RECV`` op, in the order the
lowered program (validated deadlock-free) gives.

Shapes: the first step with a new micro-batch shape sends a small header (dtype, shape) before
each message; the receiving rank learns every boundary's shape from it, and later steps
post their receives at once into buffers of those shapes.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
]
_HEADER = 10  # dtype code, number of dims, up to 8 dims


class RankFailed(RuntimeError):
    """A peer rank stopped answering (it failed or was killed)."""


def wait_for(work: Any, what: str, timeout: float) -> None:
    """Waits for ``work``; a failure or a timeout becomes :class:`RankFailed` saying ``what``."""
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout))
    except Exception as e:  # gloo: connection closed by a dead peer, or its own timeout
        raise RankFailed(f"{what} failed: {e}".strip()) from e
    if ok is False:
        raise RankFailed(f"{what} did not complete within {timeout:g} s")


class P2P:
    """One rank's messages to and from its pipeline neighbours for one step at a time.

    ``ranks[p]`` is the global rank of pipeline rank ``p`` of this replica; ``tag_of`` numbers a
    message uniquely within a step.
    """

    def __init__(self, ranks: List[int], me: int, device: torch.device, early: bool, timeout: float):
        self.ranks = ranks
        self.me = me
        self.device = device
        self.early = early
        self.timeout = timeout
        self.shapes: Dict[Tuple, Tuple[torch.Size, torch.dtype]] = {}
        self.headers = False
        self.pending: Dict[Tuple, Any] = {}
        self.sends: List[Tuple[Any, Any, str]] = []
        self.bytes_sent = 0
        self.wait_seconds = 0.0

    def begin(self, headers: bool) -> None:
        """A new step; ``headers``: every message of this step carries its dtype and shape."""
        self.headers = headers
        self.pending.clear()
        self.sends.clear()
        self.bytes_sent = 0
        self.wait_seconds = 0.0

    @staticmethod
    def _key(kind: str, chunk: Tuple[int, int, int]) -> Tuple:
        return (kind, chunk[0], chunk[1])

    def _what(self, kind: str, chunk, peer: int, sending: bool) -> str:
        d, s, m = chunk
        noun = "activations" if kind == "F" else "gradients"
        way = f"to rank {self.ranks[peer]}" if sending else f"from rank {self.ranks[peer]}"
        return f"rank {self.ranks[self.me]}: {noun} of micro-batch {m} (direction {d}, stage {s}) {way}"

    def post(self, kind: str, chunk, peer: int, tag: int) -> None:
        """Posts the receive of ``kind`` (``"F"`` or ``"B"``) for ``chunk`` from pipeline rank ``peer``."""
        key = self._key(kind, chunk)
        if self.headers or key not in self.shapes:
            self.pending[(kind, chunk)] = ("header", peer, tag)
            return
        shape, dtype = self.shapes[key]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(buf, src=self.ranks[peer], tag=2 * tag)
        self.pending[(kind, chunk)] = ("posted", work, buf, peer)

    def take(self, kind: str, chunk) -> torch.Tensor:
        """The received tensor for ``chunk`` (waiting for it)."""
        entry = self.pending.pop((kind, chunk))
        t0 = time.perf_counter()
        if entry[0] == "header":
            _, peer, tag = entry
            what = self._what(kind, chunk, peer, False)
            header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
            wait_for(dist.irecv(header, src=self.ranks[peer], tag=2 * tag + 1), what + " (its shape)", self.timeout)
            code, ndim, *dims = header.tolist()
            shape = torch.Size(dims[:ndim])
            dtype = _DTYPES[code]
            self.shapes[self._key(kind, chunk)] = (shape, dtype)
            buf = torch.empty(shape, dtype=dtype, device=self.device)
            wait_for(dist.irecv(buf, src=self.ranks[peer], tag=2 * tag), what, self.timeout)
        else:
            _, work, buf, peer = entry
            wait_for(work, self._what(kind, chunk, peer, False), self.timeout)
        self.wait_seconds += time.perf_counter() - t0
        return buf

    def send(self, kind: str, chunk, peer: int, tag: int, tensor: torch.Tensor) -> None:
        """Sends ``tensor`` without waiting (completed by :meth:`finish`)."""
        tensor = tensor.detach().contiguous()
        dst = self.ranks[peer]
        what = self._what(kind, chunk, peer, True)
        if self.headers:
            if tensor.dim() > _HEADER - 2 or tensor.dtype not in _DTYPES:
                raise ValueError(
                    f"stage {chunk[1]} sends a {tensor.dim()}-dimensional {tensor.dtype} tensor; the pipeline "
                    f"carries tensors of at most {_HEADER - 2} dimensions of the dtypes {_DTYPES}"
                )
            dims = list(tensor.shape) + [0] * (_HEADER - 2 - tensor.dim())
            header = torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *dims], dtype=torch.int64, device=self.device)
            self.sends.append((dist.isend(header, dst=dst, tag=2 * tag + 1), header, what))
        self.sends.append((dist.isend(tensor, dst=dst, tag=2 * tag), tensor, what))
        self.bytes_sent += tensor.numel() * tensor.element_size()

    def finish(self) -> None:
        """Waits for every send of the step."""
        for work, _, what in self.sends:
            wait_for(work, what, self.timeout)
        self.sends.clear()
        if self.pending:  # pragma: no cover - the validator proves every receive is consumed
            raise RuntimeError(f"rank {self.ranks[self.me]}: {len(self.pending)} messages were never used")


def tag_of(kind: str, chunk, stages: int, micro_batches: int) -> int:
    """A number for the message of ``kind`` about ``chunk``, unique within a step."""
    d, s, m = chunk
    return ((("F", "B").index(kind) * 2 + d) * stages + s) * micro_batches + m


def local_tensor(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A tensor passed between two stages on the same rank, cut from the producer's graph."""
    return None if t is None else t.detach()
