"""kiln/_triton.py: Triton's interpreter (how CPU tensors run kiln's kernels) computes what a GPU would.

The interpreter truncated float32 to bfloat16 and reinterpreted the bits of any other
type cast to or from bfloat16 (arange/eye/logspace in bfloat16 came out as denormals);
its libdevice stand-ins raised where the GPU returns inf (lgamma at 0 and -1).
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

import kiln._triton  # noqa: F401  (patches the interpreter)
import kiln.testing
from kiln.backend import compile_graph

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks Triton's CPU interpreter")


@triton.jit
def _cast_to_bfloat16(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(target + offsets, tl.load(source + offsets, offsets < n).to(tl.bfloat16), offsets < n)


@triton.jit
def _cast_from_bfloat16(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(target + offsets, tl.load(source + offsets, offsets < n).to(target.dtype.element_ty), offsets < n)


@triton.jit
def _lgamma(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(target + offsets, libdevice.lgamma(tl.load(source + offsets, offsets < n)), offsets < n)


FLOATS = [1.00390625, 1.01171875, 3.3e38, -3.4e38, float("nan"), float("-inf"), -7.6, 300.7, 1e-40, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool])
def test_cast_to_bfloat16_rounds_like_torch(dtype):
    if dtype.is_floating_point:
        source = torch.tensor(FLOATS, dtype=dtype)
    else:
        source = torch.tensor([1, 257, -259, 65537, 0, 3, 1, 1, 9999, -1]).to(dtype)
    target = torch.zeros(len(source), dtype=torch.bfloat16)
    _cast_to_bfloat16[(1,)](source, target, len(source), BLOCK=16)
    expected = source.to(torch.bfloat16)
    assert torch.equal(target.isnan(), expected.isnan())
    assert torch.equal(target[~expected.isnan()], expected[~expected.isnan()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_cast_from_bfloat16_like_torch(dtype):
    source = torch.tensor([-3.5, 2.75, 1000.0, -1.0, 0.0, 65280.0], dtype=torch.bfloat16)
    target = torch.zeros(len(source), dtype=dtype)
    _cast_from_bfloat16[(1,)](source, target, len(source), BLOCK=8)
    assert torch.equal(target, source.to(dtype))


def test_lgamma_at_poles_is_inf():
    source = torch.tensor([0.0, -1.0, -2.0, 0.5, 3.0, float("inf"), float("nan")])
    target = torch.empty_like(source)
    _lgamma[(1,)](source, target, len(source), BLOCK=8)
    assert torch.equal(target.isnan(), source.lgamma().isnan())
    finite = ~source.isnan()
    torch.testing.assert_close(target[finite], source.lgamma()[finite])


def _compiled_matches(fn, *inputs):
    gm = torch.fx.symbolic_trace(fn)
    with kiln.config.patch(strict=True):
        compiled = compile_graph(gm, list(inputs))
        result = compiled(*inputs)
    assert compiled.kernel_count >= 1
    verdict = kiln.testing.compare(result, fn(*inputs))
    assert verdict, verdict.message


def test_bfloat16_arange_and_eye_through_kernels():
    def fn(x):
        return (torch.arange(0, x.shape[0], dtype=torch.bfloat16, device=x.device) + 0 * x,
                torch.eye(x.shape[0], dtype=torch.bfloat16, device=x.device) + 0 * x)

    _compiled_matches(fn, torch.zeros(300, dtype=torch.bfloat16))


def test_lgamma_kernel_at_poles():
    _compiled_matches(lambda x: (torch.lgamma(x),), torch.tensor([0.0, -1.0, -2.5, 1.0, 4.5]))


def test_triton_cpu_backend_works_without_triton_interpret_set():
    # A user choosing KILN_CPU_BACKEND=triton does not set TRITON_INTERPRET=1 before Triton's import:
    # then Triton's own @jit helpers (tl.zeros, combine functions) are compiled JITFunctions, which the
    # interpreter refuses to call ("Cannot call @triton.jit'd outside of the scope of a kernel").
    import os
    import subprocess
    import sys

    program = (
        "import torch, kiln\n"
        "import torch.nn.functional as F\n"
        "def f(x, w, b):\n"
        "    return x.sum(), F.layer_norm(x, (3,), w, b), torch.var_mean(x, 1), x.argmax(1), (x == 0).float()\n"
        "torch.manual_seed(0)\n"
        "x, w, b = torch.randn(2, 3), torch.randn(3), torch.randn(3)\n"
        "reference = f(x.double(), w.double(), b.double())  # x.sum()'s order: eager's alone failed 4 of 300 seeds\n"
        "with kiln.config.patch(cpu_backend='triton', strict=True):\n"
        "    assert kiln.testing.compare(kiln.compile(f)(x, w, b), f(x, w, b), reference)\n")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_symbolic_strides_unravel_with_the_right_precedence():
    # A 3-d kernel's row index is `xindex // (s1*s2)`; printed as `xindex // s1*s2` it was
    # `(xindex // s1) * s2`: wrong rows, and stores past the end of the output.
    def fn(x, y):
        return (x.permute(2, 0, 1) + y.unsqueeze(0),)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    with kiln.config.patch(strict=True, cpu_backend="triton"):
        for shape in ((3, 4, 5), (4, 5, 6)):
            x, y = torch.randn(*shape), torch.randn(shape[0], shape[1])
            verdict = kiln.testing.compare(compiled(x, y), fn(x, y))
            assert verdict, verdict.message
