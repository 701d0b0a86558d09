"""What a graph break's call sees of its caller (kiln/frontend/resume.py, guards.compile_function `stand_in`).

A breaking entry stands in for the program's frame: its file, function name, the break's line and its globals.
`sys._getframe` breaks, and the entry makes that call itself; C functions, classes and library functions are
called from the entry too. What reads the caller's locals (`locals()`, `vars()`, `dir()`, `eval`/`exec` without
namespaces) runs the frame eagerly, since only the program's own frame has them.
"""
from __future__ import annotations

import collections
import os
import sys
import traceback

import pytest
import torch

from tests.frontend.test_graph_breaks import _compile, _eager_frames_and_breaks


def reads_its_own_frame(x):
    a = x * 2
    frame = sys._getframe()  # the break's call, made from the entry: the frame that stands in for this one
    # (its f_lineno stays the break's line, where eager's moves on: read it on the line of the call)
    seen = frame.f_code.co_name, frame.f_code.co_filename, sys._getframe().f_lineno, frame.f_globals is globals()
    return a + 1, seen


def _callers_frame():
    frame = sys._getframe(1)
    return frame.f_code.co_name, frame.f_code.co_filename, frame.f_lineno, frame.f_globals is globals()


def helper_reads_its_callers_frame(x):
    a = x.cos()
    seen = _callers_frame()
    return a - 1, seen


def makes_a_namedtuple(x):
    a = x + 1
    sys._getframe()
    Pair = collections.namedtuple("Pair", "left right")  # names its module from its caller's frame
    return Pair(a, a * 2), Pair.__module__


@pytest.mark.parametrize("fn", [reads_its_own_frame, helper_reads_its_callers_frame, makes_a_namedtuple])
def test_frame_introspection_breaks_and_sees_the_programs_file_name_line_and_globals(fn):
    """`sys._getframe` is a break whose call the entry makes itself, and the entry stands in for the frame
    (its file, function name, the break's line, the module's globals): what eager's frame reports."""
    compiled, graphs = _compile(fn)
    x = torch.randn(3)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    expected, result = fn(x), compiled(x)
    torch.testing.assert_close(result[0], expected[0])
    assert result[1] == expected[1], (result[1], expected[1])
    assert graphs and report.break_count >= 1 and not report.eager_frames


def lists_its_locals(x):
    y = x + 1
    return y, sorted(locals())


def evaluates_a_local(x):
    y = x + 1
    return eval("y * 2")


def lists_its_variables(x):
    y = x * 3
    return y, sorted(vars()), sorted(dir())


def reads_its_globals(x):
    y = x - 1
    return y, globals() is sys.modules[__name__].__dict__


@pytest.mark.parametrize("fn", [lists_its_locals, evaluates_a_local, lists_its_variables, reads_its_globals])
def test_what_reads_the_callers_namespace_sees_the_programs(fn):
    """`locals()`, `vars()`, `dir()` and `eval` without namespaces read the calling frame's locals, which only the
    program's own frame has: that frame runs eagerly (no break, whose call the entry would make). `globals()` is a
    break: the entry runs with the program's globals. (Made from `call_compiled`, all of them read kiln's frame.)"""
    compiled, _ = _compile(fn)
    x = torch.randn(3)
    result, expected = compiled(x), fn(x)
    if isinstance(expected, tuple):
        torch.testing.assert_close(result[0], expected[0])
        assert result[1:] == expected[1:]
    else:
        torch.testing.assert_close(result, expected)


def test_an_error_at_a_break_names_the_programs_file_and_line():
    def broken(x):
        y = x * 2
        return y + len(os.listdir(f"/no/such/directory/{y.shape[0]}"))  # the broken call raises

    compiled, _ = _compile(broken)
    with pytest.raises(FileNotFoundError) as raised:
        compiled(torch.randn(2))
    frames = [(entry.name, entry.filename, entry.lineno) for entry in traceback.extract_tb(raised.value.__traceback__)]
    line = broken.__code__.co_firstlineno + 2
    assert ("broken", __file__, line) in frames, frames
