"""Symbolic sizes spelled as sums (`-1 + s0`) inside the generated arithmetic.

A reduction over `x[: n - 1]` under dynamic shapes has the extent `-1 + s0`. The C++ lane
loop's end (`extent - extent % 16`) once rendered it unparenthesized, `-1 + s0 - -1 + s0 % 16`,
and read far past the buffer: a silent wrong answer.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing


def sliced_reductions(x):
    return x[: x.shape[0] - 1].sum(0), torch.var_mean(x[:, : x.shape[1] - 1], dim=1), x[1:].amax(0)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_reductions_over_an_extent_that_is_a_sum_of_sizes(backend):
    torch._dynamo.reset()
    compiled = torch.compile(sliced_reductions, backend="kiln", dynamic=True)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        for shape in ((5, 7), (40, 40)):  # tails of the 16-lane loop, and full blocks with a tail
            x = torch.randn(*shape)
            verdict = kiln.testing.compare(compiled(x), sliced_reductions(x), sliced_reductions(x.double()))
            assert verdict, (shape, verdict.message)
