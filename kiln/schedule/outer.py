"""Outer reductions: reductions whose columns are strided in memory and whose rows are contiguous.

A reduction kernel tiles [XBLOCK rows, RBLOCK columns] (kiln/codegen/triton.py). Its default tile,
one row by 1024 columns, suits a reduction over the last, contiguous dim (softmax, a norm's
statistics): a warp reads 32 neighbouring elements. Training's backward is full of the other kind:
a linear layer's bias gradient `grad.sum(0)` over a (tokens, features) gradient, a layer norm's
weight and bias gradients, a channels-last batch norm's statistics over (N, H, W) with C innermost.
There the columns are a whole row of the input apart, and the 1 x 1024 tile gives each lane its own
32-byte sector for 2 or 4 useful bytes; it also makes one program per output element, few enough
(768 for a bias) that each walks thousands of strided loads in turn. On the H200 at 8dd84d3, ViT-B/16
training (whose backward has about 100 such reductions by its architecture: 12 blocks of 4 bias
and 4 layer-norm gradients) ran 28.6 ms per step against eager's 25.7.

`is_outer_reduction(node, buffers)` says which reductions are of that kind: the node's main loads
(those indexed by both a row and a column variable; a per-column statistic such as a norm's mean
is small) move by one element with the innermost row, and not by one with any column. For them:
- fusion makes the kernel looped unless its columns are few (`OUTER_PERSISTENT_MAX`), and marks it
  `outer` (kiln/schedule/fusion.py);
- the Triton generator tiles it [64 rows, 32 columns], so a warp's loads cover consecutive rows
  (kiln/codegen/triton.py `_reduction_blocks`);
- split_reductions splits its columns into chunks when too few programs would cover its rows,
  with the partial results laid out chunk-major, so that both stages stay outer reductions
  (kiln/schedule/split.py).
Which values are computed does not change, only the order the elements are visited in.
"""
from __future__ import annotations

import sympy

from kiln.ir import LoopNode
from kiln.ir.indexing import FloorDiv, Mod, fold_div_mod, index_var
from kiln.ir.kernel import OUTER_PERSISTENT_MAX, OUTER_ROWS_PER_PROGRAM


def is_outer_reduction(node: LoopNode, buffers: dict) -> bool:
    """Whether `node` is a reduction whose main loads are contiguous along its innermost row and
    along none of its columns (static offsets, the row's linear)."""
    if not node.is_reduction:
        return False
    rows = [position for position, size in enumerate(node.ranges) if size != 1]
    columns = [position for position, size in enumerate(node.reduction_ranges) if size != 1]
    if not rows or not columns:
        return False
    row = index_var("i", rows[-1])
    row_vars = {index_var("i", position) for position in rows}
    column_vars = {index_var("r", position) for position in columns}
    verdicts = []
    for op in node.body.reads():
        if op.operands:
            continue  # a masked load: padding, not the bulk of the traffic
        offset = fold_div_mod(buffers[op.buffer].layout.offset_of(op.index))
        symbols = offset.free_symbols
        if not (symbols & row_vars and symbols & column_vars):
            continue
        row_stride = _stride(offset, row, divided_ok=False)
        column_strides = [_stride(offset, var, divided_ok=True) for var in sorted(column_vars, key=str)]
        if row_stride is None or None in column_strides:
            return False
        # contiguous along the rows; along no column (a column it does not move with is fine)
        verdicts.append(abs(row_stride) == 1 and all(abs(stride) != 1 for stride in column_strides))
    return bool(verdicts) and all(verdicts)


def _stride(offset, var, *, divided_ok: bool) -> int | None:
    """How far `offset` moves with `var` through its terms c * var; None where `var` appears in another term,
    except, with `divided_ok`, a multiple of a FloorDiv or Mod: a column read through a broadcast (an average
    pool's gradient, `grad[n]` at n = r // (H * W)) moves by whole rows every H * W columns, not by one."""
    total = 0
    for term in sympy.Add.make_args(offset):
        if var not in term.free_symbols:
            continue
        coefficient, rest = term.as_coeff_Mul()
        if rest == var and coefficient.is_Integer:
            total += int(coefficient)
        elif not (divided_ok and isinstance(rest, (FloorDiv, Mod))):
            return None
    return total


__all__ = ["OUTER_PERSISTENT_MAX", "OUTER_ROWS_PER_PROGRAM", "is_outer_reduction"]
