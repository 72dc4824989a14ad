"""Trains tiny ``transformers`` causal LMs under ``DualPipeStrategy`` in the processes torchrun
started; used by test_torch_hf.py.

    torchrun --nproc_per_node 2 hf_worker.py --out DIR --suite families

Each case builds one family's model from a tiny config (random init, f64, eager attention so a
missing causal mask would show), trains it for a few steps with ``loss_fn=None`` (the model's
own loss) and writes, per rank, ``<family>-<schedule>-rank<r>.pt``: the per-step losses and the
final parameters by the model's ``state_dict`` keys. The test compares them with the same model
trained in one process with ``model(input_ids, labels=labels).loss``.
"""

from __future__ import annotations

import os
import sys

import torch

import dualpipe_rs.torch as dpt

VOCAB, SEQ, ROWS_PER_MB, LAYERS = 48, 8, 2, 4
FAMILIES = ["gpt2", "llama", "qwen2", "mistral", "deepseek_v3"]
SCHEDULES = ["dualpipe", "dualpipev", "1f1b"]


def config_of(family: str):
    """The tiny config of a family (its defaults otherwise)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=LAYERS, num_attention_heads=2,
                  max_position_embeddings=32, attn_implementation="eager")
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=LAYERS, n_head=2, n_positions=32, resid_pdrop=0.0,
                             embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                             attn_implementation="eager")  # tied embeddings
    if family == "llama":
        return tf.LlamaConfig(intermediate_size=24, num_key_value_heads=1, **common)  # untied
    if family == "qwen2":
        return tf.Qwen2Config(intermediate_size=24, num_key_value_heads=1, tie_word_embeddings=True, **common)
    if family == "mistral":  # a window shorter than the sequence: the sliding mask matters
        return tf.MistralConfig(intermediate_size=24, num_key_value_heads=1, sliding_window=3, **common)
    if family == "deepseek_v3":  # layer 0 dense, layers 1-3 MoE (8 routed experts, top 2 of 2 groups), MLA
        return tf.DeepseekV3Config(intermediate_size=24, moe_intermediate_size=8, num_key_value_heads=2,
                                   n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                   n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=8, kv_lora_rank=8,
                                   qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4,
                                   experts_implementation="eager", **common)  # grouped_mm has no f64
    raise ValueError(family)


def build(family: str):
    """The same model in every process and in the single-process oracle."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config_of(family))
    return model.to(torch.float64)


def batches(steps: int, rows: int):
    """Every step's token ids (the labels are the ids: the loss shifts them)."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (rows, SEQ), generator=g) for _ in range(steps)]


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def params_of(s):
    return {k: p.detach().clone() for m in s.stages.values() for k, p in m.named_user_parameters()}


def suite_families(out: str, world: int) -> None:
    for family in FAMILIES:
        for schedule in SCHEDULES:
            mbs = 2 * world
            s = dpt.DualPipeStrategy(build(family), adamw, None, schedule=schedule, micro_batches=mbs)
            losses = [s.step(x, x) for x in batches(3, mbs * ROWS_PER_MB)]
            name = f"{family}-{schedule}"
            torch.save({"losses": losses, "params": params_of(s)}, os.path.join(out, f"{name}-rank{s.world.rank}.pt"))
            if schedule == "1f1b":
                s.save(os.path.join(out, f"ckpt-{name}"))


def suite_experts(out: str, world: int) -> None:
    """DeepSeek-V3 on 2 pipeline ranks x 2 replicas, its routed experts sharded over the replicas and
    re-placed by EPLB after every step; then 1 x 4 in two expert groups, without EPLB."""
    for schedule in SCHEDULES:
        mbs = 4
        s = dpt.DualPipeStrategy(build("deepseek_v3"), adamw, None, schedule=schedule, micro_batches=mbs,
                                 pipeline_stages=2, expert_parallel=2, eplb_interval=1)
        rows = mbs * ROWS_PER_MB
        losses, moves = [], []
        for x in batches(3, 2 * rows):
            losses.append(s.step(x.chunk(2)[s.world.replica], x.chunk(2)[s.world.replica]))
            st = s.stats()
            moves.append({k: v for k, v in st.items() if k.startswith("eplb_")})
        overlapped = s.executor.overlap and len(st["fb_seconds"])  # FB pairs run with the overlap
        torch.save({"losses": losses, "params": params_of(s), "replica": s.world.replica, "eplb": moves,
                    "overlapped_pairs": overlapped,
                    "placement": s._ep.phy2log.clone()}, os.path.join(out, f"ep-{schedule}-rank{s.world.rank}.pt"))
    # 4 replicas in 2 expert groups: each shard's gradient also summed with the other group's
    s = dpt.DualPipeStrategy(build("deepseek_v3"), adamw, None, schedule="1f1b", micro_batches=2,
                             pipeline_stages=1, expert_parallel=2)
    losses = [s.step(x.chunk(4)[s.world.replica], x.chunk(4)[s.world.replica]) for x in batches(3, 8 * ROWS_PER_MB)]
    try:
        s.save(os.path.join(out, "ckpt-ep"))
        refused = "saved"
    except ValueError as e:
        refused = f"ValueError: {e}"
    torch.save({"losses": losses, "params": params_of(s), "replica": s.world.replica, "save": refused},
               os.path.join(out, f"ep-groups-rank{s.world.rank}.pt"))


def main() -> None:
    from torch_strategy_worker import run_suite

    run_suite(globals())


if __name__ == "__main__":
    sys.exit(main())
