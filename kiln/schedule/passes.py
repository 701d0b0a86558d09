"""LoopIR -> LoopIR passes on the scheduled kernels, for every backend (kiln/schedule owns them).

    optimize(scheduled) = annotate_loop_variables(eliminate_common_subexpressions(reduce_strength(
                              order_loops(scheduled))))

A rewriting pass rewrites the body of every node of every kernel and returns a new
`ScheduledGraph` (the input is not changed); a body the pass leaves alone is kept as it is, op numbers included,
so its kernel text does not change. `optimize` lists the passes in order (PASSES); under
KILN_DEBUG each one's result is dumped as `loopir_after_<pass>.txt` and timed as its own stage.

- `order_loops` (loop_order.py): each pointwise kernel walks its rows in its first output's memory
  order (`Kernel.row_order`), so that neighbouring lanes touch neighbouring elements of a permuted
  (channels-last, transposed) output.
- `reduce_strength`: a floating pow by the constant 2 or 3 becomes multiplies, x * x and
  (x * x) * x, which is what ATen's pow(tensor, scalar) computes for those exponents on CPU and
  CUDA alike. The lowering of aten.pow.Tensor_Scalar already emits that arithmetic
  (kiln/lowering/pointwise.py POW_BY_ARITHMETIC, with eager's fp16/bf16 rounding of the square);
  this pass catches the pows whose exponent only becomes a constant in the body (a pow by a
  0-d tensor made by `torch.full`, inlined into its consumer).
- `eliminate_common_subexpressions`: within one body, an op equal to an earlier one (same name,
  dtype, buffer, index, attribute and operands) is replaced by it. Never merged: stores and
  reduces (they act), loads of a buffer this node or a later node of the kernel writes (the value
  read may depend on where the load sits; one an earlier node wrote is read after that store
  wherever it sits), and ops on either side of a reduce (the values before it live inside
  the column loop, those after it outside: kiln/codegen/triton.py's looped reduction).

- `annotate_loop_variables`: an analysis, last: each op of each kernel gets the kernel loop
  variables (`x*`, `r*`) its value depends on (`Kernel.op_loop_variables`, printed `@ x0 r0`,
  `@ -` for a value no loop changes). Loop-invariant code motion reads it: the C++ backend
  defines each value in the outermost loop none of its variables belongs to (codegen/cpp.py
  `_level`). Triton kernels are straight-line code over tiles; the one loop they have (a looped
  reduction's) is left to LLVM's LICM.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import sympy
import torch

from kiln.ir.nodes import Body, Op, Template, indirect_symbol, indirect_value
from kiln.ir.kernel import Kernel, ScheduledGraph, loop_variables
from kiln.schedule.loop_order import order_loops

# Ops that act, rather than compute a value from their operands: never merged.
_NOT_MERGED = frozenset({"store", "reduce"})
# pow(x, constant) that ATen computes by multiplying (pow_tensor_scalar_optimized_kernel on CPU,
# pow_tensor_scalar_kernel_impl on CUDA): exponent -> number of factors of x.
_POW_FACTORS = {2.0: 2, 3.0: 3}
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def reduce_strength(scheduled: ScheduledGraph) -> ScheduledGraph:
    """Floating pow(x, 2) and pow(x, 3) by a constant exponent as products of x (see the module doc).

    An fp16/bf16 pow (the lowering never makes one: math runs in fp32) multiplies in float32 and
    rounds once, as the C++ backend did before this pass."""
    return _map_bodies(scheduled, lambda kernel, position, body: _reduce_strength(body))


def eliminate_common_subexpressions(scheduled: ScheduledGraph) -> ScheduledGraph:
    """Each value computed once per body: later copies of an op are replaced by the first one."""
    def run(kernel: Kernel, position: int, body: Body) -> Body:
        # this node's own outputs and later nodes': a load of them may see a value stored after it
        written = {name for node in kernel.nodes[position:] for name in node.outputs}
        return _eliminate_common_subexpressions(body, written)
    return _map_bodies(scheduled, run)


def annotate_loop_variables(scheduled: ScheduledGraph) -> ScheduledGraph:
    """Each kernel with `op_loop_variables`: per node, per op, the loop variables its value depends on."""
    steps = [dataclasses.replace(step, op_loop_variables=loop_variables(step)) if isinstance(step, Kernel) else step
             for step in scheduled.steps]
    return ScheduledGraph(scheduled.graph, steps)


# The pipeline, in order: (name, pass). The names key the dump files and the timings.
PASSES: tuple = (
    ("loop_order", order_loops),
    ("reduce_strength", reduce_strength),
    ("cse", eliminate_common_subexpressions),
    ("loop_variables", annotate_loop_variables),
)


def optimize(scheduled: ScheduledGraph, dump=None) -> ScheduledGraph:
    """Run PASSES in order. `dump` (a kiln.debug GraphDump, optional) times each pass as a stage
    and receives its result as `loopir_after_<name>.txt`."""
    for name, run_pass in PASSES:
        if dump is None:
            scheduled = run_pass(scheduled)
            continue
        with dump.stage(name):
            scheduled = run_pass(scheduled)
        dump.write(f"loopir_after_{name}.txt", scheduled.format)
    return scheduled


# ---- helpers ---------------------------------------------------------------------------------
def _map_bodies(scheduled: ScheduledGraph, rewrite: Callable) -> ScheduledGraph:
    """A copy of `scheduled` with every kernel node's body replaced by `rewrite(kernel, position, body)`;
    its graph lists the rewritten nodes in place of the old ones (verify_scheduled checks that every
    node of the graph runs in one step)."""
    steps, replaced = [], {}
    for step in scheduled.steps:
        if isinstance(step, Kernel):
            nodes = []
            for position, node in enumerate(step.nodes):
                # a template's body is its operands' addressing, which its backend reads as it is
                body = node.body if isinstance(node, Template) else rewrite(step, position, node.body)
                if body is not node.body:
                    replaced[id(node)] = dataclasses.replace(node, body=body)
                nodes.append(replaced.get(id(node), node))
            step = dataclasses.replace(step, nodes=nodes, roles=list(step.roles), local_buffers=set(step.local_buffers),
                                       op_loop_variables=[])  # an annotation of the old bodies
        steps.append(step)
    graph = scheduled.graph
    if replaced:
        graph = copy.copy(graph)  # a shallow copy keeps what lowering recorded on it (lowered_ops, extern_ops)
        graph.nodes = [replaced.get(id(node), node) for node in graph.nodes]
    return ScheduledGraph(graph, steps)


def _renumbered(op: Op, new_ids: dict) -> Op:
    """`op` with its operands and the `ind<k>` symbols of its index and attribute renumbered."""
    def renumber(expr):
        expr = sympy.sympify(expr)
        used = {symbol for symbol in expr.free_symbols if indirect_value(symbol) is not None}
        return expr.xreplace({symbol: indirect_symbol(new_ids[indirect_value(symbol)]) for symbol in used})

    index = None if op.index is None else tuple(renumber(expr) for expr in op.index)
    attr = renumber(op.attr) if isinstance(op.attr, sympy.Basic) else op.attr
    return dataclasses.replace(op, operands=tuple(new_ids[operand] for operand in op.operands), index=index,
                               attr=attr)


def _attr_key(attr):
    """The attribute as a key: by its repr and type, so 0.0 and -0.0, 1 and 1.0 and True stay apart."""
    if isinstance(attr, sympy.Basic):
        return ("sympy", attr)
    return (type(attr).__name__, repr(attr))


def _eliminate_common_subexpressions(body: Body, written: set) -> Body:
    first: dict = {}  # key -> new id of the op computing it
    new_ids: dict = {}  # old id -> new id
    ops: list = []
    segment = 0  # reduces seen so far: ops are merged only within one segment
    for old_id, op in enumerate(body.ops):
        op = _renumbered(op, new_ids)
        mergeable = op.name not in _NOT_MERGED and not (op.name == "load" and op.buffer in written)
        key = (segment, op.name, op.dtype, op.buffer, op.index, _attr_key(op.attr), op.operands)
        if mergeable and key in first:
            new_ids[old_id] = first[key]
            continue
        new_ids[old_id] = len(ops)
        if mergeable:
            first[key] = len(ops)
        ops.append(op)
        if op.name == "reduce":
            segment += 1
    return body if len(ops) == len(body.ops) else Body(ops)


def _pow_factors(body: Body, op: Op) -> int | None:
    """How many factors of its base a floating pow by a constant 2 or 3 multiplies; None otherwise."""
    if op.name != "pow" or op.dtype is None or not op.dtype.is_floating_point:
        return None
    exponent = body.ops[op.operands[1]]
    if exponent.name != "constant" or isinstance(exponent.attr, bool):
        return None
    try:
        value = float(exponent.attr)
    except (TypeError, ValueError):
        return None
    return _POW_FACTORS.get(value)


def _reduce_strength(body: Body) -> Body:
    factors = {old_id: count for old_id, op in enumerate(body.ops)
               if (count := _pow_factors(body, op)) is not None}
    if not factors:
        return body
    # Exponent constants no op but a rewritten pow uses are dropped with it.
    uses: dict = {}
    for old_id, op in enumerate(body.ops):
        used = list(op.operands[:1]) if old_id in factors else list(op.operands)
        for expr in (op.index or ()):
            used += [indirect_value(symbol) for symbol in sympy.sympify(expr).free_symbols
                     if indirect_value(symbol) is not None]
        for operand in used:
            uses[operand] = uses.get(operand, 0) + 1
    dropped = {body.ops[old_id].operands[1] for old_id in factors} - set(uses)
    result = Body()
    new_ids: dict = {}
    for old_id, op in enumerate(body.ops):
        if old_id in dropped:
            continue
        if old_id not in factors:
            new_ids[old_id] = len(result.ops)
            result.ops.append(_renumbered(op, new_ids))
            continue
        base, dtype = new_ids[op.operands[0]], op.dtype
        if dtype in _LOW_PRECISION:
            base = result.emit("to_dtype", (base,), torch.float32)
        product = base
        for _ in range(factors[old_id] - 1):
            product = result.emit("mul", (product, base), torch.float32 if dtype in _LOW_PRECISION else dtype)
        if dtype in _LOW_PRECISION:
            product = result.emit("to_dtype", (product,), dtype)
        new_ids[old_id] = product
    return result
