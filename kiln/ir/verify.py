"""`verify(graph)`: LoopIR well-formedness, checked at every stage boundary.

Catches a malformed graph at the pass that made it: unknown ops, reads of values or
buffers not yet defined, index arity that does not match the buffer, index variables
outside the node's loops, reductions without exactly one `reduce`, stores to buffers
the node does not own, gathered positions (`ind<k>`) that no `check_index` bounds.
"""
from __future__ import annotations

import sympy

from kiln.ir.indexing import range_vars
from kiln.ir.nodes import ALL_OPS, REDUCTION_KINDS, Extern, Graph, LoopNode, TensorArg, indirect_value


class IRVerificationError(AssertionError):
    pass


def verify(graph: Graph) -> None:
    defined = {graph_input.buffer.name for graph_input in graph.inputs if graph_input.kind == "tensor"}
    defined |= set(graph.constants)
    size_symbols = {graph_input.symbol for graph_input in graph.inputs if graph_input.kind == "symbol"}
    for buffer in graph.buffers.values():
        for expr in (*buffer.layout.size, *buffer.layout.stride, buffer.layout.offset):
            size_symbols |= sympy.sympify(expr).free_symbols
    for node in graph.nodes:
        problems = []
        if isinstance(node, Extern):
            for arg in node.tensor_args():
                if arg.buffer not in defined:
                    problems.append(f"reads {arg.buffer} before it is written")
        else:
            problems = _verify_loop(node, graph, defined, size_symbols)
        if problems:
            raise IRVerificationError(f"{node.name}: " + "; ".join(problems))
        defined |= set(node.outputs)
    for output in graph.outputs:
        if isinstance(output, TensorArg) and output.buffer not in defined:
            raise IRVerificationError(f"output {output.buffer} is never written")



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
        for operand in op.operands:
            if not 0 <= operand < position:
                problems.append(f"{where}: uses %{operand} before it is defined")
        if op.name == "reduce":
            after_reduce = True
            if op.attr not in REDUCTION_KINDS:
                problems.append(f"{where}: unknown reduction {op.attr!r}")
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
                problems.append(f"{where}: unknown buffer {op.buffer}")
                continue
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
