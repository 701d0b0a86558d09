"""Record the text kiln generates for a program, stage by stage, without compiling or running kernels.

The texts come from kiln's own debug dump (`KILN_DEBUG`, kiln/debug/dump.py), so they are the
stages `compile_graph` really runs, in its order, whatever passes it gains: the LoopIR before and
after fusion, every kernel, the wrapper. The one piece of the pipeline replaced is loading
(`kiln.runtime.loader.load_module`): each graph gets its eager fallback instead of compiled
kernels, so no g++ and no Triton run, and a program's backward still gets traced and dumped
when its forward runs.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from unittest import mock

import torch

import kiln
from kiln.backend import compile_graph
from kiln.config import OPTIONS

BACKENDS = ("cpp", "triton")  # config.cpu_backend: the C++ kernels, or the Triton kernels (as for a GPU)

# The dump's files a golden text holds, besides kernels (aten_graph.py is torch's text; timings.txt
# is never read).
STAGE_FILES = ("loopir_before_fusion.txt", "loopir_after_fusion.txt")
WRAPPER_FILE = "wrapper.py"


@dataclass
class GraphTexts:
    """One compiled graph's texts: file name in the dump -> text."""

    name: str  # the dump folder's name (graph_<n>), for messages only
    files: dict = field(default_factory=dict)

    def kernels(self) -> dict:
        return {name: text for name, text in self.files.items() if name.startswith("kernel_")}


# Options not reset to their defaults: they do not shape generated code, or record_graphs sets them.
_NOT_CODEGEN_OPTIONS = ("debug", "debug_dir", "logs", "cache_dir", "compile_workers", "strict", "cpu_backend")


def _default_options() -> dict:
    """Every option that shapes generated code at its default, whatever KILN_* the environment sets."""
    return {option.name: option.default for option in OPTIONS if option.name not in _NOT_CODEGEN_OPTIONS}


LOADER = "kiln.runtime.loader.load_module"  # the one pipeline stage the harness replaces


class _EagerGraph:
    """What the harness's loader returns: the graph run eagerly (nothing compiled, a backward still
    gets traced), with the counts a loaded graph reports, which kiln.explain's recorder reads (the
    model tests that call kiln.explain failed under the harness without them)."""

    _boxed_call = True  # AOTAutograd calls it with the argument list, as it calls the fallback

    def __init__(self, fallback, module_source, scheduled):
        self._fallback, self.scheduled = fallback, scheduled
        self.kernel_count = len(module_source.kernel_sources)
        self.extern_count = len(scheduled.externs) if scheduled is not None else 0

    def __call__(self, *args):
        return self._fallback(*args)


def _codegen_only_loader(calls: list):
    def load_module(module_source, *, fallback, scheduled=None, **_):
        calls.append(module_source)
        return _EagerGraph(fallback, module_source, scheduled)
    return load_module


@contextlib.contextmanager
def record_graphs(backend: str):
    """Within the block every graph kiln compiles (strictly, with default options and `backend`
    for CPU tensors) is dumped, not loaded; the list yielded is filled with their `GraphTexts`,
    in compile order, when the block ends."""
    graphs: list = []
    loads: list = []
    with tempfile.TemporaryDirectory(prefix="kiln-golden-") as folder, \
            kiln.config.patch(**_default_options(), debug=True, debug_dir=folder, strict=True, cpu_backend=backend), \
            mock.patch(LOADER, _codegen_only_loader(loads)):
        yield graphs
        graphs.extend(_read_dumps(folder))
    if graphs and not loads:  # the pipeline loads elsewhere now: kernels were compiled, slowly
        raise AssertionError(f"kiln compiled {len(graphs)} graphs without calling {LOADER}: point "
                             "tests/golden/capture.py's LOADER at the stage that loads generated code")


def _read_dumps(folder: str) -> list:
    graph_folders = []
    for run in os.listdir(folder):
        for graph in os.listdir(os.path.join(folder, run)):
            graph_folders.append(os.path.join(folder, run, graph))
    graph_folders.sort(key=lambda path: int(re.sub(r"\D", "", os.path.basename(path)) or 0))
    result = []
    for path in graph_folders:
        texts = GraphTexts(os.path.basename(path))
        for filename in sorted(os.listdir(path)):
            if filename in ("timings.txt",):
                continue
            with open(os.path.join(path, filename)) as handle:
                text = handle.read()
            texts.files[filename] = kernel_listing(text) if filename.startswith("kernel_") else text
        result.append(texts)
    return result


_TRITON_HARNESS = "\n# ---- example inputs and launch ----"
_CPP_HEADER_FIRST, _CPP_HEADER_LAST = "// Built by kiln/runtime/cpp_build.py", "// and called through ctypes"


def kernel_listing(text: str) -> str:
    """The generated kernel itself, from a dumped kernel file. KILN_DEBUG writes a Triton kernel as a
    script that runs on its own (a docstring, the kernel with @triton.jit, then an input builder and a
    main) and a C++ kernel under a header naming this machine's compiler command; goldens and the kernel
    diff compare the kernel only. A file in the older plain format is returned as it is."""
    if text.startswith('"""kiln kernel') and _TRITON_HARNESS in text:
        source = text.split('\n"""\n', 1)[1].split(_TRITON_HARNESS, 1)[0]
        decorator = source.rfind("\n@triton.jit\ndef kernel_")  # the dump's, on the kernel (helpers have their own)
        if decorator >= 0:
            source = source[:decorator] + source[decorator + len("\n@triton.jit"):]
        return source.rstrip("\n") + "\n"
    if text.startswith(_CPP_HEADER_FIRST):
        lines = text.splitlines(keepends=True)
        last = next(index for index, line in enumerate(lines) if line.startswith(_CPP_HEADER_LAST))
        return "".join(lines[last + 1:])
    return text


def run_program(program) -> None:
    """Compile `program` with kiln's graph entry and run it (backward too, when it has one)."""
    inputs = program.make_inputs(torch.Generator().manual_seed(0))
    gm = _traced_with_tuple_output(program.fn)
    with kiln.config.patch(**program.options):
        compiled = compile_graph(gm, list(inputs))
        outputs = compiled(*inputs)
    if program.backward:
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        sum(output.sum() for output in outputs).backward()


def _traced_with_tuple_output(fn) -> torch.fx.GraphModule:
    """`fn` traced by torch.fx, returning a tuple as the torch.compile backend contract asks."""
    gm = torch.fx.symbolic_trace(fn)
    output = next(node for node in gm.graph.nodes if node.op == "output")
    if not isinstance(output.args[0], (tuple, list)):
        output.args = ((output.args[0],),)
        gm.recompile()
    return gm


def render_program(program, backend: str) -> str:
    """The golden text of `program` on `backend`: each graph's LoopIR before and after fusion,
    its kernels and its wrapper, in one file with a header per section."""
    with record_graphs(backend) as graphs:
        run_program(program)
    if not graphs:
        raise AssertionError(f"{program.name}: kiln compiled no graph")
    return render_graphs(graphs)


def render_graphs(graphs: list) -> str:
    sections = []
    for position, graph in enumerate(graphs):
        names = [name for name in STAGE_FILES if name in graph.files]
        names += sorted(graph.kernels())
        names += [WRAPPER_FILE] if WRAPPER_FILE in graph.files else []
        for name in names:
            sections.append(f"===== graph {position}: {name}\n{graph.files[name].rstrip()}\n")
    return "\n".join(sections)
