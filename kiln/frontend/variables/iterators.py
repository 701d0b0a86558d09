"""Iterators over trackers: lazy (`BaseIteratorVariable.next_item`), as Python's.

A list's iterator reads the list at each step (an item appended during the loop is reached, as in Python); a
dict's and a set's step a real iterator over the tracker's own entries, which the trace mutates as the program
mutates its container, so a change of size during the loop raises the program's RuntimeError where Python does
("dictionary changed size during iteration", "Set changed size during iteration", "dictionary keys changed
during iteration"). The lazy builtins (zip, map, filter, enumerate, chain, islice, count) and, in
interpreter.py, generators compute one item per step; each takes at most MAX_ITERATION_STEPS items per trace.
"""
from __future__ import annotations

import collections
from typing import Any

from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.variables.base import ConstantVariable, Variable

MAX_ITERATION_STEPS = 10_000
"""How many items the trace takes from one lazy iterator (a generator, zip, map...) before it gives up.

An iterator that never ends would otherwise hang the tracer; past this many items the
frame runs eagerly instead (eager Python, of course, loops as long as the program says),
not with a graph break, which would unroll that many steps into one graph first.
"""


class BaseIteratorVariable(Variable):
    """An iterator: `next_item(tx)` gives the next tracker, or None once it is exhausted.

    Iteration is lazy, as in Python: a consumer that stops early (a `for` loop that
    breaks, `any`, `next`, `zip` over a shorter iterable) takes only the items it needs,
    so a generator or a `map` runs its code (and its side effects) only that far.
    """

    passed_as_items = False  # True: at a graph break, a resume function takes `remaining_items()` (resume._kind)

    def rebuild_parts(self) -> tuple[Any, list[Variable]] | None:
        """(callable, argument trackers) whose call makes this iterator in its present state, live over its
        container (a graph break passes them on, `resume._kind`), or None."""
        return None

    def describe(self) -> str:
        return "iterator"

    def python_type(self) -> type:
        return type(iter([]))

    def next_item(self, tx) -> Variable | None:
        raise NotImplementedError

    def take(self, tx, count: int | None = None) -> list[Variable]:
        """Up to `count` more items (all of them when None), bounded by MAX_ITERATION_STEPS."""
        items: list[Variable] = []
        while count is None or len(items) < count:
            if len(items) >= MAX_ITERATION_STEPS:
                raise Unsupported(f"{self.describe()} gave more than {MAX_ITERATION_STEPS} items while the trace "
                                  "consumed it (an endless iterator?)", breakable=False)
            item = self.next_item(tx)
            if item is None:
                break
            items.append(item)
        return items

    def unpack(self, tx) -> list[Variable]:
        return self.take(tx)

    def stop_arguments(self) -> list[Variable]:
        """The arguments of the StopIteration that `next()` raises now it gave None: a generator that has just
        returned a value raises StopIteration(value) once; anything else StopIteration()."""
        return []

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "__next__":
            item = self.next_item(tx)
            if item is None:
                raise ProgramException(f"next() on exhausted {self.describe()}", StopIteration, self.stop_arguments())
            return item
        if name == "__iter__":
            return self
        return super().call_method(tx, name, args, kwargs)


class IteratorVariable(BaseIteratorVariable):
    """An iterator over a list of trackers (what GET_ITER makes of a list, tuple, range...).

    Over a list (`live`), it reads the list's items at each step, as CPython's list iterator (an index into the
    list) does: an item appended inside the loop is reached, one removed before the index shifts the rest. Once
    it has run off the end it stays exhausted, also as CPython's. Otherwise its items are fixed when it is made.
    """

    passed_as_items = True  # at a graph break, a resume function takes the items it has left (resume._kind)

    def __init__(self, items: list[Variable], origin: Variable | None = None, fixed_items: bool = False,
                 live: bool = False, rebuilt_from: tuple[Variable, str] | None = None):
        self._items = list(items)
        self.position = 0
        self.origin = origin  # the list or tuple iterated over, when the items are its own
        # over a range, a tuple, a string or a tensor (Tensor.__iter__ is iter(self.unbind(0)), a tuple made at
        # once): no later change to what it iterates over can change the items it yields
        self.fixed_items = fixed_items
        self.live = live and origin is not None  # the list's items are read at each step
        self.exhausted = False
        # (dict tracker, view kind) whose real iterator this one is (a module container's `_modules` values):
        # at a graph break the loop goes on over that dict's own iterator
        self.rebuilt_from = rebuilt_from

    @property
    def items(self) -> list[Variable]:
        return self.origin.items if self.live else self._items

    def next_item(self, tx) -> Variable | None:
        items = self.items
        if self.exhausted or self.position >= len(items):
            self.exhausted = True
            return None
        item = items[self.position]
        self.position += 1
        return item

    def unpack(self, tx) -> list[Variable]:
        rest = self.remaining_items()
        self.position += len(rest)
        self.exhausted = True
        return rest

    def rebuild_parts(self) -> tuple[Any, list[Variable]] | None:
        """A live list iterator goes on over the list itself (a loop that appends after a graph break reaches the
        new items); None (its remaining items are passed) for any other, or one exhausted or past the list's end."""
        if self.exhausted or self.position > len(self.items):
            return None
        if self.rebuilt_from is not None:  # a dict's iterator, made when the dict had len(self.items) entries
            container, kind = self.rebuilt_from
            return iterator_at, [container, ConstantVariable(kind), _left(len(self.items) - self.position),
                                 ConstantVariable(len(self.items))]
        if not self.live:
            return None
        return iterator_at, [self.origin, ConstantVariable("list"), _left(len(self.items) - self.position)]

    def remaining_items(self) -> list[Variable]:
        """The items it would give from here, if nothing changes what it iterates over."""
        return [] if self.exhausted else self.items[self.position:]

    def reconstruct(self, codegen) -> str:
        """The iterator of a list or tuple, advanced as far as the trace took it (a break passing it to a
        function called in Python): the real list's iterator, which sees later changes to the list as this
        tracker (a copy of its items) would not, so only while the list has the items the copy has."""
        origin = self.origin
        if self.fixed_items:  # the items not taken yet, in a tuple's iterator (a range's yields the same)
            return "iter((" + "".join(f"{codegen.value(item)}, " for item in self.remaining_items()) + "))"
        if self.exhausted:
            return "iter(())"
        if origin is None or len(origin.items) != len(self.items) or \
                any(item is not copied for item, copied in zip(origin.items, self.items)):
            raise Unsupported(f"passing on an iterator over {origin.describe() if origin else 'computed items'} "
                              "to Python at a graph break")
        return f"{codegen.constant(advanced)}(iter({codegen.value(origin)}), {self.position})"


def _program_runtime_error(error: RuntimeError) -> ProgramException:
    """The RuntimeError a real dict or set iterator raised (its size changed during the loop), as the program's."""
    return ProgramException(str(error), RuntimeError, [ConstantVariable(str(error))])


class DictIteratorVariable(BaseIteratorVariable):
    """`iter(d)`, `iter(d.keys())`, `iter(d.values())`, `iter(d.items())` of a dict tracker (`owner`).

    It steps a real iterator over the tracker's `entries` (a Python dict the trace mutates as the program mutates
    its dict, in the same order), so it gives what Python's would and raises the same RuntimeError when the dict
    changed size, or keys, during the loop (the error sticks, as CPython's; "keys changed" ends the iterator).
    An outside dict the trace has not copied (`ExternalDictVariable`) is read key by key under its keys guard
    until its first mutation copies it; the iterator then continues over the copy (`attach`). An OrderedDict's
    iterator raises "OrderedDict mutated during iteration" once a key was added or removed, as CPython's, unless
    the last key it gave was the last one then (it looks for the next key as it gives one).
    """

    passed_as_items = True

    def __init__(self, owner: Variable, kind: str, make_tuple, entries: dict | None, pending: list | None = None):
        self.owner = owner
        self.make_tuple = make_tuple  # TupleVariable, for an items() iterator's pairs
        self.kind = kind  # "dict_keys", "dict_values" or "dict_items"
        self.taken = 0
        self.exhausted = False
        self.entries = entries
        self.size = len(entries) if entries is not None else len(pending)  # when made (what CPython checks)
        self.real = None if entries is None else iter(entries.values())
        # an outside dict not copied yet: its entries as (key tracker, () -> value tracker), values read when asked
        self.pending = pending
        ordered = issubclass(owner.python_type(), collections.OrderedDict)
        # an OrderedDict's keys when the iterator was made (an outside one's: when its copy is made, `attach`)
        self.ordered_keys = (list(entries) if entries is not None else []) if ordered else None

    def describe(self) -> str:
        return f"{self.kind} iterator of {self.owner.describe()}"

    def python_type(self) -> type:
        return {"dict_keys": type(iter({})), "dict_values": type(iter({}.values())),
                "dict_items": type(iter({}.items()))}[self.kind]

    def attach(self, entries: dict) -> None:
        """Continue over `entries`, the copy an outside dict became at its first mutation (not yet applied)."""
        self.entries = entries
        self.real = advanced(iter(entries.values()), self.taken)
        if self.ordered_keys is not None:
            self.ordered_keys = list(entries)

    def _item(self, key: Variable, value) -> Variable:
        if self.kind == "dict_keys":
            return key
        value = value() if callable(value) else value
        if self.kind == "dict_values":
            return value
        return self.make_tuple([key, value])

    def next_item(self, tx) -> Variable | None:
        if self.exhausted:
            return None
        if self.ordered_keys is not None and self.entries is not None and self.taken >= len(self.ordered_keys):
            self.exhausted = True  # CPython's odict iterator finds the next key as it gives one: none, it is done
            return None
        if self.ordered_keys is not None and self.entries is not None and list(self.entries) != self.ordered_keys:
            self.exhausted = True  # CPython's odict iterator lets go of its dict after this error
            raise ProgramException("OrderedDict mutated during iteration", RuntimeError,
                                   [ConstantVariable("OrderedDict mutated during iteration")])
        if self.real is None:
            found = self.pending[self.taken] if self.taken < len(self.pending) else None
        else:
            try:
                found = next(self.real)
            except StopIteration:
                found = None
            except RuntimeError as error:
                raise _program_runtime_error(error) from None
        if found is None:
            self.exhausted = True
            return None
        self.taken += 1
        return self._item(*found)

    def rebuild_parts(self) -> tuple[Any, list[Variable]] | None:
        """At a graph break: the dict's own iterator, advanced past what this one gave (the loop goes on over the
        real dict, so a change after the break raises as in Python); only where that iterator is in this one's
        state (nothing added or removed since it was made)."""
        if self.exhausted:
            return None
        if self.real is None:
            left = len(self.pending) - self.taken
        elif len(self.entries) != self.size:
            left = 0  # changed size: the rebuilt iterator raises at its first step, as this one would
        else:
            rest = self._remaining_entries()
            order = list(self.entries.values())
            left = len(rest)
            if self.taken != len(order) - left or any(a is not b for a, b in zip(order[len(order) - left:], rest)) \
                    or (self.ordered_keys is not None and list(self.entries) != self.ordered_keys):
                raise Unsupported(f"passing on {self.describe()} at a graph break after the loop changed its keys")
        parts = [self.owner, ConstantVariable(self.kind), _left(left), ConstantVariable(self.size)]
        if self.ordered_keys is not None:  # the call at the break may reorder it (`move_to_end`): that raises too
            parts.append(ConstantVariable(self._keys_when_made()))
        return iterator_at, parts

    def _keys_when_made(self) -> tuple:
        """An OrderedDict iterator's keys as they were when it was made, as constants for a resume function."""
        keys = [key.as_constant() if isinstance(key, ConstantVariable) else key for key, _ in self.pending] \
            if self.entries is None else self.ordered_keys
        if not all(type(key) in (str, int, bool, float, bytes, type(None)) for key in keys):
            raise Unsupported(f"passing on {self.describe()} at a graph break (keys other than str/int literals)")
        return tuple(keys)

    def remaining_items(self) -> list[Variable]:
        """What it has left to give (a graph break passes them on), if the dict does not change."""
        if self.exhausted:
            return []
        if self.real is None:
            return [self._item(*found) for found in self.pending[self.taken:]]
        return [self._item(*entry) for entry in self._remaining_entries()]

    def _remaining_entries(self) -> list:
        try:
            _, (entries,) = self.real.__reduce__()[:2]  # a copy of the iterator, run to its end
        except RuntimeError as error:
            raise Unsupported(f"passing on {self.describe()} at a graph break after the loop changed the dict "
                              f"({error})") from None
        return entries

    def reconstruct(self, codegen) -> str:
        return "iter((" + "".join(f"{codegen.value(item)}, " for item in self.remaining_items()) + "))"


class SetIteratorVariable(BaseIteratorVariable):
    """`iter(s)` of a set tracker: steps a real iterator over the tracker's own set of values, which the trace
    mutates as the program mutates its set, so a change of size during the loop raises Python's RuntimeError."""

    passed_as_items = True

    def __init__(self, owner: Variable, values: set):
        self.owner = owner
        self.values = values
        self.size = len(values)  # when made (what CPython checks)
        self.real = iter(values)
        self.exhausted = False

    def describe(self) -> str:
        return f"iterator of {self.owner.describe()}"

    def python_type(self) -> type:
        return type(iter(set()))

    def next_item(self, tx) -> Variable | None:
        if self.exhausted:
            return None
        try:
            return ConstantVariable(next(self.real))
        except StopIteration:
            self.exhausted = True
            return None
        except RuntimeError as error:
            raise _program_runtime_error(error) from None

    def rebuild_parts(self) -> tuple[Any, list[Variable]] | None:
        """At a graph break: the set's own iterator, advanced past what this one gave."""
        if self.exhausted:
            return None
        left = 0 if len(self.values) != self.size else len(self.remaining_items())  # changed: the rebuilt raises
        return iterator_at, [self.owner, ConstantVariable("set"), _left(left), ConstantVariable(self.size)]

    def remaining_items(self) -> list[Variable]:
        if self.exhausted:
            return []
        try:
            _, (values,) = self.real.__reduce__()[:2]
        except RuntimeError as error:
            raise Unsupported(f"passing on {self.describe()} at a graph break after the loop changed the set "
                              f"({error})") from None
        return [ConstantVariable(value) for value in values]

    def reconstruct(self, codegen) -> str:
        return "iter((" + "".join(f"{codegen.value(item)}, " for item in self.remaining_items()) + "))"


def _left(count: int) -> "IteratorVariable":
    """`count` placeholders, passed as an iterator's remaining items: their number tells the resume function's
    dispatcher which iteration of the loop it continues (`Dispatcher.loop_position`), as for any passed iterator."""
    return IteratorVariable([ConstantVariable(None)] * count)


def iterator_at(container, kind: str, left, size: int | None = None, keys: tuple | None = None):
    """The iterator of `container` (a list, dict view `kind`, set) with as many items left as `left` gives: made
    by a resume function's prologue at a graph break, where it is traced (a live iterator over the container) or
    runs in Python. A dict or set whose size is no longer `size` (the size the iterator was made at: the call at
    the break, or the trace before it, changed it), or an OrderedDict whose keys are no longer `keys` (in their
    order), gives the iterator Python's would be: one that raises."""
    if size is not None and len(container) != size:
        return changed_during_iteration(changed_size_message(type(container)))
    if keys is not None and tuple(container) != keys:
        return changed_during_iteration("OrderedDict mutated during iteration")
    if kind == "dict_values":
        iterator = iter(container.values())
    elif kind == "dict_items":
        iterator = iter(container.items())
    else:
        iterator = iter(container)
    skip = len(container)
    for _ in left:
        skip -= 1
    for _ in range(skip):
        next(iterator)
    return iterator


def reversed_at(sequence: list, index: int):
    """`reversed(sequence)` whose next step gives `sequence[index]` (-1: exhausted): a live reversed list iterator
    passed on at a graph break (`index` is below the list's length there, which `__setstate__` needs)."""
    iterator = reversed(sequence)
    iterator.__setstate__(index)
    return iterator


def reversed_dict_at(container: dict, kind: str, index: int, size: int):
    """`reversed()` of `container` (or of its view `kind`) whose next step gives its entry at `index` (-1:
    exhausted): a reverse dict iterator passed on at a graph break, made when the dict had `size` entries (a
    dict of another size now gives an iterator that raises, as Python's would)."""
    if len(container) != size:
        return changed_during_iteration(changed_size_message(type(container)))
    view = {"dict_values": container.values, "dict_items": container.items}.get(kind, container.keys)()
    return advanced(reversed(view), len(container) - 1 - index)


def changed_size_message(container_type: type) -> str:
    """The RuntimeError's text a `container_type` iterator raises once the container changed size."""
    if issubclass(container_type, collections.OrderedDict):
        return "OrderedDict mutated during iteration"
    if issubclass(container_type, (set, frozenset)):
        return "Set changed size during iteration"
    return "dictionary changed size during iteration"


def changed_during_iteration(message: str):
    """An iterator whose first step raises RuntimeError(message): a dict's or set's changed during the loop."""
    raise RuntimeError(message)
    yield  # noqa: unreachable (a generator: the error comes at its first step)


def advanced(iterator, count: int):
    """`iterator` after `count` steps (an iterator rebuilt where the trace left it)."""
    for _ in range(count):
        next(iterator)
    return iterator


class LazyIteratorVariable(BaseIteratorVariable):
    """An iterator whose items are computed one `next()` at a time (zip, map, filter, enumerate, chain).

    `step(tx)` returns the next item or None; once it has returned None it is not called again,
    like CPython's builtins, which drop their inputs when exhausted.
    """

    built_once = True  # one object wherever the trace put it (entry_codegen._is_new_mutable)

    def __init__(self, kind: str, step, parts=None):
        self.kind = kind
        self.step = step
        self.exhausted = False
        self.steps = 0
        self.parts = parts  # () -> (callable, argument trackers) making it as it is now, or None

    def rebuild_parts(self) -> tuple[Any, list[Variable]] | None:
        """(callable, argument trackers) whose call makes this iterator in its present state (enumerate of the
        source at the next count, zip of the sources, ...), or None when it cannot be rebuilt."""
        if self.exhausted or self.parts is None:
            return None
        return self.parts()

    def reconstruct(self, codegen) -> str:
        parts = self.rebuild_parts()
        if parts is None:
            return super().reconstruct(codegen)
        function, arguments = parts
        return f"{codegen.constant(function)}({''.join(f'{codegen.value(argument)}, ' for argument in arguments)})"

    def describe(self) -> str:
        return f"{self.kind} iterator"

    def python_type(self) -> type:
        return _ITERATOR_TYPES.get(self.kind, type(iter([])))

    def next_item(self, tx) -> Variable | None:
        if self.exhausted:
            return None
        self.steps += 1
        if self.steps > MAX_ITERATION_STEPS:
            raise Unsupported(f"{self.describe()} stepped more than {MAX_ITERATION_STEPS} times during the trace "
                              "(an endless iterator?)", breakable=False)
        item = self.step(tx)
        if item is None:
            self.exhausted = True
        return item


class UserIteratorVariable(BaseIteratorVariable):
    """An object of a class with a Python `__next__`: each step inlines it; StopIteration ends the iteration."""

    def __init__(self, iterator: Variable):
        self.iterator = iterator
        self.exhausted = False
        self.steps = 0

    def describe(self) -> str:
        return f"iterator {self.iterator.describe()}"

    def python_type(self) -> type:
        return self.iterator.python_type()

    def identity(self) -> Any:
        return self.iterator.identity()

    def next_item(self, tx) -> Variable | None:
        if self.exhausted:  # CPython asks again; a class that restarts is not modelled
            raise Unsupported(f"stepping {self.describe()} again after it raised StopIteration")
        self.steps += 1
        if self.steps > MAX_ITERATION_STEPS:
            raise Unsupported(f"{self.describe()} stepped more than {MAX_ITERATION_STEPS} times during the trace "
                              "(an endless iterator?)", breakable=False)
        try:
            return self.iterator.call_method(tx, "__next__", [], {})
        except ProgramException as raised:
            if not issubclass(raised.exception_type, StopIteration):
                raise
            self.exhausted = True
            return None

    def getattr(self, tx, name: str) -> Variable:
        return self.iterator.getattr(tx, name)

    def reconstruct(self, codegen) -> str:
        return self.iterator.reconstruct(codegen)



def _iterator_types() -> dict[str, type]:
    import itertools

    return {"zip": zip, "map": map, "filter": filter, "enumerate": enumerate, "chain": itertools.chain,
            "islice": itertools.islice, "count": itertools.count, "list_reverseiterator": type(reversed([])),
            "dict_reversekeyiterator": type(reversed({})), "dict_reversevalueiterator": type(reversed({}.values())),
            "dict_reverseitemiterator": type(reversed({}.items()))}


_ITERATOR_TYPES = _iterator_types()

