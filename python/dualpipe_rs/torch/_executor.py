"""Runs one rank's lowered program for one training step over torch autograd.

``F`` runs a stage's forward (and the loss on a last stage); ``B`` its full backward; ``I`` the
input gradient only (torch's split backward keeps what the weight gradient needs) and ``W`` the
deferred weight gradient; ``FB`` a forward and a full backward of two chunks, through the stage's
``overlapped_forward_backward`` hook when its layer defines one (DeepSeek's name, or its spelling
``overlaped_forward_backward``), otherwise the forward, its activations sent at once, then the
backward, so the message travels while the backward computes; with ``overlap`` (models with
expert parallelism) the backward runs on a second thread during the forward, so each chunk's
expert all-to-all waits while the other chunk computes. Sends never wait; receives are
posted at the step's start, in each sender's order (see ``_p2p``). A first stage has no input gradient to produce: its ``I`` does
nothing and its ``W`` runs the whole backward.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from ._p2p import P2P, local_tensor

Chunk = Tuple[int, int, int]


def _chunk(d: Dict[str, Any]) -> Chunk:
    return (d.get("dir", 0), d["stage"], d["mb"])


def _hook(module: Any) -> Optional[Tuple[type, Callable]]:
    """The stage's overlapped forward-backward hook: its single layer's class and the hook."""
    layers = getattr(module, "layers", None)
    if layers is None or len(layers) != 1:
        return None
    cls = type(layers[0])
    hook = getattr(cls, "overlapped_forward_backward", None) or getattr(cls, "overlaped_forward_backward", None)
    return (cls, hook) if hook is not None else None


class StepResult:
    """What one rank's program produced: its micro-batches' losses and its measured timeline."""

    def __init__(self) -> None:
        self.losses: Dict[int, float] = {}
        self.ops: List[Tuple[str, float, float]] = []  # (op, start, end) seconds from the step start
        self.compute_seconds = 0.0
        self.wait_seconds = 0.0
        self.bytes_sent = 0
        self.peak_memory_bytes = 0
        self.fb_seconds: List[float] = []
        self.peak_activations = 0
        self.peak_activation_bytes = 0


class Executor:
    """Interprets this rank's lowered program.

    ``stages[(dir, stage)]`` are this rank's stage modules; ``placement[dir][stage]`` the
    pipeline rank of every stage; ``micro_batches`` the step's total; ``loss_fn(out, labels)``
    must give a scalar; ``scale`` multiplies each micro-batch's loss before its backward.
    """

    def __init__(self, program: List[Dict[str, Any]], stages: Dict[Tuple[int, int], Any], placement: List[List[int]],
                 micro_batches: int, rank: int, p2p: P2P, loss_fn: Callable, use_hooks: bool = True,
                 eager_sends: bool = True, overlap: bool = False):
        self.program = program
        self.stages = stages
        self.placement = placement
        self.dirs = len(placement)
        self.num_stages = len(placement[0])
        self.micro_batches = micro_batches
        self.per_dir = micro_batches // self.dirs
        self.rank = rank
        self.p2p = p2p
        self.loss_fn = loss_fn
        self.use_hooks = use_hooks
        self.eager_sends = eager_sends
        self.overlap = overlap
        self.params = {k: [p for p in m.parameters() if p.requires_grad] for k, m in stages.items()}
        self.saved_bytes: Dict[Tuple, int] = {}  # bytes autograd saves per forward, by stage and input shape

    def global_mb(self, c: Chunk) -> int:
        """The step's micro-batch index of a chunk: direction 1 takes the second half."""
        return c[0] * self.per_dir + c[2]

    def _local(self, c: Chunk, delta: int) -> bool:
        s = c[1] + delta
        return 0 <= s < self.num_stages and self.placement[c[0]][s] == self.rank

    def run(self, inputs: List[Any], labels: List[Any], headers: bool) -> StepResult:
        """Runs the program on the step's micro-batches (``inputs[g]``, ``labels[g]``)."""
        self.inputs, self.labels = inputs, labels
        self.inp: Dict[Chunk, Any] = {}
        self.out: Dict[Chunk, Any] = {}
        self.loss: Dict[Chunk, torch.Tensor] = {}
        self.in_grad: Dict[Chunk, Any] = {}
        self.local_act: Dict[Chunk, Any] = {}
        self.local_grad: Dict[Chunk, Any] = {}
        self.deferred: Dict[Chunk, Any] = {}
        self.sent: set = set()
        self.live: Dict[Chunk, int] = {}
        self.send_to: Dict[Tuple[str, Chunk], int] = {}
        res = StepResult()
        self.res = res
        for op in self.program:
            if op["op"] in ("SEND_F", "SEND_B"):
                self.send_to[(op["op"][-1], _chunk(op))] = op["peer"]
        self.p2p.begin(headers)
        t_start = time.perf_counter()
        for op in self.program:
            name = op["op"]
            if name in ("RECV_F", "RECV_B"):
                continue  # posted by begin()
            if name in ("SEND_F", "SEND_B"):
                self._send(name[-1], _chunk(op))
                continue
            if name == "WAIT":
                continue
            w0 = self.p2p.wait_seconds
            t0 = time.perf_counter()
            if name == "F":
                self._forward(_chunk(op))
            elif name == "B":
                self._backward(_chunk(op))
            elif name == "I":
                self._backward_input(_chunk(op))
            elif name == "W":
                self._backward_weight(_chunk(op))
            elif name == "FB":
                self._forward_backward(_chunk(op["f"]), _chunk(op["b"]))
            else:  # pragma: no cover - the generator emits no other op
                raise RuntimeError(f"unknown op {name}")
            t1 = time.perf_counter()
            if name == "FB":
                res.fb_seconds.append(t1 - t0 - (self.p2p.wait_seconds - w0))
            res.ops.append((name, t0 - t_start, t1 - t_start))
            res.compute_seconds += (t1 - t0) - (self.p2p.wait_seconds - w0)
        self.p2p.finish()
        res.wait_seconds = self.p2p.wait_seconds
        res.bytes_sent = self.p2p.bytes_sent
        return res

    # -- inputs of ops -------------------------------------------------------------------------

    def _input(self, c: Chunk) -> Any:
        d, s, m = c
        if s == 0:
            return self.inputs[self.global_mb(c)]
        if self._local(c, -1):
            x = self.local_act.pop(c)
        else:
            x = self.p2p.take("F", c)
        if x.is_floating_point():
            x = x.detach().requires_grad_(True)
        return x

    def _output_grad(self, c: Chunk) -> Optional[torch.Tensor]:
        if c[1] == self.num_stages - 1:
            return None
        if self._local(c, 1):
            return self.local_grad.pop(c)
        return self.p2p.take("B", c)

    def _send(self, kind: str, c: Chunk) -> None:
        if (kind, c) in self.sent or (kind, c) not in self.send_to:
            return
        self.sent.add((kind, c))
        t = self.out[c] if kind == "F" else self.in_grad.pop(c)
        self.p2p.send(kind, c, self.send_to[(kind, c)], t)

    # -- compute -------------------------------------------------------------------------------

    def _loss(self, c: Chunk, out: Any) -> torch.Tensor:
        g = self.global_mb(c)
        loss = self.loss_fn(out, self.labels[g])
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(
                f"loss_fn returned {shape}, not a scalar tensor: reduce it (e.g. reduction='mean') so each "
                "micro-batch has one loss"
            )
        self.res.losses[g] = float(loss.detach())
        return loss / self.micro_batches

    def _after_forward(self, c: Chunk, x: Any, out: Any) -> None:
        self.inp[c] = x
        if c[1] == self.num_stages - 1:
            self.loss[c] = self._loss(c, out)
            self.out[c] = None
            return
        self.out[c] = out
        nxt = (c[0], c[1] + 1, c[2])
        if self._local(c, 1):
            self.local_act[nxt] = local_tensor(out)
        elif self.eager_sends:
            self._send("F", c)  # at once: in an FB pair the message travels during the backward

    def _forward(self, c: Chunk) -> None:
        x = self._input(c)
        key = (c[0], c[1], tuple(x.shape))
        if key in self.saved_bytes:  # counted once per stage and shape: the hook costs time
            out = self.stages[(c[0], c[1])](x)
        else:
            seen: Dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                seen[t.data_ptr()] = t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = self.stages[(c[0], c[1])](x)
            self.saved_bytes[key] = sum(seen.values())
        self._alive(c, self.saved_bytes[key])
        self._after_forward(c, x, out)

    def _alive(self, c: Chunk, nbytes: int) -> None:
        self.live[c] = nbytes
        res = self.res
        res.peak_activations = max(res.peak_activations, len(self.live))
        res.peak_activation_bytes = max(res.peak_activation_bytes, sum(self.live.values()))

    def _roots(self, c: Chunk) -> Tuple[List[torch.Tensor], Optional[List[torch.Tensor]]]:
        if c[1] == self.num_stages - 1:
            return [self.loss.pop(c)], None
        return [self.out.pop(c)], [self._output_grad(c)]

    def _pass_input_grad(self, c: Chunk, x: Any) -> None:
        if c[1] == 0:
            return
        g = x.grad if isinstance(x, torch.Tensor) else None
        prev = (c[0], c[1] - 1, c[2])
        if self._local(c, -1):
            self.local_grad[prev] = g
        else:
            self.in_grad[c] = g
            if self.eager_sends:
                self._send("B", c)

    def _backward(self, c: Chunk) -> None:
        roots, grads = self._roots(c)
        torch.autograd.backward(roots, grads)
        self.live.pop(c, None)
        self._pass_input_grad(c, self.inp.pop(c))

    def _backward_input(self, c: Chunk) -> None:
        roots, grads = self._roots(c)
        x = self.inp.pop(c)
        if c[1] == 0 or not (isinstance(x, torch.Tensor) and x.requires_grad):
            self.deferred[c] = ("whole", roots, grads)
        else:
            _, groups = stage_backward_input(roots, grads, [x], iter(self.params[(c[0], c[1])]))
            self.deferred[c] = ("split", groups)
        self._pass_input_grad(c, x)

    def _backward_weight(self, c: Chunk) -> None:
        entry = self.deferred.pop(c)
        if entry[0] == "whole":
            torch.autograd.backward(entry[1], entry[2])
        else:
            stage_backward_weight(iter(self.params[(c[0], c[1])]), entry[1])
        self.live.pop(c, None)

    def _forward_backward(self, f: Chunk, b: Chunk) -> None:
        module_f, module_b = self.stages[(f[0], f[1])], self.stages[(b[0], b[1])]
        hook = _hook(module_f) if self.use_hooks else None
        if hook is not None and _hook(module_b) is not None and _hook(module_b)[0] is hook[0]:
            self._hooked_pair(hook[1], module_f, f, module_b, b)
            return
        if self.overlap:
            self._overlapped_pair(f, b)
            return
        self._forward(f)
        self._backward(b)

    def _overlapped_pair(self, f: Chunk, b: Chunk) -> None:
        """The backward of ``b`` on a second thread while this one runs the forward of ``f``:
        each chunk's collectives (an expert all-to-all, on process groups of their own for
        forwards and for backwards) wait while the other chunk computes."""
        roots, grads = self._roots(b)
        failed: List[BaseException] = []

        def backward() -> None:
            try:
                torch.autograd.backward(roots, grads)
            except BaseException as e:  # noqa: BLE001 - raised again on this thread
                failed.append(e)

        t = threading.Thread(target=backward, name="dualpipe-fb-backward")
        t.start()
        try:
            self._forward(f)
        finally:
            t.join()
        if failed:
            raise failed[0]
        self.live.pop(b, None)
        self._pass_input_grad(b, self.inp.pop(b))

    def _hooked_pair(self, hook: Callable, module_f: Any, f: Chunk, module_b: Any, b: Chunk) -> None:
        """The user's overlapped pair: ``hook(module0, inputs0, criterion0, labels0, module1,
        loss1, outputs1, output_grads1) -> (outputs0, loss0)`` on the stages' single layers."""
        x = self._input(f)
        last_f = f[1] == self.num_stages - 1
        g = self.global_mb(f)
        def scaled_loss(out: Any, *labels: Any) -> torch.Tensor:  # the hook's criterion(*outputs, *labels)
            return self._loss(f, out)

        criterion = scaled_loss if last_f else None
        roots, grads = self._roots(b)
        xb = self.inp.pop(b)
        last_b = b[1] == self.num_stages - 1
        outs0, loss0 = hook(
            module_f.layers[0], [x], criterion, [self.labels[g]] if last_f else [],
            module_b.layers[0], roots[0] if last_b else None, [] if last_b else roots, [] if last_b else grads,
        )
        out = outs0[0] if isinstance(outs0, (list, tuple)) else outs0
        self.live.pop(b, None)
        self._alive(f, 0)
        self.inp[f] = x
        if last_f:
            self.loss[f] = loss0
            self.out[f] = None
        else:
            self._after_forward(f, x, out)
        self._pass_input_grad(b, xb)
