"""Python builtins (len, isinstance, getattr, range, zip, min, max, ...), modelled one by one.

Each builtin is one handler `(tx, args, kwargs) -> Variable` in `_HANDLERS`. A
builtin on constants runs for real; on containers it works item by item; on
tensors it becomes a graph node (abs, min/max of tensors via torch) or is refused
when it would need tensor data. `operator` and `math` functions are handled the
same way. The iterator builtins (zip, map, filter, enumerate, iter, next, any, all,
itertools.chain/islice/count) step their inputs lazily, as CPython does; `print` is
recorded and replayed after the graph (kiln/frontend/replay.py).
"""
from __future__ import annotations

import ast
import bisect
import builtins
import collections
import copy
import dataclasses
import functools
import heapq
import itertools
import math
import operator
import random
import struct
import sys
import types
import threading
from typing import Any, Callable

import torch

from kiln.frontend import replay
from kiln.frontend.errors import AttributeFailure, ProgramException, Unsupported, unbreakable
from kiln.frontend.operations import BINARY_OPERATORS, COMPARE_OPERATORS, binary_op, compare_op, contains, unary_op
from kiln.frontend.sources import TypeSource
from kiln.frontend.variables import builder, iterators
from kiln.frontend.variables.base import (NONE, ConstantVariable, ObjectIdVariable, Variable, constant_arguments,
                                          is_constant_value, is_same, lookup_class_attribute, run_on_constants)
from kiln.frontend.variables.containers import (BaseIteratorVariable, BaseListVariable, CounterVariable, DictVariable,
                                                DictViewVariable, ExternalDictVariable, IteratorVariable,
                                                LazyIteratorVariable, ListVariable, SliceVariable, TupleVariable,
                                                hashable_key, iterate, unpack_iterable)
from kiln.frontend.variables.copying import copy_handler, deepcopy_handler
from kiln.frontend.variables.deques import make_deque
from kiln.frontend.variables.functions import BoundMethodVariable, PartialVariable
from kiln.frontend.variables.lazy_itertools import HANDLERS as _LAZY_ITERTOOLS
from kiln.frontend.variables.objects import (ClassVariable, ExceptionVariable, ModelOutputVariable, NewObjectVariable,
                                             UserObjectVariable, new_object)
from kiln.frontend.variables.sets import SetVariable
from kiln.frontend.variables.tensor import TensorVariable
from kiln.frontend.variables.text import user_format, user_text


class BuiltinVariable(Variable):
    """A Python builtin function or type with a kiln handler."""

    def __init__(self, fn: Any, handler: Callable):
        self.fn = fn
        self.handler = handler

    def describe(self) -> str:
        return f"builtin {getattr(self.fn, '__name__', self.fn)}"

    def identity(self) -> Any:
        return self.fn

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return type(self.fn)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(self.fn)

    def truth(self, tx) -> bool:
        return True

    def getitem(self, tx, key: Variable) -> Variable:
        """`list[Tensor]`, `dict[str, int]`: a builtin class's generic alias (annotations, `typing.cast`), made now
        from the classes or constants it is parameterized by."""
        if not isinstance(self.fn, type) or "__class_getitem__" not in vars(self.fn):
            return super().getitem(tx, key)
        items = key.unpack(tx) if type(key).__name__ == "TupleVariable" else [key]
        parameters = []
        for item in items:
            parameter = item.as_constant() if item.is_constant() else item.identity()
            if isinstance(parameter, Variable):
                raise Unsupported(f"{self.describe()}[...] parameterized by {item.describe()}")
            parameters.append(parameter)
        alias = self.fn[tuple(parameters) if len(items) != 1 or type(key).__name__ == "TupleVariable" else parameters[0]]
        return tx.wrap_sourceless(alias)

    def call(self, tx, args, kwargs) -> Variable:
        return self.handler(tx, list(args), dict(kwargs))

    def getattr(self, tx, name: str) -> Variable:
        if isinstance(self.fn, type):
            return ClassVariable(self.fn).getattr(tx, name)
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.fn, name))
        raise Unsupported(f"attribute {name!r} of {self.describe()}")


def _is_numpy_pure(value: Any) -> bool:
    """A NumPy ufunc, or a NumPy scalar type (made from a constant, a NumPy scalar is a constant to kiln)."""
    if type(value).__name__ == "ufunc" and type(value).__module__ == "numpy":
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, type) and issubclass(value, numpy.generic)


def builtin_variable(value: Any) -> BuiltinVariable | None:
    try:
        handler = _HANDLERS.get(value)
    except TypeError:
        return None
    if handler is None and _is_numpy_pure(value):
        handler = _pure(value)  # np.sqrt, np.float32(1.5): pure functions of constant arguments
    return BuiltinVariable(value, handler) if handler is not None else None


_constants = constant_arguments


_run = run_on_constants  # `fn(*values, **keywords)` on constants, for real; what it raises, the program raises


def _pure(fn):
    """A builtin that is a pure function of constant arguments."""

    def handler(tx, args, kwargs):
        constants = _constants(args, kwargs)
        if constants is None:
            raise Unsupported(f"{fn.__name__}() on values not known at trace time "
                              f"({', '.join(arg.describe() for arg in args)})")
        return tx.wrap_sourceless(_run(fn, *constants))

    return handler


def _eval(tx, args, kwargs):
    """`eval` of a constant string that is a literal (`"(1, 'a')"`) or arithmetic on numbers (`"2 + 3"`), as
    Dynamo folds it: no names, calls or attributes, so nothing it reads can change. Anything else (globals or
    locals given, a name in the text, a syntax error) is a graph break: Python evaluates it, except where it
    would read the caller's locals (no namespaces given): only the program's own frame has them, so that
    frame runs eagerly."""
    if len(args) == 1 and not kwargs and isinstance(args[0], ConstantVariable) and isinstance(args[0].value, str):
        with unbreakable():
            return _eval_text(tx, args[0].value)
    if len(args) < 2 and "globals" not in kwargs:
        raise Unsupported("eval() without its own namespaces reads the caller's locals (only the program's own "
                          "frame has them: the frame runs eagerly)", breakable=False)
    raise Unsupported("eval() with its own namespaces (a graph break evaluates it)")


def _eval_text(tx, text: str) -> Variable:
    """One constant string, evaluated in the caller's frame: folded where it is a literal or arithmetic."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise Unsupported(f"eval({text!r}): not an expression (Python raises SyntaxError)") from None
    try:
        return tx.wrap_sourceless(ast.literal_eval(tree))
    except Exception:  # not a literal (or one Python rejects, `{[1]: 2}`): arithmetic, or else a graph break
        pass
    if not all(isinstance(node, _FOLDED_EVAL_NODES) and
               (not isinstance(node, ast.Constant) or type(node.value) in (bool, int, float, complex))
               for node in ast.walk(tree)):
        raise Unsupported(f"eval({text!r}): kiln folds only literals and arithmetic on numbers")
    return tx.wrap_sourceless(_run(eval, [compile(tree, "<string>", "eval"), {"__builtins__": {}}, {}], {}))


_FOLDED_EVAL_NODES = (ast.Expression, ast.Constant, ast.UnaryOp, ast.BinOp, ast.UAdd, ast.USub, ast.Invert, ast.Add,
                      ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitOr, ast.BitXor, ast.BitAnd)


def _per_thread(fn):
    """A value fixed for the calling thread (`threading.get_ident()`): read at trace time and guarded by value,
    so the guard (which runs in the caller's thread) sends another thread to a trace of its own."""
    name = f"{fn.__module__}.{fn.__name__}"

    def handler(tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"{name}() with arguments (the program raises TypeError)")
        value = fn()
        guards = tx.output.guards
        guards.add(None, f"{guards.constant(fn)}() != {value!r}", f"{name}() is no longer {value!r} (another thread)")
        return ConstantVariable(value)

    return handler


def _text(fn):
    """str() / repr() (ascii()): of constants for real; of an exception the program made, its text."""
    pure = _pure(fn)

    def handler(tx, args, kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], ExceptionVariable):
            return args[0].text(tx, fn)
        if len(args) == 1 and not kwargs and (text := user_text(tx, args[0], fn)) is not None:
            return ConstantVariable(text)  # the class's own __str__ / __repr__, inlined
        return pure(tx, args, kwargs)

    return handler


def _method_type(tx, args, kwargs):
    """`types.MethodType(function, obj)`: `function` bound to `obj` (contextlib.ExitStack binds each __exit__)."""
    if len(args) != 2 or kwargs:
        raise Unsupported("types.MethodType() with these arguments (the program raises TypeError)")
    return BoundMethodVariable(args[0], args[1])


def _format(tx, args, kwargs):
    """format(value, spec=""): a user object's own __format__ (or __str__) inlined; constants for real."""
    if 1 <= len(args) <= 2 and not kwargs and all(arg.is_constant() for arg in args[1:]):
        text = user_format(tx, args[0], 0, args[1].as_constant() if len(args) > 1 else "")
        if text is not None:
            return ConstantVariable(text)
    return _pure(format)(tx, args, kwargs)


def _len(tx, args, kwargs):
    return ConstantVariable(args[0].length(tx))


def _python_type(tx, variable: Variable) -> type:
    return variable.python_type()


def _isinstance(tx, args, kwargs):
    variable, classes = args
    cls = _python_type(tx, variable)
    wanted = classes.as_constant()
    if isinstance(variable, TensorVariable) and wanted is torch.nn.Parameter or \
            isinstance(wanted, tuple) and torch.nn.Parameter in wanted and isinstance(variable, TensorVariable):
        return ConstantVariable(variable.real_type is torch.nn.Parameter)
    try:
        return ConstantVariable(issubclass(cls, wanted))
    except TypeError as error:
        raise Unsupported(f"isinstance with {wanted!r}: {error}") from None


def _issubclass(tx, args, kwargs):
    return _pure(issubclass)(tx, args, kwargs)


def _type(tx, args, kwargs):
    if len(args) != 1:
        raise Unsupported("type() with three arguments (creating a class)")
    variable = args[0]
    cls = variable.python_type()
    return tx.wrap(cls, TypeSource(variable.source) if variable.source is not None else None, guard=False)


def _getattr(tx, args, kwargs):
    target, name = args[0], args[1].as_constant()
    if len(args) == 3:
        try:
            return target.getattr(tx, name)
        except AttributeFailure:
            return args[2]
    return target.getattr(tx, name)


def _hasattr(tx, args, kwargs):
    target, name = args[0], args[1].as_constant()
    checker = getattr(target, "has_attribute", None)
    if checker is not None:
        return ConstantVariable(checker(tx, name))
    try:
        target.getattr(tx, name)
        return ConstantVariable(True)
    except AttributeFailure:
        return ConstantVariable(False)
    except Unsupported:
        if isinstance(target, ConstantVariable):
            return ConstantVariable(hasattr(target.value, name))
        raise


def _setattr(tx, args, kwargs):
    args[0].setattr(tx, args[1].as_constant(), args[2])
    return NONE


def _delattr(tx, args, kwargs):
    deleter = getattr(args[0], "delattr", None)
    if deleter is None:
        raise Unsupported(f"delattr on {args[0].describe()}")
    deleter(tx, args[1].as_constant())
    return NONE


def _range(tx, args, kwargs):
    return ConstantVariable(_run(range, [arg.as_constant() for arg in args], {}))


def _iterable_items(tx, variable: Variable) -> list[Variable]:
    return unpack_iterable(tx, variable)


def _enumerate(tx, args, kwargs):
    start = (args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))).as_constant()
    source = iterate(tx, args[0])
    counter = [start]

    def step(tx):
        item = source.next_item(tx)
        if item is None:
            return None
        counter[0] += 1
        return TupleVariable([ConstantVariable(counter[0] - 1), item])

    return LazyIteratorVariable("enumerate", step, lambda: (enumerate, [source, ConstantVariable(counter[0])]))


def _zip(tx, args, kwargs):
    strict = kwargs.get("strict", ConstantVariable(False)).as_constant()
    sources = [iterate(tx, arg) for arg in args]

    def step(tx):
        if not sources:
            return None
        row = []
        for position, source in enumerate(sources):  # in order, like CPython: later ones are not advanced
            item = source.next_item(tx)
            if item is None:
                if strict:
                    _zip_strict_check(tx, sources, position)
                return None
            row.append(item)
        return TupleVariable(row)

    return LazyIteratorVariable("zip", step, None if strict else lambda: (zip, list(sources)))


def _zip_strict_check(tx, sources, exhausted: int) -> None:
    """zip(strict=True) found argument `exhausted` at its end: CPython's ValueError if the arguments differ in
    length (a later argument is stepped once to see, as CPython does)."""
    if exhausted == 0:
        exhausted = next((position for position, other in enumerate(sources[1:], 1)
                          if other.next_item(tx) is not None), None)
        if exhausted is None:
            return
        relation = "longer"
    else:
        relation = "shorter"
    message = f"zip() argument {exhausted + 1} is {relation} than argument{' ' if exhausted == 1 else 's 1-'}{exhausted}"
    raise ProgramException(message, ValueError, [ConstantVariable(message)])


def _map(tx, args, kwargs):
    function, sources = args[0], [iterate(tx, arg) for arg in args[1:]]
    if not sources:
        raise Unsupported("map() with no iterable (the program raises TypeError)")

    def step(tx):
        row = []
        for source in sources:
            item = source.next_item(tx)
            if item is None:
                return None
            row.append(item)
        return function.call(tx, row, {})

    return LazyIteratorVariable("map", step, lambda: (map, [function, *sources]))


def _filter(tx, args, kwargs):
    function, source = args[0], iterate(tx, args[1])
    keeps_truthy = isinstance(function, ConstantVariable) and function.value is None

    def step(tx):
        while True:
            item = source.next_item(tx)
            if item is None or (item.truth(tx) if keeps_truthy else function.call(tx, [item], {}).truth(tx)):
                return item

    return LazyIteratorVariable("filter", step)


def _reversed(tx, args, kwargs):
    if isinstance(args[0], ListVariable) and args[0].python_type() is list:
        return _live_reversed(args[0], len(args[0].items) - 1)
    if _reverses_as_dict(args[0]):
        view = isinstance(args[0], DictViewVariable)
        return _reversed_dict(tx, args[0].owner if view else args[0], args[0].kind if view else "dict_keys")
    return IteratorVariable(list(reversed(_iterable_items(tx, args[0]))))


def _reverses_as_dict(variable: Variable) -> bool:
    """A dict (not an OrderedDict, whose reverse iterator checks its keys its own way) or a view of one."""
    if isinstance(variable, DictViewVariable):
        if variable.of_object is not None:
            return False
        variable = variable.owner
    return isinstance(variable, (DictVariable, ExternalDictVariable)) and \
        issubclass(variable.python_type(), dict) and not issubclass(variable.python_type(), collections.OrderedDict)


def _reversed_dict(tx, owner: Variable, kind: str) -> LazyIteratorVariable:
    """`reversed(d)` (or of a view of d): as CPython's reverse dict iterator, each step first checks that d still
    has the size it had when the iterator was made, else raises "dictionary changed size during iteration" (and
    so at every later step), and reads the value d has now. A copy of the items made with it missed both."""
    key_trackers = owner.unpack(tx)
    keys = [hashable_key(tx, key) for key in key_trackers]
    position = [len(keys) - 1]
    failed = [False]

    def step(tx):
        if failed[0] or owner.length(tx) != len(keys):
            failed[0] = True
            message = "dictionary changed size during iteration"
            raise ProgramException(message, RuntimeError, [ConstantVariable(message)])
        if position[0] < 0:
            return None
        if [hashable_key(tx, key) for key in owner.unpack(tx)] != keys:
            raise Unsupported("reversed() over a dict whose keys changed (not their number) during the loop")
        key = key_trackers[position[0]]
        position[0] -= 1
        if kind == "dict_keys":
            return key
        value = owner.getitem(tx, key)
        return value if kind == "dict_values" else TupleVariable([key, value])

    def parts():
        if failed[0]:
            return None
        return iterators.reversed_dict_at, [owner, ConstantVariable(kind), ConstantVariable(position[0]),
                                            ConstantVariable(len(keys))]

    return LazyIteratorVariable(_REVERSED_DICT_KINDS[kind], step, parts)


def _reversed_dict_at(tx, args, kwargs):
    """`iterators.reversed_dict_at(d, kind, index, size)` in a resume function's prologue: the reverse dict
    iterator again, or (d changed size) one that raises at its first step."""
    container, kind, index, size = (args[0], *(arg.as_constant() for arg in args[1:]))
    if container.length(tx) != size:
        message = iterators.changed_size_message(container.python_type())
        return tx.wrap_sourceless(iterators.changed_during_iteration).call(tx, [ConstantVariable(message)], {})
    iterator = _reversed_dict(tx, container, kind)
    for _ in range(size - 1 - index):
        iterator.next_item(tx)
    return iterator


_REVERSED_DICT_KINDS = {"dict_keys": "dict_reversekeyiterator", "dict_values": "dict_reversevalueiterator",
                        "dict_items": "dict_reverseitemiterator"}


def _live_reversed(sequence: ListVariable, index: int) -> LazyIteratorVariable:
    """`reversed(list)`: as CPython's reverse list iterator, an index into the list, read at each step (an item
    removed from the front inside the loop shifts what it gives next; one appended is never reached); once the
    index is off either end it stays exhausted. Not a copy of the items as they were when it was made."""
    position = [index]

    def step(tx):
        if 0 <= position[0] < len(sequence.items):
            position[0] -= 1
            return sequence.items[position[0] + 1]
        position[0] = -1
        return None

    def parts():
        if position[0] >= len(sequence.items):  # off the end the list shrank to: `__setstate__` would clamp it
            return None
        return iterators.reversed_at, [sequence, ConstantVariable(position[0])]

    return LazyIteratorVariable("list_reverseiterator", step, parts)


def _reversed_at(tx, args, kwargs):
    """`iterators.reversed_at(list, index)` in a resume function's prologue: the live reversed iterator again."""
    sequence, index = args
    if not (isinstance(sequence, ListVariable) and sequence.python_type() is list):
        raise Unsupported(f"reversed_at over {sequence.describe()}")
    return _live_reversed(sequence, index.as_constant())


def _iter(tx, args, kwargs):
    if len(args) != 1:
        raise Unsupported("iter(callable, sentinel)")
    return iterate(tx, args[0])


def _next(tx, args, kwargs):
    iterator = args[0]
    if not isinstance(iterator, BaseIteratorVariable):
        raise Unsupported(f"next() on {iterator.describe()} (the program raises TypeError unless it is an iterator)")
    item = iterator.next_item(tx)
    if item is None:
        if len(args) > 1:
            return args[1]
        raise ProgramException("next() on an exhausted iterator", StopIteration, iterator.stop_arguments())
    return item


def _object_new(tx, args, kwargs):
    """`object.__new__(cls)` (`super().__new__(cls)` in a class's own __new__)."""
    if not args:
        raise Unsupported("object.__new__() without a class (the program raises TypeError)")
    cls = args[0].as_constant()
    if not isinstance(cls, type):
        raise Unsupported(f"object.__new__({args[0].describe()}) (the program raises TypeError)")
    if len(args) > 1 or kwargs:
        raise ProgramException(f"object.__new__({cls.__qualname__}) with arguments", TypeError)
    return new_object(cls)


def _tuple_new(tx, args, kwargs):
    """`tuple.__new__(cls, iterable)`, as a namedtuple's `_make` calls it."""
    if kwargs or not 1 <= len(args) <= 2:
        raise Unsupported("tuple.__new__ with these arguments")
    cls = args[0].as_constant()
    if not (isinstance(cls, type) and issubclass(cls, tuple)) or \
            (cls is not tuple and not (hasattr(cls, "_fields") and "__slots__" in vars(cls))):
        raise Unsupported(f"tuple.__new__({getattr(cls, '__qualname__', cls)!r}) (kiln models tuples and namedtuples)")
    items = _iterable_items(tx, args[1]) if len(args) > 1 else []
    return TupleVariable(items, tuple_type=cls)


def _sequence_builder(kind):
    def handler(tx, args, kwargs):
        items = _iterable_items(tx, args[0]) if args else []
        if kind is list:
            return ListVariable(items)
        return TupleVariable(items)

    return handler


def _dict(dict_type: type):
    """dict(...) and collections.OrderedDict(...)."""
    def handler(tx, args, kwargs):
        if len(args) > 1:
            raise Unsupported(f"{dict_type.__name__}() with {len(args)} positional arguments (the program raises "
                              "TypeError)")
        result = DictVariable(dict_type=dict_type)
        if args:
            result.update_from(tx, args[0])
        for key, value in kwargs.items():
            result.entries[key] = (ConstantVariable(key), value)
        return result

    return handler


def _fromkeys(dict_type: type):
    """dict.fromkeys(iterable, value=None) (and a dict subclass's, OrderedDict's): a new dict whose every key
    maps to the one value object, as Python builds it."""
    def handler(tx, args, kwargs):
        if kwargs or not 1 <= len(args) <= 2:
            raise Unsupported(f"{dict_type.__name__}.fromkeys() with {len(args)} positional and {len(kwargs)} "
                              "keyword arguments (the program raises TypeError)")
        value = args[1] if len(args) == 2 else ConstantVariable(None)
        result = DictVariable(dict_type=dict_type)
        for key in _iterable_items(tx, args[0]):
            result.entries[hashable_key(tx, key)] = (key, value)
        return result

    return handler


# Class methods of builtin types that are pure functions of their (constant) arguments.
_PURE_CLASS_METHODS = {(int, "from_bytes"), (float, "fromhex"), (bytes, "fromhex"), (bytearray, "fromhex"),
                       (str, "maketrans"), (bytes, "maketrans"), (bytearray, "maketrans")}


def builtin_class_method(value: Any) -> Variable | None:
    """A builtin type's class method, bound to its class (`dict.fromkeys`, `int.from_bytes`), when kiln models
    it: dict.fromkeys builds a dict; the pure ones run on constant arguments. None for any other (a class
    method of a C type, `datetime.now`, may read the world: the caller makes it opaque)."""
    owner = value.__self__
    if value.__name__ == "fromkeys" and issubclass(owner, dict):
        return BuiltinVariable(value, _fromkeys(owner))
    if (owner, value.__name__) in _PURE_CLASS_METHODS:
        return BuiltinVariable(value, _pure(value))
    return None


def _counter(tx, args, kwargs):
    """collections.Counter(iterable or mapping, **counts): counted now (see CounterVariable)."""
    counter = CounterVariable()
    if args or kwargs:
        counter.call_method(tx, "update", args, kwargs)
    return counter


def _set(kind):
    def handler(tx, args, kwargs):
        items = _iterable_items(tx, args[0]) if args else []
        values = [item.as_constant() for item in items]
        return ConstantVariable(frozenset(values)) if kind is frozenset else SetVariable(values)

    return handler


class SeededRandomVariable(Variable):
    """A `random.Random(seed)` made in the trace with a constant seed: its draws are a function of the seed
    alone, so kiln draws them now, from a generator of its own seeded the same, and they are constants of
    the trace (eager makes the same generator, and the same draws, on every call). An unseeded generator, or
    one the trace did not make (the module's, an argument), draws only when the program runs: a graph break.
    The generator itself never leaves the trace (returned or live across a break, the frame runs eagerly)."""

    def __init__(self, generator: random.Random):
        self.generator = generator

    def describe(self) -> str:
        return "random.Random made in the trace"

    def python_type(self) -> type:
        return random.Random

    def truth(self, tx) -> bool:
        return True

    def call_method(self, tx, name, args, kwargs):
        if name not in _RANDOM_METHODS:
            raise Unsupported(f"random.Random.{name} (kiln draws only from the methods of constant arguments)")
        constants = _constants(args, kwargs)
        if constants is None or not all(is_constant_value(value) for value in [*constants[0], *constants[1].values()]):
            raise Unsupported(f"random.Random.{name} with arguments that are not immutable constants")
        return tx.wrap_sourceless(_run(getattr(self.generator, name), *constants))

    def reconstruct(self, codegen) -> str:
        raise Unsupported("a random.Random made in the trace, used after it (kiln keeps its state only while tracing)")


# Methods whose result depends only on the generator's state and their (immutable) arguments; `shuffle`, which
# changes a list in place, is not among them.
_RANDOM_METHODS = frozenset({
    "random", "uniform", "randint", "randrange", "choice", "choices", "sample", "gauss", "normalvariate",
    "lognormvariate", "expovariate", "vonmisesvariate", "gammavariate", "betavariate", "paretovariate",
    "weibullvariate", "triangular", "binomialvariate", "getrandbits", "randbytes", "seed", "getstate", "setstate"})


def _seeded_random(tx, args, kwargs):
    """random.Random(seed) with a constant seed (see SeededRandomVariable)."""
    constants = _constants(args, kwargs)
    if not args or kwargs or constants is None or args[0].as_constant() is None:
        raise Unsupported("random.Random() without a constant seed: its draws exist only when the program runs "
                          "(a graph break makes them in Python)")
    return SeededRandomVariable(_run(random.Random, *constants))


def _reduce_min_max(fn, torch_fn):
    def handler(tx, args, kwargs):
        items = _iterable_items(tx, args[0]) if len(args) == 1 else args
        keyed = "key" in kwargs and not (kwargs["key"].is_constant() and kwargs["key"].as_constant() is None)
        if any(isinstance(item, TensorVariable) for item in items) and not keyed:
            if len(items) == 2 and not kwargs:
                return tx.output.call_tensor_op(tx, "call_function", torch_fn, items, {})
            raise Unsupported(f"{fn.__name__}() over tensors (compares tensor values in Python)")
        constants = None if keyed else _constants(items, kwargs)
        if constants is None:
            if keyed and set(kwargs) <= {"key", "default"}:
                key = kwargs["key"]
                if not items and "default" in kwargs:
                    return kwargs["default"]
                scores = [key.call(tx, [item], {}).as_constant() for item in items]
                # the first of equal best scores, as Python's (max over (score, index) pairs took the last one)
                return items[_run(fn, [range(len(items))], {"key": scores.__getitem__})]
            raise Unsupported(f"{fn.__name__}() on values not known at trace time")
        values, keywords = constants
        return ConstantVariable(_run(fn, [values], keywords))

    return handler


def _sum(tx, args, kwargs):
    items = _iterable_items(tx, args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    for item in items:
        total = binary_op(tx, "+", total, item)
    return total


def _any_all(fn):
    """any/all stop at the first item that decides, as in Python (a generator runs only that far)."""
    def handler(tx, args, kwargs):
        source = iterate(tx, args[0])
        deciding = fn is any
        while True:
            item = source.next_item(tx)
            if item is None:
                return ConstantVariable(not deciding)
            if item.truth(tx) == deciding:
                return ConstantVariable(deciding)

    return handler


def _abs(tx, args, kwargs):
    if isinstance(args[0], TensorVariable):
        return tx.output.call_tensor_op(tx, "call_function", operator.abs, args, {})
    return _pure(abs)(tx, args, kwargs)


def _bool(tx, args, kwargs):
    return ConstantVariable(args[0].truth(tx) if args else False)


def _numeric(kind):
    def handler(tx, args, kwargs):
        if args and isinstance(args[0], TensorVariable):
            raise Unsupported(f"{kind.__name__}() of a tensor needs its data (data-dependent)")
        return _pure(kind)(tx, args, kwargs)

    return handler


def _callable(tx, args, kwargs):
    variable = args[0]
    if isinstance(variable, ConstantVariable):
        return ConstantVariable(callable(variable.value))
    if isinstance(variable, UserObjectVariable):
        return ConstantVariable(lookup_class_attribute(type(variable.value), "__call__")[1] is not None)
    return ConstantVariable(not isinstance(variable, (BaseListVariable, DictVariable, TensorVariable)))


def _slice(tx, args, kwargs):
    parts = list(args) + [NONE] * (3 - len(args))
    if len(args) == 1:
        parts = [NONE, args[0], NONE]
    return SliceVariable(*parts)


def _vars(tx, args, kwargs):
    """vars(obj): `obj.__dict__`, looked up as an attribute (a class's __getattribute__ sees it)."""
    if not args and not kwargs:
        raise Unsupported("vars() without an object reads the caller's locals (only the program's own frame has "
                          "them: the frame runs eagerly)", breakable=False)
    if len(args) != 1 or kwargs:
        raise Unsupported("vars() with other than one object (Python raises TypeError)")
    return args[0].getattr(tx, "__dict__")


def _super(tx, args, kwargs):
    return tx.make_super(args)


def _print(tx, args, kwargs):
    """print(...) is replayed after the graph (kiln/frontend/replay.py), with its arguments as they are now."""
    unknown = set(kwargs) - {"sep", "end", "file", "flush"}
    if unknown:
        raise Unsupported(f"print() with keyword arguments {sorted(unknown)} (the program raises TypeError)")
    held = [replay.snapshot(arg, "print()") for arg in args]
    options: dict[str, Variable] = {key: replay.snapshot(kwargs[key], "print()")
                                    for key in ("sep", "end", "flush") if key in kwargs}
    stream = kwargs.get("file", NONE)
    if not (isinstance(stream, ConstantVariable) and stream.value is None):
        if stream.source is None:
            raise Unsupported(f"print(file={stream.describe()}): a stream made inside the compiled function")
        options["file"] = stream  # read when the entry prints, like sys.stdout would be
    tx.output.side_effects.replay_call(builtins.print, held, options)
    return NONE


def _id(tx, args, kwargs):
    identity = args[0].identity()
    if identity is args[0]:
        if isinstance(args[0], TensorVariable):  # a tensor changed in place is a new tracker: no identity to key
            raise Unsupported(f"id() of {args[0].describe()} created during the trace")
        return ObjectIdVariable(args[0])  # known only when the program runs; compared and hashed by its object
    return ConstantVariable(id(identity))


def _operator_binary(symbol):
    return lambda tx, args, kwargs: binary_op(tx, symbol, args[0], args[1])


def _operator_compare(symbol):
    return lambda tx, args, kwargs: compare_op(tx, symbol, args[0], args[1])


def _operator_getitem(tx, args, kwargs):
    return args[0].getitem(tx, args[1])


def _operator_contains(tx, args, kwargs):
    return ConstantVariable(contains(tx, args[0], args[1]))


def _operator_is(negate):
    return lambda tx, args, kwargs: ConstantVariable(is_same(args[0], args[1], tx) != negate)


def _operator_not(tx, args, kwargs):
    return ConstantVariable(not args[0].truth(tx))


def _unary(fn):
    return lambda tx, args, kwargs: unary_op(tx, fn, args[0])


def _math(fn):
    def handler(tx, args, kwargs):
        if any(isinstance(arg, TensorVariable) for arg in args):
            raise Unsupported(f"math.{fn.__name__} of a tensor needs its data; use torch.{fn.__name__}")
        return _pure(fn)(tx, args, kwargs)

    return handler


def _fields(tx, args, kwargs):
    target = args[0]
    cls = target.cls if isinstance(target, (ModelOutputVariable, NewObjectVariable)) else target.as_constant()
    return ConstantVariable(tuple(dataclasses.fields(cls)))


def _is_dataclass(tx, args, kwargs):
    return ConstantVariable(dataclasses.is_dataclass(args[0].python_type()) or
                            (args[0].is_constant() and dataclasses.is_dataclass(args[0].as_constant())))


def _partial(tx, args, kwargs):
    return PartialVariable(args[0], list(args[1:]), kwargs)


def _reduce(tx, args, kwargs):
    function, items = args[0], _iterable_items(tx, args[1])
    if len(args) > 2:
        accumulator = args[2]
    else:
        accumulator, items = items[0], items[1:]
    for item in items:
        accumulator = function.call(tx, [accumulator, item], {})
    return accumulator


def _chain(tx, args, kwargs):
    pending = list(args)
    current: list[BaseIteratorVariable] = []

    def step(tx):
        while True:
            if not current:
                if not pending:
                    return None
                current.append(iterate(tx, pending.pop(0)))  # like chain: each input is iterated when reached
            item = current[0].next_item(tx)
            if item is not None:
                return item
            current.clear()

    return LazyIteratorVariable("chain", step)


def _chain_from_iterable(tx, args, kwargs):
    """itertools.chain.from_iterable(iterables): the outer iterable is stepped only when an inner one ends."""
    if len(args) != 1 or kwargs:
        raise Unsupported("chain.from_iterable() with these arguments (the program raises TypeError)")
    outer = iterate(tx, args[0])
    current: list[BaseIteratorVariable] = []

    def step(tx):
        while True:
            if not current:
                inner = outer.next_item(tx)
                if inner is None:
                    return None
                current.append(iterate(tx, inner))
            item = current[0].next_item(tx)
            if item is not None:
                return item
            current.clear()

    return LazyIteratorVariable("chain", step)


def _islice(tx, args, kwargs):
    """itertools.islice(iterable, stop) / (iterable, start, stop[, step]): takes only what it yields."""
    if kwargs or not 2 <= len(args) <= 4:
        raise Unsupported("itertools.islice with these arguments (the program raises TypeError)")
    source = iterate(tx, args[0])
    bounds = slice(*[arg.as_constant() for arg in args[1:]])
    start, stop, step = bounds.start or 0, bounds.stop, bounds.step or 1
    if any(not isinstance(value, int) or value < 0 for value in (start, step)) or step == 0 or \
            (stop is not None and (not isinstance(stop, int) or stop < 0)):
        raise Unsupported(f"itertools.islice bounds {bounds} (the program raises ValueError)")
    state = {"consumed": 0, "next": start}

    def step_fn(tx):  # CPython's islice_next, step for step: the items it consumes are the ones eager consumes
        while state["consumed"] < state["next"]:
            if source.next_item(tx) is None:
                return None
            state["consumed"] += 1
        if stop is not None and state["consumed"] >= stop:
            return None
        item = source.next_item(tx)
        if item is None:
            return None
        state["consumed"] += 1
        state["next"] += step
        if stop is not None and state["next"] > stop:
            state["next"] = stop
        return item

    return LazyIteratorVariable("islice", step_fn)


def _count(tx, args, kwargs):
    """itertools.count(start=0, step=1) of constants."""
    values = [arg.as_constant() for arg in args]
    keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
    counter = _run(itertools.count, values, keywords)
    return LazyIteratorVariable("count", lambda tx: ConstantVariable(next(counter)))


def _product(tx, args, kwargs):
    if set(kwargs) - {"repeat"}:
        raise Unsupported(f"itertools.product() with keywords {sorted(kwargs)} (the program raises TypeError)")
    repeat = kwargs.get("repeat", ConstantVariable(1))
    if not repeat.is_constant():
        raise Unsupported("itertools.product(repeat=...) not known at trace time")
    columns = [_iterable_items(tx, arg) for arg in args]
    rows = _run(itertools.product, [*columns], {"repeat": repeat.as_constant()})  # (repeat was ignored: wrong rows)
    return IteratorVariable([TupleVariable(list(row)) for row in rows])


def _defaultdict(tx, args, kwargs):
    """collections.defaultdict(factory, mapping or pairs, **entries): a DictVariable whose missing keys call
    `factory` (kiln's trackers call it as the program would)."""
    factory = args[0] if args else ConstantVariable(None)
    if len(args) > 2:
        raise Unsupported(f"defaultdict() with {len(args)} positional arguments (the program raises TypeError)")
    if factory.is_constant() and not (factory.as_constant() is None or callable(factory.as_constant())):
        raise ProgramException("defaultdict(): first argument must be callable or None", TypeError,
                               [ConstantVariable("first argument must be callable or None")])
    result = DictVariable(dict_type=collections.defaultdict, default_factory=factory)
    if len(args) == 2:
        result.update_from(tx, args[1])
    for key, value in kwargs.items():
        result.entries[key] = (ConstantVariable(key), value)
    return result


def _sorted(tx, args, kwargs):
    """sorted(iterable, *, key=None, reverse=False): the items ordered by constant sort keys (the items
    themselves, or what `key` returns for each, traced), stably as Python sorts; the items may be anything."""
    if len(args) != 1 or set(kwargs) - {"key", "reverse"}:
        raise Unsupported("sorted() with these arguments (the program raises TypeError)")
    items = _iterable_items(tx, args[0])
    key, reverse = kwargs.get("key"), kwargs.get("reverse", ConstantVariable(False))
    if key is None or (key.is_constant() and key.as_constant() is None):
        scores = items
    else:
        scores = [key.call(tx, [item], {}) for item in items]
    if not reverse.is_constant():
        raise Unsupported("sorted() with a reverse flag not known at trace time")
    values = [_sort_value(score) for score in scores]
    order = _run(sorted, [range(len(items))], {"key": values.__getitem__, "reverse": bool(reverse.as_constant())})
    return ListVariable([items[index] for index in order])


class _Unordered:
    """A sort key's part whose value the trace does not know (a tensor in `(name, tensor)`): Python compares
    tuples element by element, so it is compared only where the elements before it tie, and then the order
    depends on data: a graph break. Equal to itself alone, as Python's identity test in `==` makes it."""

    def __init__(self, variable: Variable):
        self.variable = variable

    def __eq__(self, other):
        if other is self:
            return True
        raise Unsupported(f"sorted() comparing {self.variable.describe()} (values not known at trace time)")

    __lt__ = __gt__ = __le__ = __ge__ = __eq__
    __hash__ = object.__hash__


def _sort_value(variable: Variable) -> Any:
    """A sort key as Python compares it: constants as they are, tuples and lists element by element."""
    if variable.is_constant():
        return variable.as_constant()
    if isinstance(variable, BaseListVariable) and variable.python_type() in (tuple, list):
        return variable.python_type()(_sort_value(item) for item in variable.items)
    return _Unordered(variable)


def _structural(fn):
    """An itertools function that only arranges its inputs' items (permutations, combinations, pairwise,
    zip_longest): run on the trackers themselves, its tuples of items built now, as CPython builds them."""
    def handler(tx, args, kwargs):
        if fn is itertools.zip_longest:  # every argument an iterable; fillvalue any tracker
            iterables, keywords = [_iterable_items(tx, arg) for arg in args], dict(kwargs)
        else:  # one iterable, then constants (r)
            iterables = [_iterable_items(tx, args[0]), *(arg.as_constant() for arg in args[1:])]
            keywords = {name: value.as_constant() for name, value in kwargs.items()}
        return IteratorVariable([TupleVariable(list(row)) for row in _run(fn, iterables, keywords)])

    return handler


def _accumulate(tx, args, kwargs):
    """itertools.accumulate(iterable, func=operator.add, *, initial=None): the running totals, each traced."""
    if not 1 <= len(args) <= 2 or set(kwargs) - {"func", "initial"}:
        raise Unsupported("itertools.accumulate with these arguments (the program raises TypeError)")
    func = args[1] if len(args) == 2 else kwargs.get("func")
    if func is not None and func.is_constant() and func.as_constant() is None:
        func = None
    initial = kwargs.get("initial")
    totals = [] if initial is None or (initial.is_constant() and initial.as_constant() is None) else [initial]
    for item in _iterable_items(tx, args[0]):
        if not totals:
            totals.append(item)
        else:
            total = binary_op(tx, "+", totals[-1], item) if func is None else func.call(tx, [totals[-1], item], {})
            totals.append(total)
    return IteratorVariable(totals)


def _repeat(tx, args, kwargs):
    """itertools.repeat(object[, times]): the same tracker, `times` times (or without end, lazily)."""
    times = args[1] if len(args) > 1 else kwargs.get("times")
    if times is None:
        return LazyIteratorVariable("repeat", lambda tx: args[0])
    return IteratorVariable([args[0]] * max(0, int(times.as_constant())))


class GetterVariable(Variable):
    """operator.itemgetter(*keys) / attrgetter(*names) made in the trace: calling it reads its argument."""

    def __init__(self, kind: type, keys: list):
        self.kind = kind
        self.keys = keys  # constants: items or dotted attribute names

    def describe(self) -> str:
        return f"operator.{self.kind.__name__}({', '.join(map(repr, self.keys))})"

    def python_type(self) -> type:
        return self.kind

    def truth(self, tx) -> bool:
        return True

    def call(self, tx, args, kwargs) -> Variable:
        if len(args) != 1 or kwargs:
            raise Unsupported(f"calling {self.describe()} with these arguments (the program raises TypeError)")
        values = []
        for key in self.keys:
            if self.kind is operator.itemgetter:
                values.append(args[0].getitem(tx, tx.wrap_sourceless(key)))
            else:
                value = args[0]
                for name in key.split("."):
                    value = value.getattr(tx, name)
                values.append(value)
        return values[0] if len(values) == 1 else TupleVariable(values)

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(self.kind)}({', '.join(repr(key) for key in self.keys)})"


def _getter(kind: type):
    def handler(tx, args, kwargs):
        keys = [arg.as_constant() for arg in args]
        if kwargs or not keys or not all(is_constant_value(key) for key in keys) or \
                (kind is operator.attrgetter and not all(isinstance(key, str) for key in keys)):
            raise Unsupported(f"operator.{kind.__name__} with these arguments")
        return GetterVariable(kind, keys)

    return handler


class _HeapEntry:
    """A list item as heapq compares it: by its sort value (`_sort_value`), carrying its tracker."""

    def __init__(self, variable: Variable):
        self.variable = variable
        self.value = _sort_value(variable)

    def __lt__(self, other: "_HeapEntry") -> bool:
        return self.value < other.value


def _heap_mutator(fn):
    """heapq.heappush / heappop / heapify / heappushpop / heapreplace on a list the trace holds: heapq itself
    reorders the items (compared by their known values; a comparison that reaches a tensor breaks), and the
    list records the change (an outside list's is replayed)."""
    def handler(tx, args, kwargs):
        if kwargs or not args or not isinstance(args[0], ListVariable):
            raise Unsupported(f"heapq.{fn.__name__} on {args[0].describe() if args else 'nothing'}")
        heap = [_HeapEntry(item) for item in args[0].items]
        # what heapq raises (IndexError: an empty heap) is the program's
        result = _run(fn, [heap, *(_HeapEntry(arg) for arg in args[1:])], {})
        args[0].items[:] = [entry.variable for entry in heap]
        args[0]._mutated(tx)
        return result.variable if isinstance(result, _HeapEntry) else NONE

    return handler


def _heap_select(largest: bool):
    """heapq.nsmallest / nlargest(n, iterable, key=None): sorted(iterable, key=key)[:n], as heapq documents."""
    def handler(tx, args, kwargs):
        if len(args) != 2 or set(kwargs) - {"key"}:
            raise Unsupported("heapq.nsmallest/nlargest with these arguments (the program raises TypeError)")
        ordered = _sorted(tx, [args[1]], {**kwargs, "reverse": ConstantVariable(largest)})
        return ListVariable(ordered.items[:max(0, int(args[0].as_constant()))])

    return handler


_HANDLERS: dict[Any, Callable] = {
    builtins.len: _len, builtins.isinstance: _isinstance, builtins.issubclass: _issubclass,
    builtins.type: _type, builtins.getattr: _getattr, builtins.hasattr: _hasattr, builtins.setattr: _setattr,
    builtins.delattr: _delattr, builtins.range: _range, builtins.enumerate: _enumerate, builtins.zip: _zip,
    builtins.map: _map, builtins.filter: _filter, builtins.reversed: _reversed, builtins.iter: _iter,
    collections.deque: make_deque,
    types.MethodType: _method_type,
    sys.exc_info: lambda tx, args, kwargs: tx.exception_info(),
    sys.exception: lambda tx, args, kwargs: tx.exception_info().items[1],
    builtins.next: _next, builtins.list: _sequence_builder(list), builtins.tuple: _sequence_builder(tuple),
    object.__new__: _object_new, tuple.__new__: _tuple_new, builtins.dict: _dict(dict),
    collections.OrderedDict: _dict(collections.OrderedDict), builtins.set: _set(set),
    builtins.frozenset: _set(frozenset), collections.Counter: _counter,
    builtins.min: _reduce_min_max(min, torch.minimum), builtins.max: _reduce_min_max(max, torch.maximum),
    builtins.sum: _sum, builtins.any: _any_all(any), builtins.all: _any_all(all), builtins.abs: _abs,
    builtins.bool: _bool, builtins.int: _numeric(int), builtins.float: _numeric(float),
    builtins.str: _text(str), builtins.repr: _text(repr), builtins.ascii: _text(ascii), builtins.round: _numeric(round),
    builtins.divmod: _pure(divmod), builtins.pow: _pure(pow), builtins.sorted: _sorted,
    builtins.callable: _callable, builtins.slice: _slice, builtins.super: _super, builtins.vars: _vars,
    builtins.print: _print,
    builtins.id: _id, builtins.hash: _pure(hash), builtins.chr: _pure(chr), builtins.ord: _pure(ord),
    builtins.format: _format, builtins.eval: _eval,
    struct.pack: _pure(struct.pack), struct.unpack: _pure(struct.unpack), struct.calcsize: _pure(struct.calcsize),
    struct.unpack_from: _pure(struct.unpack_from), random.Random: _seeded_random,
    threading.get_ident: _per_thread(threading.get_ident),
    threading.get_native_id: _per_thread(threading.get_native_id),
    operator.getitem: _operator_getitem, operator.contains: _operator_contains, operator.is_: _operator_is(False),
    operator.is_not: _operator_is(True), operator.not_: _operator_not, operator.neg: _unary(operator.neg),
    operator.pos: _unary(operator.pos), operator.invert: _unary(operator.invert),
    operator.truth: _bool, operator.index: _numeric(operator.index),
    dataclasses.fields: _fields, dataclasses.is_dataclass: _is_dataclass, functools.partial: _partial,
    functools.reduce: _reduce, itertools.chain: _chain,
    itertools.chain.from_iterable: _chain_from_iterable, itertools.product: _product, itertools.islice: _islice,
    itertools.count: _count, copy.deepcopy: deepcopy_handler, copy.copy: copy_handler,
    collections.defaultdict: _defaultdict, itertools.accumulate: _accumulate, itertools.repeat: _repeat,
    itertools.permutations: _structural(itertools.permutations),
    itertools.combinations: _structural(itertools.combinations),
    itertools.combinations_with_replacement: _structural(itertools.combinations_with_replacement),
    itertools.pairwise: _structural(itertools.pairwise), itertools.zip_longest: _structural(itertools.zip_longest),
    operator.itemgetter: _getter(operator.itemgetter), operator.attrgetter: _getter(operator.attrgetter),
    heapq.heappush: _heap_mutator(heapq.heappush), heapq.heappop: _heap_mutator(heapq.heappop),
    heapq.heapify: _heap_mutator(heapq.heapify), heapq.heappushpop: _heap_mutator(heapq.heappushpop),
    heapq.heapreplace: _heap_mutator(heapq.heapreplace), heapq.nsmallest: _heap_select(False),
    heapq.nlargest: _heap_select(True), bisect.bisect_left: _pure(bisect.bisect_left),
    bisect.bisect_right: _pure(bisect.bisect_right),
}
for _symbol, _fn in BINARY_OPERATORS.items():
    _HANDLERS[_fn] = _operator_binary(_symbol)
for _symbol, _fn in COMPARE_OPERATORS.items():
    _HANDLERS[_fn] = _operator_compare(_symbol)
_HANDLERS.update(_LAZY_ITERTOOLS)
for _name in ("sqrt", "exp", "log", "log2", "log10", "ceil", "floor", "sin", "cos", "tan", "tanh", "pow", "gcd",
              "isqrt", "prod", "isfinite", "isinf", "isnan", "fabs", "trunc", "atan", "atan2", "erf", "lcm", "hypot",
              "copysign", "fmod", "radians", "degrees", "log1p", "expm1", "sinh", "cosh", "asin", "acos", "isclose",
              "dist", "fsum", "comb", "perm", "factorial", "ldexp", "frexp", "modf", "remainder", "cbrt", "exp2"):
    _HANDLERS[getattr(math, _name)] = _math(getattr(math, _name))
builder.register_call_handler(iterators.reversed_at, _reversed_at)
builder.register_call_handler(iterators.reversed_dict_at, _reversed_dict_at)
builder.register_call_handler(builtins.sorted, _sorted)  # list.sort (containers.py) orders as sorted() does
