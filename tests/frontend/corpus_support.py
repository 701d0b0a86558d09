"""The corpus's vocabulary: how a program, its arguments and its two changes are declared.

A program is a plain function registered with `@program(...)`:
- `args`: a zero-argument callable making fresh arguments;
- `guarded`: a change that must cause exactly one recompile (default: the first
  tensor argument becomes float64);
- `stable`: a change that must not recompile (default: fresh arguments with the
  same metadata, i.e. new tensor values).
A change is `(args) -> (new_args, undo)`; `undo` (or None) restores any global
state it touched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

Change = Callable[[tuple], tuple[tuple, Callable[[], None] | None]]


@dataclass
class Program:
    name: str
    fn: Callable
    make_args: Callable[[], tuple]
    guarded: Change
    stable: Change


PROGRAMS: list[Program] = []


def tensors(*shapes, dtype=torch.float32) -> Callable[[], tuple]:
    """Fresh random tensors of these shapes (a shape may be an int for 1-d)."""
    def make():
        return tuple(torch.randn(*(shape if isinstance(shape, tuple) else (shape,)), dtype=dtype) for shape in shapes)

    return make


def with_values(*values, shapes=((4, 3),)) -> Callable[[], tuple]:
    """Tensors of `shapes` followed by the given plain Python values."""
    make = tensors(*shapes)
    return lambda: (*make(), *values)


def retype(args: tuple):
    """Floating tensor arguments become float64: every tensor guard must notice."""
    def convert(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.double()
        if isinstance(value, (list, tuple)):
            return type(value)(convert(item) for item in value)
        if isinstance(value, dict):
            return {key: convert(item) for key, item in value.items()}
        return value

    return tuple(convert(value) for value in args), None


def reshape_first(*shape):
    def change(args):
        out = list(args)
        for index, value in enumerate(out):
            if isinstance(value, torch.Tensor):
                out[index] = torch.randn(*shape, dtype=value.dtype)
                break
        return tuple(out), None

    return change


def replace_arg(position: int, value: Any) -> Change:
    def change(args):
        out = list(args)
        out[position] = value
        return tuple(out), None

    return change


def set_attribute(owner: Any, name: str, value: Any) -> Change:
    """Set `owner.name` (a module global when owner is a module), undone afterwards."""
    def change(args):
        old = getattr(owner, name)
        setattr(owner, name, value)
        return args, lambda: setattr(owner, name, old)

    return change


def set_closure(fn: Callable, variable: str, value: Any) -> Change:
    def change(args):
        cell = fn.__closure__[fn.__code__.co_freevars.index(variable)]
        old = cell.cell_contents
        cell.cell_contents = value
        return args, lambda: setattr(cell, "cell_contents", old)

    return change


def fresh_values(make_args):
    def change(args):
        return make_args(), None

    return change


def program(args: Callable[[], tuple] | None = None, guarded: Change | None = None, stable: Change | None = None):
    """Register a corpus program (see the module docstring)."""
    def register(fn):
        make_args = args or tensors((4, 3), (4, 3))
        PROGRAMS.append(Program(fn.__name__, fn, make_args, guarded or retype, stable or fresh_values(make_args)))
        return fn

    return register
