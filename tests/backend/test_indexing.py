"""Indexing lowerings (kiln/lowering/indexing.py) on edge-case shapes, against eager."""
from __future__ import annotations

import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph


def _check(fn, *inputs):
    with kiln.config.patch(strict=True):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        result = compiled(*inputs)
    verdict = kiln.testing.compare(result, fn(*inputs))
    assert verdict, verdict.message


def test_gather_with_an_empty_index_of_higher_rank():
    # torch skips the rank check for an empty index; the load's index had 2 dims for a 1-d input
    _check(lambda x, index: (torch.gather(x, 0, index),), torch.randn(5), torch.zeros(2, 0, dtype=torch.int64))


def test_gather_negative_dim():
    _check(lambda x, index: (torch.gather(x, -1, index),), torch.randn(3, 5), torch.randint(0, 5, (3, 4)))
