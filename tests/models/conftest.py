"""Setup for the end-to-end model tests: a clean compiler and strict mode for each test.

Strict mode (`kiln.config.patch(strict=True)`) makes a graph kiln cannot compile raise
instead of silently running eagerly, so a passing test means kiln compiled it.
`kiln.reset()` before each test keeps compiled graphs of one test from counting towards
the recompile limit of the next (all the models share `forward` code objects).
"""
from __future__ import annotations

import pytest

import kiln


@pytest.fixture(autouse=True)
def _strict_fresh_kiln():
    kiln.reset()
    with kiln.config.patch(strict=True):
        yield
    kiln.reset()
