"""itertools' lazy filters and mappers (starmap, takewhile, dropwhile, filterfalse, compress, groupby) as lazy
iterators: each step takes from its input only what CPython's would, calling the function (traced) as it does.
Before, each was a graph break, and the resume function, given the real iterator, ran eagerly."""
from __future__ import annotations

import itertools

from kiln.frontend.errors import Unsupported
from kiln.frontend.variables.base import ConstantVariable, Variable
from kiln.frontend.variables.containers import TupleVariable, compare_equal, iterate, unpack_iterable
from kiln.frontend.variables.iterators import BaseIteratorVariable, LazyIteratorVariable


def _positional(name: str, args, kwargs, count: int) -> None:
    if len(args) != count or kwargs:
        raise Unsupported(f"itertools.{name}() with these arguments (the program raises TypeError)")


def _starmap(tx, args, kwargs):
    _positional("starmap", args, kwargs, 2)
    function, source = args[0], iterate(tx, args[1])

    def step(tx):
        item = source.next_item(tx)
        return None if item is None else function.call(tx, unpack_iterable(tx, item), {})

    return LazyIteratorVariable("starmap", step)


def _takewhile(tx, args, kwargs):
    _positional("takewhile", args, kwargs, 2)
    predicate, source = args[0], iterate(tx, args[1])
    stopped = [False]

    def step(tx):
        if stopped[0]:
            return None
        item = source.next_item(tx)
        if item is None or not predicate.call(tx, [item], {}).truth(tx):
            stopped[0] = True  # the failing item is consumed and dropped, as CPython's
            return None
        return item

    return LazyIteratorVariable("takewhile", step)


def _dropwhile(tx, args, kwargs):
    _positional("dropwhile", args, kwargs, 2)
    predicate, source = args[0], iterate(tx, args[1])
    dropping = [True]

    def step(tx):
        while True:
            item = source.next_item(tx)
            if item is None or not dropping[0] or not predicate.call(tx, [item], {}).truth(tx):
                dropping[0] = False
                return item

    return LazyIteratorVariable("dropwhile", step)


def _filterfalse(tx, args, kwargs):
    _positional("filterfalse", args, kwargs, 2)
    function, source = args[0], iterate(tx, args[1])
    by_truth = isinstance(function, ConstantVariable) and function.value is None

    def step(tx):
        while True:
            item = source.next_item(tx)
            if item is None or not (item.truth(tx) if by_truth else function.call(tx, [item], {}).truth(tx)):
                return item

    return LazyIteratorVariable("filterfalse", step)


def _compress(tx, args, kwargs):
    _positional("compress", args, kwargs, 2)
    data, selectors = iterate(tx, args[0]), iterate(tx, args[1])

    def step(tx):
        while True:
            item = data.next_item(tx)
            if item is None:
                return None
            selector = selectors.next_item(tx)
            if selector is None:
                return None
            if selector.truth(tx):
                return item

    return LazyIteratorVariable("compress", step)


_UNSET = object()


def _groupby(tx, args, kwargs):
    """itertools.groupby, step for step as CPython's: one item read ahead; a group's iterator gives items only
    while it is the current group (advancing the outer iterator empties the groups before)."""
    if not 1 <= len(args) <= 2 or set(kwargs) - {"key"}:
        raise Unsupported("itertools.groupby() with these arguments (the program raises TypeError)")
    source = iterate(tx, args[0])
    key = args[1] if len(args) > 1 else kwargs.get("key")
    if key is not None and isinstance(key, ConstantVariable) and key.value is None:
        key = None
    state = {"target": _UNSET, "current_key": _UNSET, "current_value": _UNSET, "group": None}

    def advance(tx) -> bool:
        value = source.next_item(tx)
        if value is None:
            return False
        state["current_value"] = value
        state["current_key"] = value if key is None else key.call(tx, [value], {})
        return True

    def step(tx):
        state["group"] = None
        while True:
            if state["current_key"] is _UNSET:
                pass
            elif state["target"] is _UNSET or not compare_equal(tx, state["target"], state["current_key"]):
                break
            if not advance(tx):
                return None
        state["target"] = state["current_key"]
        group = _Group(state, state["target"], advance)
        state["group"] = group
        return TupleVariable([state["current_key"], group])

    return LazyIteratorVariable("groupby", step)


class _Group(BaseIteratorVariable):
    """One group of a groupby: its items while it is the current group and the key stays equal."""

    def __init__(self, state: dict, target: Variable, advance):
        self.state, self.target, self.advance = state, target, advance

    def describe(self) -> str:
        return "groupby group"

    def python_type(self) -> type:
        return type(next(itertools.groupby([1]))[1])

    def next_item(self, tx) -> Variable | None:
        state = self.state
        if state["group"] is not self:
            return None
        if state["current_value"] is _UNSET and not self.advance(tx):
            return None
        if not compare_equal(tx, self.target, state["current_key"]):
            return None
        value, state["current_value"] = state["current_value"], _UNSET
        return value


HANDLERS = {itertools.starmap: _starmap, itertools.takewhile: _takewhile, itertools.dropwhile: _dropwhile,
            itertools.filterfalse: _filterfalse, itertools.compress: _compress, itertools.groupby: _groupby}
