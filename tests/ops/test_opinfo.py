"""CI subset of the OpInfo sweep: tests/ops/subset.py's cases through kiln, forward, on both
CPU backends (kiln.config.cpu_backend: the C++ kernels and the Triton interpreter).

Cases listed in known_failures.py are xfail (strict=False: one that starts passing shows
as XPASS; shrink the table with the sweep's --update-known-failures). Set
OPINFO_BACKEND=aot_eager to check the harness itself against kiln's AOT stage alone.
"""
from __future__ import annotations

import os

import pytest

from tests.ops.harness import Outcome, run_case
from tests.ops.report import known_failure_reason, known_failures
from tests.ops.subset import SAMPLES_PER_CASE, subset_cases

BACKEND = os.environ.get("OPINFO_BACKEND", "kiln")
SECONDS_PER_SAMPLE = 60.0


def _params() -> list:
    table = known_failures()
    params = []
    for case in subset_cases():
        reason = known_failure_reason(case, table)
        marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
        params.append(pytest.param(case, id=f"{case.full_name}-{case.dtype}", marks=marks))
    return params


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])  # both CPU backends: C++ and the Triton interpreter
@pytest.mark.parametrize("case", _params())
def test_opinfo_forward(case, cpu_backend):
    import kiln

    with kiln.config.patch(cpu_backend=cpu_backend):
        results = run_case(case, backend=BACKEND, max_samples=SAMPLES_PER_CASE, timeout=SECONDS_PER_SAMPLE)
    failures = [result for result in results if result.outcome in Outcome.FAILURES]
    if failures:
        lines = [f"sample {result.index}: {result.outcome}: {result.message}" for result in failures]
        pytest.fail(f"{case} on {BACKEND}: {len(failures)} of {len(results)} samples failed\n" + "\n".join(lines),
                    pytrace=False)
    if not any(result.outcome == Outcome.PASS for result in results):
        pytest.skip(f"no sample to compare: {[result.outcome for result in results]}")
