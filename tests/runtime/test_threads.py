"""kiln called from several threads at once: compiles are serialized per process and traced
once (kiln/runtime/locks.py, kiln/frontend/dispatcher.py, kiln/aot), interpreted Triton kernels
run one at a time (kiln/_triton.py), and every call gives eager's result, on both CPU backends."""
from __future__ import annotations

import glob
import linecache
import os
import threading

import pytest
import torch

import kiln
import kiln.testing
from kiln import _triton
from kiln.frontend import stats

THREADS = 8
CALLS = 4


@pytest.fixture(params=["cpp", "triton"])
def cpu_backend(request, tmp_path):
    """Both CPU backends, strict (a failed compile raises), with an empty cache."""
    with kiln.config.patch(cpu_backend=request.param, strict=True, cache_dir=str(tmp_path / "cache")):
        yield request.param


def run_together(work, count: int = THREADS) -> list:
    """`work(index)` on `count` threads released at once; their results, or the first error raised."""
    barrier = threading.Barrier(count)
    results, errors = [None] * count, []

    def target(index):
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as error:  # re-raised below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def kernel_files(cpu_backend: str) -> list:
    pattern = "cpp/*/*.so" if cpu_backend == "cpp" else "triton/*/*.py"
    return glob.glob(os.path.join(kiln.config.cache_dir, pattern))


def assert_close_to_eager(result, fn, *args):
    verdict = kiln.testing.compare(result, fn(*args), fn(*kiln.testing.to_float64(args)))
    assert verdict, verdict.message


def test_first_calls_from_many_threads_trace_once_and_share_one_entry(cpu_backend):
    def fn(x, y):
        return torch.sin(x) * y + torch.cos(y).sum(dim=-1, keepdim=True)

    compiled = kiln.compile(fn)
    inputs = [(torch.randn(6, 33), torch.randn(6, 33)) for _ in range(THREADS)]
    captures = stats.captures

    def work(index):
        return [compiled(*inputs[index]) for _ in range(CALLS)]

    for index, results in enumerate(run_together(work)):
        for result in results:
            assert_close_to_eager(result, fn, *inputs[index])
    assert stats.captures - captures == 1
    (entry,) = compiled.entries
    assert entry.eager_reason is None and entry.graph_module is not None
    assert len(glob.glob(os.path.join(kiln.config.cache_dir, "wrappers", "*", "*.py"))) == 1
    assert len(kernel_files(cpu_backend)) >= 1


def test_different_functions_compiled_at_once_all_compile(cpu_backend):
    # AOTAutograd traces through torch.fx's module-level patcher: two traces at once broke one
    # of them ("CURRENT_PATCHER is None"), which then ran eagerly for good (strict: raised).
    count = 4  # each is its own kernel build
    functions = [(lambda scale: lambda x: torch.tanh(x * scale) + scale)(index + 1.5) for index in range(count)]
    compiled = [kiln.compile(fn) for fn in functions]
    inputs = [torch.randn(16, 40) for _ in range(count)]

    def work(index):
        return [compiled[index](inputs[index]) for _ in range(CALLS)]

    for index, results in enumerate(run_together(work, count)):
        for result in results:
            assert_close_to_eager(result, functions[index], inputs[index])
        (entry,) = compiled[index].entries
        assert entry.eager_reason is None and entry.graph_module is not None


def test_training_steps_from_many_threads(cpu_backend):
    def fn(x, w):
        return (torch.nn.functional.silu(x @ w) * 2).sum()

    compiled = kiln.compile(fn)
    weights = [torch.randn(24, 8, requires_grad=True) for _ in range(THREADS)]
    inputs = [torch.randn(5, 24) for _ in range(THREADS)]

    def work(index):
        gradients = []
        for _ in range(CALLS):
            (gradient,) = torch.autograd.grad(compiled(inputs[index], weights[index]), [weights[index]])
            gradients.append(gradient)
        return gradients

    for index, gradients in enumerate(run_together(work)):
        (eager,) = torch.autograd.grad(fn(inputs[index], weights[index]), [weights[index]])
        weight64 = weights[index].detach().double().requires_grad_()
        (reference,) = torch.autograd.grad(fn(inputs[index].double(), weight64), [weight64])
        for gradient in gradients:
            verdict = kiln.testing.compare(gradient, eager, reference)
            assert verdict, verdict.message
    assert len(compiled.entries) == 1 and compiled.entries[0].graph_module is not None


def test_only_interpreted_kernels_are_serialized(monkeypatch):
    # On a GPU (no TRITON_INTERPRET) launches stay lock-free: the kernel is Triton's own JITFunction.
    from triton import knobs

    source = "import triton\ndef kernel_k(x_ptr, XBLOCK: triton.language.constexpr):\n    pass\n"
    filename = "<kiln test kernel>"
    monkeypatch.setitem(linecache.cache, filename, (len(source), None, source.splitlines(True), filename))
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    assert not isinstance(_triton.jit_for_device(namespace["kernel_k"], "cuda"),
                          _triton.SerializedInterpretedFunction)
    monkeypatch.setattr(knobs.runtime, "interpret", True)
    assert isinstance(_triton.jit_for_device(namespace["kernel_k"], "cuda"), _triton.SerializedInterpretedFunction)
    assert isinstance(_triton.jit_for_device(namespace["kernel_k"], "cpu"), _triton.SerializedInterpretedFunction)
