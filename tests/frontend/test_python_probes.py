"""Probe programs whose side effects (a global log, a global counter) must happen as eager's, in order, with eager's
result, and no frame run eagerly (2026-12-05 probes; the pure ones are in corpus_probes.py)."""
from __future__ import annotations

import contextlib
import sys

import pytest
import torch

import kiln
from kiln.debug.explain import explain

LOG: list = []
COUNTER = 0


def _reset():
    global COUNTER
    LOG.clear()
    COUNTER = 0


@contextlib.contextmanager
def _logged(tag):
    LOG.append("enter " + tag)
    try:
        yield tag * 2
    finally:
        LOG.append("exit " + tag)


def _exit_stack_in_order(x):
    with contextlib.ExitStack() as stack:
        tag = stack.enter_context(_logged("a"))
        stack.callback(LOG.append, "callback")
        LOG.append(tag)
        x = x * 2
    return x + 1


def _exit_stack_reraises_to_the_program(x):
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(LOG.append, "callback")
            stack.enter_context(_logged("b"))
            raise KeyError("k")
    except KeyError as error:
        LOG.append(str(error))
    return x + 1


def _counter_and_generator_steps(x):
    global COUNTER

    def steps():
        for index in range(5):
            LOG.append(("step", index))
            yield index

    for value in steps():
        if value == 2:
            break
        COUNTER += value
    COUNTER += 10
    return x * COUNTER


def _exc_info_inside_a_handler(x):
    try:
        raise ValueError("inner")
    except ValueError:
        LOG.append(sys.exc_info()[0].__name__)
    LOG.append(sys.exc_info()[0])
    return x + 1


def _closes_generators_with_cleanup(x):  # was: a graph break at each close()
    def with_finally():
        try:
            yield 1
            yield 2
        finally:
            LOG.append("finally")

    def catches_exit():
        try:
            yield 3
        except GeneratorExit:
            LOG.append("caught exit")
            return

    def with_block():
        with _logged("g"):
            yield 4

    first, second, third = with_finally(), catches_exit(), with_block()
    total = next(first) + next(second) + next(third)
    for generator in (first, second, third):
        generator.close()
    first.close()  # closed already: nothing runs
    return x * total, list(first)


@pytest.mark.parametrize("program", [_exit_stack_in_order, _exit_stack_reraises_to_the_program,
                                     _counter_and_generator_steps, _exc_info_inside_a_handler,
                                     _closes_generators_with_cleanup])
def test_side_effects_in_eager_order(program):
    x = torch.randn(3)
    _reset()
    expected = program(x), list(LOG), COUNTER
    _reset()
    report = explain(program, x)
    assert report.graph_count == 1 and report.break_count == 0 and not report.eager_frames, str(report)
    _reset()
    actual = kiln.compile(program, fullgraph=True)(x), list(LOG), COUNTER
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1:] == expected[1:]


def test_exc_info_of_a_caller_handling_an_exception():
    """sys.exc_info() with no handler running in the trace is guarded: a caller inside an `except` clause makes
    Python's answer its exception, so such a call does not reuse the entry traced outside one."""
    def program(x):
        return x + 1, sys.exc_info()[0]

    compiled = kiln.compile(program)
    assert compiled(torch.ones(1))[1] is None
    try:
        raise IndexError
    except IndexError:
        assert compiled(torch.ones(1))[1] is IndexError


class _Plain:
    def __init__(self):
        self.a = 1


def test_vars_of_a_new_object_returned_is_its_own_dict():
    """vars(obj) of an object made in the trace, returned with it, is the rebuilt object's own __dict__ (returning
    it ran the whole frame eagerly)."""
    def program(x):
        made = _Plain()
        attributes = vars(made)
        attributes["b"] = 2
        del made.a
        return x + 1, attributes, made

    report = explain(program, torch.ones(2))
    assert report.graph_count == 1 and not report.eager_frames, str(report)
    _, attributes, made = kiln.compile(program, fullgraph=True)(torch.ones(2))
    assert attributes is vars(made) and attributes == {"b": 2}
