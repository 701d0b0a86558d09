"""Effectful ops (AOTAutograd's `with_effects`): the op runs as an extern, in order.

linalg.inv/solve/cholesky check their results with `_linalg_check_errors` under an
effect token; that extern was printed into the wrapper with the op object as an
argument (`<OpOverload(...)>`), a syntax error.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph


def _compile(fn, *inputs):
    with kiln.config.patch(strict=True):
        return compile_graph(torch.fx.symbolic_trace(fn), list(inputs))


@pytest.mark.parametrize("fn", [lambda a: (torch.linalg.inv(a),),
                                lambda a: (torch.linalg.cholesky(a @ a.mT + 4 * torch.eye(4)),)])
def test_checked_linalg_matches_eager(fn):
    a = torch.randn(2, 4, 4)
    compiled = _compile(fn, a)
    verdict = kiln.testing.compare(compiled(a), fn(a))
    assert verdict, verdict.message


# torch 2.11's AOTAutograd dropped `_linalg_check_errors` from the graph (torch.compile with Inductor
# returns the singular matrix's inverse without raising there); kiln/_torch.py marks it effectful, as
# torch 2.13 does, so the check stays under an effect token on both versions.
def test_checked_linalg_still_raises():
    compiled = _compile(lambda a: (torch.linalg.inv(a),), torch.randn(3, 3))
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(torch.zeros(3, 3))
