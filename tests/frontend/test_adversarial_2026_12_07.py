"""Adversarial programs (2026-12-07): outside objects' attributes, against eager.

Each program runs eagerly and compiled on equal copies of its state, call after call, while the state changes
between calls; the results and the state left behind must be eager's. Each test says what kiln once did wrong.
"""
from __future__ import annotations

import types

import torch

import kiln
from kiln.frontend import dispatcher


def _compiled(fn):
    """`kiln.compile(fn)` with a backend that counts the graphs it is given (run as traced)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return kiln.compile(fn, backend=backend), graphs


def _same(actual, expected):
    if isinstance(expected, torch.Tensor):
        return isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype and torch.equal(actual, expected)
    if isinstance(expected, (list, tuple)):
        return type(actual) is type(expected) and len(actual) == len(expected) and \
            all(_same(a, e) for a, e in zip(actual, expected))
    if isinstance(expected, dict):
        return isinstance(actual, dict) and list(actual) == list(expected) and \
            all(_same(actual[key], expected[key]) for key in expected)
    return actual == expected


def _check_calls(make, calls, *, captured=True):
    """make() -> (fn, state); each call(state) changes the state as it likes and returns the arguments.

    Results and the state's plain attributes must be eager's after every call; with `captured`, no frame ran
    eagerly (a graph was traced, breaks allowed)."""
    eager_fn, eager_state = make()
    compiled_fn, compiled_state = make()
    compiled, graphs = _compiled(compiled_fn)
    eager_frames = dispatcher.stats.eager_frames
    for number, call in enumerate(calls):
        expected = eager_fn(*call(eager_state))
        actual = compiled(*call(compiled_state))
        assert _same(actual, expected), f"call {number}: {actual!r} != {expected!r}"
        assert _same(_attributes(compiled_state), _attributes(eager_state)), f"state after call {number}"
    if captured:
        assert graphs and dispatcher.stats.eager_frames == eager_frames
    return graphs


def _attributes(state):
    """The state's tensors and plain objects' attributes (modules and classes are compared by the results)."""
    return {key: value if isinstance(value, torch.Tensor) else vars(value) for key, value in state.items()
            if isinstance(value, torch.Tensor) or not isinstance(value, (type, types.ModuleType, torch.nn.Module))}


# -- a store through the class's own __setattr__ ---------------------------------------------------------------
# Once wrong: the class's __setattr__ ran twice, once inlined in the trace and once more when the entry replayed
# the store with `setattr` after the graph (a counter counted two, a transforming setter transformed twice).

class _CountingSetter:
    def __init__(self):
        object.__setattr__(self, "stores", 0)

    def __setattr__(self, name, value):
        object.__setattr__(self, "stores", self.stores + 1)
        object.__setattr__(self, name, value)


class _DoublingSetter:
    def __setattr__(self, name, value):
        super().__setattr__(name, value * 2)


class _ForwardingSetter:
    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)


def _stores_attribute(x, obj):
    obj.a = 3
    obj.b = x.shape[0]
    return x + obj.a + obj.b


def _make_with(cls):
    return lambda: (_stores_attribute, {"obj": cls()})


def test_store_through_a_counting_setattr_runs_it_once():
    _check_calls(_make_with(_CountingSetter), [lambda s: (torch.ones(2), s["obj"])] * 3)


def test_store_through_a_transforming_setattr_transforms_once():
    _check_calls(_make_with(_DoublingSetter), [lambda s: (torch.ones(2), s["obj"])] * 3)


def test_store_through_a_forwarding_setattr():
    _check_calls(_make_with(_ForwardingSetter), [lambda s: (torch.ones(2), s["obj"])] * 3)


class _CountingDeleter:
    def __init__(self):
        self.deletes = 0
        self.a = 1

    def __delattr__(self, name):
        self.deletes += 1
        object.__delattr__(self, name)


def test_deletion_through_a_counting_delattr_runs_it_once():
    def program(x, obj):
        obj.b = 2
        del obj.a
        del obj.b
        return x + obj.deletes

    def call(state):
        state["obj"].a = 1
        return torch.ones(2), state["obj"]

    _check_calls(lambda: (program, {"obj": _CountingDeleter()}), [call] * 3)
