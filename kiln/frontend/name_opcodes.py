"""`Frame`'s opcodes that read and write names: locals, closure cells, globals (and builtins).

LOAD_FAST and its 3.12/3.13 pairs, STORE_FAST, DELETE_FAST; LOAD_CLOSURE, LOAD_DEREF and
STORE_DEREF on the frame's `CellVariable`s; LOAD_GLOBAL, LOAD_NAME, STORE_GLOBAL and
DELETE_GLOBAL, where a global the trace stored or deleted is read back from `SideEffects`
(side_effects.py), one read from a user module's globals is guarded by its source, and one
of torch's own modules is trusted. A family of opcodes with one concern (where a name's value
comes from, and the guard that reading it installs), kept apart from interpreter.py as
exceptions.py and matching.py are: a mixin of `Frame`, which provides the stack, locals,
cells, `wrap` and the output graph.
"""
from __future__ import annotations

import builtins

from kiln.frontend import versions
from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.side_effects import DELETED_GLOBAL
from kiln.frontend.sources import ItemSource
from kiln.frontend.variables.base import NULL, ConstantVariable, Variable, is_trusted_module


class NameOpcodes:
    """Frame's opcodes for locals, cells and globals (mixed into interpreter.Frame)."""

    def LOAD_FAST(self, instruction):
        name = instruction.argval
        if name in self.locals:
            self.push(self.locals[name])
        elif name in self.cells:  # 3.13 loads a cell object itself with LOAD_FAST (for closures)
            self.push(self.cells[name])
        else:  # a local deleted (an `except ... as name` clause's at its end) or not yet assigned
            message = f"cannot access local variable {name!r} where it is not associated with a value"
            raise ProgramException(message, UnboundLocalError, [ConstantVariable(message)])

    def LOAD_FAST_AND_CLEAR(self, instruction):
        self.push(self.locals.pop(instruction.argval, NULL))

    def LOAD_FAST_LOAD_FAST(self, instruction):
        first, second = instruction.argval
        self.push(self.locals[first])
        self.push(self.locals[second])

    def STORE_FAST(self, instruction):
        value = self.pop()
        if value is NULL:
            self.locals.pop(instruction.argval, None)
        else:
            self.locals[instruction.argval] = value

    def STORE_FAST_STORE_FAST(self, instruction):
        first, second = instruction.argval
        self.locals[first] = self.pop()
        self.locals[second] = self.pop()

    def STORE_FAST_LOAD_FAST(self, instruction):
        store, load = instruction.argval
        self.locals[store] = self.pop()
        self.push(self.locals[load])

    def DELETE_FAST(self, instruction):
        self.locals.pop(instruction.argval, None)

    def LOAD_CLOSURE(self, instruction):
        self.push(self.cells[instruction.argval])

    def LOAD_DEREF(self, instruction):
        self.push(self.cells[instruction.argval].load(self))

    def STORE_DEREF(self, instruction):
        self.cells[instruction.argval].store(self, self.pop())

    def LOAD_GLOBAL(self, instruction):
        name = instruction.argval
        pushes_null = versions.load_global_pushes_null(instruction.opname, instruction.arg)
        value = self._global(name)
        if pushes_null:
            versions.push_callable_with_null(self.stack, value, NULL)
        else:
            self.push(value)

    def _global(self, name: str) -> Variable:
        stored = self.output.side_effects.stored_global(self.fn_globals, name)
        if stored is not None:
            if stored is DELETED_GLOBAL:
                raise _name_error(name)
            return stored
        if name in self.fn_globals:
            if _is_library_globals(self.fn_globals):
                return self.wrap(self.fn_globals[name], None, guard=False)
            return self.wrap(self.fn_globals[name], ItemSource(self.globals_source, name))
        if hasattr(builtins, name):
            if not _is_library_globals(self.fn_globals):  # a global defined later would shadow the builtin
                self.output.guards.contains(self.globals_source, name, False)
            return self.wrap(getattr(builtins, name), None, guard=False)
        if not _is_library_globals(self.fn_globals):  # the trace takes the NameError's path while it stays undefined
            self.output.guards.contains(self.globals_source, name, False)
        raise _name_error(name)

    def LOAD_NAME(self, instruction):
        self.push(self._global(instruction.argval))

    def STORE_GLOBAL(self, instruction):
        self.output.side_effects.store_global(self.fn_globals, self.globals_source, instruction.argval, self.pop())

    def DELETE_GLOBAL(self, instruction):
        name = instruction.argval
        stored = self.output.side_effects.stored_global(self.fn_globals, name)
        if stored is DELETED_GLOBAL or (stored is None and name not in self.fn_globals):
            raise Unsupported(f"del of global {name!r}, which is not defined (the program raises NameError)")
        if stored is None:  # it exists now: the entry may delete it only while that still holds
            self.output.guards.contains(self.globals_source, name, True)
        self.output.side_effects.store_global(self.fn_globals, self.globals_source, name, DELETED_GLOBAL)


def _is_library_globals(fn_globals: dict) -> bool:
    """Globals of torch's own modules: kiln assumes they are not rebound while compiled code runs."""
    return is_trusted_module(str(fn_globals.get("__name__", "")))


def _name_error(name: str) -> ProgramException:
    """The NameError Python raises reading an undefined global: the program's own exception, which a `try` in the
    traced frames may catch (`try: NAME except NameError: ...`); uncaught, the frame runs eagerly and raises it."""
    message = f"name {name!r} is not defined"
    return ProgramException(f"{message} (the program raises NameError)", NameError, [ConstantVariable(message)])

