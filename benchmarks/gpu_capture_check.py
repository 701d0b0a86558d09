"""On the GPU, as users run them: GPT-2 and the Llama-style model (TARGETS configs, DEFAULT settings, their
DynamicCache included) are captured whole by kiln's frontend under bf16 autocast: one graph, no graph
break, no frame run eagerly, and the compiled logits agree with eager's. Exit status 1 otherwise.

    python -m benchmarks.gpu_capture_check
"""
from __future__ import annotations

import sys

import torch

import kiln
from benchmarks.workloads import gpt2, llama


def main() -> int:
    failed = 0
    for make in (gpt2, llama):
        workload = make(False, "cuda")
        model = workload.program.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            expected = model(**workload.infer_kwargs).logits.float()
            report = kiln.explain(model, **workload.infer_kwargs)
            actual = kiln.compile(model)(**workload.infer_kwargs).logits.float()
        error = (actual - expected).abs().max().item()
        scale = expected.abs().max().item()
        whole = report.graph_count == 1 and not report.breaks and not report.eager_frames
        close = error <= 0.05 * scale
        failed += not (whole and close)
        print(f"{workload.name}: graphs={report.graph_count} breaks={report.break_count} "
              f"eager_frames={len(report.eager_frames)} kernels={sum(g.kernels or 0 for g in report.graphs)} "
              f"max|logits - eager|={error:.4f} (max|eager| {scale:.2f}) first call {report.first_call_seconds:.1f} s "
              f"{'OK' if whole and close else 'FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
