"""Group LoopIR nodes into kernels (greedy, in program order, so no dependency cycles).

A node joins one of the last few kernels (`fusion_window` steps back, never before
a step that writes what it reads) when (1) it iterates the same rows (and columns), (2)
every value it reads from the kernel is the one the kernel holds in registers for the
same row and column (same storage offset after mapping both to kernel variables), and
(3) in a looped reduction kernel, a pointwise value is only read inside its own loop.
"""
from __future__ import annotations

import sympy

from kiln.config import config
from kiln.ir import Extern, Graph, LoopNode, Pointwise, Template
from kiln.ir.indexing import fold_div_mod
from kiln.ir.nodes import indirect_value
from kiln.schedule.inline import buffer_uses
from kiln.schedule.outer import OUTER_PERSISTENT_MAX, is_outer_reduction
from kiln.ir.kernel import Kernel, ScheduledGraph, node_role, nonunit, var_map


# A pointwise node over at most this many elements that reads only graph inputs nothing writes may join a
# kernel of such nodes anywhere before it (group_kernels).
PARAMETER_NODE_MAX_ELEMENTS = 1 << 16


def group_kernels(graph: Graph) -> ScheduledGraph:
    steps: list = []
    produced_at: dict[str, int] = {}  # buffer -> index of the step that writes it
    parameter_node = _parameter_nodes(graph)
    parameter_kernels: list = []  # positions of kernels made of parameter nodes alone
    for node in graph.nodes:
        if isinstance(node, Extern):
            steps.append(node)
            position = len(steps) - 1
        else:
            position = _join_recent_kernel(steps, node, graph, produced_at)
            if position is None and parameter_node(node):
                position = next((earlier for earlier in parameter_kernels if _try_add(steps[earlier], node, graph)),
                                None)
            if position is None:
                steps.append(_new_kernel(f"k{len([s for s in steps if isinstance(s, Kernel)])}", node, graph))
                position = len(steps) - 1
                if parameter_node(node):
                    parameter_kernels.append(position)
            elif position in parameter_kernels and not parameter_node(node):
                parameter_kernels.remove(position)
        for name in node.outputs:
            produced_at[name] = position
    _mark_local_buffers(graph, steps)
    return ScheduledGraph(graph, steps)


def _parameter_nodes(graph: Graph):
    """A predicate: whether a node is a small pointwise one reading only graph inputs that nothing in the graph
    writes (a batch norm's per-channel 1 / sqrt(var + eps) of its buffers). Such a node depends on nothing the
    graph computes, so it may join a kernel of such nodes anywhere before it: spread over a conv net, one per
    batch norm, they were a launch each (ResNet-50: 53 batch norms); together, one per channel count."""
    written = {name for node in graph.nodes for name in node.outputs}
    inputs = {graph_input.buffer.name for graph_input in graph.inputs
              if getattr(graph_input, "buffer", None) is not None} - written

    def parameter_node(node: LoopNode) -> bool:
        if type(node) is not Pointwise:
            return False
        size = sympy.sympify(sympy.prod(node.ranges))  # prod([]) is the int 1
        return size.is_Integer and 0 < int(size) <= PARAMETER_NODE_MAX_ELEMENTS and \
            all(op.buffer in inputs for op in node.body.reads())
    return parameter_node


def _join_recent_kernel(steps: list, node: LoopNode, graph: Graph, produced_at: dict) -> int | None:
    """Add `node` to one of the last few kernels, newest first; its index, or None.

    A node may join a kernel that runs before steps it does not depend on (a weight
    cast that autocast placed after a layer norm's reduction still joins the
    normalization's kernel): it only has to come after every step that writes what
    it reads. The window is short so that hoisting barely extends buffer lifetimes.
    """
    reads = {op.buffer for op in node.body.reads()}
    earliest = max((produced_at[name] for name in reads if name in produced_at), default=0)
    oldest = max(earliest, len(steps) - config.fusion_window)
    for position in range(len(steps) - 1, oldest - 1, -1):
        step = steps[position]
        if isinstance(step, Kernel) and _try_add(step, node, graph):
            return position
    return None


def _columns(node: LoopNode) -> list:
    return nonunit(node.reduction_ranges) or [sympy.Integer(1)]


def _new_kernel(name: str, node: LoopNode, graph: Graph) -> Kernel:
    if isinstance(node, Template):  # rows ([batch,] m) and columns (n) are the product's; its k loop its own
        return Kernel(name, list(node.ranges[:-1]), [node.ranges[-1]], [node], ["template"])
    if node.is_reduction:
        kernel = Kernel(name, nonunit(node.ranges), _columns(node))
        kernel.outer = is_outer_reduction(node, graph.buffers)
        numel = kernel.col_numel
        longest = OUTER_PERSISTENT_MAX if kernel.outer else config.persistent_reduction_max
        kernel.persistent = bool(numel.is_Integer and 0 < int(numel) <= longest)
        role = "reduction"
    else:
        kernel = Kernel(name, nonunit(node.ranges), [])
        role = "full"
    kernel.nodes.append(node)
    kernel.roles.append(role)
    return kernel


def _store_offset(kernel: Kernel, node: LoopNode, role: str, buffer_name: str, graph: Graph):
    mapping = var_map(node, role, kernel.row_ranges, kernel.col_ranges)
    for op in node.body.writes():
        if op.buffer == buffer_name:
            return _offset(graph, buffer_name, op.index, mapping)
    raise AssertionError(f"{node.name} does not store {buffer_name}")


def _offset(graph: Graph, buffer_name: str, index, mapping: dict) -> sympy.Expr:
    """The element offset an access reaches, in kernel variables (div/mod folded where they cancel)."""
    return fold_div_mod(graph.buffers[buffer_name].layout.offset_of([e.xreplace(mapping) for e in index]))


def _try_add(kernel: Kernel, node: LoopNode, graph: Graph) -> bool:
    if isinstance(node, Template):
        return False  # a template starts its own kernel
    role = node_role(node, kernel.row_ranges, kernel.col_ranges)
    if role is None or kernel.op_count() + len(node.body.ops) > config.max_fusion_ops:
        return False
    if kernel.template is not None and (role != "full" or not _reads_kernel_values(kernel, node)):
        return False  # a template's epilogue: pointwise over its tile, reading what the kernel computed
    producers = {name: (producer, producer_role) for producer, producer_role in zip(kernel.nodes, kernel.roles)
                 for name in producer.outputs}
    mapping = var_map(node, role, kernel.row_ranges, kernel.col_ranges)
    for op in node.body.reads():
        if op.buffer not in producers:
            continue
        producer, producer_role = producers[op.buffer]
        if op.operands or any(indirect_value(s) is not None for e in op.index for s in sympy.sympify(e).free_symbols):
            return False  # masked or gathered reads go through memory
        offset = _offset(graph, op.buffer, op.index, mapping)
        if sympy.expand(offset - _store_offset(kernel, producer, producer_role, op.buffer, graph)) != 0:
            return False
        if producer_role == "full" and role in ("reduction", "row") and not kernel.persistent:
            return False
        if producer_role == "full" and role == "full" and not kernel.persistent:
            later = kernel.roles[kernel.nodes.index(producer) + 1:]
            if "reduction" in later:
                return False
    kernel.nodes.append(node)
    kernel.roles.append(role)
    return True


def _reads_kernel_values(kernel: Kernel, node: LoopNode) -> bool:
    written = {name for member in kernel.nodes for name in member.outputs}
    return any(op.buffer in written for op in node.body.reads())


def _mark_local_buffers(graph: Graph, steps: list) -> None:
    uses = buffer_uses(graph)
    for step in steps:
        if not isinstance(step, Kernel):
            continue
        members = {id(node) for node in step.nodes}
        for node in step.nodes:
            for name in node.outputs:
                users = uses.get(name, [])
                if users and all(user is not None and id(user) in members for user, _ in users):
                    step.local_buffers.add(name)
