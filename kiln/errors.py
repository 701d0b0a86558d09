"""The errors kiln raises to its callers, defined below every layer so that any stage may raise them.

`kiln.backend` re-exports them (`from kiln.backend import KilnCompileError` is the public spelling).
"""
from __future__ import annotations


class KilnCompileError(RuntimeError):
    """A graph kiln could not compile (raised under strict mode or fullgraph=True)."""
