"""Rules for pooling windows: max_pool2d whose indices nothing reads.

`aten.max_pool2d_with_indices` returns the maxima and where each was found; only the backward reads
the indices, so an inference graph's call reads none. ATen's kernel writes both (ResNet-18's stem on an
H100, bf16 NHWC, 64 x 64 x 112 x 112: 222 us a call, where reading the input once takes ~35 us), and as
an extern it fuses with nothing. The rule below makes the maxima one pointwise kernel over the output:
each element the maximum of its window's loads, a position outside the input masked to -inf (torch pads
with -inf, and ceil_mode's last window may hang over the edge), so the scheduler can fuse the batch norm
and ReLU before it into the loads, as it fuses any producer into a gather's loads.
"""
from __future__ import annotations

import operator

import torch

from kiln import _torch
from kiln.ir.indexing import as_expr
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


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    _check_kernel_dtypes(x)
    if not isinstance(node, torch.fx.Node) or _reads_indices(node):
        raise Unsupported("max_pool2d's indices are read (the backward): ATen's kernel computes them")
    meta = meta_of(node)[0]
    if not meta.dtype.is_floating_point or x.ndim not in (3, 4):
        raise Unsupported(f"max_pool2d of {meta.dtype}, {x.ndim} dims")
    kernel = _pair(kernel_size, None)
    strides, pads, dilations = _pair(stride, kernel), _pair(padding, 0), _pair(dilation, 1)
    if not all(isinstance(value, int) for value in (*kernel, *strides, *pads, *dilations)):
        raise Unsupported("symbolic pooling parameters")
    if kernel[0] * kernel[1] > MAX_WINDOW:
        raise Unsupported(f"a {kernel[0]} x {kernel[1]} window")
    dtype = compute_dtype_for(meta.dtype)
    height, width = as_expr(x.shape[-2]), as_expr(x.shape[-1])

    def compute(body, out_index):
        result = None
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                source = list(out_index)
                source[-2] = out_index[-2] * strides[0] - pads[0] + i * dilations[0]
                source[-1] = out_index[-1] * strides[1] - pads[1] + j * dilations[1]
                inside = body.emit("logical_and", (_in_range(body, source[-2], 0, height),
                                                   _in_range(body, source[-1], 0, width)), torch.bool)
                loaded = body.to_dtype(x.load(body, source, mask=inside), dtype)
                value = body.emit("where", (inside, loaded, body.constant(float("-inf"), dtype)), dtype)
                result = value if result is None else body.emit("maximum", (result, value), dtype)
        return result

    return ctx.pointwise_indexed(meta, compute), None
