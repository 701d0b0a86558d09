"""Standard-library calls common in model and training code, captured whole (fullgraph=True) with eager's results:
itertools' arranging functions and accumulate, sorted() with a key, collections.defaultdict made in the trace,
set operators (sets, frozensets, dict key views), operator.itemgetter / attrgetter, NumPy ufuncs and scalar types on
constants. Each was a graph break (sorted over dict items, a set operator and a dict key view: the whole frame ran
eagerly) before 2026-12-04."""
from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import itertools
import operator

import numpy as np
import pytest
import torch

import kiln


def _same(expected, actual):
    expected_leaves, actual_leaves = (torch.utils._pytree.tree_leaves(value) for value in (expected, actual))
    assert len(expected_leaves) == len(actual_leaves)
    for want, got in zip(expected_leaves, actual_leaves):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want)
        else:
            assert type(got) is type(want) and got == want


def _itertools(x):
    totals = list(itertools.accumulate([1, 2, 3]))
    products = list(itertools.accumulate([x, x, x], operator.mul, initial=x))
    pairs = list(itertools.permutations([x, 2 * x], 2)) + list(itertools.combinations([1, 2, 3], 2))
    padded = list(itertools.zip_longest([x, x], [1], fillvalue=x + 1))
    return x * sum(totals), products[-1], [a * b for a, b in pairs[:2]], padded[1][1], \
        list(itertools.pairwise("abc")), list(itertools.repeat(x, 2))[1], \
        list(itertools.combinations_with_replacement([1, 2], 2))


def _sorted(x):
    scores = {"b": 2, "a": 1, "c": 3, "d": 2}
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    by_tensor_rank = sorted([x, x.t(), x[:1]], key=lambda t: t.dim() * 10 + t.shape[0])
    return ranked, x * ranked[0][1], [t.shape for t in by_tensor_rank], sorted([3, 1, 2], reverse=True)


def _defaultdict(x):
    groups = collections.defaultdict(list)
    for index in range(4):
        groups[index % 2].append(x * index)
    counts = collections.defaultdict(int, {"seen": 1})
    counts["new"] += 2
    return sum(groups[0]) + sum(groups[1]), dict(counts), type(groups) is collections.defaultdict


def _sets(x):
    mapping = {"a": 1, "b": 2}
    seen = {1, 2}
    seen |= {3}
    union, both, rest, either = {1, 2} | {3}, mapping.keys() & {"b", "z"}, frozenset({1, 2}) - {2}, {1, 2} ^ {2, 3}
    return x * (len(union) + len(seen)), both, rest, either, seen


@dataclasses.dataclass
class _Config:
    scale: float = 2.0
    inner: "_Config | None" = None


def _getters(x):
    second = operator.itemgetter(1)
    pair = operator.itemgetter(0, 2)
    nested = operator.attrgetter("inner.scale")
    config = _Config(inner=_Config(scale=3.0))
    return x * second([1, 5, 9]) + sum(pair([1, 5, 9])) * nested(config), sorted([(2, "b"), (1, "a")], key=second)


def _numpy(x):
    return x * float(np.sqrt(x.shape[-1])) + np.float32(1.5) + np.exp(0.0)


@pytest.mark.parametrize("program", [_itertools, _sorted, _defaultdict, _sets, _getters, _numpy])
def test_captured_whole_with_eager_results(program):
    x = torch.randn(3, 3)
    _same(program(x.clone()), kiln.compile(program, fullgraph=True)(x.clone()))


def test_an_outside_set_updated_in_place_by_an_operator():
    seen = {1}

    def program(x):
        nonlocal_seen = seen
        nonlocal_seen |= {2, 3}
        return x + len(nonlocal_seen)

    torch.testing.assert_close(kiln.compile(program, fullgraph=True)(torch.zeros(2)), torch.full((2,), 3.0))
    assert seen == {1, 2, 3}


def test_sorted_by_values_known_only_at_run_time_breaks():
    def program(x):
        order = sorted([x.sum(), x.max()])
        return order[0] + 1

    with pytest.raises(kiln.frontend.FullgraphError, match="sorted"):
        kiln.compile(program, fullgraph=True)(torch.randn(4))
    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(program)(x), program(x))


def _divide_or_fallback(x, divisor: int):
    try:
        ratio = 10 / divisor
    except ZeroDivisionError:
        ratio = -1.0
    return x * ratio


def _suppressed(x, divisor: int):
    import contextlib

    ratio = 3
    with contextlib.suppress(ZeroDivisionError):
        ratio = 10 // divisor
    return x * ratio


@pytest.mark.parametrize("program", [_divide_or_fallback, _suppressed])
def test_arithmetic_on_constants_raises_to_the_programs_handler(program):
    """`10 / 0` on constants raises ZeroDivisionError inside the trace, to the program's own handler (a try, or
    contextlib.suppress): captured whole (it was a graph break, and inside suppress the frame ran eagerly)."""
    compiled = kiln.compile(program, fullgraph=True)
    for divisor in (0, 2):
        torch.testing.assert_close(compiled(torch.ones(2), divisor), program(torch.ones(2), divisor))


def test_arithmetic_on_constants_raises_out_of_the_frame():
    def program(x, divisor: int):
        return x * (10 // divisor)

    with pytest.raises(ZeroDivisionError):
        kiln.compile(program)(torch.ones(2), 0)


def test_sorted_items_holding_tensors_orders_by_the_known_parts():
    """`sorted(d.items())` of str keys and tensor values: Python never compares the tensors (the keys differ)."""
    def program(x):
        parts = {f"k{index}": x * index for index in (2, 0, 1)}
        total = 0
        for key, value in sorted(parts.items()):
            total = total + value.sum() * int(key[1:])
        return total, [key for key, _ in sorted(parts.items(), reverse=True)]

    x = torch.randn(3)
    _same(program(x), kiln.compile(program, fullgraph=True)(x))


def test_sorted_that_compares_a_tensor_breaks_and_type_errors_raise():
    def ties(x):
        return sorted([("a", x), ("a", x + 1)])[0][1] * 2

    def mixed(x):
        return x * len(sorted([1, "a"]))

    x = torch.randn(3)
    with pytest.raises(kiln.frontend.FullgraphError, match="sorted"):
        kiln.compile(ties, fullgraph=True)(x)
    with pytest.raises(TypeError):
        kiln.compile(mixed)(x)


_QUEUE = [5, 1, 4]


def _heaps(x):
    local = [(3, "c"), (1, "a"), (2, "b")]
    heapq.heapify(local)
    heapq.heappush(local, (0, "z"))
    first = heapq.heappop(local)
    heapq.heapify(_QUEUE)
    heapq.heappush(_QUEUE, 2)
    smallest = heapq.heappop(_QUEUE)
    return x * smallest + first[0] + bisect.bisect_left([1, 3, 5], 4), local, heapq.nlargest(2, [3, 9, 1]), heapq.nsmallest(1, [(2, x), (1, x * 2)],
                                                                                         key=lambda item: item[0])


def test_heapq_on_lists_of_known_values():
    """heapq on a local list and on a global one (its reordering replayed on the real list), nsmallest with a key
    over tuples holding tensors."""
    global _QUEUE
    x = torch.randn(3)
    _QUEUE = [5, 1, 4]
    expected, expected_queue = _heaps(x), list(_QUEUE)
    _QUEUE = [5, 1, 4]
    actual = kiln.compile(_heaps, fullgraph=True)(x)
    _same(expected, actual)
    assert _QUEUE == expected_queue


_SETTINGS = {"a": 1}


def _views_after_mutation(x):
    local = {"a": 1}
    keys, items = local.keys(), local.items()
    local["b"] = 2
    values = _SETTINGS.values()
    _SETTINGS["c"] = 5
    return x * len(keys) + sum(values), list(keys), list(items), keys


def test_dict_views_are_live():
    """A dict's keys/values/items view sees later changes to the dict, as Python's does (kiln's views were
    snapshots: len(keys) after d[k] = v was the old length, a silent wrong answer); a returned view is a view of
    the returned dict."""
    x = torch.ones(2)
    _SETTINGS.clear()
    _SETTINGS["a"] = 1
    expected = _views_after_mutation(x)
    _SETTINGS.clear()
    _SETTINGS["a"] = 1
    actual = kiln.compile(_views_after_mutation, fullgraph=True)(x)
    _same(expected[:3], actual[:3])
    assert type(actual[3]) is type({}.keys()) and list(actual[3]) == ["a", "b"]
    assert _SETTINGS == {"a": 1, "c": 5}


def test_a_dict_view_live_across_a_graph_break():
    def program(x):
        scores = {"a": x, "b": x * 2}
        names = scores.keys()
        print(x.sum())  # a graph break with the view live
        scores["c"] = x * 3
        return sum(scores[name] for name in names), len(names)

    x = torch.randn(3)
    _same(program(x), kiln.compile(program)(x))


def test_defaultdict_with_a_factory_that_is_not_callable_raises_typeerror():
    def program(x):
        return x + len(collections.defaultdict(3))

    with pytest.raises(TypeError):
        kiln.compile(program)(torch.ones(2))


def test_heappop_of_an_empty_heap_raises_the_programs_indexerror():
    def program(x):
        try:
            heapq.heappop([])
        except IndexError:
            return x + 1
        return x

    torch.testing.assert_close(kiln.compile(program, fullgraph=True)(torch.ones(2)), torch.full((2,), 2.0))
