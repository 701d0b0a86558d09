"""Dropout drawn in kernels (kiln/aot/random.py, kiln/philox.py): the keep mask `philox(seed, i) >= threshold`, i the
element's row-major position in the tensor's shape, whatever its layout, so that the forward and the
backward, whose kernels walk different layouts, draw the same mask. Each rule is a pointwise node, fused
with its producers and consumers like any other."""
from __future__ import annotations

import operator

import sympy
import torch

from kiln import _torch
from kiln.philox import dropout_scale, keep_threshold
from kiln.ir.indexing import contiguous_strides
from kiln.lowering.context import TensorValue, Unsupported, compute_dtype_for, meta_of, rounded_scalar
from kiln.lowering.registry import lowering


def _keep(body, seed, index, shape, p: float) -> int:
    """The bool keep value at `index` of a tensor of `shape`."""
    position = sum((variable * stride for variable, stride in zip(index, contiguous_strides(shape))),
                   sympy.Integer(0))
    seed_value = body.to_dtype(seed.load(body, []), torch.int64)
    bits = body.emit("philox", (seed_value, body.index_expr(position, torch.int64)), torch.int64)
    return body.emit("ge", (bits, body.constant(keep_threshold(p), torch.int64)), torch.bool)


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
