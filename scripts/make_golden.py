#!/usr/bin/env python3
"""Regenerates the golden oracles in testdata/golden from DeepSeek's reference implementations.

    pip install torch numpy        # CPU torch is enough: nothing runs on a GPU
    git clone https://github.com/deepseek-ai/DualPipe ../DualPipe
    git clone https://github.com/deepseek-ai/EPLB ../EPLB
    python3 scripts/make_golden.py --dualpipe-repo ../DualPipe --eplb-repo ../EPLB [--out DIR]
    python3 scripts/make_golden.py ... --check      # compare with testdata/golden instead of writing

DualPipe / DualPipeV: the reference's own `step()` runs once per rank with its compute and its
point-to-point calls traced instead of executed. Every scheduling decision (which chunk runs when,
which phase, whether the weight gradient is deferred, which peer a message goes to, when the
communication is waited on) is the reference's code; the tracer only records what it is asked to do
and keeps the reference's bookkeeping lists filled with empty placeholders. The events and the chunk
naming (`dir`, `stage`, `mb`) are described in testdata/golden/README.md.

EPLB: each case's input (`weight`, sizes) is taken from the existing case file (the loads were
drawn once, see `distribution`) or, with --new-eplb-cases N, drawn afresh with a seed; the outputs
(`phy2log`, `log2phy`, `logcnt`) are always recomputed by the reference's `rebalance_experts`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "testdata" / "golden"

# The configurations of testdata/golden/dualpipe: (ranks, micro-batches).
DUALPIPE_CASES = [
    (2, 4), (2, 6), (2, 20), (2, 32), (2, 64),
    (4, 8), (4, 10), (4, 12), (4, 20), (4, 32), (4, 64),
    (8, 16), (8, 18), (8, 20), (8, 24), (8, 32), (8, 64),
]
DUALPIPEV_CASES = [
    (1, 2), (1, 3), (1, 5), (1, 10), (1, 20), (1, 33),
    (2, 4), (2, 5), (2, 7), (2, 10), (2, 20), (2, 33),
    (4, 8), (4, 9), (4, 10), (4, 11), (4, 20), (4, 33),
]


WAIT_AT_WEIGHT = False


class Tracer:
    """Replaces the compute and communication of one reference pipeline object by records."""

    def __init__(self, pipe, v_shape: bool, ranks: int, rank: int):
        self.pipe, self.v_shape, self.ranks, self.rank = pipe, v_shape, ranks, rank
        self.events: list[dict] = []
        self.deferred: list[dict] = []  # chunks whose weight gradient waits (FIFO, as the reference)
        self.pending_comm: tuple[str, list[int]] | None = None

    # -- naming -------------------------------------------------------------------------------
    def physical(self, phase: int) -> int:
        """The reference's phase after its own second-half swap (DualPipe only)."""
        if self.v_shape:
            return phase
        return phase ^ int(self.pipe.is_in_second_half)

    def chunk(self, physical_phase: int, chunk_id: int) -> dict:
        if self.v_shape:
            stage = self.rank if physical_phase == 0 else 2 * self.ranks - 1 - self.rank
            return {"stage": stage, "mb": chunk_id}
        stage = self.rank if physical_phase == 0 else self.ranks - 1 - self.rank
        return {"dir": physical_phase, "stage": stage, "mb": chunk_id}

    # -- compute --------------------------------------------------------------------------------
    def take_forward(self, phase: int) -> dict:
        p = self.physical(phase)
        chunk_id = self.pipe.current_f_chunk_id[p]
        self.pipe.current_f_chunk_id[p] += 1
        self.pipe.output_chunks[p].append([])
        return self.chunk(p, chunk_id)

    def take_backward(self, phase: int) -> dict:
        p = self.physical(phase)
        chunk_id = self.pipe.current_b_chunk_id[p]
        self.pipe.current_b_chunk_id[p] += 1
        self.pipe.input_grad_chunks[p].append([])
        return self.chunk(p, chunk_id)

    def forward_compute(self, phase: int) -> None:
        self.events.append({"op": "F", **self.take_forward(phase)})
        self.keep_loss_list_filled()

    def keep_loss_list_filled(self) -> None:
        """The reference stacks its per-chunk losses at the end of step(); give it placeholders."""
        if self.pipe.is_first_rank or self.pipe.is_last_rank:
            self.pipe.loss_chunks.append(self.zero)

    def backward_compute(self, phase: int, enable_zb: bool = False) -> None:
        c = self.take_backward(phase)
        if enable_zb:
            self.events.append({"op": "I", **c})
            self.deferred.append(c)
        else:
            self.events.append({"op": "B", **c})

    def forward_backward_compute(self, phase0: int, phase1: int) -> None:
        f = self.take_forward(phase0)
        b = self.take_backward(phase1)
        self.events.append({"op": "FB", "f": f, "b": b})
        self.keep_loss_list_filled()

    def weight(self) -> None:
        # The reference's `_weight_chunk` also completes the communication posted so far. The
        # stored oracles leave that WAIT out (the sends stay pending until the next recorded
        # WAIT, which the golden README allows: WAIT placement may differ); --wait-at-weight
        # records it where the reference has it.
        if WAIT_AT_WEIGHT:
            self.pipe._commit_and_wait_comm()
        self.events.append({"op": "W", **self.deferred.pop(0)})

    def commit_and_wait(self) -> None:
        if self.pipe.comm_ops:
            self.events.append({"op": "WAIT"})
        self.pipe.comm_ops = []
        self.pipe.to_free = []

    # -- communication: the reference's methods run; their p2p calls land here --------------------
    def wrap(self, kind: str, counters: str, method):
        def traced(phase: int):
            self.pending_comm = (kind, list(getattr(self.pipe, counters)))
            method(phase)
            self.pending_comm = None

        return traced

    def record_p2p(self, ops: list, peer: int) -> list:
        kind, before = self.pending_comm
        counters = {"RECV_F": "current_recv_f_chunk_id", "SEND_F": "current_send_f_chunk_id",
                    "RECV_B": "current_recv_b_chunk_id", "SEND_B": "current_send_b_chunk_id"}[kind]
        after = getattr(self.pipe, counters)
        (p,) = [i for i in range(2) if after[i] != before[i]]
        self.events.append({"op": kind, "peer": peer, **self.chunk(p, before[p])})
        ops.append(kind)
        return []


def trace_rank(module, cls_name: str, ranks: int, rank: int, micro_batches: int) -> list[dict]:
    torch = importlib.import_module("torch")
    comm = importlib.import_module("dualpipe.comm")
    cls = getattr(module, cls_name)
    v_shape = cls_name == "DualPipeV"
    pipe = cls.__new__(cls)
    torch.nn.Module.__init__(pipe)
    # The attributes the reference's __init__ derives from its process group (no group needed).
    pipe.module = [None, None]
    pipe.overlapped_forward_backward = True
    pipe.batch_dim = 0
    pipe.group = None
    pipe.num_ranks = ranks
    pipe.rank = rank
    pipe.first_rank, pipe.last_rank = 0, ranks - 1
    pipe.prev_rank, pipe.next_rank = rank - 1, rank + 1
    pipe.is_first_rank = rank == 0
    pipe.is_last_rank = rank == ranks - 1
    pipe.is_in_second_half = rank >= ranks // 2
    pipe.is_middle_rank = rank in (ranks // 2 - 1, ranks // 2)

    tracer = Tracer(pipe, v_shape, ranks, rank)
    tracer.zero = torch.zeros(())
    pipe._forward_compute_chunk = tracer.forward_compute
    pipe._backward_compute_chunk = tracer.backward_compute
    pipe._forward_backward_compute_chunk = tracer.forward_backward_compute
    pipe._weight_chunk = tracer.weight
    pipe._commit_and_wait_comm = tracer.commit_and_wait
    for name, kind, counters in [
        ("_recv_forward", "RECV_F", "current_recv_f_chunk_id"),
        ("_send_forward", "SEND_F", "current_send_f_chunk_id"),
        ("_recv_backward", "RECV_B", "current_recv_b_chunk_id"),
        ("_send_backward", "SEND_B", "current_send_b_chunk_id"),
    ]:
        setattr(pipe, name, tracer.wrap(kind, counters, getattr(pipe, name)))
    comm.append_irecv = lambda ops, src, group: tracer.record_p2p(ops, src)
    comm.append_isend = lambda ops, tensors, dst, group: tracer.record_p2p(ops, dst)
    comm.set_p2p_tensor_shapes([(1,)])
    comm.set_p2p_tensor_dtype(torch.float32)

    needs_data = rank in (0, ranks - 1)
    inputs = (torch.zeros(micro_batches),) if needs_data else ()
    labels = (torch.zeros(micro_batches),) if needs_data else ()
    pipe.step(*inputs, num_chunks=micro_batches, criterion=lambda *a: None, labels=labels)
    return tracer.events


def dualpipe_files(repo: Path) -> dict[str, dict]:
    sys.path.insert(0, str(repo))
    out = {}
    for cls_name, module_name, tag, cases in [
        ("DualPipe", "dualpipe.dualpipe", "dualpipe", DUALPIPE_CASES),
        ("DualPipeV", "dualpipe.dualpipev", "dualpipev", DUALPIPEV_CASES),
    ]:
        module = importlib.import_module(module_name)
        for ranks, mbs in cases:
            programs = [trace_rank(module, cls_name, ranks, r, mbs) for r in range(ranks)]
            out[f"dualpipe/{tag}-pp{ranks}-mb{mbs}.json"] = {
                "schedule": tag, "ranks": ranks, "micro_batches": mbs, "programs": programs,
            }
    return out


def eplb_files(repo: Path, new_cases: int, seed: int) -> dict[str, dict]:
    sys.path.insert(0, str(repo))
    torch = importlib.import_module("torch")
    eplb = importlib.import_module("eplb")
    cases = {}
    for path in sorted((GOLDEN / "eplb").glob("*.json")):
        cases[f"eplb/{path.name}"] = json.loads(path.read_text())
    gen = torch.Generator().manual_seed(seed)
    for i in range(new_cases):
        layers, experts, groups, nodes = 2, 16, 4, 2
        gpus, replicas = 8, 24
        weight = torch.randint(0, 100, (layers, experts), generator=gen).tolist()
        cases[f"eplb/new-{i:03d}-seed{seed}.json"] = {
            "weight": weight, "weight_is_integer": True, "distribution": f"randint seed {seed}",
            "num_replicas": replicas, "num_groups": groups, "num_nodes": nodes, "num_gpus": gpus,
        }
    out = {}
    for name, case in cases.items():
        weight = torch.tensor(case["weight"], dtype=torch.float64 if not case.get("weight_is_integer") else torch.int64)
        phy2log, log2phy, logcnt = eplb.rebalance_experts(
            weight, case["num_replicas"], case["num_groups"], case["num_nodes"], case["num_gpus"])
        case = dict(case)
        case["phy2log"], case["log2phy"], case["logcnt"] = phy2log.tolist(), log2phy.tolist(), logcnt.tolist()
        out[name] = case
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dualpipe-repo", type=Path, help="checkout of deepseek-ai/DualPipe")
    ap.add_argument("--eplb-repo", type=Path, help="checkout of deepseek-ai/EPLB")
    ap.add_argument("--out", type=Path, default=GOLDEN, help="where to write (default testdata/golden)")
    ap.add_argument("--check", action="store_true", help="compare with testdata/golden, write nothing")
    ap.add_argument("--new-eplb-cases", type=int, default=0, help="also draw N new EPLB inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait-at-weight", action="store_true",
                    help="also record the WAIT inside the reference's weight step (differs from the stored files)")
    args = ap.parse_args()
    global WAIT_AT_WEIGHT
    WAIT_AT_WEIGHT = args.wait_at_weight
    if not args.dualpipe_repo and not args.eplb_repo:
        ap.error("give --dualpipe-repo and/or --eplb-repo")
    files = {}
    if args.dualpipe_repo:
        files.update(dualpipe_files(args.dualpipe_repo))
    if args.eplb_repo:
        files.update(eplb_files(args.eplb_repo, args.new_eplb_cases, args.seed))
    differ = 0
    for name, data in sorted(files.items()):
        if args.check:
            path = GOLDEN / name
            old = json.loads(path.read_text()) if path.exists() else None
            same = old == data
            differ += not same
            print(f"{'same' if same else 'DIFFERS'}  {name}")
        else:
            path = args.out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, separators=(",", ":")))
    print(f"{len(files)} files {'checked' if args.check else 'written'}" + (f", {differ} differ" if args.check else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
