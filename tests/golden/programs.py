"""The golden corpus: about twenty small canonical programs that together reach most of kiln's backend.

Each `Program` is a plain function of tensors (traced with `torch.fx.symbolic_trace`) and a
factory for its example inputs. Shapes are small but keep the features that pick code paths:
a row longer than `persistent_reduction_max` (looped reduction), few long rows (split
reduction), GPT-2's odd 50257 columns, a transposed input, low-precision and integer dtypes,
a size-1 reduced dim. Input values never reach generated code, only shapes, strides and
dtypes do, so the factories draw from a fixed generator only to keep the inputs honest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    make_inputs: Callable[[torch.Generator], list]
    backward: bool = False  # run a backward too, so AOTAutograd's joint graph gives a backward graph
    doc: str = ""
    options: dict = field(default_factory=dict)  # kiln.config options it compiles with (beyond the defaults)


def _randn(generator, *size, dtype=torch.float32, requires_grad=False):
    return torch.randn(*size, generator=generator, dtype=dtype).requires_grad_(requires_grad)


def _randint(generator, high, *size, dtype=torch.int64):
    return torch.randint(0, high, size, generator=generator, dtype=dtype)


# ---------------------------------------------------------------------------- the programs

def sin_add(x, y):
    return torch.sin(x) + torch.sin(y)


def softmax(x):
    return torch.softmax(x, -1)


def softmax_looped(x):
    return torch.softmax(x, -1)


def log_softmax(x):
    return torch.log_softmax(x, -1)


def layer_norm_gelu(x, weight, bias):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), weight, bias))


def embedding_rms_norm(ids, table, weight):
    hidden = F.embedding(ids, table)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return hidden * torch.rsqrt(variance + 1e-6) * weight


def linear_gelu_residual(hidden, weight, bias, residual):
    return F.gelu(F.linear(hidden, weight, bias)) + residual


def lm_head(hidden, weight):
    return F.linear(hidden, weight)


def conv_bn_relu(x, weight, running_mean, running_var, bn_weight, bn_bias):
    y = F.conv2d(x, weight, padding=1)
    return F.relu(F.batch_norm(y, running_mean, running_var, bn_weight, bn_bias, training=False, eps=1e-5))


def layer_norm_backward(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def var_mean(x):
    variance, mean = torch.var_mean(x, dim=1)
    return variance, mean


def argmax(x):
    return x.argmax(-1)


def cat_index(x, y, index):
    return torch.cat([x, y], dim=0)[index]


def gather(x, index):
    return torch.gather(x, 1, index)


def pad(x):
    return F.pad(x, (1, 2, 3, 0), value=0.5)


def transposed_input(x, y):
    return x * 2.0 + y


def bf16_sum(x, y):
    return (x * y).sum(-1) + x.float().amax(-1).to(torch.bfloat16)


def int_arith(x, y):
    return (x * y + 3) // 2 + x % 5 - (y >> 1)


def size1_reduction(x):
    return x.sum(1)


def split_sum(x):
    return x.sum(-1)


def broadcast_center(x):
    return x - x.mean(dim=(0, 2), keepdim=True)


def masked_fill_max(x, mask):
    return x.masked_fill(mask, float("-inf")).amax(-1)


def attention(q, k, v):
    scores = (q @ k.transpose(-1, -2)) * 0.125
    return torch.softmax(scores, -1) @ v


def cumsum_extern(x):
    return torch.cumsum(x, -1).abs()


PROGRAMS = [
    Program("sin_add", sin_add, lambda g: [_randn(g, 32, 64), _randn(g, 32, 64)]),
    Program("softmax", softmax, lambda g: [_randn(g, 16, 100)], doc="persistent reductions"),
    Program("softmax_looped", softmax_looped, lambda g: [_randn(g, 4, 10000)], doc="a row past persistent_reduction_max"),
    Program("log_softmax", log_softmax, lambda g: [_randn(g, 16, 100)]),
    Program("layer_norm_gelu", layer_norm_gelu, lambda g: [_randn(g, 16, 64), _randn(g, 64), _randn(g, 64)]),
    Program("embedding_rms_norm", embedding_rms_norm,
            lambda g: [_randint(g, 100, 2, 16), _randn(g, 100, 64), _randn(g, 64)]),
    Program("linear_gelu_residual", linear_gelu_residual,
            lambda g: [_randn(g, 40, 64), _randn(g, 96, 64), _randn(g, 96), _randn(g, 40, 96)],
            doc="a product template with its bias, gelu and residual add as epilogue",
            options={"matmul_template": "on"}),
    Program("lm_head", lm_head, lambda g: [_randn(g, 32, 64), _randn(g, 50257, 64)], doc="GPT-2's LM head: odd N"),
    Program("conv_bn_relu", conv_bn_relu,
            lambda g: [_randn(g, 2, 3, 16, 16), _randn(g, 8, 3, 3, 3), _randn(g, 8), _randn(g, 8).abs() + 0.5,
                       _randn(g, 8), _randn(g, 8)]),
    Program("layer_norm_backward", layer_norm_backward,
            lambda g: [_randn(g, 16, 64, requires_grad=True), _randn(g, 64, requires_grad=True),
                       _randn(g, 64, requires_grad=True)], backward=True),
    Program("var_mean", var_mean, lambda g: [_randn(g, 8, 33, 5)]),
    Program("argmax", argmax, lambda g: [_randn(g, 16, 100)]),
    Program("cat_index", cat_index, lambda g: [_randn(g, 4, 8), _randn(g, 6, 8), _randint(g, 10, 7)]),
    Program("gather", gather, lambda g: [_randn(g, 8, 16), _randint(g, 16, 8, 5)]),
    Program("pad", pad, lambda g: [_randn(g, 5, 6, 7)]),
    Program("transposed_input", transposed_input, lambda g: [_randn(g, 48, 32).t(), _randn(g, 32, 48)],
            doc="a non-contiguous (transposed) input"),
    Program("bf16_sum", bf16_sum, lambda g: [_randn(g, 16, 64, dtype=torch.bfloat16),
                                             _randn(g, 16, 64, dtype=torch.bfloat16)]),
    Program("int_arith", int_arith, lambda g: [_randint(g, 100, 16, 32), _randint(g, 100, 16, 32)]),
    Program("size1_reduction", size1_reduction, lambda g: [_randn(g, 8, 1, 16)]),
    Program("split_sum", split_sum, lambda g: [_randn(g, 2, 16384)], doc="few long rows: a split reduction"),
    Program("broadcast_center", broadcast_center, lambda g: [_randn(g, 4, 8, 16)]),
    Program("masked_fill_max", masked_fill_max, lambda g: [_randn(g, 8, 32), _randn(g, 8, 32) > 0.5]),
    Program("attention", attention, lambda g: [_randn(g, 2, 4, 16, 8), _randn(g, 2, 4, 16, 8), _randn(g, 2, 4, 16, 8)]),
    Program("cumsum_extern", cumsum_extern, lambda g: [_randn(g, 4, 32)], doc="an op without a lowering: an Extern"),
]

PROGRAMS_BY_NAME = {program.name: program for program in PROGRAMS}
