"""A fixed-seed subset of the guard and side-effect fuzzer (tests/frontend/fuzz_guards.py), for CI.

Long runs: `python -m tests.frontend.fuzz_guards --cases N --seed S`.
"""
from __future__ import annotations

import pytest

from kiln.frontend.guards import GuardBuilder
from tests.frontend import fuzz_guards

CI_SEED = 20261201
CI_CASES = 100


def test_fixed_seed_subset_has_no_wrong_answers_and_compiles_most_cases():
    outcomes = fuzz_guards.run(CI_CASES, CI_SEED)
    failures = [outcome for outcome in outcomes if outcome.status != "pass"]
    assert not failures, fuzz_guards.summary(failures, CI_SEED, "aot_eager", 0.0)
    compiled = sum(outcome.compiled for outcome in outcomes)
    assert compiled >= 0.85 * len(outcomes), fuzz_guards.summary(outcomes, CI_SEED, "aot_eager", 0.0)
    # The generator draws changes of every kind: most kinds were made, the input's and a module's among them.
    kinds = {outcome.case.change_of for outcome in outcomes}
    assert kinds >= {"input", "module", "mutated argument"} and len(kinds) >= 0.6 * len(fuzz_guards.INGREDIENTS), kinds


def test_generation_is_deterministic():
    first, second = fuzz_guards.generate(20, 7), fuzz_guards.generate(20, 7)
    assert [case.source(7) + case.change for case in first] == [case.source(7) + case.change for case in second]


def _case(ingredient_name: str, change: str) -> fuzz_guards.Case:
    ingredient = next(item for item in fuzz_guards.INGREDIENTS if item.name == ingredient_name)
    return fuzz_guards.Case(0, [(0, ingredient)], change, ingredient_name)


@pytest.mark.parametrize("ingredient, change", [("global int", "K0 = K0 + 1"), ("global set", "S0.discard('a')")])
def test_the_fuzzer_reports_a_missing_guard(monkeypatch, ingredient, change):
    """With the guards on globals switched off, the change goes unseen and the fuzzer must say so."""
    case = _case(ingredient, change)
    assert fuzz_guards.run_case(case, 0, "aot_eager").status == "pass"
    add = GuardBuilder.add

    def add_except_globals(self, source, failure, reason):
        if source is None or not source.expr().startswith("__globals"):
            add(self, source, failure, reason)

    monkeypatch.setattr(GuardBuilder, "add", add_except_globals)
    outcome = fuzz_guards.run_case(case, 0, "aot_eager")
    assert outcome.status == "wrong" and "after change" in outcome.detail


def test_the_fuzzer_reports_a_missing_side_effect(monkeypatch):
    """Side effects are compared too: an entry that forgets to replay a global store is caught."""
    from kiln.frontend import side_effects

    monkeypatch.setattr(side_effects.SideEffects, "codegen", lambda self, codegen: [])
    outcome = fuzz_guards.run_case(_case("stores a global", "COUNT0 = 10"), 0, "aot_eager")
    assert outcome.status == "wrong" and "side effects differ" in outcome.detail
