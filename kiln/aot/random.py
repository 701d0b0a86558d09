"""Dropout drawn in kiln's kernels, its mask regenerated in the backward instead of saved.

A traced `F.dropout` is `aten.native_dropout(x, p, train)`: one ATen kernel that draws the mask from
torch's generator, returns the scaled result and the bool mask, and the backward reads the saved mask
(one byte per element; BERT-base at 8 x 512 saves 25 of them, 75 MiB a step) and breaks the fusion of
the pointwise work on either side. Here each such call becomes `kiln::philox_dropout(x, seed, p)`:
the mask is `philox(seed, i) >= round(p * 2**32)`, i the element's row-major position in x's shape and
philox Philox4x32-10's first 32-bit word (kiln/ir/ops.py's `philox` row: the same bits on Triton and
C++), so the forward's kernels compute it where they read x. Each dropout's seed is an `aten.randint`
call where the dropout was (a 64-bit seed drawn from torch's generator in the program's order of random
ops: `torch.manual_seed` makes a run repeatable, a CUDA graph's replays draw new seeds, and
`kiln.testing.philox_dropout()` makes eager draw the same masks), and where the
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

aten = _torch.aten
_WORD = 0xFFFFFFFF
SEED_HIGH = 2 ** 62  # seeds are drawn from [0, SEED_HIGH)


def philox(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10's first word (int64, in [0, 2**32)) for key = seed's two 32-bit halves and counter =
    (offset's halves, 0, 0), in torch's int64 arithmetic (products wrap mod 2**64): the reference the
    kernels' `philox` op is tested against, and the eager implementation of the ops below."""
    seed, offset = torch.broadcast_tensors(seed.to(torch.int64), offset.to(torch.int64))
    k0, k1 = seed & _WORD, (seed >> 32) & _WORD
    c0, c1 = offset & _WORD, (offset >> 32) & _WORD
    c2 = c3 = torch.zeros_like(c0)
    for _ in range(10):
        p0, p1 = c0 * 0xD2511F53, c2 * 0xCD9E8D57
        c0, c1, c2, c3 = ((p1 >> 32) & _WORD) ^ c1 ^ k0, p1 & _WORD, ((p0 >> 32) & _WORD) ^ c3 ^ k1, p0 & _WORD
        k0, k1 = (k0 + 0x9E3779B9) & _WORD, (k1 + 0xBB67AE85) & _WORD
    return c0


def keep_threshold(p: float) -> int:
    """An element is kept where its 32-bit word is at least this: with probability 1 - p within 2**-33."""
    return round(p * 2 ** 32)


def dropout_scale(p: float) -> float:
    return 1.0 / (1.0 - p)


def _keep(seed: torch.Tensor, size, p: float) -> torch.Tensor:
    offsets = torch.arange(int(torch.Size(size).numel()), device=seed.device, dtype=torch.int64).view(size)
    return philox(seed, offsets) >= keep_threshold(p)


@torch.library.custom_op("kiln::philox_keep", mutates_args=())
def philox_keep(seed: torch.Tensor, size: list[int], p: float) -> torch.Tensor:
    """The keep mask (bool, contiguous, `size`) of the dropout whose seed is `seed` (int64, 0-d)."""
    return _keep(seed, size, p)


@philox_keep.register_fake
def _(seed, size, p):
    return seed.new_empty(size, dtype=torch.bool)


@torch.library.custom_op("kiln::philox_dropout", mutates_args=())
def philox_dropout(x: torch.Tensor, seed: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`native_dropout(x, p, train=True)` with the mask `philox_keep(seed, x.shape, p)`: (result, mask)."""
    from kiln.aot.decompositions import dropout_backward_as_eager

    keep = _keep(seed, x.shape, p)
    return dropout_backward_as_eager(x, keep, dropout_scale(p), scale_in_grad_dtype=x.device.type == "cpu"), keep


@philox_dropout.register_fake
def _(x, seed, p):
    return torch.empty_like(x, memory_format=_torch.suggest_memory_format(x)), x.new_empty(x.shape, dtype=torch.bool)


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


def eager_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """F.dropout as kiln's kernels compute it, in torch ops (differentiable): the seed drawn from torch's
    generator as the compiled graph draws it, so an eager run made with it draws kiln's masks
    (kiln.testing.philox_dropout)."""
    if not training or not 0 < p < 1 or not x.dtype.is_floating_point or x.numel() == 0:
        return _F_DROPOUT(x, p, training, inplace)
    from kiln.aot.decompositions import dropout_backward_as_eager

    seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64, device=x.device)
    result = dropout_backward_as_eager(x, _keep(seed, x.shape, p), dropout_scale(p),
                                       scale_in_grad_dtype=x.device.type == "cpu")
    return x.copy_(result) if inplace else result


_F_DROPOUT = torch.nn.functional.dropout


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
