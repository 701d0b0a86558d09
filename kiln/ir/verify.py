"""`verify(graph)`: LoopIR well-formedness, checked at every stage boundary.

Catches a malformed graph at the pass that made it: unknown ops, operand counts and dtypes that
break the op's rule, reads of values or buffers not yet defined, index arity that does not match
the buffer, index variables outside the node's loops, reductions without exactly one `reduce`,
stores to buffers the node does not own, gathered positions (`ind<k>`) that no `check_index` bounds.

The op rules (arity, operand and result dtypes) are not written here: they are the op table's
rows and specs (kiln/ir/ops.py `operand_counts`, `dtype_problems`). The scheduled form has its own
checks on top of these (kiln/schedule/verify.py).
"""
from __future__ import annotations

import sympy

from kiln.ir.indexing import range_vars
from kiln.ir.nodes import ALL_OPS, Extern, Graph, LoopNode, TensorArg, Template, indirect_value
from kiln.ir.ops import dtype_problems, operand_counts
from kiln.ir.template import template_parts


class IRVerificationError(AssertionError):
    """A malformed graph: the message names the stage, the node, the op and every problem found."""


def verify(graph: Graph, stage: str | None = None) -> None:
    """Check `graph` (its nodes in order); raise IRVerificationError naming `stage` on a problem."""
    defined = defined_at_entry(graph)
    symbols = size_symbols(graph)
    for node in graph.nodes:
        check_node(node, graph, defined, symbols, stage)
        defined |= set(node.outputs)
    check_outputs(graph, defined, stage)


def defined_at_entry(graph: Graph) -> set:
    """The buffers that hold values before any node runs: tensor inputs and constants."""
    defined = {graph_input.buffer.name for graph_input in graph.inputs if graph_input.kind == "tensor"}
    return defined | set(graph.constants)


def size_symbols(graph: Graph) -> set:
    """The symbols a size or an index may use: size inputs and the symbols of buffer layouts."""
    symbols = {graph_input.symbol for graph_input in graph.inputs if graph_input.kind == "symbol"}
    for buffer in graph.buffers.values():
        for expr in (*buffer.layout.size, *buffer.layout.stride, buffer.layout.offset):
            symbols |= sympy.sympify(expr).free_symbols
    return symbols


def check_node(node, graph: Graph, defined: set, symbols: set, stage: str | None = None) -> None:
    """Check one node given the buffers `defined` before it runs; raise on a problem."""
    if isinstance(node, Extern):
        problems = [f"reads {arg.buffer} before it is written" for arg in node.tensor_args()
                    if arg.buffer not in defined]
    else:
        problems = _verify_loop(node, graph, defined, symbols)
        if isinstance(node, Template) and not problems:
            try:
                template_parts(node, graph)
            except ValueError as error:
                problems.append(f"not a {node.kind} template: {error}")
    if problems:
        raise IRVerificationError(_located(stage, f"{node.name}: " + "; ".join(problems)))


def check_outputs(graph: Graph, defined: set, stage: str | None = None) -> None:
    for output in graph.outputs:
        if isinstance(output, TensorArg) and output.buffer not in defined:
            raise IRVerificationError(_located(stage, f"output {output.buffer} is never written"))


def _located(stage: str | None, message: str) -> str:
    return message if stage is None else f"after {stage}: {message}"


def _verify_loop(node: LoopNode, graph: Graph, defined: set, size_symbols: set) -> list[str]:
    problems = []
    loop_vars = set(range_vars(len(node.ranges), "i"))
    reduction_vars = set(range_vars(len(node.reduction_ranges), "r"))
    allowed = loop_vars | reduction_vars | size_symbols
    reduces = [op for op in node.body.ops if op.name == "reduce"]
    if node.reduction_ranges and len(reduces) != 1:
        problems.append(f"has reduction ranges and {len(reduces)} reduce ops (needs exactly 1)")
    if not node.reduction_ranges and reduces:
        problems.append("has a reduce op but no reduction ranges")
    after_reduce = False
    for position, op in enumerate(node.body.ops):
        where = f"%{position} {op.name}"
        if op.name not in ALL_OPS:
            problems.append(f"{where}: unknown op")
            continue
        problems += [f"{where}: {problem}" for problem in _op_rule_problems(node, graph, position)]
        if op.name == "reduce":
            after_reduce = True
        exprs = list(op.index or ())
        if op.name in ("index_expr", "check_index"):
            exprs.append(op.attr)
        for expr in exprs:
            extra = {symbol for symbol in sympy.sympify(expr).free_symbols - allowed
                     if not (indirect_value(symbol) is not None and indirect_value(symbol) < position)}
            if extra:
                problems.append(f"{where}: index uses {sorted(map(str, extra))} outside the node's loops")
            # Every gathered position passes the one bounds rule: an `ind<k>` names a check_index
            # value (which also catches an SSA number left stale when one body is inlined into another).
            unchecked = sorted(str(symbol) for symbol in sympy.sympify(expr).free_symbols
                               if indirect_value(symbol) is not None and indirect_value(symbol) < position
                               and node.body.ops[indirect_value(symbol)].name != "check_index")
            if unchecked:
                problems.append(f"{where}: index uses {unchecked}, values no check_index bounds")
            if op.name == "check_index" and sympy.sympify(expr).free_symbols - size_symbols:
                problems.append(f"{where}: checks against a size that is not a size expression")
            if after_reduce and sympy.sympify(expr).free_symbols & reduction_vars:
                problems.append(f"{where}: after the reduce but indexes reduction variables")
        if op.name in ("load", "store"):
            buffer = graph.buffers.get(op.buffer)
            if buffer is None:
                continue  # reported by the op rule
            if len(op.index) != len(buffer.layout.size):
                problems.append(f"{where}: {len(op.index)}-d index into {len(buffer.layout.size)}-d {op.buffer}")
            if op.name == "load" and op.buffer not in defined:
                problems.append(f"{where}: reads {op.buffer} before it is written")
            if op.name == "store" and op.buffer not in node.outputs:
                problems.append(f"{where}: stores to {op.buffer}, not one of its outputs")
    stored = {op.buffer for op in node.body.ops if op.name == "store"}
    if stored != set(node.outputs):
        problems.append(f"stores {sorted(stored)} but declares outputs {node.outputs}")
    return problems


def _op_rule_problems(node: LoopNode, graph: Graph, position: int) -> list[str]:
    """Op `position`'s operand count and dtypes against the op table (kiln/ir/ops.py)."""
    ops = node.body.ops
    op = ops[position]
    counts = operand_counts(op.name)
    if len(op.operands) not in counts:
        return [f"{len(op.operands)} operands, {op.name} takes {' or '.join(map(str, counts))}"]
    if not all(0 <= operand < position for operand in op.operands):
        return [f"uses %{operand} before it is defined" for operand in op.operands if not 0 <= operand < position]
    buffer_dtype = None
    if op.name in ("load", "store"):
        if op.buffer not in graph.buffers:
            return [f"unknown buffer {op.buffer}"]
        buffer_dtype = graph.buffers[op.buffer].dtype
    if op.name == "getitem" and not (ops[op.operands[0]].name == "reduce" and ops[op.operands[0]].attr == "welford"):
        return [f"takes %{op.operands[0]}, not a welford reduce"]
    return dtype_problems(op, [ops[operand].dtype for operand in op.operands], buffer_dtype)
