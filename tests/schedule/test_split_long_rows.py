"""kiln/schedule/split.py `_long_rows`: a reduction of few rows too long for registers is split even where its
consumer reads the rows again (an NCHW batch norm's statistics in training), its welford in one read of x as
the outer split's; the values against eager and float64 on both CPU backends, and the split's accuracy against
the unsplit kernel's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backend import compile_graph
from kiln.schedule import split


def _random(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rows, columns, count", [
    (64, 64 * 112 * 112, 16),  # ResNet-50's stem batch norm at batch 64: 1024 programs
    (512, 64 * 28 * 28, 2),
    (1024, 64 * 7 * 7, 1),  # rows enough to fill the GPU
    (3, 9973 * 2, 2),  # a prime-times-two row: only 2 divides into chunks of >= 1024
])
def test_long_row_split_count(rows, columns, count):
    assert split.long_row_split_count(rows, columns) == count


def test_an_empty_reduction_of_long_rows_is_not_split():
    x = torch.randn(0, 40000)
    with kiln.config.patch(strict=True, cpu_backend="triton"):
        (out,) = compile_graph(torch.fx.symbolic_trace(lambda x: (torch.softmax(x, -1),)), [x])(x)
    assert out.shape == (0, 40000)


def _statistics_kernels(x, **options):
    """var_mean over (N, H, W) of an NCHW x feeding the normalization (the batch norm's pattern): the compiled
    graph's kernels and its results."""

    def normalized(x):
        variance, mean = torch.var_mean(x, dim=(0, 2, 3), keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(variance + 1e-5), variance.flatten()

    with kiln.config.patch(strict=True, cpu_backend="triton", **options):
        compiled = compile_graph(torch.fx.symbolic_trace(normalized), [x])
        return compiled.scheduled.kernels, compiled(x), normalized(x.double())


def test_few_long_rows_feeding_their_consumer_are_split():
    x = _random((8, 8, 64, 64), 1) * 3 + 2  # 8 rows of 32768 columns (split_long_row_min_columns)
    kernels, (out, variance), (out64, variance64) = _statistics_kernels(x)
    # stage 1 (welfords of chunks, 8 x 32 programs), stage 2 (the two merging sums), then the normalization
    assert [len(kernel.nodes) for kernel in kernels] == [1, 3, 1], kernels
    assert [int(size) for size in kernels[0].row_ranges] == [8, 32]
    torch.testing.assert_close(out.double(), out64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(variance.double(), variance64, rtol=1e-5, atol=1e-6)
    whole, (out, _), _ = _statistics_kernels(x, split_long_row_programs=0)
    # the option off: one program per channel (8) loops over its 32768 columns; the normalization (over N, C, H,
    # W: the channel is not its leading dim) was never fused with it
    assert [int(size) for size in whole[0].row_ranges] == [8] and len(whole) == 2, whole
    torch.testing.assert_close(out.double(), out64, rtol=1e-5, atol=1e-5)


def test_rows_in_registers_or_short_stay_whole():
    for shape in ((2, 8, 32, 32), (4, 8, 64, 64)):  # 2048 columns (in registers, read once), 16384 (short)
        kernels, _, _ = _statistics_kernels(_random(shape, 2))
        assert [int(size) for size in kernels[0].row_ranges] == [8] and len(kernels) == 2, kernels


@pytest.mark.parametrize("values", ["offset", "outlier", "equal"])
def test_a_split_row_welford_is_as_accurate_as_the_whole_one(values):
    """The outer split's accuracy cases (tests/schedule/test_outer.py) for a row welford: a mean 1e5 spreads
    from 0, K (the row's first element) 100 spreads out, and equal values (exact mean, variance 0)."""
    x = _random((8, 8, 64, 64), 7) * 0.01 + 1000
    if values == "outlier":
        x[0, :, 0, 0] = 1000 + 100 * 0.01
    elif values == "equal":
        x = torch.full((8, 8, 64, 64), 3.7)
    _, (_, split_variance), (_, reference) = _statistics_kernels(x)
    _, (_, whole_variance), _ = _statistics_kernels(x, split_long_row_programs=0)
    if values == "equal":
        assert torch.equal(split_variance, torch.zeros(8))
        return
    split_error = float(((split_variance.double() - reference) / reference).abs().max())
    whole_error = float(((whole_variance.double() - reference) / reference).abs().max())
    assert split_error <= max(1.5 * whole_error, 1e-6), (split_error, whole_error)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_an_nchw_batch_norm_trains_as_eager(backend, monkeypatch):
    """Forward and backward of a training batch norm and ReLU, NCHW, 8 channels of 32768: the statistics and
    the backward's per-channel sums split; output and gradients against eager and float64."""
    torch.manual_seed(0)
    counts = []  # each long-row split's chunk count, in the forward and in the backward
    count_of = split.long_row_split_count
    monkeypatch.setattr(split, "long_row_split_count", lambda *sizes: counts.append(count_of(*sizes)) or counts[-1])

    def step(x, w, b):
        return F.batch_norm(x, None, None, w, b, training=True).relu()

    x = (_random((8, 8, 64, 64), 3) * 3 + 100).requires_grad_()
    w, b = _random((8,), 4).requires_grad_(), _random((8,), 5).requires_grad_()
    grad = _random((8, 8, 64, 64), 6)
    with kiln.config.patch(cpu_backend=backend, graph_cache=False, strict=True):
        out = kiln.compile(step)(x, w, b)
        split_in_forward = len(counts)
        out.backward(grad)
    assert split_in_forward >= 1 and len(counts) > split_in_forward and all(count > 1 for count in counts), counts
    got = [out.detach(), *(t.grad for t in (x, w, b))]
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    expected = step(*leaves)
    expected.backward(grad)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
    reference = step(*leaves64)
    reference.backward(grad.double())
    for mine, theirs, exact in zip(got, [expected.detach(), *(t.grad for t in leaves)],
                                   [reference.detach(), *(t.grad for t in leaves64)]):
        verdict = kiln.testing.compare(mine, theirs, exact)
        assert verdict, verdict.message
