"""SASS instructions per element of kiln's row kernels for sm_90, on a machine without a GPU.

    python -m benchmarks.sass_count

On the H200 these kernels are bound by instruction issue rather than memory (tests/codegen/test_gpu_compile.py
test_row_kernels_stay_within_their_instruction_budget says why), so the count predicts their time. Each program
of TARGETS.md (bf16, rows of 4096) is compiled by kiln through Dynamo on CPU tensors, its CUDA kernel generated
and compiled by Triton for sm_90, and the cubin's instructions counted (Triton's cuobjdump), divided by the
elements one thread computes (of a program's largest kernel). gelu's kernel is shown twice: the CPU lowering's
(erfc form), and CUDA's (eager's erf form, erf_for_16bit for a 16-bit result).
"""
from __future__ import annotations

import contextlib

import torch

from benchmarks.workloads import gelu_bias, layer_norm, rmsnorm_silu_gate, softmax_last


def _batch_norm_relu(x, mean, var, weight, bias):
    """A conv net's inference batch norm and relu over a channels-last bf16 activation, float32 statistics."""
    return torch.relu(torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=False))


@contextlib.contextmanager
def _cuda_gelu(on: bool):
    """Lower gelu with eager's CUDA formula on these CPU tensors (as tests/lowering/test_gelu.py does)."""
    import kiln.lowering.pointwise as pointwise

    saved = pointwise._cuda_formula
    if on:
        pointwise._cuda_formula = lambda meta: True
    try:
        yield
    finally:
        pointwise._cuda_formula = saved


def main() -> None:
    from tests.codegen.test_gpu_compile import cuda_sources, sass_instructions
    generator = torch.Generator().manual_seed(0)

    def randn(*size):
        return torch.randn(*size, generator=generator).to(torch.bfloat16)

    programs = {"softmax": (softmax_last, [randn(2, 4096)]),
                "layer_norm": (layer_norm, [randn(2, 4096), randn(4096), randn(4096)]),
                "rmsnorm_silu_gate": (rmsnorm_silu_gate, [randn(2, 4096), randn(4096), randn(2, 4096)]),
                "gelu_bias (CPU lowering)": (gelu_bias, [randn(16, 4096), randn(4096)]),
                "batch_norm + relu, NHWC": (_batch_norm_relu,
                                            [randn(4, 256, 14, 14).to(memory_format=torch.channels_last),
                                             *(torch.rand(256) + 0.5 for _ in range(4))])}
    programs["gelu_bias (CUDA formula)"] = programs["gelu_bias (CPU lowering)"]
    for name, (fn, inputs) in programs.items():
        # gelu's CUDA formula (eager's erf form, with erf_for_16bit for a 16-bit result) where the name says so
        with _cuda_gelu(name.endswith("(CUDA formula)")):
            sources = cuda_sources(fn, *inputs)
        source = max(sources, key=lambda source: int(source.xnumel))  # the activation's kernel
        (count,) = sass_instructions([source])
        per_thread = source.xblock * (source.rblock or 1) // (32 * source.num_warps)
        print(f"{name:26s} XBLOCK {source.xblock:5d} RBLOCK {source.rblock or '-':>5} warps {source.num_warps:2d}: "
              f"{count:5d} instructions / {per_thread:3d} elements = {count / per_thread:5.1f} per element", flush=True)


if __name__ == "__main__":
    main()
