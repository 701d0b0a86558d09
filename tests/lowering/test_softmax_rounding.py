"""fp16/bf16 softmax on the CPU gives eager's bits: over a dim that is not innermost, eager's kernel
rounds exp(x - max) to the dtype before dividing by the float sum where the inner size is under a
vector (fuzz seed 3007 #1749). Larger inner sizes are left out: which of their positions eager rounds
twice depends on its thread count."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.backend import compile_graph


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,dim", [((5, 5, 13), 1), ((5, 5, 13), 2), ((7, 1), 0), ((6, 9), -1), ((4, 3, 1), 1),
                                       ((9, 2, 7), 0), ((40,), 0)])
def test_low_precision_softmax_is_eagers_bits(backend, dtype, shape, dim):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 2).to(dtype)

    def f(x):
        return (x.softmax(dim),)

    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(f), [x])
        (got,) = compiled(x)
    assert compiled.kernel_count > 0 and compiled.extern_count == 0
    torch.testing.assert_close(got, f(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,dim", [((0, 0, 1), 1), ((0, 0, 1), 0), ((3, 0, 2), 0)])
def test_empty_low_precision_softmax_compiles(dtype, shape, dim):
    # The rounding-twice path took amax over a 0-size dim, which AOTAutograd cannot trace: the
    # graph ran eagerly (fuzz seed 3012 #4072; KILN_STRICT raised).
    x = torch.randn(shape).to(dtype)

    def f(x):
        return (x.softmax(dim), x.log_softmax(dim) + 1)

    with kiln.config.patch(strict=True, cpu_backend="cpp"):
        got = compile_graph(torch.fx.symbolic_trace(f), [x])(x)
    for out, want in zip(got, f(x)):
        assert out.shape == want.shape and out.dtype == want.dtype
