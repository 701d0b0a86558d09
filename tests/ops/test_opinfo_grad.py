"""CI subset of the gradient sweep: GRAD_FAMILIES' ops through kiln, float32, on both CPU backends.

Each sample's inputs require grad; the harness (`harness._run_backward`) compiles the op's graph
with kiln under strict mode (AOTAutograd's forward and backward graphs, both kiln's: a fallback
raises), backpropagates a fixed random cotangent into every differentiable output with
`torch.autograd.grad`, and compares forward outputs and gradients with eager's against a float64
reference (`kiln.testing.compare`). A passing case must have run kiln's code (kernels or externs).

Known failures are the rows of tests/ops/known_failures.py whose direction is "backward":
xfail(strict=False), as in test_opinfo.py. The full gradient sweep runs outside CI:
`python -m tests.ops.sweep --grad --cpu-backend cpp`.
"""
from __future__ import annotations

import os

import pytest

from tests.ops.harness import Outcome, run_case
from tests.ops.report import known_failure_reason, known_failures
from tests.ops.subset import GRAD_SAMPLES_PER_CASE, grad_subset_cases

BACKEND = os.environ.get("OPINFO_BACKEND", "kiln")
SECONDS_PER_SAMPLE = 60.0


def _params() -> list:
    table = known_failures()
    params = []
    for case in grad_subset_cases():
        reason = known_failure_reason(case, table)
        marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
        params.append(pytest.param(case, id=case.full_name, marks=marks))
    return params


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])  # both CPU backends: C++ and the Triton interpreter
@pytest.mark.parametrize("case", _params())
def test_opinfo_gradients(case, cpu_backend):
    import kiln

    with kiln.config.patch(cpu_backend=cpu_backend):
        results = run_case(case, backend=BACKEND, max_samples=GRAD_SAMPLES_PER_CASE, timeout=SECONDS_PER_SAMPLE)
    failures = [result for result in results if result.outcome in Outcome.FAILURES]
    if failures:
        lines = [f"sample {result.index}: {result.outcome}: {result.message}" for result in failures]
        pytest.fail(f"{case} on {BACKEND}: {len(failures)} of {len(results)} samples failed\n" + "\n".join(lines),
                    pytrace=False)
    passes = [result for result in results if result.outcome == Outcome.PASS]
    if not passes:
        pytest.skip(f"no sample to compare: {[(result.outcome, result.message) for result in results]}")
    if BACKEND == "kiln":  # kiln's code ran: a graph that ran eagerly reports no counts
        assert all(result.kernels is not None for result in passes), f"{case}: a sample reported no kiln graph"
