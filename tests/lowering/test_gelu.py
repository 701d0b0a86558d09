"""gelu (the erf form) gives eager's value where eager's is exact: 0 where 1 + erf(x / sqrt 2)
cancels to 0 (kiln's x * Phi(x) is a tiny nonzero value there, so fmod(y, gelu(x)) lost eager's
NaN: fuzz program seed 101 #1864). gelu(+inf) is +inf, float64's value: eager's in float, bfloat16
and half depends on the CPU's vector kernel (NaN on some machines, inf on an AVX2 EPYC).
Runs on the C++ backend and on Triton (under the interpreter without a GPU)."""
from __future__ import annotations

import math

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


def _every_finite(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of a 16-bit float dtype."""
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    return values[values.isfinite()]


def _eager_cuda_formula(x: torch.Tensor) -> torch.Tensor:
    """Eager's CUDA gelu of 16-bit x: (x * 0.5) * (1 + erf(x * M_SQRT1_2)) in float32 with erff (here float64's
    erf, rounded: correctly rounded, where CUDA's erff is within 2 ulp), rounded to x's dtype."""
    x32 = x.float()
    erf = torch.erf((x32 * math.sqrt(0.5)).double()).float()
    return ((x32 * 0.5) * (1.0 + erf)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_gelu_of_16_bit_values_is_eagers_at_every_value(monkeypatch, dtype):
    """On CUDA a 16-bit gelu takes erf_for_16bit (kiln/ir/ops.py); run here through Triton's
    interpreter, it gives eager's formula's value at every finite bfloat16 whose gelu is a normal number,
    and at all but a few float16 values, each one ulp away and no farther from float64 than eager's."""
    monkeypatch.setattr(kiln.lowering.pointwise, "_cuda_formula", lambda meta: True)
    x = _every_finite(dtype)
    (got,) = _compile(_gelu, [x], "triton")
    want, exact = _eager_cuda_formula(x), F.gelu(x.double())
    normal = exact.abs() >= torch.finfo(dtype).tiny
    differ = (got != want) & normal & ~want.isnan()
    assert torch.equal(got.isnan(), want.isnan())
    assert int(differ.sum()) <= (0 if dtype == torch.bfloat16 else 8), x[differ]
    farther = (got.double() - exact).abs() > (want.double() - exact).abs()
    ulp = torch.finfo(dtype).eps * want.double().abs().clamp_min(torch.finfo(dtype).tiny)
    assert ((got.double() - want.double()).abs()[differ] <= ulp[differ]).all()
    assert int((farther & normal).sum()) <= int(differ.sum())
    assert torch.equal(got[want == 0], want[want == 0])  # eager's zeros (1 + erf cancels below -5.54) are kept
    assert kiln.testing.compare([got], [want], [exact]).ok


def test_cuda_gelu_of_float32_keeps_libdevice_erf(monkeypatch):
    """The fitted erf is for results rounded to 16 bits: a float32 gelu keeps erf."""
    monkeypatch.setattr(kiln.lowering.pointwise, "_cuda_formula", lambda meta: True)
    with kiln.config.patch(strict=True, cpu_backend="triton", graph_cache=False):
        sources = {}
        for dtype in (torch.float32, torch.bfloat16):
            compiled = compile_graph(torch.fx.symbolic_trace(_gelu), [torch.randn(64).to(dtype)])
            sources[dtype] = "\n".join(compiled.module_source.kernels.values())
    assert "libdevice.erf(" in sources[torch.float32] and "_erf_for_16bit(" not in sources[torch.float32]
    assert "libdevice.erf(" not in sources[torch.bfloat16] and "_erf_for_16bit(" in sources[torch.bfloat16]
