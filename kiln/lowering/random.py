"""Random values drawn in kernels from Philox words (kiln/philox.py): `philox(seed, i)`, i the element's row-major
position in the tensor's shape, whatever its layout, so that the forward and the backward, whose kernels walk
different layouts, draw the same dropout mask (kiln/aot/random.py). Each rule is a pointwise node, fused with its
producers and consumers like any other.

- dropout: keep where the word is at least round(p * 2**32);
- `rand`, `rand_like` (float32, float16, bfloat16): the word's top 24, 11 or 8 bits times 2**-24, 2**-11 or 2**-8,
  uniform on [0, 1) and exact in the dtype (a float32 value rounded to a 16-bit format could round up to 1);
- `bernoulli.p`: 1 where a 24-bit uniform is below p.
Their seeds are an `aten.randint` drawn from torch's generator where the op is (an extern), so torch.manual_seed makes
a run repeatable and a CUDA graph's replays draw new values; float64, an explicit generator, and `randn` stay ATen's.
"""
from __future__ import annotations

import operator

import sympy
import torch

from kiln import _torch
from kiln.philox import SEED_HIGH, UNIFORM_BITS, dropout_scale, keep_threshold
from kiln.ir.indexing import contiguous_strides
from kiln.lowering.context import TensorValue, Unsupported, compute_dtype_for, meta_of, rounded_scalar
from kiln.lowering.registry import lowering

aten = _torch.aten


def _word(body, seed, index, shape) -> int:
    """The element's 32-bit Philox word (int64) at `index` of a tensor of `shape`."""
    position = sum((variable * stride for variable, stride in zip(index, contiguous_strides(shape))),
                   sympy.Integer(0))
    seed_value = body.to_dtype(seed.load(body, []), torch.int64)
    return body.emit("philox", (seed_value, body.index_expr(position, torch.int64)), torch.int64)


def _keep(body, seed, index, shape, p: float) -> int:
    """The bool keep value at `index` of a tensor of `shape`."""
    return body.emit("ge", (_word(body, seed, index, shape), body.constant(keep_threshold(p), torch.int64)), torch.bool)


def _uniform(body, seed, index, shape, bits: int) -> int:
    """A float32 value uniform on {0, 2**-bits, ..., 1 - 2**-bits}: the word's top `bits` bits."""
    top = body.emit("right_shift", (_word(body, seed, index, shape), body.constant(32 - bits, torch.int64)),
                    torch.int64)
    return body.emit("mul", (body.to_dtype(top, torch.float32), body.constant(2.0 ** -bits, torch.float32)),
                     torch.float32)


def _fresh_seed(ctx, meta: torch.Tensor) -> TensorValue:
    """A seed drawn from torch's generator here, in the program's order of random ops (an extern aten.randint)."""
    return ctx.extern(aten.randint.low, (0, SEED_HIGH, []),
                      {"dtype": torch.int64, "device": meta.device, "pin_memory": False},
                      meta.new_empty((), dtype=torch.int64))


@lowering(aten.rand.default, aten.rand_like.default)
def rand(ctx, node, *args, **kwargs):
    meta = meta_of(node)
    if meta.dtype not in UNIFORM_BITS:
        raise Unsupported(f"rand in {meta.dtype}")
    seed, shape = _fresh_seed(ctx, meta), _shape(meta)
    return ctx.pointwise_indexed(meta, lambda body, index: _uniform(body, seed, index, shape, UNIFORM_BITS[meta.dtype]))


@lowering(aten.bernoulli.p)
def bernoulli(ctx, node, x, p=0.5, **kwargs):
    meta = meta_of(node)
    if kwargs.get("generator") is not None or not meta.dtype.is_floating_point or not isinstance(p, (int, float)):
        raise Unsupported("bernoulli with a generator, of integers, or with a symbolic p")
    seed, shape = _fresh_seed(ctx, meta), _shape(meta)

    def draw(body, index):
        below = body.emit("lt", (_uniform(body, seed, index, shape, 24), body.constant(float(p), torch.float32)),
                          torch.bool)
        return body.to_dtype(below, meta.dtype)

    return ctx.pointwise_indexed(meta, draw)


def _seed(seed) -> TensorValue:
    if not isinstance(seed, TensorValue) or seed.ndim != 0:
        raise Unsupported("a dropout seed that is not a 0-d tensor")
    return seed


def _shape(meta: torch.Tensor) -> list:
    return [_torch.sym_expr(size) for size in meta.shape]


@lowering(torch.ops.kiln.philox_keep.default)
def philox_keep(ctx, node, seed, size, p):
    seed, meta = _seed(seed), meta_of(node)
    shape = _shape(meta)
    return ctx.pointwise_indexed(meta, lambda body, index: _keep(body, seed, index, shape, p))


@lowering(torch.ops.kiln.philox_dropout.default)
def philox_dropout(ctx, node, x, seed, p):
    """(x * keep * 1/(1-p), keep), the product as eager's dropout computes it on x's device: in float32
    for fp16/bf16 with the scale in float32 (CUDA), or with the scale rounded to x's dtype (the CPU)."""
    seed = _seed(seed)
    result_meta, mask_meta = node.meta["val"]
    shape = _shape(result_meta)
    dtype = compute_dtype_for(result_meta.dtype)
    scale = dropout_scale(p)
    if result_meta.device.type == "cpu":
        scale = rounded_scalar(scale, result_meta.dtype)

    def result(body, index):
        kept = _keep(body, seed, index, shape, p)
        factor = body.emit("where", (kept, body.constant(scale, dtype), body.constant(0.0, dtype)), dtype)
        return body.emit("mul", (ctx.load_broadcast(body, x, index, shape, dtype), factor), dtype)

    # the forward of a training graph saves the seed, not the mask: then nothing reads it and it is not stored
    mask = ctx.pointwise_indexed(mask_meta, lambda body, index: _keep(body, seed, index, shape, p)) \
        if _read(node, 1) else None
    return ctx.pointwise_indexed(result_meta, result), mask


def _read(node, position: int) -> bool:
    """Whether anything reads result `position` of the multi-result FX node."""
    return any(user.target is operator.getitem and user.args[1] == position and user.users for user in node.users)
