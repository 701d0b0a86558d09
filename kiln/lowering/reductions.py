"""Reduction rules: sum, prod, amax/amin, max/min (values and indices), argmax/argmin,
mean, var/std/var_mean (one Welford pass), any/all.

Each becomes one Reduction node; reductions over the same rows are fused into one
kernel later by the scheduler (kiln/schedule), so rules never combine them here.
"""
from __future__ import annotations

import sympy
import torch

from kiln import _torch
from kiln.lowering.context import Unsupported, compute_dtype_for, meta_of
from kiln.lowering.registry import lowering

aten = _torch.aten


def _dims(value, dim) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(value.ndim))
    if isinstance(dim, int):
        return [dim]
    return list(dim)


def _accumulate_dtype(input_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    if out_dtype.is_floating_point:
        return compute_dtype_for(out_dtype)
    if out_dtype == torch.bool:
        return torch.int32
    return out_dtype


@lowering(aten.sum.dim_IntList, aten.sum.default, aten.prod.dim_int, aten.prod.default)
def sum_or_prod(ctx, node, x, dim=None, keepdim=False, dtype=None):
    kind = "sum" if node.target in (aten.sum.dim_IntList, aten.sum.default) else "prod"
    if kind == "prod" and isinstance(dim, int):
        dim = [dim]
    meta = meta_of(node)
    return ctx.reduction(x, _dims(x, dim), kind, metas=[meta], keepdim=keepdim,
                         compute_dtype=_accumulate_dtype(x.dtype, meta.dtype))[0]


@lowering(aten.mean.dim, aten.mean.default)
def mean(ctx, node, x, dim=None, keepdim=False, dtype=None):
    meta = meta_of(node)
    dtype = compute_dtype_for(meta.dtype)
    if not dtype.is_floating_point:
        raise Unsupported("mean of integers")

    def finish(body, total, count):
        return [body.emit("truediv", (total, _count(body, count, dtype)), dtype)]

    return ctx.reduction(x, _dims(x, dim), "sum", metas=[meta], keepdim=keepdim, compute_dtype=dtype,
                         finish=finish)[0]


def _count(body, count, dtype):
    if isinstance(count, sympy.Basic) and not count.is_Integer:
        return body.to_dtype(body.index_expr(count), dtype)
    return body.constant(int(count), dtype)


@lowering(aten.amax, aten.amin, aten.max.default, aten.min.default)
def amax_amin(ctx, node, x, dim=None, keepdim=False):
    kind = "max" if node.target in (aten.amax.default, aten.max.default) else "min"
    if x.dtype == torch.bool:
        raise Unsupported(f"{kind} of bool")
    return ctx.reduction(x, _dims(x, dim), kind, metas=[meta_of(node)], keepdim=keepdim)[0]


@lowering(aten.argmax, aten.argmin)
def argmax_argmin(ctx, node, x, dim=None, keepdim=False):
    kind = "argmax" if node.target is aten.argmax.default else "argmin"
    if dim is None and x.ndim > 1:
        raise Unsupported(f"{kind} over a flattened tensor")
    if x.dtype == torch.bool:
        raise Unsupported(f"{kind} of bool")
    return ctx.reduction(x, _dims(x, dim), kind, metas=[meta_of(node)], keepdim=keepdim)[0]


@lowering(aten.max.dim, aten.min.dim)
def max_min_dim(ctx, node, x, dim, keepdim=False):
    values_meta, indices_meta = meta_of(node)
    kind = "max" if node.target is aten.max.dim else "min"
    if x.dtype == torch.bool:
        raise Unsupported(f"{kind} of bool")
    values = ctx.reduction(x, [dim], kind, metas=[values_meta], keepdim=keepdim)[0]
    indices = ctx.reduction(x, [dim], "arg" + kind, metas=[indices_meta], keepdim=keepdim)[0]
    return values, indices


@lowering(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def any_all(ctx, node, x, dim=None, keepdim=False):
    kind = "any" if node.target in (aten.any.default, aten.any.dim, aten.any.dims) else "all"
    meta = meta_of(node)
    if meta.dtype != torch.bool:
        raise Unsupported(f"{kind} returning {meta.dtype}")
    dims = [dim] if isinstance(dim, int) else _dims(x, dim)
    return ctx.reduction(x, dims, kind, metas=[meta], keepdim=keepdim, compute_dtype=torch.bool)[0]


def _welford(ctx, node, x, dim, correction, keepdim, outputs: tuple):
    """var/std/mean from one Welford reduction; `outputs` names what to store, in order."""
    metas = meta_of(node)
    metas = list(metas) if isinstance(metas, (list, tuple)) else [metas]
    dtype = compute_dtype_for(metas[0].dtype)
    if not dtype.is_floating_point:
        raise Unsupported("variance of integers")
    correction = 1 if correction is None else correction

    def finish(body, reduced, count):
        mean_value = body.emit("getitem", (reduced,), dtype, attr=0)
        if isinstance(count, sympy.Basic) and count.is_Integer and int(count) == 0:
            mean_value = body.constant(float("nan"), dtype)  # the mean of nothing is 0/0
        m2 = body.emit("getitem", (reduced,), dtype, attr=1)
        if isinstance(count, sympy.Basic) and not count.is_Integer:
            denominator = body.emit("maximum", (body.emit("sub", (_count(body, count, dtype),
                                                                  body.constant(correction, dtype)), dtype),
                                                body.constant(0, dtype)), dtype)
        else:
            denominator = body.constant(max(int(count) - correction, 0), dtype)
        variance = body.emit("truediv", (m2, denominator), dtype)
        results = {"var": variance, "mean": mean_value}
        if "std" in outputs:
            results["std"] = body.emit("sqrt", (variance,), dtype)
        return [results[name] for name in outputs]

    dims = _dims(x, dim)
    values = ctx.reduction(x, dims, "welford", metas=metas, keepdim=keepdim, compute_dtype=dtype, finish=finish)
    return values if len(values) > 1 else values[0]


@lowering(aten.var.correction, aten.var.dim, aten.var.default)
def var(ctx, node, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(unbiased, bool):
        correction = 1 if unbiased else 0
    elif unbiased is not None:
        dim, keepdim = unbiased, keepdim
    return _welford(ctx, node, x, dim, correction, keepdim, ("var",))


@lowering(aten.std.correction, aten.std.dim, aten.std.default)
def std(ctx, node, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(unbiased, bool):
        correction = 1 if unbiased else 0
    return _welford(ctx, node, x, dim, correction, keepdim, ("std",))


@lowering(aten.var_mean.correction, aten.var_mean.dim, aten.var_mean.default)
def var_mean(ctx, node, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(unbiased, bool):
        correction = 1 if unbiased else 0
    return tuple(_welford(ctx, node, x, dim, correction, keepdim, ("var", "mean")))
