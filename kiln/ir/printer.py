"""The stable text form of LoopIR: what KILN_DEBUG dumps and golden tests compare."""
from __future__ import annotations

from kiln.ir.nodes import Body, Extern, Graph, LoopNode, TensorArg, Template, dtype_name


def format_body(body: Body, indent: str = "  ", notes: list | None = None) -> list[str]:
    """One line per op; `notes` (one text per op), when given, end each line after two spaces."""
    lines = []
    for position, op in enumerate(body.ops):
        operands = " ".join(f"%{operand}" for operand in op.operands)
        if op.name == "load":
            text = f"%{position} = load {op.buffer}[{_index(op.index)}]"
        elif op.name == "store":
            text = f"store {op.buffer}[{_index(op.index)}] {operands}"
        elif op.name in ("constant", "index_expr", "reduce", "getitem", "check_index"):
            text = f"%{position} = {op.name} {operands + ' ' if operands else ''}{op.attr}"
        else:
            text = f"%{position} = {op.name} {operands}"
        if op.dtype is not None:
            text += f" : {dtype_name(op.dtype)}"
        if notes is not None:
            text += f"  {notes[position]}"
        lines.append(indent + text)
    return lines


def _index(index) -> str:
    return ", ".join(str(expr) for expr in index)


def format_node(node, buffers: dict) -> list[str]:
    if isinstance(node, Extern):
        args = _format_args(node.args)
        kwargs = ", ".join(f"{key}={_format_args((value,))}" for key, value in node.kwargs.items())
        call = ", ".join(part for part in (args, kwargs) if part)
        outs = ", ".join(node.outputs)
        return [f"{outs} = Extern {node.op}({call})  # {node.name}"] + \
            [f"  {buffers[name]}" for name in node.outputs]
    assert isinstance(node, LoopNode)
    kind = f"Reduction {node.reduction_kind()}" if node.is_reduction else "Pointwise"
    if isinstance(node, Template):
        kind = f"Template {node.kind}" + (f" {node.config}" if node.config is not None else "") + \
            (f" {node.precision}" if node.precision != "ieee" else "")
    ranges = f"ranges=[{', '.join(map(str, node.ranges))}]"
    if node.is_reduction:
        ranges += f" rranges=[{', '.join(map(str, node.reduction_ranges))}]"
    lines = [f"{node.name}: {kind} {ranges} -> {', '.join(node.outputs)}"]
    lines += [f"  # {buffers[name]}" for name in node.outputs if name in buffers]
    return lines + format_body(node.body)


def _format_args(args) -> str:
    parts = []
    for arg in args:
        if isinstance(arg, TensorArg):
            parts.append(f"{arg.buffer}<{arg.layout}>")
        elif isinstance(arg, (list, tuple)):
            parts.append("[" + _format_args(arg) + "]")
        else:
            parts.append(repr(arg) if not hasattr(arg, "free_symbols") else str(arg))
    return ", ".join(parts)


def format_graph(graph: Graph) -> str:
    lines = ["# inputs"]
    for graph_input in graph.inputs:
        if graph_input.kind == "tensor":
            lines.append(f"  {graph_input.buffer}")
        else:
            lines.append(f"  {graph_input.name}: {graph_input.kind} {graph_input.symbol or ''}".rstrip())
    for name in graph.constants:
        lines.append(f"  {graph.buffers[name]} (constant)")
    lines.append("# nodes")
    for node in graph.nodes:
        lines += format_node(node, graph.buffers)
    lines.append("# outputs")
    lines.append("  " + _format_args(graph.outputs))
    return "\n".join(lines) + "\n"
