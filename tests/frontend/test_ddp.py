"""`kiln.compile(DDP(model))`: DDP's forward runs as it is, the model inside is compiled.

One process (world size 1, gloo over an in-memory store): what is checked is that the
wrapper compiles the model, gives eager DDP's outputs and gradients, and leaves the module
as it found it. Several processes need several GPUs or hosts, which CI does not have.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import kiln
from kiln.backend import graph_compiler
from kiln.debug.explain import ExplainReport, _recording

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_ddp_model_is_compiled_and_matches_eager_ddp(process_group):
    eager_model = _model()
    compiled_model = copy.deepcopy(eager_model)
    eager = torch.nn.parallel.DistributedDataParallel(eager_model)
    ddp = torch.nn.parallel.DistributedDataParallel(compiled_model)
    compiled = kiln.compile(ddp, backend="aot_eager")
    report = ExplainReport()
    for step in range(2):
        x = torch.randn(5, 8)
        expected = eager(x)
        expected.square().sum().backward()
        with _recording(report):
            actual = compiled(x)
        actual.square().sum().backward()
        torch.testing.assert_close(actual, expected)
        for mine, theirs in zip(compiled_model.parameters(), eager_model.parameters()):
            torch.testing.assert_close(mine.grad, theirs.grad)
    assert report.frames and not report.eager_frames and not report.breaks
    assert all(entry.graph_module is not None for entry in compiled._compiled_call.entries)
    assert "forward" not in compiled_model.__dict__  # the module is left as it was
    # torch.compile's key layout (`_orig_mod.` first), which torch.distributed.checkpoint relies on
    assert compiled.state_dict().keys() == torch.compile(ddp, backend="eager").state_dict().keys()


def _blocks():
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 4))


@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("form", ["compile_ddp", "ddp_of_compiled"])
def test_a_graph_inside_ddp_is_split_at_its_buckets(process_group, form, split):
    """With 20 KB buckets (a layer is 16.6 KB), the graph is compiled in pieces, and DDP sends the last layers'
    bucket while the first layer's gradient is still to be computed: the all-reduce overlaps the backward.
    Whole (ddp_split off), no bucket is sent before the backward is over. Either way, eager DDP's parameters."""
    reference, model = _blocks(), _blocks()
    eager = torch.nn.parallel.DistributedDataParallel(reference, bucket_cap_mb=0.02)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_compiler("aot_eager")(graph_module, example_inputs)

    inner = kiln.compile(model, backend=backend) if form == "ddp_of_compiled" else model
    ddp = torch.nn.parallel.DistributedDataParallel(inner, bucket_cap_mb=0.02)
    compiled = kiln.compile(ddp, backend=backend) if form == "compile_ddp" else ddp
    sent_early = []

    def hook(state, bucket):
        sent_early.append(model[0][0].weight.grad is None)
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    ddp.register_comm_hook(None, hook)
    optimizers = [torch.optim.SGD(reference.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)]
    report = ExplainReport()
    with kiln.config.patch(ddp_split=split):
        for _ in range(3):
            x = torch.randn(8, 64)
            for optimizer in optimizers:
                optimizer.zero_grad()
            eager(x).square().sum().backward()
            with _recording(report):
                loss = compiled(x).square().sum()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs)
    assert report.frames and not report.eager_frames and not report.breaks
    assert len(graphs) == (2 if split else 1)
    assert any(sent_early) == split, sent_early


def _traced(program):
    graph_module = torch.fx.symbolic_trace(program)
    for node in graph_module.graph.nodes:  # the trace's metadata, as kiln's frontend records it
        node.meta["example_value"] = (torch.empty(2, 4), torch.empty(2, 4)) if node.target == "split" else \
            torch.empty(0)
    return graph_module


def test_a_cut_a_non_tensor_would_cross_is_dropped():
    """ddp.plan with 1-byte buckets: a cut between two products, unless split's tuple would cross it."""
    from kiln.frontend import ddp as ddp_split

    inputs = [torch.randn(2, 8), torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8, 8))]

    def tensors_cross(x, w0, w1):
        return torch.mm(torch.mm(x, w0).relu(), w1)

    pieces = ddp_split.plan(_traced(tensors_cross), inputs, first_cap=1, cap=1)
    assert [(piece.start, piece.stop, piece.parameter_bytes) for piece in pieces] == [(0, 2, 256), (2, 3, 256)]
    assert [node.name for node in pieces[1].inputs] == ["relu", "w1"]

    def a_tuple_crosses(x, w0, w1):
        halves = torch.mm(x, w0).split(4, dim=1)
        return torch.mm(halves[0].repeat(1, 2), w1) + halves[1].sum()

    pieces = ddp_split.plan(_traced(a_tuple_crosses), inputs, first_cap=1, cap=1)
    assert [(piece.start, piece.stop, piece.parameter_bytes) for piece in pieces] == [(0, 8, 512)]


def test_no_cut_inside_a_no_grad_region():
    """ddp.plan with 1-byte buckets: the product that fills the bucket is inside a no_grad region (the frontend's
    _set_grad_enabled nodes), so the cut before it would leave the region's end to another piece: one piece."""
    from kiln.frontend import ddp as ddp_split

    graph = torch.fx.Graph()
    x, w0, w1 = (graph.placeholder(name) for name in ("x", "w0", "w1"))
    first = graph.call_function(torch.mm, (x, w0))
    graph.call_function(torch._C._set_grad_enabled, (False,))
    relu = graph.call_function(torch.relu, (first,))
    second = graph.call_function(torch.mm, (relu, w1))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output((second,))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    for node in graph_module.graph.nodes:
        node.meta["example_value"] = torch.empty(0)
    inputs = [torch.randn(2, 8), torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8, 8))]
    pieces = ddp_split.plan(graph_module, inputs, first_cap=1, cap=1)
    assert [(piece.start, piece.stop) for piece in pieces] == [(0, 5)], pieces


def test_llama_default_config_trains_split_at_ddp_buckets(process_group):
    """transformers' Llama (default config, tiny sizes; its rotary embedding's autocast region and causal mask
    in the graph) under kiln.compile(DDP(m)) with 50 KB buckets: several pieces, eager DDP's losses and
    parameters after 3 AdamW steps."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config)
    model = copy.deepcopy(reference)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_compiler("aot_eager")(graph_module, example_inputs)

    eager = torch.nn.parallel.DistributedDataParallel(reference, bucket_cap_mb=0.05)
    compiled = kiln.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05), backend=backend)
    optimizers = [torch.optim.AdamW(reference.parameters(), lr=1e-3), torch.optim.AdamW(model.parameters(), lr=1e-3)]
    report = ExplainReport()
    for _ in range(3):
        ids = torch.randint(0, 256, (2, 16))
        for optimizer in optimizers:
            optimizer.zero_grad()
        expected = eager(input_ids=ids, labels=ids).loss
        expected.backward()
        with _recording(report):
            loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, expected)
        for optimizer in optimizers:
            optimizer.step()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert report.frames and not report.eager_frames and not report.breaks
    assert len(graphs) >= 5, len(graphs)  # 260 KB of parameters in 50 KB buckets
