"""Tensors that are autograd leaves or module state, made or updated inside a compiled function.

- A tensor made with requires_grad=True (or `.requires_grad_()`) inside the trace is a new autograd leaf: the
  graph's output was not one (returned with requires_grad False, and `autograd.grad(y, w)` raised), a silent
  wrong result. It is made at a graph break, in Python, and enters the next graph as an input.
- `self.steps += 1` on a registered buffer stores back the very tensor the in-place op updated: captured whole
  (it was a graph break: "setting attribute ... to tensor").
"""
from __future__ import annotations

import torch

import kiln
from kiln.debug.explain import explain


def _leaf_from_factory(x):
    w = torch.ones(4, requires_grad=True)
    return (x * w).sum(), w


def _leaf_from_requires_grad_(x):
    w = x.detach().mean(0).requires_grad_()
    return (x * w).sum(), w


def _gradient_inside(x):
    w = torch.ones(4, requires_grad=True)
    y = (x * w.sin()).sum()
    (grad,) = torch.autograd.grad(y, w)
    return grad


def test_a_new_leaf_requiring_grad_is_a_real_leaf():
    x = torch.randn(3, 4)
    for program in (_leaf_from_factory, _leaf_from_requires_grad_):
        y, w = kiln.compile(program)(x)
        expected_y, _ = program(x)
        assert y.requires_grad and w.requires_grad and w.is_leaf and w.grad_fn is None
        torch.testing.assert_close(y, expected_y)
        y.backward()
        torch.testing.assert_close(w.grad, x.sum(0))
    torch.testing.assert_close(kiln.compile(_gradient_inside)(x), _gradient_inside(x))


class _Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x):
        self.steps += 1
        return self.linear(x) * self.steps


def test_an_augmented_assignment_to_a_buffer_is_captured():
    torch.manual_seed(0)
    eager, compiled_module = _Counting(), _Counting()
    compiled_module.load_state_dict(eager.state_dict())
    report = explain(_Counting(), torch.randn(2, 2))
    assert len(report.graphs) == 1 and not report.breaks
    compiled = kiln.compile(compiled_module)
    x = torch.randn(2, 2)
    for step in range(1, 4):
        torch.testing.assert_close(compiled(x), eager(x))
        assert int(compiled_module.steps) == int(eager.steps) == step


def test_an_in_place_update_of_a_parameter_under_no_grad_is_captured():
    """The in-place op's result is the parameter itself (a leaf requiring grad, but an input, not a new one)."""
    torch.manual_seed(0)
    eager, compiled_linear = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    compiled_linear.load_state_dict(eager.state_dict())

    def step(linear, x):
        y = linear(x)
        with torch.no_grad():
            linear.weight.mul_(0.5)
        return y

    x = torch.randn(2, 4)
    report = explain(step, torch.nn.Linear(4, 4), x)
    assert len(report.graphs) == 1 and not report.breaks
    compiled = kiln.compile(step)
    for _ in range(2):
        torch.testing.assert_close(compiled(compiled_linear, x), step(eager, x))
        torch.testing.assert_close(compiled_linear.weight, eager.weight)


def test_a_view_of_a_parameter_under_no_grad_is_not_a_new_leaf():
    """Under no_grad, `cls_token.expand(...)` is a leaf that requires grad (autograd's rule for views made without
    recording): not a new leaf, so ViT's and CLIP's inference stays one graph."""
    token = torch.nn.Parameter(torch.randn(1, 1, 4))

    def program(x):
        return torch.cat([token.expand(x.shape[0], -1, -1), x], 1)

    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        report = explain(program, x)
        assert len(report.graphs) == 1 and not report.breaks
        torch.testing.assert_close(kiln.compile(program)(x), program(x))
