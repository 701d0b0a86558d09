"""Pattern rewrites over the ATen graph, run at the start of lowering: a product and its
elementwise consumer become one call of a fused op.

fp32 CPU products run on oneDNN's linear (lowering/matmul.py), which can apply one elementwise
op to the product's values as it stores them (a post-op), so no kernel reads the product back.
`POST_OP_PATTERNS` lists the consumers it applies, one row each. `apply_patterns(gm)` finds every
product whose only consumer (through reshapes) is one of them, under the conditions of
`_match_post_op`, and rewrites product, reshapes and consumer into one node calling
`linear_unary` or `linear_binary`. Those are plain functions whose eager meaning is the unfused
computation (the same ATen ops), so the rewritten graph prints and runs; the lowering rule for
them (lowering/matmul.py) emits the one oneDNN call.

The pass sees the graph, not the buffers: the conditions on layouts (a row-major x, a dense
`other`, a unit-stride bias) are checked by that rule on the lowered operands, and where they
fail it lowers the replaced nodes one by one (`ReplacedNode`), as if no pattern had matched.

Not relu: oneDNN's relu post-op makes NaN 0, where eager's relu keeps it (fuzz seed 3013 #9071,
#9842). Its gelu and swish keep NaN and infinities as eager's do.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from kiln import _torch
from kiln.codegen.templates import templates_forced
from kiln.config import config

aten = _torch.aten

PRODUCTS = (aten.mm.default, aten.addmm.default)
RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
REPLACED_NODES = "kiln_replaced_nodes"  # fused node's meta key: the ReplacedNodes it stands for


@dataclass(frozen=True)
class PostOpPattern:
    """One row: an elementwise consumer of a product that oneDNN's linear applies as it stores."""

    consumer: object  # the ATen op
    onednn_attr: str  # oneDNN's name for it (`attr` of mkldnn::_linear_pointwise)
    binary: bool  # whether it takes a second tensor (`product * other`: the `.binary` variant)
    algorithm_kwarg: str | None = None  # the consumer's kwarg that is oneDNN's `algorithm`

    def algorithm(self, consumer_kwargs: dict) -> str:
        """oneDNN's `algorithm` argument for a call of the consumer with these kwargs."""
        return consumer_kwargs.get(self.algorithm_kwarg, "none") if self.algorithm_kwarg else ""


POST_OP_PATTERNS = (
    PostOpPattern(aten.gelu.default, "gelu", binary=False, algorithm_kwarg="approximate"),  # exact or tanh
    PostOpPattern(aten.silu.default, "swish", binary=False),
    PostOpPattern(aten.mul.Tensor, "mul", binary=True),  # Llama's silu(gate) * up
)
PATTERN_OF_CONSUMER = {pattern.consumer: pattern for pattern in POST_OP_PATTERNS}


@dataclass(frozen=True)
class ReplacedNode:
    """What a lowering rule reads of an FX node a pattern replaced: its op and its meta (the fake result)."""

    target: object
    meta: dict


@dataclass(frozen=True)
class PostOpMatch:
    """A product, its single-use reshapes and the consumer oneDNN applies, in graph order."""

    product: torch.fx.Node
    reshapes: tuple
    consumer: torch.fx.Node
    pattern: PostOpPattern

    @property
    def nodes(self) -> tuple:
        return (self.product, *self.reshapes, self.consumer)


def _product_value(product_op, bias, a, b):
    return product_op(a, b) if bias is None else product_op(bias, a, b)


def _reshaped(value, reshapes):
    for reshape_op, shape in reshapes:
        value = reshape_op(value, shape)
    return value


def linear_unary(product_op, bias, a, b, reshapes, consumer_op, consumer_kwargs):
    """`consumer_op(product, **consumer_kwargs)` of the product `a @ b` (+ bias: addmm) after its
    reshapes ((op, shape) pairs): oneDNN's linear with a unary post-op (gelu, silu)."""
    return consumer_op(_reshaped(_product_value(product_op, bias, a, b), reshapes), **consumer_kwargs)


def linear_binary(product_op, bias, a, b, reshapes, consumer_op, other, product_first):
    """`consumer_op(product, other)` (or `(other, product)` when not product_first) of the product
    `a @ b` (+ bias: addmm) after its reshapes: oneDNN's linear with a binary post-op (mul)."""
    product = _reshaped(_product_value(product_op, bias, a, b), reshapes)
    return consumer_op(product, other) if product_first else consumer_op(other, product)


FUSED_OPS = (linear_unary, linear_binary)


def apply_patterns(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` itself when no pattern matches; otherwise a copy (gm stays as it is: it is the eager
    fallback) with each match rewritten into one fused call at the product's place."""
    matches = find_post_op_matches(gm.graph)
    if not matches:
        return gm
    graph = torch.fx.Graph()
    copies: dict = {}
    output = graph.graph_copy(gm.graph, copies)
    graph.output(output)
    graph.output_node().meta = copy.copy(gm.graph.output_node().meta)
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    for match in matches:
        _rewrite(graph, PostOpMatch(copies[match.product], tuple(copies[node] for node in match.reshapes),
                                    copies[match.consumer], match.pattern))
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


def find_post_op_matches(graph: torch.fx.Graph) -> list[PostOpMatch]:
    """Every product whose consumer oneDNN applies as its post-op, in graph order (no two share a node)."""
    position = {node: index for index, node in enumerate(graph.nodes)}
    matches, claimed = [], set()
    for node in graph.nodes:
        match = _match_post_op(node, position)
        if match is not None and not claimed & set(match.nodes):
            matches.append(match)
            claimed |= set(match.nodes)
    return matches


def _shape(meta) -> list:
    """A fake tensor's sizes as sympy expressions (compared without guarding on SymInts)."""
    return [_torch.sym_expr(size) for size in meta.shape]


def _static_positive(size, minimum: int) -> bool:
    expr = _torch.sym_expr(size)
    return expr.is_Integer and int(expr) >= minimum


def _is_float32_tensor(meta) -> bool:
    return isinstance(meta, torch.Tensor) and meta.dtype == torch.float32


def _match_post_op(product, position: dict) -> PostOpMatch | None:
    """The match starting at `product`, or None. The conditions, all of them:

    - post-ops on (config.cpu_gemm_post_ops), products on oneDNN (config.cpu_gemm='onednn')
      and this torch has oneDNN's linear;
    - the product is aten.mm, or aten.addmm with beta = alpha = 1 and a 1-d bias of N elements;
      its result is a 2-d float32 CPU tensor, with K > 1 and N > 0 static (the op rejects K = 0);
    - the product reaches its consumer through single-use reshapes (view, _unsafe_view,
      reshape), whose sizes are defined before the product, and that consumer is its only use;
    - the consumer's result is float32 and of the product's (reshaped) size;
    - gelu / silu: the product is its only positional argument;
    - mul: no kwargs, the product is one of its two arguments, this torch has the `.binary`
      variant, and the other is a float32 tensor of the result's size defined before the product.
    """
    if product.op != "call_function" or product.target not in PRODUCTS:
        return None
    if not config.cpu_gemm_post_ops or config.cpu_gemm != "onednn" or _torch.onednn_linear() is None:
        return None
    meta = product.meta.get("val")
    if not _is_float32_tensor(meta) or meta.device.type != "cpu" or meta.dim() != 2 or templates_forced("cpu"):
        return None
    if product.target == aten.addmm.default:
        if product.kwargs.get("beta", 1) != 1 or product.kwargs.get("alpha", 1) != 1:
            return None
        bias, b = product.args[0].meta.get("val"), product.args[2].meta.get("val")
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or _shape(bias)[0] != _shape(meta)[1]:
            return None
    else:
        b = product.args[1].meta.get("val")
    inner, columns = b.shape
    if not (_static_positive(inner, 2) and _static_positive(columns, 1)):
        return None
    end, reshapes = product, []
    while len(end.users) == 1:
        (user,) = end.users
        if user.target not in RESHAPES or user.args[0] is not end:
            break
        if any(position[size] > position[product] for size in user.all_input_nodes if size is not end):
            return None  # the fused call stands where the product does: its sizes must be defined there
        end = user
        reshapes.append(user)
    if len(end.users) != 1:
        return None
    (consumer,) = end.users
    result, end_meta = consumer.meta.get("val"), end.meta.get("val")
    if not _is_float32_tensor(result) or not isinstance(end_meta, torch.Tensor) or _shape(result) != _shape(end_meta):
        return None
    pattern = PATTERN_OF_CONSUMER.get(consumer.target) if consumer.op == "call_function" else None
    if pattern is None:
        return None
    if not pattern.binary:
        if consumer.args[0] is not end or len(consumer.args) != 1:
            return None
        return PostOpMatch(product, tuple(reshapes), consumer, pattern)
    if consumer.kwargs or len(consumer.args) != 2 or list(consumer.args).count(end) != 1 or \
            _torch.onednn_linear_binary() is None:
        return None
    other = consumer.args[1] if consumer.args[0] is end else consumer.args[0]
    if not isinstance(other, torch.fx.Node) or position[other] > position[product]:
        return None
    other_meta = other.meta.get("val")
    if not _is_float32_tensor(other_meta) or _shape(other_meta) != _shape(result):
        return None
    return PostOpMatch(product, tuple(reshapes), consumer, pattern)


def _rewrite(graph: torch.fx.Graph, match: PostOpMatch) -> None:
    """Replace the match's nodes by one call of its fused op, placed where the product is."""
    product, consumer = match.product, match.consumer
    if product.target == aten.addmm.default:
        bias, a, b = product.args[:3]
    else:
        (a, b), bias = product.args[:2], None
    reshapes = tuple((node.target, node.args[1]) for node in match.reshapes)
    end = match.reshapes[-1] if match.reshapes else product
    head = (product.target, bias, a, b, reshapes, consumer.target)
    if match.pattern.binary:
        product_first = consumer.args[0] is end
        args = (*head, consumer.args[1] if product_first else consumer.args[0], product_first)
        fused_op = linear_binary
    else:
        args, fused_op = (*head, dict(consumer.kwargs)), linear_unary
    with graph.inserting_before(product):
        fused = graph.call_function(fused_op, args)
    fused.meta = dict(consumer.meta)
    fused.meta[REPLACED_NODES] = tuple(ReplacedNode(node.target, dict(node.meta)) for node in match.nodes)
    consumer.replace_all_uses_with(fused)
    for node in reversed(match.nodes):
        graph.erase_node(node)
