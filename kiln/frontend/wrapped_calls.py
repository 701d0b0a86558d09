"""A frame that cannot break, calling through a closure cell a function that can: run the frame in
Python and the function it calls through its own dispatcher.

A graph break goes to the outermost frame that can resume (dispatcher.py `_break_point`). A frame
whose call into the failing function sits where a resume function cannot start (an `except` clause's
own body, whose cleanup re-raises from an offset of the frame's code; a generator) cannot. A
decorator's wrapper there would make a graph break anywhere inside the function it wraps run the
whole call eagerly. (A call inside a `try` block breaks there: resume.py hands an exception to the
block's handler. transformers wraps every model's forward in two such wrappers,
`merge_with_config_defaults` restoring the config in a `finally` and `capture_outputs` resetting its
collector in one, and those frames break at the call.) TorchDynamo does not hit this, since it
compiles every frame Python starts: the wrapper's frame runs in Python, and the function it calls is
compiled on its own.

kiln gets the same for the decorator's shape: where the outermost frame calls the failing function
through one of its closure cells (`func(self, *args, **kwargs)` with `func` a free variable that the
frame never assigns), `CalleeCompiled` runs a copy of the frame's function whose cell holds that
function's dispatcher instead. The copy shares the function's code, globals, defaults and every
other cell; the frame runs in Python, try blocks and all, and the call compiles (breaking inside in
turn). A cell whose contents changed since the copy was made gets a new copy.
"""
from __future__ import annotations

import contextlib
import types
import weakref
from typing import Callable

import torch

from kiln.frontend import bytecode
from kiln.frontend.variables.modules import _HOOK_DICTS


def hooked(module) -> bool:
    """Whether `module` has hooks of its own (its call then runs them, around forward)."""
    return isinstance(module, torch.nn.Module) and any(getattr(module, table, None) for table in _HOOK_DICTS)


def forward_function(module) -> types.FunctionType | None:
    """The plain function `module(...)` runs as forward (no hooks), or None."""
    forward = getattr(module, "forward", None)
    if isinstance(forward, types.MethodType) and forward.__self__ is module \
            and isinstance(forward.__func__, types.FunctionType):
        return forward.__func__
    return None


def callee_cell(fn: types.FunctionType, callee_code: types.CodeType) -> int | None:
    """The position in `fn.__closure__` of the cell holding the function whose code is `callee_code`,
    when `fn`'s code never assigns that cell; None otherwise."""
    names = fn.__code__.co_freevars
    assigned = {instruction.argval for instruction in bytecode.decode(fn.__code__).instructions
                if instruction.opname in ("STORE_DEREF", "DELETE_DEREF")}
    for position, (name, cell) in enumerate(zip(names, fn.__closure__ or ())):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(contents, types.FunctionType) and contents.__code__ is callee_code and name not in assigned:
            return position
    return None


class CalleeCompiled:
    """The entry of a dispatcher whose frame runs in Python with its callee compiled (see the module doc).

    Called as the dispatcher's entries are: with the frame's arguments, and `__fn=` for a closure's
    dispatcher; for a module's (`_call_module`), its first argument is the module."""

    def __init__(self, position: int, callee_dispatcher: Callable, *, fn: types.FunctionType | None = None,
                 module_call: bool = False):
        self.position = position
        self.callee_dispatcher = callee_dispatcher  # makes the dispatcher of a function (Dispatcher.callee_factory())
        self.fn = fn  # the function, unless given per call (a closure's dispatcher) or a module's forward
        self.module_call = module_call
        self._copies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # function -> (callee, copy)

    def __call__(self, *args, **kwargs):
        fn = kwargs.pop("__fn", None) or self.fn
        if self.module_call:
            module = args[0]
            fn = forward_function(module)
            if fn is None or hooked(module) or not fn.__closure__ or len(fn.__closure__) <= self.position:
                return module(*args[1:], **kwargs)  # the module changed since the trace: as Python runs it
        return self.copy_of(fn)(*args, **kwargs)

    def copy_of(self, fn: types.FunctionType) -> types.FunctionType:
        callee = fn.__closure__[self.position].cell_contents
        known = self._copies.get(fn)
        if known is not None and known[0] is callee:
            return known[1]
        cells = list(fn.__closure__)
        cells[self.position] = types.CellType(_CompiledFunction(callee, self.callee_dispatcher(callee)))
        copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        self._copies[fn] = (callee, copy)
        return copy


class _CompiledFunction:
    """A function's stand-in in the copy's cell: calls go to its dispatcher, anything else read from it
    (`func.__code__.co_varnames`, as transformers' wrapper reads, `__name__`, `__wrapped__`) is the function's."""

    def __init__(self, function: types.FunctionType, dispatcher: Callable):
        self.__dict__["_kiln_function"] = function
        self.__dict__["_kiln_dispatcher"] = dispatcher

    def __call__(self, *args, **kwargs):
        return self._kiln_dispatcher(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._kiln_function, name)

    def __get__(self, instance, owner=None):  # bound as the function would be
        return self if instance is None else types.MethodType(self, instance)


class ForwardCompiled:
    """A module whose hooks kiln cannot trace (`untraceable_hooks`: FSDP2's forward hooks, registered with
    kwargs, or backward hooks): its call runs nn.Module's machinery in Python, hooks and all, and the
    forward that machinery calls is compiled on its own, as TorchDynamo runs torch.nn's call frames and
    compiles the forward frame they start. (Tracing the module's call would give up on the whole frame.)

    For the length of the call the module's instance attribute `forward` is the compiled forward
    (`forward_swapped`, as kiln.compile(DDP(model)) does for DDP's module)."""

    _ABSENT = object()

    def __init__(self, callee_dispatcher: Callable):
        self.callee_dispatcher = callee_dispatcher  # makes a function's dispatcher (Dispatcher.callee_factory())
        self._dispatchers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # forward function -> its own

    def dispatchers(self) -> list:
        return list(self._dispatchers.values())

    def __call__(self, module: torch.nn.Module, *args, **kwargs):
        own = module.__dict__.get("forward", self._ABSENT)
        # the function forward runs and what it is bound to: the class's (the module), an instance's own bound
        # method (accelerate's patched forward: its receiver), an instance's own plain function (nothing)
        function, receiver = getattr(type(module), "forward", None), module
        if isinstance(own, types.MethodType):
            function, receiver = own.__func__, own.__self__
        elif own is not self._ABSENT:
            function, receiver = own, None
        if not isinstance(function, types.FunctionType):  # a partial, a callable object: as Python runs it
            return torch.nn.Module.__call__(module, *args, **kwargs)
        dispatcher = self._dispatchers.get(function)
        if dispatcher is None:
            dispatcher = self._dispatchers[function] = self.callee_dispatcher(function)

        def forward(*forward_args, **forward_kwargs):
            if receiver is None:
                return dispatcher(*forward_args, **forward_kwargs)
            return dispatcher(receiver, *forward_args, **forward_kwargs)

        with forward_swapped(module, forward):
            return torch.nn.Module.__call__(module, *args, **kwargs)


@contextlib.contextmanager
def forward_swapped(module: torch.nn.Module, forward: Callable):
    """For the block's length the module's instance attribute `forward` is `forward` (nn.Module's call reads
    `self.forward`: its hooks run around it), then the module's own is back, or none."""
    state = module.__dict__
    own = state.get("forward", ForwardCompiled._ABSENT)
    state["forward"] = forward
    try:
        yield
    finally:
        if own is ForwardCompiled._ABSENT:
            state.pop("forward", None)
        else:
            state["forward"] = own
