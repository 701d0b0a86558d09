"""The text of an object made by a user class: `str()`, `repr()`, `format()` and f-string fields inline the class's
own `__str__` / `__repr__` / `__format__` (what they read is guarded as any read)."""
from __future__ import annotations

import types
from typing import Any, Callable

from kiln.frontend.errors import Unsupported
from kiln.frontend.variables.base import ConstantVariable, Variable, lookup_class_attribute
from kiln.frontend.variables.objects import NewObjectVariable, UserObjectVariable


def user_text(tx, variable: Variable, conversion: Callable[[Any], str]) -> str | None:
    """`str(obj)` / `repr(obj)` of a user object whose class writes that text in Python (`__str__`, else the
    `__repr__` object.__str__ calls): the method inlined (what it reads is guarded as any read). None for any other
    tracker, or a class whose text is object's default (it holds the object's address)."""
    if not isinstance(variable, (UserObjectVariable, NewObjectVariable)) or conversion is ascii:
        return None
    cls = variable.user_class()
    for name in ("__str__", "__repr__") if conversion is str else ("__repr__",):
        raw, _ = lookup_class_attribute(cls, name)
        if isinstance(raw, types.FunctionType):
            result = variable.getattr(tx, name).call(tx, [], {})
            if not (result.is_constant() and type(result.as_constant()) is str):
                raise Unsupported(f"{name} of {variable.describe()} returned {result.describe()} (the program raises "
                                  "TypeError unless it is a str)")
            return result.as_constant()
        if raw is not object.__str__:
            return None
    return None


def user_format(tx, variable: Variable, conversion: int, spec: str) -> str | None:
    """What an f-string (or `format(obj, spec)`) makes of a user object: with `!s`/`!r` its text (`user_text`)
    formatted by `spec`; else its class's Python `__format__(spec)` inlined, or, with object's `__format__` and no
    spec, its str(). None where this does not apply (kiln's other rules, or the program's TypeError)."""
    if not isinstance(variable, (UserObjectVariable, NewObjectVariable)):
        return None
    if conversion:
        text = user_text(tx, variable, {1: str, 2: repr, 3: ascii}[conversion])
        return None if text is None else format(text, spec)
    raw, _ = lookup_class_attribute(variable.user_class(), "__format__")
    if isinstance(raw, types.FunctionType):
        result = variable.getattr(tx, "__format__").call(tx, [ConstantVariable(spec)], {})
        if not (result.is_constant() and type(result.as_constant()) is str):
            raise Unsupported(f"__format__ of {variable.describe()} returned {result.describe()}")
        return result.as_constant()
    if raw is object.__format__ and not spec:
        return user_text(tx, variable, str)
    return None
