"""Hugging Face ``transformers`` causal LMs as pipeline units, with the model's own loss.

:func:`adapt` cuts a ``PreTrainedModel`` of a known family into units that each take and return
one tensor, the hidden states (what the pipeline sends between ranks):

- the embeddings (GPT-2: token and position embeddings and their dropout);
- one unit per decoder layer, which rebuilds the causal mask (sliding where the model slides)
  and the rotary embeddings from the hidden states it receives, as the model's own forward
  builds them once for all layers, and calls the layer with them;
- the final norm, then the head.

Each unit keeps the model's own tensor names (a decoder layer's unit is a shallow copy of the
layer whose class adds only that ``forward``), so its ``state_dict`` keys, and a checkpoint's,
are the model's. Tied input and output embeddings get separate tensors, one per unit, starting
equal; :class:`TiedGrads` gives both the sum of their gradients every step (as Megatron does for
embeddings on two pipeline ranks), so with the same optimizer state they stay equal. The loss is
the model's ``loss_function`` (``ForCausalLMLoss``: labels shifted inside, ``-100`` ignored).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ._p2p import wait_for
from ._split import Layers

# model_type -> the layout its adapter reads
FAMILIES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "llama", "mistral": "llama", "deepseek_v3": "llama"}

RECIPE = (
    "wrap it yourself: an nn.Sequential of modules that each take and return one tensor (the "
    "embeddings; one module per decoder layer that builds its own causal mask and rotary "
    "embeddings; the final norm and the head) and pass loss_fn=(logits, labels) -> scalar "
    "(see docs/python.md, 'Other transformers models')"
)


def is_transformers_model(model: Any) -> bool:
    """Whether ``model`` is a ``transformers`` ``PreTrainedModel`` (without importing transformers)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers")
               for c in type(model).__mro__)


class _Context:
    """What a decoder layer's unit needs besides the hidden states: the config, the model's rotary
    embedding (``None`` for GPT-2) and the mask function of this layer's attention."""

    def __init__(self, config: Any, rotary: Optional[nn.Module], mask_fn: Callable):
        self.config = config
        self.rotary = rotary
        self.mask_fn = mask_fn


class _DecoderUnit:
    """Mixed into a copy of a decoder layer's class: ``forward(hidden_states)`` builds the
    positions, the causal mask and the rotary embeddings as the model's forward does, then runs
    the layer's own ``forward``."""

    _dualpipe_ctx: _Context

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # noqa: D102 - see the class
        ctx = self._dualpipe_ctx
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        mask = ctx.mask_fn(ctx.config, hidden_states, None, None, position_ids=positions)
        kwargs: Dict[str, Any] = {"attention_mask": mask, "position_ids": positions}
        if ctx.rotary is not None:
            kwargs["position_embeddings"] = ctx.rotary(hidden_states, positions)
        out = super().forward(hidden_states, **kwargs)  # type: ignore[misc]
        return out[0] if isinstance(out, tuple) else out


_UNIT_CLASSES: Dict[type, type] = {}


def _decoder_unit(layer: nn.Module, ctx: _Context) -> nn.Module:
    """A unit over ``layer``: a shallow copy (the same parameters and submodules, so the same
    names) whose class is the layer's with :class:`_DecoderUnit`'s ``forward``."""
    base = type(layer)
    cls = _UNIT_CLASSES.get(base)
    if cls is None:
        cls = type(f"DualPipe{base.__name__}", (_DecoderUnit, base), {"__module__": __name__})
        _UNIT_CLASSES[base] = cls
    unit = copy.copy(layer)
    unit.__class__ = cls
    object.__setattr__(unit, "_dualpipe_ctx", ctx)  # a plain attribute: no tensor of its own
    return unit


class GPT2Embeddings(nn.Module):
    """GPT-2's input side: token plus position embeddings, then the embedding dropout."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module):
        super().__init__()
        self.wte = wte
        self.wpe = wpe
        self.drop = drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # noqa: D102 - as GPT2Model's
        embeds = self.wte(input_ids)
        positions = torch.arange(input_ids.shape[-1], device=embeds.device).unsqueeze(0)
        return self.drop(embeds + self.wpe(positions))


class TiedHead(nn.Module):
    """The output projection of a model whose head shares the input embedding's tensor: here its
    own copy, kept equal by :class:`TiedGrads`."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(head.weight.detach().clone())
        self.bias = nn.Parameter(head.bias.detach().clone()) if head.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102 - a linear layer
        return nn.functional.linear(x, self.weight, self.bias)


class Adapted:
    """What :func:`adapt` gives the strategy: the units, the loss and the tied tensors' keys."""

    def __init__(self, layers: Layers, loss_fn: Callable, ties: List[Tuple[str, ...]], family: str):
        self.layers = layers
        self.loss_fn = loss_fn
        self.ties = ties
        self.family = family


def _mask_fns(model_type: str, config: Any, n: int) -> List[Callable]:
    """Each decoder layer's mask function, as the family's own forward picks it."""
    from transformers import masking_utils as mu

    causal, sliding = mu.create_causal_mask, mu.create_sliding_window_causal_mask
    if model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return [sliding] * n
    if model_type == "qwen2":
        types = getattr(config, "layer_types", None) or ["full_attention"] * n
        return [sliding if t == "sliding_attention" else causal for t in types[:n]]
    return [causal] * n


def _head(model: nn.Module, embedding: nn.Embedding) -> Tuple[nn.Module, bool]:
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    return (TiedHead(head) if tied else head), tied


def adapt(model: Any, loss_fn: Any) -> Adapted:
    """The units of a ``transformers`` causal LM; ``loss_fn=None`` takes the model's own
    causal-LM loss. An unknown family raises ``ValueError`` naming the wrapper recipe."""
    if not is_transformers_model(model):
        raise TypeError(
            f"loss_fn=None takes a transformers causal LM's own loss, but the model is a {type(model).__name__}: "
            "give loss_fn, a callable (out, labels) -> scalar or a loss class"
        )
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None or not type(model).__name__.endswith(("LMHeadModel", "ForCausalLM")):
        raise ValueError(
            f"DualPipeStrategy takes transformers causal LMs of the types {', '.join(sorted(FAMILIES))} as they are; "
            f"this model is a {type(model).__name__} (model_type '{model_type}'): {RECIPE}"
        )
    n = config.num_hidden_layers
    masks = _mask_fns(model_type, config, n)
    if family == "gpt2":
        body = model.transformer
        embed_unit = ("transformer", GPT2Embeddings(body.wte, body.wpe, body.drop))
        embedding, blocks, block_prefix = body.wte, body.h, "transformer.h"
        norm = ("transformer.ln_f", body.ln_f)
        embed_key, rotary = "transformer.wte.weight", None
    else:
        body = model.model
        embed_unit = ("model.embed_tokens", body.embed_tokens)
        embedding, blocks, block_prefix = body.embed_tokens, body.layers, "model.layers"
        norm = ("model.norm", body.norm)
        embed_key, rotary = "model.embed_tokens.weight", body.rotary_emb
    head, tied = _head(model, embedding)
    units = [embed_unit]
    units += [(f"{block_prefix}.{i}", _decoder_unit(layer, _Context(config, rotary, masks[i])))
              for i, layer in enumerate(blocks[:n])]
    units += [norm, ("lm_head", head)]
    if loss_fn is None:
        own = model.loss_function
        vocab = config.vocab_size

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return own(logits=logits, labels=labels, vocab_size=vocab)

    ties = [(embed_key, "lm_head.weight")] if tied else []
    return Adapted(Layers(units, 1, n), loss_fn, ties, family)


class TiedGrads:
    """Tensors that are one in the model (tied embeddings) and several here: every step each
    copy's gradient becomes the sum of the tensors' gradients, once per tensor (DualPipe's two
    copies of a stage already hold the same summed gradient, so one is counted).

    ``holders[key]``: the pipeline ranks holding a copy of ``key``. Where every holder holds
    every key of the tie, the sum is local; otherwise each key's lowest holder contributes it to
    an all-reduce over the holders of this replica (``groups[replica]``)."""

    def __init__(self, ties: Sequence[Tuple[str, ...]], holders: Dict[str, List[int]], world: Any, timeout: float):
        self.ties = [tuple(t) for t in ties]
        self.world = world
        self.timeout = timeout
        self.owner = {k: min(ranks) for k, ranks in holders.items()}
        self.groups: Dict[Tuple[str, ...], Any] = {}
        for tie in self.ties:
            sets = [set(holders[k]) for k in tie]
            if all(s == sets[0] for s in sets):
                continue  # every holder holds every key: a local sum
            members = sorted(set().union(*sets))
            for replica in range(world.replicas):  # every process creates every group, in one order
                ranks = [world.global_rank(p, replica) for p in members]
                group = dist.new_group(ranks) if world.size > 1 else None
                if replica == world.replica and world.pipeline_rank in members:
                    self.groups[tie] = group

    def sum_grads(self, stages: Dict[Tuple[int, int], Any]) -> None:
        """Gives each local copy of a tied tensor the sum of the tie's gradients."""
        local: Dict[str, List[nn.Parameter]] = {}
        for m in stages.values():
            for k, p in m.named_user_parameters():
                local.setdefault(k, []).append(p)
        me = self.world.pipeline_rank
        for tie in self.ties:
            held = [k for k in tie if k in local]
            if not held:
                continue
            group = self.groups.get(tie)
            counted = [k for k in held if group is None or self.owner[k] == me]
            p0 = local[held[0]][0]
            total = torch.zeros_like(p0)
            for k in counted:
                g = local[k][0].grad
                if g is not None:
                    total += g
            if group is not None:
                wait_for(dist.all_reduce(total, group=group, async_op=True),
                         f"rank {self.world.rank}: the tied tensors {', '.join(tie)}' gradients", self.timeout)
            for k in held:
                for p in local[k]:
                    p.grad = total.clone()


def tie_holders(adapted: Adapted, placement: List[List[int]], sizes: List[int]) -> Dict[str, List[int]]:
    """The pipeline ranks holding each tied key: its unit's stage, on every direction's rank."""
    stage_of_unit: List[int] = []
    for s, k in enumerate(sizes):
        stage_of_unit += [s] * k
    unit_of_key: Dict[str, int] = {}
    for i, (prefix, module) in enumerate(adapted.layers.units):
        for name, _ in module.named_parameters():
            unit_of_key[f"{prefix}.{name}"] = i
    out: Dict[str, List[int]] = {}
    for tie in adapted.ties:
        for k in tie:
            s = stage_of_unit[unit_of_key[k]]
            out[k] = sorted({row[s] for row in placement})
    return out
