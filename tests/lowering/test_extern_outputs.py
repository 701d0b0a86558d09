"""Non-tensor results of externs (kiln/lowering/context.py `LoweringContext.extern`).

An op kiln has no rule for runs as an extern call, and its non-tensor results are taken from
the fake run. Under dynamic shapes such a result can be a SymInt: cuDNN attention returns its
max sequence lengths, which are sizes of its inputs. Those are symbolic sizes like any other;
only a SymInt that depends on data (an unbacked symbol) makes the graph fall back.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing
from kiln.lowering.context import Unsupported


@torch.library.custom_op("kiln_test::scaled_with_length", mutates_args=())
def scaled_with_length(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x * 2, x.shape[0]


@scaled_with_length.register_fake
def _(x):
    return torch.empty_like(x), x.shape[0]


def program(x):
    doubled, length = torch.ops.kiln_test.scaled_with_length(x)
    return doubled.sin() + 1, doubled[: length - 1].sum(0)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_an_extern_returning_a_size_compiles_under_dynamic_shapes(backend):
    torch._dynamo.reset()
    compiled = torch.compile(program, backend="kiln", dynamic=True)
    with kiln.config.patch(strict=True, cpu_backend=backend):  # strict: a graph run eagerly raises
        for rows in (5, 9):
            x = torch.randn(rows, 7)
            assert kiln.testing.compare(compiled(x), program(x), program(x.double()))


def test_an_extern_returning_a_data_dependent_int_is_unsupported():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from kiln import _torch
    from kiln.ir import Graph
    from kiln.lowering.context import LoweringContext

    shape_env = ShapeEnv()
    count, size = shape_env.create_unbacked_symint(), shape_env.create_symintnode(
        shape_env.create_symbol(5, torch._dynamo.source.ConstantSource("size")), hint=5)
    assert _torch.has_unbacked_symbols(count) and not _torch.has_unbacked_symbols(size)
    assert not _torch.has_unbacked_symbols(7)
    context = LoweringContext(Graph())
    with pytest.raises(Unsupported, match="returns a data-dependent SymInt"):
        context.extern(torch.ops.kiln_test.scaled_with_length.default, (), {}, (None, count))
    assert context.extern(torch.ops.kiln_test.scaled_with_length.default, (), {}, (None, size))[1] == _torch.sym_expr(size)
