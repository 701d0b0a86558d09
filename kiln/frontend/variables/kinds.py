"""Which tracker each kind of Python value becomes: the makers `builder.wrap` tries, in order.

This module is the top of variables/: it imports the tracker modules and registers one
maker per kind with builder's registry, so builder itself imports none of them. The
interpreter imports it, so every kind is registered before anything is wrapped. The
order is the order of the checks: modules, tuples and lists, os.environ, dicts, sets;
then torch's own callables and the builtins kiln models (looked up by value, ahead of
the type they have); then functions, methods, Python modules, classes, descriptors,
builtin methods, partials, context variables, loggers, and any other object, guarded by
its type. A maker returns None for an instance it does not take.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import random
import types
from typing import Any

import torch

from kiln.frontend.errors import Unsupported
from kiln.frontend.sources import AttrSource, ItemSource, LocalSource
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import ConstantVariable, Variable, is_constant_value
from kiln.frontend.variables.builtins import builtin_class_method, builtin_variable
from kiln.frontend.variables.containers import DictVariable, ExternalDictVariable, ListVariable, TupleVariable
from kiln.frontend.variables.sets import SetVariable
from kiln.frontend.variables.functions import (BoundMethodVariable, LruCacheVariable, MethodDescriptorVariable,
                                               OpaqueFunctionVariable, PartialVariable, TorchFunctionVariable,
                                               UserFunctionVariable, is_library_function, is_torch_function)
from kiln.frontend.variables.modules import ModuleVariable, PythonModuleVariable
from kiln.frontend.variables.objects import ClassVariable, ContextVarVariable, UserObjectVariable
from kiln.frontend.variables.tensor import TensorMethodVariable
from kiln.frontend.variables.torch_special import (GradModeExit, GradModeExitVariable, InferenceModeExit,
                                                   InferenceModeExitVariable, LoggerVariable)


def _guard_identity(guards, source, value: Any) -> None:
    if guards is not None:
        guards.identity(source, value)


def _module(tx, value: torch.nn.Module, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    return ModuleVariable(value, source)


def _is_sequence(value: Any) -> bool:
    """A list, a tuple or a namedtuple (not another subclass: its methods may be overridden)."""
    return type(value) in (tuple, list) or (isinstance(value, tuple) and hasattr(type(value), "_fields"))


def _sequence(tx, value: tuple | list, source, guards) -> Variable | None:
    if not _is_sequence(value):
        return None
    if guards is not None:
        guards.type_is(source, type(value))
        guards.length(source, len(value))
    items = [builder.wrap(tx, item, ItemSource(source, index) if source is not None else None, guards is not None)
             for index, item in enumerate(value)]
    if type(value) is list:
        return ListVariable(items, source)
    return TupleVariable(items, source, type(value))


def _environ(tx, value: os._Environ, source, guards) -> Variable | None:
    if source is None:
        return None
    return ExternalDictVariable(value, source)  # os.environ reads are guarded key by key


def _dict(tx, value: dict, source, guards) -> Variable | None:
    if not _behaves_as_dict(type(value)):
        return None
    if source is None:
        return DictVariable({key: (builder.wrap_sourceless(tx, key), builder.wrap_sourceless(tx, item))
                             for key, item in value.items()}, dict_type=type(value))
    if guards is not None:
        guards.type_is(source, type(value))
    return ExternalDictVariable(value, source)


_DICT_METHODS = ("get", "__getitem__", "__contains__", "keys", "items", "values", "__iter__", "__len__")


def _behaves_as_dict(cls: type) -> bool:
    """A dict or a dict subclass that reads like one (no overridden lookups)."""
    return all(getattr(cls, name) is getattr(dict, name) or
               any(getattr(cls, name) is getattr(base, name, None) for base in (dict,)) for name in _DICT_METHODS) \
        or cls.__module__ == "collections"


def _set(tx, value: set, source, guards) -> Variable | None:
    if type(value) is not set or not all(is_constant_value(item) for item in value):
        return None
    if guards is not None:  # compared with a snapshot: the live set would always equal itself
        guards.type_is(source, set)
        guards.add(source, f"{{}} != {guards.constant(frozenset(value))}", f"changed from {value!r}")
    return SetVariable(value, source, value)


def _frozenset_of_classes(tx, value: frozenset, source, guards) -> Variable | None:
    """A frozenset of classes (3.12's `dataclasses._ATOMIC_TYPES`): a constant, guarded equal to its value (classes
    compare by identity), so `type(obj) in it` folds."""
    if type(value) is not frozenset or not all(isinstance(item, type) or is_constant_value(item) for item in value):
        return None
    if guards is not None:
        guards.type_is(source, frozenset)
        guards.add(source, f"{{}} != {guards.constant(value)}", f"changed from {value!r}")
    return ConstantVariable(value, source)


def _kiln_compiled(tx, value: Any, source, guards) -> Variable | None:
    """A callable kiln already compiled, called in a trace: what it compiles is traced in its place, as
    Dynamo inlines a nested torch.compile (Lightning's from_compiled compiles training_step, which calls
    the compiled forward). Marked with `__kiln_compiled__`, the kiln-compiled callable it calls (kiln/backend.py
    run_with_options), or `__kiln_dispatcher__` (a Dispatcher: its function, bound to its `bound_self`)."""
    # Looked up statically: a dynamic __getattr__ answers any name (torch.ops made a namespace "__kiln_compiled__",
    # and every torch.ops.<namespace> call in a trace failed).
    inner = value.__dict__.get("__kiln_compiled__") if isinstance(value, types.FunctionType) else None
    dispatcher = inner is None and inspect.getattr_static(type(value), "__kiln_dispatcher__", False) is True
    if inner is None and not dispatcher:
        return None
    _guard_identity(guards, source, value)
    if inner is not None:
        return builder.wrap(tx, inner, AttrSource(source, "__kiln_compiled__") if source else None)
    function = builder.wrap(tx, value.fn, AttrSource(source, "fn") if source else None)
    if value.bound_self is None:
        return function
    bound_self = builder.wrap(tx, value.bound_self, AttrSource(source, "bound_self") if source else None)
    return PartialVariable(function, [bound_self], {}, source)


def _torch_callable(tx, value: Any, source, guards) -> Variable | None:
    """torch's functions and classes, and the callables with a handler of their own: graph nodes or handled."""
    if builder.call_handler(value) is None and not is_torch_function(value):
        return None
    _guard_identity(guards, source, value)  # torch's own attributes come here unguarded: this is a user's name
    if isinstance(value, type):
        return ClassVariable(value, source)
    return TorchFunctionVariable(value, source)


def _builtin(tx, value: Any, source, guards) -> Variable | None:
    return builtin_variable(value)


def _lru_cache(tx, value, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    return LruCacheVariable(value, source)


def _is_argument_item(source) -> bool:
    """An argument, or an item of one (`args[0][1]`: the resume function of a generator rebuilt inside another's)."""
    while isinstance(source, ItemSource):
        source = source.parent
    return isinstance(source, LocalSource)


def _function(tx, value: types.FunctionType, source, guards) -> Variable:
    if guards is not None and _is_argument_item(source) and not is_library_function(value):
        # An argument (a lambda a resume function takes as a live local, a callback): a function made by the
        # caller is a new object on each call, so its code and globals are guarded, and its identity only
        # when the trace depends on it (UserFunctionVariable.pinned).
        guards.type_is(source, types.FunctionType)
        guards.function(source, value)
        guards.identity(AttrSource(source, "__globals__"), value.__globals__)
        return UserFunctionVariable(value, source, pin=lambda: guards.identity(source, value))
    _guard_identity(guards, source, value)
    return UserFunctionVariable(value, source)


def _method(tx, value: types.MethodType, source, guards) -> Variable:
    if guards is not None and source is not None:  # a new object at each attribute read: guard what it binds
        guards.type_is(source, types.MethodType)
        guards.identity(AttrSource(source, "__func__"), value.__func__)
        guards.identity(AttrSource(source, "__self__"), value.__self__)
    else:
        _guard_identity(guards, source, value)
    function = builder.wrap(tx, value.__func__, AttrSource(source, "__func__") if source else None, False)
    bound_self = builder.wrap(tx, value.__self__, AttrSource(source, "__self__") if source else None, False)
    return BoundMethodVariable(function, bound_self, source)


def _python_module(tx, value: types.ModuleType, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    return PythonModuleVariable(value, source)


def _class(tx, value: type, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    return ClassVariable(value, source)


def _descriptor(tx, value: Any, source, guards) -> Variable:
    """`dict.get`, `list.__len__`: guarded by type only (it is a plain instance to the guards)."""
    return MethodDescriptorVariable(value.__objclass__, value.__name__, source)


def _guard_bound_method(guards, source, value: types.BuiltinMethodType) -> None:
    """A bound method is a new object at each attribute read: guard what it binds (its type, the receiver's
    identity, the method's name)."""
    if guards is not None:
        guards.type_is(source, type(value))
        guards.identity(AttrSource(source, "__self__"), value.__self__)
        guards.value(AttrSource(source, "__name__"), value.__name__)


def _builtin_method(tx, value: types.BuiltinMethodType, source, guards) -> Variable:
    """A C function: a bound method of a receiver kiln can wrap (`"-".join`), else not modelled."""
    receiver = value.__self__
    if receiver is None or isinstance(receiver, types.ModuleType):
        _guard_identity(guards, source, value)
        return OpaqueFunctionVariable(value, source)
    if isinstance(receiver, type):  # a class method bound to its class: `dict.fromkeys`, `datetime.now`
        _guard_bound_method(guards, source, value)
        return builtin_class_method(value) or OpaqueFunctionVariable(value, source)
    if isinstance(receiver, random.Random):  # its draws exist only when the program runs: a graph break calls it
        _guard_bound_method(guards, source, value)
        return OpaqueFunctionVariable(value, source)
    if isinstance(receiver, types.GeneratorType) and source is not None:
        # `generator.send` of a real generator (one a graph break rebuilt, new on each call): the trace cannot step
        # it, so calling it breaks and nothing depends on which generator it is
        if guards is not None:
            guards.type_is(source, type(value))
            guards.type_is(AttrSource(source, "__self__"), types.GeneratorType)
            guards.value(AttrSource(source, "__name__"), value.__name__)
        return OpaqueFunctionVariable(value, source)
    if isinstance(receiver, torch.Tensor) and source is not None:  # `x.add` held as a value: x is a graph input
        if guards is not None:
            guards.type_is(source, type(value))
            guards.value(AttrSource(source, "__name__"), value.__name__)
        tensor = builder.wrap(tx, receiver, AttrSource(source, "__self__"))
        return TensorMethodVariable(tensor, value.__name__)
    _guard_bound_method(guards, source, value)
    # The identity guard pins which object the method is bound to, not what that object holds: a list's
    # `append` passed to a resume function must guard the list's length and items like any outside list
    # (its mutations are replayed from what the trace saw; unguarded, a later call with more items lost
    # them). The receiver has a source (a graph break may need to pass it on).
    receiver_source = AttrSource(source, "__self__") if source is not None else None
    bound = builder.wrap(tx, receiver, receiver_source, guards is not None) \
        if not builder.wraps_as_constant(receiver) else ConstantVariable(receiver)
    return BoundMethodVariable(MethodDescriptorVariable(type(receiver), value.__name__), bound)


def _partial(tx, value: functools.partial, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    function = builder.wrap(tx, value.func, AttrSource(source, "func") if source else None)
    args = [builder.wrap(tx, arg, ItemSource(AttrSource(source, "args"), index) if source else None)
            for index, arg in enumerate(value.args)]
    kwargs = {key: builder.wrap(tx, arg, ItemSource(AttrSource(source, "keywords"), key) if source else None)
              for key, arg in value.keywords.items()}
    return PartialVariable(function, args, kwargs, source)


def _context_var(tx, value: contextvars.ContextVar, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    return ContextVarVariable(value, source)


def _logger(tx, value: logging.Logger | logging.LoggerAdapter, source, guards) -> Variable:
    _guard_identity(guards, source, value)
    return LoggerVariable(value, source)


def _grad_mode_exit(tx, value: GradModeExit, source, guards) -> Variable:
    _guard_identity(guards, source, value)  # made by kiln, never changed: its identity pins `previous`
    return GradModeExitVariable(value, source)


def _inference_mode_exit(tx, value: InferenceModeExit, source, guards) -> Variable:
    _guard_identity(guards, source, value)  # one per (mode, modes before it), never changed: its identity pins them
    return InferenceModeExitVariable(value, source)


def _random_generator(tx, value: random.Random, source, guards) -> Variable:
    raise Unsupported(f"{type(value).__module__}.{type(value).__qualname__}: Python's random number generator, whose "
                      "draws exist only when the program runs (kiln does not trace them; use torch's random "
                      "functions, which become graph nodes)")


def _user_object(tx, value: Any, source, guards) -> Variable:
    if guards is not None:
        guards.type_is(source, type(value))  # its attributes are guarded one by one as the trace reads them
    return UserObjectVariable(value, source)


def _sourceless_list(tx, value: list) -> Variable | None:
    if type(value) is not list:
        return None
    return ListVariable([builder.wrap_sourceless(tx, item) for item in value])


def _sourceless_tuple(tx, value: tuple) -> Variable | None:
    if type(value) is not tuple and not hasattr(type(value), "_fields"):
        return None
    return TupleVariable([builder.wrap_sourceless(tx, item) for item in value], tuple_type=type(value))


def _sourceless_dict(tx, value: dict | types.MappingProxyType) -> Variable | None:
    if type(value) not in (dict, types.MappingProxyType):
        return None
    return DictVariable({key: (builder.wrap_sourceless(tx, key), builder.wrap_sourceless(tx, item))
                         for key, item in value.items()})


# (kind, maker) in the order wrap tries them
KINDS = (
    (torch.nn.Module, _module),
    ((tuple, list), _sequence),
    (os._Environ, _environ),
    (dict, _dict),
    (set, _set),
    (frozenset, _frozenset_of_classes),
    (object, _kiln_compiled),
    (object, _torch_callable),
    (object, _builtin),
    (functools._lru_cache_wrapper, _lru_cache),
    (types.FunctionType, _function),
    (types.MethodType, _method),
    (types.ModuleType, _python_module),
    (type, _class),
    ((types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType), _descriptor),
    (types.BuiltinMethodType, _builtin_method),
    (functools.partial, _partial),
    (contextvars.ContextVar, _context_var),
    ((logging.Logger, logging.LoggerAdapter), _logger),
    (GradModeExit, _grad_mode_exit),
    (InferenceModeExit, _inference_mode_exit),
    (random.Random, _random_generator),
    (object, _user_object),
)
def _sourceless_handled(tx, value: types.FunctionType) -> Variable | None:
    """A function with a call handler, as generated code loads it (a constant of a resume function's prologue)."""
    return TorchFunctionVariable(value, None) if builder.call_handler(value) is not None else None


SOURCELESS_KINDS = ((list, _sourceless_list), (tuple, _sourceless_tuple),
                    ((dict, types.MappingProxyType), _sourceless_dict), (types.FunctionType, _sourceless_handled))

for kind, maker in KINDS:
    builder.register(kind, maker)
for kind, maker in SOURCELESS_KINDS:
    builder.register_sourceless(kind, maker)
