"""ZeRO-1 and ZeRO-2 for ``DualPipeStrategy``: the optimizer state of a stage split among the
ranks that hold the stage, each updating its own piece, the updated pieces then gathered.

**Layout.** A stage's trainable parameters, flattened in ``parameters()`` order (``n`` values),
are held by ``C`` copies (``C = 2`` for DualPipe's two directions, else 1) in each of ``D``
data-parallel replicas: ``C x D`` holders. Holder ``(c, r)`` owns the region ``shard r`` (of
``D``, :func:`shard_range`) of ``half c`` (of ``C``) of the flat vector, so DualPipe's two copies
of a stage share one sharded state instead of keeping two whole ones. The optimizer runs over
*pieces*: each owned region cut at parameter boundaries, one 1-D tensor per (parameter, range),
so its state (AdamW's moments, 1-bit Adam's frozen variance) exists once per stage, keyed by the
parameter's name when saved. A *bucket* is one stage copy on this rank; its *holders* are every
rank holding a copy of that stage. Expert parallelism shards an expert's state the same way: an
expert's bucket with, as holders, the ranks of its data-parallel group.

**A step.** (1) DualPipe: each copy sends the other copy the half that copy owns and adds the
other's contribution to its own half, direction 0 first (``zero=0`` adds the same values in the
same order, whole). (2) The replicas reduce-scatter that half (``GradExchange.reduce_scatter``,
compressed with error feedback as ``zero=0``); each keeps the mean of its own region. ``zero=1``
writes it into the parameters' ``.grad`` (full-size buffers, the rest holding this replica's own
gradients); ``zero=2`` frees ``.grad`` and keeps shard-sized gradients only. (3) The optimizer
steps the pieces. (4) Every holder sends its updated region to the stage's other holders: the
values, or, compressed, the change since the last gathered values encoded with the exchange's
codec; every holder (the owner too) adds the decoded change, so all hold the same weights. The
piece is then the full-precision trajectory (its own tensor) and its distance to the gathered
weights the error feedback of this phase. Uncompressed, a piece is a view of the parameter.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ._codec import decode, encode
from ._dp import GradExchange, shard_range
from ._p2p import wait_for

LEVELS = (0, 1, 2)
_HALF_TAG = (1 << 26) + (1 << 22)
_GATHER_TAG = 1 << 27
_SAVE_TAG = (1 << 27) + (1 << 25)


def check_zero(zero: Any) -> int:
    """``zero`` if it is a level we know, else one error naming them."""
    if isinstance(zero, bool) or not isinstance(zero, int) or zero not in LEVELS:
        raise ValueError(
            f"zero must be 0 (every replica keeps the whole optimizer state), 1 (optimizer state sharded "
            f"over the replicas and DualPipe's copies) or 2 (gradients too), got {zero!r}"
        )
    return zero


class Piece:
    """One optimizer tensor: ``param.view(-1)[a:b]``, at offset ``at`` of the owned region."""

    def __init__(self, param: nn.Parameter, a: int, b: int, at: int, own: bool):
        self.param, self.a, self.b, self.at = param, a, b, at
        flat = param.detach().view(-1)[a:b]
        self.tensor = (flat.clone() if own else flat).requires_grad_(True)


class Bucket:
    """One stage copy on this rank and where its stage's pieces live."""

    def __init__(self, key: Tuple[int, int], index: int, module: nn.Module, holders: List[Tuple[int, int, int]],
                 mine: int, copies: int, replicas: int, own: bool):
        self.key = key
        self.index = index  # the exchange's bucket number (this rank's stage copies in key order), as zero=0's
        self.stage = key[1]
        self.params = [p for p in module.parameters() if p.requires_grad]
        for p in self.params:
            if not p.is_contiguous():
                p.data = p.data.contiguous()
        self.n = sum(p.numel() for p in self.params)
        self.width = copies * replicas
        # holders[i] = (global rank, copy c, replica r); piece index c * D + r
        self.holders = holders
        self.mine = mine
        self.regions = []
        for c in range(copies):
            hlo, hhi = shard_range(self.n, copies, c)
            for r in range(replicas):
                lo, hi = shard_range(hhi - hlo, replicas, r)
                self.regions.append((hlo + lo, hlo + hi))
        self.half = shard_range(self.n, copies, key[0])
        self.lo, self.hi = self.regions[mine]
        self.pieces: List[Piece] = []
        at = 0
        for p in self.params:
            a, b = max(self.lo - at, 0), min(self.hi - at, p.numel())
            if a < b:
                self.pieces.append(Piece(p, a, b, at + a - self.lo, own))
            at += p.numel()

    def flat_grads(self) -> torch.Tensor:
        """This copy's gradients, flattened (zeros where a parameter got none)."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])

    def read(self, lo: int, hi: int) -> torch.Tensor:
        """The weights ``[lo, hi)`` of the flat vector."""
        out, at = [], 0
        for p in self.params:
            a, b = max(lo - at, 0), min(hi - at, p.numel())
            if a < b:
                out.append(p.detach().view(-1)[a:b])
            at += p.numel()
        return torch.cat(out) if out else torch.empty(0, dtype=self.params[0].dtype, device=self.params[0].device)

    @torch.no_grad()
    def write(self, lo: int, values: torch.Tensor, add: bool = False) -> None:
        """Sets (or adds to) the weights from ``lo`` on."""
        hi, at = lo + values.numel(), 0
        for p in self.params:
            a, b = max(lo - at, 0), min(hi - at, p.numel())
            if a < b:
                dst = p.view(-1)[a:b]
                src = values[at + a - lo : at + b - lo]
                dst.add_(src) if add else dst.copy_(src)
            at += p.numel()


class Shards:
    """This rank's side of ZeRO: its buckets, their pieces, the copy sum, the gather."""

    def __init__(self, stages: Dict[Tuple[int, int], nn.Module], placement: List[List[int]], world: Any,
                 zero: int, compression: Optional[str], timeout: float):
        self.zero, self.compression, self.timeout, self.world = zero, compression, timeout, world
        copies, D = len(placement), world.replicas
        self.copies = copies
        self.buckets: List[Bucket] = []
        for key in sorted(stages, key=lambda k: (k[1], k[0])):  # by stage: both sides of a pair agree on the order
            d, s = key
            holders = [(world.global_rank(placement[c][s], r), c, r) for c in range(copies) for r in range(D)]
            self.buckets.append(Bucket(key, sorted(stages).index(key), stages[key], holders, d * D + world.replica,
                                       copies, D, own=compression is not None))
        self.bytes_sent = 0
        self.copy_bytes = 0
        self.seconds = 0.0

    def params(self) -> List[torch.Tensor]:
        """The tensors the optimizer updates (this rank's pieces)."""
        return [pc.tensor for b in self.buckets for pc in b.pieces]

    # -- gradients ---------------------------------------------------------------------------

    def _halves(self) -> List[torch.Tensor]:
        """Each bucket's own half of its gradients, summed with the stage's other copy."""
        flats = [b.flat_grads() for b in self.buckets]
        if self.copies == 1:
            return flats
        ops, recvs, out = [], {}, [None] * len(self.buckets)
        me = self.world.rank
        local = {b.key: f for b, f in zip(self.buckets, flats)}
        for i, (b, f) in enumerate(zip(self.buckets, flats)):
            d, s = b.key
            other = b.holders[(1 - d) * self.world.replicas + self.world.replica][0]
            if other == me:
                continue
            olo, ohi = shard_range(b.n, 2, 1 - d)
            ops.append(dist.P2POp(dist.isend, f[olo:ohi].contiguous(), other, tag=_HALF_TAG + s))
            self.copy_bytes += (ohi - olo) * f.element_size()
            lo, hi = b.half
            recvs[i] = torch.empty(hi - lo, dtype=f.dtype, device=f.device)
            ops.append(dist.P2POp(dist.irecv, recvs[i], other, tag=_HALF_TAG + s))
        works = dist.batch_isend_irecv(ops) if ops else []
        for w in works:
            wait_for(w, f"rank {me}: the other copy's gradients", self.timeout)
        for i, (b, f) in enumerate(zip(self.buckets, flats)):
            lo, hi = b.half
            theirs = recvs[i] if i in recvs else local[(1 - b.key[0], b.stage)][lo:hi]
            mine = f[lo:hi]
            out[i] = mine + theirs if b.key[0] == 0 else theirs + mine  # direction 0 first, as zero=0
        return out

    def reduce(self, step: int, exchange: GradExchange) -> int:
        """The copies summed, the replicas' mean of each owned region as its pieces' gradients;
        returns the bytes sent to the other copies."""
        t0 = time.perf_counter()
        self.copy_bytes = 0
        halves = self._halves()
        for b, half in zip(self.buckets, halves):
            mean = exchange.reduce_scatter(step, b.index, half)
            for pc in b.pieces:
                g = mean[pc.at : pc.at + pc.b - pc.a]
                if self.zero == 1:
                    if pc.param.grad is None:
                        pc.param.grad = torch.zeros_like(pc.param)
                    region = pc.param.grad.view(-1)[pc.a : pc.b]
                    region.copy_(g)
                    pc.tensor.grad = region
                else:
                    pc.tensor.grad = g.clone()
            if self.zero == 2:
                for p in b.params:
                    p.grad = None
        self.seconds += time.perf_counter() - t0
        return self.copy_bytes

    # -- parameters ----------------------------------------------------------------------------

    def _message(self, b: Bucket, comp: Optional[str], exchange: GradExchange) -> torch.Tensor:
        values = torch.cat([pc.tensor.detach() for pc in b.pieces]) if b.pieces else b.read(b.lo, b.hi)
        if comp is not None:
            values = values - b.read(b.lo, b.hi)
        return encode(values, comp, exchange.chunk)

    @torch.no_grad()
    def gather(self, step: int, exchange: GradExchange) -> None:
        """Every holder's updated region to the stage's other holders (compressed: the change)."""
        t0 = time.perf_counter()
        comp = self.compression if step >= exchange.warmup else None
        me, dev = self.world.rank, self.buckets[0].params[0].device if self.buckets else None
        ops, recvs, mine = [], [], []
        for b in self.buckets:
            body = self._message(b, comp, exchange)
            mine.append(body)
            msg = torch.cat([exchange._stamp(step, b.stage, 2, dev), body])
            base = _GATHER_TAG + b.stage * b.width
            for rank, _, _ in b.holders:
                if rank != me:
                    ops.append(dist.P2POp(dist.isend, msg, rank, tag=base + b.mine))
                    self.bytes_sent += msg.numel()
        for b in self.buckets:
            base = _GATHER_TAG + b.stage * b.width
            for j, (rank, _, _) in enumerate(b.holders):
                if rank == me:
                    continue
                lo, hi = b.regions[j]
                size = encode(torch.zeros(hi - lo, dtype=b.params[0].dtype, device=dev), comp, exchange.chunk).numel()
                buf = torch.empty(24 + size, dtype=torch.uint8, device=dev)
                ops.append(dist.P2POp(dist.irecv, buf, rank, tag=base + j))
                recvs.append((b, j, rank, buf))
        works = dist.batch_isend_irecv(ops) if ops else []
        sends = len(ops) - len(recvs)
        for b in self.buckets:  # this rank's own regions, into every bucket of their stage here
            for o, body in zip(self.buckets, mine):
                if o.stage == b.stage:
                    self._apply(b, *o.regions[o.mine], body, comp, exchange)
        for (b, j, rank, buf), w in zip(recvs, works[sends:]):
            wait_for(w, f"rank {me}: stage {b.stage}'s updated weights from rank {rank}", self.timeout)
            lo, hi = b.regions[j]
            self._apply(b, lo, hi, exchange._check(buf, step, b.stage, 2, rank), comp, exchange)
        for w in works[:sends]:
            wait_for(w, f"rank {me}: updated weights to the other holders", self.timeout)
        self.seconds += time.perf_counter() - t0

    def _apply(self, b: Bucket, lo: int, hi: int, body: torch.Tensor, comp: Optional[str], exchange: GradExchange) -> None:
        values = decode(body, comp, hi - lo, b.params[0].dtype, exchange.chunk)
        b.write(lo, values, add=comp is not None)

    # -- checkpoints ---------------------------------------------------------------------------

    def feedback(self) -> Dict[Tuple[int, int], torch.Tensor]:
        """The gather's error feedback (compressed runs), by bucket key: each owned region's
        pieces minus its weights."""
        if self.compression is None:
            return {}
        return {b.key: torch.cat([pc.tensor.detach() for pc in b.pieces]) - b.read(b.lo, b.hi)
                for b in self.buckets if b.pieces}

    @torch.no_grad()
    def reset_pieces(self, feedback: Dict[Tuple[int, int], torch.Tensor]) -> None:
        """Own pieces (compressed runs) set to the weights plus the saved feedback, if any."""
        if self.compression is None:
            return
        for b in self.buckets:
            res = feedback.get(b.key)
            for pc in b.pieces:
                pc.tensor.copy_(pc.param.detach().view(-1)[pc.a : pc.b])
                if res is not None:
                    pc.tensor.add_(res[pc.at : pc.at + pc.b - pc.a].to(pc.tensor.device))

    def load_states(self, optimizer: torch.optim.Optimizer,
                    states: List[Tuple[Any, Optional[Dict[str, torch.Tensor]]]]) -> None:
        """The optimizer state of whole parameters (a checkpoint's), cut into this rank's pieces."""
        by_param = {id(p): st for p, st in states}
        for b in self.buckets:
            for pc in b.pieces:
                st = by_param.get(id(pc.param))
                if not st:
                    optimizer.state.pop(pc.tensor, None)
                    continue
                n = pc.param.numel()
                optimizer.state[pc.tensor] = {
                    k: v.reshape(-1)[pc.a : pc.b].clone() if v.dim() and v.numel() == n else v.clone()
                    for k, v in st.items()
                }

    def full_states(self, optimizer: torch.optim.Optimizer, steps: int) -> Dict[int, Dict[str, torch.Tensor]]:
        """For checkpoints (every rank calls it): on the writer of each stage (replica 0's
        direction-0 copy), ``id(param) -> {state name: whole tensor}``; elsewhere ``{}``. Each
        holder sends its pieces' state to that writer."""
        if steps == 0:
            return {}
        me = self.world.rank
        ops, pending = [], []
        names, scalars = self._state_names(optimizer)
        for b in self.buckets:
            writer = b.holders[0][0]
            if b.mine == 0:
                for j, (rank, _, _) in enumerate(b.holders):
                    lo, hi = b.regions[j]
                    local = self._local(b.stage, j)
                    if local is not None:
                        pending.append((b, j, [self._flat_state(optimizer, local, name) for name, _ in names]))
                    elif hi > lo:
                        bufs = [torch.empty(hi - lo, dtype=dt, device=b.params[0].device) for _, dt in names]
                        tag = _SAVE_TAG + (b.stage * b.width + j) * len(names)
                        ops += [dist.P2POp(dist.irecv, buf, rank, tag=tag + k) for k, buf in enumerate(bufs)]
                        pending.append((b, j, bufs))
            elif b.hi > b.lo and writer != me:
                tag = _SAVE_TAG + (b.stage * b.width + b.mine) * len(names)
                for k, (name, _) in enumerate(names):
                    ops.append(dist.P2POp(dist.isend, self._flat_state(optimizer, b, name), writer, tag=tag + k))
        works = dist.batch_isend_irecv(ops) if ops else []
        for w in works:
            wait_for(w, f"rank {me}: the optimizer state's pieces for the checkpoint", self.timeout)
        out: Dict[int, Dict[str, torch.Tensor]] = {}
        for b in self.buckets:
            if b.mine != 0:
                continue
            whole = {name: torch.empty(b.n, dtype=dt, device=b.params[0].device) for name, dt in names}
            for name, _ in names:
                if b.hi > b.lo:
                    whole[name][b.lo : b.hi] = self._flat_state(optimizer, b, name)
            for bb, j, bufs in pending:
                if bb is b:
                    lo, hi = b.regions[j]
                    for (name, _), buf in zip(names, bufs):
                        whole[name][lo:hi] = buf
            at = 0
            for p in b.params:
                st = {name: whole[name][at : at + p.numel()].view_as(p).clone() for name, _ in names}
                st.update({k: v.clone() for k, v in scalars.items()})
                out[id(p)] = st
                at += p.numel()
        return out

    def _local(self, stage: int, j: int) -> Optional[Bucket]:
        """This rank's bucket holding piece ``j`` of ``stage``, if any."""
        return next((b for b in self.buckets if b.stage == stage and b.mine == j), None)

    @staticmethod
    def _flat_state(optimizer: torch.optim.Optimizer, b: Bucket, name: str) -> torch.Tensor:
        return torch.cat([optimizer.state[pc.tensor][name].reshape(-1) for pc in b.pieces])

    def _state_names(self, optimizer: torch.optim.Optimizer
                     ) -> Tuple[List[Tuple[str, torch.dtype]], Dict[str, torch.Tensor]]:
        """The per-value state tensors' names and dtypes, and the scalar ones (``step``), from this
        rank's first piece (every piece of one optimizer has the same)."""
        for b in self.buckets:
            for pc in b.pieces:
                st = optimizer.state.get(pc.tensor)
                if st:
                    n = pc.b - pc.a
                    per_value = {k for k, v in st.items() if isinstance(v, torch.Tensor) and v.dim() and v.numel() == n}
                    names = sorted((k, st[k].dtype) for k in per_value)
                    scalars = {k: (v if isinstance(v, torch.Tensor) else torch.tensor(v)) for k, v in st.items()
                               if k not in per_value}
                    return names, scalars
        return [], {}


def memory(s: Any) -> Dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state (pieces held apart from the
    weights, compressed ZeRO's, counted as optimizer state), measured on the tensors."""
    def nbytes(t: Optional[torch.Tensor]) -> int:
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    params = [p for m in s.stages.values() for p in m.parameters()]
    grads = sum(nbytes(p.grad) for p in params)
    state = sum(nbytes(v) for st in s.optimizer.state.values() for v in st.values())
    shards: Optional[Shards] = getattr(s, "shards", None)
    if shards is not None:
        pieces = [pc for b in shards.buckets for pc in b.pieces]
        # a piece's own gradient (ZeRO-2's; ZeRO-1's once 1-bit Adam folded it), not a view of .grad
        grads += sum(nbytes(pc.tensor.grad) for pc in pieces if pc.tensor.grad is not None and pc.tensor.grad._base is None)
        if shards.compression is not None:
            state += sum(nbytes(pc.tensor) for pc in pieces)
    return {"parameter_bytes": sum(nbytes(p) for p in params), "gradient_bytes": grads, "optimizer_state_bytes": state}
