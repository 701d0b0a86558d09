"""Adversarial indexing programs (gathers and writes at computed positions) against eager, on both CPU
backends, through `kiln.compile` (and `torch.compile(backend="kiln")` where the two frontends' graphs differ)
with KILN_STRICT (a compile failure raises; nothing runs eagerly behind
the test's back). Each program is called on three sizes, so the second and third calls run a graph
with symbolic sizes. Each case names what was once wrong.
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.testing


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    with kiln.config.patch(cpu_backend=request.param, strict=True):
        yield request.param


SIZES = (5, 7, 6)


def _compile(program, frontend: str):
    if frontend == "kiln":
        return kiln.compile(program)
    torch._dynamo.reset()
    return torch.compile(program, backend="kiln")


def _check(program, make_inputs, frontend: str = "kiln"):
    compiled = _compile(program, frontend)
    for call, size in enumerate(SIZES):
        torch.manual_seed(call)
        inputs = make_inputs(size)
        expected = program(*[value.clone() for value in inputs])
        actual = compiled(*[value.clone() for value in inputs])
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, (size, actual, expected)
        verdict = kiln.testing.compare(actual, expected)
        assert verdict, (size, verdict.message)


# A 0-d operand of gather or scatter counts as a 1-d one of one element in eager (ATen's ensure_nonempty_dim).
RANK_QUIRKS = {
    # once wrong: gather's rule took an index of another rank for an empty one and returned zeros
    "gather_1d_at_0d_index": (lambda x: torch.gather(x * 2, 0, x.argmax()), lambda n: [torch.randn(n)]),
    "gather_1d_at_0d_input_index": (lambda x, i: torch.gather(x + 1, 0, i),
                                    lambda n: [torch.randn(n), torch.tensor(n - 2)]),
    "gather_0d_at_1d_index": (lambda x: x.sum().gather(0, torch.zeros(3, dtype=torch.long)) * 2,
                              lambda n: [torch.randn(n)]),
    # once a compile error: scatter's rule loaded a 0-d source with a 1-d index
    "scatter_0d_source": (lambda x: (x * 2).scatter(0, x.argmax()[None], x.sum()), lambda n: [torch.randn(n)]),
    "scatter_into_0d": (lambda x: x.sum().scatter(0, torch.zeros((), dtype=torch.long), x[:1] * 3),
                        lambda n: [torch.randn(n)]),
}


@pytest.mark.parametrize("name", list(RANK_QUIRKS))
def test_zero_dim_operands_of_gather_and_scatter(name):
    program, make_inputs = RANK_QUIRKS[name]
    _check(program, make_inputs)


def _write_at_negative_size(x):
    y = x * 2
    y[-(x.shape[0] // 2)] = 0.0
    return y


def _add_at_negative_size_column(x):
    y = x * 2
    y[:, 1 - x.shape[1]] += 5.0
    return y


# An integer index that is a size expression with a sign sympy cannot decide (-(s0 // 2): the ShapeEnv
# guarded it negative, the graph keeps the expression). Once wrong: select took it as a position as it
# was, and read before the tensor's first row (garbage, up to 9e30).
SYMBOLIC_NEGATIVE_INDICES = {
    "select_rows": lambda x: (x * 2)[-(x.shape[0] // 2)],
    "select_of_an_input": lambda x: x[-(x.shape[0] // 2)] + 1,
    "select_columns": lambda x: x.select(1, 1 - x.shape[1]) * 3,
    "select_scatter": lambda x: torch.select_scatter(x * 2, x[0], 0, -(x.shape[0] // 2)),
    "setitem": _write_at_negative_size,
    "add_into_a_column": _add_at_negative_size_column,
}


@pytest.mark.parametrize("frontend", ["kiln", "dynamo"])
@pytest.mark.parametrize("name", list(SYMBOLIC_NEGATIVE_INDICES))
def test_select_at_a_symbolic_negative_index(name, frontend):
    _check(SYMBOLIC_NEGATIVE_INDICES[name], lambda n: [torch.randn(n, n - 1)], frontend)


def _write_one_read_the_other(a, b):
    a[torch.tensor([0, 2])] += 1
    return b * 2


def _put_into_one_add_the_other(a, b):
    a.index_put_((torch.tensor([1]),), torch.tensor(5.0))
    return a + b


# Two arguments that share a storage (x and x[1:]) reach the graph as views of one base (AOTAutograd's
# synthetic base), addressed through as_strided with symbolic strides once sizes change. Once a compile
# error (RecursionError): `upper_bound` of a product with no number factor (s0*i0) recursed on itself.
ALIASED_ARGUMENTS = {
    "write_one_read_the_other": (_write_one_read_the_other, lambda x: (x, x[1:])),
    "put_into_one_add_the_other": (_put_into_one_add_the_other, lambda x: (x, x.t())),
}


@pytest.mark.parametrize("name", list(ALIASED_ARGUMENTS))
def test_writes_into_aliased_arguments(name):
    program, split = ALIASED_ARGUMENTS[name]
    compiled = _compile(program, "dynamo")
    for size in (4, 5, 6):
        base = torch.randn(size, size)
        eager_base, compiled_base = base.clone(), base.clone()
        expected = program(*split(eager_base))
        actual = compiled(*split(compiled_base))
        verdict = kiln.testing.compare(actual, expected)
        assert verdict, (size, verdict.message)
        assert torch.equal(compiled_base, eager_base), size


def test_upper_bound_of_a_product_of_symbols():
    import sympy

    from kiln.ir.indexing import index_var, upper_bound

    i0, i1 = index_var("i", 0), index_var("i", 1)
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert upper_bound(s0 * i0, {i0: 4}) == 3 * s0
    assert sympy.expand(upper_bound(3 * s0 * i0 + i1, {i0: 4, i1: s0}) - (10 * s0 - 1)) == 0


# Eager's index_add and index_copy take an index in [0, size) and raise for a negative one. Once accepted:
# their decompositions wrote through index_put, which counts a negative index from the end.
NEGATIVE_INDEX_WRITES = {  # name: (program, the dim it indexes)
    "index_add": (lambda x, i: (x * 2).index_add(0, i - x.shape[0], x[:2]), 0),
    "index_copy": (lambda x, i: (x * 2).index_copy(0, i - x.shape[0], x[:2]), 0),
    "index_add_in_place": (lambda x, i: (x * 2).index_add_(1, i - x.shape[1], x[:, :2], alpha=2), 1),
}


@pytest.mark.parametrize("name", list(NEGATIVE_INDEX_WRITES))
def test_negative_index_of_index_add_and_index_copy_raises(name):
    program, dim = NEGATIVE_INDEX_WRITES[name]
    compiled = kiln.compile(program)
    for size in SIZES:
        x = torch.randn(size, size - 1)
        negative = torch.tensor([0, 1])  # minus the size: -size and -size + 1
        with pytest.raises((IndexError, RuntimeError)):
            program(x, negative)
        with pytest.raises((IndexError, RuntimeError)):
            compiled(x, negative)
        valid = negative + x.shape[dim]
        verdict = kiln.testing.compare(compiled(x, valid), program(x, valid))
        assert verdict, verdict.message


# Gathers at positions computed from a size divided by a number: the ATen graph computes the scale as a
# SymFloat (`s0 / 7`, `sym_float(s0) * 1.7`) and multiplies a tensor by it. kiln's lowering has no symbolic
# float scalars (operator.truediv and sym_float become externs that return a SymFloat, which it refuses),
# so after the recompile with symbolic sizes the graph does not compile: KILN_STRICT raises, and without it
# the graph runs eagerly (right values, no kernels).
SYMBOLIC_FLOAT_SCALES = {
    "interpolate_to_a_size": lambda x: torch.nn.functional.interpolate(x * 2, size=(7, 5), mode="bilinear"),
    "interpolate_by_a_factor": lambda x: torch.nn.functional.interpolate(x + 1, scale_factor=1.7, mode="nearest"),
}


@pytest.mark.xfail(strict=True, reason="no symbolic float scalars in the lowering (SymFloat externs refused)")
@pytest.mark.parametrize("name", list(SYMBOLIC_FLOAT_SCALES))
def test_gathers_at_positions_scaled_by_a_symbolic_float(name):
    _check(SYMBOLIC_FLOAT_SCALES[name], lambda n: [torch.randn(1, 2, n, 3)])
