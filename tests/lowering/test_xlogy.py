"""xlogy: an op added by one op-table row alone (kiln/ir/ops.py), the worked example of docs/design/ir.md.

The row names `aten.xlogy`'s overloads, so lowering registers its rule and the decomposition table keeps
it whole (core ATen would decompose it into a where of mul and log): it lowers to one kernel, not an
Extern, and computes as eager's kernel does: NaN where y is NaN, 0 where x == 0 (even for an infinite
or negative y), else x * log(y)."""
from __future__ import annotations

import math

import pytest
import torch

import kiln
import kiln.testing
from kiln import _torch
from kiln.aot.decompositions import decomposition_table
from kiln.backend import compile_graph
from kiln.lowering.registry import LOWERINGS

SPECIALS = [math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, -3.5, 0.5, 30.0, 1e-30]


def _inputs(dtype: torch.dtype) -> tuple:
    """Every pair of special values, then random ones (y positive and negative, x sometimes 0)."""
    generator = torch.Generator().manual_seed(0)
    specials = torch.tensor(SPECIALS)
    x = torch.randn(500, generator=generator) * 10
    x[::7] = 0.0
    y = torch.randn(500, generator=generator).abs() * 100
    y[::5] = -y[::5]
    return (torch.cat([specials.repeat_interleave(len(SPECIALS)), x]).to(dtype),
            torch.cat([specials.repeat(len(SPECIALS)), y]).to(dtype))


def _xlogy(x, y):
    return (torch.xlogy(x, y),)


def test_the_row_alone_registers_the_lowering_and_keeps_it_undecomposed():
    aten = _torch.aten
    for overload in (aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other):
        assert overload in LOWERINGS and overload not in decomposition_table(), overload


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_xlogy_is_one_kernel_and_matches_eager(backend, dtype):
    x, y = _inputs(dtype)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(_xlogy), [x, y])
        got = compiled(x, y)
    assert compiled.kernel_count == 1 and compiled.extern_count == 0
    ops = {op.name for kernel in compiled.scheduled.kernels for node in kernel.nodes for op in node.body.ops}
    assert "xlogy" in ops and "log" not in ops, ops  # the table's op, not core ATen's decomposition
    eager = _xlogy(x, y)
    assert kiln.testing.compare(got, eager, _xlogy(x.double(), y.double()))
    nonfinite = ~torch.isfinite(eager[0])  # infinities and NaN exactly where eager has them
    torch.testing.assert_close(got[0][nonfinite], eager[0][nonfinite], rtol=0, atol=0, equal_nan=True)
    zeros = eager[0] == 0
    torch.testing.assert_close(got[0][zeros], eager[0][zeros], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_xlogy_with_a_scalar_and_integer_operands(backend):
    x = torch.arange(-3, 9).reshape(3, 4)
    y = torch.tensor([0.0, 0.5, 2.0, math.nan])

    def program(x, y):
        return torch.xlogy(x, y), torch.xlogy(2.0, y), torch.xlogy(x, 3.0)

    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(program), [x, y])
        got = compiled(x, y)
    assert compiled.extern_count == 0
    assert kiln.testing.compare(got, program(x, y), program(x.double(), y.double()))
