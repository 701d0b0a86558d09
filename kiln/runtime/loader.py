"""Turn a generated ModuleSource into the callable handed back to the frontend.

A graph's kernels are loaded by the backend that generated them (`module_source.backend`, a
KernelBackend of kiln/codegen/backends.py): Triton kernels here (`load_triton_kernels`), compiled
from their text under the name of their cache file (Triton reads a kernel's source through
`inspect`, which finds the same text in `linecache`), wrapped for the device (compiled for CUDA,
interpreted for CPU), kept in an in-process cache keyed by source hash; C++ kernels are compiled
in parallel and loaded by kiln/runtime/cpp_build.py. They are bound into the wrapper's namespace.
Nothing is imported through `importlib`, so no bytecode cache (`__pycache__`) sits beside the
entries to go stale or corrupt: the in-memory text is what runs, its cache file is where
tracebacks point.
"""
from __future__ import annotations

import contextlib
import linecache
import logging
import threading
import types

from kiln import _triton
from kiln.errors import KilnCompileError
from kiln.runtime.cache import cache_path, source_hash
from kiln.runtime.launch import KernelCompileError

log = logging.getLogger("kiln")

_loaded_kernels: dict = {}


def _execute(source: str, kind: str, namespace: dict) -> None:
    """Run generated `source` in `namespace`, under the name of its cache file (kiln/runtime/cache.py)."""
    path = cache_path(kind, source)
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)  # no mtime: never evicted
    namespace["__file__"] = path
    exec(compile(source, path, "exec"), namespace)


def load_kernel(name: str, source: str, device_type: str):
    """The Triton kernel `name` defined by `source`, for `device_type` (loaded once per process)."""
    key = (source_hash(source), device_type)
    if key not in _loaded_kernels:
        module = types.ModuleType(f"kiln_kernel_{key[0][:16]}")
        _execute(source, "triton", module.__dict__)
        _loaded_kernels[key] = _triton.jit_for_device(getattr(module, name), device_type)
    return _loaded_kernels[key]


def load_triton_kernels(kernel_sources: list) -> dict:
    """{kernel name: launch function} for a graph's Triton kernel sources (kiln/codegen/triton.py).
    With `config.parallel_compile` (on by default), the graph's distinct CUDA kernels are
    compiled now, in parallel (`config.compile_workers` threads; runtime/launch.py compile_ahead), rather
    than one after another at their first launches."""
    launchers = {kernel.name: _launcher(kernel) for kernel in kernel_sources}
    try:
        _compile_ahead(kernel_sources)
    except Exception as error:  # an optimization only: each kernel still compiles at its first launch
        log.warning("kiln: compiling kernels ahead failed (%s: %s); they compile at their first launch",
                    type(error).__name__, error)
    return launchers


def _compile_ahead(kernel_sources: list) -> None:
    """Each distinct (kernel, static arguments) of the graph's CUDA kernels compiled in parallel: on this thread's
    stream where `streamed_compiles` opened one (the kernels it has not had yet go to it), else all at once."""
    import os

    from kiln.config import config
    from kiln.runtime.launch import compile_ahead

    if not config.parallel_compile:
        return
    if _open_streams():
        for kernel in kernel_sources:
            compile_early(kernel)
        _open_streams()[-1].close()
        return
    jobs, seen = [], set()
    for kernel in kernel_sources:
        job = _compile_job(kernel, seen)
        if job is not None:
            jobs.append(job)
    compile_ahead(jobs, config.compile_workers or os.cpu_count() or 1, background=config.compile_overlap)


def _compile_job(kernel, seen: set):
    """compile_ahead's job for a kernel source, or None: not a compiled CUDA kernel, a size known only at launch,
    or a (kernel, static arguments) already in `seen` (which it is added to)."""
    if kernel.device_type != "cuda" or kernel.skip:
        return None
    ints = [int(size) if getattr(size, "is_Integer", False) else None for size in kernel.size_args]
    if None in ints:  # a symbolic size: its value (and so the specialization) is known at launch only
        return None
    jit = load_kernel(kernel.function_name, kernel.source, kernel.device_type)
    if _triton.is_interpreted(jit):
        return None
    key = (id(jit), tuple(map(str, kernel.pointer_dtypes)), tuple(ints), tuple(kernel.constexprs.items()),
           tuple(kernel.launch_options.items()))
    if key in seen:
        return None
    seen.add(key)
    return jit, kernel.pointer_dtypes, ints, kernel.constexprs, kernel.launch_options


class _Stream:
    """One graph's streamed compiles: its CompileStream (made at its first CUDA kernel) and the jobs it had."""

    def __init__(self) -> None:
        self.compiles = None
        self.seen: set = set()
        self.closed = False

    def add(self, kernel) -> None:
        import os

        from kiln.config import config
        from kiln.runtime.launch import CompileStream

        if self.closed:
            return
        job = _compile_job(kernel, self.seen)
        if job is None:
            return
        if self.compiles is None:
            self.compiles = CompileStream(config.compile_workers or os.cpu_count() or 1)
        self.compiles.add(job)

    def close(self) -> None:
        if not self.closed and self.compiles is not None:
            self.compiles.close()
        self.closed = True


_local = threading.local()


def _open_streams() -> list:
    """This thread's open streams, innermost last (a graph compiled while another is generated has its own)."""
    if not hasattr(_local, "streams"):
        _local.streams = []
    return _local.streams


@contextlib.contextmanager
def streamed_compiles():
    """While a graph's kernels are generated and its module loaded (kiln/backend.py): each CUDA kernel's compile
    starts as soon as its text exists (`compile_early`, which the Triton backend calls as it generates a kernel),
    on compile_ahead's background threads, rather than once the whole module is generated and loaded
    (`config.compile_overlap` and `config.parallel_compile`; otherwise this does nothing). The stream closes when
    the module is loaded, or when this block ends."""
    from kiln.config import config

    if not (config.parallel_compile and config.compile_overlap):
        yield
        return
    stream = _Stream()
    streams = _open_streams()
    streams.append(stream)
    try:
        yield
    finally:
        streams.remove(stream)
        stream.close()


def compile_early(kernel) -> None:
    """Start compiling a CUDA kernel source now, when `streamed_compiles` is open on this thread (else nothing)."""
    streams = _open_streams()
    if streams:
        try:
            streams[-1].add(kernel)
        except Exception as error:  # an optimization only: the kernel compiles with the module, or at its launch
            log.warning("kiln: compiling a kernel early failed (%s: %s)", type(error).__name__, error)


def _launcher(kernel):
    """The launch function the wrapper calls as `name(grid_x, *buffers, *sizes)`."""
    from kiln.runtime.launch import make_launcher

    return make_launcher(load_kernel(kernel.function_name, kernel.source, kernel.device_type), kernel.device_type,
                         name=kernel.name, pointer_count=len(kernel.buffer_args), int_count=len(kernel.size_args),
                         constexprs=kernel.constexprs, options=kernel.launch_options)


class Split:
    """A wrapper cut in two (kiln/codegen/wrapper.py `_tail_start`): `head(args)` runs the first steps and returns
    the values the rest need, as a tuple; `tail(list_of_them)` runs the rest and returns the graph's outputs. The
    default mode's CUDA graph records the head only (kiln/runtime/cudagraphs.py)."""

    def __init__(self, head, tail, steps: int, output_bytes: int = 0) -> None:
        self.head, self.tail, self.steps, self.output_bytes = head, tail, steps, output_bytes


class CompiledGraph:
    """The boxed callable for one graph: `compiled(list_of_inputs) -> tuple of outputs`.

    Triton compiles a kernel at its first launch, inside this call, where a failure
    (`KernelCompileError`) must end like any other compile failure: the graph runs eagerly
    (`fallback`, the ATen graph run by torch) with a warning, or raises `KilnCompileError`
    under strict mode. The first call keeps its own list of the inputs (the wrapper clears
    `args` to free them early) to run them again eagerly; once a call has succeeded, later
    calls do not, so inputs are still freed early. A later failure (a new specialization's
    compile) cannot rerun that call: it raises, and the graph runs eagerly from then on.
    """

    _boxed_call = True

    def __init__(self, call, module_source, scheduled=None, *, name: str = "", fallback=None,
                 strict: bool = False, index_status=()):
        self._call = call
        # The Triton kernels' index-error checks (runtime/support.py IndexStatus), one per device, which
        # the CUDA-graph runner runs after a replay, since a replay runs no wrapper code.
        self.index_status = list(index_status)
        self.module_source = module_source
        self.scheduled = scheduled
        self.kernel_count = module_source.kernel_count
        self.extern_count = module_source.extern_count
        self.name = name
        self.fallback_reason: str | None = None  # why the graph runs eagerly, once it does
        self._fallback = fallback
        self.strict = strict  # raise KilnCompileError rather than run eagerly (strict mode, fullgraph=True)
        self._first_call = True
        self._split: Split | None = None

    @property
    def split(self) -> Split | None:
        """The wrapper's head and tail, where it has a tail and the graph has not fallen back to eager."""
        return self._split if self.fallback_reason is None else None

    def __call__(self, args):
        if not self._first_call:
            try:
                return self._call(args)
            except KernelCompileError as error:
                self._fall_back(error)
                raise KilnCompileError(f"kiln: graph {self.name}: {error}; its inputs were already released, "
                                       f"so this call cannot run eagerly (later calls do)") from error
        inputs = list(args)
        try:
            result = self._call(args)
        except KernelCompileError as error:
            self._fall_back(error)
            return self._call(inputs)
        self._first_call = False
        return result

    def _fall_back(self, error: "KernelCompileError") -> None:
        """From now on run the graph eagerly (or raise, under strict mode or without a fallback)."""
        from kiln.config import config

        if self._fallback is None or self.strict or config.strict:
            raise KilnCompileError(f"kiln could not compile graph {self.name}: {error}") from error
        log.warning("kiln: graph %s runs eagerly: %s (set KILN_STRICT=1 to raise)", self.name, error)
        self.fallback_reason = str(error)
        self._call, self._first_call = self._fallback, False


def python_binding(op):
    """What the wrapper calls for an extern of `op`: torch's own Python binding where one takes the
    overload's arguments as the wrapper passes them (kiln/runtime/support.py PYTHON_BINDINGS), else
    the OpOverload."""
    from kiln.runtime.support import PYTHON_BINDINGS

    return PYTHON_BINDINGS.get(op, op)


def load_module(module_source, *, mode: str = "default", scheduled=None, name: str = "", fallback=None,
                strict: bool = False) -> CompiledGraph:
    """The CompiledGraph of `module_source` (kiln/codegen/wrapper.py's ModuleSource): its kernels
    loaded by the backend that generated them (`module_source.backend`), bound with its constants
    and externs into the namespace its wrapper runs in."""
    namespace = dict(module_source.backend.load_kernels(module_source.kernel_sources))
    namespace.update(module_source.constants)
    namespace.update({name: python_binding(op) for name, op in module_source.externs.items()})
    _execute(module_source.wrapper, "wrappers", namespace)
    compiled = CompiledGraph(namespace["call"], module_source, scheduled, name=name, fallback=fallback, strict=strict,
                             index_status=[namespace[name] for name in module_source.index_status])
    if "call_tail" in namespace:
        compiled._split = Split(namespace["call_head"], namespace["call_tail"], getattr(module_source, "tail_steps", 0),
                                getattr(module_source, "tail_bytes", 0))
    return compiled
