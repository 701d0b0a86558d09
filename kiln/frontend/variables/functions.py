"""Callables: user functions (inlined), closures made during the trace, bound methods,
functools.partial, torch functions (graph nodes) and method descriptors.

A user function call is inlined: the interpreter runs the callee's bytecode in a
new `Frame` whose locals are the bound argument trackers. Closure cells of a real
function are read through `ClosureCellSource` (and guarded); cells of a closure
created during the trace are `CellVariable`s shared with the frame that made them.
"""
from __future__ import annotations

import collections
import functools
import inspect
import os
import random
import sys
import sysconfig
import types
from typing import Any, Callable

import torch

from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.sources import AttrSource, ClosureCellSource, ItemSource
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import (NONE, ConstantVariable, Variable, is_constant_value, is_trusted_module,
                                          lookup_class_attribute)
from kiln.frontend.variables.containers import DictVariable, ExternalDictVariable, TupleVariable


class CellVariable(Variable):
    """A closure cell: either made during the trace (contents is a tracker) or a real one."""

    EMPTY = object()

    def __init__(self, contents: Any = EMPTY, real_cell: types.CellType | None = None, source=None,
                 pin: Callable[[], Any] | None = None):
        self.contents = contents
        self.real_cell = real_cell
        self.source = source  # source of the cell's *contents*
        self._pin = pin  # guards the identity of the function the real cell belongs to (UserFunctionVariable)

    def pinned_cell(self) -> types.CellType | None:
        """The real cell, for code the entry runs with this very cell object: the function it was read from
        is then guarded by identity (other functions of the same code have other cells)."""
        if self._pin is not None:
            pin, self._pin = self._pin, None
            pin()
        return self.real_cell

    def describe(self) -> str:
        return "closure cell"

    def load(self, tx) -> Variable:
        if self.contents is CellVariable.EMPTY:
            if self.real_cell is None:
                raise Unsupported("reading a free variable before assignment")
            if self.source is None:
                raise Unsupported("reading a closure cell of a function with no source (cannot guard it)")
            try:
                value = self.real_cell.cell_contents
            except ValueError:
                raise Unsupported("reading an empty closure cell") from None
            self.contents = tx.wrap(value, self.source)
        return self.contents

    def reconstruct(self, codegen) -> str:
        """The cell object itself, re-read from the closure it came from (`fn.__closure__[i]`). One the trace
        made is built by the entry (`EntryCodegen.value`: once, with its contents as the trace left them)."""
        if self.real_cell is None:
            return codegen.value(self)
        if isinstance(self.source, ClosureCellSource):
            return f"{codegen.source(self.source.parent)}.__closure__[{self.source.index}]"
        return codegen.constant(self.pinned_cell())

    def store(self, tx, value: Variable) -> None:
        if self.real_cell is not None:  # a cell of a function defined outside: written back by the entry
            if not isinstance(self.source, ClosureCellSource) and self._pin is None:
                raise Unsupported("assigning to a nonlocal variable of a function kiln cannot name (no source)")
            tx.output.side_effects.store_cell(self, value)
        self.contents = value


class BaseFunctionVariable(Variable):
    """What inlining needs from any Python-level function."""

    def code(self) -> types.CodeType:
        raise NotImplementedError

    def function_globals(self) -> dict:
        raise NotImplementedError

    def closure_cells(self, tx) -> list[CellVariable]:
        raise NotImplementedError

    def bind(self, tx, args: list[Variable], kwargs: dict[str, Variable]) -> dict[str, Variable]:
        raise NotImplementedError

    def call(self, tx, args, kwargs) -> Variable:
        return tx.inline_call(self, args, kwargs)

    def python_type(self) -> type:
        return types.FunctionType

    def truth(self, tx) -> bool:
        return True


def bind_arguments(code: types.CodeType, args: list[Variable], kwargs: dict[str, Variable], default_count: int,
                   default_for) -> dict[str, Variable]:
    """Bind trackers to a code object's parameters the way CPython does.

    `default_for(index_or_None, name)` gives the tracker for a missing parameter's
    default (positional index into `__defaults__`, or None for keyword-only), or
    None when it has no default.
    """
    where = code.co_qualname
    positional = code.co_varnames[:code.co_argcount]
    keyword_only = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    index = code.co_argcount + code.co_kwonlyargcount
    varargs = varkw = None
    if code.co_flags & inspect.CO_VARARGS:
        varargs = code.co_varnames[index]
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        varkw = code.co_varnames[index]
    bound: dict[str, Variable] = dict(zip(positional, args))
    if len(args) > len(positional) and varargs is None:
        raise _binding_error(f"{where}() takes {len(positional)} positional arguments but {len(args)} were given")
    extra_keywords: dict[str, Variable] = {}
    keyword_names = set(positional[code.co_posonlyargcount:]) | set(keyword_only)
    for key, value in kwargs.items():
        if key in keyword_names:
            if key in bound:
                raise _binding_error(f"{where}() got multiple values for argument {key!r}")
            bound[key] = value
        elif varkw is not None:
            extra_keywords[key] = value
        else:
            raise _binding_error(f"{where}() got an unexpected keyword argument {key!r}")
    first_default = len(positional) - default_count
    for position, name in enumerate(positional):
        if name not in bound:
            default = default_for(position - first_default, name) if position >= first_default else None
            if default is None:
                raise _binding_error(f"{where}() missing required argument {name!r}")
            bound[name] = default
    for name in keyword_only:
        if name not in bound:
            default = default_for(None, name)
            if default is None:
                raise _binding_error(f"{where}() missing required keyword-only argument {name!r}")
            bound[name] = default
    if varargs is not None:
        bound[varargs] = TupleVariable(list(args[len(positional):]))
    if varkw is not None:
        bound[varkw] = DictVariable({key: (ConstantVariable(key), value) for key, value in extra_keywords.items()})
    return bound


def _binding_error(message: str) -> ProgramException:
    """The TypeError Python raises for a call whose arguments do not fit the parameters (its exact text is not
    modelled: reading it is unsupported)."""
    return ProgramException(message, TypeError, None)


class UserFunctionVariable(BaseFunctionVariable):
    """A real Python function from outside the trace; calls are inlined.

    `pin`, when given, installs the guard on the function's identity: a function passed as an argument
    is guarded by its type, code and globals (kinds.py), since a lambda or nested function is a new
    object on every call of the frame that makes it; its closure cells and defaults are guarded as the
    trace reads them, and its identity only once the trace depends on it (`is`, a dict key, `id`, its
    attributes, the object itself as a constant, a real closure cell in a function the entry rebuilds).
    """

    def __init__(self, fn: types.FunctionType, source=None, pin: Callable[[], None] | None = None):
        self.fn = fn
        self.source = source
        self._pin = pin

    def pinned(self) -> types.FunctionType:
        """The function, after guarding that it is this very object."""
        if self._pin is not None:
            pin, self._pin = self._pin, None
            pin()
        return self.fn

    def describe(self) -> str:
        return f"function {self.fn.__qualname__}"

    def identity(self) -> Any:
        return self.pinned()

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(self.fn)  # reached through guarded or trusted objects: this very function

    def as_constant(self) -> Any:
        return self.pinned()

    def code(self) -> types.CodeType:
        return self.fn.__code__

    def function_globals(self) -> dict:
        return self.fn.__globals__

    def closure_cells(self, tx) -> list[CellVariable]:
        cells = self.fn.__closure__ or ()
        # A function reached without a source (e.g. a method found on a class) is held by the guard directly.
        function_source = self._function_source(tx)
        return [tx.output.outside_cell(cell, ClosureCellSource(function_source, index), pin=self.pinned)
                for index, cell in enumerate(cells)]

    def _function_source(self, tx):
        """Where guards read this function: its source, else the guard holds the function itself."""
        return self.source if self.source is not None else tx.output.named_source("__function", self.fn)

    def bind(self, tx, args, kwargs):
        # Inlining reads the function's code and defaults: both are assignable, so guard them
        # (the function's identity alone does not cover them). torch's own functions are
        # trusted, like its globals.
        function_source = self._function_source(tx)
        guarded = not is_library_function(self.fn)
        if guarded:
            tx.output.guards.function(function_source, self.fn)
        defaults = self.fn.__defaults__ or ()
        kwdefaults = self.fn.__kwdefaults__ or {}

        def default(position, name):
            if position is None:
                if name not in kwdefaults:
                    return None
                return tx.wrap(kwdefaults[name], ItemSource(AttrSource(function_source, "__kwdefaults__"), name),
                               guard=guarded)
            if guarded:
                tx.output.guards.function_defaults(function_source, defaults)
            return tx.wrap(defaults[position], ItemSource(AttrSource(function_source, "__defaults__"), position),
                           guard=guarded)

        return bind_arguments(self.fn.__code__, args, kwargs, len(defaults), default)

    def getattr(self, tx, name: str) -> Variable:
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(self.pinned(), name))
        if name == "__code__":
            return CodeVariable(self.fn.__code__)
        if name == "__wrapped__" and hasattr(self.fn, "__wrapped__"):
            return tx.wrap(self.pinned().__wrapped__, AttrSource(self.source, name) if self.source else None)
        if name == "__get__":
            return MethodBinderVariable(self)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")


def is_library_function(fn: types.FunctionType) -> bool:
    """A function of torch (or another library kiln trusts not to be monkeypatched)."""
    return is_trusted_module(str(fn.__globals__.get("__name__", "")))


class CodeVariable(ConstantVariable):
    """A code object: its metadata attributes are constants."""

    def getattr(self, tx, name: str) -> Variable:
        if name.startswith("co_"):
            return ConstantVariable(getattr(self.value, name))
        raise Unsupported(f"attribute {name!r} of a code object")


class MethodBinderVariable(Variable):
    """`function.__get__` : binding a function to an object by hand."""

    def __init__(self, function: Variable):
        self.function = function

    def call(self, tx, args, kwargs) -> Variable:
        return BoundMethodVariable(self.function, args[0])


class NestedFunctionVariable(BaseFunctionVariable):
    """A function created by MAKE_FUNCTION during the trace (closures, lambdas, comprehensions)."""

    def __init__(self, code: types.CodeType, fn_globals: dict, name: str, defaults: list[Variable] | None,
                 kwdefaults: dict[str, Variable] | None, closure: list[CellVariable] | None, wrapped=None):
        self._code = code
        self._globals = fn_globals
        self.name = name
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure or []
        self.wrapped = wrapped  # set by functools.wraps
        self.attributes: dict[str, Variable] = {}

    def describe(self) -> str:
        return f"function {self._code.co_qualname} (defined in the compiled code)"

    def reconstruct(self, codegen) -> str:
        """A new function object, as MAKE_FUNCTION would make it (closures over real cells only)."""
        if self.attributes or self.wrapped is not None:
            raise Unsupported(f"rebuilding {self.describe()} with attributes set in the trace")
        defaults = "(" + "".join(f"{codegen.value(item)}, " for item in self.defaults) + ")" \
            if self.defaults else "None"
        kwdefaults = "{" + ", ".join(f"{name!r}: {codegen.value(item)}" for name, item in self.kwdefaults.items()) \
            + "}" if self.kwdefaults else "None"
        # its cells as they are now: the real ones re-read, the ones the trace made built once, shared by every
        # function (and resume function) that closes over them
        closure = "(" + "".join(f"{codegen.value(cell)}, " for cell in self.closure) + ")" if self.closure else "None"
        return (f"{codegen.constant(_make_function)}({codegen.constant(self._code)}, {codegen.constant(self._globals)}, "
                f"{self.name!r}, {defaults}, {kwdefaults}, {closure})")

    def code(self) -> types.CodeType:
        return self._code

    def function_globals(self) -> dict:
        return self._globals

    def closure_cells(self, tx) -> list[CellVariable]:
        return self.closure

    def bind(self, tx, args, kwargs):
        defaults = self.defaults or []
        kwdefaults = self.kwdefaults or {}

        def default(position, name):
            if position is None:
                return kwdefaults.get(name)
            return defaults[position]

        return bind_arguments(self._code, args, kwargs, len(defaults), default)

    def getattr(self, tx, name: str) -> Variable:
        if name in self.attributes:
            return self.attributes[name]
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(self._code.co_name if name == "__name__" else self._code.co_qualname)
        if name == "__code__":
            return CodeVariable(self._code)
        if name == "__wrapped__" and self.wrapped is not None:
            return self.wrapped
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def setattr(self, tx, name: str, value: Variable) -> None:
        self.attributes[name] = value


def _make_function(code, fn_globals, name, defaults, kwdefaults, closure):
    function = types.FunctionType(code, fn_globals, name, defaults, closure)
    function.__kwdefaults__ = kwdefaults
    return function


class BoundMethodVariable(Variable):
    """`obj.method`: a function with its first argument bound."""

    def __init__(self, function: Variable, bound_self: Variable, source=None):
        self.function = function
        self.bound_self = bound_self
        self.source = source

    def describe(self) -> str:
        return f"bound method {self.function.describe()}"

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        if isinstance(self.function, MethodDescriptorVariable):  # a builtin's method: bound as Python binds it
            descriptor = self.function.identity()
            if _resolves_to(self.bound_self, self.function.name, descriptor):
                return f"{codegen.value(self.bound_self)}.{self.function.name}"
            # `super().append` or `list.append.__get__(obj)` on a subclass whose own `append` overrides it
            return f"{codegen.constant(descriptor)}.__get__({codegen.value(self.bound_self)})"
        return f"{codegen.constant(types.MethodType)}({codegen.value(self.function)}, {codegen.value(self.bound_self)})"

    def python_type(self) -> type:
        return types.MethodType

    def truth(self, tx) -> bool:
        return True

    def call(self, tx, args, kwargs) -> Variable:
        return self.function.call(tx, [self.bound_self, *args], kwargs)

    def getattr(self, tx, name: str) -> Variable:
        if name == "__self__":
            return self.bound_self
        if name == "__func__":
            return self.function
        return self.function.getattr(tx, name)


def _resolves_to(receiver: Variable, name: str, descriptor: Any) -> bool:
    """Whether `receiver.name` finds `descriptor` on the receiver's class (no subclass overrides it)."""
    try:
        cls = receiver.python_type()
    except Unsupported:
        return False
    return lookup_class_attribute(cls, name)[0] is descriptor


class PartialVariable(Variable):
    """functools.partial(func, *args, **kwargs)."""

    def __init__(self, function: Variable, args: list[Variable], kwargs: dict[str, Variable], source=None):
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.source = source

    def describe(self) -> str:
        return f"partial({self.function.describe()})"

    def python_type(self) -> type:
        return functools.partial

    def truth(self, tx) -> bool:
        return True

    def call(self, tx, args, kwargs) -> Variable:
        return self.function.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, tx, name: str) -> Variable:
        if name == "func":
            return self.function
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "keywords":  # a copy: kiln does not model the partial's own dict changed in place
            return DictVariable({key: (ConstantVariable(key), value) for key, value in self.kwargs.items()})
        return super().getattr(tx, name)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        arguments = [codegen.value(self.function)] + [codegen.value(arg) for arg in self.args]
        keywords = ", ".join(f"{key!r}: {codegen.value(value)}" for key, value in self.kwargs.items())
        return f"{codegen.constant(functools.partial)}({', '.join(arguments)}, **{{{keywords}}})"


_MAPPING_READS = frozenset({"keys", "values", "items", "get", "__getitem__", "__contains__", "__len__", "__iter__"})


class MethodDescriptorVariable(Variable):
    """An unbound method of a builtin type (`dict.get`, `list.append`, `str.join`)."""

    def __init__(self, owner: type, name: str, source=None):
        self.owner = owner
        self.name = name
        self.source = source

    def describe(self) -> str:
        return f"{self.owner.__name__}.{self.name}"

    def identity(self) -> Any:
        return getattr(self.owner, self.name)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(getattr(self.owner, self.name))

    def truth(self, tx) -> bool:
        return True

    def call(self, tx, args, kwargs) -> Variable:
        if not args:
            raise Unsupported(f"calling {self.describe()} without a receiver")
        receiver = args[0]
        generic = {"generic": True} if receiver.generic_access else {}
        if self.owner is object and self.name == "__setattr__":
            receiver.setattr(tx, args[1].as_constant(), args[2], **generic)
            return NONE
        if self.owner is object and self.name == "__getattribute__":
            return receiver.getattr(tx, args[1].as_constant(), **generic)
        if self.owner is object and self.name == "__delattr__" and hasattr(receiver, "delattr"):
            receiver.delattr(tx, args[1].as_constant(), **generic)
            return NONE
        real = getattr(receiver, "value", None)
        if generic and isinstance(real, dict) and receiver.source is not None and (
                self.owner is dict or (self.owner is collections.OrderedDict and self.name in _MAPPING_READS)):
            # dict's own method (or OrderedDict's, reading) on a dict subclass that overrides it: read the real
            # mapping (`OrderedDict.keys(self)` in transformers' ModelOutput.to_tuple, on an outside output)
            receiver = ExternalDictVariable(real, receiver.source)
        elif generic:
            # An instance of a user subclass of a builtin (`class Items(list)`), or of a builtin type kiln does not
            # model (bytearray, deque, array.array): its own call_method would find this same descriptor again.
            # kiln does not model the builtin's state inside such an object.
            if receiver.python_type().__flags__ & _IMMUTABLE_TYPE:  # a C type itself, not a class statement's
                raise Unsupported(f"{self.describe()} on {receiver.describe()} (kiln does not model objects of "
                                  f"the builtin type {type(receiver.value).__qualname__})")
            raise Unsupported(f"{self.describe()} on {receiver.describe()} (a builtin's method on an instance of "
                              "a user subclass)")
        return receiver.call_method(tx, self.name, list(args[1:]), kwargs)


class LruCacheVariable(Variable):
    """A `functools.lru_cache` (or `functools.cache`) wrapper: its function is inlined, its cache bypassed.

    The cache lives in C and cannot be read, so a call is traced through `__wrapped__`. That is
    what the cache would return only when the function is a pure function of its arguments, so
    kiln requires what it can check: every argument is a constant, the call adds nothing to the
    graph and makes no side effect, and its result is a constant or an outside object (returned
    as itself, like the cached one). Values it reads (globals, attributes) are guarded as usual;
    a helper whose result depended on state that changed since it was cached would differ from
    eager's stale cached value, which is the one way this can disagree with Python.
    """

    def __init__(self, wrapper: Any, source=None):
        self.wrapper = wrapper
        self.source = source

    def describe(self) -> str:
        return f"lru_cache-wrapped function {getattr(self.wrapper, '__qualname__', self.wrapper)}"

    def identity(self) -> Any:
        return self.wrapper

    def as_constant(self) -> Any:
        return self.wrapper

    def python_type(self) -> type:
        return type(self.wrapper)

    def truth(self, tx) -> bool:
        return True

    def getattr(self, tx, name: str) -> Variable:
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(self.wrapper, name))
        if name == "__wrapped__":
            return tx.wrap(self.wrapper.__wrapped__, AttrSource(self.source, name) if self.source else None)
        raise Unsupported(f"attribute {name!r} of {self.describe()} (its cache is not modelled)")

    def call(self, tx, args, kwargs) -> Variable:
        arguments = [*args, *kwargs.values()]
        if not all(argument.is_constant() and _is_cacheable_constant(argument) for argument in arguments):
            raise Unsupported(f"calling {self.describe()} with {', '.join(a.describe() for a in arguments)}: kiln "
                              "traces a cached helper only on constant arguments")
        key = (id(self.wrapper), tuple(_typed(argument) for argument in args),  # typed: f(1), f(True) apart
               tuple((name, _typed(argument)) for name, argument in kwargs.items()))
        if key in tx.output.cached_calls:  # called again in this trace: the cache returns the same object
            return tx.output.cached_calls[key]
        if _is_library_function(getattr(self.wrapper, "__wrapped__", None)):
            tx.output.cached_calls[key] = result = self._call_library_helper(args, kwargs)
            return result
        wrapped_source = AttrSource(self.source, "__wrapped__") if self.source is not None else None
        function = tx.wrap(self.wrapper.__wrapped__, wrapped_source, guard=wrapped_source is not None)
        before = effects_fingerprint(tx.output)
        result = function.call(tx, args, kwargs)
        if effects_fingerprint(tx.output) != before:
            raise Unsupported(f"{self.describe()} changed state or computed tensors (the cache would skip that on "
                              "a later call: kiln traces only pure cached helpers)")
        if not (isinstance(result, ConstantVariable) or result.identity() is not result):
            value = result.as_constant() if result.is_constant() else []  # [] stands for "not a constant"
            if not is_constant_value(value):
                raise Unsupported(f"{self.describe()} returned {result.describe()}, a mutable object made by the "
                                  "call (the cache returns that one object every time, mutations included)")
            # An immutable value (a tuple of ints) equals the cached one; the entry holds it as one object.
            result = ConstantVariable(value)
        tx.output.cached_calls[key] = result
        return result


    def _call_library_helper(self, args, kwargs) -> Variable:
        """A library's cached helper (transformers' `is_torch_available`, typing's `_tp_cache`) called as it is,
        through its cache, at trace time: its value is what the call would return when the program runs (the
        cache holds it from now on). Traced instead, such a helper can reach code the tracer has no business in
        (importlib.metadata's distribution search: a RecursionError, and the whole frame ran eagerly)."""
        try:
            value = self.wrapper(*[argument.as_constant() for argument in args],
                                 **{name: argument.as_constant() for name, argument in kwargs.items()})
        except Exception as error:  # noqa: BLE001 (raised again where the program calls it)
            raise Unsupported(f"{self.describe()} raised {type(error).__name__} at trace time") from None
        if not is_constant_value(value):
            raise Unsupported(f"{self.describe()} returned {type(value).__name__}, not a constant (a library's cached "
                              "helper is called, not traced)")
        return ConstantVariable(value)


def _is_library_function(function: Any) -> bool:
    """A function of the standard library's or of an installed package's (not the program's own)."""
    filename = getattr(getattr(function, "__code__", None), "co_filename", None)
    return isinstance(filename, str) and filename.startswith(_LIBRARY_PATHS)


_LIBRARY_PATHS = tuple(os.path.join(path, "") for path in {sysconfig.get_paths()[key] for key in
                                                            ("stdlib", "platstdlib", "purelib", "platlib")})


def _typed(variable: Variable) -> tuple:
    value = variable.as_constant()
    return type(value), value


def _is_cacheable_constant(variable: Variable) -> bool:
    try:
        hash(variable.as_constant())
        return True
    except (TypeError, Unsupported):
        return False


def effects_fingerprint(output) -> tuple:
    """What the trace has done to the world so far: graph nodes, replayed calls, and the outside state it changed."""
    state = output.side_effects.current_state()
    return (len(output.graph.nodes), len(output.side_effects.calls),
            tuple((key, id(value)) for key, (_, _, value) in state.attributes.items()),
            tuple((key, tuple(map(id, items if isinstance(items, list) else items.values())))
                  for key, (_, items) in state.containers.items()),
            tuple((key, id(value)) for key, (_, _, value) in state.globals.items()))


# Py_TPFLAGS_IMMUTABLETYPE (Python >= 3.10): set on C types (bytearray, deque, array.array), never on a class
# made by a class statement.
_IMMUTABLE_TYPE = 1 << 8


# Torch functions with global effects: running them at trace time would be wrong.
_TORCH_SIDE_EFFECTS = frozenset({
    "manual_seed", "seed", "set_default_dtype", "set_default_device", "set_rng_state", "use_deterministic_algorithms",
    "set_num_threads", "set_printoptions", "_set_grad_enabled", "set_grad_enabled", "set_autocast_enabled",
})


class TorchFunctionVariable(Variable):
    """A torch function (or Python operator applied to tensors): becomes a graph node."""

    def __init__(self, fn: Any, source=None):
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"torch function {getattr(self.fn, '__qualname__', None) or getattr(self.fn, '__name__', self.fn)}"

    def identity(self) -> Any:
        return self.fn

    def as_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return type(self.fn)

    def truth(self, tx) -> bool:
        return bool(self.fn)  # torch's functions and classes: no user code

    def getattr(self, tx, name: str) -> Variable:
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.fn, name))
        return tx.wrap_sourceless(getattr(self.fn, name))

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(self.fn)

    def call(self, tx, args, kwargs) -> Variable:
        special = builder.call_handler(self.fn)
        if special is not None:
            return special(tx, args, kwargs)
        if getattr(self.fn, "__name__", "") in _TORCH_SIDE_EFFECTS:
            raise Unsupported(f"{self.describe()} changes global state")
        return tx.output.call_tensor_op(tx, "call_function", self.fn, list(args), dict(kwargs))


_FRAME_INTROSPECTION = frozenset(function for function in (sys._getframe, getattr(sys, "_getframemodulename", None))
                                 if function is not None)


class OpaqueFunctionVariable(Variable):
    """A C function kiln does not model (`time.perf_counter`, `os.getpid`): it can be held and
    passed around; calling it is unsupported (a graph break calls it in Python)."""

    def __init__(self, value: Any, source=None):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"builtin {getattr(self.value, '__qualname__', self.value)!r}"

    def python_type(self) -> type:
        return type(self.value)

    def as_constant(self) -> Any:
        return self.value

    def identity(self) -> Any:
        return self.value

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(self.value)

    def call(self, tx, args, kwargs) -> Variable:
        if isinstance(getattr(self.value, "__self__", None), random.Random):
            raise Unsupported(f"random.{self.value.__name__}(): a draw from Python's random number generator, whose "
                              "value exists only when the program runs (a graph break makes it in Python)")
        if _reads_callers_locals(self.value, args, kwargs):
            raise Unsupported(f"calling {self.describe()}, which reads the calling frame's local variables (a graph "
                              "break would make the call from kiln's entry function, whose locals are not the "
                              "program's)", breakable=False)
        error = Unsupported(f"calling {self.describe()}, which kiln does not model")
        error.reads_frames = self.value in _FRAME_INTROSPECTION
        raise error


def _reads_callers_locals(function: Any, args: list, kwargs: dict) -> bool:
    """`locals()`, `dir()`, and `exec` without its own namespaces: they read the locals of the frame that calls
    them, which only the program's own frame has (`vars()` and `eval`: their handlers in builtins.py)."""
    if function in (locals, dir):
        return not args and not kwargs
    if function is exec:
        return len(args) < 2 and "globals" not in kwargs
    return False


def is_torch_function(value: Any) -> bool:
    """Whether a callable should become a graph node rather than be inlined."""
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        module = getattr(value, "__module__", None) or ""
        self_object = getattr(value, "__self__", None)
        return module.startswith("torch") or (isinstance(self_object, types.ModuleType)
                                              and self_object.__name__.startswith("torch"))
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(value, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    if isinstance(value, torch._ops.OpOverloadPacket) or isinstance(value, torch._ops.OpOverload):
        return True
    if isinstance(value, types.FunctionType):
        module = value.__module__ or ""
        return module in _GRAPHED_PYTHON_MODULES
    return False


# Python modules of torch whose functions are tensor operations: put them in the graph whole.
_GRAPHED_PYTHON_MODULES = frozenset({
    "torch.nn.functional", "torch.functional", "torch._tensor", "torch.fft", "torch.linalg", "torch.special",
    "torch._refs", "torch.nn.init", "torch.random", "torch._C._nn", "torch", "torch.overrides",
    "torch._jit_internal",
})
