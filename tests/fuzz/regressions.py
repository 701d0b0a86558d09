"""Every failure the fuzzer found, and every case the outside review listed, as data.

Two tables:

- `REGRESSIONS`: hand-written (or minimized) programs, each with the bug it exercises
  and, per backend, the reason it still fails today (`known`). They run in CI on both
  backends (tests/fuzz/test_fuzz.py) and with `python -m tests.fuzz --regressions`.
- `KNOWN_FUZZ_FAILURES`: programs of the CI subset (named by seed and index: the
  generator maps them to the same text forever) that fail today, keyed by
  (seed, index, backend), with the bug class they hit (one of the `BUG_*` reasons).

A known failure that starts passing fails the test ("fixed: remove the entry"), so the
fix that closes a bug class removes its entries here (and the `known` reasons of the
regression programs it fixes) in the same commit. A program not listed must pass: its
outputs equal eager's under kiln.testing's rule, and a hand-written regression must also
be compiled by kiln (no graph may fall back to eager).

To add a failure the fuzzer found: minimize it (`python -m tests.fuzz --minimize --seed S
--index K --backend B`), paste the printed `explicit(...)` entry into REGRESSIONS with the
bug class, and, if its seed is in the CI subset, list it in KNOWN_FUZZ_FAILURES.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tests.fuzz.program import InputSpec, Program, Statement
from tests.fuzz.runner import Outcome

BACKENDS = ("cpp", "triton")

# ---------------------------------------------------------------------------- bug classes
# One line each: what is wrong, where, and the smallest program that shows it (in REGRESSIONS).


@dataclass(frozen=True)
class Regression:
    """A program with what it exercises and, per backend ('*': both), why it fails today."""

    program: Program
    bug: str
    known: dict = field(default_factory=dict)
    backends: tuple = ("cpp", "triton", "cuda")  # where it runs ("cuda": Triton on a GPU)
    needs_graph: bool = True  # kiln must compile it (False: a program without tensor ops)

    @property
    def name(self) -> str:
        return self.program.name

    def known_failure(self, backend: str) -> str | None:
        return self.known.get(backend) or self.known.get("*")


def spec(name: str, shape: tuple, dtype: str = "float32", values: str = "randn", **details) -> InputSpec:
    """An input of a hand-written program (the seed defaults to one per name, so runs repeat)."""
    details.setdefault("seed", sum(map(ord, name)) * 7919)
    return InputSpec(name, tuple(shape), dtype, values, **details)


def explicit(label: str, inputs: list, body: str, outputs: tuple, note: str = "") -> Program:
    """A hand-written program: `body` holds one `v = expr` statement per line."""
    statements = []
    for line in body.strip().splitlines():
        target, expr = line.split("=", 1)
        statements.append(Statement(target.strip(), expr.strip()))
    return Program(0, 0, tuple(inputs), tuple(statements), tuple(outputs), note=note, label=label)


_ARANGE_3x4 = spec("x0", (3, 4), values="arange", low=1)
_INDEX_0123 = spec("x1", (4,), "int64", values="arange", low=0)

REGRESSIONS: list[Regression] = [
    # ---- the outside review's cases
    Regression(explicit("review_pad_then_index", [_ARANGE_3x4, _INDEX_0123],
                        "v0 = F.pad(x0, (0, 0, 2, 1))[x1 + 1]", ("v0",)),
               "F.pad(x,(0,0,2,1))[i+1]: rows of a padded value picked by a computed index"),
    Regression(explicit("review_index_select_of_pad", [_ARANGE_3x4, _INDEX_0123],
                        "v0 = torch.index_select(F.pad(x0, (1, 1)), 1, x1 + 1)", ("v0",)),
               "index_select of a padded value with a computed index"),
    Regression(explicit("review_cat_then_index", [_ARANGE_3x4, _INDEX_0123],
                        "v0 = torch.cat([x0, 2 * x0], 0)[x1 + 1]", ("v0",)),
               "torch.cat([x, 2*x], 0)[i+1]"),
    Regression(explicit("review_stack_then_index", [_ARANGE_3x4, _INDEX_0123],
                        "v0 = torch.stack([x0, 2 * x0], 0)[(x1 + 1) % 2]\n"
                        "v1 = torch.stack([x0, x0 + 1], 2).reshape(3, 8)[:, x1 * 2 - 1]\n"
                        "v2 = torch.index_select(torch.stack([x0, -x0], 1), 1, (x1 + 1) % 2)", ("v0", "v1", "v2")),
               "torch.stack variants indexed by computed indices"),
    Regression(explicit("review_sign_of_bool", [spec("x0", (3, 5), "bool", values="bool")],
                        "v0 = torch.sign(x0)\nv1 = torch.sign(x0) & x0", ("v0", "v1")),
               "torch.sign of a bool tensor (bool result, True -> True)"),
    Regression(explicit("review_layer_norm_constant_rows", [spec("x0", (4, 7), values="full", scale=0.7)],
                        "v0 = F.layer_norm(x0, (7,))\n"
                        "v1 = (x0 - x0.mean(-1, keepdim=True)) / torch.sqrt(x0.var(-1, keepdim=True, correction=0) "
                        "+ 1e-5)", ("v0", "v1")),
               "layer_norm of constant rows is exactly 0 (eager's is)"),
    Regression(explicit("review_amax_of_size1_dim_beside_pointwise", [spec("x0", (3, 1))],
                        "v0 = x0.amax(1)\nv1 = x0 * 2", ("v0", "v1")),
               "x.amax(1) with x of shape (3, 1) beside a pointwise op"),
    Regression(explicit("amax_of_size1_dim_of_pointwise_output", [spec("x0", (3, 1))],
                        "v0 = x0 * 2\nv1 = v0.amax(1)", ("v1", "v0")),
               "x.amax(1) with x of shape (3, 1) reading a pointwise value that is also returned"),
    Regression(explicit("seed0_prog87_min", [spec("x0", (1, 1))],
                        "v0 = x0.bfloat16()\nv1 = v0.argmax(0, True)", ("v1", "v0")),
               "argmax over a size-1 dim of a returned cast (CI program seed 0 #87, minimized)"),
    Regression(explicit("review_sign_of_nan", [spec("x0", (4, 6), nonfinite=0.5)],
                        "v0 = torch.sign(x0)\nv1 = torch.sign(x0) == 0", ("v0", "v1")),
               "torch.sign(nan) is 0, as in eager"),
    Regression(explicit("review_var_std_constant_rows", [spec("x0", (5, 9), values="full", scale=0.3)],
                        "v0 = x0.var(-1)\nv1 = x0.std(1, keepdim=True)\nv2 = torch.var(x0, dim=(0, 1), correction=0)",
                        ("v0", "v1", "v2")),
               "var and std of constant rows are exactly 0"),
    Regression(explicit("review_rms_norm_of_expanded_compared_cast",
                        [spec("x0", (3, 1)), spec("x1", (4, 3, 8), layout="expanded", layout_arg=(1, (2,)))],
                        "v0 = x0.expand(3, 8)\nv1 = (v0 > 0.0).to(torch.float32)\n"
                        "v2 = v1 * torch.rsqrt(v1.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
                        "v3 = (x1 > 0.5).float()\nv4 = F.rms_norm(v3, (8,))", ("v2", "v4")),
               "RMSNorm over an expanded, compared and cast input (sympy PolynomialError in indexing)"),
    Regression(explicit("review_minimum_of_0dim_results", [spec("x0", (5,))],
                        "v0 = torch.linalg.vector_norm(x0, dim=0)\nv1 = x0.amax()\nv2 = torch.minimum(v0, v1)",
                        ("v2",)),
               "torch.minimum of two 0-dim results (one a vector_norm over the only dim) has shape ()"),
    Regression(explicit("review_minimum_of_0dim_results_size1_negative_dim", [spec("x0", (1,))],
                        "v0 = torch.linalg.vector_norm(x0, dim=-1)\nv1 = x0.amax()\nv2 = torch.minimum(v0, v1)",
                        ("v2", "v0")),
               "the same with x of shape (1,) and dim=-1: torch 2.11's shape rule for vector_norm kept the size-1 "
               "dim (shape (1,); kiln/_torch.py fixes the rule)"),
    Regression(explicit("review_float32_sum_of_2_24_elements", [spec("x0", (1 << 24,), values="uniform", scale=1.0)],
                        "v0 = x0.sum()\nv1 = (x0 * 2).sum(0)", ("v0", "v1")),
               "a float32 sum of 2^24 elements is as accurate as eager's (pairwise, not one running sum)",
               backends=("cpp", "cuda")),  # minutes under the Triton interpreter: the 2^13 one below runs there
    # ---- found by the fuzzer (minimized; the seed they came from in the name)
    Regression(explicit("returns_other_input", [spec("x0", (3, 4)), spec("x1", (3, 4))],
                        "v0 = x1", ("v0",)),
               "a program that only returns an input", needs_graph=False),
    Regression(explicit("returns_inputs_swapped", [spec("x0", (5,)), spec("x1", (5,)), spec("x2", (5,))],
                        "v0 = x2\nv1 = x0", ("v0", "v1")),
               "a program that returns inputs in another order", needs_graph=False),
    Regression(explicit("seed1_prog141_min", [spec("x0", (2, 5), nonfinite=0.5)],
                        "v0 = F.gelu(x0)\nv1 = F.gelu(x0, approximate='tanh')", ("v0", "v1")),
               "gelu of nan and +-inf"),
    Regression(explicit("seed1_prog47_min", [spec("x0", (1,))],
                        "v0 = F.gelu(x0)\nv1 = F.layer_norm(v0, (1,))", ("v1",)),
               "layer_norm over one element is exactly 0"),
    Regression(explicit("seed1_prog229_min", [spec("x0", (11, 1), "int64", values="randint", low=0, high=3),
                                              spec("x1", (3,), "int64", values="arange", low=9)],
                        "v0 = torch.cat([x0, 2 * x0], 0)\nv1 = v0.index_select(0, 25 - x1)", ("v1",)),
               "index_select of an int cat with a computed index (rows 14..16: the second part)"),
    Regression(explicit("seed1_prog251_min", [spec("x0", (6,), scale=3.0)],
                        "v0 = torch.log1p(x0)\nv1 = torch.sign(v0)", ("v1",)),
               "sign of a computed nan (log1p below -1)"),
    Regression(explicit("seed1_prog255_min", [spec("x0", (2, 3))],
                        "v0 = x0 > 0.0\nv1 = v0.movedim(1, 0)\nv2 = v1.masked_fill_(v1, True)", ("v0",)),
               "an output mutated through its permuted view keeps its own strides"),
    Regression(explicit("seed1_prog279_min", [spec("x0", (2, 1, 3, 1), layout="transposed", layout_arg=(0, 2)),
                                              spec("x1", (1, 1, 1, 1), "int64", values="randint", low=-4, high=5)],
                        "v0 = x1 < x0\nv1 = v0.masked_fill_(v0, True)", ("v0",)),
               "an output of a permuted input, written in place, keeps eager's strides"),
    Regression(explicit("seed3001_prog1102_masked_fill_of_transposed_isnan",
                        [spec("x1", (3, 2, 2), layout="permuted", layout_arg=(1, 2, 0)),
                         spec("x2", (3, 2, 2), "bool", values="bool")],
                        "v1 = torch.isnan(x1)\nv2 = v1.transpose(1, 2)\nv5 = v2.masked_fill_(x2, True)\nv7 = v5 < 2",
                        ("v7", "v5")),
               "masked_fill_ on a transposed view of an intermediate: the output is eager's view (seed 3001 #1102)"),
    Regression(explicit("seed3002_prog403_logical_xor_0dim_first",
                        [spec("x3", (16,), "int64", values="randint", low=-3, high=11),
                         spec("x2", (11, 8, 8), layout="transposed", layout_arg=(0, 2))],
                        "v2 = x3.amin(dim=0)\nv7 = torch.logical_xor(v2, x2)", ("v7",)),
               "logical_xor of a 0-dim and a transposed tensor follows the transposed one (seed 3002 #403)"),
    Regression(explicit("seed2_prog46_min", [spec("x0", (3, 16), layout="expanded", layout_arg=(1, (1,)),
                                                  seed=883465091),
                                             spec("x1", (19, 3), seed=0)],
                        "v0 = x1 @ x0\nv1 = v0.var(dim=(0, 1), keepdim=True, correction=1)", ("v1",)),
               "var over all of a product with constant rows is as accurate as eager's"),
    Regression(explicit("seed2_prog198_min", [spec("x0", (1, 2, 2, 2), seed=372060781),
                                              spec("x1", (5,), "int64", values="randint", low=-2, high=2)],
                        "v0 = x0[:, ((x1 * 2 + 1) % 2)]\nv1 = F.pad(v0, (0, -1))\nv2 = v1.transpose(1, 0)\n"
                        "v3 = torch.var(v2, dim=-4, keepdim=True, correction=1)", ("v3",)),
               "var over repeated (gathered) rows is exactly 0"),
    Regression(explicit("seed2_prog255_min", [spec("x0", (6, 0, 7, 6))],
                        "v0 = torch.var(x0, dim=(-4, 1), keepdim=True, correction=1) >= 3.0", ("v0",)),
               "a reduction over 0 elements, on every backend (Triton: one column and wide row blocks; it took "
               "25-50 s per call under the interpreter with a (1, 1024) block per row)"),
    Regression(explicit("seed3008_prog303_min", [spec("x2", (11, 0, 13, 6), "bool", values="bool")],
                        "v9 = torch.all(x2, dim=1)\nv10 = x2.sum(1)", ("v9", "v10")),
               "all() and sum() over a 0-size dim of 858 rows: 160 s on the Triton interpreter, now under 1 s"),
    Regression(explicit("seed1_prog81_min", [spec("x0", (2, 0, 2, 6), seed=1)],
                        "v0 = F.layer_norm(x0, (6,))", ("v0",)),
               "layer_norm of a tensor with a 0-size dim compiles"),
    Regression(explicit("seed1_prog172_min", [spec("x0", (2, 5), seed=536474522)],
                        "v0 = x0.clone()\nv1 = v0[..., ::2].add_(-1.5)\nv2 = v1.flatten(0, 1)\nv3 = v2.add_(-0.25)\n"
                        "v4 = F.log_softmax(v3, dim=0)", ("v4",)),
               "log_softmax of a flattened stepped slice written in place compiles"),
    Regression(explicit("seed1_prog6_min", [spec("x0", (1, 1), "bool", values="bool")],
                        "v0 = torch.sign(x0)", ("v0",)),
               "sign of a bool tensor alone in a kernel"),
    Regression(explicit("seed101_prog1864_min", [spec("x2", (2, 1, 6, 1), scale=3.0, seed=1918626517),
                                                 spec("x3", (1, 1), seed=0)],
                        "v1 = F.gelu(x2)\nv3 = torch.fmod(x3, v1)", ("v3",)),
               "fmod by gelu of x < -5.54, where eager's gelu is exactly 0 (NaN, as in eager)"),
    Regression(explicit("seed101_prog2148_min", [spec("x1", (2, 1), layout="expanded", layout_arg=(1, ()),
                                                 seed=481762342)],
                        "v1 = F.silu(x1)\nv2 = v1.var(dim=(0, -1), correction=0)", ("v2",)),
               "var of a computed value of equal elements is exactly 0 (cpp: g++'s fma contraction differed "
               "between the var's passes)"),
    Regression(explicit("seed101_prog2303_min", [spec("x8", (1, 2), "bool", values="bool")],
                        "v5 = torch.sin(x8)\nv6 = v5.neg_()\nv8 = torch.reciprocal(v5)\n"
                        "v20 = v8.nan_to_num(0.0, 100.0, -100.0).clamp(-100, 100).long()", ("v20",)),
               "-x of +0.0 is -0.0, so its reciprocal is -inf (Triton: -x was 0 - x)"),
    Regression(explicit("seed2_remainder_by_scalar_min", [spec("x5", (1, 6, 12), "bfloat16", seed=2)],
                        "v0 = torch.remainder(x5, 0.1)\nv1 = torch.reciprocal(v0)", ("v1",)),
               "remainder of bf16 by a Python scalar divides by bf16(0.1), as eager: its zeros (reciprocal's "
               "infinities) are eager's"),
    Regression(explicit("cuda_remainder_of_pad_plus_scalar", [spec("x0", (3, 5, 4), "float16", seed=11)],
                        "v0 = torch.remainder(F.pad(x0, (-1, 0, 3, -1)) + 0.1, 0.1)", ("v0",)),
               "fp16 remainder by a scalar of padded zeros plus the scalar is 0, as eager (H200: error 0.1)"),
    Regression(explicit("seed25506151_signbit_of_sqrt_min", [spec("x", (1, 3), seed=25506151)],
                        "v0 = torch.stack([torch.signbit(torch.sqrt(x)), torch.sqrt(x)], -3)", ("v0",)),
               "signbit of sqrt's NaN is eager's (+NaN on CPU float32)"),
    Regression(explicit("seed3006_prog8708_pow3_of_bf16", [spec("x0", (13, 11, 11), "bfloat16", seed=1166169187)],
                        "v0 = torch.pow(x0, 3.0)\nv1 = torch.pow(x0, -2.0)", ("v0", "v1")),
               "pow(bf16, 3 or -2) rounds x * x to bf16 as eager does (CPU and CUDA; fp16 too on CUDA): it was "
               "0.125 off"),
    Regression(explicit("seed3009_prog5079_layer_norm_of_recomputed_atan2",
                        [spec("x0", (4, 5, 1), seed=2111928862, scale=3.0), spec("x1", (1, 1), seed=1491720722,
                                                                                scale=3.0),
                         spec("x2", (4,), "int64", values="arange", low=0)],
                        "v0 = torch.atan2(x0, x1)\nv1 = F.layer_norm(v0, (1,))\nv2 = v1[(x2 + -1) % 4]", ("v2",)),
               "layer_norm over a size-1 dim of atan2 is exactly 0 (cpp: the mean's scalar loop called libm's "
               "atan2f and the gather's vector loop libmvec's, 1 ulp apart, times rsqrt(eps))"),
    Regression(explicit("seed3013_prog9842_relu_of_nan_product",
                        [spec("x0", (16, 7), scale=0.1, nonfinite=0.1, seed=2002682450)],
                        "v1 = x0 @ x0.mT\nv2 = v1.relu_()\nv4 = torch.isfinite(v1)\nv5 = torch.relu(x0.mT @ x0)",
                        ("v4", "v5")),
               "relu of a product with NaN keeps the NaN (cpp and the interpreter: oneDNN's relu post-op made it 0)"),
    Regression(explicit("float32_sum_of_2_13_elements", [spec("x0", (1 << 13,), values="uniform", scale=1.0)],
                        "v0 = x0.sum()\nv1 = (x0 * 2).sum(0)", ("v0", "v1")),
               "a float32 sum of 2^13 elements (a split reduction) is as accurate as eager's: the review's 2^24 "
               "case at a size the Triton interpreter runs in seconds", backends=("triton",)),
]


# (seed, index, backend) -> bug class, for the programs of the CI subset that fail today.
KNOWN_FUZZ_FAILURES: dict[tuple[int, int, str], str] = {}


def regression_programs(backend: str | None = None, device: str = "cpu") -> list[Regression]:
    """The regressions that run on `backend` (on CUDA every one marked 'cuda')."""
    where = "cuda" if device == "cuda" else backend
    return [entry for entry in REGRESSIONS if where is None or where in entry.backends]


def check_result(entry: Regression, result, backend: str, *, strict_strides: bool = True) -> str:
    """'' when `result` is what the table says for `entry` on `backend`, else what is wrong."""
    return check_outcome(result, entry.known_failure(backend), strict_strides=strict_strides,
                         must_compile=entry.needs_graph)


def check_outcome(result, known: str | None, *, strict_strides: bool = False, must_compile: bool = False) -> str:
    """'' when `result` agrees with its known-failure reason (None: it must pass), else the problem."""
    failing = result.outcome in Outcome.FAILURES or result.outcome == Outcome.INVALID \
        or (strict_strides and result.outcome == Outcome.STRIDE) or (must_compile and not result.compiled)
    if known:
        if failing:
            return ""
        return f"fixed: remove the entry ({result.name} now {result.outcome}; it was listed as: {known[:120]})"
    if must_compile and not result.compiled and result.outcome not in Outcome.FAILURES:
        return f"{result.name}: kiln did not compile it: {'; '.join(result.fallbacks) or 'no graph captured'}"
    if failing:
        return f"{result.name}: {result.outcome}: {result.message or result.stride_message}"
    return ""
