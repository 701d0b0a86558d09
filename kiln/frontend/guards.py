"""Guards: what must still hold for a cache entry to be reused, as ONE Python function.

While the interpreter traces, every read of the outside world adds a check to the
`GuardBuilder`: tensor metadata (type, dtype, device, shape, stride, requires_grad),
the type, identity or value of globals, closure cells and attributes, container
lengths and keys, and global state (grad mode, default dtype, autocast). `build()` turns them into
straight-line Python source:

    def guard(self, x):
        try:
            __s0 = self._modules['fc']
            if __s0 is not __c1: return "self._modules['fc'] is a different object"
            if type(x) is not __c2: return "x: type changed (was Tensor)"
            if x.dtype is not __c3: return "x: dtype changed (was torch.float32)"
            ...
        except Exception as error:
            return "guard raised " + repr(error)
        return None

It returns None when every check holds, else the first failing reason, so a
recompile can say why. Sources shared by several checks are evaluated once into a
local (`SourceRenderer`), which keeps the per-call cost low for deep module trees.
"""
from __future__ import annotations

import ast
import builtins
import enum
import inspect
import keyword
import math
import re
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from kiln import _torch
from kiln.frontend.sources import (AttrSource, DictKeySource, ItemSource, LocalSource, NamedSource, Source, TensorKey,
                                   chain)

_LITERAL_TYPES = (int, float, str, bool, type(None), bytes)


@dataclass(frozen=True)
class Check:
    """One guard line: `failure` (with `{}` for the rendered source, `{key}` for the rendered `key`, a tensor dict
    key's source) true means the guard fails."""

    source: Source | None
    failure: str
    reason: str
    key: Source | None = None


class GuardBuilder:
    """Collects checks in the order the trace made them (parents before children)."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self._seen: set[tuple] = set()
        self.constants: dict[str, Any] = {}
        self._constant_names: dict[int, str] = {}
        self._tensors: dict[Source, torch.Tensor] = {}  # tensor guards, checked together when torch can
        self._tensor_lines: set[tuple] = set()  # (source, failure) of their per-tensor Python lines
        self._storages: list[_TracedStorage] = []  # every tensor input, for the storage aliasing check
        # symbolic shapes: (source, name in the ShapeEnv, fake tensor or SymInt/SymFloat) of each symbolic input,
        # and the fakes of tensors with symbolic sizes, whose static sizes the tensor check compares
        self._symbolic_inputs: list[tuple[Source, str, Any]] = []
        self._symbolic_tensors: dict[Source, torch.Tensor] = {}
        self._tensor_keys: dict[int, Source] = {}  # id of each tensor used as a dict key -> its first source

    def constant(self, value: Any, by_identity: bool = False) -> str:
        """A name under which the guard function holds `value` (equal hashable values share one, unless the
        check is `is`: two equal tuples are different objects)."""
        try:
            key = (type(value), value) if isinstance(value, (torch.device, torch.dtype, tuple, str, int)) and \
                not by_identity else id(value)
            hash(key)
        except TypeError:
            key = id(value)
        if key not in self._constant_names:
            name = f"__c{len(self._constant_names)}"
            self._constant_names[key] = name
            self.constants[name] = value
        return self._constant_names[key]

    def add(self, source: Source | None, failure: str, reason: str, key: Source | None = None) -> None:
        seen = (source, failure, key)
        if seen in self._seen:
            return
        self._seen.add(seen)
        self.checks.append(Check(source, failure, reason, key))

    # -- kinds of guard -------------------------------------------------------------------------

    def type_is(self, source: Source, cls: type) -> None:
        self.add(source, f"type({{}}) is not {self.constant(cls)}", f"type is no longer {cls.__qualname__}")

    def identity(self, source: Source, value: Any) -> None:
        self.add(source, f"{{}} is not {self.constant(value, by_identity=True)}",
                 f"is a different object than {_short(value)}")

    def value(self, source: Source, value: Any) -> None:
        """Equality with a literal, with the exact type (so 1, 1.0 and True differ)."""
        if value is None or value is True or value is False or value is Ellipsis:
            self.add(source, f"{{}} is not {value!r}", f"is no longer {value!r}")
            return
        if isinstance(value, enum.Enum):
            self.identity(source, value)
            return
        if type(value) in _LITERAL_TYPES and value == value:  # NaN never equals itself
            self.type_is(source, type(value))
            self.add(source, f"{{}} != {value!r}", f"changed from {value!r}")
            if type(value) is float and value == 0.0:  # 0.0 == -0.0, but 1 / x or atan2 tell them apart
                sign = math.copysign(1.0, value)
                self.add(source, f"{self.constant(math.copysign)}(1.0, {{}}) != {sign!r}", f"changed from {value!r}")
            return
        if type(value) is float:  # NaN
            self.type_is(source, float)
            self.add(source, "{} == {}", "is no longer nan")
            return
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            self.identity(source, value)
            return
        self.type_is(source, type(value))
        # Compare with a copy made now: the live object (a set) may be changed in place later,
        # and a guard holding it would compare it with itself.
        snapshot = frozenset(value) if isinstance(value, (set, frozenset)) else value
        self.add(source, f"{{}} != {self.constant(snapshot)}", f"changed from {_short(value)}")

    def length(self, source: Source, size: int) -> None:
        self.add(source, f"len({{}}) != {size}", f"length changed from {size}")

    def keys(self, source: Source, keys: tuple) -> None:
        if not keys:  # the common `**kwargs` left empty: a truth test is the cheapest check
            self.add(source, "{}", "keys changed from ()")
            return
        if any(isinstance(key, TensorKey) for key in keys):
            self._keys_with_tensors(source, keys)
            return
        self.add(source, f"tuple({{}}) != {self.constant(keys)}", f"keys changed from {keys!r}")

    def _keys_with_tensors(self, source: Source, keys: tuple) -> None:
        """The keys of a dict keyed (partly) by tensors, in order: each tensor key is the very tensor now at its
        source (one the trace only met by listing this dict, `list(d)[i]`, just a tensor: its own guards check
        it), each other key equal to the traced one."""
        sourced = [isinstance(key, TensorKey) and not isinstance(key.source, DictKeySource) for key in keys]
        constants = tuple(_SOURCED_TENSOR_KEY if own else _ANY_TENSOR_KEY if isinstance(key, TensorKey) else key
                          for key, own in zip(keys, sourced))
        tensors = "(" + "".join(f"{key.source.expr()}, " for key, own in zip(keys, sourced) if own) + ")"
        self.constants["__dict_keys_differ"] = dict_keys_differ
        self.add(source, f"__dict_keys_differ({{}}, {self.constant(constants)}, {tensors})",
                 f"keys changed from {keys!r} (tensor keys by identity)")

    def contains(self, source: Source, key: Any, present: bool) -> None:
        test = "not in" if present else "in"
        reason = f"{'lost' if present else 'gained'} key {key!r}"
        if isinstance(key, TensorKey):  # whatever tensor is at the key's source now
            self.add(source, f"{{key}} {test} {{}}", reason, key.source)
            return
        self.add(source, f"{self.constant(key)} {test} {{}}", reason)

    def tensor_key(self, key: TensorKey) -> None:
        """A tensor the trace used as a dict key: the distinct tensors keys stood for stay distinct (a lookup
        through one source found, or missed, what a store through another one left)."""
        self._tensor_keys.setdefault(key.identity, key.source)

    def has_attr(self, source: Source, name: str, present: bool) -> None:
        test = "not hasattr" if present else "hasattr"
        self.add(source, f"{test}({{}}, {name!r})", f"{'lost' if present else 'gained'} attribute {name!r}")

    def empty(self, source: Source) -> None:
        self.add(source, "{}", "is no longer empty")

    def tensor(self, source: Source, tensor: torch.Tensor, fake: torch.Tensor | None = None) -> None:
        """Static metadata: everything the trace could have specialized on.

        Written as Python lines (type, then one line of metadata); `build` replaces all of
        them by one C++ check of every tensor at the end when torch provides one. A tensor
        whose `fake` has symbolic sizes gets its metadata check in `build`: its symbolic
        sizes and strides are left to the shape guards, the rest compared as traced.
        """
        if source not in self._tensors:
            self._tensors[source] = tensor
        before = len(self.checks)
        self.type_is(source, type(tensor))
        if fake is not None and _torch.is_symbolic(tuple(fake.shape) + tuple(fake.stride())):
            self._symbolic_tensors[source] = fake
            self._tensor_lines.update((check.source, check.failure) for check in self.checks[before:])
            return
        shape, stride = tuple(tensor.shape), tuple(tensor.stride())
        # `is_cpu` (a flag) costs half of building and comparing a torch.device; CPU has no index.
        device = "not {}.is_cpu" if tensor.device.type == "cpu" else f"{{}}.device != {self.constant(tensor.device)}"
        failure = (f"{{}}.dtype is not {self.constant(tensor.dtype)} or {{}}.shape != {shape!r} or "
                   f"{{}}.stride() != {stride!r} or {device} or "
                   f"{{}}.requires_grad is not {tensor.requires_grad}")
        self.add(source, failure, f"tensor metadata changed from {str(tensor.dtype).replace('torch.', '')}"
                                  f"{list(shape)} stride {stride} on {tensor.device}, "
                                  f"requires_grad={tensor.requires_grad}")
        self._tensor_lines.update((check.source, check.failure) for check in self.checks[before:])

    def tensor_storage(self, source: Source, tensor: torch.Tensor, fake: torch.Tensor, graph: torch.fx.Graph) -> None:
        """Remember a tensor input and its fake tensor, for `build`'s storage aliasing check.

        The trace sees which inputs share storage (the fake tensors of views of one buffer
        share one fake storage), and the graph it records is only right for that sharing
        once an input is mutated. `build` reads the fakes' version counters to find the
        mutated inputs (and, for an inference tensor, which has none, looks for in-place
        ops in `graph`).
        """
        self._storages.append(_TracedStorage(source, tensor, fake, _version(fake), graph))

    def symbolic_input(self, source: Source, name: str, value: Any) -> None:
        """A graph input with symbolic sizes (a fake tensor) or a symbolic int or float argument, named
        `name` in its ShapeEnv: `build` checks the relations the trace recorded about it."""
        self._symbolic_inputs.append((source, name, value))

    def fits_int64(self, source: Source) -> None:
        """An int argument that is a SymInt graph input (an int64) still fits one (2**70 gets its own entry)."""
        from kiln.frontend.dynamic import INT64_MAX, INT64_MIN

        self.add(source, f"not ({INT64_MIN} <= {{}} <= {INT64_MAX})", "no longer fits an int64 (a symbolic input)")

    def has_symbolic_inputs(self) -> bool:
        return bool(self._symbolic_inputs)

    def function(self, source: Source, fn: types.FunctionType) -> None:
        """A function the trace inlines: its code is still the one traced (identity of the
        function object does not say so: `__code__` is assignable)."""
        self.identity(AttrSource(source, "__code__"), fn.__code__)

    def function_defaults(self, source: Source, defaults: tuple) -> None:
        """How many positional defaults an inlined function has decides which parameters they fill."""
        defaults_source = AttrSource(source, "__defaults__")
        self.type_is(defaults_source, tuple)
        self.length(defaults_source, len(defaults))

    def no_hooks(self, source: Source, tables: tuple[str, ...]) -> None:
        """The module at `source` still has no hooks in any of `tables`."""
        failure = " or ".join(f"{{}}.{table}" for table in tables)
        self.add(source, failure, f"hooks were added ({', '.join(tables)})")

    def global_state(self) -> None:
        """Grad mode, the default dtype and autocast as they are now, at the start of the trace."""
        grad = torch.is_grad_enabled()
        self.add(None, f"{self.constant(torch.is_grad_enabled)}() is not {grad}",
                 f"grad mode changed from {'enabled' if grad else 'disabled'}")
        default_dtype = torch.get_default_dtype()  # `torch.ones(3)` in the trace is baked with it
        self.add(None, f"{self.constant(torch.get_default_dtype)}() is not {self.constant(default_dtype)}",
                 f"default dtype changed from {str(default_dtype).replace('torch.', '')}")
        for device_type in ("cpu", "cuda"):
            enabled = torch.is_autocast_enabled(device_type)
            self.add(None, f"{self.constant(torch.is_autocast_enabled)}({device_type!r}) is not {enabled}",
                     f"autocast({device_type}) changed from {enabled}")
            if enabled:  # the trace casts to this dtype: bfloat16 and float16 regions are different graphs
                dtype = torch.get_autocast_dtype(device_type)
                self.add(None, f"{self.constant(torch.get_autocast_dtype)}({device_type!r}) is not "
                               f"{self.constant(dtype)}",
                         f"autocast({device_type}) dtype changed from {str(dtype).replace('torch.', '')}")
        # torch functions the trace runs as constants (`if torch.are_deterministic_algorithms_enabled():`)
        for read in (torch.are_deterministic_algorithms_enabled, torch.is_deterministic_algorithms_warn_only_enabled,
                     torch.get_float32_matmul_precision):
            value = read()
            self.add(None, f"{self.constant(read)}() != {value!r}", f"{read.__name__}() changed from {value!r}")

    # -- code generation ------------------------------------------------------------------------

    def build(self, signature: "FrameSignature", extra_namespace: dict) -> tuple[Callable, str]:
        """The guard function and its source text."""
        implied = {(LocalSource(name), f"type({{}}) is not {self._constant_names.get(id(cls))}")
                   for name, cls in signature.implied_types()}
        tensor_sources = list(self._tensors)
        symbolic_sizes = self._checked_sizes_and_strides(tensor_sources) if self._symbolic_tensors else ()
        checker = _torch.tensor_metadata_checker(
            [self._tensors[source] for source in tensor_sources], [source.expr() for source in tensor_sources],
            *symbolic_sizes) if tensor_sources else None
        skipped = implied | (self._tensor_lines if checker is not None else set())
        rendered = [check.source for check in self.checks
                    if check.source is not None and (check.source, check.failure) not in skipped
                    for _ in range(check.failure.count("{}"))]
        rendered += [check.key for check in self.checks if check.key is not None] + list(self._tensor_keys.values())
        renderer = SourceRenderer(rendered + (tensor_sources if checker is not None else list(self._symbolic_tensors)))
        body: list[str] = []
        for check in self.checks:
            if (check.source, check.failure) in skipped:
                continue  # implied by the signature (`type(kwargs) is not dict`), or in the C++ check below
            if check.source is None:
                condition = check.failure
                label = "global state"
            else:
                text = renderer.render(check.source, body)
                condition = check.failure.replace("{}", text)
                if check.key is not None:
                    condition = condition.replace("{key}", renderer.render(check.key, body))
                label = check.source.expr()
            body.append(f"if {condition}: return {label + ': ' + check.reason!r}")
        namespace = dict(signature.namespace)
        if checker is not None:
            # Last, so every object on the way to a tensor has passed its own checks.
            values = ", ".join(renderer.render(source, body) for source in tensor_sources)
            body.append(f"if __tensors.check({values}) is not True: "
                        f"return 'tensor metadata changed: ' + str(__tensors.check_verbose({values}, "
                        f"tensor_check_names=__tensor_names))")
            namespace["__tensors"] = checker
            namespace["__tensor_names"] = [source.expr() for source in tensor_sources]
        else:
            body.extend(self._symbolic_tensor_lines(renderer, body))
        body.extend(self._shape_guard_lines(renderer, body, namespace))
        body.extend(self._distinct_tensor_keys_lines(renderer, body))
        body.extend(self._storage_aliasing_lines(renderer, body, namespace))
        lines = [f"def __guard({signature.text}):", "    try:"]
        lines += ["        " + line for line in body] or ["        pass"]
        lines += ["    except Exception as __error:",
                  "        return 'guard raised ' + repr(__error)",
                  "    return None"]
        source_text = "\n".join(lines)
        namespace.update(self.constants)
        namespace.update(extra_namespace)
        return compile_function(source_text, "__guard", namespace, "kiln_guard"), source_text


    def _checked_sizes_and_strides(self, sources: list[Source]) -> tuple[list, list]:
        """What the tensor check compares: each tensor's sizes and strides as traced, None where symbolic.
        Read now, after the trace and the backend's compile: a size they specialized is compared."""
        sizes, strides = [], []
        for source in sources:
            fake = self._symbolic_tensors.get(source)
            tensor = self._tensors[source] if fake is None else fake
            sizes.append(_torch.concrete_or_none(tensor.shape))
            strides.append(_torch.concrete_or_none(tensor.stride()))
        return sizes, strides

    def _symbolic_tensor_lines(self, renderer: "SourceRenderer", body: list[str]) -> list[str]:
        """Without the C++ tensor check: the metadata of tensors with symbolic sizes, in Python, dim by dim."""
        lines = []
        for source, fake in self._symbolic_tensors.items():
            text = renderer.render(source, body)
            sizes, strides = _torch.concrete_or_none(fake.shape), _torch.concrete_or_none(fake.stride())
            device = f"not {text}.is_cpu" if fake.device.type == "cpu" else \
                f"{text}.device != {self.constant(fake.device)}"
            tests = [f"{text}.dtype is not {self.constant(fake.dtype)}", f"{text}.dim() != {fake.dim()}"]
            tests += [f"{text}.size({dim}) != {size}" for dim, size in enumerate(sizes) if size is not None]
            tests += [f"{text}.stride({dim}) != {stride}" for dim, stride in enumerate(strides) if stride is not None]
            tests += [device, f"{text}.requires_grad is not {fake.requires_grad}"]
            reason = (f"{source.expr()}: tensor metadata changed from {str(fake.dtype).replace('torch.', '')}"
                      f"{list(fake.shape)} on {fake.device}, requires_grad={fake.requires_grad}")
            lines.append(f"if {' or '.join(tests)}: return {reason!r}")
        return lines

    def _shape_guard_lines(self, renderer: "SourceRenderer", body: list[str], namespace: dict) -> list[str]:
        """The relations the trace (and the backend's compile) recorded about symbolic inputs, from their
        ShapeEnv: `x.size(1) == y.size(1)` where they share a symbol, `x.size(0) > 4` where the trace
        branched on it, `2 <= x.size(1)` for each symbol's range. After the tensor check (every value is a
        tensor of the right rank by then); each size read once, into a local."""
        if not self._symbolic_inputs:
            return []
        by_name = {name: source for source, name, _ in self._symbolic_inputs}
        reads: dict[tuple, int] = {}

        def mark(name: str, kind: str | None, dim: int | None) -> str:
            return f"\x00{reads.setdefault((name, kind, dim), len(reads))}\x00"

        try:
            conditions = _torch.shape_guards([(value, name) for _, name, value in self._symbolic_inputs], mark)
        except Exception as error:  # never an entry without its guards: this one is never used
            reason = f"shape guards could not be made: {type(error).__name__}: {error}"
            return [f"return {reason!r}"]
        keys = {index: key for key, index in reads.items()}
        lines, local_names = [], {}
        for condition in conditions:
            code, text = condition.split("\x00"), condition.split("\x00")
            for position in range(1, len(code), 2):
                index = int(code[position])
                name, kind, dim = keys[index]
                source = by_name[name]
                suffix = "" if kind is None else f".{kind}({'' if dim is None else dim})"
                if index not in local_names:
                    read = renderer.render(source, lines) + suffix
                    if kind is None:
                        local_names[index] = read
                    else:
                        local_names[index] = f"__z{len(local_names)}"
                        lines.append(f"{local_names[index]} = {read}")
                code[position], text[position] = local_names[index], source.expr() + suffix
            label = text[1] if len(text) > 1 else "shape"
            reason = f"{label}: the entry assumes {''.join(text)} (a relation the trace relied on)"
            lines.append(f"if not ({''.join(code)}): return {reason!r}")
        namespace.update({key: value for key, value in _torch.shape_guard_namespace().items() if key not in namespace})
        return lines

    def _distinct_tensor_keys_lines(self, renderer: "SourceRenderer", body: list[str]) -> list[str]:
        """The tensors the trace used as dict keys are still distinct objects (after the tensor check)."""
        if len(self._tensor_keys) < 2:
            return []
        names = [source.expr() for source in self._tensor_keys.values()]
        values = [renderer.render(source, body) for source in self._tensor_keys.values()]
        reason = f"tensor dict keys: two of {', '.join(names[:4])}{', ...' if len(names) > 4 else ''} " \
                 "are now the same tensor"
        return [f"if len(set(map(id, ({', '.join(values)},)))) != {len(values)}: return {reason!r}"]

    def _storage_aliasing_lines(self, renderer: "SourceRenderer", body: list[str],
                                namespace: dict) -> list[str]:
        """Checks that every mutated input shares storage with exactly the inputs it shared it
        with in the trace (and only those): the graph's result depends on that sharing.

        Inputs that nothing mutates may alias each other freely, so a frame without input
        mutation gets no check at all. Otherwise every tensor input's storage identity is
        read in one call (`_torch.storage_ids`, after the metadata checks, so every value is
        a tensor), ordered so that the checks are slices: the mutated inputs' storages
        first (one per storage), then the inputs that shared those in the trace, then the rest.
        """
        mutated = [traced for traced in self._storages if traced.mutated()]
        if not mutated:
            return []
        groups: dict[int, list[_TracedStorage]] = {}
        for traced in self._storages:
            groups.setdefault(traced.storage_key(), []).append(traced)
        mutated_keys = list(dict.fromkeys(traced.storage_key() for traced in mutated))
        representatives = [groups[key][0] for key in mutated_keys]
        sharing = [(traced, index) for index, key in enumerate(mutated_keys) for traced in groups[key][1:]]
        others = [traced for traced in self._storages if traced.storage_key() not in mutated_keys]
        ordered = representatives + [traced for traced, _ in sharing] + others
        namespace["__storage_ids"] = _torch.storage_ids
        values = ", ".join(renderer.render(traced.source, body) for traced in ordered)
        lines = [f"__storages = __storage_ids({values})"]
        names = ", ".join(first.source.expr() for first in representatives)
        count = len(representatives)
        for position, (traced, group) in enumerate(sharing, start=count):
            first = representatives[group].source.expr()
            reason = f"{traced.source.expr()}: no longer shares storage with {first}, which the graph mutates"
            lines.append(f"if __storages[{position}] != __storages[{group}]: return {reason!r}")
        # where inputs share a mutated storage, the graph reads each one at the place in it the trace saw (y = x[1:4]
        # traced, y = x[0:3] now: same sizes, strides and storage), so each one's offset is compared too
        shared_groups = {group for _, group in sharing}
        for traced in [representatives[group] for group in sorted(shared_groups)] + [traced for traced, _ in sharing]:
            offset = traced.tensor.storage_offset()
            reason = f"{traced.source.expr()}: storage offset changed from {offset} (it shares a mutated storage)"
            lines.append(f"if {renderer.render(traced.source, body)}.storage_offset() != {offset}: return {reason!r}")
        if count > 1:
            lines.append(f"if len(set(__storages[:{count}])) != {count}: return "
                         f"{f'mutated inputs ({names}) now share storage with each other'!r}")
        if others:
            start = count + len(sharing)
            test = f"__storages[0] in __storages[{start}:]" if count == 1 else \
                f"not set(__storages[:{count}]).isdisjoint(__storages[{start}:])"
            lines.append(f"if {test}: return {f'an input now shares storage with a mutated input ({names})'!r}")
        return lines


# A tensor's place among a dict's traced keys (`dict_keys_differ`): any tensor (one the trace met only by listing
# the dict, whose own guards check it), or the very tensor at the key's own source.
_ANY_TENSOR_KEY, _SOURCED_TENSOR_KEY = object(), object()


def dict_keys_differ(actual: dict, traced: tuple, tensors: tuple) -> bool:
    """Whether `actual`'s keys differ, in order, from the `traced` ones: a tensor key by identity (`tensors`: the
    tensor now at each `_SOURCED_TENSOR_KEY`'s source, in order), any other key by type and equality."""
    if len(actual) != len(traced):
        return True
    expected = iter(tensors)
    for key, was in zip(actual, traced):
        if was is _ANY_TENSOR_KEY or was is _SOURCED_TENSOR_KEY:
            if not isinstance(key, torch.Tensor) or (was is _SOURCED_TENSOR_KEY and key is not next(expected)):
                return True
        elif isinstance(key, torch.Tensor) or type(key) is not type(was) or key != was:
            return True
    return False


@dataclass(frozen=True)
class _TracedStorage:
    """A tensor input as the trace saw it: its storage, and its fake's version when the trace began."""

    source: Source
    tensor: torch.Tensor
    fake: torch.Tensor
    initial_version: int | None
    graph: torch.fx.Graph

    def storage_key(self) -> int:
        return _torch.storage_ids(self.tensor)[0]

    def mutated(self) -> bool:
        """Whether the trace wrote to this input (or to a view of it).

        An inference tensor has no version counter: it counts as mutated when the graph has
        any in-place op at all (an input made under `torch.inference_mode()` then costs the
        storage check only in frames that write to some tensor)."""
        version = _version(self.fake)
        if version is None or self.initial_version is None:
            return _has_inplace_op(self.graph)
        return version != self.initial_version


_INPLACE_OPERATORS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
                      "rshift", "matmul")
_INPLACE_FUNCTIONS = frozenset({"setitem", "__setitem__", *(f"i{op}" for op in _INPLACE_OPERATORS),
                                *(f"__i{op}__" for op in _INPLACE_OPERATORS)})


def _has_inplace_op(graph: torch.fx.Graph) -> bool:
    """Whether any node of `graph` may write to a tensor: an in-place method or function
    (`add_`, `x[i] = v`, `+=`), an `out=` or `inplace=True` argument."""
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_FUNCTIONS or \
                "out" in node.kwargs or node.kwargs.get("inplace") is True:
            return True
        parameters = getattr(getattr(node.target, "__code__", None), "co_varnames", ())
        if "inplace" in parameters and True in node.args[1:]:  # F.relu(x, True)
            return True
    return False


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors do not count their versions
        return None


class SourceRenderer:
    """Renders sources into straight-line code, evaluating a shared prefix only once.

    A source that is the parent of two or more rendered sources is assigned to a local
    (`__s3 = self._modules['layers']`) the first time it is needed.
    """

    def __init__(self, sources: list[Source]):
        uses: dict[Source, int] = {}
        pending = list(sources)
        while pending:  # a source listed twice is used twice
            for ancestor in chain(pending.pop()):
                uses[ancestor] = uses.get(ancestor, 0) + 1
                if isinstance(ancestor, ItemSource) and isinstance(ancestor.key, TensorKey):
                    pending.append(ancestor.key.source)  # `d[<the key tensor's source>]` reads that source too
        self._hoist = {source for source, count in uses.items()
                       if count >= 2 and not isinstance(source, (LocalSource, NamedSource))}
        self._locals: dict[Source, str] = {}

    def render(self, source: Source, lines: list[str]) -> str:
        if source in self._locals:
            return self._locals[source]
        if source.parent is None:
            text = source.expr()
        elif isinstance(source, ItemSource) and isinstance(source.key, TensorKey):
            text = f"{self.render(source.parent, lines)}[{self.render(source.key.source, lines)}]"
        else:
            text = source.with_parent(self.render(source.parent, lines))
        if source in self._hoist:
            name = f"__s{len(self._locals)}"
            lines.append(f"{name} = {text}")
            self._locals[source] = name
            return name
        return text


@dataclass
class FrameSignature:
    """The compiled function's parameter list as text, with defaults bound by name."""

    text: str
    namespace: dict
    parameter_names: tuple[str, ...]
    var_positional: str | None = None
    var_keyword: str | None = None

    def implied_types(self) -> list[tuple[str, type]]:
        """(parameter, type) the signature itself guarantees: *args is a tuple, **kwargs a dict."""
        return [(name, cls) for name, cls in ((self.var_positional, tuple), (self.var_keyword, dict)) if name]

    @classmethod
    def of(cls, fn: Callable) -> "FrameSignature":
        signature = inspect.signature(fn, follow_wrapped=False)
        parts, namespace, names = [], {}, []
        seen_keyword_only = False
        previous_kind = None
        for index, parameter in enumerate(signature.parameters.values()):
            kind = parameter.kind
            if previous_kind == inspect.Parameter.POSITIONAL_ONLY and kind != inspect.Parameter.POSITIONAL_ONLY:
                parts.append("/")
            if kind == inspect.Parameter.KEYWORD_ONLY and not seen_keyword_only:
                parts.append("*")
            if kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_POSITIONAL):
                seen_keyword_only = True
            text = parameter.name
            if kind == inspect.Parameter.VAR_POSITIONAL:
                text = "*" + text
            elif kind == inspect.Parameter.VAR_KEYWORD:
                text = "**" + text
            elif parameter.default is not inspect.Parameter.empty:
                default_name = f"__default{index}"
                namespace[default_name] = parameter.default
                text += "=" + default_name
            parts.append(text)
            names.append(parameter.name)
            previous_kind = kind
        if previous_kind == inspect.Parameter.POSITIONAL_ONLY:
            parts.append("/")
        var_positional = next((p.name for p in signature.parameters.values()
                               if p.kind == inspect.Parameter.VAR_POSITIONAL), None)
        var_keyword = next((p.name for p in signature.parameters.values()
                            if p.kind == inspect.Parameter.VAR_KEYWORD), None)
        if fn.__code__.co_freevars:
            # The function whose closure cells the guard and entry read (`__fn.__closure__[i]`): a parameter,
            # since one dispatcher runs every function of the same code (Dispatcher.call_function).
            namespace["__fn_default"] = fn
            where = len(parts) - 1 if var_keyword else len(parts)
            added = ["__fn=__fn_default"] if seen_keyword_only else ["*", "__fn=__fn_default"]
            parts[where:where] = added
        return cls(", ".join(parts), namespace, tuple(names), var_positional, var_keyword)


def compile_function(source_text: str, name: str, namespace: dict, filename: str,
                     stand_in: tuple[types.CodeType, int, dict] | None = None) -> Callable:
    """exec `source_text` (one def) in `namespace` and return the function called `name`.

    With `stand_in` (a code object, a line, its globals), the function stands in for that frame: it
    reports the code's file, name and qualified name, every line of it is the given line, and it
    runs with those globals, reading the namespace's names as closure cells. A graph break's entry
    is such a stand-in, so what its broken call reads of its caller's frame (`sys._getframe(1)`,
    `f_globals`, the module a namedtuple or a warning names, a traceback's line) is the program's.
    """
    if stand_in is None:
        code = compile(source_text, f"<{filename}>", "exec")
        exec(code, namespace)
        return namespace[name]
    program, line, program_globals = stand_in
    names = [key for key in namespace if key.isidentifier() and key != "__builtins__"]
    # builtins the text names, bound here: the program's globals may shadow them
    words = set(re.findall(r"[A-Za-z_]\w*", source_text))
    shadowed = {word: getattr(builtins, word) for word in words
                if word not in namespace and not keyword.iskeyword(word) and hasattr(builtins, word)}
    cells = [*names, *shadowed]
    factory = f"def __stand_in({', '.join(cells)}):\n" + \
        "".join(f"    {text}\n" for text in source_text.splitlines()) + f"    return {name}\n"
    tree = ast.parse(factory)
    for node in ast.walk(tree):
        if "lineno" in node._attributes:
            node.lineno = node.end_lineno = line
    scope: dict = {"__builtins__": builtins}
    exec(compile(tree, program.co_filename, "exec"), scope)
    made = scope["__stand_in"](*(namespace[key] for key in names), *shadowed.values())
    renamed = made.__code__.replace(co_name=program.co_name, co_qualname=program.co_qualname)
    function = types.FunctionType(renamed, program_globals, program.co_name, made.__defaults__, made.__closure__)
    function.__kwdefaults__ = made.__kwdefaults__
    return function


def _short(value: Any) -> str:
    # A class's or function's own name; any other object is named by its type, never through getattr on the
    # object (a module's own __getattr__ may answer any name with anything).
    text = value.__qualname__ if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) else None
    text = text if isinstance(text, str) and text else type(value).__name__
    return text if len(text) < 60 else text[:57] + "..."
