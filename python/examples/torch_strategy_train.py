"""Train a small transformer (torch.nn layers) with DualPipe under torchrun: DualPipeStrategy.

    torchrun --standalone --nproc_per_node 4 python/examples/torch_strategy_train.py \
        --pipeline_stages 2 --gradient_compression=int8 --steps 30

Every process builds the same model; ``DualPipeStrategy`` keeps this rank's stages (DualPipe:
two copies, of stages ``r`` and ``ranks - 1 - r``), runs our DualPipe program over gloo (NCCL when
the model is on CUDA), sums the copies' gradients, exchanges them among the data-parallel
replicas (compressed, with error feedback), and steps AdamW. The task: continue sequences that
count up modulo the vocabulary from a random start, which the model learns in a few dozen steps.
Rank 0 prints the losses and the last step's measurements, and saves a checkpoint when asked.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

import dualpipe_rs.torch as dpt


class Positions(nn.Module):
    """Learned position embeddings added to the token embeddings."""

    def __init__(self, length: int, width: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(length, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[1]]


class TinyGPT(nn.Module):
    """Embedding, positions, ``blocks`` (a ModuleList of encoder layers, causal), norm, head."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, length: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.positions = Positions(length, width)
        self.blocks = nn.ModuleList([CausalBlock(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # the same computation, in one process
        x = self.positions(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class CausalBlock(nn.Module):
    """One pre-norm transformer layer with a causal mask."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=x.dtype)
        return self.layer(x, src_mask=mask, is_causal=True)


def batch(step: int, rows: int, length: int, vocab: int, replica: int):
    """This replica's rows of step ``step``: counting sequences from random starts."""
    g = torch.Generator().manual_seed(10_000 * step + replica)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    seq = (start + torch.arange(length + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline_stages", type=int, default=None)
    ap.add_argument("--gradient_compression", default="none", choices=["none", "bf16", "int8", "1bit"])
    ap.add_argument("--schedule", default="dualpipe")
    ap.add_argument("--zero", type=int, default=0, choices=[0, 1, 2],
                    help="1: optimizer state sharded over the replicas and DualPipe's copies; 2: gradients too")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--micro_batches", type=int, default=8)
    ap.add_argument("--rows", type=int, default=32, help="rows per replica and step")
    ap.add_argument("--save", default=None, help="a new directory for the final checkpoint")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: each process on cuda:LOCAL_RANK, over NCCL (one process per GPU)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    vocab, width, heads, layers, length = 32, 32, 4, 4, 16

    torch.manual_seed(0)  # the same model in every process
    model = TinyGPT(vocab, width, heads, layers, length).to(args.device)
    loss_fn = lambda out, y: nn.functional.cross_entropy(out.reshape(-1, vocab), y.reshape(-1))  # noqa: E731
    s = dpt.DualPipeStrategy(
        (model, "blocks"), torch.optim.AdamW, loss_fn,
        compression=None if args.gradient_compression == "none" else args.gradient_compression,
        pipeline_stages=args.pipeline_stages, schedule=args.schedule, micro_batches=args.micro_batches,
        optimizer_kwargs={"lr": 3e-3, "weight_decay": 0.01}, zero=args.zero,
    )
    w = s.world
    if w.rank == 0:
        print(f"{w.size} processes: {w.pipeline_ranks} pipeline ranks x {w.replicas} replicas, {s.kind}, "
              f"{s.micro_batches} micro-batches, stages of {s.partition} layers, backend {s.backend}, "
              f"compression {s.compression}, zero={s.zero}")
    for step in range(args.steps):
        x, y = batch(step, args.rows, length, vocab, w.replica)
        with s.context():
            out = s.forward(x)
            loss = s.compute_loss(out, y)
            s.backward(loss)
            s.update_weights()
        if w.rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            st = s.stats()
            print(f"step {step:3d}  loss {loss.item():.4f}  step {st['step_seconds'] * 1e3:6.1f} ms  "
                  f"bubble {st['bubble_ratio']:.2f}  exchange {st['communication_overhead_ratio']:.2f}  "
                  f"gradient bytes {st['gradient_bytes_sent']}")
    st = s.stats()
    if w.rank == 0:
        print(f"peak activations on rank 0: {st['peak_activations']} micro-batches measured, "
              f"{st['peak_activations_simulated']} simulated; {st['peak_activation_bytes']} bytes saved for backward; "
              f"optimizer state {st['optimizer_state_bytes']} bytes")
    if args.save:
        s.save(args.save)
        if w.rank == 0:
            print(f"checkpoint: {args.save} ({len(os.listdir(os.path.join(args.save, 'model')))} layer files)")
    s.close()


if __name__ == "__main__":
    main()
