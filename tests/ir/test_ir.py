"""LoopIR: printing is stable, verify() catches malformed graphs, indexing simplifies."""
from __future__ import annotations

import pytest
import sympy
import torch

from kiln.ir import Body, Buffer, Graph, GraphInput, IRVerificationError, Layout, Pointwise, format_graph, verify
from kiln.ir.indexing import FloorDiv, Mod, range_vars, simplify_index, unravel


def _graph():
    i0, i1 = range_vars(2)
    layout = Layout((sympy.Integer(4), sympy.Integer(8)), (sympy.Integer(8), sympy.Integer(1)))
    x = Buffer("arg0", torch.device("cpu"), torch.float32, layout)
    out = Buffer("buf0", torch.device("cpu"), torch.float32, layout)
    body = Body()
    loaded = body.load(x, [i0, i1])
    body.store(out, [i0, i1], body.emit("sin", (loaded,), torch.float32))
    graph = Graph(inputs=[GraphInput("tensor", "x", buffer=x)], buffers={"arg0": x, "buf0": out},
                  nodes=[Pointwise("node0", [4, 8], body, ["buf0"])])
    return graph, body


def test_printer_golden():
    graph, _ = _graph()
    assert format_graph(graph) == (
        "# inputs\n"
        "  arg0: f32[4, 8] stride [8, 1] on cpu\n"
        "# nodes\n"
        "node0: Pointwise ranges=[4, 8] -> buf0\n"
        "  # buf0: f32[4, 8] stride [8, 1] on cpu\n"
        "  %0 = load arg0[i0, i1] : f32\n"
        "  %1 = sin %0 : f32\n"
        "  store buf0[i0, i1] %1\n"
        "# outputs\n"
        "  \n")


def test_verify_accepts_wellformed_and_rejects_bad_reads():
    graph, body = _graph()
    verify(graph)
    body.emit("cos", (7,), torch.float32)
    with pytest.raises(IRVerificationError, match="before it is defined"):
        verify(graph)


def test_verify_rejects_unknown_buffer_and_loop_variable():
    graph, body = _graph()
    body.ops[0] = body.ops[0].__class__("load", (), torch.float32, "nope", body.ops[0].index)
    with pytest.raises(IRVerificationError, match="unknown buffer"):
        verify(graph)
    graph, body = _graph()
    r5 = sympy.Symbol("r5", integer=True, nonnegative=True)
    body.ops[0] = body.ops[0].__class__("load", (), torch.float32, "arg0", (r5, 0))
    with pytest.raises(IRVerificationError, match="outside the node's loops"):
        verify(graph)


def test_index_simplification_uses_ranges():
    i0, i1 = range_vars(2)
    assert simplify_index(FloorDiv(i0 * 768 + i1, 768), {i0: 10, i1: 768}) == i0
    assert simplify_index(Mod(i0 * 768 + i1, 768), {i0: 10, i1: 768}) == i1
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert simplify_index(FloorDiv(i0 * s0 + i1, s0), {i1: s0}) == i0
    assert unravel(i0, [4, 5, 6]) == [FloorDiv(i0, 30), Mod(FloorDiv(i0, 6), 5), Mod(i0, 6)]


def test_floor_div_and_mod_of_terms_holding_floor_div_and_mod():
    # A kernel's row variable substituted into a node's index puts FloorDiv/Mod terms inside
    # FloorDiv/Mod (RMSNorm over an expanded, compared, cast input: 14 of 3,000 fuzz programs).
    # Splitting off the multiples of the divisor went through sympy.Poly, which raised
    # PolynomialError ("FloorDiv(x0, 48) contains an element of the set of generators").
    x0, x1 = range_vars(2, "x")
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert FloorDiv(48 * FloorDiv(x0, 48) + x1, 48) == FloorDiv(x0, 48) + FloorDiv(x1, 48)
    assert Mod(48 * FloorDiv(x0, 48) + x1, 48) == Mod(x1, 48)
    assert FloorDiv(3 * Mod(x0, 48) + x0, 3) == Mod(x0, 48) + FloorDiv(x0, 3)
    assert Mod(x0 * FloorDiv(x0, 48) * 96 + x1, 48) == Mod(x1, 48)
    assert FloorDiv(s0 * Mod(x0, s0) + x1, s0) == Mod(x0, s0) + FloorDiv(x1, s0)
    # Terms that are not whole multiples stay inside.
    assert FloorDiv(3 * FloorDiv(x0, 48) + x1, 2) == FloorDiv(3 * FloorDiv(x0, 48) + x1, 2)
    assert Mod(FloorDiv(x0, 48), 3).args == (FloorDiv(x0, 48), 3)
    ranges = {x0: 96, x1: 48}
    assert simplify_index(FloorDiv(48 * FloorDiv(x0, 48) + x1, 48), ranges) == FloorDiv(x0, 48)


def test_simplify_index_factors_a_multiple_of_the_divisor_out_of_a_merged_view():
    """(17 x0 + x1) // 51 with x1 < 17 is x0 // 3, and % 51 is 17 (x0 % 3) + x1: checked on every point."""
    import itertools

    from kiln.ir.indexing import FloorDiv, Mod, index_var, simplify_index

    x0, x1 = index_var("x", 0), index_var("x", 1)
    ranges = {x0: 6, x1: 17}
    assert simplify_index(FloorDiv(17 * x0 + x1, 51), ranges) == FloorDiv(x0, 3)
    assert simplify_index(Mod(17 * x0 + x1, 51), ranges) == 17 * Mod(x0, 3) + x1
    for expr in (FloorDiv(17 * x0 + x1, 51), Mod(17 * x0 + x1, 51), FloorDiv(34 * x0 + 2 * x1 + 1, 34),
                 Mod(6 * x0 + x1 % 3, 12)):
        simplified = simplify_index(expr, ranges)
        for a, b in itertools.product(range(6), range(17)):
            assert simplified.subs({x0: a, x1: b}) == expr.subs({x0: a, x1: b}), (expr, simplified, a, b)
    # no rewrite where the low part can reach the factor: x1 reaches 16, the factor is 16
    assert simplify_index(FloorDiv(16 * x0 + x1, 48), ranges) == FloorDiv(16 * x0 + x1, 48)


def test_floor_division_is_nonnegative_only_where_its_operands_are():
    from kiln.ir.indexing import FloorDiv, index_var

    k = sympy.Symbol("k", integer=True)  # a symbolic int argument: may be negative (-1 // 4 is -1)
    assert FloorDiv(k, 4).is_nonnegative is None
    assert FloorDiv(index_var("x", 0), 4).is_nonnegative is True
    assert sympy.Max(FloorDiv(k, 4), 0) != FloorDiv(k, 4)  # sympy may not drop the max on a false assumption
