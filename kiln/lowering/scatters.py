"""Rules that write a source into a copy of a base: slice_scatter, select_scatter, and scatter where
each row has one index.

Each is a pointwise choice between the base and the source, decided by the output element's
position (and, for scatter, by the index tensor's value at it), so it fuses like any pointwise op:
the backward of a slice (`slice_scatter` into zeros, then added to other gradients) becomes one
kernel instead of an ATen copy of the whole base and a strided copy into it. The source loads are
masked, so no lane reads outside it.

A scatter with several indices per row (index.shape[dim] > 1) stays an extern: two of its indices
can name the same element, and which write wins is eager's kernel's choice.
"""
from __future__ import annotations

import sympy
import torch

from kiln import _torch
from kiln.ir.indexing import FloorDiv, Mod, as_expr
from kiln.lowering.context import Unsupported, check_fill_value, compute_dtype_for, meta_of
from kiln.lowering.indexing import _check_kernel_dtypes, _in_range, as_nonempty_dims, nonempty_index
from kiln.lowering.registry import lowering
from kiln.lowering.views import _normalize_start, normalize_index

aten = _torch.aten


def _choose(body, inside, source_value, base_value, dtype):
    """where(inside, source, base), both in the compute dtype."""
    return body.emit("where", (inside, body.to_dtype(source_value, dtype), body.to_dtype(base_value, dtype)), dtype)


def _and(body, a, b):
    if a is None:
        return b
    return body.emit("logical_and", (a, b), torch.bool)


@lowering(aten.slice_scatter.default)
def slice_scatter(ctx, node, base, src, dim=0, start=None, end=None, step=1):
    """out = base, with out[..., start:end:step, ...] = src. `end` is implied by src's length."""
    _check_kernel_dtypes(base, src)
    meta = meta_of(node)
    dim = dim % max(base.ndim, 1)
    start = _normalize_start(start, base.shape[dim])
    step = as_expr(step)
    if not (step.is_Integer and int(step) >= 1):
        raise Unsupported("slice_scatter with a symbolic or nonpositive step")
    if int(step) > 1 and not start.is_Integer:
        raise Unsupported("slice_scatter with a step and a symbolic start")
    length = src.shape[dim]
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, out_index):
        position = out_index[dim]
        # the last element written is start + step * (length - 1)
        inside = _in_range(body, position, start, start + step * (length - 1) + 1)
        source = list(out_index)
        if step == 1:
            source[dim] = position - start
        else:
            # on the slice's lattice: position ≡ start (mod step); Mod and FloorDiv take nonnegative
            # arguments, which both are wherever the mask lets the load through
            phase = body.emit("eq", (body.index_expr(Mod(position, step)),
                                     body.index_expr(sympy.Integer(int(start) % int(step)))), torch.bool)
            inside = _and(body, inside, phase)
            source[dim] = FloorDiv(position - start, step)
        return _choose(body, inside, src.load(body, source, mask=inside), base.load(body, out_index), dtype)

    return ctx.pointwise_indexed(meta, compute)


@lowering(aten.select_scatter.default)
def select_scatter(ctx, node, base, src, dim, index):
    """out = base, with out.select(dim, index) = src."""
    _check_kernel_dtypes(base, src)
    meta = meta_of(node)
    dim = dim % base.ndim
    position = normalize_index(index, base.shape[dim])
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, out_index):
        here = body.emit("eq", (body.index_expr(out_index[dim]), body.index_expr(position)), torch.bool)
        source = list(out_index[:dim]) + list(out_index[dim + 1:])
        return _choose(body, here, src.load(body, source, mask=here), base.load(body, out_index), dtype)

    return ctx.pointwise_indexed(meta, compute)


@lowering(aten.scatter.value, aten.scatter.src)
def scatter(ctx, node, base, dim, index, value):
    """out = base, with out[..., index[..., 0, ...], ...] = value (a scalar, or src[..., 0, ...]) for
    every position the index tensor covers: one index per row along `dim`. A 0-d base, index or source
    counts as 1-d (`as_nonempty_dims`), as in eager."""
    _check_kernel_dtypes(base)
    meta = meta_of(node)
    tensor_source = not isinstance(value, (int, float, bool))
    if tensor_source:
        _check_kernel_dtypes(value)
        value = as_nonempty_dims(value)
    else:
        check_fill_value(value, meta.dtype)
    base_rank = base.ndim
    base, index = as_nonempty_dims(base), as_nonempty_dims(index)
    if index.ndim != base.ndim or (tensor_source and value.ndim != base.ndim):
        raise Unsupported("scatter with an index or source of another rank")
    dim = dim % base.ndim
    if index.shape[dim] != 1:
        raise Unsupported("scatter with several indices per row (which duplicate write wins is eager's choice)")
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, out_index):
        out_index = nonempty_index(out_index, base_rank)
        covered = None  # the positions the index tensor has a row for (it may be smaller than base)
        for d in range(base.ndim):
            if d != dim and index.shape[d] != base.shape[d]:
                covered = _and(body, covered, _in_range(body, out_index[d], 0, index.shape[d]))
        row = list(out_index)
        row[dim] = sympy.Integer(0)
        # eager's rule for a scatter index: [0, size), else an error (the `check_index` op)
        target = body.check_index(body.to_dtype(index.load(body, row, mask=covered), torch.int64), base.shape[dim])
        here = body.emit("eq", (body.index_expr(out_index[dim]), target), torch.bool)
        here = _and(body, covered, here)
        if tensor_source:
            written = value.load(body, row, mask=here)
        else:
            written = body.constant(value, dtype)
        return _choose(body, here, written, base.load(body, out_index), dtype)

    return ctx.pointwise_indexed(meta, compute)
