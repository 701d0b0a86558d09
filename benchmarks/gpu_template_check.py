"""Product templates on the GPU (kiln/codegen/triton_templates.py): correctness first, then what autotuning picks.

    python -m benchmarks.gpu_template_check            # on the H200 (CUDA): well under 200 s
    python -m benchmarks.gpu_template_check cpu        # the same programs on the CPU (Triton interpreter)

1. Every program below, compiled with config.matmul_template="on" (every product a template with the
   default tile), must match eager by kiln.testing's rule against a float64 reference: products with
   epilogues, bf16/fp16/fp32 (fp32 with TF32 off and on), odd sizes, transposed and offset operands,
   one row, addmm's alpha/beta. A compile failure, an eager fallback or a missing template is a FAIL.
2. Then, on CUDA only, the TARGETS models' product shapes under matmul_template="auto", logged with
   KILN_LOGS=perf: each product's timings (every tile and the extern) and the choice; the choice must be
   as accurate as the extern.
Prints PASS/FAIL per line and the number of failures; exits 1 on any.
"""
from __future__ import annotations

import os
import sys
import time

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.argv[1:2] == ["cpu"]:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported

import torch  # noqa: E402

import kiln  # noqa: E402
import kiln.testing  # noqa: E402
from tests.fuzz.template_products import counting_templates  # noqa: E402

F = torch.nn.functional


def programs(device: str) -> list:
    """(name, fn, inputs, expected template count)."""
    def randn(*size, dtype=torch.bfloat16, scale=1.0):
        return torch.randn(*size, device=device, dtype=dtype) * scale

    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tag = str(dtype).replace("torch.", "")
        cases += [
            (f"gelu(x @ W.T + b) {tag} 1000x768 -> 3072", lambda x, w, b: F.gelu(F.linear(x, w, b)),
             [randn(1000, 768, dtype=dtype), randn(3072, 768, dtype=dtype, scale=0.03), randn(3072, dtype=dtype)], 1),
            (f"x @ W.T + b + r {tag} 333x3072 -> 768", lambda x, w, b, r: F.linear(x, w, b) + r,
             [randn(333, 3072, dtype=dtype), randn(768, 3072, dtype=dtype, scale=0.02), randn(768, dtype=dtype),
              randn(333, 768, dtype=dtype)], 1),
            (f"silu(x @ G.T) * (x @ U.T) {tag} 257x512 -> 1376",
             lambda x, g, u: F.silu(x @ g.t()) * (x @ u.t()),
             [randn(257, 512, dtype=dtype), randn(1376, 512, dtype=dtype, scale=0.05),
              randn(1376, 512, dtype=dtype, scale=0.05)], 2),
        ]
    cases += [
        ("a.t() @ b[offset] fp32 (column-major a)", lambda a, b: a.t() @ b[3:],
         [randn(300, 200, dtype=torch.float32), randn(303, 130, dtype=torch.float32)], 1),
        ("one row: x @ W.T bf16 (decode)", lambda x, w: F.linear(x, w),
         [randn(1, 2048), randn(8192, 2048, scale=0.02)], 1),
        ("addmm beta=0.5 alpha=-2 fp32", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0),
         [randn(130, 70, dtype=torch.float32), randn(130, 50, dtype=torch.float32),
          randn(50, 70, dtype=torch.float32)], 1),
        ("LM head bf16 512x768 -> 50257 (odd N)", lambda x, w: F.linear(x, w),
         [randn(512, 768), randn(50257, 768, scale=0.03)], 1),
        ("attention scores bmm bf16 16x(128x64 @ 64x200) * scale", lambda q, k: torch.bmm(q, k.transpose(1, 2)) * 0.125,
         [randn(16, 128, 64), randn(16, 200, 64)], 1),
    ]
    return cases


def check(name: str, fn, inputs: list, expected: int, options: dict) -> str:
    try:
        with kiln.config.patch(strict=True, graph_cache=False, **options), counting_templates() as generated:
            compiled = kiln.compile(fn)  # graph cache off: codegen runs, so templates are counted
            actual = compiled(*inputs)
        verdict = kiln.testing.compare(actual, fn(*inputs), fn(*kiln.testing.to_float64(inputs)))
    except Exception as error:  # a failure to compile is a FAIL, with its reason
        return f"FAIL {type(error).__name__}: {str(error)[:300]}"
    if not verdict:
        return f"FAIL {verdict.message}"
    if options.get("matmul_template") == "on" and len(generated) < expected:
        return f"FAIL {len(generated)} templates generated, expected {expected}"
    return f"PASS ({len(generated)} templates)"


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    start, failures = time.perf_counter(), 0
    base = {"cpu_backend": "triton"} if device == "cpu" else {}
    runs = [("on", {**base, "matmul_template": "on"})]
    if device == "cuda":
        runs.append(("auto", {"matmul_template": "auto", "autotune_kernels": "auto", "logs": "perf"}))
    for label, options in runs:
        for name, fn, inputs, expected in programs(device):
            if device == "cpu" and any(size in name for size in ("3072", "50257", "8192")):
                continue  # too slow for the interpreter
            torch._dynamo.reset()
            kiln.reset()
            verdict = check(name, fn, inputs, expected, options)
            failures += not verdict.startswith("PASS")
            print(f"[{label}] {name}: {verdict}", flush=True)
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            name, fn, inputs, expected = programs(device)[6]  # fp32 gelu with TF32 products allowed
            kiln.reset()
            verdict = check(name + " (TF32 allowed)", fn, inputs, expected, options)
            failures += not verdict.startswith("PASS")
            print(f"[{label}] {name} (TF32 allowed): {verdict}", flush=True)
            torch.backends.cuda.matmul.allow_tf32 = False
    print(f"gpu_template_check: {failures} failures in {time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
