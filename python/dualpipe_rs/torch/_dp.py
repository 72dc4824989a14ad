"""Data-parallel gradient exchange among the replicas of one pipeline rank, in torch ops.

Per bucket (one stage copy's gradients, flattened), a reduce-scatter then an all-gather, point
to point as the Rust exchange does: the bucket is cut into ``D`` shards; replica ``j`` owns shard
``j``; each replica sends shard ``j`` of its (compressed) gradients to replica ``j``, which sums
the ``D`` contributions in replica order, divides by ``D``, and sends the (compressed) result
to every other replica; every replica, the owner included, decodes the result from the same
bytes, so all end bit-identical.

Compressed, error feedback runs on both sides (1-bit Adam's): a replica adds its residual to
its gradients before compressing and keeps what compression dropped; the owner adds its own
residual to the averaged shard before compressing the result. Steps below ``warmup`` go
uncompressed. Every message starts with a stamp (step, bucket, phase): a message of another step
or bucket is refused, never mixed in (tags keep early ones apart until they are wanted).
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._codec import decode, encode
from ._p2p import RankFailed, wait_for

_STAMP = 3  # int64: step, bucket, phase
_TAG_BASE = 1 << 24


class StaleMessage(RuntimeError):
    """A data-parallel message stamped with another step or bucket than the one awaited."""


def shard_range(n: int, parts: int, j: int) -> Tuple[int, int]:
    """Shard ``j`` of ``parts`` nearly equal ranges of ``0..n``."""
    base, extra = divmod(n, parts)
    start = j * base + min(j, extra)
    return start, start + base + (1 if j < extra else 0)


class GradExchange:
    """One replica's side of the exchange. ``ranks[j]``: global rank of replica ``j``."""

    def __init__(self, ranks: List[int], me: int, compression: Optional[str], warmup: int,
                 chunk: int = 2048, timeout: float = 60.0):
        self.ranks = ranks
        self.me = me
        self.compression = compression
        self.warmup = warmup
        self.chunk = chunk
        self.timeout = timeout
        self.worker_residual: Dict[int, torch.Tensor] = {}
        self.server_residual: Dict[int, torch.Tensor] = {}
        self.bytes_sent = 0
        self.seconds = 0.0

    def _stamp(self, step: int, bucket: int, phase: int, device) -> torch.Tensor:
        return torch.tensor([step, bucket, phase], dtype=torch.int64, device=device).view(torch.uint8)

    def _tag(self, bucket: int, phase: int, shard: int) -> int:
        return _TAG_BASE + (bucket * 2 + phase) * len(self.ranks) + shard

    def _check(self, msg: torch.Tensor, step: int, bucket: int, phase: int, src: int) -> torch.Tensor:
        got = msg[: 8 * _STAMP].view(torch.int64).tolist()
        if got != [step, bucket, phase]:
            raise StaleMessage(
                f"rank {self.ranks[self.me]}: a data-parallel message from rank {src} is stamped step {got[0]}, "
                f"bucket {got[1]}, phase {got[2]} where step {step}, bucket {bucket}, phase {phase} was awaited: refused"
            )
        return msg[8 * _STAMP :]

    def reduce_scatter(self, step: int, bucket: int, flat: torch.Tensor) -> torch.Tensor:
        """This replica's shard (:func:`shard_range`) of the mean over replicas of ``flat``: the
        exchange's first phase alone (ZeRO gathers parameters instead of the averaged gradients,
        so the owner's side keeps no error feedback)."""
        if len(self.ranks) == 1:
            return flat
        t0 = time.perf_counter()
        mean, send_works = self._scatter(step, bucket, flat, self.compression if step >= self.warmup else None)
        self._wait_sends(send_works)
        self.seconds += time.perf_counter() - t0
        return mean

    def _wait_sends(self, works: List[Tuple[dist.Work, int]]) -> None:
        for work, j in works:
            wait_for(work, f"rank {self.ranks[self.me]}: gradients to rank {self.ranks[j]}", self.timeout)

    def _scatter(self, step: int, bucket: int, flat: torch.Tensor, comp: Optional[str]):
        """Phase 0: each replica's (compressed) shard ``j`` to replica ``j``; returns the mean of
        this replica's shard (contributions summed in replica order) and the sends to wait for."""
        d = len(self.ranks)
        n, dtype, dev = flat.numel(), flat.dtype, flat.device
        if comp is not None:
            res = self.worker_residual.get(bucket)
            x = flat + res if res is not None else flat.clone()
        else:
            x = flat
        sends: List[Tuple[torch.Tensor, int]] = []
        ops: List[dist.P2POp] = []
        mine: Dict[int, torch.Tensor] = {}
        lo, hi = shard_range(n, d, self.me)
        recv_sizes = {}
        dropped = torch.empty_like(x) if comp is not None else None
        for j in range(d):
            a, b = shard_range(n, d, j)
            body = encode(x[a:b], comp, self.chunk)
            if comp is not None:
                dropped[a:b] = x[a:b] - decode(body, comp, b - a, dtype, self.chunk)
            if j == self.me:
                mine[j] = body
                recv_sizes = body.numel()
                continue
            msg = torch.cat([self._stamp(step, bucket, 0, dev), body])
            ops.append(dist.P2POp(dist.isend, msg, self.ranks[j], tag=self._tag(bucket, 0, j)))
            sends.append((msg, j))
            self.bytes_sent += msg.numel()
        if comp is not None:
            self.worker_residual[bucket] = dropped
        # my shard: the others' contributions have the size of mine
        bufs = {}
        for j in range(d):
            if j != self.me:
                bufs[j] = torch.empty(8 * _STAMP + recv_sizes, dtype=torch.uint8, device=dev)
                ops.append(dist.P2POp(dist.irecv, bufs[j], self.ranks[j], tag=self._tag(bucket, 0, self.me)))
        # one group of sends and receives: NCCL, which serialises a pair's traffic, cannot deadlock on it
        works = dist.batch_isend_irecv(ops)
        n_sends = len(sends)
        recvs = {j: (w, bufs[j]) for j, w in zip(sorted(bufs), works[n_sends:])}
        send_works = list(zip(works[:n_sends], [j for _, j in sends]))
        total = None
        for j in range(d):
            if j == self.me:
                body = mine[j]
            else:
                work, buf = recvs[j]
                wait_for(work, f"rank {self.ranks[self.me]}: gradients of bucket {bucket} from rank {self.ranks[j]}", self.timeout)
                body = self._check(buf, step, bucket, 0, self.ranks[j])
            part = decode(body, comp, hi - lo, dtype, self.chunk)
            total = part if total is None else total + part
        mean = total / d
        return mean, send_works

    def exchange(self, step: int, bucket: int, flat: torch.Tensor) -> torch.Tensor:
        """The mean over replicas of ``flat`` (this replica's gradients of ``bucket``)."""
        d = len(self.ranks)
        if d == 1:
            return flat
        t0 = time.perf_counter()
        comp = self.compression if step >= self.warmup else None
        n, dtype, dev = flat.numel(), flat.dtype, flat.device
        mean, send_works = self._scatter(step, bucket, flat, comp)
        lo, hi = shard_range(n, d, self.me)
        if comp is not None:
            res = self.server_residual.get(bucket)
            if res is not None:
                mean = mean + res
        result = encode(mean, comp, self.chunk)
        if comp is not None:
            self.server_residual[bucket] = mean - decode(result, comp, hi - lo, dtype, self.chunk)
        msg = torch.cat([self._stamp(step, bucket, 1, dev), result])
        ops = []
        others = [j for j in range(d) if j != self.me]
        for j in others:
            ops.append(dist.P2POp(dist.isend, msg, self.ranks[j], tag=self._tag(bucket, 1, self.me)))
            self.bytes_sent += msg.numel()
        bufs = {}
        for j in others:
            a, b = shard_range(n, d, j)
            size = encode(torch.zeros(b - a, dtype=dtype, device=dev), comp, self.chunk).numel()
            bufs[j] = torch.empty(8 * _STAMP + size, dtype=torch.uint8, device=dev)
            ops.append(dist.P2POp(dist.irecv, bufs[j], self.ranks[j], tag=self._tag(bucket, 1, j)))
        works = dist.batch_isend_irecv(ops)
        out = torch.empty_like(flat)
        out[lo:hi] = decode(result, comp, hi - lo, dtype, self.chunk)
        for j, work in zip(others, works[len(others):]):
            a, b = shard_range(n, d, j)
            wait_for(work, f"rank {self.ranks[self.me]}: averaged gradients of bucket {bucket} from rank {self.ranks[j]}", self.timeout)
            out[a:b] = decode(self._check(bufs[j], step, bucket, 1, self.ranks[j]), comp, b - a, dtype, self.chunk)
        self._wait_sends(send_works + list(zip(works[: len(others)], others)))
        self.seconds += time.perf_counter() - t0
        return out

    def state(self) -> Dict[str, torch.Tensor]:
        """The error-feedback residuals, for checkpoints."""
        out = {f"worker.{b}": t for b, t in self.worker_residual.items()}
        out.update({f"server.{b}": t for b, t in self.server_residual.items()})
        return out

    def load_state(self, state: Dict[str, torch.Tensor]) -> None:
        """Restores :meth:`state`."""
        self.worker_residual.clear()
        self.server_residual.clear()
        for k, t in state.items():
            side, b = k.split(".")
            (self.worker_residual if side == "worker" else self.server_residual)[int(b)] = t.clone()


def exchange_copies(flat: torch.Tensor, partner: int, me: int, tag: int, timeout: float) -> torch.Tensor:
    """Swaps ``flat`` with the partner rank holding DualPipe's other copies (uncompressed)."""
    other = torch.empty_like(flat)
    send, recv = dist.batch_isend_irecv([dist.P2POp(dist.isend, flat.contiguous(), partner, tag=tag),
                                         dist.P2POp(dist.irecv, other, partner, tag=tag)])
    wait_for(recv, f"rank {me}: the other copy's gradients from rank {partner}", timeout)
    wait_for(send, f"rank {me}: this copy's gradients to rank {partner}", timeout)
    return other


__all__ = ["GradExchange", "RankFailed", "StaleMessage", "exchange_copies", "shard_range"]
