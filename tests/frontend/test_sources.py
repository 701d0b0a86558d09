"""Sources hash once and compare as values; a copy or pickle hashes itself anew."""
from __future__ import annotations

import copy
import pickle

from kiln.frontend.sources import AttrSource, ItemSource, LocalSource, TypeSource


def _deep(depth: int):
    source = LocalSource("self")
    for index in range(depth):
        source = AttrSource(ItemSource(AttrSource(source, "_modules"), str(index)), "weight")
    return source


def test_equal_sources_hash_alike_and_differ_from_others():
    a, b = _deep(6), _deep(6)
    assert a is not b and a == b and hash(a) == hash(b)
    assert {a: 1}[b] == 1
    other = AttrSource(a.parent, "bias")
    assert other != a
    assert TypeSource(a) != a and TypeSource(a) == TypeSource(b)
    assert a != "self" and LocalSource("x") == LocalSource("x") and LocalSource("x") != LocalSource("y")


def test_hash_is_computed_once():
    source = _deep(3)
    first = hash(source)
    assert source.__dict__["_hash"] == first
    assert hash(source) == first


def test_copies_and_pickles_drop_the_cached_hash():
    source = _deep(4)
    hash(source)
    for clone in (copy.deepcopy(source), pickle.loads(pickle.dumps(source))):
        assert "_hash" not in clone.__dict__
        assert clone == source and hash(clone) == hash(source)
        assert clone.expr() == source.expr() == "self._modules['0'].weight._modules['1'].weight._modules['2']" \
                                                ".weight._modules['3'].weight"
