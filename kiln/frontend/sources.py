"""Where a value the trace read came from, as an expression a guard can re-evaluate.

Every variable tracker built from a real Python object carries a `Source`. A source
prints as a Python expression over the names a guard function and an entry function
have in scope: the frame's arguments by name, and `NamedSource`s the functions hold
directly: `__fn` (the compiled function, for closure cells) and `__globalsN` (the
globals dict of each function the trace read a global in).

    AttrSource(ItemSource(AttrSource(LocalSource("self"), "_modules"), "fc"), "weight")
        ->  self._modules['fc'].weight
"""
from __future__ import annotations

import keyword
from dataclasses import dataclass, field


class Source:
    """Base: `expr()` is the Python text; `parent` (on every subclass) is the source it reads from."""

    def expr(self) -> str:
        raise NotImplementedError

    def with_parent(self, text: str) -> str:
        """This source's expression with its parent already rendered as `text`."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.expr()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)  # str hashes differ between processes: a copy hashes itself anew
        return state

    def readable_name(self) -> str:
        """A short identifier for graph placeholders: `self.fc.weight` -> `self_fc_weight`."""
        text = self.expr()
        for noise in ("._modules", "._parameters", "._buffers", ".__closure__", ".cell_contents", "__globals"):
            text = text.replace(noise, "")
        name = "".join(ch if ch.isalnum() else "_" for ch in text)
        while "__" in name:
            name = name.replace("__", "_")
        name = name.strip("_") or "input"
        return name if not name[0].isdigit() else "v_" + name


def _source(cls):
    """A frozen dataclass whose hash is computed once. Guard building hashes and compares sources
    thousands of times (a deep module tree's chains are ten sources long), and a dataclass's own
    hash and equality recurse through every parent each time."""
    cls = dataclass(frozen=True, eq=True)(cls)
    fields_hash, fields_eq = cls.__hash__, cls.__eq__

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = fields_hash(self)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return hash(self) == hash(other) and fields_eq(self, other)

    cls.__hash__, cls.__eq__ = __hash__, __eq__
    return cls


@_source
class LocalSource(Source):
    """An argument of the compiled frame."""

    name: str
    parent = None

    def expr(self) -> str:
        return self.name


@_source
class NamedSource(Source):
    """An object the guard and entry functions hold directly under `name` (e.g. `__fn`, a globals dict)."""

    name: str
    parent = None

    def expr(self) -> str:
        return self.name


@_source
class AttrSource(Source):
    parent: Source
    name: str

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        if self.name.isidentifier() and not keyword.iskeyword(self.name) and not self.name.startswith("__"):
            return f"{text}.{self.name}"
        if self.name.startswith("__") and self.name.endswith("__"):
            return f"{text}.{self.name}"
        return f"getattr({text}, {self.name!r})"


@_source
class GenericAttrSource(AttrSource):
    """`object.__getattribute__(parent, name)`: an attribute of an object whose class has a `__getattribute__` of its
    own, as the trace read it (past that method: what the method itself reads with object.__getattribute__)."""

    def with_parent(self, text: str) -> str:
        return f"object.__getattribute__({text}, {self.name!r})"


@_source
class ItemSource(Source):
    """`parent[key]` for a key that prints as a literal (str, int, bool, None), or as the name or source of the
    object it stands for (containers.NamedKey, TensorKey)."""

    parent: Source
    key: object

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        return f"{text}[{self.key!r}]"


@_source
class DictItemSource(ItemSource):
    """`dict.__getitem__(parent, key)`: an entry of a dict subclass whose own `__getitem__` does something else
    (transformers' `ClassInstantier` makes a module): read as dict's method reads it, never running the override."""

    def with_parent(self, text: str) -> str:
        return f"dict.__getitem__({text}, {self.key!r})"


@_source
class TypeSource(Source):
    parent: Source

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        return f"type({text})"


@_source
class ClosureCellSource(Source):
    """The contents of closure cell `index` of the function at `parent`."""

    parent: Source
    index: int

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        return f"{text}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True, eq=True)
class TensorKey:
    """An outside tensor used as a dict key, by identity as Python hashes it (`state[p]`): it equals another
    TensorKey of the same tensor object, and prints as the tensor's source, so `ItemSource(d, key)` renders as
    `d[<the tensor's source>]`, a lookup of whatever tensor is there when the guard or entry runs.

    It holds the tensor's `id`, not the tensor: the trace keeps its inputs alive while it runs, and a guard
    or entry never sees the object, only the expression."""

    identity: int
    source: Source = field(compare=False)

    def __repr__(self) -> str:
        return self.source.expr()


@_source
class DictKeySource(Source):
    """Key number `index` of the dict at `parent` (a key the trace met by listing the dict, not by a
    source of its own): `list(d)[index]`."""

    parent: Source
    index: int

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        return f"list({text})[{self.index}]"


def is_literal_key(key: object) -> bool:
    """Whether `ItemSource` can print `key` as a literal."""
    return type(key) in (str, int, bool) or key is None


def chain(source: Source) -> list[Source]:
    """`source` and its parents, outermost first."""
    out = []
    while source is not None:
        out.append(source)
        source = source.parent
    return out[::-1]


@_source
class TensorPropertySource(Source):
    """A size (`kind="size"`), stride or storage offset of the tensor at `parent`: a graph input
    that binds one symbol of a symbolic shape."""

    parent: Source
    kind: str
    dim: int | None = None

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        return f"{text}.{self.kind}({'' if self.dim is None else self.dim})"


@_source
class ScalarTensorSource(Source):
    """The float at `parent` as the 0-d float64 tensor a graph takes it as (`__scalar_tensor` is
    `torch.scalar_tensor(value, dtype=torch.float64)`, bound in the entry's namespace)."""

    parent: Source

    def expr(self) -> str:
        return self.with_parent(self.parent.expr())

    def with_parent(self, text: str) -> str:
        return f"__scalar_tensor({text})"
