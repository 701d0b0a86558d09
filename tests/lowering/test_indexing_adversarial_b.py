"""Adversarial programs, second round (after test_indexing_adversarial.py): computed indices, masks and the
numbers that ops fill with, against eager on both CPU backends, through `kiln.compile` with KILN_STRICT. Each
case names what was once wrong.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.debug.explain import explain


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    with kiln.config.patch(cpu_backend=request.param, strict=True):
        yield request.param


def _as_int8(x):
    return (x * 10).to(torch.int8)


# A number that does not fit the dtype an op fills with: eager raises ("value cannot be converted to type
# int8_t without overflow"). Once wrong: the kernel stored the number wrapped (300 as int8 is 44) or inf, and
# returned it (the C++ backend; the Triton interpreter happened to refuse the constant, a GPU need not).
UNFITTING_FILL_VALUES = {
    "masked_fill_int8": lambda x: _as_int8(x).masked_fill(x > 0, 300),
    "masked_fill_half": lambda x: x.half().masked_fill(x.cumsum(1) > 0, 1e6),
    "where_int8": lambda x: torch.where(x.cumsum(0) > 0, 300, _as_int8(x)),
    "where_int32": lambda x: torch.where(x > 0, _as_int8(x).int(), 2 ** 33 + 3),
    "full_like_int8": lambda x: torch.full_like(_as_int8(x), 300) + 1,
    "fill_int8": lambda x: _as_int8(x).fill_(-129),
    "clamp_int8": lambda x: _as_int8(x).clamp(max=300),
    "hardtanh_int8": lambda x: torch.nn.functional.hardtanh(_as_int8(x), -300, 300),
    "threshold_int8": lambda x: torch.nn.functional.threshold(_as_int8(x), 3, 300),
    "pad_int8": lambda x: torch.nn.functional.pad(_as_int8(x), (1, 1), value=300),
    "pad_half": lambda x: torch.nn.functional.pad(x.half(), (1, 1), value=1e6),
    "scatter_into_int32": lambda x: _as_int8(x).int().scatter(1, x.argsort(1)[:, :1], 2 ** 31 + 5),
    "scatter_into_half": lambda x: x.half().scatter(1, x.argsort(1)[:, :1], 70000),
    "index_fill_int8": lambda x: _as_int8(x).index_fill(1, x[0].argsort()[:2], 300),
    # a 0-d tensor's number, read at run time (masked_fill.Tensor): ATen's op runs unless the dtype holds any
    "masked_fill_int8_by_a_sum": lambda x: _as_int8(x).masked_fill(x > 0, (x * 10).long().abs().sum() * 100),
    "masked_fill_half_by_a_double": lambda x: x.half().masked_fill(x > 0, x.double().abs().sum() * 1e6),
}


@pytest.mark.parametrize("name", list(UNFITTING_FILL_VALUES))
def test_a_fill_value_that_does_not_fit_raises(name):
    program = UNFITTING_FILL_VALUES[name]
    x = torch.randn(5, 4)
    with pytest.raises(RuntimeError, match="overflow"):
        program(x.clone())
    with pytest.raises(RuntimeError, match="overflow"):
        kiln.compile(program)(x.clone())


# The same ops at the edges of what fits, which eager takes (and wraps or rounds): they still compile to kernels.
FITTING_FILL_VALUES = {
    "masked_fill_uint8_negative": lambda x: (x.abs() * 10).to(torch.uint8).masked_fill(x > 0, -255),
    "masked_fill_int8_truncated": lambda x: _as_int8(x).masked_fill(x > 0, -127.5),
    "masked_fill_half_max": lambda x: x.half().masked_fill(x > 0, 65504.0),
    "masked_fill_half_inf": lambda x: x.half().masked_fill(x > 0, float("-inf")),
    "masked_fill_bool": lambda x: (x > 0).masked_fill(x.cumsum(1) > 0, 2),
    "where_half_beyond_its_max": lambda x: torch.where(x > 0, x.half(), 1e6),  # scalar_tensor: inf, no error
    "where_int8_float": lambda x: torch.where(x > 0, _as_int8(x), 1e6),  # promoted to float32
    "clamp_int8_float": lambda x: _as_int8(x).clamp(max=1e6),  # promoted to float32
    "add_int8_wraps": lambda x: _as_int8(x) * 2 + 1,
    "full_like_int64_max": lambda x: torch.full_like((x * 10).long(), 2 ** 63 - 1) - (x * 10).long(),
    "masked_fill_by_a_sum": lambda x: x.masked_fill(x.cumsum(1) > 0, x.sum()) * 2,
    "masked_fill_int8_by_an_int8": lambda x: _as_int8(x).masked_fill(x > 0, _as_int8(x).amax()),
}


@pytest.mark.parametrize("name", list(FITTING_FILL_VALUES))
def test_a_fill_value_that_fits_compiles_to_kernels(name):
    program = FITTING_FILL_VALUES[name]
    x = torch.randn(5, 4)
    report = explain(program, x.clone())
    assert report.kernel_count > 0 and report.break_count == 0, str(report)
    assert not any("masked_fill" in line or "scalar_tensor" in line for line in str(report).splitlines()
                   if "extern" in line.lower()), str(report)
    actual, expected = kiln.compile(program)(x.clone()), program(x.clone())
    assert actual.dtype == expected.dtype
    verdict = kiln.testing.compare(actual, expected)
    assert verdict, verdict.message


def _check_gradients(program, shapes):
    """The program's result and its input's gradient against eager, one compiled function over `shapes` (the
    second call recompiles with symbolic sizes)."""
    compiled = kiln.compile(program)
    for call, shape in enumerate(shapes):
        torch.manual_seed(call)
        x = torch.randn(*shape)
        eager_x, kiln_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected, actual = program(eager_x), compiled(kiln_x)
        gradient = torch.randn(expected.shape)
        expected.backward(gradient)
        actual.backward(gradient)
        for got, want in ((actual, expected), (kiln_x.grad, eager_x.grad)):
            verdict = kiln.testing.compare(got, want)
            assert verdict, (shape, verdict.message)


# Once an IndexError where eager has none: roll's backward gathers at (arange(s0) + (s0 - 3) % s0) fmod s0, and
# the index simplifier took Mod(-3, s0) (sympy's form of (s0 - 3) % s0) for -3, its own remainder since -3 < s0:
# it checked only the upper end of [0, s0).
ROLLS_BY_A_NEGATIVE_SHIFT = {
    "columns": lambda x: torch.roll(x * 2, -3, 1),
    "rows_and_columns": lambda x: torch.roll(x + 1, (-1, -2), (0, 1)),
    "flattened": lambda x: torch.roll(x * 3, -5),
}


@pytest.mark.parametrize("name", list(ROLLS_BY_A_NEGATIVE_SHIFT))
def test_backward_of_a_roll_by_a_negative_shift_at_symbolic_sizes(name):
    _check_gradients(ROLLS_BY_A_NEGATIVE_SHIFT[name], [(5, 4), (6, 3), (7, 5)])


def test_a_negative_dividend_below_the_divisor_is_not_its_own_remainder():
    import sympy

    from kiln.ir.indexing import FloorDiv, Mod, index_var, simplify_index

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    i0 = index_var("i", 0)
    assert simplify_index(Mod(-3, s0), {}) == Mod(-3, s0)
    assert simplify_index(FloorDiv(i0 - 3, s0), {i0: s0 - 1}) == FloorDiv(i0 - 3, s0)
    assert simplify_index(Mod(i0 + 1, s0 + 1), {i0: s0}) == i0 + 1  # nonnegative and below: still simplified


# Outputs whose elements share addresses. Once a wrong gradient (inductor's too): AOTAutograd copied the incoming
# gradient into the output's own layout before the backward read it, and the elements that share an address
# overwrote each other (x.grad[0, 1] = 2 * (g[0, 1] + g[1, 0]) came out 4 * g[1, 0]). Its overlap check gave up on
# these layouts (TOO_HARD) and read that as "no overlap"; kiln/_torch.py wraps its guess.
OVERLAPPING_OUTPUTS = {
    "as_strided": lambda x: (x * 2).as_strided((2, 2), (1, 1)),
    "unfold": lambda x: (x * 2).unfold(1, 2, 1),
    "unfold_rows": lambda x: (x + 1).unfold(0, 3, 2),
    "gather_then_unfold": lambda x: x.gather(1, x.detach().argsort(1)).unfold(1, 2, 1) * 3,
}


@pytest.mark.parametrize("name", list(OVERLAPPING_OUTPUTS))
def test_gradient_through_an_output_that_overlaps_itself(name):
    _check_gradients(OVERLAPPING_OUTPUTS[name], [(5, 4)])


def test_overlap_check_of_tangent_layouts():
    from kiln._torch import may_overlap_itself

    x = torch.empty(5, 4)
    assert not may_overlap_itself(x) and not may_overlap_itself(x.t()) and not may_overlap_itself(x[:, ::2])
    assert may_overlap_itself(x.unfold(1, 2, 1)) and may_overlap_itself(x.as_strided((2, 2), (1, 1)))
    assert may_overlap_itself(x[:1].expand(3, 4)) and not may_overlap_itself(x.unfold(1, 2, 2))
