"""Cutting a user's model into pipeline stages: its layers, the partition, the stage modules."""

from __future__ import annotations

import copy
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import nn


class Layers:
    """A model as an ordered list of named layers, each called with the previous one's output.

    ``units[i] = (prefix, module)``: ``prefix`` is where the module sits in the user's model, so
    ``prefix + "." + name`` is the user's own ``state_dict`` key of each of its tensors.
    ``units[first:first + blocks]`` are the blocks that the partition spreads over the stages;
    the units before them go with the first stage, those after with the last.
    """

    def __init__(self, units: List[Tuple[str, nn.Module]], first: int, blocks: int):
        self.units = units
        self.first = first
        self.blocks = blocks


def layers_of(model: Any, blocks: Optional[str]) -> Layers:
    """The layers of ``model``: an ``nn.Sequential`` (``blocks=None``), or a module whose
    ``blocks`` attribute is its ``nn.ModuleList``/``nn.Sequential`` of blocks, called with its
    other direct children in the order they were registered (e.g. embedding, blocks, norm, head)."""
    if isinstance(model, tuple) and len(model) == 2 and blocks is None:
        model, blocks = model
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be an nn.Sequential, or an nn.Module with blocks='<name of its nn.ModuleList>', "
            f"not {type(model).__name__}"
        )
    if blocks is None:
        if not isinstance(model, nn.Sequential):
            raise TypeError(
                f"model is a {type(model).__name__}, not an nn.Sequential: pass blocks='<name of its "
                "nn.ModuleList of blocks>' (its other children run before and after the blocks, in "
                "the order they were registered) or wrap the model's layers in an nn.Sequential"
            )
        units = [(name, m) for name, m in model.named_children()]
        if not units:
            raise ValueError("model is an empty nn.Sequential: give it the layers to train")
        _no_loose_tensors(model, "model")
        return Layers(units, 0, len(units))
    if not isinstance(blocks, str):
        raise TypeError(f"blocks must be the name of the model's list of blocks (str), not {type(blocks).__name__}")
    children = list(model.named_children())
    names = [n for n, _ in children]
    if blocks not in names:
        raise ValueError(
            f"model ({type(model).__name__}) has no child module named blocks='{blocks}'; its children "
            f"are {names}: name its nn.ModuleList of blocks"
        )
    at = names.index(blocks)
    block_list = children[at][1]
    if not isinstance(block_list, (nn.ModuleList, nn.Sequential)):
        raise TypeError(
            f"model.{blocks} is a {type(block_list).__name__}, not an nn.ModuleList or nn.Sequential of blocks"
        )
    if len(block_list) == 0:
        raise ValueError(f"model.{blocks} is empty: there are no blocks to split into stages")
    _no_loose_tensors(model, "model")
    units = list(children[:at])
    units += [(f"{blocks}.{n}", m) for n, m in block_list.named_children()]
    units += list(children[at + 1 :])
    return Layers(units, at, len(block_list))


def _no_loose_tensors(model: nn.Module, what: str) -> None:
    """Parameters or buffers held by the model itself belong to no layer: refused."""
    loose = [n for n, _ in model.named_parameters(recurse=False)] + [n for n, _ in model.named_buffers(recurse=False)]
    if loose:
        raise ValueError(
            f"{what} holds tensors outside its layers ({', '.join(loose)}), which no pipeline stage "
            "would own: move them into a layer module (e.g. a positional-embedding module)"
        )


def partition_sizes(layers: Layers, stages: int, partition: Any) -> List[int]:
    """How many blocks each of ``stages`` stages gets: even (``None``; the first stages take one
    more when they do not divide), or the explicit list ``partition``."""
    n = layers.blocks
    if partition is None:
        if n < stages:
            raise ValueError(
                f"the model has {n} block{'s' if n != 1 else ''}, which cannot be split into {stages} pipeline stages (each "
                f"needs at least one block): use fewer pipeline_stages or a model with at least {stages} blocks"
            )
        base, extra = divmod(n, stages)
        return [base + (1 if s < extra else 0) for s in range(stages)]
    if isinstance(partition, (str, bytes)) or not isinstance(partition, Sequence):
        raise TypeError(
            "partition must be None (even), 'plan' (measured), or a list of block counts per stage, "
            f"not {type(partition).__name__}"
        )
    sizes = list(partition)
    if any(isinstance(s, bool) or not isinstance(s, int) for s in sizes):
        raise TypeError(f"partition must list whole numbers of blocks per stage, got {sizes}")
    if len(sizes) != stages:
        raise ValueError(
            f"partition lists {len(sizes)} stages, but the schedule has {stages}: give one block count per stage"
        )
    if any(s < 1 for s in sizes) or sum(sizes) != n:
        raise ValueError(
            f"partition {sizes} must give every stage at least one block and add up to the model's "
            f"{n} blocks (it adds up to {sum(sizes)})"
        )
    return sizes


def unit_sizes(layers: Layers, block_sizes: List[int]) -> List[int]:
    """Layers per stage from blocks per stage: the leading units join the first stage, the
    trailing ones the last."""
    sizes = list(block_sizes)
    sizes[0] += layers.first
    sizes[-1] += len(layers.units) - layers.first - layers.blocks
    return sizes


def stage_units(layers: Layers, sizes: List[int]) -> List[List[Tuple[str, nn.Module]]]:
    """The layers of each stage, in order, ``sizes[s]`` layers (units) for stage ``s``."""
    out = []
    at = 0
    for k in sizes:
        out.append(layers.units[at : at + k])
        at += k
    return out


class StageModule(nn.Module):
    """One pipeline stage: the user's layers called one after the other.

    ``keys()`` maps each of its parameter and buffer names to the user's ``state_dict`` key.
    """

    def __init__(self, units: List[Tuple[str, nn.Module]]):
        super().__init__()
        self.prefixes = [p for p, _ in units]
        self.layers = nn.ModuleList([m for _, m in units])

    def forward(self, x: Any) -> Any:  # noqa: D102 - the layers in order
        for layer in self.layers:
            x = layer(x)
        return x

    def user_key(self, local: str) -> str:
        """The user's ``state_dict`` key of this module's ``layers.{i}.{name}`` tensor."""
        _, i, rest = local.split(".", 2)
        return f"{self.prefixes[int(i)]}.{rest}"

    def named_user_parameters(self) -> List[Tuple[str, nn.Parameter]]:
        """``(user key, parameter)`` for each trainable parameter, in a fixed order."""
        return [(self.user_key(n), p) for n, p in self.named_parameters() if p.requires_grad]

    def user_state(self) -> List[Tuple[str, str, torch.Tensor]]:
        """``(layer prefix, user key, tensor)`` for every parameter and persistent buffer."""
        out = []
        for n, t in self.state_dict(keep_vars=True).items():
            key = self.user_key(n)
            out.append((self.prefixes[int(n.split(".")[1])], key, t))
        return out


def copy_stage(stage: StageModule) -> StageModule:
    """DualPipe's second copy of a stage: the same layers and values, its own tensors."""
    return copy.deepcopy(stage)
