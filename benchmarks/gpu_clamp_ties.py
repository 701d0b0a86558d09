"""clamp by a number on CUDA keeps x at a tie, as eager: the signbit of clamp_min/clamp_max of signed zeros,
kiln against eager (tests/lowering/test_clamp_ties.py checks the CPU backends). `python -m benchmarks.gpu_clamp_ties`."""
from __future__ import annotations

import sys

import torch

import kiln

CASES = {"clamp_max(+0)": lambda x: x.clamp_max(0.0), "clamp_max(-0)": lambda x: x.clamp_max(-0.0),
         "clamp_min(+0)": lambda x: x.clamp_min(0.0), "clamp_min(-0)": lambda x: x.clamp_min(-0.0),
         "clamp(-0, +0)": lambda x: x.clamp(-0.0, 0.0)}


def main() -> int:
    x = torch.tensor([-0.0, 0.0, 0.5, -0.5] * 8, device="cuda")
    failures = 0
    for name, function in CASES.items():
        kiln.reset()
        want, got = torch.signbit(function(x)), torch.signbit(kiln.compile(function)(x))
        same = torch.equal(want, got)
        failures += not same
        print(f"{'PASS' if same else 'FAIL'} {name}: eager {want[:4].tolist()} kiln {got[:4].tolist()}")
    print(f"gpu_clamp_ties: {len(CASES) - failures} of {len(CASES)} pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
