"""kiln/runtime/compile_workers.py: Triton compiles a graph's CUDA kernels in worker processes first.

The end-to-end test compiles kiln's kernels for an H200 (sm_90) on this GPU-less machine, in a fresh
process (Triton compiling, not interpreted) whose Triton driver is a stand-in that names the target:
Triton's own JIT warmup runs, its compiles go through compile_ahead, and with worker processes every
one of them must be a cache hit in the parent (no compile stage runs there), with the same kernels.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import kiln

from kiln import _triton
from kiln.runtime.compile_workers import CompileWorkers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROBE = textwrap.dedent('''
    import json, os, pickle, sys
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime import driver

    class Driver:  # the target an H200 gives; no device is touched
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device=None: 0)
        get_current_target = staticmethod(lambda: GPUTarget("cuda", 90, 32))
        get_active_torch_device = staticmethod(lambda: torch.device("cuda", 0))

    driver.set_active(Driver())
    import kiln
    from kiln.runtime import compile_workers, launch, loader

    compiled_here = []
    add_stages = CUDABackend.add_stages
    CUDABackend.add_stages = lambda self, *args: (compiled_here.append(1), add_stages(self, *args))[1]
    kiln._triton.load_compiled = lambda kernel, device: None  # nothing to load a binary on
    torch.cuda.current_device = lambda: 0
    processes = sys.argv[2] == "1"
    jobs = [(loader.load_kernel(job["function"], job["source"], "cuda"), job["pointer_dtypes"], job["sizes"],
             job["constexprs"], job["options"]) for job in pickle.load(open(sys.argv[1], "rb"))]
    with kiln.config.patch(compile_processes=processes, compile_workers=2):
        launch.compile_ahead(jobs, 2)
    workers = compile_workers._workers
    print(json.dumps({"compiled_here": len(compiled_here), "failures": workers.failures if workers else None,
                      "processes_started": len(workers._all) if workers else 0,
                      "asm": sorted(next(iter(jit.device_caches[0][0].values())).asm["ptx"][-400:]
                                    for jit, *_ in jobs)}))
''')


def _kernel_jobs(tmp_path) -> str:
    from tests.codegen.test_gpu_compile import cuda_sources

    x, y = torch.randn(64, 96), torch.randn(64, 96)
    sources = cuda_sources(lambda x, y: torch.sin(x) + y.sum(1, keepdim=True) * torch.cos(y), x, y)
    jobs = [{"source": s.source, "function": s.function_name, "pointer_dtypes": list(s.pointer_dtypes),
             "sizes": [int(v) for v in s.size_args], "constexprs": s.constexprs, "options": s.launch_options}
            for s in sources]
    assert len(jobs) >= 1
    path = tmp_path / "jobs.pkl"
    path.write_bytes(pickle.dumps(jobs))
    return str(path)


def _probe(jobs: str, processes: bool, cache: str) -> dict:
    environment = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=cache, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", _PROBE, jobs, "1" if processes else "0"], cwd=ROOT,
                            env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_worker_processes_compile_every_kernel_and_the_parent_finds_them_in_the_cache(tmp_path):
    jobs = _kernel_jobs(tmp_path)
    with_workers = _probe(jobs, True, str(tmp_path / "cache-workers"))
    assert with_workers["failures"] == [] and with_workers["compiled_here"] == 0
    alone = _probe(jobs, False, str(tmp_path / "cache-alone"))
    assert alone["compiled_here"] >= 1 and alone["failures"] is None
    assert with_workers["asm"] == alone["asm"]  # the same kernels


def test_a_warm_start_sends_nothing_to_worker_processes(tmp_path):
    """With Triton's cache filled by a first process, a second one (a warm start) finds every kernel there
    before asking a worker: it starts no worker processes and compiles nothing."""
    jobs, cache = _kernel_jobs(tmp_path), str(tmp_path / "cache")
    cold = _probe(jobs, True, cache)
    assert cold["processes_started"] == 2 and cold["compiled_here"] == 0
    warm = _probe(jobs, True, cache)
    assert warm["processes_started"] == 0 and warm["compiled_here"] == 0 and warm["failures"] == []
    assert warm["asm"] == cold["asm"]


def test_in_cache_is_false_for_what_it_cannot_read():
    assert _triton.in_cache("key", _closure_compile(1)) is False  # no `src` in the closure


def _closure_compile(value):
    def compile_fn():
        return value
    return compile_fn


def test_a_failing_worker_leaves_the_compile_to_the_thread(monkeypatch):
    """A worker that raises costs only the wait: the thread runs Triton's compile itself."""
    calls = []

    def broken_worker(job):
        calls.append(job)
        raise EOFError("the compile worker exited")

    monkeypatch.setattr(_triton, "compile_job", lambda compile_fn: {"kernel": compile_fn()})
    with ThreadPoolExecutor(2) as executor:
        with _triton.WorkerCompileMode(executor, broken_worker) as mode:
            kept = {}
            future = mode.submit("key", _closure_compile("binary"), lambda kernel: kept.__setitem__("key", kernel))
    assert calls == [{"kernel": "binary"}]  # the worker was asked, and failed
    assert future.result() == "binary" and kept == {"key": "binary"}


def test_only_tritons_compile_closure_is_sent_to_a_worker():
    calls = []
    with ThreadPoolExecutor(1) as executor:
        with _triton.WorkerCompileMode(executor, calls.append) as mode:
            future = mode.submit("key", _closure_compile("binary"), lambda kernel: None)
    assert future.result() == "binary" and calls == []  # not Triton's closure: nothing to send
    assert _triton.compile_job(_closure_compile(1)) is None


def test_a_dead_worker_is_replaced_and_its_compile_reported(tmp_path):
    workers = CompileWorkers(1)
    try:
        workers.start()
        (worker,) = workers._all
        worker.process.kill()
        worker.process.wait()
        assert workers.compile({"text": ""}) is False
        assert "EOFError" in workers.failures[0] or "BrokenPipe" in workers.failures[0]
        assert workers._all == []
        # a bad job in a live worker: reported, the worker kept
        assert workers.compile({"text": "x = (", "path": str(tmp_path / "k.py"), "module": "m", "function": "f",
                                "signature": {}, "constants": {}, "attrs": {}, "target": None, "options": {},
                                "env_vars": {}}) is False
        assert "SyntaxError" in workers.failures[-1] and len(workers._all) == 1
    finally:
        workers.close()


def test_workers_are_off_under_the_interpreter_and_by_option(monkeypatch):
    from kiln.config import config
    from kiln.runtime import compile_workers

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert compile_workers.workers() is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with config.patch(compile_processes=False):
        assert compile_workers.workers() is None


def test_each_kernel_is_loaded_on_its_compile_thread_as_soon_as_it_compiles():
    """A kernel's launcher and binary load right after its own compile, while the others still compile: a
    graph no longer waits for its slowest compile and then its slowest launcher. A load that raises is left
    for the launch (which loads again and reports it)."""
    import threading

    events, slow_started, fast_loaded = [], threading.Event(), threading.Event()

    def compile_slow():
        slow_started.set()
        assert fast_loaded.wait(10), "the fast kernel was not loaded while the slow one compiled"
        events.append("slow compiled")
        return "slow"

    def compile_fast():
        slow_started.wait(10)
        events.append("fast compiled")
        return "fast"

    def after_compile(kernel):
        events.append(f"{kernel} loaded on {threading.current_thread().name}")
        if kernel == "fast":
            fast_loaded.set()
        else:
            raise RuntimeError("no device to load on")

    with ThreadPoolExecutor(2, thread_name_prefix="compile") as executor:
        with _triton.WorkerCompileMode(executor, lambda job: False, after_compile=after_compile) as mode:
            slow = mode.submit("slow", compile_slow, lambda kernel: None)
            fast = mode.submit("fast", compile_fast, lambda kernel: None)
    assert slow.result() == "slow" and fast.result() == "fast"
    assert events[:2] == ["fast compiled", events[1]] and events[1].startswith("fast loaded on compile")
    assert events[2:] == ["slow compiled", events[3]] and events[3].startswith("slow loaded on compile")


def _worker_module():
    import importlib.util

    path = os.path.join(ROOT, "kiln", "runtime", "compile_worker_main.py")
    spec = importlib.util.spec_from_file_location("kiln_compile_worker_main_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_a_worker_builds_a_cuda_kernels_launcher_while_the_kernel_compiles(monkeypatch, backend, tmp_path):
    """The launcher's C source depends only on the kernel's signature and constants: the worker builds it on a
    thread beside the compile (its C compiler run then costs the parent's thread nothing at load time)."""
    import threading

    import triton
    import triton.backends.nvidia.driver as nvidia_driver
    from triton.backends.compiler import GPUTarget

    worker = _worker_module()
    launcher_built, seen = threading.Event(), {}

    class Launcher:
        def __init__(self, source, metadata):
            seen["source"] = source
            launcher_built.set()
            metadata.global_scratch_size  # what the real one reads after building: absent on the stand-in

    def compile_waiting_for_the_launcher(source, target, options, _env_vars):
        seen["compiled"] = source
        seen["overlapped"] = launcher_built.wait(5 if backend == "cuda" else 0.2)

    monkeypatch.setattr(nvidia_driver, "CudaLauncher", Launcher)
    monkeypatch.setattr(triton, "compile", compile_waiting_for_the_launcher)
    text = "import triton\n\ndef kernel(x_ptr, n):\n    pass\n"
    worker._compile({"path": str(tmp_path / "k.py"), "text": text, "module": "k", "function": "kernel",
                     "signature": {"x_ptr": "*fp32", "n": "i32"}, "constants": {}, "attrs": {},
                     "target": GPUTarget(backend, 90, 32), "options": {}, "env_vars": {}})
    if backend == "cuda":
        assert seen["overlapped"] and seen["source"] is seen["compiled"]  # built while compiling, from its source
    else:
        assert not seen["overlapped"] and "source" not in seen  # no CUDA launcher for another backend


def _run_worker(script: str, environment: dict) -> subprocess.CompletedProcess:
    worker = os.path.join(ROOT, "kiln", "runtime", "compile_worker_main.py")
    return subprocess.run([sys.executable, "-c", script, worker], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TRITON_INTERPRET="0", **environment))


def test_a_worker_warms_up_for_the_parents_gpu_without_hashing_triton_or_keeping_the_kernel(tmp_path):
    """compile_worker_main.warm_up compiles a throwaway row kernel for the target it is given (sm_90 here, on this
    GPU-less machine): it runs Triton's whole pipeline, under a key prefix of its own (Triton's hash of itself is not
    computed), and restores what it changed."""
    script = textwrap.dedent('''
        import runpy, sys, time
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend
        from triton.runtime import cache
        stages = []
        add_stages = CUDABackend.add_stages
        CUDABackend.add_stages = lambda self, *args: (stages.append(1), add_stages(self, *args))[1]
        original = cache.triton_key
        cache.triton_key = lambda: (_ for _ in ()).throw(AssertionError("hashed Triton"))
        worker = runpy.run_path(sys.argv[1])
        start = time.perf_counter()
        worker["warm_up"]("cuda,90,32")
        print(len(stages), cache.triton_key is not original and cache.triton_key.__name__ == "<lambda>",
              knobs.compilation.always_compile)
    ''')
    result = _run_worker(script, {"TRITON_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["1", "True", "False"]  # compiled once; triton_key and always_compile restored


def test_a_failed_warm_up_leaves_the_worker_serving():
    script = textwrap.dedent('''
        import runpy, sys
        worker = runpy.run_path(sys.argv[1])
        worker["warm_up"]("cuda,not-an-arch,32")
        worker["warm_up"]("hip,gfx942,64")  # not a CUDA target: nothing
        print("serving")
    ''')
    result = _run_worker(script, {})
    assert result.returncode == 0 and result.stdout.strip() == "serving", result.stderr[-3000:]


def test_workers_are_told_the_target_they_warm_up_for(monkeypatch):
    from kiln.runtime import compile_workers

    started = []

    class Worker:
        def __init__(self, warm_up_target=None):
            started.append(warm_up_target)
            self.process = None

    monkeypatch.setattr(compile_workers, "_Worker", Worker)
    monkeypatch.setattr(compile_workers, "_current_target", lambda: "cuda,90,32")
    with kiln.config.patch(compile_worker_warm_up=True):
        pool = CompileWorkers(2)
        pool.start()
        assert started == ["cuda,90,32", "cuda,90,32"]
        monkeypatch.setattr(compile_workers, "_current_target", lambda: None)
        pool, started[:] = CompileWorkers(1), []
        pool.start()
        assert started == [""]  # no GPU to ask: no warm-up
    monkeypatch.setattr(compile_workers, "_current_target", lambda: "cuda,90,32")
    pool, started[:] = CompileWorkers(1), []
    pool.start()
    assert started == [""]  # the default: no warm-up (not yet measured on a GPU)


def test_warming_workers_run_at_a_lower_priority_than_their_parent():
    from kiln.runtime import compile_worker_main
    from kiln.runtime.compile_workers import _Worker

    worker = _Worker("cuda,90,32")
    try:
        for _ in range(100):  # the worker lowers its own priority as it starts
            if os.getpriority(os.PRIO_PROCESS, worker.process.pid) > os.getpriority(os.PRIO_PROCESS, 0):
                break
            threading.Event().wait(0.05)
        parent = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, worker.process.pid) == min(parent + compile_worker_main.NICENESS, 19)
    finally:
        worker.close()
