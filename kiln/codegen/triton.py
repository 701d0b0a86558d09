"""Triton kernels from scheduled LoopIR kernels.

One kernel = one `@triton.jit` function. Pointwise kernels tile the flattened rows in
1-D blocks of XBLOCK; reduction kernels tile [XBLOCK rows, RBLOCK columns], either
persistent (the whole row in registers) or looped over the columns with per-lane
accumulators. fp16/bf16 are loaded and stored in their own dtype; the body's explicit
`to_dtype` ops do the math in fp32. Masks cover every tail.
"""
from __future__ import annotations

import hashlib
import math

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import sympy
import torch

from kiln.codegen.common import LineBuffer, kernel_ranges, pointer_name, reduction_identity
from kiln.codegen.printing import TRITON_DTYPES, expr_to_source, python_constant
from kiln.ir import Graph
from kiln.ir.indexing import simplify_index
from kiln.ir.nodes import indirect_value, symbol_name
from kiln.ir.ops import OPS, triton_variants
from kiln.ir.template import template_parts
from kiln.codegen.triton_templates import default_tile, emit_product, program_count
from kiln.codegen.tuning import tune_kernel
from kiln.runtime.loader import compile_early, load_triton_kernels
from kiln.config import config
from kiln.ir.kernel import OUTER_ROWS_PER_PROGRAM, Kernel, is_loop_variable, var_map

INT32_LIMIT = 2**31 - 1
# The pseudo-buffer a kernel with check_index ops takes as one of its pointers: the graph's one-int32
# index-error flag, allocated by the wrapper (codegen/wrapper.py).
INDEX_STATUS = "_index_status"

# The pointwise ops' renderings are kiln/ir/ops.py's `triton` column; why some variants exist:
# - integer (and bool): libdevice has no integer rounding, fmod, pow or signbit, and `//`, `%` are C's
#   truncating ones. Division by zero gives 0 (torch raises; a GPU's is undefined), min // -1 wraps.
#   Helpers return their operand's dtype (a Python int constant in tl.where widens int8 to int32).
# - float neg: Triton's unary minus is `0 - x`, which is +0.0 for x = 0.0 (on the GPU and in the
#   interpreter); torch's neg flips the sign (-0.0), which 1 / x, copysign, signbit and atan2 see.
#   Multiplying by -1 is exact and keeps NaN.
# - float32: `/` on the GPU is Triton's div.full.f32, an approximation (2 ulp); eager's CUDA division
#   is IEEE (div.rn.f32). tl.div_rn is the correctly rounded one (float64's `/` already is). Likewise
#   libdevice's sqrtf is sqrt.approx.f32 under Triton (it does not set __CUDA_PREC_SQRT), where
#   eager's is IEEE: sqrt(2) * sqrt(2) then truncates to 1 instead of 2 (fuzzer seed101 #753).
#   (tl.exp / tl.log are ex2/lg2.approx after a multiply, some ulps off and more for large
#   arguments: sin(exp(x)) was 2.6e-4 off; the defaults use libdevice's expf / logf, as CUDA's eager does.)
# - rounded_to_16bit: a float32 division whose quotient only a cast to float16 or bfloat16 reads (softmax's
#   last step, a 16-bit division) is div.full.f32. Its 2 ulp of float32 are 1/4096 of a bfloat16 ulp (1/512
#   of a float16 one), so the 16-bit result is eager's, or one ulp from it where the exact quotient lies that
#   close to a rounding boundary; the result stays within half a 16-bit ulp of the exact one, plus that
#   sliver. IEEE division costs about 20 instructions per element with its slow-path branch, div.full two
#   (softmax over 4096 bf16 columns, sm_90 SASS: 42.5 instructions per element with it, 25.5 without).
# - bool: Triton's int1 add/sub wrap mod 2 on the GPU (True + True = False); torch's bool add is
#   logical or, its bool mul logical and (sub of bools torch refuses).
# - low_precision (fp16/bf16 ops; math otherwise runs in fp32): nextafter steps by the 16-bit format's ulp.
# - sign is torch's (0 < x) - (x < 0): sign(NaN) is 0, a bool's sign is itself; a uint8 bitwise_not
#   is not `~` (`^ -1`), which the interpreter cannot make a uint8.

HELPERS = {
    # Philox4x32-10's first word for key = the seed's 32-bit halves, counter = (the offset's halves, 0, 0):
    # Triton's tl.randint with int64 operands, zero-extended to int64 (kiln/ir/ops.py CPP_PHILOX is the same)
    "philox": """
@triton.jit
def _philox(seed, offset):
    return tl.randint(seed.to(tl.int64), offset.to(tl.int64)).to(tl.int64)
""",
    # erf_for_16bit (kiln/ir/ops.py) in float32: erf(z) = sign(z) (1 - 2^P(min(|z|, 4))), P a degree-10
    # polynomial with P(0) = 0 fitted to log2(erfc(u)) on [0, 4] (least squares reweighted towards the minimax,
    # Lawson's way; float32 coefficients). Past 4, erfc(u) < 2^-25 and erf rounds to +-1 in float32, as 1 - 2^P(4)
    # does. It is within 1.9e-7 of erf (a correctly rounded erff: 3e-8). In gelu's (x * 0.5) * (1 + erf(x /
    # sqrt 2)), 1 + erf cancels for x < 0 to the same float32 grid as eager's, so eager's exact zeros (x <
    # -5.5426) stay. Over every finite bfloat16 x, that gelu rounded to bfloat16 is eager's formula's value (with
    # a correctly rounded erf) wherever the result is a normal number; over every float16, all but 4 of 63,488,
    # each one ulp off where the exact value lies within 2e-7 of a rounding boundary (tests/lowering/
    # test_gelu.py). On sm_90 it is one MUFU.EX2 and about 13 other instructions an element (9 FFMA): a bfloat16
    # gelu(x + b) kernel takes 24 SASS instructions an element with it, 38 with libdevice's erff.
    # The FMAs are explicit: kiln's kernels compile without contraction (kiln/runtime/launch.py).
    "erf_for_16bit": """
@triton.jit
def _erf_for_16bit(z):
    u = tl.minimum(tl.abs(z), 4.0, propagate_nan=tl.PropagateNan.ALL)
    p = tl.fma(u, -5.21950653364911e-07, 1.1878792065544985e-05)
    p = tl.fma(p, u, -0.00011569738853722811)
    p = tl.fma(p, u, 0.0006069603259675205)
    p = tl.fma(p, u, -0.0015760654350742698)
    p = tl.fma(p, u, -0.001026000129058957)
    p = tl.fma(p, u, 0.028730714693665504)
    p = tl.fma(p, u, -0.14880697429180145)
    p = tl.fma(p, u, -0.9183238744735718)
    p = tl.fma(p, u, -1.627916932106018)
    return libdevice.copysign(1.0 - libdevice.exp2(p * u), z)
""",
    "floordiv_float": """
@triton.jit
def _floordiv_float(a, b):
    # torch's div_floor_floating: from the remainder, so floordiv(inf, 1) is NaN as in torch
    rest = libdevice.fmod(a, b)
    quotient = (a - rest) / b
    quotient = tl.where((rest != 0) & ((b < 0) != (rest < 0)), quotient - 1.0, quotient)
    floored = libdevice.floor(quotient)
    floored = tl.where(quotient - floored > 0.5, floored + 1.0, floored)
    floored = tl.where(quotient == 0, libdevice.copysign(quotient * 0.0, a / b), floored)
    return tl.where(b == 0, a / b, floored)
""",
    "remainder_float": """
@triton.jit
def _remainder_float(a, b):
    rest = libdevice.fmod(a, b)
    return tl.where((rest != 0) & ((rest < 0) != (b < 0)), rest + b, rest)
""",
    "floordiv_integer": """
@triton.jit
def _floordiv_integer(a, b):
    divisor = tl.where((b == 0) | (b == -1), 1, b)
    quotient = a // divisor
    quotient = tl.where(((a % divisor) != 0) & ((a < 0) != (divisor < 0)), quotient - 1, quotient)
    return tl.where(b == 0, 0, tl.where(b == -1, -a, quotient)).to(a.dtype)
""",
    "truncdiv_integer": """
@triton.jit
def _truncdiv_integer(a, b):
    divisor = tl.where((b == 0) | (b == -1), 1, b)
    return tl.where(b == 0, 0, tl.where(b == -1, -a, a // divisor)).to(a.dtype)
""",
    "remainder_integer": """
@triton.jit
def _remainder_integer(a, b):
    divisor = tl.where((b == 0) | (b == -1), 1, b)
    rest = a % divisor
    rest = tl.where((rest != 0) & ((rest < 0) != (divisor < 0)), rest + divisor, rest)
    return tl.where((b == 0) | (b == -1), 0, rest).to(a.dtype)
""",
    "fmod_integer": """
@triton.jit
def _fmod_integer(a, b):
    divisor = tl.where((b == 0) | (b == -1), 1, b)
    return tl.where((b == 0) | (b == -1), 0, a % divisor).to(a.dtype)
""",
    "nextafter_16": """
@triton.jit
def _nextafter_16(a, b):
    # compared in float32 (exact), stepped on the 16 bits; the interpreter compares bf16 by its bits
    x = a.to(tl.float32)
    y = b.to(tl.float32)
    bits = a.to(tl.int16, bitcast=True).to(tl.int32)
    step = tl.where((x < y) == (x > 0), 1, -1)
    stepped = tl.where(x == 0, tl.where(y < 0, -32767, 1), bits + step).to(tl.int16).to(a.dtype, bitcast=True)
    return tl.where((x != x) | (y != y), x + y, tl.where(x == y, y, stepped.to(tl.float32))).to(a.dtype)
""",
    "pow_integer": """
@triton.jit
def _pow_integer(base, exponent):
    # by squaring, wrapping like torch; a negative exponent: 1 for 1, +-1 for -1, else 0
    result = base * 0 + 1
    square = base
    rest = exponent
    for _ in range(64):
        result = tl.where((rest & 1) != 0, result * square, result)
        square = square * square
        rest = rest >> 1
    negative = tl.where(base == 1, 1, tl.where((base + 1 == 0) & ((exponent & 1) != 0), base, 0))
    negative = tl.where((base + 1 == 0) & ((exponent & 1) == 0), 1, negative)
    return tl.where(exponent < 0, negative, result).to(base.dtype)
""",
    "max": """
@triton.jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)
""",
    "min": """
@triton.jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)
""",
    "prod": """
@triton.jit
def _prod_combine(a, b):
    return a * b
""",
    "sum": """
@triton.jit
def _sum_combine(a, b):
    return a + b
""",
    "argmax": """
@triton.jit
def _argmax_combine(value_a, index_a, value_b, index_b):
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    pick_a = (value_a > value_b) | (nan_a & ~nan_b) | (((value_a == value_b) | (nan_a & nan_b)) & (index_a < index_b))
    return tl.where(pick_a, value_a, value_b), tl.where(pick_a, index_a, index_b)
""",
    "argmin": """
@triton.jit
def _argmin_combine(value_a, index_a, value_b, index_b):
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    pick_a = (value_a < value_b) | (nan_a & ~nan_b) | (((value_a == value_b) | (nan_a & nan_b)) & (index_a < index_b))
    return tl.where(pick_a, value_a, value_b), tl.where(pick_a, index_a, index_b)
""",
}


@dataclass
class KernelSource:
    """A generated kernel and how the wrapper launches it."""

    name: str
    source: str
    buffer_args: list  # buffer names, in parameter order
    size_args: list  # sympy expressions passed as ints (symbols, xnumel, rnumel)
    xnumel: sympy.Expr
    xblock: int
    rblock: int | None
    num_warps: int
    device_type: str
    skip: bool = False  # empty iteration space: allocate only, never launch
    function_name: str = ""  # the Triton function in `source` (shared by identical kernels)
    pointer_dtypes: list = field(default_factory=list)  # the element type of each buffer_args pointer
    constexpr_values: dict | None = None  # a template's block sizes; None: XBLOCK (and RBLOCK)
    num_stages: int | None = None  # software pipelining stages (templates); None: Triton's default
    full_rows: bool = False  # no row mask: every XBLOCK a launch takes must divide xnumel
    full_columns: bool = False  # no column mask: RBLOCK must be rnumel
    file_suffix: ClassVar[str] = ".py"  # of the KILN_DEBUG dump

    @property
    def listing(self) -> str:
        """The text dumped for KILN_DEBUG: the source itself."""
        return self.source

    @property
    def constexprs(self) -> dict:
        """The compile-time arguments every launch passes: the block sizes."""
        if self.constexpr_values is not None:
            return dict(self.constexpr_values)
        return {"XBLOCK": self.xblock, **({"RBLOCK": self.rblock} if self.rblock else {})}

    @property
    def launch_options(self) -> dict:
        """Triton's compile options for the launch: warps, and stages where the kernel sets them."""
        return {"num_warps": self.num_warps, **({"num_stages": self.num_stages} if self.num_stages else {})}

    @property
    def checks_indices(self) -> bool:
        """Whether the kernel reports out-of-range gather indices into the graph's status flag."""
        return INDEX_STATUS in self.buffer_args


def _next_power_of_2(value: int) -> int:
    return 1 << max(0, (int(value) - 1).bit_length())


def _identity(kind: str, dtype: torch.dtype) -> str:
    """The Triton initial value of a reduction's accumulator."""
    identity = reduction_identity(kind)
    if identity in ("zero", "one"):
        return "0" if identity == "zero" else "1"
    largest = identity == "largest"
    if dtype.is_floating_point:
        return 'float("inf")' if largest else 'float("-inf")'
    if dtype == torch.bool:
        return "1" if largest else "0"
    info = torch.iinfo(dtype)
    return str(info.max if largest else info.min)


class TritonKernelGenerator:
    def __init__(self, kernel: Kernel, graph: Graph, device_type: str):
        self.kernel, self.graph, self.device_type = kernel, graph, device_type
        self.pointer_names: dict[str, str] = {}
        self.size_symbols: set = set()
        self.register_values: dict[str, str] = {}  # buffer name -> Triton variable holding it in-kernel
        self.helpers: set = set()
        self.out = LineBuffer()
        self.use_int64 = self._needs_int64()
        self.full_rows = self.full_columns = False  # set by generate() once the blocks are chosen
        self._rounded_body, self._rounded = None, set()  # _rounded_to_16bit's last body and its answer
        # A kernel without loops (pointwise, persistent reduction) defines each value once for all its nodes:
        # right-hand side -> the variable that first held it (_define); None where it has loops
        self._defined: dict | None = None
        self._aliases: dict = {}  # a variable not defined -> the earlier one it stands for
        self._kernel_writes = {op.buffer for node in kernel.nodes for op in node.body.ops if op.name == "store"}

    # ---- set-up -----------------------------------------------------------------------
    def _needs_int64(self) -> bool:
        spans = []
        for node in self.kernel.nodes:
            for op in node.body.ops:
                if op.buffer is not None:
                    spans.append(self.graph.buffers[op.buffer].layout.storage_span())
        spans.append(self.kernel.row_numel * self.kernel.col_numel)
        for span in spans:
            span = sympy.sympify(span)
            if not span.is_Integer or int(span) > INT32_LIMIT:
                return True
        return False

    def pointer(self, buffer_name: str) -> str:
        return pointer_name(self.pointer_names, buffer_name)  # no buffer name: see generate()

    def index_source(self, expr) -> str:
        expr = sympy.sympify(expr)
        for symbol in expr.free_symbols:
            if indirect_value(symbol) is None and not is_loop_variable(symbol):
                self.size_symbols.add(symbol)
        return expr_to_source(expr, rename=self._rename, language="triton", helpers_used=self.helpers)

    def _rename(self, symbol):
        value = indirect_value(symbol)
        if value is not None:
            return self._current_names[value]
        return None

    # ---- generation ---------------------------------------------------------------------
    def generate(self) -> KernelSource:
        kernel = self.kernel
        if kernel.template is not None:
            return self._generate_template()
        xnumel = kernel.row_numel
        rnumel = kernel.col_numel
        skip = (xnumel.is_Integer and int(xnumel) == 0)
        if kernel.is_reduction:
            rblock, xblock, num_warps = self._reduction_blocks(rnumel)
            self.full_columns = kernel.persistent and rnumel.is_Integer and int(rnumel) == rblock
        else:
            rblock = None
            # 32 bytes of each buffer per thread: 16 elements of a 16-bit tensor, 8 of a 32-bit one (gelu(x + b)
            # over 65536x4096 bf16 on an H100 ran at 0.94 of the copy ceiling with 16 per thread, 0.88 with 8:
            # benchmarks/results/2026-12-05_kernel-variants-a008e7e_nvidia-h100.txt)
            widest = max((self.graph.buffers[op.buffer].dtype.itemsize for node in kernel.nodes
                          for op in node.body.ops if op.name in ("load", "store") and op.buffer in self.graph.buffers),
                         default=4)
            most = 2048 if widest <= 2 else 1024
            xblock = min(most, _next_power_of_2(int(xnumel))) if xnumel.is_Integer else most
            xblock = max(xblock, 16)
            num_warps = 4 if xblock >= 512 else 2
        # A block that never runs past its sizes needs no mask: a constant True one, which Triton folds away
        # (a select per element and per reduction fewer; the tuner keeps such kernels' blocks dividing them).
        self.full_rows = xnumel.is_Integer and int(xnumel) > 0 and int(xnumel) % xblock == 0
        if kernel.is_reduction:
            self._reduction_body(rnumel)
        else:
            self._pointwise_body()
        counts = [("xnumel", xnumel)] + ([("rnumel", rnumel)] if kernel.is_reduction else [])
        blocks = ["XBLOCK"] + (["RBLOCK"] if kernel.is_reduction else [])
        source, function_name, sizes = self._source(counts, blocks)
        return KernelSource(kernel.name, source, list(self.pointer_names), sizes, xnumel, xblock, rblock,
                            num_warps, self.device_type, skip, function_name, self._pointer_dtypes(),
                            full_rows=self.full_rows, full_columns=self.full_columns)

    def _source(self, counts: list, blocks: list) -> tuple:
        """(the module's text, the kernel function's name, the size arguments a launch passes) for the
        lines in `self.out`, whose function takes the pointers, the size symbols, the `counts`
        ((parameter, expression)) and the constexpr `blocks`."""
        size_args = sorted(self.size_symbols, key=str)
        params = [self.pointer_names[name] for name in self.pointer_names] + [str(s) for s in size_args]
        params += [name for name, _ in counts] + [f"{block}: tl.constexpr" for block in blocks]
        # The function is named after its own text, and nothing in it names a buffer, so the
        # same kernel in every layer of a model is one source: compiled once, cached once.
        body = "\n".join(self.out.lines)
        function_name = "kernel_" + hashlib.sha256(f"{params}{body}".encode()).hexdigest()[:12]
        header = [f"def {function_name}({', '.join(params)}):"]
        helpers = "".join(HELPERS[name] for name in sorted(self.helpers))
        source = ("import triton\nimport triton.language as tl\nfrom triton.language.extra.cuda import libdevice\n"
                  + helpers + "\n\n" + "\n".join(header + self.out.lines) + "\n")
        return source, function_name, list(size_args) + [expr for _, expr in counts]

    def _pointer_dtypes(self) -> list:
        return [torch.int32 if name == INDEX_STATUS else self.graph.buffers[name].dtype for name in self.pointer_names]

    def _generate_template(self) -> KernelSource:
        """A product template's kernel (codegen/triton_templates.py): the tiled product, then the
        template's finish and the epilogue nodes on its [BLOCK_M, BLOCK_N] tile."""
        kernel = self.kernel
        template = kernel.nodes[0]
        tile = template.config or default_tile(self.graph.buffers[template.outputs[0]].dtype, self.device_type)
        parts = template_parts(template, self.graph)
        *batch, rows, columns = template.ranges
        inner = template.reduction_ranges[0]
        accumulator = emit_product(self, parts, template.precision, self.use_int64, [rows, columns, inner], tile,
                                   batched=bool(batch))
        self._index_setup("xindex", kernel.row_ranges, "x")
        self._index_setup("rindex", kernel.col_ranges, "r")
        self._current_names = {parts.reduce_index: accumulator}
        self._emit_node(template, "template", 0, "xmask & rmask", start=parts.reduce_index + 1)
        for position, (node, role) in enumerate(zip(kernel.nodes, kernel.roles)):
            if position:
                self._emit_node(node, role, position, "xmask & rmask")
        counts = [("xnumel", rows), ("rnumel", columns), ("knumel", inner)] + [("bnumel", size) for size in batch]
        source, function_name, sizes = self._source(counts, list(tile.constexprs))
        programs = program_count(rows, columns, tile) * (batch[0] if batch else 1)
        skip = bool(sympy.sympify(programs).is_Integer and int(programs) == 0)
        return KernelSource(kernel.name, source, list(self.pointer_names), sizes, programs, 1, None, tile.num_warps,
                            self.device_type, skip, function_name, self._pointer_dtypes(),
                            constexpr_values=tile.constexprs, num_stages=tile.num_stages)

    def _reduction_blocks(self, rnumel):
        if rnumel.is_Integer and int(rnumel) == 0:
            # Nothing to reduce: one column, and rows in wide blocks (a (1, 1024) block per row made an
            # all() over a 0-size dim of 858 rows take 160 s under the interpreter: fuzz seed 3008 #303).
            xnumel = self.kernel.row_numel
            xblock = min(1024, _next_power_of_2(max(int(xnumel), 1))) if xnumel.is_Integer else 1024
            return 1, xblock, 4
        xnumel = self.kernel.row_numel
        if self.kernel.outer:
            # Rows are the contiguous dim (kiln/schedule/outer.py): a tile of many rows, so that a
            # warp's loads cover neighbouring elements, and of enough columns to keep 2048 in flight.
            most = _next_power_of_2(int(rnumel)) if rnumel.is_Integer else 1024
            xblock = max(32, min(OUTER_ROWS_PER_PROGRAM, 4096 // most)) if self.kernel.persistent \
                else OUTER_ROWS_PER_PROGRAM
            if xnumel.is_Integer:
                xblock = min(xblock, _next_power_of_2(max(int(xnumel), 1)))
            rblock = most if self.kernel.persistent else min(most, max(8, 2048 // xblock))
            num_warps = 8 if rblock * xblock >= 2048 else 4
            return rblock, xblock, num_warps
        if self.kernel.persistent:
            rblock = _next_power_of_2(int(rnumel))
            xblock = 1 if rblock >= 1024 else max(1, min(64, 1024 // rblock))
        else:
            rblock, xblock = 1024, 1
        if xnumel.is_Integer:
            xblock = min(xblock, _next_power_of_2(max(int(xnumel), 1)))
        # 4 warps up to 4096 elements a block: a row of 4096 then costs 22 instructions per element in
        # layer_norm's kernel (sm_90 SASS), 29 with 8 warps (more of each thread's work is the reduction tree)
        num_warps = 8 if rblock * xblock >= (8192 if self.kernel.persistent else 2048) else 4
        return rblock, xblock, num_warps

    def _index_setup(self, flat: str, ranges: list, prefix: str, order: list | None = None) -> None:
        """`{prefix}k` for each dim k of `ranges`, unravelled from `flat` with the dims walked in
        `order` (outermost first; the last moves fastest from lane to lane), listed order by default."""
        order = list(range(len(ranges))) if order is None else order
        strides, running = {}, sympy.Integer(1)
        for dim in reversed(order):
            strides[dim] = running
            running = running * ranges[dim]
        for dim in range(len(ranges)):
            stride = strides[dim]
            # Parenthesized: a symbolic stride or size prints as a product (`s1*s2`), and
            # `x // s1*s2` is `(x // s1) * s2` in Python.
            value = flat if stride == 1 else f"({flat} // ({self.index_source(stride)}))"
            if dim != order[0]:
                value = f"({value} % ({self.index_source(ranges[dim])}))"
            self.out.add(f"{prefix}{dim} = {value}")

    def _pointwise_body(self) -> None:
        program = "tl.program_id(0).to(tl.int64)" if self.use_int64 else "tl.program_id(0)"
        self.out.add(f"xoffset = {program} * XBLOCK")
        self.out.add("xindex = xoffset + tl.arange(0, XBLOCK)")
        self.out.add("xmask = tl.full([XBLOCK], True, tl.int1)" if self.full_rows else "xmask = xindex < xnumel")
        self._index_setup("xindex", self.kernel.row_ranges, "x", self.kernel.walk_order)
        self._defined = {}
        for position, (node, role) in enumerate(zip(self.kernel.nodes, self.kernel.roles)):
            self._emit_node(node, role, position, "xmask")

    def _reduction_body(self, rnumel) -> None:
        program = "tl.program_id(0).to(tl.int64)" if self.use_int64 else "tl.program_id(0)"
        self.out.add(f"xoffset = {program} * XBLOCK")
        self.out.add("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        self.out.add("xmask = tl.full([XBLOCK, 1], True, tl.int1)" if self.full_rows else "xmask = xindex < xnumel")
        self._index_setup("xindex", self.kernel.row_ranges, "x")
        self.out.add("rbase = tl.arange(0, RBLOCK)[None, :]")
        if self.kernel.persistent:
            self.out.add("rindex = rbase")
            self.out.add("rmask = tl.full([1, RBLOCK], True, tl.int1)" if self.full_columns
                         else "rmask = rindex < rnumel")
            self._index_setup("rindex", self.kernel.col_ranges, "r")
            self._defined = {}
            for position, (node, role) in enumerate(zip(self.kernel.nodes, self.kernel.roles)):
                self._emit_node(node, role, position, "xmask & rmask" if role != "row" else "xmask")
            return
        position = 0
        nodes = list(zip(self.kernel.nodes, self.kernel.roles))
        while position < len(nodes):
            node, role = nodes[position]
            if role == "row":
                self._emit_node(node, role, position, "xmask")
                position += 1
                continue
            if role == "reduction":
                self._emit_looped_reduction(node, position)
                position += 1
                continue
            self._open_column_loop()
            while position < len(nodes) and nodes[position][1] == "full":
                self._emit_node(nodes[position][0], "full", position, "xmask & rmask")
                position += 1
            self.out.depth -= 1

    def _open_column_loop(self) -> None:
        self.out.add("for roffset in range(0, rnumel, RBLOCK):")
        self.out.depth += 1
        self.out.add("rindex = roffset + rbase")
        self.out.add("rmask = rindex < rnumel")
        self._index_setup("rindex", self.kernel.col_ranges, "r")

    # ---- nodes ----------------------------------------------------------------------------
    def _emit_node(self, node, role: str, position: int, mask: str, stop_at_reduce: bool = False,
                   start: int = 0) -> None:
        mapping = var_map(node, role, self.kernel.row_ranges, self.kernel.col_ranges)
        self._mapping = mapping
        self._current_node = node
        self._current_names = getattr(self, "_current_names", {}) if start else {}
        prefix = f"n{position}_"
        for op_index in range(start, len(node.body.ops)):
            op = node.body.ops[op_index]
            if stop_at_reduce and op.name == "reduce":
                return
            name = f"{prefix}{op_index}"
            self._current_names[op_index] = name
            self._emit_op(op, name, mask, role)
            self._current_names[op_index] = self._aliases.get(name, name)

    def _ranges_dict(self) -> dict:
        return kernel_ranges(self.kernel)

    def _offset(self, op) -> tuple[str, set]:
        """A load's or store's element offset in kernel variables, and the kinds of kernel variable
        ('x', 'r') it uses."""
        layout = self.graph.buffers[op.buffer].layout
        index = [sympy.sympify(expr).xreplace(self._mapping) for expr in op.index]
        offset = simplify_index(sympy.expand(layout.offset_of(index)), self._ranges_dict())
        text = self.index_source(offset)
        letters = {symbol_name(symbol)[0] for symbol in offset.free_symbols if is_loop_variable(symbol)}
        if not letters:
            text += " + 0 * xindex"  # a scalar address, broadcast to the block so masks apply
        return text, letters

    def _emit_op(self, op, name: str, mask: str, role: str) -> None:
        names = self._current_names
        args = [names[operand] for operand in op.operands]
        if op.name == "load":
            if op.buffer in self.register_values and not op.operands:
                # the value is a variable of this kernel: use it. A copy (`name = value`) made inside a column
                # loop is a name Triton does not know after the loop, where a looped reduction's finish may
                # read it (a channels-last batch norm's split statistics: mean = K + d, d loaded before the
                # reduce; "NameError: n1_0 is not defined" at ResNet-50's sizes on the GPU, the graph run
                # eagerly; the interpreter, plain Python, knows it)
                self._aliases[name] = self.register_values[op.buffer]
                return
            offset, letters = self._offset(op)
            if self.kernel.is_reduction and not op.operands and "r" not in letters:
                mask = "xmask"  # a per-row value ([XBLOCK, 1]): a tile's mask would not broadcast to its pointer
            elif self.kernel.is_reduction and not op.operands and "x" not in letters and mask != "xmask" and \
                    not any(indirect_value(symbol) is not None for expr in op.index
                            for symbol in sympy.sympify(expr).free_symbols):  # a gathered row varies with x
                # a per-column value (a bias, a norm's weight): one [1, RBLOCK] row of loads, broadcast where it
                # is used, not the same values loaded again for every row of the tile (a template's bias cost
                # 64 loads and their addresses per thread; its gelu epilogue then spilled registers)
                mask = "rmask"
            load_mask = mask if not op.operands else f"({mask}) & {args[0]}"
            self._define(name, f"tl.load({self.pointer(op.buffer)} + ({offset}), {load_mask}, other=0)",
                         shareable=op.buffer not in self._kernel_writes)
        elif op.name == "store":
            self.register_values[op.buffer] = args[0]
            if op.buffer in self.kernel.local_buffers:
                return
            dtype = self.graph.buffers[op.buffer].dtype
            value = args[0] if dtype != torch.bool else f"({args[0]} != 0)"
            store_mask = "xmask" if role in ("row", "reduction") else mask
            self.out.add(f"tl.store({self.pointer(op.buffer)} + ({self._offset(op)[0]}), "
                          f"{value}.to({TRITON_DTYPES[dtype]}), {store_mask})")
        elif op.name == "constant":
            value = op.attr
            if isinstance(value, sympy.Basic):
                value = int(value) if value.is_Integer else float(value)
            if op.dtype == torch.bool:
                value = bool(value)
            elif op.dtype.is_floating_point:
                value = float(value)
            else:
                value = int(value)
            shape = self._scalar_shape()
            full = f"tl.full({shape}, {python_constant(value)}, {TRITON_DTYPES[op.dtype]})"
            if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0:
                full = f"({full} * -1.0)"  # tl.full(shape, -0.0) is +0.0: clamp_max(x, -0.0) must give -0.0
            self._define(name, full)
        elif op.name == "index_expr":
            expr = simplify_index(sympy.sympify(op.attr).xreplace(self._mapping), self._ranges_dict())
            source = self.index_source(expr)
            shape = self._scalar_shape()
            self._define(name, f"(tl.full({shape}, 0, tl.int64) + {source}).to({TRITON_DTYPES[op.dtype]})")
        elif op.name == "to_dtype":
            if op.dtype == torch.bool:
                self._define(name, f"{args[0]} != 0")
            else:
                self._define(name, f"{args[0]}.to({TRITON_DTYPES[op.dtype]})")
        elif op.name == "where":
            self._define(name, f"tl.where({args[0]}, {args[1]}, {args[2]})")
        elif op.name == "check_index":
            self._emit_check_index(op, name, args[0], mask)
        elif op.name in OPS:
            self._define(name, self._math_source(op, args))
        elif op.name == "reduce":
            if not self.kernel.is_reduction:  # its RBLOCK and rindex exist only in reduction kernels
                raise AssertionError(f"{self._current_node.name}: a reduce in pointwise kernel {self.kernel.name}")
            self._emit_persistent_reduce(op, name, args[0], mask)
        elif op.name == "getitem":
            self.out.add(f"{name} = {args[0]}_{op.attr}")
        else:
            raise NotImplementedError(f"Triton codegen for op {op.name}")

    def _define(self, name: str, source: str, shareable: bool = True) -> None:
        """`name = source`; in a kernel without loops, a source an earlier node (or op) already computed is not
        computed again: `name` stands for that variable. A load is shared only from a buffer no node of the kernel
        writes (a load after a store reads the stored value); every other source is a function of its text."""
        if self._defined is not None and shareable:
            earlier = self._defined.setdefault(source, name)
            if earlier != name:
                self._aliases[name] = earlier
                return
        self.out.add(f"{name} = {source}")

    def _emit_check_index(self, op, name: str, value: str, mask: str) -> None:
        """check_index: a lane whose position is outside [0, size) reads position 0 instead (never
        memory outside the tensor, on any device) and sets the graph's status flag, a one-int32
        buffer the wrapper reads after the kernels and raises IndexError for (runtime/support.py).
        Lanes outside the block's mask (tails) compute any value and report nothing."""
        status = self.pointer(INDEX_STATUS)
        self.out.add(f"{name}_outside = ({value} < 0) | ({value} >= {self.index_source(op.attr)})")
        self.out.add(f"{name} = tl.where({name}_outside, 0, {value})")
        self.out.add(f"{name}_flag = ({name}_outside & ({mask})).to(tl.int32)")
        self.out.add(f"tl.store({status} + 0 * {name}_flag, {name}_flag, {name}_flag != 0)")

    def _math_source(self, op, args: list) -> str:
        """A unary or binary op's expression, by the dtype its operands have."""
        operand_dtype = self._current_node.body.ops[op.operands[0]].dtype
        rounded = id(op) in self._rounded_to_16bit(self._current_node.body)
        source, helper = math_source(op.name, operand_dtype, op.dtype, args, self._scalar_shape(), rounded)
        if helper is not None:
            self.helpers.add(helper)
        return source

    def _rounded_to_16bit(self, body) -> set:
        """The ids of `body`'s ops that only casts to float16 or bfloat16 read (one pass per body)."""
        if self._rounded_body is not body:
            readers: dict = {}
            for reader in body.ops:
                for operand in reader.operands:
                    readers.setdefault(operand, []).append(reader)
            self._rounded_body, self._rounded = body, {
                id(body.ops[position]) for position, users in readers.items()
                if all(user.name == "to_dtype" and user.dtype in (torch.float16, torch.bfloat16) for user in users)}
        return self._rounded

    def _scalar_shape(self) -> str:
        """A constant's block shape: of the kernel's rank, so `tl.broadcast_to` a [XBLOCK, RBLOCK] tile works."""
        return "[1, 1]" if self.kernel.is_reduction else "[1]"

    def _emit_persistent_reduce(self, op, name: str, value: str, mask: str) -> None:
        kind = op.attr
        source_dtype = self._current_node.body.ops[op.operands[0]].dtype
        identity = _identity(kind, source_dtype)
        self.out.add(f"{name}_in = tl.broadcast_to({value}, [XBLOCK, RBLOCK])")
        if kind == "welford":
            # Three sums over the row in registers: the mean estimate m0 = sum(x / n) (no
            # overflow where the sum of x would), its correction mean = m0 + sum(x - m0) / n,
            # then the squared deviations from the mean. As in eager's Welford combine, a row
            # of equal values gets its exact mean and var 0 (x - m0 is exact, so is the
            # corrected mean); sum / n alone is a few ulp off.
            count = self.index_source(self.kernel.col_numel)
            if not sympy.sympify(self.kernel.col_numel).is_Atom:
                count = f"({count})"  # a symbolic count: `-1 + s0`, `s0*s1`
            self.out.add(f"{name}_m0 = " + self._row_sum(f"tl.where({mask}, {name}_in * (1.0 / {count}), 0.0)"))
            self.out.add(f"{name}_c = " + self._row_sum(f"tl.where({mask}, {name}_in - {name}_m0, 0.0)"))
            self.out.add(f"{name}_0 = {name}_m0 + {name}_c / {count}")
            self.out.add(f"{name}_d = tl.where({mask}, {name}_in - {name}_0, 0.0)")
            self.out.add(f"{name}_1 = " + self._row_sum(f"{name}_d * {name}_d"))
            self.out.add(f"{name}_2 = tl.full([XBLOCK, 1], 0, {TRITON_DTYPES[source_dtype]}) + {count}")
            return
        if kind in ("argmax", "argmin"):
            self.helpers.add(kind)
            self.out.add(f"{name}_idx = tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)")
            self.out.add(f"_, {name} = tl.reduce((tl.where({mask}, {name}_in, {identity}), {name}_idx), 1, "
                          f"_{kind}_combine)")
            self.out.add(f"{name} = {name}[:, None]")
            return
        if kind in ("any", "all"):
            combine = "max" if kind == "any" else "min"
            self.helpers.add(combine)
            self.out.add(f"{name} = tl.reduce(tl.where({mask}, ({name}_in != 0).to(tl.int32), {identity}), 1, "
                          f"_{combine}_combine)[:, None] != 0")
            return
        self.helpers.add(kind)
        self.out.add(f"{name} = tl.reduce(tl.where({mask}, {name}_in, {identity}), 1, _{kind}_combine)[:, None]")

    def _emit_looped_reduction(self, node, position: int) -> None:
        mapping = var_map(node, "reduction", self.kernel.row_ranges, self.kernel.col_ranges)
        reduce_index = next(k for k, op in enumerate(node.body.ops) if op.name == "reduce")
        reduce_op = node.body.ops[reduce_index]
        kind = reduce_op.attr
        input_dtype = node.body.ops[reduce_op.operands[0]].dtype
        accumulate = TRITON_DTYPES[input_dtype if kind not in ("any", "all") else torch.int32]
        name = f"n{position}_{reduce_index}"
        identity = _identity(kind, input_dtype)
        compensated = kind == "sum" and input_dtype.is_floating_point
        if kind == "welford":
            for part in ("mean", "cmean", "m2", "cm2", "weight"):
                # in the operand's dtype: float64 statistics accumulated in float32 lost half their digits
                self.out.add(f"{name}_{part} = tl.full([XBLOCK, RBLOCK], 0, {accumulate})")
        else:
            self.out.add(f"{name}_acc = tl.full([XBLOCK, RBLOCK], {identity}, {accumulate})")
            if compensated:
                self.out.add(f"{name}_comp = tl.full([XBLOCK, RBLOCK], 0, {accumulate})")
            if kind in ("argmax", "argmin"):
                self.out.add(f"{name}_accidx = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
        self._open_column_loop()
        self._mapping = mapping
        self._emit_node(node, "reduction", position, "xmask & rmask", stop_at_reduce=True)
        value = f"tl.broadcast_to({self._current_names[reduce_op.operands[0]]}, [XBLOCK, RBLOCK])"
        mask = "xmask & rmask"
        if kind == "welford":
            # Welford's updates per lane (no overflow where a sum would; a row of equal values
            # keeps its exact mean and m2 0), with mean and m2 each compensated (_kahan_add)
            # so that long rows stay as accurate as eager's (config.welford_compensation).
            self.out.add(f"{name}_w = tl.where({mask}, {name}_weight + 1.0, {name}_weight)")
            self.out.add(f"{name}_delta = {value} - {name}_mean")
            add = self._kahan_add if config.welford_compensation else self._plain_add
            add(f"{name}_mean", f"{name}_cmean",
                f"tl.where({mask}, {name}_delta / tl.where({name}_w == 0.0, 1.0, {name}_w), 0.0)")
            add(f"{name}_m2", f"{name}_cm2", f"tl.where({mask}, {name}_delta * ({value} - {name}_mean), 0.0)")
            self.out.add(f"{name}_weight = {name}_w")
        elif compensated:
            self._kahan_add(f"{name}_acc", f"{name}_comp", f"tl.where({mask}, {value}, 0.0)")
        elif kind in ("argmax", "argmin"):
            self.helpers.add(kind)
            self.out.add(f"{name}_v, {name}_i = _{kind}_combine({name}_acc, {name}_accidx, {value}, "
                          f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64))")
            self.out.add(f"{name}_acc = tl.where({mask}, {name}_v, {name}_acc)")
            self.out.add(f"{name}_accidx = tl.where({mask}, {name}_i, {name}_accidx)")
        else:
            combine = {"any": "max", "all": "min"}.get(kind, kind)
            self.helpers.add(combine)
            if kind in ("any", "all"):
                value = f"({value} != 0).to(tl.int32)"
            self.out.add(f"{name}_acc = tl.where({mask}, _{combine}_combine({name}_acc, {value}), {name}_acc)")
        self.out.depth -= 1
        if kind == "welford":
            # Each lane's (count, mean, m2), then the lanes merged by Chan's formulas written
            # as tree sums: m0 = sum(mean_l w / n) (no overflow), mean = m0 + sum(w (mean_l - m0)) / n,
            # m2 = sum(m2_l) + sum(w (mean_l - mean)^2). Lanes with equal means merge exactly.
            self.out.add(f"{name}_mean = {name}_mean - {name}_cmean")
            self.out.add(f"{name}_m2 = {name}_m2 - {name}_cm2")
            self.out.add(f"{name}_2 = " + self._row_sum(f"{name}_weight"))
            self.out.add(f"{name}_m0 = " + self._row_sum(f"{name}_mean * ({name}_weight / {name}_2)"))
            self.out.add(f"{name}_0 = {name}_m0 + "
                          + self._row_sum(f"{name}_weight * ({name}_mean - {name}_m0)") + f" / {name}_2")
            self.out.add(f"{name}_d = tl.where({name}_weight == 0.0, 0.0, {name}_mean - {name}_0)")
            self.out.add(f"{name}_1 = " + self._row_sum(f"{name}_m2") + " + "
                          + self._row_sum(f"{name}_weight * {name}_d * {name}_d"))
        elif kind in ("argmax", "argmin"):
            self.out.add(f"_, {name} = tl.reduce(({name}_acc, {name}_accidx), 1, _{kind}_combine)")
            self.out.add(f"{name} = {name}[:, None]")
        else:
            combine = {"any": "max", "all": "min"}.get(kind, kind)
            suffix = " != 0" if kind in ("any", "all") else ""
            if compensated:
                self.out.add(f"{name} = " + self._row_sum(f"{name}_acc - {name}_comp"))
            else:
                self.out.add(f"{name} = tl.reduce({name}_acc, 1, _{combine}_combine)[:, None]{suffix}")
        self._current_names[reduce_index] = name
        self._mapping = mapping
        self._emit_node(node, "reduction", position, "xmask", start=reduce_index + 1)

    def _row_sum(self, value: str) -> str:
        """The [XBLOCK, 1] sum of a [XBLOCK, RBLOCK] value over its row: a tree on the GPU, numpy's
        pairwise sum under the interpreter (kiln/_triton.py)."""
        self.helpers.add("sum")
        return f"tl.reduce({value}, 1, _sum_combine)[:, None]"

    def _plain_add(self, total: str, compensation: str, value: str) -> None:
        """total += value per lane, the compensation left at 0 (config.welford_compensation off)."""
        self.out.add(f"{total} = {total} + {value}")

    def _kahan_add(self, total: str, compensation: str, value: str) -> None:
        """total += value per lane with Kahan's compensation: a lane of a looped reduction adds
        rnumel / RBLOCK values in turn, which alone loses about sqrt(that) ulp (3-8x eager's
        error over 2^24 elements). A compensation that is not finite (an inf or NaN total) is
        dropped, so infinities and NaN propagate as in a plain sum."""
        self.out.add(f"{total}_y = {value} - {compensation}")
        self.out.add(f"{total}_t = {total} + {total}_y")
        self.out.add(f"{compensation} = tl.where({total}_t - {total}_t == 0, ({total}_t - {total}) - {total}_y, 0.0)")
        self.out.add(f"{total} = {total}_t")


def math_source(name: str, operand_dtype: torch.dtype, result_dtype: torch.dtype, args: list,
                shape: str, rounded_to_16bit: bool = False) -> tuple:
    """(expression, the HELPERS entry it calls or None): the op table's first Triton variant that
    applies to these dtypes (kiln/ir/ops.py); `rounded_to_16bit`: only 16-bit casts read the result."""
    renderings = OPS[name].triton
    variants = [variant for variant in triton_variants(operand_dtype, result_dtype, rounded_to_16bit)
                if variant in renderings]
    if not variants:
        raise NotImplementedError(f"Triton codegen for op {name} on {operand_dtype}: ops.py has no rendering")
    template = renderings[variants[0]]
    helper = template[1:template.index("(")] if template.startswith("_") else None
    return template.format(*args, T=TRITON_DTYPES[result_dtype], shape=shape), helper


def generate_kernel(kernel: Kernel, graph: Graph, device_type: str) -> KernelSource:
    """The Triton source of one scheduled kernel, for `device_type`."""
    return TritonKernelGenerator(kernel, graph, device_type).generate()


@dataclass(frozen=True)
class TritonBackend:
    """The Triton backend (a KernelBackend, kiln/codegen/common.py): compiled for CUDA, or run by
    Triton's interpreter on CPU; loaded by kiln/runtime/loader.py."""

    device_type: str
    name: ClassVar[str] = "triton"

    def generate_kernel(self, kernel: Kernel, graph: Graph) -> KernelSource:
        """The kernel's source, with its launch config autotuned where config.autotune_kernels asks."""
        return tune_kernel(generate_kernel(kernel, graph, self.device_type), kernel, graph)

    def loop_dependent_ops(self) -> frozenset:
        return frozenset()  # Triton's libdevice computes each element the same way in every kernel

    def kernel_call(self, source: KernelSource, argument_sources: list, python_source: Callable) -> str:
        """`name(grid_x, *buffers, *sizes)`, the launch function of kiln/runtime/launch.py."""
        xnumel = sympy.sympify(source.xnumel)
        grid_x = str(-(-int(xnumel) // source.xblock)) if xnumel.is_Integer else \
            f"cdiv({python_source(xnumel)}, {source.xblock})"
        return f"{source.name}({', '.join([grid_x] + argument_sources)})"

    def load_kernels(self, kernel_sources: list) -> dict:
        return load_triton_kernels(kernel_sources)

    def kernel_generated(self, source: KernelSource) -> None:
        compile_early(source)  # a CUDA kernel's compile starts while the rest of the graph is generated
