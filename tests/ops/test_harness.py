"""Tests of the sweep's own machinery: graph building, classification, isolation, the table.

They use the aot_eager rung (no kiln codegen) and deliberately broken backends, so they
check the harness, not kiln.
"""
from __future__ import annotations

import ctypes
import time
import types

import torch

from tests.ops import report
from tests.ops.harness import (Case, Outcome, build_graph, find_opinfo, generate_samples, graph_compiler,
                               kernel_stats, run_case, run_sample)
from tests.ops.workers import run_pool


def _outcomes(results) -> set:
    return {result.outcome for result in results}


def test_aot_eager_runs_lists_tuples_and_kwargs():
    for case in [Case("add", "", "float32"), Case("cat", "", "bfloat16"),          # list of tensors
                 Case("max", "reduction_with_dim", "float32"),                       # (values, indices)
                 Case("nn.functional.layer_norm", "", "float32")]:                   # kwargs
        results = run_case(case, backend="aot_eager", max_samples=4)
        assert _outcomes(results) == {Outcome.PASS}, (case, results)


def test_graph_has_one_placeholder_per_distinct_tensor():
    op = find_opinfo("add", "")
    x = torch.randn(3)
    sample = type("Sample", (), {"input": x, "args": (x,), "kwargs": {"alpha": 2}})()
    graph = build_graph(op, sample, op.op(x, x, alpha=2))
    assert [node.op for node in graph.gm.graph.nodes] == ["placeholder", "call_function", "output"]
    assert torch.equal(graph.gm(x)[0], x + 2 * x)


def _perturbing_backend(gm, example_inputs):
    """aot_eager, then every floating output off by one part in a thousand."""
    compiled = graph_compiler("aot_eager")(gm, example_inputs)

    def run(*args):
        return [out * 1.001 if out.is_floating_point() else out for out in compiled(*args)]
    return run


def _input_copying_backend(gm, example_inputs):
    """Runs the graph on copies of its inputs, so a mutation of an input is lost."""
    return lambda *args: gm(*[arg.clone() for arg in args])


def _raising_backend(gm, example_inputs):
    raise NotImplementedError("no lowering for this op")


def _failing_at_runtime_backend(gm, example_inputs):
    def run(*args):
        raise RuntimeError("kernel launch failed")
    return run


def _sleeping_backend(gm, example_inputs):
    time.sleep(30)


def segfaulting_backend(gm, example_inputs):
    """Takes its worker process down, as a miscompiled kernel might."""
    ctypes.string_at(0)


def test_failures_are_classified():
    case = Case("mul", "", "float32")
    # mul's samples include an empty tensor, where any backend is right.
    assert _outcomes(run_case(case, backend=_perturbing_backend, max_samples=4)) == {Outcome.MISMATCH, Outcome.PASS}
    assert _outcomes(run_case(case, backend=_raising_backend, max_samples=2)) == {Outcome.COMPILE_ERROR}
    assert _outcomes(run_case(case, backend=_failing_at_runtime_backend, max_samples=2)) == {Outcome.RUNTIME_ERROR}
    assert _outcomes(run_case(case, backend=_sleeping_backend, max_samples=1, timeout=1)) == {Outcome.TIMEOUT}


def test_mutated_inputs_are_compared():
    # OpInfo's in-place entries clone first, so this op is made up: x.add_(1) returns x, mutated.
    add_in_place = types.SimpleNamespace(
        name="add_", variant_test_name="", op=lambda x: x.add_(1), has_nondeterministic_output=False,
        skip_correctness_check_compile_vs_eager=False, supported_dtypes=lambda device: {torch.float32, torch.float64})
    sample = types.SimpleNamespace(input=torch.randn(4), args=(), kwargs={})
    case = Case("add_", "", "float32")
    assert run_sample(add_in_place, sample, case, 0, backend="aot_eager").outcome == Outcome.PASS
    assert run_sample(add_in_place, sample, case, 0, backend=_input_copying_backend).outcome == Outcome.MISMATCH


def test_random_ops_compare_shapes_only():
    results = run_case(Case("bernoulli", "", "float32"), backend="aot_eager", max_samples=2)
    assert _outcomes(results) == {Outcome.PASS} and {result.check for result in results} == {"shape"}


def test_skips_are_not_failures():
    assert _outcomes(run_case(Case("item", "", "float32"), backend="aot_eager", max_samples=2)) == {
        Outcome.NO_TENSOR_OUTPUT}
    # cov's composite checks its weights with aten.equal: Dynamo graph-breaks there (torch 2.13)
    assert _outcomes(run_case(Case("cov", "", "float32"), backend="aot_eager", max_samples=2)) == {
        Outcome.DATA_DEPENDENT}


def _graph_as_captured(gm, example_inputs):
    """The captured graph, run as it is (the `eager` rung without kiln's config)."""
    return gm.forward


def test_data_dependent_graphs_that_dynamo_captures_are_compiled():
    # narrow with a tensor start: Dynamo hands the graph to the backend whole (the start an unbacked
    # SymInt), so a sample is compared, not skipped, and a backend that cannot trace it fails it.
    case = Case("narrow", "", "float32")
    samples = dict(generate_samples(find_opinfo("narrow", ""), case, None))
    tensor_start = [index for index, sample in samples.items() if isinstance(sample.args[1], torch.Tensor)]
    assert tensor_start
    sample, op = samples[tensor_start[0]], find_opinfo("narrow", "")
    assert run_sample(op, sample, case, tensor_start[0], backend=_graph_as_captured).outcome == Outcome.PASS
    untraceable = run_sample(op, sample, case, tensor_start[0], backend=_data_dependent_backend)
    assert untraceable.outcome == Outcome.COMPILE_ERROR and "Dynamo captures this graph whole" in untraceable.message


def _data_dependent_backend(gm, example_inputs):
    """Fails the way a fake-tensor trace fails on a tensor's value."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    raise DataDependentOutputException(torch.ops.aten._local_scalar_dense.default)


def test_kernel_stats_reads_what_kiln_reports():
    def compiled():
        pass
    assert kernel_stats(compiled) is None
    compiled.kernel_count, compiled.extern_count = 2, 1
    assert kernel_stats(compiled) == {"kernels": 2, "externs": 1}

    def wrapper():
        pass
    wrapper.__wrapped__ = compiled
    assert kernel_stats(wrapper) == {"kernels": 2, "externs": 1}


def test_pool_survives_a_crashing_sample():
    case = Case("add", "", "float32")
    (record,) = run_pool([case], backend="tests.ops.test_harness:segfaulting_backend", jobs=1,
                         max_samples=2, timeout=30)
    assert record.finished and [result.outcome for result in record.samples] == [Outcome.CRASH] * 2
    assert "SIGSEGV" in record.samples[0].message


def test_known_failures_update_is_a_merge(tmp_path):
    path = tmp_path / "known_failures.py"
    still_failing, now_passing, not_swept = [("op_a", "", "float32", "forward"), ("op_b", "", "float32", "forward"),
                                             ("op_d", "", "float32", "forward")]
    report.write_known_failures({still_failing: "hand-written reason", now_passing: "old", not_swept: "kept"}, path)

    def row(op, status, first_failure=""):
        return {"op": op, "variant": "", "dtype": "float32", "direction": "forward", "status": status,
                "first_failure": first_failure, "error": ""}
    sweep = {"meta": {"backend": "kiln"}, "cases": [
        row("op_a", "known failure", "mismatch (1/2 samples): off"), row("op_b", "unexpected pass"),
        row("op_c", "new failure", "compile error (2/2 samples): no lowering for aten.op_c")]}
    changes = report.update_known_failures(sweep, path)
    table = report.known_failures(path)
    assert table == {still_failing: "hand-written reason", not_swept: "kept",
                     ("op_c", "", "float32", "forward"): "compile error (2/2 samples): no lowering for aten.op_c"}
    assert changes["removed"] == [now_passing] and changes["kept"] == 1


class _DoubledGradient(torch.autograd.Function):
    """The identity, with a backward twice the true one."""

    @staticmethod
    def forward(ctx, value):
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def _wrong_gradient_backend(gm, example_inputs):
    """aot_eager's forward values, every floating output's gradient doubled."""
    compiled = graph_compiler("aot_eager")(gm, example_inputs)
    return lambda *args: [_DoubledGradient.apply(out) if out.requires_grad else out for out in compiled(*args)]


class _ShiftedGradient(torch.autograd.Function):
    """The identity, with a backward one more than the true one."""

    @staticmethod
    def forward(ctx, value):
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad + 1


def _shifted_input_gradient_backend(gm, example_inputs):
    """aot_eager's forward values, every floating input's gradient shifted by one."""
    compiled = graph_compiler("aot_eager")(gm, example_inputs)
    return lambda *args: compiled(*[_ShiftedGradient.apply(arg) if arg.requires_grad else arg for arg in args])


def _detaching_backend(gm, example_inputs):
    """aot_eager's values, but outputs cut from autograd."""
    compiled = graph_compiler("aot_eager")(gm, example_inputs)
    return lambda *args: [out.detach() for out in compiled(*args)]


def test_backward_direction_classifies_gradients():
    case = Case("mul", "", "float32", "backward")
    honest = run_case(case, backend="aot_eager", max_samples=2)
    compared = {result.index for result in honest if result.outcome == Outcome.PASS}
    assert compared and _outcomes(honest) <= {Outcome.PASS, Outcome.NO_GRADIENT}  # sample 0 is empty
    wrong = [result for result in run_case(case, backend=_wrong_gradient_backend, max_samples=2)
             if result.index in compared]
    assert _outcomes(wrong) == {Outcome.MISMATCH}
    assert all(result.message.startswith("gradient of input") for result in wrong), wrong
    detached = [result for result in run_case(case, backend=_detaching_backend, max_samples=2)
                if result.index in compared]
    assert _outcomes(detached) == {Outcome.MISMATCH} and "do not require grad" in detached[0].message
    # A zero gradient is a result too (floor's; a norm's subgradient at zero): it is compared.
    floor = Case("floor", "", "float32", "backward")
    assert _outcomes(run_case(floor, backend="aot_eager", max_samples=2)) == {Outcome.PASS}
    shifted = run_case(floor, backend=_shifted_input_gradient_backend, max_samples=2)
    assert _outcomes(shifted) == {Outcome.MISMATCH} and shifted[0].message.startswith("gradient of input")
