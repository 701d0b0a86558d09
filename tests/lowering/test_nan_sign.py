"""The sign of a NaN made by sqrt/log/log2/log10 is eager's (kiln/lowering/pointwise.py,
_CPU_POSITIVE_NAN_OPS): eager's CPU float32/float64 kernels give +NaN for x < 0, kiln's C++ and the
Triton interpreter gave the hardware's default NaN (sign set), so signbit(sqrt(x)) differed
(fuzz seed 25506151); fp16/bf16 NaNs keep the sign set, as in eager."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.backend import compile_graph


def _nan_signs(x):
    return tuple(torch.signbit(op(x)) for op in (torch.sqrt, torch.log, torch.log2, torch.log10))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_nan_of_sqrt_and_log_has_eagers_sign(backend, dtype):
    x = (torch.randn(40, generator=torch.Generator().manual_seed(5)) * 2).to(dtype)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(_nan_signs), [x])
        got = compiled(x)
    assert compiled.extern_count == 0 and compiled.kernel_count > 0
    for value, expected in zip(got, _nan_signs(x)):
        assert torch.equal(value.signbit(), expected.signbit()), (value, expected)
