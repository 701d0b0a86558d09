"""Tuples, lists, dicts, slices and iterators whose items are trackers.

Containers built during the trace (`[a, b]`, `{**kwargs}`, `zip(...)`) hold
trackers and are mutated in place by list/dict methods. Containers read from the
outside world are wrapped item by item with `ItemSource`s (and a type and length
or keys guard); large outside dicts use `ExternalDictVariable`, which wraps only
the entries the trace reads and guards just those. Mutating an outside container
is recorded and replayed after the graph runs (`SideEffects`), on the object itself.

Iterators (variables/iterators.py) are lazy and live: `iterate` makes a container's own
(a list's reads the list at each step; a dict's or a set's raises where Python's does when
the container changes size during the loop).

`compare_equal` (Python `==` as a bool at trace time) lives here, beside the sequences
it compares item by item, since list.index, count and `in` need it.
"""
from __future__ import annotations

import collections
import collections.abc
import dataclasses
import operator
import types
from typing import Any

import torch

from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.sources import AttrSource, DictItemSource, DictKeySource, ItemSource, TensorKey, is_literal_key
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import (NONE, ConstantVariable, ObjectIdVariable, Variable, has_python_method,
                                          is_same, is_trusted_module, lookup_class_attribute, run_on_constants)
from kiln.frontend.variables.iterators import (MAX_ITERATION_STEPS, BaseIteratorVariable,  # noqa: F401 (re-exported)
                                               DictIteratorVariable, IteratorVariable, LazyIteratorVariable,
                                               UserIteratorVariable, advanced, changed_during_iteration,
                                               changed_size_message, iterator_at)
from kiln.frontend.variables.tensor import SymNumberVariable, TensorVariable


def missing_key(key: Variable, container: Variable) -> ProgramException:
    """The KeyError Python raises for `container[key]`."""
    return ProgramException(f"key {key.describe()} missing from {container.describe()}", KeyError, [key])


@dataclasses.dataclass(frozen=True)
class NamedKey:
    """A dict key the guard and entry functions hold by name (a class, a function): `d[__key3]` in a source."""

    name: str

    def __repr__(self) -> str:
        return self.name


def _is_identity_key(key: Any) -> bool:
    """A key that hashes and compares by identity (a class, a function, `typing.Union`) or is an enum member:
    no user __eq__ or __hash__ runs in the guard."""
    import enum

    kind = type(key)
    if isinstance(key, type):
        return kind.__eq__ is type.__eq__ and kind.__hash__ is type.__hash__
    return isinstance(key, (types.FunctionType, types.BuiltinFunctionType, enum.Enum)) or \
        (kind.__eq__ is object.__eq__ and kind.__hash__ is object.__hash__)


def hashable_key(tx, key: Variable) -> Any:
    """The Python object a tracker stands for as a dict key; an outside tensor is a `TensorKey` (by identity); a
    symbolic number is specialized (its value guarded), since a dict hashes the number, not the tracker."""
    if isinstance(key, TensorVariable):
        return tensor_key(tx, key)
    if isinstance(key, SymNumberVariable):
        return key.as_constant()
    if isinstance(key, TupleVariable):
        return tuple(hashable_key(tx, item) for item in key.items)
    identity = key.identity()
    try:
        hash(identity)
    except TypeError:
        raise Unsupported(f"unhashable dict key {key.describe()}") from None
    return identity


def tensor_key(tx, key: TensorVariable) -> TensorKey:
    """A tensor as a dict key: Python hashes a tensor by identity, so the key is the real tensor object, which only
    an outside tensor has (a parameter, an argument, an attribute: the graph's own inputs). A tensor the graph
    computes exists only when the graph runs (and a tensor the trace changed in place is a new tracker)."""
    real = tx.output.outside_tensor(key) if key.source is not None else None
    if real is None:
        raise Unsupported(f"{key.describe()}, a tensor the trace computed, used as a dict key (only outside tensors, "
                          "which the compiled function receives or reads, can be keys: the computed one does not "
                          "exist until the graph runs)")
    python_key = TensorKey(id(real), key.source)
    tx.output.guards.tensor_key(python_key)
    return python_key


def real_key(tx, key: Any) -> Any:
    """The object a Python key stands for in a real dict: the tensor for a `TensorKey`."""
    if isinstance(key, TensorKey):
        return tx.output.tensor_by_id(key.identity)
    return key


class BaseListVariable(Variable):
    """Shared behaviour of tuples and lists."""

    def __init__(self, items: list[Variable], source=None):
        self.items = list(items)
        self.source = source

    def unpack(self, tx) -> list[Variable]:
        return list(self.items)

    def length(self, tx) -> int:
        return len(self.items)

    def truth(self, tx) -> bool:
        return bool(self.items)

    def is_constant(self) -> bool:
        return all(item.is_constant() for item in self.items)

    def getitem(self, tx, key: Variable) -> Variable:
        index = key.as_constant()
        if isinstance(index, slice):
            return self.rebuild(self.items[index])
        try:
            return self.items[index]
        except IndexError:
            kind = self.python_type()
            message = "list" if kind is list else "tuple" if issubclass(kind, tuple) else None
            raise ProgramException(f"index {index} out of range for {self.describe()}", IndexError,
                                   None if message is None else [ConstantVariable(f"{message} index out of range")]) \
                from None
        except TypeError:
            raise Unsupported(f"indexing {self.describe()} with {key.describe()}") from None

    def rebuild(self, items: list[Variable]) -> Variable:
        raise NotImplementedError

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "index" and 1 <= len(args) <= 3 and not kwargs:
            bounds = slice(*[arg.as_constant() for arg in args[1:3]], None) if len(args) > 1 else slice(None)
            for position in range(len(self.items))[bounds]:
                if compare_equal(tx, self.items[position], args[0]):
                    return ConstantVariable(position)
            raise ProgramException(f"{self.describe()}.index(): value not present", ValueError)
        if name == "count" and len(args) == 1:
            return ConstantVariable(sum(1 for item in self.items if compare_equal(tx, item, args[0])))
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__contains__":
            return ConstantVariable(any(compare_equal(tx, item, args[0]) for item in self.items))
        if name == "__iter__":
            return self.live_iterator(tx)
        return super().call_method(tx, name, args, kwargs)

    def live_iterator(self, tx) -> BaseIteratorVariable:
        """`iter(self)`: over a list, one that reads the list at each step."""
        return IteratorVariable(self.items, self if self.python_type() in (list, tuple) else None,
                                fixed_items=self.python_type() in _FIXED_ITEMS, live=isinstance(self, ListVariable))


class TupleVariable(BaseListVariable):
    """A tuple (or namedtuple / torch.Size / torch.return_types) of trackers."""

    def __init__(self, items, source=None, tuple_type: type = tuple):
        super().__init__(items, source)
        self.tuple_type = tuple_type

    def describe(self) -> str:
        return f"{self.tuple_type.__name__} of {len(self.items)}"

    def python_type(self) -> type:
        return self.tuple_type

    def as_constant(self) -> Any:
        values = [item.as_constant() for item in self.items]
        if self.tuple_type is tuple:
            return tuple(values)
        if hasattr(self.tuple_type, "_fields"):
            return self.tuple_type(*values)
        return self.tuple_type(values)

    def rebuild(self, items) -> Variable:
        # Slicing gives a plain tuple for namedtuples and structseqs, but torch.Size slices are Sizes.
        return TupleVariable(items, tuple_type=torch.Size if issubclass(self.tuple_type, torch.Size) else tuple)

    def getattr(self, tx, name: str) -> Variable:
        fields = _field_names(self.tuple_type)
        if name in fields:
            return self.items[fields.index(name)]
        raw, owner = lookup_class_attribute(self.tuple_type, name)
        if owner is not None and owner not in (tuple, object) and hasattr(self.tuple_type, "_fields"):
            return self._class_attribute(tx, raw, name)
        return super().getattr(tx, name)

    def _class_attribute(self, tx, raw: Any, name: str) -> Variable:
        """An attribute a namedtuple class defines (`_replace`, `_fields`, a NamedTuple's own methods), read from
        the class (guarded there, unless the class is a library's); methods are inlined."""
        cls = self.tuple_type
        source = None if is_trusted_module(cls.__module__) else AttrSource(tx.output.named_source("__class", cls), name)
        if isinstance(raw, types.FunctionType):
            return _BoundTupleMethod(tx.wrap(raw, source, guard=source is not None), self)
        if isinstance(raw, classmethod):
            function = tx.wrap(raw.__func__, AttrSource(source, "__func__") if source else None, guard=bool(source))
            return _BoundTupleMethod(function, tx.wrap(cls, None, guard=False))
        if isinstance(raw, staticmethod):
            return tx.wrap(raw.__func__, source, guard=source is not None)
        if isinstance(raw, property) and raw.fget is not None:
            getter = tx.wrap(raw.fget, AttrSource(source, "fget") if source else None, guard=bool(source))
            return getter.call(tx, [self], {})
        if hasattr(type(raw), "__get__"):
            raise Unsupported(f"attribute {name!r} of {self.describe()}: a {type(raw).__name__} on its class")
        return tx.wrap(raw, source, guard=source is not None)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # the outside tuple itself
            return codegen.source(self.source)
        inner = ", ".join(codegen.value(item) for item in self.items)
        if self.tuple_type is tuple:
            return f"({inner}{',' if len(self.items) == 1 else ''})"
        if hasattr(self.tuple_type, "_fields"):
            return f"{codegen.constant(self.tuple_type)}({inner})"
        return f"{codegen.constant(self.tuple_type)}(({inner}{',' if len(self.items) == 1 else ''}))"


class _BoundTupleMethod(Variable):
    """A namedtuple class's method bound to a tuple (or to the class, for a classmethod): inlined when called."""

    def __init__(self, function: Variable, receiver: Variable):
        self.function = function
        self.receiver = receiver

    def describe(self) -> str:
        return f"bound {self.function.describe()}"

    def truth(self, tx) -> bool:
        return True

    def call(self, tx, args, kwargs) -> Variable:
        return self.function.call(tx, [self.receiver, *args], kwargs)


def _field_names(tuple_type: type) -> list[str]:
    """Field names of a namedtuple or a torch.return_types structseq, in order."""
    if hasattr(tuple_type, "_fields"):
        return list(tuple_type._fields)
    count = getattr(tuple_type, "n_sequence_fields", None)
    if count is None:
        return []
    probe = tuple_type(tuple(range(count)))
    names = [name for name in dir(tuple_type) if not name.startswith(("_", "n_")) and name not in ("count", "index")]
    return sorted((name for name in names if isinstance(getattr(probe, name, None), int)),
                  key=lambda name: getattr(probe, name))


class ListVariable(BaseListVariable):
    """A list of trackers; mutating methods change it in place."""

    def describe(self) -> str:
        return f"list of {len(self.items)}"

    def python_type(self) -> type:
        return list

    def as_constant(self) -> Any:
        return [item.as_constant() for item in self.items]

    def rebuild(self, items) -> Variable:
        return ListVariable(items)

    def _mutated(self, tx) -> None:
        if self.source is not None:
            tx.output.side_effects.mutated_container(self)

    def setitem(self, tx, key: Variable, value: Variable) -> None:
        index = key.as_constant()
        if isinstance(index, slice):
            self.items[index] = value.unpack(tx)
        else:
            self.items[index] = value
        self._mutated(tx)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "append":
            self.items.append(args[0])
        elif name == "extend":
            self.items.extend(args[0].unpack(tx))
        elif name == "insert":
            self.items.insert(args[0].as_constant(), args[1])
        elif name == "pop":
            value = self.items.pop(*(arg.as_constant() for arg in args))
            self._mutated(tx)
            return value
        elif name == "reverse":
            self.items.reverse()
        elif name == "clear":
            self.items.clear()
        elif name == "copy":
            return ListVariable(self.items)
        elif name == "remove":
            position = self.call_method(tx, "index", args, {}).as_constant()
            del self.items[position]
        elif name == "sort":
            if args:
                raise Unsupported("list.sort() with positional arguments (the program raises TypeError)")
            # as sorted() orders them (builtins' handler: keys traced, tensors only where ties never reach them)
            self.items[:] = builder.call_handler(sorted)(tx, [ListVariable(self.items)], kwargs).items
        elif name == "__setitem__":
            self.setitem(tx, args[0], args[1])
        else:
            return super().call_method(tx, name, args, kwargs)
        self._mutated(tx)
        return NONE

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # the outside list itself (its mutations are replayed in place)
            return codegen.source(self.source)
        return self.display(codegen)

    def display(self, codegen) -> str:
        """A list display of the current items."""
        return "[" + ", ".join(codegen.value(item) for item in self.items) + "]"


class DictVariable(Variable):
    """A dict of trackers, keyed by the Python objects the keys stand for (insertion ordered)."""

    def __init__(self, entries: dict[Any, tuple[Variable, Variable]] | None = None, source=None,
                 dict_type: type = dict, default_factory: Variable | None = None):
        self.entries = dict(entries or {})
        self.source = source
        self.dict_type = dict_type
        self.default_factory = default_factory  # a defaultdict's (None: a missing key raises KeyError)

    @property
    def items(self) -> dict:
        return {key: value for key, (_, value) in self.entries.items()}

    @classmethod
    def from_pairs(cls, tx, pairs: list[tuple[Variable, Variable]], dict_type: type = dict) -> "DictVariable":
        out = cls(dict_type=dict_type)
        for key, value in pairs:
            out.entries[hashable_key(tx, key)] = (key, value)
        return out

    def describe(self) -> str:
        return f"{self.dict_type.__name__} with keys {list(self.entries)[:6]}"

    def python_type(self) -> type:
        return self.dict_type

    def is_constant(self) -> bool:  # a tensor key (a TensorKey here) is no constant: only the entry has the tensor
        return all(value.is_constant() and not isinstance(key, TensorKey) for key, (_, value) in self.entries.items())

    def as_constant(self) -> Any:
        if any(isinstance(key, TensorKey) for key in self.entries):
            raise Unsupported(f"the value of {self.describe()}, keyed by tensors, as a Python constant")
        return self.dict_type((key, value.as_constant()) for key, (_, value) in self.entries.items())

    def truth(self, tx) -> bool:
        return bool(self.entries)

    def length(self, tx) -> int:
        return len(self.entries)

    def unpack(self, tx) -> list[Variable]:
        return [key for key, _ in self.entries.values()]

    def getitem(self, tx, key: Variable) -> Variable:
        python_key = hashable_key(tx, key)
        if python_key not in self.entries:
            return self.missing(tx, key)
        return self.entries[python_key][1]

    def missing(self, tx, key: Variable) -> Variable:
        """`d[key]` for a key `d` lacks: a defaultdict stores and returns a new default (`__missing__`), any other
        dict raises KeyError."""
        if self.default_factory is None and hasattr(self.dict_type, "__missing__") and \
                self.dict_type is not collections.defaultdict:
            raise Unsupported(f"a missing key of {self.describe()}, whose __missing__ kiln does not model")
        if self.default_factory is None or self.default_factory.is_constant() and \
                self.default_factory.as_constant() is None:
            raise missing_key(key, self)
        value = self.default_factory.call(tx, [], {})
        self.setitem(tx, key, value)
        return value

    def setitem(self, tx, key: Variable, value: Variable) -> None:
        self.entries[hashable_key(tx, key)] = (key, value)
        self._mutated(tx)

    def _mutated(self, tx) -> None:
        if self.source is not None:
            tx.output.side_effects.mutated_container(self)

    def contains(self, tx, key: Variable) -> bool:
        return hashable_key(tx, key) in self.entries

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name in ("get", "__getitem__", "pop", "setdefault") and args:
            python_key = hashable_key(tx, args[0])
            present = python_key in self.entries
            if name == "__getitem__":
                return self.getitem(tx, args[0])
            if name == "get":
                return self.entries[python_key][1] if present else (args[1] if len(args) > 1 else NONE)
            if name == "pop":
                if present:
                    value = self.entries.pop(python_key)[1]
                    self._mutated(tx)
                    return value
                if len(args) > 1:
                    return args[1]
                raise missing_key(args[0], self)
            if not present:
                self.entries[python_key] = (args[0], args[1] if len(args) > 1 else NONE)
                self._mutated(tx)
            return self.entries[python_key][1]
        if name in _VIEW_KINDS:
            return DictViewVariable(tx, self, _VIEW_KINDS[name])
        if name == "__contains__":
            return ConstantVariable(self.contains(tx, args[0]))
        if name == "update":
            if args:
                self.update_from(tx, args[0])
            for key, value in kwargs.items():
                self.entries[key] = (ConstantVariable(key), value)
            self._mutated(tx)
            return NONE
        if name == "copy":
            return DictVariable(self.entries, dict_type=self.dict_type, default_factory=self.default_factory)
        if name == "clear":
            self.entries.clear()
            self._mutated(tx)
            return NONE
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return NONE
        if name == "__len__":
            return ConstantVariable(len(self.entries))
        if name == "__iter__":
            return self.live_iterator(tx)
        if name == "__delitem__":
            self.getitem(tx, args[0])  # a missing key raises, as `del` would
            return self.call_method(tx, "pop", args, {})
        if name == "popitem" and not args and set(kwargs) <= ({"last"} if self.dict_type is not dict else set()):
            last = kwargs.get("last", ConstantVariable(True)).as_constant()  # OrderedDict.popitem(last=False)
            if not self.entries:
                message = "dictionary is empty" if issubclass(self.dict_type, collections.OrderedDict) else \
                    "popitem(): dictionary is empty"
                raise ProgramException(f"popitem() on empty {self.describe()}", KeyError, [ConstantVariable(message)])
            key = next(reversed(self.entries)) if last else next(iter(self.entries))
            key_variable, value = self.entries.pop(key)
            self._mutated(tx)
            return TupleVariable([key_variable, value])
        return super().call_method(tx, name, args, kwargs)

    def live_iterator(self, tx, kind: str = "dict_keys") -> BaseIteratorVariable:
        """`iter(d)` (or of its `kind` of view): steps the entries as they are at each step."""
        return DictIteratorVariable(self, kind, TupleVariable, self.entries)

    def view_items(self, tx, kind: str) -> list[Variable]:
        """What its keys(), values() or items() view holds now."""
        if kind == "dict_keys":
            return [key for key, _ in self.entries.values()]
        if kind == "dict_values":
            return [value for _, value in self.entries.values()]
        return [TupleVariable([key, value]) for key, value in self.entries.values()]

    def update_from(self, tx, other: Variable) -> None:
        if isinstance(other, DictVariable):
            self.entries.update(other.entries)
        elif isinstance(other, ExternalDictVariable):
            for key in other.keys(tx):
                self.entries[key] = (other.key_variable(key), other.item(tx, key))
        else:
            for pair in other.unpack(tx):
                key, value = pair.unpack(tx)
                self.entries[hashable_key(tx, key)] = (key, value)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # the outside dict itself (its mutations are replayed in place)
            return codegen.source(self.source)
        return self.display(codegen)

    def display(self, codegen) -> str:
        """A dict (of `dict_type`) holding the current entries."""
        inner = ", ".join(f"{codegen.value(key)}: {codegen.value(value)}" for key, value in self.entries.values())
        if self.dict_type is dict:
            return "{" + inner + "}"
        if self.dict_type is collections.defaultdict:
            factory = codegen.value(self.default_factory) if self.default_factory is not None else "None"
            return f"{codegen.constant(self.dict_type)}({factory}, {{{inner}}})"
        return f"{codegen.constant(self.dict_type)}({{{inner}}})"


class CounterVariable(DictVariable):
    """A `collections.Counter` made in the trace: a dict whose missing keys count 0 (`counts[k]`, `del`).

    Its keys and counts are constants, so Counter's own methods (counting `update`, `subtract`,
    `most_common`, `total`, `elements`, the `+ - | &` operators, ...) run for real on a copy made
    now, and a method that changes the counter leaves its new counts here. A counter holding
    anything else (a tensor as a count) supports only what a dict does.
    """

    def __init__(self, entries=None, source=None):
        super().__init__(entries, source, dict_type=collections.Counter)

    @classmethod
    def of(cls, counter: collections.Counter) -> "CounterVariable":
        return cls({key: (ConstantVariable(key), ConstantVariable(count)) for key, count in counter.items()})

    def getitem(self, tx, key: Variable) -> Variable:
        python_key = hashable_key(tx, key)
        if python_key not in self.entries:
            return ConstantVariable(0)  # Counter.__missing__ (the key is not added)
        return self.entries[python_key][1]

    def as_constant(self) -> Any:
        counts = self._counts()
        if counts is None:
            raise Unsupported(f"the value of {self.describe()}, whose keys or counts are not all constants")
        return counts

    def is_constant(self) -> bool:
        return self._counts() is not None

    def _counts(self) -> collections.Counter | None:
        """The counter as a Python object, when every key and count is a constant."""
        if all(isinstance(key, ConstantVariable) and isinstance(value, ConstantVariable)
               for key, value in self.entries.values()):
            return collections.Counter({key: value.value for key, (_, value) in self.entries.items()})
        return None

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name not in _COUNTER_METHODS:
            return super().call_method(tx, name, args, kwargs)
        counts = self._counts()
        if counts is None:
            if name in _DICT_METHODS_OF_COUNTER:
                return super().call_method(tx, name, args, kwargs)
            raise Unsupported(f"Counter.{name} on {self.describe()}, whose keys or counts are not all constants")
        values = [counter_operand(tx, arg) for arg in args]
        keywords = {key: counter_operand(tx, arg) for key, arg in kwargs.items()}
        result = run_on_constants(getattr(counts, name), values, keywords)
        if name in _COUNTER_MUTATORS:
            self.entries = CounterVariable.of(counts).entries
            self._mutated(tx)
        if isinstance(result, collections.Counter):
            return CounterVariable.of(result)
        if name == "elements":
            return IteratorVariable([ConstantVariable(item) for item in result])
        return tx.wrap_sourceless(result)


def counter_arithmetic(tx, symbol: str, inplace: bool, left: Variable, right: Variable) -> Variable:
    """`left <symbol> right` (`+=` when `inplace`) with a Counter on one side: Counter's own operators on
    constants (`|` is the larger count, not dict's merge); `c += d` changes `c` and is `c`."""
    import operator

    operators = {"+": (operator.add, operator.iadd), "-": (operator.sub, operator.isub),
                 "|": (operator.or_, operator.ior), "&": (operator.and_, operator.iand)}
    if symbol not in operators:
        raise Unsupported(f"operator {symbol!r} between {left.describe()} and {right.describe()}")
    operands = [counter_operand(tx, side) for side in (left, right)]
    result = run_on_constants(operators[symbol][inplace], operands, {})
    if inplace and result is operands[0] and isinstance(left, CounterVariable):
        left.entries = CounterVariable.of(result).entries
        left._mutated(tx)
        return left
    if isinstance(result, collections.Counter):
        return CounterVariable.of(result)
    return tx.wrap_sourceless(result)


def counter_operand(tx, variable: Variable) -> Any:
    """A Counter method's argument as a Python value: a constant, a dict or counter of constants, or the items of
    an iterable (each a constant)."""
    if isinstance(variable, CounterVariable):
        counts = variable._counts()
        if counts is None:
            raise Unsupported(f"a Counter operation on {variable.describe()}, whose counts are not all constants")
        return counts
    if variable.is_constant() and not isinstance(variable, BaseIteratorVariable):
        return variable.as_constant()
    if issubclass(variable.python_type(), collections.abc.Mapping):  # Counter adds a mapping's values
        raise Unsupported(f"counting {variable.describe()}, a mapping whose values are not all constants")
    items = unpack_iterable(tx, variable)
    if not all(isinstance(item, ConstantVariable) for item in items):
        raise Unsupported(f"counting {variable.describe()}, whose items are not all constants")
    return [item.value for item in items]


_COUNTER_MUTATORS = frozenset({"update", "subtract", "__delitem__", "clear", "pop", "popitem", "setdefault"})
_COUNTER_METHODS = _COUNTER_MUTATORS | frozenset({"most_common", "total", "elements", "copy"})
_DICT_METHODS_OF_COUNTER = frozenset({"__delitem__", "clear", "pop", "popitem", "setdefault", "copy"})


_DICT_MUTATORS = frozenset({"__setitem__", "__delitem__", "pop", "popitem", "setdefault", "update", "clear"})
_DICT_CLASSES = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)


def _overridden_mutator(value: dict) -> str | None:
    """A mutator a dict subclass defines itself (`__setitem__` that stores `v * 2`), if any: it runs code that the
    trace's copy of the dict would not, and the entry's replay (`clear()` then `update()`) could call it."""
    for name in sorted(_DICT_MUTATORS | {"__ior__"}):
        for cls in type(value).__mro__:
            if name in vars(cls):
                if cls not in _DICT_CLASSES:
                    return name
                break
    return None


class ExternalDictVariable(Variable):
    """A dict from outside the trace, read lazily: only the entries read are wrapped and guarded.

    The first mutation turns it into a `DictVariable` of every entry (all of them read and
    guarded, since the replay rewrites the whole dict): later reads and writes go to that,
    and the real dict is updated in place after the graph runs.
    """

    def __init__(self, value: dict, source):
        self.value = value
        self.source = source
        self.materialized: DictVariable | None = None
        self.tensor_keys: dict[TensorKey, Variable] = {}  # the trackers of its tensor keys the trace listed
        self.iterators: list[DictIteratorVariable] = []  # over it before its copy: they continue over the copy
        # Why it may no longer be read (objects.check_instance_dict_in_step): an object's `__dict__` whose
        # attributes the trace then set, which this tracker does not show; any use of it breaks the graph.
        self.stale: str | None = None

    def _check_fresh(self) -> None:
        if self.stale is not None:
            raise Unsupported(self.stale)

    def describe(self) -> str:
        return f"dict at {self.source}"

    def python_type(self) -> type:
        return type(self.value)

    def identity(self) -> Any:
        return self.value

    def _materialize(self, tx) -> DictVariable:
        self._check_fresh()
        if self.materialized is None:
            import os

            if isinstance(self.value, os._Environ):
                raise Unsupported("mutating os.environ inside a compiled function")
            if isinstance(self.source, AttrSource) and self.source.name in ("_modules", "_parameters", "_buffers"):
                # the trace reads a module's children from the real tables (modules.ModuleVariable._children): a
                # change here would go unseen by len() and iteration later in the trace
                raise Unsupported(f"changing a module's {self.source.name} ({self.describe()}) inside a compiled "
                                  "function; a graph break makes the change in Python")
            if _is_module_namespace(self.value):
                raise Unsupported(f"assigning into a module's globals dict ({self.describe()}); assign the global "
                                  "itself (`global NAME` or `module.NAME = ...`), which kiln tracks")
            overridden = _overridden_mutator(self.value)
            if overridden is not None:
                raise Unsupported(f"changing {self.describe()}, a {type(self.value).__qualname__}, whose class defines "
                                  f"its own {overridden} (kiln models dict's; a graph break runs the change in Python)")
            entries = {key: (self.key_variable(key), self.item(tx, key)) for key in self.keys(tx)}
            self.materialized = DictVariable(entries, self.source, type(self.value), self._default_factory(tx))
            for iterator in self.iterators:
                iterator.attach(self.materialized.entries)
        return self.materialized

    def _default_factory(self, tx) -> Variable | None:
        """A defaultdict's factory (read and guarded), None for a dict without one; a dict whose missing keys
        run other code (`__missing__` of a Counter or a user subclass) is not modelled."""
        if type(self.value) is collections.defaultdict:
            source = AttrSource(self.source, "default_factory")
            tx.output.guards.identity(source, self.value.default_factory)  # a builtin (`dict`) is wrapped unguarded
            return tx.wrap(self.value.default_factory, source)
        return None

    def key_variable(self, key: Any) -> Variable:
        """The tracker for one of its keys (a key of `keys`)."""
        if isinstance(key, TensorKey):
            return self.tensor_keys[key]
        return ConstantVariable(key)

    def keys(self, tx) -> list:
        self._check_fresh()
        if self.materialized is not None:
            return list(self.materialized.entries)
        if tx.output.side_effects.stores_globals_into(self.value):
            raise Unsupported(f"listing {self.describe()}, a module's globals, after the trace assigned one of them")
        keys = tuple(self._python_key(tx, key, index) for index, key in enumerate(self.value))
        tx.output.guards.keys(self.source, keys)
        return list(keys)

    def _python_key(self, tx, key: Any, index: int) -> Any:
        """A listed key as the trace holds it: a tensor becomes a `TensorKey` with the source the trace knows it
        by (a parameter met before), else `list(d)[index]`, a new graph input."""
        if not isinstance(key, torch.Tensor):
            return key
        variable = tx.output.tensors_by_id.get(id(key))
        if variable is None:
            variable = tx.wrap(key, DictKeySource(self.source, index))
        python_key = tensor_key(tx, variable)
        self.tensor_keys.setdefault(python_key, variable)
        return python_key

    def item(self, tx, key) -> Variable:
        self._check_fresh()
        if self.materialized is not None:
            return self.materialized.entries[key][1]
        stored = tx.output.side_effects.stored_global(self.value, key)  # a module's globals dict, read after a store
        if stored is not None:
            if not isinstance(stored, Variable):
                raise missing_key(ConstantVariable(key), self)
            return stored
        # A dict subclass's own __getitem__ may run code (transformers' ClassInstantier makes a module): the
        # trace and its guards read the mapping itself, as dict's method does.
        raw = isinstance(self.value, dict) and type(self.value).__getitem__ is not dict.__getitem__
        read, item_source = (dict.__getitem__, DictItemSource) if raw else (operator.getitem, ItemSource)
        if isinstance(key, TensorKey):
            return tx.wrap(read(self.value, real_key(tx, key)), item_source(self.source, key))
        if not is_literal_key(key):
            if not _is_identity_key(key):
                raise Unsupported(f"reading key {key!r} of an outside dict (only str/int keys, classes, functions and "
                                  "enum members are guarded)")
            named = NamedKey(tx.output.named_source("__key", key).name)
            return tx.wrap(read(self.value, key), item_source(self.source, named))
        return tx.wrap(read(self.value, key), item_source(self.source, key))

    def contains(self, tx, key: Variable) -> bool:
        self._check_fresh()
        if self.materialized is not None:
            return self.materialized.contains(tx, key)
        python_key = hashable_key(tx, key)
        stored = tx.output.side_effects.stored_global(self.value, python_key)
        if stored is not None:
            return isinstance(stored, Variable)
        present = real_key(tx, python_key) in self.value
        tx.output.guards.contains(self.source, python_key, present)
        return present

    def truth(self, tx) -> bool:
        self._check_fresh()
        return bool(self.keys(tx))

    def live_iterator(self, tx, kind: str = "dict_keys") -> BaseIteratorVariable:
        """`iter(d)` (or of its `kind` of view): over its keys as listed now (guarded), values read as given."""
        self._check_fresh()
        if self.materialized is not None:
            return self.materialized.live_iterator(tx, kind)
        pending = [(self.key_variable(key), lambda key=key: self.item(tx, key)) for key in self.keys(tx)]
        iterator = DictIteratorVariable(self, kind, TupleVariable, None, pending)
        self.iterators.append(iterator)
        return iterator

    def view_items(self, tx, kind: str) -> list[Variable]:
        """What its keys(), values() or items() view holds now (read, and guarded, as the dict's own reads)."""
        self._check_fresh()
        if self.materialized is not None:
            return self.materialized.view_items(tx, kind)
        keys = self.keys(tx)
        if kind == "dict_keys":
            return [self.key_variable(key) for key in keys]
        if kind == "dict_values":
            return [self.item(tx, key) for key in keys]
        return [TupleVariable([self.key_variable(key), self.item(tx, key)]) for key in keys]

    def length(self, tx) -> int:
        self._check_fresh()
        return len(self.keys(tx))

    def unpack(self, tx) -> list[Variable]:
        self._check_fresh()
        if self.materialized is not None:
            return self.materialized.unpack(tx)
        return [self.key_variable(key) for key in self.keys(tx)]

    def getitem(self, tx, key: Variable) -> Variable:
        self._check_fresh()
        python_key = hashable_key(tx, key)
        if not self.contains(tx, key):
            if hasattr(type(self.value), "__missing__"):  # a defaultdict stores a new default: a mutation
                return self._materialize(tx).missing(tx, key)
            raise missing_key(key, self)
        return self.item(tx, python_key)

    def setitem(self, tx, key: Variable, value: Variable) -> None:
        self._check_fresh()
        self._materialize(tx).setitem(tx, key, value)

    def update_in_place(self, tx, other: Variable) -> None:
        """`d |= other`."""
        self._check_fresh()
        self._materialize(tx).call_method(tx, "update", [other], {})

    def call_method(self, tx, name, args, kwargs) -> Variable:
        self._check_fresh()
        if name in _DICT_MUTATORS or self.materialized is not None:
            materialized = self._materialize(tx)
            if name == "__delitem__":
                materialized.getitem(tx, args[0])  # a missing key raises, as `del` would
                return materialized.call_method(tx, "pop", args, {})
            return materialized.call_method(tx, name, args, kwargs)
        if name == "__getitem__" and args:
            return self.getitem(tx, args[0])
        if name == "get" and args:
            if self.contains(tx, args[0]):
                return self.item(tx, hashable_key(tx, args[0]))
            return args[1] if len(args) > 1 else NONE
        if name == "__contains__":
            return ConstantVariable(self.contains(tx, args[0]))
        if name in _VIEW_KINDS:
            return DictViewVariable(tx, self, _VIEW_KINDS[name])
        if name == "__iter__":
            return self.live_iterator(tx)
        if name == "copy":
            return DictVariable({key: (self.key_variable(key), self.item(tx, key)) for key in self.keys(tx)},
                                dict_type=collections.defaultdict if isinstance(self.value, collections.defaultdict)
                                else dict, default_factory=self._default_factory(tx))
        if name == "__len__":
            return ConstantVariable(self.length(tx))
        raise Unsupported(f"dict.{name} on {self.describe()}")


class ListIteratorLike(BaseListVariable):
    """dict views and other iterables that only need to be iterated, measured or listed."""

    def __init__(self, items, kind: str):
        super().__init__(items)
        self.kind = kind

    def describe(self) -> str:
        return self.kind

    def python_type(self) -> type:
        return {"dict_keys": type({}.keys()), "dict_values": type({}.values()),
                "dict_items": type({}.items())}.get(self.kind, list)


_VIEW_KINDS = {"keys": "dict_keys", "values": "dict_values", "items": "dict_items"}


class DictViewVariable(ListIteratorLike):
    """`d.keys()`, `d.values()`, `d.items()`: a live view, as Python's. What it holds is read from its dict at each
    use (after `d[k] = v`, the view has k: a snapshot taken at the call gave the old entries, a wrong answer), and
    it rebuilds as that view of the rebuilt dict."""

    def __init__(self, tx, owner: Variable, kind: str, of_object: Variable | None = None):  # noqa: D107
        self.owner = owner  # the dict tracker whose entries it shows (no BaseListVariable state: items is read)
        self.kind = kind
        self.source = None
        self._tx = tx
        self.of_object = of_object  # the object whose mapping `owner` is (a ModelOutput), or None

    @property
    def items(self) -> list[Variable]:
        return self.owner.view_items(self._tx, self.kind)

    def live_iterator(self, tx) -> BaseIteratorVariable:
        return self.owner.live_iterator(tx, self.kind)

    def rebuild_parts(self) -> tuple[Any, list[Variable]] | None:
        """At a graph break: the same view of the dict the resume function takes (`view_of`), a view again
        there (a real view object passed in could not be traced)."""
        return None if self.of_object is not None else (view_of, [self.owner, ConstantVariable(self.kind)])

    def reconstruct(self, codegen) -> str:
        method = {kind: name for name, kind in _VIEW_KINDS.items()}[self.kind]
        if self.of_object is not None:  # OrderedDict's own view of the object (a ModelOutput) itself
            return f"{codegen.constant(getattr(collections.OrderedDict, method))}({codegen.value(self.of_object)})"
        return f"{codegen.value(self.owner)}.{method}()"


def view_of(mapping, kind: str):
    """`mapping.keys()` / `.values()` / `.items()` for a view `kind` ("dict_keys"...): a resume function's
    prologue remakes a dict view passed on at a graph break (traced: `_view_of`)."""
    return getattr(mapping, {view: name for name, view in _VIEW_KINDS.items()}[kind])()


def _view_of(tx, args, kwargs) -> Variable:
    mapping, kind = args
    return mapping.call_method(tx, {view: name for name, view in _VIEW_KINDS.items()}[kind.as_constant()], [], {})


def _is_module_namespace(value: dict) -> bool:
    """Whether `value` is some module's `__dict__` (the globals of the functions defined in it), or the globals of
    code exec'd into a plain dict (exec puts `__builtins__` in it): the trace's global reads and stores go to
    `SideEffects.globals`, which a change of the dict as a container would not reach."""
    import sys

    if "__builtins__" in value:
        return True
    module = sys.modules.get(value.get("__name__")) if isinstance(value.get("__name__"), str) else None
    return module is not None and getattr(module, "__dict__", None) is value



def iterate(tx, variable: Variable) -> BaseIteratorVariable:
    """`iter(variable)`: an iterator is itself; a user class's own `__iter__` is called (a generator
    method, usually); anything else iterates over its items."""
    if isinstance(variable, BaseIteratorVariable):
        return variable
    if _iterates_in_python(variable):
        iterator = variable.call_method(tx, "__iter__", [], {})
        if isinstance(iterator, BaseIteratorVariable):
            return iterator
        if has_python_method(iterator, "__next__"):
            return UserIteratorVariable(iterator)
        raise Unsupported(f"__iter__ of {variable.describe()} returned {iterator.describe()}, not an iterator "
                          "kiln can step")
    live_iterator = getattr(variable, "live_iterator", None)
    if live_iterator is not None:  # a list, dict, dict view or set: sees the changes the loop makes
        return live_iterator(tx)
    return IteratorVariable(variable.unpack(tx), variable if isinstance(variable, BaseListVariable) and
                            variable.python_type() in (list, tuple) else None,
                            fixed_items=variable.python_type() in _FIXED_ITEMS)


# Iterables whose iterator's items cannot change once it is made: one passed on at a graph break is rebuilt from
# the items it has left
_FIXED_ITEMS = frozenset({range, tuple, str, bytes, frozenset, torch.Size, torch.Tensor})


def unpack_iterable(tx, variable: Variable, count: int | None = None) -> list[Variable]:
    """The items of `variable`; from an iterator only `count` of them (unpacking takes one more than its
    targets, to check that it is exhausted)."""
    if isinstance(variable, BaseIteratorVariable) or _iterates_in_python(variable):
        return iterate(tx, variable).take(tx, count)
    return variable.unpack(tx)


def _iterates_in_python(variable: Variable) -> bool:
    """An object whose class defines `__iter__` in Python (inlined); a builtin base's slot is not."""
    if not has_python_method(variable, "__iter__"):
        return False
    return isinstance(lookup_class_attribute(variable.user_class(), "__iter__")[0], types.FunctionType)


class SliceVariable(Variable):
    """slice(start, stop, step) whose parts may be trackers."""

    def __init__(self, start: Variable, stop: Variable, step: Variable):
        self.parts = [start, stop, step]

    def describe(self) -> str:
        return "slice"

    def python_type(self) -> type:
        return slice

    def is_constant(self) -> bool:
        return all(part.is_constant() for part in self.parts)

    def as_constant(self) -> Any:
        return slice(*(part.as_constant() for part in self.parts))

    def identity(self) -> Any:
        return self.as_constant() if self.is_constant() else self

    def reconstruct(self, codegen) -> str:
        return f"slice({', '.join(codegen.value(part) for part in self.parts)})"


def compare_equal(tx, left: Variable, right: Variable) -> bool:
    """Python `==` as a bool, for trackers whose equality is known at trace time."""
    if isinstance(left, TensorVariable) or isinstance(right, TensorVariable):
        if left is right:
            return True
        other = right if isinstance(left, TensorVariable) else left
        if isinstance(other, ConstantVariable) and other.value is None:
            return False
        raise Unsupported("== between tensors used as a Python bool (data-dependent)")
    if isinstance(left, ConstantVariable) and isinstance(right, ConstantVariable):
        return bool(left.value == right.value)
    if isinstance(left, ObjectIdVariable):
        return left.equals(right, tx)
    if isinstance(right, ObjectIdVariable):
        return right.equals(left, tx)
    if isinstance(left, DictViewVariable) or isinstance(right, DictViewVariable):
        return _views_equal(tx, left, right)
    if _compares_as_dict(left) and _compares_as_dict(right):
        return _dicts_equal(tx, left, right)
    if isinstance(left, BaseListVariable) and isinstance(right, BaseListVariable):
        if issubclass(left.python_type(), list) != issubclass(right.python_type(), list):
            return False
        return len(left.items) == len(right.items) and all(
            compare_equal(tx, a, b) for a, b in zip(left.items, right.items))
    if left.is_constant() and right.is_constant():
        try:
            return bool(left.as_constant() == right.as_constant())
        except Unsupported:
            pass
    if has_python_method(left, "__eq__"):
        return left.call_method(tx, "__eq__", [right], {}).truth(tx)
    return is_same(left, right, tx)


def _compares_as_dict(variable: Variable) -> bool:
    """A dict tracker whose `==` is dict's (or OrderedDict's): not a Counter's, nor a subclass's own `__eq__`."""
    if not isinstance(variable, (DictVariable, ExternalDictVariable)):
        return False
    kind = variable.python_type()
    return issubclass(kind, dict) and not issubclass(kind, collections.Counter) and \
        not has_python_method(variable, "__eq__")


def _dicts_equal(tx, left: Variable, right: Variable) -> bool:
    """`==` of two dicts, as Python's: the same keys, each with an equal value, in any order (two OrderedDicts: in
    the same order too). Not the identity of the two trackers, which made `{"a": 1, "b": 2} == {"b": 2, "a": 1}`
    of two arguments, or a dict and its defaultdict copy, False."""
    left_entries = {hashable_key(tx, key): key for key in left.unpack(tx)}
    right_entries = {hashable_key(tx, key): key for key in right.unpack(tx)}
    if left_entries.keys() != right_entries.keys():
        return False
    if issubclass(left.python_type(), collections.OrderedDict) and \
            issubclass(right.python_type(), collections.OrderedDict) and list(left_entries) != list(right_entries):
        return False
    return all(compare_equal(tx, left.getitem(tx, key), right.getitem(tx, right_entries[python_key]))
               for python_key, key in left_entries.items())


def _views_equal(tx, left: Variable, right: Variable) -> bool:
    """`==` with a dict view, as Python's: a values view equals only itself; a keys or items view compares as a set
    (in any order) with a set, a frozenset or another keys or items view, and is unequal to anything else. Not
    the view's items as a list in the dict's order, which gave False for `d.keys() == {"a", "b"}`."""
    if isinstance(left, DictViewVariable) and left.kind == "dict_values" or \
            isinstance(right, DictViewVariable) and right.kind == "dict_values":
        return left is right
    set_like = (set, frozenset, type({}.keys()), type({}.items()))
    try:
        kinds = (left.python_type(), right.python_type())
    except Unsupported:
        return False
    if not all(issubclass(kind, set_like) for kind in kinds):
        return False
    left_items, right_items = left.unpack(tx), right.unpack(tx)
    if not all(item.is_constant() for item in (*left_items, *right_items)):
        raise Unsupported("== between a dict view and a set whose items are not constants")
    return {item.as_constant() for item in left_items} == {item.as_constant() for item in right_items}


def _iterator_at(tx, args, kwargs) -> BaseIteratorVariable:
    """`iterators.iterator_at(container, kind, left)` in a resume function's prologue: the container's live
    iterator, advanced so that as many items are left as `left` gives."""
    container, kind, left, *size_and_keys = args
    kind = kind.as_constant()
    size, keys = [*(arg.as_constant() for arg in size_and_keys), None, None][:2]
    message = None  # the original would raise at its next step
    if size is not None and container.length(tx) != size:
        message = changed_size_message(container.python_type())
    elif keys is not None and tuple(hashable_key(tx, key) for key in container.unpack(tx)) != keys:
        message = "OrderedDict mutated during iteration"
    if message is not None:
        return tx.wrap_sourceless(changed_during_iteration).call(tx, [ConstantVariable(message)], {})
    if kind in _VIEW_KINDS.values():
        container = container.call_method(tx, {view: name for name, view in _VIEW_KINDS.items()}[kind], [], {})
    iterator = iterate(tx, container)
    for _ in range(container.length(tx) - len(unpack_iterable(tx, left))):
        iterator.next_item(tx)
    return iterator


builder.register_call_handler(iterator_at, _iterator_at)
builder.register_call_handler(view_of, _view_of)
