"""Graph-break corpus, part 2: what a break must carry across it.

Live locals of every kind, values on the stack in the middle of an expression, side
effects before and after a break in program order (LOG, globals, attributes, print,
logging), in-place ops on inputs, generators with breaks in their body or an early
`break` in their consumer, grad mode around a break, and results that are the inputs.

See break_corpus_support.py for what `@program` declares and
tests/frontend/test_break_corpus.py for the checks.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from tests.frontend.break_corpus_support import LOG, logger, program, seeded, signed, tensors, track_globals, twin_of


def _noted(t):
    """A break in a helper: LOG gets the tensor's sum as a Python float."""
    value = round(t.sum().item(), 3)
    LOG.append(value)
    return t * 2


class Holder:
    def __init__(self, value, tag):
        self.value = value
        self.tag = tag


# ---------------------------------------------------------------- live locals of every kind


@program("live_locals")
def tensors_and_a_list_of_tensors_live(x, y):
    a = x * 2
    parts = [x + 1, y - 1, a]
    value = a.sum().item()
    return a * value + parts[0] * parts[1] - parts[2]


@program("live_locals")
def dict_of_tensors_live(x, y):
    named = {"x": x.exp(), "y": y.sin(), "both": x * y}
    value = named["both"].mean().item()
    return named["x"] * value + named["y"] + named["both"]


@program("live_locals")
def scalars_strings_and_none_live(x, y):
    count, ratio, label, nothing, flag = 3, 0.25, "scaled", None, True
    pair = (count, label)
    a = x * ratio
    print("pause", label)
    value = a.abs().sum().item()
    out = a * count + (y if nothing is None else -y)
    return out * (2 if flag else 1), pair, label + "!", round(value, 3)


@program("live_locals")
def user_object_live(x, y):
    holder = Holder(x * 2, "h")
    peak = holder.value.max().item()
    holder.tag = holder.tag + "!"
    return holder.value * peak + y, holder.tag


@program("live_locals")
def closure_live(x, y):
    factor = y.mean()

    def scale(t):
        return t * factor + 1

    a = scale(x)
    print("between", round(a.sum().item(), 3))
    return scale(a) - y


@program("live_locals")
def nested_containers_live(x, y):
    state = {"pair": [x, (y, 2)], "empty": None, "names": ("a", "b")}
    total = (x + y).sum().item()
    first, (second, times) = state["pair"]
    return first * times + second * total, state["names"], state["empty"]


@program("live_locals")
def range_and_slice_live(x, y):
    steps = range(1, 4)
    rows = slice(0, 2)
    a = x[rows] * 2
    value = a.sum().item()
    return a * len(steps) + y[rows] * value, steps[-1]


@program("live_locals")
def dtype_device_and_shape_live(x, y):
    dtype, device, shape = x.dtype, x.device, x.shape
    a = x.relu() + 1
    value = a.max().item()
    return torch.ones(shape, dtype=dtype, device=device) * value + y.reshape(shape[::-1]).t(), shape


@program("live_locals")
def set_and_frozenset_live(x, y):
    names = {"alpha", "beta"}
    fixed = frozenset({1, 2, 3})
    a = x * len(names)
    value = a.sum().item()
    names.add("gamma")
    return a + y * value * len(names) * len(fixed), sorted(names)


@program("live_locals")
def bound_methods_live(x, y):
    add_to_x = x.add
    extend = LOG.extend
    a = add_to_x(y) * 2
    value = a.mean().item()
    extend(["after", round(value, 3)])
    return add_to_x(a) * value


LINEAR = seeded(11, lambda: nn.Linear(3, 3))


@program("live_locals")
def module_and_lambda_live(x, y):
    layer = LINEAR
    twice = lambda t: t * 2  # noqa: E731
    a = layer(x)
    value = a.sum().item()
    return twice(layer(a)) + y * value


@program("live_locals")
def iterator_live_across_a_break(x, y):
    items = iter([x, y, x * y])
    first = next(items) * 2
    value = first.sum().item()
    second = next(items)
    return first + second * value + next(items)


@program("live_locals")
def deleted_local_across_a_break(x, y):
    scratch = x * 3
    a = scratch + y
    del scratch
    value = a.sum().item()
    scratch = a * value
    return scratch - x


# ---------------------------------------------------------------- values on the stack


def _item_scaled(t):
    return t * t.abs().mean().item()


@program("stack_values")
def break_in_the_middle_of_arithmetic(x, y):
    a, c = x + 1, y * 2
    return a + _item_scaled(x * y) * c


@program("stack_values")
def break_inside_call_arguments(x, y):
    a = x.exp()
    return torch.addcmul(a, _noted(y), x - y, value=0.5)


@program("stack_values")
def break_inside_a_list_display(x, y):
    parts = [x * 2, _noted(y + 1), x - y]
    return torch.stack(parts).sum(0), len(parts)


@program("stack_values")
def break_inside_a_dict_display(x, y):
    named = {"a": x.sin(), "b": _noted(y), "c": x * y}
    return named["a"] + named["b"] * named["c"]


@program("stack_values")
def break_inside_a_tuple_display(x, y):
    triple = (x + y, _item_scaled(x), y.cos())
    return triple[0] * triple[1] - triple[2]


@program("stack_values")
def item_inside_an_f_string(x, y):
    a = x * y
    text = f"sum={a.sum().item():.3f} max={a.max().item():.3f} {tuple(a.shape)}"
    LOG.append(text)
    return a.relu() + y


@program("stack_values")
def break_inside_a_method_chain(x, y):
    return x.mul(_noted(y)).add(x).sigmoid()


@program("stack_values", args=signed(1, 1), name="chained_comparison_inside")
@program("stack_values", args=signed(-1, 1), name="chained_comparison_outside")
def chained_comparison_on_items(x, y):
    a = x * 0.5
    inside = 0.0 < a.mean().item() < 10.0
    return (a + y if inside else a - y) * 2, inside


@program("stack_values")
def break_inside_a_subscript(x, y):
    parts = [x, y, x + y, x * y]
    picked = parts[int((x + y).abs().sum().item()) % 4]
    return picked * 2 + parts[0]


@program("stack_values")
def break_inside_keyword_arguments(x, y):
    def combine(t, *, weight, bias):
        return t * weight + bias

    return combine(x.cos(), weight=_item_scaled(y), bias=x * y).sum(dim=0)


@program("stack_values")
def break_inside_a_list_comprehension(x, y):
    scaled = [t * t.sum().item() for t in (x, y, x - y)]
    return torch.stack(scaled).mean(0) + y


@program("stack_values")
def break_inside_a_conditional_argument(x, y):
    a = x * 2
    return torch.where(a > 0, a, y if y.sum() > 0 else -y) + x


@program("stack_values")
def break_in_an_augmented_subscript_store(x, y):
    outs = {"total": x * 1}
    outs["total"] += _item_scaled(y)
    outs["total"] *= 2
    return outs["total"] - y


# ---------------------------------------------------------------- side effects around breaks

COUNTER = 0
HISTORY: list = []
STATE: dict = {"calls": 0, "last": None}
SINK = Holder(None, "sink")
TAGGED = seeded(12, lambda: nn.Linear(3, 3))
TAGGED.note = "initial"
TAGGED.seen = 0


@program("side_effects", dynamo_recompiles="LOG.append is on the stack at the break: Dynamo's resume function "
                                            "guards the bound method object, a new one every call")
def log_before_between_and_after_a_break(x, y):
    LOG.append("start")
    a = x * y
    LOG.append(("middle", round(a.sum().item(), 3)))
    b = a.exp() + y
    LOG.append("end")
    return b


@program("side_effects")
def list_extend_pop_setitem_around_a_break(x, y):
    HISTORY.extend(["a", "b", "c"])
    a = x + y
    HISTORY.pop(0)
    value = a.mean().item()
    HISTORY[0] = round(value, 3)
    HISTORY.insert(1, "inserted")
    b = a * value
    HISTORY.append(len(HISTORY))
    return b - x


@program("side_effects", args=lambda: (torch.randn(4, 3), [torch.randn(4, 3), "tag"]))
def list_argument_mutated_around_a_break(x, items):
    items.append(x * 2)
    a = items[0] + x
    value = a.sum().item()
    items[1] = items[1] + "!"
    items.pop(0)
    items.append(round(value, 3))
    return a * value


@program("side_effects")
def dict_setitem_pop_update_around_a_break(x, y):
    STATE["calls"] = STATE["calls"] + 1
    STATE["scratch"] = "temporary"
    a = x * 3
    STATE["last"] = round(a.max().item(), 3)
    STATE.pop("scratch")
    STATE.update({"after": True, "calls": STATE["calls"] + 1})
    return a + y * STATE["calls"]


@program("side_effects", args=lambda: (torch.randn(4, 3), {"scale": 2.0, "drop": None}))
def dict_argument_mutated_around_a_break(x, options):
    options["first"] = x * options["scale"]
    del options["drop"]
    value = options["first"].sum().item()
    options["value"] = round(value, 3)
    options.setdefault("scale", 0.0)
    return options["first"] + value


@program("side_effects")
def global_rebound_around_a_break(x, y):
    global COUNTER
    COUNTER = COUNTER + 1
    LOG.append(("counter", COUNTER))
    a = x + COUNTER
    value = a.sum().item()
    COUNTER = COUNTER + 10
    LOG.append(("counter", COUNTER))
    return a * value + y * COUNTER


def _bump_and_break(t):
    global COUNTER
    COUNTER = COUNTER + 5
    if t.sum() > 0:
        return t * COUNTER
    return t - COUNTER


@program("side_effects")
def global_written_in_a_helper_that_breaks(x, y):
    global COUNTER
    COUNTER = 2
    a = _bump_and_break(x * y)
    COUNTER = COUNTER * 3
    return a + COUNTER


@program("side_effects")
def object_attributes_stored_around_a_break(x, y):
    SINK.value = "pending"
    SINK.tag = SINK.tag + "+"
    a = x.abs() + y.abs()
    SINK.value = round(a.min().item(), 3)
    SINK.count = 1
    return a.sqrt() * SINK.count


@program("side_effects")
def module_attributes_stored_around_a_break(x, y):
    TAGGED.note = "running"
    a = TAGGED(x)
    TAGGED.seen = TAGGED.seen + int(a.abs().sum().item() > 0)
    TAGGED.note = TAGGED.note + " done"
    return TAGGED(a + y)


@program("side_effects", args=lambda: (torch.randn(4, 3), Holder(1.5, "arg")))
def argument_object_attributes_around_a_break(x, holder):
    holder.value = holder.value * 2
    a = x * holder.value
    holder.tag = f"{holder.tag}:{a.sum().item():.3f}"
    holder.extra = [holder.value]
    return a.exp()


@program("side_effects")
def print_between_tensor_ops(x, y):
    print("before", x.shape)
    a = x * y
    print("sum", a.sum())
    b = a.relu() + x
    print("after", tuple(b.shape), sep="|")
    return b * 2


@program("side_effects")
def print_of_items_with_sep_and_end(x, y):
    a = x + y
    print(round(a.max().item(), 3), round(a.min().item(), 3), sep=", ", end=";\n")
    return a.tanh()


@program("side_effects")
def logging_around_a_break(x, y):
    logger.info("start %d", 1)
    a = x * 2
    logger.info("value %.3f", a.sum().item())
    b = a - y
    logger.warning("done %s", tuple(b.shape))
    return b.exp()


@program("side_effects")
def print_log_and_list_interleaved(x, y):
    LOG.append(1)
    print("one")
    a = x.sin()
    LOG.append(2)
    print("two", a.mean())
    LOG.append(3)
    b = a * y
    print("three")
    LOG.append(4)
    return b


def _record_and_scale(t, tag):
    HISTORY.append(tag)
    value = t.max().item()
    HISTORY.append((tag, round(value, 3)))
    return t * value


@program("side_effects")
def helper_mutates_a_global_list_across_its_break(x, y):
    HISTORY.append("outer start")
    a = _record_and_scale(x + y, "first")
    b = _record_and_scale(a * 0.1, "second")
    HISTORY.append("outer end")
    return a + b


@program("side_effects")
def setattr_and_delattr_builtins_around_a_break(x, y):
    setattr(SINK, "scratch", 1)
    a = x * y
    value = a.sum().item()
    delattr(SINK, "scratch")
    setattr(SINK, "value", round(value, 3))
    return a + getattr(SINK, "value")


# ---------------------------------------------------------------- in-place ops on inputs

RUNNING = torch.ones(3)


@program("inplace")
def add_before_a_break_mul_after(x, y):
    x.add_(1)
    value = x.sum().item()
    x.mul_(2)
    return x + y * value


@program("inplace", args=signed(1, 1), name="inplace_then_branch_positive")
@program("inplace", args=signed(-1, 1), name="inplace_then_branch_negative")
def inplace_then_branch_on_the_result(x, y):
    y.sub_(x * 2)
    if y.sum() > 0:
        y.mul_(0.5)
    else:
        y.add_(1)
    return y * x


@program("inplace")
def inplace_on_views_of_an_input(x, y):
    x[0].mul_(3)
    value = x[0].sum().item()
    x[:, 1].add_(y[:, 1] * value)
    return x.sum(dim=0) + y


@program("inplace", args=lambda: (torch.randn(4, 3), [torch.randn(4, 3), torch.randn(4, 3)]))
def inplace_on_tensors_in_a_list_argument(x, items):
    items[0].add_(x)
    value = items[0].mean().item()
    items[1].mul_(value)
    return items[0] * items[1]


@program("inplace")
def inplace_on_a_global_tensor(x, y):
    RUNNING.add_(x.sum(dim=0))
    value = RUNNING.max().item()
    RUNNING.mul_(0.5)
    return y * RUNNING + value


@program("inplace", args=lambda: (lambda t: (t, t, torch.randn(4, 3)))(torch.randn(4, 3)))
def inplace_on_an_input_passed_twice(x, same, y):
    x.add_(1)
    value = same.sum().item()
    same.mul_(2)
    return x + y * value


@program("inplace")
def out_argument_and_clamp_inplace(x, y):
    torch.add(x, y, out=y)
    value = y.abs().max().item()
    y.clamp_(min=-value / 2, max=value / 2)
    return y - x


@program("inplace")
def copy_into_an_input_after_a_break(x, y):
    a = x * 2 + y
    print("copy", round(a.sum().item(), 3))
    x.copy_(a.relu())
    return x - y


# ---------------------------------------------------------------- generators


@program("generator")
def generator_breaks_in_its_body_consumer_breaks_early(x, y):
    def produce():
        for i in range(4):
            t = x * (i + 1)
            print("yield", i, t.sum())
            yield t

    acc = y.clone()
    for count, value in enumerate(produce()):
        acc = acc + value
        if count == 1:
            break
    return acc * 2


@twin_of(generator_breaks_in_its_body_consumer_breaks_early)
def _generator_breaks_in_its_body_consumer_breaks_early_inlined(x, y):
    acc = y.clone()
    t = x * 1
    print("yield", 0, t.sum())
    acc = acc + t
    t = x * 2
    print("yield", 1, t.sum())
    acc = acc + t
    return acc * 2


@program("generator")
def next_on_a_generator_with_a_break(x, y):
    def produce():
        yield x * 2
        LOG.append(round(x.sum().item(), 3))
        yield x + y

    values = produce()
    first = next(values)
    second = next(values)
    return first * second + y


@twin_of(next_on_a_generator_with_a_break)
def _next_on_a_generator_with_a_break_inlined(x, y):
    first = x * 2
    LOG.append(round(x.sum().item(), 3))
    second = x + y
    return first * second + y


@program("generator")
def zip_of_a_generator_and_a_list(x, y):
    def produce():
        step = 0
        while True:
            pid = os.getpid()
            yield x * step + (0.0 if pid > 0 else 1.0)
            step += 1

    pairs = [a * b for a, b in zip(produce(), [y, y * 2, y * 3])]
    return torch.stack(pairs).sum(0)


@twin_of(zip_of_a_generator_and_a_list)
def _zip_of_a_generator_and_a_list_inlined(x, y):
    others = [y, y * 2, y * 3]
    pid = os.getpid()
    first = x * 0 + (0.0 if pid > 0 else 1.0)
    pid = os.getpid()
    second = x * 1 + (0.0 if pid > 0 else 1.0)
    pid = os.getpid()
    third = x * 2 + (0.0 if pid > 0 else 1.0)
    pid = os.getpid()  # zip asks the generator once more before it sees the list end
    pairs = [first * others[0], second * others[1], third * others[2]]
    return torch.stack(pairs).sum(0)


@program("generator")
def consumer_breaks_on_a_data_dependent_test(x, y):
    def produce():
        for i in range(6):
            LOG.append(("produce", i))
            yield x.abs() * (i + 1)

    total = y * 0.5
    for value in produce():
        total = total + value
        if total.sum() > 20:
            break
    return total.log1p()


@twin_of(consumer_breaks_on_a_data_dependent_test)
def _consumer_breaks_on_a_data_dependent_test_inlined(x, y):
    total = y * 0.5
    LOG.append(("produce", 0))
    total = total + x.abs() * 1
    if total.sum() > 20:
        return total.log1p()
    LOG.append(("produce", 1))
    total = total + x.abs() * 2
    if total.sum() > 20:
        return total.log1p()
    LOG.append(("produce", 2))
    total = total + x.abs() * 3
    if total.sum() > 20:
        return total.log1p()
    LOG.append(("produce", 3))
    total = total + x.abs() * 4
    if total.sum() > 20:
        return total.log1p()
    LOG.append(("produce", 4))
    total = total + x.abs() * 5
    if total.sum() > 20:
        return total.log1p()
    LOG.append(("produce", 5))
    total = total + x.abs() * 6
    return total.log1p()


@program("generator", args=signed(1, 1), name="generator_branch_positive")
@program("generator", args=signed(-1, 1), name="generator_branch_negative")
def data_dependent_branch_in_a_generator(x, y):
    def produce():
        for t in (x, y):
            if t.sum() > 0:
                yield t * 2
            else:
                yield -t

    return sum(produce()) + x * y


@twin_of(data_dependent_branch_in_a_generator)
def _data_dependent_branch_in_a_generator_inlined(x, y):
    first = x * 2 if x.sum() > 0 else -x
    second = y * 2 if y.sum() > 0 else -y
    return 0 + first + second + x * y


@program("generator")
def generator_expression_of_items(x, y):
    a = x * y
    total = sum(round(t.sum().item(), 3) for t in (a, x, y))
    return a * total + y


@twin_of(generator_expression_of_items)
def _generator_expression_of_items_inlined(x, y):
    a = x * y
    total = 0 + round(a.sum().item(), 3) + round(x.sum().item(), 3) + round(y.sum().item(), 3)
    return a * total + y


@program("generator")
def list_of_a_generator_that_prints(x, y):
    def produce():
        for t in (x, y, x - y):
            u = t.exp()
            print("made", tuple(u.shape))
            yield u

    made = list(produce())
    return torch.cat(made).sum(dim=0), len(made)


@twin_of(list_of_a_generator_that_prints)
def _list_of_a_generator_that_prints_inlined(x, y):
    items = (x, y, x - y)
    first = items[0].exp()
    print("made", tuple(first.shape))
    second = items[1].exp()
    print("made", tuple(second.shape))
    third = items[2].exp()
    print("made", tuple(third.shape))
    made = [first, second, third]
    return torch.cat(made).sum(dim=0), len(made)


@program("generator")
def produce_and_consume_interleaved(x, y):
    def produce():
        for i in range(3):
            LOG.append(("produce", i))
            yield x * i

    total = y.clone()
    for i, value in enumerate(produce()):
        LOG.append(("consume", i, round(value.sum().item(), 3)))
        total = total + value
    return total


@twin_of(produce_and_consume_interleaved)
def _produce_and_consume_interleaved_inlined(x, y):
    total = y.clone()
    LOG.append(("produce", 0))
    value = x * 0
    LOG.append(("consume", 0, round(value.sum().item(), 3)))
    total = total + value
    LOG.append(("produce", 1))
    value = x * 1
    LOG.append(("consume", 1, round(value.sum().item(), 3)))
    total = total + value
    LOG.append(("produce", 2))
    value = x * 2
    LOG.append(("consume", 2, round(value.sum().item(), 3)))
    total = total + value
    return total


@program("generator")
def suspended_generator_live_across_a_break(x, y):
    def produce():
        yield x + 1
        yield y * 2
        yield x * y

    values = produce()
    first = next(values)
    value = first.sum().item()
    second = next(values)
    return first * value + second + next(values)


@twin_of(suspended_generator_live_across_a_break)
def _suspended_generator_live_across_a_break_inlined(x, y):
    first = x + 1
    value = first.sum().item()
    second = y * 2
    return first * value + second + x * y


@program("generator")
def generator_sent_to_then_closed_before_a_break(x, y):
    def accumulate():
        total = x * 1
        while True:
            increment = yield total
            total = total + increment

    running = accumulate()
    start = next(running)
    after = running.send(y * 2)
    running.close()
    value = after.mean().item()
    return after * value + start, round(value, 3)


# ---------------------------------------------------------------- grad mode around a break


def _requires_grad(*shapes):
    make = tensors(*shapes)
    return lambda: tuple(t.requires_grad_() for t in make())


@program("grad_mode", args=_requires_grad((4, 3), (4, 3)))
def no_grad_around_an_item(x, y):
    with torch.no_grad():
        a = x * 2
        value = a.sum().item()
        b = a * value
    return b + y


@program("grad_mode", args=_requires_grad((4, 3), (4, 3)))
def print_inside_no_grad(x, y):
    a = x * y
    with torch.no_grad():
        b = a.exp()
        print("inside", b.sum())
        c = b + x
    return a + c, c.requires_grad


@program("grad_mode", args=_requires_grad((4, 3), (4, 3)))
def enable_grad_inside_no_grad_with_a_break(x, y):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = y * 3
            value = b.sum().item()
            c = b * value
        d = a + 1
    return c + d, c.requires_grad, d.requires_grad


@program("grad_mode", args=lambda: (torch.randn(4, 3).requires_grad_(), torch.randn(4, 3), False))
def set_grad_enabled_with_a_branch(x, y, enabled):
    with torch.set_grad_enabled(enabled):
        a = x * y
        if a.sum() > 0:
            b = a.relu()
        else:
            b = a.abs()
    return b + x, b.requires_grad


@program("grad_mode", args=_requires_grad((4, 3), (4, 3)))
def requires_grad_inputs_across_a_break(x, y):
    a = x.sin() * y
    value = a.abs().max().item()
    return a / value + y.exp()


@program("grad_mode")
def inference_mode_around_a_break(x, y):
    with torch.inference_mode():
        a = x * y
        value = a.sum().item()
        b = a + value
    return b.clone() * 2, b.is_inference()


# ---------------------------------------------------------------- results that are the inputs


@program("aliasing")
def input_returned_after_a_break(x, y):
    x.add_(y)
    value = x.sum().item()
    x.mul_(0.5)
    return x, value > -1e9


@program("aliasing", args=lambda: (torch.randn(4, 3), [torch.randn(4, 3)]))
def list_argument_returned_after_a_break(x, items):
    items.append(x * 2)
    value = items[0].sum().item()
    items.append(items[1] * value)
    items.append(round(value, 3))
    return items


@program("aliasing", args=lambda: (torch.randn(4, 3), {"base": torch.randn(4, 3)}))
def dict_argument_returned_after_a_break(x, named):
    named["scaled"] = named["base"] * x
    value = named["scaled"].mean().item()
    named["value"] = round(value, 3)
    named["rescaled"] = named["scaled"] * value
    return named, named["base"]


@program("aliasing")
def same_input_returned_twice(x, y):
    a = x * y
    print("between", round(a.sum().item(), 3))
    return x, a * 2, x, y


@program("aliasing")
def new_tensor_in_the_log_and_the_result(x, y):
    a = x + y
    LOG.append(a)
    value = a.sum().item()
    b = a * value
    LOG.append(b)
    return a, b


@program("aliasing")
def global_list_returned_after_a_break(x, y):
    HISTORY.append(x * y)
    value = HISTORY[-1].max().item()
    HISTORY.append(y * value)
    return HISTORY, HISTORY[-1] + x


track_globals(__name__, "COUNTER", "HISTORY", "STATE", "SINK", "TAGGED", "RUNNING")
