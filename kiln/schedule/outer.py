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

from kiln.ir import LoopNode
from kiln.ir.kernel import OUTER_PERSISTENT_MAX, OUTER_ROWS_PER_PROGRAM
from kiln.ir.indexing import FloorDiv, Mod, fold_div_mod, index_var, linear_coefficient


def is_outer_reduction(node: LoopNode, buffers: dict) -> bool:
    """Whether `node` is a reduction whose main loads are contiguous along its innermost row and
    along none of its columns (static, linear offsets only)."""
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
        if offset.has(FloorDiv, Mod) or not offset.is_polynomial(*symbols):
            return False  # a view whose index divides: its strides are not constant
        strides = [linear_coefficient(offset, var) for var in (row, *sorted(column_vars, key=str))]
        if any(stride is None for stride in strides):
            return False
        row_stride, *column_strides = strides
        # contiguous along the rows; along no column (a column it does not move with is fine)
        verdicts.append(abs(row_stride) == 1 and all(abs(stride) != 1 for stride in column_strides))
    return bool(verdicts) and all(verdicts)


__all__ = ["OUTER_PERSISTENT_MAX", "OUTER_ROWS_PER_PROGRAM", "is_outer_reduction"]
