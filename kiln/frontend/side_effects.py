"""Side effects of a trace on the outside world, replayed by the entry function after the graph runs.

`SideEffects` (one per trace, `OutputGraph.side_effects`) records what the trace changed outside
itself, in program order: attribute stores and deletions on outside objects, outside lists, dicts
and sets changed in place, stores into and deletions from any module's globals (`DELETED_GLOBAL`),
`nonlocal` stores into closure cells of functions defined outside the compiled code, and calls made
for their output (print, warnings.warn, logging; replay.py), each with the `OutsideState` it saw.
`codegen` writes them as the entry's lines (through entry_codegen.py's `EntryCodegen`): each
replayed call after the state it saw is written back, then the state as the trace left it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kiln.frontend.entry_codegen import EntryCodegen
from kiln.frontend.errors import Unsupported
from kiln.frontend.sources import NamedSource
from kiln.frontend.variables.base import Variable
from kiln.frontend.variables.sets import SetVariable
from kiln.frontend.variables.containers import DictVariable, ListVariable
from kiln.frontend.variables.objects import DELETED


DELETED_GLOBAL = object()  # what `del NAME` stores for a global until the entry deletes it


@dataclass
class OutsideState:
    """The outside world as the trace has changed it so far: what the entry must have written by then.

    `attributes`: (id of the object's tracker, name) -> (tracker, name, value or DELETED);
    `containers`: id of the tracker -> (tracker, its items or entries then);
    `globals`: as `SideEffects.globals`;
    `cells`: closure cells of functions defined outside the compiled code, assigned through `nonlocal`.
    """

    attributes: dict[tuple[int, str], tuple[Variable, str, Any]]
    containers: dict[int, tuple[Variable, Any]]
    globals: dict[tuple[int, str], tuple[NamedSource, str, Any]]
    cells: dict[int, tuple[Variable, Any]] = field(default_factory=dict)  # id of an outside cell's tracker -> value


@dataclass
class ReplayedCall:
    """A call made for its effect on the world outside the graph (print, warnings.warn, logging), made again
    after the graph with the same (constant) arguments, once the state it saw is written back."""

    function: Callable
    args: list[Variable]
    kwargs: dict[str, Variable]
    state: OutsideState


class SideEffects:
    """Mutations of the outside world made by the trace, replayed after the graph runs, in program order.

    State (attributes of outside objects, outside lists and dicts, globals) is written back
    as the trace left it; a call made for its output (print, warnings.warn, logging) is
    made after the state it saw has been written, and before what the program changed
    after it, so a warning filter, a log handler or an error it raises meets the world
    as eager's call would.
    """

    def __init__(self) -> None:
        self.objects: list[Variable] = []
        self.containers: list[Variable] = []
        # (id of the globals dict, name) -> (that dict's NamedSource, name, tracker or DELETED_GLOBAL)
        self.globals: dict[tuple[int, str], tuple[NamedSource, str, Any]] = {}
        self.context_vars: set = set()
        self.calls: list[ReplayedCall] = []
        self.cells: dict[int, tuple[Variable, Any]] = {}  # id of a real cell's tracker -> (tracker, value stored)

    def mutated_object(self, variable: Variable) -> None:
        if variable not in self.objects:
            self.objects.append(variable)

    def mutated_container(self, variable: Variable) -> None:
        if variable not in self.containers:
            self.containers.append(variable)

    def store_global(self, fn_globals: dict, globals_source: NamedSource, name: str, value: Any) -> None:
        """`global NAME; NAME = value` (or DELETED_GLOBAL) in the module whose globals dict is `fn_globals`."""
        self.globals[(id(fn_globals), name)] = (globals_source, name, value)

    def stored_global(self, fn_globals: dict, name: str) -> Any:
        """What the trace last stored into `fn_globals[name]` (a tracker or DELETED_GLOBAL), else None."""
        stored = self.globals.get((id(fn_globals), name))
        return stored[2] if stored is not None else None

    def stores_globals_into(self, fn_globals: dict) -> bool:
        return any(key[0] == id(fn_globals) for key in self.globals)

    def store_cell(self, cell: Variable, value: Variable) -> None:
        """`nonlocal name; name = value` into a real cell (of a function defined outside the compiled code)."""
        self.cells[id(cell)] = (cell, value)

    def replay_call(self, function: Callable, args: list[Variable], kwargs: dict[str, Variable]) -> None:
        self.calls.append(ReplayedCall(function, list(args), dict(kwargs), self.current_state()))

    def current_state(self) -> OutsideState:
        attributes = {(id(variable), name): (variable, name, value)
                      for variable in self.objects for name, value in variable.pending.items()}
        containers = {id(variable): (variable, list(variable.items) if isinstance(variable, ListVariable)
                                     else tuple(variable.calls) if isinstance(variable, SetVariable)
                                     else dict(variable.entries))
                      for variable in self.containers}
        return OutsideState(attributes, containers, dict(self.globals), dict(self.cells))

    def codegen(self, codegen: EntryCodegen) -> list[str]:
        for variable in self.context_vars:
            if variable.current:
                raise Unsupported(f"{variable.describe()} set and not reset inside the compiled function")
        lines: list[str] = []
        written = OutsideState({}, {}, {})
        for call in self.calls:
            lines += _write_state(codegen, call.state, written)
            written = call.state
            arguments = [codegen.value(arg) for arg in call.args]
            arguments += [f"{key}={codegen.value(arg)}" for key, arg in call.kwargs.items()]
            lines.append(f"{codegen.constant(call.function)}({', '.join(arguments)})")
        lines += _write_state(codegen, self.current_state(), written)
        return lines


def _write_state(codegen: EntryCodegen, state: OutsideState, written: OutsideState) -> list[str]:
    """Lines that bring the outside world from `written` (what the entry wrote so far) to `state`."""
    lines = []
    for key, (variable, name, value) in state.attributes.items():
        previous = written.attributes.get(key)
        if previous is not None and previous[2] is value:
            continue
        target = codegen.source(variable.source)
        own_method = getattr(variable, "own_method", lambda name: None)  # the trace inlined it: not again
        setter = codegen.constant(object.__setattr__) if own_method("__setattr__") else "setattr"
        deleter = codegen.constant(object.__delattr__) if own_method("__delattr__") else "delattr"
        # Every store is replayed, as eager makes it: an attribute's value when the trace ran is not guarded (a
        # store of that same value was skipped, and a later call's object kept whatever it held; the break fuzzer).
        if value is DELETED and previous is None and getattr(variable.value, name, _ABSENT) is _ABSENT:
            # set and deleted by the trace: absent afterwards, whatever the object holds when the entry runs
            lines.append(f"{codegen.constant(_discard_attribute)}({target}, {name!r}, {deleter})")
        elif value is DELETED:
            lines.append(f"{deleter}({target}, {name!r})")
        else:
            lines.append(f"{setter}({target}, {name!r}, {codegen.value(value)})")
    for key, (variable, contents) in state.containers.items():
        previous = written.containers.get(key)
        if previous is not None and _same_contents(previous[1], contents):
            continue
        target = codegen.source(variable.source)
        if isinstance(variable, ListVariable):
            lines.append(f"{target}[:] = {ListVariable(contents).display(codegen)}")
        elif isinstance(variable, SetVariable):  # the calls made since, again, on the set itself
            for name, arguments in contents[len(previous[1]) if previous is not None else 0:]:
                lines.append(f"{target}.{name}({', '.join(codegen.constant(argument) for argument in arguments)})")
        else:
            lines.append(f"{target}.clear()")
            lines.append(f"{target}.update({DictVariable(contents, dict_type=dict).display(codegen)})")
    for key, (globals_source, name, value) in state.globals.items():
        previous = written.globals.get(key)
        if previous is not None and previous[2] is value:
            continue
        namespace = codegen.source(globals_source)
        if value is DELETED_GLOBAL:
            lines.append(f"del {namespace}[{name!r}]")
        else:
            lines.append(f"{namespace}[{name!r}] = {codegen.value(value)}")
    for key, (cell, value) in state.cells.items():
        previous = written.cells.get(key)
        if previous is not None and previous[1] is value:
            continue
        lines.append(f"{cell.reconstruct(codegen)}.cell_contents = {codegen.value(value)}")
    return lines


def _same_contents(before: Any, after: Any) -> bool:
    """Items (a list) or entries (a dict) holding the same trackers in the same order; the same calls (a set)."""
    if isinstance(before, tuple):
        return len(before) == len(after)
    if isinstance(before, list):
        return len(before) == len(after) and all(a is b for a, b in zip(before, after))
    return list(before) == list(after) and all(before[key][1] is after[key][1] for key in before)


_ABSENT = object()


def _discard_attribute(obj: Any, name: str, deleter: Callable[[Any, str], None]) -> None:
    """`del obj.name` where the program set it first: the attribute ends absent, whether or not it was there."""
    try:
        deleter(obj, name)
    except AttributeError:
        pass
