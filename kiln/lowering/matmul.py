"""Matrix products: externs (cuBLAS beats generated code), laid out for cuBLAS's fast paths.

A product whose output rows are not a multiple of 16 bytes long (GPT-2's LM head:
50257 columns) makes cuBLAS fall back to slow unaligned kernels, several times slower
(see benchmarks/results/2026-12-02_docstring-measurements.md). kiln allocates such an
output with its row stride rounded up and calls the op's `out=` variant, which writes rows
at that stride: the same values, an aligned layout.
Consumers read buffers through their strides, so nothing else changes.

Padding the output alone was not enough: the profile of GPT-2 on the H200 still showed an
align1 CUTLASS kernel for the LM head, far slower than Inductor's (see
benchmarks/results/2026-11-30_gpt2-profile_nvidia-h200.tgz, p/profile_gpt2_kiln.txt against
p/profile_gpt2_inductor.txt), because the product's N (50257) stays odd. So on CUDA, a
half-precision product with N not a multiple of 8 computes with N rounded up: kiln writes the
second operand into a buffer with zero columns added (one pointwise kernel; under autocast it is
the bf16 cast kiln writes anyway), multiplies into an output of N_pad columns and reads its first
N (`pad_product_columns`).

On the CPU, a product's output of static size is also allocated by kiln and passed as
`out=` (with the scratch block on, config.cpu_scratch_arena): an intermediate then lives
in the graph's block (kiln/runtime/scratch.py), reused by every call. A large one always
does, for huge pages (kiln/runtime/host_memory.py): either way, no page fault per 4 KiB on
each call's first write.

fp32 CPU products go to oneDNN's linear (`mkldnn::_linear_pointwise`, with the bias when
addmm has one; config.cpu_gemm='aten' turns it off). aten.mm calls MKL's sgemm, and on the
2-core AMD EPYC of our CPU benchmarks oneDNN's kernels were faster at every model shape, with
the weight read as it is stored, no packing and no cache. Its sums run in another order: its
error against float64 is somewhat larger than MKL's (both measurements: see
benchmarks/results/2026-12-02_docstring-measurements.md). It takes no
`out=`, so its outputs are allocated per call, not in the scratch block.

A product's only elementwise consumer (gelu, silu, or a product with a tensor of its
size) is oneDNN's post-op: applied to the values as they are stored, so no kernel reads the
product back. The pattern pass (lowering/patterns.py) rewrites product and consumer into one
call of `patterns.linear_unary` / `linear_binary`; their rules here emit the one oneDNN call,
or lower the replaced nodes one by one where the operands' layouts do not suit it.

On the Triton backends a 2-d product may instead be a Template node (`template_product`): a
generated tiled kernel that its pointwise epilogue joins, where config.matmul_template and, under
mode="max-autotune", the timings say so (kiln/codegen/templates.py; docs/design/templates.md). It is
tried first, before the padding above, which a template does not need.
"""
from __future__ import annotations

import sympy

import torch

from kiln import _torch
from kiln.config import config
from kiln.ir import Body, Layout, TensorArg, Template
from kiln.ir.indexing import contiguous_strides, range_vars
from kiln.ir.template import template_parts
from kiln.lowering import patterns
from kiln.lowering.context import BufferValue, TensorValue, Unsupported, ViewValue, layout_of, meta_of
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
    if meta.device.type == "cpu" and meta.is_contiguous():
        layout = layout_of(meta, with_offset=False)
        static = all(size.is_Integer for size in layout.size)
        if static and (config.cpu_scratch_arena or
                       0 < config.cpu_huge_pages_min_bytes <= meta.numel() * meta.element_size()):
            return layout
    raise Unsupported("an aligned product that ATen allocates as well: the plain extern")


PAD_DEVICE_TYPES = ("cuda",)  # where operands are padded (tests add "cpu" to check the values)
MIN_PADDED_ROWS = 256  # fewer rows: copying the operand would cost more than the product saves


def pad_product_columns(ctx, meta, a, b):
    """`a @ b` computed with b's columns padded to a multiple of 8 (see the module docstring),
    as a view of the first N columns; None when that does not apply."""
    if meta.device.type not in PAD_DEVICE_TYPES or meta.dtype not in (torch.bfloat16, torch.float16) \
            or meta.dim() != 2:
        return None
    rows, columns = (_torch.sym_expr(size) for size in meta.shape)
    inner = sympy.sympify(b.shape[0])
    if not (rows.is_Integer and inner.is_Integer and columns.is_Integer) or int(rows) < MIN_PADDED_ROWS:
        return None
    multiple = ROW_ALIGNMENT_BYTES // 2
    if int(columns) % multiple == 0 or int(rows) * int(columns) < MIN_PADDED_ELEMENTS:
        return None
    padded = sympy.Integer(-(-int(columns) // multiple) * multiple)

    def padded_column(body, index):  # index = [column, k] of b transposed, zero past its columns
        column, k = index
        inside = body.emit("lt", (body.index_expr(column, torch.int64), body.index_expr(columns, torch.int64)),
                           torch.bool)
        loaded = body.to_dtype(b.load(body, [k, column], mask=inside), torch.float32)
        return body.emit("where", (inside, loaded, body.constant(0.0, torch.float32)), torch.float32)

    # b padded, stored as a [padded, inner] row-major buffer read transposed (nn.Linear's layout).
    b_rows = ctx.pointwise_indexed(meta, padded_column, layout=Layout((padded, inner), (inner, sympy.Integer(1))))
    b_padded = ViewValue(b_rows, [inner, padded], lambda index: [index[1], index[0]])
    product = ctx.extern_into(aten.mm.out, (a, b_padded), {}, [Layout((rows, padded), (padded, sympy.Integer(1)))],
                              meta)
    return ViewValue(product, [rows, columns], lambda index: index)


def onednn_weight(meta, a: TensorArg, b: TensorArg, bias: TensorArg | None = None) -> TensorArg | None:
    """The weight b.t() that oneDNN's linear takes for `a @ b (+ bias)` (see the module docstring),
    or None when the op does not apply: only fp32 CPU products, on layouts it is exact for."""
    from kiln.codegen.templates import templates_forced

    if config.cpu_gemm != "onednn" or _torch.onednn_linear() is None or meta.device.type != "cpu" or \
            meta.dtype != torch.float32 or meta.dim() != 2 or templates_forced("cpu"):
        return None  # (aten's products take operands of the result's dtype only)
    if not (isinstance(a, TensorArg) and isinstance(b, TensorArg)):
        return None
    inner, columns = b.layout.size
    if not (inner.is_Integer and columns.is_Integer and int(inner) > 1 and int(columns) > 0):
        return None  # the op rejects K = 0; K = 1 leaves no unit stride to check
    weight = TensorArg(b.buffer, Layout((columns, inner), tuple(reversed(b.layout.stride)), b.layout.offset))
    # Measured (tests/backend/test_matmul_onednn.py): rows of x must be unit-stride (a column-major
    # x is rejected), the weight may be either way round, and a strided bias gives wrong values.
    if a.layout.stride[1] != 1 or 1 not in weight.layout.stride or 0 in weight.layout.stride:
        return None
    if bias is not None and (not isinstance(bias, TensorArg) or len(bias.layout.size) != 1 or
                             bias.layout.size[0] != columns or bias.layout.stride[0] != 1):
        return None
    return weight


def onednn_linear(ctx, meta, a: TensorArg, b: TensorArg, bias: TensorArg | None = None):
    """`a @ b (+ bias)` as oneDNN's linear of a and the weight b.t(), or None when it does not apply."""
    weight = onednn_weight(meta, a, b, bias)
    if weight is None:
        return None
    return ctx.extern(_torch.onednn_linear(), (a, weight, bias, "none", [], ""), {}, meta)


def dense_other(ctx, other, meta) -> TensorArg | None:
    """A binary post-op's other operand as the dense [rows, columns] matrix oneDNN reads (the
    product's `meta` gives the shape), or None when its buffer does not hold it so."""
    other = ctx.realize(other)
    expected = contiguous_strides(other.layout.size)
    if any(size != 1 and sympy.expand(stride - want) != 0
           for size, stride, want in zip(other.layout.size, other.layout.stride, expected)):
        return None
    rows, columns = (_torch.sym_expr(size) for size in meta.shape)
    return TensorArg(other.buffer, Layout((rows, columns), (columns, sympy.Integer(1)), other.layout.offset))


def _replaced_product(ctx, node, bias, a, b):
    """A fused call's replaced product node and its operands, realized in the order its own rule
    realizes them (addmm: bias, a, b), once for whichever op takes them."""
    product = node.meta[patterns.REPLACED_NODES][0]
    if bias is None:
        a, b = _realized(ctx, a), _realized(ctx, b)
    else:
        bias, a, b = _realized(ctx, bias), _realized(ctx, a), _realized(ctx, b)
    return product, bias, a, b


def _lower_replaced(ctx, node, bias, a, b, reshape_sizes, consumer_args, consumer_kwargs, product=None):
    """The replaced nodes lowered one by one, as if no pattern had matched (the product by its own
    rule unless `product` already holds its value, then the reshapes, then the consumer, when given
    its arguments with None where the product goes)."""
    product_node, *reshape_nodes, consumer_node = node.meta[patterns.REPLACED_NODES]
    if product is None:
        operands = (a, b) if bias is None else (bias, a, b)
        product = ctx.lower_op(product_node, operands, {})
    for reshape_node, size in zip(reshape_nodes, reshape_sizes):
        product = ctx.lower_op(reshape_node, (product, size), {})
    if consumer_args is None:
        return product
    args = tuple(product if arg is None else arg for arg in consumer_args)
    return ctx.lower_op(consumer_node, args, consumer_kwargs)


@lowering(patterns.linear_unary)
def linear_unary(ctx, node, product_op, bias, a, b, reshapes, consumer_op, consumer_kwargs):
    """A product and its gelu or silu (lowering/patterns.py): oneDNN's linear with that post-op."""
    product_node, bias, a, b = _replaced_product(ctx, node, bias, a, b)
    reshape_sizes = [size for _, size in reshapes]
    meta = meta_of(product_node)
    weight = onednn_weight(meta, a, b, bias)
    if weight is None:
        return _lower_replaced(ctx, node, bias, a, b, reshape_sizes, (None,), consumer_kwargs)
    pattern = patterns.PATTERN_OF_CONSUMER[consumer_op]
    product = ctx.extern(_torch.onednn_linear(), (a, weight, bias, pattern.onednn_attr, [],
                                                  pattern.algorithm(consumer_kwargs)), {}, meta)
    return _lower_replaced(ctx, node, bias, a, b, reshape_sizes, None, {}, product=product)


@lowering(patterns.linear_binary)
def linear_binary(ctx, node, product_op, bias, a, b, reshapes, consumer_op, other, product_first):
    """A product times a tensor (lowering/patterns.py): oneDNN's linear with that binary post-op."""
    product_node, bias, a, b = _replaced_product(ctx, node, bias, a, b)
    reshape_sizes = [size for _, size in reshapes]
    meta = meta_of(product_node)
    consumer_args = (None, other) if product_first else (other, None)
    weight = onednn_weight(meta, a, b, bias)
    other_matrix = dense_other(ctx, other, meta) if weight is not None else None
    if other_matrix is None:
        return _lower_replaced(ctx, node, bias, a, b, reshape_sizes, consumer_args, {})
    pattern = patterns.PATTERN_OF_CONSUMER[consumer_op]
    product = ctx.extern(_torch.onednn_linear_binary(), (a, other_matrix, weight, bias, pattern.onednn_attr), {},
                         meta)
    return _lower_replaced(ctx, node, bias, a, b, reshape_sizes, None, {}, product=product)


TEMPLATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def template_product(ctx, meta, a, b, bias=None, beta=1, alpha=1):
    """`beta * bias + alpha * (a @ b)` (2-d, or a batched product of 3-d operands without bias) as a Template node (kiln/ir/template.py), which the scheduler lets a
    pointwise epilogue join; None where no template applies or config.matmul_template (with autotuning,
    kiln/codegen/templates.py) keeps the extern.

    Its body sums the exact products in float32, then scales, adds the bias (in float32) and rounds once
    to the result's dtype: what cuBLAS's kernels do for these dtypes. fp32 operands multiply in full
    precision, or in TF32 where torch allows it for CUDA products (`precision`)."""
    from kiln.codegen.templates import product_config, templates_considered  # it generates and times kernels

    if meta.dim() not in (2, 3) or meta.dtype not in TEMPLATE_DTYPES or \
            any(not isinstance(value, TensorValue) or value.dtype != meta.dtype
                for value in (a, b) + (() if bias is None else (bias,))) or \
            not templates_considered(meta, sympy.sympify(a.shape[-1])):
        return None
    # fp32 where torch allows TF32: three TF32 products (the operands split in high and low halves), near
    # fp32's precision. One TF32 product truncates the operands (cuBLAS rounds them): 2.3x eager's error on
    # the H200 at 1000x768x3072, over the accuracy rule's 2x.
    precision = "tf32x3" if meta.dtype == torch.float32 and meta.device.type == "cuda" and \
        torch.backends.cuda.matmul.allow_tf32 else "ieee"
    *batch, m, n = range_vars(meta.dim(), "i")  # a batched product (bmm): [batch, m, n]
    (k,) = range_vars(1, "r")
    body = Body()
    loaded_a = a.load(body, [*batch, m, k])
    loaded_b = b.load(body, [*batch, k, n])
    if len(body.ops) != 2:
        return None  # an operand that is not a plain load (padded, masked): the extern reads it realized
    product = body.emit("mul", (body.to_dtype(loaded_a, torch.float32), body.to_dtype(loaded_b, torch.float32)),
                        torch.float32)
    total = body.emit("reduce", (product,), torch.float32, attr="sum")
    sizes = [_torch.sym_expr(size) for size in meta.shape]
    node = Template("template", sizes, body, [], reduction_ranges=[sympy.sympify(a.shape[-1])],
                    kind="bmm" if batch else "mm", precision=precision)  # named once it is added
    try:
        template_parts(node, ctx.graph)
    except ValueError:
        return None  # an operand whose elements are not a strided matrix of its buffer: realized for the extern
    node.config = product_config(node, ctx.graph, meta)
    if node.config is None:
        return None
    if alpha != 1:
        total = body.emit("mul", (total, body.constant(alpha, torch.float32)), torch.float32)
    if bias is not None and beta != 0:  # beta 0 ignores the bias, NaN included, as torch's addmm does
        added = ctx.load_broadcast(body, bias, [m, n], sizes, torch.float32)
        if beta != 1:
            added = body.emit("mul", (added, body.constant(beta, torch.float32)), torch.float32)
        total = body.emit("add", (total, added), torch.float32)
    out = ctx.buffer_for(meta)
    body.store(out, [*batch, m, n], body.to_dtype(total, meta.dtype))
    node.name, node.outputs = ctx.new_node_name(), [out.name]
    ctx.graph.nodes.append(node)
    return BufferValue(out)


def _realized(ctx, value):
    """A tensor operand as the strided view the extern reads (other values as they are)."""
    return ctx.realize(value) if isinstance(value, TensorValue) else value


@lowering(aten.mm.default)
def mm(ctx, node, a, b):
    template = template_product(ctx, meta_of(node), a, b)
    if template is not None:
        return template
    padded = pad_product_columns(ctx, meta_of(node), a, b)
    if padded is not None:
        return padded
    a, b = _realized(ctx, a), _realized(ctx, b)  # once, for whichever op takes them
    linear = onednn_linear(ctx, meta_of(node), a, b)
    if linear is not None:
        return linear
    layout = output_layout(meta_of(node))
    return ctx.extern_into(aten.mm.out, (a, b), {}, [layout], meta_of(node))


@lowering(aten.bmm.default)
def bmm(ctx, node, a, b):
    template = template_product(ctx, meta_of(node), a, b)
    if template is None:
        raise Unsupported("a batched product that is not a template: the extern")
    return template


@lowering(aten.addmm.default)
def addmm(ctx, node, bias, a, b, *, beta=1, alpha=1):
    template = template_product(ctx, meta_of(node), a, b, bias, beta, alpha)
    if template is not None:
        return template
    bias, a, b = _realized(ctx, bias), _realized(ctx, a), _realized(ctx, b)  # once, for whichever op takes them
    if beta == 1 and alpha == 1:
        linear = onednn_linear(ctx, meta_of(node), a, b, bias)
        if linear is not None:
            return linear
    layout = output_layout(meta_of(node))
    return ctx.extern_into(aten.addmm.out, (bias, a, b), {"beta": beta, "alpha": alpha}, [layout], meta_of(node))
