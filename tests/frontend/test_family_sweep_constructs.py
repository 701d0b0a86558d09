"""Constructs the second Hugging Face family sweep (tests/models/sweep_families.py, 2026-12-04) found kiln's
frontend mishandling, each in a small program: captured whole (fullgraph=True where nothing breaks), with eager's
results and side effects.

- `dict.fromkeys(range(n))` (transformers' linear-attention cache layers, Mamba's): a RecursionError ran the
  whole frame eagerly; builtin class methods that are pure run on constants; `datetime.now` breaks.
- `ACT2FN["silu"](x)` inside a forward: transformers' `ClassInstantier` (a dict subclass whose `__getitem__` makes
  a module) had its `__getitem__` run at trace time and again in every guard check (a new module each time: a
  recompile per call), and the module it made was called as if it were the class.
- A module made inside the trace whose construction runs only torch.nn's code (no `__init__` of its own) or
  transformers' activations'.
- Objects with `__slots__` made inside the trace (torch.utils._pytree's TreeSpec, a frozen slotted dataclass).
- `torch.tensor(0, dtype=int)`: the Python type reached the FX graph's code as `<class 'int'>`, a SyntaxError that
  ran the frame eagerly.
- `OrderedDict.keys(output)` on a ModelOutput from outside the trace (`ModelOutput.to_tuple` after a break).
"""
from __future__ import annotations

import collections
import dataclasses
import datetime

import pytest
import torch

import kiln
from kiln.debug.explain import explain


def _compiled_whole(fn, *args):
    """`fn` compiled with fullgraph=True: its result, after checking one capture with no break."""
    report = explain(fn, *args)
    assert len(report.breaks) == 0 and not any(frame.eager_reason for frame in report.frames), str(report)
    return kiln.compile(fn, fullgraph=True)(*args)


def test_dict_fromkeys_and_pure_builtin_class_methods():
    def program(x, n: int = 3):
        plain = dict.fromkeys(range(n))
        flags = dict.fromkeys(range(n), False)
        flags[1] = True
        ordered = collections.OrderedDict.fromkeys("ab", 0)
        number = int.from_bytes(b"\x01\x02", "big") + float.fromhex("0x1p-1")
        return x * (len(plain) + sum(1 for v in flags.values() if v is False) + number), flags, ordered

    x = torch.randn(4)
    expected, actual = program(x), _compiled_whole(program, x)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1] == expected[1] and actual[2] == expected[2] and type(actual[2]) is collections.OrderedDict


def test_a_class_method_that_reads_the_world_breaks():
    def program(x):
        return x + datetime.datetime.now().year * 0

    report = explain(program, torch.ones(2))
    assert len(report.breaks) == 1 and "datetime.now" in report.breaks[0].reason
    torch.testing.assert_close(kiln.compile(program)(torch.ones(2)), torch.ones(2))


class _Activation(torch.nn.Module):  # no __init__ of its own: making one runs nn.Module's only
    def forward(self, input):
        return torch.nn.functional.silu(input) * 2


class _Configured(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        _MADE.append(scale)  # a side effect: this class must not be made at trace time

    def forward(self, input):
        return input * self.scale


_MADE: list = []


def test_a_module_made_inside_the_trace():
    transformers = pytest.importorskip("transformers")
    from transformers.activations import ACT2FN

    def program(x):
        return _Activation()(x) + ACT2FN["silu"](x) + ACT2FN["gelu"](x)

    x = torch.randn(5)
    torch.testing.assert_close(_compiled_whole(program, x), program(x))
    compiled = kiln.compile(program)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), program(x))
    assert transformers is not None


def test_a_module_whose_own_init_has_effects_is_made_by_the_program():
    def program(x):
        return _Configured(3.0)(x) + 1

    _MADE.clear()
    compiled = kiln.compile(program)
    for _ in range(2):
        torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 4.0))
    assert _MADE == [3.0, 3.0]  # once per call, as eager makes it: never at trace time only


class _Counting(dict):
    reads: list = []

    def __getitem__(self, key):
        _Counting.reads.append(key)
        return super().__getitem__(key) * 10


_COUNTING = _Counting(a=1, b=2)


def test_a_dict_subclass_getitem_runs_only_when_the_program_calls_it():
    """The trace and its guards read dict.__getitem__(d, key) where dict's own method is called on a dict
    subclass; the subclass's override runs only where the program indexes it, once per call."""

    def program(x):
        return x + _COUNTING["a"] + dict.__getitem__(_COUNTING, "b")

    compiled = kiln.compile(program)
    for _ in range(3):
        _Counting.reads.clear()
        torch.testing.assert_close(compiled(torch.zeros(2)), torch.full((2,), 12.0))
        assert _Counting.reads == ["a"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Frozen:
    count: int
    values: torch.Tensor


class _Slotted:
    __slots__ = ("first", "second")

    def __init__(self, first):
        self.first = first


def test_objects_with_slots_made_inside_the_trace():
    def program(x):
        frozen = _Frozen(2, x * 2)
        slotted = _Slotted(x + 1)
        slotted.second = frozen.values.sum()
        try:
            slotted.third = 1
            refused = False
        except AttributeError:
            refused = True
        had_second = hasattr(slotted, "second")
        del slotted.second
        return frozen, slotted.first * frozen.count, refused, had_second, hasattr(slotted, "second")

    x = torch.randn(3)
    expected, actual = program(x), _compiled_whole(program, x)
    assert type(actual[0]) is _Frozen and actual[0].count == 2
    torch.testing.assert_close(actual[0].values, expected[0].values)
    torch.testing.assert_close(actual[1], expected[1])
    assert actual[2:] == expected[2:] == (True, True, False)


def test_pytree_flatten_and_unflatten_inside_the_trace():
    from torch.utils import _pytree as pytree

    def program(x):
        leaves, spec = pytree.tree_flatten({"a": x, "b": [x * 2, x + 1]})
        return pytree.tree_unflatten([leaf * 3 for leaf in leaves], spec), spec.num_leaves

    x = torch.randn(3)
    expected, actual = program(x), _compiled_whole(program, x)
    assert actual[1] == expected[1] == 3
    torch.testing.assert_close(actual[0], expected[0])


def test_python_types_as_dtypes():
    def program(x):
        return torch.tensor(3, dtype=int) + 1, x.to(float) * 2, torch.zeros(2, dtype=bool), x.new_ones(2, dtype=complex)

    x = torch.randn(2)
    for expected, actual in zip(program(x), _compiled_whole(program, x)):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected)


def test_ordered_dict_keys_of_an_outside_model_output():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutput

    output = BaseModelOutput(last_hidden_state=torch.randn(2, 3))

    def program(x, out):
        return x + len(collections.OrderedDict.keys(out)), out.to_tuple()[0] * 2

    x = torch.randn(2, 3)
    expected, actual = program(x, output), _compiled_whole(program, x, output)
    torch.testing.assert_close(actual, expected)
    assert transformers is not None
