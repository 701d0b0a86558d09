"""Dropout drawn in kiln's kernels, its mask regenerated in the backward instead of saved.

A traced `F.dropout` is `aten.native_dropout(x, p, train)`: one ATen kernel that draws the mask from
torch's generator, returns the scaled result and the bool mask, and the backward reads the saved mask
(one byte per element; BERT-base at 8 x 512 saves 25 of them, 75 MiB a step) and breaks the fusion of
the pointwise work on either side. Here each such call becomes `kiln::philox_dropout(x, seed, p)`:
the mask is `philox(seed, i) >= round(p * 2**32)`, i the element's row-major position in x's shape and
philox Philox4x32-10's first 32-bit word (kiln/philox.py; kiln/ir/ops.py's `philox` row: the same bits on
Triton and C++), so the forward's kernels compute it where they read x. Each dropout's seed is an `aten.randint`
call where the dropout was (a 64-bit seed drawn from torch's generator in the program's order of random
ops: `torch.manual_seed` makes a run repeatable, and `kiln.testing.philox_draws()` makes eager draw the same
masks; torch's CUDA generator is graph-safe, so a recorded CUDA graph's replays should draw new seeds, which
benchmarks/gpu_dropout_check.py checks on a GPU), and where the
partitioner saved a dropout's mask for the backward, the forward saves its seed instead (8 bytes) and
the backward recomputes the mask, `kiln::philox_keep(seed, size, p)`, in the kernel that reads it.

The masks are not eager's (another generator), their statistics are: each element is kept with
probability 1 - round(p * 2**32) / 2**32, independently. The kept values are eager's bit for bit: x times
1/(1-p) in float32 for fp16/bf16 rounded once (eager's CUDA kernel), or times 1/(1-p) rounded to x's
dtype (eager's CPU dropout), as kiln/aot/decompositions.py's backward computes the gradient.

`rewrite_forward(gm)` makes the first change in a forward or inference graph; `partition` wraps the
partitioner to make both in a training graph's pair. `config.in_kernel_dropout` turns it off.
"""
from __future__ import annotations

import functools
import operator
from typing import Callable

import torch

from kiln import _torch
from kiln.config import config
from kiln.philox import SEED_HIGH

aten = _torch.aten


def _dropouts(gm: torch.fx.GraphModule) -> list:
    """The graph's native_dropout calls that draw a mask: training, 0 < p < 1, a tensor of a kernel dtype."""
    found = []
    for node in gm.graph.find_nodes(op="call_function", target=aten.native_dropout.default):
        x, p = node.args[0], node.args[1]
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if train is False or not isinstance(p, float) or not 0 < p < 1 or not isinstance(value, torch.Tensor) \
                or not value.dtype.is_floating_point or value.numel() == 0:
            continue
        found.append(node)
    return found


def rewrite_forward(gm: torch.fx.GraphModule) -> dict:
    """Each dropout of `gm` drawn in kernels (module docstring): {its mask node: its seed node}."""
    if not config.in_kernel_dropout:
        return {}
    dropouts = _dropouts(gm)
    if not dropouts:
        return {}
    masks = {}
    graph = gm.graph
    for node in dropouts:
        x, p = node.args[0], node.args[1]
        with graph.inserting_before(node):
            seed = graph.call_function(aten.randint.low, (0, SEED_HIGH, []),
                                       {"dtype": torch.int64, "device": x.meta["val"].device, "pin_memory": False})
            dropout = graph.call_function(torch.ops.kiln.philox_dropout.default, (x, seed, p))
        seed.meta["val"] = x.meta["val"].new_empty((), dtype=torch.int64)
        dropout.meta.update({key: value for key, value in node.meta.items() if key != "val"})
        dropout.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(dropout)
        graph.erase_node(node)
        masks.update({user: seed for user in dropout.users if user.target is operator.getitem and user.args[1] == 1})
    graph.lint()
    gm.recompile()
    return masks


def partition(partition_fn: Callable) -> Callable:
    """`partition_fn` (AOTAutograd's signature), then each dropout of the forward drawn in kernels, and
    each mask the forward saved for the backward replaced by its seed, which the backward expands again."""

    @functools.wraps(partition_fn)
    def partition_with_seeds(joint_module, joint_inputs, **kwargs):
        forward, backward = partition_fn(joint_module, joint_inputs, **kwargs)
        masks = rewrite_forward(forward)
        if masks:
            _save_seeds(forward, backward, masks)
        return forward, backward

    return partition_with_seeds


def _save_seeds(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule, masks: dict) -> None:
    """Where the forward returns a dropout's mask to save it, return its seed, and have the backward's
    input of that name compute the mask from it. The backward names its saved inputs as the forward's nodes."""
    output = forward.graph.output_node()
    placeholders = {node.name: node for node in backward.graph.find_nodes(op="placeholder")}
    results = list(output.args[0])
    first_computation = next(node for node in backward.graph.nodes if node.op != "placeholder")
    changed = False
    for position, item in enumerate(results):
        seed = masks.get(item)
        saved = placeholders.get(item.name) if isinstance(item, torch.fx.Node) else None
        if seed is None or saved is None:
            continue
        dropout = item.args[0]
        size, p = _sizes_in(backward, dropout.args[0].meta["val"].shape), dropout.args[2]
        if size is None:
            continue  # a symbolic size the backward has no input for: the mask stays saved
        results[position] = seed
        saved.meta["val"] = seed.meta["val"]
        with backward.graph.inserting_before(first_computation):
            keep = backward.graph.call_function(torch.ops.kiln.philox_keep.default, (saved, size, p))
        keep.meta.update({key: value for key, value in item.meta.items() if key != "val"})
        keep.meta["val"] = item.meta["val"].new_empty(item.meta["val"].shape)
        saved.replace_all_uses_with(keep, delete_user_cb=lambda user: user is not keep)
        changed = True
    if changed:
        output.args = (tuple(results),)
        forward.graph.lint()
        backward.graph.lint()
        forward.recompile()
        backward.recompile()


def _sizes_in(backward: torch.fx.GraphModule, shape) -> list | None:
    """`shape` as arguments of a backward node: ints, and for each symbolic size the backward's input
    that holds it (None where there is none)."""
    symbols = {str(_torch.sym_expr(node.meta["val"])): node for node in backward.graph.find_nodes(op="placeholder")
               if isinstance(node.meta.get("val"), torch.SymInt)}
    sizes = []
    for size in shape:
        if isinstance(size, torch.SymInt) and not _torch.sym_expr(size).is_Integer:
            size = symbols.get(str(_torch.sym_expr(size)))
            if size is None:
                return None
        sizes.append(int(size) if not isinstance(size, torch.fx.Node) else size)
    return sizes
