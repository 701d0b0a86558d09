"""GPU smoke check of kiln's generated kernels (run on the device machine before long benchmarks).

Compiles a handful of fused programs on CUDA in fp32 and bf16 and checks each against
eager with kiln's accuracy rule (float64 reference). Prints one line per case.
"""
from __future__ import annotations

import sys
import traceback

import torch

import kiln
import kiln.testing

F = torch.nn.functional
CASES = {
    "sin_plus_sin": (lambda x, y: torch.sin(x) + torch.sin(y), lambda dt: (torch.randn(1 << 20, dtype=dt),
                                                                             torch.randn(1 << 20, dtype=dt))),
    "gelu_bias": (lambda x, b: F.gelu(x + b), lambda dt: (torch.randn(512, 4096, dtype=dt), torch.randn(4096, dtype=dt))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                   lambda dt: (torch.randn(512, 4096, dtype=dt), torch.randn(4096, dtype=dt), torch.randn(4096, dtype=dt))),
    "softmax_persistent": (lambda x: torch.softmax(x, -1), lambda dt: (torch.randn(512, 4096, dtype=dt),)),
    "softmax_looped": (lambda x: torch.softmax(x, -1), lambda dt: (torch.randn(64, 20000, dtype=dt),)),
    "reductions": (lambda x: (x.sum(0), x.argmax(1), torch.var_mean(x, 1), x.amin(1)),
                   lambda dt: (torch.randn(300, 9000, dtype=dt),)),
    "gather_cat": (lambda x, i: torch.cat([x[i], x[i] * 2], 1).sum(1), lambda dt: (torch.randn(100, 64, dtype=dt),
                                                                                  torch.randint(0, 100, (50,)))),
}


def main() -> int:
    failures = 0
    for dtype in (torch.float32, torch.bfloat16):
        for name, (fn, make) in CASES.items():
            torch._dynamo.reset()
            args = [a.cuda() for a in make(dtype)]
            try:
                with kiln.config.patch(strict=True):
                    out = kiln.compile(fn)(*args)
                verdict = kiln.testing.compare(out, fn(*args), fn(*kiln.testing.to_float64(args)))
                print(f"{name:20} {str(dtype):15} {'ok' if verdict else 'MISMATCH ' + verdict.message}", flush=True)
                failures += not verdict
            except Exception:
                failures += 1
                print(f"{name:20} {str(dtype):15} ERROR {traceback.format_exc()[-1500:]}", flush=True)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
