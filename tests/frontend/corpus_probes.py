"""Corpus, part 5: Python features a model's code may use, each written as a probe program and compared with eager
on 2026-12-05 (checked by tests/frontend/test_corpus.py: one graph, no Python on a cached call, guards neither too
loose nor too tight). Those marked "was:" ran their whole frame eagerly or broke before that day's fixes.

Nothing in this file may run during a compiled call: the checker watches for frames from this file.
"""
from __future__ import annotations

import abc
import collections
import collections.abc
import contextlib
import dataclasses
import enum
import functools
import itertools
import math
import typing

import torch

from tests.frontend.corpus_support import program


class _Color(enum.Enum):
    RED = 1
    GREEN = 2


class _Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@program()
def enum_members(x, y):  # was: iterating the class ran the frame eagerly; returning a str Enum member too
    names = [member.name for member in _Color]
    chosen = _Color["GREEN"]
    return x * chosen.value + y * len(_Color), names, _Color(1) is _Color.RED, list(_Mode), _Mode("eval") == "eval"


@program()
def partial_and_reduce(x, y):  # was: reading .func/.args/.keywords of a partial ran the frame eagerly
    scaled = functools.partial(torch.add, alpha=2)
    total = functools.reduce(lambda a, b: a + b, [x, y, x])
    product = functools.reduce(lambda a, b: a * b, [1, 2, 3], 10)
    return scaled(x, total) * product, scaled.keywords, scaled.func is torch.add, len(scaled.args)


def _traced(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **kwargs) + 1

    return inner


@_traced
def _double(t):
    """Doubles."""
    return t * 2


@program()
def wraps_metadata(x, y):
    return _double(x) + _double.__wrapped__(y), _double.__name__, _double.__doc__


@dataclasses.dataclass
class _Config:
    width: int = 4
    tags: list = dataclasses.field(default_factory=list)
    scale: float = 1.0


@program()
def dataclass_replace_asdict(x, y):
    config = _Config(width=3)
    bigger = dataclasses.replace(config, scale=2.5)
    config.tags.append("first")
    return x * bigger.scale + y * config.width, dataclasses.asdict(bigger), bigger.tags, dataclasses.astuple(config)


class _Pair(typing.NamedTuple):
    count: int
    value: torch.Tensor


@program()
def namedtuple_replace_asdict(x, y):
    pair = _Pair(1, x)
    changed = pair._replace(count=5)
    return changed.count * changed.value + y, pair._asdict()["count"], _Pair._fields, _Pair._make([2, y]).count


@contextlib.contextmanager
def _scaled(factor):
    yield factor * 2


@program()
def contextmanager_and_nullcontext(x, y):
    with _scaled(3) as factor:
        x = x * factor
    with contextlib.nullcontext(y) as same:
        y = same + 1
    with contextlib.nullcontext(enter_result=3) as three:  # was: the keyword was dropped (None)
        y = y * three
    with torch.set_grad_enabled(mode=True):
        y = y + 1
    return x + y


def _accumulate():
    total = 0
    while True:
        value = yield total
        if value is None:
            return total
        total += value


def _inner():
    yield 1
    yield 2
    return 10


def _outer():
    result = yield from _inner()
    yield result


@program()
def generator_send_and_return_values(x, y):  # was: StopIteration.value ran the frame eagerly
    generator = _accumulate()
    next(generator)
    generator.send(2)
    generator.send(3)
    try:
        generator.send(None)
    except StopIteration as stop:
        total = stop.value
    return x * total + y * sum(_outer()), list(_outer())


def _finally_wins():
    try:
        return 1
    finally:
        return 2  # noqa: B012 (the point of the probe)


@program()
def finally_return_and_chaining(x, y):
    try:
        try:
            raise ValueError("inner")
        except ValueError as error:
            raise KeyError("outer") from error
    except KeyError as error:
        cause = type(error.__cause__).__name__, str(error.__cause__), error.__suppress_context__
    return x * _finally_wins() + y, cause


def _collect(a, b, c=0, *rest, d=1, **named):
    return a + b + c + sum(rest) + d + sum(named.values())


@program()
def walrus_and_star_unpacking(x, y):
    if (rows := x.shape[0]) > 2:
        x = x * rows
    evens = [v for i in range(4) if (v := i * 2) > 2]
    first, *middle, last = [1, 2, 3, 4]
    return x + y * _collect(*[1, 2], 5, *[6], **{"d": 3, "e": 4}), evens, middle, last


@program()
def nonlocal_counter_closure(x, y):
    count = 0

    def make():
        def bump():
            nonlocal count
            count += 1
            return count

        return bump

    bump = make()
    bump()
    bump()
    return x * count + y * bump()


class _Temperature:
    def __init__(self):
        self._value = 1

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, new):
        self._value = new * 2


@program()
def property_setter(x, y):
    reading = _Temperature()
    reading.value = 3
    return x * reading.value + y


class _Helpers(torch.nn.Module):
    factor = 2

    @staticmethod
    def shift(t):
        return t + 1

    @classmethod
    def scale(cls):
        return cls.factor

    def forward(self, t):
        return self.shift(t) * self.scale()


_HELPERS = _Helpers()


@program()
def module_static_and_class_methods(x, y):
    return _HELPERS(x) + _Helpers.shift(y)


class _Base:
    def tag(self):
        return "base"


class _Left(_Base):
    def tag(self):
        return "left>" + super().tag()


class _Right(_Base):
    def tag(self):
        return "right>" + super().tag()


class _Both(_Left, _Right):
    def tag(self):
        return "both>" + super().tag()


@program()
def super_in_multiple_inheritance(x, y):
    return x * len(_Both().tag()) + y, _Both().tag()


class _Shape(abc.ABC):
    @abc.abstractmethod
    def area(self): ...


class _Square(_Shape):
    def area(self):
        return 4


@program()
def isinstance_tuples_and_abcs(x, y):
    checks = (isinstance(x, (int, torch.Tensor)), isinstance([1], collections.abc.Sequence),
              isinstance({}, collections.abc.Mapping), isinstance(_Square(), _Shape), issubclass(bool, int))
    return x * _Square().area() + y, checks


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, t):
        missing = getattr(self, "missing", None)
        has = hasattr(self, "linear"), hasattr(self, "nope"), getattr(self.linear, "bias", None) is not None
        return self.linear(t.float()).to(t.dtype), missing, has


_COUNTER = _Counter()


@program()
def getattr_default_and_hasattr_on_modules(x, y):
    return _COUNTER(x)[0] + y, _COUNTER(y)[1:]


@program()
def formatting_shapes(x, y):  # was: `%` with a tuple holding a torch.Size broke
    return x + y, f"{x.shape}", "{} {}".format(x.shape[0], tuple(y.shape)), f"{x.shape[0]:04d}", \
        "%d-%s" % (x.dim(), x.shape), str(x.size())


@program()
def math_on_sizes(x, y):  # was: math.isclose broke
    rows = x.shape[0]
    return x * math.sqrt(rows) + y, math.ceil(rows / 3), math.prod(x.shape), math.gcd(rows, 6), \
        math.isclose(rows, 4.0), math.log2(rows)


@program()
def size_arithmetic_and_unpacking(x, y):
    rows, cols = x.shape
    *lead, last = y.shape
    extended = x.shape + (5,)
    return x.reshape(*x.shape[:-1], -1).t() @ y.view(rows, cols), extended, lead, last, x.shape[1:] == (3,), \
        list(reversed(x.shape))


@program()
def ranges_and_enumerate(x, y):
    out = []
    for index, row in enumerate([x, y], start=5):
        out.append(row * index)
    return out, list(range(10, 0, -3)), list(range(5)[::-1]), range(10)[-2], list(range(10)[2:8:2]), \
        list(reversed([1, 2, 3])), list(enumerate("ab", 1))


@program()
def zip_strict_mismatch_caught(x, y):  # was: the ValueError ran the frame eagerly
    try:
        list(zip([x, y], [1], strict=True))
    except ValueError as error:
        return x + y, str(error)
    return x - y, ""


@program()
def any_all_min_max_with_key(x, y):
    scores = {"a": 3, "b": 1, "c": 2}
    flags = [True, False, True]
    return x * max(3, 7, 5, key=lambda v: -v) + y, any(f for f in flags), all(f for f in flags), \
        min(scores, key=scores.get), max(scores.items(), key=lambda kv: kv[1]), min([], default=-1)


@program()
def dict_comprehension_of_tensors(x, y):
    parts = {f"k{i}": x * i + y for i in range(3)}
    shifted = {key: value + 1 for key, value in parts.items() if key != "k0"}
    return parts, shifted


@program()
def list_sort_with_key_in_place(x, y):  # was: list.sort with a key broke
    rows = [(3, x), (1, y), (2, x + y)]
    rows.sort(key=lambda row: row[0])
    names = ["bb", "a", "ccc"]
    names.sort(key=len, reverse=True)
    return [row for _, row in rows], names


@program()
def identity_comparisons(x, y):
    items = [x]
    alias = items
    return x + y, alias is items, items is [x], x is x, None is None


class _Named:
    def __init__(self, name, width):
        self.name, self.width = name, width

    def __repr__(self):
        return f"_Named({self.name!r})"

    def __format__(self, spec):
        return f"{self.name}:{self.width:{spec}}" if spec else self.name


@program()
def user_object_text(x, y):  # was: a graph break for each str()/repr()/f-string of an object
    layer = _Named("proj", 3)
    return x * layer.width + y, str(layer), repr(layer), f"{layer}", f"{layer:>4}", f"{layer!r}", format(layer, "02d")


class _Suppressing:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, kind, value, traceback):
        self.log.append(("exit", kind.__name__ if kind else None))
        return True


@program()
def exit_stack_callbacks_and_managers(x, y):  # was: its deque (and sys.exc_info, MethodType) ran the frame eagerly
    log = []
    with contextlib.ExitStack() as stack:
        factor = stack.enter_context(_scaled(2))
        stack.callback(log.append, "callback")
        stack.enter_context(_Suppressing(log))
        x = x * factor
        raise ValueError("suppressed by the last manager entered")
    with contextlib.ExitStack() as stack:
        stack.callback(log.append, "kept")
        later = stack.pop_all()
    log.append("between")
    later.close()
    return x + y, log


@program()
def deque_methods(x, y):
    window = collections.deque([x, y], maxlen=3)
    window.append(x + y)
    window.append(x * y)  # drops x
    window.appendleft(y)  # drops x * y
    window.rotate(1)
    first = window.popleft()
    try:
        for row in window:
            window.append(row)
    except RuntimeError as error:
        message = str(error)
    return first + sum(window), len(window), window.maxlen, message


class _Node:
    def __init__(self, weight):
        self.weight = weight


@program()
def id_memo_of_new_objects(x, y):  # was: id() of an object made in the trace broke
    first, second = _Node(2), _Node(3)
    memo = {}
    for node in (first, second, first):
        memo[id(node)] = memo.get(id(node), 0) + node.weight
    return x * memo[id(first)] + y * len(memo), id(first) == id(second), id(first) in memo, sorted(memo.values())


@program()
def itertools_keywords_and_chains(x, y):  # was: product(repeat=2) ignored repeat (a silent wrong answer)
    grid = list(itertools.product([0, 1], repeat=2))
    flat = list(itertools.chain.from_iterable([[x], [y, x + y]]))
    return sum(flat) * len(grid), grid, [5, 3, 1, 3].index(3, 2)


def _keywords(**named):
    return sorted(named)


@program()
def unbound_locals_and_argument_errors(x, y):  # was: each ran the frame eagerly
    try:
        raise KeyError("k")
    except KeyError as error:
        kind = type(error).__name__
    try:
        error  # noqa: B018 (deleted at the end of its except clause)
        deleted = False
    except NameError:
        deleted = True
    try:
        _keywords(a=1, **{"a": 2})
        duplicate = False
    except TypeError:
        duplicate = True
    try:
        _keywords(1)
        positional = False
    except TypeError:
        positional = True
    return x + y, kind, deleted, duplicate, positional


@program()
def dict_popitem(x, y):  # was: a graph break
    plain = {"a": x, "b": y}
    key, value = plain.popitem()
    ordered = collections.OrderedDict(a=1, b=2, c=3)
    first = ordered.popitem(last=False)
    return value * 2 + x, key, plain, first, list(ordered)


@program()
def lazy_itertools_and_groupby(x, y):  # was: a graph break each, and the resume function ran eagerly
    rows = [("a", x), ("a", y), ("b", x + y), ("a", x * y)]
    grouped = [(name, sum(row for _, row in group)) for name, group in itertools.groupby(rows, key=lambda r: r[0])]
    groups = [group for _, group in itertools.groupby("aabbbc")]
    stale = [list(group) for group in groups]  # advancing groupby empties the groups before
    numbers = iter([1, 2, 3, 4])
    small = list(itertools.takewhile(lambda v: v < 2, numbers))  # consumes the 2 as well
    return grouped, stale, small, list(numbers), list(itertools.starmap(pow, [(2, 3)])), \
        list(itertools.dropwhile(lambda v: v < 3, [1, 5, 1])), list(itertools.compress("abc", [1, 0, 1])), \
        list(itertools.filterfalse(None, [0, 1, 0, 2]))


@program()
def min_max_ties_take_the_first(x, y):  # was: max with a key returned the last of equal keys (a wrong answer)
    rows = [(1, "b"), (0, "a"), (1, "a"), (0, "b")]
    by_size = max([x, y, x + y], key=lambda t: t.shape[0])  # tensors compared by their keys only
    return by_size * 2, max(rows, key=lambda row: row[0]), min(rows, key=lambda row: row[0]), \
        max(["ab", "cd", "e"], key=len), min([], key=len, default="none")
