"""Automatic dynamic shapes: which sizes and scalars a trace makes symbolic.

A compiled function first specializes on every size (its graph and guards are static,
the guard's tensor check one batched C++ call). Each code object's `DynamicPolicy`
(in the dispatcher's cache for it) remembers, by source, the sizes of every tensor input
and the value of every int and float argument the first trace saw. A later trace (a
recompile) asks it input by input:

- a tensor whose size changed in some dims gets a symbol for each of those dims (the
  others stay static), so the graph is shape-generic in them and the guard checks the
  relations the trace recorded instead of those sizes;
- an int or float argument whose value changed becomes a graph input (a SymInt, or a
  0-d float64 tensor whose `item()` is a SymFloat, as Dynamo passes a float).

Once dynamic, a dim or a scalar stays dynamic. `dynamic=True` makes every dim of every
tensor input and every int and float argument symbolic from the first trace;
`dynamic=False` never does. Parameters and buffers keep static sizes (a model's weights
do not change shape), as in Dynamo. Sizes 0 and 1 are specialized by the ShapeEnv, so an
entry made with a symbolic dim serves sizes >= 2 only (its guard says so).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.config import config
from kiln.frontend.sources import AttrSource, ItemSource, LocalSource, NamedSource, Source, chain

log = logging.getLogger("kiln")


@dataclass
class DynamicPolicy:
    """What the traces of one code object make symbolic. `mode`: None (automatic), True or False."""

    mode: bool | None = None
    traces: int = 0
    sizes: dict[Source, tuple[int, ...]] = field(default_factory=dict)  # each tensor's shape in the first trace
    dynamic_dims: dict[Source, frozenset[int]] = field(default_factory=dict)
    scalars: dict[Source, Any] = field(default_factory=dict)  # each int/float argument's first value
    dynamic_scalars: set[Source] = field(default_factory=set)
    # Set when AOTAutograd could not turn a symbolic float's arithmetic into tensor arithmetic (torch 2.11's
    # tensorify_python_scalars, kiln/_torch.py is_tensorify_restart): float arguments stay constants, as Dynamo
    # specializes them on the same torch.
    static_floats: bool = False

    def start_trace(self) -> bool:
        """A trace begins; whether it needs a ShapeEnv (any trace but the first, unless static)."""
        self.traces += 1
        return self.mode is True or (self.mode is None and self.traces > 1)

    def tensor_dims(self, source: Source, tensor: torch.Tensor) -> frozenset[int]:
        """The dims of this tensor input to make symbolic (and remember its sizes)."""
        if self.mode is False or not _may_be_dynamic(source, tensor):
            return frozenset()
        if self.mode is True:
            return frozenset(range(tensor.dim()))
        shape = tuple(tensor.shape)
        first = self.sizes.setdefault(source, shape)
        dims = self.dynamic_dims.get(source, frozenset())
        if len(first) == len(shape):
            changed = frozenset(dim for dim, (old, new) in enumerate(zip(first, shape)) if old != new) - dims
            if changed:
                dims |= changed
                self.dynamic_dims[source] = dims
                if config.log_enabled("recompiles"):
                    log.warning("kiln: %s: size changed from %s to %s; dim%s %s symbolic from now on", source.expr(),
                                list(first), list(shape), "s" if len(changed) > 1 else "",
                                ", ".join(map(str, sorted(changed))))
        return dims

    def scalar_is_dynamic(self, source: Source, value: Any) -> bool:
        """Whether this int or float argument becomes a graph input (and remember its value)."""
        if self.mode is False or type(value) not in (int, float) or not _is_argument(source) or \
                (type(value) is float and (self.static_floats or not math.isfinite(value))):
            return False
        if type(value) is int and not fits_int64(value):  # a SymInt is an int64: 2**70 would overflow
            self.scalars.setdefault(source, value)
            return False
        if self.mode is True or source in self.dynamic_scalars:
            return True
        first = self.scalars.setdefault(source, value)
        if type(first) is type(value) and first != value:
            self.dynamic_scalars.add(source)
            if config.log_enabled("recompiles"):
                log.warning("kiln: %s: changed from %r to %r; a graph input from now on", source.expr(), first, value)
            return True
        return False


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def fits_int64(value: int) -> bool:
    """Whether an int can be a SymInt graph input (an int64 at run time); a bigger one stays a constant,
    guarded by value, and the guard of an entry where that argument is symbolic refuses it."""
    return INT64_MIN <= value <= INT64_MAX


def _may_be_dynamic(source: Source, tensor: torch.Tensor) -> bool:
    """Parameters and buffers keep static sizes; so do 0-d tensors (they have none)."""
    if tensor.dim() == 0 or isinstance(tensor, torch.nn.Parameter):
        return False
    return not any(isinstance(link, AttrSource) and link.name in ("_parameters", "_buffers") for link in chain(source))


def _is_argument(source: Source) -> bool:
    """An argument of the compiled frame, or an item of one (of `*args`, `**kwargs`, a list argument); a global,
    or an attribute or item of an argument or a global (a step counter or a scale kept on an object or in a
    module): read from where the frame finds it on each call, as an argument is."""
    links = chain(source)
    return isinstance(links[0], (LocalSource, NamedSource)) and \
        all(isinstance(link, (ItemSource, AttrSource)) for link in links[1:])
