"""What the tests of Python constructs real models execute (issue 13, item 2) share
(test_python_control_flow.py, test_python_generators.py, test_python_objects.py,
test_python_library.py): each function is compiled with fullgraph=True (a construct kiln cannot
capture raises), its result compared with eager's, and the number of graphs checked where it has
tensors.
"""
from __future__ import annotations

import torch

from kiln.backend import graph_compiler
from kiln.frontend import compile_function


def _compiled(fn):
    graphs = []
    eager_rung = graph_compiler("eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return eager_rung(gm, example_inputs)

    return compile_function(fn, backend, fullgraph=True), graphs


def _equal(got, want) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), (got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for a, b in zip(got, want):
            _equal(a, b)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), (got, want)
        for key in want:
            _equal(got[key], want[key])
    else:
        assert got == want, (got, want)


def check(fn, *args, graphs: int | None = 1):
    """fn compiled as one frame (and `graphs` graphs) gives eager's result; returns the dispatcher."""
    compiled, made = _compiled(fn)
    _equal(compiled(*args), fn(*args))
    if graphs is not None:
        assert len(made) == graphs
    return compiled


X = torch.arange(4.0)
