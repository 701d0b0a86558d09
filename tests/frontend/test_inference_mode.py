"""`torch.inference_mode()` inside a compiled function (kiln/frontend/variables/torch_special.py
InferenceModeVariable, output.py set_inference_mode): the results, and which of them are inference tensors,
are eager's; a break inside the region resumes inside it; what eager refuses (an inference tensor updated
in place, or saved for backward, outside the mode) raises as in eager.

Each program runs through kiln's frontend on the eager rung (graphs counted) and through kiln.compile with
kiln's own CPU backend (generated kernels: their outputs are not made inside any mode).
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.frontend.dispatcher import Dispatcher


def _eager_rung():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, backend


def _leaves(value) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _assert_same(result, expected):
    """Equal values; each tensor with eager's `is_inference()` and `requires_grad`."""
    result, expected = _leaves(result), _leaves(expected)
    assert len(result) == len(expected)
    for item, wanted in zip(result, expected):
        if isinstance(wanted, torch.Tensor):
            torch.testing.assert_close(item.detach(), wanted.detach())
            assert (item.is_inference(), item.requires_grad) == (wanted.is_inference(), wanted.requires_grad)
        else:
            assert item == wanted


def region_around_a_break(x, y):
    with torch.inference_mode():
        a = x * y
        value = a.sum().item()
        b = a + value
    return b.clone() * 2, b.is_inference(), b


def whole_body_in_a_region(x):
    with torch.inference_mode():
        y = x.sin() * 2
        return y, y.is_inference(), torch.is_inference_mode_enabled(), torch.is_grad_enabled()


def used_after_the_region(x):
    with torch.inference_mode():
        a = x.exp()
    outside = a + 1  # made outside: a normal tensor, from an inference one
    return outside, a, a.is_inference(), outside.is_inference(), torch.is_inference_mode_enabled()


def views_in_the_region(x):
    with torch.inference_mode():
        view = x.view(-1)  # a view of a normal tensor is a normal tensor, even in the region
        made = (x * 3).view(-1)  # a view of an inference tensor is one
        first, second = (x + 1).split(2)  # and so are the views one op makes
    return view, made, view.is_inference(), made.is_inference(), first, second.is_inference()


@torch.inference_mode()
def _decorated_helper(t):
    return t.cos() + 1


def calls_a_decorated_helper(x):
    y = _decorated_helper(x)
    return y * 1, y, torch.is_grad_enabled()


def mode_false_inside(x):
    with torch.inference_mode():
        a = x + 1
        with torch.inference_mode(False):
            b = x * 2
            grad = torch.is_grad_enabled()
        c = a + b
    return a, b, c, grad


PROGRAMS = [region_around_a_break, whole_body_in_a_region, used_after_the_region, views_in_the_region,
            calls_a_decorated_helper, mode_false_inside]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda fn: fn.__name__)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_results_and_inference_tensors_match_eager(fn, requires_grad):
    def arguments():
        torch.manual_seed(0)
        return [torch.randn(3, 4, requires_grad=requires_grad) for _ in range(fn.__code__.co_argcount)]

    expected = fn(*arguments())
    graphs, backend = _eager_rung()
    on_the_eager_rung = Dispatcher(fn, backend)
    compiled = kiln.compile(fn)
    for run in (on_the_eager_rung, compiled):
        for _ in range(2):  # the second call reuses what the first compiled
            _assert_same(run(*arguments()), expected)
    assert graphs and all(entry.eager_reason is None for entry in on_the_eager_rung.entries)
    assert compiled.entries and all(entry.eager_reason is None for entry in compiled.entries)


def test_a_break_inside_the_region_gives_as_many_graphs_as_dynamo():
    graphs, backend = _eager_rung()
    compiled = Dispatcher(region_around_a_break, backend)
    x, y = torch.randn(3), torch.randn(3)
    _assert_same(compiled(x, y), region_around_a_break(x, y))
    assert len(graphs) == 2  # Dynamo: 2 graphs, 1 break (tests/frontend/results/break_corpus_dynamo.json)
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()  # the region was left


def updates_an_inference_tensor_outside(x):
    with torch.inference_mode():
        a = x * 2
    a.add_(1)  # eager: RuntimeError, an inplace update to an inference tensor outside InferenceMode
    return a


def saves_an_inference_tensor_for_backward(x, w):
    with torch.inference_mode():
        mask = x > 0
        scale = x.abs() + 1
    return (w * scale).sum(), mask


@pytest.mark.parametrize("fn, count", [(updates_an_inference_tensor_outside, 1),
                                       (saves_an_inference_tensor_for_backward, 2)])
def test_what_eager_refuses_raises_as_in_eager(fn, count):
    def arguments():
        return [torch.randn(3, requires_grad=index == 1) for index in range(count)]

    with pytest.raises(RuntimeError) as eager_error:
        fn(*arguments())
    with pytest.raises(RuntimeError) as kiln_error:
        kiln.compile(fn)(*arguments())
    assert str(kiln_error.value) == str(eager_error.value)


def test_called_inside_an_outer_region_still_reuses_its_graph():
    """A function without a region of its own keeps today's behaviour: no inference-mode guard, no copy."""
    graphs, backend = _eager_rung()
    compiled = Dispatcher(lambda x: x * 2 + 1, backend)
    with torch.inference_mode():
        x = torch.randn(3)
        out = compiled(x)
    assert out.is_inference()
    assert "inference mode" not in compiled.entries[0].guard_source
