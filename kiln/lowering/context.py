"""The lowering context: tensor values, buffers and the helpers every rule uses.

A lowered tensor is a `TensorValue` that knows how to load one element given a
multi-index over its own shape:
  * `BufferValue`: a realized buffer (graph input, constant, node or extern output);
  * `ViewValue`: an index remap of another value (permute, expand, slice, reshape...).
    Views never copy; they compose index functions.

Rules build nodes through `LoweringContext.pointwise`, `.reduction` and `.extern`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import sympy
import torch

from kiln import _torch
from kiln.ir import Body, Buffer, Extern, Graph, Layout, Pointwise, Reduction, TensorArg
from kiln.ir.indexing import affine_coefficients, as_expr, fold_div_mod, is_affine, range_vars, simplify_index
from kiln.lowering.registry import EXTERN_OPS, LOWERINGS

# dtypes Triton kernels handle; anything else runs as an extern.
KERNEL_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
                 torch.int32, torch.int64, torch.uint8, torch.bool}
LOW_PRECISION = {torch.float16, torch.bfloat16}


# Reductions whose result over a dim the value does not vary along (a broadcast: stride 0, or a
# view that ignores the dim) is exact without reading it: sum is the one value times the size,
# mean, max, min, any and all are the value. Eager reads every copy: its float sum of n equal
# values rounds n times, so its mean of 13 equal values can be an ulp off the value, and a
# z-score of such a row, (x - mean) / sqrt(var + eps), 316 times that (fuzz seed 3015 #1970 on
# CUDA). prod (n roundings in eager, one pow here), argmax/argmin (a flattened index over every
# reduced dim) and welford (exact for equal values already) keep the loop.
BROADCAST_EXACT_KINDS = {"sum", "max", "min", "any", "all"}


def _broadcast_dims(value: "TensorValue", dims: Sequence[int], buffers: dict) -> list[int]:
    """The dims of `dims` that `value`'s elements do not depend on, each of a known size >= 1: a
    load into a trial body, whose addresses (the buffers' strides applied) do not name them."""
    probe = Body()
    symbols = range_vars(value.ndim, "p")
    value.load(probe, symbols)
    used: set = set()
    for op in probe.ops:
        expressions = [op.attr]
        if op.name == "load":
            stride = buffers[op.buffer].layout.stride
            expressions.append(sum((as_expr(index) * step for index, step in zip(op.index, stride)), sympy.Integer(0)))
        for expr in expressions:
            if isinstance(expr, sympy.Basic):
                used |= expr.free_symbols
    return [dim for dim in dims if symbols[dim] not in used
            and isinstance(value.shape[dim], (int, sympy.Integer)) and int(value.shape[dim]) >= 1]


class Unsupported(Exception):
    """A rule cannot handle this call; the node becomes an extern call of the ATen op."""


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Math on fp16/bf16 runs in fp32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


class TensorValue:
    dtype: torch.dtype
    device: torch.device
    shape: list

    def load(self, body: Body, index: Sequence[sympy.Expr], mask: int | None = None) -> int:
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.shape)


class BufferValue(TensorValue):
    def __init__(self, buffer: Buffer):
        self.buffer = buffer
        self.dtype, self.device, self.shape = buffer.dtype, buffer.device, list(buffer.layout.size)

    def load(self, body: Body, index: Sequence[sympy.Expr], mask: int | None = None) -> int:
        return body.load(self.buffer, index, mask)

    def __repr__(self) -> str:
        return f"BufferValue({self.buffer.name})"


class ViewValue(TensorValue):
    """`load(index)` = `base.load(remap(index))`."""

    def __init__(self, base: TensorValue, shape: Sequence, remap: Callable[[list], list]):
        self.base, self.shape, self.remap = base, [as_expr(size) for size in shape], remap
        self.dtype, self.device = base.dtype, base.device

    def load(self, body: Body, index: Sequence[sympy.Expr], mask: int | None = None) -> int:
        ranges = {var: size for var, size in zip(index, self.shape) if isinstance(var, sympy.Symbol)}
        base_index = [simplify_index(sympy.sympify(expr), ranges) for expr in self.remap(list(index))]
        return self.base.load(body, base_index, mask)

    def __repr__(self) -> str:
        return f"ViewValue({self.base!r}, {self.shape})"


def meta_of(fx_node) -> torch.Tensor:
    return fx_node.meta["val"]


def layout_of(tensor: torch.Tensor, *, with_offset: bool = True) -> Layout:
    size = tuple(_torch.sym_expr(size) for size in tensor.shape)
    stride = tuple(_torch.sym_expr(stride) for stride in tensor.stride())
    offset = _torch.sym_expr(tensor.storage_offset()) if with_offset else sympy.Integer(0)
    return Layout(size, stride, offset)


class ConstantOutput:
    """A non-tensor result of an extern whose value the fake run already knows."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        return f"ConstantOutput({self.value!r})"


class LoweringContext:
    """Owns the LoopIR graph under construction and names its buffers and nodes."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._buffer_count = 0
        self._node_count = 0
        self.lowered_ops: dict[str, int] = {}
        self.extern_ops: dict[str, int] = {}
        self.values: dict = {}  # FX node -> its lowered value, as lower_graph fills it in

    # ---- naming -------------------------------------------------------------------
    def new_buffer(self, device, dtype, layout: Layout, prefix: str = "buf") -> Buffer:
        buffer = Buffer(f"{prefix}{self._buffer_count}", torch.device(device), dtype, layout)
        self._buffer_count += 1
        self.graph.buffers[buffer.name] = buffer
        return buffer

    def buffer_for(self, meta: torch.Tensor) -> Buffer:
        """A fresh buffer laid out as the op's fake result (its strides match eager's)."""
        if meta.dtype not in KERNEL_DTYPES:
            raise Unsupported(f"dtype {meta.dtype}")
        return self.new_buffer(meta.device, meta.dtype, layout_of(meta, with_offset=False))

    def new_node_name(self) -> str:
        name = f"node{self._node_count}"
        self._node_count += 1
        return name

    # ---- loading --------------------------------------------------------------------
    def load_broadcast(self, body: Body, value, index: Sequence, shape: Sequence, dtype, through=None) -> int:
        """Load `value` (a TensorValue or Python scalar) broadcast to `shape`, as `dtype`.

        through: a dtype the value is rounded to first, as eager converts an operand to the
        op's fp16/bf16 common dtype before math done in float (None: no rounding).
        """
        if not isinstance(value, TensorValue):
            scalar = _python_scalar(value)
            if isinstance(scalar, sympy.Basic) and not scalar.is_Number:
                loaded = body.index_expr(scalar, torch.int64)
                if through is not None:
                    loaded = body.to_dtype(loaded, through)
                return body.to_dtype(loaded, dtype)
            if through is not None and through != dtype:
                scalar = rounded_scalar(scalar, through)
            return body.constant(scalar, dtype)
        leading = len(shape) - value.ndim
        value_index = [sympy.Integer(0) if size == 1 and shape[leading + position] != 1 else index[leading + position]
                       for position, size in enumerate(value.shape)]
        loaded = value.load(body, value_index)
        if through is not None and value.dtype != through:
            loaded = body.to_dtype(loaded, through)
        return body.to_dtype(loaded, dtype)

    # ---- building nodes ---------------------------------------------------------------
    def lower_op(self, fx_node, args: tuple, kwargs: dict):
        """One call of `fx_node.target` on lowered arguments: its rule in the lowering table, or an
        extern call of the op where there is none or it declines (`Unsupported`). `fx_node` is what
        the rule reads (its target and meta): an FX node, or a node a pattern replaced."""
        target = fx_node.target
        rule = LOWERINGS.get(target)
        if rule is not None and target not in EXTERN_OPS:
            try:
                result = rule(self, fx_node, *args, **kwargs)
                self.lowered_ops[str(target)] = self.lowered_ops.get(str(target), 0) + 1
                return result
            except Unsupported:
                pass
        self.extern_ops[str(target)] = self.extern_ops.get(str(target), 0) + 1
        return self.extern(target, args, kwargs, fx_node.meta.get("val"))

    def pointwise(self, inputs: Sequence, compute: Callable, *, meta: torch.Tensor, compute_dtype=None,
                  input_dtypes: Sequence | None = None, rounded_through: Sequence | None = None) -> BufferValue:
        """A Pointwise node over `meta`'s shape: load inputs, `compute(body, *values)`, store.

        compute_dtype: what inputs are converted to before the math (default: the
        output dtype, fp32 for fp16/bf16). input_dtypes overrides it per input.
        rounded_through: per input, a dtype it is rounded to before that conversion, or None
        (see load_broadcast).
        """
        for value in inputs:
            if isinstance(value, TensorValue):
                if value.device != meta.device:
                    raise Unsupported(f"input on {value.device}, output on {meta.device}")
                if value.dtype not in KERNEL_DTYPES:
                    raise Unsupported(f"dtype {value.dtype}")
        out = self.buffer_for(meta)
        shape = list(out.layout.size)
        index = range_vars(len(shape))
        body = Body()
        compute_dtype = compute_dtype or compute_dtype_for(meta.dtype)
        dtypes = input_dtypes or [compute_dtype] * len(inputs)
        throughs = rounded_through or [None] * len(inputs)
        loaded = [self.load_broadcast(body, value, index, shape, dtype, through)
                  for value, dtype, through in zip(inputs, dtypes, throughs)]
        result = compute(body, *loaded)
        body.store(out, index, body.to_dtype(result, meta.dtype))
        self.graph.nodes.append(Pointwise(self.new_node_name(), shape, body, [out.name]))
        return BufferValue(out)

    def pointwise_indexed(self, meta: torch.Tensor, compute: Callable, layout: Layout | None = None) -> BufferValue:
        """A Pointwise node whose `compute(body, index)` loads its inputs itself (gathers, cat, pad);
        its buffer is laid out as `meta`, or as `layout` (with meta's dtype and device) when given."""
        out = self.buffer_for(meta) if layout is None else self.new_buffer(meta.device, meta.dtype, layout)
        index = range_vars(len(out.layout.size))
        body = Body()
        body.store(out, index, body.to_dtype(compute(body, index), meta.dtype))
        self.graph.nodes.append(Pointwise(self.new_node_name(), list(out.layout.size), body, [out.name]))
        return BufferValue(out)

    def reduction(self, value: TensorValue, dims: Sequence[int], kind: str, *, metas: Sequence[torch.Tensor],
                  keepdim: bool, compute_dtype=None, finish: Callable | None = None) -> list[BufferValue]:
        """A Reduction node over `dims` of `value`.

        finish(body, reduced, count) returns the SSA values to store, one per meta in
        `metas` (default: the reduce result). `count` is the number of reduced elements.
        """
        if value.dtype not in KERNEL_DTYPES:
            raise Unsupported(f"dtype {value.dtype}")
        dims = sorted({dim % max(value.ndim, 1) for dim in dims}) if value.ndim else []
        kept = [dim for dim in range(value.ndim) if dim not in dims]
        broadcast = _broadcast_dims(value, dims, self.graph.buffers) if kind in BROADCAST_EXACT_KINDS else []
        summed = [dim for dim in dims if dim not in broadcast]
        ranges = [value.shape[dim] for dim in kept]
        reduction_ranges = [value.shape[dim] for dim in summed]
        if not reduction_ranges:
            reduction_ranges = [sympy.Integer(1)]
        outs = [self.buffer_for(meta) for meta in metas]
        loop_vars, reduction_vars = range_vars(len(ranges), "i"), range_vars(len(reduction_ranges), "r")
        source_index = [sympy.Integer(0)] * value.ndim  # a broadcast dim reads its one value
        for dim, var in zip(kept, loop_vars):
            source_index[dim] = var
        for dim, var in zip(summed, reduction_vars):
            source_index[dim] = var
        body = Body()
        compute_dtype = compute_dtype or compute_dtype_for(value.dtype)
        loaded = body.to_dtype(value.load(body, source_index), compute_dtype)
        reduce_dtype = torch.int64 if kind in ("argmax", "argmin") else compute_dtype
        reduced = body.emit("reduce", (loaded,), reduce_dtype, attr=kind)
        count = 1
        for size in reduction_ranges:
            count = count * size
        copies = 1
        for dim in broadcast:
            copies *= int(value.shape[dim])
        if kind == "sum" and finish is None and copies != 1:  # n equal terms: one product, one rounding
            reduced = body.emit("mul", (reduced, body.constant(copies, reduce_dtype)), reduce_dtype)
        # `count` is what was summed: a mean over broadcast dims is their one value, exactly
        results = finish(body, reduced, count) if finish else [reduced]
        for out, result in zip(outs, results):
            out_index = []
            kept_iter = iter(loop_vars)
            for dim in range(value.ndim):
                if dim in dims:
                    if keepdim:
                        out_index.append(sympy.Integer(0))
                else:
                    out_index.append(next(kept_iter))
            body.store(out, out_index, body.to_dtype(result, out.dtype))
        self.graph.nodes.append(Reduction(self.new_node_name(), ranges, body, [out.name for out in outs],
                                          reduction_ranges=reduction_ranges))
        return [BufferValue(out) for out in outs]

    def realize(self, value: TensorValue) -> TensorArg:
        """A strided view of a buffer holding `value` (a copy only when no view can express it)."""
        if isinstance(value, BufferValue):
            return TensorArg(value.buffer.name, value.buffer.layout)
        strided = self.as_strided_view(value)
        if strided is not None:
            return strided
        out = self.new_buffer(value.device, value.dtype, Layout(tuple(value.shape), tuple(_contiguous(value.shape))))
        index = range_vars(value.ndim)
        body = Body()
        body.store(out, index, value.load(body, index))
        self.graph.nodes.append(Pointwise(self.new_node_name(), list(value.shape), body, [out.name]))
        return TensorArg(out.name, out.layout)

    def realize_as(self, value: TensorValue, meta: torch.Tensor) -> TensorArg:
        """`value` realized with exactly `meta`'s strides (eager's), for a graph output.

        A view keeps its buffer where its layout already addresses the same elements as
        meta's: strides may differ only in dims of size 1 and in empty tensors, where they
        address nothing else, and there meta's strides are taken. Any other layout (a copy
        of a view that no strided view expresses, a padded product) is copied into a buffer
        laid out as meta. Views of graph inputs always stay views (their layout matches
        eager's view up to those dims), so outputs that alias inputs still alias them.
        """
        arg = self.realize(value)
        wanted = layout_of(meta, with_offset=False)
        size, stride = arg.layout.size, arg.layout.stride
        if tuple(sympy.sympify(s) for s in size) != tuple(wanted.size):
            return arg  # symbolic sizes spelled differently: the realized layout stands
        empty = any(sympy.sympify(extent).is_Integer and int(extent) == 0 for extent in size)
        if all(empty or extent == 1 or sympy.expand(have - want) == 0
               for extent, have, want in zip(size, stride, wanted.stride)):
            if tuple(stride) == tuple(wanted.stride):
                return arg
            return TensorArg(arg.buffer, Layout(tuple(size), tuple(wanted.stride), arg.layout.offset))
        out = self.buffer_for(meta)
        index = range_vars(value.ndim)
        body = Body()
        body.store(out, index, value.load(body, index))
        self.graph.nodes.append(Pointwise(self.new_node_name(), list(value.shape), body, [out.name]))
        return TensorArg(out.name, out.layout)

    def as_strided_view(self, value: TensorValue) -> TensorArg | None:
        """Express a view as (buffer, size, stride, offset) when its index map is affine."""
        base = value
        while isinstance(base, ViewValue):
            base = base.base
        if not isinstance(base, BufferValue):
            return None
        index = range_vars(value.ndim, "v")
        probe = Body()
        value.load(probe, index)
        flat = fold_div_mod(base.buffer.layout.offset_of(probe.ops[0].index))
        if not is_affine(flat, index):
            return None
        coefficients, offset = affine_coefficients(flat, index)
        stride = [0 if size == 1 else coefficient for size, coefficient in zip(value.shape, coefficients)]
        return TensorArg(base.buffer.name, Layout(tuple(value.shape), tuple(sympy.sympify(s) for s in stride),
                                                  sympy.sympify(offset)))

    def extern(self, op, args: tuple, kwargs: dict, meta) -> object:
        """Call the ATen op itself on realized buffers; outputs laid out as their metas."""
        converted_args = _map_values(args, self._extern_arg)
        converted_kwargs = {key: _map_values(value, self._extern_arg) for key, value in kwargs.items()}
        outputs: list[Buffer] = []

        def output_for(item):
            if isinstance(item, torch.Tensor):
                outputs.append(self.new_buffer(item.device, item.dtype, layout_of(item, with_offset=False)))
                return len(outputs) - 1
            if isinstance(item, (list, tuple)):
                return type(item)(output_for(sub) for sub in item)
            if item is None or (isinstance(item, (int, float, bool)) and not isinstance(item, torch.SymInt)):
                return ConstantOutput(item)  # e.g. attention's static max sequence lengths
            if isinstance(item, torch.SymInt) and not _torch.has_unbacked_symbols(item):
                # a size the fake run derived from the inputs' sizes (cuDNN attention's max sequence
                # lengths under dynamic shapes): the same expression as any other symbolic size
                return ConstantOutput(_torch.sym_expr(item))
            what = "a data-dependent SymInt" if isinstance(item, torch.SymInt) else type(item).__name__
            raise Unsupported(f"extern {op} returns {what}")

        structure = output_for(meta)
        node = Extern(self.new_node_name(), op, converted_args, converted_kwargs, [buffer.name for buffer in outputs],
                      structure)
        self.graph.nodes.append(node)

        def rebuild(item):
            if isinstance(item, ConstantOutput):
                return item.value
            if isinstance(item, int) and not isinstance(item, bool):
                return BufferValue(outputs[item])
            if isinstance(item, (list, tuple)):
                return type(item)(rebuild(sub) for sub in item)
            return item

        return rebuild(structure)

    def extern_into(self, op, args: tuple, kwargs: dict, layouts: list, meta) -> object:
        """Call an op's `out=` variant on buffers allocated with `layouts` (e.g. padded rows).

        The wrapper allocates the outputs and passes them as `out=`; the op writes them
        at their strides. One output only (mm, addmm, bmm).
        """
        converted_args = _map_values(args, self._extern_arg)
        converted_kwargs = {key: _map_values(value, self._extern_arg) for key, value in kwargs.items()}
        (layout,) = layouts
        output = self.new_buffer(meta.device, meta.dtype, layout)
        self.graph.nodes.append(Extern(self.new_node_name(), op, converted_args, converted_kwargs, [output.name], 0,
                                       writes_into_outputs=True))
        return BufferValue(output)

    def _extern_arg(self, value):
        if isinstance(value, TensorValue):
            return self.realize(value)
        return value


def _contiguous(shape):
    from kiln.ir.indexing import contiguous_strides

    return contiguous_strides(shape)


def _map_values(value, fn):
    if isinstance(value, (list, tuple)):
        return type(value)(_map_values(item, fn) for item in value)
    return fn(value)


def rounded_scalar(value, dtype: torch.dtype):
    """A Python number rounded to `dtype` (round to nearest even, as eager's conversion), as a Python number."""
    exact_int = not isinstance(value, float) and -2 ** 63 <= value < 2 ** 63
    rounded = torch.tensor(value, dtype=torch.int64 if exact_int else torch.float64).to(dtype)
    return rounded.item()


def check_fill_value(value, dtype: torch.dtype, *, half_floats_checked: bool = True) -> None:
    """Raise Unsupported where eager refuses to convert the number `value` to `dtype` ("value cannot be
    converted to type int8_t without overflow"): the ops that fill with a number (full, fill, scalar_tensor,
    masked_fill, scatter's value, constant padding, clamp's bounds) check it, where arithmetic (`x + 300` on
    int8) wraps. A kernel would store the wrapped number (300 as int8 is 44) or inf; refused, the call runs
    ATen's op, which raises eager's error. c10's rule: a bool takes anything; an integer dtype takes
    [lowest, max], an unsigned one down to -max too (it wraps), and no inf or NaN; a floating dtype takes inf
    and NaN, and finite values in [lowest, max]. scalar_tensor (so where's number branch) does not check
    float16 and bfloat16: `half_floats_checked=False`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or dtype is torch.bool or dtype.is_complex:
        return
    if dtype.is_floating_point:
        if (dtype in LOW_PRECISION and not half_floats_checked) or value != value or value in (math.inf, -math.inf):
            return
        limits = torch.finfo(dtype)
        fits = limits.min <= value <= limits.max
    else:
        limits = torch.iinfo(dtype)
        lowest = -limits.max if limits.min == 0 else limits.min
        fits = value == value and lowest <= value <= limits.max
    if not fits:
        raise Unsupported(f"the number {value!r} does not fit {dtype}: ATen's op runs, and raises as in eager "
                          f"(value cannot be converted without overflow)")


def check_fill_dtype(value_dtype: torch.dtype, dtype: torch.dtype) -> None:
    """`check_fill_value` for a number read from a 0-d tensor of `value_dtype` at run time (masked_fill.Tensor):
    Unsupported unless `dtype` holds every value of `value_dtype` (an int64 sum into int8, a float32 into float16),
    so that ATen's op, which checks the number it reads, runs instead of a kernel that would wrap it."""
    if value_dtype is torch.bool or value_dtype == dtype:
        return
    limits = torch.finfo(value_dtype) if value_dtype.is_floating_point else torch.iinfo(value_dtype)
    for extreme in (limits.min, limits.max):
        check_fill_value(float(extreme) if value_dtype.is_floating_point else int(extreme), dtype)


def _python_scalar(value):
    if isinstance(value, sympy.Basic):
        return value if not value.is_Number else (int(value) if value.is_Integer else float(value))
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, torch.SymInt):
        return _torch.sym_expr(value)
    raise Unsupported(f"scalar operand of type {type(value).__name__}")
