"""The dispatcher's contract: guards, recompiles and their log, the recompile limit,
eager fallback, fullgraph errors, and the kiln.compile integration."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln.backend import graph_compiler
from kiln.frontend import RECOMPILE_LIMIT, FullgraphError, compile_function


def _counting():
    graphs = []
    rung = graph_compiler("eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return rung(gm, example_inputs)

    return graphs, backend


def scale_by(x, factor):
    return x * factor


def test_guard_returns_first_failing_reason():
    compiled = compile_function(scale_by, _counting()[1])
    compiled(torch.randn(2, 3), 2)
    guard = compiled.entries[0].guard
    assert guard(torch.randn(2, 3), 2) is None
    assert "changed from 2" in guard(torch.randn(2, 3), 3)
    assert "tensor metadata changed" in guard(torch.randn(5, 3), 2)
    with torch.no_grad():
        assert "grad mode" in guard(torch.randn(2, 3), 2)


def test_recompile_is_logged_with_reason(caplog):
    compiled = compile_function(scale_by, _counting()[1])
    compiled(torch.randn(2, 3), 2)
    with kiln.config.patch(logs="recompiles"), caplog.at_level(logging.WARNING, logger="kiln"):
        compiled(torch.randn(2, 3), 5)
    assert any("recompiling" in record.message and "changed from 2" in record.message for record in caplog.records)


def test_recompile_limit_then_eager_with_one_warning(caplog):
    graphs, backend = _counting()
    compiled = compile_function(scale_by, backend, dynamic=False)  # else the factor becomes a graph input
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for factor in range(RECOMPILE_LIMIT + 4):
            torch.testing.assert_close(compiled(torch.ones(2), factor), torch.ones(2) * factor)
    assert len(graphs) == RECOMPILE_LIMIT == len(compiled.entries)
    assert sum("recompile limit" in record.message for record in caplog.records) == 1


def data_dependent(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def test_unsupported_frame_runs_eagerly_without_retracing():
    graphs, backend = _counting()
    compiled = compile_function(data_dependent, backend)
    x = torch.randn(4)
    with kiln.config.patch(graph_breaks=False):
        torch.testing.assert_close(compiled(x), data_dependent(x))
        torch.testing.assert_close(compiled(-x.abs()), data_dependent(-x.abs()))
    assert graphs == [] and len(compiled.entries) == 1
    assert "data" in compiled.entries[0].eager_reason


def test_a_data_dependent_branch_breaks_the_graph_and_each_side_resumes_compiled():
    graphs, backend = _counting()
    compiled = compile_function(data_dependent, backend)
    x = torch.randn(4).abs() + 0.1
    torch.testing.assert_close(compiled(x), data_dependent(x))
    torch.testing.assert_close(compiled(-x), data_dependent(-x))
    torch.testing.assert_close(compiled(x * 2), data_dependent(x * 2))
    assert len(compiled.entries) == 1 and compiled.entries[0].eager_reason is None
    # The condition's graph, then one resume function per side of the branch (compiled once each).
    assert len(graphs) == 3


def test_fullgraph_error_names_construct_and_line():
    compiled = compile_function(data_dependent, _counting()[1], fullgraph=True)
    with pytest.raises(FullgraphError) as raised:
        compiled(torch.randn(4))
    message = str(raised.value)
    assert "truth value" in message and f"{__file__}:" in message and "data_dependent" in message


def prints(x):
    print("side effect", x)  # a tensor's value in Python: no graph breaks, so the frame runs eagerly
    return x + 1


def test_fullgraph_error_for_print():
    with pytest.raises(FullgraphError, match=r"print\(\)"):
        compile_function(prints, _counting()[1], fullgraph=True)(torch.randn(2))


def test_kiln_compile_uses_the_frontend_when_configured():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
    x = torch.randn(2, 3)
    with kiln.config.patch(frontend="kiln"):
        compiled_model = kiln.compile(model, backend="aot_eager")
        compiled_fn = kiln.compile(scale_by, backend="eager")
    torch.testing.assert_close(compiled_model(x), model(x))
    torch.testing.assert_close(compiled_fn(x, 3), x * 3)
    assert type(compiled_fn).__name__ == "Dispatcher"


def test_module_hook_added_later_recompiles():
    graphs, backend = _counting()
    model = torch.nn.Linear(3, 3)
    compiled = compile_function(model, backend)
    x = torch.randn(2, 3)
    compiled(x)
    handle = model.register_forward_hook(lambda module, inputs, output: output * 0)
    torch.testing.assert_close(compiled(x), torch.zeros(2, 3))
    handle.remove()
    torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 2


def test_parameter_values_are_inputs_not_guards():
    graphs, backend = _counting()
    model = torch.nn.Linear(3, 3)
    compiled = compile_function(model, backend)
    x = torch.randn(2, 3)
    compiled(x)
    with torch.no_grad():
        model.weight.mul_(2)
    torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 1


def test_unsupported_frame_warns_once_with_reason_and_line(caplog):
    compiled = compile_function(prints, _counting()[1])
    with caplog.at_level(logging.WARNING, logger="kiln"), kiln.config.patch(graph_breaks=False):
        compiled(torch.randn(2))
        compiled(torch.randn(2))
    warnings = [record.message for record in caplog.records if "runs eagerly" in record.message]
    assert len(warnings) == 1
    assert "print()" in warnings[0] and f"{__file__}:" in warnings[0]


def test_strict_mode_raises_instead_of_running_eagerly():
    compiled = compile_function(prints, _counting()[1])
    with kiln.config.patch(strict=True), pytest.raises(FullgraphError, match="strict mode"):
        compiled(torch.randn(2))


def test_frontend_bug_runs_eagerly_never_breaks_user_code(monkeypatch, caplog):
    from kiln.frontend import interpreter

    def broken(self, instruction):
        raise KeyError("injected frontend bug")

    monkeypatch.setattr(interpreter.Frame, "BINARY_OP", broken)
    compiled = compile_function(scale_by, _counting()[1])
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        torch.testing.assert_close(compiled(x, 2), x * 2)
    assert "injected frontend bug" in compiled.entries[0].eager_reason
    assert any("runs eagerly" in record.message for record in caplog.records)
    with pytest.raises(FullgraphError, match="injected frontend bug"):
        compile_function(scale_by, _counting()[1], fullgraph=True)(x, 2)


def test_callable_objects_and_partials_are_compiled():
    import functools

    class AddOne:
        def __call__(self, x):
            return x + 1

    graphs, backend = _counting()
    x = torch.randn(3)
    torch.testing.assert_close(compile_function(AddOne(), backend)(x), x + 1)
    torch.testing.assert_close(compile_function(functools.partial(scale_by, factor=3), backend)(x), x * 3)
    assert len(graphs) == 2


def test_default_frontend_is_kiln_and_dynamo_stays_selectable():
    from kiln.config import OPTIONS

    x = torch.randn(3)
    assert next(option for option in OPTIONS if option.name == "frontend").default == "kiln"
    with kiln.config.patch(frontend="kiln"):
        assert type(kiln.compile(scale_by, backend="eager")).__name__ == "Dispatcher"
    with kiln.config.patch(frontend="dynamo"):
        torch._dynamo.reset()
        compiled = kiln.compile(scale_by, backend="eager")
        assert type(compiled).__name__ != "Dispatcher"
        torch.testing.assert_close(compiled(x, 2), x * 2)
    # dynamic=True (shape-generic graphs from the start) is kiln's frontend too (test_dynamic_shapes.py).
    with kiln.config.patch(frontend="kiln"):
        assert type(kiln.compile(scale_by, backend="eager", dynamic=True)).__name__ == "Dispatcher"


def _class_with_compiled_methods():
    class WithCompiledMethods(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        @kiln.compile(backend="eager")
        def forward(self, x):
            return self.linear(x).relu()

        @kiln.compile(backend="eager")
        @staticmethod
        def shift(x):
            return x + 1

    return WithCompiledMethods


def test_compile_as_a_method_decorator_binds_like_a_function():
    with kiln.config.patch(frontend="kiln"):
        cls = _class_with_compiled_methods()
    model, x = cls(), torch.randn(2, 3)
    torch.testing.assert_close(model(x), model.linear(x).relu())
    torch.testing.assert_close(model.shift(x), x + 1)
    torch.testing.assert_close(cls.shift(x), x + 1)
    assert type(cls.__dict__["forward"]).__name__ == "Dispatcher"
    assert cls.__dict__["forward"].entries[0].eager_reason is None


class _Settings:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


def _uses_settings_text(x, settings):
    return x * 2 if f"{settings}" == "double" else x


def test_object_text_is_not_baked_into_a_trace():
    # str(settings) depends on an attribute the type guard alone would not watch: its class's __str__ is inlined,
    # so the attribute it reads is guarded and a change recompiles (before 2026-12-05 a graph break formatted it in
    # Python; before that the whole frame ran eagerly)
    compiled = compile_function(_uses_settings_text, _counting()[1])
    x = torch.ones(2)
    settings = _Settings("double")
    report = kiln.debug.explain.ExplainReport()
    with kiln.debug.explain._recording(report):
        torch.testing.assert_close(compiled(x, settings), x * 2)
    settings.name = "same"
    torch.testing.assert_close(compiled(x, settings), x)
    assert all(entry.eager_reason is None for entry in compiled.entries) and len(compiled.entries) == 2
    assert report.breaks == [], report.breaks


class _RemembersBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.batch = x.shape[0]
        return self.linear(x) * self.batch


def test_plain_module_attribute_stores_are_replayed_after_the_graph():
    graphs, backend = _counting()
    model = _RemembersBatch()
    compiled = compile_function(model, backend)
    for rows in (2, 2, 5):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(x), model.linear(x) * rows)
        assert model.batch == rows and "batch" in model.__dict__
    assert len(graphs) == 2 and all(entry.eager_reason is None for entry in compiled.entries)


class _StoresATensor(torch.nn.Module):
    def forward(self, x):
        self.cache = x * 2
        return self.cache + 1


def test_storing_a_tensor_on_a_module_runs_eagerly():
    model = _StoresATensor()
    compiled = compile_function(model, _counting()[1])
    x = torch.randn(3)
    with kiln.config.patch(graph_breaks=False):
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    torch.testing.assert_close(model.cache, x * 2)
    assert "only plain values" in compiled.entries[0].eager_reason


def test_storing_a_tensor_on_a_module_is_a_graph_break():
    model = _StoresATensor()
    compiled = compile_function(model, _counting()[1])
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    torch.testing.assert_close(model.cache, x * 2)
    assert compiled.entries[0].eager_reason is None


def _makes_a_linear(x):
    return torch.nn.Linear(3, 3)(x)


def test_creating_a_module_with_parameters_runs_eagerly_without_touching_the_rng():
    compiled = compile_function(_makes_a_linear, _counting()[1])
    x = torch.randn(2, 3)
    torch.manual_seed(0)
    expected = _makes_a_linear(x)
    torch.manual_seed(0)
    with kiln.config.patch(graph_breaks=False):
        torch.testing.assert_close(compiled(x), expected)  # the failed trace drew no random numbers
    assert "parameters or buffers" in compiled.entries[0].eager_reason


def test_creating_a_module_with_parameters_is_a_graph_break_drawing_eagers_random_numbers():
    compiled = compile_function(_makes_a_linear, _counting()[1])
    x = torch.randn(2, 3)
    torch.manual_seed(0)
    expected = _makes_a_linear(x)
    torch.manual_seed(0)
    torch.testing.assert_close(compiled(x), expected)  # the module is made once, in Python, at the break
    assert compiled.entries[0].eager_reason is None


@pytest.mark.parametrize("checker", ["torch", "python"])
def test_tensor_guards_notice_every_metadata_change(checker, monkeypatch):
    # One C++ check of all tensors when torch provides it, per-tensor Python lines otherwise.
    from kiln import _torch

    if checker == "python":
        monkeypatch.setattr(_torch, "tensor_metadata_checker", lambda tensors, names: None)
    model = torch.nn.Linear(3, 3)
    compiled = compile_function(model, _counting()[1])
    x = torch.randn(4, 3)
    compiled(x)
    guard = compiled.entries[0].guard
    assert ("__tensors.check(" in compiled.entries[0].guard_source) == (checker == "torch")
    assert guard(model, x) is None and guard(model, torch.randn(4, 3)) is None
    changed = [x.double(), torch.randn(5, 3), torch.randn(3, 4).t(), x.clone().requires_grad_(),
               torch.nn.Parameter(x.clone()), "not a tensor"]
    for value in changed:
        assert guard(model, value) is not None, value
    with torch.no_grad():
        model.weight.data = model.weight.data.double()
    assert "weight" in guard(model, x)
