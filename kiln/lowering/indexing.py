"""Rules that read their inputs at computed positions: gather, index_select, index
(advanced indexing), embedding, cat and constant padding.

Gathers load an index tensor, turn it into a checked position (`_gathered_position`: eager's
rules, once for every gather; docs/design/indexing.md), then use that value inside another
load's index (an `ind<k>` symbol). cat and padding use masked loads so no lane reads out of
bounds.
"""
from __future__ import annotations

import sympy
import torch

from kiln import _torch
from kiln.ir.indexing import as_expr
from kiln.lowering.context import TensorValue, Unsupported, ViewValue, check_fill_value, compute_dtype_for, meta_of
from kiln.lowering.registry import lowering

aten = _torch.aten


def _gathered_position(body, value, size, *, negative_wraps: bool):
    """The position an index tensor's element selects along a dim of `size`, as an `ind<k>` symbol.

    Eager's rules, one place for every gather: advanced indexing (aten.index) takes a value in
    [-size, size), negative ones counting from the end (x[-1] is the last element); gather,
    index_select and embedding take [0, size) only (a negative index raises in eager). Any other
    value is an error: one `check_index` op, which every backend renders (the kernel reports it,
    the host raises IndexError, and no lane reads outside the tensor meanwhile). The size is the
    logical size of the indexed dim, so no view under the gather (expand, reshape, slice) can
    turn a bad index into a valid address.
    """
    size = as_expr(size)
    if size == 0:
        raise Unsupported("a gather from an empty dim (every index is out of range: eager raises)")
    position = body.to_dtype(value, torch.int64)
    if negative_wraps:
        size_value = body.index_expr(size, torch.int64)
        negative = body.emit("lt", (position, body.constant(0, torch.int64)), torch.bool)
        wrapped = body.emit("add", (position, size_value), torch.int64)
        position = body.emit("where", (negative, wrapped, position), torch.int64)
    return body.indirect(body.check_index(position, size))


def _check_kernel_dtypes(*values):
    from kiln.lowering.context import KERNEL_DTYPES

    for value in values:
        if isinstance(value, TensorValue) and value.dtype not in KERNEL_DTYPES:
            raise Unsupported(f"dtype {value.dtype}")


def as_nonempty_dims(value):
    """`value` as gather and scatter see their operands: a 0-d tensor counts as a 1-d one of one element
    (ATen's `ensure_nonempty_dim`), so `gather(x, 0, i)` with x 1-d and i 0-d reads x[i], and a 0-d source
    scatters like a 1-element one. Other values are returned as they are."""
    if isinstance(value, TensorValue) and value.ndim == 0:
        return ViewValue(value, [sympy.Integer(1)], lambda index: [])
    return value


def nonempty_index(out_index, ndim: int) -> list:
    """An output index of a tensor of rank `ndim`, as an index into its `as_nonempty_dims` view."""
    return list(out_index) if ndim else [sympy.Integer(0)]


@lowering(aten.gather.default)
def gather(ctx, node, x, dim, index, sparse_grad=False):
    _check_kernel_dtypes(x)
    dim = dim % max(x.ndim, 1)
    source_value, index_value = as_nonempty_dims(x), as_nonempty_dims(index)
    if index_value.ndim != source_value.ndim:  # torch allows it for an empty index only: nothing to read
        meta = meta_of(node)
        return ctx.pointwise([0], lambda body, zero: zero, meta=meta, compute_dtype=compute_dtype_for(meta.dtype))

    def compute(body, out_index):
        out_index = nonempty_index(out_index, index.ndim)  # the result has the index's shape
        position = _gathered_position(body, index_value.load(body, out_index), source_value.shape[dim],
                                      negative_wraps=False)
        source = list(out_index)
        source[dim] = position
        return source_value.load(body, source)

    return ctx.pointwise_indexed(meta_of(node), compute)


@lowering(aten.index_select.default)
def index_select(ctx, node, x, dim, index):
    _check_kernel_dtypes(x)
    if x.ndim == 0:
        raise Unsupported("index_select of a scalar")
    dim = dim % x.ndim

    def compute(body, out_index):
        position = _gathered_position(body, index.load(body, [out_index[dim]] if index.ndim else []), x.shape[dim],
                                      negative_wraps=False)
        source = list(out_index)
        source[dim] = position
        return x.load(body, source)

    return ctx.pointwise_indexed(meta_of(node), compute)


@lowering(aten.index.Tensor)
def index(ctx, node, x, indices):
    _check_kernel_dtypes(x)
    meta = meta_of(node)
    tensors = [(dim, value) for dim, value in enumerate(indices) if value is not None]
    if any(value.dtype in (torch.bool, torch.uint8) for _, value in tensors):
        raise Unsupported("boolean mask indexing")
    indexed_dims = [dim for dim, _ in tensors]
    broadcast_rank = max(value.ndim for _, value in tensors)
    adjacent = indexed_dims == list(range(indexed_dims[0], indexed_dims[-1] + 1))
    first = indexed_dims[0] if adjacent else 0
    out_rank = len(meta.shape)
    broadcast_shape = [_torch.sym_expr(size) for size in meta.shape[first:first + broadcast_rank]]

    def compute(body, out_index):
        broadcast_index = out_index[first:first + broadcast_rank]
        remaining = list(out_index[:first]) + list(out_index[first + broadcast_rank:])
        source, rest = [], iter(remaining)
        for dim in range(x.ndim):
            if dim in indexed_dims:
                value = dict(tensors)[dim]
                value_index = _broadcast_index(broadcast_index, broadcast_shape, value.shape)
                source.append(_gathered_position(body, value.load(body, value_index), x.shape[dim],
                                                 negative_wraps=True))
            else:
                source.append(next(rest))
        return x.load(body, source)

    assert out_rank == x.ndim - len(indexed_dims) + broadcast_rank
    return ctx.pointwise_indexed(meta, compute)


@lowering(aten.embedding.default)
def embedding(ctx, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """out[..., j] = weight[indices[...], j]; kept whole (not decomposed to aten.index, which would
    accept negative indices that eager's embedding rejects). padding_idx only changes the backward."""
    _check_kernel_dtypes(weight)
    if weight.ndim != 2:
        raise Unsupported("embedding of a weight that is not 2-d")

    def compute(body, out_index):
        row = _gathered_position(body, indices.load(body, out_index[:-1]), weight.shape[0], negative_wraps=False)
        return weight.load(body, [row, out_index[-1]])

    return ctx.pointwise_indexed(meta_of(node), compute)


def _broadcast_index(index, shape, value_shape):
    leading = len(shape) - len(value_shape)
    return [sympy.Integer(0) if size == 1 and shape[leading + d] != 1 else index[leading + d]
            for d, size in enumerate(value_shape)]


def _in_range(body, position, low, high):
    """low <= position < high, as a bool value."""
    value = body.index_expr(position, torch.int64)
    above = body.emit("ge", (value, body.index_expr(as_expr(low), torch.int64)), torch.bool)
    below = body.emit("lt", (value, body.index_expr(as_expr(high), torch.int64)), torch.bool)
    return body.emit("logical_and", (above, below), torch.bool)


@lowering(aten.cat.default)
def cat(ctx, node, tensors, dim=0):
    meta = meta_of(node)
    tensors = [tensor for tensor in tensors if not (tensor.ndim == 1 and tensor.shape[0] == 0)]
    _check_kernel_dtypes(*tensors)
    if not tensors or any(tensor.device != meta.device for tensor in tensors):
        raise Unsupported("cat of empty or cross-device tensors")
    dim = dim % tensors[0].ndim
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, out_index):
        result, offset = None, sympy.Integer(0)
        pieces = []
        for tensor in tensors:
            end = offset + tensor.shape[dim]
            inside = _in_range(body, out_index[dim], offset, end)
            source = list(out_index)
            source[dim] = out_index[dim] - offset
            pieces.append((inside, body.to_dtype(tensor.load(body, source, mask=inside), dtype)))
            offset = end
        result = pieces[-1][1]
        for inside, value in reversed(pieces[:-1]):
            result = body.emit("where", (inside, value, result), dtype)
        return result

    return ctx.pointwise_indexed(meta, compute)


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, node, x, pad, value=0):
    _check_kernel_dtypes(x)
    meta = meta_of(node)
    pads = [(as_expr(pad[2 * k]), as_expr(pad[2 * k + 1])) for k in range(len(pad) // 2)]
    if any(not (low.is_Integer and low >= 0 and high.is_Integer and high >= 0) for low, high in pads):
        raise Unsupported("negative or symbolic padding")
    check_fill_value(value, meta.dtype)
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, out_index):
        inside, source = None, list(out_index)
        for k, (low, _high) in enumerate(pads):
            dim = x.ndim - 1 - k
            source[dim] = out_index[dim] - low
            in_dim = _in_range(body, out_index[dim], low, low + x.shape[dim])
            inside = in_dim if inside is None else body.emit("logical_and", (inside, in_dim), torch.bool)
        if inside is None:
            return body.to_dtype(x.load(body, source), dtype)
        loaded = body.to_dtype(x.load(body, source, mask=inside), dtype)
        return body.emit("where", (inside, loaded, body.constant(value, dtype)), dtype)

    return ctx.pointwise_indexed(meta, compute)
