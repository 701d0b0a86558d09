"""`wrap`: the one place a real Python value becomes a tracker (and gets its guard).

Given a value and the source it was read from, pick the tracker kind and install
the guard that kind needs: tensor metadata for tensors (which also become graph
inputs), identity for modules, functions, classes and objects, type+value for
constants, type+length for tuples and lists, type for dicts (whose entries are
guarded lazily, when read). Non-constant objects are wrapped once per trace (by
identity), so two reads of the same object share one tracker and its pending
mutations.

Tensors and constants are decided here; every other kind is a registry entry:
`register(kind, maker)` for the instances of a type, tried in registration order
until a maker returns a tracker (None: not this one). kinds.py, at the top of the
package, defines the makers and registers them in order. So this module imports no
tracker module beyond base, and everything that wraps can import it.

`call_handler` is the other registry: callables with a handler of their own
(torch_special's table: is_compiling, grad mode, warnings.warn, ...), consulted by
functions and classes when called.
"""
from __future__ import annotations

import enum
import sys
from typing import Any, Callable

import torch

from kiln.frontend.errors import Unsupported
from kiln.frontend.sources import LocalSource, Source
from kiln.frontend.variables.base import ArgumentConstant, ConstantVariable, Tracer, Variable, is_constant_value

# maker(tx, value, source, guards): guards is the GuardBuilder, or None when the value is not to be guarded
Maker = Callable[[Tracer, Any, "Source | None", Any], "Variable | None"]
SourcelessMaker = Callable[[Tracer, Any], "Variable | None"]
Kind = type | tuple[type, ...]

_MAKERS: list[tuple[Kind, Maker]] = []
_SOURCELESS_MAKERS: list[tuple[Kind, SourcelessMaker]] = []


def register(kind: Kind, maker: Maker) -> None:
    """Instances of `kind` are offered to `maker`, after every maker registered before it."""
    _MAKERS.append((kind, maker))


def register_sourceless(kind: Kind, maker: SourcelessMaker) -> None:
    """Instances of `kind` computed at trace time are offered to `maker` before `wrap` sees them."""
    _SOURCELESS_MAKERS.append((kind, maker))


def wrap(tx: Tracer, value: Any, source: Source | None, guard: bool = True) -> Variable:
    """The tracker for `value`, read from `source` (guarded unless `guard` is False)."""
    output = tx.output
    guards = output.guards if (guard and source is not None) else None
    if isinstance(value, torch.Tensor):
        if source is None:
            raise Unsupported("a tensor reached the trace without a source (cannot make it a graph input)")
        return output.tensor_input(tx, value, source)
    if wraps_as_constant(value):
        if guards is not None:
            if type(value) in (int, float):  # an argument that changes between calls may be a graph input
                symbolic = output.scalar_input(tx, value, source)
                if symbolic is not None:
                    return symbolic
            if isinstance(source, LocalSource):  # an argument: guarded when the trace reads it
                return ArgumentConstant(value, source, guards)
            guards.value(source, value)
        return ConstantVariable(value, source)
    cached = output.wrapped.get(id(value))
    if cached is not None:
        if guards is not None:
            if cached.source is not None and cached.source != source:  # the same object as that one, whichever
                guards.add(source, f"{{}} is not {cached.source.expr()}",
                           f"no longer the same object as {cached.source.expr()}")
            elif cached.source is None:
                guards.identity(source, value)
        return cached
    variable = _first_made(_MAKERS, value, (tx, value, source, guards))
    if variable is None:
        raise Unsupported(f"no tracker kind is registered for {type(value).__qualname__} (kinds.py not imported)")
    output.remember_wrapped(value, variable)
    return variable


def wrap_sourceless(tx: Tracer, value: Any) -> Variable:
    """The tracker for a value computed at trace time (no source, no guard)."""
    if wraps_as_constant(value):
        return ConstantVariable(value)
    variable = _first_made(_SOURCELESS_MAKERS, value, (tx, value))
    if variable is not None:
        return variable
    if isinstance(value, torch.Tensor):
        raise Unsupported("a tensor computed outside the graph during the trace")
    return wrap(tx, value, None, guard=False)


def _first_made(makers: list[tuple[Kind, Callable]], value: Any, arguments: tuple) -> Variable | None:
    for kind, maker in makers:
        if isinstance(value, kind):
            variable = maker(*arguments)
            if variable is not None:
                return variable
    return None


def wraps_as_constant(value: Any) -> bool:
    """Whether `wrap` makes `value` a ConstantVariable: literals, torch.Size, enums, NumPy scalars."""
    if is_constant_value(value) or isinstance(value, torch.Size):
        return True
    return isinstance(value, enum.Enum) or _is_numpy_scalar(value)


def _is_numpy_scalar(value: Any) -> bool:
    """np.float32(2.0) and friends: immutable numbers, guarded by type and value like Python's."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic)


_build_call_handlers: Callable[[], dict[Any, Callable]] | None = None
_call_handlers: dict[Any, Callable] | None = None


def register_call_handlers(build_table: Callable[[], dict[Any, Callable]]) -> None:
    """`build_table()` gives {callable: handler(tx, args, kwargs)}; it runs on the first lookup, since the
    table reads torch attributes that import on first access (torch._dynamo)."""
    global _build_call_handlers, _call_handlers
    _build_call_handlers, _call_handlers = build_table, None


_own_call_handlers: dict[Any, Callable] = {}


def register_call_handler(value: Any, handler: Callable) -> None:
    """One more handler(tx, args, kwargs) for calling `value`: a function of kiln's own that generated code calls
    (a resume function's prologue), registered by the module that defines it."""
    _own_call_handlers[value] = handler


def call_handler(value: Any) -> Callable | None:
    """The special handler for calling `value`, or None when it is an ordinary callable."""
    global _call_handlers
    if _call_handlers is None:
        _call_handlers = {**_build_call_handlers(), **_own_call_handlers}
    try:
        return _call_handlers.get(value) or _own_call_handlers.get(value)
    except TypeError:  # unhashable
        return None
