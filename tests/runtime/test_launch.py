"""kiln/runtime/launch.py: the CUDA fast launcher's generated code, run on CPU with stand-ins.

No GPU here: Triton's driver and compiled kernel are replaced by recording stand-ins, so
these tests check kiln's own logic (when to compile, which key, what reaches the
compiled launcher), not Triton's.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import types

import pytest
import torch
from triton import knobs
from triton.runtime import driver

import kiln
from kiln.backend import KilnCompileError, compile_graph
from kiln.runtime.launch import KernelCompileError, _fast_launcher


class _Driver:
    get_current_device = staticmethod(lambda: 0)
    get_current_stream = staticmethod(lambda device: 1234)


class _Launcher:
    """Stands in for Triton's CudaLauncher: `launch` is its C entry point, `__call__` its Python one."""
    launch_cooperative_grid, launch_pdl, profile_scratch_size = False, False, 0

    def __init__(self, launches: list, global_scratch_size: int):
        self.launches, self.global_scratch_size, self.python_calls = launches, global_scratch_size, 0

    def launch(self, *args):
        self.launches.append(args)

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *rest):
        self.python_calls += 1  # Triton's would allocate the scratch here, then call launch
        self.launch(grid_x, grid_y, grid_z, stream, function, False, False, "scratch", None, *rest)


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self, global_scratch_size: int = 0):
        self.launches = []
        self.run = _Launcher(self.launches, global_scratch_size)


class _Kernel:
    """Stands in for a JITFunction: `run` "compiles" (and launches), `[grid]` is Triton's own path."""

    def __init__(self):
        self.compiled, self.compiles, self.triton_launches = _Compiled(), 0, 0

    def run(self, *args, grid, warmup, **options):
        # no FMA contraction: eager rounds a*b + c twice (runtime/launch.py COMPILE_OPTIONS)
        assert not warmup and options == {"XBLOCK": 16, "num_warps": 4, "enable_fp_fusion": False}
        self.compiles += 1
        return self.compiled

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.triton_launches += 1
        return launch


@pytest.fixture
def fake_driver(monkeypatch):
    previous = driver._active  # None until a real driver is first asked for (never, on a CPU machine)
    driver.set_active(_Driver())
    # the fake driver's device and stream, not torch's C bindings: a CUDA build of torch has them on a machine
    # without a GPU too, where they fail (Python 3.12, torch 2.13.0+cu130 from PyPI on a CPU machine)
    monkeypatch.setattr(kiln._torch, "cuda_stream_functions", lambda: None)
    yield
    driver._active = previous


def test_compiles_once_per_specialization_then_launches_directly(fake_driver):
    kernel = _Kernel()
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=1, constexprs={"XBLOCK": 16}, options={"num_warps": 4})
    buffer = torch.zeros(64)
    for size in (48, 48, 48, 64, 64):  # 48 and 64: both divisible by 16, one specialization
        launch(3, buffer, size)
    launch(3, buffer[1:], 48)  # a pointer off 16-byte alignment: another specialization
    assert kernel.compiles == 2 and kernel.triton_launches == 0
    assert len(kernel.compiled.launches) == 4
    grid_and_handles, arguments = kernel.compiled.launches[0][:13], kernel.compiled.launches[0][13:]
    # straight into the C entry point: grid, stream, function, cooperative, pdl, no scratch, metadata, no hooks
    assert grid_and_handles == (3, 1, 1, 1234, "function", False, False, None, None, "metadata", None, None, None)
    assert arguments[0] is buffer and arguments[1:] == (48, 16)  # pointers, ints, then constexprs
    assert kernel.compiled.run.python_calls == 0


def test_a_kernel_that_needs_scratch_memory_launches_through_triton_python_launcher(fake_driver):
    kernel = _Kernel()
    kernel.compiled = _Compiled(global_scratch_size=128)
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=1, constexprs={"XBLOCK": 16}, options={"num_warps": 4})
    buffer = torch.zeros(64)
    launch(2, buffer, 48)  # compiles
    launch(2, buffer, 48)
    assert kernel.compiled.run.python_calls == 1
    assert kernel.compiled.launches[0][:9] == (2, 1, 1, 1234, "function", False, False, "scratch", None)


def test_launchers_of_one_signature_share_code_but_not_constants_or_caches(fake_driver):
    """The launcher's code is compiled once per (pointers, ints, constexprs) count; each kernel's
    launcher keeps its own constexpr values, specialization cache and name."""
    first, second = _Kernel(), _Kernel()
    launch_first = _fast_launcher(first, "k0", pointer_count=1, int_count=1, constexprs={"XBLOCK": 16}, options={"num_warps": 4})
    second.run = lambda *args, grid, warmup, **options: (setattr(second, "compiles", second.compiles + 1),
                                                         second.compiled)[1]
    launch_second = _fast_launcher(second, "k1", pointer_count=1, int_count=1, constexprs={"RBLOCK": 64},
                                   options={"num_warps": 4})
    assert launch_first.__code__.co_code == launch_second.__code__.co_code
    assert (launch_first.__name__, launch_second.__name__) == ("launch_k0", "launch_k1")
    assert launch_first.__code__.co_filename == "<kiln launcher k0>"
    buffer = torch.zeros(64)
    for launch in (launch_first, launch_second, launch_first, launch_second):
        launch(2, buffer, 32)
    assert first.compiles == 1 and second.compiles == 1
    assert first.compiled.launches[0][-1] == 16 and second.compiled.launches[0][-1] == 64


def test_a_registered_launch_hook_takes_tritons_path(fake_driver):
    kernel = _Kernel()
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=0, constexprs={"XBLOCK": 16}, options={"num_warps": 4})
    buffer = torch.zeros(16)
    launch(1, buffer)  # compiles
    hook = lambda *args: None  # noqa: E731  (what a profiler registers)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch(1, buffer)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    launch(1, buffer)
    assert kernel.triton_launches == 1 and len(kernel.compiled.launches) == 1


class _FailingKernel(_Kernel):
    """A kernel whose compile fails, as Triton's does for a kernel that names an undefined RBLOCK."""

    def run(self, *args, grid, warmup, **options):
        from triton.compiler.errors import CompilationError

        self.compiles += 1
        raise CompilationError("kernel source", None, "NameError('RBLOCK is not defined')")


def test_a_compile_failure_at_first_launch_is_a_kernel_compile_error(fake_driver):
    kernel = _FailingKernel()
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=0, constexprs={"XBLOCK": 16}, options={"num_warps": 4})
    with pytest.raises(KernelCompileError, match="(?s)kernel k0 failed to compile.*RBLOCK"):
        launch(1, torch.zeros(16))


def _with_undefined_name(generate_kernel):
    """`generate_kernel`, but every kernel's first line reads RBLOCK, which it does not define."""
    def generate(kernel, graph, device_type):
        source = generate_kernel(kernel, graph, device_type)
        header = f"def {source.function_name}("
        start = source.source.index(header)
        body = source.source.index("\n", start) + 1
        source.source = source.source[:body] + "    unused = RBLOCK\n" + source.source[body:]
        return source

    return generate


def _sin_plus_one(x):
    return (x.sin() + 1,)


@pytest.mark.parametrize("strict", [False, True])
def test_a_kernel_failing_at_its_first_launch_runs_the_graph_eagerly(monkeypatch, caplog, strict):
    # Triton compiles lazily, at a kernel's first launch inside the user's call: 22 fuzz programs
    # raised Triton's NameError('RBLOCK is not defined') to the user on an H200. Under the
    # interpreter the same kernel fails at its first run, which is what is injected here.
    import kiln.codegen.triton

    monkeypatch.setattr(kiln.codegen.triton, "generate_kernel", _with_undefined_name(kiln.codegen.triton.generate_kernel))
    x = torch.randn(37)
    with kiln.config.patch(cpu_backend="triton", strict=False):
        compiled = compile_graph(torch.fx.symbolic_trace(_sin_plus_one), [x])
    assert compiled.kernel_count == 1
    with kiln.config.patch(strict=strict):
        if strict:
            with pytest.raises(KilnCompileError, match="(?s)failed to compile at its first launch.*RBLOCK"):
                compiled(x)
            return
        with caplog.at_level(logging.WARNING, logger="kiln"):
            first = compiled(x)
        second = compiled(x)
    assert any("runs eagerly" in record.getMessage() and "RBLOCK" in record.getMessage() for record in caplog.records)
    assert torch.equal(first[0], _sin_plus_one(x)[0]) and torch.equal(second[0], first[0])


# ---- compile_ahead: a graph's CUDA kernels compiled in parallel before their first launch ----------------


class _AsyncKernel:
    """Stands in for a JITFunction's warmup under Triton's AsyncCompileMode: submits its compile to the
    mode's executor and stores the result in its own cache when the mode finalizes it."""

    def __init__(self, fail: bool = False, compiled=None, gate=None):
        self.cache, self.threads, self.calls, self.fail = {}, set(), [], fail
        self.compiled = "binary" if compiled is None else compiled
        self.gate = gate  # a threading.Event the compile waits for

    def warmup(self, *args, grid, **options):
        import threading
        import time

        from triton.runtime._async_compile import active_mode

        self.calls.append((args, options))
        key = (id(self), tuple(map(str, args)), tuple(sorted(options.items())))  # Triton's: source + specialization

        def compile_kernel():
            time.sleep(0.05)
            if self.gate is not None:
                self.gate.wait(30)
            self.threads.add(threading.get_ident())
            if self.fail:
                raise RuntimeError("ptxas failed")
            return self.compiled

        return active_mode.get().submit(key, compile_kernel, lambda binary: self.cache.__setitem__(key, binary))


def test_compile_ahead_compiles_every_kernel_on_several_threads_before_returning():
    from kiln.runtime.launch import compile_ahead

    kernels = [_AsyncKernel() for _ in range(6)]
    failing = _AsyncKernel(fail=True)
    jobs = [(kernel, [torch.float32, torch.bfloat16], [4096, 1], {"XBLOCK": 1024}, {"num_warps": 4}) for kernel in kernels]
    jobs.append((failing, [torch.float32], [16], {"XBLOCK": 16}, {"num_warps": 2}))
    assert compile_ahead(jobs, workers=4) == 7
    assert all(len(kernel.cache) == 1 for kernel in kernels)  # finalized before compile_ahead returned
    assert not failing.cache  # its error is left for the launch to report
    assert len(set().union(*(kernel.threads for kernel in kernels))) > 1
    args, options = kernels[0].calls[0]
    assert args == (torch.float32, torch.bfloat16, 4096, 1)  # pointers as dtypes (warmup mocks them), ints
    assert options == {"XBLOCK": 1024, "num_warps": 4, "enable_fp_fusion": False}  # the launch's options


def test_compile_ahead_in_the_background_returns_at_once_and_each_launch_waits_for_its_own_kernel():
    from kiln.runtime.launch import compile_ahead, wait_for_ahead_compile

    gate = threading.Event()
    slow, quick = _AsyncKernel(gate=gate), _AsyncKernel()
    jobs = [(kernel, [torch.float32], [16], {"XBLOCK": 16}, {"num_warps": 2}) for kernel in (slow, quick)]
    assert compile_ahead(jobs, workers=2, background=True) == 2
    assert not slow.cache  # still compiling: compile_ahead did not wait for it
    wait_for_ahead_compile(quick)
    assert len(quick.cache) == 1  # finalized, where its launch finds it, while the other still compiles
    waiter = threading.Thread(target=wait_for_ahead_compile, args=(slow,))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not slow.cache
    gate.set()
    waiter.join(10)
    assert not waiter.is_alive() and len(slow.cache) == 1
    wait_for_ahead_compile(_AsyncKernel())  # a kernel never compiled ahead: nothing to wait for


def test_a_failing_background_compile_releases_its_launch():
    from kiln.runtime.launch import compile_ahead, wait_for_ahead_compile

    failing = _AsyncKernel(fail=True)
    compile_ahead([(failing, [torch.float32], [16], {"XBLOCK": 16}, {"num_warps": 2})], workers=1, background=True)
    waiter = threading.Thread(target=wait_for_ahead_compile, args=(failing,))
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive() and not failing.cache  # the launch compiles it and reports the error


class _CompiledKernel:
    """Stands in for Triton's CompiledKernel: `_init_handles` builds the launcher and loads the binary."""

    device = threading.local()  # the device a torch.cuda.device block made current on this thread

    def __init__(self, fail: bool = False):
        self.loads, self.fail = [], fail

    def _init_handles(self):
        self.loads.append((threading.get_ident(), getattr(self.device, "index", None)))
        if self.fail:
            raise RuntimeError("out of resources: shared memory")


def test_compile_ahead_loads_each_compiled_kernel_on_the_pool_threads_on_the_callers_device(monkeypatch):
    from kiln.runtime.launch import compile_ahead

    @contextlib.contextmanager
    def cuda_device(index):
        _CompiledKernel.device.index = index
        yield
        _CompiledKernel.device.index = None

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "device", cuda_device)
    compiled = [_CompiledKernel() for _ in range(5)] + [_CompiledKernel(fail=True)]
    kernels = [_AsyncKernel(compiled=binary) for binary in compiled] + [_AsyncKernel(fail=True)]
    jobs = [(kernel, [torch.float32], [16], {"XBLOCK": 16}, {"num_warps": 2}) for kernel in kernels]
    assert compile_ahead(jobs, workers=4) == 7  # the failing load is left for the first launch to raise
    assert all(len(binary.loads) == 1 for binary in compiled)
    threads = {thread for binary in compiled for thread, _ in binary.loads}
    assert threading.get_ident() not in threads
    assert {device for binary in compiled for _, device in binary.loads} == {3}  # the caller's current device


def test_the_loader_compiles_static_cuda_kernels_ahead_once_each(monkeypatch):
    import sympy

    from kiln.codegen.triton import KernelSource
    from kiln.runtime import launch, loader

    submitted = []
    shared = object()
    monkeypatch.setattr(loader, "load_kernel", lambda name, source, device_type: shared)
    monkeypatch.setattr(loader._triton, "is_interpreted", lambda kernel: False)
    monkeypatch.setattr(launch, "compile_ahead", lambda jobs, workers, background=False: submitted.extend(jobs) or len(jobs))
    s0 = sympy.Symbol("s0", integer=True, positive=True)

    def source(name, sizes, device_type="cuda", skip=False):
        return KernelSource(name, "src", ["buf0", "buf1"], sizes, sizes[-1], 1024, None, 4, device_type, skip,
                            "kernel_abc", [torch.float32, torch.bfloat16])

    with kiln.config.patch(parallel_compile=True):  # the default
        loader._compile_ahead(kernel_sources=[
            source("k0", [sympy.Integer(8), sympy.Integer(4096)]),
            source("k1", [sympy.Integer(8), sympy.Integer(4096)]),  # the same source and arguments: once
            source("k2", [sympy.Integer(8), sympy.Integer(1024)]),  # other sizes: another specialization
            source("k3", [s0, s0 * 8]),  # symbolic sizes: compiled at launch, where they are known
            source("k4", [sympy.Integer(8)], device_type="cpu"),
            source("k5", [sympy.Integer(0)], skip=True),
        ])
    assert [(kernel, dtypes, ints) for kernel, dtypes, ints, _, _ in submitted] == [
        (shared, [torch.float32, torch.bfloat16], [8, 4096]), (shared, [torch.float32, torch.bfloat16], [8, 1024])]
    with kiln.config.patch(parallel_compile=False):
        submitted.clear()
        loader._compile_ahead([source("k0", [sympy.Integer(8), sympy.Integer(4096)])])
        assert not submitted


def test_the_launcher_runs_with_the_builtins(fake_driver):
    """C functions the launcher calls may run Python that reads the calling frame's builtins: torch's
    `_cuda_getDevice` on a machine without a GPU raised KeyError: '__builtins__' there, not its RuntimeError."""
    import builtins

    launch = _fast_launcher(_Kernel(), "k0", pointer_count=1, int_count=1, constexprs={"XBLOCK": 16}, options={"num_warps": 4})
    assert launch.__globals__["__builtins__"] is builtins


def test_a_first_launch_waits_for_its_kernels_background_compile(fake_driver):
    """A kernel compiling in the background (compile_ahead(background=True)) is launched only once its compile is in
    its cache: the first launch blocks on its event; later launches take the direct path without waiting."""
    from kiln.runtime import launch as launch_module

    kernel, ready = _Kernel(), threading.Event()
    launch_module._compiling[kernel] = ready
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=1, constexprs={"XBLOCK": 16},
                            options={"num_warps": 4})
    buffer = torch.zeros(64)
    launcher = threading.Thread(target=launch, args=(3, buffer, 48))
    launcher.start()
    launcher.join(0.3)
    assert launcher.is_alive() and kernel.compiles == 0  # waiting: Triton has not been asked to compile
    ready.set()
    launcher.join(10)
    assert not launcher.is_alive() and kernel.compiles == 1  # Triton's run compiles (its cache) and launches
    launch(3, buffer, 48)
    assert kernel.compiles == 1 and len(kernel.compiled.launches) == 1  # the direct path


# ---- streamed compiles: each kernel's compile starts as codegen makes it ------------------------------------


def test_a_compile_stream_compiles_each_job_as_it_comes_and_finalizes_after_close():
    from kiln.runtime.launch import CompileStream, wait_for_ahead_compile

    first, second = _AsyncKernel(), _AsyncKernel()
    stream = CompileStream(workers=2)
    stream.add((first, [torch.float32], [16], {"XBLOCK": 16}, {"num_warps": 2}))
    for _ in range(200):  # compiling before the next job exists
        if first.threads:
            break
        threading.Event().wait(0.01)
    assert first.threads and not second.calls
    waiter = threading.Thread(target=wait_for_ahead_compile, args=(first,))
    waiter.start()
    stream.add((second, [torch.float32], [32], {"XBLOCK": 32}, {"num_warps": 4}))
    waiter.join(0.2)
    assert waiter.is_alive()  # a launch waits until the stream is closed and its compile finalized
    stream.close()
    waiter.join(10)
    stream.thread.join(10)
    assert not waiter.is_alive() and not stream.thread.is_alive()
    assert len(first.cache) == 1 and len(second.cache) == 1


def _kernel_source(name, sizes, device_type="cuda"):
    from kiln.codegen.triton import KernelSource

    return KernelSource(name, "src", ["buf0", "buf1"], sizes, sizes[-1], 1024, None, 4, device_type, False,
                        f"kernel_{name}", [torch.float32, torch.bfloat16])


def test_streamed_compiles_start_each_kernel_when_generated_and_close_with_the_module(monkeypatch):
    import sympy

    from kiln.runtime import launch, loader

    added, closed = [], []

    class Stream:
        def __init__(self, workers):
            self.workers = workers

        def add(self, job):
            added.append(job[0])

        def close(self):
            closed.append(self)

    jits: dict = {}  # the loader's cache: one kernel object per source
    monkeypatch.setattr(loader, "load_kernel", lambda name, source, device_type: jits.setdefault(name, name))
    monkeypatch.setattr(loader._triton, "is_interpreted", lambda kernel: False)
    monkeypatch.setattr(launch, "CompileStream", Stream)
    monkeypatch.setattr(launch, "compile_ahead", lambda *a, **k: pytest.fail("compiled all at once"))
    sizes = [sympy.Integer(8), sympy.Integer(4096)]
    with kiln.config.patch(parallel_compile=True, compile_overlap=True):
        with loader.streamed_compiles():
            loader.compile_early(_kernel_source("k0", sizes))
            assert added == ["kernel_k0"] and not closed  # compiling while the rest is generated
            loader.compile_early(_kernel_source("k0", sizes))  # the same kernel and arguments: once
            loader.compile_early(_kernel_source("k1", sizes, device_type="cpu"))  # not a CUDA kernel
            loader._compile_ahead([_kernel_source("k0", sizes), _kernel_source("k2", sizes)])  # the module loads
            assert added == ["kernel_k0", "kernel_k2"] and len(closed) == 1
            loader.compile_early(_kernel_source("k3", sizes))  # after the load: not into a closed stream
        assert added == ["kernel_k0", "kernel_k2"] and len(closed) == 1
        loader.compile_early(_kernel_source("k4", sizes))  # no stream open: nothing
    assert added == ["kernel_k0", "kernel_k2"]


def test_a_stream_closes_when_its_block_ends_early(monkeypatch):
    """A compile that fails after some kernels were generated still closes their stream (its thread ends)."""
    import sympy

    from kiln.runtime import launch, loader

    closed = []
    monkeypatch.setattr(loader, "load_kernel", lambda name, source, device_type: name)
    monkeypatch.setattr(loader._triton, "is_interpreted", lambda kernel: False)
    monkeypatch.setattr(launch, "CompileStream", lambda workers: type("S", (), {
        "add": lambda self, job: None, "close": lambda self: closed.append(1)})())
    with kiln.config.patch(parallel_compile=True, compile_overlap=True):
        with pytest.raises(ValueError):
            with loader.streamed_compiles():
                loader.compile_early(_kernel_source("k0", [sympy.Integer(8), sympy.Integer(4096)]))
                raise ValueError("lowering failed")
    assert closed == [1] and loader._open_streams() == []


def test_without_overlap_the_kernels_compile_together_at_load(monkeypatch):
    import sympy

    from kiln.runtime import launch, loader

    submitted = []
    monkeypatch.setattr(loader, "load_kernel", lambda name, source, device_type: name)
    monkeypatch.setattr(loader._triton, "is_interpreted", lambda kernel: False)
    monkeypatch.setattr(launch, "compile_ahead", lambda jobs, workers, background=False: submitted.append(
        ([job[0] for job in jobs], background)))
    with kiln.config.patch(parallel_compile=True, compile_overlap=False):
        with loader.streamed_compiles():
            loader.compile_early(_kernel_source("k0", [sympy.Integer(8), sympy.Integer(4096)]))
            loader._compile_ahead([_kernel_source("k0", [sympy.Integer(8), sympy.Integer(4096)])])
    assert submitted == [(["kernel_k0"], False)]


def test_a_first_launch_error_names_the_parameter_counts_of_the_kernel_and_of_what_its_cache_compiled():
    # the diagnostic for a launcher built for another kernel's signature (seen once on an H100 at 05ad837)
    from kiln.runtime.launch import _compiled_signatures

    compiled = types.SimpleNamespace(src=types.SimpleNamespace(signature={"a": "*fp32", "b": "i32", "c": "i32"}),
                                     hash="h1")
    future = types.SimpleNamespace(kernel=compiled)  # a finalized FutureKernel
    kernel = types.SimpleNamespace(arg_names=["p0", "p1", "p2", "p3", "XBLOCK"],
                                   device_caches={0: ({"spec0": compiled, "spec1": future}, {})})
    text = _compiled_signatures(kernel)
    assert "kernel parameters 5" in text and text.count("3 (h1; launcher not built)") == 2
    assert _compiled_signatures(object()) == ""  # a stand-in without Triton's caches: no diagnostic
