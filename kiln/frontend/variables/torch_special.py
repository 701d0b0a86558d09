"""torch (and a few library) callables the interpreter models instead of calling or inlining.

- "am I compiling?" queries: `torch.compiler.is_compiling()` is True inside a kiln
  trace (libraries use it to pick compile-friendly code paths); scripting/tracing
  queries are False.
- grad mode and autocast as context managers (`no_grad`, `enable_grad`,
  `set_grad_enabled`, `autocast`): entering one changes the mode for the rest of
  the trace (so fake tensors see it) and puts the same change into the graph.
- constant constructors (`torch.Size`, `torch.device`, `torch.finfo`, ...) run at
  trace time on constant arguments.
- logging and `warnings.warn` are dropped (they print, they do not compute).
"""
from __future__ import annotations

import contextlib
import inspect
import typing
import warnings
from typing import Any, Callable

import torch

from kiln.frontend.errors import Unsupported
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable


def _constant(value):
    return lambda tx, args, kwargs: ConstantVariable(value)


def _constant_call(fn):
    def handler(tx, args, kwargs):
        try:
            values = [arg.as_constant() for arg in args]
            keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"{fn.__qualname__} with non-constant arguments") from None
        return ConstantVariable(fn(*values, **keywords))

    return handler


def _grad_mode(enabled: bool):
    return lambda tx, args, kwargs: GradModeVariable(enabled)


def _set_grad_enabled(tx, args, kwargs):
    mode = GradModeVariable(bool(args[0].as_constant()))
    mode.apply_now(tx)  # set_grad_enabled(False) as a call takes effect at once, even outside `with`
    return mode


def _is_grad_enabled(tx, args, kwargs):
    return ConstantVariable(torch.is_grad_enabled())


def _autocast(tx, args, kwargs):
    values = [arg.as_constant() for arg in args]
    keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
    return AutocastVariable(torch.autocast(*values, **keywords))


def _ignored(tx, args, kwargs):
    return NONE


def _cast(tx, args, kwargs):
    return args[1]


def _module_call(tx, args, kwargs):
    from kiln.frontend.variables.modules import ModuleVariable, call_module

    if not args or not isinstance(args[0], ModuleVariable):
        raise Unsupported("nn.Module.__call__ on something that is not a module")
    return call_module(tx, args[0], list(args[1:]), kwargs, own_call=True)


def _check(tx, args, kwargs):
    condition = args[0]
    if condition.is_constant() and condition.as_constant():
        return NONE
    raise Unsupported("torch._check on a value not known at trace time")


def real_callable(variable: Variable) -> Any:
    """The real Python callable a tracker stands for (for introspection such as inspect.signature)."""
    from kiln.frontend.variables.functions import BoundMethodVariable

    if isinstance(variable, BoundMethodVariable):
        import types

        return types.MethodType(real_callable(variable.function), real_callable(variable.bound_self))
    for attribute in ("fn", "value"):
        if hasattr(variable, attribute):
            return getattr(variable, attribute)
    raise Unsupported(f"introspecting {variable.describe()}")


def _signature(tx, args, kwargs):
    return ConstantVariable(inspect.signature(real_callable(args[0])))


def _nullcontext(tx, args, kwargs):
    return NullContextVariable(args[0] if args else NONE)


def _build_table() -> dict[Any, Callable]:
    from kiln.frontend.variables.modules import _MODULE_CALLS

    table: dict[Any, Callable] = {
        torch.compiler.is_compiling: _constant(True),
        torch.compiler.is_dynamo_compiling: _constant(True),
        torch._dynamo.is_compiling: _constant(True),
        torch.jit.is_scripting: _constant(False),
        torch.jit.is_tracing: _constant(False),
        torch._C._get_tracing_state: _constant(None),
        torch.no_grad: _grad_mode(False),
        torch.enable_grad: _grad_mode(True),
        torch.set_grad_enabled: _set_grad_enabled,
        torch.is_grad_enabled: _is_grad_enabled,
        torch.autocast: _autocast,
        torch.amp.autocast: _autocast,
        torch.Size: _constant_call(torch.Size),
        torch.device: _constant_call(torch.device),
        torch.finfo: _constant_call(torch.finfo),
        torch.iinfo: _constant_call(torch.iinfo),
        torch.get_default_dtype: _constant_call(torch.get_default_dtype),
        torch.is_autocast_enabled: _constant_call(torch.is_autocast_enabled),
        torch._check: _check,
        torch._assert: _check,
        warnings.warn: _ignored,
        typing.cast: _cast,
        contextlib.nullcontext: _nullcontext,
        inspect.signature: _signature,
    }
    for fn in _MODULE_CALLS:
        table[fn] = _module_call
    fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_tracing", None)
    if fx_tracing is not None:
        table[fx_tracing] = _constant(False)
    return table


_TABLE: dict[Any, Callable] | None = None


def handler_for(value: Any) -> Callable | None:
    """The special handler for `value`, or None when it is an ordinary callable."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _build_table()
    try:
        return _TABLE.get(value)
    except TypeError:  # unhashable
        return None


class ContextManagerVariable(Variable):
    """A context manager the interpreter understands: `enter` and `exit` act on the trace."""

    def enter(self, tx) -> Variable:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            self.exit(tx)
            return ConstantVariable(False)
        return super().call_method(tx, name, args, kwargs)

    def call(self, tx, args, kwargs) -> Variable:
        """Used as a decorator: `@torch.no_grad()` wraps a function."""
        if len(args) == 1 and not kwargs:
            return DecoratedFunctionVariable(self, args[0])
        raise Unsupported(f"calling {self.describe()}")


class GradModeVariable(ContextManagerVariable):
    """no_grad / enable_grad / set_grad_enabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.previous: list[bool] = []

    def describe(self) -> str:
        return f"grad mode {'enabled' if self.enabled else 'disabled'}"

    def python_type(self) -> type:
        return torch.set_grad_enabled

    def apply_now(self, tx) -> None:
        self.previous.append(torch.is_grad_enabled())
        tx.output.set_grad_enabled(tx, self.enabled)

    def enter(self, tx) -> Variable:
        if not self.previous or torch.is_grad_enabled() != self.enabled:
            self.apply_now(tx)
        return NONE

    def exit(self, tx) -> None:
        if self.previous:
            tx.output.set_grad_enabled(tx, self.previous.pop())


class AutocastVariable(ContextManagerVariable):
    """torch.autocast(...): a region whose ops run in lower precision."""

    def __init__(self, autocast: torch.autocast):
        self.autocast = autocast
        self.mode_node = None

    def describe(self) -> str:
        return f"autocast({self.autocast.device}, {self.autocast.fast_dtype})"

    def enter(self, tx) -> Variable:
        self.mode_node = tx.output.enter_autocast(self.autocast)
        return NONE

    def exit(self, tx) -> None:
        tx.output.exit_autocast(self.autocast, self.mode_node)


class NullContextVariable(ContextManagerVariable):
    def __init__(self, value: Variable):
        self.value = value

    def enter(self, tx) -> Variable:
        return self.value

    def exit(self, tx) -> None:
        pass


class DecoratedFunctionVariable(Variable):
    """A function decorated with a context manager (`@torch.no_grad()`)."""

    def __init__(self, manager: ContextManagerVariable, function: Variable):
        self.manager = manager
        self.function = function

    def call(self, tx, args, kwargs) -> Variable:
        self.manager.enter(tx)
        result = self.function.call(tx, args, kwargs)
        self.manager.exit(tx)
        return result


class IgnoredCallsVariable(Variable):
    """A logger: every method call is dropped (logging does not change the computation)."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"logger {getattr(self.value, 'name', '')}"

    def identity(self) -> Any:
        return self.value

    def getattr(self, tx, name: str) -> Variable:
        if name.startswith("is") or name in ("level", "name", "disabled"):
            return ConstantVariable(getattr(self.value, name)()) if callable(getattr(self.value, name)) \
                else ConstantVariable(getattr(self.value, name))
        return IgnoredCallsVariable(None)

    def call(self, tx, args, kwargs) -> Variable:
        return NONE
