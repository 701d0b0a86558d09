"""A kernel: LoopIR nodes that run in one launch over shared rows (and columns).

Every node of a kernel sees the kernel's row index space (`row_ranges`) and, for a
reduction kernel, its column space (`col_ranges`, the reduced dims). A node plays one
role: "reduction" (ranges = rows, reduction ranges = columns), "full" (pointwise over
rows x columns) or "row" (pointwise over rows only, e.g. rsqrt(var + eps)).
`var_map` rewrites a node's own index variables into the kernel's (`x*`, `r*`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from kiln.ir import Extern, LoopNode, range_vars
from kiln.ir.indexing import index_var, product
from kiln.ir.printer import format_body, format_node


def nonunit(sizes) -> list:
    return [size for size in sizes if size != 1]


def same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(sympy.expand(x - y) == 0 for x, y in zip(a, b))


def node_role(node: LoopNode, row: list, col: list) -> str | None:
    """How `node` fits a kernel over (row, col), or None if it does not."""
    ranges = nonunit(node.ranges)
    if node.is_reduction:
        return "reduction" if same_sizes(ranges, row) and same_sizes(nonunit(node.reduction_ranges), col) else None
    if same_sizes(ranges, list(row) + list(col)):
        return "full"
    if col and same_sizes(ranges, row):
        return "row"
    return None


def var_map(node: LoopNode, role: str, row: list, col: list) -> dict:
    """Node variable -> kernel expression (x* for rows, r* for columns, 0 for size-1 dims)."""
    mapping = {}
    row_vars = iter(index_var("x", k) for k in range(len(row)))
    col_vars = iter(index_var("r", k) for k in range(len(col)))
    node_vars = list(zip(range_vars(len(node.ranges), "i"), node.ranges))
    if role == "full":
        kernel_vars = iter(list(row_vars) + list(col_vars))
        for var, size in node_vars:
            mapping[var] = sympy.Integer(0) if size == 1 else next(kernel_vars)
        return mapping
    for var, size in node_vars:
        mapping[var] = sympy.Integer(0) if size == 1 else next(row_vars)
    for var, size in zip(range_vars(len(node.reduction_ranges), "r"), node.reduction_ranges):
        mapping[var] = sympy.Integer(0) if size == 1 else next(col_vars)
    return mapping


@dataclass
class Kernel:
    name: str
    row_ranges: list
    col_ranges: list
    nodes: list = field(default_factory=list)
    roles: list = field(default_factory=list)
    persistent: bool = True
    local_buffers: set = field(default_factory=set)  # produced and consumed here: never stored

    @property
    def is_reduction(self) -> bool:
        return bool(self.col_ranges)

    @property
    def row_numel(self):
        return product(self.row_ranges)

    @property
    def col_numel(self):
        return product(self.col_ranges)

    def outputs(self) -> list[str]:
        return [name for node in self.nodes for name in node.outputs if name not in self.local_buffers]

    def op_count(self) -> int:
        return sum(len(node.body.ops) for node in self.nodes)

    def format(self, buffers: dict) -> list[str]:
        shape = f"rows=[{', '.join(map(str, self.row_ranges))}]"
        if self.is_reduction:
            shape += f" cols=[{', '.join(map(str, self.col_ranges))}] " + \
                ("persistent" if self.persistent else "looped")
        lines = [f"kernel {self.name}: {shape} writes {', '.join(self.outputs()) or '-'}"]
        if self.local_buffers:
            lines.append(f"  in registers: {', '.join(sorted(self.local_buffers))}")
        for node, role in zip(self.nodes, self.roles):
            lines.append(f"  = {node.name} ({role})")
            lines += format_body(node.body, indent="      ")
        return lines


@dataclass
class ScheduledGraph:
    graph: object
    steps: list  # Kernel | Extern, in execution order

    def format(self) -> str:
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel):
                lines += step.format(self.graph.buffers)
            else:
                lines += format_node(step, self.graph.buffers)
        return "\n".join(lines) + "\n"

    @property
    def kernels(self) -> list[Kernel]:
        return [step for step in self.steps if isinstance(step, Kernel)]

    @property
    def externs(self) -> list[Extern]:
        return [step for step in self.steps if isinstance(step, Extern)]
