"""clamp with number bounds keeps x where x equals a bound, as eager's CPU kernel does on both its
paths: clamp_max(-0.0, 0.0) is -0.0, so signbit after a clamp is eager's (fuzz seed 3008 #1972).
Eager's CUDA kernel does the same (measured on the H200); benchmarks/gpu_verify.sh kernels checks
kiln's there."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.backend import compile_graph

NAN = float("nan")


def _signbits_and_values(backend, fn, x):
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
        got = compiled(x)
    assert compiled.kernel_count > 0 and compiled.extern_count == 0
    return got


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bounds", [(None, 0.0), (None, -0.0), (0.0, None), (-0.0, None), (-0.0, 0.0),
                                    (0.0, 0.0), (NAN, None), (None, NAN), (-1.0, 1.0)])
def test_clamp_by_numbers_keeps_x_at_ties(backend, dtype, bounds):
    low, high = bounds
    x = torch.tensor([-0.0, 0.0, -1.0, 1.0, NAN, -2.0, 2.0, 0.5] * 5, dtype=dtype)

    def f(x):
        clamped = torch.clamp(x, low, high)
        return (clamped, torch.signbit(clamped))

    got = _signbits_and_values(backend, f, x)
    want = f(x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got[1], want[1]), (got[1], want[1])
