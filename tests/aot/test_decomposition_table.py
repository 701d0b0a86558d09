"""kiln's decomposition table (kiln/aot/decompositions.py) starts from torch's core-ATen table without the
CompositeImplicitAutograd entries that torch's public `core_aten_decompositions()` adds for torch.export
(kiln/_torch.py `core_aten_decompositions`: building those costs every new process a noticeable part of its
first call). A trace never reaches a CIA entry, since the dispatcher decomposes a CIA op before any mode sees it:
the ATen graphs handed to kiln's backend must be the same with either table, for inference and for training
(forward and backward), on models in their default configs."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln import _torch, backend
from kiln.aot import decompositions

from tests.aot.test_plain_trace import VOCAB, _bert, _gpt2, _llama, _ResNetLike

transformers = pytest.importorskip("transformers")


def _aten_graphs(monkeypatch, model, args, train: bool) -> list:
    """The code of every ATen graph kiln's backend was handed compiling `model` (no graph cache)."""
    codes = []
    compile_aten = backend.compile_aten_graph

    def recording(gm, example_inputs, **options):
        codes.append(gm.code)
        return compile_aten(gm, example_inputs, **options)

    monkeypatch.setattr(backend, "compile_aten_graph", recording)
    kiln.reset()
    with kiln.config.patch(graph_cache=False):
        if train:
            model.train()
            output = kiln.compile(model)(*args)
            torch.utils._pytree.tree_leaves(output)[0].float().sum().backward()
        else:
            model.eval()
            with torch.no_grad():
                kiln.compile(model)(*args)
    monkeypatch.undo()
    return codes


def _public_table():
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("make", [_bert, _gpt2, _llama, _ResNetLike], ids=["bert", "gpt2", "llama", "resnet"])
def test_the_aten_graphs_are_those_of_torchs_public_table(monkeypatch, make, train):
    torch.manual_seed(0)
    model = make()
    args = (torch.randn(2, 3, 16, 16),) if make is _ResNetLike else (torch.randint(0, VOCAB, (2, 16)),)
    decompositions.decomposition_table.cache_clear()
    try:
        ours = _aten_graphs(monkeypatch, model, args, train)
        monkeypatch.setattr(_torch, "core_aten_decompositions", _public_table)
        decompositions.decomposition_table.cache_clear()
        public = _aten_graphs(monkeypatch, model, args, train)
    finally:
        decompositions.decomposition_table.cache_clear()
    assert len(ours) == (2 if train else 1) and ours == public


def test_the_table_leaves_out_the_composite_implicit_entries_and_keeps_the_core_ones():
    ours, public = _torch.core_aten_decompositions(), _public_table()
    assert set(ours) < set(public)
    aten = torch.ops.aten
    assert aten.addmm.default in ours or aten.addmm.default not in public  # core entries kept as torch has them
    for op in (aten.native_layer_norm.default, aten.gelu.default, aten._softmax.default):
        assert (op in ours) == (op in public), op
    assert aten.linear.default in public and aten.linear.default not in ours  # a CIA op: the dispatcher decomposes it


def _traced_batch_norm(table):
    """Eval batch norm traced to ATen with `table` (kiln's, or kiln's with torch's entry for the op)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    return lambda *args: make_fx(lambda *a: op(*a, 0.1, 1e-5), decomposition_table=table)(*args)(*args)


def _tables():
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    ours = decompositions.decomposition_table()
    return ours, {**ours, op: _torch.get_decompositions([op])[op]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
def test_eval_batch_norm_matches_torchs_decomposition_bit_for_bit(dtype, affine, channels_last):
    """kiln's batch_norm_inference computes torch's formula in fewer ops: the same values, shapes and layout."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 7, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    stats_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    mean, var = torch.randn(6, dtype=stats_dtype), torch.rand(6, dtype=stats_dtype) + 0.1
    weight, bias = (torch.randn(6, dtype=stats_dtype), torch.randn(6, dtype=stats_dtype)) if affine else (None, None)
    ours, torchs = (_traced_batch_norm(table)(x, weight, bias, mean, var) for table in _tables())
    for a, b in zip(ours, torchs):
        assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    eager = torch.ops.aten._native_batch_norm_legit_no_training(x, weight, bias, mean, var, 0.1, 1e-5)[0]
    torch.testing.assert_close(ours[0], eager, **({"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}))


def test_eval_batch_norm_traces_in_fewer_ops_than_torchs():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, mean, var, weight, bias = torch.randn(2, 3, 4, 4), torch.randn(3), torch.rand(3) + 0.1, torch.randn(3), torch.randn(3)
    op = torch.ops.aten._native_batch_norm_legit_no_training.default

    def count(table):
        gm = make_fx(lambda *a: op(*a, 0.1, 1e-5), decomposition_table=table)(x, weight, bias, mean, var)
        return sum(node.op == "call_function" for node in gm.graph.nodes)

    ours, torchs = (count(table) for table in _tables())
    assert ours < torchs, (ours, torchs)
