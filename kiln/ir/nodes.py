"""LoopIR: buffers, layouts, SSA bodies and the nodes that fill buffers.

A `Body` is an explicit list of SSA ops. Value `%k` is the result of op k. Loads and
stores address a buffer by a *multi-index over its logical shape*; the buffer's
layout turns that into a storage offset only in codegen, so inlining a producer into a
consumer is plain substitution of index variables.

Ops (name: operands -> result):
    load        buffer[index] (mask)               the element, in the buffer's dtype; an index may
                                                   use `ind<k>`, standing for value %k (gathers)
    store       value -> buffer[index]             no result
    constant    value (attr)                       a scalar of `dtype`
    index_expr  expr (attr)                        an index expression as `dtype`
    to_dtype    x                                  x converted to `dtype`
    unary math  x                                  (see ops.py)
    binary math x, y                               (see ops.py)
    where       cond, x, y
    check_index x, size (attr)                     a gathered position: x when 0 <= x < size; otherwise
                                                   the kernel reports an IndexError (the host raises) and
                                                   continues with 0, so no lane reads outside a tensor
    reduce      x, kind (attr)                     reduction over the node's reduction ranges;
                                                   welford yields (mean, m2, count): use getitem
    getitem     x, position (attr)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import sympy
import torch

from kiln.ir.ops import EXPENSIVE, OPS, REDUCTION_KINDS as _REDUCTION_KINDS, SPECS

# The pointwise ops' sets, from the op table (kiln/ir/ops.py): plain strings, as bodies hold them.
UNARY_OPS = {name for name, row in OPS.items() if row.arity == 1}
BINARY_OPS = {name for name, row in OPS.items() if row.arity == 2}
EXPENSIVE_OPS = {name for name, row in OPS.items() if row.cost == EXPENSIVE}  # see ops.py's cost classes
REDUCTION_KINDS = set(_REDUCTION_KINDS)
OTHER_OPS = set(SPECS)  # the ops without a row: their specs, also in ops.py
ALL_OPS = UNARY_OPS | BINARY_OPS | OTHER_OPS


@dataclass(frozen=True)
class Layout:
    """Sizes and strides (sympy) and a storage offset, in elements."""

    size: tuple
    stride: tuple
    offset: sympy.Expr = sympy.Integer(0)

    def offset_of(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        # one Add of all the terms: the same canonical sum as adding them one by one, flattened once
        return self.offset + sympy.Add(*[i * s for i, s in zip(index, self.stride)])

    @property
    def numel(self) -> sympy.Expr:
        result = sympy.Integer(1)
        for size in self.size:
            result = result * size
        return result

    def storage_span(self) -> sympy.Expr:
        """Elements from offset 0 to one past the last element (what an allocation needs)."""
        if any(size == 0 for size in self.size):
            return sympy.Integer(0)
        return self.offset + 1 + sum(((size - 1) * stride for size, stride in zip(self.size, self.stride)),
                                     sympy.Integer(0))

    def __str__(self) -> str:
        text = f"[{', '.join(map(str, self.size))}] stride [{', '.join(map(str, self.stride))}]"
        return text + (f" offset {self.offset}" if self.offset != 0 else "")


@dataclass
class Buffer:
    """A named region of device memory with a dtype and a layout."""

    name: str
    device: torch.device
    dtype: torch.dtype
    layout: Layout

    def __str__(self) -> str:
        return f"{self.name}: {dtype_name(self.dtype)}{self.layout} on {self.device}"


@dataclass(frozen=True)
class Op:
    name: str
    operands: tuple = ()
    dtype: torch.dtype | None = None
    buffer: str | None = None
    index: tuple | None = None
    attr: Any = None


@dataclass
class Body:
    """An SSA op list: value %k is ops[k]'s result."""

    ops: list = field(default_factory=list)

    def emit(self, name: str, operands: Sequence[int] = (), dtype=None, *, buffer=None, index=None,
             attr=None) -> int:
        self.ops.append(Op(name, tuple(operands), dtype, buffer, None if index is None else tuple(index), attr))
        return len(self.ops) - 1

    # Builders for the common ops; each returns the SSA id of its result.
    def load(self, buffer: "Buffer", index: Sequence[sympy.Expr], mask: int | None = None) -> int:
        """Load buffer[index]; with `mask` (a bool value), lanes where it is false read 0."""
        return self.emit("load", () if mask is None else (mask,), buffer.dtype, buffer=buffer.name, index=index)

    def indirect(self, value: int) -> sympy.Symbol:
        """A symbol standing for SSA value `value` inside an index (gather, embedding)."""
        return indirect_symbol(value)

    def check_index(self, value: int, size: sympy.Expr) -> int:
        """`value` (int64) checked to lie in [0, size): the one bounds rule every backend renders."""
        return self.emit("check_index", (value,), torch.int64, attr=size)

    def store(self, buffer: "Buffer", index: Sequence[sympy.Expr], value: int) -> int:
        return self.emit("store", (value,), None, buffer=buffer.name, index=index)

    def constant(self, value, dtype: torch.dtype) -> int:
        return self.emit("constant", (), dtype, attr=value)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype = torch.int64) -> int:
        return self.emit("index_expr", (), dtype, attr=expr)

    def to_dtype(self, value: int, dtype: torch.dtype) -> int:
        if self.ops[value].dtype == dtype:
            return value
        return self.emit("to_dtype", (value,), dtype)

    def dtype_of(self, value: int) -> torch.dtype:
        return self.ops[value].dtype

    def reads(self) -> list[Op]:
        return [op for op in self.ops if op.name == "load"]

    def writes(self) -> list[Op]:
        return [op for op in self.ops if op.name == "store"]


@dataclass
class LoopNode:
    """A loop nest over `ranges` (and `reduction_ranges` for a reduction) running `body`."""

    name: str
    ranges: list
    body: Body
    outputs: list  # buffer names this node stores to

    reduction_ranges: list = field(default_factory=list)

    @property
    def is_reduction(self) -> bool:
        return any(op.name == "reduce" for op in self.body.ops)

    def reduction_kind(self) -> str | None:
        for op in self.body.ops:
            if op.name == "reduce":
                return op.attr
        return None


class Pointwise(LoopNode):
    pass


class Reduction(LoopNode):
    pass


@dataclass
class Template(LoopNode):
    """A matrix product computed by a kernel template (Triton's tiled `tl.dot` loop), which a pointwise
    epilogue may join: `out[i0, i1] = finish(sum over r0 of a[i0, r0] * b[r0, i1])` (kind "mm"), or with a
    leading batch dim, `out[i0, i1, i2] = sum over r0 of a[i0, i1, r0] * b[i0, r0, i2]` (kind "bmm").

    Its body states that exactly, so it prints, verifies and reports its reads like any reduction:
    op 0 loads `a` at an index affine in (i0, r0), op 1 loads `b` affine in (r0, i1), then the casts,
    the product and `reduce sum`; the ops after the reduce (a bias, alpha/beta, the cast, the store)
    are pointwise over (i0, i1). Backends generate the reduction part from the template's `kind`
    rather than op by op, so nothing inlines into the ops before the reduce.
    `config` holds the tile (block sizes, warps, stages) chosen for it, or None: the backend's default.
    """

    kind: str = "mm"
    config: Any = None
    precision: str = "ieee"  # fp32 operands: "ieee" (full products) or "tf32x3" (torch allows TF32: three TF32 products)


@dataclass
class TensorArg:
    """An extern's tensor argument: a strided view of a buffer."""

    buffer: str
    layout: Layout


@dataclass
class Extern:
    """A call of an ATen op on realized buffers (cuBLAS mm, conv, SDPA, any fallback)."""

    name: str
    op: Any
    args: tuple  # pytree of constants, sympy exprs and TensorArg
    kwargs: dict
    outputs: list  # buffer names, in the order the op returns its tensors
    output_structure: Any = None  # the op's result with output positions (int) for tensors
    writes_into_outputs: bool = False  # an `out=` variant: the wrapper allocates `outputs` and passes them

    def tensor_args(self) -> list:
        """Every TensorArg among the arguments, nested lists included."""
        found, stack = [], list(self.args) + list(self.kwargs.values())
        while stack:
            item = stack.pop()
            if isinstance(item, TensorArg):
                found.append(item)
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
        return found


@dataclass
class GraphInput:
    """A graph input: a tensor buffer, a size symbol, or a value passed through."""

    kind: str  # "tensor" | "symbol" | "other"
    name: str
    buffer: Buffer | None = None
    symbol: sympy.Symbol | None = None


@dataclass
class Graph:
    """A LoopIR graph: inputs, buffers, nodes in execution order, outputs."""

    inputs: list = field(default_factory=list)
    buffers: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    outputs: list = field(default_factory=list)  # TensorArg | sympy expr | python constant | None
    constants: dict = field(default_factory=dict)  # buffer name -> real tensor held by the module

    def producers(self) -> dict:
        """Buffer name -> node that writes it."""
        return {output: node for node in self.nodes for output in node.outputs}


def graph_device_type(graph: Graph) -> str:
    """The device type whose backend runs `graph`: cuda when any of its buffers is on a CUDA device, else cpu."""
    for buffer in graph.buffers.values():
        if buffer.device.type == "cuda":
            return "cuda"
    return "cpu"


def indirect_symbol(value: int) -> sympy.Symbol:
    return sympy.Symbol(f"ind{value}", integer=True)


def symbol_name(symbol) -> str:
    """A symbol's name, read without sympy's printer (str() of a Symbol costs ~9 us; lowering and codegen ask
    ~30,000 times for a GPT-2)."""
    return symbol.name if isinstance(symbol, sympy.Symbol) else str(symbol)


def indirect_value(symbol) -> int | None:
    """The SSA id an `ind<k>` symbol stands for, or None for other symbols."""
    name = symbol_name(symbol)
    return int(name[3:]) if name.startswith("ind") and name[3:].isdigit() else None


_DTYPE_NAMES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_name(dtype: torch.dtype | None) -> str:
    if dtype is None:
        return "-"
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
