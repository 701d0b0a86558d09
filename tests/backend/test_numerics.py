"""Numerics of reductions against eager, beyond kiln.testing's rule: exact results where eager's
are exact (rows of equal values), and long sums as accurate as eager's blocked sums.

Each case runs on the C++ backend and on the Triton one (under the interpreter without a
GPU), persistent (the row in registers) and looped (rows longer than
`persistent_reduction_max`), so every emission path of kiln/codegen/{cpp,triton}.py is
covered.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph

BACKENDS = ["cpp", "triton"]
COLUMNS = [768, 10000]  # persistent, looped


def _compile(fn, inputs, backend):
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        result = compiled(*inputs)
    assert compiled.extern_count == 0 and compiled.kernel_count > 0  # kiln's kernels, not ATen's
    return result


def _constant_rows(columns: int, huge: bool = True) -> torch.Tensor:
    """Rows of one repeated value each, values whose sums round (0.1 * k is inexact in binary),
    and one whose sum overflows (eager's layer_norm gives NaN there: `huge=False` leaves it out)."""
    values = torch.tensor([0.1, 3.3, -7.1, 0.37, 1e-30] + ([3e38] if huge else []))
    return values[:, None].expand(len(values), columns).contiguous()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("columns", COLUMNS)
def test_layer_norm_of_constant_rows_is_exactly_zero(backend, columns):
    # The mean was a few ulp off and rsqrt(var + eps) ~ 316 magnified it: up to 1.5e-3.
    def fn(x, weight, bias):
        return (torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias),)

    x, weight = _constant_rows(columns, huge=False), torch.randn(columns)
    (got,) = _compile(fn, [x, weight, torch.zeros(columns)], backend)
    (want,) = fn(x, weight, torch.zeros(columns))
    assert torch.equal(want, torch.zeros_like(want))
    assert torch.equal(got, want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, on 0 / 0 and 3e38 squared under the interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("columns", COLUMNS)
def test_var_std_mean_of_constant_rows_are_exact(backend, columns):
    # var must be exactly 0: `std > 0` flipped to True, and a z-score was finite garbage
    # where eager's is 0/0 = NaN.
    def fn(x):
        std, mean = torch.std_mean(x, 1, keepdim=True)
        variance, var_mean_mean = torch.var_mean(x, 1)
        return x.var(1), x.std(1) > 0, (x - mean) / std, variance, var_mean_mean

    x = _constant_rows(columns)
    got, want = _compile(fn, [x], backend), fn(x)
    assert torch.equal(want[0], torch.zeros(x.shape[0]))
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1]) and not want[1].any()
    assert torch.isnan(want[2]).all() and torch.isnan(got[2]).all()
    assert torch.equal(got[3], want[3])
    assert torch.equal(got[4], x[:, 0]) and torch.equal(got[4], want[4])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("columns", [2, 768])
def test_var_of_a_computed_value_of_constant_rows_is_exact(backend, columns):
    # The operand is recomputed by each pass of the var (mean, then squares): both passes must
    # give the same bits, or var of equal values is an ulp squared (g++ contracting a * b + c into
    # an fma differently in each loop: fuzz seed 101 #2148).
    def fn(x):
        activated = torch.nn.functional.silu(x)
        return activated.var(1, correction=0), (x * 1.7 + 0.3).var(1), torch.sigmoid(x).std(1)

    generator = torch.Generator().manual_seed(481762342)
    x = torch.randn(64, 1, generator=generator).expand(64, columns)
    got, want = _compile(fn, [x], backend), fn(x)
    for value, expected in zip(got, want):
        assert torch.equal(expected, torch.zeros(64))
        assert torch.equal(value, expected)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, on inf and NaN under the interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("columns", [100, 10000])
def test_inf_and_nan_propagate_through_compensated_sums(backend, columns):
    # Kahan's compensation is (t - total) - y: inf - inf would turn an inf sum into NaN.
    def fn(x):
        return x.sum(1), x.mean(1), x.var(1), torch.var_mean(x, 1)[1]

    x = torch.rand(6, columns)
    x[0, 5] = float("inf")
    x[1, 7], x[1, 9] = float("-inf"), float("inf")
    x[2, 3] = float("nan")
    x[3, 0] = float("inf")
    x[4, 1] = 3e38  # the sum overflows, the mean estimate sum(x / n) does not
    x[5, 50] = -float("inf")  # not last: there eager's Welford order gives a var_mean mean of -inf, not NaN
    got, want = _compile(fn, [x], backend), fn(x)
    verdict = kiln.testing.compare(got, want, fn(x.double()))
    assert verdict, verdict.message


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """Normwise error in units of 2^-24 (fp32's half ulp, relative): 1 is one correct rounding."""
    error = torch.linalg.vector_norm(value.double() - reference)
    return float(error / torch.linalg.vector_norm(reference)) / 2.0**-24


# (backend, shape, reduction): long sums, full and along a dim, and the means and variances
# built on them. Triton's cases are smaller: the interpreter runs each op in Python.
ACCURACY_CASES = [
    ("cpp", (2**20,), "sum"), ("cpp", (2**24,), "sum"), ("cpp", (16, 2**20), "sum_dim"),
    ("cpp", (2**20,), "var"), ("cpp", (2**24,), "var"), ("cpp", (16, 2**16), "var_dim"),
    ("cpp", (2**16, 16), "var_dim0"), ("cpp", (4, 2**20), "mean_dim"), ("cpp", (2**22,), "std"),
    ("triton", (2, 2**20), "sum_dim"), ("triton", (2, 2**18), "var_dim"), ("triton", (2**18,), "mean"),
    ("triton", (64, 4096), "var_dim"),
]
REDUCTIONS = {
    "sum": lambda x: (x.sum(),), "sum_dim": lambda x: (x.sum(-1),), "mean": lambda x: (x.mean(),),
    "mean_dim": lambda x: (x.mean(-1),), "var": lambda x: (x.var(),), "std": lambda x: (x.std(),),
    "var_dim": lambda x: (x.var(-1),), "var_dim0": lambda x: (x.var(0),),
}


@pytest.mark.parametrize("backend, shape, reduction", ACCURACY_CASES)
def test_long_reductions_are_as_accurate_as_eager(backend, shape, reduction):
    # One accumulator lane summing n / lanes values in turn lost ~sqrt(n) ulp: 3-8x eager's
    # error for 2^24-element sums, up to 6e4x for variances. Eager sums in blocks; its
    # variance accumulates in double. Allowed: twice eager's error plus one rounding.
    fn = REDUCTIONS[reduction]
    x = torch.rand(shape) + 0.1 * torch.randn(shape)
    (reference,) = fn(x.double())
    (got,) = _compile(fn, [x], backend)
    (want,) = fn(x)
    kiln_error, eager_error = _relative_error(got, reference), _relative_error(want, reference)
    assert kiln_error <= 2 * eager_error + 1.0, f"kiln {kiln_error:.3f} vs eager {eager_error:.3f} (2^-24 units)"


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_of_an_expanded_compared_cast_input(backend):
    # The fuzz programs whose index simplification raised sympy's PolynomialError (the class
    # is tested in tests/ir/test_ir.py); the program compiles and matches eager.
    def fn(x, weight):
        y = (x.expand(2, 3, 48) > 0).float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * weight,)

    x, weight = torch.randn(2, 1, 48), torch.randn(48)
    got, want = _compile(fn, [x, weight], backend), fn(x, weight)
    verdict = kiln.testing.compare(got, want, fn(x.double(), weight.double()))
    assert verdict, verdict.message
