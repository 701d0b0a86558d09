"""`collections.deque` made in the trace (contextlib.ExitStack keeps its exit callbacks in one): a list of trackers
with deque's methods. A deque from outside the trace is not modelled (an opaque object, as before)."""
from __future__ import annotations

import collections
from typing import Any

from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable
from kiln.frontend.variables.containers import ListVariable, unpack_iterable
from kiln.frontend.variables.iterators import BaseIteratorVariable

_MUTATORS = frozenset({"append", "appendleft", "pop", "popleft", "extend", "extendleft", "rotate", "clear", "remove",
                       "reverse", "insert", "__setitem__", "__delitem__"})


class DequeVariable(ListVariable):
    """A deque of trackers: `maxlen` drops items from the other end, as deque does; any change bumps `state`, which
    its iterators check (CPython's "deque mutated during iteration")."""

    def __init__(self, items: list[Variable], maxlen: int | None = None):
        super().__init__(items)
        self.maxlen = maxlen
        self.state = 0
        self._trim(left=True)

    def describe(self) -> str:
        return f"deque of {len(self.items)}"

    def python_type(self) -> type:
        return collections.deque

    def as_constant(self) -> Any:
        return collections.deque((item.as_constant() for item in self.items), self.maxlen)

    def rebuild(self, items) -> Variable:
        raise ProgramException("sequence index must be integer, not 'slice'", TypeError,
                               [ConstantVariable("sequence index must be integer, not 'slice'")])

    def _trim(self, left: bool) -> None:
        while self.maxlen is not None and len(self.items) > self.maxlen:
            self.items.pop(0 if left else -1)

    def getattr(self, tx, name: str) -> Variable:
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name in _MUTATORS:
            self.state += 1
        if name in ("pop", "popleft"):
            if args or kwargs:
                raise Unsupported(f"deque.{name} with arguments (the program raises TypeError)")
            if not self.items:
                raise ProgramException(f"{name} from an empty deque", IndexError,
                                       [ConstantVariable(f"{name} from an empty deque")])
            return self.items.pop(-1 if name == "pop" else 0)
        if name == "append":
            self.items.append(args[0])
            self._trim(left=True)
        elif name == "appendleft":
            self.items.insert(0, args[0])
            self._trim(left=False)
        elif name == "extend":
            self.items.extend(unpack_iterable(tx, args[0]))
            self._trim(left=True)
        elif name == "extendleft":
            self.items[:0] = reversed(unpack_iterable(tx, args[0]))
            self._trim(left=False)
        elif name == "rotate":
            steps = args[0].as_constant() if args else 1
            if self.items:
                steps %= len(self.items)
                self.items[:] = self.items[-steps:] + self.items[:-steps] if steps else self.items
        elif name == "copy":
            return DequeVariable(self.items, self.maxlen)
        elif name in ("sort", "__iter__"):
            if name == "sort":
                raise Unsupported("deque.sort (the program raises AttributeError)")
            return self.live_iterator(tx)
        else:
            return super().call_method(tx, name, args, kwargs)
        return NONE

    def live_iterator(self, tx) -> BaseIteratorVariable:
        return DequeIteratorVariable(self)

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(collections.deque)}({self.display(codegen)}, {self.maxlen!r})"


class DequeIteratorVariable(BaseIteratorVariable):
    """iter(deque): raises CPython's RuntimeError once the deque changed after it was made."""

    def __init__(self, deque: DequeVariable):
        self.deque = deque
        self.state = deque.state
        self.position = 0

    def describe(self) -> str:
        return f"iterator of {self.deque.describe()}"

    def python_type(self) -> type:
        return type(iter(collections.deque()))

    def next_item(self, tx) -> Variable | None:
        if self.deque.state != self.state:
            raise ProgramException("deque mutated during iteration", RuntimeError,
                                   [ConstantVariable("deque mutated during iteration")])
        if self.position >= len(self.deque.items):
            return None
        self.position += 1
        return self.deque.items[self.position - 1]


def make_deque(tx, args, kwargs) -> DequeVariable:
    """`collections.deque(iterable=(), maxlen=None)`."""
    iterable = args[0] if args else kwargs.get("iterable")
    maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen", NONE)
    if not maxlen.is_constant():
        raise Unsupported("deque() with a maxlen not known at trace time")
    return DequeVariable(unpack_iterable(tx, iterable) if iterable is not None else [], maxlen.as_constant())
