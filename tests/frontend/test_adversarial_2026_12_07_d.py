"""Adversarial programs (2026-12-07, d): against eager, call after call while the state changes between calls.

Each program runs eagerly and compiled (strict mode unless it must break the graph) on equal copies of its
state; the results and the state left behind must be eager's. Each program says what was once wrong.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from tests.frontend.adversarial_support import check_calls, outcome, plain


def _plain(value):
    return plain(value, _object_form)


def _object_form(value):
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return (type(value).__name__, _plain(_slots(value)))


def _slots(value):
    out = {}
    for name in getattr(type(value), "__slots__", ()):
        try:
            out[name] = getattr(value, name)
        except AttributeError:
            out[name] = "<unset>"
    return out


def _outcome(fn, args):
    return outcome(fn, args, _plain)


def _check_calls(make, calls, strict=True):
    check_calls(make, calls, _plain, strict)


# -- an unset __slots__ member ------------------------------------------------------------------------------------
# Once wrong: reading a slot that holds no value (never set, or deleted) crashed the frontend (its own
# AttributeError while reading the real value), so the frame ran eagerly (and strict mode refused it) instead
# of tracing the program's own `except AttributeError` / hasattr() with a guard that the slot stays unset.

class _Slotted:
    __slots__ = ("a", "b")


def test_unset_slot_read_under_try_and_hasattr():
    def program(x, obj):
        try:
            found = obj.b
        except AttributeError:
            found = -1
        return x * found + hasattr(obj, "b")

    def setting(action):
        def call(state):
            if action == "set3":
                state["obj"].b = 3
            elif action == "set4":
                state["obj"].b = 4
            elif action == "del":
                del state["obj"].b
            return torch.ones(2), state["obj"]
        return call
    _check_calls(lambda: (program, {"obj": _Slotted()}),
                 [setting(None), setting("set3"), setting("set4"), setting("del"), setting(None)])


# -- a user class's data descriptor (not a property) ----------------------------------------------------------
# Once wrong: its value was read for real at trace time (running the descriptor's own __get__) and guarded by
# value, which ran __get__ again on every call: a __get__ that counts its reads counted 2-3 reads per call
# where eager counts one, and a value that changes per read made the compiled result off.

class _CountingDescriptor:
    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        obj.count += 1
        return obj.count

    def __set__(self, obj, value):
        raise AttributeError("read-only")


class _Counted:
    value = _CountingDescriptor()

    def __init__(self):
        self.count = 0

    __slots__ = ("count",)


def test_user_data_descriptor_get_runs_once_per_read():
    def program(x, obj):
        return x * obj.value, obj.count

    _check_calls(lambda: (program, {"obj": _Counted()}), [lambda state: (torch.ones(2), state["obj"])] * 3,
                 strict=False)


# -- descriptors read through a class ---------------------------------------------------------------------------
# Once wrong: `Class.attr` where attr is a user descriptor, or a property of the metaclass, was read for real at
# trace time and then guarded by value, running the user's __get__ / getter again on every call (a counting getter
# gave 1, 5, 7 where eager gives 1, 2, 3).

class _ClassCounter:
    def __init__(self):
        self.count = 0

    def __get__(self, obj, owner=None):
        self.count += 1
        return self.count


class _WithClassCounter:
    counter = _ClassCounter()


class _CountingMeta(type):
    @property
    def reads(cls):
        cls.count += 1
        return cls.count


class _WithCountingMeta(metaclass=_CountingMeta):
    count = 0


def test_user_descriptor_read_through_its_class():
    def program(x):
        return x * _WithClassCounter.counter

    _WithClassCounter.__dict__["counter"].count = 0
    expected = [program(torch.ones(1)).item() for _ in range(3)]
    _WithClassCounter.__dict__["counter"].count = 0
    compiled = kiln.compile(program)
    assert [compiled(torch.ones(1)).item() for _ in range(3)] == expected == [1.0, 2.0, 3.0]


def test_metaclass_property_read_through_the_class():
    def program(x):
        return x * _WithCountingMeta.reads

    _WithCountingMeta.count = 0
    expected = [program(torch.ones(1)).item() for _ in range(3)]
    _WithCountingMeta.count = 0
    compiled = kiln.compile(program)
    assert [compiled(torch.ones(1)).item() for _ in range(3)] == expected == [1.0, 2.0, 3.0]
    assert _WithCountingMeta.count == 3
