"""The memory plan's types: what kiln/schedule/memory.py decides (`plan_memory`) and
kiln/codegen/wrapper.py renders. For each step of the scheduled program: the buffers it
allocates and how (Allocation.kind), the buffers that die after it, the bytes live during it;
the scratch block; the buffers the outputs keep alive. `MemoryPlan.format()` prints it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from kiln.ir.nodes import dtype_name

# How a step's buffer comes to exist (Allocation.kind).
EMPTY = "empty"  # empty_strided
HUGE = "huge"  # empty_strided_huge (kiln/runtime/host_memory.py)
SCRATCH = "scratch"  # a view into the scratch block
RETURNED = "returned"  # an extern's fresh result
VIEW = "view"  # an extern's result that may be a view of its arguments
ALLOCATED_BY_WRAPPER = (EMPTY, HUGE, SCRATCH)


@dataclass
class Allocation:
    """One buffer that a step brings into existence."""

    buffer: str
    kind: str  # EMPTY | HUGE | SCRATCH | RETURNED | VIEW
    layout: object  # kiln.ir Layout
    dtype: torch.dtype
    nbytes: sympy.Expr  # its storage's bytes (0 for a VIEW: it shares its arguments' memory)
    scratch_index: int | None = None  # SCRATCH: its view's position in ScratchPlan.layouts
    scratch_offset: int | None = None  # SCRATCH: its first byte in the block

    def format(self) -> str:
        size = "[" + ",".join(map(str, self.layout.size)) + "]"
        where = f"scratch@{self.scratch_offset:#x}" if self.kind == SCRATCH else self.kind
        return f"{self.buffer} {size} {dtype_name(self.dtype)} {where}"


@dataclass
class StepPlan:
    """What one step of the scheduled program allocates, and what dies after it."""

    index: int
    name: str  # the kernel's or the extern's name
    op: str = ""  # an extern's ATen op, for the text
    allocations: list = field(default_factory=list)  # Allocation, in the order the wrapper makes them
    frees: list = field(default_factory=list)  # buffer names, sorted
    live_bytes: sympy.Expr = sympy.Integer(0)  # bytes of the buffers live during this step

    def format(self) -> str:
        parts = []
        if self.allocations:
            parts.append("alloc " + ", ".join(allocation.format() for allocation in self.allocations))
        if self.frees:
            parts.append("free " + " ".join(self.frees))
        name = f"{self.name} ({self.op})" if self.op else self.name
        return f"step {self.index} {name}: " + ("; ".join(parts) or "-") + f"  (live {self.live_bytes} B)"


@dataclass
class ScratchPlan:
    """The scratch block: its bytes, and each view's (offset bytes, size, stride, dtype), in the
    order of `Allocation.scratch_index` (ScratchArena's `layouts`)."""

    nbytes: int
    buffers: list  # buffer names, by view index
    layouts: list
    device: str = "cpu"  # where the block lives ("cuda:0": an inference graph's, config.cuda_scratch_arena)


@dataclass
class MemoryPlan:
    """Per step of a scheduled graph: allocations, frees, live bytes; the scratch block; the outputs."""

    steps: list  # StepPlan, one per scheduled step
    scratch: ScratchPlan | None
    escaping: list  # buffers that graph outputs view: never freed, never in the scratch block
    peak_bytes: sympy.Expr
    peak_step: int | None  # the step whose live bytes are the peak (None when sizes do not decide it)

    def allocation(self, buffer: str) -> Allocation:
        """The allocation of `buffer` (its first, should two steps write it)."""
        for step in self.steps:
            for allocation in step.allocations:
                if allocation.buffer == buffer:
                    return allocation
        raise KeyError(buffer)

    def format(self) -> str:
        lines = [f"memory plan: {len(self.steps)} steps"]
        if self.scratch is not None:
            where = "" if self.scratch.device == "cpu" else f" on {self.scratch.device}"
            lines.append(f"scratch block{where}: {self.scratch.nbytes} B ({self.scratch.nbytes:#x}), "
                         f"{len(self.scratch.buffers)} buffers")
        lines += [step.format() for step in self.steps]
        lines.append("escape: " + (" ".join(self.escaping) or "-"))
        where = f" during step {self.peak_step} {self.steps[self.peak_step].name}" if self.peak_step is not None else ""
        lines.append(f"peak: {self.peak_bytes} B live{where} (buffers the program allocates, inputs not counted)")
        return "\n".join(lines) + "\n"
