"""The pipeline's messages under NCCL's matching rules, checked on a model of them (no GPU here).

NCCL matches a pair's point-to-point messages by order, not by tag, and runs a communicator's
operations one after another on its stream: a send completes only together with its receive,
and an operation waits for every earlier one on its side of the communicator. Gloo, which the
tests run on, matches by tag, so it cannot show an ordering fault. This model replays every
rank's lowered program the way ``_executor`` issues it (receives posted at the step's start,
sends at their op, a compute op blocked until the messages it consumes have arrived) and
reports a deadlock, or a message delivered into another message's receive.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Tuple

import pytest

from dualpipe_rs import _native

if not os.environ.get("DUALPIPE_REQUIRE_TORCH"):  # CI: torch is installed, so these tests must run
    pytest.importorskip(
        "torch", reason="torch is not installed (pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    )

from dualpipe_rs.torch._p2p import directed_pairs, incoming  # noqa: E402

KINDS = ["gpipe", "1f1b", "interleaved", "zb1p", "dualpipe", "dualpipev"]


def _chunk(op) -> Tuple[int, int, int]:
    return (op.get("dir", 0), op["stage"], op["mb"])


def replay(programs: List[List[dict]], comm: Callable[[int, int], object], post: str) -> str:
    """``"ok"``, ``"deadlock"`` or ``"mismatch"``. ``comm(a, b)`` names the communicator of a
    message from ``a`` to ``b``; ``post`` is ``"sender-order"`` (every receive at the step's
    start, in the sender's order: ours), ``"own-order"`` (at the start, in the receiver's order
    of its RECV ops) or ``"at-op"`` (at each RECV op)."""
    P = len(programs)
    queues: Dict[Tuple[object, int], List[Tuple[str, tuple]]] = {}
    arrived = set()

    def issue(key, rank, what, msg):
        queues.setdefault((key, rank), []).append((what, msg))

    recv_of = []  # per rank: (kind, receiving chunk) -> sender
    for me, program in enumerate(programs):
        recv_of.append({(op["op"][-1], _chunk(op)): op["peer"] for op in program if op["op"].startswith("RECV_")})
        if post == "sender-order":
            for peer, msgs in sorted(incoming(programs, me).items()):
                for kind, c in msgs:
                    issue(comm(peer, me), me, "recv", (peer, kind, c))
        elif post == "own-order":
            for op in program:
                if op["op"].startswith("RECV_"):
                    issue(comm(op["peer"], me), me, "recv", (op["peer"], op["op"][-1], _chunk(op)))
    pc = [0] * P
    progress = True
    while progress:
        progress = False
        for me, program in enumerate(programs):
            while pc[me] < len(program):
                op = program[pc[me]]
                name = op["op"]
                if name.startswith("RECV_"):
                    if post == "at-op":
                        issue(comm(op["peer"], me), me, "recv", (op["peer"], name[-1], _chunk(op)))
                elif name.startswith("SEND_"):
                    kind, (d, s, m) = name[-1], _chunk(op)
                    issue(comm(me, op["peer"]), me, "send", (me, kind, (d, s + 1 if kind == "F" else s - 1, m)))
                elif name in ("F", "B", "I", "FB"):
                    wants = [("F", _chunk(op["f"])), ("B", _chunk(op["b"]))] if name == "FB" else \
                        [("F" if name == "F" else "B", _chunk(op))]
                    needed = [(recv_of[me][w], *w) for w in wants if w in recv_of[me]]
                    if not all((me, n) in arrived for n in needed):
                        break
                pc[me] += 1
                progress = True
        # Each communicator: the two sides' first operations complete together when they match.
        for (key, rank) in list(queues):
            for other in range(P):
                a, b = queues.get((key, rank), []), queues.get((key, other), [])
                while other != rank and a and b and {a[0][0], b[0][0]} == {"send", "recv"}:
                    if a[0][1] != b[0][1]:
                        return "mismatch"
                    receiver = rank if a[0][0] == "recv" else other
                    arrived.add((receiver, a[0][1]))
                    a.pop(0)
                    b.pop(0)
                    progress = True
    return "ok" if all(pc[r] == len(programs[r]) for r in range(P)) else "deadlock"


def ours(a: int, b: int):
    """One communicator per ordered pair (``_p2p.pair_groups``)."""
    return (a, b)


def shared(a: int, b: int):
    """One communicator per pair of ranks, both directions: torch's default for P2P on NCCL."""
    return frozenset((a, b))


def cases():
    for kind in KINDS:
        for ranks in (2, 3, 4, 6, 8):
            for mb in (2, 4, 6, 8, 12, 16, 24):
                try:
                    plan = _native.schedule(kind, ranks, mb)
                except ValueError:
                    continue
                yield kind, ranks, mb, plan.programs


@pytest.mark.parametrize("kind", KINDS)
def test_every_schedule_runs_under_nccl_matching(kind):
    runs = 0
    for k, ranks, mb, programs in cases():
        if k == kind:
            assert replay(programs, ours, "sender-order") == "ok", (kind, ranks, mb)
            runs += 1
    assert runs >= 10


def test_the_model_finds_the_faults_the_design_avoids():
    programs = _native.schedule("dualpipe", 4, 8).programs
    # Both directions on one communicator, receives at their op: two neighbours that each send
    # before receiving wait for each other's receive, queued behind their own send.
    assert replay(programs, shared, "at-op") == "deadlock"
    # Receives posted at the start on a shared communicator: two ranks both receiving first.
    assert replay(programs, shared, "sender-order") == "deadlock"
    # Per-pair communicators, but receives posted in the receiver's own order: DualPipe at 6
    # ranks and DualPipeV at 3 receive a neighbour's activations and gradients in another order
    # than it sends them, so NCCL would deliver one into the other's buffer.
    assert replay(_native.schedule("dualpipe", 6, 12).programs, ours, "own-order") == "mismatch"
    assert replay(_native.schedule("dualpipev", 3, 6).programs, ours, "own-order") == "mismatch"


def test_pairs_are_the_neighbours_that_talk():
    assert directed_pairs(_native.schedule("1f1b", 3, 4).programs) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    # Interleaved wraps from the last rank to the first.
    assert (3, 0) in directed_pairs(_native.schedule("interleaved", 4, 8).programs)
