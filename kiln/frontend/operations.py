"""Python's operators on trackers: arithmetic, comparison, identity, membership, unary.

The rule is the same for every operator: if a tensor is involved the operator
becomes a graph node (`operator.add(x, y)`); if both sides are constants it runs
now; containers implement concatenation, repetition and element-wise equality;
objects of user classes have their dunder method inlined (with the reflected one
tried when the first returns NotImplemented). Equality and identity as Python bools,
which trackers need too, sit below them: `compare_equal` in variables/containers.py,
`is_same` and `has_python_method` in variables/base.py.
"""
from __future__ import annotations

import operator
from typing import Any

import torch

from kiln.frontend.errors import Unsupported
from kiln.frontend.variables.base import (ConstantVariable, Variable, has_python_method, is_constant_value,
                                         run_on_constants)
from kiln.frontend.variables.containers import (BaseIteratorVariable, BaseListVariable, CounterVariable,
                                                DictVariable, ExternalDictVariable, ListVariable, TupleVariable,
                                                ListIteratorLike, compare_equal, counter_arithmetic)
from kiln.frontend.variables.sets import SetVariable
from kiln.frontend.variables.modules import ModuleVariable
from kiln.frontend.variables.objects import ModelOutputVariable
from kiln.frontend.variables.tensor import (SymNumberVariable, TensorVariable, is_number,
                                            symbolic_arithmetic, symbolic_compare)

BINARY_OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow, "@": operator.matmul, "&": operator.and_, "|": operator.or_,
    "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
}
INPLACE_OPERATORS = {
    "+": operator.iadd, "-": operator.isub, "*": operator.imul, "/": operator.itruediv, "//": operator.ifloordiv,
    "%": operator.imod, "**": operator.ipow, "@": operator.imatmul, "&": operator.iand, "|": operator.ior,
    "^": operator.ixor, "<<": operator.ilshift, ">>": operator.irshift,
}
_DUNDERS = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "**": "pow", "@": "matmul",
    "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift",
}
COMPARE_OPERATORS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
                     ">=": operator.ge}
_REFLECTED_COMPARE = {"<": "__gt__", "<=": "__ge__", "==": "__eq__", "!=": "__ne__", ">": "__lt__", ">=": "__le__"}
_COMPARE_DUNDERS = {"<": "__lt__", "<=": "__le__", "==": "__eq__", "!=": "__ne__", ">": "__gt__", ">=": "__ge__"}


def _run_constant(fn, *values) -> ConstantVariable:
    """`fn(*values)` on constants, for real; what it raises (`1 / 0`), the program raises there, to its own
    handlers (a try/except, contextlib.suppress) or out of the frame."""
    return ConstantVariable(run_on_constants(fn, list(values), {}))


def binary_op(tx, symbol: str, left: Variable, right: Variable) -> Variable:
    """`left <symbol> right`; symbols ending in '=' (but not comparisons) are in-place."""
    inplace = symbol.endswith("=") and len(symbol) >= 2 and symbol[:-1] in BINARY_OPERATORS
    base = symbol[:-1] if inplace else symbol
    if isinstance(left, TensorVariable) or isinstance(right, TensorVariable):
        fn = INPLACE_OPERATORS[base] if inplace and isinstance(left, TensorVariable) else BINARY_OPERATORS[base]
        return tx.output.call_tensor_op(tx, "call_function", fn, [left, right], {})
    if isinstance(left, SymNumberVariable) or isinstance(right, SymNumberVariable):
        result = symbolic_arithmetic(tx, BINARY_OPERATORS[base], left, right)
        if result is not None:
            return result
        if is_number(left) and is_number(right):  # `n / 2`, `0.5 * n`: specialized, guarded on n's value
            return _run_constant(BINARY_OPERATORS[base], left.as_constant(), right.as_constant())
        # else (`[0] * n`) the operands are specialized below
    if left.is_constant() and right.is_constant() and isinstance(left, ConstantVariable) \
            and isinstance(right, ConstantVariable):
        return _run_constant(BINARY_OPERATORS[base], left.value, right.value)
    immutable = _immutable_constants(left, right)
    if immutable is not None:  # tuples of constants (torch.Size among them): Python's own rules give the type
        return tx.wrap_sourceless(_run_constant(BINARY_OPERATORS[base], *immutable).value)
    if isinstance(left, BaseListVariable) or isinstance(right, BaseListVariable) or \
            _is_constant_sequence(left) or _is_constant_sequence(right):
        result = _sequence_op(tx, base, inplace, left, right)
        if result is not None:
            return result
    if isinstance(left, CounterVariable) or isinstance(right, CounterVariable):
        return counter_arithmetic(tx, base, inplace, left, right)
    if base == "|" and isinstance(left, (DictVariable, ExternalDictVariable)):
        if inplace:  # `d |= other` updates d itself
            if isinstance(left, ExternalDictVariable):
                left.update_in_place(tx, right)
            else:
                left.call_method(tx, "update", [right], {})
            return left
        merged = DictVariable(dict_type=dict)
        merged.update_from(tx, left)
        merged.update_from(tx, right)
        return merged
    if base in _SET_OPERATORS:
        result = _set_op(tx, base, inplace, left, right)
        if result is not None:
            return result
    return _dunder(tx, base, inplace, left, right)


_SET_OPERATORS = {"|": "update", "&": "intersection_update", "-": "difference_update", "^": "symmetric_difference_update"}


def _set_values(variable: Variable) -> set | frozenset | None:
    """The elements of a set-like operand of constants (a set, a frozenset, a dict's keys or items view), else None."""
    if isinstance(variable, SetVariable):
        return set(variable.values)
    if isinstance(variable, ListIteratorLike) and variable.kind in ("dict_keys", "dict_items") and \
            all(item.is_constant() for item in variable.items):
        return {item.as_constant() for item in variable.items}
    if isinstance(variable, ConstantVariable) and isinstance(variable.value, frozenset):
        return variable.value
    return None


def _set_op(tx, base: str, inplace: bool, left: Variable, right: Variable) -> Variable | None:
    """`a | b`, `a & b`, `a - b`, `a ^ b` (and `|=`...) on sets of constants, dict key views and frozensets,
    as Python computes them; an in-place one on a set updates it (an outside set's update is replayed)."""
    values = _set_values(left), _set_values(right)
    if values[0] is None or values[1] is None:
        return None
    if inplace and isinstance(left, SetVariable):
        left.call_method(tx, _SET_OPERATORS[base], [SetVariable(values[1])], {})
        return left
    result = run_on_constants(BINARY_OPERATORS[base], list(values), {})
    return SetVariable(result) if isinstance(result, set) else tx.wrap_sourceless(result)


def _immutable_constants(left: Variable, right: Variable) -> tuple | None:
    """Both operands as Python values, when both are immutable constants (no list, no tensor)."""
    if isinstance(left, ListVariable) or isinstance(right, ListVariable) or not (left.is_constant() and
                                                                                 right.is_constant()):
        return None
    if _holds_symbolic(left) or _holds_symbolic(right):  # `(-1,) + x.shape[1:]` keeps its symbolic sizes
        return None
    try:
        values = (left.as_constant(), right.as_constant())
    except Unsupported:
        return None
    if all(_immutable(value) for value in values):
        return values
    return None


def _immutable(value: Any) -> bool:
    """A literal, a torch.Size, or a tuple of them (`"%s %d" % (x.shape, n)`)."""
    if is_constant_value(value) or isinstance(value, torch.Size):
        return True
    return type(value) is tuple and all(_immutable(item) for item in value)


def _holds_symbolic(variable: Variable) -> bool:
    """A symbolic number, or a tuple or list holding one (a symbolic shape)."""
    if isinstance(variable, SymNumberVariable):
        return True
    return isinstance(variable, BaseListVariable) and any(_holds_symbolic(item) for item in variable.items)


def _is_constant_sequence(variable: Variable) -> bool:
    return isinstance(variable, ConstantVariable) and isinstance(variable.value, (tuple, list, str))


def _items(tx, variable: Variable) -> list[Variable]:
    return variable.unpack(tx)


def _sequence_op(tx, base, inplace, left, right) -> Variable | None:
    if base == "+":
        left_type, right_type = left.python_type(), right.python_type()
        if issubclass(left_type, list) and issubclass(right_type, list):
            if inplace and isinstance(left, ListVariable):
                left.call_method(tx, "extend", [right], {})
                return left
            return ListVariable(_items(tx, left) + _items(tx, right))
        if inplace and isinstance(left, ListVariable):
            left.call_method(tx, "extend", [right], {})
            return left
        if issubclass(left_type, tuple) and issubclass(right_type, tuple):
            return TupleVariable(_items(tx, left) + _items(tx, right))
        return None
    if base == "*":
        sequence, count = (left, right) if not right.python_type() in (list, tuple) else (right, left)
        if not isinstance(count, ConstantVariable) or not isinstance(count.value, int):
            return None
        items = _items(tx, sequence) * count.value
        if sequence.python_type() is list:
            if inplace and isinstance(sequence, ListVariable) and sequence is left:
                sequence.items = items
                sequence._mutated(tx)
                return sequence
            return ListVariable(items)
        return TupleVariable(items)
    return None


def _dunder(tx, base, inplace, left, right) -> Variable:
    name = _DUNDERS[base]
    attempts = ([(left, f"__i{name}__", right)] if inplace else []) + \
        [(left, f"__{name}__", right), (right, f"__r{name}__", left)]
    for receiver, method, other in attempts:
        if not has_python_method(receiver, method):
            continue
        result = receiver.call_method(tx, method, [other], {})
        if not (isinstance(result, ConstantVariable) and result.value is NotImplemented):
            return result
    raise Unsupported(f"operator {base!r} between {left.describe()} and {right.describe()}")


def unary_op(tx, fn, operand: Variable) -> Variable:
    """-x, +x, ~x (operator.neg / pos / invert)."""
    if isinstance(operand, TensorVariable):
        return tx.output.call_tensor_op(tx, "call_function", fn, [operand], {})
    if isinstance(operand, SymNumberVariable):
        result = symbolic_arithmetic(tx, fn, operand)
        return result if result is not None else _run_constant(fn, operand.as_constant())
    if isinstance(operand, ConstantVariable):
        return _run_constant(fn, operand.value)
    dunder = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__"}[fn]
    if has_python_method(operand, dunder):
        return operand.call_method(tx, dunder, [], {})
    raise Unsupported(f"{fn.__name__} of {operand.describe()}")


def compare_op(tx, symbol: str, left: Variable, right: Variable) -> Variable:
    """Rich comparison: graph node with tensors, Python value otherwise."""
    if isinstance(left, TensorVariable) or isinstance(right, TensorVariable):
        return tx.output.call_tensor_op(tx, "call_function", COMPARE_OPERATORS[symbol], [left, right], {})
    if isinstance(left, SymNumberVariable) or isinstance(right, SymNumberVariable):
        result = symbolic_compare(tx, COMPARE_OPERATORS[symbol], left, right)
        if result is not None:
            return result
    if isinstance(left, ConstantVariable) and isinstance(right, ConstantVariable):
        return _run_constant(COMPARE_OPERATORS[symbol], left.value, right.value)
    if symbol in ("==", "!="):
        equal = compare_equal(tx, left, right)
        return ConstantVariable(equal if symbol == "==" else not equal)
    if left.is_constant() and right.is_constant():
        return _run_constant(COMPARE_OPERATORS[symbol], left.as_constant(), right.as_constant())
    if has_python_method(left, _COMPARE_DUNDERS[symbol]):
        return left.call_method(tx, _COMPARE_DUNDERS[symbol], [right], {})
    raise Unsupported(f"comparison {symbol!r} between {left.describe()} and {right.describe()}")


def contains(tx, container: Variable, item: Variable) -> bool:
    """Python `in`."""
    if isinstance(container, (DictVariable, ExternalDictVariable)):
        return container.contains(tx, item)
    if isinstance(container, BaseIteratorVariable):  # consumes the iterator up to the first match, as Python does
        while True:
            element = container.next_item(tx)
            if element is None:
                return False
            if compare_equal(tx, element, item):
                return True
    if isinstance(container, ModelOutputVariable):
        return item.as_constant() in container.present()
    if isinstance(container, ConstantVariable):
        if isinstance(item, TensorVariable):
            raise Unsupported("`tensor in constant` is data-dependent")
        return _run_constant(operator.contains, container.value, item.as_constant()).value
    if isinstance(container, (BaseListVariable, ModuleVariable)):
        return any(compare_equal(tx, element, item) for element in container.unpack(tx))
    if isinstance(container, TensorVariable):
        raise Unsupported("`x in tensor` is data-dependent")
    if has_python_method(container, "__contains__"):
        return container.call_method(tx, "__contains__", [item], {}).truth(tx)
    return any(compare_equal(tx, element, item) for element in container.unpack(tx))

