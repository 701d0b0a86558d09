"""`copy.deepcopy` and `copy.copy` on trackers, step for step as the copy module does them.

The copy module's own Python cannot be inlined (its memo is keyed by `id()`, and an
object's copy goes through the C-level `object.__reduce_ex__`), so these handlers do
what it does for the kinds whose copy is plain data, and refuse the rest by name:

- immutable constants: copied for real (an immutable-constant operation: an atom or a
  tuple of atoms is itself, a device or frozenset an equal new object);
- lists, tuples and namedtuples, dicts (plain and OrderedDict, from the trace or from
  outside: every entry is read, and guarded), sets of constants, bound methods;
- functions and classes: themselves (the copy module treats them as atoms);
- instances of plain Python classes (the default reduce protocol: `object.__new__`, no
  `__slots__`, no `__deepcopy__`/`__copy__`, `__reduce_ex__`, `__reduce__`, `__getstate__`,
  `__getnewargs__` or `__setstate__` of their own): a new object made without `__init__`
  whose `__dict__` is a copy of the original's, as `copy._reconstruct` makes it. An outside
  object's `__dict__` is read key by key under guards (a transformers config, for T5, BART
  and Whisper, which copy their config on every forward).

The memo is kept as the copy module keeps it, per top-level call, keyed by the identity of
each original, so shared references and cycles come out shared and cyclic.
Tensors, modules and objects with a copy protocol of their own are unsupported.
"""
from __future__ import annotations

import collections
import copy
import copyreg
import enum
import sys
import types
from typing import Any

from kiln.frontend.errors import AttributeFailure, Unsupported
from kiln.frontend.sources import AttrSource
from kiln.frontend.variables.base import MISSING, ConstantVariable, Variable, lookup_class_attribute
from kiln.frontend.variables.containers import (DictVariable, ExternalDictVariable, ListVariable, TupleVariable,
                                                hashable_key)
from kiln.frontend.variables.functions import (BoundMethodVariable, NestedFunctionVariable, TorchFunctionVariable,
                                               UserFunctionVariable)
from kiln.frontend.variables.objects import (ClassVariable, NewObjectVariable, UserObjectVariable, has_slots,
                                             new_object)
from kiln.frontend.variables.tensor import TensorVariable

_REDUCE_METHODS = ("__reduce_ex__", "__reduce__", "__getstate__")


def deepcopy_handler(tx, args, kwargs) -> Variable:
    if len(args) != 1 or kwargs:
        raise Unsupported("copy.deepcopy with a memo argument")
    return _Copier(tx, deep=True).copy(args[0])


def copy_handler(tx, args, kwargs) -> Variable:
    if len(args) != 1 or kwargs:
        raise Unsupported("copy.copy with more than one argument (the program raises TypeError)")
    return _Copier(tx, deep=False).copy(args[0])


class _Copier:
    """One top-level copy.deepcopy / copy.copy call (its memo)."""

    def __init__(self, tx, deep: bool):
        self.tx = tx
        self.deep = deep
        self.memo: dict[int, Variable] = {}

    @property
    def what(self) -> str:
        return "copy.deepcopy" if self.deep else "copy.copy"

    def copy(self, variable: Variable) -> Variable:
        if isinstance(variable, ConstantVariable):
            return self._constant(variable)
        if isinstance(variable, (UserFunctionVariable, NestedFunctionVariable, ClassVariable)) or \
                (isinstance(variable, TorchFunctionVariable) and
                 isinstance(variable.fn, (types.FunctionType, types.BuiltinFunctionType))):
            return variable  # the copy module's atoms
        key = id(variable.identity())
        if key in self.memo:
            return self.memo[key]
        if isinstance(variable, TensorVariable):
            raise Unsupported(f"{self.what} of {variable.describe()} (kiln does not copy tensors outside the graph)")
        if isinstance(variable, ListVariable):
            result = ListVariable([])
            self.memo[key] = result
            result.items = [self._item(item) for item in variable.items]
            return result
        if isinstance(variable, TupleVariable):
            return self._tuple(variable, key)
        if isinstance(variable, (DictVariable, ExternalDictVariable)):
            return self._dict(variable, key)
        if variable.python_type() is set and hasattr(variable, "values"):  # builtins.SetVariable: constants only
            if not all(_copies_like_builtins(value) for value in variable.values):
                raise Unsupported(f"{self.what} of {variable.describe()}")
            result = type(variable)(copy.deepcopy(variable.values) if self.deep else set(variable.values))
            self.memo[key] = result
            return result
        if isinstance(variable, BoundMethodVariable):
            bound_self = self.copy(variable.bound_self) if self.deep else variable.bound_self
            return BoundMethodVariable(variable.function, bound_self)
        if isinstance(variable, (UserObjectVariable, NewObjectVariable)):
            return self._object(variable, key)
        raise Unsupported(f"{self.what} of {variable.describe()}")

    def _item(self, variable: Variable) -> Variable:
        """An element of a copied container: copied again when deep, shared when shallow."""
        return self.copy(variable) if self.deep else variable

    def _constant(self, variable: ConstantVariable) -> Variable:
        value = variable.value
        if not _copies_like_builtins(value):
            raise Unsupported(f"{self.what} of {variable.describe()} ({type(value).__qualname__} may copy itself "
                              "its own way)")
        copied = copy.deepcopy(value) if self.deep else copy.copy(value)  # immutable builtins: no user code runs
        return variable if copied is value else ConstantVariable(copied)

    def _tuple(self, variable: TupleVariable, key: int) -> Variable:
        tuple_type = variable.tuple_type
        if tuple_type is not tuple and not _is_plain_namedtuple(tuple_type):
            raise Unsupported(f"{self.what} of {variable.describe()}")
        if tuple_type is tuple:
            if not self.deep:
                return variable
            items = [self.copy(item) for item in variable.items]
            if key in self.memo:  # a cycle through the tuple made its copy meanwhile
                return self.memo[key]
            if all(copied is item for copied, item in zip(items, variable.items)):
                return variable
            result = TupleVariable(items)
        else:  # a namedtuple is rebuilt from its (copied) fields: always a new tuple
            result = TupleVariable([self._item(item) for item in variable.items], tuple_type=tuple_type)
        self.memo[key] = result
        return result

    def _dict(self, variable: DictVariable | ExternalDictVariable, key: int) -> Variable:
        dict_type = variable.python_type()
        if dict_type not in (dict, collections.OrderedDict):
            raise Unsupported(f"{self.what} of {variable.describe()} ({dict_type.__qualname__})")
        if isinstance(variable, ExternalDictVariable):
            pairs = [(variable.key_variable(name), variable.item(self.tx, name)) for name in variable.keys(self.tx)]
        else:
            pairs = list(variable.entries.values())
        result = DictVariable(dict_type=dict_type)
        self.memo[key] = result
        for name, value in pairs:
            copied_key = self._item(name)
            result.entries[hashable_key(self.tx, copied_key)] = (copied_key, self._item(value))
        return result

    def _object(self, variable: UserObjectVariable | NewObjectVariable, key: int) -> Variable:
        """copy._reconstruct for the default reduce protocol: a new object, then its __dict__ (copied if deep)."""
        tx = self.tx
        cls = variable.python_type()
        what = f"{self.what} of {variable.describe()}"
        own_copy = "__deepcopy__" if self.deep else "__copy__"
        if self.deep:  # copy.deepcopy asks the object; copy.copy asks its class
            if _has_attribute(tx, variable, own_copy):
                raise Unsupported(f"{what}: it defines {own_copy}")
        elif lookup_class_attribute(cls, own_copy)[0] is not MISSING:
            raise Unsupported(f"{what}: its class defines {own_copy}")
        if cls in copyreg.dispatch_table:
            raise Unsupported(f"{what}: copyreg has a reducer for {cls.__qualname__}")
        for name in _REDUCE_METHODS:
            if not _is_object_method(tx, variable, name):
                raise Unsupported(f"{what}: its class customizes {name}")
        for name in ("__getnewargs_ex__", "__getnewargs__"):
            if lookup_class_attribute(cls, name)[0] is not MISSING:
                raise Unsupported(f"{what}: its class defines {name}")
        if cls.__new__ is not object.__new__ or has_slots(cls):
            raise Unsupported(f"{what}: {cls.__qualname__} has a __new__ or __slots__ of its own")
        if isinstance(variable, UserObjectVariable):
            if variable.pending:
                raise Unsupported(f"{what}, which the trace modified")
            if variable.source is None:
                raise Unsupported(f"{what}, which has no source (its attributes cannot be guarded)")
            state = tx.wrap(variable.value.__dict__, AttrSource(variable.source, "__dict__"))
        else:
            state = variable.instance_dict
        result = new_object(cls)  # copyreg.__newobj__: cls.__new__(cls)
        self.memo[key] = result
        if state.length(tx) == 0:  # object.__getstate__ gives None for an empty __dict__
            return result
        if self.deep:
            state = self.copy(state)
        if _has_attribute(tx, result, "__setstate__"):
            raise Unsupported(f"{what}: the new object has a __setstate__")
        if isinstance(state, ExternalDictVariable):  # copy.copy: the original's values, shared
            entries = {name: (ConstantVariable(name), state.item(tx, name)) for name in state.keys(tx)}
        else:
            entries = state.entries
        result.instance_dict.entries.update(entries)  # y.__dict__.update(state)
        return result


def _has_attribute(tx, variable: Variable, name: str) -> bool:
    """hasattr() as the copy module calls it (through the class's own __getattribute__ / __getattr__)."""
    try:
        variable.getattr(tx, name)
        return True
    except AttributeFailure:
        return False


def _is_object_method(tx, variable: Variable, name: str) -> bool:
    """Whether `variable.name` is object's own method (what the C reduce machinery checks for)."""
    try:
        found = variable.getattr(tx, name)
    except AttributeFailure:
        return False
    return isinstance(found, BoundMethodVariable) and found.function.identity() is getattr(object, name)


def _is_plain_namedtuple(tuple_type: type) -> bool:
    """A namedtuple class (or a subclass adding only methods) that copies itself the default way: rebuilt by its
    namedtuple-made __new__ from its fields."""
    mro = tuple_type.__mro__
    base = next((klass for klass in mro if "_make" in vars(klass) and "_fields" in vars(klass)), None)
    if base is None or not all("__slots__" in vars(klass) for klass in mro[:mro.index(base) + 1]):
        return False
    return all(lookup_class_attribute(tuple_type, name)[1] in (base, tuple, object, None)
               for name in ("__new__", "__getnewargs__", "__deepcopy__", "__copy__", *_REDUCE_METHODS,
                            "__setstate__"))


def _copies_like_builtins(value: Any) -> bool:
    """A constant whose copy runs no user code: builtins, torch's immutable types, enums, NumPy scalars."""
    if isinstance(value, (tuple, frozenset)):
        return type(value) in (tuple, frozenset) and all(_copies_like_builtins(item) for item in value)
    if isinstance(value, enum.Enum):
        return type(value).__deepcopy__ is enum.Enum.__deepcopy__ and type(value).__copy__ is enum.Enum.__copy__
    module = type(value).__module__
    numpy = sys.modules.get("numpy")
    return module == "builtins" or module.startswith("torch") or \
        (numpy is not None and isinstance(value, numpy.generic))
