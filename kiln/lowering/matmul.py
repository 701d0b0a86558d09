"""Matrix products: externs (cuBLAS beats generated code), laid out for cuBLAS's fast paths.

A product whose output rows are not a multiple of 16 bytes long (GPT-2's LM head:
50257 columns) makes cuBLAS fall back to slow unaligned kernels (measured on an
H200: 3.3 ms instead of 0.45 ms for [4096, 768] x [768, 50257] in bf16). kiln
allocates such an output with its row stride rounded up and calls the op's `out=`
variant, which writes rows at that stride: the same values, an aligned layout.
Consumers read buffers through their strides, so nothing else changes.

On the CPU, a large product's output is also allocated by kiln and passed as `out=`,
so that it gets huge pages (kiln/runtime/host_memory.py) instead of a page fault per
4 KiB on its first write.
"""
from __future__ import annotations

import sympy

from kiln import _torch
from kiln.config import config
from kiln.ir import Layout
from kiln.lowering.context import Unsupported, meta_of
from kiln.lowering.registry import lowering

aten = _torch.aten

ROW_ALIGNMENT_BYTES = 32
MIN_PADDED_ELEMENTS = 1 << 16  # small products are launch-bound: padding would not pay


def padded_layout(meta) -> Layout | None:
    """A row-padded layout for a 2-d product's output, or None when it is aligned already."""
    if meta.dim() != 2 or not meta.is_contiguous() or not meta.dtype.is_floating_point:
        return None
    rows, columns = (_torch.sym_expr(size) for size in meta.shape)
    if not (rows.is_Integer and columns.is_Integer) or int(rows) * int(columns) < MIN_PADDED_ELEMENTS:
        return None
    multiple = max(1, ROW_ALIGNMENT_BYTES // meta.element_size())
    if int(columns) % multiple == 0 or int(rows) == 1:
        return None
    stride = -(-int(columns) // multiple) * multiple
    return Layout((rows, columns), (sympy.Integer(stride), sympy.Integer(1)))


def output_layout(meta) -> Layout:
    """The layout kiln allocates a product's output with; Unsupported when ATen's own is as good."""
    layout = padded_layout(meta)
    if layout is not None:
        return layout
    if meta.device.type == "cpu" and meta.is_contiguous() and 0 < config.cpu_huge_pages_min_bytes \
            <= meta.numel() * meta.element_size():
        sizes = [_torch.sym_expr(size) for size in meta.shape]
        if all(size.is_Integer for size in sizes):
            return Layout(tuple(sizes), tuple(sympy.Integer(stride) for stride in meta.stride()))
    raise Unsupported("an aligned product that ATen allocates as well: the plain extern")


@lowering(aten.mm.default)
def mm(ctx, node, a, b):
    layout = output_layout(meta_of(node))
    return ctx.extern_into(aten.mm.out, (a, b), {}, [layout], meta_of(node))


@lowering(aten.addmm.default)
def addmm(ctx, node, bias, a, b, *, beta=1, alpha=1):
    layout = output_layout(meta_of(node))
    return ctx.extern_into(aten.addmm.out, (bias, a, b), {"beta": beta, "alpha": alpha}, [layout], meta_of(node))
