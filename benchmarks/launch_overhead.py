"""Host time per call of a launch-bound compiled program, kiln's launcher on and off.

    python -m benchmarks.launch_overhead          # on a GPU machine

A chain of 8 small kernels on a [100, 100] tensor (each step a row sum and a pointwise
epilogue, so each step is one persistent-reduction kernel and the next step must wait
for it): the GPU work is a few microseconds per kernel, so the time per call is the
host's: the generated wrapper, the launches, the allocations. (A first version summed
the whole tensor, one row of 10k: a single-program looped reduction, GPU-bound.) Printed for
`fast_launch` True and False, each in a fresh compile, with the same inputs.
"""
from __future__ import annotations

import time

import torch

import kiln


def program(x):
    for _ in range(8):
        x = torch.sin(x) + x.sum(1, keepdim=True)  # reads whole rows of the previous step: a new kernel
    return x


def host_us_per_call(fast_launch: bool, calls: int = 2000) -> float:
    torch._dynamo.reset()
    with kiln.config.patch(fast_launch=fast_launch, strict=True):
        compiled = kiln.compile(program)
        x = torch.randn(100, 100, device="cuda")
        expected = program(x)
        assert kiln.testing.compare(compiled(x), expected), "kiln result differs from eager"
        for _ in range(50):
            compiled(x)
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            compiled(x)
        torch.cuda.synchronize()
    return (time.perf_counter() - begin) / calls * 1e6


def main() -> None:
    eager_begin = time.perf_counter()
    x = torch.randn(100, 100, device="cuda")
    for _ in range(2000):
        program(x)
    torch.cuda.synchronize()
    eager = (time.perf_counter() - eager_begin) / 2000 * 1e6
    slow, fast = host_us_per_call(False), host_us_per_call(True)
    print(f"launch-bound chain (8 row-sum kernels, 100x100 fp32), us per call: eager {eager:.1f}, "
          f"kiln with Triton's launch {slow:.1f}, kiln with kiln's launcher {fast:.1f}")


if __name__ == "__main__":
    main()
