"""The variable tracker protocol, the tracer protocol, and Python constants.

A `Variable` stands for one Python value during symbolic interpretation. It knows
its `source` (where it came from, for guards and for rebuilding it at run time) and
answers the operations the interpreter needs: attribute reads, calls, method
calls, iteration, truth value, and `reconstruct` (a Python expression that
recreates it after the graph ran). Anything a kind does not model raises
`Unsupported`, which names the operation.

`Tracer` and `TracedOutput` are what trackers call on the frame being interpreted and
on its output graph (interpreter.Frame and output.OutputGraph implement them), so no
tracker imports the interpreter: trackers make other trackers from real values through
`tx.wrap` / `tx.wrap_sourceless`. This module imports no other tracker module.

`ConstantVariable` holds an immutable Python value (None, bool, int, float, str,
bytes, tuple-free literals, dtypes, devices, ranges, frozensets ...); operations on
constants run for real at trace time, since they cannot have side effects.
"""
from __future__ import annotations

import inspect
import operator
from types import FunctionType
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from kiln.frontend.errors import AttributeFailure, ProgramException, Unsupported
from kiln.frontend.sources import Source

MISSING = object()  # what lookup_class_attribute finds for a name no class in the MRO defines


class TracedOutput(Protocol):
    """The output graph as trackers use it (output.OutputGraph): graph nodes, guards, side effects."""

    guards: Any  # guards.GuardBuilder
    side_effects: Any  # side_effects.SideEffects
    guard_namespace: dict[str, Any]  # the guard function's globals
    wrapped: dict[int, "Variable"]  # id(value) -> its tracker, one per object and trace

    def tensor_input(self, tx: "Tracer", value: torch.Tensor, source: Source) -> "Variable": ...

    def scalar_input(self, tx: "Tracer", value: Any, source: Source) -> "Variable | None":
        """An int or float argument as a graph input when it changes between calls (dynamic.py), else None."""
        ...

    def remember_wrapped(self, value: Any, variable: "Variable") -> None: ...

    def call_tensor_op(self, tx: "Tracer", kind: str, target: Any, args: list, kwargs: dict) -> "Variable": ...

    def tensor_metadata(self, tx: "Tracer", tensor: "Variable", method: str, args: list, value: Any) -> "Variable":
        """`tensor.method(*args)` (size, stride, numel, ...) whose result `value` may be symbolic."""
        ...

    def symbolic_number(self, tx: "Tracer", value: Any, make_node: Any) -> "Variable":
        """The tracker for a SymInt/SymFloat; `make_node()` computes it in the graph when no input binds it."""
        ...

    def symbolic_node(self, kind: str, target: Any, args: tuple, value: Any, kwargs: dict | None = None
                      ) -> torch.fx.Node: ...

    def named_source(self, prefix: str, value: Any) -> Source: ...

    def set_grad_enabled(self, tx: "Tracer", enabled: bool) -> None: ...

    def enter_autocast(self, autocast: torch.autocast) -> torch.fx.Node: ...

    def exit_autocast(self, autocast: torch.autocast, mode_node: torch.fx.Node) -> None: ...


class Tracer(Protocol):
    """The frame being interpreted, as trackers use it (interpreter.Frame)."""

    output: TracedOutput

    def wrap(self, value: Any, source: Source | None, guard: bool = True) -> "Variable": ...

    def wrap_sourceless(self, value: Any) -> "Variable": ...

    def inline_call(self, function: "Variable", args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        ...

    def make_super(self, args: list["Variable"]) -> "Variable": ...

    def python_caller(self, levels: int) -> "Tracer | None": ...

    def behind_uninterpreted_frames(self) -> AbstractContextManager: ...

    def exception_info(self) -> "Variable": ...


class Variable:
    """Base of all trackers. Subclasses override what they support."""

    source: Source | None = None
    # getattr/setattr take `generic=True` (object.__getattribute__ / __setattr__, past the class's own): outside
    # objects of user classes
    generic_access = False

    def python_type(self) -> type:
        raise Unsupported(f"type() of {self.describe()}")

    def describe(self) -> str:
        return type(self).__name__

    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        """The plain Python value, when it is fully known at trace time."""
        raise Unsupported(f"{self.describe()} is not a constant here")

    def identity(self) -> Any:
        """The object `is` compares: the real object when tracked, else the tracker."""
        return self

    def user_class(self) -> type | None:
        """The user class whose Python-level methods the trace inlines for this value (objects.py's
        objects); None for the kinds kiln models itself."""
        return None

    def getattr(self, tx: "Tracer", name: str) -> "Variable":
        """Default: a method of the value's Python type, served by this tracker's `call_method`."""
        if type(self).call_method is not Variable.call_method:
            try:
                python_type = self.python_type()
            except Unsupported:
                python_type = None
            if python_type is not None and callable(getattr(python_type, name, None)):
                return TrackerMethod(self, name)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def call(self, tx: "Tracer", args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        raise Unsupported(f"calling {self.describe()}")

    def call_method(self, tx: "Tracer", name: str, args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        method = self.getattr(tx, name)
        if isinstance(method, TrackerMethod) and method.receiver is self and method.name == name:
            # the type has the method, but this tracker's call_method does not model it (it asked us)
            raise Unsupported(f"{self.describe()}.{name}() (kiln does not model this method)")
        return method.call(tx, args, kwargs)

    def unpack(self, tx: "Tracer") -> list["Variable"]:
        """The items iteration would produce, all at once."""
        raise Unsupported(f"iterating over {self.describe()}")

    def truth(self, tx: "Tracer") -> bool:
        raise Unsupported(f"truth value of {self.describe()}")

    def length(self, tx: "Tracer") -> int:
        return len(self.unpack(tx))

    def getitem(self, tx: "Tracer", key: "Variable") -> "Variable":
        raise Unsupported(f"indexing {self.describe()}")

    def setitem(self, tx: "Tracer", key: "Variable", value: "Variable") -> None:
        raise Unsupported(f"item assignment on {self.describe()}")

    def setattr(self, tx: "Tracer", name: str, value: "Variable") -> None:
        raise Unsupported(f"setting attribute {name!r} on {self.describe()}")

    def reconstruct(self, codegen) -> str:
        """A Python expression recreating this value after the graph ran."""
        if self.source is not None:
            return codegen.source(self.source)
        raise Unsupported(f"returning {self.describe()} from a compiled function")

    def __repr__(self) -> str:
        return f"{self.describe()}(source={self.source})"


class TrackerMethod(Variable):
    """`receiver.name` for a method the receiver's tracker implements in `call_method`."""

    def __init__(self, receiver: Variable, name: str):
        self.receiver = receiver
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.receiver.describe()}"

    def reconstruct(self, codegen) -> str:
        return f"{codegen.value(self.receiver)}.{self.name}"

    def call(self, tx, args, kwargs) -> Variable:
        return self.receiver.call_method(tx, self.name, args, kwargs)


class NullVariable(Variable):
    """The NULL CPython pushes beside a callable."""

    def describe(self) -> str:
        return "NULL"


NULL = NullVariable()


_IMMUTABLE_TYPES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented),
                    range, slice, frozenset, torch.dtype, torch.device, torch.layout, torch.memory_format,
                    torch.finfo, torch.iinfo, inspect.Signature, inspect.Parameter)


def is_constant_value(value: Any) -> bool:
    """Whether `value` is an immutable literal a ConstantVariable may hold."""
    if isinstance(value, _IMMUTABLE_TYPES):
        if isinstance(value, frozenset):
            return all(is_constant_value(item) for item in value)
        return True
    if type(value) is tuple:
        return all(is_constant_value(item) for item in value)
    return False


class ObjectIdVariable(Variable):
    """`id(obj)` of an object made in the trace: its value exists only when the program runs, but two are equal
    exactly when their objects are the same one (an outside object's id never equals it: both objects are alive),
    and it keys dicts by that object (a memo: `seen[id(obj)]`). Computed with or printed, it is unsupported."""

    def __init__(self, target: "Variable"):
        self.target = target

    def describe(self) -> str:
        return f"id of {self.target.describe()}"

    def python_type(self) -> type:
        return int

    def identity(self) -> Any:
        return _ObjectId(self.target)

    def truth(self, tx) -> bool:
        return True  # no object has id 0

    def equals(self, other: "Variable", tx) -> bool:
        return isinstance(other, ObjectIdVariable) and is_same(self.target, other.target, tx)

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(id)}({codegen.value(self.target)})"


class _ObjectId:
    """A dict key standing for `id(obj)` of a tracker's object (`ObjectIdVariable.identity`)."""

    __slots__ = ("target",)

    def __init__(self, target: "Variable"):
        self.target = target

    def __eq__(self, other) -> bool:
        return isinstance(other, _ObjectId) and other.target is self.target

    def __hash__(self) -> int:
        return hash(id(self.target))

    def __repr__(self) -> str:
        return f"id({self.target.describe()})"


class ConstantVariable(Variable):
    """An immutable Python value known at trace time."""

    def __init__(self, value: Any, source: Source | None = None):
        self.value = value
        self.source = source

    def describe(self) -> str:
        text = repr(self.value)
        return f"constant {text if len(text) < 40 else text[:37] + '...'}"

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def identity(self) -> Any:
        return self.value

    def truth(self, tx) -> bool:
        return bool(self.value)

    def length(self, tx) -> int:
        return len(self.value)

    def unpack(self, tx) -> list[Variable]:
        try:
            items = list(self.value)
        except TypeError:
            raise Unsupported(f"iterating over {self.describe()}") from None
        return [ConstantVariable(item) for item in items]

    def getattr(self, tx, name: str) -> Variable:
        try:
            value = getattr(self.value, name)
        except AttributeError as error:
            raise AttributeFailure(f"{self.describe()} has no attribute {name!r}: {error}") from None
        return tx.wrap_sourceless(value)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if all(arg.is_constant() for arg in args) and all(arg.is_constant() for arg in kwargs.values()):
            method = getattr(self.value, name, None)
            if method is None:
                raise Unsupported(f"{self.describe()} has no method {name!r}")
            result = run_on_constants(method, [arg.as_constant() for arg in args],
                                      {key: arg.as_constant() for key, arg in kwargs.items()})
            return tx.wrap_sourceless(result)
        if isinstance(self.value, str) and name == "join" and len(args) == 1:
            items = [item.as_constant() for item in args[0].unpack(tx)]
            return ConstantVariable(self.value.join(items))
        if isinstance(self.value, str) and name == "format":
            raise Unsupported(f"str.format with non-constant arguments on {self.describe()}")
        return super().call_method(tx, name, args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        return tx.wrap_sourceless(run_on_constants(operator.getitem, [self.value, key.as_constant()], {}))

    def reconstruct(self, codegen) -> str:
        if self.source is not None and type(self.value) not in (type(None), bool, int):
            return codegen.source(self.source)  # the outside object itself (`f(t) is t` for a tuple t)
        return codegen.constant(self.value)


class ArgumentConstant(ConstantVariable):
    """A constant argument of the traced frame, guarded (by type and value) when the trace first reads it.

    Moving it around (locals, the stack, a call's arguments) reads nothing, so a value the trace only
    passes on (a live local a resume function takes and hands to the next break, the result of a broken
    call that the resumed code pops) is not guarded, as in TorchDynamo, whose argument trackers are
    built lazily: a later call with another value reuses the entry. Every read of `value` (truth,
    arithmetic, `as_constant`, `python_type`, ...) installs the guard first.
    """

    def __init__(self, value: Any, source: Source, guards: Any):
        self._value = value
        self.source = source
        self._guards = guards  # the GuardBuilder, until the guard is installed

    @property
    def value(self) -> Any:
        if self._guards is not None:
            guards, self._guards = self._guards, None
            guards.value(self.source, self._value)
        return self._value

    def describe(self) -> str:  # naming it in a message decides nothing: no guard
        text = repr(self._value)
        return f"constant {text if len(text) < 40 else text[:37] + '...'}"

    def reconstruct(self, codegen) -> str:
        if self._guards is not None:  # never read: the entry passes on whatever the argument is
            return codegen.source(self.source)
        return super().reconstruct(codegen)


def run_on_constants(fn, values: list, keywords: dict) -> Any:
    """`fn(*values, **keywords)` on immutable constants, for real: what it raises, the program raises there.
    kiln's own signals (Unsupported, ProgramException) raised by a tracker `fn` calls back pass through as they are
    (sorted's and heapq's comparisons reaching a tensor)."""
    try:
        return fn(*values, **keywords)
    except Unsupported:
        raise
    except Exception as error:
        arguments = [ConstantVariable(arg) for arg in error.args] \
            if all(is_constant_value(arg) for arg in error.args) else None
        raise ProgramException(f"{getattr(fn, '__qualname__', fn)}() raises {type(error).__name__}: {error}",
                               type(error), arguments) from None


def constant_arguments(args, kwargs) -> tuple[list, dict] | None:
    """Call arguments as Python values, when every one is a constant; else None."""
    if all(arg.is_constant() for arg in args) and all(arg.is_constant() for arg in kwargs.values()):
        try:
            return [arg.as_constant() for arg in args], {key: arg.as_constant() for key, arg in kwargs.items()}
        except Unsupported:
            return None
    return None


def constant(value: Any) -> ConstantVariable:
    return ConstantVariable(value)


NONE = ConstantVariable(None)


def is_same(left: Variable, right: Variable, tx: "Tracer | None" = None) -> bool:
    """Python `is`. Two objects read from the outside world that are not the same object now may be next
    call (one dict passed as two arguments): with `tx`, the answer False is guarded."""
    if left is right:
        return True
    for one, other in ((left, right), (right, left)):
        # A function is never an immutable constant (`callback is None`): decided without the function's
        # identity, which a function argument guards only once the trace depends on it.
        if isinstance(one, ConstantVariable) and _is_function_tracker(other):
            one.as_constant()  # its value (and type) guarded: an argument that is a function next time is not this
            return False
    a, b = left.identity(), right.identity()
    same = a is b and a is not left and b is not right  # a fresh tracker (new list, tensor) is only itself
    if not same and tx is not None:
        _guard_distinct(tx, left, right)
    return same


def _guard_distinct(tx: "Tracer", left: Variable, right: Variable) -> None:
    """Guard that two objects read from sources stay distinct (the wrapper gives one object read twice one
    tracker, and guards that; distinct ones get two trackers, guarded here once `is` depended on it)."""
    if isinstance(left, ConstantVariable) or isinstance(right, ConstantVariable):
        return  # values: guarded by value where the trace reads them
    ours, theirs = getattr(left, "source", None), getattr(right, "source", None)
    if ours is not None and theirs is not None and ours != theirs:
        tx.output.guards.add(ours, f"{{}} is {theirs.expr()}", f"now the same object as {theirs.expr()}")


def _is_function_tracker(variable: Variable) -> bool:
    try:
        return variable.python_type() is FunctionType
    except Unsupported:
        return False


def lookup_class_attribute(cls: type, name: str) -> tuple[Any, type | None]:
    """The raw (undescribed) class attribute and the class that defines it."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name], klass
    return MISSING, None


def has_python_method(variable: Variable, method: str) -> bool:
    """Whether `variable` is an object of a user class that defines `method` (its call is inlined)."""
    cls = variable.user_class()
    if cls is None:
        return False
    raw, owner = lookup_class_attribute(cls, method)
    return owner is not None and owner is not object


# Library modules kiln assumes nobody monkeypatches while compiled code runs: their globals, functions and
# classes are trusted (not guarded).
_TRUSTED_MODULE_ROOTS = frozenset({
    "torch", "math", "operator", "functools", "itertools", "collections", "typing", "builtins", "dataclasses",
    "inspect", "warnings", "numpy", "contextlib", "enum", "abc", "copy", "types"})


def is_trusted_module(module_name: str) -> bool:
    """Whether the module named `module_name` belongs to a trusted library (by its top-level package)."""
    return module_name.split(".")[0] in _TRUSTED_MODULE_ROOTS
