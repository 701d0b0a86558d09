"""add/sub/rsub's alpha from an int argument that changed between calls, and so became symbolic: once a
KilnCompileError ("Cannot convert expression to float": the rule made alpha a constant of the kernel), and the
graph ran eagerly outside strict mode. The alpha is now one more input of the kernel, its symbol's value. Each
program runs on both CPU backends under KILN_STRICT, against eager and a float64 reference."""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.frontend.dispatcher import stats

PROGRAMS = {
    "add": lambda x, y, n: torch.add(x, y, alpha=n),
    "sub": lambda x, y, n: x.sub(y, alpha=n) * 2,
    "rsub": lambda x, y, n: torch.rsub(x, y, alpha=n).sin(),
    "add_bf16": lambda x, y, n: torch.add(x.bfloat16(), y.bfloat16(), alpha=n),
    "add_int64": lambda x, y, n: torch.add((x * 10).long(), (y * 10).long(), alpha=n),
    "sub_number": lambda x, y, n: torch.sub(x, 2.5, alpha=n) + y,
}


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    with kiln.config.patch(cpu_backend=request.param, strict=True):
        yield request.param


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_alpha_from_an_int_argument_that_changes(name):
    program = PROGRAMS[name]
    compiled = kiln.compile(program)
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    graphs, eager_frames = stats.graphs, stats.eager_frames
    for n in (1, 3, -7, 300, 2):  # 3 recompiles with n symbolic; the calls after it reuse that graph
        actual, expected = compiled(x, y, n), program(x, y, n)
        reference = program(x.double(), y.double(), n)
        assert actual.dtype == expected.dtype
        verdict = kiln.testing.compare(actual, expected, reference if expected.is_floating_point() else None)
        assert verdict, (n, verdict.message)
    assert stats.graphs - graphs == 2, "one graph for n = 1, one symbolic graph for the others"
    assert stats.eager_frames == eager_frames
