"""verify() and verify_scheduled(): each check fires on a hand-made malformed graph, naming the
problem, and every golden program's graphs pass at every stage of the pipeline."""
from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

import kiln
from kiln.ir import Body, Buffer, Graph, GraphInput, IRVerificationError, Layout, Pointwise, TensorArg, verify
from kiln.ir.indexing import range_vars
from kiln.ir.ops import OPS, SPECS, operand_counts
from kiln.schedule import verify_scheduled
from kiln.schedule.fusion import group_kernels
from tests.golden.capture import render_program
from tests.golden.programs import PROGRAMS

CPU = torch.device("cpu")
LAYOUT = Layout((4, 8), (8, 1))


def _buffer(name: str, dtype=torch.float32) -> Buffer:
    return Buffer(name, CPU, dtype, LAYOUT)


def _graph(compute, *, input_dtype=torch.float32, output_dtype=torch.float32) -> Graph:
    """One Pointwise node: out[i] = compute(body, load x[i]); its result stored as it is."""
    x, out = _buffer("arg0", input_dtype), _buffer("buf0", output_dtype)
    index = range_vars(2)
    body = Body()
    body.store(out, index, compute(body, body.load(x, index)))
    return Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={"arg0": x, "buf0": out},
                 nodes=[Pointwise("node0", [4, 8], body, ["buf0"])], outputs=[TensorArg("buf0", LAYOUT)])


def _rejects(graph: Graph, message: str) -> None:
    with pytest.raises(IRVerificationError, match=message):
        verify(graph, "lower")


def test_the_rules_come_from_the_op_table():
    assert operand_counts("add") == (2,) and operand_counts("exp") == (1,)
    assert operand_counts("where") == (3,) and operand_counts("load") == (0, 1)
    assert not set(OPS) & set(SPECS)


def test_a_wellformed_graph_passes():
    verify(_graph(lambda body, x: body.emit("sin", (x,), torch.float32)), "lower")


def test_wrong_arity():
    _rejects(_graph(lambda body, x: body.emit("add", (x,), torch.float32)),
             r"after lower: node0: %1 add: 1 operands, add takes 2")
    _rejects(_graph(lambda body, x: body.emit("where", (x, x), torch.float32)), r"%1 where: 2 operands, where takes 3")


def test_wrong_operand_dtype():
    _rejects(_graph(lambda body, x: body.emit("exp", (x,), torch.float16), input_dtype=torch.float16,
                    output_dtype=torch.float16), r"%1 exp: operand 0 is float16, float only \(exp\) does not take it")
    _rejects(_graph(lambda body, x: body.emit("left_shift", (x, x), torch.float32)),
             r"left_shift: operand 0 is float32")
    _rejects(_graph(lambda body, x: body.emit("add", (x, body.constant(1, torch.int64)), torch.float32)),
             r"%2 add: operands differ: float32, int64")


def test_wrong_result_dtype():
    _rejects(_graph(lambda body, x: body.emit("lt", (x, x), torch.float32)),
             r"%1 lt: result is float32, .* gives bool")
    _rejects(_graph(lambda body, x: body.emit("mul", (x, x), torch.float64)),
             r"%1 mul: result is float64, .* gives float32")


def test_where_needs_a_bool_condition_and_matching_branches():
    _rejects(_graph(lambda body, x: body.emit("where", (x, x, x), torch.float32)),
             r"%1 where: condition is float32, not bool")

    def mixed(body, x):
        condition = body.emit("gt", (x, x), torch.bool)
        return body.emit("where", (condition, x, body.constant(0, torch.int64)), torch.float32)

    _rejects(_graph(mixed), r"where: branches are float32 and int64, result float32")


def test_load_store_and_check_index_dtypes():
    _rejects(_graph(lambda body, x: x, output_dtype=torch.float16),
             r"store: stores a float32 value into a float16 buffer")

    def wrong_load(body, x):
        body.ops[x] = dataclasses.replace(body.ops[x], dtype=torch.float64)
        return body.to_dtype(x, torch.float32)

    _rejects(_graph(wrong_load), r"%0 load: result is float64 but the buffer holds float32")
    _rejects(_graph(lambda body, x: body.to_dtype(body.check_index(x, 4), torch.float32)),
             r"check_index: checks a float32 position, not an integer")


def test_reduce_and_getitem():
    def graph(kind: str, result_dtype, with_getitem: bool = False):
        x, out = _buffer("arg0"), Buffer("buf0", CPU, torch.float32, Layout((4,), (1,)))
        i0, r0 = sympy.Symbol("i0", integer=True, nonnegative=True), sympy.Symbol("r0", integer=True, nonnegative=True)
        body = Body()
        reduced = body.emit("reduce", (body.load(x, [i0, r0]),), result_dtype, attr=kind)
        value = body.emit("getitem", (reduced,), torch.float32, attr=0) if with_getitem else reduced
        body.store(out, [i0], body.to_dtype(value, torch.float32))
        node = Pointwise("node0", [4], body, ["buf0"], reduction_ranges=[8])
        return Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={"arg0": x, "buf0": out}, nodes=[node])

    verify(graph("sum", torch.float32))
    verify(graph("argmax", torch.int64))
    verify(graph("welford", torch.float32, with_getitem=True))
    _rejects(graph("argmax", torch.float32), r"reduce: argmax of float32 has result float32, not int64")
    _rejects(graph("sum", torch.float32, with_getitem=True), r"getitem: takes %1, not a welford reduce")
    _rejects(graph("median", torch.float32), r"unknown reduction 'median'")


def _scheduled():
    """Two pointwise nodes: node1 reads node0's buffer; in one kernel, buf0 stays in registers."""
    x, middle, out = _buffer("arg0"), _buffer("buf0"), _buffer("buf1")
    index = range_vars(2)
    first, second = Body(), Body()
    first.store(middle, index, first.emit("sin", (first.load(x, index),), torch.float32))
    second.store(out, index, second.emit("cos", (second.load(middle, index),), torch.float32))
    graph = Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={"arg0": x, "buf0": middle, "buf1": out},
                  nodes=[Pointwise("node0", [4, 8], first, ["buf0"]), Pointwise("node1", [4, 8], second, ["buf1"])],
                  outputs=[TensorArg("buf1", LAYOUT)])
    return group_kernels(graph)


def test_a_scheduled_graph_passes():
    scheduled = _scheduled()
    assert len(scheduled.kernels) == 1 and scheduled.kernels[0].local_buffers == {"buf0"}
    verify_scheduled(scheduled, "schedule")


def test_a_node_in_two_kernels():
    scheduled = _scheduled()
    kernel = scheduled.kernels[0]
    twin = dataclasses.replace(kernel, name="k1", nodes=kernel.nodes[1:], roles=kernel.roles[1:], local_buffers=set())
    scheduled.steps.append(twin)
    with pytest.raises(IRVerificationError, match=r"after schedule: node1 runs 2 times \(in k0, k1\), not once"):
        verify_scheduled(scheduled, "schedule")


def test_a_local_buffer_read_outside_its_kernel():
    scheduled = _scheduled()
    kernel = scheduled.kernels[0]
    scheduled.steps = [dataclasses.replace(kernel, nodes=kernel.nodes[:1], roles=kernel.roles[:1]),
                       dataclasses.replace(kernel, name="k1", nodes=kernel.nodes[1:], roles=kernel.roles[1:],
                                           local_buffers=set())]
    with pytest.raises(IRVerificationError, match=r"kernel k0: local buffers \['buf0'\] are read by k1"):
        verify_scheduled(scheduled, "schedule")


def test_kernel_order_respects_dependencies_and_roles_fit():
    scheduled = _scheduled()
    kernel = scheduled.kernels[0]
    scheduled.steps = [dataclasses.replace(kernel, nodes=kernel.nodes[::-1])]
    with pytest.raises(IRVerificationError, match=r"node1 reads local buffer buf0 before it is written"):
        verify_scheduled(scheduled)
    scheduled = _scheduled()
    scheduled.kernels[0].row_ranges = [sympy.Integer(5)]
    with pytest.raises(IRVerificationError, match=r"kernel k0: node0 has role 'full', but its ranges"):
        verify_scheduled(scheduled)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda program: program.name)
def test_golden_programs_verify_at_every_stage(program, monkeypatch):
    """Each golden program's graphs, after lowering, after split_reductions, after scheduling and after
    the LoopIR passes (kiln/backend.py `_check`)."""
    import kiln.backend

    checked = []
    check = kiln.backend._check

    def recording_check(stage, form):
        checked.append(stage)
        with kiln.config.patch(verify_ir=True):
            check(stage, form)

    monkeypatch.setattr(kiln.backend, "_check", recording_check)
    render_program(program, "cpp")
    assert checked and set(checked) == {"lower", "split_reductions", "schedule", "optimize"}
    assert len({checked.count(stage) for stage in set(checked)}) == 1  # each stage once per graph


def _broken_graph(graph: Graph) -> Graph:
    """`graph` with an output no node writes."""
    layout = graph.buffers[next(iter(graph.buffers))].layout
    graph.outputs.append(TensorArg("never_written", layout))
    return graph


def _broken_scheduled(scheduled):
    """`scheduled` with its first kernel run twice."""
    kernel = scheduled.kernels[0]
    scheduled.steps.append(dataclasses.replace(kernel, name=f"{kernel.name}_twin"))
    return scheduled


def _breaking(run, breaker):
    return lambda *args, **kwargs: breaker(run(*args, **kwargs))


@pytest.mark.parametrize("stage", ["lower", "split_reductions", "schedule", "optimize"])
def test_a_stage_that_makes_a_malformed_form_is_named(stage, monkeypatch):
    """The pipeline verifies each stage's form in one place (kiln/backend.py `_check`): a stage that
    breaks its form raises an IRVerificationError naming that stage, under config.verify_ir."""
    import kiln.backend
    import kiln.lowering
    import kiln.schedule
    import kiln.schedule.passes

    module, name, breaker = {
        "lower": (kiln.lowering, "lower_graph", _broken_graph),
        "split_reductions": (kiln.schedule, "split_reductions", _broken_graph),
        "schedule": (kiln.schedule, "schedule_graph", _broken_scheduled),
        "optimize": (kiln.schedule.passes, "optimize", _broken_scheduled),
    }[stage]
    monkeypatch.setattr(module, name, _breaking(getattr(module, name), breaker))
    x = torch.randn(4, 8)
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: (torch.sin(x) + 1,))(x)
    with kiln.config.patch(verify_ir=True, strict=True), pytest.raises(IRVerificationError, match=f"after {stage}: "):
        kiln.backend.compile_aten_graph(gm, [x])


def test_verification_follows_config_verify_ir():
    """`_check` verifies when config.verify_ir says so, and when it is unset, exactly under strict."""
    from kiln.backend import _check

    broken = _broken_graph(_graph(lambda body, x: x))
    for verify_ir, strict, checks in [(True, False, True), (False, True, False), (None, True, True), (None, False, False)]:
        with kiln.config.patch(verify_ir=verify_ir, strict=strict):
            if checks:
                with pytest.raises(IRVerificationError, match="after lower: output never_written is never written"):
                    _check("lower", broken)
            else:
                _check("lower", broken)
