"""Runs the fuzzer's CUDA-only wrong answers (tests/fuzz/cuda_cases.py) on CUDA through kiln.compile
(strict: a compile failure or eager fallback is a FAIL) and compares with eager the project's way
(kiln.testing.compare against a float64 reference). Prints PASS/FAIL per program; the lead runs it on
the GPU machine: `python benchmarks/gpu_semantics_check.py` (well under 90 s)."""
from __future__ import annotations

import os
import sys
import time
import warnings

# the repository root, not benchmarks/ (its profile.py would shadow the standard library's)
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TRITON_INTERPRET", "0")

import torch  # noqa: E402

import kiln  # noqa: E402
import kiln.testing  # noqa: E402
from tests.fuzz.cuda_cases import CASES, FAILURES  # noqa: E402


def check(name: str, source: str, device: str) -> str:
    scope: dict = {"__name__": f"cuda_case_{name}"}
    exec(compile(source, name, "exec"), scope)
    inputs = scope["make_inputs"](device)
    program = scope["program"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = program(*inputs)
        try:  # as the fuzzer: no float64 reference where the program refuses float64 (bf16 @ float64)
            reference = list(program(*kiln.testing.to_float64(inputs)))
        except RuntimeError:
            reference = None
        with kiln.config.patch(strict=True):
            actual = kiln.compile(program)(*inputs)
    verdict = kiln.testing.compare(list(actual), list(expected), reference)
    return "PASS" if verdict else f"FAIL {verdict.message}"


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    start, failures = time.perf_counter(), 0
    for name, source in CASES.items():
        try:
            outcome = check(name, source, device)
        except Exception as error:  # a crash is a failure too, with its reason
            outcome = f"FAIL {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        failures += outcome != "PASS"
        print(f"{name:18s} {outcome}" + ("" if outcome == "PASS" else f"   (H200 at 8f9bfe2: {FAILURES[name]})"),
              flush=True)
    print(f"{len(CASES) - failures}/{len(CASES)} PASS in {time.perf_counter() - start:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
