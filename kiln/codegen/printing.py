"""Index expressions as source text (Triton kernels and the Python wrapper share it)."""
from __future__ import annotations

import math

import sympy
import torch

from kiln.ir.indexing import FloorDiv, Mod
from kiln.ir.nodes import indirect_value, symbol_name


def expr_to_source(expr, rename=None, language: str = "python", helpers_used: set | None = None) -> str:
    """Python (or, with language="triton" / "cpp", Triton / C++ int64) source for an integer index expression.

    rename(symbol) -> str gives a symbol's spelling (default: its name; `ind<k>` -> `tmp<k>`).
    Sizes and loop variables are nonnegative, so there truncating division is floor division; an expression over
    a symbolic int argument (which may be negative) uses the floor helpers instead.
    """
    cpp = language == "cpp"
    expr = sympy.sympify(expr)

    def name_of(symbol):
        if rename is not None:
            spelled = rename(symbol)
            if spelled is not None:
                return spelled
        value = indirect_value(symbol)
        return f"tmp{value}" if value is not None else symbol_name(symbol)

    def visit(node) -> str:
        if node.is_Integer:
            return str(int(node))
        if node.is_Symbol:
            return name_of(node)
        if isinstance(node, (FloorDiv, Mod)) and language != "python" and not _provably_nonnegative(node.args):
            # a symbolic int argument may be negative: C++'s and Triton's `/`, `//` and `%` truncate where
            # Python floors (the Triton helpers are the kernel's own: `helpers_used` names them)
            if cpp:
                helper = ("kiln_floordiv" if isinstance(node, FloorDiv) else "kiln_remainder") + "<int64_t>"
            else:
                helper = "_floordiv_integer" if isinstance(node, FloorDiv) else "_remainder_integer"
                if helpers_used is not None:
                    helpers_used.add(helper[1:])
                if node.args[0].is_Integer:  # the helpers read the dividend's dtype: a literal has none
                    return f"{helper}(tl.full([1], {int(node.args[0])}, tl.int64), {visit(node.args[1])})"
            return f"{helper}({visit(node.args[0])}, {visit(node.args[1])})"
        if isinstance(node, FloorDiv):
            return f"({visit(node.args[0])} {'/' if cpp else '//'} {visit(node.args[1])})"
        if isinstance(node, Mod):
            return f"({visit(node.args[0])} % {visit(node.args[1])})"
        if isinstance(node, sympy.Add):
            terms = sorted(node.args, key=sympy.default_sort_key)
            return "(" + " + ".join(visit(term) for term in terms) + ")"
        if isinstance(node, sympy.Mul):
            coefficient, rest = node.as_coeff_Mul()
            factors = [visit(factor) for factor in sympy.Mul.make_args(rest)]
            if coefficient != 1:
                if not coefficient.is_Integer:
                    raise ValueError(f"non-integer index coefficient in {expr}")
                factors.insert(0, str(int(coefficient)))
            return "(" + "*".join(factors) + ")"
        if isinstance(node, sympy.Pow) and node.exp.is_Integer and node.exp > 0:
            return "(" + "*".join([visit(node.base)] * int(node.exp)) + ")"
        if isinstance(node, (sympy.Min, sympy.Max)):
            name = ("std::min<int64_t>" if cpp else "min") if isinstance(node, sympy.Min) else \
                ("std::max<int64_t>" if cpp else "max")
            if not cpp:
                return f"{name}({', '.join(visit(arg) for arg in node.args)})"
            text = visit(node.args[0])
            for arg in node.args[1:]:
                text = f"{name}({text}, {visit(arg)})"
            return text
        raise ValueError(f"cannot print index expression {node} ({type(node).__name__})")

    text = visit(expr)
    return text[1:-1] if text.startswith("(") and _balanced(text[1:-1]) else text


def _provably_nonnegative(operands) -> bool:
    """Whether the dividend is known nonnegative and the divisor known positive, so truncating division is
    floor division. Nonnegative symbols are not enough: roll's shift `Mod(-FloorDiv(s0, 2), s0)` is over sizes
    alone and its dividend is negative. A symbolic int argument's symbol carries no sign assumption."""
    dividend, divisor = (sympy.sympify(operand) for operand in operands)
    return dividend.is_nonnegative is True and \
        (divisor.is_positive is True or (divisor.is_Integer and int(divisor) > 0))


def _balanced(text: str) -> bool:
    depth = 0
    for character in text:
        depth += {"(": 1, ")": -1}.get(character, 0)
        if depth < 0:
            return False
    return depth == 0


def python_constant(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if isinstance(value, int):
        return str(value)
    raise ValueError(f"constant {value!r}")


TRITON_DTYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
