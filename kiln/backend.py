"""`compile_graph(gm, example_inputs) -> callable`: kiln's backend, stage by stage.

This is the `torch.compile` backend contract. The pipeline reads top to bottom:

    aot_compile (kiln/aot: functionalize, decompose, joint forward/backward, partition)
    ->  patterns (lowering/patterns.py: ATen graph -> ATen graph, oneDNN post-ops)
    ->  lower (ATen -> LoopIR)  ->  schedule (fuse into kernels)
    ->  optimize (schedule/passes.py, LoopIR -> LoopIR: reduce_strength, cse, loop_variables)
    ->  plan_memory (schedule/memory.py)
    ->  codegen (the device's KernelBackend from codegen/backends.py, and the wrapper)
    ->  load (runtime/: compile and cache the kernels, load the module)

Each stage after aot_compile is one named call in `_compile_aten_graph`; the names (and each
optimize pass's) key the KILN_DEBUG dumps and the stage timings. `_check(stage, form)` verifies
the LoopIR after lower, split_reductions (inside schedule), schedule and optimize
(`config.verify_ir`; unset: under KILN_STRICT).
A failure in any stage logs a warning and runs that graph eagerly, unless
`fullgraph=True` or `KILN_STRICT=1`. docs/design/backend.md describes each stage.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import math
import traceback
from typing import Callable

import torch

from kiln import _torch
from kiln.config import config
from kiln.errors import KilnCompileError
from kiln.runtime.heap import frozen_heap

log = logging.getLogger("kiln")

LADDER = ("eager", "aot_eager", "kiln")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# As torch.compile's: these modes replay graphs on CUDA through CUDA graphs (runtime/cudagraphs.py) ...
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# ... and these autotune (config.matmul_template, config.autotune_kernels: docs/design/templates.md).
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")

# What names one graph, times its stages and writes its KILN_DEBUG dumps: `factory(gm)` returns an
# object with `name`, `timings` ({stage: seconds}), `stage(name)` (a context manager that times one
# stage), `write(filename, text)`, `write_kernel(kernel_source, graph, example_inputs)` (a kernel's
# file) and `finish()`. kiln.debug registers its GraphDump here when it is
# imported (kiln/__init__.py imports it, so it is registered before anything compiles): debug
# observes the pipeline without the pipeline importing the layer above it.
_stage_recorder_factory: Callable | None = None


# Whether the stage recorders keep what they are given (KILN_DEBUG, the HTML report): then every graph is
# compiled stage by stage, the whole-graph caches bypassed, so that what they show is complete.
_stages_wanted: Callable[[], bool] = lambda: False


def set_stage_recorder(factory: Callable, wanted: Callable[[], bool] = lambda: False) -> None:
    """Register `factory(gm)`, the maker of each graph's stage recorder (kiln.debug's GraphDump.new), and
    `wanted()`, whether the recorders it makes keep the stages."""
    global _stage_recorder_factory, _stages_wanted
    _stage_recorder_factory, _stages_wanted = factory, wanted


__all__ = ["AUTOTUNE_MODES", "CUDA_GRAPH_MODES", "KilnCompileError", "LADDER", "MODES", "checked_mode", "compile_aten_graph", "compile_graph",
           "graph_compiler", "register", "run_with_options", "set_stage_recorder"]


def checked_mode(mode: str | None, caller: str) -> str:
    """`mode` (None: "default") if it is one of MODES, else ValueError listing them."""
    mode = "default" if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"{caller}: unknown mode {mode!r}; choose one of {MODES}")
    return mode


def _mode_options(mode: str) -> dict:
    """The kiln.config options a mode implies where the user left them at "default": mode="max-autotune"
    times 2-d products' Triton templates against cuBLAS (config.matmul_template) and CUDA kernels' block
    sizes and warps (config.autotune_kernels)."""
    if mode not in AUTOTUNE_MODES:
        return {}
    return {name: "auto" for name in ("matmul_template", "autotune_kernels") if getattr(config, name) == "default"}


def run_with_options(compiled: Callable, options: dict) -> Callable:
    """`compiled`, each call of which runs with the kiln.config `options` in force (itself when there are none);
    the wrapper keeps `compiled`'s attributes (`_boxed_call`, a dispatcher's `entries`)."""
    if not options:
        return compiled

    @functools.wraps(compiled)
    def call(*args, **kwargs):
        with config.patch(**options):
            return compiled(*args, **kwargs)

    call.__kiln_compiled__ = compiled  # a trace that calls it traces `compiled`'s function instead
    return call


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = "default",
                  fullgraph: bool = False, options: dict | None = None) -> Callable:
    """kiln's backend: compile one torch-level FX graph into a callable.

    `torch.compile(model, backend="kiln", mode=..., options=...)` passes its mode and options here:
    `options` are kiln.config options (an unknown name raises listing the valid ones), in force while
    this graph compiles and each time it runs.
    """
    mode = checked_mode(mode, "kiln backend")
    options = config.checked(options or {})
    with config.patch(**options), frozen_heap():
        return run_with_options(_compile_graph(gm, example_inputs, mode, fullgraph), options)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: list, mode: str, fullgraph: bool) -> Callable:
    from kiln.aot import aot_compile, plain
    from kiln.runtime import compile_workers

    try:
        _check_supported_inputs(example_inputs)
        not_plain = plain.not_plain_reason(gm, example_inputs, private_writes=True)
        if not_plain is not None and config.log_enabled("perf"):
            log.warning("kiln: AOTAutograd traces this graph (two traces, not one): %s", not_plain)
        is_plain = not_plain is None
        plain_key = None if _stages_wanted() else plain.key_of(gm, example_inputs, mode)
        if plain_key is not None:
            warm = _load_plain_inference(plain_key, gm, example_inputs, mode, fullgraph)
            if warm is not None:
                return warm
        if any(isinstance(value, torch.Tensor) and value.is_cuda for value in example_inputs):
            compile_workers.prestart()  # Triton's compile processes start while the graph is traced and lowered
        compile_aten = functools.partial(compile_aten_graph, mode=mode, fullgraph=fullgraph)
        token = _compiled_graphs.set([])
        try:
            compiled = aot_compile(gm, example_inputs, compile_aten, functools.partial(compile_aten, inference=True),
                                   plain=is_plain and config.plain_trace)
            if plain_key is not None:
                plain.link(plain_key, _compiled_graphs.get(), gm, example_inputs)
        finally:
            _compiled_graphs.reset(token)
        return compiled
    except KilnCompileError:
        raise
    except Exception as error:  # AOTAutograd itself failed: the graph runs as captured
        if _torch.is_tensorify_restart(error):
            raise  # the frontend (Dynamo's or kiln's) traces again with its floats specialized
        if config.strict or fullgraph:
            raise KilnCompileError(f"kiln could not trace the graph to ATen: {error}") from error
        reason = "".join(traceback.format_exception_only(type(error), error)).strip()
        log.warning("kiln: a graph runs eagerly (AOTAutograd could not trace it): %s (set KILN_STRICT=1 to raise)",
                    reason)
        return gm.forward


def _check_supported_inputs(example_inputs: list) -> None:
    """Refuse, with a reason, inputs the pipeline cannot trace (AOTAutograd's fake tensors reject them)."""
    for position, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            raise NotImplementedError(f"input {position} has layout {value.layout}: kiln compiles strided tensors only")


# Each ATen graph compile_aten_graph compiled inside one _compile_graph call, as (its whole-graph cache key
# when its module is in the cache, whether it is an inference graph, its input, output and node counts):
# kiln/aot/plain.py links a plain inference graph's torch-level key to the one it yielded.
_compiled_graphs: contextvars.ContextVar[list | None] = contextvars.ContextVar("kiln_compiled_graphs", default=None)


def _load_plain_inference(key: str, gm: torch.fx.GraphModule, example_inputs: list, mode: str,
                          fullgraph: bool) -> Callable | None:
    """A warm start without AOTAutograd: the module of the ATen graph that a plain inference graph's `key`
    links to (kiln/aot/plain.py), called as AOTAutograd's wrapper calls it; None when there is none."""
    from kiln.aot import plain
    from kiln.codegen.backends import backend_for
    from kiln.runtime import graph_cache

    if _stage_recorder_factory is None:
        return None
    linked = graph_cache.load_link(key)
    found = graph_cache.load(linked[0]) if linked is not None else None
    if found is None:
        if config.log_enabled("perf"):
            log.warning("kiln: the whole-graph cache has no module for this plain graph, so it is traced to ATen: %s",
                        "its key links to no ATen graph (never compiled with these inputs, modes and options; or "
                        "the compiling process could not link it, which KILN_LOGS=perf there says)" if linked is None
                        else "the ATen graph its key links to is not in the whole-graph cache")
        return None
    facts = linked[1]
    module_source, device_type = found
    module_source.backend = backend_for(device_type)
    dump = _stage_recorder_factory(gm)
    try:
        compiled = _load(module_source, gm, dump, mode, scheduled=None, fallback=plain.eager_fallback(gm, facts))
        if fullgraph:  # a kernel failing at its first launch raises too
            compiled.strict = True
        compiled = _with_cuda_graphs(compiled, dump.name, example_inputs, mode, inference=True, gm=gm)
    except Exception as error:  # noqa: BLE001 (compiled as on a cold start instead)
        log.warning("kiln: graph %s: its cached module could not be loaded (%s: %s); compiling it", dump.name,
                    type(error).__name__, error)
        return None
    log.debug("kiln: graph %s: loaded from the whole-graph cache without tracing it to ATen", dump.name)
    wrapper = plain.runtime_wrapper(compiled, facts)
    wrapper.kiln_graph = (dump.name, facts["aten_nodes"], dict(dump.timings))  # for kiln.explain
    return wrapper


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str = "default",
                       fullgraph: bool = False, inference: bool = False) -> Callable:
    """Compile one functional ATen graph (from kiln/aot) into kernels and a wrapper; with
    mode="reduce-overhead" or "max-autotune", a graph on CUDA (inference, or a training step's forward or
    backward) replays through a CUDA graph."""
    from kiln.ir import IRVerificationError
    from kiln.runtime import autotune

    if _stage_recorder_factory is None:
        raise KilnCompileError("kiln.backend has no stage recorder: import kiln (kiln.debug registers it)")
    dump = _stage_recorder_factory(gm)
    try:
        with config.patch(**_mode_options(mode)), autotune.graph_budget(), frozen_heap():
            compiled, cached_key = _compile_aten_graph(gm, example_inputs, dump, mode, inference)
        recorded = _compiled_graphs.get()
        if recorded is not None:
            (output,) = [node for node in gm.graph.nodes if node.op == "output"]
            recorded.append((cached_key, inference, sum(node.op == "placeholder" for node in gm.graph.nodes),
                             len(torch.utils._pytree.tree_leaves(output.args[0])),
                             sum(node.op == "call_function" for node in gm.graph.nodes)))
        if fullgraph and hasattr(compiled, "strict"):  # a kernel failing at its first launch raises too
            compiled.strict = True
        return _with_cuda_graphs(compiled, dump.name, example_inputs, mode, inference=inference, gm=gm)
    except Exception as error:
        if isinstance(error, IRVerificationError) and config.strict:
            raise  # a malformed graph is kiln's bug: raised as it is, naming the stage that made it
        if config.strict or fullgraph:
            raise KilnCompileError(f"kiln could not compile graph {dump.name}: {error}") from error
        reason = "".join(traceback.format_exception_only(type(error), error)).strip()
        log.warning("kiln: graph %s runs eagerly: %s (set KILN_STRICT=1 to raise)", dump.name, reason)
        dump.write("fallback.txt", traceback.format_exc())
        return _torch.make_boxed_func(gm)


def _with_cuda_graphs(compiled, name: str, example_inputs: list, mode: str, *, inference: bool,
                      gm: torch.fx.GraphModule | None = None) -> Callable:
    """`compiled`, replayed through CUDA graphs where its mode has them: reduce-overhead and max-autotune with
    torch.compile's semantics (a result is valid until the next call; a training graph's saved tensors and
    gradients, until the caller drops them); the default mode, under
    `config.default_cuda_graphs`, with eager's (results stay valid: runtime/cudagraphs.py, "preserve")."""
    from kiln.aot import training_role
    from kiln.aot.mutations import mutated_inputs
    from kiln.runtime import cudagraphs

    mutated = mutated_inputs(gm) if gm is not None else ()  # read in place by a CUDA graph, never copied
    if mode in CUDA_GRAPH_MODES:  # a training graph's part (forward or backward) decides its runner's policy
        role = training_role(gm) if gm is not None and not inference else {}
        return cudagraphs.wrap(compiled, name, example_inputs, inference=inference, mutated=mutated, **role)
    if mode == "default" and config.default_cuda_graphs:
        launches = getattr(compiled, "kernel_count", 0) + getattr(compiled, "extern_count", 0)
        output_bytes = _output_bytes(gm)
        split = getattr(compiled, "split", None)
        if output_bytes is not None and split is not None:  # the tail's outputs are never copied (cudagraphs.py)
            output_bytes -= split.output_bytes
        return cudagraphs.wrap(compiled, name, example_inputs, inference=inference, preserve=True,
                               launches=launches, output_bytes=output_bytes, mutated=mutated)
    return compiled


def _output_bytes(gm: torch.fx.GraphModule | None) -> int | None:
    """The bytes of `gm`'s tensor outputs, from their traced values (None where a value is missing)."""
    if gm is None:
        return None
    (output,) = [node for node in gm.graph.nodes if node.op == "output"]
    total = 0
    for node in torch.utils._pytree.tree_leaves(output.args[0]):
        if not isinstance(node, torch.fx.Node):
            continue
        value = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(value, torch.Tensor):
            sizes = tuple(value.shape)
            if not all(type(size) is int for size in sizes):  # a symbolic size: int() on it would guard it to this
                return None                                  # value, and every new size would compile again
            total += math.prod(sizes) * value.element_size()
        elif value is None:
            return None
    return total


def _compile_aten_graph(gm, example_inputs, dump, mode, inference=False):
    """(the compiled callable, its whole-graph cache key when its module is in the cache, else None)."""
    from kiln.codegen.backends import backend_for
    from kiln.codegen.wrapper import generate_wrapper
    from kiln.ir import format_graph, graph_device_type
    from kiln.lowering import apply_patterns, lower_graph
    from kiln.runtime import graph_cache
    from kiln.runtime.loader import streamed_compiles
    from kiln.schedule import schedule_graph
    from kiln.schedule.memory import plan_memory
    from kiln.schedule.passes import optimize

    dump.write("aten_graph.py", lambda: gm.print_readable(print_output=False))
    key = None
    if not dump.wanted:  # KILN_DEBUG and the HTML report show the stages a cache hit skips
        with dump.stage("graph_cache"):
            key = graph_cache.key_of(gm, example_inputs, mode, extra=[f"inference {inference}"])
            found = graph_cache.load(key) if key is not None else None
        if found is not None:
            module_source, device_type = found
            module_source.backend = backend_for(device_type)
            return _load(module_source, gm, dump, mode, scheduled=None), key
    with dump.stage("patterns"):
        patterned = apply_patterns(gm)  # gm itself when nothing matched; gm stays the eager fallback
    if patterned is not gm:
        dump.write("aten_graph_patterns.py", lambda: patterned.print_readable(print_output=False))
    with dump.stage("lower"):
        graph = lower_graph(patterned, example_inputs)
    dump.write("loopir_before_fusion.txt", lambda: format_graph(graph))
    _check("lower", graph)
    with dump.stage("schedule"):
        scheduled = schedule_graph(graph, backend_for(graph_device_type(graph)).loop_dependent_ops(), check=_check)
    dump.write("loopir_after_fusion.txt", scheduled.format)
    _check("schedule", scheduled)
    scheduled = optimize(scheduled, dump)  # LoopIR -> LoopIR passes, each dumped and timed
    _check("optimize", scheduled)
    with dump.stage("plan_memory"):
        memory_plan = plan_memory(scheduled, inference=inference)
    dump.write("memory_plan.txt", memory_plan.format)
    with streamed_compiles():  # each CUDA kernel compiles from when its text exists, while the rest is generated
        with dump.stage("codegen"):
            module_source = generate_wrapper(scheduled, memory_plan)
        dump.write("wrapper.py", module_source.wrapper)
        for kernel in module_source.kernel_sources:
            dump.write_kernel(kernel, scheduled.graph, example_inputs)
        if key is not None:
            with dump.stage("graph_cache"):
                if not graph_cache.store(key, module_source, graph_device_type(graph)):
                    key = None
        return _load(module_source, gm, dump, mode, scheduled), key


def _load(module_source, gm, dump, mode, scheduled, fallback=None):
    from kiln.runtime.loader import load_module

    with dump.stage("load"):
        # Triton compiles at a kernel's first launch: a failure there runs this same eager fallback.
        compiled = load_module(module_source, mode=mode, scheduled=scheduled, name=dump.name,
                               fallback=fallback or _torch.make_boxed_func(gm), strict=config.strict)
    dump.finish()
    return compiled


def _check(stage: str, form) -> None:
    """Verify the LoopIR `form` (a Graph or a ScheduledGraph) a stage made, when `config.verify_ir`
    says so (unset: under strict); an IRVerificationError names the stage, the node, the op, the problem.
    The one place the pipeline verifies: after lower, split_reductions (inside schedule), schedule and
    optimize."""
    from kiln.ir import Graph, verify
    from kiln.schedule import verify_scheduled

    if not (config.strict if config.verify_ir is None else config.verify_ir):
        return
    if isinstance(form, Graph):
        verify(form, stage)
    else:
        verify_scheduled(form, stage)


def _eager_backend(gm: torch.fx.GraphModule, example_inputs: list, **_: object) -> Callable:
    """Ladder rung 1: run the captured FX graph as it is."""
    return gm.forward


def _aot_eager_backend(gm: torch.fx.GraphModule, example_inputs: list, **_: object) -> Callable:
    """Ladder rung 2: kiln/aot's functional ATen graph, run by torch without codegen."""
    from kiln.aot import aot_compile

    return aot_compile(gm, example_inputs, lambda aten_gm, _inputs: _torch.make_boxed_func(aten_gm))


def graph_compiler(backend: str, *, mode: str = "default", fullgraph: bool = False) -> Callable:
    """The `compile_graph`-shaped callable for one rung of the ladder."""
    rungs = {"eager": _eager_backend, "aot_eager": _aot_eager_backend, "kiln": compile_graph}
    return functools.partial(rungs[backend], mode=mode, fullgraph=fullgraph)


def register() -> None:
    """`torch.compile(backend="kiln")` (and kiln_eager, kiln_aot_eager) after `import kiln`; idempotent,
    and left to torch for a name it found as a `torch_dynamo_backends` entry point (pyproject.toml)."""
    _torch.register_dynamo_backend("kiln", compile_graph)
    _torch.register_dynamo_backend("kiln_eager", _eager_backend)
    _torch.register_dynamo_backend("kiln_aot_eager", _aot_eager_backend)
