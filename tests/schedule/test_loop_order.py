"""kiln/schedule/loop_order.py: which order a pointwise kernel walks its rows in, on hand-built
kernels, then end to end on both CPU backends (C++, and Triton under the interpreter): permuted
outputs (channels-last, transposed) walked in memory order, with results bit-identical to eager's and
to listed order's."""
from __future__ import annotations

from unittest import mock

import pytest
import sympy
import torch

import kiln
from kiln.backend import compile_graph
from kiln.ir import Body, Buffer, Graph, IRVerificationError, Layout, Pointwise
from kiln.ir.indexing import FloorDiv, range_vars
from kiln.ir.kernel import Kernel, ScheduledGraph
from kiln.schedule import loop_order, passes, verify_scheduled
from tests.golden.capture import record_graphs


def _buffer(name, size, stride):
    return Buffer(name, torch.device("cpu"), torch.float32,
                  Layout(tuple(map(sympy.Integer, size)), tuple(map(sympy.Integer, stride))))


def _copy_kernel(size, out_stride, index=None):
    """One pointwise kernel over rows `size`: out[i...] = x[i...] (x contiguous, out with `out_stride`)."""
    variables = range_vars(len(size))
    contiguous = [int(torch.tensor(1).new_empty(size).stride()[k]) for k in range(len(size))]
    x, out = _buffer("arg0", size, contiguous), _buffer("buf0", size, out_stride)
    body = Body()
    body.store(out, index or variables, body.load(x, variables))
    node = Pointwise("node0", list(size), body, ["buf0"])
    kernel = Kernel("k0", [sympy.Integer(s) for s in size], [], [node], ["full"])
    return ScheduledGraph(Graph(buffers={"arg0": x, "buf0": out}, nodes=[node]), [kernel])


def _order(scheduled):
    return loop_order.order_loops(scheduled).kernels[0].row_order


def test_a_channels_last_output_is_walked_channel_innermost():
    # [N, C, H, W] = [2, 8, 5, 6] stored NHWC: strides (240, 1, 48, 8)
    assert _order(_copy_kernel((2, 8, 5, 6), (240, 1, 48, 8))) == (0, 2, 3, 1)


def test_a_contiguous_output_keeps_listed_order():
    assert _order(_copy_kernel((2, 8, 5, 6), (240, 30, 6, 1))) is None


def test_a_transposed_output_is_walked_in_its_memory_order():
    assert _order(_copy_kernel((4, 8), (1, 4))) == (1, 0)


def test_size_one_rows_keep_their_places():
    # [2, 1, 3, 5] stored as a permute(0, 3, 1, 2) would: the size-1 dim stays where it was listed
    assert _order(_copy_kernel((2, 1, 3, 5), (15, 15, 1, 3))) == (0, 1, 3, 2)


def test_an_offset_that_divides_keeps_listed_order():
    """A store whose index divides a row variable (a view): no stride per row, so listed order."""
    i0, i1 = range_vars(2)
    scheduled = _copy_kernel((4, 8), (1, 4), index=[FloorDiv(i0 * 8 + i1, 8), i1])
    assert _order(scheduled) is None


def test_verify_rejects_an_order_that_is_not_one():
    scheduled = _copy_kernel((4, 8), (1, 4))
    kernel = scheduled.kernels[0]
    kernel.row_order = (1, 1)
    with pytest.raises(IRVerificationError, match="is not an order"):
        verify_scheduled(scheduled)


def test_the_order_prints_in_the_kernel():
    assert "rows=[4, 8] order=[x1, x0]" in loop_order.order_loops(_copy_kernel((4, 8), (1, 4))).format()


# ---- end to end ---------------------------------------------------------------------------------
def _random(shape, dtype=torch.float32, seed=0):
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    return torch.where(values == 0, 1.0, values).to(dtype)


def _batch_norm_relu(x, scale, shift, residual):
    return (torch.relu(x * scale + shift) + residual,)


def _transposed_sum(x, y):
    return (x.t() * 2 + y.t(),)  # TensorIterator gives the result x.t()'s (transposed) layout


PROGRAMS = {
    "nhwc_batch_norm_relu": (_batch_norm_relu, lambda dtype: [
        _random((2, 16, 5, 7), dtype).to(memory_format=torch.channels_last), _random((1, 16, 1, 1), dtype, 1),
        _random((1, 16, 1, 1), dtype, 2), _random((2, 16, 5, 7), dtype, 3).to(memory_format=torch.channels_last)]),
    "transposed": (_transposed_sum, lambda dtype: [_random((12, 33), dtype), _random((12, 33), dtype, 1)]),
}


def _compile(fn, inputs, backend, with_order=True):
    with kiln.config.patch(strict=True, cpu_backend=backend), \
            mock.patch.object(loop_order, "memory_order", loop_order.memory_order if with_order
                              else (lambda kernel, buffers: None)):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        return compiled, compiled(*inputs)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_permuted_outputs_match_eager_and_listed_order_bit_for_bit(backend, dtype, program):
    fn, make_inputs = PROGRAMS[program]
    inputs = make_inputs(dtype)
    compiled, (got,) = _compile(fn, inputs, backend)
    (want,) = fn(*inputs)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    _, (listed,) = _compile(fn, inputs, backend, with_order=False)
    assert torch.equal(got, listed)
    orders = [kernel.row_order for kernel in compiled.scheduled.kernels]
    assert any(order is not None for order in orders), orders


def test_triton_lanes_walk_the_channel_dim_of_an_nhwc_output():
    fn, make_inputs = PROGRAMS["nhwc_batch_norm_relu"]
    inputs = make_inputs(torch.float32)
    with record_graphs("triton") as graphs:
        _compile(fn, inputs, "triton")
    (graph,) = graphs
    (source,) = graph.kernels().values()
    # rows [2, 16, 5, 7]: x1 (C) is the fastest-moving, so it is xindex modulo C, without a division
    assert "x1 = (xindex % (16))" in source, source
    assert "order=[x0, x2, x3, x1]" in graph.files["loopir_after_loop_order.txt"]


def test_cpp_nests_the_channel_loop_innermost():
    fn, make_inputs = PROGRAMS["nhwc_batch_norm_relu"]
    with record_graphs("cpp") as graphs:
        _compile(fn, make_inputs(torch.float32), "cpp")
    (graph,) = graphs
    (source,) = graph.kernels().values()
    simd = source.index("#pragma omp simd")
    assert "for (int64_t x1 = 0; x1 < 16; x1++)" in source[simd:], source
