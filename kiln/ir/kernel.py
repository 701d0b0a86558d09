"""The scheduled form's types: a kernel (LoopIR nodes that run in one launch over shared rows
and columns) and the scheduled graph (kernels and externs in execution order).

kiln/schedule makes them and kiln/codegen reads them, so they live in ir/, below both.

Every node of a kernel sees the kernel's row index space (`row_ranges`) and, for a
reduction kernel, its column space (`col_ranges`, the reduced dims). A node plays one
role: "reduction" (ranges = rows, reduction ranges = columns), "full" (pointwise over
rows x columns) or "row" (pointwise over rows only, e.g. rsqrt(var + eps)).
`var_map` rewrites a node's own index variables into the kernel's (`x*`, `r*`);
`loop_variables` says which of those each op's value depends on (its loop level).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy

from kiln.ir import Extern, LoopNode, range_vars
from kiln.ir.nodes import Template, indirect_value, symbol_name
from kiln.ir.indexing import contiguous_strides, index_var, product, simplify_index, unravel
from kiln.ir.printer import format_body, format_node


# Outer reductions (kiln/schedule/outer.py): the rows one program covers (Triton's XBLOCK), which
# split_reductions counts programs by; an outer kernel stays persistent (every column in registers)
# only when its columns are this few, its tile being [>= 32 rows, all the columns].
OUTER_ROWS_PER_PROGRAM = 64
OUTER_PERSISTENT_MAX = 128


def nonunit(sizes) -> list:
    return [size for size in sizes if size != 1]


def equal_size(a, b) -> bool:
    """Whether two sizes (ints or sympy expressions) are equal: numbers compared as numbers (a sympy
    subtraction and expand cost ~10 us, and scheduling a GPT-2 compares ~5,000 pairs), symbolic ones by
    expanding their difference."""
    if isinstance(a, (int, sympy.Integer)) and isinstance(b, (int, sympy.Integer)):
        return int(a) == int(b)
    return sympy.expand(a - b) == 0


def same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(equal_size(x, y) for x, y in zip(a, b))


def node_role(node: LoopNode, row: list, col: list) -> str | None:
    """How `node` fits a kernel over (row, col), or None if it does not.

    Dims are matched by products, not one by one: a node over [4096, 768] fits a
    kernel over rows [8, 512] and columns [768] (a reshape between them is only a
    different way to count the same rows). Whether the data lines up is checked
    separately, by comparing the offsets at which values are stored and read.
    """
    ranges = nonunit(node.ranges)
    if node.is_reduction:
        # Only into a reduction kernel: one over size-1 columns (`x.amax(1)` of [3, 1]) has no
        # non-unit column left, and in a pointwise kernel (no columns) its reduce had no loop.
        fits = bool(col) and _same_numel(ranges, row) and _same_numel(nonunit(node.reduction_ranges), col)
        return "reduction" if fits else None
    split = _split_point(ranges, row)
    if split is not None and _same_numel(ranges[split:], col):
        return "full"
    if col and _same_numel(ranges, row):
        return "row"
    return None


def _same_numel(a, b) -> bool:
    return equal_size(product(a), product(b))


def _split_point(sizes: list, row: list) -> int | None:
    """How many leading `sizes` multiply to the kernel's row count (None if no prefix does)."""
    total, count = product(row), sympy.Integer(1)
    for position in range(len(sizes) + 1):
        if equal_size(count, total):
            return position
        if position < len(sizes):
            count = count * sizes[position]
    return None


def _map_dims(node_sizes: list, kernel_sizes: list, prefix: str) -> list:
    """Kernel expressions for the node's (non-unit) dims that count the same elements as `kernel_sizes`.

    Equal shapes map one to one; otherwise the kernel's row-major position is
    unravelled over the node's sizes (FloorDiv/Mod that the ranges make redundant
    are removed).
    """
    kernel_vars = [index_var(prefix, k) for k in range(len(kernel_sizes))]
    if same_sizes(node_sizes, kernel_sizes):
        return kernel_vars
    ranges = dict(zip(kernel_vars, kernel_sizes))
    flat = sum((var * stride for var, stride in zip(kernel_vars, contiguous_strides(kernel_sizes))), sympy.Integer(0))
    return [simplify_index(expr, ranges) for expr in unravel(flat, node_sizes)]


def var_map(node: LoopNode, role: str, row: list, col: list) -> dict:
    """Node variable -> kernel expression (x* for rows, r* for columns, 0 for size-1 dims).
    A template's (role "template") rows are the kernel's rows, its columns the kernel's columns and
    its reduced dim `k0`, which the template's own loop walks (kiln/codegen/triton_templates.py)."""
    if role == "template":  # [m, n] or [batch, m, n]: every dim but the last is a row dim
        (k,) = range_vars(1, "r")
        *rows, column = range_vars(len(node.ranges), "i")
        mapping = {var: index_var("x", position) for position, var in enumerate(rows)}
        return {**mapping, column: index_var("r", 0), k: sympy.Symbol("k0", integer=True)}
    reduction_ranges = tuple(node.reduction_ranges) if node.is_reduction else ()
    return dict(_loop_var_map(tuple(node.ranges), reduction_ranges, role, tuple(row), tuple(col)))


@functools.lru_cache(maxsize=4096)
def _loop_var_map(ranges: tuple, reduction_ranges: tuple, role: str, row: tuple, col: tuple) -> dict:
    """var_map of a loop node, a pure function of these sizes, kept: fusion, loop order, loop variables and
    codegen each ask for every node of every kernel (~700 calls for a GPT-2, ~80 us each under cProfile).
    The caller gets a copy."""
    node_vars = [(var, size) for var, size in zip(range_vars(len(ranges), "i"), ranges)]
    reduction_vars = [(var, size) for var, size in zip(range_vars(len(reduction_ranges), "r"), reduction_ranges)]
    if role == "full":
        sized = [var for var, size in node_vars if size != 1]
        sizes = nonunit(ranges)
        split = _split_point(sizes, row)
        row_part, col_part = (sized[:split], sizes[:split]), (sized[split:], sizes[split:])
    else:
        row_part = ([var for var, size in node_vars if size != 1], nonunit(ranges))
        col_part = ([var for var, size in reduction_vars if size != 1], nonunit([s for _, s in reduction_vars]))
    mapping = {var: sympy.Integer(0) for var, size in node_vars + reduction_vars if size == 1}
    for (variables, sizes), kernel_sizes, prefix in ((row_part, row, "x"), (col_part, col, "r")):
        if variables:
            mapping.update(zip(variables, _map_dims(sizes, list(kernel_sizes), prefix)))
    return mapping


def is_loop_variable(symbol) -> bool:
    """A kernel loop variable: x<k> (rows) or r<k> (columns)."""
    name = symbol_name(symbol)
    return name[:1] in ("x", "r") and name[1:].isdigit()


def loop_variables(kernel: "Kernel") -> list:
    """Per node of `kernel`, per op: the kernel loop variables (names, `x*` and `r*`) its value
    depends on, through its index or index expression, its operands and its gathered positions.
    A reduce's value varies with the rows only; a store's set is what it writes at."""
    result = []
    for node, role in zip(kernel.nodes, kernel.roles):
        mapping = var_map(node, role, kernel.row_ranges, kernel.col_ranges)
        per_op: list = []
        for op in node.body.ops:
            expressions = list(op.index or ()) + ([op.attr] if op.name == "index_expr" else [])
            names: set = set()
            for expr in expressions:
                for symbol in sympy.sympify(expr).xreplace(mapping).free_symbols:
                    gathered = indirect_value(symbol)
                    if gathered is not None:
                        names |= per_op[gathered]
                    elif is_loop_variable(symbol):
                        names.add(symbol_name(symbol))
            for operand in op.operands:
                names |= per_op[operand]
            if op.name == "reduce":
                names = {name for name in names if name[0] == "x"}
            per_op.append(frozenset(names))
        result.append(tuple(per_op))
    return result


def _loop_note(names: frozenset) -> str:
    ordered = sorted(names, key=lambda name: (name[0] != "x", int(name[1:])))
    return "@ " + (" ".join(ordered) if ordered else "-")


@dataclass
class Kernel:
    name: str
    row_ranges: list
    col_ranges: list
    nodes: list = field(default_factory=list)
    roles: list = field(default_factory=list)
    persistent: bool = True
    local_buffers: set = field(default_factory=set)  # produced and consumed here: never stored
    # `loop_variables(self)` once computed (schedule/passes.py `annotate_loop_variables`); printed
    op_loop_variables: list = field(default_factory=list)
    # The order a backend walks the rows in, outermost dim first (schedule/loop_order.py); None: as
    # listed, the last innermost. It changes which row tuple a lane or iteration gets, never a value.
    row_order: tuple | None = None
    # An outer reduction (kiln/schedule/outer.py): its loads are contiguous along the rows and strided
    # along the columns, so a backend tiles many rows by a few columns. Never changes a value.
    outer: bool = False

    @property
    def template(self) -> Template | None:
        """The product template this kernel runs (its first node), or None for a loop kernel."""
        return self.nodes[0] if self.nodes and isinstance(self.nodes[0], Template) else None

    @property
    def walk_order(self) -> list:
        """The row dims, outermost first: `row_order`, or listed order."""
        return list(self.row_order) if self.row_order is not None else list(range(len(self.row_ranges)))

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
                (f"template {self.template.kind}" if self.template is not None else
                 "persistent" if self.persistent else "looped")
        if self.outer:
            shape += " outer"
        if self.row_order is not None:
            shape += f" order=[{', '.join(f'x{dim}' for dim in self.row_order)}]"
        lines = [f"kernel {self.name}: {shape} writes {', '.join(self.outputs()) or '-'}"]
        if self.local_buffers:
            lines.append(f"  in registers: {', '.join(sorted(self.local_buffers))}")
        for position, (node, role) in enumerate(zip(self.nodes, self.roles)):
            lines.append(f"  = {node.name} ({role})")
            notes = None
            if self.op_loop_variables:
                notes = [_loop_note(names) for names in self.op_loop_variables[position]]
            lines += format_body(node.body, indent="      ", notes=notes)
        return lines


def step_buffers(step) -> set:
    """The buffers a step of a scheduled graph (a Kernel or an Extern) reads or writes, a kernel's in-register ones
    included: what the memory plan's last uses and the wrapper's tail count."""
    if isinstance(step, Kernel):
        names = set()
        for node in step.nodes:
            names |= {op.buffer for op in node.body.reads()}
            names |= set(node.outputs)
        return names
    return {arg.buffer for arg in step.tensor_args()} | set(step.outputs)


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
