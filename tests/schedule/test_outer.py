"""kiln/schedule/outer.py: which reductions are outer ones (rows contiguous, columns strided), how
split_reductions splits them chunk-major, the tile the Triton generator gives them, and end to end on
both CPU backends (C++, and Triton under the interpreter): bias and norm-weight gradients and
channels-last statistics against eager and float64."""
from __future__ import annotations

from unittest import mock

import pytest
import sympy
import torch

import kiln
from kiln.backend import compile_graph
from kiln.ir import Body, Buffer, Graph, Layout, Reduction
from kiln.ir.indexing import range_vars
from kiln.schedule import split
from kiln.schedule.outer import is_outer_reduction
from tests.golden.capture import record_graphs


def _sum_node(size, stride, reduced):
    """out[kept dims] = sum of x (sizes `size`, strides `stride`) over dim `reduced`."""
    x = Buffer("arg0", torch.device("cpu"), torch.float32,
               Layout(tuple(map(sympy.Integer, size)), tuple(map(sympy.Integer, stride))))
    kept = [s for k, s in enumerate(size) if k != reduced]
    out = Buffer("buf0", torch.device("cpu"), torch.float32,
                 Layout(tuple(map(sympy.Integer, kept)),
                        tuple(map(sympy.Integer, torch.empty(kept).stride()))))
    rows, (column,) = range_vars(len(kept)), range_vars(1, "r")
    index = rows[:reduced] + [column] + rows[reduced:]
    body = Body()
    total = body.emit("reduce", (body.load(x, index),), torch.float32, attr="sum")
    body.store(out, rows, total)
    node = Reduction("node0", [sympy.Integer(s) for s in kept], body, ["buf0"],
                     reduction_ranges=[sympy.Integer(size[reduced])])
    return node, Graph(buffers={"arg0": x, "buf0": out}, nodes=[node])


def test_a_sum_over_the_leading_dim_of_a_contiguous_matrix_is_outer():
    node, graph = _sum_node((4096, 96), (96, 1), reduced=0)
    assert is_outer_reduction(node, graph.buffers)


def test_a_sum_over_the_contiguous_dim_is_not_outer():
    node, graph = _sum_node((4096, 96), (96, 1), reduced=1)
    assert not is_outer_reduction(node, graph.buffers)


def test_a_sum_over_a_transposed_matrix_leading_dim_is_not_outer():
    node, graph = _sum_node((4096, 96), (1, 4096), reduced=0)  # columns contiguous after all
    assert not is_outer_reduction(node, graph.buffers)


def test_an_outer_split_is_chunk_major_and_both_stages_stay_outer():
    node, graph = _sum_node((4096, 96), (96, 1), reduced=0)
    split.split_reductions(graph)
    first, second = graph.nodes
    assert [int(size) for size in first.ranges] == [16, 96] and [int(s) for s in first.reduction_ranges] == [256]
    assert graph.buffers["node0_partial"].layout.size == (16, 96)
    assert [int(s) for s in second.reduction_ranges] == [16]
    assert is_outer_reduction(first, graph.buffers) and is_outer_reduction(second, graph.buffers)


@pytest.mark.parametrize("rows, columns, count", [(768, 12608, 32), (64, 200704, 784), (4096, 12608, 16),
                                                   (768, 300, 1), (0, 4096, 1)])
def test_outer_split_count(rows, columns, count):
    # enough chunks for about 1024 programs of 64 rows, each chunk at least 256 columns, dividing exactly
    # (12608 = 64 x 197: 32 for 12 row tiles (85 wanted, 49 at most); 16 for 64; none under 256 columns)
    assert split.outer_split_count(rows, columns) == count


# ---- end to end ---------------------------------------------------------------------------------
def _random(shape, seed, dtype=torch.float32):
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    return torch.where(values == 0, 1.0, values).to(dtype)


def _bias_and_norm_weight_grads(grad, x):  # a linear's bias gradient, a layer norm's weight gradient
    return grad.sum(0), (grad * x).sum(0)


def _channels_last_statistics(x):
    variance, mean = torch.var_mean(x, dim=(0, 2, 3))
    return x.sum(dim=(0, 2, 3)), x.amax(dim=(0, 2, 3)), variance, mean


def _channels_last_batch_norm(x, weight, bias):  # training statistics: an outer welford, split in three sums
    variance, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    return torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True), variance, mean


def _batch_norm_1d(x, weight, bias):  # BatchNorm1d's training statistics over the batch: an outer welford of (N, C)
    variance, mean = torch.var_mean(x, dim=0)
    return torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True), variance, mean


def _middle_dim(x):
    return x.sum(1), (x * 2).mean(1)


PROGRAMS = {
    "bias_and_norm_weight_grads": (_bias_and_norm_weight_grads,
                                   lambda dtype: [_random((2560, 80), 0, dtype), _random((2560, 80), 1, dtype)]),
    "channels_last_statistics": (_channels_last_statistics,
                                 lambda dtype: [_random((4, 24, 9, 8), 2, dtype).to(memory_format=torch.channels_last)]),
    "middle_dim": (_middle_dim, lambda dtype: [_random((3, 300, 40), 3, dtype)]),
    "batch_norm_1d": (_batch_norm_1d, lambda dtype: [(_random((4096, 48), 10) + 3).to(dtype), _random((48,), 11, dtype),
                                                     _random((48,), 12, dtype)]),
    "channels_last_batch_norm": (_channels_last_batch_norm, lambda dtype: [
        (_random((8, 24, 16, 16), 4) + 5).to(dtype).to(memory_format=torch.channels_last),
        _random((24,), 5, dtype), _random((24,), 6, dtype)]),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_outer_reductions_match_eager(backend, dtype, program):
    from kiln.testing import compare, to_float64

    fn, make_inputs = PROGRAMS[program]
    inputs = make_inputs(dtype)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        got = compiled(*inputs)
    assert any(kernel.outer for kernel in compiled.scheduled.kernels)
    verdict = compare(got, fn(*inputs), fn(*to_float64(inputs)))
    assert verdict, verdict.message


def test_the_triton_tile_of_an_outer_kernel_walks_rows_across_lanes():
    fn, make_inputs = PROGRAMS["bias_and_norm_weight_grads"]
    with record_graphs("triton") as graphs:
        with kiln.config.patch(cpu_backend="triton"):
            compile_graph(torch.fx.symbolic_trace(fn), make_inputs(torch.float32))
    (graph,) = graphs
    loopir = graph.files["loopir_after_cse.txt"]
    # 2560 columns, 80 rows: two row tiles, so the columns split in 10 chunks of 256, chunk-major
    assert "rows=[10, 80] cols=[256] looped outer" in loopir, loopir
    assert "rows=[80] cols=[10] persistent outer" in loopir, loopir
    launches = graph.files["wrapper.py"]
    # a program per 64 rows (XBLOCK): stage 1's 800 (chunk, row) pairs in 13 programs, stage 2's 80 in 2
    assert "k0(13, " in launches and "k1(2, " in launches, launches


def test_without_the_outer_rule_the_values_are_the_same():
    """Outer tiling and the chunk-major split change the visiting order only: the sums agree with the
    listed-order kernels to float32 rounding."""
    fn, make_inputs = PROGRAMS["bias_and_norm_weight_grads"]
    inputs = make_inputs(torch.float32)
    with kiln.config.patch(strict=True, cpu_backend="triton"):
        outer = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))(*inputs)
        with mock.patch("kiln.schedule.split.is_outer_reduction", lambda node, buffers: False), \
                mock.patch("kiln.schedule.fusion.is_outer_reduction", lambda node, buffers: False):
            plain = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))(*inputs)
    for a, b in zip(outer, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_a_split_welford_keeps_eager_exactness_on_equal_values(backend):
    """Welfords of chunks of x - K (K the row's first element), merged: a channel of equal values has its
    exact mean and variance 0, as eager's (sum(x) / n alone was a few ulp off, and every squared deviation
    then counted)."""
    x = torch.full((8, 24, 16, 16), 3.7).to(memory_format=torch.channels_last)
    x[:, 1] = 0.1  # another value in another channel

    def stats(x):
        return torch.var_mean(x, dim=(0, 2, 3))

    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(stats), [x])
        variance, mean = compiled(x)
    # 2048 columns of 24 rows: split in chunks (one read of x), then the two sums that merge them in one kernel,
    # both outer kernels
    kernels = compiled.scheduled.kernels
    assert len(kernels) == 2 and all(kernel.outer for kernel in kernels), kernels
    assert [len(kernel.nodes) for kernel in kernels] == [1, 2]
    assert torch.equal(variance, torch.zeros(24)) and torch.equal(mean, stats(x)[1])


def _split_and_whole_statistics(x):
    """var_mean over (N, H, W) of a channels-last x: split (outer), unsplit (the outer rule off), float64."""

    def stats(x):
        return torch.var_mean(x, dim=(0, 2, 3))

    with kiln.config.patch(strict=True, cpu_backend="triton"):
        split = compile_graph(torch.fx.symbolic_trace(stats), [x])(x)
        with mock.patch("kiln.schedule.split.is_outer_reduction", lambda node, buffers: False), \
                mock.patch("kiln.schedule.fusion.is_outer_reduction", lambda node, buffers: False):
            whole = compile_graph(torch.fx.symbolic_trace(stats), [x])(x)
    return split, whole, stats(x.double())


def test_the_split_welford_is_as_accurate_as_the_whole_one():
    """A mean 1e5 times the spread (1000 +- 0.01): float32 statistics lose digits here, eager's CPU kernel
    (double accumulators) does not. The split must lose no more than the unsplit welford kernel."""
    x = (_random((8, 24, 16, 16), 7) * 0.01 + 1000).to(memory_format=torch.channels_last)
    (split_variance, _), (whole_variance, _), reference = _split_and_whole_statistics(x)
    split_error = float((split_variance.double() - reference[0]).abs().max())
    whole_error = float((whole_variance.double() - reference[0]).abs().max())
    assert split_error <= 1.5 * whole_error, (split_error, whole_error)


@pytest.mark.parametrize("layout", ["outlier", "dead"])
def test_the_split_welford_is_accurate_where_its_shift_lies_far_out(layout):
    """The split shifts each row by its first element K. Where K lies far out in the row's distribution
    (100 spreads from the mean; a channel of zeros but K and one other), sum(x - K) and sum((x - K)^2)
    would cancel (3e-4 of the variance lost at 100 spreads, measured); welfords of chunks of x - K, merged
    by Chan's formula, lose no more than the unsplit welford kernel."""
    if layout == "outlier":
        x = _random((8, 24, 16, 16), 7) * 0.01 + 1000
        x[0, :, 0, 0] = 1000 + 100 * 0.03
    else:
        x = torch.zeros(8, 24, 16, 16)
        x[0, :, 0, 0] = 5.0
        x[3, 5, 2, 2] = -1.0
    (split_variance, split_mean), (whole_variance, _), reference = _split_and_whole_statistics(
        x.to(memory_format=torch.channels_last))
    split_error = float(((split_variance.double() - reference[0]) / reference[0]).abs().max())
    whole_error = float(((whole_variance.double() - reference[0]) / reference[0]).abs().max())
    assert split_error <= max(1.5 * whole_error, 1e-7), (split_error, whole_error)
    torch.testing.assert_close(split_mean.double(), reference[1], rtol=1e-6, atol=1e-6)


def test_a_split_read_through_a_broadcast_stays_outer():
    """A channels-last batch norm's weight gradient after a global average pool (ResNet's last block):
    sum over (N, H, W) of x * g[n, c] / 49. Split in chunks of whole images, the first stage reads g at
    n = chunk * k + r // 49, a FloorDiv of the column; its rows (channels) are still contiguous in x and g,
    so the kernel is tiled as an outer one (it was a [1, 512] row tile, each lane 2048 elements apart)."""
    x = _random((16, 256, 7, 7), 8).to(memory_format=torch.channels_last)
    g = _random((16, 256), 9)

    def weight_gradient(x, g):
        return (x * (g[:, :, None, None] / 49)).sum(dim=(0, 2, 3)),

    with kiln.config.patch(strict=True, cpu_backend="triton"):
        compiled = compile_graph(torch.fx.symbolic_trace(weight_gradient), [x, g])
        got = compiled(x, g)
    reductions = [kernel for kernel in compiled.scheduled.kernels if kernel.col_ranges]
    assert len(reductions) == 2 and all(kernel.outer for kernel in reductions), reductions
    torch.testing.assert_close(got[0], weight_gradient(x, g)[0], rtol=1e-5, atol=1e-4)
