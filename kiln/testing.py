"""kiln's accuracy rule, shared by tests, the OpInfo sweep and the benchmarks.

A compiled result is accepted when it is no farther from a float64 reference than
eager's result is, up to a small factor (fusion reorders and skips roundings), with
an absolute floor of a few units in the last place of the output dtype (eager can be
exact where kiln rounds once differently). Both the 2-norm and the max-norm of the
error are checked, so one wrong element in a large tensor is not averaged away.
Integer and bool results must equal eager's exactly; NaN and inf must sit where
eager's are, except where both eager and float64 give a special value and kiln gives float64's, and
where eager overflowed to inf at a value float64 holds finite and kiln gives that value to within
the ulp floor (float32 sinh(-89) and cosh(-89) on this project's AMD EPYC CPU: inf from eager's
vectorized kernel over 48 elements, -2.2448e38 and 2.2448e38 from its scalar path and from float64).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

# Error allowed relative to eager's error, by output dtype.
ERROR_FACTOR = {torch.float64: 2.0, torch.float32: 2.0, torch.float16: 3.0, torch.bfloat16: 3.0}
# Floor in units of the dtype's epsilon, times the reference's magnitude: long fp32 reductions
# legitimately differ by ~sqrt(n) ulp from an eager kernel that accumulates in double.
ULP_FLOOR = 16.0


@dataclass
class Verdict:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok


def _flatten(value) -> list:
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, bool, complex)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in _flatten(value[key])]
    if hasattr(value, "to_tuple"):  # transformers ModelOutput
        return _flatten(value.to_tuple())
    if _is_model_cache(value):
        if isinstance(getattr(value, "layers", None), list):  # DynamicCache & co: each layer's keys and values
            return [type(value).__name__] + [
                leaf for layer in value.layers
                for leaf in _flatten([getattr(layer, "keys", None), getattr(layer, "values", None)])]
        if hasattr(value, "self_attention_cache"):  # EncoderDecoderCache: its two caches
            return [type(value).__name__] + _flatten([value.self_attention_cache, value.cross_attention_cache])
    return [value]


def _is_model_cache(value) -> bool:
    return any(klass.__name__ == "Cache" and klass.__module__.startswith("transformers")
               for klass in type(value).__mro__)


def compare(actual, eager, reference=None, *, factor: float | None = None) -> Verdict:
    """Compare a compiled result with eager's (and a float64 reference when given)."""
    actual_leaves, eager_leaves = _flatten(actual), _flatten(eager)
    reference_leaves = _flatten(reference) if reference is not None else [None] * len(eager_leaves)
    if len(actual_leaves) != len(eager_leaves):
        return Verdict(False, f"{len(actual_leaves)} outputs, eager has {len(eager_leaves)}")
    for position, (got, want, ref) in enumerate(zip(actual_leaves, eager_leaves, reference_leaves)):
        verdict = _compare_leaf(got, want, ref, factor)
        if not verdict.ok:
            return Verdict(False, f"output {position}: {verdict.message}")
    return Verdict(True, "ok")


def _compare_leaf(got, want, ref, factor) -> Verdict:
    if not isinstance(want, torch.Tensor):
        if isinstance(got, torch.Tensor):
            got = got.item() if got.numel() == 1 else got
        if isinstance(want, float) and isinstance(got, (int, float)):
            if want != want:
                return Verdict(got != got, f"{got} != nan")
            return Verdict(abs(got - want) <= 1e-6 * max(1.0, abs(want)), f"{got} != {want}")
        return Verdict(got == want, f"{got!r} != {want!r}")
    if not isinstance(got, torch.Tensor):
        return Verdict(False, f"got {type(got).__name__}, eager gave a tensor")
    if got.shape != want.shape:
        return Verdict(False, f"shape {tuple(got.shape)} != eager's {tuple(want.shape)}")
    if got.dtype != want.dtype:
        return Verdict(False, f"dtype {got.dtype} != eager's {want.dtype}")
    got, want = got.detach().cpu(), want.detach().cpu()
    if not (want.is_floating_point() or want.is_complex()):
        if torch.equal(got, want):
            return Verdict(True, "ok")
        mismatches = int((got != want).sum())
        return Verdict(False, f"{mismatches} of {want.numel()} elements differ from eager (exact dtype {want.dtype})")
    if want.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
        ref = torch.view_as_real(ref.detach().cpu()) if isinstance(ref, torch.Tensor) else None
    reference = (ref.detach().cpu() if isinstance(ref, torch.Tensor) else want).to(torch.float64)
    got64, want64 = got.to(torch.float64), want.to(torch.float64)
    # Where eager's value is special (NaN or inf) and float64's is another special value, kiln may give
    # either: eager's own special values can depend on the CPU's vector kernel (gelu(+inf) is NaN on some).
    exact_ref = ~torch.isfinite(reference) & ~torch.isfinite(want64) if ref is not None \
        else torch.zeros_like(want64, dtype=torch.bool)
    matches_ref = exact_ref & (torch.isnan(got64) & torch.isnan(reference) | (got64 == reference))
    if ref is not None:  # eager's overflow where float64's value is finite: kiln's must be float64's
        close = (got64 - reference).abs() <= ULP_FLOOR * torch.finfo(got.dtype).eps * reference.abs()
        matches_ref |= torch.isinf(want64) & torch.isfinite(reference) & torch.isfinite(got64) & close
    nan_ref = torch.isnan(want64) & ~matches_ref
    nan_got = torch.isnan(got64) & ~matches_ref
    if not torch.equal(nan_got, nan_ref):
        return Verdict(False, f"NaN in {int(nan_got.sum())} places, eager has {int(nan_ref.sum())}")
    inf_want = torch.isinf(want64) & ~matches_ref
    if not torch.equal(torch.isinf(got64) & ~nan_ref & ~matches_ref, inf_want) \
            or not torch.equal(got64[inf_want], want64[inf_want]):
        return Verdict(False, "infinities differ from eager's")
    finite = ~(nan_ref | inf_want | matches_ref) & torch.isfinite(reference)
    got64, want64, reference = got64[finite], want64[finite], reference[finite]
    if got64.numel() == 0:
        return Verdict(True, "ok")
    factor = factor if factor is not None else ERROR_FACTOR.get(got.dtype, 2.0)
    eps = torch.finfo(got.dtype).eps
    magnitude = reference.abs()
    floor_max = ULP_FLOOR * eps * float(magnitude.max().clamp_min(1e-30))
    floor_norm = ULP_FLOOR * eps * float(torch.linalg.vector_norm(magnitude).clamp_min(1e-30))
    err_got_max = float((got64 - reference).abs().max())
    err_eager_max = float((want64 - reference).abs().max())
    err_got_norm = float(torch.linalg.vector_norm(got64 - reference))
    err_eager_norm = float(torch.linalg.vector_norm(want64 - reference))
    if err_got_max > factor * err_eager_max + floor_max:
        return Verdict(False, f"max error {err_got_max:.3g} vs eager's {err_eager_max:.3g} "
                              f"(allowed {factor * err_eager_max + floor_max:.3g})")
    if err_got_norm > factor * err_eager_norm + floor_norm:
        return Verdict(False, f"norm error {err_got_norm:.3g} vs eager's {err_eager_norm:.3g} "
                              f"(allowed {factor * err_eager_norm + floor_norm:.3g})")
    return Verdict(True, "ok")


def to_float64(value):
    """A copy of `value` with every floating tensor in float64 (for reference runs)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
        if value.is_complex():
            return value.detach().to(torch.complex128)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(to_float64(item) for item in value)
    if isinstance(value, dict):
        return {key: to_float64(item) for key, item in value.items()}
    return value


@contextlib.contextmanager
def philox_draws():
    """Within it, eager draws what kiln's kernels draw (kiln/philox.py): `F.dropout`'s masks, on the CPU the dropout of
    `F.scaled_dot_product_attention` (its math path, which a CPU trace takes for attention with dropout), and the
    values of `torch.rand` and `torch.rand_like` (float32, float16, bfloat16). Run an eager twin of a compiled model
    under it, seeded alike, and the two compare value for value with dropout and rand. kiln draws each seed from
    torch's generator where the program calls the op, as this does. (Tensor.bernoulli is not patched.)"""
    from kiln.philox import eager_dropout, eager_rand, eager_rand_like

    functional = torch.nn.functional
    originals = functional.dropout, functional.scaled_dot_product_attention, torch.rand, torch.rand_like
    functional.dropout, functional.scaled_dot_product_attention = eager_dropout, _attention_with_philox_dropout
    torch.rand, torch.rand_like = eager_rand, eager_rand_like
    try:
        yield
    finally:
        functional.dropout, functional.scaled_dot_product_attention, torch.rand, torch.rand_like = originals


def _attention_with_philox_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                   enable_gqa=False):
    """torch's math attention (as a trace decomposes it) with kiln's dropout; torch's own where dropout_p is 0 and
    off the CPU (a CUDA trace keeps a fused kernel, which draws its own dropout as eager's does)."""
    from kiln.philox import eager_dropout

    if not dropout_p or query.device.type != "cpu":
        return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                         scale=scale, enable_gqa=enable_gqa)
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    root = math.sqrt(scale if scale is not None else 1 / math.sqrt(query.size(-1)))
    scores = (query * root) @ (key * root).transpose(-2, -1)
    if is_causal:
        attn_mask = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    return eager_dropout(scores.softmax(-1), dropout_p) @ value
