"""Host microseconds per call of what a compiled graph's wrapper does between kernels, on a GPU.

    python -m benchmarks.extern_overhead

A product through its OpOverload (`aten.mm.default(a, b)`, what kiln's wrappers called before
2026-12-04) against torch's own binding (`torch.mm(a, b)`, what kiln/runtime/support.py
PYTHON_BINDINGS binds now) and the out= form Inductor's wrappers use; an allocation through
`torch.empty_strided(..., device=, dtype=)` against `_empty_strided_cuda` (kiln/runtime/support.py
cuda_allocator). Small operands (64 x 64, bf16), so the GPU keeps up and the loop measures the host:
the median of 5 rounds of 2,000 calls, issued without a synchronize (one at the end of each round).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch


def _per_call_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - begin) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    from torch._C._dynamo.guards import _empty_strided_cuda

    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16).t()  # a transposed view, as nn.Linear's weight
    out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    mm = torch.ops.aten.mm.default
    cases = {
        "aten.mm.default(a, b)": lambda: mm(a, b),
        "torch.mm(a, b)": lambda: torch.mm(a, b),
        "torch.mm(a, b, out=c)": lambda: torch.mm(a, b, out=out),
        "torch.empty_strided(size, stride, device=, dtype=)":
            lambda: torch.empty_strided((4096, 1024), (1024, 1), device="cuda:0", dtype=torch.bfloat16),
        "_empty_strided_cuda(size, stride, dtype)": lambda: _empty_strided_cuda((4096, 1024), (1024, 1), torch.bfloat16),
    }
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: host us per call")
    print("| call | us |\n|---|---|")
    for name, fn in cases.items():
        print(f"| `{name}` | {_per_call_us(fn):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
