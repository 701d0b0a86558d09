"""Sets of constants: made in the trace, or from outside (guarded by a snapshot; their mutations replayed)."""
from __future__ import annotations

from typing import Any

from kiln.frontend.errors import Unsupported
from kiln.frontend.variables.base import ConstantVariable, Variable, constant_arguments, run_on_constants
from kiln.frontend.variables.iterators import SetIteratorVariable


_SET_MUTATORS = frozenset({"add", "update", "discard", "remove", "pop", "clear", "difference_update",
                           "intersection_update", "symmetric_difference_update"})


class SetVariable(Variable):
    """A set of constants: made during the trace, or an outside one (`source`, `real`).

    An outside set (a global, an argument, a live local a resume function takes) is guarded by
    a snapshot of its value; the trace changes a copy, and the entry makes the same calls
    (`add`, `discard`, `update`, ...) on the set itself after the graph (SideEffects), in
    program order: the set ends as eager's, its iteration order included.
    """

    def __init__(self, values, source=None, real: set | None = None):
        self.values = set(values)
        self.source = source
        self.real = real  # the outside set itself
        self.calls: list[tuple[str, tuple]] = []  # the mutating calls made on an outside set, for the entry

    def describe(self) -> str:
        return "set" if self.source is None else f"set at {self.source}"

    def identity(self) -> Any:
        return self.real if self.real is not None else self

    def python_type(self) -> type:
        return set

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return set(self.values)

    def unpack(self, tx):
        return [ConstantVariable(value) for value in self.values]

    def truth(self, tx) -> bool:
        return bool(self.values)

    def live_iterator(self, tx) -> SetIteratorVariable:
        """`iter(s)`: raises Python's RuntimeError if the set changes size during the loop."""
        return SetIteratorVariable(self, self.values)

    def call_method(self, tx, name, args, kwargs):
        if name == "__iter__":
            return self.live_iterator(tx)
        if name == "__contains__":
            return ConstantVariable(args[0].as_constant() in self.values)
        if name in _SET_MUTATORS:
            if kwargs or (self.source is not None and name == "pop"):
                raise Unsupported(f"set.{name} on {self.describe()} (with keywords, or pop: which element it takes "
                                  "depends on the real set's layout)")
            values = [arg.as_constant() for arg in args]  # the elements themselves (classes and functions too)
            values = [tuple(value) if isinstance(value, (list, set, frozenset)) else value for value in values]
            result = run_on_constants(getattr(self.values, name), values, {})
            if self.source is not None:
                self.calls.append((name, tuple(values)))
                tx.output.side_effects.mutated_container(self)
            return tx.wrap_sourceless(result)
        constants = constant_arguments(args, kwargs)
        if constants is None:
            raise Unsupported(f"set.{name} with non-constant arguments")
        result = run_on_constants(getattr(self.values, name), *constants)
        return SetVariable(result) if isinstance(result, set) else tx.wrap_sourceless(result)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # the outside set itself (its changes are replayed in place)
            return codegen.source(self.source)
        return codegen.constant(set(self.values)) + ".copy()"
