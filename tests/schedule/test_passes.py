"""kiln/schedule/passes.py: each LoopIR pass on small hand-built bodies, then end to end on both CPU
backends (C++, and Triton under the interpreter): results bit-identical to eager's arithmetic and to
kiln without the passes, and the Triton source computing a repeated subexpression once."""
from __future__ import annotations

from unittest import mock

import pytest
import sympy
import torch

import kiln
from kiln.backend import compile_graph
from kiln.ir import Body, Buffer, Graph, Layout, Pointwise, Reduction
from kiln.ir.indexing import range_vars
from kiln.ir.printer import format_body
from kiln.schedule import passes
from kiln.ir.kernel import Kernel, ScheduledGraph
from tests.golden.capture import record_graphs

I0, I1 = range_vars(2)
R0 = range_vars(1, "r")[0]


def _buffer(name, dtype=torch.float32, size=(4, 8)):
    size = tuple(sympy.Integer(s) for s in size)
    stride = tuple(sympy.Integer(s) for s in ([size[1], 1] if len(size) == 2 else [1]))
    return Buffer(name, torch.device("cpu"), dtype, Layout(size, stride))


def _scheduled(*nodes, buffers, col_ranges=()):
    """One kernel over rows [4] (x [8] columns for pointwise nodes) holding `nodes`."""
    roles = ["reduction" if node.is_reduction else "row" if col_ranges else "full" for node in nodes]
    row = [4] if col_ranges else [4, 8]
    kernel = Kernel("k0", row, list(col_ranges), list(nodes), roles)
    return ScheduledGraph(Graph(buffers={b.name: b for b in buffers}), [kernel])


def _ops(scheduled, position=0):
    return [op.name for op in scheduled.kernels[0].nodes[position].body.ops]


def test_cse_merges_duplicates_and_keeps_stores():
    x, out = _buffer("arg0"), _buffer("buf0")
    body = Body()
    first, second = body.load(x, [I0, I1]), body.load(x, [I0, I1])
    sines = [body.emit("sin", (value,), torch.float32) for value in (first, second)]
    total = body.emit("add", tuple(sines), torch.float32)
    body.store(out, [I0, I1], total)
    body.store(out, [I0, I1], total)
    scheduled = _scheduled(Pointwise("node0", [4, 8], body, ["buf0"]), buffers=[x, out])
    result = passes.eliminate_common_subexpressions(scheduled)
    assert format_body(result.kernels[0].nodes[0].body, indent="") == [
        "%0 = load arg0[i0, i1] : f32", "%1 = sin %0 : f32", "%2 = add %1 %1 : f32",
        "store buf0[i0, i1] %2", "store buf0[i0, i1] %2"]
    assert len(body.ops) == 7, "the input graph is not changed"


def test_cse_renumbers_gathered_indices_and_merges_identical_checks():
    table, positions, out = _buffer("arg0"), _buffer("arg1", torch.int64), _buffer("buf0")
    body = Body()
    checks = [body.check_index(body.load(positions, [I0, I1]), sympy.Integer(4)) for _ in range(2)]
    gathered = [body.load(table, [body.indirect(check), I1]) for check in checks]
    body.store(out, [I0, I1], body.emit("add", tuple(gathered), torch.float32))
    scheduled = _scheduled(Pointwise("node0", [4, 8], body, ["buf0"]), buffers=[table, positions, out])
    result = passes.eliminate_common_subexpressions(scheduled)
    assert format_body(result.kernels[0].nodes[0].body, indent="") == [
        "%0 = load arg1[i0, i1] : i64", "%1 = check_index %0 4 : i64", "%2 = load arg0[ind1, i1] : f32",
        "%3 = add %2 %2 : f32", "store buf0[i0, i1] %3"]


def test_cse_keeps_apart_what_differs():
    """-0.0 and 0.0 compare equal in Python but are different constants; int and float attributes too."""
    out = _buffer("buf0")
    body = Body()
    zeros = [body.constant(0.0, torch.float32), body.constant(-0.0, torch.float32)]
    ones = [body.constant(1, torch.int64), body.constant(1.0, torch.int64), body.constant(True, torch.int64)]
    value = body.emit("sub", tuple(zeros), torch.float32)
    for one in ones:
        value = body.emit("add", (value, body.to_dtype(one, torch.float32)), torch.float32)
    body.store(out, [I0, I1], value)
    scheduled = _scheduled(Pointwise("node0", [4, 8], body, ["buf0"]), buffers=[out])
    assert passes.eliminate_common_subexpressions(scheduled).kernels[0].nodes[0].body is body


def test_cse_keeps_loads_that_may_see_a_later_store_and_values_across_a_reduce():
    """Node 0 reads buf1 (node 1 writes it later in the kernel) twice: both loads stay. Node 1 reads
    buf0 (node 0 wrote it) twice: merged. A row value loaded before and after the reduce: both stay
    (the first lives in the column loop)."""
    x, acc, mid = _buffer("arg0"), _buffer("buf0", size=(4,)), _buffer("buf1", size=(4,))
    reduction = Body()
    before, again = reduction.load(mid, [I0]), reduction.load(mid, [I0])
    row = reduction.load(x, [I0, sympy.Integer(0)])
    column = reduction.emit("mul", (reduction.load(x, [I0, R0]), row), torch.float32)
    summed = reduction.emit("reduce", (reduction.emit("add", (column, before), torch.float32),), torch.float32,
                            attr="sum")
    after = reduction.load(x, [I0, sympy.Integer(0)])
    total = reduction.emit("add", (reduction.emit("add", (summed, again), torch.float32), after), torch.float32)
    reduction.store(acc, [I0], total)
    reader = Body()
    loaded = [reader.load(acc, [I0]) for _ in range(2)]
    reader.store(mid, [I0], reader.emit("add", tuple(loaded), torch.float32))
    nodes = (Reduction("node0", [4], reduction, ["buf0"], [8]), Pointwise("node1", [4], reader, ["buf1"]))
    scheduled = _scheduled(*nodes, buffers=[x, acc, mid], col_ranges=[8])
    result = passes.eliminate_common_subexpressions(scheduled)
    assert result.kernels[0].nodes[0].body is reduction
    assert _ops(result, 1) == ["load", "add", "store"]


def _pow_body(dtype, exponents, extra_use=False):
    x, out = _buffer("arg0", dtype), _buffer("buf0", dtype)
    body = Body()
    base = body.load(x, [I0, I1])
    value = None
    for exponent in exponents:
        constant = body.constant(exponent, dtype)
        power = body.emit("pow", (base, constant), dtype)
        value = power if value is None else body.emit("add", (value, power), dtype)
    if extra_use:
        value = body.emit("add", (value, constant), dtype)
    body.store(out, [I0, I1], value)
    return _scheduled(Pointwise("node0", [4, 8], body, ["buf0"]), buffers=[x, out])


def test_reduce_strength_squares_and_cubes_by_multiplying():
    result = passes.reduce_strength(_pow_body(torch.float32, [2.0, 3]))
    assert format_body(result.kernels[0].nodes[0].body, indent="") == [
        "%0 = load arg0[i0, i1] : f32", "%1 = mul %0 %0 : f32", "%2 = mul %0 %0 : f32", "%3 = mul %2 %0 : f32",
        "%4 = add %1 %3 : f32", "store buf0[i0, i1] %4"]
    # CSE after it shares the square: the pipeline's order
    assert _ops(passes.optimize(_pow_body(torch.float32, [2.0, 3]))) == ["load", "mul", "mul", "add", "store"]


def test_reduce_strength_keeps_a_constant_still_used_and_leaves_other_pows():
    assert _ops(passes.reduce_strength(_pow_body(torch.float64, [2.0], extra_use=True))) == [
        "load", "constant", "mul", "add", "store"]
    unchanged = [_pow_body(torch.float32, [2.5]), _pow_body(torch.float32, [-2.0]), _pow_body(torch.int64, [2])]
    for scheduled in unchanged:
        assert passes.reduce_strength(scheduled).kernels[0].nodes[0].body is scheduled.kernels[0].nodes[0].body


def test_reduce_strength_multiplies_a_low_precision_pow_in_float_and_rounds_once():
    result = passes.reduce_strength(_pow_body(torch.bfloat16, [3.0]))
    assert format_body(result.kernels[0].nodes[0].body, indent="") == [
        "%0 = load arg0[i0, i1] : bf16", "%1 = to_dtype %0 : f32", "%2 = mul %1 %1 : f32", "%3 = mul %2 %1 : f32",
        "%4 = to_dtype %3 : bf16", "store buf0[i0, i1] %4"]


def _compile(fn, inputs, backend, with_passes=True):
    with kiln.config.patch(strict=True, cpu_backend=backend), \
            mock.patch.object(passes, "PASSES", passes.PASSES if with_passes else ()):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        return compiled, compiled(*inputs)


def _random(shape, dtype):
    """Random values, never zero (a zero hides a wrong sign or a wrong factor)."""
    values = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3
    return torch.where(values == 0, 1.0, values).to(dtype)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("exponent", [2.0, 3.0])
def test_pow_by_a_constant_tensor_is_atens_arithmetic(backend, dtype, exponent):
    """pow(x, full([], 3.0)): the exponent is a constant only once inlined. kiln multiplies, bit for bit
    what ATen's pow(x, 3.0) computes (x * x * x); bf16 math runs in float32, rounded once at the end."""
    x = _random((300,), dtype)

    def f(x):
        wide = x.float() if dtype == torch.bfloat16 else x
        return (torch.pow(wide, torch.full([], exponent, dtype=wide.dtype)).to(dtype),)

    compiled, (got,) = _compile(f, [x], backend)
    wide = x.float() if dtype == torch.bfloat16 else x
    torch.testing.assert_close(got, wide.pow(exponent).to(dtype), rtol=0, atol=0)
    ops = [op.name for kernel in compiled.scheduled.kernels for node in kernel.nodes for op in node.body.ops]
    assert "pow" not in ops and "mul" in ops, ops


def _layers(x, w):
    y = torch.sin(x)
    z = torch.nn.functional.gelu(x * w, approximate="tanh")
    normed = torch.nn.functional.layer_norm(x, (x.shape[-1],), w[0])
    return (y * y + torch.exp(y), torch.softmax(z, -1), normed * normed, torch.gather(x, 1, (w.abs() * 4).long() % 8))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_are_bit_identical_without_the_passes(backend, dtype):
    inputs = [_random((8, 64), dtype), _random((8, 64), dtype)]
    _, optimized = _compile(_layers, inputs, backend)
    _, plain = _compile(_layers, inputs, backend, with_passes=False)
    for got, want in zip(optimized, plain):
        assert torch.equal(got, want)


def test_triton_computes_a_repeated_subexpression_once_and_every_pass_is_dumped():
    def f(x):
        y = torch.sin(x)  # inlined into the sum three times
        return (y * y + torch.exp(y),)

    with record_graphs("triton") as graphs:
        _compile(f, [_random((300,), torch.float32)], "triton")
    (graph,) = graphs
    (source,) = graph.kernels().values()
    assert source.count("libdevice.sin(") == 1, source
    assert {"loopir_after_reduce_strength.txt", "loopir_after_cse.txt"} <= set(graph.files)
    assert graph.files["loopir_after_cse.txt"].count(" sin ") == 1
    assert graph.files["loopir_after_fusion.txt"].count(" sin ") == 3


def test_loop_variables_annotate_each_value_and_print_in_the_dump():
    """A reduction kernel over rows [4] x columns [8]: the row load varies with x0 only, the column
    load and what it feeds with x0 and r0, the constant with nothing, the reduce with the row; a
    gathered load varies with what its position does."""
    x, positions, out = _buffer("arg0"), _buffer("arg1", torch.int64, size=(4,)), _buffer("buf0", size=(4,))
    body = Body()
    scale = body.constant(2.0, torch.float32)
    row = body.load(x, [I0, sympy.Integer(0)])
    position = body.check_index(body.load(positions, [I0]), sympy.Integer(8))
    gathered = body.load(x, [body.indirect(position), R0])
    column = body.emit("mul", (body.emit("mul", (body.load(x, [I0, R0]), scale), torch.float32), gathered),
                       torch.float32)
    summed = body.emit("reduce", (body.emit("add", (column, row), torch.float32),), torch.float32, attr="sum")
    body.store(out, [I0], summed)
    scheduled = passes.optimize(_scheduled(Reduction("node0", [4], body, ["buf0"], [8]),
                                           buffers=[x, positions, out], col_ranges=[8]))
    (kernel,) = scheduled.kernels
    assert [sorted(names) for names in kernel.op_loop_variables[0]] == [
        [], ["x0"], ["x0"], ["x0"], ["r0", "x0"], ["r0", "x0"], ["r0", "x0"], ["r0", "x0"], ["r0", "x0"],
        ["x0"], ["x0"]]
    text = scheduled.format()
    assert "%0 = constant 2.0 : f32  @ -" in text and "%4 = load arg0[ind3, r0] : f32  @ x0 r0" in text, text
    assert passes.eliminate_common_subexpressions(scheduled).kernels[0].op_loop_variables == [], \
        "a pass that rewrites bodies drops the annotation of the old ones"
