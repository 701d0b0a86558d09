"""`merge_duplicates(gm)`: an inference ATen graph computes each value once.

Under autocast every `nn.Linear` casts its input: three projections of one float32 hidden state (BERT's
and ViT's query, key and value after a layer norm, Llama's after an RMSNorm) are three `_to_copy` nodes
of the same tensor to the same dtype. Lowered as they are, each is a node of the norm's kernel with an
output of its own: the kernel recomputes the norm three times and stores three equal bf16 copies
(BERT's layer norms took 134 SASS instructions an element for it, benchmarks/sass_census.py). A
training graph's joint trace is merged this way by AOTAutograd's partitioner; an inference graph is not.

A node is merged into an earlier one with the same target, the same arguments (after earlier merges)
and the same meta, where that cannot change what the program computes or returns:
- only ATen ops whose schema writes nothing, that draw no random numbers (`nondeterministic_seeded`)
  and that do not make uninitialized memory (`empty`), with one tensor as their value;
- never across an op that writes (a functional graph's `copy_` into an input): what a node read
  before the write is not what the same node reads after it;
- never a node whose storage a graph output has (the output itself, or what it views): eager returns
  separate tensors, which a caller may write one at a time;
- float arguments compare with their sign (0.0 and -0.0 are different multipliers).
"""
from __future__ import annotations

import math

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from kiln import _torch


def merge_duplicates(gm: torch.fx.GraphModule) -> int:
    """Merge each duplicate node of `gm` into its first occurrence (see the module docstring); how many
    nodes went. `gm` is recompiled when any did."""
    graph = gm.graph
    returned = _returned_storages(graph)
    first: dict = {}  # key -> the earliest node with it, since the last write
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            first.clear()
            continue
        key = _key(node, returned)
        if key is None:
            continue
        earlier = first.setdefault(key, node)
        if earlier is not node and _same_meta(earlier.meta["val"], node.meta["val"]):
            node.replace_all_uses_with(earlier)
            graph.erase_node(node)
            merged += 1
    if merged:
        gm.recompile()
    return merged


def _returned_storages(graph: torch.fx.Graph) -> set:
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    values, _ = tree_flatten(output.args)
    return {_storage(value.meta.get("val")) for value in values if isinstance(value, torch.fx.Node)} - {None}


def _storage(value):
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return _torch.storage_weak_ref(value.untyped_storage())
    except (NotImplementedError, RuntimeError):  # a tensor without storage (sparse, nested)
        return None


def _key(node: torch.fx.Node, returned: set):
    """What identifies `node`'s value, or None when it must not be merged."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in target.tags:
        return None
    if target.overloadpacket.__name__.startswith(("empty", "new_empty")):
        return None
    value = node.meta.get("val")
    storage = _storage(value)
    if storage is None or storage in returned:
        return None
    leaves, spec = tree_flatten((node.args, node.kwargs))
    key = [target, str(spec)]
    for leaf in leaves:
        if isinstance(leaf, float):
            key.append((float, repr(leaf), math.copysign(1.0, leaf)))
        elif isinstance(leaf, (torch.fx.Node, int, bool, str, type(None), torch.dtype, torch.device,
                               torch.layout, torch.memory_format)):
            key.append((type(leaf), leaf))
        else:  # a symbolic number, a tensor constant...: not compared
            return None
    return tuple(key)


def _same_meta(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Equal dtype, device and layout; symbolic sizes compare by their expressions (no guard is added)."""
    def layout(tensor):
        return [str(number) if _torch.is_symbolic(number) else number
                for number in (*tensor.shape, *tensor.stride(), tensor.storage_offset())]

    return first.dtype == second.dtype and first.device == second.device and layout(first) == layout(second)
