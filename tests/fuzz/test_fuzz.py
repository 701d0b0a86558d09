"""The fuzzer in CI: a fixed-seed subset of generated programs on both CPU backends, and every regression.

Each backend's programs run in two worker processes (tests/fuzz/workers.py), so a
segfault or a hang is a recorded failure, not a dead test run. A program must pass
(a fallback to eager passes too: the sweep counts those separately) unless
tests/fuzz/regressions.py lists it as a known failure, and a listed one must still fail.
Stride mismatches (on dims of size > 1) fail too; FUZZ_STRICT_STRIDES=0 reports them
as passes, for a sweep on a branch that changes layouts.

The generator's own tests (no kiln involved) check that every statement has the shape
and dtype the generator tracked, and that a seed's program text never changes.
"""
from __future__ import annotations

import hashlib
import os

import pytest
import torch

from tests.fuzz.generator import generate
from tests.fuzz.program import DTYPES
from tests.fuzz.regressions import KNOWN_FUZZ_FAILURES, check_outcome, check_result, regression_programs
from tests.fuzz.runner import Outcome, compare_outputs, compare_strides, trace_values
from tests.fuzz.workers import Task, run_pool

STRICT_STRIDES = os.environ.get("FUZZ_STRICT_STRIDES", "1") == "1"
CI_SEED = 0
# Program indices of seed CI_SEED per backend (~200 in all; sized to run in about 2 minutes on 2 cores).
CI_PROGRAMS = {"cpp": range(0, 80), "triton": range(80, 200)}
JOBS = 2


@pytest.mark.parametrize("backend", sorted(CI_PROGRAMS))
def test_fuzz_subset_and_regressions(backend):
    programs = [generate(CI_SEED, index) for index in CI_PROGRAMS[backend]]
    regressions = regression_programs(backend)
    tasks = [Task(program, backend) for program in programs] + [Task(entry.program, backend) for entry in regressions]
    results = run_pool(tasks, jobs=JOBS, timeout=120)
    assert len(results) == len(tasks)
    problems = []
    for program, result in zip(programs, results):
        known = KNOWN_FUZZ_FAILURES.get((program.seed, program.index, backend))
        problem = check_outcome(result, known, strict_strides=STRICT_STRIDES)
        if problem:
            problems.append(problem + (f"\n    repro: python -m tests.fuzz --show --seed {program.seed} "
                                       f"--index {program.index} --backend {backend}" if not known else ""))
    for entry, result in zip(regressions, results[len(programs):]):
        problem = check_result(entry, result, backend)  # regressions: strides count
        if problem:
            problems.append(f"regression {entry.name}: {problem}")
    compiled = sum(result.compiled for result in results[:len(programs)])
    assert compiled >= len(programs) // 2, f"only {compiled} of {len(programs)} programs compiled: kiln fell back"
    assert not problems, f"{len(problems)} problems on {backend}:\n" + "\n".join(problems)


def test_known_fuzz_failures_are_in_the_ci_subset():
    for seed, index, backend in KNOWN_FUZZ_FAILURES:
        assert seed == CI_SEED and index in CI_PROGRAMS[backend], \
            f"({seed}, {index}, {backend}) is not run in CI: minimize it into REGRESSIONS instead"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_generated_statements_have_the_tracked_shapes_and_dtypes():
    for index in range(60):
        program = generate(1, index)
        traced = trace_values(program)
        assert 4 <= len(program.statements) <= 25
        for statement in program.statements:
            shape, dtype = traced[statement.target]
            assert (shape, dtype) == (statement.shape, DTYPES[statement.dtype]), (program.name, statement.source())


def test_program_text_is_stable_per_seed():
    """seed -> program is forever: KNOWN_FUZZ_FAILURES and reports name programs by seed and index.

    If a generator change alters these, it renames every recorded failure: bump
    GENERATOR_VERSION, re-run the CI subset, and update the table and these digests.
    """
    assert generate(3, 14).source() == generate(3, 14).source()
    digests = [hashlib.sha256(generate(0, index).source().encode()).hexdigest()[:16] for index in range(4)]
    assert digests == GOLDEN_DIGESTS


GOLDEN_DIGESTS = ['b594d86562070c6b', 'f22dd24cac377060', '4ff8cfd734f80bba', '55c1670214a5d606']


def test_compare_flags_wrong_values_and_accepts_rounding():
    exact = torch.tensor([1.0, 2.0, 3.0])
    assert compare_outputs([exact.clone()], [exact], [exact.double()]) == (Outcome.PASS, "")
    outcome, message = compare_outputs([torch.tensor([1.0, 2.5, 3.0])], [exact], [exact.double()])
    assert outcome == Outcome.WRONG and message.startswith("output 0: max error")
    assert compare_outputs([torch.tensor([1, 2])], [torch.tensor([1, 3])], None)[0] == Outcome.WRONG
    assert compare_outputs([exact.half()], [exact], None)[0] == Outcome.WRONG  # dtype
    # An int output on a rounding edge: kiln agrees with the float64 run, eager does not.
    outcome, _ = compare_outputs([torch.tensor([3, 4])], [torch.tensor([3, 3])], [torch.tensor([3, 4])])
    assert outcome == Outcome.SENSITIVE
    outcome, _ = compare_outputs([torch.tensor([3, 5])], [torch.tensor([3, 4])], [torch.tensor([3, 4])])
    assert outcome == Outcome.WRONG


def test_compare_strides_ignores_size_one_dims():
    base = torch.randn(3, 4)
    assert compare_strides([base.t().contiguous()], [base.t()]).startswith("output 0: strides")
    assert compare_strides([torch.randn(3, 1)], [torch.randn(1, 3).t()]) == ""


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_minimizer_shrinks_to_the_statement_that_fails():
    """A stand-in for kiln that 'fails' any program computing a flip: the minimizer keeps only that."""
    from tests.fuzz.minimize import _dead_code_removed, minimize_program
    from tests.fuzz.runner import ProgramResult

    program = next(program for program in (generate(2, index) for index in range(200))
                   if any("flip(" in statement.expr for statement in _dead_code_removed(program).statements)
                   and len(program.statements) >= 10)

    def fake_run(candidate):
        try:
            trace_values(candidate)
        except Exception as error:
            return ProgramResult(candidate.name, 0, 0, Outcome.INVALID, str(error))
        reached = "\n".join(statement.expr for statement in _dead_code_removed(candidate).statements)
        flipped = "flip(" in reached
        return ProgramResult(candidate.name, 0, 0, Outcome.WRONG if flipped else Outcome.PASS,
                             "output 0: max error 1 vs eager's 0" if flipped else "")

    minimal = minimize_program(program, run=fake_run, log=lambda line: None)
    assert len(minimal.statements) == 1 and "flip(" in minimal.statements[0].expr, minimal.function_source()
    assert len(minimal.inputs) == 1 and minimal.outputs == (minimal.statements[0].target,)


def test_known_failures_must_keep_failing_and_others_must_pass():
    from tests.fuzz.runner import ProgramResult

    passed = ProgramResult("p", 0, 0, Outcome.PASS, graphs=1, kernels=1)
    wrong = ProgramResult("p", 0, 0, Outcome.WRONG, "output 0: max error 1", graphs=1, kernels=1)
    fell_back = ProgramResult("p", 0, 0, Outcome.PASS, graphs=1, fallbacks=["AssertionError: ..."])
    stride = ProgramResult("p", 0, 0, Outcome.STRIDE, stride_message="output 0: strides", graphs=1)
    assert check_outcome(passed, None) == "" and check_outcome(wrong, "BUG") == ""
    assert check_outcome(passed, "BUG").startswith("fixed: remove the entry")
    assert check_outcome(wrong, None).startswith("p: wrong")
    assert check_outcome(fell_back, None) == ""  # a sweep program may fall back
    assert "did not compile" in check_outcome(fell_back, None, must_compile=True)
    assert check_outcome(fell_back, "BUG", must_compile=True) == ""
    assert check_outcome(stride, None) == "" and check_outcome(stride, None, strict_strides=True)
