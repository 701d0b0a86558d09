"""Side effects of compiled frames, checked against eager Python beyond what the corpus can see.

- globals: the value left in each module's dict after the call (any module, any frame);
- generators and lazy iterators: how much of them runs, endless ones, abandoned ones;
- identity: outside containers and tensors come back as themselves, mutated in place;
  a new object held in two places is one object;
- warnings, logging and print: made after the graph, with the location, registry,
  level and order that eager Python gives them.

Every test compiles with strict mode (a capture failure raises) unless it checks a fallback.
"""
from __future__ import annotations

import logging
import threading
import warnings

import pytest
import torch

import kiln
from kiln.backend import graph_compiler
from kiln.frontend import FullgraphError, compile_function
from tests.frontend import effects_helper_module


def _compiled(fn):
    graphs = []
    eager_rung = graph_compiler("eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return eager_rung(gm, example_inputs)

    return compile_function(fn, backend), graphs


def _captured(compiled, graphs, count=1):
    assert compiled.entries and compiled.entries[0].eager_reason is None, compiled.entries[0].eager_reason
    assert len(graphs) == count


# ---------------------------------------------------------------- globals

MODE = 1.0
COUNT = 0
DOOMED = "present"


def _set_mode(value):
    global MODE
    MODE = value


def _bump():
    global COUNT
    COUNT = COUNT + 1


def scaled_by_mode(t):
    _set_mode(3.0)
    return t * MODE


def counts_from_two_frames(t):
    global COUNT
    COUNT = 5
    _bump()
    return t + COUNT


def writes_another_module(t):
    effects_helper_module.set_level(2.0)
    effects_helper_module.LEVEL = effects_helper_module.LEVEL + 1.0
    return effects_helper_module.scaled(t)


def deletes_a_global(t):
    global DOOMED
    del DOOMED
    return t + 1


def reads_module_dict_after_a_store(t):
    effects_helper_module.set_level(2.0)
    value = effects_helper_module.__dict__["LEVEL"]
    effects_helper_module.set_level(1.0)
    return t * value


def writes_module_dict(t):
    effects_helper_module.__dict__["LEVEL"] = 5.0
    return t * effects_helper_module.LEVEL


def test_a_modules_dict_reads_the_globals_the_trace_stored():
    compiled, graphs = _compiled(reads_module_dict_after_a_store)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x), x * 2.0)
    assert effects_helper_module.LEVEL == 1.0
    _captured(compiled, graphs)


def test_writing_a_modules_dict_directly_runs_eagerly_without_graph_breaks():
    compiled, graphs = _compiled(writes_module_dict)
    x = torch.randn(3)
    try:
        with kiln.config.patch(graph_breaks=False):
            torch.testing.assert_close(compiled(x), x * 5.0)
        assert "module's globals dict" in compiled.entries[0].eager_reason
    finally:
        effects_helper_module.LEVEL = 1.0
    assert graphs == []


def test_writing_a_modules_dict_directly_is_a_graph_break():
    compiled, graphs = _compiled(writes_module_dict)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(compiled(x), x * 5.0)
        assert compiled.entries[0].eager_reason is None and effects_helper_module.LEVEL == 5.0
    finally:
        effects_helper_module.LEVEL = 1.0


def test_global_written_in_a_helper_is_read_back_and_stored():
    global MODE
    MODE = 1.0
    compiled, graphs = _compiled(scaled_by_mode)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        for _ in range(2):
            MODE = 1.0
            torch.testing.assert_close(compiled(x), x * 3.0)
            assert MODE == 3.0
    _captured(compiled, graphs)


def test_global_written_from_two_frames_keeps_both_writes():
    global COUNT
    COUNT = 0
    compiled, graphs = _compiled(counts_from_two_frames)
    x = torch.zeros(2)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x), x + 6)
    assert COUNT == 6
    assert "COUNT'] = 6" in compiled.entries[0].entry_source
    _captured(compiled, graphs)


def test_globals_of_another_module_are_written_to_that_module():
    effects_helper_module.LEVEL = 1.0
    compiled, graphs = _compiled(writes_another_module)
    x = torch.randn(3)
    try:
        with kiln.config.patch(strict=True):
            torch.testing.assert_close(compiled(x), x * 3.0)
        assert effects_helper_module.LEVEL == 3.0
        assert "LEVEL" not in globals()
    finally:
        effects_helper_module.LEVEL = 1.0
    _captured(compiled, graphs)


def test_del_of_a_global_is_replayed():
    global DOOMED
    compiled, graphs = _compiled(deletes_a_global)
    with kiln.config.patch(strict=True):
        compiled(torch.randn(2))
    assert "DOOMED" not in globals()
    DOOMED = "present"
    compiled(torch.randn(2))
    assert "DOOMED" not in globals()
    _captured(compiled, graphs)


# ---------------------------------------------------------------- generators and lazy iterators

CALLS: list = []


def _check(t):
    CALLS.append(t)
    return True


def any_over_generator(t):
    return t * any(_check(u) for u in (t, t + 1, t + 2))


def next_of_generator(t):
    return next(u * 2 for u in (t, t + 1, t + 2) if _check(u))


def _forever(t):
    step = 0
    while True:
        yield t + step
        step += 1


def zips_endless_generator(t):
    return [a * b for a, b in zip(_forever(t), [1.0, 2.0])]


def _steps():
    step = 0
    while True:
        yield step
        step += 1


def lists_endless_generator(t):
    return t * len(list(_steps()))


def membership_in_generator(t):
    return t * (2 in (_check(i) and i for i in range(10))), t.sum()


def _with_cleanup(t):
    try:
        yield t
        yield t + 1
    finally:
        CALLS.append("cleanup")


def abandons_generator_in_try(t):
    return next(_with_cleanup(t)) * 2


def finishes_generator_in_try(t):
    return sum(_with_cleanup(t))


def test_any_over_a_generator_stops_at_the_first_true():
    CALLS.clear()
    compiled, graphs = _compiled(any_over_generator)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x), x)
    assert len(CALLS) == 1  # as eager: any() stops after the first item
    _captured(compiled, graphs)


def test_next_of_a_generator_expression_evaluates_one_element():
    CALLS.clear()
    compiled, graphs = _compiled(next_of_generator)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x), x * 2)
    assert len(CALLS) == 1
    _captured(compiled, graphs)


def test_membership_in_a_generator_stops_at_the_match():
    CALLS.clear()
    compiled, graphs = _compiled(membership_in_generator)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x)[0], x)
    assert len(CALLS) == 3  # 0, 1, 2: found
    _captured(compiled, graphs)


def _within_a_minute(call):
    """`call()`'s result, or its exception; fails if it has not finished after 60 s.

    A tracer that runs generators to completion never returns from an endless one: run
    the call in a daemon thread, which can be abandoned, so that such a tracer fails here
    instead of hanging the suite.
    """
    outcome = []

    def run():
        try:
            outcome.append(("result", call()))
        except Exception as error:
            outcome.append(("error", error))

    worker = threading.Thread(target=run, daemon=True)
    with kiln.config.patch(strict=True):
        worker.start()
        worker.join(timeout=60)
    assert outcome, "the trace hangs"
    return outcome[0]


def test_endless_generator_zipped_with_a_list_does_not_hang():
    compiled, graphs = _compiled(zips_endless_generator)
    x = torch.randn(3)
    kind, result = _within_a_minute(lambda: compiled(x))
    assert kind == "result" and len(result) == 2
    torch.testing.assert_close(result[1], (x + 1) * 2.0)
    _captured(compiled, graphs)


def test_endless_generator_drained_is_refused_not_hung():
    compiled, _ = _compiled(lists_endless_generator)
    kind, error = _within_a_minute(lambda: compiled(torch.randn(2)))
    assert kind == "error" and isinstance(error, FullgraphError) and "endless" in str(error)


def test_generator_abandoned_inside_try_runs_eagerly_with_its_cleanup():
    CALLS.clear()
    compiled, graphs = _compiled(abandons_generator_in_try)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2)
    assert "suspended inside a try/with" in compiled.entries[0].eager_reason
    assert CALLS == ["cleanup"]  # the eager run dropped the generator: its finally ran
    assert graphs == []


def test_generator_finished_inside_try_is_compiled():
    compiled, graphs = _compiled(finishes_generator_in_try)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        for _ in range(2):
            CALLS.clear()
            torch.testing.assert_close(compiled(x), x + x + 1)
            assert CALLS == ["cleanup"]  # the finally's append, replayed on the real list
    _captured(compiled, graphs)


# ---------------------------------------------------------------- identity and output types


class Holder:
    pass


def returns_mutated_input(items, t):
    items.append(t * 2)
    return items


def reorders_nested_lists(outer, t):
    outer.insert(0, t)
    outer[1].append(t + 1)  # the inner list that was outer[0] before the insert
    return outer


def stores_new_list_twice(holder, t):
    fresh = [t + 1]
    holder.items = fresh
    return fresh, holder


def mutates_input_dict(options, t):
    options["out"] = t * options["scale"]
    del options["scratch"]
    options |= {"done": True}
    return options


def returns_input_tensor(t, u):
    return t, u * 2


def returns_input_tuple(t, pair, size):
    return pair, size, t + pair[0]


def size_arithmetic(t):
    width = t.shape[-1] + 1
    return t.shape[:-1] + (width,), (width,) + t.shape[1:], t.shape[1:] * 2


def test_returned_input_list_is_the_same_object_mutated():
    compiled, graphs = _compiled(returns_mutated_input)
    x = torch.randn(3)
    items = [torch.randn(3)]
    with kiln.config.patch(strict=True):
        result = compiled(items, x)
    assert result is items and len(items) == 2
    torch.testing.assert_close(items[1], x * 2)
    _captured(compiled, graphs)


def test_nested_input_lists_are_mutated_where_they_were():
    compiled, graphs = _compiled(reorders_nested_lists)
    x = torch.randn(3)
    inner = []
    outer = [inner]
    with kiln.config.patch(strict=True):
        result = compiled(outer, x)
    assert result is outer and outer[0] is x and outer[1] is inner
    assert len(inner) == 1
    torch.testing.assert_close(inner[0], x + 1)
    _captured(compiled, graphs)


def test_a_new_list_held_in_two_places_is_one_object():
    compiled, graphs = _compiled(stores_new_list_twice)
    holder = Holder()
    holder.items = None
    with kiln.config.patch(strict=True):
        fresh, returned_holder = compiled(holder, torch.randn(2))
    assert returned_holder is holder and holder.items is fresh
    _captured(compiled, graphs)


def test_input_dict_is_mutated_in_place_and_returned():
    compiled, graphs = _compiled(mutates_input_dict)
    x = torch.randn(3)
    for _ in range(2):
        options = {"scale": 2.0, "scratch": [1]}
        with kiln.config.patch(strict=True):
            result = compiled(options, x)
        assert result is options and list(options) == ["scale", "out", "done"] and options["done"] is True
        torch.testing.assert_close(options["out"], x * 2.0)
    _captured(compiled, graphs)


def test_returned_input_tensor_is_the_same_object():
    compiled, graphs = _compiled(returns_input_tensor)
    x, y = torch.randn(3), torch.randn(3)
    with kiln.config.patch(strict=True):
        same, doubled = compiled(x, y)
    assert same is x
    torch.testing.assert_close(doubled, y * 2)
    _captured(compiled, graphs)


def test_returned_input_tuples_are_the_same_objects():
    compiled, graphs = _compiled(returns_input_tuple)
    with kiln.config.patch(strict=True):
        for _ in range(2):  # equal but new objects on the second call: the cached entry returns those
            pair, size = tuple([1, 2.5]), torch.Size([7, 8])
            returned_pair, returned_size, _ = compiled(torch.randn(3), pair, size)
            assert returned_pair is pair and returned_size is size
    _captured(compiled, graphs)


def test_size_arithmetic_returns_a_size():
    compiled, _ = _compiled(size_arithmetic)
    with kiln.config.patch(strict=True):
        result = compiled(torch.randn(2, 3, 4))
    assert [type(size) for size in result] == [torch.Size] * 3
    assert result == ((2, 3, 5), (5, 3, 4), (3, 4, 3, 4))


# ---------------------------------------------------------------- warnings, logging, print

logger = logging.getLogger("kiln.tests.side_effects")


def _deprecated(t):
    warnings.warn("old helper", FutureWarning, stacklevel=2)
    return t + 1


def warns_directly(t):
    warnings.warn("careful")
    return t * 2


def warns_from_helper(t):
    return _deprecated(t) * 3


def warns_from_outside(t):
    warnings.warn("caller's fault", stacklevel=2)
    return t


def logs(t):
    logger.warning("shape %s, %d items", t.shape, t.numel())
    logger.info("not shown at WARNING level")
    return t + 1


def branches_on_level(t):
    if logger.isEnabledFor(logging.DEBUG):
        return t * 10
    return t + 1


def prints_in_order(t):
    print("first", t.shape)
    warnings.warn("between")
    print("second", t.dtype, sep="|")
    return t - 1


def _record_warnings(fn, *args, action="always"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        fn(*args)
    return [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


@pytest.mark.parametrize("fn", [warns_directly, warns_from_helper], ids=["stacklevel 1", "stacklevel 2"])
def test_warnings_are_made_as_eager_makes_them(fn):
    compiled, graphs = _compiled(fn)
    x = torch.randn(3)
    expected = _record_warnings(fn, x)
    with kiln.config.patch(strict=True):
        assert _record_warnings(compiled, x) == expected  # the first call traces, then replays
        assert _record_warnings(compiled, x) == expected
    assert len(expected) == 1
    _captured(compiled, graphs)


def test_default_filter_warns_once_per_location_across_calls():
    compiled, graphs = _compiled(warns_directly)
    x = torch.randn(3)
    globals().pop("__warningregistry__", None)
    with kiln.config.patch(strict=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            compiled(x)
        assert [str(w.message) for w in caught] == ["careful"]
        warns_directly(x)  # same location as the compiled call's: already shown
    assert [str(w.message) for w in caught] == ["careful"]
    _captured(compiled, graphs)


def test_warning_naming_the_compiled_functions_caller_runs_eagerly():
    compiled, graphs = _compiled(warns_from_outside)
    x = torch.randn(3)
    assert [warning[:2] for warning in _record_warnings(compiled, x)] == [("caller's fault", UserWarning)]
    assert "stacklevel=2" in compiled.entries[0].eager_reason
    assert graphs == []


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage(), record.pathname, record.lineno, record.funcName))


@pytest.fixture
def records():
    handler = _Records()
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def test_logging_is_replayed_with_the_callers_location(records):
    compiled, graphs = _compiled(logs)
    x = torch.randn(2, 3)
    logs(x)
    expected = list(records)
    records.clear()
    with kiln.config.patch(strict=True):
        compiled(x)
        compiled(x)
    assert records == expected * 2 and expected[0][1] == "shape torch.Size([2, 3]), 6 items"
    logger.setLevel(logging.ERROR)  # the level is checked when the entry logs, as the call would
    compiled(x)
    assert len(records) == 2
    _captured(compiled, graphs)


def test_level_checks_are_guarded(records):
    compiled, graphs = _compiled(branches_on_level)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x), x + 1)
        logger.setLevel(logging.DEBUG)
        torch.testing.assert_close(compiled(x), x * 10)
    assert len(graphs) == 2


def test_print_is_replayed_in_program_order(capsys):
    compiled, graphs = _compiled(prints_in_order)
    x = torch.randn(3)
    prints_in_order(x)
    expected = capsys.readouterr().out
    with kiln.config.patch(strict=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x)
        assert capsys.readouterr().out == expected == "first torch.Size([3])\nsecond|torch.float32\n"
        compiled(x)
        assert capsys.readouterr().out == expected
    _captured(compiled, graphs)


def test_print_of_a_tensor_is_a_graph_break(capsys):
    def prints_tensor(t):
        print(t)
        return t + 1

    compiled, graphs = _compiled(prints_tensor)
    x = torch.randn(2)
    compiled(x)
    assert capsys.readouterr().out == f"{x}\n"
    assert compiled.entries[0].eager_reason is None and len(graphs) == 1  # only `t + 1` is tensor work
    with kiln.config.patch(graph_breaks=False):
        compiled, graphs = _compiled(prints_tensor)
        compiled(x)
    assert "tensor argument" in compiled.entries[0].eager_reason
    assert capsys.readouterr().out == f"{x}\n"
    assert graphs == []


class _WarnsOnCall:
    def __call__(self, t):
        warnings.warn("called", stacklevel=2)
        return t + 1


class _WarnsInForward(torch.nn.Module):
    def forward(self, t):
        warnings.warn("in forward")
        _deprecated(t)  # stacklevel=2 names this line of forward
        return t * 2


def test_warning_location_in_a_module_forward_matches_eager():
    module = _WarnsInForward()
    compiled, graphs = _compiled(module)
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        assert _record_warnings(compiled, x) == _record_warnings(module, x)
    _captured(compiled, graphs)


def test_warning_naming_a_callable_objects_caller_runs_eagerly():
    compiled, graphs = _compiled(_WarnsOnCall())
    compiled(torch.randn(3))
    assert "stacklevel=2" in compiled.entries[0].eager_reason
    assert graphs == []


class _Items(list):
    pass


def measures_list_subclass(t, items):
    return t + len(items)


def test_builtin_method_on_a_subclass_instance_is_refused_not_a_recursion():
    compiled, graphs = _compiled(measures_list_subclass)
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x, _Items([1, 2])), x + 2)  # a graph break calls len()
    assert compiled.entries[0].eager_reason is None
    compiled, graphs = _compiled(measures_list_subclass)
    with kiln.config.patch(graph_breaks=False):
        torch.testing.assert_close(compiled(x, _Items([1, 2])), x + 2)
    reason = compiled.entries[0].eager_reason
    assert "list.__len__ on _Items object" in reason and "RecursionError" not in reason


def logs_between_mutations(holder, t):
    holder.value = 1
    STATE_SEEN.append("one")
    logger.warning("first")
    holder.value = 2
    STATE_SEEN.append("two")
    warnings.warn("second")
    holder.value = 3
    return t + 1


STATE_SEEN: list = []


class _SeesHolder(logging.Handler):
    def __init__(self, holder):
        super().__init__()
        self.holder = holder
        self.seen = []

    def emit(self, record):
        self.seen.append((self.holder.value, list(STATE_SEEN)))


def test_replayed_calls_see_the_state_the_program_had_at_that_point(records):
    holder = Holder()
    watcher = _SeesHolder(holder)
    logger.addHandler(watcher)
    compiled, graphs = _compiled(logs_between_mutations)
    try:
        for run in (logs_between_mutations, compiled, compiled):
            holder.value = 0
            STATE_SEEN.clear()
            watcher.seen.clear()
            with warnings.catch_warnings(), kiln.config.patch(strict=True):
                warnings.simplefilter("error")  # the warning raises: what happened before it stays done
                with pytest.raises(UserWarning, match="second"):
                    run(holder, torch.randn(2))
            assert watcher.seen == [(1, ["one"])] and holder.value == 2 and STATE_SEEN == ["one", "two"], run
    finally:
        logger.removeHandler(watcher)
    _captured(compiled, graphs)


ALLOWED = {1}


def reads_a_global_set(t):
    return t * (2 in ALLOWED), isinstance(ALLOWED, set), ALLOWED


def adds_to_an_input_set(t, seen):
    seen.add(3)
    return t + len(seen)


def test_an_outside_set_is_a_set_guarded_by_its_contents():
    compiled, graphs = _compiled(reads_a_global_set)
    x = torch.randn(2)
    ALLOWED.clear()
    ALLOWED.add(1)
    with kiln.config.patch(strict=True):
        scaled, is_set, returned = compiled(x)
        torch.testing.assert_close(scaled, x * 0)
        assert is_set is True and returned is ALLOWED
        ALLOWED.add(2)  # the guard compares with what the trace saw, not with the live set itself
        torch.testing.assert_close(compiled(x)[0], x)
    assert len(graphs) == 2


def test_mutating_an_outside_set_is_replayed_on_it_without_a_graph_break():
    compiled, graphs = _compiled(adds_to_an_input_set)
    x = torch.randn(2)
    for _ in range(2):
        seen = {1}
        with kiln.config.patch(graph_breaks=False):
            torch.testing.assert_close(compiled(x, seen), x + 2)
        assert seen == {1, 3}
    _captured(compiled, graphs)


# ---------------------------------------------------------------- an outside list's method across a break


class _Recorder:
    def __init__(self):
        self.losses = []


def _record_loss(recorder, x):
    loss = (x * 2).sum()
    recorder.losses.append(loss.item())  # the break at .item() leaves `recorder.losses.append` on the stack
    return loss


def _append_to_argument(values, x):
    loss = (x * 3).mean()
    values.append(loss.item())
    return loss


@pytest.mark.parametrize("fn, make", [(_record_loss, _Recorder), (_append_to_argument, list)])
def test_a_list_method_live_across_a_break_keeps_the_items_of_earlier_calls(fn, make):
    # The resume function gets the list's bound `append` as a stack value. It pinned the list by identity
    # but not its items, and replayed its mutation as `list[:] = <the items its trace saw> + [new]`: every
    # call after the first replaced the earlier losses (a Lightning training_step's `self.losses.append(loss.item())`).
    compiled = kiln.compile(fn)
    eager_state, compiled_state = make(), make()
    for step in range(11):  # past the recompile limit (8) too
        x = torch.full((3,), float(step + 1))
        torch.testing.assert_close(compiled(compiled_state, x), fn(eager_state, x))
        got = compiled_state if isinstance(compiled_state, list) else compiled_state.losses
        want = eager_state if isinstance(eager_state, list) else eager_state.losses
        assert got == want, f"after call {step + 1}"


# ---------------------------------------------------------------- nonlocal stores into cells of outside functions

def _counter_program():
    """A compiled closure that assigns its enclosing function's variables (`nonlocal`), directly and through a
    helper it inlines, with a graph break (a tensor printed) after the stores."""
    calls, scale = 0, 1.0

    def bump(t):
        nonlocal calls
        calls += 1
        return t + calls

    def program(x):
        nonlocal scale
        scale = scale * 2
        y = bump(x) * scale
        print(y.sum())
        return bump(y), calls, scale

    return program


def _cells(fn):
    cells = {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__)}
    return cells["scale"], cells["bump"].__closure__[0].cell_contents


def test_nonlocal_stores_into_outside_cells_are_replayed(capsys):
    """They ran the whole frame eagerly ('assigning to a nonlocal variable of a function defined outside the
    compiled code'); now the cells are written back in program order, the break's resume function reads them."""
    program, expected_program = _counter_program(), _counter_program()
    compiled, graphs = _compiled(program)
    x = torch.arange(3.0)
    for _ in range(3):
        got, want = compiled(x), expected_program(x)
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:], (got, want)
        assert _cells(program) == _cells(expected_program)
    assert compiled.entries[-1].eager_reason is None and graphs
    printed = capsys.readouterr().out.splitlines()
    assert printed[0::2] == printed[1::2]  # the same prints, compiled then eager, call by call
