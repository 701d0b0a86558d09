"""`kiln.explain(fn, *args, **kwargs)`: what kiln did with one call, as a report.

It compiles `fn` (a function or module) with kiln, calls it once with the arguments,
and records, without changing what runs:
- the frames kiln's frontend traced: each cache entry's guard function, or why the frame
  runs eagerly (the unsupported construct and its source line);
- every graph the backend compiled: ATen nodes, kernels, externs (and which ATen ops),
  the time of each stage, or the reason it fell back to running eagerly;
- every warning kiln logged meanwhile (fallbacks, recompiles).

    report = kiln.explain(model, input_ids)
    print(report)              # readable text, summary first, guards last; fields are plain data for tools
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field


@dataclass
class GraphReport:
    name: str
    aten_nodes: int
    kernels: int | None = None  # None: the graph runs eagerly (see fallback)
    externs: int | None = None
    extern_ops: dict = field(default_factory=dict)  # ATen op -> calls
    stage_seconds: dict = field(default_factory=dict)
    fallback: str | None = None

    def lines(self) -> list[str]:
        head = f"graph {self.name}: {self.aten_nodes} ATen nodes"
        if self.fallback is not None:
            return [head + f", runs eagerly: {self.fallback}"]
        lines = [head + f" -> {self.kernels} kernels, {self.externs} externs"]
        if self.extern_ops:
            lines.append("  externs: " + ", ".join(f"{op} x{count}" for op, count in sorted(self.extern_ops.items())))
        if self.stage_seconds:
            lines.append("  stages: " + ", ".join(f"{stage} {seconds * 1000:.0f} ms"
                                                   for stage, seconds in self.stage_seconds.items()))
        return lines


@dataclass
class FrameReport:
    guard_source: str | None
    eager_reason: str | None

    def lines(self) -> list[str]:
        if self.eager_reason is not None:
            return [f"frame runs eagerly: {self.eager_reason}"]
        guard = (self.guard_source or "").strip().splitlines()
        return ["frame captured; guard function:"] + ["  " + line for line in guard]


@dataclass
class BreakReport:
    reason: str
    location: str  # file:line in function
    frame: str  # the compiled function (or resume function) whose entry breaks there

    def lines(self) -> list[str]:
        return [f"graph break in {self.frame}: {self.reason}", f"  at {self.location}"]


@dataclass
class ExplainReport:
    frames: list = field(default_factory=list)  # FrameReport: every frame traced, resume functions included
    graphs: list = field(default_factory=list)  # GraphReport
    breaks: list = field(default_factory=list)  # BreakReport
    warnings: list = field(default_factory=list)  # str
    first_call_seconds: float = 0.0

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    @property
    def eager_frames(self) -> list:
        return [frame for frame in self.frames if frame.eager_reason is not None]

    @property
    def kernel_count(self) -> int:
        return sum(graph.kernels or 0 for graph in self.graphs)

    @property
    def fallback_graphs(self) -> list:
        return [graph for graph in self.graphs if graph.fallback is not None]

    def __str__(self) -> str:
        """The summary first (counts, breaks, graphs, eager frames, warnings), the guard functions last:
        a model's guards run to hundreds of lines."""
        lines = [f"kiln.explain: {len(self.graphs)} graph(s), {len(self.breaks)} graph break(s), "
                 f"{self.kernel_count} kernel(s), {len(self.fallback_graphs)} graph(s) run eagerly, "
                 f"{len(self.frames)} frame(s) ({len(self.eager_frames)} run eagerly), "
                 f"first call {self.first_call_seconds:.2f} s"]
        for graph_break in self.breaks:
            lines += graph_break.lines()
        for graph in self.graphs:
            lines += graph.lines()
        for frame in self.eager_frames:
            lines += frame.lines()
        if self.warnings:
            lines.append("warnings:")
            lines += ["  " + warning for warning in self.warnings]
        for number, frame in enumerate(self.frames):
            if frame.eager_reason is None:
                lines += [f"frame {number}: " + frame.lines()[0]] + frame.lines()[1:]
        return "\n".join(lines)


class _WarningRecorder(logging.Handler):
    def __init__(self, sink: list):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


def _describe_compiled(graph: GraphReport, compiled, timings: dict) -> None:
    graph.kernels, graph.externs = compiled.kernel_count, compiled.extern_count
    for op in compiled.module_source.externs.values():  # also there when the graph came from the graph cache
        graph.extern_ops[str(op)] = graph.extern_ops.get(str(op), 0) + 1
    graph.stage_seconds = dict(timings)


@contextlib.contextmanager
def _recording(report: ExplainReport):
    """Record into `report` the graphs compiled, the frames traced and the graph breaks made meanwhile."""
    from kiln import backend
    from kiln.frontend import dispatcher as frontend

    def on_break(graph_break) -> None:
        report.breaks.append(BreakReport(graph_break.reason, graph_break.location, graph_break.frame))

    def on_capture(_dispatcher, entry) -> None:
        report.frames.append(FrameReport(entry.guard_source, entry.eager_reason))

    original = backend._compile_aten_graph

    def recording(gm, example_inputs, dump, mode, inference=False):
        graph = GraphReport(dump.name, sum(1 for node in gm.graph.nodes if node.op == "call_function"))
        report.graphs.append(graph)
        try:
            compiled, cached_key = original(gm, example_inputs, dump, mode, inference)
        except Exception as error:
            graph.fallback = f"{type(error).__name__}: {error}"
            raise
        _describe_compiled(graph, compiled, dump.timings)
        return compiled, cached_key

    original_plain = backend._load_plain_inference

    def recording_plain(*args, **kwargs):
        """A plain inference graph loaded from the whole-graph cache (no ATen graph compiled)."""
        wrapper = original_plain(*args, **kwargs)
        if wrapper is not None:
            name, aten_nodes, timings = wrapper.kiln_graph
            graph = GraphReport(name, aten_nodes)
            report.graphs.append(graph)
            _describe_compiled(graph, wrapper.__wrapped__, timings)
        return wrapper

    handler = _WarningRecorder(report.warnings)
    logger = logging.getLogger("kiln")
    logger.addHandler(handler)
    backend._compile_aten_graph = recording
    backend._load_plain_inference = recording_plain
    frontend.break_listeners.append(on_break)
    frontend.capture_listeners.append(on_capture)
    try:
        yield
    finally:
        backend._compile_aten_graph = original
        backend._load_plain_inference = original_plain
        logger.removeHandler(handler)
        frontend.break_listeners.remove(on_break)
        frontend.capture_listeners.remove(on_capture)


def explain(fn, *args, **kwargs) -> ExplainReport:
    """Compile `fn` with kiln, call it once with these arguments, and report what happened."""
    from kiln import api  # kiln.compile's module: the kiln package imports this one

    report = ExplainReport()
    with _recording(report):
        compiled = api.compile(fn)
        start = time.perf_counter()
        compiled(*args, **kwargs)
        report.first_call_seconds = time.perf_counter() - start
    return report


__all__ = ["BreakReport", "ExplainReport", "FrameReport", "GraphReport", "explain"]
