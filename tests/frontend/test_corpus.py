"""Every corpus program, through kiln's frontend with the `eager` backend rung.

For each program (tests/frontend/corpus_basic.py, corpus_objects.py, corpus_effects.py, corpus_library.py, corpus_probes.py) the
checker asks:
1. the compiled result equals eager's;
2. the first call made exactly one graph and no eager fallback;
3. the second call does not run the program's Python body (no frame from a corpus
   file starts while it runs: watched with sys.settrace, so it sees any Python,
   including side-effect-free code that a counter could not observe);
4. a change that does not affect what the trace read reuses the entry: the program's
   own `stable` change (by default: new tensor values), then, for every program, a
   global of its module that it never reads is added and rebound;
5. a change to a guarded value (by default: the first tensor becomes float64)
   recompiles exactly once, and the new entry is right too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys

import pytest
import torch

from kiln.backend import graph_compiler
from kiln.frontend import compile_function
from tests.frontend import corpus_basic, corpus_effects, corpus_library, corpus_objects, corpus_probes
from tests.frontend.corpus_support import PROGRAMS

CORPUS_FILES = {corpus_basic.__file__, corpus_objects.__file__, corpus_effects.__file__, corpus_library.__file__,
                corpus_probes.__file__}


def copy_arguments(value):
    """Fresh copies of tensors and containers; other objects are shared (their identity may be guarded)."""
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_(value.requires_grad)
    if isinstance(value, list):
        return [copy_arguments(item) for item in value]
    if isinstance(value, tuple):
        return tuple(copy_arguments(item) for item in value)
    if isinstance(value, dict):
        return {key: copy_arguments(item) for key, item in value.items()}
    return value


def assert_same(actual, expected, path="result"):
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} vs {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, path
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True, msg=path)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for index, (a, b) in enumerate(zip(actual, expected)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same(getattr(actual, field.name), getattr(expected, field.name), f"{path}.{field.name}")
    else:
        assert actual == expected, path


@contextlib.contextmanager
def watch_corpus_frames():
    """Collects the names of corpus functions that start running inside the block."""
    started: list[str] = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in CORPUS_FILES:
            started.append(frame.f_code.co_qualname)
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield started
    finally:
        sys.settrace(previous)


def run_and_compare(compiled, program, args):
    expected = program.fn(*copy_arguments(args))
    actual = compiled(*copy_arguments(args))
    assert_same(actual, expected)


def test_corpus_is_large_enough():
    assert len(PROGRAMS) >= 150
    assert len({program.name for program in PROGRAMS}) == len(PROGRAMS)


@pytest.mark.parametrize("program", PROGRAMS, ids=[program.name for program in PROGRAMS])
def test_program(program):
    graphs = []
    eager_rung = graph_compiler("eager")

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return eager_rung(gm, example_inputs)

    compiled = compile_function(program.fn, counting_backend)
    args = program.make_args()
    run_and_compare(compiled, program, args)
    assert compiled.entries[0].eager_reason is None, compiled.entries[0].eager_reason
    assert len(graphs) == 1 and len(compiled.entries) == 1

    with watch_corpus_frames() as started:
        compiled(*copy_arguments(args))
    assert started == [], f"Python of the program ran on a cached call: {started}"

    stable_args, undo = program.stable(args)
    try:
        run_and_compare(compiled, program, stable_args)
        assert len(compiled.entries) == 1, compiled.entries[0].guard(*stable_args)
    finally:
        if undo:
            undo()

    module_globals = program.fn.__globals__
    try:
        for value in (1, 2.5, "rebound"):  # unrelated outside state: no guard may read it
            module_globals["UNRELATED_GLOBAL"] = value
            run_and_compare(compiled, program, args)
        assert len(compiled.entries) == 1, compiled.entries[0].guard(*args)
    finally:
        module_globals.pop("UNRELATED_GLOBAL", None)

    changed_args, undo = program.guarded(args)
    try:
        assert compiled.entries[0].guard(*changed_args) is not None, "the guarded change passes the guards"
        run_and_compare(compiled, program, changed_args)
        assert len(compiled.entries) == 2 and len(graphs) == 2
        assert compiled.entries[0].eager_reason is None, compiled.entries[0].eager_reason
    finally:
        if undo:
            undo()
