"""Shared pytest setup for kiln's tests.

- Without a GPU, Triton kernels run under the Triton interpreter: TRITON_INTERPRET=1 is
  set (unless the environment already says otherwise) before anything imports triton.
- KILN_VERIFY_IR=1: LoopIR is verified after every stage of every compile (unless set otherwise).
- KILN_GRAPH_CACHE=0: every graph is lowered and generated afresh (unless set otherwise).
- Every test starts from the same random state (torch, numpy, random seeded with 0).
- The `models` marker tags the end-to-end model tests (tests/models); `slow` is
  declared in pyproject.toml and is left out of CI (`-m "not slow"`).
"""
from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Every compiled graph is verified at every stage boundary (kiln/backend.py `_check`), strict or not.
os.environ.setdefault("KILN_VERIFY_IR", "1")
# The whole-graph cache would let a test's graph come from an earlier run or test, skipping the stages
# a test patches or inspects; tests/runtime/test_graph_cache.py turns it on in a folder of its own.
os.environ.setdefault("KILN_GRAPH_CACHE", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "models: tiny real models compiled end to end (tests/models)")


@pytest.fixture(autouse=True)
def _seeded_random_state():
    """Each test sees the same random numbers whatever ran before it."""
    random.seed(0)
    torch.manual_seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass
    yield


@pytest.fixture
def kernel_sources(monkeypatch) -> list:
    """The source of every kernel the graphs compiled in the test generate, in order (each graph's
    kernels, from kiln/codegen/wrapper.py's generate_wrapper)."""
    import kiln.codegen.wrapper

    sources: list = []
    generate_wrapper = kiln.codegen.wrapper.generate_wrapper

    def capturing(*args, **kwargs):
        module_source = generate_wrapper(*args, **kwargs)
        sources.extend(module_source.kernels.values())
        return module_source

    monkeypatch.setattr(kiln.codegen.wrapper, "generate_wrapper", capturing)
    return sources
