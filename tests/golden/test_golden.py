"""Golden texts: what kiln generates for the canonical programs of tests/golden/programs.py.

For each program and each CPU backend (C++ kernels; Triton kernels, the GPU's code) the test
renders every compiled graph's LoopIR before and after fusion, its kernels and its wrapper
(tests/golden/capture.py) and compares the text with tests/golden/expected/<program>.<backend>.txt.
A difference fails with a unified diff. When the change is meant, accept it the expecttest way:

    EXPECTTEST_ACCEPT=1 python -m pytest tests/golden

and review the rewritten files in the commit. Nothing is compiled or run: the tests take seconds.
"""
from __future__ import annotations

import difflib
import os

import pytest

from tests.golden.capture import BACKENDS, render_program
from tests.golden.programs import PROGRAMS

EXPECTED_DIR = os.path.join(os.path.dirname(__file__), "expected")
ACCEPT = os.environ.get("EXPECTTEST_ACCEPT", "") not in ("", "0")
MAX_DIFF_LINES = 200


def expected_path(program_name: str, backend: str) -> str:
    return os.path.join(EXPECTED_DIR, f"{program_name}.{backend}.txt")


def assert_matches_expected(path: str, actual: str) -> None:
    """`actual` equals the text in `path`; under EXPECTTEST_ACCEPT=1, `path` is rewritten instead."""
    if ACCEPT:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(actual)
        return
    if not os.path.exists(path):
        pytest.fail(f"no golden file {path}: run with EXPECTTEST_ACCEPT=1 to write it")
    with open(path) as handle:
        expected = handle.read()
    if actual != expected:
        diff = list(difflib.unified_diff(expected.splitlines(), actual.splitlines(), "expected", "actual",
                                         lineterm=""))
        shown = "\n".join(diff[:MAX_DIFF_LINES]) + ("\n..." if len(diff) > MAX_DIFF_LINES else "")
        pytest.fail(f"generated text differs from {os.path.relpath(path)} (EXPECTTEST_ACCEPT=1 accepts it):\n{shown}",
                    pytrace=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", PROGRAMS, ids=[program.name for program in PROGRAMS])
def test_generated_text_matches_golden(program, backend):
    assert_matches_expected(expected_path(program.name, backend), render_program(program, backend))


def test_every_golden_file_belongs_to_a_program():
    """A program renamed or removed leaves no stale golden file behind."""
    wanted = {os.path.basename(expected_path(program.name, backend)) for program in PROGRAMS for backend in BACKENDS}
    stale = sorted(set(os.listdir(EXPECTED_DIR)) - wanted) if os.path.isdir(EXPECTED_DIR) else []
    assert not stale, f"golden files without a program (delete them): {stale}"


def test_render_is_deterministic_within_a_process():
    """Rendering twice gives the same text: no counters, addresses or paths leak into it."""
    program = next(program for program in PROGRAMS if program.name == "layer_norm_backward")
    assert render_program(program, "cpp") == render_program(program, "cpp")
