"""Index expressions: sympy integers over loop variables and size symbols.

Loop variables are `i0, i1, ...` (a node's output ranges) and `r0, r1, ...` (its
reduction ranges); size symbols come from torch's ShapeEnv (`s0, s1, ...`). Every
symbol is a nonnegative integer. `FloorDiv` and `Mod` stay unevaluated sympy functions
with only exact rewrites (so `floor` never leaks in), and `simplify_index` removes
them where the variables' ranges prove them redundant.
"""
from __future__ import annotations

import functools
from typing import Iterable, Sequence

import sympy

from kiln import _torch


class FloorDiv(sympy.Function):
    """Integer floor division (Python's `//`). Nonnegative where its operands are: loop variables and sizes
    are; a symbolic int argument (a step counter made a graph input) may be negative, and then so may this."""

    is_integer = True

    def _eval_is_nonnegative(self):
        base, divisor = self.args
        if base.is_nonnegative and divisor.is_positive:
            return True
        return None

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        # Pull out the terms that are exact multiples of the divisor.
        whole, rest = _split_multiples(base, divisor)
        if whole != 0:
            return whole + FloorDiv(rest, divisor)
        return None


class Mod(sympy.Function):
    """Remainder of nonnegative integers (`base % divisor`)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) % int(divisor))
        whole, rest = _split_multiples(base, divisor)
        if whole != 0:
            return Mod(rest, divisor)
        return None


def _split_multiples(expr, divisor):
    """expr = whole * divisor + rest, where whole collects the terms divisible by divisor."""
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        quotient = term / divisor  # sympy's Mul cancels common factors itself; `cancel` can raise
        if _is_integer_polynomial(quotient):
            whole += quotient
        else:
            rest += term
    return whole, rest


def _is_integer_polynomial(expr) -> bool:
    """Whether expr is a sum of integer multiples of products of integer-valued factors.

    Read off the expanded terms, not with `sympy.Poly`: a term such as `x0*FloorDiv(x0, 48)`
    holds a loop variable both bare and inside a function, which Poly refuses as a
    generator ("contains an element of the set of generators"). A factor whose integrality
    sympy cannot prove (a size symbol without assumptions) counts as not divisible.
    """
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coefficient, rest = term.as_coeff_Mul()
        if not coefficient.is_Integer:
            return False
        for factor in sympy.Mul.make_args(rest):
            base, exponent = factor.as_base_exp()
            if not (exponent.is_Integer and exponent >= 0 and base.is_integer):
                return False
    return True


@functools.lru_cache(maxsize=None)
def index_var(prefix: str, position: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{position}", integer=True, nonnegative=True)


def range_vars(count: int, prefix: str = "i") -> list[sympy.Symbol]:
    return [index_var(prefix, position) for position in range(count)]


def as_expr(value) -> sympy.Expr:
    if isinstance(value, sympy.Basic):
        return value
    return sympy.Integer(int(value))


def contiguous_strides(sizes: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    strides, running = [], sympy.Integer(1)
    for size in reversed(sizes):
        strides.append(running)
        running = running * size
    return list(reversed(strides))


def product(values: Iterable) -> sympy.Expr:
    result = sympy.Integer(1)
    for value in values:
        result = result * value
    return result


def unravel(flat: sympy.Expr, sizes: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Row-major multi-index of `flat` over `sizes`."""
    strides = contiguous_strides(sizes)
    indices = []
    for position, (size, stride) in enumerate(zip(sizes, strides)):
        value = FloorDiv(flat, stride)
        if position > 0:
            value = Mod(value, size)
        indices.append(value)
    return indices


def upper_bound(expr, ranges: dict) -> sympy.Expr | None:
    """An upper bound (inclusive) of a nonnegative index expression, or None if unknown.

    `ranges` maps loop variables to their extent (the variable is < extent).
    """
    if expr.is_Integer:
        return expr
    if expr in ranges:
        return ranges[expr] - 1
    if isinstance(expr, sympy.Symbol):
        return None
    if isinstance(expr, sympy.Add):
        bounds = [upper_bound(term, ranges) for term in expr.args]
        return None if any(bound is None for bound in bounds) else sympy.Add(*bounds)
    if isinstance(expr, sympy.Mul):
        coefficient, rest = expr.as_coeff_Mul()
        # (a product without a number factor is its own `rest`: bounded factor by factor below)
        if coefficient.is_Integer and coefficient >= 0 and rest != expr:
            rest_bound = upper_bound(rest, ranges)
            if rest_bound is not None:
                return coefficient * rest_bound
            # size symbol times a loop variable: symbol * (extent - 1)
        factors = [factor for factor in sympy.Mul.make_args(expr)]
        bounds = []
        for factor in factors:
            if factor.is_Integer and factor >= 0:
                bounds.append(factor)
            elif factor in ranges:
                bounds.append(ranges[factor] - 1)
            elif isinstance(factor, sympy.Symbol) and factor.is_positive:
                bounds.append(factor)
            else:
                return None
        return sympy.Mul(*bounds)
    if isinstance(expr, FloorDiv):
        bound = upper_bound(expr.args[0], ranges)
        return None if bound is None else FloorDiv(bound, expr.args[1])
    if isinstance(expr, Mod):
        return expr.args[1] - 1
    return None


def _provably_less(expr_bound, limit) -> bool:
    difference = sympy.expand(limit - expr_bound)
    if difference.is_Integer:
        return difference > 0
    return bool(difference.is_positive)


def simplify_index(expr, ranges: dict) -> sympy.Expr:
    """Remove FloorDiv and Mod that the variables' ranges make redundant."""
    if not isinstance(expr, sympy.Basic) or not expr.has(FloorDiv, Mod):
        return expr

    def rewrite(node):
        if isinstance(node, (FloorDiv, Mod)):
            base, divisor = rewrite(node.args[0]), node.args[1]
            bound = upper_bound(base, ranges)
            # in [0, divisor): both ends, a negative base (Mod(-3, s0), from (s0 - 3) % s0) is not its own remainder
            if bound is not None and _provably_less(bound, divisor) and base.is_nonnegative:
                return sympy.Integer(0) if isinstance(node, FloorDiv) else base
            factored = _factor_out(base, divisor, ranges)
            if factored is not None:  # base = g * high + low, 0 <= low < g, g | divisor
                g, high, low = factored
                if isinstance(node, FloorDiv):
                    return FloorDiv(high, divisor // g)
                return g * Mod(high, divisor // g) + low
            return type(node)(base, divisor)
        if node.args:
            return node.func(*[rewrite(argument) for argument in node.args])
        return node

    return sympy.expand(rewrite(expr))


def _factor_out(base, divisor, ranges: dict):
    """(g, high, low) with base = g * high + low, g > 1 dividing `divisor` and 0 <= low < g by the ranges,
    or None. Then base // divisor = high // (divisor / g) and base % divisor = g * (high % (divisor / g)) + low:
    a view that merged dims, (17 x0 + x1) // 51 with x1 < 17, reads x0 // 3."""
    if not (isinstance(divisor, sympy.Integer) and divisor > 1):
        return None
    terms = sympy.Add.make_args(sympy.expand(base))
    coefficients = {int(term.as_coeff_Mul()[0]) for term in terms if term.as_coeff_Mul()[0].is_Integer}
    for g in sorted(coefficients, reverse=True):
        if g <= 1 or int(divisor) % g:
            continue
        high = [term for term in terms if term.as_coeff_Mul()[0].is_Integer and int(term.as_coeff_Mul()[0]) % g == 0]
        low = sympy.Add(*[term for term in terms if term not in high])
        bound = upper_bound(low, ranges) if low != 0 else sympy.Integer(0)
        quotient = sympy.expand(sympy.Add(*high) / g)
        if bound is not None and _provably_less(bound, g) and _is_integer_polynomial(low) \
                and _is_integer_polynomial(quotient) and all(_nonnegative(term) for term in sympy.Add.make_args(low)):
            return sympy.Integer(g), quotient, low
    return None


def _nonnegative(term) -> bool:
    coefficient, _ = term.as_coeff_Mul()
    return bool(coefficient.is_Integer and coefficient >= 0) or term == 0


def fold_div_mod(expr) -> sympy.Expr:
    """Rewrite each Mod(x, d) as x - d*FloorDiv(x, d), so `d*FloorDiv(x, d) + Mod(x, d)` folds to x."""
    for mod in sorted(expr.atoms(Mod), key=str):
        expr = expr.subs(mod, mod.args[0] - mod.args[1] * FloorDiv(mod.args[0], mod.args[1]))
    return sympy.expand(expr)


def is_affine(expr, variables: Sequence[sympy.Symbol]) -> bool:
    """True when expr is a constant plus integer-coefficient multiples of `variables`."""
    if expr.has(FloorDiv, Mod):
        return False
    expanded = sympy.expand(expr)
    for variable in variables:
        coefficient = expanded.coeff(variable)
        if coefficient.free_symbols & set(variables):
            return False
    return True


def linear_coefficient(expr, var: sympy.Symbol) -> int | None:
    """d(expr)/d(var) where that is an integer, else None. Read off the terms of the sum (`c*var`, `var`, or a
    term without `var`); any other term (a FloorDiv of `var`, a symbolic stride) is left to sympy.diff, which
    costs ~60 us a call: loop_order and outer asked ~370 times for a GPT-2 (2026-12-06)."""
    total = 0
    for term in sympy.Add.make_args(expr):
        if var not in term.free_symbols:
            continue
        coefficient, rest = term.as_coeff_Mul()
        if rest != var or not coefficient.is_Integer:
            break
        total += int(coefficient)
    else:
        return total
    derivative = sympy.diff(expr, var)
    return int(derivative) if derivative.is_Integer else None


def affine_coefficients(expr, variables: Sequence[sympy.Symbol]) -> tuple[list[sympy.Expr], sympy.Expr]:
    expanded = sympy.expand(expr)
    coefficients = [expanded.coeff(variable) for variable in variables]
    # xreplace, not subs: the same value for numbers put in for symbols, without subs's sorting and
    # one-pass-per-symbol rebuilding (~180 us a call under cProfile; BERT's lowering calls this 181 times)
    constant = expanded.xreplace({variable: sympy.Integer(0) for variable in variables})
    return coefficients, constant


# A symbolic size from torch's ShapeEnv (`_torch.sym_expr`) is spelled with these functions, not torch's.
_torch.INDEX_FUNCTION_REWRITES.update({
    "FloorDiv": FloorDiv, "CleanDiv": FloorDiv, "CeilDiv": lambda base, divisor: FloorDiv(base + divisor - 1, divisor),
    "PythonMod": Mod, "Mod": Mod,
    "ModularIndexing": lambda base, divisor, modulus: Mod(FloorDiv(base, divisor), modulus),
    "Max": sympy.Max, "Min": sympy.Min, "PowByNatural": sympy.Pow,
})
