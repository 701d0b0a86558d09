"""Tensors as dict keys, by identity as Python hashes them (containers.tensor_key): an outside tensor looking up,
testing or inserting into a dict the trace built or an outside one (an optimizer's `state[p]`, a
`collections.defaultdict(dict)` whose missing-key insertion is replayed after the graph), iteration over a dict
keyed by tensors, and the guards that see a new key, a replaced tensor or two keys that became one tensor. A tensor
the trace computed stays refused, with its reason. Also the two tensor-valued scalars torch.optim passes while
compiling (`addcdiv_(..., value=t)`, `_foreach_addcdiv_(..., scalars)`), decomposed into graph ops."""
from __future__ import annotations

import collections
import logging

import pytest
import torch

import kiln
from kiln.backend import graph_compiler
from kiln.frontend import FullgraphError, compile_function


def _compiled(fn):
    return compile_function(fn, graph_compiler("aot_eager"))


def _captured(compiled, entries: int) -> None:
    """`entries` cache entries, each a captured graph (nothing ran eagerly)."""
    assert len(compiled.entries) == entries
    assert all(entry.eager_reason is None and entry.graph_module is not None for entry in compiled.entries)


class TinyOptimizer:
    """The shape of torch.optim's state handling: `state[p]` of a defaultdict(dict), filled on first use."""

    def __init__(self, params):
        self.params = params
        self.state = collections.defaultdict(dict)

    def step(self):
        for p in self.params:
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0)
                state["avg"] = torch.zeros_like(p)
            state["step"] += 1
            state["avg"].mul_(0.5).add_(p)
        return self.params[0] * 2


def _optimizers():
    params = [torch.randn(3), torch.randn(2, 2)]
    return TinyOptimizer(params), TinyOptimizer([p.clone() for p in params])


def _assert_same_state(compiled: TinyOptimizer, eager: TinyOptimizer) -> None:
    """The same entries in the same order (compiled's keyed by its own tensors, as eager's are by its own)."""
    assert len(compiled.state) == len(eager.state)
    for got, want in zip(compiled.state.values(), eager.state.values()):
        assert list(got) == list(want)
        for name in got:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


def test_defaultdict_state_is_filled_then_read_like_eager():
    optimizer, eager = _optimizers()
    step = _compiled(optimizer.step)
    with kiln.config.patch(strict=True):
        for call in range(4):
            torch.testing.assert_close(step(), eager.step())
            _assert_same_state(optimizer, eager)
            assert all(key is p for key, p in zip(optimizer.state, optimizer.params))
    _captured(step, 2)  # the first step fills the state, every later one reads it: one recompile
    assert type(optimizer.state) is collections.defaultdict and optimizer.state.default_factory is dict


def test_a_new_key_or_a_replaced_tensor_recompiles():
    optimizer, eager = _optimizers()
    step = _compiled(optimizer.step)
    with kiln.config.patch(strict=True):
        step(), eager.step()
        step(), eager.step()
        replacement = torch.randn(3)  # same metadata, another object: not a key of the state
        optimizer.params[0], eager.params[0] = replacement, replacement.clone()
        torch.testing.assert_close(step(), eager.step())
        _assert_same_state(optimizer, eager)
        assert len(optimizer.state) == 3 and list(optimizer.state)[2] is replacement
        assert len(step.entries) == 3
        optimizer.state.pop(optimizer.params[1])  # a key lost: filled again
        eager.state.pop(eager.params[1])
        torch.testing.assert_close(step(), eager.step())
        _assert_same_state(optimizer, eager)
        assert optimizer.state[optimizer.params[1]]["step"].item() == 1.0


def test_two_keys_that_became_one_tensor_recompile():
    def count(table, a, b):
        table[a] = table.get(a, 0) + 1
        table[b] = table.get(b, 0) + 1
        return a + b

    compiled = _compiled(count)
    x, y = torch.randn(2), torch.randn(2)
    table, eager_table = {}, {}
    with kiln.config.patch(strict=True):
        compiled(table, x, y)
        count(eager_table, x, y)
        assert [table[x], table[y]] == [1, 1]
        table.clear(), eager_table.clear()
        torch.testing.assert_close(compiled(table, x, x), count(eager_table, x, x))
    assert list(table) == [x] and table[x] == 2 == eager_table[x]
    assert len(compiled.entries) == 2


def test_lookup_contains_and_get_on_an_outside_dict():
    def scaled(x, weights, scales):
        total = x
        for w in weights:
            if w in scales:
                total = total + w * scales[w]
            total = total + scales.get(w, 0.5)
        return total

    compiled = _compiled(scaled)
    weights = [torch.randn(3), torch.randn(3)]
    scales = {weights[0]: 2.0}
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x, weights, scales), scaled(x, weights, scales))
        torch.testing.assert_close(compiled(x, weights, scales), scaled(x, weights, scales))
        _captured(compiled, 1)
        scales[weights[1]] = 3.0  # a new key
        torch.testing.assert_close(compiled(x, weights, scales), scaled(x, weights, scales))
        scales[weights[0]] = 4.0  # a value, guarded as read
        torch.testing.assert_close(compiled(x, weights, scales), scaled(x, weights, scales))
    _captured(compiled, 3)


def test_iterating_a_dict_keyed_by_tensors():
    def weighted(x, state):
        total = x.sum()
        for p, entry in state.items():
            total = total + (p * entry["avg"]).sum()
        return total, len(state)

    compiled = _compiled(weighted)
    params = [torch.randn(3), torch.randn(3)]
    state = {p: {"avg": torch.randn(3)} for p in params}
    x = torch.randn(3)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x, state), weighted(x, state))
        other = {torch.randn(3): {"avg": torch.randn(3)} for _ in range(2)}  # other tensors, same layout
        torch.testing.assert_close(compiled(x, other), weighted(x, other))
        _captured(compiled, 1)
        state[torch.randn(3)] = {"avg": torch.randn(3)}  # one more key
        torch.testing.assert_close(compiled(x, state), weighted(x, state))
    _captured(compiled, 2)


def test_dict_built_in_the_trace_keyed_by_outside_tensors():
    def pair_up(a, b):
        table = {a: a * 2, b: b + 1}
        table[a] = table[a] + table[b]
        return table, b in table, len(table)

    compiled = _compiled(pair_up)
    a, b = torch.randn(2), torch.randn(2)
    with kiln.config.patch(strict=True):
        table, present, size = compiled(a, b)
    want, _, _ = pair_up(a, b)
    assert list(table) == [a, b] and present and size == 2
    torch.testing.assert_close(table[a], want[a])
    torch.testing.assert_close(table[b], want[b])


def test_a_computed_tensor_as_a_key_is_refused_with_its_reason():
    def keyed_by_computed(x):
        return {x + 1: 1}

    with pytest.raises(FullgraphError, match="a tensor the trace computed, used as a dict key"):
        compile_function(keyed_by_computed, graph_compiler("aot_eager"), fullgraph=True)(torch.randn(2))


def test_a_replaced_default_factory_recompiles():
    def fill(table, key):
        return table[key]

    compiled = _compiled(fill)
    key = torch.randn(2)
    with kiln.config.patch(strict=True):
        assert compiled(collections.defaultdict(dict), key) == {}
        assert compiled(collections.defaultdict(list), key) == []
    assert len(compiled.entries) == 2


def test_tensor_valued_step_sizes_stay_in_the_graph():
    def update(param, avg, denom, step_size, params, avgs, denoms):
        param.addcdiv_(avg, denom, value=-step_size)
        torch._foreach_addcdiv_(params, avgs, denoms, torch.stack([step_size, step_size * 2]))
        return param

    def arguments():
        torch.manual_seed(0)
        tensors = [torch.randn(4), torch.randn(4), torch.rand(4) + 1, torch.tensor(0.1)]
        return tensors + [[torch.randn(3), torch.randn(2)], [torch.randn(3), torch.randn(2)],
                          [torch.rand(3) + 1, torch.rand(2) + 1]]

    compiled = _compiled(update)
    got, want = arguments(), arguments()
    with kiln.config.patch(strict=True):
        compiled(*got)
    update(*want)
    _captured(compiled, 1)
    torch.testing.assert_close(got, want)


def test_an_optimizers_step_count_is_read_as_a_double_precision_number():
    """torch.optim's `_get_value(step)` is `step.item()` eagerly: the bias correction is double-precision arithmetic
    (float32's cancellation in `1 - 0.999 ** step` would cost 1e-4 relative), rounded to float32 where it meets x."""
    from torch.optim.optimizer import _get_value

    def corrected(x, step):
        return x / (1 - 0.999 ** _get_value(step)) ** 0.5

    compiled = _compiled(corrected)
    x, step = torch.randn(5), torch.tensor(3.0)
    with kiln.config.patch(strict=True):
        torch.testing.assert_close(compiled(x, step), corrected(x, step), rtol=0, atol=0)
    _captured(compiled, 1)


class _SizeAtEmit(logging.Handler):
    """Records how many entries `table` has when each record is emitted."""

    def __init__(self, table):
        super().__init__()
        self.table, self.sizes = table, []

    def emit(self, record):
        self.sizes.append(len(self.table))


_LOG = logging.getLogger("kiln.tests.tensor_keys")


def _fill_with_logs(table, a, b):
    _LOG.warning("before")
    table[a]["n"] = 1
    _LOG.warning("between")
    table[b]["n"] = 2
    return a + b


def test_defaultdict_insertions_are_replayed_in_program_order():
    a, b = torch.randn(2), torch.randn(2)
    sizes = []
    for run in (_fill_with_logs, _compiled(_fill_with_logs)):
        table = collections.defaultdict(dict)
        handler = _SizeAtEmit(table)
        _LOG.addHandler(handler)
        try:
            with kiln.config.patch(strict=True):
                run(table, a, b)
        finally:
            _LOG.removeHandler(handler)
        assert list(table) == [a, b] and [entry["n"] for entry in table.values()] == [1, 2]
        sizes.append(handler.sizes)
    assert sizes[0] == sizes[1] == [0, 1]
