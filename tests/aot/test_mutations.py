"""Input mutations kept in the ATen graph (kiln/aot/mutations.py): batched into one _foreach_copy_ per dtype where
they end the graph, left alone where something reads around them, and every written input named for CUDA graphs."""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln import _torch
from kiln.aot.mutations import batch_input_copies, mutated_inputs

aten = _torch.aten


def _graph(build) -> torch.fx.GraphModule:
    """An ATen-level graph built by `build(graph, placeholders)` over placeholders a (f32[4]), b (f32[4]),
    c (i64[]) and d (f32[4]), each node's meta "val" a real tensor of its value's metadata."""
    graph = torch.fx.Graph()
    metas = {"a": torch.zeros(4), "b": torch.zeros(4), "c": torch.zeros((), dtype=torch.int64), "d": torch.zeros(4)}
    placeholders = {}
    for name, meta in metas.items():
        placeholders[name] = graph.placeholder(name)
        placeholders[name].meta["val"] = meta

    def call(target, *args):
        node = graph.call_function(target, args)
        values = [arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg for arg in args]
        node.meta["val"] = target(*[value.clone() if isinstance(value, torch.Tensor) else value for value in values])
        return node

    graph.output(build(call, placeholders))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _targets(gm) -> list:
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def test_copies_that_end_a_graph_become_one_foreach_copy_per_dtype():
    def build(call, p):
        new_a, new_b = call(aten.mul.Tensor, p["a"], 2), call(aten.add.Tensor, p["b"], p["d"])
        new_c = call(aten.add.Tensor, p["c"], 1)
        out = call(aten.sub.Tensor, new_a, new_b)
        for target, value in ((p["a"], new_a), (p["b"], new_b), (p["c"], new_c)):
            call(aten.copy_.default, target, value)
        return (out,)

    gm = _graph(build)
    assert batch_input_copies(gm) == 2  # a and b (float32); c alone in its dtype stays a copy_
    assert _targets(gm).count(aten._foreach_copy_.default) == 1 and _targets(gm).count(aten.copy_.default) == 1
    assert mutated_inputs(gm) == (0, 1, 2)
    a, b, c, d = torch.randn(4), torch.randn(4), torch.tensor(3), torch.randn(4)
    want_a, want_b, want_out = a * 2, b + d, a * 2 - (b + d)
    (out,) = gm(a, b, c, d)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(a, want_a)
    torch.testing.assert_close(b, want_b)
    assert c.item() == 4


def test_a_copy_that_a_later_node_reads_around_or_that_casts_stays():
    def build(call, p):
        new_a, new_b, new_d = call(aten.mul.Tensor, p["a"], 2), call(aten.mul.Tensor, p["b"], 3), p["d"]
        call(aten.copy_.default, p["a"], new_a)
        late = call(aten.add.Tensor, p["a"], 1)  # reads a after its copy: the copy must stay before it
        call(aten.copy_.default, p["b"], new_b)
        call(aten.copy_.default, p["c"], call(aten.sum.default, new_d))  # a float into an int64: a cast
        return (late,)

    gm = _graph(build)
    assert batch_input_copies(gm) == 0  # b is the only plain copy left to batch: a group of one
    assert _targets(gm).count(aten.copy_.default) == 3
    assert mutated_inputs(gm) == (0, 1, 2)


def _conv_bn_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_batch_norm_running_statistics_are_written_by_two_batched_copies_a_step(backend):
    from torch.profiler import profile

    from kiln.testing import compare

    model, reference, exact = _conv_bn_model(), _conv_bn_model(), _conv_bn_model().double()
    kiln.reset()
    with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        compiled = kiln.compile(model)
        probe = torch.randn(2, 8, 8, 8, generator=torch.Generator().manual_seed(9))  # a loss whose gradients are not 0
        for step in range(3):
            x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(step))
            if step < 2:
                (compiled(x) * probe).sum().backward()
            else:
                with profile() as prof:
                    (compiled(x) * probe).sum().backward()
            (reference(x) * probe).sum().backward()
            (exact(x.double()) * probe.double()).sum().backward()
    calls = {event.key: event.count for event in prof.key_averages()}
    # running_mean and running_var of both norms (float32), their num_batches_tracked (int64)
    assert calls.get("aten::_foreach_copy_") == 2, calls
    for (name, got), (_, want) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(got, want, msg=name)
    for (name, got), (_, want), (_, ref) in zip(model.named_parameters(), reference.named_parameters(),
                                                exact.named_parameters()):
        if name == "0.bias":  # a conv's bias before a batch norm: zero in exact math, float32 cancellation here
            assert got.grad.abs().max() <= 1e-4 * model[0].weight.grad.abs().max(), (name, got.grad)
            continue
        verdict = compare(got.grad, want.grad, ref.grad)  # eager's float32 sums round differently from kiln's
        assert verdict.ok, (name, verdict.message)


def test_an_inference_graph_that_writes_its_inputs_writes_the_callers_tensors():
    def step(x, total, count):
        total.add_(x.sum(0))
        count.add_(1)
        return x * 2

    total, count = torch.zeros(5), torch.zeros((), dtype=torch.int64)
    want_total, want_count = total.clone(), count.clone()
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, graph_cache=False):
        compiled = kiln.compile(step)
        for index in range(3):
            x = torch.randn(4, 5, generator=torch.Generator().manual_seed(index))
            torch.testing.assert_close(compiled(x, total, count), step(x, want_total, want_count))
    torch.testing.assert_close(total, want_total)
    assert count.item() == want_count.item() == 3


def test_a_deep_copied_model_keeps_its_own_running_statistics():
    """Two compiled copies of one model: each graph writes its own module's buffers."""
    first = _conv_bn_model()
    second = copy.deepcopy(first)
    kiln.reset()
    with kiln.config.patch(strict=True, graph_cache=False):
        compiled_first, compiled_second = kiln.compile(first), kiln.compile(second)
        compiled_first(torch.randn(2, 3, 12, 12)).sum().backward()
    assert second[1].num_batches_tracked.item() == 0 and first[1].num_batches_tracked.item() == 1
    torch.testing.assert_close(second[1].running_mean, torch.zeros(8))
    del compiled_second
