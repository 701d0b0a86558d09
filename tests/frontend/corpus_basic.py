"""Corpus, part 1: arithmetic, tensor ops, control flow, loops, comprehensions, closures, globals.

Every function here is a program checked by tests/frontend/test_corpus.py (see
corpus_support.py for what `@program` declares). Nothing in this file may run
during a compiled call: the checker watches for frames from this file.
"""
from __future__ import annotations

import functools
import math
import operator
import sys

import torch
import torch.nn.functional as F

from tests.frontend.corpus_support import (program, replace_arg, reshape_first, set_attribute, set_closure, tensors,
                                           with_values)

this_module = sys.modules[__name__]

# ---------------------------------------------------------------- arithmetic and tensor ops


@program()
def add(x, y):
    return x + y


@program()
def arithmetic_mix(x, y):
    return (x - y) * 2.5 / (y.abs() + 1) + x ** 2 - 3


@program()
def reflected_scalars(x, y):
    return 1 - x, 2 / (y.abs() + 1), 3 * x, 2 ** y.clamp(-2, 2)


@program()
def negation_and_abs(x, y):
    return -x, abs(y), +x


@program(args=tensors((4, 3), (3, 5)))
def matmul_operator(x, w):
    return x @ w


@program()
def inplace_on_intermediate(x, y):
    z = x.clone()
    z += y
    z *= 2
    z.sub_(1)
    return z


@program()
def comparisons_make_masks(x, y):
    mask = (x > y) & (x > 0)
    return torch.where(mask, x, y), mask, x == y


@program()
def torch_functions(x, y):
    return torch.sin(x) + torch.exp(-y.abs()), torch.softmax(x, dim=-1), torch.tanh(y)


@program()
def tensor_methods(x, y):
    return x.sigmoid().sum(dim=1, keepdim=True), y.mean(), x.t().contiguous()


@program()
def views_and_shapes(x, y):
    z = x.reshape(2, 6).permute(1, 0).unsqueeze(0)
    return z.flatten(), y.view(-1), x.transpose(0, 1).shape


@program()
def reductions_with_named_tuples(x, y):
    values, indices = x.max(dim=1)
    result = y.min(dim=0)
    return values, indices, result.values, result.indices


@program()
def cat_stack_split(x, y):
    both = torch.cat([x, y], dim=0)
    first, second = both.split(4, dim=0)
    chunks = torch.stack((x, y)).chunk(2, dim=0)
    return first - second, chunks[0], len(chunks)


@program()
def indexing_reads(x, y):
    return x[0], x[:, 1], x[1:3, ::2], x[None, ..., -1], y[[0, 2]]


@program()
def indexing_with_tensor(x, y):
    return x[torch.tensor([2, 0])], y[torch.arange(2)], x.masked_fill(y > 0, 0.0)


@program()
def setitem_on_clone(x, y):
    z = x.clone()
    z[0] = 0.0
    z[:, 1] = y[:, 1]
    return z


@program()
def functional_ops(x, y):
    return F.relu(x), F.gelu(y), F.layer_norm(x, (3,)), F.dropout(x, p=0.5, training=False)


@program()
def factory_functions(x, y):
    ones = torch.ones(4, 3)
    ramp = torch.arange(12, dtype=x.dtype).reshape(4, 3)
    return x * ones + ramp + torch.zeros_like(y) + torch.full((4, 3), 2.0)


@program()
def dtype_conversions(x, y):
    return x.to(torch.float16).float(), (y > 0).int(), x.type_as(y), x.to(y.dtype)


@program()
def metadata_queries(x, y):
    return x * x.dim() + x.numel() + x.size(0) + y.shape[-1] + x.element_size()


@program()
def python_math_on_shapes(x, y):
    scale = 1.0 / math.sqrt(x.shape[-1])
    return x * scale + math.floor(2.7) + max(x.shape) - min(y.shape)


@program()
def operator_module(x, y):
    return operator.add(x, y), operator.mul(x, 2), operator.getitem(x, 0), operator.neg(y)


@program()
def einsum_and_bmm(x, y):
    return torch.einsum("ij,kj->ik", x, y), torch.bmm(x[None], y.t()[None])


@program(args=tensors((2, 3, 8, 8)))
def conv_functional(x):
    weight = torch.ones(4, 3, 3, 3, dtype=x.dtype) / 27
    return F.conv2d(x, weight, padding=1).relu().mean(dim=(2, 3))


# ---------------------------------------------------------------- control flow on Python values


@program(args=with_values(3), guarded=replace_arg(1, 7))
def branch_on_int(x, n):
    if n > 5:
        return x * 2
    return x - n


@program(args=with_values(True), guarded=replace_arg(1, False))
def branch_on_flag(x, flag):
    return x.relu() if flag else x.sigmoid()


@program(args=with_values(None), guarded=replace_arg(1, 2.0))
def branch_on_none(x, scale):
    if scale is None:
        scale = 1.0
    return x * scale + 1


@program(args=with_values(4), guarded=replace_arg(1, 2))
def while_loop_on_int(x, n):
    index = 0
    while index < n:
        x = x * 0.5 + index
        index += 1
    return x


@program(args=with_values(6), guarded=replace_arg(1, 3))
def break_and_continue(x, n):
    total = x
    for index in range(10):
        if index % 2:
            continue
        if index >= n:
            break
        total = total + index
    return total


@program(args=with_values(2, "relu"), guarded=replace_arg(2, "tanh"))
def branch_on_string(x, repeat, activation):
    for _ in range(repeat):
        x = torch.relu(x) if activation == "relu" else torch.tanh(x)
    return x


@program(args=with_values(3, 0), guarded=replace_arg(2, 5))
def short_circuit_logic(x, a, b):
    if a and not b:
        x = x + 1
    if a > 2 or b > 2:
        x = x * 2
    return x, (a and b), (b or a)


@program(args=with_values(4), guarded=replace_arg(1, 10))
def chained_comparison(x, n):
    return x + 1 if 0 < n < 5 else x - 1


@program(args=with_values(2, 3), guarded=replace_arg(1, 5))
def nested_branches(x, a, b):
    if a > 1:
        if b > 2:
            return x + a * b
        return x - a
    return x


@program(args=with_values(3), guarded=replace_arg(1, 4))
def early_return_in_loop(x, limit):
    for index in range(10):
        if index == limit:
            return x * index
    return x


# ---------------------------------------------------------------- control flow on shapes and dtypes


@program(guarded=reshape_first(1, 3))
def branch_on_shape(x, y):
    if x.shape[0] > 2:
        return x + y
    return x - 1


@program(guarded=reshape_first(2, 2, 3))
def branch_on_dim(x, y):
    if x.dim() == 2:
        return x @ y.t()
    return x.sum()


@program()
def branch_on_dtype(x, y):
    if x.dtype == torch.float32:
        return x * 2
    return x.float() / 2


@program()
def branch_on_is_floating(x, y):
    return x + 1 if x.is_floating_point() and not y.is_complex() else x


@program(guarded=reshape_first(6, 3))
def loop_over_shape(x, y):
    rows = []
    for index in range(x.shape[0]):
        rows.append(x[index] * index)
    return torch.stack(rows)


@program(guarded=reshape_first(2, 3))
def len_of_tensor(x, y):
    return x * len(x)


@program(guarded=reshape_first(4, 6))
def unpack_shape(x, y):
    rows, cols = x.shape
    return x.reshape(cols, rows) if cols != rows else x


@program(guarded=reshape_first(8, 3))
def numel_branch(x, y):
    return x.sum() if x.numel() > 20 else x.mean()


@program(args=tensors((2, 3, 4)), guarded=reshape_first(2, 3, 6))
def shape_arithmetic(x):
    batch, *rest = x.shape
    return x.reshape(batch, -1) * rest[-1], x.view(*x.shape[:-1], 2, -1)


@program(guarded=reshape_first(3, 3))
def iterate_tensor_rows(x, y):
    total = 0
    for row in x:
        total = total + row.sum()
    return total


# ---------------------------------------------------------------- loops


@program()
def for_over_tensor_list(x, y):
    total = torch.zeros_like(x)
    for tensor in [x, y, x * y]:
        total = total + tensor
    return total


@program()
def enumerate_and_zip(x, y):
    out = []
    for index, (a, b) in enumerate(zip([x, y], [y, x])):
        out.append(a * index + b)
    return out


@program()
def reversed_range_step(x, y):
    for scale in reversed(range(1, 6, 2)):
        x = x * scale - y
    return x


@program()
def nested_loops(x, y):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x


@program()
def loop_with_else(x, y):
    for value in (1, 2, 3):
        if value > 5:
            break
    else:
        x = x + 100
    return x


@program()
def accumulate_in_dict(x, y):
    stats = {}
    for name, tensor in (("x", x), ("y", y)):
        stats[name] = tensor.mean()
    return stats


@program()
def while_true_with_break(x, y):
    steps = 0
    while True:
        x = x * 0.9
        steps += 1
        if steps == 3:
            break
    return x


@program()
def loop_over_dict_items(x, y):
    weights = {"a": 1.0, "b": 2.0}
    for key, value in weights.items():
        x = x + value if key == "a" else x * value
    return x


# ---------------------------------------------------------------- comprehensions


@program()
def list_comprehension(x, y):
    return [x * i for i in range(3)]


@program()
def comprehension_with_condition(x, y):
    return sum(t for t in [x, y, x + y] if t.shape[0] == 4)


@program()
def dict_comprehension(x, y):
    return {f"k{i}": x + i for i in range(2)}


@program()
def nested_comprehension(x, y):
    return [[x * i + j for j in range(2)] for i in range(2)]


@program()
def generator_into_builtins(x, y):
    shapes = (t.shape[0] for t in (x, y))
    return x * sum(shapes), any(t.dim() > 5 for t in (x, y)), all(t.dim() == 2 for t in (x, y))


@program()
def set_comprehension_of_constants(x, y):
    sizes = {t.shape[1] for t in (x, y)}
    return x * len(sizes)


@program()
def comprehension_closure_over_tensor(x, y):
    return torch.stack([x[i] + y for i in range(2)])


@program()
def tuple_from_generator(x, y):
    return tuple(t.relu() for t in (x, y))


# ---------------------------------------------------------------- closures and nested functions


@program()
def nested_function(x, y):
    def combine(a, b):
        return a * 2 + b

    return combine(x, y) + combine(y, x)


@program()
def lambda_function(x, y):
    square = lambda t: t * t  # noqa: E731
    return square(x) + square(y)


@program()
def closure_over_argument(x, y):
    def shift(t):
        return t + y

    return shift(x), shift(x * 2)


@program()
def nonlocal_counter(x, y):
    count = 0

    def step(t):
        nonlocal count
        count += 1
        return t * count

    return step(x) + step(y), count


@program()
def returned_closure(x, y):
    def make_scale(factor):
        def scale(t):
            return t * factor

        return scale

    return make_scale(3)(x) + make_scale(0.5)(y)


@program()
def partial_function(x, y):
    add_scaled = functools.partial(torch.add, alpha=2.0)
    return add_scaled(x, y)


@program()
def default_arguments_of_nested(x, y):
    def blend(a, b, weight=0.25, *, bias=1.0):
        return a * weight + b * (1 - weight) + bias

    return blend(x, y), blend(x, y, 0.5, bias=0.0)


def _make_closure_program():
    offset = 2.0

    def closure_over_outer_constant(x, y):
        return x + offset

    return closure_over_outer_constant


closure_program = _make_closure_program()
program(guarded=set_closure(closure_program, "offset", 5.0))(closure_program)


def _double(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2

    return wrapper


@program()
@_double
def decorated_function(x, y):
    return x - y


@program()
def recursion_free_helper_chain(x, y):
    return _helper_outer(x, y)


def _helper_inner(t):
    return t.sin()


def _helper_outer(a, b):
    return _helper_inner(a) * _helper_inner(b)


# ---------------------------------------------------------------- globals

SCALE = 2.0
BIAS_TENSOR = torch.randn(3)
ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}
SETTINGS = {"depth": 2, "mode": "sum"}
USE_BIAS = True
UNRELATED = 0
LAYER_SIZES = [3, 3]


@program(guarded=set_attribute(this_module, "SCALE", 3.0), stable=set_attribute(this_module, "UNRELATED", 1))
def global_constant(x, y):
    return x * SCALE


@program(guarded=set_attribute(this_module, "BIAS_TENSOR", torch.randn(3, dtype=torch.float64)))
def global_tensor(x, y):
    return x + BIAS_TENSOR


@program(guarded=set_attribute(this_module, "USE_BIAS", False), stable=set_attribute(this_module, "UNRELATED", 5))
def global_flag(x, y):
    if USE_BIAS:
        return x + 1
    return x - 1


@program()
def global_function(x, y):
    return _helper_outer(x, y) + _helper_inner(x)


@program(guarded=set_attribute(this_module, "SETTINGS", {"depth": 3, "mode": "sum"}))
def global_dict_reads(x, y):
    for _ in range(SETTINGS["depth"]):
        x = x + y if SETTINGS.get("mode") == "sum" else x * y
    return x


@program()
def global_dict_of_functions(x, y):
    return ACTIVATIONS["relu"](x) + ACTIVATIONS["tanh"](y)


@program(guarded=set_attribute(this_module, "LAYER_SIZES", [3, 3, 3]))
def global_list_reads(x, y):
    for size in LAYER_SIZES:
        x = x[:, :size] * 2
    return x


@program()
def module_alias_global(x, y):
    return F.softplus(x) + torch.nn.functional.silu(y)


@program()
def math_module_global(x, y):
    return x * math.pi + math.log(2.0)
