"""Per-graph debug dumps: `KILN_DEBUG=1` writes `kiln_debug/<run>/<graph>/`.

Each graph gets a folder with the ATen graph, LoopIR before and after fusion, the memory
plan, every kernel, the wrapper and `timings.txt` (seconds per stage). A Triton kernel's file is
a script that runs on its own, as Inductor's output_code.py does: the kernel with its decorator,
a builder of example inputs and a main that launches and times it; a C++ kernel's file says what
compiles it. Stage timings are kept even without KILN_DEBUG, so the perf log and `explain()` can
report them. While the HTML report collects (KILN_REPORT, kiln/debug/html_report.py),
`GraphDump.observer` sees each new dump and makes it keep every stage's text in `kept`;
otherwise nothing is kept.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from typing import Callable

from kiln.config import config

log = logging.getLogger("kiln")
_graph_counter = itertools.count()
_RUN_NAME = time.strftime("run_%Y%m%d_%H%M%S") + f"_{os.getpid()}"


class GraphDump:
    # Called with each new dump and its ATen graph; set by kiln.debug.html_report.enable(), None otherwise.
    observer: Callable | None = None

    def __init__(self, name: str, folder: str | None):
        self.name = name
        self.folder = folder
        self.timings: dict[str, float] = {}
        self.kept: dict[str, str] | None = None  # {filename: text} of every write, when an observer asks

    @classmethod
    def keeps_stages(cls) -> bool:
        """Whether the dumps made now keep what they are given (KILN_DEBUG, or an observer: the HTML report)."""
        return bool(config.debug) or cls.observer is not None

    @classmethod
    def new(cls, gm=None) -> "GraphDump":
        name = f"graph_{next(_graph_counter)}"
        folder = None
        if config.debug:
            folder = os.path.join(config.debug_dir, _RUN_NAME, name)
            os.makedirs(folder, exist_ok=True)
        dump = cls(name, folder)
        if cls.observer is not None:
            cls.observer(dump, gm)
        return dump

    def write_kernel(self, kernel, graph, example_inputs=()) -> None:
        """`kernel_<name>.py` (a runnable script) or `.cpp` for one generated kernel (`kernel_file`)."""
        if self.wanted:
            self.write(f"kernel_{kernel.name}{kernel.file_suffix}", kernel_file(kernel, graph, example_inputs))

    @property
    def wanted(self) -> bool:
        """Whether a write is kept anywhere (KILN_DEBUG's folder, or the HTML report's `kept`)."""
        return self.folder is not None or self.kept is not None

    def write(self, filename: str, text: str | Callable[[], str]) -> None:
        """Keep `text` as `filename`; a callable is called only when the text is wanted, since
        rendering a big graph's forms takes a noticeable part of a compile."""
        if not self.wanted:
            return
        if callable(text):
            text = text()
        if self.kept is not None:
            self.kept[filename] = text
        if self.folder is None:
            return
        with open(os.path.join(self.folder, filename), "w") as handle:
            handle.write(text)

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = time.perf_counter() - start

    def finish(self) -> None:
        report = "\n".join(f"{stage:10} {seconds * 1000:9.1f} ms" for stage, seconds in self.timings.items())
        self.write("timings.txt", report + "\n")
        if config.log_enabled("perf"):
            log.warning("kiln: %s compile stages:\n%s", self.name, report)
        if self.folder is not None and config.log_enabled("kernels"):
            log.warning("kiln: %s dumped to %s", self.name, self.folder)


# ---- kernel files: a Triton kernel runs on its own; a C++ one says what builds it ----

DEFAULT_SIZE = 16  # a size symbol whose value the compile's example inputs do not give


def kernel_file(kernel, graph, example_inputs=()) -> str:
    """The dumped text of one generated kernel: for Triton, a script that builds example inputs,
    launches the kernel as kiln/runtime/launch.py does and times it (`python kernel_k0.py`); for C++,
    the listing under a header saying how kiln builds it."""
    if kernel.file_suffix == ".cpp":
        return _cpp_kernel_file(kernel)
    return _triton_kernel_file(kernel, graph, _size_values(graph, example_inputs))


def _size_values(graph, example_inputs) -> dict:
    """{size symbol name: int} read from the compile's example inputs (their positions are the graph's inputs)."""
    import sympy

    values: dict = {}
    if len(graph.inputs) != len(example_inputs):
        return values
    for graph_input, example in zip(graph.inputs, example_inputs):
        try:
            if graph_input.kind == "symbol" and graph_input.symbol is not None:
                values.setdefault(str(graph_input.symbol), int(example))
            elif graph_input.kind == "tensor":
                layout = graph_input.buffer.layout
                for dim, (size, stride) in enumerate(zip(layout.size, layout.stride)):
                    if isinstance(size, sympy.Symbol):
                        values.setdefault(str(size), int(example.size(dim)))
                    if isinstance(stride, sympy.Symbol):
                        values.setdefault(str(stride), int(example.stride(dim)))
        except (TypeError, ValueError, RuntimeError, AttributeError):  # a symbolic value without a hint
            continue
    return values


def _triton_kernel_file(kernel, graph, known_sizes: dict) -> str:
    import sympy

    from kiln.codegen.triton import INDEX_STATUS
    from kiln.runtime.launch import COMPILE_OPTIONS

    symbols = set()
    spans = []
    for name in kernel.buffer_args:
        span = sympy.Integer(1) if name == INDEX_STATUS else sympy.sympify(graph.buffers[name].layout.storage_span())
        spans.append(span)
        symbols |= span.free_symbols
    for expression in list(kernel.size_args) + [kernel.xnumel]:
        symbols |= sympy.sympify(expression).free_symbols
    sizes = {str(symbol): known_sizes.get(str(symbol), DEFAULT_SIZE) for symbol in sorted(symbols, key=str)}
    buffers = []
    for name, dtype, span in zip(kernel.buffer_args, kernel.pointer_dtypes, spans):
        kind = "zeros" if name == INDEX_STATUS else "random"
        buffers.append(f"        ({name!r}, {_source(span)}, {str(dtype)!r}, {kind!r}),")
    constexprs = kernel.constexprs
    source = kernel.source.replace(f"\ndef {kernel.function_name}(", f"\n@triton.jit\ndef {kernel.function_name}(", 1)
    return f'''"""kiln kernel {kernel.name} (Triton), dumped by KILN_DEBUG: runnable on its own.

    python {"kernel_" + kernel.name}.py                      # on a CUDA GPU: launches it and times it (do_bench)
    TRITON_INTERPRET=1 python {"kernel_" + kernel.name}.py   # on a CPU: runs it once under Triton's interpreter

Generated for {kernel.device_type}. The example inputs are random tensors of the kernel's buffers'
sizes and dtypes; SIZES holds the size symbols' values (from the compile's example inputs where
known, else {DEFAULT_SIZE}): edit them to try other sizes. The launch is kiln's (kiln/runtime/launch.py):
a 1-d grid of cdiv(xnumel, {kernel.xblock}) programs, constexprs {constexprs}, options {kernel.launch_options},
compile options {COMPILE_OPTIONS}.
"""
{source}

# ---- example inputs and launch ----
import sys
import time

import torch

SIZES = {sizes!r}
CONSTEXPRS = {constexprs!r}
OPTIONS = {kernel.launch_options!r}
COMPILE_OPTIONS = {COMPILE_OPTIONS!r}


def make_inputs(device):
    """(buffers, ints) for one launch: every pointer argument, then every int argument."""
    {"" if not sizes else ", ".join(sizes) + ", = SIZES.values()"}
    buffers = []
    for name, elements, dtype, kind in [
{chr(10).join(buffers)}
    ]:
        dtype = getattr(torch, dtype.replace("torch.", ""))
        if kind == "zeros" or dtype == torch.bool:
            tensor = torch.zeros(elements, dtype=dtype, device=device)
        elif dtype.is_floating_point or dtype.is_complex:
            tensor = torch.randn(elements, dtype=dtype, device=device)
        else:
            tensor = torch.randint(0, 2, (elements,), dtype=dtype, device=device)  # small: in range as an index
        buffers.append(tensor)
    ints = [{", ".join(_source(size) for size in kernel.size_args)}]
    return buffers, ints


def launch(buffers, ints):
    {"" if not sizes else ", ".join(sizes) + ", = SIZES.values()"}
    xnumel = {_source(kernel.xnumel)}
    grid = (triton.cdiv(xnumel, {kernel.xblock}),)
    {kernel.function_name}[grid](*buffers, *ints, **CONSTEXPRS, **OPTIONS, **COMPILE_OPTIONS)


if __name__ == "__main__":
    from triton import knobs

    interpreting = knobs.runtime.interpret
    if interpreting:
        try:
            import kiln.ir.ops  # noqa: F401  gives Triton's interpreter the libdevice functions kiln's kernels call
        except ImportError:
            print("kiln is not importable here: Triton's interpreter lacks the libdevice functions kiln adds to it "
                  "(kiln/_triton.py), so a kernel calling libdevice fails", file=sys.stderr)
    elif not torch.cuda.is_available():
        raise SystemExit("this kernel needs a CUDA GPU; on a CPU run it under Triton's interpreter: "
                         "TRITON_INTERPRET=1 python " + __file__)
    device = "cpu" if interpreting else "cuda"
    buffers, ints = make_inputs(device)
    if device == "cuda":
        milliseconds = triton.testing.do_bench(lambda: launch(buffers, ints))
        print(f"kernel {kernel.name}: {{milliseconds * 1000:.1f}} us per launch (triton.testing.do_bench)")
    else:
        start = time.perf_counter()
        launch(buffers, ints)
        print(f"kernel {kernel.name}: ran once under Triton's interpreter in {{time.perf_counter() - start:.3f}} s")
'''


def _source(expression) -> str:
    """Python for a sympy size expression over the SIZES names."""
    from kiln.codegen.printing import expr_to_source

    return expr_to_source(expression)


def _cpp_kernel_file(kernel) -> str:
    try:
        from kiln.runtime.cpp_build import toolchain
        tools = toolchain()
        command = f"{tools.compiler} {' '.join(tools.flags)}"
    except Exception as error:  # no compiler here: say so, the rest of the dump stays useful
        command = f"(no C++ compiler found: {type(error).__name__}: {error})"
    return (f"// Built by kiln/runtime/cpp_build.py: kiln's prelude (kiln/codegen/cpp_prelude.py PRELUDE, left out\n"
            f"// of this listing) followed by this source, compiled into a shared library with\n"
            f"//   {command}\n"
            f"// and called through ctypes at its extern \"C\" entry point (pointers, then int64 sizes).\n"
            + kernel.listing)
