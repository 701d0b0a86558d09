"""Triton on the GPU vs Triton's interpreter: constructs whose compiled (NVIDIA) semantics differ
from the interpreter's numpy ones. kiln/_triton.py makes the interpreter compute what the GPU
computes for them, so these CPU tests fail on a rendering that is right only under numpy."""
from __future__ import annotations

import re

import torch
import triton.language as tl

import kiln
import kiln.testing
from kiln._triton import jit_for_device
from kiln.backend import compile_graph


def _bool_arithmetic_kernel(a_ptr, b_ptr, sum_ptr, difference_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offsets) != 0
    b = tl.load(b_ptr + offsets) != 0
    tl.store(sum_ptr + offsets, a + b)
    tl.store(difference_ptr + offsets, a - b)


def test_the_interpreter_wraps_bool_add_and_sub_mod_2_as_the_gpu_does():
    a = torch.tensor([False, False, True, True])
    b = torch.tensor([False, True, False, True])
    total, difference = torch.empty(4, dtype=torch.bool), torch.empty(4, dtype=torch.bool)
    jit_for_device(_bool_arithmetic_kernel, "cpu")[(1,)](a, b, total, difference, BLOCK=4)
    # an i1 add or sub on the GPU is a xor (True + True = False); numpy's bool add is an or
    assert total.tolist() == [False, True, True, False]
    assert difference.tolist() == [False, True, True, False]


def _compile_and_run(fn, inputs):
    with kiln.config.patch(cpu_backend="triton", strict=True):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), inputs)
        result = compiled(*inputs)
    assert compiled.kernel_count >= 1 and compiled.extern_count == 0
    return result


def test_bool_add_and_mul_are_torchs_logical_or_and_and():
    # fuzzer seed101 prog201/458/1931/2795/4427 on CUDA: True + True was False
    def fn(a, b, x):
        return a + b, a * b, ~(a + b), (a + b) * x

    generator = torch.Generator().manual_seed(0)
    a = torch.rand(64, generator=generator) < 0.5
    b = torch.rand(64, generator=generator) < 0.5
    x = torch.randn(64, generator=generator)
    result = _compile_and_run(fn, [a, b, x])
    verdict = kiln.testing.compare(list(result), list(fn(a, b, x)))
    assert verdict, verdict.message


def test_neg_of_zero_is_negative_zero():
    # fuzzer seed101 prog2303: Triton's -x is 0 - x, +0.0 for x = 0.0, so 1 / -x was +inf, not -inf
    def fn(x, h):
        return 1.0 / -x, torch.signbit(-x), -h

    x = torch.randn(32, generator=torch.Generator().manual_seed(1))
    x[::3] = 0.0
    x[1::5] = -0.0
    h = x.to(torch.float16)
    result = _compile_and_run(fn, [x, h])
    verdict = kiln.testing.compare(list(result), list(fn(x, h)))
    assert verdict, verdict.message
    assert torch.equal(torch.signbit(result[2]), torch.signbit(-h))


def _compile_capturing_kernels(fn, inputs, kernel_sources):
    """Compile and run `fn` with the Triton backend; its result and its kernels' sources (conftest's fixture)."""
    return _compile_and_run(fn, inputs), "\n".join(kernel_sources)


def test_float32_division_is_correctly_rounded(kernel_sources):
    # fuzzer seed101 prog2190/4495: float32 `/` compiles to div.full.f32 on the GPU (2 ulp, the
    # interpreter's numpy division is exact, so only the rendering can be checked on CPU)
    def fn(x, y, d, h):
        return x / y, d / (d + 1.0), h / (h + 1.0)

    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(16, generator=generator), torch.randn(16, generator=generator)
    d = torch.randn(16, generator=generator, dtype=torch.float64)
    h = torch.randn(16, generator=generator).half()
    result, source = _compile_capturing_kernels(fn, [x, y, d, h], kernel_sources)
    # float32's; float64's `/` is IEEE, and float16's float32 quotient is only rounded to float16
    assert source.count("tl.div_rn(") == 1, source
    verdict = kiln.testing.compare(list(result), list(fn(x, y, d, h)))
    assert verdict, verdict.message


def test_a_float32_quotient_only_rounded_to_16_bits_is_the_fast_division(kernel_sources):
    # codegen/triton.py, rounded_to_16bit: div.full's 2 ulp of float32 are far below a 16-bit ulp. A quotient
    # that anything else reads (here a float32 output) stays IEEE, and so does every float32 softmax.
    def fn(h, x):
        quotient = x / (x.abs() + 1.0)
        return torch.softmax(h, -1), torch.softmax(x, -1), quotient, quotient.to(torch.bfloat16)

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, generator=generator)
    h = torch.randn(8, 64, generator=generator).to(torch.bfloat16)
    result, source = _compile_capturing_kernels(fn, [h, x], kernel_sources)
    assert source.count("tl.div_rn(") == 2, source  # x's softmax and the float32 quotient
    fast = re.findall(r"(n\d+_\d+) = \(\w+ / \w+\)\n\s+\w+ = \1\.to\(tl\.bfloat16\)", source)
    assert len(fast) == 1, source  # h's softmax
    verdict = kiln.testing.compare(list(result), list(fn(h, x)), list(fn(h.double(), x.double())))
    assert verdict, verdict.message
