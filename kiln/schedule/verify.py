"""`verify_scheduled(scheduled)`: the scheduled form's invariants, on top of `ir.verify`'s.

- Every node of the graph runs in exactly one step: in one kernel, or as an extern step.
- The steps, and the nodes within a kernel, run in an order where every read comes after its
  write (fusion may hoist a node into an earlier kernel, never before what it reads).
- A kernel's `local_buffers` (kept in registers) are written by one of its nodes, read only by
  its later nodes, and are neither graph outputs nor read by any other step.
- A kernel's `row_order`, if any, lists each of its row dims once.
- Each node's role is the one its ranges give in the kernel's rows and columns (`node_role`),
  and each node passes `ir.verify`'s checks, in the order the steps run.
"""
from __future__ import annotations

from kiln.ir import Extern, IRVerificationError, TensorArg, Template
from kiln.ir.verify import check_node, check_outputs, defined_at_entry, size_symbols
from kiln.ir.kernel import Kernel, ScheduledGraph, node_role, nonunit, same_sizes


def verify_scheduled(scheduled: ScheduledGraph, stage: str | None = None) -> None:
    """Check `scheduled`; raise IRVerificationError naming `stage`, the kernel and the problem."""
    graph = scheduled.graph
    prefix = "" if stage is None else f"after {stage}: "
    _check_partition(scheduled, prefix)
    defined, symbols = defined_at_entry(graph), size_symbols(graph)
    for step in scheduled.steps:
        if isinstance(step, Kernel):
            _check_kernel(step, scheduled, prefix)
            for node in step.nodes:
                check_node(node, graph, defined, symbols, stage)
                defined |= set(node.outputs)
        else:
            check_node(step, graph, defined, symbols, stage)
            defined |= set(step.outputs)
    check_outputs(graph, defined, stage)


def _check_partition(scheduled: ScheduledGraph, prefix: str) -> None:
    runs: dict[int, list[str]] = {}
    for step in scheduled.steps:
        members = step.nodes if isinstance(step, Kernel) else [step]
        for node in members:
            runs.setdefault(id(node), []).append(step.name)
    for node in scheduled.graph.nodes:
        places = runs.pop(id(node), [])
        if len(places) != 1:
            where = f"in {', '.join(places)}" if places else "in no step"
            raise IRVerificationError(f"{prefix}{node.name} runs {len(places)} times ({where}), not once")
    if runs:
        raise IRVerificationError(f"{prefix}steps {sorted({p for places in runs.values() for p in places})} "
                                  f"run nodes that are not in the graph")


def _check_kernel(kernel: Kernel, scheduled: ScheduledGraph, prefix: str) -> None:
    where = f"{prefix}kernel {kernel.name}"
    if len(kernel.roles) != len(kernel.nodes):
        raise IRVerificationError(f"{where}: {len(kernel.nodes)} nodes but {len(kernel.roles)} roles")
    if kernel.row_order is not None and sorted(kernel.row_order) != list(range(len(kernel.row_ranges))):
        raise IRVerificationError(f"{where}: row order {kernel.row_order} is not an order of its "
                                  f"{len(kernel.row_ranges)} rows")
    for position, (node, role) in enumerate(zip(kernel.nodes, kernel.roles)):
        if isinstance(node, Template) or role == "template":
            if not (position == 0 and role == "template" and isinstance(node, Template)
                    and same_sizes(node.ranges, kernel.row_ranges + kernel.col_ranges)):
                raise IRVerificationError(f"{where}: {node.name} ({type(node).__name__}, role {role!r}) at "
                                          f"position {position}: a template is the first node of its own kernel, "
                                          f"whose rows and columns are its ranges")
            continue
        if kernel.template is not None and role != "full":
            raise IRVerificationError(f"{where}: {node.name} joined template kernel with role {role!r}; "
                                      f"only pointwise epilogues over its tile may")
        fits = node_role(node, kernel.row_ranges, kernel.col_ranges)
        # An empty node's element counts match any split of its dims, so node_role may find none:
        # a "full" node is then the one whose dims are the kernel's, as the kernel was made from it.
        if fits is None and role == "full" and same_sizes(nonunit(node.ranges), kernel.row_ranges + kernel.col_ranges):
            fits = role
        if fits != role:
            raise IRVerificationError(f"{where}: {node.name} has role {role!r}, but its ranges {node.ranges} "
                                      f"(reduced {node.reduction_ranges}) give {fits!r} in rows "
                                      f"{kernel.row_ranges} x columns {kernel.col_ranges}")
    written_at = {name: position for position, node in enumerate(kernel.nodes) for name in node.outputs}
    for name in sorted(kernel.local_buffers):
        if name not in written_at:
            raise IRVerificationError(f"{where}: local buffer {name} is written by none of its nodes")
        for position, node in enumerate(kernel.nodes):
            if position <= written_at[name] and any(op.buffer == name for op in node.body.reads()):
                raise IRVerificationError(f"{where}: {node.name} reads local buffer {name} before it is written")
    _check_locals_stay_inside(kernel, scheduled, where)


def _check_locals_stay_inside(kernel: Kernel, scheduled: ScheduledGraph, where: str) -> None:
    """A value kept in registers exists nowhere else: no other step reads it and it is not an output."""
    local = kernel.local_buffers
    outputs = {output.buffer for output in scheduled.graph.outputs if isinstance(output, TensorArg)}
    if local & outputs:
        raise IRVerificationError(f"{where}: local buffers {sorted(local & outputs)} are graph outputs")
    for step in scheduled.steps:
        if step is kernel:
            continue
        if isinstance(step, Extern):
            read = {arg.buffer for arg in step.tensor_args()}
        else:
            read = {op.buffer for node in step.nodes for op in node.body.reads()}
        if read & local:
            raise IRVerificationError(f"{where}: local buffers {sorted(read & local)} are read by {step.name}")
