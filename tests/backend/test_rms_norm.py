"""RMSNorm as eager computes it on each device (kiln/aot/decompositions.py, `fused_rms_norm`).

F.rms_norm calls `aten._fused_rms_norm` on CUDA, whose kernel makes a whole row NaN when the row
holds an inf or a NaN; the CPU formula makes only that element NaN. The expected CUDA rows below
were measured on the H200 (torch 2.11, 2026-12-01); the GPU check benchmarks/gpu_semantics_check.py
runs the compiled CUDA path against eager there.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln.aot.decompositions import rms_norm_as_eager

NAN, INF = float("nan"), float("inf")
ROWS = torch.tensor([[1.0, INF, 2.0], [1.0, NAN, 2.0], [3e20, 1.0, 1.0], [1.0, 2.0, 3.0], [-INF, 1.0, 1.0],
                     [-0.0, 0.0, 0.0]])
# eager on the H200: rows 0, 1 and 4 all NaN; row 2 (squares overflow to inf) all 0.
CUDA_NAN_ROWS = [True, True, False, False, True, False]


def test_cuda_rule_makes_rows_with_a_nonfinite_element_nan():
    result, rstd = rms_norm_as_eager(ROWS, (3,), None, None, nonfinite_rows=True)
    assert torch.isnan(result).all(dim=1).tolist() == CUDA_NAN_ROWS
    assert torch.isnan(rstd).flatten().tolist() == CUDA_NAN_ROWS
    finite = ~torch.tensor(CUDA_NAN_ROWS)
    assert torch.equal(result[finite], F.rms_norm(ROWS, (3,))[finite])
    assert torch.signbit(result[5, 0])  # -0.0 stays -0.0 (no `+ 0` on the result)


def test_cpu_rule_is_eagers_cpu_formula():
    weight = torch.randn(3)
    result, _ = rms_norm_as_eager(ROWS, (3,), weight, 1e-6, nonfinite_rows=False)
    torch.testing.assert_close(result, F.rms_norm(ROWS, (3,), weight, 1e-6), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_rms_norm_with_infinities_matches_eager_on_cpu(backend, dtype):
    x = torch.randn(6, 2, 8) * 3
    x[0, 0, 3], x[2, 1, 0], x[4, 0, 7] = INF, NAN, -INF
    x = x.to(dtype)
    weight = torch.randn(8).to(dtype)

    def f(x, weight):
        return F.rms_norm(x, (8,), weight), F.rms_norm(x, (2, 8))

    with kiln.config.patch(cpu_backend=backend, strict=True):
        got = kiln.compile(f)(x, weight)
    verdict = kiln.testing.compare(got, f(x, weight), f(x.double(), weight.double()))
    assert verdict, verdict.message
