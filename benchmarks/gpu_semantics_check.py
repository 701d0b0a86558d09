"""Runs the fuzzer's CUDA-only wrong answers (tests/fuzz/cuda_cases.py) on CUDA through kiln.compile
(a compile failure or eager fallback is a FAIL) and judges them as the fuzzer does (tests/fuzz/runner.py:
kiln.testing's rule against a float64 reference, rounding-sensitive cases told apart). Prints PASS/FAIL
per program; the lead runs it on the GPU machine: `python benchmarks/gpu_semantics_check.py` (well
under 90 s); `python benchmarks/gpu_semantics_check.py cpu` runs the same programs on the CPU."""
from __future__ import annotations

import os
import sys
import time

# the repository root, not benchmarks/ (its profile.py would shadow the standard library's)
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TRITON_INTERPRET", "0")

from tests.fuzz.cuda_cases import CASES, FAILURES  # noqa: E402
from tests.fuzz.generator import generate  # noqa: E402
from tests.fuzz.runner import Outcome, run_program  # noqa: E402


def check(name: str, source: str, device: str) -> str:
    """The fuzzer's own verdict (tests/fuzz/runner.py: kiln.testing's rule, rounding-sensitive cases
    told apart) for the program `name` (seed S, index K) regenerated, and refused if it is not `source`."""
    seed, index = (int(part) for part in name.removeprefix("seed").split("_prog"))
    program = generate(seed, index)
    if program.source() != source:
        return "FAIL the generator no longer makes this program"
    result = run_program(program, backend="triton", device=device)
    if result.fallbacks:
        return f"FAIL ran eagerly: {result.fallbacks[0]}"
    if result.outcome in (Outcome.PASS, Outcome.SENSITIVE):
        return "PASS" + (f" (sensitive: {result.message})" if result.outcome == Outcome.SENSITIVE else "")
    return f"FAIL {result.outcome}: {result.message or result.stride_message}"


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    start, failures = time.perf_counter(), 0
    for name, source in CASES.items():
        try:
            outcome = check(name, source, device)
        except Exception as error:  # a crash is a failure too, with its reason
            outcome = f"FAIL {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        failures += not outcome.startswith("PASS")
        print(f"{name:18s} {outcome}" + ("" if outcome.startswith("PASS") else f"   (first seen on the H200: {FAILURES[name]})"),
              flush=True)
    print(f"{len(CASES) - failures}/{len(CASES)} PASS in {time.perf_counter() - start:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
