"""Turn a generated ModuleSource into the callable handed back to the frontend.

Triton kernels are imported from their cache files (Triton reads a kernel's source from
its file), wrapped for the device (compiled for CUDA, interpreted for CPU), kept in an
in-process cache keyed by source hash; C++ kernels (kiln/codegen/cpp.py) are compiled in
parallel and loaded by kiln/runtime/cpp_build.py. Both are bound into the wrapper's namespace.
"""
from __future__ import annotations

import importlib.util
import linecache

from kiln import _triton
from kiln.runtime.cache import cache_path, source_hash

_loaded_kernels: dict = {}


def load_kernel(name: str, source: str, device_type: str):
    key = (source_hash(source), device_type)
    if key not in _loaded_kernels:
        path = cache_path("triton", source)
        spec = importlib.util.spec_from_file_location(f"kiln_kernel_{key[0][:16]}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
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

    def __init__(self, call, module_source, scheduled=None, index_status=()):
        self._call = call
        # The Triton kernels' index-error flags (codegen/wrapper.py), one per device, read by the
        # CUDA-graph runner after a replay, which runs no wrapper code.
        self.index_status = list(index_status)
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
    path = cache_path("wrappers", module_source.wrapper)
    linecache.cache[path] = (len(module_source.wrapper), None, module_source.wrapper.splitlines(True), path)
    exec(compile(module_source.wrapper, path, "exec"), namespace)
    return CompiledGraph(namespace["call"], module_source, scheduled,
                         [namespace[name] for name in module_source.index_status])
