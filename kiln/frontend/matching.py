"""The `match` statement's opcodes of `Frame` (PEP 634): structural pattern matching on trackers.

CPython compiles `case` patterns into tests the interpreter answers at trace time, each
from what the trackers already know, so a match on guarded values folds like an `if`:

- MATCH_SEQUENCE / MATCH_MAPPING: whether the subject's type is a sequence (list, tuple,
  not str or bytes) or a mapping, by the type flags Python itself tests;
- GET_LEN: `len(subject)`;
- MATCH_KEYS: the values of a mapping pattern's keys, or None when one is missing;
- MATCH_CLASS: `isinstance` and the attributes a class pattern names (positional ones
  through `__match_args__`), or None;
- COPY_DICT_WITHOUT_KEYS: the `**rest` of a mapping pattern.

Literal and value patterns are ordinary comparisons (COMPARE_OP, IS_OP).
"""
from __future__ import annotations

from kiln.frontend.errors import AttributeFailure, Unsupported
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable
from kiln.frontend.variables.containers import DictVariable, ExternalDictVariable, TupleVariable, hashable_key

_TPFLAGS_SEQUENCE = 1 << 5
_TPFLAGS_MAPPING = 1 << 6
# Classes whose single positional sub-pattern matches the subject itself (`case int(x)`).
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)


class PatternMatching:
    """Frame's pattern-matching opcodes (mixed into interpreter.Frame)."""

    def GET_LEN(self, instruction):
        self.push(ConstantVariable(self.stack[-1].length(self)))

    def MATCH_SEQUENCE(self, instruction):
        self.push(ConstantVariable(bool(self.stack[-1].python_type().__flags__ & _TPFLAGS_SEQUENCE)))

    def MATCH_MAPPING(self, instruction):
        self.push(ConstantVariable(bool(self.stack[-1].python_type().__flags__ & _TPFLAGS_MAPPING)))

    def MATCH_KEYS(self, instruction):
        keys = self.stack[-1].unpack(self)
        subject = self.stack[-2]
        values = []
        for key in keys:
            if not _mapping_contains(self, subject, key):
                self.push(NONE)
                return
            values.append(subject.getitem(self, key))
        self.push(TupleVariable(values))

    def COPY_DICT_WITHOUT_KEYS(self, instruction):
        keys = {hashable_key(self, key) for key in self.stack[-1].unpack(self)}
        subject = self.stack[-2]
        rest = DictVariable()
        rest.update_from(self, subject)
        for key in keys:
            rest.entries.pop(key, None)
        self.stack[-1] = rest

    def MATCH_CLASS(self, instruction):
        names = self.pop().as_constant()
        cls_variable = self.pop()
        subject = self.pop()
        cls = cls_variable.as_constant()
        if not isinstance(cls, type):
            raise Unsupported(f"`case {cls_variable.describe()}(...)`: not a class (the program raises TypeError)")
        if not issubclass(subject.python_type(), cls):
            self.push(NONE)
            return
        attributes = []
        if instruction.arg:
            if instruction.arg == 1 and cls in _SELF_MATCHING and "__match_args__" not in vars(cls):
                attributes.append(subject)
            else:
                match_args = cls_variable.getattr(self, "__match_args__").as_constant() \
                    if hasattr(cls, "__match_args__") else ()
                if not isinstance(match_args, tuple) or len(match_args) < instruction.arg:
                    raise Unsupported(f"`case {cls.__qualname__}(...)` with {instruction.arg} positional patterns "
                                      f"(its __match_args__ is {match_args!r}: the program raises TypeError)")
                names = tuple(match_args[:instruction.arg]) + tuple(names)
        for name in names:
            try:
                attributes.append(subject.getattr(self, name))
            except AttributeFailure:
                self.push(NONE)
                return
        self.push(TupleVariable(attributes))


def _mapping_contains(tx, subject: Variable, key: Variable) -> bool:
    if isinstance(subject, (DictVariable, ExternalDictVariable)):
        return subject.contains(tx, key)
    return subject.call_method(tx, "__contains__", [key], {}).truth(tx)
