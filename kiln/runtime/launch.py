"""Launching Triton kernels with as little Python per call as possible.

The generated wrapper calls `k3(grid_x, buf0, buf1, 4096)` for every kernel. On CUDA,
Triton's own launch path (`kernel[grid](...)`) re-derives the kernel's specialization
from its arguments on every call (bind the signature, classify each argument, build a
cache key, look it up, check globals). kiln's launcher does that work once: the first
call goes through Triton (which compiles), and later calls whose arguments have the
same specialization-relevant properties (pointer alignment to 16 bytes; an int's
being 1, its divisibility by 16 and whether it needs 64 bits) call the compiled
launcher's C entry point directly, with the stream from torch's C bindings. A changed
property takes Triton's path again, so a kernel is never run with a specialization its
arguments do not satisfy.

On by default (`KILN_FAST_LAUNCH=0` turns it off). Triton 3.6's `launch_enter_hook` is an
empty hook chain, never None, so the direct path asks whether a chain holds hooks, and a
launch with a profiler's hooks set takes Triton's path. Its first check on a GPU and what it
saves per launch and per model: see benchmarks/results/2026-11-30_gpu-fast-launch-3137f32_nvidia-h200.md
and benchmarks/results/2026-12-02_docstring-measurements.md. On CPU the tests check it with a
stand-in kernel.

Triton compiles a kernel at its first launch (for each specialization), inside the user's
call, after the graph's own compile-time fallback has run. So a launcher turns a failure
there into `KernelCompileError`: any exception at a kernel's first launch (Triton's
`CompilationError` on a GPU; under the interpreter, which never compiles, the error of its
first run) and a `TritonError` at any launch (a new specialization's compile, out of
resources). `CompiledGraph` (kiln/runtime/loader.py) answers it by running that graph eagerly.

This is the one place in kiln that touches Triton's launch internals
(`JITFunction.run(warmup=False)` returning the `CompiledKernel`, its `run`,
`function` and `packed_metadata`, `driver.active`, `knobs.runtime`); they change
between Triton releases. With `config.fast_launch=False` every launch is `kernel[grid](...)`.
Under the interpreter (CPU), kernels are always launched through Triton.
"""
from __future__ import annotations

import builtins
import functools
import threading
import traceback as _traceback
import types
import weakref

from typing import Callable

try:
    from triton.errors import TritonError  # the base of compile, out-of-resources and interpreter errors
except ImportError:  # older Triton: no common base
    from triton.compiler.errors import CompilationError as TritonError


class KernelCompileError(RuntimeError):
    """A generated Triton kernel failed to compile (or, interpreted, to run) when first launched."""

    def __init__(self, name: str, error: BaseException, context: str = ""):
        reason = "".join(_traceback.format_exception_only(type(error), error)).strip()
        super().__init__(f"kernel {name} failed to compile at its first launch: {reason}{context}")
        self.kernel_name = name


def _compiled_signatures(kernel) -> str:
    """For a first launch's error: the kernel's parameter count and, per specialization in its cache, the parameter
    count of the compiled kernel's source, its cache hash and its launcher's library file. A launcher built for
    another kernel's signature ("function takes exactly 21 arguments (27 given)", ResNet-50 on an H100 at 05ad837,
    once in three processes: two compile threads' launcher loads sharing one module object, which kiln/_triton.py
    `load_extension_module` now prevents) shows as a source count that differs from the kernel's, or, where the
    counts agree, as a library that is not the one its source's launcher hashes to."""
    try:
        parts = []
        for cache in kernel.device_caches.values():
            for compiled in cache[0].values():
                compiled = getattr(compiled, "kernel", None) or compiled  # a FutureKernel's result, if finalized
                source = getattr(compiled, "src", None)
                launch = getattr(getattr(compiled, "_run", None), "launch", None)  # Triton's C launcher, if built
                library = getattr(getattr(launch, "__self__", None), "__file__", "not built")
                parts.append(f"{len(getattr(source, 'signature', ()))} ({getattr(compiled, 'hash', '?')}; "
                             f"launcher {library})")
        return f" [kernel parameters {len(kernel.arg_names)}; compiled specializations' parameters: " \
               f"{', '.join(parts) or 'none'}]"
    except Exception:  # a diagnostic only
        return ""


def make_launcher(kernel, device_type: str, *, name: str, pointer_count: int, int_count: int, constexprs: dict,
                  options: dict) -> Callable:
    """A function `launch(grid_x, *pointers, *ints)` that runs `kernel` on a 1-d grid; `options` are
    Triton's launch options (num_warps, and num_stages where a kernel sets them)."""
    from kiln.config import config

    if device_type != "cuda" or not config.fast_launch:
        return _triton_launcher(kernel, name, constexprs, options)
    return _fast_launcher(kernel, name, pointer_count, int_count, constexprs, options)


# Triton's compile options for every kiln kernel. No FMA contraction: Triton fuses a*b + c by
# default (and ptxas too), eager's CUDA kernels round each op, so x*y - x*y would be ~1e-17 where
# eager's is 0. kiln's kernels are memory-bound: separate multiply and add cost nothing measurable.
COMPILE_OPTIONS = {"enable_fp_fusion": False}


def _triton_launcher(kernel, name: str, constexprs: dict, options: dict) -> Callable:
    """Triton's own launch path (`kernel[grid](...)`), which compiles each new specialization."""
    launched = []  # empty until a launch succeeded: a failure before that is the kernel's

    def launch(grid_x, *args):
        if not launched:
            wait_for_ahead_compile(kernel)
        try:
            kernel[(grid_x,)](*args, **constexprs, **options, **COMPILE_OPTIONS)
        except TritonError as error:
            raise KernelCompileError(name, error) from error
        except Exception as error:
            if launched:
                raise
            raise KernelCompileError(name, error) from error
        if not launched:
            launched.append(True)

    return launch


def _hooked(hook) -> bool:
    """Whether a launch hook would do anything: Triton 3.6 keeps an always-present HookChain
    (a hook list, empty unless a profiler adds one); older releases keep None or a callable."""
    return bool(getattr(hook, "calls", hook))


def _fast_launcher(kernel, name: str, pointer_count: int, int_count: int, constexprs: dict,
                   options: dict) -> Callable:
    """Generated straight-line code: one specialization key, one dict lookup, one launch."""
    from triton import knobs
    from triton.runtime import driver

    from kiln import _torch

    hook_chains = all(hasattr(hook, "calls") for hook in (knobs.runtime.launch_enter_hook,
                                                          knobs.runtime.launch_exit_hook))
    code = _launcher_code(pointer_count, int_count, len(constexprs), hook_chains).replace(  # named for profiles
        co_name=f"launch_{name}", co_qualname=f"launch_{name}", co_filename=f"<kiln launcher {name}>")

    def first_launch(grid_x, *args):
        """Compile for this specialization (Triton compiles as it launches) and launch."""
        wait_for_ahead_compile(kernel)
        try:
            compiled_kernel = kernel.run(*args, grid=(grid_x,), warmup=False, **constexprs, **options,
                                         **COMPILE_OPTIONS)
            if hasattr(compiled_kernel, "result"):  # a future when Triton compiles asynchronously
                compiled_kernel = compiled_kernel.result()
        except Exception as error:
            raise KernelCompileError(name, error, _compiled_signatures(kernel)) from error
        launcher = compiled_kernel.run
        return (_driver_launch(launcher), compiled_kernel.function, compiled_kernel.packed_metadata,
                launcher.launch_cooperative_grid, launcher.launch_pdl)

    current_device, current_stream = _torch.cuda_stream_functions() or (driver.active.get_current_device,
                                                                         driver.active.get_current_stream)
    namespace = {"__builtins__": builtins,  # C functions it calls may run Python that reads the caller's builtins
                 "compiled": {}, "first_launch": first_launch,
                 "slow_launch": _triton_launcher(kernel, name, constexprs, options),
                 "runtime_knobs": knobs.runtime, "hooked": _hooked, "current_stream": current_stream,
                 "current_device": current_device,
                 **{f"c{k}": value for k, value in enumerate(constexprs.values())}}
    return types.FunctionType(code, namespace, f"launch_{name}")


def _driver_launch(launcher) -> Callable:
    """The compiled launcher's C entry point, `launch(grid_x, grid_y, grid_z, stream, function,
    cooperative, pdl, global_scratch, profile_scratch, metadata, launch_metadata, enter_hook, exit_hook,
    *args)`, called without Triton's Python `CudaLauncher.__call__` (a closure and two scratch
    lookups per launch). A kernel that needs global or profile scratch memory (none of kiln's so
    far) goes through `__call__`, which allocates it."""
    if launcher.global_scratch_size == 0 and launcher.profile_scratch_size == 0:
        return launcher.launch

    def through_triton(grid_x, grid_y, grid_z, stream, function, cooperative, pdl, global_scratch, profile_scratch,
                       *rest):
        launcher(grid_x, grid_y, grid_z, stream, function, *rest)

    return through_triton


@functools.lru_cache(maxsize=None)
def _launcher_code(pointer_count: int, int_count: int, constexpr_count: int, hook_chains: bool = False
                   ) -> types.CodeType:
    """The code of a launcher for kernels of this many pointers, ints and constexprs (which it reads as
    the globals c0, c1, ...): compiled once per signature, not once per kernel (a graph has hundreds).
    `hook_chains`: Triton keeps its launch hooks in HookChains (3.6), whose hook lists the launcher
    reads inline, rather than calling `_hooked` twice per launch."""
    pointers = [f"p{k}" for k in range(pointer_count)]
    ints = [f"s{k}" for k in range(int_count)]
    params = ", ".join(["grid_x"] + pointers + ints)
    key_parts = [f"{p}.data_ptr() & 15" for p in pointers]
    key_parts += [f"{s} == 1, {s} & 15, {s} > 0x7FFFFFFF" for s in ints]
    key = "(" + "".join(part + ", " for part in key_parts) + ")"
    call_args = ", ".join(pointers + ints + [f"c{k}" for k in range(constexpr_count)])
    hooks_set = ("runtime_knobs.launch_enter_hook.calls or runtime_knobs.launch_exit_hook.calls" if hook_chains
                 else "hooked(runtime_knobs.launch_enter_hook) or hooked(runtime_knobs.launch_exit_hook)")
    source = f"""
def launch({params}):
    key = {key}
    entry = compiled.get(key)
    if entry is None:
        compiled[key] = first_launch(grid_x, {', '.join(pointers + ints)})
        return
    launch, function, metadata, cooperative, pdl = entry
    if {hooks_set}:
        slow_launch(grid_x, {', '.join(pointers + ints)})  # a profiler's hooks want Triton's own path
    else:
        launch(grid_x, 1, 1, current_stream(current_device()), function, cooperative, pdl, None, None, metadata,
               None, None, None, {call_args})
"""
    module = compile(source, "<kiln launcher>", "exec")
    return next(constant for constant in module.co_consts if isinstance(constant, types.CodeType))


# A kernel whose ahead compile runs in the background (compile_ahead(background=True)) -> the Event set once
# its compiles are finalized in Triton's kernel cache: its first launch waits for that, not for the graph's.
_compiling: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def wait_for_ahead_compile(kernel) -> None:
    """Block until `kernel`'s background compiles (if any) are in its cache, where its launch finds them."""
    try:
        event = _compiling.get(kernel)
    except TypeError:  # not weakly referenceable (a test's stand-in): it was never registered
        return
    if event is not None:
        event.wait()


def compile_ahead(jobs: list, workers: int, *, background: bool = False) -> int:
    """Compile CUDA kernels on `workers` threads before their first launch; how many were submitted.

    `jobs` holds `(kernel, pointer_dtypes, ints, constexprs, options)`: a Triton JITFunction and the
    arguments its launches will pass, pointers as their element types. Triton compiles each as the
    first launch would (`warmup`, under its AsyncCompileMode: the specialization, the options and so the
    cache key are the launch's), in parallel, and keeps the result in the kernel's own cache, where the
    first launch finds it. The launch's pointers are taken to be 16-byte aligned (what the allocator
    gives); a launch whose arguments specialize otherwise compiles at launch as before. A compile that
    fails here is ignored: the launch compiles again and reports it (KernelCompileError).

    On the same thread, as soon as its compile returns, each kernel's launcher is built and its binary loaded
    on the current device, which Triton does at the first launch, one kernel after another on the launching
    thread: building a launcher runs a C compiler (0.26 s each), 4.2 s of BERT-base's 12.7 s cold first
    call on an H100 at 21cb104 (benchmarks/first_call_compiles.py). Until 2026-12-06 the launchers were built
    once every compile had finished, so a graph waited for its slowest compile and then its slowest launcher.

    With `config.compile_processes`, each thread has a worker process compile its kernel into Triton's
    cache first (kiln/runtime/compile_workers.py), past the part of Triton's compile that holds the GIL.

    `background`: return at once, the compiles running on a thread of their own, so that the graph's first call
    (its extern calls, CUDA's and cuDNN's lazy start-up, the frontend's work after the compile) overlaps them; each
    kernel's first launch waits for that kernel's compiles only (`wait_for_ahead_compile`)."""
    if not jobs:
        return 0
    load = _loader_on_current_device()
    if not background:
        _compile_now(jobs, workers, load, {})
        return len(jobs)
    events: dict = {}
    for kernel, *_ in jobs:
        try:
            events[kernel] = _compiling[kernel] = threading.Event()
        except TypeError:  # not weakly referenceable: its launch will not wait (nor need to)
            pass
    threading.Thread(target=_compile_now, args=(jobs, workers, load, events), name="kiln-compile-ahead",
                     daemon=True).start()
    return len(jobs)


def _loader_on_current_device():
    """What loads a compiled kernel on the caller's device (where its first launches will run), or None."""
    import torch
    from kiln import _triton

    try:
        return functools.partial(_triton.load_compiled, device=torch.cuda.current_device())
    except (AssertionError, RuntimeError):  # a torch without CUDA (tests' stand-in kernels): nothing to load
        return None


class CompileStream:
    """compile_ahead(background=True) fed one kernel at a time: the compiles start while the rest of the graph is
    still generated (kiln/runtime/loader.py `streamed_compiles`), not once every kernel's text exists.

    `add(job)` (a compile_ahead job) registers the kernel's event at once, so that its first launch waits for it;
    `close()` says no job follows, after which the thread finalizes the compiles and sets the events. A stream
    must be closed (its thread waits for jobs until then)."""

    def __init__(self, workers: int) -> None:
        import queue

        load = _loader_on_current_device()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._events: dict = {}
        self.thread = threading.Thread(target=_compile_now, args=(self._jobs(), workers, load, self._events),
                                       name="kiln-compile-stream", daemon=True)
        self.thread.start()

    def add(self, job: tuple) -> None:
        kernel = job[0]
        if kernel not in self._events:
            try:
                self._events[kernel] = _compiling[kernel] = threading.Event()
            except TypeError:  # not weakly referenceable: its launch will not wait (nor need to)
                pass
        self._queue.put(job)

    def close(self) -> None:
        self._queue.put(None)

    def _jobs(self):
        while (job := self._queue.get()) is not None:
            yield job


def _compile_now(jobs, workers: int, load, events: dict) -> None:
    """compile_ahead's compiles, on `workers` threads; each kernel's event in `events` is set as soon as its own
    compiles are finalized (in Triton's kernel cache, where its launch finds them), and every event at the end.
    `jobs` may be a generator (a CompileStream's): each is submitted as it comes."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from kiln import _triton
    from kiln.runtime import compile_workers
    from kiln.runtime.progress import Progress

    processes = compile_workers.workers()
    in_worker = processes.compile if processes is not None else (lambda job: False)
    compile_workers.triton_key()  # Triton's key known before the first job's cache key needs it
    pending: dict = {}  # a kernel -> how many of its compiles are not finalized yet
    owners: dict = {}  # a raw future -> (its kernel, the FutureKernel that finalizes it)
    try:
        count = len(jobs) if isinstance(jobs, list) else workers
        with ThreadPoolExecutor(max_workers=max(1, min(workers, count))) as executor:
            with _triton.WorkerCompileMode(executor, in_worker, after_compile=load, ignore_errors=True) as mode:
                for kernel, pointer_dtypes, ints, constexprs, options in jobs:
                    try:
                        future = kernel.warmup(*pointer_dtypes, *ints, grid=(1,), **constexprs, **options,
                                               **COMPILE_OPTIONS)
                    except Exception:  # the launch compiles it and reports the error
                        continue
                    raw = getattr(future, "future", None)
                    if raw is not None and raw not in owners:
                        owners[raw] = (kernel, future)
                        pending[kernel] = pending.get(kernel, 0) + 1
                for kernel, event in events.items():
                    if kernel not in pending:
                        event.set()
                progress = Progress(len(mode.raw_futures), "compiling the CUDA kernels of a graph")
                for raw in as_completed(mode.raw_futures):  # the mode's exit finalizes any left
                    progress.step()
                    kernel, future = owners.get(raw, (None, None))
                    if future is None:
                        continue
                    future.result(ignore_errors=True)  # into the kernel's cache
                    pending[kernel] -= 1
                    if pending[kernel] == 0 and kernel in events:
                        events[kernel].set()
    finally:
        for event in events.values():
            event.set()


__all__ = ["CompileStream", "KernelCompileError", "compile_ahead", "make_launcher", "wait_for_ahead_compile"]
