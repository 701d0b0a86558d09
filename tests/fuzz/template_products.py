"""The fuzzer's programs that multiply matrices, run with every 2-d product a Triton template
(config.matmul_template="on", the Triton backend under the interpreter), judged as the fuzzer judges
(tests/fuzz/runner.py): outside CI, for the product templates (kiln/codegen/triton_templates.py).

    python -m tests.fuzz.template_products --seed 3202 --programs 2500

Prints how many of the first N programs of the seed have a product (`@` or bmm), their outcomes, and
how many template kernels were generated (the others' products are batched, or not strided matrices).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

if __name__ == "__main__":  # a CPU run; imported (benchmarks/gpu_template_check.py), it changes nothing
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kiln  # noqa: E402
from kiln.codegen import triton as triton_codegen  # noqa: E402
from tests.fuzz.generator import generate  # noqa: E402
from tests.fuzz.runner import run_program  # noqa: E402


@contextlib.contextmanager
def counting_templates():
    """Within the block, the names of the template kernels generated are appended to the list yielded."""
    generated: list = []
    original = triton_codegen.TritonKernelGenerator._generate_template

    def counting(self):
        generated.append(self.kernel.name)
        return original(self)

    triton_codegen.TritonKernelGenerator._generate_template = counting
    try:
        yield generated
    finally:
        triton_codegen.TritonKernelGenerator._generate_template = original


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=3201)
    parser.add_argument("--programs", type=int, default=400)
    args = parser.parse_args()
    products = [index for index in range(args.programs)
                if any(mark in generate(args.seed, index).source() for mark in ("@", "bmm"))]
    outcomes: dict = {}
    failures = []
    with kiln.config.patch(matmul_template="on", graph_cache=False), counting_templates() as generated:
        for index in products:
            result = run_program(generate(args.seed, index), backend="triton", device="cpu")
            outcome = str(result.outcome)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome not in ("pass", "sensitive", "invalid"):
                failures.append(f"program {index}: {outcome} {result.message}")
            elif result.fallbacks:
                failures.append(f"program {index}: ran eagerly: {result.fallbacks[0]}")
    print(f"seed {args.seed}, programs 0..{args.programs - 1}: {len(products)} with a product; outcomes {outcomes}; "
          f"{len(generated)} template kernels generated")
    print("\n".join(failures) or "no wrong answers, crashes or fallbacks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
