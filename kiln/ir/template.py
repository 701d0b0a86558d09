"""What a matrix-product Template node's body must look like, and its operands' addressing.

A Template (kiln/ir/nodes.py) states its product as a reduction body. A backend generates the
reduction part from the template's kind, so it needs the two operand loads as strided matrices:
`a[m, k]` at `base_a + m * a_m + k * a_k` and `b[k, n]` at `base_b + k * b_k + n * b_n` (element
offsets in the buffers' storage, all sizes and strides sympy expressions). `template_parts` finds
them or says why the body is not a template's; ir/verify.py and the backends share it.

The ops between the loads and the reduce may only convert and multiply the two loaded values
(`to_dtype`, `mul`): a body whose operands were computed (a prologue) is not one a template kernel
runs, and the scheduler never inlines one into a template.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from kiln.ir.indexing import affine_coefficients, fold_div_mod, is_affine, range_vars
from kiln.ir.nodes import Graph, Op, Template

_PROLOGUE_OPS = ("load", "to_dtype", "mul")


@dataclass(frozen=True)
class MatrixOperand:
    """One operand of a product as a strided matrix: `buffer[batch, row, column]` at
    `offset + batch * batch_stride + row * row_stride + column * column_stride` (element offsets into its
    storage; batch_stride 0 for a 2-d product)."""

    buffer: str
    offset: sympy.Expr
    row_stride: sympy.Expr
    column_stride: sympy.Expr
    batch_stride: sympy.Expr = sympy.Integer(0)


@dataclass(frozen=True)
class TemplateParts:
    a: MatrixOperand  # rows m (the output's rows), columns k
    b: MatrixOperand  # rows k, columns n (the output's columns)
    reduce_index: int  # the position of the body's `reduce sum`; the ops after it are the finish


TEMPLATE_RANKS = {"mm": 2, "bmm": 3}  # a template kind -> the rank of its output ([m, n]; [batch, m, n])


def template_parts(node: Template, graph: Graph) -> TemplateParts:
    """The operands and the reduce of a product template's body; ValueError saying why it is not one.
    "mm": ranges [m, n], a[m, k], b[k, n]; "bmm": ranges [batch, m, n], a[batch, m, k], b[batch, k, n]."""
    if node.kind not in TEMPLATE_RANKS:
        raise ValueError(f"unknown template kind {node.kind!r}")
    rank = TEMPLATE_RANKS[node.kind]
    if len(node.ranges) != rank or len(node.reduction_ranges) != 1:
        raise ValueError(f"a {node.kind} over ranges {node.ranges} x {node.reduction_ranges}")
    ops = node.body.ops
    reduces = [position for position, op in enumerate(ops) if op.name == "reduce"]
    if len(reduces) != 1 or ops[reduces[0]].attr != "sum":
        raise ValueError("the body needs exactly one `reduce sum`")
    reduce_index = reduces[0]
    prologue = ops[:reduce_index]
    if [op.name for op in prologue[:2]] != ["load", "load"] or \
            any(op.name not in _PROLOGUE_OPS for op in prologue) or \
            sum(op.name == "load" for op in prologue) != 2:
        raise ValueError("the ops before the reduce must be the two operand loads, casts and their product")
    if any(op.operands for op in prologue[:2]):
        raise ValueError("a masked operand load")
    *batch, m, n = range_vars(rank, "i")
    (k,) = range_vars(1, "r")
    a = _matrix(prologue[0], graph, m, k, n, batch)
    b = _matrix(prologue[1], graph, k, n, m, batch)
    return TemplateParts(a, b, reduce_index)


def _matrix(load: Op, graph: Graph, row, column, absent, batch: list) -> MatrixOperand:
    """`load`'s element offset as a strided matrix over (row, column) (and `batch`, when given); it must not
    use `absent`."""
    # folded: a reshape's view reads [m // s, m % s, k] of a contiguous buffer, at m * k_size + k
    offset = fold_div_mod(graph.buffers[load.buffer].layout.offset_of([sympy.sympify(e) for e in load.index]))
    variables = [*batch, row, column]
    if absent in offset.free_symbols or not is_affine(offset, variables):
        raise ValueError(f"operand {load.buffer} is not read as a strided matrix over {variables}: {offset}")
    coefficients, base = affine_coefficients(offset, variables)
    *batch_stride, row_stride, column_stride = coefficients
    return MatrixOperand(load.buffer, base, row_stride, column_stride, *batch_stride)
