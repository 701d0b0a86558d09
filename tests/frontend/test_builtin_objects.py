"""Objects of builtin types kiln's frontend does not model (bytearray, deque, array.array): the
reason a frame runs eagerly names the builtin type, not "a user subclass" (which it was, for
`len(deque)`); a real user subclass of a builtin keeps its own reason."""
from __future__ import annotations

import array
import collections

import pytest
import torch

import kiln
from kiln.frontend import FullgraphError


def _scaled_by_length(x, items):
    return x * len(items)


class _Items(list):
    pass


@pytest.mark.parametrize("items, reason", [
    (bytearray(b"abc"), "kiln does not model objects of the builtin type bytearray"),
    (collections.deque([1, 2]), "kiln does not model objects of the builtin type deque"),
    (array.array("i", [1, 2, 3]), "kiln does not model objects of the builtin type array"),
    (_Items([1]), "an instance of a user subclass"),
])
def test_len_of_an_unmodelled_builtin_object_names_its_type(items, reason):
    with kiln.config.patch(strict=True), pytest.raises(FullgraphError, match=reason):
        kiln.compile(_scaled_by_length)(torch.ones(2), items)
