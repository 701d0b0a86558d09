"""Scatter lowerings (kiln/lowering/scatters.py) against eager, on both CPU backends.

slice_scatter, select_scatter and a scatter with one index per row are pointwise choices between
base and source, so they fuse: a slice's backward (slice_scatter into zeros, added to other
gradients) and nll_loss's backward (scatter into zeros) run as kernels, not as ATen copies. The
forward's partner, cat (rotate_half), reads its parts under masks: kiln/schedule/inline.py inlines
them there, so the rotary embedding is one kernel too.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln.aot import aot_compile
from kiln.backend import compile_aten_graph

SCATTER_OPS = {"aten.slice_scatter.default", "aten.select_scatter.default", "aten.scatter.value",
               "aten.scatter.src"}


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    with kiln.config.patch(cpu_backend=request.param):
        yield request.param


def _compile(fn, *inputs, lowered: bool = True):
    """`fn` through kiln's AOT stage and backend (strict: no eager fallback); returns the compiled
    function and the ATen ops the graphs still call."""
    graphs = []

    def record(aten_gm, aten_inputs):
        graphs.append(compile_aten_graph(aten_gm, aten_inputs))
        return graphs[-1]

    with kiln.config.patch(strict=True):
        compiled = aot_compile(torch.fx.symbolic_trace(fn), list(inputs), record)
    externs = {op for graph in graphs for op in graph.scheduled.graph.extern_ops}
    if lowered:
        assert not SCATTER_OPS & externs, externs
        assert all(graph.kernel_count >= 1 for graph in graphs)
    return compiled, externs


def _check(fn, *inputs, lowered: bool = True):
    compiled, externs = _compile(fn, *inputs, lowered=lowered)
    with kiln.config.patch(strict=True):
        result = compiled(*inputs)
    verdict = kiln.testing.compare(result, fn(*inputs), fn(*kiln.testing.to_float64(inputs)))
    assert verdict, verdict.message
    return externs


@pytest.mark.parametrize("dim, start, end, step", [
    (1, None, 3, 1), (1, 2, 5, 1), (1, -3, None, 1), (0, 1, None, 2), (2, 1, 7, 3), (-1, 0, 8, 4),
    (1, 0, 0, 1),  # an empty slice: base unchanged
])
def test_slice_scatter(dim, start, end, step):
    base = torch.randn(5, 6, 8)
    src = torch.randn_like(base[(slice(None),) * (dim % 3) + (slice(start, end, step),)])

    def fn(base, src):
        return (torch.slice_scatter(base.cos(), src * 2, dim, start, end, step) + 1,)

    _check(fn, base, src)


def test_slice_scatter_bfloat16_into_zeros_fuses_with_its_sum():
    """A slice's backward, as autograd writes it for rotate_half: two slice_scatters into zeros, added."""
    grad = torch.randn(4, 3, 16, dtype=torch.bfloat16)

    def fn(grad):
        zeros = torch.zeros(4, 3, 32, dtype=torch.bfloat16)
        first = torch.slice_scatter(zeros, grad, 2, 0, 16)
        second = torch.slice_scatter(zeros, -grad, 2, 16, 32)
        return (first + second,)

    _check(fn, grad)


@pytest.mark.parametrize("dim, index", [(0, 2), (1, -1), (2, 0)])
def test_select_scatter(dim, index):
    base = torch.randn(3, 4, 5)
    src = torch.randn_like(base.select(dim, index))

    def fn(base, src):
        return (torch.select_scatter(base * 3, src.exp(), dim, index),)

    _check(fn, base, src)


def test_scatter_value_one_index_per_row():
    """nll_loss's backward: -1 at each row's target, in a zero matrix."""
    target = torch.randint(0, 10, (6, 1))

    def fn(logits, target):
        return (torch.scatter(torch.zeros_like(logits), 1, target, -1.0) * logits.softmax(-1),)

    _check(fn, torch.randn(6, 10), target)


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_src_with_a_smaller_index(dim):
    """The index covers part of base in the other dims; the rest keeps base's values."""
    base = torch.randn(5, 7)
    index_shape = (1, 4) if dim == 0 else (3, 1)
    index = torch.randint(0, base.shape[dim], index_shape)
    src = torch.randn(4, 6)

    def fn(base, index, src):
        return (torch.scatter(base + 1, dim, index, src.sin()),)

    _check(fn, base, index, src)


def test_scatter_with_several_indices_per_row_stays_an_extern():
    """Two indices of one row may name the same element: eager's kernel decides which write wins."""
    base, src = torch.randn(4, 6), torch.randn(4, 3)
    index = torch.stack([torch.randperm(6)[:3] for _ in range(4)])

    def fn(base, index, src):
        return (torch.scatter(base, 1, index, src) * 2,)

    externs = _check(fn, base, index, src, lowered=False)
    assert "aten.scatter.src" in externs


def test_scatter_index_out_of_range_raises():
    def fn(base, index):
        return (torch.scatter(base, 1, index, 1.0) + 1,)

    base, good = torch.randn(3, 4), torch.tensor([[0], [3], [1]])
    compiled, _ = _compile(fn, base, good)
    with kiln.config.patch(strict=True), pytest.raises((IndexError, RuntimeError)):
        compiled(base, torch.tensor([[0], [4], [1]]))


def test_nll_loss_backward_runs_without_scatter_externs():
    """cross_entropy's gradient: the scatter of -1 and the log_softmax backward, as kernels."""
    logits = torch.randn(8, 12, requires_grad=True)
    target = torch.randint(0, 12, (8,))
    compiled = kiln.compile(lambda x, t: F.cross_entropy(x, t))
    with kiln.config.patch(strict=True):
        loss = compiled(logits, target)
        (grad,) = torch.autograd.grad(loss, logits)
    (want,) = torch.autograd.grad(F.cross_entropy(logits, target), logits)
    torch.testing.assert_close(grad, want)


def test_rotate_half_runs_as_one_kernel():
    """Llama's rotary embedding: cat of a negated half and a half, read under masks; the negation is
    inlined into the cat (its load masked), so q * cos + rotate_half(q) * sin is one kernel."""
    def fn(q, cos, sin):
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return (q * cos + rotated * sin,)

    q = torch.randn(2, 4, 16, 64, dtype=torch.bfloat16)
    cos, sin = torch.randn(16, 64), torch.randn(16, 64)
    graphs = []
    with kiln.config.patch(strict=True):
        aot_compile(torch.fx.symbolic_trace(fn), [q, cos, sin],
                    lambda gm, inputs: graphs.append(compile_aten_graph(gm, inputs)) or graphs[-1])
    assert [graph.kernel_count for graph in graphs] == [1]
    _check(fn, q, cos, sin, lowered=False)
