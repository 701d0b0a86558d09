"""Rules for pooling windows: max_pool2d whose indices nothing reads.

`aten.max_pool2d_with_indices` returns the maxima and where each was found; only the backward reads
the indices, so an inference graph's call reads none. ATen's kernel writes both (ResNet-18's stem on an
H100, bf16 NHWC, 64 x 64 x 112 x 112: 222 us a call, where reading the input once takes ~35 us), and as
an extern it fuses with nothing. The rule below makes the maxima one pointwise kernel over the output:
each element the maximum of its window's loads, a position outside the input masked to -inf (torch pads
with -inf, and ceil_mode's last window may hang over the edge), so the scheduler can fuse the batch norm
and ReLU before it into the loads, as it fuses any producer into a gather's loads.

In training the backward reads the indices: a second pointwise kernel over the output computes each window's
position the way ATen's kernels pick it (the first in-bounds element, then any later one greater, or NaN: a
window's last NaN), as h * W + w in its input plane. `max_pool2d_with_indices_backward` is a gather too: each
input element sums the gradients of the windows that cover it and chose it, at most ceil(k / s) per dim
(ResNet's 3 x 3, stride 2 stem pool: 4), where ATen's CUDA kernel ran 2.29 ms of a ResNet-50 training step
at batch 64 on an H100 (2026-12-07_profile-train-resnet50-ded8935).
"""
from __future__ import annotations

import operator

import torch

from kiln import _torch
from kiln.ir.indexing import FloorDiv, Mod, as_expr
from kiln.lowering.context import Unsupported, compute_dtype_for, meta_of
from kiln.lowering.indexing import _check_kernel_dtypes, _in_range
from kiln.lowering.registry import lowering

aten = _torch.aten

# Windows of more elements than this stay ATen's: each element is a load in the kernel's body.
MAX_WINDOW = 64


def _pair(value, default) -> tuple:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, (list, tuple)):
        return (value[0], value[0]) if len(value) == 1 else tuple(value)
    return value, value


def _reads_indices(node: torch.fx.Node) -> bool:
    """Whether anything reads the call's second result (the indices)."""
    return any(user.op != "call_function" or user.target is not operator.getitem or user.args[1] != 0
               for user in node.users)


def _window(kernel_size, stride, padding, dilation) -> tuple:
    """(kernel, strides, pads, dilations), each an (h, w) pair of ints; Unsupported where symbolic or too big."""
    kernel = _pair(kernel_size, None)
    strides, pads, dilations = _pair(stride, kernel), _pair(padding, 0), _pair(dilation, 1)
    if not all(isinstance(value, int) for value in (*kernel, *strides, *pads, *dilations)):
        raise Unsupported("symbolic pooling parameters")
    if kernel[0] * kernel[1] > MAX_WINDOW:
        raise Unsupported(f"a {kernel[0]} x {kernel[1]} window")
    return kernel, strides, pads, dilations


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    _check_kernel_dtypes(x)
    if not isinstance(node, torch.fx.Node):
        raise Unsupported("max_pool2d outside a graph node")
    meta, index_meta = meta_of(node)
    if not meta.dtype.is_floating_point or x.ndim not in (3, 4):
        raise Unsupported(f"max_pool2d of {meta.dtype}, {x.ndim} dims")
    kernel, strides, pads, dilations = _window(kernel_size, stride, padding, dilation)
    dtype = compute_dtype_for(meta.dtype)
    height, width = as_expr(x.shape[-2]), as_expr(x.shape[-1])

    def window(body, out_index):
        """(inside, row, column, value) of each window position, in ATen's order (row-major)."""
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                source = list(out_index)
                source[-2] = out_index[-2] * strides[0] - pads[0] + i * dilations[0]
                source[-1] = out_index[-1] * strides[1] - pads[1] + j * dilations[1]
                inside = body.emit("logical_and", (_in_range(body, source[-2], 0, height),
                                                   _in_range(body, source[-1], 0, width)), torch.bool)
                loaded = body.to_dtype(x.load(body, source, mask=inside), dtype)
                yield inside, source[-2], source[-1], loaded

    def maxima(body, out_index):
        result = None
        for inside, _, _, loaded in window(body, out_index):
            value = body.emit("where", (inside, loaded, body.constant(float("-inf"), dtype)), dtype)
            result = value if result is None else body.emit("maximum", (result, value), dtype)
        return result

    def positions(body, out_index):
        best = body.constant(float("-inf"), dtype)
        found = body.constant(False, torch.bool)
        chosen = body.constant(0, torch.int64)
        for inside, row, column, loaded in window(body, out_index):
            better = body.emit("logical_or", (body.emit("gt", (loaded, best), torch.bool),
                                              body.emit("isnan", (loaded,), torch.bool)), torch.bool)
            first = body.emit("logical_not", (found,), torch.bool)
            take = body.emit("logical_and", (inside, body.emit("logical_or", (first, better), torch.bool)), torch.bool)
            best = body.emit("where", (take, loaded, best), dtype)
            chosen = body.emit("where", (take, body.index_expr(row * width + column, torch.int64), chosen), torch.int64)
            found = body.emit("logical_or", (found, inside), torch.bool)
        return chosen

    values = ctx.pointwise_indexed(meta, maxima)
    return values, (ctx.pointwise_indexed(index_meta, positions) if _reads_indices(node) else None)


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(ctx, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each input element's gradient: the sum over the windows that cover it and chose it (`indices`)."""
    _check_kernel_dtypes(grad, x)
    meta = meta_of(node)
    if not meta.dtype.is_floating_point or x.ndim not in (3, 4) or grad.ndim != x.ndim:
        raise Unsupported(f"max_pool2d's backward of {meta.dtype}, {x.ndim} dims")
    kernel, strides, pads, dilations = _window(kernel_size, stride, padding, dilation)
    dtype = compute_dtype_for(meta.dtype)
    width = as_expr(x.shape[-1])
    out_sizes = (as_expr(grad.shape[-2]), as_expr(grad.shape[-1]))

    def window_start(body, position, offset, dim):
        """(valid, output index) of the window whose element `offset` (times the dilation) is `position`:
        (position + pad - offset * dilation) / stride where that is a whole number in range. The numerator
        is shifted by a multiple of the stride to stay nonnegative, as FloorDiv and Mod want."""
        step, shift = strides[dim], -(-(kernel[dim] - 1) * dilations[dim] // strides[dim]) * strides[dim]
        numerator = position + pads[dim] - offset * dilations[dim] + shift
        start = FloorDiv(numerator, step) - shift // step
        whole = body.emit("eq", (body.index_expr(Mod(numerator, step), torch.int64),
                                 body.constant(0, torch.int64)), torch.bool)
        return body.emit("logical_and", (whole, _in_range(body, start, 0, out_sizes[dim])), torch.bool), start

    def compute(body, in_index):
        here = body.index_expr(in_index[-2] * width + in_index[-1], torch.int64)
        total = body.constant(0.0, dtype)
        for i in range(kernel[0]):
            row_valid, row = window_start(body, in_index[-2], i, 0)
            for j in range(kernel[1]):
                column_valid, column = window_start(body, in_index[-1], j, 1)
                valid = body.emit("logical_and", (row_valid, column_valid), torch.bool)
                out_index = [*in_index[:-2], row, column]
                chosen = body.emit("eq", (indices.load(body, out_index, mask=valid), here), torch.bool)
                hit = body.emit("logical_and", (valid, chosen), torch.bool)
                value = body.to_dtype(grad.load(body, out_index, mask=hit), dtype)
                total = body.emit("add", (total, body.emit("where", (hit, value, body.constant(0.0, dtype)), dtype)),
                                  dtype)
        return total

    return ctx.pointwise_indexed(meta, compute)
