"""The lowering table: ATen op -> rule. One entry per op, in one file per op family.

    @lowering(aten.sin)                       # every overload of the packet
    def sin(ctx, node, x): ...

A rule gets the context, the FX node (whose `meta["val"]` is the fake result: shape,
strides, dtype) and the lowered arguments (TensorValue for tensors, Python or sympy
values otherwise). It returns TensorValue(s) shaped like the op's result, or raises
`Unsupported` to make that one call an extern.
"""
from __future__ import annotations

from typing import Callable

LOWERINGS: dict = {}
# Ops deliberately run as externs: vendor libraries beat generated code on them.
EXTERN_OPS: set = set()


def _overloads(op):
    if hasattr(op, "overloads"):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lowering(*ops) -> Callable:
    def register(rule: Callable) -> Callable:
        for op in ops:
            for overload in _overloads(op):
                LOWERINGS[overload] = rule
        return rule

    return register


def extern_op(*ops) -> None:
    for op in ops:
        EXTERN_OPS.update(_overloads(op))
