"""Reduction kernels (kiln/codegen/triton.py) against eager, on bodies that stress the 2-D tiles."""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph


def _check(fn, *inputs):
    with kiln.config.patch(strict=True):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        result = compiled(*inputs)
    verdict = kiln.testing.compare(result, fn(*inputs), fn(*kiln.testing.to_float64(inputs)))
    assert verdict, verdict.message
    return compiled


@pytest.mark.parametrize("columns", [5, 3000])  # persistent and looped
def test_reduction_of_a_constant(columns):
    # masked.mean's count: sum(full(1)) over a row. The constant was a [1] block that
    # tl.broadcast_to could not widen to [XBLOCK, RBLOCK] ("rank mismatch").
    def fn(x):
        count = torch.ones(x.shape, dtype=torch.int64).sum(1)
        return (x.sum(1) / count, torch.arange(x.shape[1]).expand(x.shape).sum(1))

    compiled = _check(fn, torch.randn(3, columns))
    assert compiled.extern_count == 0


# Reductions whose columns are empty or of size 1 once unit dims go: (input shape, reduced dims).
DEGENERATE_REDUCTIONS = [((3, 1), (1,)), ((3, 1, 1), (1, 2)), ((1, 1), (0, 1)), ((), ()), ((3, 0), (1,)),
                         ((2, 0, 1), (1, 2))]
REDUCTIONS = {
    "sum": lambda x, dims: x.sum(dims), "prod": lambda x, dims: x.prod(dims[0]) if len(dims) == 1 else x.prod(),
    "amax": lambda x, dims: x.amax(dims), "amin": lambda x, dims: x.amin(dims),
    "argmax": lambda x, dims: x.argmax(dims[0]),  # (over several dims kiln calls ATen's)
    "mean": lambda x, dims: x.mean(dims), "var": lambda x, dims: x.var(dims, correction=0),
    "any": lambda x, dims: (x > 0).any(dims[0]) if len(dims) == 1 else (x > 0).any(),
    "all": lambda x, dims: (x > 0).all(dims[0]) if len(dims) == 1 else (x > 0).all(),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("shape, dims", DEGENERATE_REDUCTIONS, ids=str)
def test_reductions_over_empty_or_unit_columns_beside_a_pointwise_op(backend, shape, dims):
    # x.amax(1) of a [3, 1] tensor after a pointwise op over its rows joined that op's pointwise
    # kernel, where its reduce had no loop: Triton's kernel used RBLOCK and rindex without defining
    # them (a NameError in the user's call), C++ codegen asserted and the graph ran eagerly.
    x = torch.randn(shape)
    rows = torch.randn(REDUCTIONS["sum"](x, dims).shape)
    kinds = []
    for kind, reduce in REDUCTIONS.items():
        try:
            reduce(x, dims)
        except (RuntimeError, IndexError):  # torch refuses it (amax of nothing, argmax over two dims)
            continue
        kinds.append(kind)

    def fn(x, rows):
        return (rows.sin(),) + tuple(REDUCTIONS[kind](x, dims) for kind in kinds) + \
            (REDUCTIONS["sum"](x, dims) * rows,)

    with kiln.config.patch(cpu_backend=backend):
        compiled = _check(fn, x, rows)
    assert compiled.kernel_count >= 1 and compiled.extern_count == 0


# A reduction over a dim its input does not vary along (an expanded input, a broadcast view) is exact:
# sum is one product, mean/max/min/any/all the value itself. Reading every copy, a float32 mean of 13
# equal values was an ulp off, and a z-score of such rows 316 times that (fuzz seed 3015 #1970 on
# CUDA: 4.8e-6 where eager's error was 7.1e-7; float64 gives exactly 0).
@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_reductions_over_broadcast_dims_are_exact(backend):
    def fn(x, y):
        return (x.mean(-1), x.sum(-1), x.amax(-1), x.amin(-1, keepdim=True), (x > 0).any(-1), (x > 0).all(-1),
                (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + 1e-5),
                y.expand(4, 7, 9).sum(1), y.expand(4, 7, 9).to(torch.int64).sum((0, 1)))

    x = (torch.randn(5, 5, 1) * 0.1).expand(5, 5, 13)
    y = torch.randn(4, 1, 9) * 3
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, y])
        got = compiled(x, y)
    exact = fn(x.double(), y.double())
    for position, (value, want) in enumerate(zip(got, exact)):
        assert torch.equal(value, want.to(value.dtype)), f"output {position}: {(value - want).abs().max()}"
    assert compiled.extern_count == 0


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_reductions_over_partly_broadcast_dims_match_eager(backend):
    # only the broadcast dims are skipped: the others are still summed, and argmax/prod keep the loop
    def fn(x):
        return x.sum((0, 2)), x.mean((1, 2)), x.amax((0, 2)), x.prod(-1), x.argmax(-1), x.sum()

    x = torch.randn(6, 5, 1).expand(6, 5, 7)
    with kiln.config.patch(cpu_backend=backend):
        compiled = _check(fn, x)
    assert compiled.extern_count == 0
