"""Iterators over containers the loop changes, as Python's (variables/iterators.py).

A dict or set that changes size while it is iterated (directly, or through keys()/values()/items(), `next()` on an
iterator taken before the change, a comprehension) raises Python's RuntimeError inside the compiled function, where
the program may catch it; a list's iterator reads the list at each step (an item appended in the loop is reached).
Before 2026-12-05 every iterator was a snapshot taken at `iter()`: the loops ran to the end over the old items, a
silent wrong answer (and a different dict or set afterwards). Each program here is captured whole (fullgraph=True,
one graph, no frame run eagerly) with eager's result.
"""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from transformers.utils import ModelOutput

import kiln
from kiln.debug.explain import explain


def _compiled_whole(fn, *args):
    """`fn` compiled with fullgraph=True: its result, after checking one graph, no break and no eager frame."""
    report = explain(fn, *args)
    assert report.graph_count == 1 and report.break_count == 0 and not report.eager_frames, str(report)
    return kiln.compile(fn, fullgraph=True)(*args)


def _same(expected, actual):
    expected_leaves, actual_leaves = (torch.utils._pytree.tree_leaves(value) for value in (expected, actual))
    assert len(expected_leaves) == len(actual_leaves), (expected, actual)
    for want, got in zip(expected_leaves, actual_leaves):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want)
        else:
            assert type(got) is type(want) and got == want, (expected, actual)


def _caught(loop):
    """A program running `loop(d_or_s)` and returning what it raised (or "none") and the container after."""
    def program(x):
        try:
            container = loop()
        except RuntimeError as error:
            return x + 1, str(error)
        return x - 1, container

    return program


def _add_while_iterating_keys():
    d = {"a": 1, "b": 2}
    for key in d:
        d[key + "x"] = 3
    return d


def _delete_while_iterating_keys_view():
    d = {"a": 1, "b": 2}
    for key in d.keys():
        del d[key]
    return d


def _pop_while_iterating_values():
    d = {"a": 1, "b": 2}
    for _ in d.values():
        d.pop("b")
    return d


def _add_while_iterating_items():
    d = {"a": 1, "b": 2}
    for key, value in d.items():
        d["c"] = value
    return d


def _replace_values_while_iterating():  # no change of size: no error
    d = {"a": 1, "b": 2}
    for key in d:
        d[key] = 5
    return d


def _same_size_other_keys():  # del + insert: same size, new keys -> "dictionary keys changed during iteration"
    d = {"a": 1, "b": 2}
    for key in d:
        del d[key]
        d[key + "z"] = 1
    return d


def _next_after_change():
    d = {"a": 1, "b": 2}
    keys = iter(d)
    next(keys)
    d["c"] = 3
    return next(keys)


def _comprehension_adds():
    d = {"a": 1}
    return [d.setdefault(key + "q", 0) for key in d]


def _set_add():
    s = {1, 2}
    for value in s:
        s.add(value + 10)
    return s


def _set_discard():
    s = {1, 2}
    for value in s:
        s.discard(value)
    return s


def _ordered_dict_replaced():  # an OrderedDict's values replaced in place: no error
    d = collections.OrderedDict(a=1, b=2)
    for key in d:
        d[key] += 1
    return d


def _ordered_dict_grows():  # CPython's odict iterator has its own message
    d = collections.OrderedDict(a=1, b=2)
    for key in d:
        d["z" + key] = 0
    return d


def _ordered_dict_grows_after_its_last_key():  # no error: its iterator had found no next key
    d = collections.OrderedDict(a=1)
    for key in d:
        d["b"] = 2
    return d


def _list_grows():
    items, seen = [1, 2], []
    for value in items:
        seen.append(value)
        if len(items) < 5:
            items.append(value + 10)
    return seen, items


def _list_shrinks_and_iterator_stays_exhausted():
    items, seen = [1, 2, 3, 4], []
    for value in items:
        seen.append(value)
        if value == 2:
            items.remove(value)
    rest = iter(items)
    taken = list(rest)
    items.append(9)
    return seen, taken, list(rest)


@pytest.mark.parametrize("loop", [_add_while_iterating_keys, _delete_while_iterating_keys_view,
                                  _pop_while_iterating_values, _add_while_iterating_items,
                                  _replace_values_while_iterating, _same_size_other_keys, _next_after_change,
                                  _comprehension_adds, _set_add, _set_discard, _ordered_dict_replaced, _ordered_dict_grows,
                                  _ordered_dict_grows_after_its_last_key,
                                  _list_grows,
                                  _list_shrinks_and_iterator_stays_exhausted])
def test_a_container_changed_during_its_loop(loop):
    program = _caught(loop)
    x = torch.randn(3)
    _same(program(x), _compiled_whole(program, x))


_GLOBAL_SCORES = {"a": 1, "b": 2}


def _global_and_argument_dicts(x, scores):
    outcome = []
    for source in (_GLOBAL_SCORES, scores):
        try:
            for key in source:
                source[key * 2] = 0
        except RuntimeError as error:
            outcome.append(str(error))
    return x + 1, outcome


def test_outside_dicts_changed_during_their_loop():
    """An outside dict (a global, an argument) is read under its keys guard until its first mutation copies it into
    the trace: the iterator taken before continues over the copy, and raises as the real one does; the dicts end
    as eager leaves them."""
    x = torch.randn(3)
    _GLOBAL_SCORES.clear()
    _GLOBAL_SCORES.update(a=1, b=2)
    argument = {"p": 1, "q": 2}
    expected = _global_and_argument_dicts(x, argument)
    expected_dicts = dict(_GLOBAL_SCORES), dict(argument)
    _GLOBAL_SCORES.clear()
    _GLOBAL_SCORES.update(a=1, b=2)
    argument = {"p": 1, "q": 2}
    _same(expected, _compiled_whole(_global_and_argument_dicts, x, dict(argument)))
    _GLOBAL_SCORES.clear()
    _GLOBAL_SCORES.update(a=1, b=2)
    actual = kiln.compile(_global_and_argument_dicts, fullgraph=True)(x, argument)
    _same(expected, actual)
    assert (dict(_GLOBAL_SCORES), argument) == expected_dicts


def test_an_uncaught_change_of_size_raises_out_of_the_compiled_function():
    def program(x):
        d = {"a": 1}
        for key in d:
            d["z"] = 1
        return x

    with pytest.raises(RuntimeError, match="dictionary changed size during iteration"):
        kiln.compile(program)(torch.ones(2))


@dataclasses.dataclass
class _Output(ModelOutput):
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def _model_output_views(x):
    out = _Output(logits=x)
    keys, items = out.keys(), out.items()
    out["hidden"] = x * 2
    return list(keys), len(items), out.to_tuple()


def _model_output_field_set_to_none(x):
    out = _Output(logits=x, hidden=x + 1)
    out.hidden = None  # the attribute only: the entry keeps its value
    return out.to_tuple(), out.hidden, out["hidden"], len(out)


def _model_output_keys_in_insertion_order(x):
    out = _Output(hidden=x)
    out["logits"] = x + 1
    out.logits = x + 2
    return list(out.keys()), out.to_tuple(), out[0]


def _model_output_refuses_pop(x):
    out = _Output(logits=x)
    try:
        out.pop("logits")
    except Exception as error:  # transformers raises a plain Exception
        return str(error), out.logits + 1
    return x


@pytest.mark.parametrize("program", [_model_output_views, _model_output_field_set_to_none,
                                     _model_output_keys_in_insertion_order, _model_output_refuses_pop])
def test_model_output_mapping_follows_transformers(program):
    """A ModelOutput made in the trace is an OrderedDict of the keys set so far, as transformers' is: its views are
    live, keys keep insertion order, setting a field to None leaves its entry. Before, its keys were recomputed as
    the non-None fields in declaration order (a view was a snapshot), so each program here gave another answer."""
    x = torch.randn(3)
    _same(program(x), _compiled_whole(program, x))


def test_a_model_output_returned_after_changes_is_rebuilt_as_the_trace_left_it():
    def program(x):
        out = _Output(logits=x + 1)
        out.extra = 5
        out["hidden"] = None
        return out

    expected, actual = program(torch.ones(2)), _compiled_whole(program, torch.ones(2))
    assert type(actual) is _Output and actual.extra == 5 and list(actual.keys()) == list(expected.keys())
    assert actual.hidden is None and actual.to_tuple()[1] is None
    torch.testing.assert_close(actual.logits, expected.logits)


def _list_appended_after_a_break(x, items):
    seen = []
    for value in items:
        if x.sum() > 0:  # a graph break on every iteration
            x = x + value
        seen.append(value)
        if len(items) < 4:
            items.append(value * 10)
    return x, seen


def _dict_grows_after_a_break(x):
    d = {"a": 1, "b": 2}
    try:
        for key in d:
            if x.sum() > 0:
                x = x + 1
            d[key + "z"] = 1
    except RuntimeError as error:
        return x, str(error), list(d)
    return x, list(d)


def _set_grows_after_a_break(x):
    s = {1, 2}
    try:
        for value in s:
            if x.sum() > 0:
                x = x + 1
            s.add(value + 10)
    except RuntimeError as error:
        return x, str(error), sorted(s)
    return x, sorted(s)


@pytest.mark.parametrize("program, arguments", [
    (_list_appended_after_a_break, lambda: (torch.ones(3), [1, 2])),
    (_list_appended_after_a_break, lambda: (torch.ones(3), list(range(12)))),
    (_dict_grows_after_a_break, lambda: (torch.ones(3),)),
    (_set_grows_after_a_break, lambda: (torch.ones(3),)),
])
def test_a_loop_that_breaks_goes_on_over_the_live_container(program, arguments):
    """A graph break inside the loop passes its iterator on as the container's own, advanced as far as the trace
    took it (`iterators.iterator_at`), so what the loop changes after the break is seen as in Python: before, the
    resume function iterated a tuple of the items left at the break (appended items were never reached, a dict
    that grew raised nothing). No frame runs eagerly; a list of 12 breaks 12 times through one resume function."""
    expected = program(*arguments())
    report = explain(program, *arguments())
    assert report.break_count >= 1 and not report.eager_frames, str(report)
    _same(expected, kiln.compile(program)(*arguments()))


def test_a_dict_view_passed_across_a_graph_break_stays_a_traced_view():
    """A dict view live at a break reaches the resume function as the view of the dict it takes (`view_of`), not
    as a real view object, which the resume function's trace could not iterate (it ran eagerly)."""
    def program(x):
        scores = {"a": x, "b": x * 2}
        values = scores.values()
        if x.sum() > 0:
            x = x + 1
        scores["c"] = x * 3
        return sum(value for value in values), len(values)

    x = torch.randn(3).abs()
    report = explain(program, x)
    assert report.break_count == 1 and not report.eager_frames, str(report)
    _same(program(x), kiln.compile(program)(x))


class _Growing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ReLU()])
        self.named = torch.nn.ModuleDict({"a": torch.nn.ReLU()})

    def forward(self, x):
        names = self.named.keys()
        self.layers.append(torch.nn.Tanh())  # a graph break: the Tanh made in the trace is made again for it
        self.named["b"] = torch.nn.Sigmoid()
        for layer in self.layers:
            x = layer(x)
        return x * len(self.layers), [type(layer).__name__ for layer in self.layers], list(names), len(self.named)


class _AppendsWhileIterating(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.ReLU()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            if len(self.layers) < 4:
                self.layers.append(torch.nn.Tanh())
        return x


def test_module_containers_changed_in_forward():
    """A module made in the trace (no parameters) and stored on a container breaks there and is made again by the
    entry (the whole frame ran eagerly: "returning module Tanh"); len() and iteration after the change see it (a
    change of a module's _modules is a graph break: the trace reads the real tables); a ModuleDict's keys() is a
    live view; a ModuleList iterated while it grows raises Python's RuntimeError, the loop continuing over the
    real `_modules` iterator after the break."""
    x = torch.randn(3)
    expected = _Growing()(x)
    report = explain(_Growing(), x)
    assert report.break_count >= 1 and not report.eager_frames, str(report)
    _same(expected, kiln.compile(_Growing())(x))
    with pytest.raises(RuntimeError, match="dictionary changed size during iteration"):
        _AppendsWhileIterating()(x)
    with pytest.raises(RuntimeError, match="dictionary changed size during iteration"):
        kiln.compile(_AppendsWhileIterating())(x)
