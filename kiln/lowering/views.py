"""View rules: every view is an index remap (a ViewValue), never a copy.

view/reshape, permute, transpose, expand, slice, split, select, squeeze, unsqueeze, alias and
as_strided (over a contiguous buffer).
"""
from __future__ import annotations

import sympy

from kiln import _torch
from kiln.ir.indexing import Mod, as_expr, contiguous_strides, product, unravel
from kiln.lowering.context import BufferValue, Unsupported, ViewValue, meta_of
from kiln.lowering.registry import lowering

aten = _torch.aten


def _shape(node) -> list:
    return [_torch.sym_expr(size) for size in meta_of(node).shape]


def _static_less(a, b) -> bool:
    difference = sympy.expand(b - a)
    if difference.is_Integer:
        return difference > 0
    if difference.is_positive:
        return True
    if (-difference).is_nonnegative:
        return False
    raise Unsupported(f"cannot order sizes {a} and {b}")


def reshape_remap(old: list, new: list):
    """Index map for a row-major reshape, grouping dims whose products match."""
    old_big = [dim for dim, size in enumerate(old) if size != 1]
    new_big = [dim for dim, size in enumerate(new) if size != 1]
    groups = []
    i = j = 0
    while i < len(old_big) and j < len(new_big):
        old_group, new_group = [old_big[i]], [new_big[j]]
        i, j = i + 1, j + 1
        while sympy.expand(product(old[d] for d in old_group) - product(new[d] for d in new_group)) != 0:
            if _static_less(product(old[d] for d in old_group), product(new[d] for d in new_group)):
                if i >= len(old_big):
                    raise Unsupported("reshape sizes do not match")
                old_group.append(old_big[i])
                i += 1
            else:
                if j >= len(new_big):
                    raise Unsupported("reshape sizes do not match")
                new_group.append(new_big[j])
                j += 1
        groups.append((old_group, new_group))

    def remap(index):
        result = [sympy.Integer(0)] * len(old)
        for old_group, new_group in groups:
            new_sizes = [new[d] for d in new_group]
            flat = sum((index[d] * stride for d, stride in zip(new_group, contiguous_strides(new_sizes))),
                       sympy.Integer(0))
            for d, value in zip(old_group, unravel(flat, [old[d] for d in old_group])):
                result[d] = value
        return result

    return remap


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def view(ctx, node, x, size):
    new = _shape(node)
    return ViewValue(x, new, reshape_remap(list(x.shape), new))


@lowering(aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default)
def alias(ctx, node, x):
    return x


@lowering(aten.permute.default)
def permute(ctx, node, x, dims):
    dims = [dim % x.ndim for dim in dims]

    def remap(index):
        result = [None] * len(dims)
        for position, dim in enumerate(dims):
            result[dim] = index[position]
        return result

    return ViewValue(x, [x.shape[dim] for dim in dims], remap)


@lowering(aten.transpose.int)
def transpose(ctx, node, x, dim0, dim1):
    dims = list(range(x.ndim))
    if x.ndim:
        dims[dim0 % x.ndim], dims[dim1 % x.ndim] = dims[dim1 % x.ndim], dims[dim0 % x.ndim]
    return permute(ctx, node, x, dims)


@lowering(aten.t.default)
def t(ctx, node, x):
    return transpose(ctx, node, x, 0, 1) if x.ndim == 2 else x


@lowering(aten.expand.default)
def expand(ctx, node, x, size, implicit=False):
    new = _shape(node)
    leading = len(new) - x.ndim

    def remap(index):
        return [sympy.Integer(0) if old == 1 and new[leading + d] != 1 else index[leading + d]
                for d, old in enumerate(x.shape)]

    return ViewValue(x, new, remap)


@lowering(aten.slice.Tensor)
def slice_(ctx, node, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    new = _shape(node)
    start = _normalize_start(start, x.shape[dim])
    return _slice_view(x, new, dim, start, step)


@lowering(aten.split_with_sizes.default, aten.split.Tensor)
def split(ctx, node, x, split_sizes, dim=0):
    """split / split_with_sizes: one slice view per part."""
    dim = dim % x.ndim
    parts = [list(meta.shape) for meta in meta_of(node)]
    views, start = [], sympy.Integer(0)
    for shape in parts:
        length = _torch.sym_expr(shape[dim])
        views.append(_slice_view(x, [_torch.sym_expr(size) for size in shape], dim, start, 1))
        start = start + length
    return views


def _slice_view(x, new, dim, start, step):
    def remap(index):
        result = list(index)
        result[dim] = start + step * index[dim]
        return result

    return ViewValue(x, new, remap)


def _normalize_start(start, size):
    if start is None:
        return sympy.Integer(0)
    start = as_expr(start)
    if start.is_Integer and size.is_Integer:
        value = int(start)
        if value < 0:
            value += int(size)
        return sympy.Integer(min(max(value, 0), int(size)))
    if start.is_Integer and int(start) >= 0:
        return sympy.Min(start, size)
    raise Unsupported("symbolic negative slice start")


def normalize_index(index, size):
    """The position in [0, size) that `select`'s index names: eager's rule, a negative one counts from the
    end. A symbolic index whose sign sympy cannot decide (`-(s0 // 2)`: the ShapeEnv guarded its sign, the
    graph keeps the expression) is taken as (index + size) mod size, the same position for either sign."""
    position = as_expr(index)
    if position.is_Integer:
        return position + size if int(position) < 0 else position
    if position.is_nonnegative:
        return position
    if position.is_negative:
        return position + size
    return Mod(position + size, size)


@lowering(aten.select.int)
def select(ctx, node, x, dim, index):
    dim = dim % x.ndim
    position = normalize_index(index, x.shape[dim])

    def remap(idx):
        return list(idx[:dim]) + [position] + list(idx[dim:])

    return ViewValue(x, _shape(node), remap)


@lowering(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, node, x, dim=None):
    if dim is None:
        dims = [d for d, size in enumerate(x.shape) if size == 1]
    else:
        dims = [d % max(x.ndim, 1) for d in ([dim] if isinstance(dim, int) else dim)]
        dims = [d for d in dims if x.ndim and x.shape[d] == 1]

    def remap(index):
        values = iter(index)
        return [sympy.Integer(0) if d in dims else next(values) for d in range(x.ndim)]

    return ViewValue(x, _shape(node), remap)


@lowering(aten.unsqueeze.default)
def unsqueeze(ctx, node, x, dim):
    dim = dim % (x.ndim + 1)
    return ViewValue(x, _shape(node), lambda index: list(index[:dim]) + list(index[dim + 1:]))


@lowering(aten.as_strided.default)
def as_strided(ctx, node, x, size, stride, storage_offset=None):
    if not isinstance(x, BufferValue):
        raise Unsupported("as_strided of a view")
    if node.args[0].op == "placeholder":
        # storage_offset counts from the input's storage, and a kernel is given the input's first element (the
        # same graph serves `base[1:]` and `base[3:]`): ATen's as_strided, on the real input, knows where that is
        raise Unsupported("as_strided of a graph input")
    layout = x.buffer.layout
    if list(layout.stride) != contiguous_strides(layout.size) or layout.offset != 0:
        raise Unsupported("as_strided of a non-contiguous buffer")
    strides = [as_expr(value) for value in stride]
    offset = as_expr(storage_offset or 0)

    def remap(index):
        flat = offset + sum((i * s for i, s in zip(index, strides)), sympy.Integer(0))
        return unravel(flat, list(layout.size)) if layout.size else []

    return ViewValue(x, _shape(node), remap)
