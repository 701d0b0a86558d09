"""Generators and iterators in a traced frame, each checked against eager Python: a generator left
suspended (inside a `try` that cannot catch GeneratorExit, and inside `try/finally`, still refused),
`yield from` with `send` and a return value, `throw` (and into a generator suspended in `yield
from`, refused), user iterator classes, and `contextlib.contextmanager` context managers, also left
by an exception. Helpers: tests/frontend/python_features_support.py.
"""
from __future__ import annotations

import contextlib
import typing

import pytest

from kiln.frontend import FullgraphError
from tests.frontend.python_features_support import X, _compiled, check


# --------------------------------------------------------------------------- generators

class _Layers(typing.Sequence):
    """Iterated by Sequence.__iter__: `yield self[i]` inside `try/except IndexError` until __getitem__ raises."""

    def __init__(self, count):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if index >= self.count:
            raise IndexError(index)
        return index * 10


def _zip_leaves_a_generator_suspended_in_try(x):
    return x + sum(a + b for a, b in zip([1, 2], _Layers(5))), list(_Layers(3))


def test_a_generator_suspended_in_a_try_that_cannot_catch_generator_exit_may_be_dropped():
    check(_zip_leaves_a_generator_suspended_in_try, X)


def _with_cleanup(log):
    try:
        yield 1
        yield 2
    finally:
        log.append("closed")  # runs when the suspended generator is dropped


def _abandons_generator_with_finally(x):
    return x + next(_with_cleanup([]))


def test_a_generator_suspended_in_try_finally_is_still_refused():
    compiled, _ = _compiled(_abandons_generator_with_finally)
    with pytest.raises(FullgraphError, match="left suspended inside a try/with"):
        compiled(X)


def _inner():
    received = yield 1
    yield received * 2
    return "done"


def _delegating(log):
    result = yield from _inner()
    log.append(result)
    yield from [7, 8]


def _yield_from(x):
    log = []
    generator = _delegating(log)
    first = next(generator)
    second = generator.send(5)
    rest = list(generator)
    return x * (first + second), rest, log


def test_yield_from_delegates_values_sends_and_return_value():
    check(_yield_from, X)


# --------------------------------------------------------------------------- iterators, context managers

class _Countdown:
    def __init__(self, start):
        self.current = start

    def __iter__(self):
        return self

    def __next__(self):
        if self.current == 0:
            raise StopIteration
        self.current -= 1
        return self.current


def _user_iterator(x):
    return x + sum(_Countdown(4)), [value for value in _Countdown(2)]


def test_user_iterator_class():
    check(_user_iterator, X)


@contextlib.contextmanager
def _scaled(log, factor):
    log.append("enter")
    yield factor
    log.append("exit")


def _generator_context_manager(x):
    log = []
    with _scaled(log, 3) as factor:
        x = x * factor
    return x, log


def test_contextlib_contextmanager():
    check(_generator_context_manager, X)


@contextlib.contextmanager
def _guarded_section(log):
    try:
        yield
    except KeyError:
        log.append("handled in the generator")  # swallows it: the with block's exception goes no further
    finally:
        log.append("cleanup")


def _context_manager_left_by_exceptions(x):
    log = []
    with _guarded_section(log):
        raise KeyError("swallowed by the generator")
    try:
        with _guarded_section(log):
            raise ValueError("passes through the generator")
    except ValueError as error:
        log.append(error.args[0])
    return x + len(log), log


def test_contextmanager_left_by_an_exception_throws_it_into_the_generator():
    check(_context_manager_left_by_exceptions, X)


def _catcher():
    caught = []
    while True:
        try:
            yield len(caught)
        except ValueError as error:
            caught.append(error.args[0])
            if len(caught) == 2:
                return caught


def _generator_throw(x):
    generator = _catcher()
    next(generator)
    first = generator.throw(ValueError("one"))
    try:
        generator.throw(ValueError("two"))
    except StopIteration as stop:
        result = stop.args
    return x * first, result


def test_generator_throw():
    check(_generator_throw, X)


def _delegate_to_catcher():
    yield from _catcher()


def _throw_into_yield_from(x):
    generator = _delegate_to_catcher()
    next(generator)
    return x * generator.throw(ValueError("for the delegate"))


def test_throw_into_a_generator_suspended_in_yield_from_is_refused():
    compiled, _ = _compiled(_throw_into_yield_from)
    with pytest.raises(FullgraphError, match="suspended in `yield from`"):
        compiled(X)
