"""The memory plan of a scheduled graph: for each step, which buffers it allocates and how,
and which buffers die after it. The wrapper (kiln/codegen/wrapper.py) only renders the plan.

    plan_memory(scheduled) -> MemoryPlan

Decisions, all made here:
- **last use**: each buffer the program holds (inputs and intermediates; not graph outputs,
  constants, or a kernel's in-register values) is freed (`del`) after the last step that reads
  or writes it, so peak memory follows eager's;
- **how a buffer is allocated**: a kernel output or an `out=` extern output is a fresh
  `empty_strided`, an `empty_strided_huge` when it is a large static CPU buffer
  (`config.cpu_huge_pages_min_bytes`), or a view into the graph's scratch block; any other extern
  output is what the extern returns, fresh or, when its schema does not rule it out, a view of
  its arguments;
- **the scratch block** (CPU graphs, `config.cpu_scratch_arena`; CUDA inference graphs,
  `config.cuda_scratch_arena`, off by default): the buffers the wrapper allocates,
  of static size, that no graph output aliases, no extern that may return a view of its
  arguments reads or returns, and no extern that takes a storage offset reads, placed at
  offsets by lifetime (`plan_offsets`), so buffers never live at the same step share bytes.
  kiln/runtime/scratch.py's `ScratchArena` builds the block;
- **peak**: the bytes live during each step, from the buffers' sizes (expressions when sizes are
  symbols), and the step where they peak.

`MemoryPlan.format()` is the text KILN_DEBUG dumps as `memory_plan.txt`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from kiln.config import config
from kiln.ir import TensorArg, graph_device_type
from kiln.ir.nodes import dtype_name
from kiln.ir.kernel import Kernel, ScheduledGraph, step_buffers
from kiln.ir.memory_plan import (ALLOCATED_BY_WRAPPER, EMPTY, HUGE, RETURNED, SCRATCH, VIEW, Allocation,
                                 MemoryPlan, ScratchPlan, StepPlan)

ALIGNMENT = 64  # bytes: a cache line, and a multiple of every dtype's size
MAX_COMPARED_PEAKS = 32  # distinct symbolic live-byte expressions the peak is simplified over


def plan_memory(scheduled: ScheduledGraph, device_type: str | None = None, inference: bool = False) -> MemoryPlan:
    """The memory plan of `scheduled`; `device_type` ("cpu" or "cuda") defaults to the graph's
    (`graph_device_type`: cuda when any buffer is on a GPU). `inference`: the graph needs no autograd
    (a CUDA graph's scratch block is kept between calls, which only an inference graph may afford: a
    training forward's block would stay allocated through the backward)."""
    graph = scheduled.graph
    if device_type is None:
        device_type = graph_device_type(graph)
    last_use = last_uses(scheduled)
    scratch, scratch_slots = _plan_scratch(scheduled, last_use, device_type, inference)
    steps = []
    for step_index, step in enumerate(scheduled.steps):
        step_plan = StepPlan(step_index, step.name, "" if isinstance(step, Kernel) else str(step.op))
        if isinstance(step, Kernel):
            written = [name for node in step.nodes for name in node.outputs if name not in step.local_buffers]
            step_plan.allocations = [_allocation(graph, name, scratch_slots) for name in written]
        elif step.writes_into_outputs:
            (output,) = step.outputs
            step_plan.allocations = [_allocation(graph, output, scratch_slots)]
        else:
            kind = RETURNED if returns_fresh_tensors(step.op) else VIEW
            step_plan.allocations = [_returned(graph, name, kind) for name in step.outputs]
        step_plan.frees = sorted(name for name, last in last_use.items() if last == step_index)
        steps.append(step_plan)
    escaping = []
    for output in graph.outputs:
        if isinstance(output, TensorArg) and output.buffer not in escaping:
            escaping.append(output.buffer)
    peak_bytes, peak_step = _account_peak(steps)
    return MemoryPlan(steps, scratch, escaping, peak_bytes, peak_step)


def last_uses(scheduled: ScheduledGraph) -> dict:
    """Buffer name -> index of the last step that reads or writes it (inputs and intermediates,
    not graph outputs, constants or in-register values)."""
    graph = scheduled.graph
    keep = {output.buffer for output in graph.outputs if isinstance(output, TensorArg)}
    keep |= set(graph.constants)
    last: dict = {}
    for step_index, step in enumerate(scheduled.steps):
        for name in step_buffers(step):
            last[name] = step_index
    local = {name for step in scheduled.kernels for name in step.local_buffers}
    return {name: index for name, index in last.items() if name not in keep and name not in local}


def _plan_scratch(scheduled: ScheduledGraph, last_use: dict, device_type: str, inference: bool) -> tuple:
    """(ScratchPlan or None, {buffer name: (view index, offset)}): the intermediates the wrapper
    allocates, of static size, that no output aliases, no extern that may return a view of its
    inputs reads or returns, and no extern that takes a storage offset reads. CPU graphs (config.cpu_scratch_arena) and CUDA inference graphs
    (config.cuda_scratch_arena) on one device have one."""
    graph = scheduled.graph
    devices = {str(buffer.device) for buffer in graph.buffers.values()}
    if device_type == "cpu":
        wanted = config.cpu_scratch_arena
    else:
        wanted = device_type == "cuda" and config.cuda_scratch_arena and inference and len(devices - {"cpu"}) == 1
    if not wanted:
        return None, {}
    device = "cpu" if device_type == "cpu" else next(iter(devices - {"cpu"}))
    inputs = {graph_input.buffer.name for graph_input in graph.inputs if graph_input.kind == "tensor"}
    escaping = {output.buffer for output in graph.outputs if isinstance(output, TensorArg)}
    first_step: dict = {}
    for step_index, step in enumerate(scheduled.steps):
        if isinstance(step, Kernel):
            written = [name for node in step.nodes for name in node.outputs if name not in step.local_buffers]
        else:
            written = list(step.outputs) if step.writes_into_outputs else []
            if not returns_fresh_tensors(step.op):
                escaping |= {arg.buffer for arg in step.tensor_args()} | set(step.outputs)
            elif reads_storage_offsets(step.op):
                escaping |= {arg.buffer for arg in step.tensor_args()}
        for name in written:
            first_step.setdefault(name, step_index)
    candidates = []
    for name, first in first_step.items():
        layout = graph.buffers[name].layout
        static = all(sympy.sympify(value).is_Integer for value in (*layout.size, *layout.stride, layout.offset))
        if name in escaping or name in inputs or name not in last_use or not static \
                or str(graph.buffers[name].device) != device:
            continue
        nbytes = int(layout.storage_span()) * graph.buffers[name].dtype.itemsize
        candidates.append((name, nbytes, first, last_use[name]))
    if not candidates:
        return None, {}
    offsets, total = plan_offsets(candidates)
    names = sorted(offsets, key=lambda name: first_step[name])
    layouts = [(offsets[name], tuple(map(int, graph.buffers[name].layout.size)),
                tuple(map(int, graph.buffers[name].layout.stride)), graph.buffers[name].dtype)
               for name in names]
    slots = {name: (index, offsets[name]) for index, name in enumerate(names)}
    return ScratchPlan(total, names, layouts, device), slots


def plan_offsets(buffers: list) -> tuple[dict, int]:
    """Offsets (bytes) for buffers given as (name, nbytes, first_step, last_step): a buffer
    may reuse the bytes of one whose last step is before its first step. First fit by
    offset; returns ({name: offset}, total bytes)."""
    offsets: dict = {}
    live: list = []  # (offset, end, last_step)
    total = 0
    for name, nbytes, first, last in sorted(buffers, key=lambda item: (item[2], -item[1])):
        live = [block for block in live if block[2] >= first]
        size = -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
        offset = 0
        for start, end, _ in sorted(live):
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[name] = offset
        live.append((offset, offset + size, last))
        total = max(total, offset + size)
    return offsets, total


def _nbytes(buffer) -> sympy.Expr:
    return sympy.sympify(buffer.layout.storage_span()) * buffer.dtype.itemsize


def _allocation(graph, name: str, scratch_slots: dict) -> Allocation:
    """How the wrapper allocates `name`, a kernel output or an `out=` extern output."""
    buffer = graph.buffers[name]
    if name in scratch_slots:
        index, offset = scratch_slots[name]
        return Allocation(name, SCRATCH, buffer.layout, buffer.dtype, _nbytes(buffer), index, offset)
    kind = HUGE if wants_huge_pages(buffer) else EMPTY
    return Allocation(name, kind, buffer.layout, buffer.dtype, _nbytes(buffer))


def _returned(graph, name: str, kind: str) -> Allocation:
    buffer = graph.buffers[name]
    return Allocation(name, kind, buffer.layout, buffer.dtype, _nbytes(buffer) if kind == RETURNED else sympy.Integer(0))


def wants_huge_pages(buffer) -> bool:
    """A large CPU buffer of static size: allocated with huge pages (kiln/runtime/host_memory.py)."""
    if buffer.device.type != "cpu" or config.cpu_huge_pages_min_bytes <= 0:
        return False
    elements = sympy.sympify(buffer.layout.storage_span())
    return elements.is_Integer and int(elements) * buffer.dtype.itemsize >= config.cpu_huge_pages_min_bytes


def reads_storage_offsets(op) -> bool:
    """Whether an extern takes a `storage_offset`, which counts from its operand's storage start
    (`as_strided_scatter`): the result depends on where the operand sits in its storage.
    Such an operand cannot live in the scratch block, where it would sit at an offset. A fresh
    allocation sits at 0, as the trace assumed. Eager's `as_strided_scatter(full, src, [2, 8],
    [8, 1], 0)`, with `full` a view at storage offset 16, returned zeros. That was the backward of
    `linear(adaptive_avg_pool2d(x, 1).flatten(1))` for a channels-last x under CPU autocast: the
    gradient of x and of every parameter before it came back 0."""
    schema = getattr(op, "_schema", None)
    return schema is not None and any(argument.name == "storage_offset" for argument in schema.arguments)


def returns_fresh_tensors(op) -> bool:
    """Whether an extern's results are never views of its arguments: its schema marks no returned
    alias, except the written `out=` tensors of an out variant, which are its own outputs."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    return all(result.alias_info is None or result.alias_info.is_write for result in schema.returns)


def _account_peak(steps: list) -> tuple:
    """Fill each step's `live_bytes` (buffers allocated by then and not freed before it; graph
    outputs live to the end) and return (peak bytes, the peak's step or None). One pass: each
    step adds what it allocates and drops what the step before freed."""
    born: dict = {}  # buffer -> its bytes, from its first allocation
    static, symbolic = 0, sympy.Integer(0)  # the live bytes, apart so that most steps add ints
    dying: list = []  # buffers freed after the previous step
    for step in steps:
        for name in dying:
            nbytes = born[name]
            if nbytes.is_Integer:
                static -= int(nbytes)
            else:
                symbolic -= nbytes
        for allocation in step.allocations:
            if allocation.buffer in born:
                continue
            born[allocation.buffer] = nbytes = sympy.sympify(allocation.nbytes)
            if nbytes.is_Integer:
                static += int(nbytes)
            else:
                symbolic += nbytes
        step.live_bytes = sympy.expand(symbolic) + static
        dying = [name for name in step.frees if name in born]
    if not steps:
        return sympy.Integer(0), None
    static_peak = max(int(step.live_bytes) for step in steps if step.live_bytes.is_Integer) \
        if any(step.live_bytes.is_Integer for step in steps) else None
    candidates = list(dict.fromkeys(step.live_bytes for step in steps if not step.live_bytes.is_Integer))
    if static_peak is not None:
        candidates.append(sympy.Integer(static_peak))
    # Max compares its arguments pairwise: past a few dozen distinct expressions it is printed unsimplified.
    peak = sympy.Max(*candidates, evaluate=len(candidates) <= MAX_COMPARED_PEAKS)
    peak_step = next((step.index for step in steps if sympy.expand(step.live_bytes - peak) == 0), None)
    return peak, peak_step


__all__ = ["ALIGNMENT", "Allocation", "MemoryPlan", "ScratchPlan", "StepPlan", "last_uses", "plan_memory",
           "plan_offsets", "returns_fresh_tensors"]
