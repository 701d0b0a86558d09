"""The Triton matrix-product template: a tiled `tl.dot` loop, then the template's finish and its epilogue.

A template kernel (kiln/schedule/fusion.py) has rows [m] (a batched one, "bmm": [batch, m]) and columns
[n]; each program computes one [BLOCK_M, BLOCK_N] tile of the product, walking k in steps of BLOCK_K with a
float32 accumulator. A batched product runs its batch entries' tiles one after another on the same 1-d
grid, each at its operands' batch strides. The tile is the kernel's (x, r) block: `xindex` holds its rows
((batch, m) flattened), `rindex` its columns, so the template's own
finish (bias, alpha, the cast, the store) and every pointwise epilogue node that joined the kernel are
emitted by the ordinary code path (codegen/triton.py `_emit_node`) on the accumulator's tile.
Programs are ordered in groups of GROUP_M row tiles (the "grouped" order of Triton's matmul tutorial),
so that tiles running together share their rows of `a` and columns of `b` in L2.

`emit_product` writes the lines; `TileConfig` is one candidate tile, `default_tile` the one used
without autotuning (kiln/codegen/templates.py chooses and times them).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from kiln.ir.template import TemplateParts


@dataclass(frozen=True)
class TileConfig:
    """One way to run a product template: its block sizes (constexprs) and launch options."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    @property
    def constexprs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "GROUP_M": self.group_m}

    def __str__(self) -> str:
        return f"tile {self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"


# Candidates autotuning times (kiln/codegen/templates.py), by operand width; the first is the default.
# 16-bit operands: the tiles Hopper's tensor cores run well with 3-4 stages of shared memory;
# fp32 operands take half the k step for the same shared memory.
CANDIDATES = {
    2: (TileConfig(128, 128, 64, 8, 3), TileConfig(128, 256, 64, 8, 3), TileConfig(256, 128, 64, 8, 3),
        TileConfig(64, 128, 64, 4, 4), TileConfig(128, 64, 64, 4, 4), TileConfig(64, 64, 64, 4, 3),
        TileConfig(64, 256, 32, 4, 4)),
    4: (TileConfig(128, 128, 32, 8, 3), TileConfig(64, 128, 32, 4, 4), TileConfig(128, 64, 32, 4, 4),
        TileConfig(64, 64, 32, 4, 3)),
}
# Under Triton's interpreter (CPU) every lane costs NumPy work: small tiles waste the least on masked tails.
INTERPRETED_TILE = TileConfig(32, 32, 32, 4, 1)


def candidates(dtype: torch.dtype) -> tuple:
    return CANDIDATES[2 if dtype.itemsize <= 2 else 4]


def default_tile(dtype: torch.dtype, device_type: str) -> TileConfig:
    return candidates(dtype)[0] if device_type == "cuda" else INTERPRETED_TILE


def program_count(rows, columns, tile: TileConfig) -> sympy.Expr:
    """How many programs cover [rows, columns] in tiles of `tile` (the launch's 1-d grid)."""
    from kiln.ir.indexing import FloorDiv

    tiles_m = FloorDiv(rows + tile.block_m - 1, tile.block_m)
    tiles_n = FloorDiv(columns + tile.block_n - 1, tile.block_n)
    return sympy.expand(tiles_m * tiles_n)


def emit_product(gen, parts: TemplateParts, precision: str, use_int64: bool, sizes: list, tile: TileConfig,
                 batched: bool = False) -> str:
    """Write the tiled product into `gen` (a TritonKernelGenerator: its `out`, `pointer` and
    `index_source`); the accumulator's name. Sets up `xindex`/`xmask` (the tile's rows, [BLOCK_M, 1])
    and `rindex`/`rmask` (its columns, [1, BLOCK_N]) for the ops that follow.

    The operand loads read rows `rm % xnumel` and columns `rn % rnumel`: a tail tile's extra lanes
    read real elements again instead of being masked, and only their results are masked at the
    store, so the inner loop's loads are unmasked except in k, and in k only when the tile does not
    divide it. Where the tile divides a dim of unit stride, its indices are marked contiguous, so the
    loads along it vectorize (in a tail tile the wrapped indices are not contiguous: no mark)."""
    out, source = gen.out, gen.index_source
    even_m, even_n, even_k = (_divides(block, size) for block, size in
                              zip((tile.block_m, tile.block_n, tile.block_k), sizes))
    wide = ".to(tl.int64)" if use_int64 else ""
    out.add("pid = tl.program_id(0)")
    out.add("tiles_m = tl.cdiv(xnumel, BLOCK_M)")
    out.add("tiles_n = tl.cdiv(rnumel, BLOCK_N)")
    if batched:  # the programs of one batch entry (matrix) are consecutive: pid_b picks the entry
        out.add(f"pid_b = (pid // (tiles_m * tiles_n)){wide}")
        out.add("pid = pid % (tiles_m * tiles_n)")
    out.add("group_size = GROUP_M * tiles_n")
    out.add("first_m = (pid // group_size) * GROUP_M")
    out.add("group_m = tl.minimum(tiles_m - first_m, GROUP_M)")
    out.add("pid_m = first_m + (pid % group_size) % group_m")
    out.add("pid_n = (pid % group_size) // group_m")
    out.add(f"rm = pid_m{wide} * BLOCK_M + tl.arange(0, BLOCK_M)")
    out.add(f"rn = pid_n{wide} * BLOCK_N + tl.arange(0, BLOCK_N)")
    out.add("rk = tl.arange(0, BLOCK_K)")
    out.add("xindex = pid_b * xnumel + rm[:, None]" if batched else "xindex = rm[:, None]")  # rows: ([b,] m)
    out.add("xmask = rm[:, None] < xnumel")
    out.add("rindex = rn[None, :]")
    out.add("rmask = rindex < rnumel")
    a, b = parts.a, parts.b
    out.add(f"am = {_contiguous_hint('rm % xnumel', 'BLOCK_M', a.row_stride, even_m)}")
    out.add(f"bn = {_contiguous_hint('rn % rnumel', 'BLOCK_N', b.column_stride, even_n)}")
    a_pointer, b_pointer = gen.pointer(a.buffer), gen.pointer(b.buffer)
    a_batch = f" + pid_b * ({source(a.batch_stride)})" if batched else ""
    b_batch = f" + pid_b * ({source(b.batch_stride)})" if batched else ""
    out.add(f"a_tile = {a_pointer} + ({source(a.offset)}){a_batch} + am[:, None] * ({source(a.row_stride)}) "
            f"+ rk[None, :] * ({source(a.column_stride)})")
    out.add(f"b_tile = {b_pointer} + ({source(b.offset)}){b_batch} + rk[:, None] * ({source(b.row_stride)}) "
            f"+ bn[None, :] * ({source(b.column_stride)})")
    out.add("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
    out.add("for k in range(0, knumel, BLOCK_K):")
    out.depth += 1
    if even_k:
        out.add("a_block = tl.load(a_tile)")
        out.add("b_block = tl.load(b_tile)")
    else:
        out.add("k_inside = rk < knumel - k")
        out.add("a_block = tl.load(a_tile, mask=k_inside[None, :], other=0.0)")
        out.add("b_block = tl.load(b_tile, mask=k_inside[:, None], other=0.0)")
    out.add(f"acc = tl.dot(a_block, b_block, acc, input_precision=\"{precision}\")")
    out.add(f"a_tile += BLOCK_K * ({source(a.column_stride)})")
    out.add(f"b_tile += BLOCK_K * ({source(b.row_stride)})")
    out.depth -= 1
    return "acc"


def _divides(block: int, size) -> bool:
    size = sympy.sympify(size)
    return bool(size.is_Integer and int(size) % block == 0)


def _contiguous_hint(index: str, block: str, stride, even: bool) -> str:
    """`index`, with Triton's hints that its BLOCK values are consecutive where the operand's stride
    along them is 1 and no tile wraps (so its loads vectorize), else as it is."""
    if stride != 1 or not even:
        return index
    return f"tl.max_contiguous(tl.multiple_of({index}, {block}), {block})"
