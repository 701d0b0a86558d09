"""Elementwise rules: unary and binary math, comparisons, logic, where, casts, clamp,
and the activations kiln lowers directly (gelu, silu, sigmoid, tanh, hardtanh...).

The one-to-one rules (ATen op X -> LoopIR op X, no special case) are not listed here: an op-table
row (kiln/ir/ops.py) names the ATen ops it implements, and `_register_table_row` lowers them.

Dtype rule (one place, `_binary`/`_unary`): math runs in the output dtype, fp32 for
fp16/bf16; comparisons run in the inputs' promoted dtype; the result is converted to
the op's output dtype (from the fake result) when stored.
"""
from __future__ import annotations

import math

import sympy
import torch

from kiln import _torch
from kiln.ir.ops import ROWS
from kiln.lowering.context import (LOW_PRECISION, TensorValue, Unsupported, check_fill_dtype, check_fill_value,
                                   compute_dtype_for, meta_of, rounded_scalar)
from kiln.lowering.registry import lowering

aten = _torch.aten


def _promoted(*values) -> torch.dtype:
    """torch's type promotion over tensors (by dtype and rank class) and Python scalars."""
    result = None
    for value in values:
        if isinstance(value, TensorValue):
            probe = torch.empty((1,) * min(value.ndim, 1), dtype=value.dtype)
        elif isinstance(value, sympy.Basic):
            probe = 1 if value.is_integer else 1.0
        else:
            probe = value
        if result is None:
            result = probe if isinstance(probe, torch.Tensor) else torch.tensor(probe)
            continue
        dtype = torch.result_type(result, probe)
        result = torch.empty((1,) * max(result.ndim, getattr(probe, "ndim", 0)), dtype=dtype)
    return result.dtype


# The sign of a NaN an op makes is visible (signbit, copysign). Eager's CPU float32/float64 sqrt and logs
# (MKL's VML) give +NaN for x < 0 at every position, where the hardware's sqrt and the libm logs that kiln's
# C++ and the Triton interpreter call give the default NaN, sign set; kiln makes those NaNs positive. Eager's
# fp16/bf16 kernels give the default NaN, as kiln does (measured, torch 2.11 and 2.13); other ops' NaN signs
# vary with the position or the data in eager (acos, pow's vector body against its scalar tail). CUDA's
# NaNs are all +NaN (0x7fffffff), which the GPU's sqrt and libdevice logs give too.
_CPU_POSITIVE_NAN_OPS = {"sqrt", "log", "log2", "log10"}


def _unary(*ops, name: str, float_only: bool = False):
    def rule(ctx, node, x):
        meta = meta_of(node)
        if float_only and not meta.dtype.is_floating_point:
            raise Unsupported(f"{name} on {meta.dtype}")
        positive_nan = name in _CPU_POSITIVE_NAN_OPS and meta.device.type == "cpu" and \
            meta.dtype in (torch.float32, torch.float64)

        def compute(body, v):
            dtype = body.dtype_of(v)
            result = body.emit(name, (v,), dtype)
            if positive_nan:
                result = body.emit("where", (body.emit("isnan", (result,), torch.bool),
                                             body.constant(math.nan, dtype), result), dtype)
            return result

        return ctx.pointwise([x], compute, meta=meta)

    lowering(*ops)(rule)


for _op, _name in [(aten.floor, "floor"), (aten.ceil, "ceil"), (aten.trunc, "trunc"), (aten.round.default, "round")]:
    _unary(_op, name=_name, float_only=True)
# Not named by their rows: core ATen decomposes aten.sgn and aten.frac, and keeping them whole would
# change kernels. The rules stay for graphs that reach lowering with them.
_unary(aten.sign, aten.sgn, name="sign")
_unary(aten.frac, name="frac")


@lowering(aten.isnan, aten.isinf, aten.signbit, aten.logical_not)
def _predicate(ctx, node, x):
    name = str(node.target).split(".")[1]
    dtype = compute_dtype_for(x.dtype)
    if name == "logical_not":
        return ctx.pointwise([x], lambda body, v: body.emit("logical_not", (v,), torch.bool), meta=meta_of(node),
                             compute_dtype=torch.bool)
    if not x.dtype.is_floating_point:
        raise Unsupported(f"{name} on integers")
    return ctx.pointwise([x], lambda body, v: body.emit(name, (v,), torch.bool), meta=meta_of(node),
                         compute_dtype=dtype)


# Operand precision on an fp16/bf16 common dtype. kiln does the math in float, as eager's kernels do,
# but eager first converts its operands to the common dtype: a Python scalar (0.1 -> bf16 0.10009765625)
# or a 0-dim tensor of a wider dtype is rounded before the math, except where the kernel reads it at
# float precision. That rounding decides values that jump (remainder(x, 0.1) is 0 at bf16 multiples of
# bf16(0.1); x == 0.1 holds for x = bf16(0.1)), so kiln repeats it, per device:
# - CPU (measured, torch 2.11 and 2.13): TensorIterator casts every input to the common dtype before the
#   kernel; only mul and div read their second operand at float precision when it is a scalar (a Python
#   number or 0-dim tensor: `original_scalar_value<opmath_t>`). add/sub round the scalar and alpha too.
# - CUDA (from the kernels' source): a Python scalar is read as the functor's argument type, opmath_t for
#   add/sub (ufunc codegen, alpha too), mul and div, scalar_t for everything else (remainder, fmod, pow,
#   atan2, comparisons...: `gpu_kernel_with_scalars` with `scalar_t` lambdas); a tensor of another dtype is
#   loaded as that argument type too, opmath_t only for mul and div.
# min/max/clamp/where/copysign need no rounding: they commute with it (monotone, or sign only).
_CUDA_OPMATH_SCALAR_OPS = {"add", "sub", "mul", "truediv"}
_OPMATH_SECOND_SCALAR_OPS = {"mul", "truediv"}  # both devices (CPU: scalars only; CUDA: any second operand)


def _rounded_operands(name: str, device: torch.device, operands, common_dtype: torch.dtype) -> list:
    """Per operand of a binary op, the fp16/bf16 dtype eager rounds it to before the math, or None."""
    if common_dtype not in LOW_PRECISION:
        return [None] * len(operands)
    rounded = []
    for position, operand in enumerate(operands):
        python_scalar = not isinstance(operand, TensorValue)
        scalar = python_scalar or operand.ndim == 0
        if device.type == "cuda":
            opmath = (python_scalar and name in _CUDA_OPMATH_SCALAR_OPS) or \
                (position == 1 and name in _OPMATH_SECOND_SCALAR_OPS)
        else:
            opmath = position == 1 and scalar and name in _OPMATH_SECOND_SCALAR_OPS
        rounded.append(None if opmath else common_dtype)
    return rounded


def _eager_alpha(name: str, alpha, device: torch.device, common_dtype: torch.dtype):
    """add/sub's alpha as eager's kernel uses it: rounded to an fp16/bf16 dtype on CPU (`alpha.to<scalar_t>()`)."""
    if device.type == "cuda" or common_dtype not in LOW_PRECISION:
        return alpha
    return rounded_scalar(alpha, common_dtype)


def _with_alpha(inputs: list, rounded: list | None, alpha, device: torch.device, common_dtype: torch.dtype):
    """add/sub's (inputs, rounded_through) with a symbolic alpha (an int argument made dynamic) as one more input,
    loaded in the kernel as its symbol's value and rounded as `_eager_alpha` rounds a number; a number alpha is
    a constant of the body, and these come back as they were."""
    if not (isinstance(alpha, sympy.Basic) and not alpha.is_Number):
        return inputs, rounded
    through = None if device.type == "cuda" or common_dtype not in LOW_PRECISION else common_dtype
    return [*inputs, alpha], [*(rounded or [None] * len(inputs)), through]


def _scaled_by_alpha(body, y, alpha, loaded_alpha: tuple, name: str, device: torch.device,
                     common_dtype: torch.dtype, dtype: torch.dtype):
    """y * alpha in the body: by the loaded symbolic alpha, or by a number alpha other than 1."""
    if loaded_alpha:
        return body.emit("mul", (y, loaded_alpha[0]), dtype)
    if alpha is not None and alpha != 1:
        return body.emit("mul", (y, body.constant(_eager_alpha(name, alpha, device, common_dtype), dtype)), dtype)
    return y


def _binary_rule(name: str, *, compare: bool = False, logical: bool = False, float_only: bool = False,
                 in_storage_dtype: bool = False):
    """in_storage_dtype: the op runs in fp16/bf16 itself (nextafter steps by the storage type's ulp)."""
    def rule(ctx, node, a, b, alpha=None, **kwargs):
        meta = meta_of(node)
        if kwargs.get("rounding_mode") is not None:
            raise Unsupported("division with a rounding mode")
        common_dtype = _promoted(a, b) if (compare or logical) else meta.dtype
        if logical:
            dtype = torch.bool
        elif compare:
            dtype = compute_dtype_for(common_dtype)
        elif in_storage_dtype:
            dtype = meta.dtype
        else:
            dtype = compute_dtype_for(meta.dtype)
        if float_only and not dtype.is_floating_point:
            raise Unsupported(f"{name} on {dtype}")
        result_dtype = torch.bool if (compare or logical) else dtype
        rounded = _rounded_operands(name, meta.device, (a, b), common_dtype) if not logical else None
        inputs, rounded = _with_alpha([a, b], rounded, alpha, meta.device, common_dtype)

        def compute(body, x, y, *loaded_alpha):
            y = _scaled_by_alpha(body, y, alpha, loaded_alpha, name, meta.device, common_dtype, dtype)
            return body.emit(name, (x, y), result_dtype)

        return ctx.pointwise(inputs, compute, meta=meta, compute_dtype=dtype, rounded_through=rounded)

    return rule


lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)(
    _binary_rule("truediv", float_only=True))
_pow = _binary_rule("pow", float_only=True)
lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)(_pow)
# Exponents eager's pow(tensor, scalar) computes with plain arithmetic on CPU and CUDA alike
# (pow_tensor_scalar_optimized_kernel / pow_tensor_scalar_kernel), not with pow(): x * x is exact
# where libdevice's powf(x, 2) is not (cos(trunc(x) ** 2) was 3.6e-6 off on the H200). On an fp16/bf16
# tensor eager may also round the square to the storage dtype before the next step (measured on CPU,
# torch 2.11 and 2.13: bf16 rounds it, fp16 computes in float; from the CUDA kernel's source: `base * base
# * base` on c10::Half / c10::BFloat16, each product rounded): `square(x)` below is eager's square.
POW_BY_ARITHMETIC = {
    2: lambda body, x, t, square: square(x),
    3: lambda body, x, t, square: body.emit("mul", (square(x), x), t),
    -1: lambda body, x, t, square: body.emit("truediv", (body.constant(1.0, t), x), t),
    -2: lambda body, x, t, square: body.emit("truediv", (body.constant(1.0, t), square(x)), t),
    0.5: lambda body, x, t, square: body.emit("sqrt", (x,), t),
    -0.5: lambda body, x, t, square: body.emit("rsqrt", (x,), t),
}


def _pow_rounds_square(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether eager's pow(x, 3 or -2) rounds x * x to x's fp16/bf16 dtype before the next step."""
    return dtype == torch.bfloat16 or (dtype == torch.float16 and device.type == "cuda")


@lowering(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(ctx, node, base, exponent):
    meta = meta_of(node)
    special = isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and exponent in POW_BY_ARITHMETIC
    if not (special and meta.dtype.is_floating_point and isinstance(base, TensorValue)):
        return _pow(ctx, node, base, exponent)
    dtype = compute_dtype_for(meta.dtype)
    rounds = _pow_rounds_square(meta.device, meta.dtype)

    def compute(body, x):
        def square(v):
            product = body.emit("mul", (v, v), dtype)
            return body.to_dtype(body.to_dtype(product, meta.dtype), dtype) if rounds else product

        return POW_BY_ARITHMETIC[exponent](body, x, dtype, square)

    return ctx.pointwise([base], compute, meta=meta)


lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)(
    _binary_rule("remainder", float_only=True))


def _register_table_row(row) -> None:
    """The lowering of an op-table row's ATen ops (kiln/ir/ops.py's `aten`): `_unary` or `_binary_rule`
    with the row's dtype rule. Float only where it admits no integers; comparisons and logic by their
    bool result; an op that admits fp16/bf16 operands runs in the storage dtype."""
    operands = row.dtype_rule.operands
    float_only = not operands & {"signed", "unsigned", "bool"}
    if row.arity == 1:
        _unary(*row.aten, name=row.op.value, float_only=float_only)
        return
    logical = row.dtype_rule.bool_result and operands == {"bool"}
    compare = row.dtype_rule.bool_result and not logical
    lowering(*row.aten)(_binary_rule(row.op.value, compare=compare, logical=logical, float_only=float_only,
                                     in_storage_dtype="low_precision" in operands))


for _table_row in ROWS:
    if _table_row.aten:
        _register_table_row(_table_row)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx, node, a, b, alpha=1):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)
    rounded = _rounded_operands("sub", meta.device, (b, a), meta.dtype)[::-1]  # eager: sub(b, a, alpha)
    inputs, rounded = _with_alpha([a, b], rounded, alpha, meta.device, meta.dtype)

    def compute(body, x, y, *loaded_alpha):
        x = _scaled_by_alpha(body, x, alpha, loaded_alpha, "sub", meta.device, meta.dtype, dtype)
        return body.emit("sub", (y, x), dtype)

    return ctx.pointwise(inputs, compute, meta=meta, rounded_through=rounded)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, node, condition, a, b):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)
    for branch in (a, b):  # a number branch is eager's scalar_tensor of the result's dtype
        check_fill_value(branch, meta.dtype, half_floats_checked=False)
    return ctx.pointwise([condition, a, b], lambda body, c, x, y: body.emit("where", (c, x, y), dtype), meta=meta,
                         input_dtypes=[torch.bool, dtype, dtype])


@lowering(aten._to_copy.default)
def to_copy(ctx, node, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    meta = meta_of(node)
    if meta.device != x.device:
        raise Unsupported("device copy")
    return ctx.pointwise([x], lambda body, v: v, meta=meta, compute_dtype=x.dtype)


@lowering(aten.clone.default)
def clone(ctx, node, x, memory_format=None):
    return ctx.pointwise([x], lambda body, v: v, meta=meta_of(node), compute_dtype=x.dtype)


@lowering(aten.copy.default)
def copy(ctx, node, destination, source, non_blocking=False):
    """`aten.copy(self, src)`, functionalization's `self.copy_(src)`: src broadcast to self's shape and
    cast to its dtype, laid out as self (its meta), as `_to_copy` does; self's values are never read."""
    return to_copy(ctx, node, source)


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
          aten.clamp_min.Tensor, aten.clamp_max.Tensor, aten.hardtanh.default)
def clamp(ctx, node, x, low=None, high=None):
    target = node.target
    if target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        low, high = None, low
    if target is aten.hardtanh.default:
        low = -1.0 if low is None else low
        high = 1.0 if high is None else high
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)
    operands = [x] + [bound for bound in (low, high) if bound is not None]
    for bound in operands[1:]:  # eager converts a number bound to the result's dtype, checked
        check_fill_value(bound, meta.dtype)

    # Ties (x equal to a number bound) as eager's kernels break them, which decides the sign of a zero
    # result (fuzz seed 3008 #1972: signbit of clamp_max(-0.0, 0.0)). CPU (measured, vectorized and
    # scalar paths alike): x is kept. CUDA (measured on the H200, torch 2.11; its kernel is
    # ::min(::max(x, low), high)): -0.0 counts as less than +0.0, so max(-0.0, +0.0) is +0.0 and
    # min(-0.0, +0.0) is -0.0 in either order. With tensor bounds the CPU tie's sign depends on the
    # path, and maximum/minimum give the bound, as its vector path does.
    number_bounds = all(not isinstance(bound, TensorValue) for bound in (low, high))
    signed_zeros = meta.device.type == "cuda" and meta.dtype.is_floating_point  # integers have one zero

    def bounded(body, value, bound, beyond: str, fallback: str):
        if not number_bounds:
            return body.emit(fallback, (value, bound), dtype)
        # NaN in x propagates (no comparison holds); a NaN bound gives NaN (torch's rule)
        replace = body.emit("logical_or", (body.emit(beyond, (value, bound), torch.bool),
                                           body.emit("ne", (bound, bound), torch.bool)), torch.bool)
        if signed_zeros:  # at a tie of zeros the low bound replaces -0.0, the high bound is kept if -0.0
            negative = value if beyond == "lt" else bound
            tie = body.emit("logical_and", (body.emit("eq", (value, bound), torch.bool),
                                            body.emit("signbit", (negative,), torch.bool)), torch.bool)
            replace = body.emit("logical_or", (replace, tie), torch.bool)
        return body.emit("where", (replace, bound, value), dtype)

    def compute(body, value, *bounds):
        bounds = list(bounds)
        if low is not None:
            value = bounded(body, value, bounds.pop(0), "lt", "maximum")
        if high is not None:
            value = bounded(body, value, bounds.pop(0), "gt", "minimum")
        return value

    return ctx.pointwise(operands, compute, meta=meta)


def _cuda_formula(meta: torch.Tensor) -> bool:
    """Whether gelu lowers eager's CUDA formula (CUDA tensors) rather than its CPU one (tests/lowering/
    test_gelu.py runs the CUDA formula on the CPU's Triton interpreter by patching this)."""
    return meta.device.type == "cuda"


@lowering(aten.gelu.default)
def gelu(ctx, node, x, approximate="none"):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, v):
        def const(value):
            return body.constant(value, dtype)

        def op(name, *operands):
            return body.emit(name, operands, dtype)

        if approximate == "tanh":
            cube = op("mul", op("mul", v, v), v)
            inner = op("mul", const(math.sqrt(2 / math.pi)), op("add", v, op("mul", cube, const(0.044715))))
            return op("mul", op("mul", v, const(0.5)), op("add", const(1.0), op("tanh", inner)))
        if _cuda_formula(meta):
            # Eager's CUDA kernel's formula, op for op: (x * 0.5) * (1 + erf(x * M_SQRT1_2)), so its exact
            # zeros (erf rounds to -1) are eager's. (Not bit-identical everywhere: on the H200 some elements
            # differ in the last place, from erff's build, 2026-12-01.) It is also the fast form, quicker
            # on the H200 than erfc with a cutoff (see benchmarks/results/2026-12-02_docstring-measurements.md).
            # A 16-bit result takes erf_for_16bit (kiln/ir/ops.py): the same 16-bit values, and a bf16 gelu(x + b)
            # kernel of 24 sm_90 instructions an element where libdevice's erff made it 38.
            erf = op("erf_for_16bit" if meta.dtype in LOW_PRECISION else "erf", op("mul", v, const(math.sqrt(0.5))))
            return op("mul", op("mul", v, const(0.5)), op("add", const(1.0), erf))
        # x * Phi(x): the same value as 0.5 x (1 + erf(x / sqrt 2)), with no cancellation for x < 0, except
        # where eager's value is exact: 0 (-0) below eager's cutoff. gelu(+inf) is +inf, float64's value.
        # (kiln's C++ erf and ATen's CPU erf approximation differ by ulps, which 1 + erf(z) would amplify.)
        below = body.emit("lt", (v, const(_GELU_EAGER_ZERO_BELOW[dtype])), torch.bool)
        phi = body.emit("where", (below, const(0.0), op("normal_cdf", v)), dtype)
        return op("mul", v, phi)

    return ctx.pointwise([x], compute, meta=meta)


# Where eager's gelu, 0.5 x (1 + erf(x / sqrt 2)) in the compute dtype, is exactly 0: 1 + erf(z) cancels to 0
# once erf(z) rounds to -1, where kiln's x * Phi(x) is still a tiny nonzero value. Downstream that
# difference is a NaN or an inf (fmod(y, gelu(x)), y / gelu(x), log(gelu(x))), so kiln flushes Phi to 0 there.
# With a correctly rounded erf (CUDA's erff, any float64 erf) that is erfc(|z|) < ulp(1) / 2, i.e.
# Phi(x) < 2^-26 in float (x < -5.542594) and 2^-55 in double (x < -8.3744). ATen's CPU float kernel,
# with its own erf approximation, is 0 for every float below -5.542593 too (measured), and ragged over
# [-5.5426, -5.4911] (some 0, some not), where kiln keeps its accurate value. gelu(+inf) in float, bfloat16
# and half depends on the CPU eager runs on (ATen picks its vector kernel by the CPU's ISA): NaN on the
# machine of an earlier session, inf on an AVX2 EPYC; float64 and CUDA give inf. kiln gives inf everywhere,
# the float64 value, which kiln.testing's rule accepts where eager's value is NaN.
def _phi_below(bound: float) -> float:
    """The x < 0 where Phi(x) = erfc(-x / sqrt 2) / 2 falls to `bound` (bisection in float64)."""
    low, high = -40.0, 0.0
    for _ in range(200):
        middle = (low + high) / 2
        if 0.5 * math.erfc(-middle / math.sqrt(2)) < bound:
            low = middle
        else:
            high = middle
    return high


_GELU_EAGER_ZERO_BELOW = {torch.float32: _phi_below(2.0 ** -26), torch.float64: _phi_below(2.0 ** -55)}


@lowering(aten.silu.default)
def silu(ctx, node, x):
    """Eager's formula on both devices, x / (1 + exp(-x)) in the compute dtype: one rounding where x * sigmoid(x)
    has two, and one division (div.full where a 16-bit cast alone reads it: codegen/triton.py)."""
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, v):
        exp = body.emit("exp", (body.emit("neg", (v,), dtype),), dtype)
        return body.emit("truediv", (v, body.emit("add", (body.constant(1.0, dtype), exp), dtype)), dtype)

    return ctx.pointwise([x], compute, meta=meta)


@lowering(aten.leaky_relu.default)
def leaky_relu(ctx, node, x, negative_slope=0.01):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, v):
        positive = body.emit("gt", (v, body.constant(0, dtype)), torch.bool)
        return body.emit("where", (positive, v, body.emit("mul", (v, body.constant(negative_slope, dtype)), dtype)),
                         dtype)

    return ctx.pointwise([x], compute, meta=meta)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx, node, start, end, weight):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)

    def compute(body, a, b, w):
        return body.emit("add", (a, body.emit("mul", (w, body.emit("sub", (b, a), dtype)), dtype)), dtype)

    return ctx.pointwise([start, end, weight], compute, meta=meta)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, node, x, mask, value):
    """where(mask, value, x). A number that does not fit x's dtype (300 in int8, 1e6 in float16) is an
    error in eager, as for full and fill: ATen's op runs and raises it."""
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)
    if isinstance(value, TensorValue):  # a 0-d tensor: its number is read at run time
        check_fill_dtype(value.dtype, meta.dtype)
    else:
        check_fill_value(value, meta.dtype)
    return ctx.pointwise([mask, value, x], lambda body, m, v, a: body.emit("where", (m, v, a), dtype), meta=meta,
                         input_dtypes=[torch.bool, dtype, dtype])
