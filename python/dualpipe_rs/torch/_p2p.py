"""Point-to-point activations and gradients between pipeline ranks over torch.distributed.

NCCL matches a pair's messages by their order, not by tag, and runs one communicator's operations
one after another. So that one program runs on NCCL and gloo alike:

- every ordered pair of pipeline neighbours (``a`` sends to ``b``) has process groups of its own
  (one for the messages, one for their shape headers): on NCCL each is a communicator with its
  own stream, where ``a`` only sends and ``b`` only receives, so a send never waits behind a
  receive of the other direction (two ranks that send to each other before receiving, as
  DualPipe's two directions do, would otherwise each wait for a receive queued behind its own
  send), and a rank's messages to one neighbour never wait for another neighbour;
- a rank posts its receives from a neighbour in the order that neighbour sends them (known from
  the neighbour's program), not in its own order of use, which differs in DualPipe at 6 ranks or
  more and in DualPipeV at 3 or more (see :func:`check_order`).

A send then waits only for its own receive, so a program that runs with buffered sends and
blocking receives (what the schedule's validator proves) also runs here. Gloo runs the same code
and also checks every message's tag.

Receives are posted before the step's first op, each into its own buffer. Shapes: the first step
with a new micro-batch shape sends a small header (dtype, shape) before each message; its
headers are posted at the step's start and each message's receive once its header (and those of
the messages sent before it) has arrived. Later steps post every receive at once into buffers of
the shapes learnt.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Optional, Tuple

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


Message = Tuple[str, Tuple[int, int, int]]  # (kind, the receiving chunk)


class P2P:
    """One rank's messages to and from its pipeline neighbours for one step at a time.

    ``ranks[p]`` is the global rank of pipeline rank ``p`` of this replica; ``incoming[peer]``
    the messages pipeline rank ``peer`` sends this rank in one step, in its order (see
    :func:`incoming`); ``groups[(a, b, what)]`` the process group of ``what`` (``"data"`` or
    ``"header"``) sent from pipeline rank ``a`` to ``b`` (see :func:`pair_groups`; the default
    group where missing); ``stages`` and ``per_dir`` number the messages' tags (:func:`message_tag`).
    """

    def __init__(self, ranks: List[int], me: int, device: torch.device, timeout: float,
                 incoming: Dict[int, List[Message]], stages: int, per_dir: int,
                 groups: Optional[Dict[Tuple[int, int, str], Any]] = None):
        self.ranks = ranks
        self.me = me
        self.device = device
        self.timeout = timeout
        self.incoming = incoming
        self.stages = stages
        self.per_dir = per_dir
        self.groups = groups or {}
        self.where = {msg: (peer, i) for peer, msgs in incoming.items() for i, msg in enumerate(msgs)}
        self.shapes: Dict[Tuple, Tuple[torch.Size, torch.dtype]] = {}
        self.headers = False
        self.posted: Dict[Message, Tuple[Any, torch.Tensor]] = {}
        self.header_works: Dict[Message, Tuple[Any, torch.Tensor]] = {}
        self.cursor: Dict[int, int] = {}
        self.sends: List[Tuple[Any, Any, str]] = []
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

    def _recv(self, msg: Message, peer: int, buf: torch.Tensor, header: bool) -> Any:
        kind, chunk = msg
        tag = 2 * message_tag(kind, chunk, True, self.stages, self.per_dir) + (1 if header else 0)
        group = self.groups.get((peer, self.me, "header" if header else "data"))
        return dist.irecv(buf, src=self.ranks[peer], tag=tag, group=group)

    def _post(self, msg: Message, peer: int) -> None:
        shape, dtype = self.shapes[self._key(*msg)]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        self.posted[msg] = (self._recv(msg, peer, buf, False), buf)

    def begin(self, headers: bool) -> None:
        """A new step, posting its receives (its headers only when ``headers``: every message of
        this step then carries its dtype and shape)."""
        self.headers = headers
        self.posted.clear()
        self.header_works.clear()
        self.sends.clear()
        self.bytes_sent = 0
        self.wait_seconds = 0.0
        for peer in sorted(self.incoming):
            self.cursor[peer] = 0
            for msg in self.incoming[peer]:
                if self.headers:
                    header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
                    self.header_works[msg] = (self._recv(msg, peer, header, True), header)
                else:
                    self._post(msg, peer)

    def take(self, kind: str, chunk) -> torch.Tensor:
        """The received tensor of ``kind`` (``"F"`` or ``"B"``) for the receiving ``chunk``."""
        msg = (kind, chunk)
        peer, index = self.where[msg]
        t0 = time.perf_counter()
        if self.headers:
            # The messages the peer sent before this one are posted first, in its order.
            while self.cursor[peer] <= index:
                earlier = self.incoming[peer][self.cursor[peer]]
                work, header = self.header_works.pop(earlier)
                wait_for(work, self._what(earlier[0], earlier[1], peer, False) + " (its shape)", self.timeout)
                code, ndim, *dims = header.tolist()
                self.shapes[self._key(*earlier)] = (torch.Size(dims[:ndim]), _DTYPES[code])
                self._post(earlier, peer)
                self.cursor[peer] += 1
        work, buf = self.posted.pop(msg)
        wait_for(work, self._what(kind, chunk, peer, False), self.timeout)
        self.wait_seconds += time.perf_counter() - t0
        return buf

    def send(self, kind: str, chunk, peer: int, tensor: torch.Tensor) -> None:
        """Sends ``tensor`` (``kind`` of the sending ``chunk``) without waiting (completed by :meth:`finish`)."""
        tensor = tensor.detach().contiguous()
        dst = self.ranks[peer]
        tag = message_tag(kind, chunk, False, self.stages, self.per_dir)
        what = self._what(kind, chunk, peer, True)
        if self.headers:
            if tensor.dim() > _HEADER - 2 or tensor.dtype not in _DTYPES:
                raise ValueError(
                    f"stage {chunk[1]} sends a {tensor.dim()}-dimensional {tensor.dtype} tensor; the pipeline "
                    f"carries tensors of at most {_HEADER - 2} dimensions of the dtypes {_DTYPES}"
                )
            dims = list(tensor.shape) + [0] * (_HEADER - 2 - tensor.dim())
            header = torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *dims], dtype=torch.int64, device=self.device)
            group = self.groups.get((self.me, peer, "header"))
            self.sends.append((dist.isend(header, dst=dst, tag=2 * tag + 1, group=group), header, what))
        group = self.groups.get((self.me, peer, "data"))
        self.sends.append((dist.isend(tensor, dst=dst, tag=2 * tag, group=group), tensor, what))
        self.bytes_sent += tensor.numel() * tensor.element_size()

    def finish(self) -> None:
        """Waits for every send of the step."""
        for work, _, what in self.sends:
            wait_for(work, what, self.timeout)
        self.sends.clear()
        if self.posted or self.header_works:  # pragma: no cover - the validator proves every receive is consumed
            left = len(self.posted) + len(self.header_works)
            raise RuntimeError(f"rank {self.ranks[self.me]}: {left} messages were never used")


def message_tag(kind: str, chunk, receiving: bool, stages: int, per_dir: int) -> int:
    """The tag of a message, the same on both sides: numbered by the boundary it crosses (the
    lower of its two stages), as the sending side names its own chunk and the receiving side
    the chunk that consumes the message."""
    d, s, m = chunk
    lower = s - 1 if (kind == "F") == receiving else s
    return tag_of(kind, (d, lower, m), stages, per_dir)


def tag_of(kind: str, chunk, stages: int, micro_batches: int) -> int:
    """A number for the message of ``kind`` about ``chunk``, unique within a step."""
    d, s, m = chunk
    return ((("F", "B").index(kind) * 2 + d) * stages + s) * micro_batches + m


def _messages(program: List[Dict[str, Any]], prefix: str) -> Iterable[Tuple[int, str, Tuple[int, int, int]]]:
    for op in program:
        if op["op"].startswith(prefix):
            yield op["peer"], op["op"][-1], (op.get("dir", 0), op["stage"], op["mb"])


def directed_pairs(programs: List[List[Dict[str, Any]]]) -> List[Tuple[int, int]]:
    """Every ``(a, b)`` such that pipeline rank ``a`` sends to pipeline rank ``b``, sorted."""
    return sorted({(a, peer) for a, program in enumerate(programs) for peer, _, _ in _messages(program, "SEND_")})


def incoming(programs: List[List[Dict[str, Any]]], me: int) -> Dict[int, List[Tuple[str, Tuple[int, int, int]]]]:
    """The messages each neighbour sends pipeline rank ``me`` in one step, in the neighbour's
    order, each named ``(kind, receiving chunk)``: the activation of ``(d, s, m)`` is received
    as ``(d, s + 1, m)``, the gradient of ``(d, s, m)`` as ``(d, s - 1, m)``.

    Raises ``RuntimeError`` unless they are exactly the messages ``me``'s program receives.
    """
    got: Dict[int, List[Tuple[str, Tuple[int, int, int]]]] = {}
    for peer, program in enumerate(programs):
        for to, kind, (d, s, m) in _messages(program, "SEND_"):
            if to == me:
                got.setdefault(peer, []).append((kind, (d, s + 1 if kind == "F" else s - 1, m)))
    sent = sorted((peer, msg) for peer, msgs in got.items() for msg in msgs)
    received = sorted((peer, (kind, chunk)) for peer, kind, chunk in _messages(programs[me], "RECV_"))
    if sent != received:  # pragma: no cover - the generator's validator proves they match
        raise RuntimeError(f"pipeline rank {me}'s receives do not match its neighbours' sends")
    return got


def pair_groups(programs: List[List[Dict[str, Any]]], global_rank: Any, replicas: int, replica: int,
                timeout: float) -> Dict[Tuple[int, int, str], Any]:
    """Two process groups (``"data"`` and ``"header"``) per ordered pair of pipeline neighbours,
    for this ``replica``, keyed ``(sender, receiver, what)``.

    Every process creates every replica's groups in the same order (``new_group`` is collective
    over the world); ``global_rank(p, d)`` is the global rank of pipeline rank ``p`` of replica
    ``d``.
    """
    groups: Dict[Tuple[int, int, str], Any] = {}
    for d in range(replicas):
        for a, b in directed_pairs(programs):
            for what in ("data", "header"):
                g = dist.new_group([global_rank(a, d), global_rank(b, d)], timeout=timedelta(seconds=timeout))
                if d == replica:
                    groups[(a, b, what)] = g
    return groups


def local_tensor(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A tensor passed between two stages on the same rank, cut from the producer's graph."""
    return None if t is None else t.detach()
