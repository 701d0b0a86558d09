"""Turn a generated ModuleSource into the callable handed back to the frontend.

Triton kernels are compiled from their text under the name of their cache file (Triton reads
a kernel's source through `inspect`, which finds the same text in `linecache`), wrapped for the
device (compiled for CUDA, interpreted for CPU), kept in an in-process cache keyed by source
hash; C++ kernels (kiln/codegen/cpp.py) are compiled in parallel and loaded by
kiln/runtime/cpp_build.py. Both are bound into the wrapper's namespace. Nothing is imported
through `importlib`, so no bytecode cache (`__pycache__`) sits beside the entries to go stale
or corrupt: the in-memory text is what runs, its cache file is where tracebacks point.
"""
from __future__ import annotations

import linecache
import types

from kiln import _triton
from kiln.runtime.cache import cache_path, source_hash

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


def _launcher(kernel):
    """The launch function the wrapper calls as `name(grid_x, *buffers, *sizes)`."""
    from kiln.runtime.launch import make_launcher

    constexprs = {"XBLOCK": kernel.xblock}
    if kernel.rblock:
        constexprs["RBLOCK"] = kernel.rblock
    return make_launcher(load_kernel(kernel.function_name, kernel.source, kernel.device_type), kernel.device_type,
                         name=kernel.name, pointer_count=len(kernel.buffer_args), int_count=len(kernel.size_args),
                         constexprs=constexprs, num_warps=kernel.num_warps)


class CompiledGraph:
    """The boxed callable for one graph: `compiled(list_of_inputs) -> tuple of outputs`."""

    _boxed_call = True

    def __init__(self, call, module_source, scheduled=None):
        self._call = call
        self.module_source = module_source
        self.scheduled = scheduled
        self.kernel_count = module_source.kernel_count
        self.extern_count = module_source.extern_count

    def __call__(self, args):
        return self._call(args)


def load_module(module_source, *, mode: str = "default", scheduled=None) -> CompiledGraph:
    from kiln.codegen.cpp import CppKernelSource
    from kiln.runtime.cpp_build import compile_kernels

    namespace = {}
    cpp_kernels = [kernel for kernel in module_source.kernel_sources if isinstance(kernel, CppKernelSource)]
    namespace.update(compile_kernels([kernel for kernel in cpp_kernels if not kernel.skip]))
    for kernel in module_source.kernel_sources:
        if not isinstance(kernel, CppKernelSource):
            namespace[kernel.name] = _launcher(kernel)
    namespace.update(module_source.constants)
    namespace.update(module_source.externs)
    _execute(module_source.wrapper, "wrappers", namespace)
    return CompiledGraph(namespace["call"], module_source, scheduled)
