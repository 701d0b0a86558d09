"""Graph-break corpus, part 1: where the break comes from and where it sits.

Unsupported calls in the middle of tensor work, data-dependent values and branches,
breaks inside loops, inside inlined helpers at several depths, and inside nn.Module
forwards. Part 2 (corpus_breaks_effects.py) is about what a break must carry across:
live locals, values on the stack, side effects in order, in-place ops, generators, grad
mode and aliasing.

See break_corpus_support.py for what `@program` declares and
tests/frontend/test_break_corpus.py for the checks. Every program does tensor work before
and after its break, so a graph count means something; inputs are random, never zeros.
A program whose frame Dynamo skips (a graph break inside a `for` loop) has a `twin`: the
same program with the loop unrolled, which Dynamo compiles; kiln is held to its count.
"""
from __future__ import annotations

import collections
import copy
import functools
import gc
import inspect
import json
import math
import os
import random
import struct
import sys
import threading
import time
import zlib

import torch
from torch import nn

from tests.frontend.break_corpus_support import (LOG, BreakProgram, PROGRAMS, program, scaled, seeded, signed,
                                                 tensors, track_globals, twin_of)


def shifted(*centers, shape=(4, 3)):
    """One tensor per center: center + 0.1 * randn, so its mean is close to the center."""
    return lambda: tuple(center + 0.1 * torch.randn(*shape) for center in centers)


# ---------------------------------------------------------------- unsupported calls mid tensor work


@program("unsupported_call")
def perf_counter_between_ops(x, y):
    a = torch.sin(x) * y
    time.perf_counter()  # a value that changes every call, dropped: nothing may be guarded on it
    b = a.exp() + x
    return b * 2 - y


@program("unsupported_call")
def getpid_selects_a_branch(x, y):
    a = x.relu() + y
    pid = os.getpid()
    b = a * 3 if pid > 0 else a
    return b.tanh() + x


@program("unsupported_call")
def getframe_has_a_caller(x, y):
    a = x @ y.t()
    has_caller = sys._getframe().f_back is not None
    return a.softmax(dim=-1) * (2.0 if has_caller else 1.0)


@program("unsupported_call")
def id_keyed_lookup_of_global_objects(x, y):
    a = x * 2
    names = {id(SCALER): "scaler", id(CONFIG): "config"}
    picked = names[id(CONFIG)]
    distinct = len({id(SCALER), id(CONFIG), id(SCALER)})
    return (a + y) * distinct * len(picked), picked


@program("unsupported_call", dynamo_recompiles="the class is a new object every call: Dynamo's resume "
                                              "function guards its identity")
def class_defined_in_function(x, y):
    base = x.sigmoid()

    class Box:
        def __init__(self, value):
            self.value = value

        def scaled(self, factor):
            return self.value * factor

    box = Box(base + y)
    return box.scaled(3.0) - x


@program("unsupported_call")
def raise_and_catch_in_the_middle(x, y):
    a = x + y
    try:
        if a.shape[0] == 4:
            raise ValueError("four rows")
        note = "no error"
    except ValueError as error:
        note = str(error)
    LOG.append(note)
    return (a * 2).cos()


def _checked_ratio(t, limit):
    if t.dim() > limit:
        raise KeyError("too many dims")
    return t / (t.abs().sum() + 1)


@program("unsupported_call")
def exception_from_helper_caught(x, y):
    a = x * y
    try:
        b = _checked_ratio(a, 1)
    except KeyError as error:
        LOG.append(error.args[0])
        b = a - 1
    return b.exp() + y


def _frame_depth():
    depth, frame = 0, sys._getframe()
    while frame is not None and depth < 3:
        frame = frame.f_back
        depth += 1
    return depth


@program("unsupported_call")
def python_helper_walks_frames(x, y):
    a = x.cos() + y
    depth = _frame_depth()
    return a * depth + x


@program("unsupported_call")
def thread_ident_in_the_middle(x, y):
    a = x.abs().sqrt()
    ident = threading.get_ident()
    same = ident == threading.get_ident()
    LOG.append(same)
    return a + y * (1 if ident else 2)


@program("unsupported_call")
def gc_state_query(x, y):
    a = (x * y).sum(dim=0)
    enabled = gc.isenabled()
    return a * (2.0 if enabled else 0.5) + y.mean()


@program("unsupported_call")
def struct_pack_size(x, y):
    a = x.log_softmax(dim=1)
    packed = struct.pack("<fi", 1.5, 7)
    return a * len(packed) + y


CONFIG = {"scale": 2.0, "names": ["a", "b"], "nested": {"depth": 3}}


@program("unsupported_call")
def json_dumps_of_a_config(x, y):
    a = x * CONFIG["scale"]
    text = json.dumps(CONFIG, sort_keys=True)
    LOG.append(text)
    return a + y * len(text)


@program("unsupported_call")
def deepcopy_of_a_config(x, y):
    a = x + y
    options = copy.deepcopy(CONFIG)
    options["scale"] = options["scale"] + 1
    return a * options["scale"] - y * options["nested"]["depth"]


@program("unsupported_call")
def eval_of_an_expression(x, y):
    a = x.tanh()
    factor = eval("2 + 3")
    return a * factor + y


@program("unsupported_call")
def seeded_python_random(x, y):
    a = x * y
    generator = random.Random(7)
    draws = [generator.random() for _ in range(3)]
    return (a + sum(draws)).sin(), len(draws)


@program("unsupported_call")
def crc_of_bytes(x, y):
    a = x.exp()
    code = zlib.crc32(b"kiln") % 7
    return a * code + y


@program("unsupported_call")
def match_statement_on_a_shape(x, y):
    a = x * y
    match a.shape:
        case (rows, cols) if rows > cols:
            difference = rows - cols
        case _:
            difference = 0
    return a.sum(0) * difference + y[0]


@program("unsupported_call")
def inspect_signature_of_a_helper(x, y):
    a = x + 2 * y
    count = len(inspect.signature(_checked_ratio).parameters)
    return a.pow(count) - x


@functools.lru_cache(maxsize=None)
def _squares(count):
    return tuple(i * i for i in range(count))


@program("unsupported_call")
def lru_cached_helper(x, y):
    a = x + y
    squares = _squares(4)
    return a * sum(squares) + x.abs()


@program("unsupported_call")
def counter_of_names(x, y):
    a = x * 2
    counts = collections.Counter(["w", "b", "w", "w"])
    return (a * counts["w"] + y * counts["b"]).relu()


# ---------------------------------------------------------------- data-dependent values and branches


@program("data_dependent")
def item_in_arithmetic(x, y):
    a = x * y
    scale = a.sum().item()
    return (y * scale + 1).relu()


@program("data_dependent", args=signed(1, 1), name="if_sum_positive_taken")
@program("data_dependent", args=signed(-1, 1), name="if_sum_positive_not_taken")
def if_sum_positive(x, y):
    a = x * y.abs()
    if a.sum() > 0:
        b = a.sqrt()
    else:
        b = -((-a).sqrt())
    return b + y


@program("data_dependent")
def item_picks_a_row(x, y):
    a = x.abs() + y.abs()
    row = int(a.sum(dim=1).argmax().item())
    return y[row] * a


@program("data_dependent")
def tolist_sum(x, y):
    a = x[0] * 2
    values = a.tolist()
    total = sum(values)
    return y * total + len(values)


@program("data_dependent")
def tolist_drives_a_python_loop(x, y):
    weights = x[:, 0].sigmoid().tolist()
    acc = y * 0.5
    for weight in weights:
        acc = acc + y * weight
    return acc.tanh()


@program("data_dependent", args=signed(1, 1), name="bool_of_comparison_true")
@program("data_dependent", args=signed(-1, 1), name="bool_of_comparison_false")
def bool_of_comparison(x, y):
    a = x.mean()
    flag = bool(a > 0)
    out = x * 2 if flag else y * 2
    return out + a, flag


@program("data_dependent")
def int_of_tensor_repeats(x, y):
    a = x.abs().sum()
    times = int(a) % 3 + 1
    return torch.cat([y] * times, dim=0) * a


@program("data_dependent")
def float_of_mean(x, y):
    mean = float((x * y).mean())
    return (x - mean) * (y + mean), mean


@program("data_dependent", args=scaled(8.0, 1.0))
def while_norm_above_one(x, y):
    v = x * 1.0
    steps = 0
    while v.norm() > 1:
        v = v / 2
        steps += 1
    return v + y, steps


@program("data_dependent", args=tensors(6, 6))
def while_item_below_a_bound(x, y):
    total = x.abs().cumsum(0)
    index = 0
    while index < 5 and total[index].item() < 1.5:
        index += 1
    return total * y + index, index


@twin_of(while_item_below_a_bound)
def _while_item_below_a_bound_unrolled(x, y):
    total = x.abs().cumsum(0)
    if not total[0].item() < 1.5:
        return total * y + 0, 0
    if not total[1].item() < 1.5:
        return total * y + 1, 1
    if not total[2].item() < 1.5:
        return total * y + 2, 2
    if not total[3].item() < 1.5:
        return total * y + 3, 3
    if not total[4].item() < 1.5:
        return total * y + 4, 4
    return total * y + 5, 5


@program("data_dependent", args=shifted(-1.0, 0.0), name="nested_ifs_negative")
@program("data_dependent", args=shifted(0.3, 0.0), name="nested_ifs_small")
@program("data_dependent", args=shifted(1.0, 0.0), name="nested_ifs_large")
def nested_ifs(x, y):
    mean = x.mean()
    if mean > 0:
        if mean > 0.6:
            out = x * y
        else:
            out = x + y
    else:
        out = x - y
    return out.exp()


@program("data_dependent", args=signed(1, 1), name="and_or_both_positive")
@program("data_dependent", args=signed(1, -1), name="and_or_one_positive")
@program("data_dependent", args=signed(-1, -1), name="and_or_none_positive")
def and_or_on_tensors(x, y):
    a = x * 2
    if (a.sum() > 0) and (y.sum() > 0):
        out = a + y
    elif (a.sum() > 0) or (y.sum() > 0):
        out = a - y
    else:
        out = -a
    return out * 2


@program("data_dependent", args=signed(1, 1), name="conditional_expression_true")
@program("data_dependent", args=signed(-1, 1), name="conditional_expression_false")
def conditional_expression_on_a_tensor(x, y):
    a = x.sin() if x.sum() > 0 else x.cos()
    return a * y


@program("data_dependent")
def assert_on_a_tensor(x, y):
    a = x.abs() + 1
    assert (a > 0).all(), "positive"
    return a.log() + y


@program("data_dependent")
def any_and_all_branches(x, y):
    a = x * y
    if (a > 100).any():
        out = a * 0.5
    elif (a.abs() < 100).all():
        out = a + 1
    else:
        out = a
    return out.mean(dim=0)


@program("data_dependent")
def item_compared_with_item(x, y):
    if x.max().item() > y.max().item():
        big = x
    else:
        big = y
    return big * 2 + (x - y)


@program("data_dependent")
def nonzero_count(x, y):
    a = x * y
    indices = torch.nonzero(a > 0)
    return a.sum() * indices.shape[0] + y


@program("data_dependent")
def boolean_mask_select(x, y):
    a = x + y
    picked = a[a > 0]
    return picked.sum() + y * picked.numel()


@program("data_dependent")
def torch_equal_as_a_bool(x, y):
    a = x * 2
    same = torch.equal(a, x + x)
    return (a + y if same else a - y).abs()


@program("data_dependent")
def str_of_a_tensor(x, y):
    a = (x * y).sum(dim=1).round(decimals=2)
    text = str(a)
    LOG.append(text)
    return a.exp() + y.sum()


@program("data_dependent")
def item_into_python_math(x, y):
    value = x.abs().mean().item()
    ratio = math.sqrt(value) + math.log1p(value)
    return y * ratio - x


@program("data_dependent")
def tolist_of_indices_picks_rows(x, y):
    order = x[:, 0].argsort().tolist()
    rows = [y[i] for i in order]
    return torch.stack(rows) * x


# ---------------------------------------------------------------- breaks inside loops


@program("loop")
def item_in_a_for_range_loop(x, y):
    acc = x.sin()
    for i in range(3):
        acc = acc * y + i
        LOG.append(round(acc.sum().item(), 3))
    return acc.cos()


@twin_of(item_in_a_for_range_loop)
def _item_in_a_for_range_loop_unrolled(x, y):
    acc = x.sin()
    acc = acc * y + 0
    LOG.append(round(acc.sum().item(), 3))
    acc = acc * y + 1
    LOG.append(round(acc.sum().item(), 3))
    acc = acc * y + 2
    LOG.append(round(acc.sum().item(), 3))
    return acc.cos()


@program("loop")
def branch_in_a_loop_over_tensors(x, y):
    acc = x * 0.5
    for t in [x, y, x * y]:
        acc = acc + t
        if acc.sum() > 0:
            acc = acc * 0.5
        else:
            acc = acc - 1
    return acc.tanh()


@twin_of(branch_in_a_loop_over_tensors)
def _branch_in_a_loop_over_tensors_unrolled(x, y):
    acc = x * 0.5
    items = [x, y, x * y]
    acc = acc + items[0]
    if acc.sum() > 0:
        acc = acc * 0.5
    else:
        acc = acc - 1
    acc = acc + items[1]
    if acc.sum() > 0:
        acc = acc * 0.5
    else:
        acc = acc - 1
    acc = acc + items[2]
    if acc.sum() > 0:
        acc = acc * 0.5
    else:
        acc = acc - 1
    return acc.tanh()


@program("loop")
def print_in_a_while_loop(x, y):
    acc = x.clone()
    step = 0
    while step < 3:
        acc = acc * y + 1
        print("step", step, acc.sum())
        step += 1
    return acc.exp()


@twin_of(print_in_a_while_loop)
def _print_in_a_while_loop_unrolled(x, y):
    acc = x.clone()
    acc = acc * y + 1
    print("step", 0, acc.sum())
    acc = acc * y + 1
    print("step", 1, acc.sum())
    acc = acc * y + 1
    print("step", 2, acc.sum())
    return acc.exp()


@program("loop")
def unsupported_call_in_an_enumerate_loop(x, y):
    outs = []
    for i, t in enumerate((x, y, x + y)):
        u = t * (i + 1)
        pid = os.getpid()
        outs.append(u.relu() if pid > 0 else u)
    return torch.stack(outs).sum(0)


@twin_of(unsupported_call_in_an_enumerate_loop)
def _unsupported_call_in_an_enumerate_loop_unrolled(x, y):
    outs = []
    items = (x, y, x + y)
    u = items[0] * 1
    pid = os.getpid()
    outs.append(u.relu() if pid > 0 else u)
    u = items[1] * 2
    pid = os.getpid()
    outs.append(u.relu() if pid > 0 else u)
    u = items[2] * 3
    pid = os.getpid()
    outs.append(u.relu() if pid > 0 else u)
    return torch.stack(outs).sum(0)


@program("loop")
def item_in_nested_loops(x, y):
    acc = x.clone()
    for i in range(2):
        for j in range(2):
            acc = acc + y * (i - j + 0.5)
            if acc.mean().item() > 10:
                acc = acc / 10
    return acc.sin()


@twin_of(item_in_nested_loops)
def _item_in_nested_loops_unrolled(x, y):
    acc = x.clone()
    acc = acc + y * 0.5
    if acc.mean().item() > 10:
        acc = acc / 10
    acc = acc + y * -0.5
    if acc.mean().item() > 10:
        acc = acc / 10
    acc = acc + y * 1.5
    if acc.mean().item() > 10:
        acc = acc / 10
    acc = acc + y * 0.5
    if acc.mean().item() > 10:
        acc = acc / 10
    return acc.sin()


@program("loop")
def loop_left_by_a_data_dependent_break(x, y):
    acc = x.abs() + 0.1
    for i in range(8):
        acc = acc * 1.5
        if acc.max() > 4:
            break
    return acc + y, i


@twin_of(loop_left_by_a_data_dependent_break)
def _loop_left_by_a_data_dependent_break_unrolled(x, y):
    acc = x.abs() + 0.1
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 0
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 1
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 2
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 3
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 4
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 5
    acc = acc * 1.5
    if acc.max() > 4:
        return acc + y, 6
    acc = acc * 1.5
    return acc + y, 7


@program("loop")
def while_true_left_on_an_item(x, y):
    v = x.abs() + 0.1
    count = 0
    while True:
        v = v * 2
        count += 1
        if v.min().item() > 1:
            break
    return v.log() + y, count


@twin_of(while_true_left_on_an_item)
def _while_true_left_on_an_item_unrolled(x, y):
    v = x.abs() + 0.1  # at least 0.1: four doublings pass 1
    v = v * 2
    if v.min().item() > 1:
        return v.log() + y, 1
    v = v * 2
    if v.min().item() > 1:
        return v.log() + y, 2
    v = v * 2
    if v.min().item() > 1:
        return v.log() + y, 3
    v = v * 2
    if v.min().item() > 1:
        return v.log() + y, 4
    raise AssertionError("more than four doublings")


@program("loop")
def tolist_in_a_loop_over_dict_items(x, y):
    parts = {"a": x, "b": y, "c": x - y}
    sums = {}
    for key, t in parts.items():
        sums[key] = [round(value, 3) for value in (t * 2).sum(dim=0).tolist()]
    return x * len(sums) + y, sums


@twin_of(tolist_in_a_loop_over_dict_items)
def _tolist_in_a_loop_over_dict_items_unrolled(x, y):
    parts = {"a": x, "b": y, "c": x - y}
    sums = {}
    sums["a"] = [round(value, 3) for value in (parts["a"] * 2).sum(dim=0).tolist()]
    sums["b"] = [round(value, 3) for value in (parts["b"] * 2).sum(dim=0).tolist()]
    sums["c"] = [round(value, 3) for value in (parts["c"] * 2).sum(dim=0).tolist()]
    return x * len(sums) + y, sums


@program("loop")
def continue_on_a_data_dependent_test(x, y):
    acc = y.clone()
    for t in (x, -x, x * 2):
        if t.sum() < 0:
            continue
        acc = acc + t
    return acc * 2


@twin_of(continue_on_a_data_dependent_test)
def _continue_on_a_data_dependent_test_unrolled(x, y):
    acc = y.clone()
    items = (x, -x, x * 2)
    if not items[0].sum() < 0:
        acc = acc + items[0]
    if not items[1].sum() < 0:
        acc = acc + items[1]
    if not items[2].sum() < 0:
        acc = acc + items[2]
    return acc * 2


@program("loop")
def loop_over_rows_with_item(x, y):
    total = y.sum(dim=0)
    for row in x:
        total = total + row * row.max().item()
    return total.softmax(dim=0)


@twin_of(loop_over_rows_with_item)
def _loop_over_rows_with_item_unrolled(x, y):
    total = y.sum(dim=0)
    total = total + x[0] * x[0].max().item()
    total = total + x[1] * x[1].max().item()
    total = total + x[2] * x[2].max().item()
    total = total + x[3] * x[3].max().item()
    return total.softmax(dim=0)


# ---------------------------------------------------------------- breaks inside inlined helpers


def _breaks(t):
    value = t.sum().item()
    return t * 2 + value


def _calls_breaks(t):
    u = t.relu() + 0.5
    return _breaks(u) - 1


def _calls_calls_breaks(t):
    return _calls_breaks(t.sin()) * 3


@program("nested_call")
def break_in_a_helper(x, y):
    a = x + y
    b = _breaks(a)
    return b.exp() - x


@program("nested_call")
def break_two_calls_deep(x, y):
    a = x * y
    b = _calls_breaks(a)
    return b + x


@program("nested_call")
def break_three_calls_deep(x, y):
    a = x - y
    b = _calls_calls_breaks(a)
    return b.tanh() * y


@program("nested_call")
def two_helpers_each_break(x, y):
    a = _breaks(x)
    b = _calls_breaks(y)
    return a * b


def _split_and_log(t):
    half = t * 0.5
    print("split", round(half.sum().item(), 3))
    return half, t - half


@program("nested_call")
def helper_returns_a_tuple_across_a_break(x, y):
    first, second = _split_and_log(x * y)
    return first.exp() + second.cos()


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, t):
        if t.mean() > 0:
            return t * self.factor
        return t / self.factor

    @staticmethod
    def stamp(t):
        return t + (1.0 if os.getpid() > 0 else 0.0)

    RATIO = 2.0

    @classmethod
    def halved_or_doubled(cls, t):
        if t.sum() > 0:
            return t / cls.RATIO
        return t * cls.RATIO


SCALER = Scaler(3.0)


@program("nested_call")
def break_in_a_method(x, y):
    a = x + 1
    b = SCALER.apply(a)
    return b - y


@program("nested_call")
def break_in_static_and_class_methods(x, y):
    a = Scaler.stamp(x * 2)
    b = Scaler.halved_or_doubled(a + y)
    return a * b


@program("nested_call")
def break_in_a_closure(x, y):
    offset = y.mean()

    def shifted_log(t):
        value = round((t + offset).sum().item(), 3)
        LOG.append(value)
        return t + offset

    a = shifted_log(x * 2)
    return a * y


@program("nested_call")
def break_in_a_lambda(x, y):
    scale = lambda t: t * t.abs().max().item()  # noqa: E731
    a = scale(x + y)
    return a.sigmoid() + scale(y)


def _scaled_and_shifted(t, *, scale, shift=0.0):
    if t.sum() > 0:
        return t * scale + shift
    return t * scale - shift


@program("nested_call")
def break_in_a_helper_with_keywords(x, y):
    a = _scaled_and_shifted(x, scale=2.0, shift=1.0)
    b = _scaled_and_shifted(y, scale=0.5)
    return a + b


def _countdown(t, depth):
    if depth == 0:
        return t * t.sum().item()
    return _countdown(t + 1, depth - 1) + t


@program("nested_call")
def break_at_the_bottom_of_a_recursion(x, y):
    a = _countdown(x * 0.1, 2)
    return a + y.exp()


# ---------------------------------------------------------------- breaks inside nn.Module forwards


class GatedBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = self.linear(x)
        if h.mean() > 0:
            return h.relu()
        return h.tanh()


class PrintingBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = self.linear(x)
        print("block output", h.abs().sum().round(decimals=3))
        return h * 2


class Inner(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.gate = GatedBlock(width)
        self.scale = nn.Parameter(torch.ones(width) * 0.5)

    def forward(self, x):
        return self.gate(x) * self.scale + x


class Outer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.inner = Inner(width)
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        return self.head(self.inner(x.sin()))


class BlockStack(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.ModuleList(GatedBlock(width) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = block(x) + x
        return x


class CountingBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.calls = 0
        self.last_norm = 0.0

    def forward(self, x):
        self.calls = self.calls + 1
        h = self.linear(x)
        self.last_norm = round(h.norm().item(), 3)
        self.calls = self.calls + 10
        return h.relu()


class ListingBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = self.linear(x)
        column = [round(value, 3) for value in h[:, 0].tolist()]
        return h * len(column) + h.new_tensor(column).unsqueeze(1)


GATED = seeded(1, lambda: GatedBlock(3))
NESTED = seeded(2, lambda: Outer(3))
STACK = seeded(3, lambda: BlockStack(3, 3))
SEQUENTIAL = seeded(4, lambda: nn.Sequential(nn.Linear(3, 3), PrintingBlock(3), nn.ReLU(), nn.Linear(3, 3)))
COUNTING = seeded(5, lambda: CountingBlock(3))
LISTING = seeded(6, lambda: ListingBlock(3))


@program("module", args=signed(1), name="module_branch_first_way")
@program("module", args=signed(-1), name="module_branch_other_way")
def module_with_a_data_dependent_branch(x):
    return GATED(x * 2) + x


@program("module")
def break_in_a_nested_module(x, y):
    return NESTED(x + y) * 3


@program("module")
def break_in_each_block_of_a_module_list(x, y):
    return STACK(x * y).sum(dim=1)


@program("module")
def printing_block_in_a_sequential(x, y):
    return SEQUENTIAL(x) - y


@program("module")
def module_forward_stores_attributes_around_a_break(x, y):
    out = COUNTING(x + y)
    return out * COUNTING.calls, COUNTING.calls, COUNTING.last_norm


@program("module")
def tolist_in_a_module_forward(x, y):
    return LISTING(x).cos() + y


def _stack_unrolled(x):
    x = STACK.blocks[0](x) + x
    x = STACK.blocks[1](x) + x
    x = STACK.blocks[2](x) + x
    return x


@twin_of(break_in_each_block_of_a_module_list)
def _break_in_each_block_of_a_module_list_unrolled(x, y):
    return _stack_unrolled(x * y).sum(dim=1)


PROGRAMS.append(BreakProgram("module_compiled_directly", NESTED, tensors((4, 3)), "module"))
PROGRAMS.append(BreakProgram("module_list_compiled_directly", STACK, tensors((4, 3)), "module", twin=_stack_unrolled))

track_globals(__name__, "COUNTING", "SCALER", "CONFIG")
