"""A fixed-seed subset of the graph-break fuzzer (tests/frontend/fuzz_breaks.py), for CI, and checks that the
fuzzer sees what it is for: a side effect dropped or replayed out of order, a frame run eagerly, a second call
that traces again.

Long runs: `python -m tests.frontend.fuzz_breaks --cases N --seed S [--backend kiln]`.
"""
from __future__ import annotations

import time

import pytest

from kiln.frontend import dispatcher as frontend_dispatcher
from kiln.frontend import side_effects
from tests.frontend import fuzz_breaks

CI_SEED = 20261204
CI_CASES = 80


def test_fixed_seed_subset_has_no_wrong_answers_crashes_or_retraces():
    start = time.perf_counter()
    outcomes = fuzz_breaks.run(CI_CASES, CI_SEED)
    seconds = time.perf_counter() - start
    failures = [outcome for outcome in outcomes if outcome.status in ("wrong", "crash", "retraced")]
    assert not failures, fuzz_breaks.summary(failures, CI_SEED, "aot_eager", seconds)
    # Most cases break and compile every frame; the rest run a frame eagerly for a limitation kiln documents.
    compiled = sum(outcome.status == "pass" for outcome in outcomes)
    assert compiled >= 0.5 * len(outcomes), fuzz_breaks.summary(outcomes, CI_SEED, "aot_eager", seconds)
    assert sum(outcome.breaks > 0 for outcome in outcomes) >= 0.8 * len(outcomes)
    # Every kind of break point, place and side effect was drawn.
    drawn = set().union(*(outcome.case.features for outcome in outcomes))
    wanted = {f"break {name}" for name, _ in fuzz_breaks.BREAKS} | {f"in {name}" for name, _ in fuzz_breaks.PLACES} | \
        {f"effect {name}" for name, _ in fuzz_breaks.EFFECTS}
    assert wanted <= drawn, wanted - drawn


def test_generation_is_deterministic():
    first, second = fuzz_breaks.generate(30, 7), fuzz_breaks.generate(30, 7)
    assert [case.source for case in first] == [case.source for case in second]
    assert len({case.source for case in first}) == 30


def test_generated_programs_run_eagerly_without_error():
    """Programs are valid: eager never raises on them (a generator bug would be reported as both raising)."""
    for case in fuzz_breaks.generate(40, 11):
        namespace = {"__name__": "check"}
        exec(compile(case.source, "<check>", "exec"), namespace)
        for offset, scale in fuzz_breaks.CALLS:
            namespace["reset"]()
            x, w = namespace["make_args"](case.seed + offset, scale)
            with fuzz_breaks.contextlib.redirect_stdout(fuzz_breaks._Channel(namespace)):
                namespace["program"](x, w)


# A program with side effects on both sides of two breaks, in an order print and LOG must keep.
EFFECTS_PROGRAM = '''
def program(x, w):
    global GC
    y = x * 0.5 + w
    LOG.append('start')
    print('before', len(LOG))
    v = x.abs().max().item()
    LOG.append(('v', v > 0))
    OBJ.count += 1
    GC = GC + 1
    w.mul_(2.0)
    print('after', OBJ.count)
    if x[0, 0] > 0:
        D['sign'] = 1
    else:
        D['sign'] = -1
    return y * v + w
'''


def test_the_effects_program_passes():
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(EFFECTS_PROGRAM))
    assert outcome.status == "pass", outcome.detail
    assert outcome.breaks >= 2


def test_the_fuzzer_reports_side_effects_that_are_not_replayed(monkeypatch):
    monkeypatch.setattr(side_effects.SideEffects, "codegen", lambda self, codegen: [])
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(EFFECTS_PROGRAM))
    assert outcome.status == "wrong", outcome.detail
    assert "differs" in outcome.detail


def test_the_fuzzer_reports_a_print_replayed_before_the_state_it_saw(monkeypatch):
    """Each replayed print must come after the LOG appends that preceded it: with the state it saw forgotten,
    the entry prints before writing LOG back, and stdout's position among LOG's events moves."""

    def replay_before_state(self, function, args, kwargs):
        self.calls.append(side_effects.ReplayedCall(function, list(args), dict(kwargs),
                                                    side_effects.OutsideState({}, {}, {})))

    monkeypatch.setattr(side_effects.SideEffects, "replay_call", replay_before_state)
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(EFFECTS_PROGRAM))
    assert outcome.status == "wrong" and "stdout differs" in outcome.detail, outcome.detail


def test_the_fuzzer_reports_a_dropped_print(monkeypatch):
    monkeypatch.setattr(side_effects.SideEffects, "replay_call", lambda self, function, args, kwargs: None)
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(EFFECTS_PROGRAM))
    assert outcome.status == "wrong" and "stdout differs" in outcome.detail, outcome.detail


def test_the_fuzzer_counts_frames_run_eagerly():
    import kiln

    with kiln.config.patch(graph_breaks=False):  # every frame that meets a break runs eagerly whole
        outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(EFFECTS_PROGRAM))
    assert outcome.status == "eager" and outcome.eager_reasons, outcome


def test_the_fuzzer_reports_a_second_call_that_traces_again(monkeypatch):
    call = frontend_dispatcher.Dispatcher.__call__

    def forgetful_call(self, *args, **kwargs):
        self._cache.entries.clear()
        return call(self, *args, **kwargs)

    monkeypatch.setattr(frontend_dispatcher.Dispatcher, "__call__", forgetful_call)
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(EFFECTS_PROGRAM))
    assert outcome.status == "retraced", outcome


# ---------------------------------------------------------------- kiln bugs the fuzzer found, minimized (both fixed)

# Seed 5 case 383 (aot_eager), minimized: an attribute store of a constant equal to the attribute's value when the
# trace ran is not replayed (kiln/frontend/side_effects.py `_write_state`: "restored to what it was"), and no guard
# checks that value: the entry traced for the second call of `helper` (its `k` made symbolic) serves the first
# call of the next run, whose OBJ has no `last` yet.
ATTRIBUTE_STORE_PROGRAM = '''
def helper(x, w, k):
    print('p', x[0] * 2)
    OBJ.last = 4
    return x + k
def program(x, w):
    y = helper(x, w, 0)
    y = helper(y, w, 1)
    return y
'''


def test_an_attribute_store_equal_to_the_traced_value_is_replayed():  # fixed (side_effects.py _write_state)
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(ATTRIBUTE_STORE_PROGRAM))
    assert outcome.status == "pass", outcome.detail


# Seed 102 case 141 (aot_eager), minimized: a frame whose floats became symbolic on a recompile (here the list
# `x.tolist()` left on the stack across the break) is traced, torch's tensorify pass asks for a restart with the
# floats specialized, and kiln's dispatcher (`Dispatcher._capture`) traces again without restoring the grad mode
# that the aborted compile of the graph left behind: the graph ends inside the `no_grad` block (grad mode off) and
# AOTAutograd ran it for real. The second trace then starts with grad mode off, and the call returns with it off
# (eager: on); where grad mode is off at that frame's start anyway, its entry is guarded on the wrong mode and the
# next call traces again (the fuzzer's `retraced` cases of seeds 102 and 104).
GRAD_MODE_PROGRAM = '''
def program(x, w):
    x.tolist()
    with torch.no_grad():
        print(x.sum())
    return x + 1
'''


def test_grad_mode_after_a_tensorify_restart():  # fixed (dispatcher.py _capture restores it)
    outcome = fuzz_breaks.run_case(fuzz_breaks.case_from_program(GRAD_MODE_PROGRAM))
    assert outcome.status == "pass", outcome.detail
