"""`kiln verify`: is this install able to compile, and are its results right?

It prints the versions that matter, detects the toolchains (the C++ compiler and OpenMP
through kiln/runtime/cpp_build.py's own detection, Triton, CUDA), then compiles four small
programs (a pointwise chain, a reduction, a softmax, a small MLP module) with kiln on each
available target: the CPU with the C++ backend, the CPU with the Triton kernels under Triton's
interpreter (when TRITON_INTERPRET=1 or --triton-interpreter: slow), and CUDA. A check passes
when the result agrees with eager (kiln.testing.compare, with a float64 reference) and kiln
compiled the program itself: at least one kernel generated, no graph run eagerly, no warning.
For what is missing it says what to install. The exit status is 0 only when every check that
could run passed (and at least one could).
"""
from __future__ import annotations

import copy
import importlib.metadata
import platform
import sys
import time
import traceback
from dataclasses import dataclass

import torch


@dataclass
class Target:
    """Where a check runs: a device and, for the CPU, kiln's backend for it."""

    label: str
    device: str
    cpu_backend: str = "cpp"


@dataclass
class Program:
    name: str
    build: object  # device -> (callable, args)


def _pointwise_chain(device):
    def chain(x, y):
        return torch.sigmoid(x * y + 1.0).exp() - torch.tanh(y) * 0.5
    return chain, (torch.randn(64, 33, device=device), torch.randn(64, 33, device=device))


def _reduction(device):
    def row_sums(x):
        return x.sum(dim=1) + x.amax(dim=1)
    return row_sums, (torch.randn(48, 100, device=device),)


def _softmax(device):
    def softmax(x):
        return torch.softmax(x * 2.0, dim=-1)
    return softmax, (torch.randn(16, 257, device=device),)


class SmallMLP(torch.nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def _mlp(device):
    return SmallMLP().to(device).eval(), (torch.randn(8, 32, device=device),)


PROGRAMS = [Program("pointwise chain", _pointwise_chain), Program("reduction", _reduction),
            Program("softmax", _softmax), Program("small MLP", _mlp)]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> list[str]:
    import kiln

    torch_build = f"{torch.__version__} (CUDA {torch.version.cuda})" if torch.version.cuda else \
        f"{torch.__version__} (CPU build)"
    kiln_version = _version("kiln")
    return [f"python       {platform.python_version()} ({sys.executable})",
            f"torch        {torch_build}",
            f"triton       {_version('triton')}",
            f"transformers {_version('transformers')}",
            f"kiln         {kiln_version} ({kiln.__path__[0]})"]


def detect_cpp() -> tuple[bool, list[str]]:
    """(usable, lines): the C++ compiler and OpenMP, as kiln's C++ backend finds them."""
    from kiln.runtime.cpp_build import CppCompileError, toolchain

    try:
        tools = toolchain()
    except CppCompileError as error:
        return False, [f"C++ compiler  none: {error}",
                       "              install one (Debian/Ubuntu: apt install g++) or set KILN_CPP_COMPILER; "
                       "until then CPU graphs run eagerly"]
    lines = [f"C++ compiler  {tools.compiler} ({tools.version.splitlines()[0] if tools.version else '?'})"]
    if tools.openmp:
        lines.append("OpenMP        yes (kernels run their outer loops on threads)")
    else:
        lines.append("OpenMP        no: kernels run on one thread (g++ ships it in libgomp; for clang++ install "
                     "libomp-dev); KILN_CPP_OPENMP=0 when it was turned off on purpose")
    lines.append(f"vector math   {'yes (glibc libmvec)' if tools.vector_math else 'no (scalar sin/exp/erf)'}")
    return True, lines


def detect_triton() -> tuple[bool, bool, list[str]]:
    """(importable, interpreting, lines)."""
    try:
        import triton
        from triton import knobs
    except Exception as error:  # absent or broken: say which
        return False, False, [f"Triton        not usable ({type(error).__name__}: {error}): install the triton that "
                              "your torch requires (pip install triton) for GPU kernels"]
    interpreting = bool(getattr(knobs.runtime, "interpret", False))
    return True, interpreting, [f"Triton        {triton.__version__}; interpreter "
                                f"{'on (TRITON_INTERPRET=1)' if interpreting else 'off'}"]


def detect_cuda() -> tuple[bool, list[str]]:
    if not torch.cuda.is_available():
        why = "this torch is a CPU build" if not torch.version.cuda else "no GPU visible to this torch"
        return False, [f"CUDA          not available ({why}): GPU kernels not checked; on an NVIDIA GPU install "
                       "torch's CUDA build (https://pytorch.org/get-started/locally/)"]
    return True, [f"CUDA          {torch.version.cuda}; {torch.cuda.get_device_name(0)}"]


def check(program: Program, target: Target) -> tuple[bool, str]:
    """(passed, what happened) for one program on one target."""
    import kiln
    from kiln.config import config
    from kiln.debug.explain import ExplainReport, _recording
    from kiln.testing import compare, to_float64

    torch.manual_seed(0)
    function, args = program.build(target.device)
    eager = function(*args)
    if isinstance(function, torch.nn.Module):
        reference = copy.deepcopy(function).double()(*to_float64(args))
    else:
        reference = function(*to_float64(args))
    report = ExplainReport()
    try:
        # progress_after_s=-1: a long first build reports its progress as a warning, which is not a problem here
        with config.patch(strict=True, cpu_backend=target.cpu_backend, progress_after_s=-1), _recording(report):
            actual = kiln.compile(function)(*args)
    except Exception as error:
        first_line = "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()[0]
        return False, f"compile or run failed: {first_line}"
    verdict = compare(actual, eager, reference)
    kernels = sum(graph.kernels or 0 for graph in report.graphs)
    problems = []
    if not verdict.ok:
        problems.append(f"wrong result: {verdict.message}")
    if not report.graphs:
        problems.append("kiln captured no graph")
    problems += [f"{graph.name} ran eagerly: {graph.fallback}" for graph in report.graphs if graph.fallback]
    if report.graphs and kernels == 0:
        problems.append("no kernel was generated")
    problems += [f"warning: {message}" for message in report.warnings]
    if problems:
        return False, "; ".join(problems)
    graphs = len(report.graphs)
    return True, f"{graphs} graph{'s' * (graphs != 1)}, {kernels} kernel{'s' * (kernels != 1)}, matches eager"


def run(triton_interpreter: bool = False) -> int:
    print("kiln verify")
    print()
    for line in versions():
        print(line)
    print()
    cpp_ok, cpp_lines = detect_cpp()
    triton_ok, interpreting, triton_lines = detect_triton()
    cuda_ok, cuda_lines = detect_cuda()
    for line in cpp_lines + triton_lines + cuda_lines:
        print(line)
    print()

    targets, skipped = [], []
    if cpp_ok:
        targets.append(Target("cpu, C++", "cpu", "cpp"))
    else:
        skipped.append("cpu, C++: no C++ compiler (see above)")
    if triton_ok and (interpreting or triton_interpreter):
        targets.append(Target("cpu, Triton interpreter", "cpu", "triton"))
    elif triton_ok:
        skipped.append("cpu, Triton interpreter: slow, not asked (--triton-interpreter or TRITON_INTERPRET=1)")
    if cuda_ok and triton_ok:
        targets.append(Target("cuda, Triton", "cuda"))

    results = []
    for target in targets:
        for program in PROGRAMS:
            start = time.perf_counter()
            passed, message = check(program, target)
            seconds = time.perf_counter() - start
            results.append(passed)
            print(f"{'ok  ' if passed else 'FAIL'}  {target.label:24} {program.name:16} {message} ({seconds:.1f} s)",
                  flush=True)
    for line in skipped:
        print(f"skip  {line}")
    print()
    if not targets:
        print("FAILED: kiln can compile for no device here: install a C++ compiler (apt install g++) for the CPU, "
              "or use a CUDA GPU with torch's CUDA build and Triton")
        return 1
    failed = results.count(False)
    if failed:
        print(f"FAILED: {failed} of {len(results)} checks failed on {'; '.join(t.label for t in targets)}. "
              "Rerun a failing program with KILN_DEBUG=1 to see each stage, and report it with this output.")
        return 1
    print(f"OK: {len(results)} checks passed on {'; '.join(t.label for t in targets)}")
    return 0
