"""A Python scalar (or 0-dim tensor) operand of an fp16/bf16 op is rounded to the tensor's dtype where
eager rounds it (kiln/lowering/pointwise.py, `_rounded_operands`): remainder(x, 0.1) on bf16 divides by
bf16(0.1) = 0.10009765625 in eager, so its zeros (and reciprocal's infinities) sit at multiples of that
(fuzz: "infinities differ from eager's" on cpp; error 0.1 on the H200). On CPU every operand is rounded
except mul/div's second scalar; bit-exact agreement with eager is checked on both CPU backends."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.backend import compile_graph

BACKENDS = ["cpp", "triton"]
PROGRAMS = {
    "remainder": lambda x: (torch.remainder(x, 0.1), torch.reciprocal(torch.remainder(x, 0.1))),
    "remainder_scalar_first": lambda x: (torch.remainder(0.1, x),),
    "remainder_0dim_float32": lambda x: (torch.remainder(x, torch.full((), 0.1)),),
    "pow": lambda x: (torch.pow(x.abs(), 0.3), torch.pow(0.3, x), torch.pow(x, 257)),
    "add_sub": lambda x: (x + 0.1, x - 0.1, 0.1 - x, torch.add(x, x, alpha=0.1)),
    "mul_div": lambda x: (x * 0.1, x / 0.1),
    "compare": lambda x: (x == 0.1, x != 0.3, x < 0.1, x >= -0.3),
}


def _input(dtype):
    x = (torch.randn(512, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    x[:6] = torch.tensor([0.1, 0.3, -0.1, 0.2, -0.3, 0.0])  # eager's scalar, rounded: on the edges
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_scalar_operand_has_eagers_precision(name, dtype, backend):
    program, x = PROGRAMS[name], _input(dtype)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(program), [x])
        got = compiled(x)
    assert compiled.extern_count == 0 and compiled.kernel_count > 0
    for value, expected in zip(got, program(x)):
        assert value.dtype == expected.dtype
        assert torch.equal(value.isnan(), expected.isnan())
        finite = ~expected.isnan()
        assert torch.equal(value[finite], expected[finite]), (value[finite] != expected[finite]).nonzero()[:5]
