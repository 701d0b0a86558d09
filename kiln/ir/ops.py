"""The pointwise op table: one row per unary and binary LoopIR op, with everything a backend needs.

A row holds the op's name (an `Op`, a `str` enum, so bodies keep plain strings and compare equal),
its arity, its dtype rule (which operand dtypes it takes and whether its result is bool), its cost
class, and its renderings: Triton and C++ text templates keyed by *variant*. A variant is a dtype
case; each backend tries its variants in a fixed order and falls back to "default":

    Triton (by the operand's dtype, then the result's):  bool (both bool), integer, signed | unsigned
        (non-floating operands; bool counts as unsigned), float, float32 (both float32), low_precision
        (an fp16/bf16 result), default.
    C++ (by the result's dtype):  bool, integer (not floating), low_precision (fp16/bf16), default.

Templates take `{0}`, `{1}` (operands) and `{T}` (the result's type in the backend's spelling);
Triton's also `{shape}` (a constant's block shape), C++'s `{D}` (the dtype's name). A Triton template
starting with `_` calls one of codegen/triton.py's HELPERS. A case no dtype expresses (a pow by the
constant 2 or 3) is a LoopIR rewrite for every backend (kiln/schedule/passes.py), not a variant.

`aten`: the ATen ops the row implements one to one (an OpOverloadPacket stands for all its overloads).
kiln/lowering/pointwise.py lowers each with the generic unary or binary rule under the row's dtype rule,
and kiln/aot/decompositions.py keeps each out of core ATen's decompositions; an ATen op that needs a
special rule (pow's constant exponents, floor's integer fallback) has its own lowering and no `aten`.

`cpp_prelude`: C++ helper functions that this op alone calls (kiln/codegen/cpp_prelude.py appends
them to the helpers every kernel shares).

`vector_math`: C++'s rendering calls libm in a scalar loop and libmvec in an `omp simd` loop, which
round differently (so a value is computed in one loop only: schedule/inline.py). `exact`: the op's
fp16/bf16 result needs no rounding back to the 16-bit format (C++ holds those as float).

Triton's interpreter (kiln/_triton.py, how CPU tests run the GPU code path) has no libdevice: it
computes each symbol with the numpy function of `LIBDEVICE_INTERPRETER`, beside the rows (a symbol, not
an op: several rows and codegen/triton.py's HELPERS share them), which this module registers there.
tests/ir/test_ops.py checks every symbol a Triton rendering or helper calls has one. The other LoopIR
ops (load, store, constant, index_expr, to_dtype, where, reduce, getitem, check_index) take attributes
or address buffers; they have no row and each generator renders them in code. What verify() checks of
them (arity, operand and result dtypes) is an `OpSpec` each in `SPECS`, at the end of this module.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kiln import _torch, _triton

aten = _torch.aten


class Op(enum.StrEnum):
    """A pointwise LoopIR op's name; equal to (and formatted as) the plain string."""

    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    ERF = "erf"
    ERFC = "erfc"
    ERF_FOR_16BIT = "erf_for_16bit"
    ERFINV = "erfinv"
    LGAMMA = "lgamma"
    SIGMOID = "sigmoid"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    RECIPROCAL = "reciprocal"
    LOGICAL_NOT = "logical_not"
    ISNAN = "isnan"
    ISINF = "isinf"
    SIGNBIT = "signbit"
    RELU = "relu"
    FRAC = "frac"
    SQUARE = "square"
    NORMAL_CDF = "normal_cdf"
    SIGN = "sign"
    BITWISE_NOT = "bitwise_not"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    TRUEDIV = "truediv"
    POW = "pow"
    ATAN2 = "atan2"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LEFT_SHIFT = "left_shift"
    RIGHT_SHIFT = "right_shift"
    COPYSIGN = "copysign"
    HYPOT = "hypot"
    NEXTAFTER = "nextafter"
    FMOD = "fmod"
    FLOORDIV = "floordiv"
    TRUNCDIV = "truncdiv"
    REMAINDER = "remainder"
    FMAX = "fmax"
    FMIN = "fmin"
    LOGADDEXP = "logaddexp"
    XLOGY = "xlogy"
    PHILOX = "philox"


@dataclass(frozen=True)
class DtypeRule:
    """Which dtype classes an op's operands may have, and whether its result is bool (else it is the
    operands' dtype). Math on fp16/bf16 runs in fp32 (`low_precision` operands only where the op
    steps by the 16-bit format's ulp)."""

    name: str
    operands: frozenset
    bool_result: bool = False


DTYPE_CLASSES = {
    "float": (torch.float32, torch.float64), "low_precision": (torch.float16, torch.bfloat16),
    "signed": (torch.int8, torch.int16, torch.int32, torch.int64), "unsigned": (torch.uint8,),
    "bool": (torch.bool,),
}
FLOAT = DtypeRule("float only", frozenset({"float"}))
FLOAT_STORAGE = DtypeRule("float, in the storage dtype", frozenset({"float", "low_precision"}))
NUMBER = DtypeRule("float or integer", frozenset({"float", "signed", "unsigned"}))
ANY = DtypeRule("any", frozenset({"float", "signed", "unsigned", "bool"}))
INTEGER = DtypeRule("integer only", frozenset({"signed", "unsigned"}))
BITWISE = DtypeRule("integer or bool", frozenset({"signed", "unsigned", "bool"}))
COMPARE = DtypeRule("any, bool result", frozenset({"float", "signed", "unsigned", "bool"}), bool_result=True)
LOGICAL = DtypeRule("bool, bool result", frozenset({"bool"}), bool_result=True)

# Cost classes. An expensive op (a libm call, a long polynomial, an IEEE division or square root) costs far
# more than a load or an add: its value is not recomputed per element of a broadcast (schedule/inline.py),
# and the C++ backend keeps it in a row array rather than computing it twice (codegen/cpp.py). Division and
# square roots are expensive on the GPU: correctly rounded, each is a slow-path sequence of 10-20
# instructions (a batch norm's 1 / sqrt(var + eps), recomputed per element of an NHWC activation, was 40
# of its kernel's 56 sm_90 instructions per element: benchmarks/results/2026-12-05_row-kernels-sass_cpu.md).
CHEAP = "cheap"
EXPENSIVE = "expensive"

TRITON_VARIANTS = ("bool", "integer", "signed", "unsigned", "float", "rounded_to_16bit", "float32", "low_precision",
                   "default")
CPP_VARIANTS = ("bool", "integer", "low_precision", "default")


@dataclass(frozen=True)
class OpRow:
    """One pointwise op: what the IR, the scheduler and every backend need to know about it."""

    op: Op
    arity: int
    dtype_rule: DtypeRule
    cost: str
    triton: dict
    cpp: dict
    vector_math: bool = False
    exact: bool = False
    aten: tuple = ()
    cpp_prelude: str = ""


def _row(op: Op, arity: int, dtype_rule: DtypeRule, cost: str, *, triton, cpp, vector_math: bool = False,
         exact: bool = False, aten=(), cpp_prelude: str = "") -> OpRow:
    """A row; a rendering given as one string is its "default" variant, an ATen op as one its 1-tuple."""
    triton = {"default": triton} if isinstance(triton, str) else triton
    cpp = {"default": cpp} if isinstance(cpp, str) else cpp
    aten = aten if isinstance(aten, tuple) else (aten,)
    return OpRow(op, arity, dtype_rule, cost, triton, cpp, vector_math, exact, aten, cpp_prelude)


# C++ helpers that one op alone calls (its row's `cpp_prelude`; kiln/codegen/cpp_prelude.py appends them).
CPP_ERFINV = r"""
// erfinv: Winitzki's approximation refined by Newton steps in double (erfc near +-1).
static inline double kiln_erfinv(double y) {
    if (y != y || y < -1 || y > 1) return std::numeric_limits<double>::quiet_NaN();
    if (y == 1) return std::numeric_limits<double>::infinity();
    if (y == -1) return -std::numeric_limits<double>::infinity();
    const double a = 0.147, two_over_pi_a = 2.0 / (3.14159265358979323846 * a);
    double log_term = std::log((1.0 - y) * (1.0 + y));
    double first = two_over_pi_a + 0.5 * log_term;
    double x = std::sqrt(std::sqrt(first * first - log_term / a) - first);
    x = y < 0 ? -x : x;
    double magnitude = std::fabs(y), tail = 1.0 - magnitude;
    for (int step = 0; step < 4; step++) {
        double slope = 2.0 / std::sqrt(3.14159265358979323846) * std::exp(-x * x);
        if (slope == 0) break;
        if (magnitude > 0.9) {
            double ax = std::fabs(x);
            ax += (std::erfc(ax) - tail) / slope;
            x = y < 0 ? -ax : ax;
        } else {
            x -= (std::erf(x) - y) / slope;
        }
    }
    return x;
}
"""

# Philox4x32-10 (Salmon, Moraes, Dror and Shaw, SC'11), the generator of curand and of Triton's tl.randint:
# key = the seed's low and high 32-bit words, counter = (the offset's low and high words, 0, 0); the first
# output word, zero-extended. Ten rounds of two 32x32 -> 64-bit products, the key bumped by the Weyl constants.
CPP_PHILOX = r"""
static inline int64_t kiln_philox(int64_t seed, int64_t offset) {
    uint32_t c0 = (uint32_t)(uint64_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)(uint64_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t next0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, next2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = next0;
        c2 = next2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return (int64_t)c0;
}
"""

ROWS = [
    _row(Op.NEG, 1, NUMBER, CHEAP, aten=aten.neg, exact=True,
         triton={"float": "({0} * -1.0)", "default": "-{0}"},
         cpp="(-{0})"),
    _row(Op.ABS, 1, NUMBER, CHEAP, aten=aten.abs, exact=True,
         triton="tl.abs({0})",
         cpp="std::abs({0})"),
    _row(Op.EXP, 1, FLOAT, EXPENSIVE, aten=aten.exp,
         triton="libdevice.exp({0})",
         cpp="kiln_exp({0})"),
    _row(Op.EXP2, 1, FLOAT, EXPENSIVE, aten=aten.exp2, vector_math=True,
         triton="libdevice.exp2({0})",
         cpp="std::exp2({0})"),
    _row(Op.EXPM1, 1, FLOAT, EXPENSIVE, aten=aten.expm1, vector_math=True,
         triton="libdevice.expm1({0})",
         cpp="std::expm1({0})"),
    _row(Op.LOG, 1, FLOAT, EXPENSIVE, aten=aten.log, vector_math=True,
         triton="libdevice.log({0})",
         cpp="std::log({0})"),
    _row(Op.LOG2, 1, FLOAT, EXPENSIVE, aten=aten.log2, vector_math=True,
         triton="libdevice.log2({0})",
         cpp="std::log2({0})"),
    _row(Op.LOG10, 1, FLOAT, EXPENSIVE, aten=aten.log10, vector_math=True,
         triton="libdevice.log10({0})",
         cpp="std::log10({0})"),
    _row(Op.LOG1P, 1, FLOAT, EXPENSIVE, aten=aten.log1p, vector_math=True,
         triton="libdevice.log1p({0})",
         cpp="std::log1p({0})"),
    _row(Op.SQRT, 1, FLOAT, EXPENSIVE, aten=aten.sqrt,
         triton={"float32": "tl.sqrt_rn({0})", "default": "libdevice.sqrt({0})"},
         cpp="std::sqrt({0})"),
    _row(Op.RSQRT, 1, FLOAT, EXPENSIVE, aten=aten.rsqrt,
         triton="libdevice.rsqrt({0})",
         cpp="(({T})1 / std::sqrt({0}))"),
    _row(Op.SIN, 1, FLOAT, EXPENSIVE, aten=aten.sin, vector_math=True,
         triton="libdevice.sin({0})",
         cpp="std::sin({0})"),
    _row(Op.COS, 1, FLOAT, EXPENSIVE, aten=aten.cos, vector_math=True,
         triton="libdevice.cos({0})",
         cpp="std::cos({0})"),
    _row(Op.TAN, 1, FLOAT, EXPENSIVE, aten=aten.tan, vector_math=True,
         triton="libdevice.tan({0})",
         cpp="std::tan({0})"),
    _row(Op.ASIN, 1, FLOAT, EXPENSIVE, aten=aten.asin, vector_math=True,
         triton="libdevice.asin({0})",
         cpp="std::asin({0})"),
    _row(Op.ACOS, 1, FLOAT, EXPENSIVE, aten=aten.acos, vector_math=True,
         triton="libdevice.acos({0})",
         cpp="std::acos({0})"),
    _row(Op.ATAN, 1, FLOAT, EXPENSIVE, aten=aten.atan, vector_math=True,
         triton="libdevice.atan({0})",
         cpp="std::atan({0})"),
    _row(Op.SINH, 1, FLOAT, EXPENSIVE, aten=aten.sinh, vector_math=True,
         triton="libdevice.sinh({0})",
         cpp="std::sinh({0})"),
    _row(Op.COSH, 1, FLOAT, EXPENSIVE, aten=aten.cosh, vector_math=True,
         triton="libdevice.cosh({0})",
         cpp="std::cosh({0})"),
    _row(Op.TANH, 1, FLOAT, EXPENSIVE, aten=aten.tanh, vector_math=True,
         triton="libdevice.tanh({0})",
         cpp="std::tanh({0})"),
    _row(Op.ASINH, 1, FLOAT, EXPENSIVE, aten=aten.asinh, vector_math=True,
         triton="libdevice.asinh({0})",
         cpp="std::asinh({0})"),
    _row(Op.ACOSH, 1, FLOAT, EXPENSIVE, aten=aten.acosh, vector_math=True,
         triton="libdevice.acosh({0})",
         cpp="std::acosh({0})"),
    _row(Op.ATANH, 1, FLOAT, EXPENSIVE, aten=aten.atanh, vector_math=True,
         triton="libdevice.atanh({0})",
         cpp="std::atanh({0})"),
    _row(Op.ERF, 1, FLOAT, EXPENSIVE, aten=aten.erf, vector_math=True,
         triton="libdevice.erf({0})",
         cpp="std::erf({0})"),
    # erf of a value that only a 16-bit result depends on (gelu of a bfloat16 or float16 tensor on CUDA): in
    # float32 a fitted 1 - 2^P(|z|) within 1.9e-7 of erf (codegen/triton.py's _erf_for_16bit says how, and how
    # close to eager's 16-bit values); elsewhere erf itself.
    _row(Op.ERF_FOR_16BIT, 1, FLOAT, EXPENSIVE, vector_math=True,
         triton={"float32": "_erf_for_16bit({0})", "default": "libdevice.erf({0})"},
         cpp="std::erf({0})"),
    _row(Op.ERFC, 1, FLOAT, EXPENSIVE, aten=aten.erfc, vector_math=True,
         triton="libdevice.erfc({0})",
         cpp="std::erfc({0})"),
    _row(Op.ERFINV, 1, FLOAT, EXPENSIVE, aten=aten.erfinv, cpp_prelude=CPP_ERFINV,
         triton="libdevice.erfinv({0})",
         cpp="({T})kiln_erfinv((double){0})"),
    _row(Op.LGAMMA, 1, FLOAT, EXPENSIVE, aten=aten.lgamma,
         triton="libdevice.lgamma({0})",
         cpp="std::lgamma({0})"),
    _row(Op.SIGMOID, 1, FLOAT, EXPENSIVE, aten=aten.sigmoid,
         triton={"float32": "tl.div_rn(1.0, 1.0 + libdevice.exp(-{0}))",
                 "default": "(1.0 / (1.0 + libdevice.exp(-{0})))"},
         cpp="(({T})1 / (({T})1 + kiln_exp(-{0})))"),
    _row(Op.FLOOR, 1, NUMBER, CHEAP,
         triton={"integer": "{0}", "default": "libdevice.floor({0})"},
         cpp={"integer": "{0}", "default": "std::floor({0})"}),
    _row(Op.CEIL, 1, NUMBER, CHEAP,
         triton={"integer": "{0}", "default": "libdevice.ceil({0})"},
         cpp={"integer": "{0}", "default": "std::ceil({0})"}),
    _row(Op.ROUND, 1, NUMBER, CHEAP,
         triton={"integer": "{0}", "default": "libdevice.nearbyint({0})"},
         cpp={"integer": "{0}", "default": "std::nearbyint({0})"}),
    _row(Op.TRUNC, 1, NUMBER, CHEAP,
         triton={"integer": "{0}", "default": "libdevice.trunc({0})"},
         cpp={"integer": "{0}", "default": "std::trunc({0})"}),
    _row(Op.RECIPROCAL, 1, FLOAT, EXPENSIVE, aten=aten.reciprocal,
         triton={"rounded_to_16bit": "(1.0 / {0})", "float32": "tl.div_rn(1.0, {0})", "default": "(1.0 / {0})"},
         cpp="(({T})1 / {0})"),
    _row(Op.LOGICAL_NOT, 1, LOGICAL, CHEAP,
         triton="({0} == 0)",
         cpp="({0} == 0)"),
    _row(Op.ISNAN, 1, COMPARE, CHEAP,
         triton="({0} != {0})",
         cpp="({0} != {0})"),
    _row(Op.ISINF, 1, COMPARE, CHEAP,
         triton='(tl.abs({0}) == float("inf"))',
         cpp="std::isinf({0})"),
    _row(Op.SIGNBIT, 1, COMPARE, CHEAP,
         triton={"integer": "({0} < 0)", "default": "(libdevice.signbit({0}) != 0)"},
         cpp="kiln_signbit({0})"),
    _row(Op.RELU, 1, NUMBER, CHEAP, aten=aten.relu,
         triton="tl.where({0} < 0, 0, {0})",
         cpp="({0} < 0 ? ({T})0 : {0})"),
    _row(Op.FRAC, 1, FLOAT, CHEAP,
         triton="({0} - libdevice.trunc({0}))",
         cpp="({0} - std::trunc({0}))"),
    _row(Op.SQUARE, 1, NUMBER, CHEAP,
         triton="({0} * {0})",
         cpp="({0} * {0})"),
    _row(Op.NORMAL_CDF, 1, FLOAT, EXPENSIVE,
         triton="(0.5 * libdevice.erfc({0} * -0.7071067811865476))",
         cpp="kiln_normal_cdf({0})"),
    _row(Op.SIGN, 1, ANY, CHEAP,
         triton={"bool": "{0}", "default": "({0} > 0).to({T}) - ({0} < 0).to({T})"},
         cpp="kiln_sign<{T}>({0})"),
    _row(Op.BITWISE_NOT, 1, BITWISE, CHEAP, aten=aten.bitwise_not,
         triton={"bool": "({0} == 0)", "unsigned": "{0} ^ tl.full({shape}, 255, tl.uint8)", "default": "~{0}"},
         cpp={"bool": "(!{0})", "default": "(~{0})"}),
    _row(Op.ADD, 2, ANY, CHEAP, aten=(aten.add.Tensor, aten.add.Scalar),
         triton={"bool": "({0} | {1})", "default": "({0} + {1})"},
         cpp="({0} + {1})"),
    _row(Op.SUB, 2, NUMBER, CHEAP, aten=(aten.sub.Tensor, aten.sub.Scalar),
         triton={"bool": "({0} ^ {1})", "default": "({0} - {1})"},
         cpp="({0} - {1})"),
    _row(Op.MUL, 2, ANY, CHEAP, aten=(aten.mul.Tensor, aten.mul.Scalar),
         triton={"bool": "({0} & {1})", "default": "({0} * {1})"},
         cpp="({0} * {1})"),
    _row(Op.TRUEDIV, 2, FLOAT, EXPENSIVE,
         triton={"rounded_to_16bit": "({0} / {1})", "float32": "tl.div_rn({0}, {1})", "default": "({0} / {1})"},
         cpp="({0} / {1})"),
    _row(Op.POW, 2, NUMBER, EXPENSIVE, vector_math=True,
         triton={"signed": "_pow_integer({0}, {1})",
                 "unsigned": "_pow_integer({0}, {1})",
                 "default": "libdevice.pow({0}, {1})"},
         cpp={"integer": "kiln_integer_pow<{T}>({0}, {1})",
                 "default": "std::pow({0}, {1})"}),
    _row(Op.ATAN2, 2, FLOAT, EXPENSIVE, aten=aten.atan2, vector_math=True,
         triton="libdevice.atan2({0}, {1})",
         cpp="std::atan2({0}, {1})"),
    _row(Op.MAXIMUM, 2, ANY, CHEAP, aten=aten.maximum.default,
         triton="tl.where(({0} > {1}) | ({0} != {0}), {0}, {1})",
         cpp="kiln_maximum<{T}>({0}, {1})"),
    _row(Op.MINIMUM, 2, ANY, CHEAP, aten=aten.minimum.default,
         triton="tl.where(({0} < {1}) | ({0} != {0}), {0}, {1})",
         cpp="kiln_minimum<{T}>({0}, {1})"),
    _row(Op.EQ, 2, COMPARE, CHEAP, aten=aten.eq,
         triton="({0} == {1})",
         cpp="({0} == {1})"),
    _row(Op.NE, 2, COMPARE, CHEAP, aten=aten.ne,
         triton="({0} != {1})",
         cpp="({0} != {1})"),
    _row(Op.LT, 2, COMPARE, CHEAP, aten=aten.lt,
         triton="({0} < {1})",
         cpp="({0} < {1})"),
    _row(Op.LE, 2, COMPARE, CHEAP, aten=aten.le,
         triton="({0} <= {1})",
         cpp="({0} <= {1})"),
    _row(Op.GT, 2, COMPARE, CHEAP, aten=aten.gt,
         triton="({0} > {1})",
         cpp="({0} > {1})"),
    _row(Op.GE, 2, COMPARE, CHEAP, aten=aten.ge,
         triton="({0} >= {1})",
         cpp="({0} >= {1})"),
    _row(Op.LOGICAL_AND, 2, LOGICAL, CHEAP, aten=aten.logical_and,
         triton="(({0} != 0) & ({1} != 0))",
         cpp="(({0} != 0) & ({1} != 0))"),
    _row(Op.LOGICAL_OR, 2, LOGICAL, CHEAP, aten=aten.logical_or,
         triton="(({0} != 0) | ({1} != 0))",
         cpp="(({0} != 0) | ({1} != 0))"),
    _row(Op.LOGICAL_XOR, 2, LOGICAL, CHEAP, aten=aten.logical_xor,
         triton="(({0} != 0) ^ ({1} != 0))",
         cpp="(({0} != 0) != ({1} != 0))"),
    _row(Op.BITWISE_AND, 2, BITWISE, CHEAP, aten=(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
         triton="({0} & {1})",
         cpp="({0} & {1})"),
    _row(Op.BITWISE_OR, 2, BITWISE, CHEAP, aten=(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
         triton="({0} | {1})",
         cpp="({0} | {1})"),
    _row(Op.BITWISE_XOR, 2, BITWISE, CHEAP, aten=(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
         triton="({0} ^ {1})",
         cpp="({0} ^ {1})"),
    _row(Op.LEFT_SHIFT, 2, INTEGER, CHEAP,
         triton="({0} << {1})",
         cpp="kiln_left_shift<{T}>({0}, {1})"),
    _row(Op.RIGHT_SHIFT, 2, INTEGER, CHEAP,
         triton="({0} >> {1})",
         cpp="kiln_right_shift<{T}>({0}, {1})"),
    _row(Op.COPYSIGN, 2, FLOAT, CHEAP, aten=(aten.copysign.Tensor, aten.copysign.Scalar),
         triton="libdevice.copysign({0}, {1})",
         cpp="std::copysign({0}, {1})"),
    _row(Op.HYPOT, 2, FLOAT, CHEAP, aten=aten.hypot, vector_math=True,
         triton="libdevice.hypot({0}, {1})",
         cpp="std::hypot({0}, {1})"),
    _row(Op.NEXTAFTER, 2, FLOAT_STORAGE, CHEAP, aten=aten.nextafter,
         triton={"low_precision": "_nextafter_16({0}, {1})", "default": "libdevice.nextafter({0}, {1})"},
         cpp={"low_precision": "kiln_nextafter_{D}({0}, {1})", "default": "std::nextafter({0}, {1})"}),
    _row(Op.FMOD, 2, NUMBER, CHEAP,
         triton={"signed": "_fmod_integer({0}, {1})",
                 "unsigned": "tl.where({1} == 0, 0, {0} % tl.where({1} == 0, 1, {1}))",
                 "default": "libdevice.fmod({0}, {1})"},
         cpp="kiln_fmod<{T}>({0}, {1})"),
    _row(Op.FLOORDIV, 2, NUMBER, CHEAP,
         triton={"signed": "_floordiv_integer({0}, {1})",
                 "unsigned": "tl.where({1} == 0, 0, {0} // tl.where({1} == 0, 1, {1}))",
                 "default": "_floordiv_float({0}, {1})"},
         cpp="kiln_floordiv<{T}>({0}, {1})"),
    _row(Op.TRUNCDIV, 2, NUMBER, CHEAP,
         triton={"signed": "_truncdiv_integer({0}, {1})",
                 "unsigned": "tl.where({1} == 0, 0, {0} // tl.where({1} == 0, 1, {1}))",
                 "default": "libdevice.trunc({0} / {1})"},
         cpp="kiln_truncdiv<{T}>({0}, {1})"),
    _row(Op.REMAINDER, 2, NUMBER, CHEAP,
         triton={"signed": "_remainder_integer({0}, {1})",
                 "unsigned": "tl.where({1} == 0, 0, {0} % tl.where({1} == 0, 1, {1}))",
                 "default": "_remainder_float({0}, {1})"},
         cpp="kiln_remainder<{T}>({0}, {1})"),
    _row(Op.FMAX, 2, ANY, CHEAP,
         triton="tl.where(({0} > {1}) | ({1} != {1}), {0}, {1})",
         cpp="std::fmax({0}, {1})"),
    _row(Op.FMIN, 2, ANY, CHEAP,
         triton="tl.where(({0} < {1}) | ({1} != {1}), {0}, {1})",
         cpp="std::fmin({0}, {1})"),
    # eager's CPU kernel: a itself where a == b is an infinity (inf - inf is NaN); NaN passes through a - b
    _row(Op.LOGADDEXP, 2, FLOAT, EXPENSIVE, aten=aten.logaddexp, vector_math=True,
         triton="tl.where(({0} == {1}) & (tl.abs({0}) == float(\"inf\")), {0}, "
                "tl.maximum({0}, {1}) + libdevice.log1p(libdevice.exp(-tl.abs({0} - {1}))))",
         cpp="(({0} == {1} && std::isinf({0})) ? {0} : "
             "std::max({0}, {1}) + std::log1p(kiln_exp(-std::abs({0} - {1}))))"),
    # eager's kernel: NaN where y is NaN, else 0 where x == 0 (whatever y is), else x * log(y)
    _row(Op.XLOGY, 2, FLOAT, EXPENSIVE, vector_math=True,
         aten=(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other),
         triton='tl.where({1} != {1}, float("nan"), tl.where({0} == 0, 0.0, {0} * libdevice.log({1})))',
         cpp="({1} != {1} ? std::numeric_limits<{T}>::quiet_NaN() : {0} == 0 ? ({T})0 : {0} * std::log({1}))"),
    # philox(seed, offset): a uniform 32-bit random word (in [0, 2**32), converted to the operands' integer
    # dtype as a C cast does) from the operands' int64 values; in-kernel dropout (kiln/aot/random.py)
    # compares it with a threshold. The same bits on every backend: tests/lowering/test_random.py.
    _row(Op.PHILOX, 2, INTEGER, EXPENSIVE, cpp_prelude=CPP_PHILOX,
         triton="_philox({0}, {1}).to({T})",
         cpp="(({T})kiln_philox((int64_t)({0}), (int64_t)({1})))"),
]
OPS = {row.op.value: row for row in ROWS}


def _torch_unary(name: str):
    """torch's elementwise `name` on a numpy array (torch's special values: lgamma(0) = inf)."""
    def function(x):
        array = np.array(x, order="C", copy=True)
        return getattr(torch, name)(torch.from_numpy(array)).numpy().reshape(array.shape)
    return function


# The Triton interpreter's libdevice: symbol (without `__nv_`; its f/d suffix dropped) -> numpy function.
LIBDEVICE_INTERPRETER = {
    "tanh": np.tanh, "pow": np.power, "atan2": np.arctan2, "expm1": np.expm1, "log1p": np.log1p,
    "erf": _torch_unary("erf"), "erfc": _torch_unary("erfc"), "lgamma": _torch_unary("lgamma"),
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "tan": np.tan, "log10": np.log10,
    "log": np.log, "exp": np.exp, "log2": np.log2, "exp2": np.exp2, "nearbyint": np.rint, "rint": np.rint,
    "trunc": np.trunc, "signbit": np.signbit, "isnan": np.isnan, "isinf": np.isinf, "fmod": np.fmod,
    "hypot": np.hypot, "copysign": np.copysign, "nextafter": np.nextafter, "erfinv": _torch_unary("erfinv"),
    "fmax": np.fmax, "fmin": np.fmin, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "floor": np.floor, "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "fabs": np.abs, "abs": np.abs,
    "cbrt": np.cbrt, "isfinited": np.isfinite, "finitef": np.isfinite,
}
_triton.register_libdevice(LIBDEVICE_INTERPRETER)


def triton_variants(operand: torch.dtype, result: torch.dtype, rounded_to_16bit: bool = False) -> list:
    """The Triton variants to try for these dtypes, most specific first. `rounded_to_16bit`: the float32
    result is read only by casts to float16 or bfloat16 (see codegen/triton.py on float32 division)."""
    variants = ["bool"] if operand == torch.bool and result == torch.bool else []
    if rounded_to_16bit and operand == torch.float32 and result == torch.float32:
        variants.append("rounded_to_16bit")
    if not operand.is_floating_point:
        variants += ["integer", "unsigned" if operand in (torch.uint8, torch.bool) else "signed"]
    else:
        variants.append("float")
        if result == torch.float32 and operand == torch.float32:
            variants.append("float32")
        if result in (torch.float16, torch.bfloat16):
            variants.append("low_precision")
    return variants + ["default"]


def cpp_variants(result: torch.dtype) -> list:
    """The C++ variants to try for this result dtype, most specific first."""
    variants = ["bool"] if result == torch.bool else []
    if not result.is_floating_point:
        variants.append("integer")
    if result in (torch.float16, torch.bfloat16):
        variants.append("low_precision")
    return variants + ["default"]


# What verify() checks of every op, built from this module: a row's arity and DtypeRule, and for the
# other ops (no row: they take attributes or address buffers) an `OpSpec` below. One function,
# `dtype_problems`, applies both, so the verifier holds no op knowledge of its own.

INTEGER_DTYPES = DTYPE_CLASSES["signed"] + DTYPE_CLASSES["unsigned"]
REDUCTION_KINDS = ("sum", "prod", "max", "min", "argmax", "argmin", "welford", "any", "all")
WELFORD_RESULTS = 3  # mean, m2, count


@dataclass(frozen=True)
class OpSpec:
    """A LoopIR op without a pointwise row: the operand counts it takes and its dtype rule.

    `check(op, operand_dtypes, buffer_dtype)` returns the rule's violations as short sentences;
    `buffer_dtype` is the dtype of the buffer a load or store addresses (None for other ops).
    """

    name: str
    operand_counts: tuple
    rule: str
    check: Callable


def _dtype_class(dtype: torch.dtype | None) -> str | None:
    return next((name for name, members in DTYPE_CLASSES.items() if dtype in members), None)


def _named(dtype) -> str:
    return "no dtype" if dtype is None else str(dtype).replace("torch.", "")


def _load(op, operands, buffer_dtype) -> list:
    problems = [f"mask is {_named(operands[0])}, not bool"] if operands and operands[0] != torch.bool else []
    if op.dtype != buffer_dtype:
        problems.append(f"result is {_named(op.dtype)} but the buffer holds {_named(buffer_dtype)}")
    return problems


def _store(op, operands, buffer_dtype) -> list:
    problems = [] if op.dtype is None else [f"has a result dtype {_named(op.dtype)} (a store has no result)"]
    if operands and operands[0] != buffer_dtype:
        problems.append(f"stores a {_named(operands[0])} value into a {_named(buffer_dtype)} buffer")
    return problems


def _has_dtype(op, operands, buffer_dtype) -> list:
    return [] if op.dtype is not None else ["has no result dtype"]


def _where(op, operands, buffer_dtype) -> list:
    condition, if_true, if_false = operands
    problems = [] if condition == torch.bool else [f"condition is {_named(condition)}, not bool"]
    if not if_true == if_false == op.dtype:
        problems.append(f"branches are {_named(if_true)} and {_named(if_false)}, result {_named(op.dtype)}")
    return problems


def _reduce(op, operands, buffer_dtype) -> list:
    if op.attr not in REDUCTION_KINDS:
        return [f"unknown reduction {op.attr!r}"]
    expected = torch.int64 if op.attr in ("argmax", "argmin") else operands[0]
    if op.dtype != expected:
        return [f"{op.attr} of {_named(operands[0])} has result {_named(op.dtype)}, not {_named(expected)}"]
    return []


def _getitem(op, operands, buffer_dtype) -> list:
    problems = [] if op.dtype == operands[0] else \
        [f"result is {_named(op.dtype)}, the welford values are {_named(operands[0])}"]
    if not (isinstance(op.attr, int) and 0 <= op.attr < WELFORD_RESULTS):
        problems.append(f"position {op.attr!r} is not one of welford's {WELFORD_RESULTS} values")
    return problems


def _check_index(op, operands, buffer_dtype) -> list:
    problems = [] if operands[0] in INTEGER_DTYPES else [f"checks a {_named(operands[0])} position, not an integer"]
    if op.dtype != torch.int64:
        problems.append(f"result is {_named(op.dtype)}, not int64")
    return problems


SPECS = {spec.name: spec for spec in (
    OpSpec("load", (0, 1), "the buffer's dtype; the optional mask is bool", _load),
    OpSpec("store", (1,), "the value is in the buffer's dtype (lowering converts before it stores); no result",
           _store),
    OpSpec("constant", (0,), "its own dtype (attr: the value)", _has_dtype),
    OpSpec("index_expr", (0,), "its own dtype (attr: the expression)", _has_dtype),
    OpSpec("to_dtype", (1,), "any dtype to its own", _has_dtype),
    OpSpec("where", (3,), "a bool condition, two branches of the result's dtype", _where),
    OpSpec("reduce", (1,), "the operand's dtype; int64 for argmax/argmin", _reduce),
    OpSpec("getitem", (1,), "one of welford's values, in their dtype", _getitem),
    OpSpec("check_index", (1,), "an integer position, checked as int64", _check_index),
)}


def operand_counts(name: str) -> tuple:
    """How many operands op `name` may take (a row's arity, or its spec's counts)."""
    return (OPS[name].arity,) if name in OPS else SPECS[name].operand_counts


def dtype_problems(op, operand_dtypes: list, buffer_dtype: torch.dtype | None = None) -> list:
    """The ways `op` (a body's `Op`) breaks its dtype rule, given its operands' dtypes."""
    if op.name in SPECS:
        return SPECS[op.name].check(op, operand_dtypes, buffer_dtype)
    rule = OPS[op.name].dtype_rule
    problems = [f"operand {position} is {_named(dtype)}, {rule.name} ({op.name}) does not take it"
                for position, dtype in enumerate(operand_dtypes) if _dtype_class(dtype) not in rule.operands]
    if len(set(operand_dtypes)) > 1:
        problems.append(f"operands differ: {', '.join(map(_named, operand_dtypes))}")
    expected = torch.bool if rule.bool_result else operand_dtypes[0]
    if op.dtype != expected:
        problems.append(f"result is {_named(op.dtype)}, {rule.name} gives {_named(expected)}")
    return problems
