"""logaddexp: one op-table row (kiln/ir/ops.py) that names aten.logaddexp, as docs/design/ir.md's worked example does.
kiln computes max(a, b) + log1p(exp(-|a - b|)) as eager's CPU kernel does, with a itself where a == b
is an infinity (inf - inf would be NaN), so infinities and NaN come out as eager's."""
from __future__ import annotations

import math

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph

SPECIALS = [math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, -3.5, 30.0, -100.0, 1e-30]


def _inputs(dtype: torch.dtype) -> tuple:
    """Every pair of special values, then random ones (wide, so that exp alone would overflow)."""
    generator = torch.Generator().manual_seed(0)
    specials = torch.tensor(SPECIALS)
    a = torch.cat([specials.repeat_interleave(len(SPECIALS)), torch.randn(500, generator=generator) * 50])
    b = torch.cat([specials.repeat(len(SPECIALS)), torch.randn(500, generator=generator) * 50])
    return a.to(dtype), b.to(dtype)


def _logaddexp(a, b):
    return (torch.logaddexp(a, b),)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logaddexp_matches_eager_with_infinities_and_nan(backend, dtype):
    a, b = _inputs(dtype)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(_logaddexp), [a, b])
        got = compiled(a, b)
    assert compiled.kernel_count > 0 and compiled.extern_count == 0
    ops = {op.name for kernel in compiled.scheduled.kernels for node in kernel.nodes for op in node.body.ops}
    assert "logaddexp" in ops, ops  # the table's op, not core ATen's decomposition
    eager = _logaddexp(a, b)
    assert kiln.testing.compare(got, eager, _logaddexp(a.double(), b.double()))
    nonfinite = ~torch.isfinite(eager[0])  # infinities and NaN exactly where eager has them
    torch.testing.assert_close(got[0][nonfinite], eager[0][nonfinite], rtol=0, atol=0, equal_nan=True)
