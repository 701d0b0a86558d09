"""The memory plan (kiln/schedule/memory.py): frees after last use, outputs never freed, scratch
offsets shared only by buffers never live together, peak bytes; and the wrapper renders the plan."""
from __future__ import annotations

import pytest
import sympy
import torch

import kiln
import kiln.testing
from kiln.aot import aot_compile
from kiln.codegen.wrapper import generate_wrapper
from kiln.ir import Buffer, Extern, Graph, GraphInput, Layout, TensorArg
from kiln.lowering import lower_graph
from kiln.schedule import schedule_graph
from kiln.schedule.memory import EMPTY, HUGE, SCRATCH, plan_memory


def _scheduled(fn, *inputs):
    """`fn`'s forward graph, lowered and scheduled (nothing compiled)."""
    graphs = []

    def record(aten_gm, aten_inputs):
        graphs.append(lower_graph(aten_gm, aten_inputs))
        return aten_gm

    aot_compile(torch.fx.symbolic_trace(fn), list(inputs), record)
    (graph,) = graphs
    return schedule_graph(graph)


def _chain(x):
    # Four reductions that alternate between rows and columns: four kernels, each reading the last.
    s = x.sum(1)
    t = (x * s[:, None]).sum(0)
    w = (x * t).sum(1)
    return ((x * w[:, None]).sum(0),)


EXPECTED_CHAIN = """\
memory plan: 4 steps
scratch block: 256 B (0x100), 3 buffers
step 0 k0: alloc buf1 [16] f32 scratch@0x0  (live 64 B)
step 1 k1: alloc buf3 [48] f32 scratch@0x40; free buf1  (live 256 B)
step 2 k2: alloc buf5 [16] f32 scratch@0x0; free buf3  (live 256 B)
step 3 k3: alloc buf7 [48] f32 empty; free arg0 buf5  (live 256 B)
escape: buf7
peak: 256 B live during step 1 k1 (buffers the program allocates, inputs not counted)
"""


def test_the_plan_of_a_chain_of_kernels_prints_as_expected():
    with kiln.config.patch(cpu_scratch_arena=True, cpu_huge_pages_min_bytes=1 << 21):
        plan = plan_memory(_scheduled(_chain, torch.randn(16, 48)))
    assert plan.format() == EXPECTED_CHAIN


def test_a_buffer_is_freed_right_after_its_last_use_and_outputs_never():
    scheduled = _scheduled(_chain, torch.randn(16, 48))
    plan = plan_memory(scheduled)
    freed_at = {name: step.index for step in plan.steps for name in step.frees}
    for step_index, step in enumerate(scheduled.steps):
        for name in step.outputs():
            readers = [later for later, other in enumerate(scheduled.steps)
                       if any(op.buffer == name for node in other.nodes for op in node.body.reads())]
            if name in plan.escaping:
                assert name not in freed_at
            else:
                assert freed_at[name] == max(readers + [step_index])
    assert plan.escaping == [scheduled.graph.outputs[0].buffer]
    assert freed_at["arg0"] == len(scheduled.steps) - 1  # the input: freed after the last kernel reads it


def test_scratch_offsets_are_shared_only_by_lifetimes_that_do_not_overlap():
    with kiln.config.patch(cpu_scratch_arena=True):
        plan = plan_memory(_scheduled(_chain, torch.randn(16, 48)))
    allocations = [allocation for step in plan.steps for allocation in step.allocations]
    born = {allocation.buffer: step.index for step in plan.steps for allocation in step.allocations}
    freed = {name: step.index for step in plan.steps for name in step.frees}
    in_block = [allocation for allocation in allocations if allocation.kind == SCRATCH]
    assert len(in_block) == 3 and plan.scratch.nbytes == 256
    for a in in_block:
        for b in in_block:
            apart = freed[a.buffer] < born[b.buffer] or freed[b.buffer] < born[a.buffer]
            if a is not b and not apart:
                assert (a.scratch_offset + int(a.nbytes) <= b.scratch_offset
                        or b.scratch_offset + int(b.nbytes) <= a.scratch_offset)
    assert plan.allocation("buf1").scratch_offset == plan.allocation("buf5").scratch_offset  # buf1 dead by then
    assert plan.allocation(plan.escaping[0]).kind == EMPTY  # an output never lives in the block


def test_no_scratch_block_off_the_cpu_arena():
    with kiln.config.patch(cpu_scratch_arena=False):
        plan = plan_memory(_scheduled(_chain, torch.randn(16, 48)))
    assert plan.scratch is None
    assert {allocation.kind for step in plan.steps for allocation in step.allocations} == {EMPTY}
    assert "scratch" not in plan.format()


def test_the_wrapper_renders_the_plan():
    scheduled = _scheduled(_chain, torch.randn(16, 48))
    with kiln.config.patch(cpu_scratch_arena=True):
        plan = plan_memory(scheduled)
        assert generate_wrapper(scheduled, plan).wrapper == generate_wrapper(scheduled, plan_memory(scheduled)).wrapper
        assert "del buf1\n" in generate_wrapper(scheduled, plan).wrapper
        plan.steps[1].frees = []  # keep buf1 to the end
        plan.steps[3].frees.append("buf1")
        plan.allocation("buf7").kind = HUGE
        wrapper = generate_wrapper(scheduled, plan).wrapper
    assert "del buf1\n" not in wrapper and "del arg0_1, buf1, buf5\n" in wrapper
    assert "buf7 = empty_strided_huge((48, ), (1, ), torch.float32)" in wrapper


def test_symbolic_sizes_are_counted_as_expressions():
    size = sympy.Symbol("s0", integer=True, positive=True)
    layout = Layout((size,), (sympy.Integer(1),))
    x = Buffer("arg0", torch.device("cpu"), torch.float32, layout)
    out = Buffer("buf0", torch.device("cpu"), torch.float64, layout)
    extern = Extern("node0", torch.ops.aten._to_copy.default, (TensorArg("arg0", layout),), {"dtype": torch.float64},
                    ["buf0"], 0)
    graph = Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={"arg0": x, "buf0": out},
                  nodes=[extern], outputs=[TensorArg("buf0", layout)])
    plan = plan_memory(schedule_graph(graph))
    assert plan.peak_bytes == 8 * size and plan.peak_step == 0
    assert plan.scratch is None  # symbolic sizes never go in the block
    assert "step 0 node0 (aten._to_copy.default): alloc buf0 [s0] f64 returned; free arg0  (live 8*s0 B)" \
        in plan.format()
    assert "peak: 8*s0 B live during step 0 node0" in plan.format()


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_an_operand_of_an_op_that_takes_a_storage_offset_is_allocated_fresh(cpu_backend):
    """as_strided_scatter's storage_offset counts from its operand's storage start, so that operand may
    not be a view into the scratch block. The backward of a linear layer over a pooled channels-last
    map under autocast scatters into such a buffer: its gradients came back 0 on both CPU backends."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)

    def head(x):
        return linear(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))

    x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.autograd.grad(head(x).float().sum(), [x, linear.weight])
    with kiln.config.patch(cpu_backend=cpu_backend, strict=True), torch.autocast("cpu", dtype=torch.bfloat16):
        result = kiln.compile(head)(x)
    got = torch.autograd.grad(result.float().sum(), [x, linear.weight])
    assert got[0].abs().sum() > 0
    assert kiln.testing.compare(got, expected)
