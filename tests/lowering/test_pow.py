"""pow(tensor, scalar) with the exponents eager computes by arithmetic (2, 3, -1, -2, 0.5, -0.5):
kiln emits the same arithmetic, never a pow() call. libdevice's powf(x, 2) on the GPU is not exactly
x * x, and cos(trunc(x) ** 2) was 3.6e-6 off eager's on the H200 (fuzzer seed 303 #1254); glibc's
pow happens to be exact for these, so the CPU values alone could not show it."""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph
from kiln.lowering.pointwise import POW_BY_ARITHMETIC


def _compile(fn, inputs, backend):
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        result = compiled(*inputs)
    assert compiled.kernel_count > 0 and compiled.extern_count == 0
    return compiled, result


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("exponent", sorted(POW_BY_ARITHMETIC) + [2.5, -3])
def test_pow_by_a_scalar_is_eagers_arithmetic(backend, exponent):
    x = torch.randn(300) * 6
    x[:3] = torch.tensor([0.0, -0.0, float("inf")])

    def f(x):
        return (torch.cos(x.pow(exponent)), x.pow(exponent))

    compiled, got = _compile(f, [x], backend)
    assert kiln.testing.compare(got, f(x), f(x.double()))
    ops = [op.name for kernel in compiled.scheduled.kernels for node in kernel.nodes for op in node.body.ops]
    assert ("pow" in ops) == (exponent not in POW_BY_ARITHMETIC), ops


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("exponent", [2, 3, -2])
def test_low_precision_pow_rounds_as_eager(backend, dtype, exponent):
    """Eager's CPU pow(bf16, 3.0) rounds x * x to bf16 before the last multiply; fp16 stays in float
    (fuzzer seed 3006 #8708: 0.125 off). kiln must give eager's bits, so the comparison is exact."""
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)

    def f(x):
        return (x.pow(exponent),)

    _, (got,) = _compile(f, [x], backend)
    torch.testing.assert_close(got, f(x)[0], rtol=0, atol=0)
