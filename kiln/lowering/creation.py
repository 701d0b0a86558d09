"""Tensors made from nothing: full/zeros/ones/empty, scalar_tensor, arange, eye, fill."""
from __future__ import annotations

import torch

from kiln import _torch
from kiln.ir.indexing import as_expr
from kiln.lowering.context import Unsupported, check_fill_value, compute_dtype_for, meta_of
from kiln.lowering.registry import lowering

aten = _torch.aten


def _filled(ctx, node, value, *, half_floats_checked: bool = True):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)
    if isinstance(value, complex):
        raise Unsupported("complex fill value")
    check_fill_value(value, meta.dtype, half_floats_checked=half_floats_checked)
    return ctx.pointwise([value], lambda body, v: v, meta=meta, compute_dtype=dtype)


@lowering(aten.full.default, aten.full_like.default)
def full(ctx, node, size_or_like, fill_value, **_):
    return _filled(ctx, node, fill_value)


@lowering(aten.scalar_tensor.default)
def scalar_tensor(ctx, node, value, **_):
    return _filled(ctx, node, value, half_floats_checked=False)  # eager's scalar_tensor does not check them


@lowering(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format, aten.empty_like.default,
          aten.new_zeros.default, aten.new_empty.default, aten.empty_strided.default)
def zeros(ctx, node, *args, **_):
    return _filled(ctx, node, 0)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, node, *args, **_):
    return _filled(ctx, node, 1)


@lowering(aten.fill.Scalar)
def fill(ctx, node, x, value):
    return _filled(ctx, node, value)


@lowering(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, node, *args, **_):
    meta = meta_of(node)
    numbers = [arg for arg in args if not isinstance(arg, (torch.dtype, torch.device, torch.layout))]
    start, step = (0, 1)
    if node.target is aten.arange.start_step:
        start, step = numbers[0], numbers[2] if len(numbers) > 2 else 1
    elif node.target is aten.arange.start:
        start = numbers[0]
    dtype = torch.float64 if meta.dtype.is_floating_point else torch.int64

    def compute(body, index):
        position = body.to_dtype(body.index_expr(index[0], torch.int64), dtype)
        scaled = body.emit("mul", (position, _scalar(body, step, dtype)), dtype)
        return body.emit("add", (scaled, _scalar(body, start, dtype)), dtype)

    return ctx.pointwise_indexed(meta, compute)


@lowering(aten.eye.default, aten.eye.m)
def eye(ctx, node, *args, **_):
    """1 where row == column: compared as int64 index values, then converted to the dtype."""
    meta = meta_of(node)

    def compute(body, index):
        row, column = (body.index_expr(position, torch.int64) for position in index)
        return body.emit("eq", (row, column), torch.bool)

    return ctx.pointwise_indexed(meta, compute)


def _scalar(body, value, dtype):
    expr = as_expr(value) if not isinstance(value, float) else None
    if expr is not None and not expr.is_Number:
        return body.to_dtype(body.index_expr(expr, torch.int64), dtype)
    return body.constant(value if isinstance(value, float) else int(value), dtype)
