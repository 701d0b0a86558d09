"""fp32 CPU products through oneDNN's linear (kiln/lowering/matmul.py, config.cpu_gemm).

The op is used only on layouts it was measured to be exact for; every other product keeps
aten.mm/addmm. Each case checks which path the graph took and the values against eager
and float64.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln import _torch
from tests.backend.test_pipeline import assert_matches, compiled_graphs

pytestmark = pytest.mark.skipif(_torch.onednn_linear() is None, reason="this torch has no oneDNN")


def uses_onednn(graph) -> bool:
    return any(op is _torch.onednn_linear() for op in graph.module_source.externs.values())


def test_linear_with_bias_runs_on_onednn():
    x, w, b = torch.randn(64, 48), torch.randn(40, 48), torch.randn(40)
    (graph,) = assert_matches(lambda x, w, b: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)), x, w, b)
    assert uses_onednn(graph)


def test_product_with_a_row_major_weight_runs_on_onednn():
    # GPT-2's Conv1D: x @ W with W [in, out], the weight read the other way round.
    x, w, b = torch.randn(3, 20, 48), torch.randn(48, 40), torch.randn(40)
    (graph,) = assert_matches(lambda x, w, b: torch.addmm(b, x.view(-1, 48), w).view(3, 20, 40), x, w, b)
    assert uses_onednn(graph)


def test_without_bias_and_with_dynamic_rows():
    w = torch.randn(40, 48)
    for rows in (5, 64):
        (graph,) = assert_matches(lambda x, w: x @ w.t() + 1, torch.randn(rows, 48), w)
        assert uses_onednn(graph)


@pytest.mark.parametrize("case", ["column_major_x", "strided_bias", "empty_inner", "inner_one", "scaled"])
def test_layouts_oneDNN_gets_wrong_keep_aten(case):
    """Measured with torch 2.13: oneDNN rejects a column-major x and K = 0, and returns wrong
    values for a strided bias. These, and addmm with beta or alpha, stay on aten."""
    w, b = torch.randn(40, 48), torch.randn(80)
    if case == "column_major_x":
        fn, args = (lambda x, w: x.t() @ w.t()), (torch.randn(48, 64), w)
    elif case == "strided_bias":
        fn, args = (lambda x, w, b: torch.nn.functional.linear(x, w, b[::2])), (torch.randn(64, 48), w, b)
    elif case == "empty_inner":
        fn, args = (lambda x, w: x @ w.t()), (torch.randn(64, 0), torch.randn(40, 0))
    elif case == "inner_one":
        fn, args = (lambda x, w: x @ w.t()), (torch.randn(64, 1), torch.randn(40, 1))
    else:
        fn, args = (lambda x, w, b: torch.addmm(b[:40], x, w.t(), beta=0.5)), (torch.randn(64, 48), w, b)
    (graph,) = assert_matches(fn, *args)
    assert not uses_onednn(graph)


def test_aten_gemm_when_configured():
    x, w = torch.randn(64, 48), torch.randn(40, 48)
    with kiln.config.patch(cpu_gemm="aten"):
        (graph,) = assert_matches(lambda x, w: x @ w.t(), x, w)
    assert not uses_onednn(graph)


def test_low_precision_products_keep_aten():
    x, w = torch.randn(64, 48, dtype=torch.bfloat16), torch.randn(40, 48, dtype=torch.bfloat16)
    (graph,) = assert_matches(lambda x, w: x @ w.t(), x, w)
    assert not uses_onednn(graph)


def test_onednn_error_is_an_fp32_products_error():
    """oneDNN sums in a different order than MKL: its error against float64 is a few ulp of the
    result's scale, like MKL's (measured: relative RMS 4.1e-7 against 2.4e-7 at K = 512)."""
    torch.manual_seed(0)
    x, w = torch.randn(256, 512), torch.randn(384, 512)
    reference = x.double() @ w.double().t()
    result = _torch.onednn_linear()(x, w, None, "none", [], "").double()
    relative_rms = ((result - reference).pow(2).mean() / reference.pow(2).mean()).sqrt().item()
    assert relative_rms < 8 * torch.finfo(torch.float32).eps


def externs_and_kernels(graph) -> tuple[list, int]:
    return sorted(str(op) for op in graph.module_source.externs.values()), graph.kernel_count


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_an_activation_of_a_linear_is_its_post_op(activation):
    fn = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
          "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh")}[activation]
    x, w, b = torch.randn(2, 30, 48), torch.randn(40, 48), torch.randn(40)
    (graph,) = assert_matches(lambda x, w, b: fn(torch.nn.functional.linear(x, w, b)), x, w, b)
    assert externs_and_kernels(graph) == (["mkldnn._linear_pointwise.default"], 0)
    attr = {"gelu": "'gelu'", "gelu_tanh": "'tanh'", "silu": "'swish'"}[activation]
    assert attr in graph.module_source.wrapper


@pytest.mark.parametrize("activation", ["relu", "relu_", "gelu", "gelu_tanh", "silu", "mul"])
def test_nan_and_inf_products_keep_eagers_nan_through_the_epilogue(activation):
    # oneDNN's relu post-op made a NaN product 0 (fuzz seed 3013 #9071: relu(x @ w) @ its transpose had
    # no NaN where eager has 4; #9842: isfinite of an in-place relu_ of x @ x.mT flipped 53 bools).
    fn = {"relu": torch.relu, "relu_": torch.relu_, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
          "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
          "mul": lambda y: y * torch.full_like(y, 2.0)}[activation]
    x, w = torch.randn(6, 8), torch.randn(8, 5)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), -float("inf")
    result, _ = compiled_graphs(lambda x, w: fn(x @ w), x, w)
    want = fn(x @ w)
    assert torch.equal(result.isnan(), want.isnan()) and torch.equal(result.isinf(), want.isinf())


def test_swiglu_is_two_products_and_no_kernel():
    # Llama's MLP: silu(x @ gate.t()) * (x @ up.t()); the gate product applies silu, the up
    # product multiplies by it as it stores.
    x, gate, up = torch.randn(2, 30, 48), torch.randn(40, 48), torch.randn(40, 48)
    fn = lambda x, g, u: torch.nn.functional.silu(x @ g.t()) * (x @ u.t())  # noqa: E731
    (graph,) = assert_matches(fn, x, gate, up)
    assert externs_and_kernels(graph) == (["mkldnn._linear_pointwise.binary", "mkldnn._linear_pointwise.default"], 0)


@pytest.mark.parametrize("case", ["two_users", "broadcast_other", "output_too", "integer_scale"])
def test_post_ops_only_for_a_single_elementwise_consumer(case):
    x, w, v = torch.randn(30, 48), torch.randn(40, 48), torch.randn(40)
    if case == "two_users":
        fn = lambda x, w, v: torch.relu(y := x @ w.t()) + y.sum()  # noqa: E731
    elif case == "broadcast_other":
        fn = lambda x, w, v: (x @ w.t()) * v  # noqa: E731
    elif case == "output_too":
        fn = lambda x, w, v: (torch.relu(y := x @ w.t()), y)  # noqa: E731
    else:
        fn = lambda x, w, v: (x @ w.t()) * 3  # noqa: E731
    (graph,) = assert_matches(fn, x, w, v)
    assert graph.kernel_count >= 1  # the consumer is a kernel of its own
    assert "'relu'" not in graph.module_source.wrapper and "binary" not in str(externs_and_kernels(graph)[0])


def test_post_op_values_match_float64_like_eager():
    """oneDNN's gelu and swish post-ops against float64, beside eager's own error."""
    torch.manual_seed(0)
    x, w, b = torch.randn(256, 128), torch.randn(320, 128) * 0.2, torch.randn(320)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    for attr, algorithm, fn in (("gelu", "none", torch.nn.functional.gelu), ("swish", "", torch.nn.functional.silu),
                                ("gelu", "tanh", lambda y: torch.nn.functional.gelu(y, approximate="tanh"))):
        fused = _torch.onednn_linear()(x, w, b, attr, [], algorithm).double()
        eager = fn(torch.nn.functional.linear(x, w, b)).double()
        error, eager_error = (fused - fn(reference)).abs().max().item(), (eager - fn(reference)).abs().max().item()
        assert error <= 4 * eager_error + 1e-6, (attr, algorithm, error, eager_error)


def test_post_ops_with_dynamic_rows():
    def fn(x, gate, up, w, b):
        return torch.nn.functional.silu(x @ gate.t()) * (x @ up.t()), torch.nn.functional.gelu(
            torch.nn.functional.linear(x, w, b))

    weights = torch.randn(40, 48), torch.randn(40, 48), torch.randn(24, 48), torch.randn(24)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    with kiln.config.patch(strict=True):
        for rows in (7, 33, 64):
            x = torch.randn(rows, 48)
            args64 = [tensor.double() for tensor in (x, *weights)]
            verdict = kiln.testing.compare(compiled(x, *weights), fn(x, *weights), fn(*args64))
            assert verdict, verdict.message


def test_a_strided_other_operand_stays_a_kernel():
    x, w = torch.randn(40, 48), torch.randn(40, 48)
    fn = lambda x, w, o: (x @ w.t()) * o.t()  # noqa: E731  (o.t(): a transposed [40, 40])
    (graph,) = assert_matches(fn, x, w, torch.randn(40, 40))
    assert "binary" not in str(externs_and_kernels(graph)[0]) and graph.kernel_count == 1
