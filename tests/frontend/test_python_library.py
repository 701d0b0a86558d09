"""Python's built-in containers and standard library in a traced frame, each checked against eager
Python: OrderedDict and Counter, outside sets changed in place (and a set live across a graph
break), dicts keyed by classes, the truth of functions, `functools.lru_cache`d helpers, `struct` and
`eval` of literals and thread identifiers folded to constants, `random` generators seeded in the
trace, and typing's generic aliases; and what stays refused, with its message (Python's global
`random`, an unseeded generator, `eval` of names, an lru_cache'd helper that changes state or
returns a list, a Counter of tensors). Helpers: tests/frontend/python_features_support.py.
"""
from __future__ import annotations

import collections
import functools
import random
import struct
import threading
import typing

import pytest
import torch

from kiln.frontend import FullgraphError, compile_function
from tests.frontend.python_features_support import X, _compiled, _equal, check


# --------------------------------------------------------------------------- OrderedDict

def _ordered_dict(x):
    table = collections.OrderedDict(a=1)
    table["b"] = 2
    return x * table["b"], table


def test_ordered_dict():
    check(_ordered_dict, X)


# --------------------------------------------------------------------------- lru_cache

@functools.lru_cache(maxsize=None)
def _head_dim(hidden, heads):
    return hidden // heads


def _uses_cached_helper(x):
    return x * _head_dim(8, 2)


def test_lru_cached_helper_on_constants_is_traced_through():
    check(_uses_cached_helper, X)


_CALLS = []


@functools.lru_cache
def _impure(value):
    _CALLS.append(value)
    return value


def _uses_impure_cached_helper(x):
    return x * _impure(2)


@functools.lru_cache(maxsize=None)
def _squares(count):
    return tuple(i * i for i in range(count))


def _uses_cached_tuple(x):
    first, second = _squares(4), _squares(4)
    return x * sum(first), first is second, second


def test_lru_cached_helper_returning_a_new_tuple_is_one_constant_object():
    compiled = check(_uses_cached_tuple, X)
    _, same, second = compiled(X)
    assert same and second is compiled(X)[2]  # as the cache: one object for the trace and for every call


@functools.lru_cache(maxsize=None)
def _cached_list(count):
    return list(range(count))


def _uses_cached_list(x):
    return x * len(_cached_list(3))


def test_lru_cached_helper_returning_a_new_list_is_refused():
    compiled, _ = _compiled(_uses_cached_list)
    with pytest.raises(FullgraphError, match="a mutable object made by the call"):
        compiled(X)


def test_lru_cached_helper_that_changes_state_is_refused():
    compiled, _ = _compiled(_uses_impure_cached_helper)
    with pytest.raises(FullgraphError, match="changed state"):
        compiled(X)


# --------------------------------------------------------------------------- dicts keyed by classes, truth of functions

_BY_TYPE = {int: 2, float: 3}


def _dict_keyed_by_class(x):
    return x * _BY_TYPE.get(type(1.5), 1)


def test_an_outside_dict_keyed_by_classes_is_read_and_guarded():
    compiled = check(_dict_keyed_by_class, X)
    _BY_TYPE[float] = 7
    try:
        _equal(compiled(X), X * 7)
    finally:
        _BY_TYPE[float] = 3


def _functions_are_true(x):
    return x * (2 if _head_dim and _dict_keyed_by_class and len else 1)


def test_functions_are_true():
    check(_functions_are_true, X)


# --------------------------------------------------------------------------- sets changed in place

def _changes_a_set(x, names):
    names.add("gamma")
    names.discard("alpha")
    names.update(["delta", "beta"])
    return x * len(names)


def test_outside_set_changed_in_place():
    compiled, graphs = _compiled(_changes_a_set)
    for _ in range(2):  # fresh sets equal to the first: the second call reuses the entry
        names, want_names = {"alpha", "beta"}, {"alpha", "beta"}
        _equal(compiled(X, names), _changes_a_set(X, want_names))
        assert names == want_names == {"beta", "gamma", "delta"} and list(names) == list(want_names)
    assert len(graphs) == 1


def _set_live_across_a_break(x):
    names = {"alpha", "beta"}
    value = (x * len(names)).sum().item()  # a graph break: `names` is a live local of the resume function
    names.add("gamma")
    names.remove("beta")
    return x * value * len(names), names


def test_set_live_across_a_break_is_changed_by_the_resume_function():
    from kiln.frontend import stats

    eager_frames = stats.eager_frames
    graphs = []
    compiled = compile_function(_set_live_across_a_break, lambda gm, inputs: (graphs.append(gm), gm.forward)[1])
    for _ in range(2):
        _equal(compiled(X), _set_live_across_a_break(X))
    assert len(graphs) == 2 and stats.eager_frames == eager_frames  # one graph each side, no frame eager


# --------------------------------------------------------------------------- Counter

def _counter(x):
    counts = collections.Counter(["a", "b", "a"])
    counts.update("aab")
    counts["z"] += 2
    del counts["absent"]  # Counter ignores a missing key
    summed = counts + collections.Counter(a=1)
    counts |= collections.Counter(b=1, c=4)  # the larger count, not dict's merge
    return (x * counts["a"] + counts["missing"], counts, summed, counts.most_common(2), counts.total(),
            list(counts.elements()), counts == collections.Counter(counts), collections.Counter(q=3) - summed,
            collections.Counter(a=1, b=0) == collections.Counter(a=1), collections.Counter(a=1) == {"a": 1})


def test_counter_counts_as_python_does():
    check(_counter, X)


def _counter_of_tensors(x):
    counts = collections.Counter()
    counts.update({"a": x})
    return counts


def test_counter_of_tensor_counts_is_refused():
    compiled, _ = _compiled(_counter_of_tensors)
    with pytest.raises(FullgraphError, match="counting"):
        compiled(X)


# --------------------------------------------------------------------------- constant folding of builtins

def _folded_builtins(x):
    packed = struct.pack("<fi", 1.5, 7)
    number, = struct.unpack("<i", packed[4:])
    return x * len(packed) + struct.calcsize("<hh") + number + eval("2 + 3 * 4"), eval(" (1, 'a') ")


def test_struct_and_eval_of_literals_are_folded():
    check(_folded_builtins, X)


def _eval_of_a_name(x):
    return x * eval("len([1])")


def test_eval_of_names_or_calls_is_refused():
    compiled, _ = _compiled(_eval_of_a_name)
    with pytest.raises(FullgraphError, match="eval"):
        compiled(X)


def _thread_ident(x):
    return x + (threading.get_ident() == threading.get_ident())


def test_thread_ident_is_a_constant_guarded_per_thread():
    compiled, made = _compiled(_thread_ident)
    _equal(compiled(X), _thread_ident(X))
    assert len(made) == 1
    results = []
    worker = threading.Thread(target=lambda: results.append(compiled(X)))
    worker.start()
    worker.join()
    _equal(results[0], _thread_ident(X))
    assert len(made) == 2  # another thread's identifier failed the guard: a trace of its own
    compiled(X)
    assert len(made) == 2


# --------------------------------------------------------------------------- random

def _python_random(x):
    return x * random.random()


def test_python_random_is_refused_with_its_reason():
    compiled, _ = _compiled(_python_random)
    with pytest.raises(FullgraphError, match="random number generator"):
        compiled(X)


def _seeded_draws(x):
    generator = random.Random(7)
    draws = [generator.random() for _ in range(3)] + [generator.randint(1, 6), generator.choice("abc")]
    return x * draws[0] + sum(draws[:4]), draws, isinstance(generator, random.Random)


def test_seeded_random_made_in_the_trace_draws_constants():
    compiled = check(_seeded_draws, X)
    _equal(compiled(X), _seeded_draws(X))  # eager makes the same generator, and draws, on every call


def _unseeded_draw(x):
    return x * random.Random().random()


def _escaping_generator(x):
    generator = random.Random(3)
    generator.random()
    return x, generator


@pytest.mark.parametrize("fn, reason", [(_unseeded_draw, "without a constant seed"),
                                        (_escaping_generator, "used after it")])
def test_unseeded_or_escaping_random_generator_is_refused(fn, reason):
    compiled, _ = _compiled(fn)
    with pytest.raises(FullgraphError, match=reason):
        compiled(X)


# --------------------------------------------------------------------------- builtin generic aliases

def _cast_to_generic_aliases(xs, table):
    # torch.optim's foreach code: `cast(list[Tensor], device_params_)`
    first = typing.cast(list[torch.Tensor], xs)[0]
    return first + typing.cast(dict[str, int], table)["n"] + typing.cast(tuple[int, ...], (1, 2))[1]


def test_builtin_generic_aliases():
    check(_cast_to_generic_aliases, [X, X + 1], {"n": 2})
