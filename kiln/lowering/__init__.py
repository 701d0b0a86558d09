"""kiln/lowering: functional ATen FX graph -> LoopIR graph.

`lower_graph(gm, example_inputs)` walks the ATen graph once. Each call_function node
goes through its rule in the lowering table (registry.py; the rules live in one
module per op family), or becomes an `Extern` call of the ATen op when there is no
rule or the rule declines (`Unsupported`). Views produce no nodes: they remap indices.

Before it, `apply_patterns(gm)` (patterns.py) rewrites a product and the elementwise consumer
oneDNN applies as it stores into one fused call, whose rule is in matmul.py.
"""
from __future__ import annotations

import operator

import sympy
import torch

from kiln import _torch
from kiln.ir import FloorDiv, Graph, GraphInput, TensorArg
# imported to register their rules
from kiln.lowering import (creation, effects, indexing, matmul, pointwise, pooling, random,  # noqa: F401
                            reductions, scatters, views)
from kiln.lowering.context import (BufferValue, LoweringContext, TensorValue, Unsupported, layout_of,
                                   meta_of)
from kiln.lowering.patterns import apply_patterns  # noqa: F401  (run on the ATen graph before lower_graph)


def lower_graph(gm: torch.fx.GraphModule, example_inputs) -> Graph:
    """The LoopIR graph of `gm`. kiln/backend.py verifies it (`_check("lower", graph)`)."""
    graph = Graph()
    ctx = LoweringContext(graph)
    values = ctx.values
    for fx_node in gm.graph.nodes:
        if fx_node.op == "placeholder":
            values[fx_node] = _lower_placeholder(ctx, fx_node)
        elif fx_node.op == "get_attr":
            values[fx_node] = _lower_constant(ctx, fx_node, getattr(gm, fx_node.target))
        elif fx_node.op == "call_function":
            values[fx_node] = _lower_call(ctx, fx_node, values)
        elif fx_node.op == "output":
            outputs = fx_node.args[0]
            graph.outputs = [_lower_output(ctx, _lookup(values, item), item) for item in outputs]
        else:
            raise Unsupported(f"FX node kind {fx_node.op}")
    graph.lowered_ops, graph.extern_ops = ctx.lowered_ops, ctx.extern_ops
    return graph


def _lower_placeholder(ctx: LoweringContext, fx_node):
    meta = fx_node.meta.get("val")
    if isinstance(meta, torch.Tensor):
        buffer = ctx.new_buffer(meta.device, meta.dtype, layout_of(meta, with_offset=False), prefix="arg")
        ctx.graph.inputs.append(GraphInput("tensor", fx_node.name, buffer=buffer))
        return BufferValue(buffer)
    if isinstance(meta, torch.SymInt):
        expr = _torch.sym_expr(meta)
        ctx.graph.inputs.append(GraphInput("symbol", fx_node.name, symbol=expr if expr.is_Symbol else None))
        return expr
    ctx.graph.inputs.append(GraphInput("other", fx_node.name))
    return meta


def _lower_constant(ctx: LoweringContext, fx_node, tensor):
    if not isinstance(tensor, torch.Tensor):
        return tensor
    buffer = ctx.new_buffer(tensor.device, tensor.dtype, layout_of(tensor, with_offset=False), prefix="const")
    ctx.graph.constants[buffer.name] = tensor
    return BufferValue(buffer)


def _lookup(values, item):
    if isinstance(item, torch.fx.Node):
        return values[item]
    if isinstance(item, (list, tuple)):
        return type(item)(_lookup(values, sub) for sub in item)
    if isinstance(item, dict):
        return {key: _lookup(values, sub) for key, sub in item.items()}
    return item


def _lower_call(ctx: LoweringContext, fx_node, values):
    target = fx_node.target
    args = _lookup(values, fx_node.args)
    kwargs = _lookup(values, dict(fx_node.kwargs))
    if target is operator.getitem:
        return args[0][args[1]]
    if target in _SYMBOLIC_OPS:
        return _SYMBOLIC_OPS[target](*args)
    return ctx.lower_op(fx_node, args, kwargs)


def _lower_output(ctx: LoweringContext, value, fx_item):
    if isinstance(value, TensorValue):
        meta = fx_item.meta.get("val") if isinstance(fx_item, torch.fx.Node) else None
        if isinstance(meta, torch.Tensor):
            return ctx.realize_as(value, meta)  # eager's strides: code downstream may depend on them
        return ctx.realize(value)
    if isinstance(value, torch.SymInt):
        return _torch.sym_expr(value)
    return value


def _sym_size(tensor, dim):
    return tensor.shape[dim]


def _sym_stride(tensor, dim):
    arg = None
    if isinstance(tensor, BufferValue):
        arg = TensorArg(tensor.buffer.name, tensor.buffer.layout)
    if arg is None:
        raise Unsupported("stride of a view")
    return arg.layout.stride[dim]


def _sym_numel(tensor):
    result = sympy.Integer(1)
    for size in tensor.shape:
        result = result * size
    return result


_SYMBOLIC_OPS = {
    _torch.aten.sym_size.int: _sym_size,
    _torch.aten.sym_stride.int: _sym_stride,
    _torch.aten.sym_numel.default: _sym_numel,
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.floordiv: FloorDiv,
}
