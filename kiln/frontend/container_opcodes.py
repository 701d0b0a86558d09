"""`Frame`'s opcodes that build values from the stack and take them apart again.

Tuples, lists, sets and dicts (BUILD_*, the comprehension appends LIST_APPEND, SET_ADD,
MAP_ADD, the `*`/`**` unpackings LIST_EXTEND, SET_UPDATE, DICT_UPDATE, DICT_MERGE), strings
(BUILD_STRING and the f-string fields FORMAT_VALUE, FORMAT_SIMPLE, FORMAT_WITH_SPEC,
CONVERT_VALUE), and unpacking (UNPACK_SEQUENCE, UNPACK_EX). Each makes or reads container
trackers (variables/containers.py) and touches no control flow, so the family lives apart
from interpreter.py, as the exception and `match` opcodes do: a mixin of `Frame`, which
provides the stack and the other opcodes (CALL_INTRINSIC_1 runs UNARY_POSITIVE).
"""
from __future__ import annotations

from typing import Any

from kiln.frontend import versions
from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.exceptions import stop_iteration_error
from kiln.frontend.variables.base import ConstantVariable, Variable
from kiln.frontend.variables.containers import DictVariable, ListVariable, TupleVariable, unpack_iterable
from kiln.frontend.variables.objects import ExceptionVariable, UserObjectVariable
from kiln.frontend.variables.sets import SetVariable
from kiln.frontend.variables.tensor import TensorVariable
from kiln.frontend.variables.text import user_format


class ContainerOpcodes:
    """Frame's opcodes for containers, strings and unpacking (mixed into interpreter.Frame)."""

    def BUILD_TUPLE(self, instruction):
        self.push(TupleVariable(self.popn(instruction.arg)))

    def BUILD_LIST(self, instruction):
        self.push(ListVariable(self.popn(instruction.arg)))

    def BUILD_SET(self, instruction):
        self.push(SetVariable(item.as_constant() for item in self.popn(instruction.arg)))

    def BUILD_MAP(self, instruction):
        flat = self.popn(2 * instruction.arg)
        self.push(DictVariable.from_pairs(self, list(zip(flat[::2], flat[1::2]))))

    def BUILD_CONST_KEY_MAP(self, instruction):
        keys = self.pop().as_constant()
        values = self.popn(instruction.arg)
        self.push(DictVariable.from_pairs(self, [(ConstantVariable(key), value) for key, value in zip(keys, values)]))

    def BUILD_STRING(self, instruction):
        parts = self.popn(instruction.arg)
        self.push(ConstantVariable("".join(part.as_constant() for part in parts)))

    def LIST_APPEND(self, instruction):
        value = self.pop()
        target = self.stack[-instruction.arg]
        target.items.append(value)
        target._mutated(self)  # a comprehension's list passed to a resume function is the caller's: replayed

    def SET_ADD(self, instruction):
        value = self.pop()
        self.stack[-instruction.arg].call_method(self, "add", [value], {})

    def MAP_ADD(self, instruction):
        value = self.pop()
        key = self.pop()
        self.stack[-instruction.arg].setitem(self, key, value)

    def LIST_EXTEND(self, instruction):
        iterable = self.pop()
        target = self.stack[-instruction.arg]
        target.items.extend(unpack_iterable(self, iterable))
        target._mutated(self)

    def SET_UPDATE(self, instruction):
        iterable = self.pop()
        self.stack[-instruction.arg].call_method(self, "update", [TupleVariable(unpack_iterable(self, iterable))], {})

    def DICT_UPDATE(self, instruction):
        mapping = self.pop()
        self.stack[-instruction.arg].update_from(self, mapping)

    def DICT_MERGE(self, instruction):
        """`f(a=1, **d)`: as DICT_UPDATE, but a key given twice is the program's TypeError ("got multiple values
        for keyword argument"), not the later value silently."""
        mapping = self.pop()
        target = self.stack[-instruction.arg]
        for key in mapping.unpack(self):
            if target.contains(self, key):
                raise ProgramException(f"multiple values for keyword argument {key.describe()}", TypeError, None)
        target.update_from(self, mapping)

    def LIST_TO_TUPLE(self, instruction):
        self.push(TupleVariable(self.pop().unpack(self)))

    def CALL_INTRINSIC_1(self, instruction):
        name = versions.intrinsic_name(instruction.argrepr)
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.LIST_TO_TUPLE(instruction)
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.UNARY_POSITIVE(instruction)
        elif name == "INTRINSIC_STOPITERATION_ERROR":
            self.push(stop_iteration_error(self.pop()))
        else:
            raise Unsupported(f"CALL_INTRINSIC_1 {name}")

    def UNPACK_SEQUENCE(self, instruction):
        items = unpack_iterable(self, self.pop(), instruction.arg + 1)
        if len(items) != instruction.arg:
            raise Unsupported(f"unpacking {len(items)} values into {instruction.arg} (the program raises ValueError)")
        self.stack.extend(reversed(items))

    def UNPACK_EX(self, instruction):
        before, after = instruction.arg & 0xFF, instruction.arg >> 8
        items = unpack_iterable(self, self.pop())
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack (the program raises ValueError)")
        middle = ListVariable(items[before:len(items) - after])
        self.stack.extend(reversed(items[len(items) - after:]))
        self.push(middle)
        self.stack.extend(reversed(items[:before]))

    def FORMAT_VALUE(self, instruction):
        flags = instruction.arg
        spec = self.pop().as_constant() if flags & 0x04 else ""
        self.push(ConstantVariable(self._formatted(self.pop(), flags & 0x03, spec)))

    def FORMAT_SIMPLE(self, instruction):
        self.push(ConstantVariable(self._formatted(self.pop(), 0, "")))

    def FORMAT_WITH_SPEC(self, instruction):
        spec = self.pop().as_constant()
        self.push(ConstantVariable(self._formatted(self.pop(), 0, spec)))

    def CONVERT_VALUE(self, instruction):
        self.push(ConstantVariable(self._formatted(self.pop(), instruction.arg or 1, "")))

    def _formatted(self, value: Variable, conversion: int, spec: str) -> str:
        """One f-string field: `value` converted (0 none, 1 !s, 2 !r, 3 !a) and formatted by `spec`."""
        text = user_format(self, value, conversion, spec)  # a user class's own __format__/__str__/__repr__
        if text is not None:
            return text
        value, conversion = self._exception_text(value, conversion, spec)
        value = _formattable(value)
        if conversion:
            value = {1: str, 2: repr, 3: ascii}[conversion](value)
        return format(value, spec)

    def _exception_text(self, value: Variable, conversion: int, spec: str) -> tuple[Variable, int]:
        """An exception formatted into an f-string (`f"{error}"`, `{error!r}`) as its text (a user class's
        `__str__` inlined), and the conversion left to apply; any other value as it is."""
        if not isinstance(value, ExceptionVariable) or (conversion == 0 and spec):
            return value, conversion
        return value.text(self, {0: str, 1: str, 2: repr, 3: ascii}[conversion]), 0


def _formattable(variable: Variable) -> Any:
    """The value an f-string formats: never an object guarded only by its type.

    Formatting such an object runs its `__str__`/`__format__` for real and bakes the text
    into the trace, though the guards would not notice its attributes changing.
    """
    if isinstance(variable, UserObjectVariable):
        raise Unsupported(f"formatting {variable.describe()} into a string (its text is not guarded)")
    if isinstance(variable, ExceptionVariable):  # `f"{error}"`: its builtin text, from its known arguments
        return variable.textual_copy()
    if isinstance(variable, TensorVariable):  # a graph break formats it in Python
        raise Unsupported(f"formatting {variable.describe()} into a string needs its values (data-dependent)")
    return variable.as_constant()
