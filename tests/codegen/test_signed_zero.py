"""-x keeps IEEE signed zeros on every backend: -(+0.0) is -0.0 (Triton's unary minus is 0 - x,
which gave +0.0, so 1 / -(x - x) was +inf where eager's is -inf: fuzz seed 101 #2303, wrong on
the Triton interpreter and on the H200)."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.backend import compile_graph


def _negations(x):
    zero = x - x  # +0.0 wherever x is finite
    return -zero, 1 / -zero, 1 / -(x * 0), -x


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_neg_of_zero_is_negative_zero(backend, dtype):
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, 3.0, float("nan")], dtype=dtype)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(_negations), [x])
        got = compiled(x)
    assert compiled.extern_count == 0 and compiled.kernel_count > 0
    for value, expected in zip(got, _negations(x)):
        assert torch.equal(value.isnan(), expected.isnan())
        finite = ~expected.isnan()
        assert torch.equal(value[finite], expected[finite])
        assert torch.equal(value[finite].signbit(), expected[finite].signbit()), (value, expected)
