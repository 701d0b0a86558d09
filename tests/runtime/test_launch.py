"""kiln/runtime/launch.py: the CUDA fast launcher's generated code, run on CPU with stand-ins.

No GPU here: Triton's driver and compiled kernel are replaced by recording stand-ins, so
these tests check kiln's own logic (when to compile, which key, what reaches the
compiled launcher), not Triton's.
"""
from __future__ import annotations

import pytest
import torch
from triton import knobs
from triton.runtime import driver

from kiln.runtime.launch import _fast_launcher


class _Driver:
    get_current_device = staticmethod(lambda: 0)
    get_current_stream = staticmethod(lambda device: 1234)


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.launches = []

    def run(self, *args):
        self.launches.append(args)


class _Kernel:
    """Stands in for a JITFunction: `run` "compiles" (and launches), `[grid]` is Triton's own path."""

    def __init__(self):
        self.compiled, self.compiles, self.triton_launches = _Compiled(), 0, 0

    def run(self, *args, grid, warmup, **options):
        assert not warmup and options == {"XBLOCK": 16, "num_warps": 4}
        self.compiles += 1
        return self.compiled

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.triton_launches += 1
        return launch


@pytest.fixture
def fake_driver():
    previous = driver._active  # None until a real driver is first asked for (never, on a CPU machine)
    driver.set_active(_Driver())
    yield
    driver._active = previous


def test_compiles_once_per_specialization_then_launches_directly(fake_driver):
    kernel = _Kernel()
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=1, constexprs={"XBLOCK": 16}, num_warps=4)
    buffer = torch.zeros(64)
    for size in (48, 48, 48, 64, 64):  # 48 and 64: both divisible by 16, one specialization
        launch(3, buffer, size)
    launch(3, buffer[1:], 48)  # a pointer off 16-byte alignment: another specialization
    assert kernel.compiles == 2 and kernel.triton_launches == 0
    assert len(kernel.compiled.launches) == 4
    grid_and_handles, arguments = kernel.compiled.launches[0][:9], kernel.compiled.launches[0][9:]
    assert grid_and_handles == (3, 1, 1, 1234, "function", "metadata", None, None, None)
    assert arguments[0] is buffer and arguments[1:] == (48, 16)  # pointers, ints, then constexprs


def test_a_registered_launch_hook_takes_tritons_path(fake_driver):
    kernel = _Kernel()
    launch = _fast_launcher(kernel, "k0", pointer_count=1, int_count=0, constexprs={"XBLOCK": 16}, num_warps=4)
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
