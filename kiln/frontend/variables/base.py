"""The variable tracker protocol, and Python constants.

A `Variable` stands for one Python value during symbolic interpretation. It knows
its `source` (where it came from, for guards and for rebuilding it at run time) and
answers the operations the interpreter needs: attribute reads, calls, method
calls, iteration, truth value, and `reconstruct` (a Python expression that
recreates it after the graph ran). Anything a kind does not model raises
`Unsupported`, which names the operation.

`ConstantVariable` holds an immutable Python value (None, bool, int, float, str,
bytes, tuple-free literals, dtypes, devices, ranges, frozensets ...); operations on
constants run for real at trace time, since they cannot have side effects.
"""
from __future__ import annotations

import inspect
import operator
from typing import TYPE_CHECKING, Any

import torch

from kiln.frontend.errors import AttributeFailure, Unsupported
from kiln.frontend.sources import Source

if TYPE_CHECKING:
    from kiln.frontend.interpreter import Frame


class Variable:
    """Base of all trackers. Subclasses override what they support."""

    source: Source | None = None

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

    def getattr(self, tx: "Frame", name: str) -> "Variable":
        """Default: a method of the value's Python type, served by this tracker's `call_method`."""
        if type(self).call_method is not Variable.call_method:
            try:
                python_type = self.python_type()
            except Unsupported:
                python_type = None
            if python_type is not None and callable(getattr(python_type, name, None)):
                return TrackerMethod(self, name)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def call(self, tx: "Frame", args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        raise Unsupported(f"calling {self.describe()}")

    def call_method(self, tx: "Frame", name: str, args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx: "Frame") -> list["Variable"]:
        """The items iteration would produce, all at once."""
        raise Unsupported(f"iterating over {self.describe()}")

    def truth(self, tx: "Frame") -> bool:
        raise Unsupported(f"truth value of {self.describe()}")

    def length(self, tx: "Frame") -> int:
        return len(self.unpack(tx))

    def getitem(self, tx: "Frame", key: "Variable") -> "Variable":
        raise Unsupported(f"indexing {self.describe()}")

    def setitem(self, tx: "Frame", key: "Variable", value: "Variable") -> None:
        raise Unsupported(f"item assignment on {self.describe()}")

    def setattr(self, tx: "Frame", name: str, value: "Variable") -> None:
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
        from kiln.frontend.variables.builder import wrap_sourceless

        return wrap_sourceless(tx, value)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if all(arg.is_constant() for arg in args) and all(arg.is_constant() for arg in kwargs.values()):
            method = getattr(self.value, name, None)
            if method is None:
                raise Unsupported(f"{self.describe()} has no method {name!r}")
            result = method(*[arg.as_constant() for arg in args],
                            **{key: arg.as_constant() for key, arg in kwargs.items()})
            from kiln.frontend.variables.builder import wrap_sourceless

            return wrap_sourceless(tx, result)
        if isinstance(self.value, str) and name == "join" and len(args) == 1:
            items = [item.as_constant() for item in args[0].unpack(tx)]
            return ConstantVariable(self.value.join(items))
        if isinstance(self.value, str) and name == "format":
            raise Unsupported(f"str.format with non-constant arguments on {self.describe()}")
        return super().call_method(tx, name, args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        from kiln.frontend.variables.builder import wrap_sourceless

        return wrap_sourceless(tx, operator.getitem(self.value, key.as_constant()))

    def reconstruct(self, codegen) -> str:
        if self.source is not None and type(self.value) not in (type(None), bool, int):
            return codegen.source(self.source)  # the outside object itself (`f(t) is t` for a tuple t)
        return codegen.constant(self.value)


def constant(value: Any) -> ConstantVariable:
    return ConstantVariable(value)


NONE = ConstantVariable(None)
