"""Inline pointwise producers into their consumers' bodies (LoopIR -> LoopIR)."""
from __future__ import annotations

import sympy
import torch

from kiln.config import config
from kiln.ir import Body, Extern, Graph, LoopNode, Op, Pointwise, TensorArg, Template, range_vars
from kiln.ir.nodes import EXPENSIVE_OPS, indirect_symbol, indirect_value


def buffer_uses(graph: Graph) -> dict:
    """Buffer name -> list of (user, kind) with kind 'load', 'masked_load', 'extern' or 'output'."""
    uses: dict = {}
    for node in graph.nodes:
        if isinstance(node, Extern):
            for arg in node.tensor_args():
                uses.setdefault(arg.buffer, []).append((node, "extern"))
        else:
            for op in node.body.reads():
                uses.setdefault(op.buffer, []).append((node, "masked_load" if op.operands else "load"))
    for output in graph.outputs:
        if isinstance(output, TensorArg):
            uses.setdefault(output.buffer, []).append((None, "output"))
    return uses



def inline_pointwise(graph: Graph, loop_dependent_ops: frozenset = frozenset()) -> Graph:
    """`loop_dependent_ops`: ops whose value may differ between two loops on this backend; a body
    with one is inlined only where it is read once, so that every use sees the same bits."""
    uses = buffer_uses(graph)
    kept = []
    for node in graph.nodes:
        if isinstance(node, Pointwise) and _can_inline(node, uses.get(node.outputs[0], []), loop_dependent_ops,
                                                       graph.buffers):
            consumers = _unique(user for user, _ in uses[node.outputs[0]])
            new_bodies = {id(consumer): substitute_loads(consumer.body, node) for consumer in consumers}
            if all(len(body.ops) <= config.max_fusion_ops for body in new_bodies.values()):
                for consumer in consumers:
                    _forget_uses(uses, consumer)
                    consumer.body = new_bodies[id(consumer)]
                    _record_uses(uses, consumer)
                _forget_uses(uses, node)
                del graph.buffers[node.outputs[0]]
                continue
        kept.append(node)
    graph.nodes = kept
    return graph


def _forget_uses(uses: dict, node: LoopNode) -> None:
    """Drop `node`'s reads from the use table (its body is about to change, or it is gone)."""
    for op in node.body.reads():
        users = uses.get(op.buffer, [])
        users[:] = [(user, kind) for user, kind in users if user is not node]


def _record_uses(uses: dict, node: LoopNode) -> None:
    for op in node.body.reads():
        uses.setdefault(op.buffer, []).append((node, "masked_load" if op.operands else "load"))


def _unique(items):
    seen, result = set(), []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            result.append(item)
    return result


def _can_inline(node: Pointwise, uses: list, loop_dependent_ops: frozenset, buffers: dict) -> bool:
    if not uses or len(node.outputs) != 1:
        return False
    if any(kind not in ("load", "masked_load") for _, kind in uses):
        return False
    if any(kind == "masked_load" for _, kind in uses) and any(op.name == "check_index" for op in node.body.ops):
        # inlined under a mask, its loads read 0 in masked lanes; an index computed from those
        # (an offset subtracted) could fail its check in a lane whose value nothing uses
        return False
    consumers = _unique(user for user, _ in uses)
    if any(isinstance(consumer, Template) for consumer in consumers):
        return False  # a template reads its operands as strided matrices (kiln/ir/template.py)
    if _recomputes_expensive_work(node, consumers):
        return False
    load_count = len(uses)
    if load_count > 1 and any(op.name in loop_dependent_ops for op in node.body.ops):
        # Each copy runs in its own loop, one perhaps vectorized (libmvec) and one not (libm):
        # layer_norm of a size-1 dim subtracted two atan2 of one element 1 ulp apart.
        return False
    if load_count == 1 or len(consumers) == 1 and load_count <= 2:
        return True
    # Read by several consumers: each recomputes it. Cheap when the body is small and reads
    # little; a body that reads many buffers (a layer norm's output: x, mean, rstd, weight,
    # bias) would make every consumer read them all, and a residual stream inlined layer
    # after layer grows without bound, so it is written to memory once instead. Only reads of
    # buffers as large as the node count: a scalar or a per-row value (nll_loss's backward reads
    # its target, mask and two scalars beside its [rows, vocab] output) stays in cache.
    full_reads = {op.buffer for op in node.body.reads() if not _smaller_than(buffers.get(op.buffer), node.ranges)}
    return len(node.body.ops) <= config.inline_max_ops and len(full_reads) <= config.inline_max_reads


def _smaller_than(buffer, ranges) -> bool:
    """Whether `buffer` provably has fewer elements than a loop over `ranges` (it is read broadcast)."""
    if buffer is None:
        return False
    numel, elements = sympy.sympify(buffer.layout.numel), sympy.sympify(sympy.prod(ranges))  # prod([]) is int 1
    if numel.is_Integer and elements.is_Integer:  # static shapes: no symbolic algebra on the hot path
        return int(numel) < int(elements)
    return bool((numel - elements).is_negative)  # symbolic: only what sympy proves (sizes are positive)


def _recomputes_expensive_work(node: Pointwise, consumers: list) -> bool:
    """Whether inlining would compute an expensive op (EXPENSIVE_OPS) more often than once per
    element: a consumer that iterates over more elements than `node` has reads it broadcast.
    Llama's rotary cos(position * inv_freq), [1, 128, 64], inlined into q and k of every layer
    and head, ran 32 cos per value; written once, it is read instead."""
    if not any(op.name in EXPENSIVE_OPS for op in node.body.ops):
        return False
    produced = sympy.prod(node.ranges)
    if produced == 0:
        return False  # an empty tensor: nothing is computed at all
    for consumer in consumers:
        ratio = sympy.simplify(sympy.prod([*consumer.ranges, *consumer.reduction_ranges]) / produced)
        if ratio.is_number and ratio.is_finite and ratio > 1:
            return True
    return False


def substitute_loads(body: Body, producer: LoopNode) -> Body:
    """`body` with each load of the producer's output replaced by the producer's computation."""
    target = producer.outputs[0]
    loop_vars = range_vars(len(producer.ranges))
    new = Body()
    mapping: dict[int, int] = {}
    for position, op in enumerate(body.ops):
        if op.name == "load" and op.buffer == target:
            # The consumer's index, its `ind<k>` renumbered into `new` first: the producer's loop
            # variables then stand for expressions over `new`'s values only.
            index = [_renumbered(expr, mapping, {}) for expr in op.index]
            mask = mapping[op.operands[0]] if op.operands else None
            value = _copy_producer(new, producer.body, dict(zip(loop_vars, index)), mask)
            if mask is not None:  # a masked load reads 0 where its mask is false: so does its inlined copy
                value = new.emit("where", (mask, value, new.constant(0, op.dtype)), op.dtype)
            mapping[position] = value
        else:
            mapping[position] = copy_op(new, op, mapping, {})
    return new


def _copy_producer(new: Body, producer_body: Body, substitution: dict, mask: int | None = None) -> int:
    """The producer's computation appended to `new`; under `mask` (the consumer's load was masked)
    every load of the producer is masked too, so no lane the consumer leaves out reads memory."""
    local: dict[int, int] = {}
    for position, op in enumerate(producer_body.ops):
        if op.name == "store":
            return local[op.operands[0]]
        if mask is not None and op.name == "load":
            own = [local[operand] for operand in op.operands]
            combined = mask if not own else new.emit("logical_and", (mask, own[0]), torch.bool)
            index = tuple(_renumbered(expr, local, substitution) for expr in op.index)
            new.ops.append(Op("load", (combined,), op.dtype, op.buffer, index, op.attr))
            local[position] = len(new.ops) - 1
            continue
        local[position] = copy_op(new, op, local, substitution)
    raise AssertionError("pointwise body without a store")


def _renumbered(expr, mapping: dict, substitution: dict):
    """`expr` of the body being copied, in the new body: each `ind<k>` (value k of the copied body)
    becomes `ind<mapping[k]>` and each loop variable its `substitution`, in one simultaneous
    replacement, so a substituted expression (which already names the new body's values) is
    never renamed a second time."""
    expr = sympy.sympify(expr)
    renames = {symbol: indirect_symbol(mapping[indirect_value(symbol)]) for symbol in expr.free_symbols
               if indirect_value(symbol) is not None}
    renames.update(substitution)
    return expr.xreplace(renames)


def copy_op(new: Body, op: Op, mapping: dict, substitution: dict) -> int:
    """Append `op` to `new`: operands through `mapping`, indices (and an index_expr's expression,
    which may name gathered values too) through `_renumbered`."""
    index = op.index
    if index is not None:
        index = tuple(_renumbered(expr, mapping, substitution) for expr in index)
    attr = op.attr
    if op.name == "index_expr":
        attr = _renumbered(attr, mapping, substitution)
    new.ops.append(Op(op.name, tuple(mapping[operand] for operand in op.operands), op.dtype, op.buffer, index, attr))
    return len(new.ops) - 1
