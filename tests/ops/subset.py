"""The CI subset of the sweep: a few samples of ops chosen to touch every lowering family.

Each family lists OpInfo names; every op runs in float32, and the ops in BFLOAT16 also in
bfloat16 (low-precision loads, fp32 math, rounding on store). Samples are capped at
SAMPLES_PER_CASE, spread over OpInfo's list, so the whole subset runs in a few minutes
under the Triton interpreter. Add an op here when a new lowering family appears.
"""
from __future__ import annotations

from tests.ops.harness import Case, cases_for, find_opinfos

SAMPLES_PER_CASE = 3

FAMILIES = {
    "unary math": ["abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "tanh", "sigmoid", "erf",
                   "reciprocal", "round", "nn.functional.relu"],
    "binary math": ["add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "pow", "maximum",
                    "remainder", "lerp", "addcmul"],
    "comparisons and logic": ["eq", "lt", "ge", "isnan", "logical_and"],
    "selection": ["where", "masked_fill", "clamp", "nn.functional.hardtanh"],
    "casts": ["to", "bfloat16", "float", "long", "bool"],
    "reductions": ["sum", "prod", "amax", "amin", "argmax", "argmin", "mean", "var", "std", "var_mean",
                   "max.reduction_with_dim", "logsumexp", "any"],
    "scans": ["cumsum"],
    "views": ["view", "reshape", "permute", "transpose", "expand", "narrow", "select", "squeeze",
              "unsqueeze", "as_strided", "t", "split"],
    "copies and layout": ["cat", "stack", "constant_pad_nd", "flip", "tril"],
    "factories": ["full", "arange", "zeros", "ones", "zeros_like"],
    "indexing": ["gather", "index_select", "nn.functional.embedding", "scatter_add", "index_put"],
    "normalization and activations": ["softmax", "log_softmax", "nn.functional.layer_norm",
                                      "nn.functional.rms_norm", "nn.functional.gelu", "nn.functional.silu",
                                      "nn.functional.group_norm"],
    "externs": ["mm", "bmm", "addmm", "matmul", "nn.functional.linear", "nn.functional.conv2d"],
    "random (shape only)": ["nn.functional.dropout", "bernoulli"],
}

BFLOAT16 = {"add", "mul", "div.no_rounding_mode", "exp", "rsqrt", "tanh", "sigmoid",
            "where", "clamp", "to", "float", "sum", "amax", "argmax", "mean", "var", "cumsum",
            "cat", "gather", "nn.functional.embedding", "softmax", "log_softmax", "nn.functional.layer_norm",
            "nn.functional.rms_norm", "nn.functional.gelu", "nn.functional.silu", "mm"}


def subset_cases() -> list[Case]:
    """Every (op, dtype) case of the subset that the op supports on CPU, in family order."""
    cases = []
    for names in FAMILIES.values():
        for name in names:
            (op,) = [op for op in find_opinfos([name])
                     if (f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name) == name]
            dtypes = ["float32", "bfloat16"] if name in BFLOAT16 else ["float32"]
            cases.extend(cases_for(op, dtypes))
    return cases


# The gradient subset (tests/ops/test_opinfo_grad.py): float32 only, one representative per family
# that has a derivative, so that both CPU backends run it in a few minutes.
GRAD_SAMPLES_PER_CASE = 3

GRAD_FAMILIES = {
    "unary math": ["exp", "log", "sqrt", "tanh", "sigmoid", "abs", "nn.functional.relu"],
    "binary math": ["add", "mul", "div.no_rounding_mode", "pow", "maximum", "where", "clamp"],
    "reductions": ["sum", "mean", "amax", "var", "max.reduction_with_dim", "logsumexp", "prod"],
    "scans": ["cumsum"],
    "normalization and activations": ["softmax", "log_softmax", "nn.functional.layer_norm",
                                      "nn.functional.rms_norm", "nn.functional.gelu", "nn.functional.silu"],
    "matmul family": ["mm", "bmm", "addmm", "matmul", "nn.functional.linear"],
    "indexing": ["gather", "index_select", "scatter_add", "index_put", "masked_fill"],
    "views and copies": ["reshape", "permute", "expand", "select", "cat", "stack", "constant_pad_nd"],
    "embedding": ["nn.functional.embedding"],
    "losses": ["nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.nll_loss",
               "nn.functional.soft_margin_loss",  # its sample 0 (y x = 15) cancelled in torch's decomposition
               "nn.functional.binary_cross_entropy_with_logits"],
}


def grad_subset_cases() -> list[Case]:
    """Every backward float32 case of GRAD_FAMILIES (ops that support autograd), in family order."""
    cases = []
    for names in GRAD_FAMILIES.values():
        for name in names:
            (op,) = [op for op in find_opinfos([name])
                     if (f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name) == name]
            cases.extend(cases_for(op, ["float32"], ["backward"]))
    return cases
