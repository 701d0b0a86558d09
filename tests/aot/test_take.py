"""kiln/aot/decompositions.py `take`: a 0-d index tensor gathers as advanced indexing, not `.item()`.

torch's decomposition, `source.reshape(-1)[index]`, reads a 0-d index's value, so take (and put's
backward, which takes the gradient) could not be traced: a compile error, where Dynamo hands the graph
to the backend whole. Forward and gradients are compared with eager's against float64.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph


def _take(source, index):
    return (torch.take(source, index),)


def _put(source, index, values):
    return (torch.put(source, index, values, accumulate=True),)


def _outputs_and_gradients(fn, inputs: list, cotangent_seed: int = 1) -> list:
    """fn's outputs, then the gradients of the floating inputs for a fixed random cotangent."""
    outputs = fn(*inputs)
    generator = torch.Generator().manual_seed(cotangent_seed)
    cotangents = [torch.randn(out.shape, dtype=out.dtype, generator=generator) for out in outputs]
    wanted = [tensor for tensor in inputs if tensor.requires_grad]
    gradients = torch.autograd.grad(outputs, wanted, cotangents)
    return [out.detach() for out in outputs] + list(gradients)


def _leaves(inputs: list, dtype=None) -> list:
    copies = []
    for tensor in inputs:
        copy = tensor.detach().clone()
        if tensor.is_floating_point():
            copy = copy.to(dtype or tensor.dtype).requires_grad_()
        copies.append(copy)
    return copies


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
@pytest.mark.parametrize("index_value", [4, -2])  # negative: counted from the end, as eager does
@pytest.mark.parametrize("fn", [_take, _put], ids=["take", "put"])
def test_a_0d_index_tensor_compiles_and_matches_eager(fn, index_value, cpu_backend):
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(3, 5, generator=generator) + 0.5
    index = torch.tensor(index_value)
    inputs = [source, index] if fn is _take else [source, index, torch.randn((), generator=generator)]
    eager = _outputs_and_gradients(fn, _leaves(inputs))
    reference = _outputs_and_gradients(fn, _leaves(inputs, torch.float64))
    with kiln.config.patch(strict=True, cpu_backend=cpu_backend):
        compiled_inputs = _leaves(inputs)
        compiled = compile_graph(torch.fx.symbolic_trace(fn), compiled_inputs)
        actual = _outputs_and_gradients(compiled, compiled_inputs)
    assert [tensor.shape for tensor in actual] == [tensor.shape for tensor in eager]
    verdict = kiln.testing.compare(actual, eager, reference)
    assert verdict, verdict.message
    assert all(gradient.count_nonzero() for gradient in actual[1:])  # the comparison saw real gradients
