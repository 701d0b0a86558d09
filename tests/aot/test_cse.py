"""kiln/aot/cse.py: an inference ATen graph's duplicate nodes merged, and only where that is safe."""
from __future__ import annotations

import glob
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.aot.cse import merge_duplicates

aten = torch.ops.aten
F = torch.nn.functional


def _aten_graph(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _count(gm, target) -> int:
    return sum(node.target is target for node in gm.graph.nodes)


def test_three_casts_of_one_tensor_become_one():
    def fn(x, wq, wk, wv):
        h = x.float() * 2
        return h.to(torch.bfloat16) @ wq, h.to(torch.bfloat16) @ wk, h.to(torch.bfloat16) @ wv

    args = [torch.randn(4, 8, dtype=torch.bfloat16)] + [torch.randn(8, 8, dtype=torch.bfloat16) for _ in range(3)]
    gm = _aten_graph(fn, *args)
    assert _count(gm, aten._to_copy.default) == 4  # x.float() and the three casts
    assert merge_duplicates(gm) == 2
    assert _count(gm, aten._to_copy.default) == 2
    for got, want in zip(gm(*args), fn(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_signed_zeros_are_different_arguments():
    def fn(x):  # the products are intermediates (outputs are never merged); 1 / (-0.0) is -inf, 1 / 0.0 inf
        return 1 / (x * 0.0), 1 / (x * -0.0)

    gm = _aten_graph(fn, torch.randn(5))
    assert merge_duplicates(gm) == 0
    x = torch.rand(5) + 1
    for got, want in zip(gm(x), fn(x)):
        assert torch.equal(got, want)


def test_returned_values_stay_separate_tensors():
    def fn(x):
        return x.to(torch.float64), x.to(torch.float64), x.to(torch.float64).view(-1)

    gm = _aten_graph(fn, torch.randn(2, 3))
    merge_duplicates(gm)
    first, second, third = gm(torch.randn(2, 3))
    storages = {value.untyped_storage().data_ptr() for value in (first, second, third)}
    assert len(storages) == 3  # a caller may write each alone, as eager's


def test_random_ops_and_writes_are_never_merged():
    def fn(x, y):
        a, b = torch.rand_like(x), torch.rand_like(x)  # two draws
        before = x.sin()
        x.copy_(y)  # a write: the same op after it reads another value
        return a, b, before + x.sin()

    gm = _aten_graph(fn, torch.randn(3), torch.randn(3))
    assert merge_duplicates(gm) == 0


def test_a_bert_attention_block_casts_its_layer_norm_once(tmp_path):
    """The layer norm's kernel stores one bf16 copy for the three projections, and the values are eager's."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

        def forward(self, x):
            h = self.norm(x)
            return self.q(h) + self.k(h) * self.v(h)

    torch.manual_seed(0)
    block, x = Block().eval(), torch.randn(2, 8, 32)
    torch._dynamo.reset()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = block(x)
        with kiln.config.patch(debug=True, debug_dir=str(tmp_path), graph_cache=False, strict=True):
            result = kiln.compile(block)(x)
    torch.testing.assert_close(result, expected, rtol=1.6e-2, atol=1e-2)
    (aten_graph,) = glob.glob(os.path.join(str(tmp_path), "*", "graph_*", "aten_graph.py"))
    text = open(aten_graph).read()
    activation_casts = [line for line in text.splitlines() if '"bf16[2, 8, 32]" = torch.ops.aten._to_copy' in line]
    assert len(activation_casts) == 1, text  # the norm's output, cast once; the weights' casts are [32, 32], [32]


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_merged_graphs_match_eager_on_both_backends(backend):
    torch.manual_seed(0)
    w = torch.randn(16, 16)

    def fn(x):
        h = torch.nn.functional.layer_norm(x, (16,))
        return h.to(torch.bfloat16).float() @ w + h.to(torch.bfloat16).float().sum(-1, keepdim=True)

    x = torch.randn(8, 16)
    torch._dynamo.reset()
    with kiln.config.patch(cpu_backend=backend, graph_cache=False, strict=True):
        result = kiln.compile(fn)(x)
    torch.testing.assert_close(result, fn(x), rtol=1e-5, atol=1e-5)
