"""contextvars.ContextVar read inside a compiled function: `ContextVar.get(var)` of an outside
variable with a value is read at trace time (it raised UnboundLocalError inside the frontend
until the import-cycle refactor, so the frame ran eagerly)."""
from __future__ import annotations

import contextvars

import torch

import kiln

_SCALE = contextvars.ContextVar("scale")
_SCALE.set(3.0)


def _scaled(x):
    return x * contextvars.ContextVar.get(_SCALE)


def test_an_outside_context_variable_is_read_in_one_graph():
    x = torch.arange(3.0)
    with kiln.config.patch(strict=True):
        assert torch.equal(kiln.compile(_scaled, fullgraph=True)(x), _scaled(x))
