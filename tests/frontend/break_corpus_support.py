"""The graph-break corpus's vocabulary: how a program, its state and its side effects are declared.

A program is a plain function registered with `@program(category, args=...)`:
- `args`: a zero-argument callable making fresh arguments; `fresh_args` seeds torch's
  generator from the program's name first, so every run (eager, kiln, the Dynamo
  recorder) sees the same values, and a data-dependent branch goes the same way;
- `category`: one of CATEGORIES (the report counts programs by it);
- `name`: when one function is registered twice (a data-dependent branch taken one way,
  then the other, by two argument factories);
- `dynamo_recompiles`: why Dynamo traces this program again on its second call (a known
  Dynamo limitation, kept as data: its self-check asserts that it still does). kiln is held
  to the full checks all the same.

A program where Dynamo gives up on a whole frame of the corpus (a graph break inside a
`for` loop or inside a generator: Dynamo skips that frame and runs it eagerly) has a twin,
`@twin_of(program_fn)`: the same program written so that Dynamo compiles every frame (the
loop unrolled, the generator's body inlined). Dynamo's counts on the twin bound kiln's; the
test checks that the twin gives the program's results and side effects exactly.

State a program may touch, and the test compares after every call:
- LOG: programs append events to it (the order of side effects);
- OUTPUT: what `print` wrote (through STDOUT) and what `logger` emitted, each with the
  length of LOG at that moment, so print/log order against LOG's events is compared too;
- globals registered with `track_globals(module, *names)`: reset to their initial value
  before every call (lists, dicts, tensors and objects in place, so their identity stays)
  and described after it.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import sys
import types
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

CATEGORIES = (
    "unsupported_call",  # a C function or Python construct kiln cannot trace, mid tensor work
    "data_dependent",  # .item(), .tolist(), bool/int/float of a tensor, if/while on a tensor
    "loop",  # breaks inside for/while loops
    "nested_call",  # breaks inside inlined helpers (several depths), methods, closures
    "module",  # breaks inside nn.Module forwards (nested modules, ModuleList, Sequential)
    "live_locals",  # a break with locals of every kind alive across it
    "stack_values",  # a break in the middle of an expression, call, display or f-string
    "side_effects",  # list/dict/global/attribute mutation, print, logging around breaks
    "inplace",  # in-place tensor ops on inputs before and after breaks
    "generator",  # generators with breaks in their body, early break, next(), zip
    "grad_mode",  # no_grad / enable_grad / set_grad_enabled around breaks
    "aliasing",  # results that are the inputs themselves
)

LOG: list = []
OUTPUT: list = []


class _Channel:
    """sys.stdout while a program runs: each write is kept with its position among LOG's events."""

    def write(self, text: str) -> int:
        OUTPUT.append((len(LOG), "stdout", text))
        return len(text)

    def flush(self) -> None:
        pass


STDOUT = _Channel()


class _LogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        OUTPUT.append((len(LOG), "log", record.levelname, record.getMessage()))


logger = logging.getLogger("kiln.tests.break_corpus")
logger.setLevel(logging.INFO)
logger.propagate = False
logger.addHandler(_LogHandler())


@dataclass
class BreakProgram:
    name: str
    fn: Callable
    make_args: Callable[[], tuple]
    category: str
    twin: Callable | None = None
    dynamo_recompiles: str | None = None


PROGRAMS: list[BreakProgram] = []


def program(category: str, args: Callable[[], tuple] | None = None, *, name: str | None = None,
            dynamo_recompiles: str | None = None):
    """Register a corpus program (see the module docstring)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}")

    def register(fn):
        PROGRAMS.append(BreakProgram(name or fn.__name__, fn, args or tensors((4, 3), (4, 3)), category,
                                     dynamo_recompiles=dynamo_recompiles))
        return fn

    return register


def twin_of(fn: Callable):
    """Register the decorated function as the twin of every program made from `fn` (see the module docstring)."""
    def register(twin):
        programs = [program for program in PROGRAMS if program.fn is fn]
        assert programs, f"{getattr(fn, '__name__', fn)} is not a registered program"
        for program in programs:
            program.twin = twin
        return twin

    return register


def fingerprint(program: BreakProgram) -> str:
    """A checksum of the program's source (its class's, for a module) and its twin's: the recorded
    Dynamo counts belong to this text; a changed program must be recorded again."""
    parts = []
    for fn in (program.fn, program.twin):
        if fn is not None:
            parts.append(inspect.getsource(fn if inspect.isfunction(fn) else type(fn)))
    return f"{zlib.crc32(''.join(parts).encode()):08x}"


def fresh_args(program: BreakProgram) -> tuple:
    """The program's arguments, the same values on every call (torch's generator seeded by the name)."""
    with torch.random.fork_rng():
        torch.manual_seed(zlib.crc32(program.name.encode()))
        return program.make_args()


def seeded(seed: int, make: Callable[[], Any]) -> Any:
    """`make()` with torch's generator seeded (module construction at import), leaving the global one as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return make()


# ---------------------------------------------------------------- argument factories


def _shape(shape):
    return shape if isinstance(shape, tuple) else (shape,)


def tensors(*shapes, dtype=torch.float32) -> Callable[[], tuple]:
    """Fresh random tensors of these shapes (a shape may be an int for 1-d)."""
    return lambda: tuple(torch.randn(*_shape(shape), dtype=dtype) for shape in shapes)


def signed(*signs, shape=(4, 3)) -> Callable[[], tuple]:
    """One tensor per sign: every element has that sign (|randn| + 0.1), so sums and means do too."""
    return lambda: tuple(sign * (torch.randn(*_shape(shape)).abs() + 0.1) for sign in signs)


def scaled(*scales, shape=(4, 3)) -> Callable[[], tuple]:
    """One tensor per scale: randn times the scale (a norm or a mean lands in a chosen range)."""
    return lambda: tuple(scale * torch.randn(*_shape(shape)) for scale in scales)


def with_values(*values, shapes=((4, 3), (4, 3))) -> Callable[[], tuple]:
    """Tensors of `shapes` followed by fresh copies of the given plain Python values."""
    make = tensors(*shapes)
    return lambda: (*make(), *copy.deepcopy(values))


# ---------------------------------------------------------------- tracked globals

_TRACKED: list[tuple[dict, str, Any]] = []  # (module globals, name, initial value)


def track_globals(module_name: str, *names: str) -> None:
    """Globals of a corpus module that programs change: reset before every call, compared after."""
    namespace = sys.modules[module_name].__dict__
    for name in names:
        _TRACKED.append((namespace, name, _saved(namespace[name])))


def _saved(value):
    if isinstance(value, torch.nn.Module) or _is_plain_object(value):
        return {key: copy.deepcopy(item) for key, item in vars(value).items() if _compared_attribute(key)}
    return copy.deepcopy(value)


def reset_state() -> None:
    """LOG, OUTPUT and every tracked global back to their initial values, in place where they
    are containers, tensors or objects (nested ones too): a guard may read their identity, and
    programs keep them in locals."""
    LOG.clear()
    OUTPUT.clear()
    for namespace, name, initial in _TRACKED:
        current = namespace.get(name, _MISSING)
        if isinstance(current, torch.nn.Module) or _is_plain_object(current):
            for key in [key for key in vars(current) if _compared_attribute(key) and key not in initial]:
                delattr(current, key)
            for key, value in initial.items():
                setattr(current, key, _restored(getattr(current, key, _MISSING), value))
        else:
            namespace[name] = _restored(current, initial)


_MISSING = object()


def _restored(current, initial):
    """`current` made equal to `initial`: the same object where it is a list, dict or tensor of the
    same kind (its items restored the same way), else a fresh copy of `initial`."""
    if isinstance(current, list) and type(initial) is list:
        kept = [_restored(old, new) for old, new in zip(current, initial)]
        current[:] = kept + copy.deepcopy(initial[len(kept):])
        return current
    if isinstance(current, dict) and type(initial) is dict:
        kept = {key: _restored(current.get(key, _MISSING), value) for key, value in initial.items()}
        current.clear()
        current.update(kept)
        return current
    if isinstance(current, torch.Tensor) and isinstance(initial, torch.Tensor) \
            and (current.shape, current.dtype) == (initial.shape, initial.dtype):
        with torch.no_grad():
            current.copy_(initial)
        return current
    return copy.deepcopy(initial)


def tracked_globals() -> dict:
    """name -> the tracked global object as it is now (roots for the identity check)."""
    return {f"{namespace['__name__'].rsplit('.', 1)[-1]}.{name}": namespace.get(name, "<deleted>")
            for namespace, name, _ in _TRACKED}


# ---------------------------------------------------------------- describing values for comparison


@dataclass
class TensorValue:
    """A tensor's values at the time it was described, and whether it required grad."""
    values: torch.Tensor
    requires_grad: bool


@dataclass
class Described:
    """A value that is compared by its parts: an object's attributes, a module's plain state."""
    kind: str
    type_name: str
    fields: Any


def _is_plain_object(value) -> bool:
    return (hasattr(value, "__dict__") and not isinstance(value, (type, types.FunctionType, types.ModuleType,
                                                                 types.MethodType, torch.nn.Module))
            and type(value).__module__.startswith("tests."))


def _compared_attribute(key: str) -> bool:
    return not key.startswith("_")


def describe(value, depth: int = 0):
    """A snapshot of `value` that later mutation cannot change, for `assert_same`."""
    if depth > 8:
        return Described("deep", type(value).__name__, None)
    if isinstance(value, torch.Tensor):
        return TensorValue(value.detach().clone(), value.requires_grad)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(describe(item, depth + 1) for item in value)
    if isinstance(value, tuple):  # a namedtuple, a torch.Size
        return Described("tuple", type(value).__qualname__, [describe(item, depth + 1) for item in value])
    if isinstance(value, dict):
        return Described(type(value).__qualname__, "dict", [(key, describe(item, depth + 1))
                                                            for key, item in value.items()])
    if isinstance(value, (set, frozenset)):
        return Described(type(value).__qualname__, "set", sorted(map(repr, value)))
    if isinstance(value, torch.nn.Module):
        return Described("module", type(value).__qualname__, {key: describe(item, depth + 1)
                                                              for key, item in vars(value).items()
                                                              if _compared_attribute(key)})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return Described("dataclass", type(value).__qualname__,
                         {field.name: describe(getattr(value, field.name), depth + 1)
                          for field in dataclasses.fields(value)})
    if _is_plain_object(value):
        return Described("object", type(value).__qualname__, {key: describe(item, depth + 1)
                                                              for key, item in vars(value).items()})
    if isinstance(value, (types.FunctionType, types.MethodType, type, types.ModuleType)):
        return Described("named", type(value).__name__, getattr(value, "__qualname__", getattr(value, "__name__", "")))
    if isinstance(value, types.GeneratorType):
        return Described("generator", "generator", value.__qualname__)
    return value


_IDENTITY_TYPES = (torch.Tensor, list, dict, set)


def identity_links(roots: dict) -> list[tuple[str, str]]:
    """(path, earlier path) for every tensor, list, dict, set or user object reachable from `roots`
    that was already seen at an earlier path: `return x` is ("result", "args[0]")."""
    seen: dict[int, str] = {}
    links: list[tuple[str, str]] = []
    keep_alive = []

    def visit(value, path, depth):
        identity_matters = isinstance(value, _IDENTITY_TYPES) or _is_plain_object(value)
        if identity_matters:
            if id(value) in seen:
                links.append((path, seen[id(value)]))
                return
            seen[id(value)] = path
            keep_alive.append(value)
        if depth > 4 or isinstance(value, torch.Tensor):
            return
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{path}[{index}]", depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(item, f"{path}[{key!r}]", depth + 1)
        elif _is_plain_object(value):
            for key, item in vars(value).items():
                visit(item, f"{path}.{key}", depth + 1)

    for name, root in roots.items():
        visit(root, name, 0)
    return links


def assert_same(actual, expected, path: str = "value") -> None:
    """`describe`d values equal: tensors closely (same dtype and shape), everything else exactly."""
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} vs {type(expected).__name__}"
    if isinstance(expected, TensorValue):
        tensor, wanted = actual.values, expected.values
        assert tensor.shape == wanted.shape and tensor.dtype == wanted.dtype, \
            f"{path}: {tensor.dtype}{list(tensor.shape)} vs {wanted.dtype}{list(wanted.shape)}"
        assert actual.requires_grad == expected.requires_grad, \
            f"{path}: requires_grad {actual.requires_grad} vs {expected.requires_grad}"
        torch.testing.assert_close(tensor, wanted, rtol=1e-5, atol=1e-5, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} vs {len(expected)}"
        for index, (a, b) in enumerate(zip(actual, expected)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} vs {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, Described):
        assert (actual.kind, actual.type_name) == (expected.kind, expected.type_name), \
            f"{path}: {actual.kind} {actual.type_name} vs {expected.kind} {expected.type_name}"
        assert_same(actual.fields, expected.fields, f"{path}<{expected.type_name}>")
    elif isinstance(expected, float) and expected != expected:
        assert actual != actual, f"{path}: {actual!r} vs nan"
    else:
        assert actual == expected, f"{path}: {actual!r} vs {expected!r}"


def output_events() -> list:
    """OUTPUT with consecutive stdout writes at the same LOG position joined (print may write
    its pieces separately or at once)."""
    events: list = []
    for event in OUTPUT:
        if event[1] == "stdout" and events and events[-1][1] == "stdout" and events[-1][0] == event[0]:
            events[-1] = (event[0], "stdout", events[-1][2] + event[2])
        else:
            events.append(event)
    return events
