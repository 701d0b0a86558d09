"""The host program: a generated Python `call(args)` that allocates, launches and
calls externs, with as few Python operations per call as the graph allows.

Sizes that are symbols are read from the inputs once at the top; every allocation
has its sizes and strides spelled out. What is allocated where, and which buffers are
deleted after each step, is the memory plan's (kiln/schedule/memory.py): the wrapper
only renders it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from kiln import _torch
from kiln.codegen.backends import backend_for
from kiln.codegen.common import KernelBackend
from kiln.codegen.printing import expr_to_source
from kiln.codegen.triton import INDEX_STATUS, KernelSource
from kiln.ir import Extern, TensorArg, graph_device_type
from kiln.ir.kernel import Kernel, ScheduledGraph, step_buffers
from kiln.ir.memory_plan import ALLOCATED_BY_WRAPPER, EMPTY, HUGE, RETURNED, SCRATCH, MemoryPlan


@dataclass
class ModuleSource:
    """Everything `kiln.runtime.loader.load_module` needs to build the callable."""

    wrapper: str
    kernels: dict  # kernel name -> its listing (the kernel's source, for dumps)
    kernel_sources: list = field(default_factory=list)  # what backend.generate_kernel returned
    constants: dict = field(default_factory=dict)
    externs: dict = field(default_factory=dict)  # name -> ATen op
    kernel_count: int = 0
    extern_count: int = 0
    index_status: list = field(default_factory=list)  # names of the IndexStatus constants (one per device's flag)
    tail_steps: int = 0  # steps in `call_tail` (0: the wrapper has only `call`; see WrapperGenerator._tail_start)
    tail_bytes: int = 0  # the bytes of the outputs `call_tail` makes
    backend: KernelBackend | None = None  # generated the kernels; loads them (kiln/runtime/loader.py)


def _symbol_sources(graph) -> dict:
    """Each size symbol -> Python expression that reads it from the inputs."""
    sources = {}
    for position, graph_input in enumerate(graph.inputs):
        if graph_input.kind == "symbol" and graph_input.symbol is not None:
            sources.setdefault(graph_input.symbol, graph_input.name)
    for graph_input in graph.inputs:
        if graph_input.kind != "tensor":
            continue
        layout = graph_input.buffer.layout
        for dim, size in enumerate(layout.size):
            if isinstance(size, sympy.Symbol):
                sources.setdefault(size, f"{graph_input.name}.size({dim})")
        for dim, stride in enumerate(layout.stride):
            if isinstance(stride, sympy.Symbol):
                sources.setdefault(stride, f"{graph_input.name}.stride({dim})")
    return sources


class WrapperGenerator:
    def __init__(self, scheduled: ScheduledGraph, memory_plan: MemoryPlan):
        self.scheduled = scheduled
        self.graph = scheduled.graph
        self.device_type = graph_device_type(scheduled.graph)
        self.backend = backend_for(self.device_type)
        self.memory_plan = memory_plan
        if [step_plan.name for step_plan in self.memory_plan.steps] != [step.name for step in scheduled.steps]:
            raise ValueError("the memory plan was made for another schedule: plan_memory(scheduled) again")
        self.step_plans = {step_plan.name: step_plan for step_plan in self.memory_plan.steps}  # step name -> StepPlan
        self.lines: list[str] = []
        self.names = {graph_input.buffer.name: graph_input.name for graph_input in self.graph.inputs
                      if graph_input.kind == "tensor"}
        self.symbols = _symbol_sources(self.graph)
        self.referenced_symbols: set = set()  # every symbol a line of the wrapper reads (`py` adds them)
        self.index_status_kernels: dict = {}  # index-error flag's name -> the kernels that set it
        self.cuda_allocators: dict = {}  # wrapper name -> CUDA device index (runtime/support.py cuda_allocator)

    def py(self, expr) -> str:
        expr = sympy.sympify(expr)
        missing = [symbol for symbol in expr.free_symbols if symbol not in self.symbols]
        if missing:
            raise NotImplementedError(f"size symbols {missing} cannot be read from the graph inputs")
        self.referenced_symbols |= expr.free_symbols
        return expr_to_source(expr)

    def py_tuple(self, exprs) -> str:
        return "(" + "".join(self.py(expr) + ", " for expr in exprs) + ")"

    def name(self, buffer_name: str) -> str:
        return self.names.get(buffer_name, buffer_name)

    def generate(self) -> ModuleSource:
        graph = self.graph
        module = ModuleSource("", {}, constants=dict(graph.constants), backend=self.backend)
        input_names = [graph_input.name for graph_input in graph.inputs]
        prologue = []
        if input_names:
            prologue.append(f"{', '.join(input_names)}, = args")
        prologue.append("args.clear()")
        scratch = self.memory_plan.scratch
        if scratch is not None:
            from kiln.runtime.scratch import ScratchArena

            module.constants["_arena"] = ScratchArena(scratch.nbytes, scratch.layouts, scratch.device)
        steps = []  # per step: its lines
        for step, step_plan in zip(self.scheduled.steps, self.memory_plan.steps):
            lines = self._kernel_call(step, module) if isinstance(step, Kernel) else self._extern_call(step, module)
            if step_plan.frees:
                lines.append(f"del {', '.join(sorted(self.name(name) for name in step_plan.frees))}")
            steps.append(lines)
        checks = self._index_status_checks(module)
        returned = f"return ({''.join(self._output(output) + ', ' for output in graph.outputs)})"
        used_symbols = self._used_symbols() | {symbol for symbol in self.referenced_symbols if symbol in self.symbols}
        bindings = [f"{name} = cuda_allocator({index})" for name, index in self.cuda_allocators.items()]
        bindings += [f"{symbol} = {self.symbols[symbol]}" for symbol in sorted(used_symbols, key=str)
                     if str(symbol) not in input_names]
        tail = self._tail_start(module, used_symbols)
        if tail == len(steps):
            body = prologue + bindings + [line for lines in steps for line in lines] + checks + [returned]
            if scratch is not None:
                body = (["_scratch = _arena.acquire()", "try:"] + ["    " + line for line in body]
                        + ["finally:", "    _arena.release(_scratch)"])
            self.lines += ["def call(args):"] + ["    " + line for line in body]
        else:
            live = self._live_into(tail)
            live_tuple = "(" + "".join(name + ", " for name in live) + ")"
            head = prologue + bindings + [line for lines in steps[:tail] for line in lines] + [f"return {live_tuple}"]
            unpack = [f"{''.join(name + ', ' for name in live)}= live", "live.clear()"] if live else []
            rest = unpack + bindings + [line for lines in steps[tail:] for line in lines] + [returned]
            self.lines += (["def call_head(args):"] + ["    " + line for line in head] + ["", "", "def call_tail(live):"]
                           + ["    " + line for line in rest] + ["", "", "def call(args):",
                                                                  "    return call_tail(list(call_head(args)))"])
            module.tail_steps = len(steps) - tail
            module.tail_bytes = sum(int(allocation.nbytes) for step_plan in self.memory_plan.steps[tail:]
                                    for allocation in step_plan.allocations)
        module.wrapper = "\n".join(self._header(module) + self.lines) + "\n"
        module.kernel_count = len([k for k in module.kernel_sources if not k.skip])
        module.extern_count = len(module.externs)
        return module

    def _tail_start(self, module: ModuleSource, used_symbols: set) -> int:
        """Where the wrapper's tail begins (the number of steps when it has none): its last steps that each
        bring into being only graph outputs, in fresh memory (an `empty_strided` or an extern's own result), of
        at least `config.cuda_graph_tail_min_bytes` (static sizes). The default mode's CUDA graph records the
        head (`call_head`) and runs `call_tail` after each replay (kiln/runtime/cudagraphs.py), so such outputs
        (an LM head's logits) are made outside the graph's pool and never copied out of it. No tail where the
        graph has size symbols, a scratch block or index checks (the head would have to hand them over)."""
        from kiln.config import config

        threshold = config.cuda_graph_tail_min_bytes
        steps = len(self.scheduled.steps)
        if threshold <= 0 or used_symbols or self.memory_plan.scratch is not None or module.index_status \
                or self.index_status_kernels:
            return steps
        outputs = {output.buffer for output in self.graph.outputs if isinstance(output, TensorArg)}
        start = steps
        for step_plan in reversed(self.memory_plan.steps):
            allocations = step_plan.allocations
            if not allocations or any(allocation.kind not in (EMPTY, RETURNED) or allocation.buffer not in outputs
                                      or not sympy.sympify(allocation.nbytes).is_Integer for allocation in allocations):
                break
            if sum(int(allocation.nbytes) for allocation in allocations) < threshold:
                break
            start -= 1
        return start

    def _live_into(self, tail: int) -> list:
        """The wrapper names the head hands to the tail: what the tail's steps read, and what the graph
        returns, that the tail does not make (inputs, and buffers of earlier steps)."""
        made, wanted = set(), []
        for step, step_plan in zip(self.scheduled.steps[tail:], self.memory_plan.steps[tail:]):
            local = step.local_buffers if isinstance(step, Kernel) else set()
            for name in sorted(step_buffers(step) - local):
                if name not in made and name not in self.graph.constants and name not in wanted:
                    wanted.append(name)
            made |= {allocation.buffer for allocation in step_plan.allocations}
        for output in self.graph.outputs:
            if isinstance(output, TensorArg) and output.buffer not in made and output.buffer not in wanted \
                    and output.buffer not in self.graph.constants:
                wanted.append(output.buffer)
        return [self.name(name) for name in wanted if name not in made]

    def _index_status_for(self, kernel: Kernel, module: ModuleSource) -> str:
        """The wrapper's name of the index-error flag of `kernel`'s device, allocated on first use:
        Triton kernels flag out-of-range gather indices (check_index) in one int32 per device that
        the module owns. (C++ kernels return their flag instead: CppKernelSource.launch.)"""
        device = self.graph.buffers[kernel.nodes[0].outputs[0]].device
        name = f"{INDEX_STATUS}_{device.type}{device.index if device.index is not None else ''}"
        if name not in module.constants:
            with _torch.real_tensors():  # compiling runs under the fake mode of the graph's inputs
                module.constants[name] = torch.zeros(1, dtype=torch.int32, device=device)
        self.index_status_kernels.setdefault(name, []).append(kernel.name)
        return name

    def _index_status_checks(self, module: ModuleSource) -> list[str]:
        """After the last kernel, for each device's flag: IndexStatus.after_call (runtime/support.py),
        which raises IndexError when a kernel flagged an index (on CUDA, by default, at a later call,
        without a host sync). config.gpu_index_checks "off" leaves CUDA's flag unread: an
        out-of-range index then reads element 0, silently."""
        from kiln.config import config
        from kiln.runtime.support import IndexStatus

        lines = []
        for name, kernels in self.index_status_kernels.items():
            if name.startswith(f"{INDEX_STATUS}_cuda") and config.gpu_index_checks == "off":
                continue
            with _torch.real_tensors():  # its pinned host copy is a real tensor, made under the graph's fake mode
                module.constants[f"{name}_check"] = IndexStatus(module.constants[name], "kernel " + ", ".join(kernels))
            module.index_status.append(f"{name}_check")
            lines.append(f"{name}_check.after_call()")
        return lines

    def _used_symbols(self) -> set:
        used = set()
        for buffer in self.graph.buffers.values():
            for expr in (*buffer.layout.size, *buffer.layout.stride, buffer.layout.offset):
                used |= sympy.sympify(expr).free_symbols
        for step in self.scheduled.steps:
            if isinstance(step, Kernel):
                used |= sympy.sympify(step.row_numel * step.col_numel).free_symbols
        for output in self.graph.outputs:
            if isinstance(output, sympy.Basic):
                used |= output.free_symbols
        return {symbol for symbol in used if symbol in self.symbols}

    def _header(self, module: ModuleSource) -> list[str]:
        lines = ["# kiln generated wrapper", "import torch", "from kiln.runtime.support import empty_strided, "
                 "empty_strided_huge, restride, view_at, cdiv, flatten_result as _flatten_result, raise_index_error", ""]
        if self.cuda_allocators:
            lines.insert(-1, "from kiln.runtime.support import cuda_allocator")
        return lines

    def _allocate(self, allocation) -> str:
        """The line that makes a buffer the plan says the wrapper allocates (memory.Allocation)."""
        buffer_name = allocation.buffer
        buffer = self.graph.buffers[buffer_name]
        if allocation.kind == SCRATCH:
            return f"{buffer_name} = _scratch[{allocation.scratch_index}]"
        sizes = self.py_tuple(buffer.layout.size)
        strides = self.py_tuple(buffer.layout.stride)
        if allocation.kind == HUGE:
            return f"{buffer_name} = empty_strided_huge({sizes}, {strides}, {buffer.dtype})"
        if buffer.device.type == "cuda":
            index = buffer.device.index if buffer.device.index is not None else 0
            allocator = f"_empty_cuda{index}"
            self.cuda_allocators[allocator] = index
            return f"{buffer_name} = {allocator}({sizes}, {strides}, {buffer.dtype})"
        return (f"{buffer_name} = empty_strided({sizes}, {strides}, device='{buffer.device}', "
                f"dtype={buffer.dtype})")

    def _kernel_call(self, kernel: Kernel, module: ModuleSource) -> list[str]:
        source = self.backend.generate_kernel(kernel, self.graph)
        self.backend.kernel_generated(source)
        module.kernel_sources.append(source)
        module.kernels[kernel.name] = source.listing
        lines = [self._allocate(allocation) for allocation in self.step_plans[kernel.name].allocations]
        if source.skip:
            return lines
        buffers = [self._index_status_for(kernel, module) if name == INDEX_STATUS else self.name(name)
                   for name in source.buffer_args]
        args = buffers + [self.py(size) for size in source.size_args]
        return lines + [self.backend.kernel_call(source, args, self.py)]

    def _extern_call(self, extern: Extern, module: ModuleSource) -> list[str]:
        module.externs[extern.name] = extern.op

        def arg_source(value):
            if isinstance(value, TensorArg):
                return self._view(value)
            if isinstance(value, (list, tuple)):
                inner = "".join(arg_source(item) + ", " for item in value)
                return f"[{inner}]" if isinstance(value, list) else f"({inner})"
            if isinstance(value, sympy.Basic):
                return self.py(value) if not value.is_Float else repr(float(value))
            if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
                return f"torch.{value}".replace("torch.torch.", "torch.") if not isinstance(value, torch.device) \
                    else f"torch.device('{value}')"
            if isinstance(value, float):
                return repr(value) if value == value and abs(value) != float("inf") else f"float('{value}')"
            if value is None or isinstance(value, (bool, int, str)):
                return repr(value)
            # Anything else (an op, a function, an enum): bound into the wrapper's namespace by name,
            # since its repr is not Python that rebuilds it.
            name = f"_const{len(module.constants)}"
            module.constants[name] = value
            return name

        args = [arg_source(value) for value in extern.args]
        args += [f"{key}={arg_source(value)}" for key, value in extern.kwargs.items()]
        if extern.writes_into_outputs:
            (allocation,) = self.step_plans[extern.name].allocations
            assert allocation.kind in ALLOCATED_BY_WRAPPER, allocation
            return [self._allocate(allocation), f"{extern.name}({', '.join(args + [f'out={allocation.buffer}'])})"]
        call = f"{extern.name}({', '.join(args)})"
        targets = _flatten_structure(extern.output_structure)
        names = [extern.outputs[position] if isinstance(position, int) else "_" for position in targets]
        if not isinstance(extern.output_structure, (list, tuple)):
            lines = [f"{names[0]} = {call}"]
        else:
            lines = [f"{''.join(name + ', ' for name in names)}= {_unpack(call, extern.output_structure)}"]
        from kiln.config import config

        if config.check_extern_strides:
            for name in extern.outputs:
                buffer = self.graph.buffers[name]
                stride = self.py_tuple(buffer.layout.stride)
                size = self.py_tuple(buffer.layout.size)
                dtype = str(buffer.dtype)  # "torch.float32"
                # The dtype too: C++ kernels read an extern's result as the IR's dtype says
                # (_batch_norm_with_update returns bf16 running stats its meta calls float32).
                lines.append(f"if {name} is not None and ({name}.stride() != {stride} or {name}.dtype != {dtype}): "
                             f"{name} = restride({name}, {size}, {stride}, {dtype})")
        return lines

    def _view(self, arg: TensorArg) -> str:
        """Source for a view of a buffer with the arg's layout.

        `view_at` counts the offset from the tensor's own start (`torch.as_strided` counts
        from the storage's): graph inputs, extern results and scratch views may themselves
        be views (a split's second part) with a storage offset of their own. It is torch's
        C++ `_reinterpret_tensor` where torch has it (kiln/runtime/support.py).
        """
        buffer = self.graph.buffers[arg.buffer]
        if arg.layout == buffer.layout:
            return self.name(arg.buffer)
        size, stride = self.py_tuple(arg.layout.size), self.py_tuple(arg.layout.stride)
        offset = self.py(arg.layout.offset)
        return f"view_at({self.name(arg.buffer)}, {size}, {stride}, {offset})"

    def _output(self, output) -> str:
        if isinstance(output, TensorArg):
            return self._view(output)
        if isinstance(output, sympy.Basic):
            return self.py(output)
        return repr(output)


def _flatten_structure(structure) -> list:
    """Output positions in the op's flattened result (non-tensor leaves are not ints)."""
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in _flatten_structure(item)]
    return [structure]


def _unpack(call: str, structure) -> str:
    """Nested tuple results are flattened so one assignment unpacks them."""
    if all(not isinstance(item, (list, tuple)) for item in structure):
        return call
    return f"_flatten_result({call})"



def generate_wrapper(scheduled: ScheduledGraph, memory_plan: MemoryPlan) -> ModuleSource:
    """The host program of `scheduled`, rendering `memory_plan` (kiln/schedule/memory.py `plan_memory`)."""
    return WrapperGenerator(scheduled, memory_plan).generate()


__all__ = ["KernelSource", "ModuleSource", "generate_wrapper"]
