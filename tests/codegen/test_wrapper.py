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
