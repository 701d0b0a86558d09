"""Random batch-norm statistics through kiln against eager and float64, on the CPU.

    python -m benchmarks.batch_norm_random BACKEND SEED CASES      # BACKEND: cpp or triton (TRITON_INTERPRET=1)

Each case: x of (N, C, H, W) with N in 2-16, C in 3-100, H and W in 4-16, float32, bf16 or fp16, NCHW or
channels-last, spread 0.01-30 around 0, 5 or 1000; `var_mean(x, (0, 2, 3))` (correction 0 or 1) and
`F.batch_norm(training=True)` compared by kiln.testing.compare. Prints each failure and how many cases took the
outer welford split (kiln/schedule/split.py `_welford_split`).
"""
from __future__ import annotations

import functools
import random
import sys

import torch

import kiln
from kiln.backend import compile_graph
from kiln.testing import compare, to_float64


def _program(x, weight, bias, *, correction):
    variance, mean = torch.var_mean(x, dim=(0, 2, 3), correction=correction)
    return torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True), variance, mean


def main(argv: list[str]) -> int:
    backend, seed, cases = argv[0], int(argv[1]), int(argv[2])
    rng = random.Random(seed)
    failures = split_cases = 0
    for case in range(cases):
        shape = (rng.choice([2, 4, 8, 16]), rng.choice([3, 16, 24, 64, 100]), rng.choice([4, 7, 8, 14, 16]),
                 rng.choice([4, 7, 8, 16]))
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
        program = functools.partial(_program, correction=rng.choice([0, 1]))
        generator = torch.Generator().manual_seed(case)
        x = (torch.randn(shape, generator=generator) * rng.choice([0.01, 1, 30]) + rng.choice([0, 5, 1000])).to(dtype)
        if rng.random() < 0.5:
            x = x.contiguous(memory_format=torch.channels_last)
        weight = torch.randn(shape[1], generator=generator).to(dtype)
        bias = torch.randn(shape[1], generator=generator).to(dtype)
        traced = torch.fx.symbolic_trace(lambda x, weight, bias: program(x, weight, bias))
        with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
            compiled = compile_graph(traced, [x, weight, bias])
            got = compiled(x, weight, bias)
        split = any(node.name.endswith("_stage2b") for kernel in compiled.scheduled.kernels for node in kernel.nodes)
        split_cases += split
        verdict = compare(got, program(x, weight, bias), program(*to_float64([x, weight, bias])))
        if not verdict:
            failures += 1
            layout = "channels-last" if not x.is_contiguous() else "NCHW"
            print(f"FAIL case {case} {shape} {dtype} {layout} split={split}: {verdict.message[:200]}")
    print(f"{backend} seed {seed}: {cases} cases, {split_cases} split, {failures} failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
