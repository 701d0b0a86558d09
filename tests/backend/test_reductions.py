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
