"""max_pool2d (kiln/lowering/pooling.py): with its indices unread, one pointwise kernel over the output,
fused with the pointwise work before and after it, equal to eager's (a maximum is exact in every dtype) for
padding, strides, dilation, ceil_mode's overhanging last window, 3-d inputs, channels-last layouts, NaN and
-inf inputs. With its indices read (training), the indices equal eager's (ties: the first; NaN: the last; a
window of -inf only: its first in-bounds element), and the backward, max_pool2d_with_indices_backward, is a
generated kernel too whose gradients match eager's."""
from __future__ import annotations

import math

import pytest
import torch

import kiln
from kiln.debug.explain import explain

F = torch.nn.functional

CASES = [  # (shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last)
    ((2, 3, 9, 11), 3, 2, 1, 1, False, False),
    ((2, 3, 9, 11), 3, 2, 1, 1, True, False),  # the last window overhangs the padded edge
    ((1, 4, 8, 8), 2, None, 0, 1, False, False),  # stride defaults to the window
    ((3, 7, 10), (3, 2), (2, 1), (1, 0), (2, 1), True, False),  # 3-d input, dilated, rectangular
    ((2, 8, 12, 12), 3, 2, 1, 1, False, True),  # ResNet's stem, channels-last
]


def every_backend_case_and_dtype(test):
    """`test` for each CPU backend, each of CASES and float32 and bfloat16."""
    for mark in (pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16]),
                 pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))]),
                 pytest.mark.parametrize("backend", ["cpp", "triton"])):
        test = mark(test)
    return test


def _program(kernel_size, stride, padding, dilation, ceil_mode):
    def program(x):
        # all below 0 after the shift: a window edge padded with anything but -inf would show
        return F.max_pool2d(torch.relu(x) * 2 - 5, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode) - 1

    return program


def _input(shape, channels_last, dtype):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    x.view(-1)[17] = float("nan")
    x.view(-1)[40] = float("-inf")
    return x.to(memory_format=torch.channels_last) if channels_last else x


@every_backend_case_and_dtype
def test_max_pool2d_is_one_fused_kernel_equal_to_eagers(backend, case, dtype):
    shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last = case
    program = _program(kernel_size, stride, padding, dilation, ceil_mode)
    x = _input(shape, channels_last, dtype)
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        (graph,) = explain(program, x).graphs
        got = kiln.compile(program)(x)
        expected = program(x)
    assert graph.kernels == 1 and graph.externs == 0, graph.lines()
    assert got.stride() == expected.stride() and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_max_pool2d_indices_are_generated_and_equal_eagers(backend, case):
    shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last = case

    def program(x):  # relu(x) * 2 - 5 ties every window of negatives at -5: the first one is eager's index
        values, indices = F.max_pool2d(torch.relu(x) * 2 - 5, kernel_size, stride, padding, dilation,
                                       ceil_mode=ceil_mode, return_indices=True)
        return values * 3, indices

    x = _input(shape, False, torch.float32)
    x.view(-1)[41] = float("nan")
    x.view(-1)[:12] = float("-inf")  # windows of -inf only (after the relu: -5, ties)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        (graph,) = explain(program, x).graphs
        got = kiln.compile(program)(x)
    assert graph.externs == 0 and graph.kernels >= 1, graph.lines()
    for value, want in zip(got, program(x)):
        torch.testing.assert_close(value, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_max_pool2d_indices_of_windows_of_minus_infinity_and_nans(backend):
    """No relu: raw -inf and NaN elements in the windows, padded windows of -inf only."""
    def program(x):
        return F.max_pool2d(x, 2, 2, 1, return_indices=True)

    x = torch.full((1, 2, 5, 5), float("-inf"))
    x[0, 1] = torch.randn(5, 5, generator=torch.Generator().manual_seed(1))
    x[0, 1, 1, 1] = x[0, 1, 2, 2] = x[0, 1, 3, 3] = float("nan")  # two NaNs in window (1, 1): eager's index is the last
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        got = kiln.compile(program)(x)
    for value, want in zip(got, program(x)):
        torch.testing.assert_close(value, want, rtol=0, atol=0, equal_nan=True)


def _backward_ops(compiled, x, grad) -> dict:
    """{ATen op name: calls} of max pooling that ran eagerly in the compiled step's forward and backward."""
    from torch.profiler import profile

    with profile() as prof:
        compiled(x).backward(grad)
    return {event.key: event.count for event in prof.key_averages() if "max_pool" in event.key}


def _gradients(program, x, grad, backend=None) -> torch.Tensor:
    """x's gradient of `program` at `x` for `grad`: eager's, or kiln's with `backend` (on a copy of x)."""
    x = x.detach().clone().requires_grad_()
    if backend is None:
        program(x).backward(grad)
        return x.grad
    kiln.reset()
    with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        kiln.compile(program)(x).backward(grad)
    return x.grad


def _check_gradients(program, x, grad, backend, context=None) -> None:
    """kiln's gradient against eager's, under kiln.testing's rule with a float64 reference (eager's bf16
    backward rounds each window's sum of gradients where kiln sums in float32)."""
    from kiln.testing import compare

    got, want = _gradients(program, x, grad, backend), _gradients(program, x, grad)
    reference = _gradients(program, x.double(), grad.double())
    assert got.stride() == want.stride(), context
    verdict = compare(got, want, reference)
    assert verdict.ok, (context, verdict.message)


def _pool(kernel_size, stride, padding, dilation, ceil_mode):
    def program(x):  # the maxima and the indices are exact in any dtype: float64's gradient is a reference
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)

    return program


@every_backend_case_and_dtype
def test_max_pool2d_backward_is_generated_and_matches_eagers(backend, case, dtype):
    shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last = case
    program = _pool(kernel_size, stride, padding, dilation, ceil_mode)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    grad = torch.randn(program(x).shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    _check_gradients(program, x, grad, backend)
    kiln.reset()
    with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        compiled = kiln.compile(program)
        x = x.detach().requires_grad_()
        compiled(x).backward(grad)  # compiles forward and backward
        assert _backward_ops(compiled, x, grad) == {}


def test_max_pool2d_in_training_gives_eagers_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
    x = torch.randn(2, 3, 10, 10)
    expected = model(x)
    expected.sum().backward()
    wants = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad()
    kiln.reset()
    with kiln.config.patch(strict=True):
        got = kiln.compile(model)(x)
        got.sum().backward()
    torch.testing.assert_close(got, expected)
    for parameter, want in zip(model.parameters(), wants):
        torch.testing.assert_close(parameter.grad, want)


def test_integer_max_pool2d_stays_atens():
    """-inf, the padding, has no integer value: ATen's kernel pools integers."""
    def program(x):
        return F.max_pool2d(x, 3, 2, 1) * 2

    x = torch.randint(-50, 50, (1, 2, 7, 7))
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, graph_cache=False):
        (graph,) = explain(program, x).graphs
        got = kiln.compile(program)(x)
    assert graph.extern_ops == {"aten.max_pool2d_with_indices.default": 1}, graph.lines()
    torch.testing.assert_close(got, program(x), rtol=0, atol=0)


def _random_cases(count: int, seed: int) -> list:
    """Valid max_pool2d calls drawn at random: windows 1-4 (rectangular), strides 1-3, padding up to half the
    window (torch's bound), dilation 1-2, ceil_mode either way, 3-d and 4-d inputs of sizes that leave at least one
    output, some channels-last."""
    import random

    rng, cases = random.Random(seed), []
    while len(cases) < count:
        kernel = (rng.randint(1, 4), rng.randint(1, 4))
        stride = (rng.randint(1, 3), rng.randint(1, 3))
        padding = (rng.randint(0, kernel[0] // 2), rng.randint(0, kernel[1] // 2))
        dilation = (rng.randint(1, 2), rng.randint(1, 2))
        rank = rng.choice((3, 4))
        shape = (rng.randint(1, 3),) * (rank - 3) + (rng.randint(1, 4), rng.randint(1, 13), rng.randint(1, 13))
        if any(shape[-2 + k] + 2 * padding[k] < dilation[k] * (kernel[k] - 1) + 1 for k in (0, 1)):
            continue  # no window fits: torch raises
        cases.append((shape, kernel, stride, padding, dilation, rng.random() < 0.4, rank == 4 and rng.random() < 0.4))
    return cases


@pytest.mark.parametrize("backend, count", [("cpp", 40), ("triton", 12)])
def test_max_pool2d_on_random_valid_calls_equals_eagers(backend, count):
    for case in _random_cases(count, seed=len(backend)):
        shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last = case
        program = _program(kernel_size, stride, padding, dilation, ceil_mode)
        x = _input(shape, channels_last, torch.float32) if math.prod(shape) > 40 else torch.randn(shape)
        expected = program(x)
        kiln.reset()
        with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
            got = kiln.compile(program)(x)
        assert got.shape == expected.shape and got.stride() == expected.stride(), case
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=lambda message: f"{case}: {message}")


@pytest.mark.parametrize("backend, count", [("cpp", 30), ("triton", 8)])
def test_max_pool2d_backward_on_random_valid_calls_matches_eagers(backend, count):
    for case in _random_cases(count, seed=10 + len(backend)):
        shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last = case
        program = _pool(kernel_size, stride, padding, dilation, ceil_mode)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(4))
        x = x.to(memory_format=torch.channels_last) if channels_last else x
        grad = torch.randn(program(x).shape, generator=torch.Generator().manual_seed(5))
        _check_gradients(program, x, grad, backend, case)
