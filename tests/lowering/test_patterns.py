"""The pattern pass over the ATen graph (kiln/lowering/patterns.py): which products and consumers
it rewrites into one fused call, that the rewritten graph computes what the original does, and
that the compiled result is eager's with the same oneDNN calls and kernel counts as before.
"""
from __future__ import annotations

import glob

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln import _torch
from kiln.aot import aot_compile
from kiln.lowering import patterns
from tests.backend.test_pipeline import assert_matches

pytestmark = pytest.mark.skipif(_torch.onednn_linear() is None, reason="this torch has no oneDNN")

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu}


def aten_graphs(fn, *args) -> list:
    """The ATen graphs kiln/aot makes of `fn` (traced, not compiled by kiln)."""
    graphs = []

    def backend(gm, example_inputs):
        def record(aten_gm, aten_inputs):
            graphs.append(aten_gm)
            return _torch.make_boxed_func(aten_gm)

        return aot_compile(gm, example_inputs, record)

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return graphs


def fused_calls(fn, *args) -> list:
    """(fused op, product op, consumer op) of each call the pass makes in `fn`'s one ATen graph."""
    (gm,) = aten_graphs(fn, *args)
    patterned = patterns.apply_patterns(gm)
    calls = [(node.target.__name__, str(node.args[0]), str(node.args[5])) for node in patterned.graph.nodes
             if node.op == "call_function" and node.target in patterns.FUSED_OPS]
    assert (patterned is gm) == (not calls)  # the graph is copied only when something matched
    return calls


def linear_inputs(dtype=torch.float32, device="cpu"):
    return (torch.randn(2, 30, 48, dtype=dtype, device=device), torch.randn(40, 48, dtype=dtype, device=device),
            torch.randn(40, dtype=dtype, device=device))


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_an_activation_of_a_linear_matches(activation):
    fn = ACTIVATIONS[activation]
    assert fused_calls(lambda x, w, b: fn(F.linear(x, w, b)), *linear_inputs()) == [
        ("linear_unary", "aten.addmm.default", {"silu": "aten.silu.default"}.get(activation, "aten.gelu.default"))]
    assert fused_calls(lambda x, w: fn(x @ w.t()), *linear_inputs()[:2]) == [
        ("linear_unary", "aten.mm.default", {"silu": "aten.silu.default"}.get(activation, "aten.gelu.default"))]


def test_swiglu_matches_a_unary_and_a_binary_pattern():
    x, gate, up = torch.randn(2, 30, 48), torch.randn(40, 48), torch.randn(40, 48)
    assert fused_calls(lambda x, g, u: F.silu(x @ g.t()) * (x @ u.t()), x, gate, up) == [
        ("linear_unary", "aten.mm.default", "aten.silu.default"),
        ("linear_binary", "aten.mm.default", "aten.mul.Tensor")]


NO_MATCH = {
    "two_users": lambda x, w, v: F.gelu(y := x @ w.t()) + y.sum(),
    "output_too": lambda x, w, v: (F.gelu(y := x @ w.t()), y),
    "relu": lambda x, w, v: torch.relu(x @ w.t()),  # oneDNN's relu makes NaN 0
    "broadcast_other": lambda x, w, v: (x @ w.t()) * v,
    "integer_scale": lambda x, w, v: (x @ w.t()) * 3,
    "scaled_addmm": lambda x, w, v: F.gelu(torch.addmm(v, x, w.t(), beta=0.5)),
    "inner_one": lambda x, w, v: F.gelu(x[:, :1] @ w[:, :1].t()),
}


@pytest.mark.parametrize("case", sorted(NO_MATCH))
def test_no_match_where_a_condition_fails(case):
    x, w, v = torch.randn(30, 48), torch.randn(40, 48), torch.randn(40)
    assert fused_calls(NO_MATCH[case], x, w, v) == []


@pytest.mark.parametrize("dtype, device", [(torch.bfloat16, "cpu"), (torch.float64, "cpu"), (torch.float32, "meta")])
def test_no_match_for_other_dtypes_and_devices(dtype, device):
    assert fused_calls(lambda x, w, b: F.gelu(F.linear(x, w, b)), *linear_inputs(dtype, device)) == []


@pytest.mark.parametrize("options", [{"cpu_gemm": "aten"}, {"cpu_gemm_post_ops": False}])
def test_no_match_when_products_or_post_ops_are_configured_off(options):
    with kiln.config.patch(**options):
        assert fused_calls(lambda x, w, b: F.gelu(F.linear(x, w, b)), *linear_inputs()) == []


def test_the_rewritten_graph_runs_and_computes_what_the_original_does():
    x, gate, up = torch.randn(2, 30, 48), torch.randn(40, 48), torch.randn(24, 48)
    (gm,) = aten_graphs(lambda x, g, u: (F.silu(x @ g.t()), F.gelu(x @ u.t(), approximate="tanh")), x, gate, up)
    patterned = patterns.apply_patterns(gm)
    assert patterned is not gm and "linear_unary" in patterned.print_readable(print_output=False)
    by_shape = {tuple(tensor.shape): tensor for tensor in (x, gate, up)}  # aot orders the placeholders
    args = [by_shape[tuple(node.meta["val"].shape)] for node in gm.graph.nodes if node.op == "placeholder"]
    for want, got in zip(gm(*args), patterned(*args)):
        assert torch.equal(got, want) and want.abs().sum() > 0


def externs_and_kernels(graph) -> tuple[list, int]:
    return sorted(str(op) for op in graph.module_source.externs.values()), graph.kernel_count


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_a_fused_linear_is_one_onednn_call_and_matches_eager(activation):
    fn = ACTIVATIONS[activation]
    (graph,) = assert_matches(lambda x, w, b: fn(F.linear(x, w, b)), *linear_inputs())
    assert externs_and_kernels(graph) == (["mkldnn._linear_pointwise.default"], 0)


def test_swiglu_is_two_onednn_calls_and_matches_eager():
    x, gate, up = torch.randn(2, 30, 48), torch.randn(40, 48), torch.randn(40, 48)
    (graph,) = assert_matches(lambda x, g, u: F.silu(x @ g.t()) * (x @ u.t()), x, gate, up)
    assert externs_and_kernels(graph) == (["mkldnn._linear_pointwise.binary", "mkldnn._linear_pointwise.default"], 0)


def test_a_layout_onednn_rejects_lowers_the_replaced_nodes_one_by_one():
    # The pass matches (it sees no strides); the rule finds x column-major and lowers mm and gelu
    # as without the pattern: aten's product and gelu's kernel.
    x, w = torch.randn(48, 64), torch.randn(40, 48)
    fn = lambda x, w: F.gelu(x.t() @ w.t())  # noqa: E731
    assert fused_calls(fn, x, w) == [("linear_unary", "aten.mm.default", "aten.gelu.default")]
    (graph,) = assert_matches(fn, x, w)
    assert externs_and_kernels(graph) == (["aten.mm.out"], 1)


def test_a_strided_other_keeps_the_plain_onednn_product_and_a_mul_kernel():
    x, w = torch.randn(40, 48), torch.randn(40, 48)
    fn = lambda x, w, o: o.t() * (x @ w.t())  # noqa: E731  (o.t() first: `other` must come before the product)
    assert fused_calls(fn, x, w, torch.randn(40, 40)) == [("linear_binary", "aten.mm.default", "aten.mul.Tensor")]
    (graph,) = assert_matches(fn, x, w, torch.randn(40, 40))
    assert externs_and_kernels(graph) == (["mkldnn._linear_pointwise.default"], 1)


def test_the_rewritten_graph_is_dumped_only_when_it_changed(tmp_path):
    with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
        assert_matches(lambda x, w, b: F.gelu(F.linear(x, w, b)), *linear_inputs())
        assert_matches(lambda x, w: torch.relu(x @ w.t()), *linear_inputs()[:2])
    dumped = sorted(glob.glob(str(tmp_path / "*" / "*" / "aten_graph_patterns.py")))
    assert len(dumped) == 1 and "linear_unary" in open(dumped[0]).read()
    assert len(glob.glob(str(tmp_path / "*" / "*" / "aten_graph.py"))) == 2
