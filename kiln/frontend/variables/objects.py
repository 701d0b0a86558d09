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

import dataclasses
import types
from typing import Any

from kiln.frontend.errors import AttributeFailure, Unsupported
from kiln.frontend.sources import AttrSource, ItemSource, TypeSource
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import (MISSING, NONE, ConstantVariable, TrackerMethod, Variable, is_trusted_module,
                                          lookup_class_attribute)
from kiln.frontend.variables.containers import IteratorVariable, ListIteratorLike, TupleVariable
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
            raise Unsupported(f"property {name!r} without a getter")
        getter_source = AttrSource(attribute_source, "fget") if guard else None
        return tx.wrap(raw.fget, getter_source, guard=guard).call(tx, [instance], {})
    if isinstance(raw, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return BoundMethodVariable(MethodDescriptorVariable(raw.__objclass__, name), instance)
    if isinstance(raw, functools_cached_property()):
        raise Unsupported(f"functools.cached_property {name!r}")
    if hasattr(type(raw), "__get__") and not isinstance(raw, type):
        raise Unsupported(f"class attribute {name!r} is a descriptor of type {type(raw).__name__}")
    return tx.wrap(raw, AttrSource(instance.source, name) if instance.source is not None else None)


def _is_library_class(cls: type) -> bool:
    return is_trusted_module(str(getattr(cls, "__module__", "")))


def functools_cached_property():
    import functools

    return functools.cached_property


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
        """`obj.name`; `generic` skips a class-defined __getattribute__ (object.__getattribute__ itself)."""
        if name in self.pending:
            if self.pending[name] is DELETED:
                raise AttributeFailure(f"reading attribute {name!r} deleted during the trace")
            return self.pending[name]
        return object_getattr(tx, self, self.value, name, generic)

    def has_attribute(self, tx, name: str) -> bool:
        if name in self.pending:
            return self.pending[name] is not DELETED
        return object_has_attribute(tx, self, self.value, name)

    def setattr(self, tx, name: str, value: Variable, generic: bool = False) -> None:
        """`obj.name = value`; a class-defined __setattr__ is inlined unless `generic`."""
        raw, _ = lookup_class_attribute(type(self.value), "__setattr__")
        if isinstance(raw, types.FunctionType) and not generic:
            bind_class_attribute(tx, raw, "__setattr__", self, type(self.value), _class_source(tx, self.source)) \
                .call(tx, [ConstantVariable(name), value], {})
            return
        if self.source is None:
            raise Unsupported(f"setting {name!r} on {self.describe()} that has no source")
        self.pending[name] = value
        tx.output.side_effects.mutated_object(self)

    def delattr(self, tx, name: str) -> None:
        if self.source is None:
            raise Unsupported(f"deleting {name!r} on {self.describe()} that has no source")
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
    raw_getattribute, _ = lookup_class_attribute(cls, "__getattribute__")
    if isinstance(raw_getattribute, types.FunctionType) and _is_model_config(cls) and source is not None \
            and not generic:
        # A transformers config reads its values through a Python __getattribute__ (per-layer views of
        # heterogeneous configs, a warning at most): side-effect-free data, so the value is read for real
        # and guarded like any other read, instead of tracing the library's machinery (which builds
        # objects kiln cannot create, and made every default-config GPT-2 / Llama forward run eagerly).
        # Methods are bound as usual (a bound method is a new object per read: no value to guard);
        # the config's __getattribute__ leaves them to object.__getattribute__ anyway.
        raw, _ = lookup_class_attribute(cls, name)
        if isinstance(raw, (types.FunctionType, staticmethod, classmethod)) and name not in vars(value):
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
    raw, owner = lookup_class_attribute(cls, name)
    is_data_descriptor = raw is not MISSING and (hasattr(type(raw), "__set__") or hasattr(type(raw), "__delete__"))
    if is_data_descriptor and not isinstance(raw, property):
        # __slots__ members, getset descriptors of builtins: read the real value.
        real = getattr(value, name)
        return tx.wrap(real, AttrSource(source, name) if source is not None else None)
    if is_data_descriptor:
        return bind_class_attribute(tx, raw, name, variable, cls, _class_source(tx, source))
    instance_dict = getattr(value, "__dict__", None)
    if isinstance(instance_dict, dict) and name in instance_dict:
        return tx.wrap(instance_dict[name], AttrSource(source, name) if source is not None else None)
    if raw is not MISSING:
        if source is not None and isinstance(instance_dict, dict) and \
                isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
            # A method is read through the class; an instance attribute set later
            # (`module.forward = patched`, as accelerate does) would shadow it.
            tx.output.guards.contains(AttrSource(source, "__dict__"), name, False)
        return bind_class_attribute(tx, raw, name, variable, cls, _class_source(tx, source))
    if name == "__class__":
        return tx.wrap(cls, TypeSource(source) if source is not None else None)
    if name == "__dict__" and isinstance(instance_dict, dict):
        return tx.wrap(instance_dict, AttrSource(source, "__dict__") if source is not None else None)
    fallback, _ = lookup_class_attribute(cls, "__getattr__")
    if fallback is not MISSING:
        return bind_class_attribute(tx, fallback, "__getattr__", variable, cls,
                                    _class_source(tx, source)).call(tx, [ConstantVariable(name)], {})
    if source is not None:
        tx.output.guards.has_attr(source, name, False)
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

    def getattr(self, tx, name: str) -> Variable:
        raw, _ = lookup_class_attribute(self.value, name)
        if raw is MISSING:
            if name in ("__name__", "__qualname__", "__module__"):
                return ConstantVariable(getattr(self.value, name))
            if name == "__mro__":
                return ConstantVariable(self.value.__mro__)
            raw = getattr(self.value, name, MISSING)
            if raw is MISSING:
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
        return ExceptionVariable(cls, args)
    import abc

    # ABCMeta adds only the abstract-method check to creating an instance (transformers' cache layers).
    if cls.__new__ is not object.__new__ or type(cls) not in (type, abc.ABCMeta):
        raise Unsupported(f"creating {cls.__qualname__} (custom __new__ or metaclass)")
    if getattr(cls, "__abstractmethods__", None):
        raise Unsupported(f"creating {cls.__qualname__}, which has abstract methods")
    instance = NewObjectVariable(cls)
    init, _ = lookup_class_attribute(cls, "__init__")
    if init is not object.__init__:
        bind_class_attribute(tx, init, "__init__", instance, cls, None).call(tx, args, kwargs)
    elif args or kwargs:
        raise Unsupported(f"{cls.__qualname__}() takes no arguments")
    return instance


def _construct_torch_module(tx, cls: type, args, kwargs) -> Variable:
    """`nn.CrossEntropyLoss(ignore_index=-1)` inside the trace: made for real, if it holds no tensors.

    Only torch.nn's own classes (trusted library code, no side effects) with constant
    arguments; a module with parameters or buffers would bring tensors from nowhere into
    the graph, so those stay unsupported. The module lives for the trace only: calling it
    inlines its forward like any module's.
    """
    import torch

    described = f"creating module {cls.__qualname__} inside a compiled function"
    if not cls.__module__.startswith("torch.nn."):
        raise Unsupported(f"{described} (only torch.nn's own modules, without parameters)")
    if not all(arg.is_constant() for arg in [*args, *kwargs.values()]):
        raise Unsupported(f"{described} from values not known at trace time")
    with torch.device("meta"):  # a module with parameters must not draw random numbers here
        module = cls(*[arg.as_constant() for arg in args], **{key: arg.as_constant() for key, arg in kwargs.items()})
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise Unsupported(f"{described} (it has parameters or buffers)")
    return tx.wrap(module, None, guard=False)  # a ModuleVariable without a source


class NewObjectVariable(Variable):
    """An instance created during the trace; its attributes are trackers."""

    def __init__(self, cls: type):
        self.cls = cls
        self.attributes: dict[str, Variable] = {}

    def describe(self) -> str:
        return f"new {self.cls.__qualname__} object"

    def python_type(self) -> type:
        return self.cls

    def user_class(self) -> type:
        return self.cls

    def getattr(self, tx, name: str) -> Variable:
        raw, _ = lookup_class_attribute(self.cls, name)
        if raw is not MISSING and isinstance(raw, property):
            return bind_class_attribute(tx, raw, name, self, self.cls, None)
        if name in self.attributes:
            return self.attributes[name]
        if raw is not MISSING:
            return bind_class_attribute(tx, raw, name, self, self.cls, None)
        if name == "__class__":
            return ClassVariable(self.cls)
        fallback, _ = lookup_class_attribute(self.cls, "__getattr__")
        if fallback is not MISSING:
            return bind_class_attribute(tx, fallback, "__getattr__", self, self.cls, None).call(
                tx, [ConstantVariable(name)], {})
        raise AttributeFailure(f"{self.cls.__qualname__} object has no attribute {name!r}")

    def setattr(self, tx, name: str, value: Variable) -> None:
        raw, _ = lookup_class_attribute(self.cls, "__setattr__")
        if raw is not object.__setattr__:
            raise Unsupported(f"{self.cls.__qualname__} overrides __setattr__")
        self.attributes[name] = value

    def delattr(self, tx, name: str) -> None:
        self.attributes.pop(name, None)

    def truth(self, tx) -> bool:
        if lookup_class_attribute(self.cls, "__bool__")[0] is MISSING and \
                lookup_class_attribute(self.cls, "__len__")[0] is MISSING:
            return True
        return self.call_method(tx, "__bool__", [], {}).truth(tx)

    def call(self, tx, args, kwargs) -> Variable:
        return self.call_method(tx, "__call__", args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        return self.call_method(tx, "__getitem__", [key], {})

    def length(self, tx) -> int:
        return self.call_method(tx, "__len__", [], {}).as_constant()

    def reconstruct(self, codegen) -> str:
        if not dataclasses.is_dataclass(self.cls):
            # A plain object (object.__new__, no __slots__): made without running __init__ again, its
            # attributes set as the trace left them (transformers' DynamicCache and its layers).
            if "__slots__" in vars(self.cls) or not hasattr(self.cls, "__dict__"):
                raise Unsupported(f"returning a {self.cls.__qualname__} object created inside the compiled function "
                                  "(its class has __slots__)")
            inner = ", ".join(f"{name!r}: {codegen.value(value)}" for name, value in self.attributes.items())
            return f"{codegen.constant(rebuild_object)}({codegen.constant(self.cls)}, {{{inner}}})"
        fields = [field.name for field in dataclasses.fields(self.cls) if field.init]
        if set(self.attributes) != {field.name for field in dataclasses.fields(self.cls)}:
            raise Unsupported(f"returning {self.cls.__qualname__}: attributes beyond its dataclass fields")
        inner = ", ".join(f"{name}={codegen.value(self.attributes[name])}" for name in fields)
        return f"{codegen.constant(self.cls)}({inner})"


def rebuild_object(cls: type, attributes: dict) -> Any:
    """An instance of `cls` with these attributes, made as the trace made it but without its __init__."""
    instance = object.__new__(cls)
    instance.__dict__.update(attributes)
    return instance


class ModelOutputVariable(Variable):
    """A transformers ModelOutput: an ordered mapping of its non-None fields, also by attribute."""

    def __init__(self, cls: type, fields: dict[str, Variable]):
        self.cls = cls
        self.fields = fields  # every dataclass field, None included, in declaration order

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
        return cls_(cls, fields)

    def describe(self) -> str:
        return f"{self.cls.__qualname__}"

    def python_type(self) -> type:
        return self.cls

    def present(self) -> list[str]:
        return [name for name, value in self.fields.items()
                if not (isinstance(value, ConstantVariable) and value.value is None)]

    def getattr(self, tx, name: str) -> Variable:
        if name in self.fields:
            return self.fields[name]
        raw, _ = lookup_class_attribute(self.cls, name)
        if raw is MISSING:
            raise AttributeFailure(f"{self.cls.__qualname__} has no attribute {name!r}")
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__contains__", "__len__",
                    "__iter__", "__setitem__"):
            return TrackerMethod(self, name)
        return bind_class_attribute(tx, raw, name, self, self.cls, None)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "to_tuple":
            return TupleVariable([self.fields[key] for key in self.present()])
        if name == "keys":
            return ListIteratorLike([ConstantVariable(key) for key in self.present()], "dict_keys")
        if name == "values":
            return ListIteratorLike([self.fields[key] for key in self.present()], "dict_values")
        if name == "items":
            return ListIteratorLike([TupleVariable([ConstantVariable(key), self.fields[key]])
                                     for key in self.present()], "dict_items")
        if name == "get":
            key = args[0].as_constant()
            return self.fields[key] if key in self.present() else (args[1] if len(args) > 1 else NONE)
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return NONE
        if name == "__contains__":
            return ConstantVariable(args[0].as_constant() in self.present())
        if name == "__len__":
            return ConstantVariable(len(self.present()))
        if name == "__iter__":
            return IteratorVariable([ConstantVariable(key) for key in self.present()])
        return self.getattr(tx, name).call(tx, args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        python_key = key.as_constant()
        if isinstance(python_key, str):
            if python_key not in self.present():
                raise Unsupported(f"{self.cls.__qualname__}[{python_key!r}] is missing (the program raises KeyError)")
            return self.fields[python_key]
        values = [self.fields[name] for name in self.present()]
        if isinstance(python_key, slice):
            return TupleVariable(values[python_key])
        return values[python_key]

    def setitem(self, tx, key: Variable, value: Variable) -> None:
        self.fields[key.as_constant()] = value

    def setattr(self, tx, name: str, value: Variable) -> None:
        self.fields[name] = value

    def truth(self, tx) -> bool:
        return bool(self.present())

    def length(self, tx) -> int:
        return len(self.present())

    def unpack(self, tx) -> list[Variable]:
        return [ConstantVariable(key) for key in self.present()]

    def reconstruct(self, codegen) -> str:
        inner = ", ".join(f"{name}={codegen.value(self.fields[name])}" for name in self.present())
        return f"{codegen.constant(self.cls)}({inner})"


class ExceptionVariable(Variable):
    """An exception object created by the program (only raising it is unsupported)."""

    def __init__(self, cls: type, args: list[Variable]):
        self.cls = cls
        self.args = args

    def describe(self) -> str:
        return f"{self.cls.__name__} exception"

    def python_type(self) -> type:
        return self.cls


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
