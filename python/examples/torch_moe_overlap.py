"""The expert all-to-all hidden in DualPipe's FB pairs, measured: a DeepSeek-V3 MoE from a config,
2 pipeline ranks x 2 expert-parallel replicas, steps with and without the overlap, beside the
simulator's prediction from the measured op times.

    torchrun --nproc_per_node 4 python/examples/torch_moe_overlap.py [--steps 6] [--hidden 128]

With ``expert_parallel`` the executor runs each FB pair's backward on a second thread while the
forward runs, so one chunk's dispatch/combine all-to-all waits while the other computes
(``s.executor.overlap``; this script switches it off and on between steps). ``--ep 1`` is the
control: the experts whole on every replica, no all-to-all, the same two threads. Rank 0 prints the
median step and FB times of each mode and what ``plan.simulate`` predicts for the step from the
measured median F, B, W times, with FB = F + B (no overlap) and FB = F + B times the measured
pair's ratio (with the overlap over without).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import transformers

import dualpipe_rs.torch as dpt


def build(hidden: int, layers: int, experts: int):
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=experts,
        num_experts_per_tok=4, n_group=2, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
        q_lora_rank=hidden // 2, kv_lora_rank=hidden // 2, qk_rope_head_dim=16, qk_nope_head_dim=16,
        v_head_dim=16, max_position_embeddings=256, experts_implementation="eager")
    return transformers.AutoModelForCausalLM.from_config(config)


def op_medians(ops):
    """Median seconds of each op kind on this rank (an op's time includes any wait for a message:
    the median keeps the typical op, not the waiting ones)."""
    out = {}
    for name in ("F", "B", "I", "W"):
        d = [e - s for n, s, e in ops if n == name]
        if d:
            out[name] = statistics.median(d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--schedule", default="dualpipe")
    ap.add_argument("--ep", type=int, default=2, help="expert_parallel (1: the control, experts whole, no all-to-all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = dpt.DualPipeStrategy(build(args.hidden, args.layers, args.experts), torch.optim.AdamW, None,
                             schedule=args.schedule, pipeline_stages=2, micro_batches=8, expert_parallel=args.ep,
                             optimizer_kwargs={"lr": 1e-3})
    g = torch.Generator().manual_seed(s.world.replica)
    times = {True: [], False: []}
    fbs = {True: [], False: []}
    ops = {True: [], False: []}
    for step in range(2 * args.steps + 1):
        overlap = step % 2 == 1
        s.executor.overlap = overlap
        ids = torch.randint(0, 512, (16, args.seq), generator=g)
        s.step(ids, ids)
        if step == 0:
            continue  # warm-up
        st = s.stats()
        times[overlap].append(st["pipeline_seconds"])
        fbs[overlap] += st["fb_seconds"]
        ops[overlap] += st["ops"]
    mine = torch.tensor([statistics.median(times[False]), statistics.median(times[True])], dtype=torch.float64)
    torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)  # the slowest rank's step
    if s.world.rank != 0:
        s.close()
        return
    plain = op_medians(ops[False])
    f, b = plain["F"], plain.get("B", plain.get("I", 0) + plain.get("W", 0))
    w = min(plain.get("W", b / 2), b)
    fb_plain, fb_over = statistics.median(fbs[False]), statistics.median(fbs[True])
    # the simulator's FB for each mode: F + B shrunk by the measured pair's ratio to its own plain pair
    shrink = fb_over / fb_plain
    sim_plain = s.plan.simulate(f=f, b=b, w=w, fb=f + b)["makespan"]
    sim_over = s.plan.simulate(f=f, b=b, w=w, fb=min(max(shrink * (f + b), f, b), f + b))["makespan"]
    print(f"{args.schedule}, 2 pipeline ranks x 2 replicas, expert_parallel={args.ep}, {args.experts} experts, "
          f"hidden {args.hidden}, {args.steps} steps per mode")
    print(f"measured F {f * 1e3:.1f} ms, B {b * 1e3:.1f} ms (rank 0, medians)")
    print(f"FB pair (rank 0, median, waits excluded): {fb_plain * 1e3:.1f} ms without the overlap, "
          f"{fb_over * 1e3:.1f} ms with it ({shrink:.2f}x)")
    print(f"step (slowest rank's pipeline phase, median): {mine[0] * 1e3:.0f} ms without, {mine[1] * 1e3:.0f} ms with "
          f"({mine[1] / mine[0]:.2f}x)")
    print(f"simulated step from F, B and FB = F + B times that ratio: {sim_plain * 1e3:.0f} ms without, "
          f"{sim_over * 1e3:.0f} ms with ({sim_over / sim_plain:.2f}x)")
    s.close()


if __name__ == "__main__":
    main()
