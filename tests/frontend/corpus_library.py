"""Corpus, part 4: the standard library, NumPy scalars, objects with slots and module-making code that programs
call in a forward (checked by tests/frontend/test_corpus.py, as every corpus program: one graph, no Python on a
cached call, guards neither too loose nor too tight). Found missing by probe programs on 2026-12-04.

Nothing in this file may run during a compiled call: the checker watches for frames from this file.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import itertools
import operator

import numpy as np
import torch

from tests.frontend.corpus_support import program


@program()
def itertools_arrangements(x, y):
    pairs = list(itertools.permutations([x, y], 2)) + list(itertools.pairwise([x, y, x + y]))
    totals = list(itertools.accumulate([x, y, x * y]))
    padded = list(itertools.zip_longest([x], [y, y], fillvalue=x - y))
    return sum(a * b for a, b in pairs) + totals[-1] + padded[1][0], len(list(itertools.combinations(range(4), 2)))


@program()
def sorted_items_by_key(x, y):
    parts = {"second": y, "first": x, "third": x + y}
    ordered = sorted(parts.items())
    by_size = sorted(parts, key=len, reverse=True)
    return [value for _, value in ordered], by_size


@program()
def defaultdict_groups(x, y):
    groups = collections.defaultdict(list)
    for index, row in enumerate([x, y, x * 2, y * 2]):
        groups[index % 2].append(row)
    return torch.stack(groups[0]).sum(0) - torch.stack(groups[1]).sum(0), sorted(groups)


@program()
def set_and_view_operators(x, y):
    names = {"a": x, "b": y}
    shared = names.keys() & {"b", "c"}
    merged = {1, 2} | {3}
    merged -= {1}
    return x * len(merged) + y * len(shared), sorted(merged ^ {5})


@dataclasses.dataclass
class _Settings:
    scale: float = 2.0


@program()
def item_and_attribute_getters(x, y):
    rows = sorted([(2, "b"), (1, "a")], key=operator.itemgetter(0))
    scale = operator.attrgetter("scale")(_Settings())
    return x * scale + y * rows[0][0], rows


@program()
def numpy_constants(x, y):
    return x * float(np.sqrt(x.shape[-1])) + np.float32(0.5) + y * np.exp(0.0)


@program()
def heapq_and_bisect(x, y):
    queue = [(3, "c"), (1, "a"), (2, "b")]
    heapq.heapify(queue)
    heapq.heappush(queue, (0, "z"))
    first = heapq.heappop(queue)
    return x * first[0] + y * bisect.bisect_left([1, 3, 5], 4), heapq.nsmallest(2, [5, 2, 8])


@program()
def dict_fromkeys_flags(x, y):
    seen = dict.fromkeys(range(3), False)
    seen[1] = True
    return x + sum(1 for flag in seen.values() if flag) * y, int.from_bytes(b"\x01\x00", "little")


@program()
def live_dict_views(x, y):
    scores = {"a": x}
    keys = scores.keys()
    scores["b"] = y
    return sum(scores[key] for key in keys), len(keys)


@dataclasses.dataclass(frozen=True, slots=True)
class _FrozenPair:
    left: torch.Tensor
    right: torch.Tensor


@program()
def slotted_objects(x, y):
    pair = _FrozenPair(x, y)
    return pair.left * pair.right, pair


@program()
def pytree_round_trip(x, y):
    leaves, spec = torch.utils._pytree.tree_flatten({"a": x, "b": [y, x + y]})
    return torch.utils._pytree.tree_unflatten([leaf * 2 for leaf in leaves], spec)


@program()
def python_types_as_dtypes(x, y):
    return x.to(float) + torch.tensor(2, dtype=int), (y > 0).to(int)


class _Activation(torch.nn.Module):
    def forward(self, value):
        return torch.nn.functional.silu(value)


@program()
def module_made_in_forward(x, y):
    return _Activation()(x) + torch.nn.ReLU()(y)


@program()
def constant_arithmetic_that_raises(x, y):
    try:
        ratio = 1 / (x.shape[0] - 4)
    except ZeroDivisionError:
        ratio = 0.5
    return x * ratio + y
