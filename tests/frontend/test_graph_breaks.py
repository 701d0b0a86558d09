"""Graph breaks (kiln/frontend/resume.py): what stops a trace is run in Python, the rest is compiled.

Each test compiles a function with kiln's frontend and a backend that counts graphs,
checks results (and side effects) against eager, and checks how many graphs and breaks
the frontend made and that no frame ran eagerly.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import time
import types

import pytest
import torch

import kiln
from kiln.frontend import break_analysis, break_calls, bytecode
from kiln.frontend.dispatcher import Dispatcher, stats
from kiln.frontend.errors import FullgraphError


def _counting():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, backend


def _compile(fn, **options):
    graphs, backend = _counting()
    return Dispatcher(fn, backend, **options), graphs


def _eager_frames_and_breaks(run):
    report = kiln.debug.explain.ExplainReport()
    with kiln.debug.explain._recording(report):
        run()
    return report


# --------------------------------------------------------------------------- unsupported calls

def with_a_c_call(x, y):
    a = x * 2 + y
    pid = os.getpid()  # a C function kiln does not model
    return a.sin() + (pid > 0), a


def test_an_unsupported_call_breaks_and_the_rest_is_compiled():
    compiled, graphs = _compile(with_a_c_call)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    report = _eager_frames_and_breaks(lambda: compiled(x, y))
    expected = with_a_c_call(x, y)
    result = compiled(x, y)
    torch.testing.assert_close(result, expected)
    assert len(graphs) == 2 and report.break_count == 1 and not report.eager_frames
    assert "getpid" in report.breaks[0].reason and f"{__file__}:" in report.breaks[0].location
    captures = stats.captures
    torch.testing.assert_close(compiled(x + 1, y), with_a_c_call(x + 1, y))
    assert stats.captures == captures  # both entries are reused


def test_fullgraph_still_raises_naming_the_construct_and_line():
    compiled, _ = _compile(with_a_c_call, fullgraph=True)
    with pytest.raises(FullgraphError) as raised:
        compiled(torch.randn(2), torch.randn(2))
    assert "getpid" in str(raised.value) and f"{__file__}:" in str(raised.value)


def test_graph_breaks_are_logged_with_reason_and_line(caplog):
    compiled, _ = _compile(with_a_c_call)
    with kiln.config.patch(logs="graph_breaks"), caplog.at_level(logging.WARNING, logger="kiln"):
        compiled(torch.randn(2), torch.randn(2))
    messages = [record.getMessage() for record in caplog.records]
    assert any("graph break in" in message and "getpid" in message and f"{__file__}:" in message
               for message in messages)


def test_kiln_explain_counts_graphs_and_breaks():
    report = kiln.explain(with_a_c_call, torch.randn(2), torch.randn(2))
    assert report.break_count == 1 and len(report.frames) == 2 and not report.eager_frames
    assert "graph break" in str(report)


def prints_a_tensor(x):
    y = x * 2
    print("between", y.shape)
    print("value", y.sum())  # a tensor's value: only after the graph ran
    return y + 1


def test_print_of_a_tensor_is_a_break_in_program_order(capsys):
    compiled, graphs = _compile(prints_a_tensor)
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert capsys.readouterr().out == "between torch.Size([3])\nvalue tensor(6.)\n"
    assert len(graphs) == 2


# --------------------------------------------------------------------------- data-dependent values

def branches(x):
    y = x.cos()
    if y.sum() > 2:
        z = y * 3
    else:
        z = y - 3
    return z + x


def test_a_tensor_condition_breaks_with_both_sides_compiled():
    compiled, graphs = _compile(branches)
    small, large = torch.full((4,), 3.0), torch.zeros(4)
    for x in (small, large, small, large):
        torch.testing.assert_close(compiled(x), branches(x))
    assert len(graphs) == 3 and len(compiled.entries) == 1


def uses_item(x):
    total = x.sum().item()
    scale = 2.0 if total > 0 else -2.0
    return x * scale, total


def test_item_breaks_and_its_python_value_flows_on():
    compiled, graphs = _compile(uses_item)
    x = torch.randn(5)
    result, total = compiled(x)
    expected, expected_total = uses_item(x)
    torch.testing.assert_close(result, expected)
    assert total == expected_total and isinstance(total, float)


def or_of_tensors(x):
    flag = (x.sum() > 0) or (x.max() > 10)
    return x + 1 if flag else x - 1


def test_boolean_operators_on_tensor_conditions():
    compiled, _ = _compile(or_of_tensors)
    for x in (torch.ones(3), -torch.ones(3), torch.tensor([-30.0, 11.0, 1.0])):
        torch.testing.assert_close(compiled(x), or_of_tensors(x))


# --------------------------------------------------------------------------- inside calls and modules

def _inner(x):
    if x.mean() > 0:
        return x * 2
    return x / 2


def _middle(x, *, shift):
    return _inner(x + shift) - 1


def calls_down(x):
    a = x.exp()
    b = _middle(a, shift=-1.5)
    return a + b


def test_a_break_two_calls_deep_resumes_at_each_level():
    compiled, graphs = _compile(calls_down)
    for x in (torch.randn(6), torch.randn(6) - 3, torch.randn(6) + 3):
        torch.testing.assert_close(compiled(x), calls_down(x))
    report = _eager_frames_and_breaks(lambda: compiled(torch.randn(6) * 5))
    assert not report.eager_frames


def star_call(x, args, kwargs):
    return x + _middle(*args, **kwargs)


def test_a_break_in_a_call_with_star_arguments():
    compiled, _ = _compile(star_call)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, (x * 2,), {"shift": 0.5}), star_call(x, (x * 2,), {"shift": 0.5}))


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.linear(x)
        if h.sum() > 0:
            return torch.relu(h)
        return -h


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gates = torch.nn.ModuleList([Gate(), Gate()])
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        for gate in self.gates:
            x = gate(x) + x
        return self.out(x)


def test_a_module_whose_submodules_branch_on_data():
    model = Net()
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(3, 4)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    with torch.no_grad():
        for sample in (x, -x, x * 3):
            torch.testing.assert_close(compiled(sample), model(sample))
    assert report.break_count >= 1 and not report.eager_frames


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.linear(x)
        LOG.append(round(h.sum().item(), 3))  # .item(): a break inside the block
        return h * 2


SEQUENTIAL = torch.nn.Sequential(torch.nn.Linear(4, 4), Noisy(), torch.nn.ReLU(), torch.nn.Linear(4, 4))


def through_a_sequential(x, y):
    return SEQUENTIAL(x + 1) - y


def test_a_break_in_a_sequential_compiles_the_user_block_and_runs_torch_modules_as_they_are():
    """At a break the Sequential runs its children one by one (break_calls._call_sequential): the user block gets
    its own dispatcher (a graph before and after its break), torch's own Linear and ReLU run as they are (as
    TorchDynamo leaves torch.nn's frames uncompiled): 4 graphs, where compiling Sequential.forward made 6."""
    compiled, graphs = _compile(through_a_sequential)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        LOG.clear()
        expected = through_a_sequential(x, y)
        eager_log = list(LOG)
        LOG.clear()
        report = _eager_frames_and_breaks(lambda: torch.testing.assert_close(compiled(x, y), expected))
        assert LOG == eager_log
        # the outer frame up to the call; the block before and after its break; the outer frame's rest
        assert len(graphs) == 4 and report.break_count == 2 and not report.eager_frames
        captures = stats.captures
        LOG.clear()
        torch.testing.assert_close(compiled(x, y), expected)
        assert stats.captures == captures and LOG == eager_log
        handle = SEQUENTIAL.register_forward_hook(lambda module, args, output: output * 10)
        try:  # a hook: the Sequential is called as it is (its children run eagerly inside it)
            LOG.clear()
            torch.testing.assert_close(compiled(x, y), through_a_sequential(x, y))
        finally:
            handle.remove()
    LOG.clear()


class Gates(torch.nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.gates = torch.nn.ModuleList(Gate() for _ in range(depth))

    def forward(self, x):
        for gate in self.gates:
            x = gate(x) * 0.5 + x
        return x


def test_blocks_of_one_class_that_break_share_their_compiled_graphs():
    """Each Gate breaks at its branch and is compiled by a dispatcher of its own (its guards hold its identity),
    but their graphs are the same but for the parameters they take as inputs: the first block's are reused
    (frontend/graph_reuse.py), each call reading its own block's weights, as Dynamo's one cache per code
    serves every instance."""
    torch.manual_seed(0)
    model = Gates(4)
    compiled, graphs = _compile(model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model(x)
        report = _eager_frames_and_breaks(lambda: torch.testing.assert_close(compiled(x), expected))
        # Gate.forward up to its branch and each side's resume (the blocks here take both), and the loop's
        # resume function once per remaining length (a recompile of one frame compiles anew): without
        # reuse each of the four blocks compiled its forward and its side's resume, 12 graphs
        sides = {bool(gate.linear(value).sum() > 0) for gate, value in _gate_inputs(model, x)}
        assert len(sides) == 2
        assert len(graphs) == 1 + 2 + 4 and not report.eager_frames, [graph.code for graph in graphs]
        for sample in (x * 2, -x):  # new values, the same entries: each block's own weights are read
            torch.testing.assert_close(compiled(sample), model(sample))
        assert len(graphs) == 7
        with torch.no_grad():
            model.gates[2].linear.weight.mul_(-3)  # one block changes: the shared graph reads it
        torch.testing.assert_close(compiled(x), model(x))
        assert len(graphs) == 7


def test_graphs_are_shared_only_when_nothing_they_compute_can_differ():
    from kiln.frontend import graph_reuse

    graph = torch.fx.symbolic_trace(lambda a, b: a.add_(b) * 2)
    def backend(gm, example_inputs):
        return gm.forward

    base = torch.randn(2, 3)
    key = graph_reuse.key_of(backend, graph, [torch.randn(2, 3), torch.randn(2, 3)])
    assert key is not None and key == graph_reuse.key_of(backend, graph, [torch.randn(2, 3), torch.randn(2, 3)])
    others = [[base, base],  # the inputs share storage
              [base[0], base[1]],  # views
              [torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3)],
              [torch.randn(3, 2).t(), torch.randn(2, 3)],  # strides
              [torch.randn(2, 3, requires_grad=True), torch.randn(2, 3)]]
    for inputs in others:
        assert graph_reuse.key_of(backend, graph, inputs) != key
    with torch.no_grad():
        assert graph_reuse.key_of(backend, graph, [torch.randn(2, 3), torch.randn(2, 3)]) != key
    replaying = functools.partial(lambda gm, example_inputs, mode: gm.forward, mode="reduce-overhead")
    parameter = torch.nn.Parameter(torch.randn(2, 3))
    assert graph_reuse.key_of(replaying, graph, [parameter, torch.randn(2, 3)]) is None
    assert graph_reuse.key_of(replaying, graph, [torch.randn(2, 3), torch.randn(2, 3)]) is None
    assert graph_reuse.key_of(backend, graph, [parameter, torch.randn(2, 3)]) is not None


def _gate_inputs(model, x):
    pairs = []
    for gate in model.gates:
        pairs.append((gate, x))
        x = gate(x) * 0.5 + x
    return pairs


# --------------------------------------------------------------------------- state around the break

def in_a_loop(xs):
    acc = xs[0] * 0
    for x in xs:
        acc = acc + x
        if acc.sum() > 0:
            acc = acc * 0.5
    return acc


def test_a_break_inside_a_for_loop_passes_the_iterator_on():
    compiled, _ = _compile(in_a_loop)
    xs = [torch.randn(3) for _ in range(5)]
    torch.testing.assert_close(compiled(xs), in_a_loop(xs))


def mid_expression(a, b, c):
    return [a, a + _inner(b) * c, f"{len(c)}"]


def test_values_on_the_stack_are_passed_to_the_resume_function():
    compiled, _ = _compile(mid_expression)
    a, b, c = torch.randn(2), torch.randn(2), torch.randn(2)
    result = compiled(a, b, c)
    expected = mid_expression(a, b, c)
    assert result[0] is a and result[2] == expected[2]
    torch.testing.assert_close(result[1], expected[1])


LOG: list = []


def effects(x, seen, box):
    global COUNTER
    LOG.append("before")
    box.value = 1
    COUNTER = 10
    x.add_(1)
    seen.add(len(LOG))  # replayed on the set in program order: it sees the state written before it
    os.getpid()  # a break
    LOG.append("after")
    box.value = box.value + 1
    x.mul_(2)
    return x + COUNTER


class Box:
    value = 0


def test_side_effects_before_and_after_a_break_keep_program_order():
    global COUNTER
    compiled, _ = _compile(effects)
    results = []
    for run in (effects, compiled):
        LOG.clear()
        COUNTER = 0
        x, seen, box = torch.ones(2), set(), Box()
        out = run(x, seen, box)
        results.append((out, x.clone(), set(seen), list(LOG), box.value, COUNTER))
    (out, x, seen, log, value, counter), expected = results[1], results[0]
    torch.testing.assert_close(out, expected[0])
    torch.testing.assert_close(x, expected[1])
    assert (seen, log, value, counter) == expected[2:]


COUNTER = 0


def with_closure(scale):
    def run(x):
        y = x * scale
        os.getpid()
        return y + scale

    return run


def test_a_function_with_a_closure_resumes_with_its_cells():
    fn = with_closure(3.0)
    compiled, graphs = _compile(fn)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), fn(x))
    assert len(graphs) == 2


def in_a_try(x):
    try:
        os.getpid()
        y = x + 1
    except ValueError:
        y = x - 1
    return y * 2


def test_a_break_inside_a_try_block_resumes_inside_it():
    compiled, graphs = _compile(in_a_try)
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x), in_a_try(x))
    assert compiled.entries[0].eager_reason is None and len(graphs) == 1  # the part after the break


TRY_LOG = []


def _raise_after_a_break(x, kind):
    print("raising", x.sum().item() > -1e9)  # a break inside this callee: the caller breaks at the call
    raise kind("from the callee")


def handled_at_a_break(x, kind):
    try:
        try:
            y = x + 1
            _raise_after_a_break(y, kind)
            y = y * 100
        finally:
            TRY_LOG.append("finally")
    except KeyError as error:
        TRY_LOG.append(("caught", str(error), sys.exc_info()[0]))
        y = x - 5
    TRY_LOG.append(("after", sys.exc_info()[0]))
    return y * 2


@pytest.mark.parametrize("kind", [KeyError, ValueError])
def test_an_exception_from_the_broken_call_goes_to_the_try_blocks_handler(kind, capsys):
    """The broken call raises: the entry hands the exception to a resume function at the handler (the finally
    block, then the except clause that matches, or out of the frame when none does), with sys.exc_info as in
    eager inside the handler and after it."""
    compiled, graphs = _compile(handled_at_a_break)
    x = torch.randn(3)
    results = []
    for run in (handled_at_a_break, compiled, compiled):
        TRY_LOG.clear()
        try:
            results.append((run(x, kind), None, list(TRY_LOG)))
        except Exception as error:
            results.append((None, type(error), list(TRY_LOG)))
    expected = results[0]
    for result in results[1:]:
        assert result[1:] == expected[1:]
        if expected[0] is not None:
            torch.testing.assert_close(result[0], expected[0])
    assert expected[1] is (None if kind is KeyError else ValueError)
    assert compiled.entries[0].eager_reason is None and graphs
    assert capsys.readouterr().out.count("raising True") == 3


def with_block_in_a_try(x, kind):
    try:
        with torch.no_grad():
            y = x * 2
            _raise_after_a_break(y, kind)
    except KeyError:
        return x - 1, torch.is_grad_enabled()
    return y, torch.is_grad_enabled()


@pytest.mark.parametrize("kind", [KeyError, ValueError])
def test_an_exception_from_the_broken_call_leaves_the_with_block_then_reaches_the_try(kind, capsys):
    """The handler around the break is the no_grad block's cleanup: it exits the block (grad mode back on), then
    passes the exception to the try block around it, or out of the frame with grad mode restored."""
    compiled, graphs = _compile(with_block_in_a_try)
    x = torch.randn(3)
    for _ in range(2):
        if kind is KeyError:
            result, grad_enabled = compiled(x, kind)
            torch.testing.assert_close(result, x - 1)
            assert grad_enabled
        else:
            with pytest.raises(ValueError):
                compiled(x, kind)
        assert torch.is_grad_enabled()
    assert compiled.entries[0].eager_reason is None


def breaks_in_an_except_clause(x):
    try:
        y = {}["missing"]
    except KeyError:
        os.getpid()
        y = x + 1
    return y


def test_a_break_inside_an_except_clause_runs_the_frame_eagerly():
    """An except clause's body re-raises from the raising instruction's offset (its handler's `lasti`), which a
    resume function's code does not have: the frame runs eagerly."""
    compiled, graphs = _compile(breaks_in_an_except_clause)
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x), breaks_in_an_except_clause(x))
    assert compiled.entries[0].eager_reason is not None and graphs == []


def try_in_a_loop(x):
    rows = []
    for index in range(3):
        try:
            if x[index].sum() > 0:  # a branch on data, inside the try block, inside the loop
                rows.append(x[index] * 2)
            else:
                raise ValueError("negative")
        except ValueError:
            rows.append(x[index] * 0)
    return torch.stack(rows)


def test_breaks_inside_a_try_block_in_a_loop():
    compiled, graphs = _compile(try_in_a_loop)
    x = torch.tensor([[1.0, 2.0], [-3.0, -1.0], [0.5, 0.25]])
    for _ in range(2):
        torch.testing.assert_close(compiled(x), try_in_a_loop(x))
    torch.testing.assert_close(compiled(-x), try_in_a_loop(-x))
    assert all(entry.eager_reason is None for entry in compiled.entries) and graphs


def _scaled_by_an_item(x, k):
    return x * x[k].sum().item()


def comprehension_over_a_range(x):
    parts = [_scaled_by_an_item(x, k) for k in range(3)]
    return parts[-1] - parts[0]


def test_an_iterator_over_a_range_is_passed_on_at_a_break():
    """The comprehension's call (3.11) or its span (3.12) runs at the break with the range's iterator as the trace
    left it, rebuilt from the items it has left: the frame compiles around it rather than running eagerly."""
    compiled, graphs = _compile(comprehension_over_a_range)
    x = torch.randn(3, 2)
    torch.testing.assert_close(compiled(x), comprehension_over_a_range(x))
    assert all(entry.eager_reason is None for entry in compiled.entries)


class _BranchingBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        if y.sum() > 1e9:  # a branch on data: every block breaks
            y = y * 2
        return torch.relu(y)


class _BlockStack(torch.nn.Module):
    def __init__(self, count: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_BranchingBlock() for _ in range(count))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_a_loop_whose_body_breaks_on_every_iteration_stays_compiled(caplog):
    """forward's resume function continues the loop at each block, passed an iterator one item shorter each
    time: one entry per iteration after the first block, 12 in all, past the recompile limit of 8, which counts each
    iteration's entries apart. Before, the blocks after the 8th ran eagerly. A second call traces nothing."""
    torch.manual_seed(0)
    model = _BlockStack(12)
    compiled, graphs = _compile(model)
    x = torch.randn(2, 4)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        torch.testing.assert_close(compiled(x), model(x))
        traced = len(graphs)
        torch.testing.assert_close(compiled(x), model(x))
    assert "recompile limit" not in caplog.text and "eagerly" not in caplog.text, caplog.text
    assert len(graphs) == traced
    (resumed,) = [dispatcher for dispatcher in compiled._resumes.values() if "forward" in dispatcher._name()]
    assert len(resumed.entries) == 12 and all(entry.eager_reason is None for entry in resumed.entries)
    assert {entry.loop_position for entry in resumed.entries} == {(count,) for count in range(12)}


CONTEXT_LOG = []


class _Logged:
    """A user context manager: logs its enter and its exit, and suppresses a KeyError."""

    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        CONTEXT_LOG.append(("enter", self.tag))
        self.entered = True
        return self

    def __exit__(self, kind, value, traceback):
        CONTEXT_LOG.append(("exit", self.tag, kind.__name__ if kind else None))
        return kind is KeyError


def breaks_in_a_user_context_manager(x, table):
    with _Logged("a") as manager:
        y = x * 2
        if y.sum() > 0:  # a break inside the block
            y = y + 1
        CONTEXT_LOG.append(("inside", manager.tag, manager.entered))
        y = y * table["scale"]  # a KeyError after the break: the manager's exit suppresses it
    return y


@pytest.mark.parametrize("table", [{"scale": 3.0}, {}])
def test_a_break_inside_a_user_context_managers_block_resumes_inside_it(table):
    """The resume function is passed the manager, and its prologue binds the manager's `__exit__` again, so the
    block's end (or an exception's cleanup) calls it as eager does; a new manager on each call reuses the
    entries (the manager is guarded as any argument, not by identity)."""
    compiled, graphs = _compile(breaks_in_a_user_context_manager)
    for x in (torch.randn(3).abs(), -torch.randn(3).abs(), torch.randn(3).abs()):
        CONTEXT_LOG.clear()
        expected = breaks_in_a_user_context_manager(x, dict(table))
        expected_log = list(CONTEXT_LOG)
        CONTEXT_LOG.clear()
        torch.testing.assert_close(compiled(x, dict(table)), expected)
        assert CONTEXT_LOG == expected_log
    entries = compiled.entries + [entry for resumed in compiled._resumes.values() for entry in resumed.entries]
    assert all(entry.eager_reason is None for entry in entries)
    assert len(entries) == 3  # the frame, and the two sides of the branch: no entry per call


# --------------------------------------------------------------------------- resume functions

def test_live_locals_are_those_read_before_written():
    def fn(a, b, c):
        d = a + 1
        os.getpid()
        b = d * 2
        return b + c

    code = fn.__code__
    instructions = bytecode.decode(code).instructions
    call = next(index for index, instruction in enumerate(instructions) if instruction.argval == "getpid")
    live = break_analysis.live_locals(code, call + 1)
    assert live == {"d", "c"}


def test_a_resume_function_is_shared_by_recompiles():
    compiled, graphs = _compile(with_a_c_call)
    compiled(torch.randn(2), torch.randn(2))
    compiled(torch.randn(2, 2), torch.randn(2, 2))  # a new shape: both frames recompile
    assert len(compiled._resumes) == 1
    (resumed,) = compiled._resumes.values()
    assert len(resumed.entries) == 2 and len(graphs) == 4


def drops_a_clock_reading(x):
    a = x.sin()
    time.perf_counter()  # a new float on every call, popped unread by the resumed code
    return a * 2


def branches_before_reading_a_float(x, scale):
    if x.sum() > 0:  # the break comes before `scale` is read: the resume function takes it as a live local
        return x * scale
    return x - scale


def test_an_argument_the_trace_only_passes_on_is_not_guarded():
    compiled, graphs = _compile(drops_a_clock_reading)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), drops_a_clock_reading(x))
    captures = stats.captures
    torch.testing.assert_close(compiled(x), drops_a_clock_reading(x))
    assert stats.captures == captures and len(graphs) == 2

    compiled, graphs = _compile(branches_before_reading_a_float)
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x, 2.0), x * 2.0)
    assert len(compiled.entries) == 1 and "scale:" not in compiled.entries[0].guard_source
    for scale in (0.5, 3.0, 0.5):
        torch.testing.assert_close(compiled(x, scale), x * scale)  # the resume function reads it: guarded there
        torch.testing.assert_close(compiled(-x, scale), -x - scale)
    assert len(compiled.entries) == 1  # the frame up to the break never read `scale`


def compares_with_a_function(x, maybe, fn):
    return x * 2 if maybe is fn else x * 3


def test_a_constant_argument_compared_with_a_function_is_guarded():
    compiled, _ = _compile(compares_with_a_function)
    x = torch.ones(3)

    def fn(t):
        return t

    for maybe in (None, fn, None):
        torch.testing.assert_close(compiled(x, maybe, fn), compares_with_a_function(x, maybe, fn))


def test_an_argument_the_trace_reads_is_guarded_by_value():
    def flagged(x, flag, scale):
        os.getpid()
        return x * scale if flag else x

    compiled, _ = _compile(flagged)
    x = torch.randn(3)
    for flag, scale in ((True, 2), (False, 2), (True, 3), (True, 2)):
        torch.testing.assert_close(compiled(x, flag, scale), flagged(x, flag, scale))


def breaks_in_a_lambda_it_defines(x):
    scale = lambda t: t * t.abs().max().item()  # noqa: E731  (a new function object on every call)
    return scale(x).sin() + scale(x + 1)


def _breaks_with_a_default(t, k=2.0):
    return t * t.abs().max().item() * k


def test_a_function_defined_in_the_compiled_code_is_compiled_once_for_all_its_objects():
    compiled, graphs = _compile(breaks_in_a_lambda_it_defines)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), breaks_in_a_lambda_it_defines(x))
    captures, graph_count = stats.captures, len(graphs)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), breaks_in_a_lambda_it_defines(x))
    assert stats.captures == captures and len(graphs) == graph_count


def test_callees_are_shared_only_by_functions_that_run_the_same():
    _, backend = _counting()

    def make_dispatcher(fn):
        return Dispatcher(fn, backend)

    def function(defaults, fn_globals=None):
        return types.FunctionType(_breaks_with_a_default.__code__, fn_globals or globals(), "f", defaults)

    defaults = (2.0,)
    first, _ = break_calls.compiled_callee(make_dispatcher, function(defaults))
    assert break_calls.compiled_callee(make_dispatcher, function(defaults))[0] is first
    for other in (function(tuple([2.0])), function(defaults, dict(globals()))):  # other default objects, globals
        assert break_calls.compiled_callee(make_dispatcher, other)[0] is not first
    # closures of one code share a dispatcher, each call made with its own cells
    first_closure, second_closure = (break_calls.compiled_callee(make_dispatcher, with_closure(k))[0] for k in (2.0, 3.0))
    assert first_closure.func.__self__ is second_closure.func.__self__
    torch.testing.assert_close(first_closure(torch.ones(2)), with_closure(2.0)(torch.ones(2)))
    torch.testing.assert_close(second_closure(torch.ones(2)), with_closure(3.0)(torch.ones(2)))
    x = torch.randn(3)
    for k in (2.0, 3.0):
        fn = function((k,))
        torch.testing.assert_close(break_calls.call_compiled(make_dispatcher, fn, x), fn(x))
    shared = function(defaults)
    torch.testing.assert_close(break_calls.call_compiled(make_dispatcher, shared, x), shared(x))
    shared.__defaults__ = (5.0,)  # no longer runs as the function whose dispatcher it shared
    torch.testing.assert_close(break_calls.call_compiled(make_dispatcher, shared, x), shared(x))


def captured_and_live(x):
    factor = x.mean()

    def scale(t):
        return t * factor + 1

    a = scale(x)
    os.getpid()
    return scale(a) - x


def captured_and_rebound_after_the_break(x):
    factor = x.mean()

    def scale(t):
        return t * factor

    a = scale(x)
    os.getpid()
    factor = factor + 1  # the inner function made before the break must see it
    return scale(a)


def recursive_inner_function(x, n):
    def countdown(t, k):  # its own cell holds it
        return t if k == 0 else countdown(t * 2, k - 1)

    a = countdown(x, n)
    os.getpid()
    return countdown(a, 1), countdown


def calls_a_closure_that_breaks(x, k):
    def scaled(t):
        return t * t.abs().max().item() * k

    return scaled(x) + 1


def test_a_frame_whose_variables_inner_functions_capture_resumes_with_the_same_cells():
    for program, args in ((captured_and_live, (torch.randn(3),)),
                          (captured_and_rebound_after_the_break, (torch.randn(3),)),
                          (recursive_inner_function, (torch.randn(3), 2))):
        compiled, graphs = _compile(program)
        report = _eager_frames_and_breaks(lambda: compiled(*args))
        assert report.break_count == 1 and compiled.entries[0].eager_reason is None, program
        expected, result = program(*args), compiled(*args)
        if program is recursive_inner_function:
            torch.testing.assert_close(result[1](args[0], 3), expected[1](args[0], 3))
            expected, result = expected[0], result[0]
        torch.testing.assert_close(result, expected)
    compiled, graphs = _compile(captured_and_live)
    x = torch.randn(3)
    compiled(x)
    captures = stats.captures
    torch.testing.assert_close(compiled(x), captured_and_live(x))
    assert stats.captures == captures and len(graphs) == 2 and not report.eager_frames


def test_a_closure_made_on_each_call_and_called_at_a_break_is_traced_once():
    compiled, graphs = _compile(calls_a_closure_that_breaks)
    x = torch.randn(3)
    report = _eager_frames_and_breaks(lambda: compiled(x, 2.0))
    assert not report.eager_frames and report.break_count == 2  # in the frame, then in the closure
    captures = stats.captures
    torch.testing.assert_close(compiled(x, 2.0), calls_a_closure_that_breaks(x, 2.0))
    assert stats.captures == captures
    for k in (3.0, 2.0, 0.5):  # the cell's contents: each call's own
        torch.testing.assert_close(compiled(x, k), calls_a_closure_that_breaks(x, k))


# --------------------------------------------------------------------------- what breaks instead of dropping the frame

def boolean_mask(x):
    y = x * 2
    return y[y > 0].sum() + x.sum()  # a data-dependent shape: BINARY_SUBSCR runs in Python


def defines_a_class(x):
    class Local:
        scale = 3

    return x * Local.scale


def draws_python_random(x):
    import random

    return x * random.random() + 1


def stores_into_a_bytearray(x, buffer):
    y = x + 1
    buffer[0] = 7  # item assignment on an object kiln does not model: one instruction in Python
    return y * 2


@pytest.mark.parametrize("program, make_args", [
    (boolean_mask, lambda: (torch.randn(8),)),
    (defines_a_class, lambda: (torch.randn(3),)),
    (draws_python_random, lambda: (torch.randn(3),)),
    (stores_into_a_bytearray, lambda: (torch.randn(3), bytearray(b"abc"))),
], ids=lambda value: getattr(value, "__name__", ""))
def test_constructs_kiln_does_not_trace_break_instead_of_running_the_frame_eagerly(program, make_args):
    import random

    compiled, graphs = _compile(program)
    args, eager_args = make_args(), None
    eager_args = tuple(arg.clone() if isinstance(arg, torch.Tensor) else type(arg)(arg) for arg in args)
    random.seed(1)
    expected = program(*eager_args)
    random.seed(1)
    report = _eager_frames_and_breaks(lambda: compiled(*args))
    random.seed(1)
    torch.testing.assert_close(compiled(*args), expected)
    assert report.break_count >= 1 and not report.eager_frames and graphs
    for mine, theirs in zip(args, eager_args):
        assert not isinstance(mine, bytearray) or mine == theirs


# --------------------------------------------------------------------------- grad mode across a break

def breaks_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("inside", y.shape)
        os.getpid()
        z = y + 1
    return z * x


def test_a_break_inside_no_grad_resumes_inside_the_block_and_its_exit_restores_grad_mode(capsys):
    compiled, graphs = _compile(breaks_inside_no_grad)
    x = torch.randn(4, requires_grad=True)
    expected = breaks_inside_no_grad(x)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    result = compiled(x)
    assert torch.is_grad_enabled()
    torch.testing.assert_close(result, expected)
    assert result.requires_grad and report.break_count == 1 and not report.eager_frames
    result.sum().backward()
    torch.testing.assert_close(x.grad, (x * 2 + 1).detach())


def raises_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        os.kill(-4194303, 0)  # raises ProcessLookupError in Python, at the break
        z = y + 1
    return z


def test_an_exception_at_a_break_inside_no_grad_still_restores_grad_mode():
    compiled, _ = _compile(raises_inside_no_grad)
    with pytest.raises(ProcessLookupError):
        compiled(torch.randn(2))
    assert torch.is_grad_enabled()


def turns_grad_off(x):
    torch.set_grad_enabled(False)
    return x * 2


def test_a_function_leaving_grad_mode_changed_leaves_it_changed_as_eager_does():
    compiled, graphs = _compile(turns_grad_off)
    x = torch.randn(2, requires_grad=True)
    try:
        result = compiled(x)
        assert not torch.is_grad_enabled() and not result.requires_grad and len(graphs) == 1
    finally:
        torch.set_grad_enabled(True)


def halves_while_large(x):
    v = x * 1.0
    steps = 0
    while v.norm() > 1:  # 3.11: the loop's test at the bottom is POP_JUMP_BACKWARD_IF_TRUE
        v = v / 2
        steps += 1
    return v, steps


def test_a_data_dependent_while_loop_takes_each_side_of_its_backward_jump():
    compiled, _ = _compile(halves_while_large)
    for x in (torch.randn(3) * 16, torch.randn(3) * 0.01, torch.randn(3) * 3):
        result, steps = compiled(x)
        expected, expected_steps = halves_while_large(x)
        torch.testing.assert_close(result, expected)
        assert steps == expected_steps


def test_a_break_in_a_loop_resumes_through_one_function_for_every_iteration():
    compiled, graphs = _compile(halves_while_large)
    x = torch.ones(3) * 2 ** 12  # twelve iterations, each breaking at the loop's test
    result, steps = compiled(x)
    expected, expected_steps = halves_while_large(x)
    torch.testing.assert_close(result, expected)
    assert steps == expected_steps == 13
    # the frame, the loop body (traced again once: `steps` becomes a graph input) and the exit
    assert len(compiled._resumes) == 2 and len(graphs) <= 4
    captures = stats.captures
    result, steps = compiled(x * 4)
    assert steps == 15 and stats.captures == captures


# --------------------------------------------------------------------------- generators across a break

GENERATOR_LOG: list = []


def _check_compiled(fn, *args, max_graphs, max_breaks):
    """fn compiled: eager's results and GENERATOR_LOG on two calls, no frame run eagerly, no more graphs or breaks
    than given, and nothing traced on the second call."""
    GENERATOR_LOG.clear()
    expected = fn(*args)
    expected_log = list(GENERATOR_LOG)
    compiled, graphs = _compile(fn)
    GENERATOR_LOG.clear()
    report = _eager_frames_and_breaks(lambda: compiled(*args))
    assert not report.eager_frames, report.eager_frames
    assert len(graphs) <= max_graphs and report.break_count <= max_breaks, (len(graphs), report.breaks)
    GENERATOR_LOG.clear()
    captures = stats.captures
    result = compiled(*args)
    assert stats.captures == captures  # every entry is reused
    torch.testing.assert_close(result, expected)
    assert GENERATOR_LOG == expected_log
    return report, graphs


def steps_a_generator_past_a_break(x):
    def produce():
        GENERATOR_LOG.append("first")
        yield x + 1
        GENERATOR_LOG.append("second")
        yield x * 2
        GENERATOR_LOG.append("third")
        yield x - 3

    values = produce()
    first = next(values)
    scale = first.sum().item()  # a break with the generator suspended at its first yield
    return first * scale + next(values) + next(values)


def test_a_suspended_generator_live_across_a_break_is_stepped_by_the_resume_functions_trace():
    report, graphs = _check_compiled(steps_a_generator_past_a_break, torch.randn(3), max_graphs=2, max_breaks=1)
    assert len(graphs) == 2 and report.break_count == 1


def accumulates_what_it_is_sent(x):
    def running():
        total = x * 0
        while True:
            step = yield total
            GENERATOR_LOG.append("step")
            total = total + step

    accumulator = running()
    next(accumulator)
    first = accumulator.send(x)
    scale = first.sum().item()  # a break: the generator is suspended at its yield, with `total` live
    return accumulator.send(x * scale)


def test_a_rebuilt_generator_takes_send_at_the_yield_it_was_suspended_at():
    _check_compiled(accumulates_what_it_is_sent, torch.randn(3), max_graphs=2, max_breaks=1)


def generator_state(x):
    def produce():
        yield x + 1
        yield x + 2

    fresh = produce()
    started = produce()
    first = next(started)
    states = (inspect.getgeneratorstate(fresh), inspect.getgeneratorstate(started))
    return first, states, next(started), fresh


def test_a_generator_the_entry_rebuilds_is_in_the_state_the_trace_left_it():
    x = torch.randn(3)
    compiled, _ = _compile(generator_state)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    assert not report.eager_frames, report.eager_frames
    first, states, second, fresh = compiled(x)
    assert states == (inspect.GEN_CREATED, inspect.GEN_SUSPENDED)
    torch.testing.assert_close(first, x + 1)
    torch.testing.assert_close(second, x + 2)
    assert inspect.isgenerator(fresh) and [t.tolist() for t in fresh] == [(x + 1).tolist(), (x + 2).tolist()]


def breaks_in_a_generators_body(x):
    def produce():
        for i in range(3):
            t = x * (i + 1)
            GENERATOR_LOG.append(("yield", i, round(t.sum().item(), 3)))  # a break inside the generator
            yield t

    total = x * 0
    for value in produce():
        GENERATOR_LOG.append("consume")
        total = total + value
    return total


def test_a_break_in_a_generators_body_runs_that_step_in_python():
    # the loop's FOR_ITER breaks: each step runs in Python, each loop body is a graph
    _check_compiled(breaks_in_a_generators_body, torch.randn(3), max_graphs=5, max_breaks=4)


def enumerates_a_generator_across_branches(x):
    def produce():
        for i in range(4):
            GENERATOR_LOG.append(("produce", i))
            yield x * (i + 1)

    total = x * 0
    for index, value in enumerate(produce(), start=10):
        total = total + value * index
        if total.sum() > 0:  # a data-dependent branch with enumerate(generator) live: both rebuilt by the resume
            total = total - 1
    return total


def test_enumerate_of_a_generator_live_across_a_branch_is_rebuilt_by_the_resume_function():
    for x in (torch.ones(3), -torch.ones(3)):
        _check_compiled(enumerates_a_generator_across_branches, x, max_graphs=9, max_breaks=4)


def comprehension_with_a_break(x, y):
    return torch.stack([t * t.sum().item() for t in (x, y, x - y)]).sum(0)


def test_a_break_in_a_list_comprehension_runs_the_comprehension_whole():
    """3.11 calls the comprehension as a function, and the break runs that call as it is; 3.12 inlines it
    (PEP 709), and the break runs its span of the code (break_analysis.Comprehension): one break, not one per item."""
    x, y = torch.randn(3), torch.randn(3)
    _check_compiled(comprehension_with_a_break, x, y, max_graphs=2, max_breaks=1)


def comprehensions_nested_and_a_dict_one(x, y):
    t = x.sum()  # a variable of the same name outside: restored after the comprehension, as Python does
    rows = [[u * u.sum().item() for u in v] for v in (x, y)]
    sums = {i: v.sum().item() for i, v in enumerate((x, y))}
    return rows[0][0] + rows[1][1] + sums[1] + t


def assigns_inside_a_comprehension(x):
    out = [(last := v.sum().item()) for v in (x, x * 2)]  # an assignment expression: the span cannot run alone
    return torch.tensor(out) + last


@pytest.mark.parametrize("fn, breaks", [(comprehensions_nested_and_a_dict_one, 2), (assigns_inside_a_comprehension, 2)])
def test_comprehensions_that_break(fn, breaks):
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    args = (x, y) if fn is comprehensions_nested_and_a_dict_one else (x,)
    _check_compiled(fn, *args, max_graphs=breaks + 1, max_breaks=breaks)


def generator_also_passed_to_the_broken_call(x):
    def produce():
        yield x + 1
        yield x + 2

    values = produce()
    first = next(values)
    described = _opaque_describe(values)  # the break's call gets the generator; the resume function too
    return first + next(values), described


def _opaque_describe(generator):
    return type(generator).__name__ + str(os.getpid() > 0)


def test_a_generator_the_broken_call_also_gets_is_passed_on_as_the_same_object():
    x = torch.randn(3)
    compiled, _ = _compile(generator_also_passed_to_the_broken_call)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    assert not report.eager_frames, report.eager_frames
    result, described = compiled(x)
    torch.testing.assert_close(result, (x + 1) + (x + 2))
    assert described == "generatorTrue"


def _rest_and_its_type(iterator):
    kind = type(iterator).__name__ + str(os.getpid() > 0)  # a break: the caller passes the iterator to Python
    return sum(iterator), kind


def passes_a_list_iterator_on(x, items):
    iterator = iter(items)
    first = next(iterator)
    rest, kind = _rest_and_its_type(iterator)
    return x * first + rest, kind


def test_a_list_iterator_passed_to_python_at_a_break_is_the_lists_own_advanced_as_far():
    x, items = torch.randn(3), [1.0, 2.0, 3.0]
    compiled, _ = _compile(passes_a_list_iterator_on)
    report = _eager_frames_and_breaks(lambda: compiled(x, items))
    assert not report.eager_frames, report.eager_frames
    result, kind = compiled(x, items)
    torch.testing.assert_close(result, x * 1.0 + 5.0)
    assert kind == "list_iteratorTrue"


def item_of_each_row(x):
    return [row.sum().item() for row in x * 2]  # 3.11: the comprehension is called with iter(x * 2)


def passes_a_tensor_iterator_on(x):
    iterator = iter(x * 2)
    first = next(iterator)
    x.mul_(10)  # eager's rows are views of x * 2 (unbind), not of x: untouched
    rest, kind = _rest_and_its_type(iterator)
    return first + rest, kind


def test_an_iterator_over_a_tensors_rows_passed_to_python_at_a_break():
    """iter(tensor) is iter(tensor.unbind(0)), a tuple computed at once: the rows the trace has not taken are
    rebuilt as that tuple's iterator (it ran the frame eagerly: 'passing on an iterator over computed items')."""
    x = torch.randn(3, 2)
    _check_compiled(item_of_each_row, x, max_graphs=2, max_breaks=1)
    compiled, _ = _compile(passes_a_tensor_iterator_on)
    report = _eager_frames_and_breaks(lambda: compiled(x.clone()))
    assert not report.eager_frames, report.eager_frames
    got, want = compiled(x.clone()), passes_a_tensor_iterator_on(x.clone())
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == "tuple_iteratorTrue"


def formats_tensors_into_text(x):
    fields = f"{x[0]:.3f}|{x[1] > 0}|{x[0]!r}"  # each field a break (FORMAT_VALUE with a spec, plain, !r)
    percent = "%s" % (x[0] > 0)  # a silent wrong answer: the trace formatted its fake tensor ('FakeTensor(...)')
    return x * len(fields), fields, percent


def test_text_made_from_tensors_breaks_and_is_eagers():
    """An f-string field or a `%` of a tensor needs the tensor's values: a break formats it in Python. The
    f-string ran the whole frame eagerly ('... is not a constant here'); `"%s" % t` gave the fake tensor's text."""
    x = torch.tensor([0.25, -2.0])
    compiled, _ = _compile(formats_tensors_into_text)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    assert not report.eager_frames, report.eager_frames
    got, want = compiled(x), formats_tensors_into_text(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == ("0.250|False|tensor(0.2500)", "tensor(True)"), got[1:]


def drops_a_generator_with_cleanup_at_a_break(x):
    def produce():
        try:
            yield x + 1
            yield x + 2
        finally:
            GENERATOR_LOG.append("closed")

    values = produce()
    first = next(values)
    GENERATOR_LOG.append(os.getpid() > 0)  # a break; `values` is dead after it, but Python closes it only at return
    return first * 2


def test_a_generator_dropped_at_a_break_inside_try_finally_still_runs_its_cleanup_in_order():
    x = torch.randn(3)
    GENERATOR_LOG.clear()
    expected = drops_a_generator_with_cleanup_at_a_break(x)
    assert GENERATOR_LOG == [True, "closed"]
    compiled, _ = _compile(drops_a_generator_with_cleanup_at_a_break)
    GENERATOR_LOG.clear()
    torch.testing.assert_close(compiled(x), expected)
    assert GENERATOR_LOG == [True, "closed"]  # the frame runs eagerly rather than lose the `finally`


def delegates_across_a_break(x):
    def inner():
        GENERATOR_LOG.append("inner")
        got = yield x + 1
        GENERATOR_LOG.append(("inner got", got))
        yield x + 2
        return 7

    def outer():
        result = yield from inner()
        GENERATOR_LOG.append(("result", result))
        yield x * 3

    values = outer()
    first = next(values)
    scale = first.sum().item()  # a break inside `yield from`: both generators are rebuilt, the delegate first
    second = values.send(scale)
    return first + second + next(values)


def test_a_generator_suspended_in_yield_from_is_rebuilt_with_its_delegate():
    _check_compiled(delegates_across_a_break, torch.randn(3), max_graphs=2, max_breaks=1)


def catches_what_is_thrown(x):
    def produce():
        while True:
            try:
                yield x + 1
            except ValueError as error:
                GENERATOR_LOG.append(("caught", str(error)))
                yield x * 0

    values = produce()
    first = next(values)
    return first + _throw_value_error(values)


def _throw_value_error(generator):
    return generator.throw(ValueError(f"pid {os.getpid() > 0}"))  # a break: the caller passes the generator on


def test_throw_into_a_rebuilt_generator_reaches_the_handler_around_its_yield():
    # breaks: the call of the helper, its getpid, its throw into the (real) generator it was given
    _check_compiled(catches_what_is_thrown, torch.randn(3), max_graphs=3, max_breaks=3)


def test_a_break_inside_record_function_resumes():
    """A profiler range is dropped by the trace (as Dynamo drops it), so a break inside its block resumes
    like one inside a nullcontext, instead of running the frame eagerly."""
    def program(x):
        with torch.autograd.profiler.record_function("region"):
            y = x.sin()
            scale = y.abs().max().item()  # a break
            z = y * scale
        return z.cos()

    x = torch.randn(5)
    report = kiln.explain(program, x)
    assert not report.eager_frames and len(report.breaks) == 1 and report.graph_count == 2
    torch.testing.assert_close(kiln.compile(program)(x), program(x))
