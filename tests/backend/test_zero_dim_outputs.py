"""0-dim results (full reductions, norms, scalar indexing, 0-dim inputs) combined by pointwise ops:
shape, strides, dtype and values equal eager's on both CPU backends, through kiln's frontend and
through torch.compile(backend="kiln").

The bug this guards (issue 11, item 9b): torch 2.11's shape rule for linalg_vector_norm (its Meta
kernel, FakeTensor rule and decomposition: one Python reference) kept a reduced dim of size 1 named
by a negative index, so `torch.minimum(vector_norm(x, dim=-1), x.amax())` with x of shape (1,) came
back from a compiled graph with shape (1,): the extern's result () was copied into a (1,) buffer laid
out as the meta said. kiln/_torch.py fixes that rule where torch has it (torch 2.13 does not), and
the wrapper refuses an extern result of another shape than its meta instead of broadcasting it.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.debug.explain import ExplainReport, _recording

INF = float("inf")

# Every kind of 0-dim producer of a 1-d x: each reduction kind, vector_norm with each ord and each
# spelling of "the only dim", scalar indexing.
ZERO_DIM_PRODUCERS = {
    "sum": lambda x: x.sum(), "prod": lambda x: x.prod(), "amax": lambda x: x.amax(), "amin0": lambda x: x.amin(0),
    "mean": lambda x: x.mean(), "var": lambda x: x.var(correction=0), "std-1": lambda x: x.std(-1, correction=0),
    "max": lambda x: x.max(), "logsumexp-1": lambda x: torch.logsumexp(x, -1),
    "argmax_as_float": lambda x: x.argmax().to(x.dtype), "any": lambda x: (x > 0).any().to(x.dtype),
    "norm2_dim0": lambda x: torch.linalg.vector_norm(x, dim=0),
    "norm2_dim-1": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "norm2_dims(-1,)": lambda x: torch.linalg.vector_norm(x, dim=(-1,)),
    "norm2_all": lambda x: torch.linalg.vector_norm(x),
    "norm1_dim-1": lambda x: torch.linalg.vector_norm(x, 1, dim=-1),
    "norminf_dim-1": lambda x: torch.linalg.vector_norm(x, INF, dim=-1),
    "norm-inf": lambda x: torch.linalg.vector_norm(x, -INF),
    "norm3_dim-1": lambda x: torch.linalg.vector_norm(x, 3, dim=-1),
    "norm0_dim-1": lambda x: torch.linalg.vector_norm(x, 0, dim=-1),
    "norm_keepdim_squeezed": lambda x: torch.linalg.vector_norm(x, dim=-1, keepdim=True).squeeze(-1),
    "tensor_norm-1": lambda x: x.norm(dim=-1),
    "index0": lambda x: x[0], "index-1": lambda x: x[-1],
}


def _program(x, scalar):
    """Each 0-dim producer alone and combined with another 0-dim value by minimum, maximum,
    add, mul and where (the pointwise op fuses with the reduction or reads the extern's result)."""
    values = {name: produce(x) for name, produce in ZERO_DIM_PRODUCERS.items()}
    other = x.amax()
    results = []
    for value in values.values():
        results += [value, torch.minimum(value, other), torch.maximum(scalar, value), value + scalar,
                    value * other, torch.where(value > scalar, value, other)]
    return tuple(results)


def _check_like_eager(got, want, reference):
    assert len(got) == len(want)
    names = [f"{name} #{k}" for name in ZERO_DIM_PRODUCERS for k in range(6)]
    for name, got_value, want_value in zip(names, got, want):
        assert (got_value.shape, got_value.stride(), got_value.dtype) == \
            (want_value.shape, want_value.stride(), want_value.dtype), name
    verdict = kiln.testing.compare(got, want, reference)
    assert verdict, verdict.message


def _inputs(size, dtype):
    return torch.randn(size, dtype=dtype), torch.randn((), dtype=dtype)


def _compiled_graphs(report):
    assert report.graphs, "no graph was captured"
    for graph in report.graphs:
        assert graph.fallback is None and graph.kernels, f"graph {graph.name} was not compiled: {graph.fallback}"


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("size, dtype", [(1, torch.float32), (5, torch.float32), (1, torch.bfloat16),
                                         (2, torch.float16)], ids=str)
def test_zero_dim_results_through_kiln_frontend(backend, size, dtype):
    x, scalar = _inputs(size, dtype)
    report = ExplainReport()
    with kiln.config.patch(strict=True, cpu_backend=backend), _recording(report):
        got = kiln.compile(_program)(x, scalar)
    _compiled_graphs(report)
    _check_like_eager(got, _program(x, scalar), _program(*kiln.testing.to_float64([x, scalar])))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_zero_dim_results_through_torch_compile(backend):
    x, scalar = _inputs(1, torch.float32)
    torch._dynamo.reset()
    report = ExplainReport()
    with kiln.config.patch(strict=True, cpu_backend=backend), _recording(report):
        got = torch.compile(_program, backend="kiln", fullgraph=True)(x, scalar)
    _compiled_graphs(report)
    _check_like_eager(got, _program(x, scalar), _program(*kiln.testing.to_float64([x, scalar])))


@pytest.mark.parametrize("shape, dim, keepdim", [((1,), -1, False), ((1,), [-1], False), ((3, 1), -1, False),
                                                 ((1, 1), (-1, 0), False), ((1, 4, 1), (-1, -3), False),
                                                 ((1,), -1, True), ((), -1, False), ((), None, False),
                                                 ((2, 1), [], False)], ids=str)
@pytest.mark.parametrize("ord", [2, 1, INF, 0])
def test_vector_norm_shape_rule_is_eagers(shape, dim, keepdim, ord):
    # The rule every trace uses (fake tensors, meta tensors, the decomposition) gives eager's shape.
    x = torch.randn(shape)
    want = torch.linalg.vector_norm(x, ord, dim, keepdim)
    meta = torch.linalg.vector_norm(x.to("meta"), ord, dim, keepdim)
    with torch._subclasses.fake_tensor.FakeTensorMode() as fake_mode:
        fake = torch.linalg.vector_norm(fake_mode.from_tensor(x), ord, dim, keepdim)
    decomposed = torch._decomp.decomposition_table[torch.ops.aten.linalg_vector_norm.default](
        x, ord, dim, keepdim)
    assert meta.shape == fake.shape == decomposed.shape == want.shape
    assert torch.equal(decomposed, want) or torch.allclose(decomposed, want)


def test_extern_result_of_another_shape_than_its_meta_raises():
    # An extern whose result disagrees with its meta in shape was broadcast into the meta's layout.
    from kiln.runtime.support import restride

    with pytest.raises(RuntimeError, match="shape"):
        restride(torch.tensor(1.0), (1,), (1,), torch.float32)
    assert restride(torch.ones(2, 3).t(), (3, 2), (2, 1)).stride() == (2, 1)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_norms_over_negative_size1_dims_keep_eagers_shape(backend):
    # Not only 0-dim results: under torch 2.11 a (3, 1) tensor's norm over dim=-1 traced as (3, 1).
    def fn(x, y):
        return (torch.linalg.vector_norm(x, dim=-1) * 2, torch.norm(x, p=1, dim=-1) + y,
                torch.linalg.norm(x.unsqueeze(0), dim=(-1, -3)), x.norm(dim=-1).amax())

    x, y = torch.randn(3, 1), torch.randn(3)
    report = ExplainReport()
    with kiln.config.patch(strict=True, cpu_backend=backend), _recording(report):
        got = kiln.compile(fn)(x, y)
    _compiled_graphs(report)
    want = fn(x, y)
    assert [(g.shape, g.stride(), g.dtype) for g in got] == [(w.shape, w.stride(), w.dtype) for w in want]
    verdict = kiln.testing.compare(got, want, fn(*kiln.testing.to_float64([x, y])))
    assert verdict, verdict.message
