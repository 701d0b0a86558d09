"""The one place kiln touches Triton internals.

Generated kernels call libdevice (`triton.language.extra.cuda.libdevice`) for math
that `tl` lacks (tanh, pow, erfinv, ...). Triton's interpreter, which runs kernels on
CPU tensors (how CI tests the GPU code path), has no extern functions; here we give
it one: each libdevice symbol is computed with numpy (or torch on numpy arrays), in
the argument's precision, with IEEE results where a Python `math` function would raise
(lgamma at a pole is inf, as on the GPU and in torch). The implementations live beside the
renderings that call them, in kiln/ir/ops.py, which registers them here (`register_libdevice`:
this bottom-layer module imports nothing of kiln's). The interpreter's casts to and from
bfloat16 are replaced too: it truncates float32 to bfloat16 (the GPU rounds to nearest even,
overflowing to inf) and reinterprets the bits of any other source type; its `tl.dot` multiplied
bfloat16 operands' bits as integers.
Bool (int1) add and subtract wrap mod 2, as compiled Triton's do.
Reductions with kiln's `_sum_combine` run as numpy's pairwise sum, as Triton's own do.
Kernels are loaded as `InterpretedFunction`s for CPU tensors and `triton.jit`
functions for CUDA tensors, from the same source. The interpreter is not thread-safe: each
run patches `triton.language` module-wide (`_patch_lang`) and restores it after, so a run on
another thread meanwhile sees half-patched functions and raises `InterpreterError`. Interpreted
runs therefore hold one process-wide lock; compiled CUDA launches take no lock.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import torch
import triton
from triton.language.extra.cuda import libdevice
from triton.runtime import interpreter as _interpreter
from triton.runtime._async_compile import AsyncCompileMode


# libdevice symbol (without `__nv_`) -> its numpy implementation. kiln/ir/ops.py's LIBDEVICE_INTERPRETER,
# beside the renderings that call them, is registered here (`register_libdevice`) when it is imported.
_NUMPY_LIBDEVICE: dict = {}


def register_libdevice(implementations: dict) -> None:
    """Give the interpreter these libdevice symbols: {name without `__nv_`: numpy function}."""
    _NUMPY_LIBDEVICE.update(implementations)


def _numpy_function(symbol: str):
    name = symbol.removeprefix("__nv_")
    if name in _NUMPY_LIBDEVICE:
        return _NUMPY_LIBDEVICE[name]
    if name[-1] in "fd" and name[:-1] in _NUMPY_LIBDEVICE:  # float and double variants (signbitd)
        return _NUMPY_LIBDEVICE[name[:-1]]
    raise NotImplementedError(f"kiln: libdevice {symbol} has no interpreter implementation: "
                              "add its numpy function to kiln/ir/ops.py's LIBDEVICE_INTERPRETER")


def _create_extern_elementwise(self, lib_name, lib_path, symbol, arg_list, ret_type, is_pure):
    function = _numpy_function(symbol)
    with np.errstate(all="ignore"):
        result = function(*[argument.data for argument in arg_list])
    result = np.asarray(result).astype(_interpreter._get_np_dtype(ret_type))
    return _interpreter.TensorHandle(result, ret_type.scalar if hasattr(ret_type, "scalar") else ret_type)


_interpreter.InterpreterBuilder.create_extern_elementwise = _create_extern_elementwise


_binary_op_with_numpy_bools = _interpreter.InterpreterBuilder.binary_op


def _binary_op_wrapping_bools(self, lhs, rhs, op):
    """Integer add and subtract of int1 (bool) values as the GPU computes them, mod 2 (an i1 add is
    a xor: True + True = False), where numpy's bool add is logical or and its bool subtract raises.
    (The interpreter's handle of a comparison keeps its operands' dtype; its data is numpy bool.)"""
    if op in (np.add, np.subtract) and np.asarray(lhs.data).dtype == np.bool_:
        op = np.logical_xor
    return _binary_op_with_numpy_bools(self, lhs, rhs, op)


_interpreter.InterpreterBuilder.binary_op = _binary_op_wrapping_bools


_TORCH_DTYPES = {
    "int1": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
    "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64,
}


def _as_torch(data: np.ndarray, dtype) -> torch.Tensor:
    array = np.array(data, order="C", copy=True)
    if dtype == _interpreter.tl.bfloat16:  # stored as uint16 bits
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


_cast_without_bfloat16 = _interpreter.InterpreterBuilder.cast_impl
_fp_to_fp_without_bfloat16 = _interpreter.InterpreterBuilder.create_fp_to_fp


def _cast_impl(self, src, dst_type):
    """A cast with torch's conversion wherever bfloat16 is involved (round to nearest even)."""
    source, target = src.dtype.scalar, dst_type.scalar
    if _interpreter.tl.bfloat16 not in (source, target):
        return _cast_without_bfloat16(self, src, dst_type)
    converted = _as_torch(src.data, source).to(_TORCH_DTYPES[target.name])
    return _interpreter.TensorHandle(_as_numpy(converted).reshape(np.shape(src.data)), target)


def _create_fp_to_fp(self, src, dst_type, rounding_mode):
    if _interpreter.tl.bfloat16 in (src.dtype.scalar, dst_type.scalar) and \
            rounding_mode in (None, _interpreter._ir.ROUNDING_MODE.RTNE):
        return _cast_impl(self, src, dst_type)
    return _fp_to_fp_without_bfloat16(self, src, dst_type, rounding_mode)


_interpreter.InterpreterBuilder.cast_impl = _cast_impl
_interpreter.InterpreterBuilder.create_fp_to_fp = _create_fp_to_fp
for _name in ("create_si_to_fp", "create_ui_to_fp", "create_fp_to_si", "create_fp_to_ui", "create_fp_ext",
              "create_fp_trunc"):
    setattr(_interpreter.InterpreterBuilder, _name, lambda self, src, dst_type: _cast_impl(self, src, dst_type))
setattr(_interpreter.InterpreterBuilder, "create_int_cast",
        lambda self, src, dst_type, is_signed: _cast_impl(self, src, dst_type))
_patch_lang_without_libdevice = _interpreter._patch_lang


def _patch_lang_with_libdevice(fn):
    """The interpreter patches `tl` for each kernel run; patch libdevice alongside it."""
    scope = _patch_lang_without_libdevice(fn)
    _interpreter._patch_builtin(libdevice, _interpreter.interpreter_builder, scope)
    # numpy 2 refuses int() of a 1-element 1-d array, which is how scalars reach range().
    scope.set_attr(_interpreter.tl.tensor, "__index__", lambda self: int(self.handle.data.item()))
    return scope


_interpreter._patch_lang = _patch_lang_with_libdevice
_dot_without_bfloat16 = _interpreter.InterpreterBuilder.create_dot


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """tl.dot: the interpreter multiplies bfloat16 operands' uint16 bits as numbers; they are
    converted to float32 first (exactly), as the GPU's tensor cores multiply them."""
    if _interpreter.tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
        a, b = (_interpreter.TensorHandle(_as_numpy(_as_torch(operand.data, operand.dtype.scalar).float()),
                                          _interpreter.tl.float32) for operand in (a, b))
    return _dot_without_bfloat16(self, a, b, d, input_precision, max_num_imprecise_acc)


_interpreter.InterpreterBuilder.create_dot = _create_dot
_reduce_without_kiln_sum = _interpreter.ReduceOps.apply_impl


def _reduce_with_kiln_sum(self, input):
    """The interpreter sums with numpy (pairwise) only for Triton's own `_sum_combine`; any other
    combine it folds element by element in Python: slow, and a sequential sum (several times
    eager's error over long rows). kiln's kernels reduce with their own `_sum_combine` (a GPU
    tree sum, like tl.sum's): run it as numpy's sum too."""
    function = getattr(self.combine_fn, "fn", self.combine_fn)
    if len(input) == 1 and getattr(function, "__name__", "") == "_sum_combine":
        return self.sum(input[0])
    return _reduce_without_kiln_sum(self, input)


_interpreter.ReduceOps.apply_impl = _reduce_with_kiln_sum


_INTERPRETER_LOCK = threading.RLock()  # one interpreted kernel run at a time per process


class SerializedInterpretedFunction(_interpreter.InterpretedFunction):
    """An interpreted kernel whose runs (`kernel[grid](...)`) hold the interpreter lock."""

    def run(self, *args, **kwargs):
        with _INTERPRETER_LOCK:
            return super().run(*args, **kwargs)


@contextlib.contextmanager
def interpreted_launches_skipped():
    """Within it, interpreted kernels' runs (`kernel[grid](...)`) return at once: a graph compiles and "runs"
    for its kernel sources only (the SASS census, compile-for-Hopper tests), its outputs left unwritten."""
    run = SerializedInterpretedFunction.run
    SerializedInterpretedFunction.run = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        SerializedInterpretedFunction.run = run


def jit_for_device(function, device_type: str):
    """A Triton kernel object for `function`: compiled for CUDA, interpreted for CPU."""
    if device_type == "cpu":
        return SerializedInterpretedFunction(function)
    kernel = triton.jit(function)
    if isinstance(kernel, _interpreter.InterpretedFunction):  # TRITON_INTERPRET=1 interprets CUDA kernels too
        return SerializedInterpretedFunction(function)
    return kernel


def is_interpreted(kernel) -> bool:
    return isinstance(kernel, _interpreter.InterpretedFunction)


def load_compiled(kernel, device: int) -> None:
    """Build a CompiledKernel's launcher and load its binary on `device` now, as Triton does at the
    kernel's first launch (`_init_handles`: a C compiler run for the launcher unless Triton's cache has
    it, then the module load), for a thread other than the launching one. A failure is left for the
    first launch, which tries again and raises it."""
    try:
        with torch.cuda.device(device):
            kernel._init_handles()
    except Exception:
        pass


def _closure_values(function) -> dict:
    """{free variable name: value} of a closure (Triton's compile closure: `src`, `target`, `options`, ...)."""
    return dict(zip(function.__code__.co_freevars, (cell.cell_contents for cell in function.__closure__)))


def compile_job(compile_fn) -> dict | None:
    """What a compile worker process (kiln/runtime/compile_worker_main.py) needs to run the compile that
    Triton's JIT hands an AsyncCompileMode as `compile_fn` (Triton 3.6: a closure over `src`, `target`,
    `options` and `env_vars`, calling `triton.compile`), as picklable values; None where it is not that
    closure or a value does not pickle. The kernel's text is its module's, from `linecache` (kiln's
    loader registers it under the module's cache path)."""
    import linecache
    import pickle

    try:
        cells = _closure_values(compile_fn)
        source, function = cells["src"], cells["src"].fn.fn
        path = function.__code__.co_filename
        text = "".join(linecache.cache[path][2])
        job = {"path": path, "text": text, "module": function.__module__, "function": function.__name__,
               "signature": source.signature, "constants": source.constants, "attrs": source.attrs,
               "target": cells["target"], "options": dict(cells["options"].__dict__), "env_vars": cells["env_vars"]}
        pickle.dumps(job)
    except Exception:
        return None
    return job


def in_cache(key: str, compile_fn) -> bool:
    """Whether Triton's on-disk cache already holds the kernel that `compile_fn` (Triton 3.6's JIT closure, see
    `compile_job`) compiles, submitted under `key`: the JIT's cache key, which `triton.compile` hashes to find
    the kernel's cache folder and looks up as `<name>.json` in it. False where that cannot be told."""
    import hashlib

    try:
        if triton.knobs.compilation.always_compile:
            return False
        from triton.runtime.cache import get_cache_manager

        source = _closure_values(compile_fn)["src"]
        name = f"{source.name[:150]}.json"
        group = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name)
        return bool(group) and group.get(name) is not None
    except Exception:
        return False


class WorkerCompileMode(AsyncCompileMode):
    """Triton's AsyncCompileMode whose compiles first run in a worker process (`compile_in_worker(job)`,
    kiln/runtime/compile_workers.py), which fills Triton's cache; the compile itself, on the executor's
    thread, then finds the kernel there. Where the worker fails, the thread compiles as before. A kernel
    Triton's cache already holds (a warm start) goes to no worker, so a warm start starts no processes.
    `after_compile(kernel)`, when given, runs on the same thread as soon as that kernel's compile returns (its
    launcher built and binary loaded while other kernels still compile); what it raises is left for the launch."""

    def __init__(self, executor, compile_in_worker, *, after_compile=None, **options):
        super().__init__(executor, **options)
        self._compile_in_worker = compile_in_worker
        self._after_compile = after_compile

    def submit(self, key, compile_fn, finalize_fn):
        if key in self.future_kernels:
            return super().submit(key, compile_fn, finalize_fn)
        job = compile_job(compile_fn) if not in_cache(key, compile_fn) else None
        compile_here, after_compile = compile_fn, self._after_compile

        def compile_fn():
            if job is not None:
                try:
                    self._compile_in_worker(job)
                except Exception:
                    pass
            kernel = compile_here()
            if after_compile is not None:
                try:
                    after_compile(kernel)
                except Exception:
                    pass
            return kernel

        return super().submit(key, compile_fn, finalize_fn)


# ---- Triton's cache-key prefix ----
# `triton.runtime.cache.triton_key()` prefixes every kernel's cache key with a hash of Triton itself: its
# compiler, backends and language sources and its whole 415 MB `libtriton` library. Each new process pays
# it at its first kernel compile, cold or warm (0.30-0.46 s on this project's CPU machine, 0.36 s on an
# H100 host). kiln remembers the key in its own cache under a stamp of those files (names, sizes and
# modification times, a few milliseconds to read) and hands it to Triton and its compile workers.

def triton_key_stamp() -> str:
    """What `triton_key()` depends on, read from the file system without reading the files: Triton's version
    and each hashed file's path, size and modification time. Equal stamps mean the same files (short of a
    file rewritten in place with its size and time kept, which no installer does)."""
    import os

    root = os.path.dirname(os.path.abspath(triton.__file__))
    entries = [f"triton {triton.__version__}"]
    paths = [os.path.join(root, "runtime", "cache.py")]
    for folder in ("compiler", "backends", "language", "_C"):
        for directory, subdirectories, files in os.walk(os.path.join(root, folder)):
            subdirectories.sort()
            paths.extend(os.path.join(directory, name) for name in sorted(files))
    for path in paths:
        status = os.stat(path)
        entries.append(f"{os.path.relpath(path, root)} {status.st_size} {status.st_mtime_ns}")
    return "\n".join(entries)


def computed_triton_key() -> str:
    """Triton's own cache-key prefix (hashing its files: the slow way)."""
    from triton.runtime import cache

    return cache.triton_key()


def use_triton_key(key: str) -> None:
    """Have Triton use `key` as its cache-key prefix in this process instead of hashing its files again."""
    import functools

    from triton.runtime import cache

    @functools.lru_cache(maxsize=None)  # triton_key's own interface (callers may cache_clear it)
    def triton_key():
        return key

    cache.triton_key = triton_key


# ---- Loading Triton's launchers: a module object per load ----
# Every Triton launcher is a C extension module named `__triton_launcher` (single-phase init), one library per kernel
# signature in Triton's cache. CPython keeps such a module's dict per library file, and a second load of a file it
# loaded before (every kernel whose signature an earlier kernel had) returns the module object that
# `sys.modules["__triton_launcher"]` holds, which is the last launcher loaded, with that file's dict copied into it.
# Triton's `CudaLauncher` reads `mod.launch` after the load returns; two threads loading launchers at once (kiln
# builds them on its compile threads, kiln/runtime/launch.py) can each read the other's off that shared object.
# ResNet-50 on an H100 at 05ad837, once in three processes: "function takes exactly 21 arguments (27 given)", a
# kernel of 14 parameters given the launcher of one of 8. With equal counts and other types, a wrong launcher would
# pack the arguments wrongly and run silently. Triton's own loader on 6 threads, 1,800 loads of cached launchers: up
# to 39 wrong (tests/runtime/test_launcher_loads.py). kiln's loader (`load_extension_module`) gives each load a
# module object of its own, made under a lock.

_extension_lock = threading.Lock()


def load_extension_module(name: str, path: str):
    """Triton's `_load_module_from_path(name, path)`: import the extension module `name` from the library file
    `path`; here into a module object no other load shares (see above)."""
    import importlib.util
    import types

    with _extension_lock:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        private = types.ModuleType(name)
        private.__dict__.update(module.__dict__)
        return private


def guard_launcher_loads() -> None:
    """Have Triton load its launchers (and its driver utilities) through `load_extension_module`."""
    from triton.runtime import build

    if getattr(build, "_load_module_from_path", None) is not None:
        build._load_module_from_path = load_extension_module


guard_launcher_loads()
