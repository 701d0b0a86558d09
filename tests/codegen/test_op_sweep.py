"""Every LoopIR op x every kernel dtype, through both backends (C++ and Triton), against eager.

kiln/codegen renders each op of kiln/ir/nodes.py once per backend. Lowering emits only
some (op, dtype) pairs today, so this sweep builds LoopIR directly: one Pointwise node
per case, `load -> to_dtype(compute) -> op -> to_dtype(result) -> store`, with the dtype
rule lowering uses (math in the result dtype, fp32 for fp16/bf16; comparisons in the
inputs' dtype; logic in bool). The inputs hold the values where ops differ: NaN, +-inf,
-0.0, halves (round), negative integers (floor division, remainder), the integer
extremes, all pairs of them for binary ops, then random values. Each case is compared
with torch's op on the same inputs by kiln.testing's rule (against a float64 reference
for floating inputs). One graph per (backend, dtype), so one compile each.

Reductions (the `reduce` op) are swept through lowering (every kind is emitted by it),
persistent and looped. An (op, dtype) torch refuses is not a case.
"""
from __future__ import annotations

import math
import zlib

import pytest
import sympy
import torch

import kiln
import kiln.testing
from kiln.philox import philox
from kiln.backend import compile_graph
from kiln.codegen.wrapper import generate_wrapper
from kiln.schedule.memory import plan_memory
from kiln.ir import Body, Buffer, Graph, GraphInput, Layout, Pointwise, TensorArg, verify
from kiln.ir.nodes import ALL_OPS, BINARY_OPS, OTHER_OPS, UNARY_OPS
from kiln.lowering.context import compute_dtype_for
from kiln.runtime.loader import load_module
from kiln.schedule import schedule_graph, verify_scheduled

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16, torch.int8,
          torch.uint8, torch.bool]
BACKENDS = ["cpp", "triton"]

# op -> (torch's op, how its operands are typed: "math" | "compare" | "logic")
OPS = {
    "neg": (torch.neg, "math"), "abs": (torch.abs, "math"), "exp": (torch.exp, "math"),
    "exp2": (torch.exp2, "math"), "expm1": (torch.expm1, "math"), "log": (torch.log, "math"),
    "log2": (torch.log2, "math"), "log10": (torch.log10, "math"), "log1p": (torch.log1p, "math"),
    "sqrt": (torch.sqrt, "math"), "rsqrt": (torch.rsqrt, "math"), "sin": (torch.sin, "math"),
    "cos": (torch.cos, "math"), "tan": (torch.tan, "math"), "asin": (torch.asin, "math"),
    "acos": (torch.acos, "math"), "atan": (torch.atan, "math"), "sinh": (torch.sinh, "math"),
    "cosh": (torch.cosh, "math"), "tanh": (torch.tanh, "math"), "asinh": (torch.asinh, "math"),
    "acosh": (torch.acosh, "math"), "atanh": (torch.atanh, "math"), "erf": (torch.erf, "math"),
    "erfc": (torch.erfc, "math"), "sigmoid": (torch.sigmoid, "math"), "floor": (torch.floor, "math"),
    "ceil": (torch.ceil, "math"), "round": (torch.round, "math"), "trunc": (torch.trunc, "math"),
    "sign": (torch.sign, "math"), "reciprocal": (torch.reciprocal, "math"),
    "logical_not": (torch.logical_not, "logic"), "bitwise_not": (torch.bitwise_not, "math"),
    "isnan": (torch.isnan, "compare"), "isinf": (torch.isinf, "compare"), "signbit": (torch.signbit, "compare"),
    "lgamma": (torch.lgamma, "math"), "erfinv": (torch.erfinv, "math"), "relu": (torch.relu, "math"),
    "frac": (torch.frac, "math"), "square": (torch.square, "math"), "normal_cdf": (torch.special.ndtr, "math"),
    "add": (torch.add, "math"), "sub": (torch.sub, "math"), "mul": (torch.mul, "math"),
    "truediv": (torch.true_divide, "math"), "floordiv": (torch.floor_divide, "math"),
    "truncdiv": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), "math"),
    "remainder": (torch.remainder, "math"), "fmod": (torch.fmod, "math"), "pow": (torch.pow, "math"),
    "maximum": (torch.maximum, "math"), "minimum": (torch.minimum, "math"), "atan2": (torch.atan2, "math"),
    "eq": (torch.eq, "compare"), "ne": (torch.ne, "compare"), "lt": (torch.lt, "compare"),
    "le": (torch.le, "compare"), "gt": (torch.gt, "compare"), "ge": (torch.ge, "compare"),
    "logical_and": (torch.logical_and, "logic"), "logical_or": (torch.logical_or, "logic"),
    "logical_xor": (torch.logical_xor, "logic"), "bitwise_and": (torch.bitwise_and, "math"),
    "bitwise_or": (torch.bitwise_or, "math"), "bitwise_xor": (torch.bitwise_xor, "math"),
    "left_shift": (torch.bitwise_left_shift, "math"), "right_shift": (torch.bitwise_right_shift, "math"),
    "copysign": (torch.copysign, "math"), "hypot": (torch.hypot, "math"), "nextafter": (torch.nextafter, "math"),
    "fmax": (torch.fmax, "math"), "fmin": (torch.fmin, "math"), "logaddexp": (torch.logaddexp, "math"),
    "xlogy": (torch.xlogy, "math"), "erf_for_16bit": (torch.erf, "math"),
    "philox": (lambda seed, offset: _philox(seed, offset), "math"),
}


def _philox(seed, offset):
    """kiln's reference Philox (kiln/aot/random.py) on integer operands, converted to theirs as a C cast does."""
    if seed.dtype.is_floating_point or seed.dtype == torch.bool:
        raise TypeError("philox takes integers")
    return philox(seed, offset).to(seed.dtype)
# Ops with their own test here (where, to_dtype) or swept through lowering (reduce), or that
# every case uses (load, store); constant/index_expr/getitem are covered by lowering's tests,
# check_index by tests/backend/test_indexing.py.
STRUCTURAL_OPS = {"load", "store", "to_dtype", "where", "reduce", "constant", "index_expr", "getitem",
                  "check_index"}
INTEGER_DIVISIONS = {"floordiv", "truncdiv", "remainder", "fmod"}

# (op, dtype name, backend or None for both) -> why the case is left out of the comparison.
KNOWN_FAILURES: dict = {}


def test_the_sweep_covers_every_op():
    assert set(OPS) == UNARY_OPS | BINARY_OPS
    assert OTHER_OPS <= STRUCTURAL_OPS and ALL_OPS == set(OPS) | OTHER_OPS


def _special_values(dtype: torch.dtype) -> list:
    if dtype == torch.bool:
        return [False, True]
    if dtype.is_floating_point:
        return [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 3.0, -7.25, 1e-3,
                100.0, 0.999]
    info = torch.iinfo(dtype)
    values = [0, 1, 2, 3, 7, 100, info.max, info.max - 1]
    return values + ([] if info.min == 0 else [-1, -2, -3, -7, -100, info.min, info.min + 1])


def _inputs(op: str, dtype: torch.dtype, generator: torch.Generator) -> list:
    """The operands of one case: every pair of special values, then random values."""
    specials = torch.tensor(_special_values(dtype), dtype=torch.float64)
    count = len(specials)
    if op in BINARY_OPS:
        pairs = [specials.repeat_interleave(count), specials.repeat(count)]
    else:
        pairs = [specials]
    operands = []
    for values in pairs:
        if dtype == torch.bool:
            extra = torch.rand(16, generator=generator) < 0.5
        elif dtype.is_floating_point:
            extra = torch.randn(32, generator=generator, dtype=torch.float64) * 3
        else:
            info = torch.iinfo(dtype)
            extra = torch.randint(max(info.min, -1000), min(info.max, 1000), (32,), generator=generator)
        operands.append(torch.cat([values.to(dtype), extra.to(dtype)]))
    if op in INTEGER_DIVISIONS and not dtype.is_floating_point:
        # torch raises for an integer x / 0, and its min / -1 traps (SIGFPE) like the CPU's division
        lowest = torch.iinfo(dtype).min if dtype != torch.bool else 0
        trapping = (operands[1] == 0) | ((operands[0] == lowest) & (operands[1] == -1))
        operands[1] = torch.where(trapping, torch.ones_like(operands[1]), operands[1])
    if op in ("left_shift", "right_shift") and not dtype.is_floating_point and dtype != torch.bool:  # torch's shifts by [0, width]
        width = torch.iinfo(dtype).bits
        operands[1] = (operands[1].to(torch.int64).abs() % (width + 1)).to(dtype)
    if op == "pow" and not dtype.is_floating_point and dtype != torch.bool:  # no negative integer powers
        operands[1] = (operands[1].to(torch.int64).abs() % 4).to(dtype)
    return operands


def _eager(op: str, operands: list):
    """torch's result for the case, or None when torch refuses the op for this dtype."""
    function = OPS[op][0]
    try:
        return function(*operands)
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def _compute_dtype(op: str, operand_dtype: torch.dtype, result_dtype: torch.dtype) -> torch.dtype:
    if op == "nextafter":  # steps by the ulp of the storage dtype (kiln/lowering/pointwise.py)
        return result_dtype
    typing = OPS[op][1]
    if typing == "logic":
        return torch.bool
    if typing == "compare":
        return compute_dtype_for(operand_dtype)
    return compute_dtype_for(result_dtype)


class _GraphBuilder:
    """A LoopIR graph of independent Pointwise nodes, one per case, each with its own inputs."""

    def __init__(self):
        self.graph, self.arguments, self.outputs = Graph(), [], []

    def buffer(self, prefix: str, dtype: torch.dtype, numel: int) -> Buffer:
        name = f"{prefix}{len(self.graph.buffers)}"
        buffer = Buffer(name, torch.device("cpu"), dtype, Layout((sympy.Integer(numel),), (sympy.Integer(1),)))
        self.graph.buffers[name] = buffer
        return buffer

    def node(self, operands: list, compute, result_dtype: torch.dtype) -> None:
        """compute(body, *loaded values) -> value; stored converted to result_dtype."""
        numel = operands[0].numel()
        index = [sympy.Symbol("i0", integer=True, nonnegative=True)]
        body = Body()
        loaded = []
        for operand in operands:
            buffer = self.buffer("arg", operand.dtype, numel)
            self.graph.inputs.append(GraphInput("tensor", f"{buffer.name}_1", buffer=buffer))
            self.arguments.append(operand)
            loaded.append(body.load(buffer, index))
        out = self.buffer("buf", result_dtype, numel)
        body.store(out, index, body.to_dtype(compute(body, *loaded), result_dtype))
        self.graph.nodes.append(Pointwise(f"node{len(self.graph.nodes)}", [sympy.Integer(numel)], body, [out.name]))
        self.graph.outputs.append(TensorArg(out.name, out.layout))

    def run(self, backend: str) -> tuple:
        with kiln.config.patch(cpu_backend=backend, strict=True):
            verify(self.graph, "op_sweep")  # the hand-built graph, as the pipeline's _check would
            scheduled = schedule_graph(self.graph)
            verify_scheduled(scheduled, "schedule")
            module = load_module(generate_wrapper(scheduled, plan_memory(scheduled)))
            assert module.kernel_count >= 1 and module.extern_count == 0
            return module(list(self.arguments))


def _op_cases(dtype: torch.dtype) -> list:
    """(name, operands, eager result, float64 reference or None, compute(body, *values))."""
    generator = torch.Generator().manual_seed(0)
    cases = []
    for op in sorted(OPS):
        # each op its own random values: a new op leaves the others' cases as they were
        operands = _inputs(op, dtype, torch.Generator().manual_seed(zlib.crc32(op.encode())))
        eager = _eager(op, operands)
        if eager is None:
            continue
        compute_dtype = _compute_dtype(op, dtype, eager.dtype)
        op_dtype = torch.bool if OPS[op][1] in ("compare", "logic") else compute_dtype

        def compute(body, *values, op=op, compute_dtype=compute_dtype, op_dtype=op_dtype):
            return body.emit(op, [body.to_dtype(value, compute_dtype) for value in values], op_dtype)

        if dtype.is_floating_point:
            reference = _eager(op, kiln.testing.to_float64(operands))
        elif eager.is_floating_point() and dtype != torch.bool:  # sin of integers: float64's from float64 operands
            reference = _eager(op, [operand.to(torch.float64) for operand in operands])
        else:
            reference = None
        cases.append((op, operands, eager, reference, compute))
    # where(cond, x, y) in the dtype; to_dtype to every kernel dtype
    operands = _inputs("add", dtype, generator)
    condition = operands[0] != operands[1]
    cases.append(("where", [condition] + operands, torch.where(condition, *operands), None,
                  lambda body, c, x, y, dtype=compute_dtype_for(dtype): body.emit(
                      "where", (c, body.to_dtype(x, dtype), body.to_dtype(y, dtype)), dtype)))
    for target in DTYPES:
        (source,) = _inputs("neg", dtype, generator)
        if dtype.is_floating_point and not target.is_floating_point and target != torch.bool:
            # a float outside the integer's range (and NaN) converts to anything in C, C++ and torch
            info = torch.iinfo(target)
            source = torch.where(source.isfinite() & (source >= info.min) & (source <= info.max), source, 0)
            source = source.to(dtype)
        cases.append((f"to_dtype:{kiln.ir.dtype_name(target)}", [source], source.to(target), None,
                      lambda body, value, target=target: body.to_dtype(value, target)))
    return cases


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=kiln.ir.dtype_name)
def test_every_op_renders_and_matches_eager(backend, dtype):
    cases = [case for case in _op_cases(dtype) if not _known_failure(case[0], dtype, backend)]
    try:
        failures = _compare(cases, _run(cases, backend))
    except Exception:  # one graph failed: find every case that fails on its own
        failures = []
        for case in cases:
            try:
                failures += _compare([case], _run([case], backend))
            except Exception as error:
                failures.append(f"{case[0]}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    assert not failures, f"{len(failures)} of {len(cases)} ops differ from eager:\n" + "\n".join(failures)


def _run(cases: list, backend: str) -> tuple:
    builder = _GraphBuilder()
    for name, operands, eager, reference, compute in cases:
        builder.node(operands, compute, eager.dtype)
    return builder.run(backend)


def _compare(cases: list, results: tuple) -> list:
    failures = []
    for (name, operands, eager, reference, compute), result in zip(cases, results):
        verdict = kiln.testing.compare(result, eager, reference)
        if not verdict:
            failures.append(f"{name}: {verdict.message}")
    return failures


def _known_failure(name: str, dtype: torch.dtype, backend: str) -> str | None:
    key = name.split(":")[0], kiln.ir.dtype_name(dtype)
    return KNOWN_FAILURES.get((*key, backend)) or KNOWN_FAILURES.get((*key, None))


REDUCTION_FUNCTIONS = {
    "sum": lambda x: x.sum(1), "prod": lambda x: x.prod(1), "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin(1), "argmax": lambda x: x.argmax(1), "argmin": lambda x: x.argmin(1),
    "any": lambda x: x.any(1), "all": lambda x: x.all(1), "mean": lambda x: x.mean(1),
    "var": lambda x: x.var(1), "max_values": lambda x: x.max(1)[0], "min_indices": lambda x: x.min(1)[1],
}


def _reduction_params() -> list:
    """(backend, persistent, dtype); looped Triton kernels take the interpreter 10-60 s each (its
    tl.reduce calls the combine function per element of a 1024-lane block): slow, but for float64."""
    params = []
    for backend in BACKENDS:
        for persistent in (True, False):
            for dtype in DTYPES:
                slow = backend == "triton" and not persistent and dtype != torch.float64
                params.append(pytest.param(backend, persistent, dtype, marks=[pytest.mark.slow] if slow else [],
                                           id=f"{kiln.ir.dtype_name(dtype)}-{'persistent' if persistent else 'looped'}"
                                              f"-{backend}"))
    return params


@pytest.mark.parametrize("backend, persistent, dtype", _reduction_params())
def test_every_reduction_kind_matches_eager(backend, persistent, dtype):
    generator = torch.Generator().manual_seed(0)
    specials = _special_values(dtype)
    columns = 19
    rows = [torch.tensor([specials[(start + column) % len(specials)] for column in range(columns)],
                         dtype=torch.float64).to(dtype) for start in range(0, len(specials), 3)]
    x = torch.stack(rows + [_inputs("neg", dtype, generator)[0][-16:].repeat(2)[:columns]])  # specials, random
    if dtype.is_floating_point:  # a row with NaN, a row without: NaN propagates through max/min/argmax
        x[-2] = torch.randn(columns, generator=generator).to(dtype)
    kinds = [kind for kind, function in REDUCTION_FUNCTIONS.items() if _eager_reduction(function, x) is not None]
    if backend == "triton" and not persistent and dtype == torch.float64:
        kinds, x = ["var"], x[-2:]  # Welford's looped statistics were float32 on Triton: kept fast

    def fn(x):
        return tuple(REDUCTION_FUNCTIONS[kind](x) for kind in kinds)

    with kiln.config.patch(cpu_backend=backend, strict=True, persistent_reduction_max=columns if persistent else 4):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
        result = compiled(x)
    assert compiled.kernel_count >= 1
    failures = []
    reference = fn(kiln.testing.to_float64(x)) if dtype.is_floating_point else None
    for position, kind in enumerate(kinds):
        verdict = kiln.testing.compare(result[position], fn(x)[position],
                                       None if reference is None else reference[position])
        if not verdict:
            failures.append(f"{kind}: {verdict.message}")
    assert not failures, "\n".join(failures)


def _eager_reduction(function, x):
    try:
        return function(x)
    except (RuntimeError, TypeError, NotImplementedError):
        return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_of_bool_and_of_nan_through_lowering(backend):
    # torch.sign of a bool tensor crashed Triton's kernel ("numpy boolean subtract"), and
    # sign(NaN) was NaN on both backends where torch gives 0.
    def fn(flags, x):
        return torch.sign(flags), torch.sign(x), torch.sgn(x)

    flags = torch.rand(40) < 0.5
    x = torch.randn(40)
    x[::5] = math.nan
    x[1::7] = -0.0
    with kiln.config.patch(cpu_backend=backend, strict=True):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [flags, x])
        result = compiled(flags, x)
    assert compiled.kernel_count >= 1 and compiled.extern_count == 0
    verdict = kiln.testing.compare(result, fn(flags, x))
    assert verdict, verdict.message
