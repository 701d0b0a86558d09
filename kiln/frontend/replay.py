"""Calls made for their effect outside the graph (warnings.warn, logging, print), replayed after it.

These calls compute nothing the graph needs, so they need no graph break: the trace records
each one (`SideEffects.replay_call`) with its arguments captured as constants when
it was traced, and the entry function makes it again after the graph runs, in
program order. What Python would decide at the moment of the call is decided at
run time, as in eager: the warning filters and the `__warningregistry__` of the
module the warning is attributed to ("once per location" holds across calls), a
logger's level, handlers and `logging.disable`, `sys.stdout` for print.

The location a warning or log record names (file, line, function) is that of the
Python frame Python itself would pick, following `stacklevel` up the interpreted
frames (`Frame.python_caller`); when it lies outside what kiln interpreted (above
the compiled function, or behind nn.Module's call machinery) the frame is refused,
runs eagerly, and says so.

Arguments must be known at trace time: a tensor (whose value exists only once the
graph ran) or a user object (whose text kiln does not guard) is unsupported here, so the
call becomes a graph break (kiln/frontend/resume.py) and is made in Python between two graphs.
"""
from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

from kiln.frontend.errors import Unsupported
from kiln.frontend.variables.base import Variable
from kiln.frontend.variables.objects import UserObjectVariable
from kiln.frontend.variables.tensor import TensorVariable, contains_tensor


class HeldValue(Variable):
    """A Python value captured at trace time; the entry function holds it by name."""

    def __init__(self, value: Any):
        self.value = value

    def describe(self) -> str:
        return f"held {type(self.value).__name__}"

    def reconstruct(self, codegen) -> str:
        return codegen.constant(self.value)


def snapshot(variable: Variable, what: str) -> HeldValue:
    """The value of a tensor-free constant tracker, as it is now (the replayed call sees this value)."""
    if isinstance(variable, TensorVariable) or contains_tensor(variable):
        raise Unsupported(f"{what} with a tensor argument: its value exists only after the graph runs")
    if isinstance(variable, UserObjectVariable) or not variable.is_constant():
        raise Unsupported(f"{what} with {variable.describe()} as an argument (only values known at trace time "
                          "can be replayed after the graph)")
    return HeldValue(variable.as_constant())


def caller_location(tx, stacklevel: int, what: str) -> tuple[str, int, str, dict]:
    """(filename, line, function name, module globals) of the frame `stacklevel` 1 names: `tx` itself."""
    frame = tx.python_caller(max(stacklevel, 1) - 1)
    if frame is None:
        raise Unsupported(f"{what} with stacklevel={stacklevel} names a frame outside what kiln interpreted "
                          "(the compiled function's caller, or nn.Module's call machinery)", breakable=False)
    return frame.code.co_filename, frame.lineno(), frame.code.co_name, frame.fn_globals


def warn(message: Any, category: type, filename: str, lineno: int, module_globals: dict) -> None:
    """`warnings.warn` as made from `filename:lineno` in the module of `module_globals`.

    What CPython's `warnings.warn` does after finding the frame: the module name and the
    registry come from that frame's globals, so "default"/"once" filters see one location.
    """
    registry = module_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, filename, lineno, module_globals.get("__name__", "<string>"), registry)


def log(logger: logging.Logger | logging.LoggerAdapter, level: int, message: Any, args: tuple,
        location: tuple[str, int, str], options: dict, configure_root: bool = False) -> None:
    """`logger.log(level, message, *args, **options)` as made from `location` (file, line, function).

    Mirrors `Logger._log` with `findCaller`'s answer given: the level is checked now (it may
    have changed since the trace), a LoggerAdapter's `process` runs now, and the module
    functions (`logging.warning(...)`) configure the root logger first when it has no handler.
    """
    if configure_root and not logging.root.handlers:
        logging.basicConfig()
    options = dict(options)
    if isinstance(logger, logging.LoggerAdapter):
        if not logger.isEnabledFor(level):
            return
        message, options = logger.process(message, options)
        logger = logger.logger
    if not logger.isEnabledFor(level):
        return
    options.pop("stacklevel", None)
    exc_info = options.pop("exc_info", None)
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
    filename, lineno, function = location if getattr(logging, "_srcfile", True) else \
        ("(unknown file)", 0, "(unknown function)")
    record = logger.makeRecord(logger.name, level, filename, lineno, message, args, exc_info, function,
                               options.pop("extra", None), None)
    logger.handle(record)
