"""Corpus, part 3: side effects: globals written anywhere in the call tree, lazy generators and
iterators, output types and identity, warnings / logging / print replayed after the graph.

See corpus_support.py for what `@program` declares and tests/frontend/test_corpus.py
for the checks. Nothing in this file may run during a compiled call. Programs that
write globals leave them as they found them (or at a value that does not depend on
the call), so eager and compiled calls can alternate.
"""
from __future__ import annotations

import itertools
import logging
import sys
import warnings

import torch

from tests.frontend import effects_helper_module
from tests.frontend.corpus_support import program, set_attribute

this_module = sys.modules[__name__]
logger = logging.getLogger("kiln.tests.corpus_effects")

# ---------------------------------------------------------------- globals

MODE = 1.0
COUNTER = 0
BLOCK_SCALE = 1.0
GUARDED_OFFSET = 1.0
UNRELATED = 0


def _set_mode(value):
    global MODE
    MODE = value


def _bump_counter():
    global COUNTER
    COUNTER = COUNTER + 1


@program()
def global_written_in_helper(x, y):
    _set_mode(3.0)
    out = x * MODE  # the helper's store, not the module's value before the call
    _set_mode(1.0)
    return out + y


@program()
def global_written_from_two_frames(x, y):
    global COUNTER
    COUNTER = 5
    _bump_counter()  # reads the 5 stored above and stores 6 into the same dict
    return x + COUNTER


class _ScaledBlock:
    def __enter__(self):
        global BLOCK_SCALE
        BLOCK_SCALE = 2.0
        return self

    def __exit__(self, *exc_info):
        global BLOCK_SCALE
        BLOCK_SCALE = 1.0
        return False


@program()
def global_written_in_enter(x, y):
    with _ScaledBlock():
        inside = x * BLOCK_SCALE
    return inside + y * BLOCK_SCALE


@program()
def global_of_another_module(x, y):
    effects_helper_module.set_level(4.0)
    first = effects_helper_module.scaled(x) + y * effects_helper_module.LEVEL
    effects_helper_module.LEVEL = 0.5  # a store through the module's attribute, same dict
    second = effects_helper_module.scaled(y)
    effects_helper_module.set_level(1.0)
    return first, second


@program(guarded=set_attribute(this_module, "GUARDED_OFFSET", 2.0), stable=set_attribute(this_module, "UNRELATED", 3))
def global_read_then_written(x, y):
    global GUARDED_OFFSET
    offset = GUARDED_OFFSET  # read first: guarded by value
    GUARDED_OFFSET = offset * 10
    out = x + GUARDED_OFFSET
    GUARDED_OFFSET = offset
    return out


# ---------------------------------------------------------------- generators and lazy iterators


@program()
def generator_loop_breaks_early(x, y):
    produced = []

    def numbers():
        for i in range(5):
            produced.append(i)
            yield x * i

    total = y
    for value in numbers():
        total = total + value
        if len(produced) == 2:
            break
    return total, len(produced)


@program()
def any_stops_at_the_first_true(x, y):
    checked = []

    def check(t):
        checked.append(t)
        return t.dim() == 2

    return x * any(check(t) for t in (x, y, x + y)), len(checked)


@program()
def all_stops_at_the_first_false(x, y):
    checked = []

    def check(t):
        checked.append(t)
        return t.dim() == 3

    return y * all(check(t) for t in (x, y)), len(checked)


@program()
def next_of_a_generator_expression(x, y):
    evaluated = []
    first = next(t * 2 for t in (x, y, x + y) if evaluated.append(t) is None)
    return first, len(evaluated)


@program()
def generator_interleaves_with_its_consumer(x, y):
    events = []

    def produce():
        for i in range(3):
            events.append(("produce", i))
            yield x * i

    for i, value in enumerate(produce()):
        events.append(("consume", i))
    return value + y, tuple(events)


@program()
def map_and_filter_are_lazy(x, y):
    seen = []

    def track(t):
        seen.append(t)
        return t + 1

    for value in filter(lambda t: t.dim() == 2, map(track, (x, y, x * y))):
        break
    return value, len(seen)


@program()
def zip_stops_at_the_shortest(x, y):
    pulled = []

    def endless():
        step = 0
        while True:
            pulled.append(step)
            yield x + step
            step += 1

    return [a * b for a, b in zip(endless(), [y, y * 2])], len(pulled)


@program()
def islice_and_count_are_lazy(x, y):
    pulled = []

    def numbers():
        for i in range(20):
            pulled.append(i)
            yield x * i

    picked = list(itertools.islice(numbers(), 1, 7, 2))
    return picked, len(pulled), [i for i, _ in zip(itertools.count(3), (x, y))]


class _Pair:
    def __init__(self, first, second):
        self.first = first
        self.second = second

    def __iter__(self):
        yield self.first
        yield self.second


@program()
def object_iterated_by_generator_method(x, y):
    first, second = _Pair(x, y)
    return first * second, [t.sum() for t in _Pair(y, x)]


@program()
def generator_send_and_first_value(x, y):
    def accumulate():
        total = x
        while True:
            increment = yield total
            total = total + increment

    running = accumulate()
    start = next(running)
    after_one = running.send(y)
    return start, running.send(y * 2), after_one


# ---------------------------------------------------------------- output types


@program()
def size_arithmetic_keeps_size(x, y):
    head, width = x.shape[:-1], y.shape[-1]
    return head + (width + 2,), (width,) + x.shape, x.shape * 2, x.reshape(head + (width,)), x.shape[1:]


@program(args=lambda: (torch.randn(4, 3), [torch.randn(4, 3), 2]))
def input_list_mutated_and_returned(x, items):
    items.append(x * items[1])
    items[0] = items[0] + 1
    return items, x


@program(args=lambda: (torch.randn(4, 3), {"scale": 2, "scratch": None}))
def input_dict_mutated_and_returned(x, options):
    options["out"] = x * options.pop("scale")
    del options["scratch"]
    options.setdefault("count", len(options))
    return options


# ---------------------------------------------------------------- warnings, logging, print


def _deprecated_scale(t):
    warnings.warn("the scale helper is deprecated", DeprecationWarning, stacklevel=2)
    return t * 2


@program()
def warning_from_a_helper(x, y):
    return _deprecated_scale(x) + y


@program()
def logging_calls_with_constant_arguments(x, y):
    logger.debug("shapes %s and %s", x.shape, tuple(y.shape))
    if logger.isEnabledFor(logging.DEBUG):
        return x - y
    return x + y


@program()
def print_of_constants(x, y):
    print("kiln corpus: shape", x.shape, "dtype", x.dtype, sep=" ", end="\n")
    return x * y
