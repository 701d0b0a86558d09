"""The op table (kiln/ir/ops.py): it lists exactly LoopIR's pointwise ops, and every row renders on
every backend for every dtype its dtype rule admits (a row without a rendering fails here, not at
codegen time). The rendered text's meaning is tested against eager by tests/codegen/test_op_sweep.py."""
from __future__ import annotations

import ast
import re

import pytest
import torch

from kiln import _triton
from kiln.codegen import cpp, triton
from kiln.codegen.cpp_prelude import PRELUDE
from kiln.ir.nodes import ALL_OPS, BINARY_OPS, OTHER_OPS, UNARY_OPS
from kiln.ir.ops import (CPP_VARIANTS, DTYPE_CLASSES, OPS, ROWS, TRITON_VARIANTS, Op, cpp_variants,
                         triton_variants)

OPERANDS = ["x_left", "y_right"]


def _cases(row) -> list:
    """(operand dtype, result dtype) for every dtype the row's rule admits."""
    result = (lambda dtype: torch.bool) if row.dtype_rule.bool_result else (lambda dtype: dtype)
    return [(dtype, result(dtype)) for name in sorted(row.dtype_rule.operands) for dtype in DTYPE_CLASSES[name]]


def test_the_table_covers_exactly_the_pointwise_ops():
    assert [row.op.value for row in ROWS] == list(OPS) and set(OPS) == {op.value for op in Op}  # one row per Op
    assert set(OPS) == UNARY_OPS | BINARY_OPS and not UNARY_OPS & BINARY_OPS
    assert not OTHER_OPS & set(OPS) and ALL_OPS == set(OPS) | OTHER_OPS
    assert all(row.arity == (1 if row.op in UNARY_OPS else 2) for row in ROWS)


def test_variant_names_are_the_ones_the_backends_try():
    for row in ROWS:
        assert set(row.triton) <= set(TRITON_VARIANTS), row.op
        assert set(row.cpp) <= set(CPP_VARIANTS), row.op
    dtypes = [dtype for members in DTYPE_CLASSES.values() for dtype in members]
    for operand in dtypes:
        assert set(cpp_variants(operand)) <= set(CPP_VARIANTS)
        for result in dtypes:
            assert set(triton_variants(operand, result)) <= set(TRITON_VARIANTS)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_renders_in_triton(name):
    row = OPS[name]
    args = OPERANDS[:row.arity]
    for operand, result in _cases(row):
        source, helper = triton.math_source(name, operand, result, args, "[1]")
        ast.parse(source, mode="eval")  # a Python expression
        assert all(arg in source for arg in args), (name, operand, source)
        if helper is not None:
            assert helper in triton.HELPERS, (name, helper)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_renders_in_cpp(name):
    row = OPS[name]
    args = OPERANDS[:row.arity]
    for _, result in _cases(row):
        expression = cpp.math_expression(name, result, args)
        assert all(arg in expression for arg in args), (name, result, expression)
        assert expression.count("(") == expression.count(")") and "{" not in expression, expression


def test_triton_renderings_call_only_libdevice_the_interpreter_has():
    symbols = set()
    for row in ROWS:
        for template in row.triton.values():
            symbols |= set(re.findall(r"libdevice\.(\w+)", template))
    for helper in triton.HELPERS.values():
        symbols |= set(re.findall(r"libdevice\.(\w+)", helper))
    for symbol in sorted(symbols):
        assert callable(_triton._numpy_function(symbol)), symbol


def _simd_declared() -> set:
    """The libm functions the C++ prelude declares `omp declare simd` (libmvec's)."""
    return set(re.findall(r"KILN_SIMD_MATH\((\w+)\)", PRELUDE)) | set(
        re.findall(r'simd notinbranch"\) double (\w+)\(', PRELUDE))


def test_vector_math_is_exactly_the_rows_calling_libmvec():
    declared = _simd_declared()
    for row in ROWS:
        calls = set(re.findall(r"std::(\w+)\(", row.cpp.get("default", "")))
        assert row.vector_math == bool(calls & declared), (row.op, calls & declared)


def _defined_helpers(text: str) -> set:
    """The kiln_ functions a C++ text defines."""
    return set(re.findall(r"static inline [\w:<>]+ (kiln_\w+)\(", text))


def test_every_cpp_helper_a_template_calls_is_in_the_prelude():
    defined = _defined_helpers(PRELUDE)
    for row in ROWS:
        for template in row.cpp.values():
            for helper in re.findall(r"\b(kiln_\w+?)(?:<|\()", template.replace("{D}", "bf16")):
                assert helper in defined, (row.op, helper)


def test_a_rows_cpp_prelude_holds_helpers_its_own_templates_call():
    for row in ROWS:
        called = {helper for template in row.cpp.values() for helper in re.findall(r"\b(kiln_\w+?)(?:<|\()", template)}
        assert _defined_helpers(row.cpp_prelude) <= called, row.op
    assert "kiln_erfinv" in _defined_helpers(OPS["erfinv"].cpp_prelude)  # a row's helper reaches the prelude
    assert "kiln_erfinv" in _defined_helpers(PRELUDE)
