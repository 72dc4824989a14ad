"""A Hugging Face ``transformers`` model, random init from a tiny config, trained under
``DualPipeStrategy`` as it is (``loss_fn=None``: the model's own causal-LM loss).

    torchrun --nproc_per_node 4 python/examples/torch_hf_train.py --model deepseek_v3 [--steps 8]
    torchrun --nproc_per_node 2 python/examples/torch_hf_train.py --model llama [--steps 8]

``deepseek_v3``: DualPipe on 2 pipeline ranks x 2 replicas, each MoE layer's 16 routed experts
sharded over the 2 replicas (``expert_parallel=2``), our EPLB re-placing them every 2 steps
(``eplb_interval=2``); rank 0 prints each step's loss and, at each re-plan, every MoE layer's
balance (the busiest replica's tokens over the mean) before and after the move. ``llama``:
DualPipeV on 2 pipeline ranks. The token ids come from a fixed random "language" (each token's
successor drawn from a few choices), so the loss falls.
"""

from __future__ import annotations

import argparse

import torch
import transformers

import dualpipe_rs.torch as dpt

VOCAB, SEQ = 128, 32


def config(name: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, max_position_embeddings=SEQ)
    if name == "llama":
        return transformers.LlamaConfig(intermediate_size=128, num_hidden_layers=4, num_key_value_heads=2, **common)
    return transformers.DeepseekV3Config(
        intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4, num_key_value_heads=4,
        n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, experts_implementation="eager", **common)


def batch(g: torch.Generator, table: torch.Tensor, rows: int) -> torch.Tensor:
    """Token ids from the fixed random language ``table`` (each token's 3 possible successors)."""
    ids = torch.empty(rows, SEQ, dtype=torch.int64)
    ids[:, 0] = torch.randint(0, VOCAB, (rows,), generator=g)
    for t in range(1, SEQ):
        ids[:, t] = table[ids[:, t - 1], torch.randint(0, table.shape[1], (rows,), generator=g)]
    return ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["deepseek_v3", "llama"], default="deepseek_v3")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every process builds the same model
    model = transformers.AutoModelForCausalLM.from_config(config(args.model))
    if args.model == "llama":
        s = dpt.DualPipeStrategy(model, torch.optim.AdamW, None, schedule="dualpipev", micro_batches=4,
                                 optimizer_kwargs={"lr": 3e-3})
    else:
        s = dpt.DualPipeStrategy(model, torch.optim.AdamW, None, schedule="dualpipe", pipeline_stages=2,
                                 micro_batches=4, expert_parallel=2, eplb_interval=2, optimizer_kwargs={"lr": 3e-3})
    table = torch.randint(0, VOCAB, (VOCAB, 3), generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(100 + s.world.replica)  # each replica its own data
    say = print if s.world.rank == 0 else (lambda *a, **k: None)
    say(f"{type(model).__name__}: {s.kind}, {s.world.pipeline_ranks} pipeline ranks x {s.world.replicas} replicas, "
        f"units per stage {s.partition}")
    for step in range(1, args.steps + 1):
        ids = batch(g, table, 8)
        loss = s.step(ids, ids)
        st = s.stats()
        say(f"step {step}: loss {loss:.4f}")
        if st.get("eplb_step") == step:
            before = " ".join(f"{b:.2f}" for b in st["eplb_balance_before"])
            after = " ".join(f"{b:.2f}" for b in st["eplb_balance_after"])
            say(f"  EPLB: balance per MoE layer {before} -> {after}, {st['eplb_moved_experts']} experts moved")
    s.close()


if __name__ == "__main__":
    main()
