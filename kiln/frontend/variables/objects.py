"""Objects of user classes, classes themselves, dataclasses and transformers' ModelOutput.

Attribute lookup follows Python's rules by hand, without running the object's code:
data descriptors of the class (properties are inlined), then the instance
`__dict__`, then class attributes (functions become bound methods that are
inlined), then a class-defined `__getattr__` (inlined). Every value read from an
outside object is wrapped with an `AttrSource`, so its guard re-reads the same
attribute.

Assigning attributes of an outside object is kept in `pending` (later reads see it)
and replayed after the graph runs. Objects created during the trace
(`NewObjectVariable`) run their class's `__init__` inlined; a dataclass or a
`ModelOutput` built this way can be returned, because it is rebuilt with
`cls(**fields)`.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import types
from typing import Any, Callable

from kiln.frontend.errors import AttributeFailure, ProgramException, Unsupported
from kiln.frontend.sources import AttrSource, GenericAttrSource, ItemSource, TypeSource
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import (MISSING, NONE, ConstantVariable, TrackerMethod, Variable, is_trusted_module,
                                          lookup_class_attribute, run_on_constants)
from kiln.frontend.variables.containers import (DictVariable, DictViewVariable, ExternalDictVariable, IteratorVariable,
                                                ListIteratorLike, TupleVariable, missing_key)
from kiln.frontend.variables.functions import BoundMethodVariable, MethodDescriptorVariable, bind_arguments

DELETED = object()


def _class_source(tx, instance_source):
    return TypeSource(instance_source) if instance_source is not None else None


def bind_class_attribute(tx, raw: Any, name: str, instance: Variable, cls: type, cls_source) -> Variable:
    """What `instance.name` is when `name` is found on the class (not the instance)."""
    # A class attribute can be rebound (`Class.method = other`) while the class stays the same
    # object: the function behind a user class's method, static/class method or property is
    # guarded by identity (torch's own classes are trusted). It is read from the class itself,
    # which the guard holds, so twelve layers of one class share one check.
    guard = cls_source is not None and not _is_library_class(cls)
    if guard:
        cls_source = tx.output.named_source("__class", cls)
    attribute_source = AttrSource(cls_source, name) if cls_source is not None else None
    if isinstance(raw, staticmethod):  # `type(obj).name` is the function itself
        return tx.wrap(raw.__func__, attribute_source, guard=guard)
    if isinstance(raw, classmethod):  # `type(obj).name` is a method bound to the class
        function = tx.wrap(raw.__func__, AttrSource(attribute_source, "__func__") if guard else None, guard=guard)
        return BoundMethodVariable(function, tx.wrap(cls, cls_source, guard=False))
    if isinstance(raw, types.FunctionType):
        return BoundMethodVariable(tx.wrap(raw, attribute_source, guard=guard), instance)
    if isinstance(raw, property):
        if raw.fget is None:
            raise AttributeFailure(f"property {name!r} of {cls.__qualname__!r} object has no getter")
        return property_function(tx, raw, "fget", name, cls).call(tx, [instance], {})
    if isinstance(raw, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return BoundMethodVariable(MethodDescriptorVariable(raw.__objclass__, name), instance)
    if isinstance(raw, functools_cached_property()):
        raise Unsupported(f"functools.cached_property {name!r}")
    if hasattr(type(raw), "__get__") and not isinstance(raw, type):
        raise Unsupported(f"class attribute {name!r} is a descriptor of type {type(raw).__name__}")
    if instance.source is not None:
        return tx.wrap(raw, AttrSource(instance.source, name))
    # an object made in the trace: the value is read from its class (guarded there, unless a library's)
    return tx.wrap(raw, attribute_source if guard else None, guard=guard)


def property_function(tx, raw: property, which: str, name: str, cls: type) -> Variable:
    """The getter, setter or deleter (`which`: fget, fset, fdel) of property `name` found on `cls`, guarded
    by identity through the class (a user class's property can be rebound)."""
    function = getattr(raw, which)
    if _is_library_class(cls):
        return tx.wrap(function, None, guard=False)
    return tx.wrap(function, AttrSource(AttrSource(tx.output.named_source("__class", cls), name), which))


def is_data_descriptor(raw: Any) -> bool:
    """A class attribute that takes precedence over the instance __dict__ (property, slot, getset descriptor)."""
    return raw is not MISSING and (hasattr(type(raw), "__set__") or hasattr(type(raw), "__delete__"))


def _runs_user_get(raw: Any) -> bool:
    """A class attribute whose reading through an instance runs user code: a property, or a descriptor of a user
    class whose __get__ is a Python function."""
    if raw is MISSING:
        return False
    if isinstance(raw, property):
        return isinstance(raw.fget, types.FunctionType) and \
            not is_trusted_module(str(getattr(raw.fget, "__module__", "")))
    return isinstance(getattr(type(raw), "__get__", None), types.FunctionType) and not _is_library_class(type(raw))


def _is_library_class(cls: type) -> bool:
    return is_trusted_module(str(getattr(cls, "__module__", "")))


def functools_cached_property():
    import functools

    return functools.cached_property


def check_instance_dict_in_step(tx, variable: Variable, value: Any, access: str) -> None:
    """An outside object's attributes and its `__dict__` read as a dict are two trackers of one mapping, and the
    trace keeps a change to either apart from the other (pending stores, an outside dict's entries) until the entry
    writes it back. So where the trace would read one after changing the other, or change the attributes while it
    holds the dict, it breaks instead (`access`: "read __dict__", "store" or "read"); the break writes back first."""
    if access == "read __dict__":
        if getattr(variable, "pending", None):
            raise Unsupported(f"reading the __dict__ of {variable.describe()}, whose attributes the trace set")
        return
    held = _held_instance_dict(tx, value)
    if held is None:
        return
    if access == "store":
        if isinstance(held, ExternalDictVariable) and held.materialized is None:
            # Only read so far (a library's __getattribute__ looking a key up in it: transformers' configs), so
            # the store goes on, and the tracker, which would not show it, breaks the graph if it is used again;
            # a later `obj.__dict__` makes a new one (which breaks while the store is pending: above).
            held.stale = f"reading the __dict__ of {variable.describe()} taken before the trace set its attributes"
            del tx.output.wrapped[id(object.__getattribute__(value, "__dict__"))]
            return
        raise Unsupported(f"setting an attribute of {variable.describe()}, whose __dict__ the trace changed")
    if getattr(held, "materialized", None) is not None:  # an outside dict's first change copies it
        raise Unsupported(f"reading an attribute of {variable.describe()}, whose __dict__ the trace changed")


def guard_class_lacks(tx, class_source, cls: type, name: str) -> None:
    """Guards that a lookup on an instance of `cls` still finds no `name` on the class. A name only the metaclass
    gives (`__name__`) is not guarded: hasattr() on the class finds it, while the instance's lookup never does."""
    if not hasattr(cls, name):
        tx.output.guards.has_attr(class_source, name, False)


def _held_instance_dict(tx, value: Any) -> Variable | None:
    """The tracker the trace made of `value.__dict__`, if it read that dict as a value."""
    try:
        instance_dict = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return None
    return tx.output.wrapped.get(id(instance_dict)) if isinstance(instance_dict, dict) else None


class UserObjectVariable(Variable):
    """An instance of a user class from outside the trace."""

    generic_access = True

    def __init__(self, value: Any, source=None):
        self.value = value
        self.source = source
        self.pending: dict[str, Any] = {}  # attribute -> tracker (or DELETED) assigned during the trace

    def describe(self) -> str:
        return f"{type(self.value).__qualname__} object"

    def python_type(self) -> type:
        return type(self.value)

    def user_class(self) -> type:
        return type(self.value)

    def identity(self) -> Any:
        return self.value

    def as_constant(self) -> Any:
        if self.pending:
            raise Unsupported(f"{self.describe()} was modified during the trace")
        return self.value

    def truth(self, tx) -> bool:
        cls = type(self.value)
        if lookup_class_attribute(cls, "__bool__")[0] is MISSING and \
                lookup_class_attribute(cls, "__len__")[0] is MISSING:
            return True
        raise Unsupported(f"truth value of {self.describe()} (its class defines __bool__ or __len__)")

    def getattr(self, tx, name: str, generic: bool = False) -> Variable:
        """`obj.name`; `generic` skips a class-defined __getattribute__ (object.__getattribute__ itself). What the
        trace stored or deleted (`pending`) stands for the instance's own storage in that lookup."""
        return object_getattr(tx, self, self.value, name, generic)

    def has_attribute(self, tx, name: str) -> bool:
        return object_has_attribute(tx, self, self.value, name)

    def own_method(self, name: str) -> Any:
        """The class's own Python `__setattr__` or `__delattr__` (`name`), which the trace inlines, else None. The
        stores and deletions it makes are object.__setattr__'s / object.__delattr__'s, and the entry replays them
        as such: through the class's method again, it would run twice (a counter counting two stores)."""
        raw, _ = lookup_class_attribute(type(self.value), name)
        return raw if isinstance(raw, types.FunctionType) else None

    def setattr(self, tx, name: str, value: Variable, generic: bool = False) -> None:
        """`obj.name = value`; a class-defined __setattr__ is inlined unless `generic`."""
        raw = self.own_method("__setattr__")
        if raw is not None and not generic:
            bind_class_attribute(tx, raw, "__setattr__", self, type(self.value), _class_source(tx, self.source)) \
                .call(tx, [ConstantVariable(name), value], {})
            return
        descriptor, _ = lookup_class_attribute(type(self.value), name)
        if isinstance(descriptor, property):  # its setter runs (inlined); what it stores is replayed
            if descriptor.fset is None:
                raise AttributeFailure(f"property {name!r} of {type(self.value).__qualname__!r} object has no setter")
            property_function(tx, descriptor, "fset", name, type(self.value)).call(tx, [self, value], {})
            return
        if is_data_descriptor(descriptor) and not isinstance(descriptor, types.MemberDescriptorType):
            raise Unsupported(f"setting {name!r} on {self.describe()}: a {type(descriptor).__name__} on its class")
        if self.source is None:
            raise Unsupported(f"setting {name!r} on {self.describe()} that has no source")
        check_instance_dict_in_step(tx, self, self.value, "store")
        self.pending[name] = value
        tx.output.side_effects.mutated_object(self)

    def delattr(self, tx, name: str, generic: bool = False) -> None:
        """`del obj.name`; a class-defined __delattr__ is inlined unless `generic`."""
        raw = self.own_method("__delattr__")
        if raw is not None and not generic:
            bind_class_attribute(tx, raw, "__delattr__", self, type(self.value), _class_source(tx, self.source)) \
                .call(tx, [ConstantVariable(name)], {})
            return
        if self.source is None:
            raise Unsupported(f"deleting {name!r} on {self.describe()} that has no source")
        check_instance_dict_in_step(tx, self, self.value, "store")
        self.pending[name] = DELETED
        tx.output.side_effects.mutated_object(self)

    def call(self, tx, args, kwargs) -> Variable:
        raw, _ = lookup_class_attribute(type(self.value), "__call__")
        if raw is MISSING:
            raise Unsupported(f"{self.describe()} is not callable")
        return bind_class_attribute(tx, raw, "__call__", self, type(self.value),
                                    _class_source(tx, self.source)).call(tx, args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        return self.call_method(tx, "__getitem__", [key], {})

    def length(self, tx) -> int:
        return self.call_method(tx, "__len__", [], {}).as_constant()

    def unpack(self, tx) -> list[Variable]:
        raise Unsupported(f"iterating over {self.describe()}")


def object_getattr(tx, variable: Variable, value: Any, name: str, generic: bool = False) -> Variable:
    """Python's attribute lookup on an outside object, without running its code.

    A class-defined `__getattribute__` is inlined (unless `generic`, which is what
    `object.__getattribute__` inside it asks for).
    """
    cls = type(value)
    source = variable.source
    check_instance_dict_in_step(tx, variable, value, "read __dict__" if name == "__dict__" else "read")
    pending = getattr(variable, "pending", None) or {}  # what the trace stored (or deleted) on the object
    stored = pending.get(name, MISSING)
    raw_getattribute, _ = lookup_class_attribute(cls, "__getattribute__")
    is_config = isinstance(raw_getattribute, types.FunctionType) and _is_model_config(cls)
    if stored is not MISSING and (is_config or _is_module(value)):
        if stored is DELETED:
            raise AttributeFailure(f"reading attribute {name!r} deleted during the trace")
        return stored
    if is_config and source is not None and not generic:
        # A transformers config reads its values through a Python __getattribute__ (per-layer views of
        # heterogeneous configs, a warning at most): side-effect-free data, so the value is read for real
        # and guarded like any other read, instead of tracing the library's machinery (which builds
        # objects kiln cannot create, and made every default-config GPT-2 / Llama forward run eagerly).
        # Methods are bound as usual (a bound method is a new object per read: no value to guard);
        # the config's __getattribute__ leaves them to object.__getattribute__ anyway.
        raw, _ = lookup_class_attribute(cls, name)
        if isinstance(raw, (types.FunctionType, staticmethod, classmethod, types.MethodDescriptorType,
                            types.WrapperDescriptorType)) and name not in vars(value):
            return object_getattr(tx, variable, value, name, generic=True)
        try:
            found = getattr(value, name)
        except AttributeError:
            tx.output.guards.has_attr(source, name, False)
            raise AttributeFailure(f"{cls.__qualname__} object has no attribute {name!r}") from None
        return _wrap_config_value(tx, found, AttrSource(source, name))
    if isinstance(raw_getattribute, types.FunctionType) and not _is_module(value) and not generic:
        raw = raw_getattribute
        return bind_class_attribute(tx, raw, "__getattribute__", variable, cls, _class_source(tx, source)) \
            .call(tx, [ConstantVariable(name)], {})
    if stored is not MISSING and stored is not DELETED:  # in the instance's own storage (its __dict__, a slot)
        return stored
    # past a class's own __getattribute__, guards and entries read what the trace read: object.__getattribute__'s
    own_source = GenericAttrSource if isinstance(raw_getattribute, types.FunctionType) else AttrSource
    deleted = stored is DELETED  # the instance's own storage has no `name` now, whatever it had at the call
    raw, owner = lookup_class_attribute(cls, name)
    data_descriptor = is_data_descriptor(raw)
    if data_descriptor and not isinstance(raw, property) and not deleted:
        # __slots__ members, getset descriptors of builtins: read the real value. A data descriptor of a user
        # class runs its own __get__, which a real read here (and the value guard after it) would run again.
        if _runs_user_get(raw):
            raise Unsupported(f"class attribute {name!r} is a data descriptor of type {type(raw).__name__}")
        try:
            real = raw.__get__(value, cls)
        except AttributeError:
            # An unset slot: the lookup fails (and reaches a class's __getattr__, which is not traced here).
            if lookup_class_attribute(cls, "__getattr__")[0] is not MISSING:
                raise Unsupported(f"reading the unset slot {name!r} of a {cls.__qualname__} with a __getattr__")
            if source is not None:
                tx.output.guards.has_attr(source, name, False)
            raise AttributeFailure(f"{cls.__qualname__} object has no attribute {name!r}") from None
        return tx.wrap(real, own_source(source, name) if source is not None else None)
    if data_descriptor and isinstance(raw, property):
        return bind_class_attribute(tx, raw, name, variable, cls, _class_source(tx, source))
    instance_dict = getattr(value, "__dict__", None)
    if isinstance(instance_dict, dict) and name in instance_dict and not deleted:
        return tx.wrap(instance_dict[name], own_source(source, name) if source is not None else None)
    if raw is not MISSING and not data_descriptor:
        if source is not None and isinstance(instance_dict, dict) and not deleted and \
                isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
            # A method is read through the class; an instance attribute set later
            # (`module.forward = patched`, as accelerate does) would shadow it.
            tx.output.guards.contains(own_source(source, "__dict__"), name, False)
        return bind_class_attribute(tx, raw, name, variable, cls, _class_source(tx, source))
    if name == "__class__":
        return tx.wrap(cls, TypeSource(source) if source is not None else None)
    if name == "__dict__" and isinstance(instance_dict, dict):
        return tx.wrap(instance_dict, AttrSource(source, "__dict__") if source is not None else None)
    fallback, _ = lookup_class_attribute(cls, "__getattr__")
    if fallback is not MISSING:
        if source is not None:  # the read reaches __getattr__ only while neither the instance nor its class has it
            if isinstance(instance_dict, dict) and not deleted:
                tx.output.guards.contains(own_source(source, "__dict__"), name, False)
            guard_class_lacks(tx, TypeSource(source), cls, name)
        return bind_class_attribute(tx, fallback, "__getattr__", variable, cls,
                                    _class_source(tx, source)).call(tx, [ConstantVariable(name)], {})
    if source is not None:  # absent from the class (and from the instance, unless the trace deleted it there)
        if deleted:
            guard_class_lacks(tx, TypeSource(source), cls, name)
        else:
            tx.output.guards.has_attr(source, name, False)
    if deleted:
        raise AttributeFailure(f"reading attribute {name!r} deleted during the trace")
    raise AttributeFailure(f"{cls.__qualname__} object has no attribute {name!r}")


def object_has_attribute(tx, variable: Variable, value: Any, name: str) -> bool:
    """hasattr() on an outside object, guarded."""
    try:
        object_getattr(tx, variable, value, name)
        return True
    except AttributeFailure:
        return False


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


class ClassVariable(Variable):
    """A class: attribute reads, isinstance checks, and construction."""

    def __init__(self, cls: type, source=None):
        self.value = cls
        self.source = source

    def describe(self) -> str:
        return f"class {self.value.__qualname__}"

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(self.value)  # reached through guarded or trusted objects: this very class

    def python_type(self) -> type:
        return type(self.value)

    def identity(self) -> Any:
        return self.value

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def _enum_members(self) -> list[Variable] | None:
        """An Enum class's members in definition order (what iterating it gives), None for another class. An enum
        class cannot gain or lose members, so they need no guard beyond the class's own."""
        if isinstance(self.value, enum.EnumMeta) and type(self.value).__iter__ is enum.EnumMeta.__iter__:
            return [ConstantVariable(member) for member in self.value]
        return None

    def unpack(self, tx) -> list[Variable]:
        members = self._enum_members()
        return members if members is not None else super().unpack(tx)

    def length(self, tx) -> int:
        members = self._enum_members()
        return len(members) if members is not None else super().length(tx)

    def getitem(self, tx, key: Variable) -> Variable:
        if self._enum_members() is not None and type(self.value).__getitem__ is enum.EnumMeta.__getitem__:
            try:
                return ConstantVariable(self.value[key.as_constant()])
            except KeyError:
                raise missing_key(key, self) from None
        return super().getitem(tx, key)

    def truth(self, tx) -> bool:
        if self._enum_members() is not None and type(self.value).__bool__ is enum.EnumMeta.__bool__:
            return True  # EnumType.__bool__: a class is always true
        metaclass = type(self.value)
        if any(lookup_class_attribute(metaclass, name)[1] not in (type, object, None)
               for name in ("__bool__", "__len__")):
            raise Unsupported(f"truth value of {self.describe()} (its metaclass defines __bool__ or __len__)")
        return True

    def getattr(self, tx, name: str) -> Variable:
        raw, _ = lookup_class_attribute(self.value, name)
        meta_raw, _ = lookup_class_attribute(type(self.value), name)
        if _runs_user_get(meta_raw) and (raw is MISSING or is_data_descriptor(meta_raw)):
            # a metaclass's property or descriptor: its __get__ is user code, which a real read here (and the
            # value guard after it, on every call) would run again
            raise Unsupported(f"class attribute {name!r} given by a {type(meta_raw).__name__} of the metaclass")
        if raw is not MISSING and _runs_user_get(raw) and not isinstance(raw, property):
            raise Unsupported(f"class attribute {name!r} is a descriptor of type {type(raw).__name__}")
        if raw is MISSING:
            if name in ("__name__", "__qualname__", "__module__"):
                return ConstantVariable(getattr(self.value, name))
            if name == "__mro__":
                return ConstantVariable(self.value.__mro__)
            raw = getattr(self.value, name, MISSING)
            if raw is MISSING:
                if self.source is not None and not _is_library_class(self.value):  # until the class gains it
                    tx.output.guards.has_attr(self.source, name, False)
                raise AttributeFailure(f"class {self.value.__qualname__} has no attribute {name!r}")
            return tx.wrap(raw, AttrSource(self.source, name) if self.source else None)
        source = AttrSource(self.source, name) if self.source is not None else None
        if isinstance(raw, staticmethod):
            return tx.wrap(raw.__func__, source)
        if isinstance(raw, classmethod):
            return BoundMethodVariable(tx.wrap(raw.__func__, None, guard=False), self)
        if isinstance(raw, property):
            return tx.wrap(raw, None, guard=False)
        return tx.wrap(getattr(self.value, name), source)

    def call(self, tx, args, kwargs) -> Variable:
        special = builder.call_handler(self.value)
        if special is not None:
            return special(tx, args, kwargs)
        return construct_object(tx, self, args, kwargs)

    def reconstruct(self, codegen) -> str:
        return codegen.source(self.source) if self.source is not None else codegen.constant(self.value)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "__call__":  # type.__call__(cls, ...) reached as a descriptor: super().__call__ in a metaclass
            return create_instance(tx, self, args, kwargs)
        return super().call_method(tx, name, args, kwargs)


def _wrap_config_value(tx, value: Any, source) -> Variable:
    """A value read from a transformers config. Its own sequence views (`config.per_layer_config`,
    which iterates by __getitem__ until IndexError) are read for real too, element by element under
    a length guard, as a tuple of their elements: the views are read-only, side-effect-free data."""
    import collections.abc

    view = isinstance(value, collections.abc.Sequence) and not isinstance(value, (list, tuple, str, bytes)) and \
        type(value).__module__.startswith("transformers")
    if not view:
        return tx.wrap(value, source)
    tx.output.guards.length(source, len(value))
    return TupleVariable([_wrap_config_value(tx, value[index], ItemSource(source, index))
                          for index in range(len(value))])


def _is_model_config(cls: type) -> bool:
    """A transformers model config (PreTrainedConfig, PretrainedConfig in older releases)."""
    return any(klass.__name__ in ("PreTrainedConfig", "PretrainedConfig") and klass.__module__.startswith("transformers")
               for klass in cls.__mro__)


def _is_model_output(cls: type) -> bool:
    return any(klass.__name__ == "ModelOutput" and klass.__module__.startswith("transformers")
               for klass in cls.__mro__)


def construct_object(tx, class_variable: ClassVariable, args, kwargs) -> Variable:
    """`cls(*args, **kwargs)` for a user class: ModelOutput, namedtuple, or inlined __init__."""
    cls = class_variable.value
    if _is_model_output(cls):
        return ModelOutputVariable.build(tx, cls, args, kwargs)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        defaults = cls.__new__.__defaults__ or ()
        bound = bind_arguments(cls.__new__.__code__, [class_variable, *args], kwargs, len(defaults),
                               lambda position, name: None if position is None else
                               tx.wrap(defaults[position], None, guard=False))
        return TupleVariable([bound[field] for field in cls._fields], tuple_type=cls)
    import torch

    if issubclass(cls, torch.nn.Module):
        return _construct_torch_module(tx, cls, args, kwargs)
    if issubclass(cls, BaseException):
        return ExceptionVariable.create(tx, cls, args, kwargs)
    metaclass = type(cls)
    call, owner = lookup_class_attribute(metaclass, "__call__")
    if owner is not type:  # a metaclass's own __call__ makes the instance (it usually ends in type.__call__)
        if not isinstance(call, types.FunctionType):
            raise Unsupported(f"creating {cls.__qualname__}: its metaclass {metaclass.__qualname__} has a builtin "
                              "__call__")
        meta_source = None if _is_library_class(metaclass) else tx.output.named_source("__metaclass", metaclass)
        return bind_class_attribute(tx, call, "__call__", class_variable, metaclass, meta_source).call(tx, args, kwargs)
    return create_instance(tx, class_variable, args, kwargs)


def create_instance(tx, class_variable: ClassVariable, args, kwargs) -> Variable:
    """`type.__call__(cls, *args, **kwargs)`: `cls.__new__`, then `__init__` if it made an instance of cls."""
    cls = class_variable.value
    class_source = None if _is_library_class(cls) else tx.output.named_source("__class", cls)
    new, _ = lookup_class_attribute(cls, "__new__")
    if new is object.__new__:
        instance = new_object(cls)
    elif isinstance(new, staticmethod) and isinstance(new.__func__, types.FunctionType):  # a Python __new__
        instance = bind_class_attribute(tx, new, "__new__", class_variable, cls, class_source) \
            .call(tx, [class_variable, *args], kwargs)
        if not issubclass(instance.python_type(), cls):
            return instance  # __new__ made something else: no __init__
    else:
        raise Unsupported(f"creating {cls.__qualname__}: its __new__ is a builtin's ({type(new).__name__}); kiln "
                          "models instances of plain Python classes")
    init, _ = lookup_class_attribute(instance.python_type(), "__init__")
    if init is not object.__init__:
        instance_class = instance.python_type()
        bind_class_attribute(tx, init, "__init__", instance, instance_class,
                             None if _is_library_class(instance_class) else
                             tx.output.named_source("__class", instance_class)).call(tx, args, kwargs)
    elif (args or kwargs) and new is object.__new__:
        raise ProgramException(f"{cls.__qualname__}() takes no arguments", TypeError)
    return instance


def new_object(cls: type) -> "NewObjectVariable":
    """`object.__new__(cls)`: a new instance of a plain Python class, nothing set on it yet."""
    if not all(klass is object or not (klass.__flags__ & _IMMUTABLE_TYPE) for klass in cls.__mro__):
        raise Unsupported(f"object.__new__({cls.__qualname__}): a subclass of a builtin type (the program raises "
                          "TypeError, or needs that type's own __new__)")
    if getattr(cls, "__abstractmethods__", None):
        raise Unsupported(f"creating {cls.__qualname__}, which has abstract methods (the program raises TypeError)")
    return NewObjectVariable(cls)


_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: C types, never a class statement's


# Modules whose module classes' constructors only set attributes of the new module: torch.nn's (trusted as before),
# and transformers' activations (read in transformers 5.25's activations.py), which forwards make with
# `ACT2FN[name](x)` (Mamba's conv).
_PURE_CONSTRUCTOR_MODULES = ("torch.nn.", "transformers.activations")


def _constructs_like_torch_nn(cls: type) -> bool:
    """Whether making a `cls` runs only code known to touch nothing but the new object: every `__init__` (and
    `__new__`) up the MRO is nn.Module's or one of `_PURE_CONSTRUCTOR_MODULES`' classes', so the subclasses between
    define none (a user's `class Act(nn.Module)` with only a forward)."""
    import torch

    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass.__module__.startswith(_PURE_CONSTRUCTOR_MODULES):
            return True
        if "__init__" in vars(klass) or "__new__" in vars(klass):
            return False
    return False


def _construct_torch_module(tx, cls: type, args, kwargs) -> Variable:
    """`nn.CrossEntropyLoss(ignore_index=-1)` inside the trace: made for real, if it holds no tensors.

    Only classes whose construction runs torch.nn's code alone (trusted library code, no side
    effects: `_constructs_like_torch_nn`), with constant arguments; a module with parameters or
    buffers would bring tensors from nowhere into the graph, so those stay unsupported. The module
    lives for the trace only: calling it inlines its forward like any module's.
    """
    import torch

    described = f"creating module {cls.__qualname__} inside a compiled function"
    if not _constructs_like_torch_nn(cls):
        raise Unsupported(f"{described} (only modules whose __init__ is torch.nn's own, without parameters)")
    if not all(arg.is_constant() for arg in [*args, *kwargs.values()]):
        raise Unsupported(f"{described} from values not known at trace time")
    with torch.device("meta"):  # a module with parameters must not draw random numbers here
        module = cls(*[arg.as_constant() for arg in args], **{key: arg.as_constant() for key, arg in kwargs.items()})
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise Unsupported(f"{described} (it has parameters or buffers)")
    variable = tx.wrap(module, None, guard=False)  # a ModuleVariable without a source
    variable.made_as, variable.built_once = (cls, list(args), dict(kwargs)), True
    return variable


class InstanceDictVariable(DictVariable):
    """The `__dict__` of an object made during the trace: the very mapping its attributes live in."""

    def __init__(self, owner: "NewObjectVariable"):
        super().__init__()
        self.owner = owner

    def describe(self) -> str:
        return f"__dict__ of {self.owner.describe()}"

    def reconstruct(self, codegen) -> str:
        # the rebuilt object's own __dict__ (the object is built once, wherever the trace put it), not a copy
        return f"{codegen.constant(vars)}({codegen.value(self.owner)})"


class NewObjectVariable(Variable):
    """An instance created during the trace; its attributes are trackers.

    Attribute access follows Python's rules as `UserObjectVariable` does: a class-defined
    `__getattribute__`, `__setattr__` or `__delattr__` is inlined, properties run their
    getter, setter or deleter, the instance `__dict__` (`instance_dict`, also what
    `obj.__dict__` gives) comes before class attributes, and `__getattr__` is the fallback
    when the lookup raises AttributeError. Class attributes of a user class are read from the
    class and guarded there.
    """

    generic_access = True

    def __init__(self, cls: type):
        self.cls = cls
        self.instance_dict = InstanceDictVariable(self)
        self.slot_values: dict[str, Variable] = {}  # attributes held in __slots__ (member descriptors), set so far

    @property
    def attributes(self) -> dict[Any, Variable]:
        return self.instance_dict.items

    def describe(self) -> str:
        return f"new {self.cls.__qualname__} object"

    def python_type(self) -> type:
        return self.cls

    def user_class(self) -> type:
        return self.cls

    def _class_source(self, tx):
        return None if _is_library_class(self.cls) else tx.output.named_source("__class", self.cls)

    def _bind(self, tx, raw: Any, name: str) -> Variable:
        return bind_class_attribute(tx, raw, name, self, self.cls, self._class_source(tx))

    def getattr(self, tx, name: str, generic: bool = False) -> Variable:
        """`obj.name`; `generic` is object.__getattribute__ itself (no class __getattribute__, no __getattr__)."""
        getattribute, _ = lookup_class_attribute(self.cls, "__getattribute__")
        fallback, _ = lookup_class_attribute(self.cls, "__getattr__")
        try:
            if isinstance(getattribute, types.FunctionType) and not generic:
                return self._bind(tx, getattribute, "__getattribute__").call(tx, [ConstantVariable(name)], {})
            if getattribute is not object.__getattribute__ and not generic:
                raise Unsupported(f"{self.describe()}: its class has a builtin __getattribute__ "
                                  f"({type(getattribute).__name__})")
            return self._generic_getattr(tx, name)
        except AttributeFailure:
            if generic or fallback is MISSING:
                raise
        return self._bind(tx, fallback, "__getattr__").call(tx, [ConstantVariable(name)], {})

    def _generic_getattr(self, tx, name: str) -> Variable:
        """object.__getattribute__: data descriptors, then the instance __dict__, then class attributes."""
        if name == "__dict__":
            return self.instance_dict
        if name == "__class__":
            return tx.wrap(self.cls, self._class_source(tx), guard=False)
        raw, _ = lookup_class_attribute(self.cls, name)
        if is_data_descriptor(raw):
            if isinstance(raw, property):
                return self._bind(tx, raw, name)
            if _is_slot(raw, self.cls):
                if name not in self.slot_values:
                    raise AttributeFailure(f"'{self.cls.__qualname__}' object has no attribute '{name}'")
                return self.slot_values[name]
            raise Unsupported(f"attribute {name!r} of {self.describe()}: a {type(raw).__name__} on its class")
        if name in self.instance_dict.entries:
            return self.instance_dict.entries[name][1]
        if raw is not MISSING:
            return self._bind(tx, raw, name)
        class_source = self._class_source(tx)
        if class_source is not None:  # until the class gains it
            guard_class_lacks(tx, class_source, self.cls, name)
        raise AttributeFailure(f"{self.cls.__qualname__!r} object has no attribute {name!r}")

    def has_attribute(self, tx, name: str) -> bool:
        try:
            self.getattr(tx, name)
            return True
        except AttributeFailure:
            return False

    def setattr(self, tx, name: str, value: Variable, generic: bool = False) -> None:
        """`obj.name = value`; `generic` is object.__setattr__ itself (past a class-defined __setattr__)."""
        setter, _ = lookup_class_attribute(self.cls, "__setattr__")
        if setter is not object.__setattr__ and not generic:
            if not isinstance(setter, types.FunctionType):
                raise Unsupported(f"{self.cls.__qualname__} has a builtin __setattr__ ({type(setter).__name__})")
            self._bind(tx, setter, "__setattr__").call(tx, [ConstantVariable(name), value], {})
            return
        raw, _ = lookup_class_attribute(self.cls, name)
        if isinstance(raw, property):
            if raw.fset is None:
                raise AttributeFailure(f"property {name!r} of {self.cls.__qualname__!r} object has no setter")
            property_function(tx, raw, "fset", name, self.cls).call(tx, [self, value], {})
            return
        if _is_slot(raw, self.cls):
            self.slot_values[name] = value
            return
        if is_data_descriptor(raw):
            raise Unsupported(f"setting {name!r} on {self.describe()}: a {type(raw).__name__} on its class")
        if not _has_instance_dict(self.cls):
            raise AttributeFailure(f"'{self.cls.__qualname__}' object has no attribute '{name}'")
        self.instance_dict.entries[name] = (ConstantVariable(name), value)

    def delattr(self, tx, name: str, generic: bool = False) -> None:
        deleter, _ = lookup_class_attribute(self.cls, "__delattr__")
        if deleter is not object.__delattr__ and not generic:
            if not isinstance(deleter, types.FunctionType):
                raise Unsupported(f"{self.cls.__qualname__} has a builtin __delattr__ ({type(deleter).__name__})")
            self._bind(tx, deleter, "__delattr__").call(tx, [ConstantVariable(name)], {})
            return
        raw, _ = lookup_class_attribute(self.cls, name)
        if isinstance(raw, property):
            if raw.fdel is None:
                raise AttributeFailure(f"property {name!r} of {self.cls.__qualname__!r} object has no deleter")
            property_function(tx, raw, "fdel", name, self.cls).call(tx, [self], {})
            return
        if _is_slot(raw, self.cls):
            if self.slot_values.pop(name, None) is None:
                raise AttributeFailure(f"'{self.cls.__qualname__}' object has no attribute '{name}'")
            return
        if is_data_descriptor(raw):
            raise Unsupported(f"deleting {name!r} on {self.describe()}: a {type(raw).__name__} on its class")
        if name not in self.instance_dict.entries:
            raise AttributeFailure(f"{self.cls.__qualname__!r} object has no attribute {name!r}")
        del self.instance_dict.entries[name]

    def truth(self, tx) -> bool:
        if lookup_class_attribute(self.cls, "__bool__")[0] is not MISSING:
            result = self.call_method(tx, "__bool__", [], {})
            if result.python_type() is not bool:
                raise Unsupported(f"__bool__ of {self.describe()} returned {result.describe()} (the program raises "
                                  "TypeError)")
            return result.truth(tx)
        if lookup_class_attribute(self.cls, "__len__")[0] is not MISSING:
            return self.length(tx) != 0
        return True

    def call(self, tx, args, kwargs) -> Variable:
        return self.call_method(tx, "__call__", args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        return self.call_method(tx, "__getitem__", [key], {})

    def length(self, tx) -> int:
        return self.call_method(tx, "__len__", [], {}).as_constant()

    def reconstruct(self, codegen) -> str:
        # Made without running __init__ (or __post_init__) again, its attributes set as the trace left them
        # (transformers' DynamicCache and its layers, dataclasses; slots through object.__setattr__, which a
        # frozen dataclass's own __setattr__ would refuse, as its __init__ does too).
        inner = ", ".join(f"{codegen.value(key)}: {codegen.value(value)}"
                          for key, value in self.instance_dict.entries.values())
        if not self.slot_values:
            return f"{codegen.constant(rebuild_object)}({codegen.constant(self.cls)}, {{{inner}}})"
        slots = ", ".join(f"{name!r}: {codegen.value(value)}" for name, value in self.slot_values.items())
        return f"{codegen.constant(rebuild_object)}({codegen.constant(self.cls)}, {{{inner}}}, {{{slots}}})"


def has_slots(cls: type) -> bool:
    """Whether instances keep (some) attributes outside a __dict__."""
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        if klass is not object and set(slots) - {"__dict__", "__weakref__"}:
            return True
    return "__dict__" not in dir(cls)


def rebuild_object(cls: type, attributes: dict, slots: dict | None = None) -> Any:
    """An instance of `cls` with these attributes (and values in its __slots__), made as the trace made it but
    without its __init__."""
    instance = object.__new__(cls)
    if attributes:
        instance.__dict__.update(attributes)
    for name, value in (slots or {}).items():
        object.__setattr__(instance, name, value)
    return instance


def _has_instance_dict(cls: type) -> bool:
    """Whether instances of `cls` have a __dict__ (not every class up the MRO declares __slots__ without it)."""
    for klass in cls.__mro__:
        if klass is object:
            continue
        slots = vars(klass).get("__slots__")
        if slots is None or "__dict__" in ((slots,) if isinstance(slots, str) else slots):
            return True
    return False


def _is_slot(raw: Any, cls: type) -> bool:
    """Whether a class attribute is the member descriptor of one of `cls`'s __slots__ (a C class's members,
    such as a builtin's, are not modelled)."""
    return isinstance(raw, types.MemberDescriptorType) and not (raw.__objclass__.__flags__ & _IMMUTABLE_TYPE)


class ModelOutputVariable(Variable):
    """A transformers ModelOutput made in the trace: an OrderedDict of the keys set so far, and attributes.

    As transformers' class does: construction puts its non-None fields in the mapping in declaration order;
    `out[k] = v` sets key and attribute (a None value too); `out.field = v` sets the attribute, and the key only
    when v is not None (setting a field to None leaves its old entry); `to_tuple()` and integer indexing read the
    mapping. Its keys()/values()/items() are live views of the mapping (a view taken before `out["k"] = v` has k).
    """

    def __init__(self, cls: type, fields: dict[str, Variable]):
        self.cls = cls
        self.attributes = dict(fields)  # every dataclass field, None included, in declaration order
        self.mapping = DictVariable(dict_type=collections.OrderedDict)  # the OrderedDict's own entries
        for name, value in fields.items():
            if not _is_none(value):
                self.mapping.entries[name] = (ConstantVariable(name), value)

    @classmethod
    def build(cls_, tx, cls: type, args, kwargs) -> "ModelOutputVariable":
        names = [field.name for field in dataclasses.fields(cls)]
        if len(args) > len(names):
            raise Unsupported(f"{cls.__qualname__} with {len(args)} positional arguments")
        fields = {name: NONE for name in names}
        for name, value in zip(names, args):
            fields[name] = value
        for name, value in kwargs.items():
            if name not in fields:
                raise Unsupported(f"{cls.__qualname__} has no field {name!r}")
            fields[name] = value
        first = fields[names[0]]
        if all(_is_none(fields[name]) for name in names[1:]) and first.python_type() in (list, tuple, dict):
            raise Unsupported(f"{cls.__qualname__} whose only field is a {first.python_type().__name__} (its "
                              "__post_init__ reads it as (key, value) pairs)")
        return cls_(cls, fields)

    def describe(self) -> str:
        return f"{self.cls.__qualname__}"

    def python_type(self) -> type:
        return self.cls

    def present(self) -> list[str]:
        """Its keys, in order."""
        return list(self.mapping.entries)

    def getattr(self, tx, name: str) -> Variable:
        if name in self.attributes:
            return self.attributes[name]
        raw, _ = lookup_class_attribute(self.cls, name)
        if raw is MISSING:
            raise AttributeFailure(f"{self.cls.__qualname__} has no attribute {name!r}")
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__contains__", "__len__",
                    "__iter__", "__setitem__") or name in _MODEL_OUTPUT_REFUSES:
            return TrackerMethod(self, name)
        return bind_class_attribute(tx, raw, name, self, self.cls, None)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "to_tuple":
            return TupleVariable(self.mapping.view_items(tx, "dict_values"))
        if name in ("keys", "values", "items"):
            return DictViewVariable(tx, self.mapping, "dict_" + name, of_object=self)
        if name in ("get", "__contains__", "__len__", "__iter__"):
            return self.mapping.call_method(tx, name, args, kwargs)
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return NONE
        if name in _MODEL_OUTPUT_REFUSES:
            message = f"You cannot use ``{name}`` on a {self.cls.__name__} instance."
            raise ProgramException(message, Exception, [ConstantVariable(message)])
        return self.getattr(tx, name).call(tx, args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        python_key = key.as_constant()
        if isinstance(python_key, str):
            return self.mapping.getitem(tx, key)
        values = self.mapping.view_items(tx, "dict_values")
        if isinstance(python_key, slice):
            return TupleVariable(values[python_key])
        try:
            return values[python_key]
        except IndexError:
            raise ProgramException(f"index {python_key} out of range for {self.describe()}", IndexError,
                                   [ConstantVariable("tuple index out of range")]) from None

    def setitem(self, tx, key: Variable, value: Variable) -> None:
        self.mapping.setitem(tx, key, value)
        self.attributes[key.as_constant()] = value

    def setattr(self, tx, name: str, value: Variable) -> None:
        if name in {field.name for field in dataclasses.fields(self.cls)} and not _is_none(value):
            self.mapping.setitem(tx, ConstantVariable(name), value)
        self.attributes[name] = value

    def truth(self, tx) -> bool:
        return bool(self.mapping.entries)

    def length(self, tx) -> int:
        return len(self.mapping.entries)

    def unpack(self, tx) -> list[Variable]:
        return self.mapping.unpack(tx)

    def live_iterator(self, tx):
        return self.mapping.live_iterator(tx)

    def reconstruct(self, codegen) -> str:
        names = [field.name for field in dataclasses.fields(self.cls)]
        if list(self.attributes) == names and \
                list(self.mapping.entries) == [name for name in names if not _is_none(self.attributes[name])] and \
                all(self.attributes[name] is value for name, (_, value) in self.mapping.entries.items()):
            inner = ", ".join(f"{name}={codegen.value(self.attributes[name])}" for name in self.present())
            return f"{codegen.constant(self.cls)}({inner})"
        attributes = ", ".join(f"{name!r}: {codegen.value(value)}" for name, value in self.attributes.items())
        mapping = ", ".join(f"{codegen.value(key)}: {codegen.value(value)}" for key, value in
                            self.mapping.entries.values())
        return f"{codegen.constant(rebuild_model_output)}({codegen.constant(self.cls)}, {{{attributes}}}, {{{mapping}}})"


_MODEL_OUTPUT_REFUSES = ("__delitem__", "setdefault", "pop", "update")


def _is_none(value: Variable) -> bool:
    return isinstance(value, ConstantVariable) and value.value is None


def rebuild_model_output(cls: type, attributes: dict, mapping: dict) -> Any:
    """A ModelOutput with these attributes and these entries (in order), as the trace left it: made with every
    field None (an empty mapping), then filled without its `__setattr__`/`__setitem__`."""
    output = cls(*[None] * len(dataclasses.fields(cls)))
    output.__dict__.update(attributes)
    collections.OrderedDict.update(output, mapping)
    return output


# The builtin `__str__`s that read only an exception's `args` (OSError's, SyntaxError's, ... read more).
_ARGS_TEXT = (BaseException.__str__, KeyError.__str__)
# The builtin exceptions whose C `__new__` does more than BaseException's (keep `args`).
_OWN_NEW = (OSError, BaseExceptionGroup)


class ExceptionVariable(Variable):
    """An exception object the program made (`ValueError("no")`) or kiln raised for it (a missing key).

    `args` are what BaseException keeps as `.args` (trackers), or None where kiln does not know
    Python's exact arguments (the message of an AttributeError kiln's own lookup raised): reading
    them is then unsupported. A user subclass's `__init__` runs inlined, and what it stores is kept.
    """

    def __init__(self, cls: type, args: list[Variable] | None):
        self.cls = cls
        self.args = None if args is None else list(args)
        self.attributes: dict[str, Variable] = {}

    @classmethod
    def create(cls_, tx, cls: type, args: list[Variable], kwargs: dict[str, Variable]) -> "ExceptionVariable":
        """`cls(*args, **kwargs)`: BaseException.__new__ keeps `args`, then the class's __init__ runs."""
        new, _ = lookup_class_attribute(cls, "__new__")
        if isinstance(new, staticmethod) or isinstance(new, types.FunctionType):
            raise Unsupported(f"creating exception {cls.__qualname__}, whose class defines __new__")
        if issubclass(cls, _OWN_NEW):  # OSError(2, ...) is a FileNotFoundError: the class Python picks, for real
            if cls.__module__ != "builtins" or kwargs or not all(arg.is_constant() for arg in args):
                raise Unsupported(f"creating exception {cls.__qualname__} (its builtin __new__ picks the class)")
            cls = type(run_on_constants(cls, [arg.as_constant() for arg in args], {}))
        exception = cls_(cls, args)
        init, owner = lookup_class_attribute(cls, "__init__")
        if isinstance(init, types.FunctionType):
            bind_class_attribute(tx, init, "__init__", exception, cls, tx.output.named_source("__class", cls)) \
                .call(tx, args, kwargs)
        elif kwargs:
            raise Unsupported(f"{cls.__qualname__}() with keyword arguments")
        return exception

    def describe(self) -> str:
        return f"{self.cls.__name__} exception"

    def python_type(self) -> type:
        return self.cls

    def getattr(self, tx, name: str) -> Variable:
        if name in self.attributes:
            return self.attributes[name]
        if name == "args":
            if self.args is None:
                raise Unsupported(f"the arguments of {self.describe()} (Python's exact message is not known to kiln)")
            return TupleVariable(list(self.args))
        if name == "__class__":
            return ClassVariable(self.cls)
        if name in ("__cause__", "__context__"):
            return self.attributes.get(name, NONE)
        if name == "__suppress_context__":
            return ConstantVariable(name in self.attributes and "__cause__" in self.attributes)
        if name == "value" and issubclass(self.cls, StopIteration) and self.args is not None and \
                lookup_class_attribute(self.cls, "__init__")[1] is StopIteration:
            return self.args[0] if self.args else NONE  # StopIteration.__init__ keeps args[0] as .value
        raw, owner = lookup_class_attribute(self.cls, name)
        if raw is not MISSING and owner.__module__ != "builtins":  # a method of a user exception class
            return bind_class_attribute(tx, raw, name, self, self.cls, tx.output.named_source("__class", self.cls))
        if name == "with_traceback":
            return TrackerMethod(self, name)
        if raw is not MISSING:
            raise Unsupported(f"attribute {name!r} of {self.describe()}")
        raise AttributeFailure(f"{self.cls.__qualname__!r} object has no attribute {name!r}")

    def setattr(self, tx, name: str, value: Variable) -> None:
        if name == "args":
            self.args = value.unpack(tx)
            return
        self.attributes[name] = value

    def text(self, tx, conversion: Callable[[Any], str]) -> Variable:
        """`str(error)` / `repr(error)` / `format(error)`: a user class's Python `__str__` or `__repr__` is
        inlined; else Python's own text, from an exception object made now from the known arguments."""
        dunder = "__str__" if conversion is str else "__repr__"
        raw, owner = lookup_class_attribute(self.cls, dunder)
        if isinstance(raw, types.FunctionType):
            if conversion is ascii:
                raise Unsupported(f"ascii() of {self.describe()}, whose class defines __repr__")
            return self.getattr(tx, dunder).call(tx, [], {})
        return ConstantVariable(conversion(self.textual_copy((dunder,))))

    def textual_copy(self, dunders: tuple[str, ...] = ("__format__", "__str__")) -> BaseException:
        """A real exception of this class holding the same (constant) arguments, whose `dunders` (the methods
        the caller will run on it) must be builtin ones that read only `args`: made without any `__init__`."""
        if self.args is None or not all(arg.is_constant() for arg in self.args):
            raise Unsupported(f"the text of {self.describe()} (its arguments are not all known constants)")
        allowed = {"__str__": _ARGS_TEXT, "__repr__": (BaseException.__repr__,), "__format__": (object.__format__,)}
        for dunder in dunders:
            if lookup_class_attribute(self.cls, dunder)[0] not in allowed[dunder]:
                raise Unsupported(f"the text of {self.describe()} ({dunder} of {self.cls.__qualname__} reads more "
                                  "than its arguments)")
        if issubclass(self.cls, _OWN_NEW):  # OSError(2, ...) makes a FileNotFoundError: not modelled
            raise Unsupported(f"the text of {self.describe()} (its builtin __new__ does more than keep its arguments)")
        exception = BaseException.__new__(self.cls)
        exception.args = tuple(arg.as_constant() for arg in self.args)
        return exception

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "__init__":  # BaseException.__init__ (from a subclass's super().__init__(...))
            if kwargs:
                raise Unsupported(f"{self.cls.__qualname__}.__init__ with keyword arguments")
            self.args = list(args)
            return NONE
        if name == "with_traceback":  # kiln's exceptions carry no traceback
            return self
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.args is None or self.attributes or self.cls.__module__ != "builtins":
            raise Unsupported(f"returning {self.describe()} from a compiled function")
        return f"{codegen.constant(self.cls)}({''.join(codegen.value(arg) + ', ' for arg in self.args)})"


class ContextVarVariable(Variable):
    """A contextvars.ContextVar: set/reset inside the trace are tracked, not performed."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source
        self.current: list[Variable] = []

    def describe(self) -> str:
        return f"ContextVar {self.value.name!r}"

    def identity(self) -> Any:
        return self.value

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "set":
            self.current.append(args[0])
            tx.output.side_effects.context_vars.add(self)
            return ContextVarTokenVariable(self, len(self.current) - 1)
        if name == "reset":
            token = args[0]
            if not isinstance(token, ContextVarTokenVariable) or token.var is not self:
                raise Unsupported("ContextVar.reset with a token from outside the trace")
            del self.current[token.depth:]
            return NONE
        if name == "get":
            if self.current:
                return self.current[-1]
            marker = object()
            real = self.value.get(marker) if not args else self.value.get(args[0].as_constant())
            if real is marker:
                raise Unsupported(f"{self.describe()}.get() with no value")
            return tx.wrap_sourceless(real)
        raise Unsupported(f"ContextVar.{name}")


class ContextVarTokenVariable(Variable):
    def __init__(self, var: ContextVarVariable, depth: int):
        self.var = var
        self.depth = depth
