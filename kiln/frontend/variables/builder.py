"""`wrap`: the one place a real Python value becomes a tracker (and gets its guard).

Given a value and the source it was read from, pick the tracker kind and install
the guard that kind needs: tensor metadata for tensors (which also become graph
inputs), identity for modules, functions, classes and objects, type+value for
constants, type+length for tuples and lists, type for dicts (whose entries are
guarded lazily, when read). Non-constant objects are wrapped once per trace (by
identity), so two reads of the same object share one tracker and its pending
mutations.
"""
from __future__ import annotations

import contextvars
import enum
import functools
import logging
import os
import sys
import types
from typing import Any

import torch

from kiln.frontend.errors import Unsupported
from kiln.frontend.sources import AttrSource, ItemSource, Source
from kiln.frontend.variables.base import ConstantVariable, Variable, is_constant_value
from kiln.frontend.variables.containers import (DictVariable, ExternalDictVariable, ListVariable, TupleVariable)
from kiln.frontend.variables.functions import (BoundMethodVariable, MethodDescriptorVariable, PartialVariable,
                                               TorchFunctionVariable, UserFunctionVariable, is_torch_function)
from kiln.frontend.variables.modules import ModuleVariable, PythonModuleVariable
from kiln.frontend.variables.objects import ClassVariable, ContextVarVariable, UserObjectVariable


def wrap(tx, value: Any, source: Source | None, guard: bool = True) -> Variable:
    """The tracker for `value`, read from `source` (guarded unless `guard` is False)."""
    output = tx.output
    guards = output.guards if (guard and source is not None) else None
    if isinstance(value, torch.Tensor):
        if source is None:
            raise Unsupported("a tensor reached the trace without a source (cannot make it a graph input)")
        return output.tensor_input(tx, value, source)
    if _is_constant(value):
        if guards is not None:
            guards.value(source, value)
        return ConstantVariable(value, source)
    cached = output.wrapped.get(id(value))
    if cached is not None:
        if guards is not None:
            guards.identity(source, value)
        return cached
    variable = _make(tx, value, source, guards)
    output.remember_wrapped(value, variable)
    return variable


def _is_constant(value: Any) -> bool:
    if is_constant_value(value) or isinstance(value, torch.Size):
        return True
    return isinstance(value, enum.Enum) or _is_numpy_scalar(value)


def _is_numpy_scalar(value: Any) -> bool:
    """np.float32(2.0) and friends: immutable numbers, guarded by type and value like Python's."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic)


def _make(tx, value: Any, source: Source | None, guards) -> Variable:
    from kiln.frontend.variables import builtins as kiln_builtins
    from kiln.frontend.variables import torch_special

    if isinstance(value, torch.nn.Module):
        if guards is not None:
            guards.identity(source, value)
        return ModuleVariable(value, source)
    if type(value) in (tuple, list) or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
        if guards is not None:
            guards.type_is(source, type(value))
            guards.length(source, len(value))
        items = [wrap(tx, item, ItemSource(source, index) if source is not None else None, guards is not None)
                 for index, item in enumerate(value)]
        if type(value) is list:
            return ListVariable(items, source)
        return TupleVariable(items, source, type(value))
    if isinstance(value, os._Environ) and source is not None:
        return ExternalDictVariable(value, source)  # os.environ reads are guarded key by key
    if isinstance(value, dict) and _behaves_as_dict(type(value)):
        if source is None:
            return DictVariable({key: (wrap_sourceless(tx, key), wrap_sourceless(tx, item))
                                 for key, item in value.items()}, dict_type=type(value))
        if guards is not None:
            guards.type_is(source, type(value))
        return ExternalDictVariable(value, source)
    if isinstance(value, frozenset) and all(is_constant_value(item) for item in value):
        if guards is not None:
            guards.value(source, value)
        return ConstantVariable(value, source)
    if type(value) is set and all(is_constant_value(item) for item in value):
        from kiln.frontend.variables.builtins import SetVariable

        if guards is not None:  # compared with a snapshot: the live set would always equal itself
            guards.type_is(source, set)
            guards.add(source, f"{{}} != {guards.constant(frozenset(value))}", f"changed from {value!r}")
        return SetVariable(value, source, value)
    special = torch_special.handler_for(value)
    if special is not None or is_torch_function(value):
        if guards is not None:  # torch's own attributes come here unguarded (`guard=False`): this is a user's name
            guards.identity(source, value)
        if isinstance(value, type):
            return ClassVariable(value, source)
        return TorchFunctionVariable(value, source)
    builtin = kiln_builtins.builtin_variable(value)
    if builtin is not None:
        return builtin
    if guards is not None and not _is_plain_instance(value):
        guards.identity(source, value)
    if isinstance(value, types.FunctionType):
        return UserFunctionVariable(value, source)
    if isinstance(value, types.MethodType):
        function = wrap(tx, value.__func__, AttrSource(source, "__func__") if source else None, False)
        bound_self = wrap(tx, value.__self__, AttrSource(source, "__self__") if source else None, False)
        return BoundMethodVariable(function, bound_self, source)
    if isinstance(value, types.ModuleType):
        return PythonModuleVariable(value, source)
    if isinstance(value, type):
        return ClassVariable(value, source)
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType,
                          types.ClassMethodDescriptorType)):
        return MethodDescriptorVariable(value.__objclass__, value.__name__, source)
    if isinstance(value, types.BuiltinMethodType) and value.__self__ is not None \
            and not isinstance(value.__self__, types.ModuleType):
        receiver = wrap(tx, value.__self__, None, False) if not _is_constant(value.__self__) \
            else ConstantVariable(value.__self__)
        return BoundMethodVariable(MethodDescriptorVariable(type(value.__self__), value.__name__), receiver)
    if isinstance(value, functools.partial):
        function = wrap(tx, value.func, AttrSource(source, "func") if source else None)
        args = [wrap(tx, arg, ItemSource(AttrSource(source, "args"), index) if source else None)
                for index, arg in enumerate(value.args)]
        kwargs = {key: wrap(tx, arg, ItemSource(AttrSource(source, "keywords"), key) if source else None)
                  for key, arg in value.keywords.items()}
        return PartialVariable(function, args, kwargs, source)
    if isinstance(value, contextvars.ContextVar):
        return ContextVarVariable(value, source)
    if isinstance(value, (logging.Logger, logging.LoggerAdapter)):
        return torch_special.LoggerVariable(value, source)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        raise Unsupported(f"calling builtin {getattr(value, '__qualname__', value)!r} which kiln does not model")
    if guards is not None:
        guards.type_is(source, type(value))  # its attributes are guarded one by one as the trace reads them
    return UserObjectVariable(value, source)


def _is_plain_instance(value: Any) -> bool:
    """An instance of an ordinary class: guarded by type, not identity (fresh config objects reuse entries)."""
    return not isinstance(value, (type, types.FunctionType, types.MethodType, types.ModuleType,
                                  types.BuiltinFunctionType, functools.partial, contextvars.ContextVar,
                                  logging.Logger, logging.LoggerAdapter))


_DICT_METHODS = ("get", "__getitem__", "__contains__", "keys", "items", "values", "__iter__", "__len__")


def _behaves_as_dict(cls: type) -> bool:
    """A dict or a dict subclass that reads like one (no overridden lookups)."""
    return all(getattr(cls, name) is getattr(dict, name) or
               any(getattr(cls, name) is getattr(base, name, None) for base in (dict,)) for name in _DICT_METHODS) \
        or cls.__module__ == "collections"


def wrap_sourceless(tx, value: Any) -> Variable:
    """The tracker for a value computed at trace time (no source, no guard)."""
    if _is_constant(value):
        return ConstantVariable(value)
    if type(value) is list:
        return ListVariable([wrap_sourceless(tx, item) for item in value])
    if type(value) is tuple or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
        return TupleVariable([wrap_sourceless(tx, item) for item in value], tuple_type=type(value))
    if type(value) in (dict, types.MappingProxyType):
        return DictVariable({key: (wrap_sourceless(tx, key), wrap_sourceless(tx, item))
                             for key, item in value.items()})
    if isinstance(value, torch.Tensor):
        raise Unsupported("a tensor computed outside the graph during the trace")
    return wrap(tx, value, None, guard=False)
