"""The generated host wrapper: what it prints must be Python that rebuilds each argument."""
from __future__ import annotations

import sympy
import torch

from kiln.codegen.wrapper import generate_wrapper
from kiln.schedule.memory import plan_memory
from kiln.ir import Buffer, Extern, Graph, GraphInput, Layout, TensorArg
from kiln.runtime.loader import load_module
from kiln.schedule import schedule_graph


def _apply(function, tensor):
    return function(tensor)


def test_extern_arguments_without_a_python_literal_are_bound_by_name():
    # An op object, a function: repr() of these is not Python (`<OpOverload(...)>`), so the
    # wrapper binds them into its namespace instead of printing them.
    layout = Layout((sympy.Integer(5),), (sympy.Integer(1),))
    x = Buffer("arg0", torch.device("cpu"), torch.float32, layout)
    out = Buffer("buf0", torch.device("cpu"), torch.float32, layout)
    extern = Extern("node0", _apply, (torch.ops.aten.sin.default, TensorArg("arg0", layout)), {}, ["buf0"], 0)
    graph = Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={"arg0": x, "buf0": out},
                  nodes=[extern], outputs=[TensorArg("buf0", layout)])
    scheduled = schedule_graph(graph)
    module = generate_wrapper(scheduled, plan_memory(scheduled))
    assert "OpOverload" not in module.wrapper
    compiled = load_module(module)
    value = torch.randn(5)
    (result,) = compiled([value])
    assert torch.equal(result, torch.sin(value))


def test_cuda_buffers_come_from_the_allocator_bound_once_per_call():
    """A CUDA graph's wrapper binds one allocator per device at the top of the call and allocates
    every buffer through it (torch's C++ `_empty_strided_cuda` when the device is current)."""
    from kiln.ir import Body, Pointwise
    from kiln.ir.indexing import range_vars

    layout = Layout((sympy.Integer(8),), (sympy.Integer(1),))
    device = torch.device("cuda", 0)
    x, hidden, out = (Buffer(name, device, torch.float32, layout) for name in ("arg0", "buf0", "buf1"))
    (i0,) = range_vars(1)
    nodes = []
    for source, target in ((x, hidden), (hidden, out)):
        body = Body()
        body.store(target, [i0], body.emit("sin", (body.load(source, [i0]),), torch.float32))
        nodes.append(Pointwise(f"node{len(nodes)}", [sympy.Integer(8)], body, [target.name]))
    graph = Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={b.name: b for b in (x, hidden, out)},
                  nodes=nodes, outputs=[TensorArg("buf1", layout)])
    scheduled = schedule_graph(graph)
    wrapper = generate_wrapper(scheduled, plan_memory(scheduled)).wrapper
    assert wrapper.count("_empty_cuda0 = cuda_allocator(0)") == 1
    assert "_empty_cuda0((8, ), (1, ), torch.float32)" in wrapper
    assert "empty_strided((8" not in wrapper


def test_cuda_allocator_takes_the_fast_path_only_on_the_current_device(monkeypatch):
    from kiln.runtime import support

    made = []
    monkeypatch.setattr(support, "_EMPTY_ON_CURRENT_CUDA", lambda size, stride, dtype: made.append("fast"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch, "empty_strided", lambda size, stride, dtype, device: made.append(str(device)))
    support.cuda_allocator(1)((4,), (1,), torch.float32)
    support.cuda_allocator(0)((4,), (1,), torch.float32)
    assert made == ["fast", "cuda:0"]


def test_product_externs_run_through_torchs_own_bindings():
    """aten.mm runs as torch.mm (no OpOverload frame per call), with the same result; the module
    source still names the op (explain and the graph cache read it)."""
    a_layout = Layout((sympy.Integer(3), sympy.Integer(4)), (sympy.Integer(4), sympy.Integer(1)))
    b_layout = Layout((sympy.Integer(4), sympy.Integer(5)), (sympy.Integer(5), sympy.Integer(1)))
    out_layout = Layout((sympy.Integer(3), sympy.Integer(5)), (sympy.Integer(5), sympy.Integer(1)))
    a, b = (Buffer(name, torch.device("cpu"), torch.float32, layout)
            for name, layout in (("arg0", a_layout), ("arg1", b_layout)))
    out = Buffer("buf0", torch.device("cpu"), torch.float32, out_layout)
    extern = Extern("node0", torch.ops.aten.mm.default, (TensorArg("arg0", a_layout), TensorArg("arg1", b_layout)),
                    {}, ["buf0"], 0)
    graph = Graph(inputs=[GraphInput("tensor", "a", buffer=a), GraphInput("tensor", "b", buffer=b)],
                  buffers={"arg0": a, "arg1": b, "buf0": out}, nodes=[extern], outputs=[TensorArg("buf0", out_layout)])
    scheduled = schedule_graph(graph)
    module = generate_wrapper(scheduled, plan_memory(scheduled))
    compiled = load_module(module)
    assert module.externs["node0"] is torch.ops.aten.mm.default
    assert compiled._call.__globals__["node0"] is torch.mm
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    (result,) = compiled([x, y])
    assert torch.equal(result, torch.mm(x, y))
