"""gelu (the erf form) gives eager's value where eager's is exact: 0 where 1 + erf(x / sqrt 2)
cancels to 0 (kiln's x * Phi(x) is a tiny nonzero value there, so fmod(y, gelu(x)) lost eager's
NaN: fuzz program seed 101 #1864). gelu(+inf) is +inf, float64's value: eager's in float, bfloat16
and half depends on the CPU's vector kernel (NaN on some machines, inf on an AVX2 EPYC).
Runs on the C++ backend and on Triton (under the interpreter without a GPU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln.backend import compile_graph

BACKENDS = ["cpp", "triton"]
SPECIAL = [float("inf"), -float("inf"), float("nan"), -40.0, -9.0, -6.0, -5.6, -3.0, -0.0, 0.0, 0.5, 2.0, 9.0]


def _compile(fn, inputs, backend, externs=0):
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        result = compiled(*inputs)
    assert compiled.extern_count == externs and compiled.kernel_count > 0  # gelu is kiln's kernel, not ATen's
    return result


def _gelu(x):
    return (F.gelu(x),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_gelu_of_inf_nan_and_deep_negatives_is_eagers(backend, dtype):
    x = torch.tensor(SPECIAL, dtype=dtype)
    (got,) = _compile(_gelu, [x], backend)
    want = F.gelu(x)
    plus_inf = x == float("inf")
    assert torch.equal(got[plus_inf], x[plus_inf]), got  # float64's gelu(+inf), whatever eager's CPU gives
    got, want = got[~plus_inf], want[~plus_inf]
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    # Eager's exact values: kiln's must equal them. (Not the sign of a zero: eager's float kernel gives -0 on
    # some CPUs and +0 on an AVX2 EPYC, where its bfloat16 and half kernels give -0.)
    exact = ~want.isnan() & ((want == 0) | want.isinf())
    assert torch.equal(got[exact], want[exact])
    assert kiln.testing.compare([got], [want], [F.gelu(x[~plus_inf].double())]).ok


def _fmod_by_gelu(y, x):
    return (torch.fmod(y, F.gelu(x)),)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fmod_by_gelu_of_deep_negatives_is_nan_as_in_eager(backend):
    generator = torch.Generator().manual_seed(1918626517)
    x = torch.randn((2, 1, 6, 1), generator=generator) * 3.0
    y = torch.randn((1, 1), generator=torch.Generator().manual_seed(0))
    got = _compile(_fmod_by_gelu, [y, x], backend, externs=1)  # fmod: ATen's
    want = _fmod_by_gelu(y, x)
    assert want[0].isnan().any()  # the case: eager's gelu is exactly 0 below about -5.54
    verdict = kiln.testing.compare(list(got), list(want), list(_fmod_by_gelu(y.double(), x.double())))
    assert verdict.ok, verdict.message
